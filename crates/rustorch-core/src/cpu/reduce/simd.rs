//! Vectorized inner loops of the reductions, compiled per SIMD level by
//! `simd_dispatch!`. Row kernels reduce one contiguous slice with 16
//! independent lane accumulators; `*_rows` kernels combine a whole row into
//! an accumulator row (the "reduce an outer dimension" case).
//!
//! Max and min propagate NaN like PyTorch: a NaN anywhere makes the result
//! NaN. `pick_max(a, x)` keeps `a` unless `x` is larger or NaN, so once an
//! accumulator holds NaN it stays NaN.

use crate::simd_dispatch;
use half::{bf16, f16};

/// Lanes per accumulator: two AVX-512 registers of f32, four of f64.
const LANES: usize = 16;

/// Sum and max for f64 (f32 uses `vecmath::sum_f32` and `vecmath::max_f32`).
macro_rules! sum_max_kernels {
    ($t:ty, $sum:ident, $max:ident) => {
        simd_dispatch! {
            /// Sum with 16 lane accumulators.
            pub fn $sum(xs: &[$t]) -> $t {
                let mut acc = [0.0 as $t; LANES];
                let chunks = xs.chunks_exact(LANES);
                let rest = chunks.remainder();
                for c in chunks {
                    for i in 0..LANES {
                        acc[i] += c[i];
                    }
                }
                // Pairwise fold of the lanes, then the tail.
                let mut w = LANES / 2;
                while w > 0 {
                    for i in 0..w {
                        acc[i] += acc[i + w];
                    }
                    w /= 2;
                }
                let mut s = acc[0];
                for &x in rest {
                    s += x;
                }
                s
            }
        }

        simd_dispatch! {
            /// Maximum, NaN if any element is NaN (-inf when empty).
            pub fn $max(xs: &[$t]) -> $t {
                let mut acc = [<$t>::NEG_INFINITY; LANES];
                let chunks = xs.chunks_exact(LANES);
                let rest = chunks.remainder();
                for c in chunks {
                    for i in 0..LANES {
                        acc[i] = if c[i] > acc[i] || c[i] != c[i] { c[i] } else { acc[i] };
                    }
                }
                let mut m = <$t>::NEG_INFINITY;
                for &x in acc.iter().chain(rest) {
                    m = if x > m || x != x { x } else { m };
                    if m != m {
                        return m;
                    }
                }
                m
            }
        }
    };
}

macro_rules! float_kernels {
    ($t:ty, $min:ident, $prod:ident, $sq_dev:ident,
     $add_rows:ident, $mul_rows:ident, $max_rows:ident, $min_rows:ident, $sq_dev_rows:ident) => {
        simd_dispatch! {
            /// Minimum, NaN if any element is NaN (+inf when empty).
            pub fn $min(xs: &[$t]) -> $t {
                let mut acc = [<$t>::INFINITY; LANES];
                let chunks = xs.chunks_exact(LANES);
                let rest = chunks.remainder();
                for c in chunks {
                    for i in 0..LANES {
                        acc[i] = if c[i] < acc[i] || c[i] != c[i] { c[i] } else { acc[i] };
                    }
                }
                let mut m = <$t>::INFINITY;
                for &x in acc.iter().chain(rest) {
                    m = if x < m || x != x { x } else { m };
                    if m != m {
                        return m;
                    }
                }
                m
            }
        }

        simd_dispatch! {
            /// Product with 16 lane accumulators.
            pub fn $prod(xs: &[$t]) -> $t {
                let mut acc = [1.0 as $t; LANES];
                let chunks = xs.chunks_exact(LANES);
                let rest = chunks.remainder();
                for c in chunks {
                    for i in 0..LANES {
                        acc[i] *= c[i];
                    }
                }
                let mut p = 1.0 as $t;
                for &x in acc.iter().chain(rest) {
                    p *= x;
                }
                p
            }
        }

        simd_dispatch! {
            /// Sum of squared deviations from `mean` (the second pass of a
            /// two-pass variance, which is as accurate as Welford's).
            pub fn $sq_dev(xs: &[$t], mean: $t) -> $t {
                let mut acc = [0.0 as $t; LANES];
                let chunks = xs.chunks_exact(LANES);
                let rest = chunks.remainder();
                for c in chunks {
                    for i in 0..LANES {
                        let d = c[i] - mean;
                        acc[i] = d.mul_add(d, acc[i]);
                    }
                }
                let mut w = LANES / 2;
                while w > 0 {
                    for i in 0..w {
                        acc[i] += acc[i + w];
                    }
                    w /= 2;
                }
                let mut s = acc[0];
                for &x in rest {
                    let d = x - mean;
                    s = d.mul_add(d, s);
                }
                s
            }
        }

        simd_dispatch! {
            /// `acc[j] += row[j]`.
            pub fn $add_rows(acc: &mut [$t], row: &[$t]) {
                for (a, &x) in acc.iter_mut().zip(row) {
                    *a += x;
                }
            }
        }

        simd_dispatch! {
            /// `acc[j] *= row[j]`.
            pub fn $mul_rows(acc: &mut [$t], row: &[$t]) {
                for (a, &x) in acc.iter_mut().zip(row) {
                    *a *= x;
                }
            }
        }

        simd_dispatch! {
            /// `acc[j] = max(acc[j], row[j])`, NaN-propagating.
            pub fn $max_rows(acc: &mut [$t], row: &[$t]) {
                for (a, &x) in acc.iter_mut().zip(row) {
                    *a = if x > *a || x != x { x } else { *a };
                }
            }
        }

        simd_dispatch! {
            /// `acc[j] = min(acc[j], row[j])`, NaN-propagating.
            pub fn $min_rows(acc: &mut [$t], row: &[$t]) {
                for (a, &x) in acc.iter_mut().zip(row) {
                    *a = if x < *a || x != x { x } else { *a };
                }
            }
        }

        simd_dispatch! {
            /// `acc[j] += (row[j] - mean[j])^2`.
            pub fn $sq_dev_rows(acc: &mut [$t], row: &[$t], mean: &[$t]) {
                for ((a, &x), &m) in acc.iter_mut().zip(row).zip(mean) {
                    let d = x - m;
                    *a = d.mul_add(d, *a);
                }
            }
        }
    };
}

sum_max_kernels!(f64, sum_f64, max_f64);
float_kernels!(
    f32,
    min_f32,
    prod_f32,
    sq_dev_f32,
    add_rows_f32,
    mul_rows_f32,
    max_rows_f32,
    min_rows_f32,
    sq_dev_rows_f32
);
float_kernels!(
    f64,
    min_f64,
    prod_f64,
    sq_dev_f64,
    add_rows_f64,
    mul_rows_f64,
    max_rows_f64,
    min_rows_f64,
    sq_dev_rows_f64
);

simd_dispatch! {
    /// Widens bf16 to f32 (exact: a bf16 is the top half of an f32).
    pub fn bf16_to_f32(src: &[bf16], dst: &mut [f32]) {
        for (d, s) in dst.iter_mut().zip(src) {
            *d = f32::from_bits((s.to_bits() as u32) << 16);
        }
    }
}

simd_dispatch! {
    /// Widens f16 to f32 exactly, without branches so it vectorizes:
    /// shifting the exponent and mantissa into f32 position and scaling by
    /// 2^112 rebiases normals and subnormals alike; inf and NaN keep an
    /// all-ones exponent.
    pub fn f16_to_f32(src: &[f16], dst: &mut [f32]) {
        const SCALE: f32 = 5.192_297e33; // 2^112
        for (d, s) in dst.iter_mut().zip(src) {
            let h = s.to_bits() as u32;
            let sign = (h & 0x8000) << 16;
            let em = h & 0x7fff;
            let finite = (f32::from_bits(em << 13) * SCALE).to_bits();
            let bits = if em >= 0x7c00 { (em << 13) | 0x7f80_0000 } else { finite };
            *d = f32::from_bits(bits | sign);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f16_widening_is_exact() {
        let all: Vec<f16> = (0..=u16::MAX).map(f16::from_bits).collect();
        let mut out = vec![0f32; all.len()];
        f16_to_f32(&all, &mut out);
        for (h, f) in all.iter().zip(&out) {
            let want = h.to_f32();
            assert!(
                want.to_bits() == f.to_bits() || (want.is_nan() && f.is_nan()),
                "{h:?}: {f} vs {want}"
            );
        }
    }

    #[test]
    fn nan_propagates() {
        let mut v: Vec<f32> = (0..100).map(|i| i as f32).collect();
        assert_eq!(max_f64(&[1.0, 3.0, 2.0]), 3.0);
        assert!(max_f64(&[1.0, f64::NAN, 2.0]).is_nan());
        assert_eq!(min_f32(&v), 0.0);
        v[37] = f32::NAN;
        assert!(min_f32(&v).is_nan());
        let mut acc = vec![0f32; 100];
        max_rows_f32(&mut acc, &v);
        assert!(acc[37].is_nan());
        min_rows_f32(&mut acc, &[1.0; 100]);
        assert!(acc[37].is_nan());
        assert_eq!(acc[50], 1.0);
    }
}
