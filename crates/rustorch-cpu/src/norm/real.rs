//! The compute types (f32 and f64) and the vectorized row primitives the
//! normalization and attention kernels are written with, so that each
//! kernel is written once and instantiated for both.

use crate::vecmath::{dot_f32, max_f32};
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
    /// Mean of the squares: each square rounded to `Self`, summed in f64,
    /// divided in f64 and rounded once. For f32 that is GGML's rms_norm
    /// arithmetic (`ggml_float` sums), and more accurate than f32 sums.
    fn mean_sq(xs: &[Self]) -> Self;
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
    /// The rotation of the pair (x0, x1) by the angle with cosine `c` and
    /// sine `s`, as GGML's RoPE computes it: GCC contracts
    /// `x0*c - x1*s` and `x0*s + x1*c` into fused multiply-adds on the first
    /// product, so `(fma(x0, c, -(x1 s)), fma(x0, s, x1 c))`, each product
    /// `x1 s`, `x1 c` rounded first (llama.cpp's outputs match this form for
    /// every element and no other).
    #[inline(always)]
    fn rotate(x0: Self, x1: Self, c: Self, s: Self) -> (Self, Self) {
        (Self::fma(x0, c, -(x1 * s)), Self::fma(x0, s, x1 * c))
    }
    /// `a * b + c` rounded once.
    fn fma(a: Self, b: Self, c: Self) -> Self;
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
                *x = crate::vecmath::exp_f32(*x - m);
            }
            crate::vecmath::sum_f32(xs)
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

/// Rows of f32 squares summed in f64 lanes (see `Real::mean_sq`).
mod wide32 {
    const LANES: usize = 16;

    crate::simd_dispatch! {
        pub fn sum_sq_wide(xs: &[f32]) -> f64 {
            let mut acc = [0f64; LANES];
            let chunks = xs.chunks_exact(LANES);
            let rest = chunks.remainder();
            for c in chunks {
                for i in 0..LANES {
                    acc[i] += (c[i] * c[i]) as f64;
                }
            }
            let mut s: f64 = acc.iter().sum();
            for &x in rest {
                s += (x * x) as f64;
            }
            s
        }
    }
}

impl Real for f32 {
    #[inline(always)]
    fn fma(a: f32, b: f32, c: f32) -> f32 {
        a.mul_add(b, c)
    }
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
    fn mean_sq(xs: &[f32]) -> f32 {
        (wide32::sum_sq_wide(xs) / xs.len().max(1) as f64) as f32
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
    #[inline(always)]
    fn fma(a: f64, b: f64, c: f64) -> f64 {
        a.mul_add(b, c)
    }
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
    fn mean_sq(xs: &[f64]) -> f64 {
        // ((x - 0) - 0)^2 = x^2 exactly.
        k64::sum_sq_dev(xs, 0.0, 0.0) / xs.len().max(1) as f64
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f64_rows() {
        let v: Vec<f64> = (0..37).map(|i| i as f64 * 0.5 - 3.0).collect();
        let want: f64 = v.iter().map(|x| x * x).sum();
        assert!((<f64 as Real>::mean_sq(&v) - want / 37.0).abs() < 1e-12);
        let v32: Vec<f32> = v.iter().map(|&x| x as f32).collect();
        // Exact here: the squares are multiples of 1/4 below 2^8.
        assert_eq!(<f32 as Real>::mean_sq(&v32), (want / 37.0) as f32);
        assert_eq!(<f64 as Real>::max(&v), 15.0);
        let mean = <f64 as Real>::sum_shifted(&v, 2.0) / 37.0 + 2.0;
        let dev: f64 = v.iter().map(|x| (x - mean) * (x - mean)).sum();
        assert!((<f64 as Real>::sum_sq_dev(&v, 2.0, mean - 2.0) - dev).abs() < 1e-9);
    }

    #[test]
    fn four_row_kernels_match_plain_loops() {
        for n in [0usize, 3, 16, 37, 128] {
            let row = |s: usize| {
                (0..n)
                    .map(|i| ((i * 7 + s * 13) % 11) as f32 - 5.0)
                    .collect::<Vec<f32>>()
            };
            let (q, k) = (row(0), [row(1), row(2), row(3), row(4)]);
            let got = <f32 as Real>::dot4(&q, [&k[0], &k[1], &k[2], &k[3]]);
            for (g, kr) in got.iter().zip(&k) {
                let want: f32 = q.iter().zip(kr).map(|(a, b)| a * b).sum();
                assert_eq!(*g, want, "dot4 n={n}"); // small integers: exact
            }
            let mut y = row(5);
            let mut want = y.clone();
            <f32 as Real>::axpy4([1.0, -2.0, 0.5, 3.0], [&k[0], &k[1], &k[2], &k[3]], &mut y);
            for (i, w) in want.iter_mut().enumerate() {
                *w += k[0][i] - 2.0 * k[1][i] + 0.5 * k[2][i] + 3.0 * k[3][i];
            }
            assert_eq!(y, want, "axpy4 n={n}");
            let q64: Vec<f64> = q.iter().map(|&x| x as f64).collect();
            let k64: Vec<Vec<f64>> = k.iter().map(|r| r.iter().map(|&x| x as f64).collect()).collect();
            let got = <f64 as Real>::dot4(&q64, [&k64[0], &k64[1], &k64[2], &k64[3]]);
            for (g, kr) in got.iter().zip(&k64) {
                assert_eq!(*g, q64.iter().zip(kr).map(|(a, b)| a * b).sum::<f64>());
            }
        }
    }
}
