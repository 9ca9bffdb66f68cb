//! `Op::MatMul` through cuBLAS: one strided-batched GEMM with f32
//! accumulation for the half types. Operands go to cuBLAS as they lie when
//! their matrices are row-major or transposed with one stride over the
//! batch (a broadcast batch is stride 0); other layouts are copied first.

use crate::backend::CudaBackend;
use crate::buffer::CudaBuffer;
use cudarc::cublas::sys::{
    cublasComputeType_t, cublasGemmAlgo_t, cublasGemmStridedBatchedEx, cublasOperation_t, cublasStatus_t, cudaDataType,
};
use rustorch_core::backend::TensorRef;
use rustorch_core::{BackendError, DType, Shape, TensorMeta};

/// `t` as a contiguous tensor of `shape` (its batch dims broadcast): the
/// copy op, which reads its input broadcast to the output's shape.
pub(super) fn contiguous(b: &CudaBackend, t: &TensorRef<'_>, shape: &Shape) -> Result<CudaBuffer, BackendError> {
    super::elementwise::run(
        b,
        &rustorch_core::Op::Copy,
        std::slice::from_ref(t),
        &TensorMeta::new(shape.clone(), t.dtype()),
    )
}

/// How cuBLAS reads one operand `[.., rows, cols]` in place: its pointer
/// offset, whether its matrices are stored transposed, the leading
/// dimension and the stride between batch entries.
struct Operand {
    offset: usize,
    transposed: bool,
    ld: usize,
    batch_stride: usize,
}

/// `t` read in place as `batch x rows x cols` matrices (batch dims broadcast
/// to `batch_dims`), or `None` where its layout needs a copy.
fn in_place(t: &TensorRef<'_>, batch_dims: &[usize]) -> Option<Operand> {
    let l = t.layout;
    let r = l.rank();
    let (rows, cols) = (l.dims()[r - 2], l.dims()[r - 1]);
    let (s_row, s_col) = (l.strides()[r - 2], l.strides()[r - 1]);
    let (transposed, ld) = if s_col == 1 && s_row >= cols.max(1) {
        (false, s_row)
    } else if s_row == 1 && s_col >= rows.max(1) {
        (true, s_col)
    } else {
        return None;
    };
    // The batch dims broadcast to the output's, as one stride (merged like
    // the kernels' layouts merge dims).
    let batch_shape = Shape::from(batch_dims.to_vec());
    let batch_layout = rustorch_core::Layout::from_parts(
        Shape::from(l.dims()[..r - 2].to_vec()),
        l.strides()[..r - 2].to_vec(),
        0,
    )
    .ok()?;
    let s = crate::launch::Strided::broadcast(&batch_layout, &batch_shape)?;
    let batch_stride = s.single_stride()?;
    Some(Operand {
        offset: l.offset(),
        transposed,
        ld: ld.max(1),
        batch_stride,
    })
}

pub(super) fn matmul(b: &CudaBackend, inputs: &[TensorRef<'_>], out: &TensorMeta) -> Result<CudaBuffer, BackendError> {
    let od = out.shape.dims();
    let r = od.len();
    let (m, n) = (od[r - 2], od[r - 1]);
    let k = inputs[0].layout.dims()[inputs[0].layout.rank() - 1];
    let batch: usize = od[..r - 2].iter().product();
    let mut a_dims = od[..r - 2].to_vec();
    a_dims.extend([m, k]);
    let mut b_dims = od[..r - 2].to_vec();
    b_dims.extend([k, n]);
    let dtype = out.dtype;
    let y = b.alloc(dtype, out.shape.numel())?;
    if y.len == 0 {
        return Ok(y);
    }
    if k == 0 {
        // Empty sums: zeros.
        y.zero(&b.stream)
            .map_err(|e| crate::error::driver(b.device, "matmul", e, 0))?;
        return Ok(y);
    }
    // Each operand in place where cuBLAS can read it so, else a contiguous copy.
    let batch_dims = &od[..r - 2];
    let mut copies = Vec::new();
    let mut operand = |t: &TensorRef<'_>, dims: Vec<usize>| -> Result<(u64, Operand), BackendError> {
        if let Some(o) = in_place(t, batch_dims) {
            let base = b.own("matmul", t.buffer)?.ptr();
            return Ok((base + (o.offset * dtype.size_in_bytes()) as u64, o));
        }
        let (rows, cols) = (dims[dims.len() - 2], dims[dims.len() - 1]);
        let c = contiguous(b, t, &Shape::from(dims))?;
        let ptr = c.ptr();
        copies.push(c);
        Ok((
            ptr,
            Operand {
                offset: 0,
                transposed: false,
                ld: cols.max(1),
                batch_stride: rows * cols,
            },
        ))
    };
    let (a_ptr, a) = operand(&inputs[0], a_dims)?;
    let (b_ptr, bm) = operand(&inputs[1], b_dims)?;
    let (data_type, compute) = match dtype {
        DType::F32 => (cudaDataType::CUDA_R_32F, cublasComputeType_t::CUBLAS_COMPUTE_32F),
        DType::F64 => (cudaDataType::CUDA_R_64F, cublasComputeType_t::CUBLAS_COMPUTE_64F),
        DType::F16 => (cudaDataType::CUDA_R_16F, cublasComputeType_t::CUBLAS_COMPUTE_32F),
        DType::BF16 => (cudaDataType::CUDA_R_16BF, cublasComputeType_t::CUBLAS_COMPUTE_32F),
        d => {
            return Err(BackendError::unsupported(
                b.device,
                "matmul",
                format!("no GEMM for {d}"),
            ))
        }
    };
    let (one_f, zero_f, one_d, zero_d) = (1f32, 0f32, 1f64, 0f64);
    let (alpha, beta) = if dtype == DType::F64 {
        (&one_d as *const f64 as *const _, &zero_d as *const f64 as *const _)
    } else {
        (&one_f as *const f32 as *const _, &zero_f as *const f32 as *const _)
    };
    let too_big = |v: usize| i32::try_from(v).is_err();
    if too_big(m) || too_big(n) || too_big(k) || too_big(batch) || too_big(a.ld) || too_big(bm.ld) {
        return Err(BackendError::unsupported(b.device, "matmul", "a dimension past 2^31"));
    }
    // Row-major C[m,n] = A[m,k] B[k,n] is column-major C^T = B^T A^T: cuBLAS
    // multiplies B^T (n x k) by A^T (k x m) into C^T (n x m, ld n). A
    // row-major operand is, read column-major, already its transpose (op N);
    // a transposed one is the matrix itself (op T).
    let op = |o: &Operand| {
        if o.transposed {
            cublasOperation_t::CUBLAS_OP_T
        } else {
            cublasOperation_t::CUBLAS_OP_N
        }
    };
    // SAFETY: pointers address buffers of the sizes the dims and strides
    // describe (the executor checked each layout against its buffer, and
    // `in_place` only passes layouts whose matrices cuBLAS addresses with
    // these leading dimensions); the handle is bound to this backend's stream.
    let status = unsafe {
        cublasGemmStridedBatchedEx(
            *b.blas.handle(),
            op(&bm),
            op(&a),
            n as i32,
            m as i32,
            k as i32,
            alpha,
            b_ptr as *const _,
            data_type,
            bm.ld as i32,
            bm.batch_stride as i64,
            a_ptr as *const _,
            data_type,
            a.ld as i32,
            a.batch_stride as i64,
            beta,
            y.ptr() as *mut _,
            data_type,
            n as i32,
            (m * n) as i64,
            batch as i32,
            compute,
            cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
        )
    };
    // The copies are freed in stream order, after the GEMM that reads them.
    drop(copies);
    if status != cublasStatus_t::CUBLAS_STATUS_SUCCESS {
        return Err(BackendError::Device {
            device: b.device,
            message: format!("cublasGemmStridedBatchedEx: {status:?}"),
        });
    }
    Ok(y)
}

/// One operand of `gemm_f32_acc`: its address, leading dimension and
/// batch stride (in elements), and its element type.
#[derive(Clone, Copy)]
pub(super) struct GemmOperand {
    pub ptr: u64,
    pub ld: i32,
    pub batch_stride: i64,
    pub dtype: cudaDataType,
}

/// `batch` column-major products C (m x n) = op_a(A) op_b(B) with f32
/// accumulation (alpha 1, beta 0), the batched operands a stride apart: the
/// quantized products' and flash attention's GEMMs. `what` names the
/// caller in an error.
///
/// # Safety
/// Each operand's pointer, leading dimension and batch stride must address
/// memory of this backend holding the matrices the dims describe (C
/// writable), for the whole batch, until the stream has run the GEMM.
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn gemm_f32_acc(
    b: &CudaBackend,
    what: &str,
    (op_a, op_b): (cublasOperation_t, cublasOperation_t),
    (m, n, k): (i32, i32, i32),
    a: GemmOperand,
    bm: GemmOperand,
    c: GemmOperand,
    batch: i32,
) -> Result<(), BackendError> {
    let (one, zero) = (1f32, 0f32);
    // SAFETY: the caller's contract; the handle is bound to this backend's
    // stream, so the GEMM runs in order with the kernels around it.
    let status = unsafe {
        cublasGemmStridedBatchedEx(
            *b.blas.handle(),
            op_a,
            op_b,
            m,
            n,
            k,
            &one as *const f32 as *const _,
            a.ptr as *const _,
            a.dtype,
            a.ld,
            a.batch_stride,
            bm.ptr as *const _,
            bm.dtype,
            bm.ld,
            bm.batch_stride,
            &zero as *const f32 as *const _,
            c.ptr as *mut _,
            c.dtype,
            c.ld,
            c.batch_stride,
            batch,
            cublasComputeType_t::CUBLAS_COMPUTE_32F,
            cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
        )
    };
    if status != cublasStatus_t::CUBLAS_STATUS_SUCCESS {
        return Err(BackendError::Device {
            device: b.device,
            message: format!("{what}: cublasGemmStridedBatchedEx: {status:?}"),
        });
    }
    Ok(())
}
