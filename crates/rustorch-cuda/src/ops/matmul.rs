//! `Op::MatMul` through cuBLAS: both operands made contiguous with their
//! batch dims broadcast (a copy kernel), then one strided-batched GEMM with
//! f32 accumulation for the half types.

use crate::backend::CudaBackend;
use crate::buffer::CudaBuffer;
use cudarc::cublas::sys::{
    cublasComputeType_t, cublasGemmAlgo_t, cublasGemmStridedBatchedEx, cublasOperation_t, cublasStatus_t, cudaDataType,
};
use rustorch_core::backend::TensorRef;
use rustorch_core::{BackendError, DType, Shape, TensorMeta};

/// `t` as a contiguous tensor of `shape` (its batch dims broadcast): the
/// copy op, which reads its input broadcast to the output's shape.
fn contiguous(b: &CudaBackend, t: &TensorRef<'_>, shape: &Shape) -> Result<CudaBuffer, BackendError> {
    super::elementwise::run(
        b,
        &rustorch_core::Op::Copy,
        std::slice::from_ref(t),
        &TensorMeta::new(shape.clone(), t.dtype()),
    )
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
        let mut y = y;
        b.stream
            .memset_zeros(&mut y.data)
            .map_err(|e| crate::error::driver(b.device, "matmul", e, 0))?;
        return Ok(y);
    }
    let a = contiguous(b, &inputs[0], &Shape::from(a_dims))?;
    let bm = contiguous(b, &inputs[1], &Shape::from(b_dims))?;
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
    if too_big(m) || too_big(n) || too_big(k) || too_big(batch) {
        return Err(BackendError::unsupported(b.device, "matmul", "a dimension past 2^31"));
    }
    // Row-major C[m,n] = A[m,k] B[k,n] is column-major C^T = B^T A^T: cuBLAS
    // multiplies B (n x k, ld n) by A (k x m, ld k) into C^T (n x m, ld n).
    // SAFETY: pointers address buffers of the sizes the dims describe; the
    // handle is bound to this backend's stream.
    let status = unsafe {
        cublasGemmStridedBatchedEx(
            *b.blas.handle(),
            cublasOperation_t::CUBLAS_OP_N,
            cublasOperation_t::CUBLAS_OP_N,
            n as i32,
            m as i32,
            k as i32,
            alpha,
            bm.ptr() as *const _,
            data_type,
            n as i32,
            (k * n) as i64,
            a.ptr() as *const _,
            data_type,
            k as i32,
            (m * k) as i64,
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
    if status != cublasStatus_t::CUBLAS_STATUS_SUCCESS {
        return Err(BackendError::Device {
            device: b.device,
            message: format!("cublasGemmStridedBatchedEx: {status:?}"),
        });
    }
    Ok(y)
}
