//! Vectorized inner loops of the reductions, compiled per SIMD level by
//! `simd_dispatch!`. Row kernels reduce one contiguous slice with many
//! independent lane accumulators (four AVX-512 registers' worth, so that
//! the adds of one register do not wait on the previous ones: a single
//! accumulator register runs at a quarter of the core's add throughput);
//! `*_rows` kernels combine a whole row into an accumulator row (the
//! "reduce an outer dimension" case).
//!
//! These are wider than `vecmath::sum_f32`/`max_f32` (one register of
//! lanes), which are latency-bound at about half of PyTorch's speed on
//! cache-resident data.
//!
//! Max and min propagate NaN like PyTorch: a NaN anywhere makes the result
//! NaN. `if x > acc || x != x { x } else { acc }` keeps `acc` unless `x` is
//! larger or NaN, so once an accumulator holds NaN it stays NaN.

use crate::simd_dispatch;
use half::{bf16, f16};
use std::mem::MaybeUninit;

/// Lanes of the scanning loops in `position`.
const SCAN: usize = 16;

/// Reduces a slice with `$lanes` independent accumulators: `$step(acc, x)`
/// takes in one element, `$fold(a, b)` merges two accumulators (a halving
/// tree at the end, which stays in vector registers).
///
/// Element `k` always goes into lane `k % LANES`, in order, so the grouping
/// of the operations (and so the rounding) depends on the slice's length
/// only, never on its address: equal inputs give equal bits wherever they
/// sit (a gathered copy of a strided input lands at a different alignment
/// on every call). The vector loop still starts at a 64-byte boundary,
/// since unaligned 512-bit loads split cache lines and cost ~20% on
/// streamed data: it runs on accumulators rotated by the length of the
/// unaligned head, which are rotated back before the fold.
macro_rules! lanes {
    ($xs:expr, $lanes:expr, $init:expr, |$a:ident, $x:ident| $step:expr, |$fa:ident, $fb:ident| $fold:expr) => {{
        const LANES: usize = $lanes;
        let xs = $xs;
        // Elements before the first 64-byte boundary: fewer than LANES for
        // every element type here (none when the pointer cannot be aligned).
        let h = match xs.as_ptr().align_offset(64) {
            h if h < LANES => h.min(xs.len()),
            _ => 0,
        };
        let (head, body) = xs.split_at(h);
        // `acc[i]` holds lane `(h + i) % LANES`: body element `j` (element
        // `h + j` of `xs`) goes into `acc[j % LANES]`, and head element
        // `k < h` (lane `k`) into `acc[LANES - h + k]`.
        let mut acc = [$init; LANES];
        for (slot, &$x) in acc[LANES - h..].iter_mut().zip(head) {
            let $a = *slot;
            *slot = $step;
        }
        let chunks = body.chunks_exact(LANES);
        let rest = chunks.remainder();
        for c in chunks {
            for i in 0..LANES {
                let ($a, $x) = (acc[i], c[i]);
                acc[i] = $step;
            }
        }
        for (slot, &$x) in acc.iter_mut().zip(rest) {
            let $a = *slot;
            *slot = $step;
        }
        // Back to lane order: `acc[i]` moves to `acc[(i + h) % LANES]`.
        if h > 0 {
            acc.rotate_right(h);
        }
        let mut w = LANES / 2;
        while w > 0 {
            for i in 0..w {
                let ($fa, $fb) = (acc[i], acc[i + w]);
                acc[i] = $fold;
            }
            w /= 2;
        }
        acc[0]
    }};
}

macro_rules! float_kernels {
    ($t:ty, $lanes:expr, $sum:ident, $max:ident, $min:ident, $prod:ident, $sq_dev:ident,
     $add_rows:ident, $mul_rows:ident, $max_rows:ident, $min_rows:ident, $sq_dev_rows:ident,
     $position:ident, $argmax_rows:ident, $argmin_rows:ident) => {
        simd_dispatch! {
            /// Sum with lane accumulators, folded pairwise.
            pub fn $sum(xs: &[$t]) -> $t {
                lanes!(xs, $lanes, 0.0 as $t, |a, x| a + x, |a, b| a + b)
            }
        }

        simd_dispatch! {
            /// Maximum, NaN if any element is NaN (-inf when empty).
            pub fn $max(xs: &[$t]) -> $t {
                let pick = |a: $t, x: $t| if x > a || x != x { x } else { a };
                lanes!(xs, $lanes, <$t>::NEG_INFINITY, |a, x| pick(a, x), |a, b| pick(a, b))
            }
        }

        simd_dispatch! {
            /// Minimum, NaN if any element is NaN (+inf when empty).
            pub fn $min(xs: &[$t]) -> $t {
                let pick = |a: $t, x: $t| if x < a || x != x { x } else { a };
                lanes!(xs, $lanes, <$t>::INFINITY, |a, x| pick(a, x), |a, b| pick(a, b))
            }
        }

        simd_dispatch! {
            /// Product with lane accumulators.
            pub fn $prod(xs: &[$t]) -> $t {
                lanes!(xs, $lanes, 1.0 as $t, |a, x| a * x, |a, b| a * b)
            }
        }

        simd_dispatch! {
            /// Sum of squared deviations from `mean` (the second pass of a
            /// two-pass variance, which is as accurate as Welford's).
            pub fn $sq_dev(xs: &[$t], mean: $t) -> $t {
                lanes!(xs, $lanes, 0.0 as $t, |a, x| (x - mean).mul_add(x - mean, a), |a, b| a + b)
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

        simd_dispatch! {
            /// Index of the first element equal to `m` (the first NaN when
            /// `m` is NaN); `xs.len()` when there is none. Scans 16 at a
            /// time with a vector compare, then finds the lane.
            pub fn $position(xs: &[$t], m: $t) -> usize {
                let nan = m != m;
                let hit = |v: $t| if nan { v != v } else { v == m };
                let chunks = xs.chunks_exact(SCAN);
                let tail = xs.len() - chunks.remainder().len();
                for (c, chunk) in chunks.enumerate() {
                    let mut any = false;
                    for &v in chunk {
                        any |= hit(v);
                    }
                    if any {
                        if let Some(i) = chunk.iter().position(|&v| hit(v)) {
                            return c * SCAN + i;
                        }
                    }
                }
                xs[tail..].iter().position(|&v| hit(v)).map_or(xs.len(), |i| tail + i)
            }
        }

        simd_dispatch! {
            /// Where `row[j]` beats `best[j]` (larger, or NaN over a number),
            /// takes it with index `i`.
            pub fn $argmax_rows(best: &mut [$t], idx: &mut [usize], row: &[$t], i: usize) {
                for ((b, k), &x) in best.iter_mut().zip(idx.iter_mut()).zip(row) {
                    let take = x > *b || (x != x && *b == *b);
                    *b = if take { x } else { *b };
                    *k = if take { i } else { *k };
                }
            }
        }

        simd_dispatch! {
            /// Where `row[j]` beats `best[j]` (smaller, or NaN over a number),
            /// takes it with index `i`.
            pub fn $argmin_rows(best: &mut [$t], idx: &mut [usize], row: &[$t], i: usize) {
                for ((b, k), &x) in best.iter_mut().zip(idx.iter_mut()).zip(row) {
                    let take = x < *b || (x != x && *b == *b);
                    *b = if take { x } else { *b };
                    *k = if take { i } else { *k };
                }
            }
        }
    };
}

float_kernels!(
    f32,
    64,
    sum_f32,
    max_f32,
    min_f32,
    prod_f32,
    sq_dev_f32,
    add_rows_f32,
    mul_rows_f32,
    max_rows_f32,
    min_rows_f32,
    sq_dev_rows_f32,
    position_f32,
    argmax_rows_f32,
    argmin_rows_f32
);
float_kernels!(
    f64,
    32,
    sum_f64,
    max_f64,
    min_f64,
    prod_f64,
    sq_dev_f64,
    add_rows_f64,
    mul_rows_f64,
    max_rows_f64,
    min_rows_f64,
    sq_dev_rows_f64,
    position_f64,
    argmax_rows_f64,
    argmin_rows_f64
);

/// e^x for f32: `vecmath::exp_f32`'s polynomial with a cheaper range
/// reduction. The integer part comes from one FMA with the 1.5 * 2^23
/// "magic number" (no separate `round()`, which lowers to several vector
/// ops) and the remainder from FMAs; softmax runs ~15% faster with it than
/// with `vecmath::exp_f32`, and the results agree to ~1 ulp (tested below).
#[inline(always)]
pub fn exp_f32(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    const MAGIC: f32 = 12_582_912.0; // 1.5 * 2^23
    let xc = x.clamp(-104.0, 89.0);
    // Adding MAGIC rounds xc * log2(e) to an integer held in the low
    // mantissa bits (the sum stays in [2^23, 2^24), where the spacing is 1).
    let t = xc.mul_add(LOG2E, MAGIC);
    let n = t - MAGIC;
    let ni = (t.to_bits() as i32).wrapping_sub(0x4B40_0000);
    let r = n.mul_add(-LN2_LO, n.mul_add(-LN2_HI, xc));
    let r2 = r * r;
    let mut p = 1.987_569_1e-4f32;
    p = p.mul_add(r, 1.398_199_9e-3);
    p = p.mul_add(r, 8.333_452e-3);
    p = p.mul_add(r, 4.166_579_6e-2);
    p = p.mul_add(r, 1.666_666_5e-1);
    p = p.mul_add(r, 5e-1);
    let y = p.mul_add(r2, r) + 1.0;
    // 2^n as two factors so that n from -151 to 129 stays representable.
    let n1 = ni >> 1;
    let n2 = ni.wrapping_sub(n1);
    let s1 = f32::from_bits((n1.wrapping_add(127) as u32) << 23);
    let s2 = f32::from_bits((n2.wrapping_add(127) as u32) << 23);
    let out = y * s1 * s2;
    if x.is_nan() {
        x
    } else {
        out
    }
}

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

simd_dispatch! {
    /// Rounds f32 to f16 (nearest, ties to even; overflow to inf, NaN
    /// stays NaN) without branches, so it vectorizes (F. Giesen's method).
    pub fn f32_to_f16(src: &[f32], dst: &mut [MaybeUninit<f16>]) {
        const INF: u32 = 255 << 23;
        const F16_MAX: u32 = (127 + 16) << 23;
        const DENORM_MAGIC: u32 = ((127 - 15) + (23 - 10) + 1) << 23;
        const NORMAL_MIN: u32 = 113 << 23;
        // Rebias the exponent from 127 to 15, plus the rounding constant.
        const REBIAS: u32 = ((15u32.wrapping_sub(127)) << 23).wrapping_add(0xfff);
        for (d, &f) in dst.iter_mut().zip(src) {
            let bits = f.to_bits();
            let sign = (bits >> 16) & 0x8000;
            let a = bits & 0x7fff_ffff;
            let special = if a > INF { 0x7e00 } else { 0x7c00 };
            let sub = (f32::from_bits(a) + f32::from_bits(DENORM_MAGIC)).to_bits().wrapping_sub(DENORM_MAGIC);
            let odd = (a >> 13) & 1;
            let normal = a.wrapping_add(REBIAS).wrapping_add(odd) >> 13;
            let h = if a >= F16_MAX { special } else if a < NORMAL_MIN { sub } else { normal };
            d.write(f16::from_bits((h | sign) as u16));
        }
    }
}

simd_dispatch! {
    /// Rounds f32 to bf16 (nearest, ties to even; NaN stays NaN).
    pub fn f32_to_bf16(src: &[f32], dst: &mut [MaybeUninit<bf16>]) {
        for (d, &f) in dst.iter_mut().zip(src) {
            let b = f.to_bits();
            let rounded = b.wrapping_add(0x7fff + ((b >> 16) & 1)) >> 16;
            let h = if f.is_nan() { (b >> 16) | 0x40 } else { rounded };
            d.write(bf16::from_bits(h as u16));
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
    fn exp_matches_std_and_vecmath() {
        let mut worst = 0f64;
        let mut x = -110.0f32;
        while x < 95.0 {
            let want = (x as f64).exp();
            let got = exp_f32(x) as f64;
            if want > 1e-37 && want < 3e38 {
                worst = worst.max(((got - want) / want).abs());
            }
            let v = crate::vecmath::exp_f32(x);
            assert!(
                got == v as f64 || (got - v as f64).abs() <= 4e-7 * want.max(1e-38),
                "{x}: {got} vs {v}"
            );
            x += 0.0071;
        }
        assert!(worst < 4e-7, "max relative error {worst}");
        assert_eq!(exp_f32(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp_f32(0.0), 1.0);
        assert_eq!(exp_f32(100.0), f32::INFINITY);
        assert!(exp_f32(f32::NAN).is_nan());
    }

    #[test]
    fn narrowing_matches_half() {
        // Every f16 value, the midpoints between neighbours (ties), and a
        // sweep of f32 bit patterns covering subnormals, overflow and NaN.
        let mut vals: Vec<f32> = Vec::new();
        for h in 0..=u16::MAX {
            let a = f16::from_bits(h).to_f32();
            let b = f16::from_bits(h.wrapping_add(1)).to_f32();
            vals.push(a);
            if a.is_finite() && b.is_finite() {
                vals.push((a as f64 * 0.5 + b as f64 * 0.5) as f32);
            }
        }
        vals.extend((0..=u32::MAX).step_by(4099).map(f32::from_bits));
        vals.extend([65504.0, 65519.99, 65520.0, 1e10, -1e-10, 5.96e-8, 2.98e-8, 2.99e-8]);
        let mut h = vec![MaybeUninit::new(f16::ZERO); vals.len()];
        let mut b = vec![MaybeUninit::new(bf16::ZERO); vals.len()];
        f32_to_f16(&vals, &mut h);
        f32_to_bf16(&vals, &mut b);
        for ((v, h), b) in vals.iter().zip(&h).zip(&b) {
            // SAFETY: the conversions wrote every element (and they were
            // initialized before anyway).
            let (h, b) = unsafe { (h.assume_init(), b.assume_init()) };
            let (wh, wb) = (f16::from_f32(*v), bf16::from_f32(*v));
            assert!(
                h.to_bits() == wh.to_bits() || (h.is_nan() && wh.is_nan()),
                "{v:e}: {h} vs {wh}"
            );
            assert!(
                b.to_bits() == wb.to_bits() || (b.is_nan() && wb.is_nan()),
                "{v:e}: {b} vs {wb}"
            );
        }
    }

    /// Every offset (so every alignment of the head) and length (every tail).
    #[test]
    fn lane_kernels_cover_heads_and_tails() {
        let v: Vec<f32> = (0..400).map(|i| ((i * 37) % 23) as f32 - 11.0).collect();
        for start in 0..20 {
            for len in 0..300 {
                let xs = &v[start..start + len];
                let want: f32 = xs.iter().sum();
                assert_eq!(sum_f32(xs), want, "{start} {len}");
                let mx = xs.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let mn = xs.iter().copied().fold(f32::INFINITY, f32::min);
                assert_eq!(max_f32(xs), mx);
                assert_eq!(min_f32(xs), mn);
                let sq: f32 = xs.iter().map(|x| (x - 1.0) * (x - 1.0)).sum();
                assert_eq!(sq_dev_f32(xs, 1.0), sq);
                let ones: Vec<f64> = xs.iter().map(|&x| if x > 0.0 { 1.0 } else { -1.0 }).collect();
                assert_eq!(prod_f64(&ones), ones.iter().product::<f64>());
                if len > 0 {
                    for at in [0, len / 2, len - 1] {
                        let mut w = xs.to_vec();
                        w[at] = f32::NAN;
                        assert!(max_f32(&w).is_nan() && min_f32(&w).is_nan(), "{start} {len} {at}");
                        assert_eq!(position_f32(&w, f32::NAN), at);
                    }
                }
            }
        }
    }

    /// The same values at every alignment give the same bits, those of
    /// lanes filled in index order (element `k` into lane `k % 64`).
    #[test]
    fn lane_grouping_ignores_alignment() {
        let v: Vec<f32> = (0..700).map(|i| 1.0 + ((i * 7919) % 1009) as f32 / 3001.0).collect();
        for len in [0, 1, 15, 16, 17, 63, 64, 65, 200, 700] {
            let xs = &v[..len];
            let mut lanes = [0f32; 64];
            for (k, &x) in xs.iter().enumerate() {
                lanes[k % 64] += x;
            }
            let mut w = 32;
            while w > 0 {
                for i in 0..w {
                    lanes[i] += lanes[i + w];
                }
                w /= 2;
            }
            let wide: Vec<f64> = xs.iter().map(|&x| x as f64).collect();
            for pad in 0..17 {
                let mut buf = vec![0f32; pad];
                buf.extend_from_slice(xs);
                assert_eq!(sum_f32(&buf[pad..]).to_bits(), lanes[0].to_bits(), "{len} {pad}");
                let mut buf = vec![0f64; pad];
                buf.extend_from_slice(&wide);
                let want = sum_f64(&wide);
                assert_eq!(sum_f64(&buf[pad..]).to_bits(), want.to_bits(), "{len} {pad}");
            }
        }
    }

    #[test]
    fn nan_propagates() {
        let mut v: Vec<f32> = (0..100).map(|i| i as f32).collect();
        assert_eq!(max_f64(&[1.0, 3.0, 2.0]), 3.0);
        assert_eq!(max_f32(&v), 99.0);
        assert_eq!(sum_f32(&v), 4950.0);
        assert!(max_f64(&[1.0, f64::NAN, 2.0]).is_nan());
        assert_eq!(min_f32(&v), 0.0);
        v[37] = f32::NAN;
        assert!(min_f32(&v).is_nan());
        assert!(max_f32(&v).is_nan());
        assert!(max_f32(&v[..40]).is_nan());
        let mut acc = vec![0f32; 100];
        max_rows_f32(&mut acc, &v);
        assert!(acc[37].is_nan());
        min_rows_f32(&mut acc, &[1.0; 100]);
        assert!(acc[37].is_nan());
        assert_eq!(acc[50], 1.0);
    }
}
