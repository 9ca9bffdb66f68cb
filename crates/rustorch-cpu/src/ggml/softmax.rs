//! `ggml_soft_max_ext` on one row (ops.cpp `ggml_compute_forward_soft_max_f32`,
//! vec.cpp `ggml_vec_soft_max_f32`), without ALiBi and sinks.
//!
//! w = x * scale + mask (scaled first, then the mask added, each rounded);
//! max over w; e = exp(w - max) with `ggml_v_expf` on each full 16-lane
//! block, each block's `_mm512_reduce_add_ps` added to an f64 sum, and libm
//! `expf` for the elements after the last block, added one by one; then
//! every e multiplied by the f32 rounding of the f64 `1.0 / sum`.

use super::expf::v_expf;
use super::reduce::reduce16;

/// Softmax of `x * scale + mask` into `out` (all of one length). A row
/// whose every element is masked gives NaN, as GGML's does.
pub(crate) fn soft_max_ext_row(x: &[f32], mask: Option<&[f32]>, scale: f32, out: &mut [f32]) {
    let n = x.len();
    debug_assert!(out.len() == n && mask.is_none_or(|m| m.len() == n));
    for i in 0..n {
        let w = x[i] * scale;
        out[i] = match mask {
            Some(m) => w + m[i],
            None => w,
        };
    }
    let max = max_of(out);
    let blocks = n / 16 * 16;
    #[cfg(target_arch = "x86_64")]
    let sum = if super::has_avx512() {
        // SAFETY: AVX-512 F, DQ and FMA are present (checked above).
        unsafe { avx512::exp_blocks(&mut out[..blocks], max) }
    } else {
        exp_blocks(&mut out[..blocks], max)
    };
    #[cfg(not(target_arch = "x86_64"))]
    let sum = exp_blocks(&mut out[..blocks], max);
    let mut sum = sum;
    for v in &mut out[blocks..] {
        *v = (*v - max).exp();
        sum += *v as f64;
    }
    let inv = (1.0 / sum) as f32;
    for v in out.iter_mut() {
        *v *= inv;
    }
}

/// `ggml_vec_soft_max_f32`'s exponentials on whole 16-lane blocks (`w`'s
/// length a multiple of 16): `e = exp(w - max)` in place, and the f64 sum
/// of each block's horizontal sum.
pub(crate) fn exp_blocks_ggml(w: &mut [f32], max: f32) -> f64 {
    debug_assert!(w.len().is_multiple_of(16));
    #[cfg(target_arch = "x86_64")]
    if super::has_avx512() {
        // SAFETY: AVX-512 F, DQ and FMA are present (checked above).
        return unsafe { avx512::exp_blocks(w, max) };
    }
    exp_blocks(w, max)
}

/// The largest element (-inf for none). GGML scans one element at a time;
/// sixteen running maxima give the same value for any values but NaN (max
/// is exact and order-free; a zero's sign may differ, which `exp(w - max)`
/// does not see), and vectorize where a single one is a chain of
/// dependent compares.
fn max_of(w: &[f32]) -> f32 {
    let pick = |m: f32, v: f32| if v > m { v } else { m };
    let mut lanes = [f32::NEG_INFINITY; 16];
    let mut blocks = w.chunks_exact(16);
    for b in &mut blocks {
        for (m, &v) in lanes.iter_mut().zip(b) {
            *m = pick(*m, v);
        }
    }
    let tail = blocks.remainder().iter().fold(f32::NEG_INFINITY, |m, &v| pick(m, v));
    lanes.iter().fold(tail, |m, &v| pick(m, v))
}

crate::simd_dispatch! {
    /// e = exp(w - max) in place on whole 16-lane blocks; returns GGML's
    /// sum. (Compiled with FMA where the CPU has it: `v_expf`'s `mul_add`
    /// is otherwise a libm call; the same bits.)
    fn exp_blocks(w: &mut [f32], max: f32) -> f64 {
        let mut sum = 0f64;
        for block in w.chunks_exact_mut(16) {
            let mut e = [0f32; 16];
            for (o, &v) in e.iter_mut().zip(block.iter()) {
                *o = v_expf(v - max);
            }
            block.copy_from_slice(&e);
            sum += reduce16(&e) as f64;
        }
        sum
    }
}

/// `soft_max_ext_row` with a mask, computed only over the 16-element
/// blocks from the first unmasked position to the last: the same bits when
/// `x` is finite wherever the mask is -inf. A fully masked block then holds
/// exp(-inf) = 0 in every lane and adds an exact +0 to the f64 sum, the
/// max ignores its -inf values, and its outputs are 0 either way; the
/// blocks kept are the row's own, so each lane sums the same elements.
/// (Attention early in a conversation: llama.cpp pads the attended length
/// to 256, most of it masked.)
pub(crate) fn soft_max_ext_live(x: &[f32], mask: &[f32], scale: f32, out: &mut [f32]) {
    let Some(visible) = visible_range(mask) else {
        // All masked: GGML's NaN row.
        return soft_max_ext_row(x, Some(mask), scale, out);
    };
    let live = soft_max_ext_visible(x, mask, scale, out, visible);
    out[..live.start].fill(0.0);
    out[live.end..].fill(0.0);
}

/// The elements of a mask row from the first it does not hide (-inf) to
/// the last; `None` when it hides all.
pub(crate) fn visible_range(mask: &[f32]) -> Option<std::ops::Range<usize>> {
    let first = mask.iter().position(|&m| m != f32::NEG_INFINITY)?;
    let last = mask.iter().rposition(|&m| m != f32::NEG_INFINITY)?;
    Some(first..last + 1)
}

/// `soft_max_ext_live` for a row whose mask hides every element outside
/// `visible` (non-empty, from the first element it does not hide to the
/// last), known to the caller: writes only the blocks it computes and
/// returns their range; the rest of the row's outputs are zeros, left
/// for the caller to write.
pub(crate) fn soft_max_ext_visible(
    x: &[f32],
    mask: &[f32],
    scale: f32,
    out: &mut [f32],
    visible: std::ops::Range<usize>,
) -> std::ops::Range<usize> {
    let n = x.len();
    let blocks = n / 16 * 16;
    let lo = visible.start / 16 * 16;
    // Past the last block the elements are summed one by one: keep all of
    // them when any is unmasked.
    let hi = if visible.end > blocks {
        n
    } else {
        visible.end.next_multiple_of(16)
    };
    soft_max_ext_row(&x[lo..hi], Some(&mask[lo..hi]), scale, &mut out[lo..hi]);
    lo..hi
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::super::expf::avx512::v_expf;
    use super::super::reduce::reduce16_avx512;
    use std::arch::x86_64::*;

    /// # Safety
    /// AVX-512 F and FMA; `w.len()` a multiple of 16.
    #[target_feature(enable = "avx512f,fma")]
    pub(super) unsafe fn exp_blocks(w: &mut [f32], max: f32) -> f64 {
        let m = _mm512_set1_ps(max);
        let mut sum = 0f64;
        for block in w.chunks_exact_mut(16) {
            // SAFETY: the block holds 16 floats.
            unsafe {
                let e = v_expf(_mm512_sub_ps(_mm512_loadu_ps(block.as_ptr()), m));
                _mm512_storeu_ps(block.as_mut_ptr(), e);
                sum += reduce16_avx512(e) as f64;
            }
        }
        sum
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The live-span softmax gives the full row's bits, for unmasked spans
    /// anywhere in rows with and without a tail past the last block.
    #[test]
    fn live_span_softmax_has_the_full_rows_bits() {
        let mut seed = 9u64;
        for n in [16usize, 40, 64, 256, 263] {
            let x: Vec<f32> = (0..n)
                .map(|_| {
                    seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                    ((seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 30.0
                })
                .collect();
            for (a, b) in [(0, 1), (0, n), (3, 9), (17, 40.min(n)), (n / 2, n), (n - 1, n), (5, 5)] {
                let mask: Vec<f32> = (0..n)
                    .map(|i| {
                        if (a..b).contains(&i) && i % 7 != 3 {
                            0.0
                        } else {
                            f32::NEG_INFINITY
                        }
                    })
                    .collect();
                let (mut full, mut live) = (vec![1f32; n], vec![1f32; n]);
                soft_max_ext_row(&x, Some(&mask), 0.3, &mut full);
                soft_max_ext_live(&x, &mask, 0.3, &mut live);
                let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&full), bits(&live), "n={n} live {a}..{b}");
            }
        }
    }

    /// Against an f64 softmax: GGML's rounding stays within a few ulp.
    #[test]
    fn close_to_an_exact_softmax() {
        let mut seed = 5u64;
        for n in [1usize, 15, 16, 17, 256, 300] {
            let x: Vec<f32> = (0..n)
                .map(|_| {
                    seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                    ((seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 20.0
                })
                .collect();
            let mask: Vec<f32> = (0..n)
                .map(|i| if i % 3 == 2 { f32::NEG_INFINITY } else { 0.0 })
                .collect();
            let mut out = vec![0f32; n];
            soft_max_ext_row(&x, Some(&mask), 0.125, &mut out);
            let w: Vec<f64> = (0..n).map(|i| (x[i] * 0.125) as f64 + mask[i] as f64).collect();
            let m = w.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let s: f64 = w.iter().map(|v| (v - m).exp()).sum();
            for i in 0..n {
                let want = (w[i] - m).exp() / s;
                assert!(
                    (out[i] as f64 - want).abs() <= 4.0 * f32::EPSILON as f64 * want.max(1e-30),
                    "n={n} i={i}"
                );
            }
        }
    }
}
