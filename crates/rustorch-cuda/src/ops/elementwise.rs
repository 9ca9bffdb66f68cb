//! Launchers for kernels/elementwise.cu and kernels/cast.cu: one thread per
//! output element (grid-stride), inputs read through their layouts.

use super::{cast_suffix, float_suffix};
use crate::backend::CudaBackend;
use crate::buffer::CudaBuffer;
use crate::launch::{grid, Strided};
use cudarc::driver::{LaunchArgs, PushKernelArg};
use rustorch_core::backend::TensorRef;
use rustorch_core::op::BinaryOp;
use rustorch_core::{BackendError, DType, Op, TensorMeta};

pub(super) fn run(
    b: &CudaBackend,
    op: &Op,
    inputs: &[TensorRef<'_>],
    out: &TensorMeta,
) -> Result<CudaBuffer, BackendError> {
    let name = op.name();
    if let Op::Binary(o @ (BinaryOp::Div | BinaryOp::Pow)) = op {
        if inputs[0].dtype().is_int() {
            int_check(b, *o, &inputs[1])?;
        }
    }
    let n = out.shape.numel();
    let y = b.alloc(out.dtype, n)?;
    if n == 0 {
        return Ok(y);
    }
    let layout = |i: usize| -> Result<Strided, BackendError> {
        Strided::broadcast(inputs[i].layout, &out.shape)
            .ok_or_else(|| BackendError::unsupported(b.device, name.clone(), "more dims than the kernels take"))
    };
    let ptr = |i: usize| -> Result<u64, BackendError> { Ok(b.own(&name, inputs[i].buffer)?.ptr()) };
    let x_dtype = inputs[0].dtype();
    let kernel = match op {
        Op::Copy => ("elementwise", format!("copy_b{}", x_dtype.size_in_bytes())),
        Op::Cast { to } => (
            "cast",
            format!(
                "cast_{}_{}",
                cast_suffix(x_dtype).unwrap_or("?"),
                cast_suffix(*to).unwrap_or("?")
            ),
        ),
        Op::Unary(u) => ("elementwise", format!("unary_{}_{}", u.name(), suffix(x_dtype))),
        Op::Clamp { .. } => ("elementwise", format!("clamp_{}", suffix(x_dtype))),
        Op::Binary(o) => ("elementwise", format!("binary_{}_{}", o.name(), suffix(x_dtype))),
        Op::Compare(c) => ("elementwise", format!("cmp_{}_{}", c.name(), suffix(x_dtype))),
        Op::Where => ("elementwise", format!("where_b{}", inputs[1].dtype().size_in_bytes())),
        Op::SwiGlu => ("elementwise", "swiglu_F32".to_string()),
        Op::GeGlu => ("elementwise", "geglu_F32".to_string()),
        _ => return Err(BackendError::unsupported(b.device, name, "not an elementwise op")),
    };
    let n64 = n as i64;
    let y_ptr = y.ptr();
    let layouts = (0..inputs.len()).map(layout).collect::<Result<Vec<_>, _>>()?;
    let ptrs = (0..inputs.len()).map(ptr).collect::<Result<Vec<_>, _>>()?;
    // Contiguous operands whose first elements are 16-byte aligned take the
    // kernel's `_v` twin, which moves 16 bytes per load and store.
    let vector = has_vector_twin(op, x_dtype)
        && y_ptr.is_multiple_of(16)
        && layouts.iter().zip(&ptrs).all(|(l, &p)| {
            l.single_stride() == Some(1) && (p + l.offset_bytes(x_dtype.size_in_bytes())).is_multiple_of(16)
        });
    let (kernel, per_thread) = if vector {
        (
            (kernel.0, format!("{}_v", kernel.1)),
            16 / x_dtype.size_in_bytes().max(1),
        )
    } else {
        (kernel, 1)
    };
    let f = b.function(kernel.0, &kernel.1)?;
    let (lo, hi) = match op {
        Op::Clamp { min, max } => (min.unwrap_or(f64::NAN), max.unwrap_or(f64::NAN)),
        _ => (0.0, 0.0),
    };
    let mut args: LaunchArgs<'_> = b.stream.launch_builder(&f);
    for (p, l) in ptrs.iter().zip(&layouts) {
        args.arg(p).arg(l);
    }
    args.arg(&y_ptr).arg(&n64);
    if matches!(op, Op::Clamp { .. }) {
        args.arg(&lo).arg(&hi);
    }
    // SAFETY: the argument list matches the kernel's signature (pointers
    // and layouts of every input, then the output and its length, then a
    // clamp's bounds), every layout stays inside its buffer (validated by
    // the executor) and the output holds `n` elements.
    unsafe { args.launch(grid(n.div_ceil(per_thread), b.sm_count)) }.map_err(|e| b.launch_err(&kernel.1, e))?;
    Ok(y)
}

/// Whether the op's kernel has a `_v` twin for contiguous, aligned
/// operands (kernels/elementwise.cu: float unary and binary ops, copies).
fn has_vector_twin(op: &Op, dtype: rustorch_core::DType) -> bool {
    match op {
        Op::Copy => true,
        Op::Unary(_) | Op::Binary(_) => float_suffix(dtype).is_some(),
        _ => false,
    }
}

/// The kernels' name for the dtype an op computes in (floats, and the
/// integer kernels' I32/I64/U8/BOOL).
fn suffix(d: rustorch_core::DType) -> &'static str {
    float_suffix(d).or_else(|| cast_suffix(d)).unwrap_or("?")
}

/// The CPU's check before an integer division or power: any zero divisor
/// or negative exponent among the second operand's elements (its own, not
/// broadcast) is `InvalidInput` with PyTorch's message. A kernel sets a
/// flag, which one 4-byte download reads (waiting for the stream, as the
/// indexing ops do for their range flag).
fn int_check(b: &CudaBackend, o: BinaryOp, rhs: &TensorRef<'_>) -> Result<(), BackendError> {
    let (what, message) = match o {
        BinaryOp::Div => ("div", "ZeroDivisionError: integer division by zero"),
        // Unsigned exponents cannot be negative.
        BinaryOp::Pow if rhs.dtype() == DType::U8 => return Ok(()),
        BinaryOp::Pow => ("pow", "Integers to negative integer powers are not allowed."),
        _ => return Ok(()),
    };
    let n = rhs.layout.shape().numel();
    if n == 0 {
        return Ok(());
    }
    let ty = suffix(rhs.dtype());
    let l = Strided::from_parts(rhs.layout.dims(), rhs.layout.strides(), rhs.layout.offset())
        .ok_or_else(|| BackendError::unsupported(b.device, what, "more dims than the kernels take"))?;
    let mut bad = b.alloc(DType::I32, 1)?;
    b.stream
        .memset_zeros(&mut bad.data)
        .map_err(|e| b.launch_err("integer check flag", e))?;
    let kernel = format!("int_check_{what}_{ty}");
    let f = b.function("elementwise", &kernel)?;
    let (xp, n64, bp) = (b.own(what, rhs.buffer)?.ptr(), n as i64, bad.ptr());
    let mut args = b.stream.launch_builder(&f);
    args.arg(&xp).arg(&l).arg(&n64).arg(&bp);
    // SAFETY: int_check_*(x, lx, n, bad): the operand's own layout over its
    // n elements (checked by the executor), `bad` one i32.
    unsafe { args.launch(grid(n, b.sm_count)) }.map_err(|e| b.launch_err(&kernel, e))?;
    let mut flag = [0u8; 4];
    b.stream
        .memcpy_dtoh(&bad.data.slice(..4), &mut flag)
        .map_err(|e| b.launch_err("integer check flag", e))?;
    b.stream.synchronize().map_err(|e| b.launch_err(&kernel, e))?;
    if i32::from_ne_bytes(flag) != 0 {
        return Err(BackendError::invalid(what, message));
    }
    Ok(())
}
