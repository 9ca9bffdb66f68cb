//! Which ops the CUDA backend runs, and the dispatch to their launchers.
//! Everything not listed in `supports` is declined, so the executor runs
//! it on the next device and the trace says so.

pub(crate) mod attention;
mod conv;
mod elementwise;
mod index;
mod matmul;
mod mmq;
mod norm_products;
mod quant;
mod reduce;
mod rope;
pub(crate) use rope::rope_write_kv_at;
mod sort;

use crate::backend::CudaBackend;
use crate::launch::MAX_DIMS;
use rustorch_core::backend::{Backend, Buffer, TensorRef};
use rustorch_core::op::{BinaryOp, ReduceOp, UnaryOp};
use rustorch_core::{BackendError, DType, Op, TensorMeta};

fn is_int(d: Option<DType>) -> bool {
    matches!(d, Some(DType::I32 | DType::I64 | DType::U8))
}

/// The kernels' name for a float dtype, for the ops that compute.
pub(crate) fn float_suffix(d: DType) -> Option<&'static str> {
    match d {
        DType::F32 => Some("F32"),
        DType::F16 => Some("F16"),
        DType::BF16 => Some("BF16"),
        DType::F64 => Some("F64"),
        _ => None,
    }
}

/// The kernels' name for any dtype a cast takes (complex: none).
pub(crate) fn cast_suffix(d: DType) -> Option<&'static str> {
    match d {
        DType::Bool => Some("BOOL"),
        DType::U8 => Some("U8"),
        DType::I32 => Some("I32"),
        DType::I64 => Some("I64"),
        d => float_suffix(d),
    }
}

pub(crate) fn supports(op: &Op, inputs: &[TensorMeta]) -> bool {
    if inputs.iter().any(|m| m.shape.rank() > MAX_DIMS) {
        return false;
    }
    let first = inputs.first().map(|m| m.dtype);
    let float = first.and_then(float_suffix).is_some();
    match op {
        Op::Copy => first.is_some_and(|d| d != DType::C64),
        Op::Cast { to } => first.and_then(cast_suffix).is_some() && cast_suffix(*to).is_some(),
        Op::Unary(_) | Op::Clamp { .. } | Op::Binary(_) | Op::Compare(_) if float => true,
        // Integers: wrapping arithmetic as on the CPU, zero divisors and
        // negative exponents rejected as the CPU rejects them (a device
        // flag, elementwise.rs); bools: maximum (or) and minimum (and),
        // the only arithmetic infer allows them.
        Op::Unary(u) => is_int(first) && matches!(u, UnaryOp::Neg | UnaryOp::Abs | UnaryOp::Relu),
        // Integer bounds rounded inward and saturated as on the CPU; a NaN
        // bound is the CPU's InvalidInput, raised before any launch
        // (elementwise.rs). Bools have no clamp (infer).
        Op::Clamp { .. } => is_int(first),
        Op::Binary(o) => {
            is_int(first) || (first == Some(DType::Bool) && matches!(o, BinaryOp::Maximum | BinaryOp::Minimum))
        }
        Op::Compare(_) => is_int(first) || first == Some(DType::Bool),
        Op::SwiGlu | Op::GeGlu => first == Some(DType::F32),
        Op::Cat { .. } => first.is_some_and(|d| d != DType::C64),
        Op::Where => inputs.get(1).is_some_and(|m| m.dtype != DType::C64),
        Op::MatMul => matches!(first, Some(DType::F32 | DType::F16 | DType::BF16 | DType::F64)),
        // Integers and bools: exact wrapping sums and products into i64,
        // max/min and their indices (reduce.rs, `reduce_int`); mean, var
        // and std need floats (infer).
        Op::Reduce { op: r, .. } => {
            float
                || ((is_int(first) || first == Some(DType::Bool))
                    && !matches!(r, ReduceOp::Mean | ReduceOp::Var { .. } | ReduceOp::Std { .. }))
        }
        Op::Softmax { .. } | Op::LogSoftmax { .. } => float,
        Op::RmsNorm { .. } => float && inputs.iter().all(|m| m.dtype == inputs[0].dtype),
        // f32 rows a block holds in registers (reduce::add_rms_norm).
        Op::AddRmsNorm { .. } => {
            inputs.iter().all(|m| m.dtype == DType::F32)
                && inputs[0]
                    .shape
                    .dims()
                    .last()
                    .is_some_and(|&n| n <= reduce::REGISTER_ROW_MAX)
        }
        // Its parts' support (norm_products.rs runs them where the fused
        // kernels do not apply).
        Op::AddRmsNormThen { eps, then } => {
            inputs.len() >= 3
                && supports(&Op::AddRmsNorm { eps: *eps }, &inputs[..3])
                && matches!(**then, Op::QMatMuls { .. } | Op::QMatMulGated { .. })
                && {
                    let mut rest = vec![inputs[0].clone()];
                    rest.extend_from_slice(&inputs[3..]);
                    quant::supports(then, &rest)
                }
        }
        Op::LayerNorm { .. } => float && inputs.iter().all(|m| m.dtype == inputs[0].dtype),
        // Floats, integers and bools (i64 output); complex stays with the CPU.
        Op::Cumsum { .. } => first.and_then(cast_suffix).is_some(),
        // Deterministic (no atomics), so floats too; see kernels/index.cu.
        Op::ScatterAdd { .. } => {
            first.is_some_and(|d| d != DType::C64)
                && inputs.get(1).is_some_and(|m| index::index_suffix(m.dtype).is_some())
                && inputs.get(2).is_some_and(|m| Some(m.dtype) == first)
        }
        Op::Rope { .. } => float && inputs.iter().all(|m| m.dtype == inputs[0].dtype),
        // Any element type moved by size, any index type infer accepts
        // (i32, i64, u8). An embedding's output has one dim more than its ids.
        Op::IndexSelect { .. } | Op::Gather { .. } | Op::Embedding => {
            first.is_some_and(|d| d != DType::C64)
                && inputs.get(1).is_some_and(|m| {
                    index::index_suffix(m.dtype).is_some()
                        && (!matches!(op, Op::Embedding) || m.shape.rank() < MAX_DIMS)
                })
        }
        // Head dims limited by one block's shared memory, or by registers
        // for AttentionAt (attention.rs).
        Op::Sdpa { .. } | Op::CachedAttention { .. } | Op::FlashAttention { .. } | Op::AttentionAt { .. } => {
            attention::supported(op, inputs)
        }
        // Direct kernels for the float dtypes (conv.rs).
        Op::BatchNorm { .. } | Op::Conv1d { .. } | Op::Conv2d { .. } | Op::ConvTranspose2d { .. } => {
            float && inputs.iter().all(|m| m.dtype == inputs[0].dtype)
        }
        Op::MaxPool2d { .. } | Op::AvgPool2d { .. } => float,
        // Every non-complex dtype, rows below 2^32 elements (sort.rs).
        Op::Sort { dim, .. } | Op::TopK { dim, .. } => {
            first.and_then(sort::sort_suffix).is_some()
                && inputs[0].shape.dims().get(*dim).is_some_and(|&n| sort::row_fits(n))
        }
        // GGML-typed weights: every type the CPU multiplies (kernels/quant.cu).
        Op::QMatMul { .. } | Op::QMatMuls { .. } | Op::QMatMulGated { .. } | Op::QEmbedding { .. } => {
            quant::supports(op, inputs)
        }
    }
}

pub(crate) fn execute(
    b: &CudaBackend,
    op: &Op,
    inputs: &[TensorRef<'_>],
    outputs: &[TensorMeta],
) -> Result<Vec<Buffer>, BackendError> {
    let metas: Vec<TensorMeta> = inputs.iter().map(|t| t.meta()).collect();
    if !supports(op, &metas) {
        return Err(BackendError::unsupported(
            b.device,
            op.name(),
            "no CUDA kernel for it yet",
        ));
    }
    match op {
        Op::Sort { dim, descending } => {
            let len = inputs[0].layout.dims().get(*dim).copied().unwrap_or(0);
            return sort::sort(b, "sort", &inputs[0], *dim, len, *descending, outputs);
        }
        Op::TopK { k, dim, largest } => return sort::sort(b, "topk", &inputs[0], *dim, *k, *largest, outputs),
        Op::AddRmsNorm { eps } => {
            let outs = reduce::add_rms_norm(b, op, *eps, inputs, outputs, [true, true])?;
            return Ok(outs.into_iter().map(|buf| std::sync::Arc::new(buf) as Buffer).collect());
        }
        Op::AddRmsNormThen { .. } => {
            let outs = norm_products::run(b, op, inputs, outputs)?;
            return Ok(outs.into_iter().map(|buf| std::sync::Arc::new(buf) as Buffer).collect());
        }
        Op::QMatMul { .. } | Op::QMatMuls { .. } | Op::QMatMulGated { .. } | Op::QEmbedding { .. } => {
            // Several outputs for QMatMuls.
            let outs = quant::run(b, op, inputs, outputs)?;
            return Ok(outs.into_iter().map(|buf| std::sync::Arc::new(buf) as Buffer).collect());
        }
        _ => {}
    }
    let out = &outputs[0];
    let buf = match op {
        Op::MatMul => matmul::matmul(b, inputs, out)?,
        Op::Cat { dim } => cat(b, *dim, inputs, out)?,
        Op::Reduce { op: r, dims, .. } => reduce::reduce(b, *r, dims, &inputs[0], out)?,
        Op::Softmax { dim } => reduce::softmax(b, *dim, false, &inputs[0], out)?,
        Op::LogSoftmax { dim } => reduce::softmax(b, *dim, true, &inputs[0], out)?,
        Op::RmsNorm { eps, .. } => reduce::rms_norm(b, op, *eps, inputs, out)?,
        Op::IndexSelect { .. } | Op::Gather { .. } | Op::Embedding => index::run(b, op, inputs, out)?,
        Op::LayerNorm { .. } => reduce::layer_norm(b, op, inputs, out)?,
        Op::Cumsum { dim } => reduce::cumsum(b, *dim, &inputs[0], out)?,
        Op::ScatterAdd { dim } => index::scatter_add(b, *dim, inputs, out)?,
        Op::Rope { layout } => rope::rope(b, *layout, inputs, out)?,
        Op::BatchNorm { .. } => conv::batch_norm(b, op, inputs, out)?,
        Op::Conv1d { .. } | Op::Conv2d { .. } | Op::ConvTranspose2d { .. } => conv::conv(b, op, inputs, out)?,
        Op::MaxPool2d { .. } | Op::AvgPool2d { .. } => conv::pool(b, op, &inputs[0], out)?,
        Op::Sdpa { mask, scale } => attention::sdpa(b, *mask, *scale, inputs, out)?,
        Op::CachedAttention { .. } | Op::FlashAttention { .. } => attention::cached(b, op, inputs, out)?,
        Op::AttentionAt { scale, window } => attention::attention_at(b, *scale, *window, inputs, out)?,
        _ => elementwise::run(b, op, inputs, out)?,
    };
    Ok(vec![std::sync::Arc::new(buf)])
}

/// `Backend::write_into`: `src` (converted to the destination's dtype as
/// `Op::Cast` converts) into the elements of `dst` that `region` selects.
pub(crate) fn write_into(
    b: &CudaBackend,
    dst: &mut dyn rustorch_core::backend::DeviceBuffer,
    region: &rustorch_core::Layout,
    src: TensorRef<'_>,
) -> Result<(), BackendError> {
    write(b, "write_into", dst, region, src, None)
}

/// `Backend::write_into_at`: `write_into` at `region` moved by
/// `pos * step` elements, `pos` read by the kernel on the device (no host
/// synchronization in the write itself, so a captured graph replays it at
/// whatever position the tensor then holds). A position outside
/// `0..=max_pos` writes nothing; the kernel sets an `ErrorFlag`, read back
/// here (a download that waits for the stream) and returned as the CPU's
/// `InvalidInput`.
pub(crate) fn write_into_at(
    b: &CudaBackend,
    dst: &mut dyn rustorch_core::backend::DeviceBuffer,
    region: &rustorch_core::Layout,
    step: usize,
    max_pos: usize,
    pos: TensorRef<'_>,
    src: TensorRef<'_>,
) -> Result<(), BackendError> {
    const OP: &str = "write_into_at";
    // The kernel adds `pos * step` to raw addresses: the bounds are checked
    // here too, not only by the executor.
    rustorch_core::backend::check_write_at(dst.len(), region, step, max_pos, pos)
        .map_err(|m| BackendError::invalid(OP, m))?;
    write(b, OP, dst, region, src, Some(At { pos, step, max_pos }))
}

/// A `write_into_at`'s position tensor and bounds (`check_write_at` has
/// accepted them).
struct At<'a> {
    pos: TensorRef<'a>,
    step: usize,
    max_pos: usize,
}

/// One path for both writes: the same `*_into` kernel, given a null
/// position for `write_into`.
fn write(
    b: &CudaBackend,
    op: &str,
    dst: &mut dyn rustorch_core::backend::DeviceBuffer,
    region: &rustorch_core::Layout,
    src: TensorRef<'_>,
    at: Option<At<'_>>,
) -> Result<(), BackendError> {
    use crate::launch::{Strided, WriteAt};
    crate::buffer::forget_row_acts(dst);
    let dst_dtype = dst.dtype();
    let dst = dst
        .as_any()
        .downcast_ref::<crate::CudaBuffer>()
        .filter(|d| d.device == b.device)
        .ok_or_else(|| BackendError::invalid(op, format!("the destination is not on {}", b.device)))?;
    let x = b.own(op, src.buffer)?;
    let pos = match &at {
        Some(a) => Some(b.own(op, a.pos.buffer)?),
        None => None,
    };
    let n = region.shape().numel();
    if n == 0 {
        // Nothing to launch, but a bad position is still the caller's
        // error, as on the CPU: read on the host (a rare, empty write).
        if let Some(a) = &at {
            let host = b.download(a.pos.buffer)?;
            rustorch_core::backend::write_pos_on_host(&host, a.pos.layout, a.max_pos)
                .map_err(|m| BackendError::invalid(op, m))?;
        }
        return Ok(());
    }
    let too_deep = || BackendError::unsupported(b.device, op, "more dims than the kernels take");
    let lx = Strided::broadcast(src.layout, region.shape()).ok_or_else(too_deep)?;
    let ly = Strided::broadcast(region, region.shape()).ok_or_else(too_deep)?;
    let name = if src.dtype() == dst_dtype {
        format!("copy_into_b{}", dst_dtype.size_in_bytes())
    } else {
        match (cast_suffix(src.dtype()), cast_suffix(dst_dtype)) {
            (Some(a), Some(z)) => format!("cast_into_{a}_{z}"),
            _ => {
                return Err(BackendError::unsupported(
                    b.device,
                    op,
                    "no conversion between these dtypes",
                ))
            }
        }
    };
    let module = if name.starts_with("copy") {
        "elementwise"
    } else {
        "cast"
    };
    let (Some(a), Some(pos)) = (at, pos) else {
        // The executor checked both layouts against their buffers, and
        // holds `dst` alone.
        return launch_into(b, module, &name, (x.ptr(), lx), (dst.ptr(), ly), n, WriteAt::NONE);
    };
    let bad = ErrorFlag::new(b)?;
    let wide = a.pos.dtype() == DType::I64;
    let pos_ptr = pos.ptr() + (a.pos.layout.offset() * a.pos.dtype().size_in_bytes()) as u64;
    let write_at = WriteAt::at(pos_ptr, wide, a.step, a.max_pos, bad.ptr());
    // `check_write_at` kept the region inside `dst` for every position the
    // kernel accepts, and `pos`'s one element inside its buffer.
    launch_into(b, module, &name, (x.ptr(), lx), (dst.ptr(), ly), n, write_at)?;
    if bad.is_set(b)? {
        let host = b.download(a.pos.buffer)?;
        let msg = rustorch_core::backend::write_pos_on_host(&host, a.pos.layout, a.max_pos)
            .err()
            .unwrap_or_else(|| format!("the write position is outside 0..={}", a.max_pos));
        return Err(BackendError::invalid(op, msg));
    }
    Ok(())
}

/// Launches a kernel that writes `n` source elements where `dst`'s layout
/// points, moved as `at` says (`copy_into_bN`, `cast_into_A_B`: arguments
/// src, its layout, dst, its layout, n, at). Callers keep both layouts
/// inside their buffers for every position `at` accepts.
fn launch_into(
    b: &CudaBackend,
    module: &'static str,
    name: &str,
    src: (u64, crate::launch::Strided),
    dst: (u64, crate::launch::Strided),
    n: usize,
    at: crate::launch::WriteAt,
) -> Result<(), BackendError> {
    let f = b.function(module, name)?;
    let n64 = n as i64;
    let mut args = crate::launch::Launch::new(b, &f);
    args.arg(&src.0).arg(&src.1).arg(&dst.0).arg(&dst.1).arg(&n64).arg(&at);
    // SAFETY: the argument list of every *_into kernel; the callers' layouts
    // stay inside their buffers, moved by any position `at` lets through.
    unsafe { args.launch(crate::launch::grid(n, b.sm_count)) }.map_err(|e| b.launch_err(name, e))?;
    Ok(())
}

/// `Op::Cat`: each input copied into its slice of the output along `dim`.
fn cat(
    b: &CudaBackend,
    dim: usize,
    inputs: &[TensorRef<'_>],
    out: &TensorMeta,
) -> Result<crate::CudaBuffer, BackendError> {
    use crate::launch::Strided;
    let y = b.alloc(out.dtype, out.shape.numel())?;
    let whole = rustorch_core::Layout::contiguous(out.shape.clone());
    let name = format!("copy_into_b{}", out.dtype.size_in_bytes());
    let mut start = 0;
    for t in inputs {
        let len = t.layout.dims()[dim];
        let n = t.layout.shape().numel();
        if n > 0 {
            let region = whole
                .narrow("cat", dim as isize, start, len)
                .map_err(|e| BackendError::invalid("cat", e.to_string()))?;
            let deep = || BackendError::unsupported(b.device, "cat", "more dims than the kernels take");
            let lx = Strided::broadcast(t.layout, region.shape()).ok_or_else(deep)?;
            let ly = Strided::broadcast(&region, region.shape()).ok_or_else(deep)?;
            // The slice lies inside the output, whose size infer computed from the inputs.
            launch_into(
                b,
                "elementwise",
                &name,
                (b.own("cat", t.buffer)?.ptr(), lx),
                (y.ptr(), ly),
                n,
                crate::launch::WriteAt::NONE,
            )?;
        }
        start += len;
    }
    Ok(y)
}

/// A 4-byte device flag that a kernel sets when it meets input the CPU
/// rejects (an index out of range, a zero divisor): zeroed in stream order
/// before the kernel, read back after it, which waits for the stream. The
/// launcher then returns the CPU's `InvalidInput`.
pub(super) struct ErrorFlag(crate::CudaBuffer);

impl ErrorFlag {
    /// A cleared flag. Inside a captured pass it is left as the arena
    /// gives it: nothing reads it there (`is_set`), and clearing it would
    /// put a memset between the kernels of every replay (three a layer in
    /// a decode step: the KV-cache writes and attention), each a graph node
    /// of its own that also keeps the next kernel from starting early.
    pub(super) fn new(b: &CudaBackend) -> Result<ErrorFlag, BackendError> {
        let flag = b.alloc(DType::I32, 1)?;
        if !b.usage.capturing() {
            flag.zero(&b.stream).map_err(|e| b.launch_err("error flag", e))?;
        }
        Ok(ErrorFlag(flag))
    }

    /// The address kernels take the flag at.
    pub(super) fn ptr(&self) -> u64 {
        self.0.ptr()
    }

    /// Whether the kernels queued before set it (waits for them). Inside a
    /// captured pass nothing can be read back: the answer is `false`, and
    /// the caller of the capture checks such inputs on the host (a decode
    /// step's token ids and positions), while the kernels stay in bounds
    /// whatever the input.
    pub(super) fn is_set(&self, b: &CudaBackend) -> Result<bool, BackendError> {
        if b.usage.capturing() {
            return Ok(false);
        }
        let mut flag = [0u8; 4];
        b.copy_to_host(crate::transfer::Method::Pageable, self.0.ptr(), &mut flag)?;
        Ok(i32::from_ne_bytes(flag) != 0)
    }
}
