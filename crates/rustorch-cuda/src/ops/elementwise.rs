//! Launchers for kernels/elementwise.cu and kernels/cast.cu: one thread per
//! output element (grid-stride), inputs read through their layouts.

use super::{cast_suffix, float_suffix};
use crate::backend::CudaBackend;
use crate::buffer::CudaBuffer;
use crate::launch::{grid, Strided};

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
    // Integer clamps take their bounds as the CPU rounds them (or refuse a
    // NaN bound), before anything is allocated or launched.
    let int_bounds = match op {
        Op::Clamp { min, max } if inputs[0].dtype().is_int() => {
            Some(int_clamp_bounds(op, inputs[0].dtype(), *min, *max)?)
        }
        _ => None,
    };
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
    let mut args = crate::launch::Launch::new(b, &f);
    for (p, l) in ptrs.iter().zip(&layouts) {
        args.arg(p).arg(l);
    }
    args.arg(&y_ptr).arg(&n64);
    let (ilo, ihi) = int_bounds.unwrap_or((0, 0));
    if int_bounds.is_some() {
        args.arg(&ilo).arg(&ihi);
    } else if matches!(op, Op::Clamp { .. }) {
        args.arg(&lo).arg(&hi);
    }
    // SAFETY: the argument list matches the kernel's signature (pointers
    // and layouts of every input, then the output and its length, then a
    // clamp's bounds: i64 for integers, f64 for floats), every layout stays
    // inside its buffer (validated by the executor) and the output holds
    // `n` elements.
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

/// An integer clamp's bounds as the CPU takes them (`int_bounds` in
/// rustorch-cpu's elementwise/unary.rs): `x >= lo` for an integer exactly
/// when `x >= ceil(lo)`, so the lower bound rounds up and the upper down,
/// then saturates into the dtype (Rust's `as`, which also makes a missing
/// bound, taken as an infinity, the dtype's MIN or MAX). A NaN bound is the
/// CPU's InvalidInput error.
fn int_clamp_bounds(op: &Op, d: DType, lo: Option<f64>, hi: Option<f64>) -> Result<(i64, i64), BackendError> {
    if lo.is_some_and(f64::is_nan) || hi.is_some_and(f64::is_nan) {
        return Err(BackendError::invalid(
            op.name(),
            "a NaN bound cannot clamp an integer tensor",
        ));
    }
    let sat = |v: f64| -> i64 {
        match d {
            DType::U8 => v as u8 as i64,
            DType::I32 => v as i32 as i64,
            _ => v as i64,
        }
    };
    Ok((
        sat(lo.map_or(f64::NEG_INFINITY, f64::ceil)),
        sat(hi.map_or(f64::INFINITY, f64::floor)),
    ))
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
    let bad = super::ErrorFlag::new(b)?;
    let kernel = format!("int_check_{what}_{ty}");
    let f = b.function("elementwise", &kernel)?;
    let (xp, n64, bp) = (b.own(what, rhs.buffer)?.ptr(), n as i64, bad.ptr());
    let mut args = crate::launch::Launch::new(b, &f);
    args.arg(&xp).arg(&l).arg(&n64).arg(&bp);
    // SAFETY: int_check_*(x, lx, n, bad): the operand's own layout over its
    // n elements (checked by the executor), `bad` one i32.
    unsafe { args.launch(grid(n, b.sm_count)) }.map_err(|e| b.launch_err(&kernel, e))?;
    if bad.is_set(b)? {
        return Err(BackendError::invalid(what, message));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The bounds the CPU's `int_bounds` takes: lower rounded up, upper
    /// down, saturated into the dtype; none is the dtype's MIN or MAX.
    #[test]
    fn integer_clamp_bounds_are_the_cpus() {
        let op = Op::Clamp { min: None, max: None };
        let b = |d, lo, hi| int_clamp_bounds(&op, d, lo, hi).unwrap();
        assert_eq!(b(DType::I32, Some(-2.5), Some(2.5)), (-2, 2));
        assert_eq!(b(DType::I32, None, None), (i32::MIN as i64, i32::MAX as i64));
        assert_eq!(
            b(DType::I32, Some(-1e12), Some(1e12)),
            (i32::MIN as i64, i32::MAX as i64)
        );
        assert_eq!(b(DType::U8, Some(-1.5), Some(300.7)), (0, 255));
        assert_eq!(b(DType::U8, None, Some(7.9)), (0, 7));
        assert_eq!(b(DType::I64, None, Some(f64::INFINITY)), (i64::MIN, i64::MAX));
        assert_eq!(b(DType::I64, Some(3.0), Some(1.0)), (3, 1));
        let e = int_clamp_bounds(&op, DType::I32, Some(f64::NAN), None).unwrap_err();
        assert!(e.to_string().contains("NaN"), "{e}");
        assert!(int_clamp_bounds(&op, DType::U8, None, Some(f64::NAN)).is_err());
    }
}
