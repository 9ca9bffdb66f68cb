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
//! The AVX2 kernels form the sums as llama.cpp's AVX2 build does, exact
//! where the second operand (the activations) holds quants in -127..=127,
//! which every activation encoder gives. The four-output kernels
//! (matvecs and batches) are `exact512`'s, which have the same order.

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

#[cfg(target_arch = "x86_64")]
pub(super) use simd::{dot_avx2, dot_rows_avx2};

#[cfg(target_arch = "x86_64")]
mod simd {
    use super::{blocks, reduce8, B};
    use std::arch::x86_64::*;

    /// The 32 weight quants at `x`: their magnitudes (as u8) and
    /// themselves (for their signs), `lanes` operands loaded once a block.
    #[inline(always)]
    unsafe fn signs(x: *const u8) -> [__m256i; 2] {
        // SAFETY: 32 readable bytes at `x` (caller); AVX2 enabled in the
        // calling kernel.
        unsafe {
            let v = _mm256_loadu_si256(x.cast());
            [_mm256_sign_epi8(v, v), v]
        }
    }

    /// The eight four-product sums (lane l: products 4l..4l+3) of the
    /// weight quants `x` (`signs`) and the 32 activation quants at `y`, as
    /// llama.cpp's AVX2 `mul_sum_i8_pairs_float` forms them: |x| times y
    /// with x's sign (`vpsignb`), pairs (`vpmaddubsw`), then quads
    /// (`vpmaddwd` by ones). Exact where the activation quants lie in
    /// -127..=127 (every Q8 activation encoder's range): a pair is then at
    /// most 2 * 128 * 127, below i16's limit, for any weight byte.
    #[inline(always)]
    unsafe fn lanes(x: &[__m256i; 2], y: *const u8) -> __m256i {
        // SAFETY: as `signs`, for `y`.
        unsafe {
            let y = _mm256_loadu_si256(y.cast());
            let pairs = _mm256_maddubs_epi16(x[0], _mm256_sign_epi8(y, x[1]));
            _mm256_madd_epi16(pairs, _mm256_set1_epi16(1))
        }
    }

    /// `hsum` of a vector's eight lanes, in llama.cpp's order.
    #[inline(always)]
    unsafe fn hsum8(v: __m256) -> f32 {
        let mut lanes = [0f32; 8];
        // SAFETY: `lanes` holds eight f32 values.
        unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), v) };
        reduce8(lanes)
    }

    /// # Safety
    /// AVX2, FMA and F16C must be available (`Isa::Avx2`).
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(in super::super) unsafe fn dot_avx2(w: &[u8], a: &[u8]) -> f32 {
        let Some(nb) = blocks(w, a) else {
            return f32::NAN;
        };
        let mut acc = _mm256_setzero_ps();
        for i in 0..nb {
            let (x, y) = (&w[i * B..(i + 1) * B], &a[i * B..(i + 1) * B]);
            // F16C is enabled in this kernel. Both scales go through one
            // zeroing `vmovd` (a lone u16 would be inserted into a stale
            // register: a false dependency on the accumulator).
            let h = u16::from_le_bytes([x[0], x[1]]) as u32 | (u16::from_le_bytes([y[0], y[1]]) as u32) << 16;
            let v = _mm_cvtph_ps(_mm_cvtsi32_si128(h as i32));
            let d = _mm_cvtss_f32(v) * _mm_cvtss_f32(_mm_movehdup_ps(v));
            // SAFETY: each block has 32 quant bytes after its scale.
            let l = unsafe { lanes(&signs(x.as_ptr().add(2)), y.as_ptr().add(2)) };
            acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(l), acc);
        }
        // SAFETY: AVX enabled above.
        unsafe { hsum8(acc) }
    }

    /// One weight row against four activation rows, each output exactly
    /// as `dot_avx2` computes it (the same lane sums, scale products and
    /// order), with each weight block loaded once for the
    /// four: a batch's kernel where AVX-512 VNNI is missing (each output
    /// was a `dot_avx2` call). Rows that do not match give NaN.
    ///
    /// # Safety
    /// AVX2, FMA and F16C must be available (`Isa::Avx2`).
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(in super::super) unsafe fn dot_rows_avx2(w: &[u8], a: [&[u8]; 4], out: &mut [f32; 4]) {
        let Some(nb) = blocks(w, a[0]).filter(|&nb| a.iter().all(|r| blocks(w, r) == Some(nb))) else {
            *out = [f32::NAN; 4];
            return;
        };
        let mut acc = [_mm256_setzero_ps(); 4];
        for i in 0..nb {
            let x = &w[i * B..(i + 1) * B];
            let dw = _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(u16::from_le_bytes([x[0], x[1]]) as i32)));
            // SAFETY: each block has 32 quant bytes after its scale.
            let xw = unsafe { signs(x.as_ptr().add(2)) };
            for (r, acc) in acc.iter_mut().enumerate() {
                let y = &a[r][i * B..(i + 1) * B];
                let da = _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(u16::from_le_bytes([y[0], y[1]]) as i32)));
                // SAFETY: as above, for the activation block.
                let l = unsafe { lanes(&xw, y.as_ptr().add(2)) };
                *acc = _mm256_fmadd_ps(_mm256_set1_ps(dw * da), _mm256_cvtepi32_ps(l), *acc);
            }
        }
        for (o, acc) in out.iter_mut().zip(acc) {
            // SAFETY: AVX enabled above.
            *o = unsafe { hsum8(acc) };
        }
    }
}
