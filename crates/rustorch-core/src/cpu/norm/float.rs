//! Floating element types as the normalization and attention kernels see
//! them.
//!
//! Each storage type names the type it computes in (`FloatElem::Acc`): f32
//! for f16, bf16 and f32, f64 for f64. Kernels convert a row at a time into
//! the compute type, work there, and round once when storing, which is what
//! PyTorch's CPU kernels do for half types. For f32 and f64 the conversion
//! is the identity and `as_acc` lets kernels skip the copy.
//!
//! `Real` gathers the vectorized row primitives the kernels need, so each
//! kernel is written once and instantiated for f32 and f64.

use crate::cpu::copy::input_slice;
use crate::cpu::vecmath::{dot_f32, max_f32, sum_sq_f32};
use crate::cpu::{CpuInput, StorageElement};
use crate::error::BackendError;
use crate::op::Op;
use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};
use std::borrow::Cow;
use std::ops::{Add, AddAssign, Div, Mul, Neg, Sub};

/// A compute type (f32 or f64) with the row operations kernels use.
pub(crate) trait Real:
    Copy
    + Send
    + Sync
    + PartialOrd
    + Default
    + std::fmt::Debug
    + Add<Output = Self>
    + Sub<Output = Self>
    + Mul<Output = Self>
    + Div<Output = Self>
    + Neg<Output = Self>
    + AddAssign
    + 'static
{
    const ZERO: Self;
    const ONE: Self;
    const NEG_INFINITY: Self;
    fn from_f64(v: f64) -> Self;
    fn sqrt(self) -> Self;
    fn sum_sq(xs: &[Self]) -> Self;
    /// Sum of `x - shift`.
    fn sum_shifted(xs: &[Self], shift: Self) -> Self;
    /// Sum of `((x - shift) - dev)^2`: the second pass of a two-pass
    /// variance around the mean `shift + dev`. Subtracting in two steps
    /// keeps the precision that rounding `shift + dev` would lose when the
    /// mean is large and the deviations small.
    fn sum_sq_dev(xs: &[Self], shift: Self, dev: Self) -> Self;
    fn dot(a: &[Self], b: &[Self]) -> Self;
    /// Maximum; NaN when any element is NaN, -inf when empty.
    fn max(xs: &[Self]) -> Self;
    /// `out = ((x - shift) - dev) * scale`, then times `w` and plus `b`
    /// elementwise when they are given (slices of the row's length).
    fn affine(x: &[Self], out: &mut [Self], center: (Self, Self), scale: Self, w: Option<&[Self]>, b: Option<&[Self]>);
    /// `out = x * a + b` with scalars `a` and `b`.
    fn scale_shift(x: &[Self], out: &mut [Self], a: Self, b: Self);
    /// Dot products of `q` with four rows at once (independent chains, so
    /// about four times the throughput of four `dot` calls).
    fn dot4(q: &[Self], k: [&[Self]; 4]) -> [Self; 4];
    /// `y += a * x`.
    fn axpy(a: Self, x: &[Self], y: &mut [Self]);
    /// `y += a[0] x[0] + .. + a[3] x[3]`, loading and storing `y` once.
    fn axpy4(a: [Self; 4], x: [&[Self]; 4], y: &mut [Self]);
    /// `xs[i] *= a`.
    fn scale(xs: &mut [Self], a: Self);
    /// Replaces each `x` by `exp(x - m)` and returns their sum.
    fn exp_sub_sum(xs: &mut [Self], m: Self) -> Self;
}

/// The generic bodies of the row primitives, compiled per compute type.
///
/// Reductions keep `LANES` independent partial sums (4 AVX-512 registers):
/// with a single register of sums every addition waits for the previous
/// one, which caps an L1-resident row at a quarter of the adder's rate.
macro_rules! row_kernels {
    ($t:ty) => {
        const LANES: usize = 64 / std::mem::size_of::<$t>() * 4;

        crate::simd_dispatch! {
            pub fn sum_shifted(xs: &[$t], shift: $t) -> $t {
                let mut acc = [0 as $t; LANES];
                let chunks = xs.chunks_exact(LANES);
                let rest = chunks.remainder();
                for c in chunks {
                    for i in 0..LANES {
                        acc[i] += c[i] - shift;
                    }
                }
                let mut s: $t = acc.iter().sum();
                for &x in rest {
                    s += x - shift;
                }
                s
            }
        }

        crate::simd_dispatch! {
            pub fn sum_sq_dev(xs: &[$t], shift: $t, dev: $t) -> $t {
                let mut acc = [0 as $t; LANES];
                let chunks = xs.chunks_exact(LANES);
                let rest = chunks.remainder();
                for c in chunks {
                    for i in 0..LANES {
                        let d = (c[i] - shift) - dev;
                        acc[i] += d * d;
                    }
                }
                let mut s: $t = acc.iter().sum();
                for &x in rest {
                    let d = (x - shift) - dev;
                    s += d * d;
                }
                s
            }
        }

        crate::simd_dispatch! {
            pub fn affine(x: &[$t], out: &mut [$t], center: ($t, $t), scale: $t, w: Option<&[$t]>, b: Option<&[$t]>) {
                let (shift, dev) = center;
                let n = x.len().min(out.len());
                let (x, out) = (&x[..n], &mut out[..n]);
                match (w, b) {
                    (Some(w), Some(b)) => {
                        for ((o, &v), (&w, &b)) in out.iter_mut().zip(x).zip(w.iter().zip(b)) {
                            *o = ((v - shift) - dev) * scale * w + b;
                        }
                    }
                    (Some(w), None) => {
                        for ((o, &v), &w) in out.iter_mut().zip(x).zip(w) {
                            *o = ((v - shift) - dev) * scale * w;
                        }
                    }
                    (None, Some(b)) => {
                        for ((o, &v), &b) in out.iter_mut().zip(x).zip(b) {
                            *o = ((v - shift) - dev) * scale + b;
                        }
                    }
                    (None, None) => {
                        for (o, &v) in out.iter_mut().zip(x) {
                            *o = ((v - shift) - dev) * scale;
                        }
                    }
                }
            }
        }

        crate::simd_dispatch! {
            pub fn dot4(q: &[$t], k: [&[$t]; 4]) -> [$t; 4] {
                // One register of partial sums per key: four independent
                // chains, so the multiply-adds overlap.
                const W: usize = 64 / std::mem::size_of::<$t>();
                let n = q.len().min(k[0].len()).min(k[1].len()).min(k[2].len()).min(k[3].len());
                let (q, k0, k1, k2, k3) = (&q[..n], &k[0][..n], &k[1][..n], &k[2][..n], &k[3][..n]);
                // Four separate arrays (not one [[_; W]; 4]) so that LLVM
                // keeps each in a register instead of on the stack.
                let (mut a0, mut a1, mut a2, mut a3) = ([0 as $t; W], [0 as $t; W], [0 as $t; W], [0 as $t; W]);
                let full = n / W * W;
                let chunks = q[..full]
                    .chunks_exact(W)
                    .zip(k0[..full].chunks_exact(W))
                    .zip(k1[..full].chunks_exact(W))
                    .zip(k2[..full].chunks_exact(W))
                    .zip(k3[..full].chunks_exact(W));
                for ((((x, a), b), c), d) in chunks {
                    for i in 0..W {
                        a0[i] += x[i] * a[i];
                        a1[i] += x[i] * b[i];
                        a2[i] += x[i] * c[i];
                        a3[i] += x[i] * d[i];
                    }
                }
                let mut out = [a0.iter().sum(), a1.iter().sum(), a2.iter().sum(), a3.iter().sum()];
                for i in full..n {
                    out[0] += q[i] * k0[i];
                    out[1] += q[i] * k1[i];
                    out[2] += q[i] * k2[i];
                    out[3] += q[i] * k3[i];
                }
                out
            }
        }

        crate::simd_dispatch! {
            pub fn axpy4(a: [$t; 4], x: [&[$t]; 4], y: &mut [$t]) {
                let n = y.len().min(x[0].len()).min(x[1].len()).min(x[2].len()).min(x[3].len());
                let (y, x0, x1, x2, x3) = (&mut y[..n], &x[0][..n], &x[1][..n], &x[2][..n], &x[3][..n]);
                for i in 0..n {
                    y[i] += a[0] * x0[i] + a[1] * x1[i] + a[2] * x2[i] + a[3] * x3[i];
                }
            }
        }

        crate::simd_dispatch! {
            pub fn scale_shift(x: &[$t], out: &mut [$t], a: $t, b: $t) {
                for (o, &v) in out.iter_mut().zip(x) {
                    *o = v * a + b;
                }
            }
        }

        crate::simd_dispatch! {
            pub fn axpy(a: $t, x: &[$t], y: &mut [$t]) {
                for (o, &v) in y.iter_mut().zip(x) {
                    *o += a * v;
                }
            }
        }

        crate::simd_dispatch! {
            pub fn scale(xs: &mut [$t], a: $t) {
                for x in xs.iter_mut() {
                    *x *= a;
                }
            }
        }
    };
}

mod k32 {
    row_kernels!(f32);

    crate::simd_dispatch! {
        pub fn exp_sub_sum(xs: &mut [f32], m: f32) -> f32 {
            for x in xs.iter_mut() {
                *x = crate::cpu::vecmath::exp_f32(*x - m);
            }
            crate::cpu::vecmath::sum_f32(xs)
        }
    }
}

mod k64 {
    row_kernels!(f64);

    crate::simd_dispatch! {
        pub fn dot(a: &[f64], b: &[f64]) -> f64 {
            let n = a.len().min(b.len());
            let (a, b) = (&a[..n], &b[..n]);
            let mut acc = [0f64; LANES];
            let (ca, cb) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
            let (ra, rb) = (ca.remainder(), cb.remainder());
            for (x, y) in ca.zip(cb) {
                for i in 0..LANES {
                    acc[i] += x[i] * y[i];
                }
            }
            acc.iter().sum::<f64>() + ra.iter().zip(rb).map(|(x, y)| x * y).sum::<f64>()
        }
    }
}

impl Real for f32 {
    const ZERO: f32 = 0.0;
    const ONE: f32 = 1.0;
    const NEG_INFINITY: f32 = f32::NEG_INFINITY;
    #[inline(always)]
    fn from_f64(v: f64) -> f32 {
        v as f32
    }
    #[inline(always)]
    fn sqrt(self) -> f32 {
        f32::sqrt(self)
    }
    fn sum_sq(xs: &[f32]) -> f32 {
        sum_sq_f32(xs)
    }
    fn sum_shifted(xs: &[f32], shift: f32) -> f32 {
        k32::sum_shifted(xs, shift)
    }
    fn sum_sq_dev(xs: &[f32], shift: f32, dev: f32) -> f32 {
        k32::sum_sq_dev(xs, shift, dev)
    }
    fn dot(a: &[f32], b: &[f32]) -> f32 {
        dot_f32(a, b)
    }
    fn max(xs: &[f32]) -> f32 {
        max_f32(xs)
    }
    fn affine(x: &[f32], out: &mut [f32], center: (f32, f32), scale: f32, w: Option<&[f32]>, b: Option<&[f32]>) {
        k32::affine(x, out, center, scale, w, b)
    }
    fn scale_shift(x: &[f32], out: &mut [f32], a: f32, b: f32) {
        k32::scale_shift(x, out, a, b)
    }
    fn dot4(q: &[f32], k: [&[f32]; 4]) -> [f32; 4] {
        k32::dot4(q, k)
    }
    fn axpy(a: f32, x: &[f32], y: &mut [f32]) {
        k32::axpy(a, x, y)
    }
    fn axpy4(a: [f32; 4], x: [&[f32]; 4], y: &mut [f32]) {
        k32::axpy4(a, x, y)
    }
    fn scale(xs: &mut [f32], a: f32) {
        k32::scale(xs, a)
    }
    fn exp_sub_sum(xs: &mut [f32], m: f32) -> f32 {
        k32::exp_sub_sum(xs, m)
    }
}

impl Real for f64 {
    const ZERO: f64 = 0.0;
    const ONE: f64 = 1.0;
    const NEG_INFINITY: f64 = f64::NEG_INFINITY;
    #[inline(always)]
    fn from_f64(v: f64) -> f64 {
        v
    }
    #[inline(always)]
    fn sqrt(self) -> f64 {
        f64::sqrt(self)
    }
    fn sum_sq(xs: &[f64]) -> f64 {
        k64::dot(xs, xs)
    }
    fn sum_shifted(xs: &[f64], shift: f64) -> f64 {
        k64::sum_shifted(xs, shift)
    }
    fn sum_sq_dev(xs: &[f64], shift: f64, dev: f64) -> f64 {
        k64::sum_sq_dev(xs, shift, dev)
    }
    fn dot(a: &[f64], b: &[f64]) -> f64 {
        k64::dot(a, b)
    }
    fn max(xs: &[f64]) -> f64 {
        let mut m = f64::NEG_INFINITY;
        for &x in xs {
            if x.is_nan() {
                return x;
            }
            if x > m {
                m = x;
            }
        }
        m
    }
    fn affine(x: &[f64], out: &mut [f64], center: (f64, f64), scale: f64, w: Option<&[f64]>, b: Option<&[f64]>) {
        k64::affine(x, out, center, scale, w, b)
    }
    fn scale_shift(x: &[f64], out: &mut [f64], a: f64, b: f64) {
        k64::scale_shift(x, out, a, b)
    }
    fn dot4(q: &[f64], k: [&[f64]; 4]) -> [f64; 4] {
        k64::dot4(q, k)
    }
    fn axpy(a: f64, x: &[f64], y: &mut [f64]) {
        k64::axpy(a, x, y)
    }
    fn axpy4(a: [f64; 4], x: [&[f64]; 4], y: &mut [f64]) {
        k64::axpy4(a, x, y)
    }
    fn scale(xs: &mut [f64], a: f64) {
        k64::scale(xs, a)
    }
    fn exp_sub_sum(xs: &mut [f64], m: f64) -> f64 {
        let mut s = 0.0;
        for x in xs.iter_mut() {
            *x = (*x - m).exp();
            s += *x;
        }
        s
    }
}

/// A floating storage type and the type it computes in.
pub(crate) trait FloatElem: StorageElement + Send + Sync {
    type Acc: Real;
    /// The row itself when the storage type is the compute type.
    fn as_acc(xs: &[Self]) -> Option<&[Self::Acc]>;
    fn as_acc_mut(xs: &mut [Self]) -> Option<&mut [Self::Acc]>;
    /// Widens a row into `dst` (same length).
    fn load_row(src: &[Self], dst: &mut [Self::Acc]);
    /// Rounds a row into `dst` (same length), once per element.
    fn store_row(src: &[Self::Acc], dst: &mut [Self]);
    fn vec_to_acc(v: Vec<Self>) -> Vec<Self::Acc>;
}

impl FloatElem for f32 {
    type Acc = f32;
    fn as_acc(xs: &[f32]) -> Option<&[f32]> {
        Some(xs)
    }
    fn as_acc_mut(xs: &mut [f32]) -> Option<&mut [f32]> {
        Some(xs)
    }
    fn load_row(src: &[f32], dst: &mut [f32]) {
        dst.copy_from_slice(src)
    }
    fn store_row(src: &[f32], dst: &mut [f32]) {
        dst.copy_from_slice(src)
    }
    fn vec_to_acc(v: Vec<f32>) -> Vec<f32> {
        v
    }
}

impl FloatElem for f64 {
    type Acc = f64;
    fn as_acc(xs: &[f64]) -> Option<&[f64]> {
        Some(xs)
    }
    fn as_acc_mut(xs: &mut [f64]) -> Option<&mut [f64]> {
        Some(xs)
    }
    fn load_row(src: &[f64], dst: &mut [f64]) {
        dst.copy_from_slice(src)
    }
    fn store_row(src: &[f64], dst: &mut [f64]) {
        dst.copy_from_slice(src)
    }
    fn vec_to_acc(v: Vec<f64>) -> Vec<f64> {
        v
    }
}

impl FloatElem for f16 {
    type Acc = f32;
    fn as_acc(_: &[f16]) -> Option<&[f32]> {
        None
    }
    fn as_acc_mut(_: &mut [f16]) -> Option<&mut [f32]> {
        None
    }
    fn load_row(src: &[f16], dst: &mut [f32]) {
        // `half` converts 8 lanes at a time with F16C when the CPU has it.
        src.convert_to_f32_slice(dst)
    }
    fn store_row(src: &[f32], dst: &mut [f16]) {
        dst.convert_from_f32_slice(src)
    }
    fn vec_to_acc(v: Vec<f16>) -> Vec<f32> {
        v.to_f32_vec()
    }
}

crate::simd_dispatch! {
    fn bf16_to_f32_row(src: &[bf16], dst: &mut [f32]) {
        for (d, s) in dst.iter_mut().zip(src) {
            *d = f32::from_bits((s.to_bits() as u32) << 16);
        }
    }
}

crate::simd_dispatch! {
    /// Round to nearest even, NaN kept quiet: the same bits as
    /// `bf16::from_f32`, written without branches so it vectorizes.
    fn f32_to_bf16_row(src: &[f32], dst: &mut [bf16]) {
        for (d, s) in dst.iter_mut().zip(src) {
            let x = s.to_bits();
            let rounded = (x.wrapping_add(0x7fff + ((x >> 16) & 1)) >> 16) as u16;
            let nan = ((x >> 16) | 0x0040) as u16;
            *d = bf16::from_bits(if (x & 0x7fff_ffff) > 0x7f80_0000 { nan } else { rounded });
        }
    }
}

impl FloatElem for bf16 {
    type Acc = f32;
    fn as_acc(_: &[bf16]) -> Option<&[f32]> {
        None
    }
    fn as_acc_mut(_: &mut [bf16]) -> Option<&mut [f32]> {
        None
    }
    fn load_row(src: &[bf16], dst: &mut [f32]) {
        bf16_to_f32_row(src, dst)
    }
    fn store_row(src: &[f32], dst: &mut [bf16]) {
        f32_to_bf16_row(src, dst)
    }
    fn vec_to_acc(v: Vec<bf16>) -> Vec<f32> {
        let mut out = vec![0f32; v.len()];
        bf16_to_f32_row(&v, &mut out);
        out
    }
}

/// An input's elements, contiguous, in the compute type of `T` (borrowed
/// when no conversion or gather is needed).
pub(crate) fn acc_input<'a, T: FloatElem>(op: &Op, input: CpuInput<'a>) -> Result<Cow<'a, [T::Acc]>, BackendError> {
    Ok(match input_slice::<T>(op, input)? {
        Cow::Borrowed(s) => match T::as_acc(s) {
            Some(a) => Cow::Borrowed(a),
            None => {
                let mut v = vec![T::Acc::ZERO; s.len()];
                T::load_row(s, &mut v);
                Cow::Owned(v)
            }
        },
        Cow::Owned(v) => Cow::Owned(T::vec_to_acc(v)),
    })
}


#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bf16_rounding_matches_half() {
        let vals = [
            0.0f32,
            -0.0,
            1.0,
            1.00390625,
            1.01171875,
            3.1415927,
            -2.7182817,
            1e-40,
            f32::MAX,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            65504.0,
            1.0 + f32::EPSILON,
        ];
        let mut out = vec![bf16::ZERO; vals.len()];
        f32_to_bf16_row(&vals, &mut out);
        for (v, o) in vals.iter().zip(&out) {
            assert_eq!(o.to_bits(), bf16::from_f32(*v).to_bits(), "{v}");
        }
        let mut back = vec![0f32; vals.len()];
        bf16_to_f32_row(&out, &mut back);
        for (o, b) in out.iter().zip(&back) {
            assert_eq!(o.to_f32().to_bits(), b.to_bits());
        }
    }

    #[test]
    fn f64_rows() {
        let v: Vec<f64> = (0..37).map(|i| i as f64 * 0.5 - 3.0).collect();
        let want: f64 = v.iter().map(|x| x * x).sum();
        assert!((<f64 as Real>::sum_sq(&v) - want).abs() < 1e-12);
        assert_eq!(<f64 as Real>::max(&v), 15.0);
        let mean = <f64 as Real>::sum_shifted(&v, 2.0) / 37.0 + 2.0;
        let dev: f64 = v.iter().map(|x| (x - mean) * (x - mean)).sum();
        assert!((<f64 as Real>::sum_sq_dev(&v, 2.0, mean - 2.0) - dev).abs() < 1e-9);
    }
}
