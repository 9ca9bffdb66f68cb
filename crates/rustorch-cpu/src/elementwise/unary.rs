//! Unary math and activations, and clamp.
//!
//! f32 uses the vectorizable functions of `vecmath`; f64 uses the standard
//! library (and `libm` for erfc), which is what PyTorch's f64 results are
//! checked against; f16/bf16 compute in f32 and round once.

use super::kernel::{map1, map_slice, Map1, Plain, Row1, ViaF32};
use super::plan::Plan;
use crate::vecmath::{self as vm, exp_f32, FastFn};
use crate::{unsupported_dtype, CpuInput, CpuResult, CpuStorage, StorageElement};
use half::{bf16, f16};
use rustorch_core::dtype::{DType, C64};
use rustorch_core::error::BackendError;
use rustorch_core::op::{Op, TensorMeta, UnaryOp};
use std::mem::MaybeUninit;

macro_rules! zst {
    ($($name:ident),*) => { $( #[derive(Clone, Copy)] pub(super) struct $name; )* };
}
zst!(Neg, Abs, Exp, Log, Sqrt, Rsqrt, Sin, Cos, Tanh, Sigmoid, Relu, Gelu, GeluTanh, Silu, Softplus);

/// Implements `Map1` for f32 and f64 from one expression per type.
macro_rules! float_map1 {
    ($name:ident, |$x:ident| f32: $e32:expr, f64: $e64:expr) => {
        impl Map1<f32, f32> for $name {
            #[inline(always)]
            fn f(self, $x: f32) -> f32 {
                $e32
            }
        }
        impl Map1<f64, f64> for $name {
            #[inline(always)]
            fn f(self, $x: f64) -> f64 {
                $e64
            }
        }
    };
}

/// Like `float_map1`, for f32 functions with a hand-written AVX-512 slice
/// kernel (`vm::map_f32_avx512`); elsewhere the portable loop runs.
macro_rules! fast_map1 {
    ($name:ident, $fast:expr, |$x:ident| f32: $e32:expr, f64: $e64:expr) => {
        impl Map1<f32, f32> for $name {
            #[inline(always)]
            fn f(self, $x: f32) -> f32 {
                $e32
            }
            #[inline(always)]
            fn slice(self, x: &[f32], out: &mut [MaybeUninit<f32>]) {
                if !vm::map_f32_avx512($fast, x, out) {
                    map_slice(self, x, out)
                }
            }
        }
        impl Map1<f64, f64> for $name {
            #[inline(always)]
            fn f(self, $x: f64) -> f64 {
                $e64
            }
        }
    };
}

float_map1!(Neg, |x| f32: -x, f64: -x);
float_map1!(Abs, |x| f32: x.abs(), f64: x.abs());
fast_map1!(Exp, FastFn::Exp, |x| f32: exp_f32(x), f64: x.exp());
float_map1!(Log, |x| f32: vm::ln_f32(x), f64: x.ln());
float_map1!(Sqrt, |x| f32: x.sqrt(), f64: x.sqrt());
float_map1!(Rsqrt, |x| f32: 1.0 / x.sqrt(), f64: 1.0 / x.sqrt());
float_map1!(Tanh, |x| f32: vm::tanh_f32(x), f64: x.tanh());
fast_map1!(Sigmoid, FastFn::Sigmoid, |x| f32: vm::sigmoid_f32(x), f64: 1.0 / (1.0 + (-x).exp()));
// `x < 0` is false for NaN, so NaN passes through as in PyTorch.
float_map1!(Relu, |x| f32: if x < 0.0 { 0.0 } else { x }, f64: if x < 0.0 { 0.0 } else { x });
fast_map1!(Gelu, FastFn::Gelu, |x| f32: vm::gelu_f32(x),
    f64: 0.5 * x * libm::erfc(-x * std::f64::consts::FRAC_1_SQRT_2));
float_map1!(GeluTanh, |x| f32: vm::gelu_tanh_f32(x),
    f64: 0.5 * x * (1.0 + (0.797_884_560_802_865_4 * (x + 0.044_715 * x * x * x)).tanh()));
fast_map1!(Silu, FastFn::Silu, |x| f32: vm::silu_f32(x), f64: x / (1.0 + (-x).exp()));
float_map1!(Softplus, |x| f32: vm::softplus_f32(x), f64: if x > 20.0 { x } else { x.exp().ln_1p() });

/// sin and cos: a vectorized pass, then exact recomputation of the rare
/// elements beyond the fast reduction's range.
macro_rules! trig_map1 {
    ($name:ident, $fast:ident, $exact:path) => {
        impl Map1<f32, f32> for $name {
            #[inline(always)]
            fn f(self, x: f32) -> f32 {
                if x.abs() > vm::TRIG_FAST_MAX && x.is_finite() {
                    $exact(x as f64) as f32
                } else {
                    vm::$fast(x)
                }
            }
            #[inline(always)]
            fn slice(self, x: &[f32], out: &mut [MaybeUninit<f32>]) {
                for (o, &v) in out.iter_mut().zip(x) {
                    o.write(vm::$fast(v));
                }
                for (o, &v) in out.iter_mut().zip(x) {
                    if v.abs() > vm::TRIG_FAST_MAX && v.is_finite() {
                        o.write($exact(v as f64) as f32);
                    }
                }
            }
        }
        impl Map1<f64, f64> for $name {
            #[inline(always)]
            fn f(self, x: f64) -> f64 {
                $exact(x)
            }
        }
    };
}
trig_map1!(Sin, sin_fast_f32, f64::sin);
trig_map1!(Cos, cos_fast_f32, f64::cos);

/// neg, abs and relu on integers wrap like PyTorch (-i64::MIN = i64::MIN).
macro_rules! int_map1 {
    ($($t:ty),*) => {$(
        impl Map1<$t, $t> for Neg {
            #[inline(always)]
            fn f(self, x: $t) -> $t {
                x.wrapping_neg()
            }
        }
        impl Map1<$t, $t> for Relu {
            #[inline(always)]
            fn f(self, x: $t) -> $t {
                x.max(0)
            }
        }
    )*};
}
int_map1!(u8, i32, i64);
impl Map1<i32, i32> for Abs {
    #[inline(always)]
    fn f(self, x: i32) -> i32 {
        x.wrapping_abs()
    }
}
impl Map1<i64, i64> for Abs {
    #[inline(always)]
    fn f(self, x: i64) -> i64 {
        x.wrapping_abs()
    }
}
impl Map1<u8, u8> for Abs {
    #[inline(always)]
    fn f(self, x: u8) -> u8 {
        x
    }
}
impl Map1<C64, C64> for Neg {
    #[inline(always)]
    fn f(self, x: C64) -> C64 {
        -x
    }
}
impl Map1<C64, C64> for Exp {
    #[inline(always)]
    fn f(self, x: C64) -> C64 {
        x.exp()
    }
}

/// Clamp to [lo, hi] as PyTorch does: NaN inputs and NaN bounds propagate,
/// and when lo > hi every element becomes hi.
#[derive(Clone, Copy)]
pub(super) struct ClampFloat<T> {
    lo: T,
    hi: T,
}

macro_rules! clamp_float {
    ($($t:ty),*) => {$(
        impl Map1<$t, $t> for ClampFloat<$t> {
            #[inline(always)]
            fn f(self, x: $t) -> $t {
                let (lo, hi) = (self.lo, self.hi);
                let y = if x < lo { lo } else { x };
                let y = if lo.is_nan() { lo } else { y };
                let z = if y > hi { hi } else { y };
                if hi.is_nan() { hi } else { z }
            }
        }
    )*};
}
clamp_float!(f32, f64);

#[derive(Clone, Copy)]
pub(super) struct ClampInt<T> {
    lo: T,
    hi: T,
}

macro_rules! clamp_int {
    ($($t:ty),*) => {$(
        impl Map1<$t, $t> for ClampInt<$t> {
            #[inline(always)]
            fn f(self, x: $t) -> $t {
                let y = if x < self.lo { self.lo } else { x };
                if y > self.hi { self.hi } else { y }
            }
        }
    )*};
}
clamp_int!(u8, i32, i64);

/// Runs a row function over one input of element type `T`.
pub(super) fn run1<T, U, R>(op: &Op, plan: &Plan<1>, x: CpuInput<'_>, row: R) -> CpuResult
where
    T: StorageElement + Default,
    U: StorageElement,
    R: Row1<T, U>,
{
    let data = x
        .storage
        .as_slice::<T>()
        .ok_or_else(|| unsupported_dtype(op, x.dtype()))?;
    Ok(vec![CpuStorage::from_vec(map1(plan, data, row))])
}

/// Binds `$k` to the element function of a floating unary op.
macro_rules! with_float_unary {
    ($u:expr, $k:ident => $body:expr) => {
        match $u {
            UnaryOp::Neg => {
                let $k = Neg;
                $body
            }
            UnaryOp::Abs => {
                let $k = Abs;
                $body
            }
            UnaryOp::Exp => {
                let $k = Exp;
                $body
            }
            UnaryOp::Log => {
                let $k = Log;
                $body
            }
            UnaryOp::Sqrt => {
                let $k = Sqrt;
                $body
            }
            UnaryOp::Rsqrt => {
                let $k = Rsqrt;
                $body
            }
            UnaryOp::Sin => {
                let $k = Sin;
                $body
            }
            UnaryOp::Cos => {
                let $k = Cos;
                $body
            }
            UnaryOp::Tanh => {
                let $k = Tanh;
                $body
            }
            UnaryOp::Sigmoid => {
                let $k = Sigmoid;
                $body
            }
            UnaryOp::Relu => {
                let $k = Relu;
                $body
            }
            UnaryOp::Gelu => {
                let $k = Gelu;
                $body
            }
            UnaryOp::GeluTanh => {
                let $k = GeluTanh;
                $body
            }
            UnaryOp::Silu => {
                let $k = Silu;
                $body
            }
            UnaryOp::Softplus => {
                let $k = Softplus;
                $body
            }
        }
    };
}

pub(super) fn unary(op: &Op, u: UnaryOp, x: CpuInput<'_>, out: &TensorMeta) -> CpuResult {
    if let Some(r) = super::stream::try_unary(u, x, out) {
        return Ok(r);
    }
    let plan = Plan::new(op, &out.shape, [x.layout])?;
    let p = &plan;
    match x.dtype() {
        DType::F32 => with_float_unary!(u, k => run1::<f32, f32, _>(op, p, x, Plain(k))),
        DType::F64 => with_float_unary!(u, k => run1::<f64, f64, _>(op, p, x, Plain(k))),
        DType::F16 => with_float_unary!(u, k => run1::<f16, f16, _>(op, p, x, ViaF32(k))),
        DType::BF16 => with_float_unary!(u, k => run1::<bf16, bf16, _>(op, p, x, ViaF32(k))),
        DType::I32 => int_unary::<i32>(op, u, p, x),
        DType::I64 => int_unary::<i64>(op, u, p, x),
        DType::U8 => int_unary::<u8>(op, u, p, x),
        DType::C64 => match u {
            UnaryOp::Neg => run1::<C64, C64, _>(op, p, x, Plain(Neg)),
            UnaryOp::Exp => run1::<C64, C64, _>(op, p, x, Plain(Exp)),
            _ => Err(unsupported_dtype(op, x.dtype())),
        },
        DType::Bool => Err(unsupported_dtype(op, x.dtype())),
    }
}

fn int_unary<T>(op: &Op, u: UnaryOp, p: &Plan<1>, x: CpuInput<'_>) -> CpuResult
where
    T: StorageElement + Default,
    Neg: Map1<T, T>,
    Abs: Map1<T, T>,
    Relu: Map1<T, T>,
{
    match u {
        UnaryOp::Neg => run1::<T, T, _>(op, p, x, Plain(Neg)),
        UnaryOp::Abs => run1::<T, T, _>(op, p, x, Plain(Abs)),
        UnaryOp::Relu => run1::<T, T, _>(op, p, x, Plain(Relu)),
        _ => Err(unsupported_dtype(op, x.dtype())),
    }
}

pub(super) fn clamp(op: &Op, lo: Option<f64>, hi: Option<f64>, x: CpuInput<'_>, out: &TensorMeta) -> CpuResult {
    let plan = Plan::new(op, &out.shape, [x.layout])?;
    let p = &plan;
    let lo_f = lo.unwrap_or(f64::NEG_INFINITY);
    let hi_f = hi.unwrap_or(f64::INFINITY);
    let f32_bounds = ClampFloat {
        lo: lo_f as f32,
        hi: hi_f as f32,
    };
    match x.dtype() {
        DType::F32 => run1::<f32, f32, _>(op, p, x, Plain(f32_bounds)),
        DType::F64 => run1::<f64, f64, _>(op, p, x, Plain(ClampFloat { lo: lo_f, hi: hi_f })),
        DType::F16 => run1::<f16, f16, _>(op, p, x, ViaF32(f32_bounds)),
        DType::BF16 => run1::<bf16, bf16, _>(op, p, x, ViaF32(f32_bounds)),
        DType::I32 => run1::<i32, i32, _>(op, p, x, Plain(int_bounds::<i32>(op, lo, hi)?)),
        DType::I64 => run1::<i64, i64, _>(op, p, x, Plain(int_bounds::<i64>(op, lo, hi)?)),
        DType::U8 => run1::<u8, u8, _>(op, p, x, Plain(int_bounds::<u8>(op, lo, hi)?)),
        DType::Bool | DType::C64 => Err(unsupported_dtype(op, x.dtype())),
    }
}

/// Integer bounds: an integer x is >= lo exactly when x >= ceil(lo), and
/// bounds outside the type's range saturate to it.
fn int_bounds<T: rustorch_core::dtype::WithDType + Bounded>(
    op: &Op,
    lo: Option<f64>,
    hi: Option<f64>,
) -> Result<ClampInt<T>, BackendError> {
    if lo.is_some_and(f64::is_nan) || hi.is_some_and(f64::is_nan) {
        return Err(BackendError::invalid(
            op.name(),
            "a NaN bound cannot clamp an integer tensor",
        ));
    }
    Ok(ClampInt {
        lo: lo.map_or(T::MIN, |v| T::from_f64(v.ceil())),
        hi: hi.map_or(T::MAX, |v| T::from_f64(v.floor())),
    })
}

pub(super) trait Bounded {
    const MIN: Self;
    const MAX: Self;
}
macro_rules! bounded {
    ($($t:ty),*) => {$( impl Bounded for $t { const MIN: $t = <$t>::MIN; const MAX: $t = <$t>::MAX; } )*};
}
bounded!(u8, i32, i64);
