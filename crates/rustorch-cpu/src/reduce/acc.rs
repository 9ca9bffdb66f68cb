//! Accumulator types and how each element type loads into one.
//!
//! f16, bf16 and f32 accumulate in f32, f64 in f64, and integers and bools
//! in i64 (PyTorch's sum and prod of small integers are i64 anyway). Kernels
//! are written once per accumulator type; an element type only says how to
//! widen a slice of itself (`Elem::load`) and the result is narrowed once at
//! the end (`Acc::into_storage`).

use super::simd;
use crate::{CpuStorage, StorageElement};
use half::{bf16, f16, slice::HalfFloatSliceExt};
use rustorch_core::dtype::DType;

pub(super) trait Acc: Copy + Send + Sync + PartialEq + std::fmt::Debug + 'static {
    const ZERO: Self;
    const ONE: Self;
    fn sum(xs: &[Self]) -> Self;
    fn prod(xs: &[Self]) -> Self;
    /// Maximum of a non-empty slice; NaN when any element is NaN.
    fn max(xs: &[Self]) -> Self;
    fn min(xs: &[Self]) -> Self;
    /// Sum of `(x - mean)^2`.
    fn sq_dev(xs: &[Self], mean: Self) -> Self;
    fn add(a: Self, b: Self) -> Self;
    fn mul(a: Self, b: Self) -> Self;
    /// Whether `x` replaces `best` as the maximum: it is larger, or NaN
    /// where `best` is not (PyTorch's NaN-propagating max and argmax).
    fn beats_max(x: Self, best: Self) -> bool;
    fn beats_min(x: Self, best: Self) -> bool;
    fn add_rows(acc: &mut [Self], row: &[Self]);
    fn mul_rows(acc: &mut [Self], row: &[Self]);
    fn max_rows(acc: &mut [Self], row: &[Self]);
    fn min_rows(acc: &mut [Self], row: &[Self]);
    fn sq_dev_rows(acc: &mut [Self], row: &[Self], mean: &[Self]);
    /// Index of the first element equal to `m` (the first NaN when `m` is
    /// NaN); `xs.len()` when there is none.
    fn position(xs: &[Self], m: Self) -> usize;
    /// Where `row[j]` beats `best[j]` (see `beats_max`/`beats_min`), takes
    /// it with index `i`.
    fn arg_rows(best: &mut [Self], idx: &mut [usize], row: &[Self], i: usize, max: bool);
    /// `x / n` (the mean of `n` values summing to `x`).
    fn div_count(x: Self, n: usize) -> Self;
    /// Variance from the sum of squared deviations of `n` values, with
    /// PyTorch's divisor `max(0, n - correction)`.
    fn variance(m2: Self, n: usize, correction: u32) -> Self;
    fn sqrt(self) -> Self;
    /// The values as a tensor of `dtype` (rounded once); `None` when this
    /// accumulator does not narrow to that dtype.
    fn into_storage(v: Vec<Self>, dtype: DType) -> Option<CpuStorage>;
}

macro_rules! float_acc {
    ($t:ty, $sum:path, $max:path, $min:path, $prod:path, $sq:path,
     $add_rows:path, $mul_rows:path, $max_rows:path, $min_rows:path, $sq_rows:path,
     $position:path, $argmax_rows:path, $argmin_rows:path) => {
        impl Acc for $t {
            const ZERO: Self = 0.0;
            const ONE: Self = 1.0;
            fn sum(xs: &[Self]) -> Self {
                $sum(xs)
            }
            fn prod(xs: &[Self]) -> Self {
                $prod(xs)
            }
            fn max(xs: &[Self]) -> Self {
                $max(xs)
            }
            fn min(xs: &[Self]) -> Self {
                $min(xs)
            }
            fn sq_dev(xs: &[Self], mean: Self) -> Self {
                $sq(xs, mean)
            }
            #[inline(always)]
            fn add(a: Self, b: Self) -> Self {
                a + b
            }
            #[inline(always)]
            fn mul(a: Self, b: Self) -> Self {
                a * b
            }
            #[inline(always)]
            fn beats_max(x: Self, best: Self) -> bool {
                x > best || (x.is_nan() && !best.is_nan())
            }
            #[inline(always)]
            fn beats_min(x: Self, best: Self) -> bool {
                x < best || (x.is_nan() && !best.is_nan())
            }
            fn add_rows(acc: &mut [Self], row: &[Self]) {
                $add_rows(acc, row)
            }
            fn mul_rows(acc: &mut [Self], row: &[Self]) {
                $mul_rows(acc, row)
            }
            fn max_rows(acc: &mut [Self], row: &[Self]) {
                $max_rows(acc, row)
            }
            fn min_rows(acc: &mut [Self], row: &[Self]) {
                $min_rows(acc, row)
            }
            fn sq_dev_rows(acc: &mut [Self], row: &[Self], mean: &[Self]) {
                $sq_rows(acc, row, mean)
            }
            fn position(xs: &[Self], m: Self) -> usize {
                $position(xs, m)
            }
            fn arg_rows(best: &mut [Self], idx: &mut [usize], row: &[Self], i: usize, max: bool) {
                if max {
                    $argmax_rows(best, idx, row, i)
                } else {
                    $argmin_rows(best, idx, row, i)
                }
            }
            fn div_count(x: Self, n: usize) -> Self {
                x / n as Self
            }
            fn variance(m2: Self, n: usize, correction: u32) -> Self {
                m2 / n.saturating_sub(correction as usize) as Self
            }
            fn sqrt(self) -> Self {
                <$t>::sqrt(self)
            }
            fn into_storage(v: Vec<Self>, dtype: DType) -> Option<CpuStorage> {
                narrow_float(v, dtype)
            }
        }
    };
}

float_acc!(
    f32,
    simd::sum_f32,
    simd::max_f32,
    simd::min_f32,
    simd::prod_f32,
    simd::sq_dev_f32,
    simd::add_rows_f32,
    simd::mul_rows_f32,
    simd::max_rows_f32,
    simd::min_rows_f32,
    simd::sq_dev_rows_f32,
    simd::position_f32,
    simd::argmax_rows_f32,
    simd::argmin_rows_f32
);
float_acc!(
    f64,
    simd::sum_f64,
    simd::max_f64,
    simd::min_f64,
    simd::prod_f64,
    simd::sq_dev_f64,
    simd::add_rows_f64,
    simd::mul_rows_f64,
    simd::max_rows_f64,
    simd::min_rows_f64,
    simd::sq_dev_rows_f64,
    simd::position_f64,
    simd::argmax_rows_f64,
    simd::argmin_rows_f64
);

/// Narrowing of float accumulators: f32 to f32/f16/bf16, f64 to f64.
trait NarrowFloat: Sized {
    fn narrow(v: Vec<Self>, dtype: DType) -> Option<CpuStorage>;
}
impl NarrowFloat for f32 {
    fn narrow(v: Vec<f32>, dtype: DType) -> Option<CpuStorage> {
        Some(match dtype {
            DType::F32 => CpuStorage::F32(v),
            DType::F16 => {
                let mut out = vec![f16::ZERO; v.len()];
                out.convert_from_f32_slice(&v);
                CpuStorage::F16(out)
            }
            DType::BF16 => {
                let mut out = vec![bf16::ZERO; v.len()];
                out.convert_from_f32_slice(&v);
                CpuStorage::BF16(out)
            }
            _ => return None,
        })
    }
}
impl NarrowFloat for f64 {
    fn narrow(v: Vec<f64>, dtype: DType) -> Option<CpuStorage> {
        (dtype == DType::F64).then_some(CpuStorage::F64(v))
    }
}
fn narrow_float<T: NarrowFloat>(v: Vec<T>, dtype: DType) -> Option<CpuStorage> {
    T::narrow(v, dtype)
}

/// Integers: wrapping arithmetic like PyTorch's (two's complement) kernels.
/// Mean and variance of integers are rejected before any kernel runs; the
/// float-only methods still give sensible values.
impl Acc for i64 {
    const ZERO: Self = 0;
    const ONE: Self = 1;
    fn sum(xs: &[Self]) -> Self {
        xs.iter().fold(0i64, |a, &x| a.wrapping_add(x))
    }
    fn prod(xs: &[Self]) -> Self {
        xs.iter().fold(1i64, |a, &x| a.wrapping_mul(x))
    }
    fn max(xs: &[Self]) -> Self {
        xs.iter().copied().max().unwrap_or(i64::MIN)
    }
    fn min(xs: &[Self]) -> Self {
        xs.iter().copied().min().unwrap_or(i64::MAX)
    }
    fn sq_dev(xs: &[Self], mean: Self) -> Self {
        xs.iter().fold(0i64, |a, &x| {
            let d = x.wrapping_sub(mean);
            a.wrapping_add(d.wrapping_mul(d))
        })
    }
    fn add(a: Self, b: Self) -> Self {
        a.wrapping_add(b)
    }
    fn mul(a: Self, b: Self) -> Self {
        a.wrapping_mul(b)
    }
    fn beats_max(x: Self, best: Self) -> bool {
        x > best
    }
    fn beats_min(x: Self, best: Self) -> bool {
        x < best
    }
    fn add_rows(acc: &mut [Self], row: &[Self]) {
        acc.iter_mut().zip(row).for_each(|(a, &x)| *a = a.wrapping_add(x));
    }
    fn mul_rows(acc: &mut [Self], row: &[Self]) {
        acc.iter_mut().zip(row).for_each(|(a, &x)| *a = a.wrapping_mul(x));
    }
    fn max_rows(acc: &mut [Self], row: &[Self]) {
        acc.iter_mut().zip(row).for_each(|(a, &x)| *a = (*a).max(x));
    }
    fn min_rows(acc: &mut [Self], row: &[Self]) {
        acc.iter_mut().zip(row).for_each(|(a, &x)| *a = (*a).min(x));
    }
    fn sq_dev_rows(acc: &mut [Self], row: &[Self], mean: &[Self]) {
        for ((a, &x), &m) in acc.iter_mut().zip(row).zip(mean) {
            let d = x.wrapping_sub(m);
            *a = a.wrapping_add(d.wrapping_mul(d));
        }
    }
    fn position(xs: &[Self], m: Self) -> usize {
        xs.iter().position(|&x| x == m).unwrap_or(xs.len())
    }
    fn arg_rows(best: &mut [Self], idx: &mut [usize], row: &[Self], i: usize, max: bool) {
        for ((b, k), &x) in best.iter_mut().zip(idx.iter_mut()).zip(row) {
            if if max { x > *b } else { x < *b } {
                *b = x;
                *k = i;
            }
        }
    }
    fn div_count(x: Self, n: usize) -> Self {
        x.checked_div(n as i64).unwrap_or(0)
    }
    fn variance(m2: Self, n: usize, correction: u32) -> Self {
        m2.checked_div(n.saturating_sub(correction as usize) as i64)
            .unwrap_or(0)
    }
    fn sqrt(self) -> Self {
        (self as f64).sqrt() as i64
    }
    fn into_storage(v: Vec<Self>, dtype: DType) -> Option<CpuStorage> {
        Some(match dtype {
            DType::I64 => CpuStorage::I64(v),
            DType::I32 => CpuStorage::I32(v.into_iter().map(|x| x as i32).collect()),
            DType::U8 => CpuStorage::U8(v.into_iter().map(|x| x as u8).collect()),
            DType::Bool => CpuStorage::Bool(v.into_iter().map(|x| x != 0).collect()),
            _ => return None,
        })
    }
}

/// An element type that reductions read.
pub(super) trait Elem: StorageElement + Send + Sync {
    type A: Acc;
    /// The elements as accumulator values: `src` itself when they already
    /// are, else widened into `buf`.
    fn load<'a>(src: &'a [Self], buf: &'a mut Vec<Self::A>) -> &'a [Self::A];
}

macro_rules! identity_elem {
    ($t:ty) => {
        impl Elem for $t {
            type A = $t;
            #[inline(always)]
            fn load<'a>(src: &'a [Self], _buf: &'a mut Vec<Self>) -> &'a [Self] {
                src
            }
        }
    };
}
identity_elem!(f32);
identity_elem!(f64);
identity_elem!(i64);

/// `len` elements of `buf` from a 64-byte boundary: widened values placed
/// there need no unaligned head in the lane kernels, which saves their
/// head and lane-rotation steps on every block (the results are the same
/// at any address; only the cost differs).
fn aligned(buf: &mut Vec<f32>, len: usize) -> &mut [f32] {
    const PAD: usize = 64 / std::mem::size_of::<f32>();
    buf.resize(len + PAD, 0.0);
    let at = buf.as_ptr().align_offset(64).min(PAD);
    &mut buf[at..at + len]
}

impl Elem for f16 {
    type A = f32;
    fn load<'a>(src: &'a [Self], buf: &'a mut Vec<f32>) -> &'a [f32] {
        let dst = aligned(buf, src.len());
        simd::f16_to_f32(src, dst);
        dst
    }
}
impl Elem for bf16 {
    type A = f32;
    fn load<'a>(src: &'a [Self], buf: &'a mut Vec<f32>) -> &'a [f32] {
        let dst = aligned(buf, src.len());
        simd::bf16_to_f32(src, dst);
        dst
    }
}
macro_rules! int_elem {
    ($t:ty) => {
        impl Elem for $t {
            type A = i64;
            fn load<'a>(src: &'a [Self], buf: &'a mut Vec<i64>) -> &'a [i64] {
                buf.clear();
                buf.extend(src.iter().map(|&x| x as i64));
                buf
            }
        }
    };
}
int_elem!(i32);
int_elem!(u8);
int_elem!(bool);
