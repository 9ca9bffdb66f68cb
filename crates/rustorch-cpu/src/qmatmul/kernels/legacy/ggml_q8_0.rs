//! Q8_0 weights against Q8_0 activations in llama.cpp's exact x86 order.
//!
//! llama.cpp computes every output of a Q8_0 product the same way, whether
//! through `ggml_vec_dot_q8_0_q8_0` (arch/x86/quants.c, m = 1) or
//! tinyBLAS_Q0_AVX (llamafile/sgemm.cpp, m >= 2; all its tile shapes do
//! the same per-element work): eight f32 lanes, lane l holding
//! `fma(d_w * d_a, sum of the four products 4l..4l+3 of the block, lane)`
//! block after block, then `hsum`: `r[i] = lane[4 + i] + lane[i]`,
//! `(r[0] + r[2]) + (r[1] + r[3])`. The four-product sums are exact
//! integers (at most 4 * 128 * 128 in magnitude, exact in f32), so any
//! exact way of forming them gives the same bits; only the float order
//! matters, and every level here follows it.
//!
//! This is the portable kernel. On x86 the same order comes from
//! `ggml_exact`'s kernels over `W8_0` (its `Avx2Dot` forms the lane sums as
//! llama.cpp's AVX2 build does, exact for activation quants in -127..=127,
//! which every activation encoder gives) and `exact512`'s four-output
//! kernels.

use rustorch_core::quant::blocks::f16_to_f32;

/// Bytes per Q8_0 block: an f16 scale, then 32 signed quants.
const B: usize = 34;

/// The block count of two matching rows; `None` if they do not match
/// (the driver never passes such rows, so kernels answer NaN).
#[inline(always)]
fn blocks(w: &[u8], a: &[u8]) -> Option<usize> {
    (w.len() == a.len() && w.len().is_multiple_of(B)).then_some(w.len() / B)
}

#[inline(always)]
fn scale(block: &[u8]) -> f32 {
    f16_to_f32([block[0], block[1]])
}

/// llama.cpp's `hsum` of eight f32 lanes (`hsum_float_8`).
#[inline(always)]
fn reduce8(acc: [f32; 8]) -> f32 {
    let r: [f32; 4] = std::array::from_fn(|i| acc[4 + i] + acc[i]);
    (r[0] + r[2]) + (r[1] + r[3])
}

/// Portable version: the same lanes, `f32::mul_add` (one rounding, as
/// `_mm256_fmadd_ps`) per lane and block.
///
/// # Safety
/// None beyond the `DotFn` contract (it is `unsafe` only to share its type).
pub(super) unsafe fn dot_scalar(w: &[u8], a: &[u8]) -> f32 {
    if blocks(w, a).is_none() {
        return f32::NAN;
    }
    let mut acc = [0f32; 8];
    for (x, y) in w.chunks_exact(B).zip(a.chunks_exact(B)) {
        let d = scale(x) * scale(y);
        for (l, lane) in acc.iter_mut().enumerate() {
            let s: i32 = (0..4)
                .map(|t| x[2 + 4 * l + t] as i8 as i32 * y[2 + 4 * l + t] as i8 as i32)
                .sum();
            *lane = d.mul_add(s as f32, *lane);
        }
    }
    reduce8(acc)
}
