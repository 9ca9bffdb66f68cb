//! Binary arithmetic with broadcasting: add, sub, mul, div, pow, maximum,
//! minimum.
//!
//! Integers wrap on overflow (as PyTorch's do); integer division truncates
//! and refuses a zero divisor, and integer pow refuses negative exponents,
//! both with PyTorch's messages. maximum/minimum propagate NaN.

use super::kernel::{map2, Map1, Map2, Plain, ViaF32};
use super::plan::Plan;
use super::unary::{run1, Rsqrt, Sqrt};
use crate::copy::contiguous;
use crate::{unsupported_dtype, CpuInput, CpuResult, CpuStorage, StorageElement};
use half::{bf16, f16};
use rustorch_core::dtype::{DType, WithDType, C64};
use rustorch_core::error::BackendError;
use rustorch_core::op::{BinaryOp, Op, TensorMeta};

macro_rules! zst {
    ($($name:ident),*) => { $( #[derive(Clone, Copy)] pub(super) struct $name; )* };
}
zst!(Add, Sub, Mul, Div, Pow, Maximum, Minimum);

macro_rules! float_map2 {
    ($($t:ty),*) => {$(
        impl Map2<$t, $t> for Add {
            #[inline(always)]
            fn f(self, a: $t, b: $t) -> $t { a + b }
        }
        impl Map2<$t, $t> for Sub {
            #[inline(always)]
            fn f(self, a: $t, b: $t) -> $t { a - b }
        }
        impl Map2<$t, $t> for Mul {
            #[inline(always)]
            fn f(self, a: $t, b: $t) -> $t { a * b }
        }
        impl Map2<$t, $t> for Div {
            #[inline(always)]
            fn f(self, a: $t, b: $t) -> $t { a / b }
        }
        impl Map2<$t, $t> for Pow {
            #[inline(always)]
            fn f(self, a: $t, b: $t) -> $t { a.powf(b) }
        }
        impl Map2<$t, $t> for Maximum {
            // On ties the first operand wins (PyTorch's sign of zero); a
            // NaN in either operand gives NaN.
            #[inline(always)]
            fn f(self, a: $t, b: $t) -> $t {
                let m = if a < b { b } else { a };
                if b.is_nan() { b } else { m }
            }
        }
        impl Map2<$t, $t> for Minimum {
            #[inline(always)]
            fn f(self, a: $t, b: $t) -> $t {
                let m = if a > b { b } else { a };
                if b.is_nan() { b } else { m }
            }
        }
    )*};
}
float_map2!(f32, f64);

macro_rules! int_map2 {
    ($($t:ty),*) => {$(
        impl Map2<$t, $t> for Add {
            #[inline(always)]
            fn f(self, a: $t, b: $t) -> $t { a.wrapping_add(b) }
        }
        impl Map2<$t, $t> for Sub {
            #[inline(always)]
            fn f(self, a: $t, b: $t) -> $t { a.wrapping_sub(b) }
        }
        impl Map2<$t, $t> for Mul {
            #[inline(always)]
            fn f(self, a: $t, b: $t) -> $t { a.wrapping_mul(b) }
        }
        impl Map2<$t, $t> for Div {
            // Zero divisors are rejected before the kernel runs; the check
            // here only keeps the division total.
            #[inline(always)]
            fn f(self, a: $t, b: $t) -> $t { if b == 0 { 0 } else { a.wrapping_div(b) } }
        }
        impl Map2<$t, $t> for Pow {
            // Square-and-multiply with wrapping products; negative
            // exponents are rejected before the kernel runs.
            #[inline(always)]
            fn f(self, a: $t, b: $t) -> $t {
                let (mut base, mut e, mut acc) = (a, b, 1 as $t);
                while e > 0 {
                    if e & 1 == 1 {
                        acc = acc.wrapping_mul(base);
                    }
                    base = base.wrapping_mul(base);
                    e >>= 1;
                }
                acc
            }
        }
        impl Map2<$t, $t> for Maximum {
            #[inline(always)]
            fn f(self, a: $t, b: $t) -> $t { a.max(b) }
        }
        impl Map2<$t, $t> for Minimum {
            #[inline(always)]
            fn f(self, a: $t, b: $t) -> $t { a.min(b) }
        }
    )*};
}
int_map2!(u8, i32, i64);

impl Map2<bool, bool> for Maximum {
    #[inline(always)]
    fn f(self, a: bool, b: bool) -> bool {
        a | b
    }
}
impl Map2<bool, bool> for Minimum {
    #[inline(always)]
    fn f(self, a: bool, b: bool) -> bool {
        a & b
    }
}

macro_rules! complex_map2 {
    ($($name:ident => $op:tt),*) => {$(
        impl Map2<C64, C64> for $name {
            #[inline(always)]
            fn f(self, a: C64, b: C64) -> C64 { a $op b }
        }
    )*};
}
complex_map2!(Add => +, Sub => -, Mul => *, Div => /);

/// Runs a row function over two inputs of element type `T`.
fn run2<T, U, R>(op: &Op, plan: &Plan<2>, a: CpuInput<'_>, b: CpuInput<'_>, row: R) -> CpuResult
where
    T: StorageElement,
    U: StorageElement,
    R: super::kernel::Row2<T, U>,
{
    let x = a
        .storage
        .as_slice::<T>()
        .ok_or_else(|| unsupported_dtype(op, a.dtype()))?;
    let y = b
        .storage
        .as_slice::<T>()
        .ok_or_else(|| unsupported_dtype(op, b.dtype()))?;
    Ok(vec![CpuStorage::from_vec(map2(plan, x, y, row))])
}

macro_rules! with_binary {
    ($b:expr, $k:ident => $body:expr) => {
        match $b {
            BinaryOp::Add => {
                let $k = Add;
                $body
            }
            BinaryOp::Sub => {
                let $k = Sub;
                $body
            }
            BinaryOp::Mul => {
                let $k = Mul;
                $body
            }
            BinaryOp::Div => {
                let $k = Div;
                $body
            }
            BinaryOp::Pow => {
                let $k = Pow;
                $body
            }
            BinaryOp::Maximum => {
                let $k = Maximum;
                $body
            }
            BinaryOp::Minimum => {
                let $k = Minimum;
                $body
            }
        }
    };
}

pub(super) fn binary(op: &Op, bop: BinaryOp, a: CpuInput<'_>, b: CpuInput<'_>, out: &TensorMeta) -> CpuResult {
    let dtype = a.dtype();
    if dtype.is_float() && bop == BinaryOp::Pow {
        if let Some(r) = pow_uniform_exponent(op, a, b, out)? {
            return Ok(r);
        }
    }
    if dtype.is_int() && matches!(bop, BinaryOp::Div | BinaryOp::Pow) {
        check_int_operand(op, bop, b)?;
    }
    if let Some(r) = super::stream::try_binary(bop, a, b, out) {
        return Ok(r);
    }
    let plan = Plan::new(op, &out.shape, [a.layout, b.layout])?;
    let p = &plan;
    match dtype {
        DType::F32 => with_binary!(bop, k => run2::<f32, f32, _>(op, p, a, b, Plain(k))),
        DType::F64 => with_binary!(bop, k => run2::<f64, f64, _>(op, p, a, b, Plain(k))),
        DType::F16 => with_binary!(bop, k => run2::<f16, f16, _>(op, p, a, b, ViaF32(k))),
        DType::BF16 => with_binary!(bop, k => run2::<bf16, bf16, _>(op, p, a, b, ViaF32(k))),
        DType::I32 => with_binary!(bop, k => run2::<i32, i32, _>(op, p, a, b, Plain(k))),
        DType::I64 => with_binary!(bop, k => run2::<i64, i64, _>(op, p, a, b, Plain(k))),
        DType::U8 => with_binary!(bop, k => run2::<u8, u8, _>(op, p, a, b, Plain(k))),
        DType::Bool => match bop {
            BinaryOp::Maximum => run2::<bool, bool, _>(op, p, a, b, Plain(Maximum)),
            BinaryOp::Minimum => run2::<bool, bool, _>(op, p, a, b, Plain(Minimum)),
            _ => Err(unsupported_dtype(op, dtype)),
        },
        DType::C64 => match bop {
            BinaryOp::Add => run2::<C64, C64, _>(op, p, a, b, Plain(Add)),
            BinaryOp::Sub => run2::<C64, C64, _>(op, p, a, b, Plain(Sub)),
            BinaryOp::Mul => run2::<C64, C64, _>(op, p, a, b, Plain(Mul)),
            BinaryOp::Div => run2::<C64, C64, _>(op, p, a, b, Plain(Div)),
            _ => Err(unsupported_dtype(op, dtype)),
        },
    }
}

/// PyTorch raises for an integer division by zero and for integer powers
/// with a negative exponent; so do we, before running anything.
fn check_int_operand(op: &Op, bop: BinaryOp, b: CpuInput<'_>) -> Result<(), BackendError> {
    fn scan<T: StorageElement + Send + Sync>(b: CpuInput<'_>, bad: impl Fn(T) -> bool) -> bool {
        b.storage
            .as_slice::<T>()
            .is_some_and(|s| contiguous(s, b.layout).iter().any(|&v| bad(v)))
    }
    let (bad, message) = match bop {
        BinaryOp::Div => (
            scan::<i32>(b, |v| v == 0) || scan::<i64>(b, |v| v == 0) || scan::<u8>(b, |v| v == 0),
            "ZeroDivisionError: integer division by zero",
        ),
        BinaryOp::Pow => (
            scan::<i32>(b, |v| v < 0) || scan::<i64>(b, |v| v < 0),
            "Integers to negative integer powers are not allowed.",
        ),
        _ => (false, ""),
    };
    if bad {
        return Err(BackendError::invalid(op.name(), message));
    }
    Ok(())
}

/// x^e for one exponent shared by every element. Like PyTorch, common
/// exponents become cheaper exact operations (x * x, sqrt, 1 / x...).
#[derive(Clone, Copy)]
pub(super) enum PowScalar<T> {
    Square,
    Cube,
    Recip,
    RecipSquare,
    Any(T),
}

macro_rules! pow_scalar {
    ($($t:ty),*) => {$(
        impl Map1<$t, $t> for PowScalar<$t> {
            #[inline(always)]
            fn f(self, x: $t) -> $t {
                match self {
                    PowScalar::Square => x * x,
                    PowScalar::Cube => x * x * x,
                    PowScalar::Recip => 1.0 / x,
                    PowScalar::RecipSquare => 1.0 / (x * x),
                    PowScalar::Any(e) => x.powf(e),
                }
            }
            // One loop per variant, so the match stays out of the loop.
            #[inline(always)]
            fn slice(self, x: &[$t], out: &mut [std::mem::MaybeUninit<$t>]) {
                macro_rules! each {
                    (|$v:ident| $e:expr) => {
                        for (o, &$v) in out.iter_mut().zip(x) {
                            o.write($e);
                        }
                    };
                }
                match self {
                    PowScalar::Square => each!(|v| v * v),
                    PowScalar::Cube => each!(|v| v * v * v),
                    PowScalar::Recip => each!(|v| 1.0 / v),
                    PowScalar::RecipSquare => each!(|v| 1.0 / (v * v)),
                    PowScalar::Any(e) => each!(|v| v.powf(e)),
                }
            }
        }
    )*};
}
pow_scalar!(f32, f64);

/// Floating pow whose exponent is a single broadcast value: runs as a unary
/// op on the base. `None` when the exponent varies.
fn pow_uniform_exponent(
    op: &Op,
    a: CpuInput<'_>,
    b: CpuInput<'_>,
    out: &TensorMeta,
) -> Result<Option<Vec<CpuStorage>>, BackendError> {
    let exponents = Plan::new(op, &out.shape, [b.layout])?;
    if !exponents.is_uniform(0) || out.shape.numel() == 0 {
        return Ok(None);
    }
    let off = b.layout.offset();
    let e = rustorch_core::with_cpu_storage!(b.storage, v, T => match v.get(off) {
        Some(x) => WithDType::to_f64(*x),
        None => return Err(BackendError::invalid(op.name(), "exponent outside its storage")),
    });
    let plan = Plan::new(op, &out.shape, [a.layout])?;
    let p = &plan;
    macro_rules! run {
        ($T:ty, $C:ty, $wrap:ident) => {{
            let s = if e == 2.0 {
                PowScalar::Square
            } else if e == 3.0 {
                PowScalar::Cube
            } else if e == -1.0 {
                PowScalar::Recip
            } else if e == -2.0 {
                PowScalar::RecipSquare
            } else {
                PowScalar::Any(e as $C)
            };
            if e == 0.5 {
                run1::<$T, $T, _>(op, p, a, $wrap(Sqrt))
            } else if e == -0.5 {
                run1::<$T, $T, _>(op, p, a, $wrap(Rsqrt))
            } else {
                run1::<$T, $T, _>(op, p, a, $wrap(s))
            }
        }};
    }
    let r = match a.dtype() {
        DType::F32 => run!(f32, f32, Plain)?,
        DType::F64 => run!(f64, f64, Plain)?,
        DType::F16 => run!(f16, f32, ViaF32)?,
        DType::BF16 => run!(bf16, f32, ViaF32)?,
        _ => return Ok(None),
    };
    Ok(Some(r))
}
