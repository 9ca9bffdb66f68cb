//! IQ4_NL weights in llama.cpp's exact x86 order (`ggml_vec_dot_iq4_nl_q8_0`,
//! arch/x86/quants.c, AVX2 branch), for matrices llama.cpp does not repack
//! (rows % 8 != 0, or inputs such as `token_embd`; see `ggml_repack`).
//!
//! Blocks go two at a time into two accumulators of eight f32 lanes:
//! lane l of `acc1` (even blocks) or `acc2` (odd blocks) takes
//! `fma(d_a * d_w, sum of products 4l..4l+3, lane)`. The result is
//! `hsum(acc1 + acc2)`, then a last odd block adds
//! `fma(d_a * d_w, sumi, sum)` (GCC contracts `sumf += d * sumi`). The
//! integer sums are exact at every level, so only this order decides the
//! bits; every level here follows it.

use super::ggml_exact::reduce8;
use rustorch_core::quant::blocks::{cast_blocks, f16_to_f32, BlockIQ4NL, BlockQ8_0, KVALUES_IQ4NL};

/// The exact integer products of one block, summed per four elements.
#[inline(always)]
fn lanes(x: &BlockIQ4NL, y: &BlockQ8_0) -> [i32; 8] {
    std::array::from_fn(|l| {
        (4 * l..4 * l + 4)
            .map(|e| {
                let q = if e < 16 { x.qs[e] & 0x0F } else { x.qs[e - 16] >> 4 };
                KVALUES_IQ4NL[q as usize] as i32 * y.qs[e] as i32
            })
            .sum()
    })
}

/// Portable version of the order above.
///
/// # Safety
/// None beyond the `DotFn` contract (it is `unsafe` only to share its type).
pub(super) unsafe fn dot_scalar(w: &[u8], a: &[u8]) -> f32 {
    let (Some(w), Some(a)) = (cast_blocks::<BlockIQ4NL>(w), cast_blocks::<BlockQ8_0>(a)) else {
        return f32::NAN;
    };
    if w.len() != a.len() {
        return f32::NAN;
    }
    let (mut acc1, mut acc2) = ([0f32; 8], [0f32; 8]);
    let pairs = w.len() / 2;
    for ib in 0..pairs {
        for (acc, b) in [(&mut acc1, 2 * ib), (&mut acc2, 2 * ib + 1)] {
            let d = f16_to_f32(a[b].d) * f16_to_f32(w[b].d);
            for (lane, s) in acc.iter_mut().zip(lanes(&w[b], &a[b])) {
                *lane = d.mul_add(s as f32, *lane);
            }
        }
    }
    let mut sum = reduce8(std::array::from_fn(|l| acc1[l] + acc2[l]));
    if w.len() % 2 == 1 {
        let b = w.len() - 1;
        let d = f16_to_f32(a[b].d) * f16_to_f32(w[b].d);
        let sumi: i32 = lanes(&w[b], &a[b]).iter().sum();
        sum = d.mul_add(sumi as f32, sum);
    }
    sum
}

#[cfg(target_arch = "x86_64")]
pub(super) use simd::dot_avx2;

#[cfg(target_arch = "x86_64")]
mod simd {
    use super::super::avx2::{u16_at, Avx2Dot};
    use super::super::WIq4Nl;
    use super::reduce8;
    use std::arch::x86_64::*;

    /// `d_a * d_w` of block `i` (f16 scales at byte 0 of both blocks).
    #[inline(always)]
    unsafe fn scale(wb: *const u8, ab: *const u8) -> f32 {
        // SAFETY: whole blocks at `wb` and `ab` (caller); F16C in the
        // kernel. Both conversions are exact.
        unsafe {
            let v = _mm_cvtph_ps(_mm_cvtsi32_si128((u16_at(ab) | u16_at(wb) << 16) as u32 as i32));
            _mm_cvtss_f32(v) * _mm_cvtss_f32(_mm_movehdup_ps(v))
        }
    }

    /// # Safety
    /// AVX2, FMA and F16C must be available (`Isa::Avx2`).
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(in super::super) unsafe fn dot_avx2(w: &[u8], a: &[u8]) -> f32 {
        let Some(nb) = super::super::blocks::<WIq4Nl>(w, a) else {
            return f32::NAN;
        };
        let (wp, ap) = (w.as_ptr(), a.as_ptr());
        let (wn, an) = (18, 34);
        let (mut acc1, mut acc2) = (_mm256_setzero_ps(), _mm256_setzero_ps());
        let mut ib = 0;
        while ib + 1 < nb {
            // SAFETY: blocks ib and ib + 1 < nb of both rows (`blocks`).
            unsafe {
                let (w0, a0) = (wp.add(ib * wn), ap.add(ib * an));
                let (w1, a1) = (w0.add(wn), a0.add(an));
                let p0 = WIq4Nl::block(w0, _mm256_loadu_si256(a0.add(2).cast()));
                let p1 = WIq4Nl::block(w1, _mm256_loadu_si256(a1.add(2).cast()));
                acc1 = _mm256_fmadd_ps(_mm256_set1_ps(scale(w0, a0)), _mm256_cvtepi32_ps(p0), acc1);
                acc2 = _mm256_fmadd_ps(_mm256_set1_ps(scale(w1, a1)), _mm256_cvtepi32_ps(p1), acc2);
            }
            ib += 2;
        }
        let mut lanes = [0f32; 8];
        // SAFETY: `lanes` holds eight f32 values; AVX enabled above.
        unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), _mm256_add_ps(acc1, acc2)) };
        let mut sum = reduce8(lanes);
        if ib < nb {
            // SAFETY: block ib < nb of both rows.
            unsafe {
                let (w0, a0) = (wp.add(ib * wn), ap.add(ib * an));
                let p = WIq4Nl::block(w0, _mm256_loadu_si256(a0.add(2).cast()));
                let mut l = [0i32; 8];
                _mm256_storeu_si256(l.as_mut_ptr().cast(), p);
                sum = scale(w0, a0).mul_add(l.iter().sum::<i32>() as f32, sum);
            }
        }
        sum
    }
}
