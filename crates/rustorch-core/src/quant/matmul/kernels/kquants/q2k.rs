//! Q2_K weights (16 groups of 16: `d * sc * q - dmin * m`, q in 2 bits, sc
//! and m in the low and high nibble of `scales[g]`).
//!
//! Block layout: half `h` (128 values) takes 32 bytes of `qs`; value
//! `128h + 32s + l` is bits `2s..2s+2` of `qs[32h + l]`.

// Group and chunk indices address several arrays with different strides.
#![allow(clippy::needless_range_loop)]

use crate::quant::blocks::{cast_blocks, f16_to_f32, BlockQ2K, BlockQ8K};
use crate::quant::matmul::kernels::DotFn;
use crate::quant::matmul::Isa;

pub(super) fn kernel(isa: Isa) -> Option<DotFn> {
    match isa {
        Isa::Scalar => Some(dot_scalar),
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => Some(dot_avx2),
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512Vnni => Some(dot_avx512),
        #[cfg(not(target_arch = "x86_64"))]
        _ => None,
    }
}

fn blocks<'a>(w: &'a [u8], a: &'a [u8]) -> Option<(&'a [BlockQ2K], &'a [BlockQ8K])> {
    Some((cast_blocks(w)?, cast_blocks(a)?))
}

/// llama.cpp's `ggml_vec_dot_q2_K_q8_K_generic`: one i32 sum per block,
/// `dall * isum - dmin * summs` added to one f32.
unsafe fn dot_scalar(w: &[u8], a: &[u8]) -> f32 {
    let Some((w, a)) = blocks(w, a) else {
        return f32::NAN;
    };
    let mut sumf = 0f32;
    for (x, y) in w.iter().zip(a) {
        let summs: i32 = (0..16).map(|j| y.bsum(j) as i32 * (x.scales[j] >> 4) as i32).sum();
        let dall = y.scale() * f16_to_f32(x.d);
        let dmin = y.scale() * f16_to_f32(x.dmin);
        let mut isum = 0i32;
        for g in 0..16 {
            let (h, s, half) = (g / 8, (g % 8) / 2, g % 2);
            let qs = &x.qs[32 * h + 16 * half..32 * h + 16 * half + 16];
            let q8 = &y.qs[16 * g..16 * g + 16];
            let isuml: i32 = qs
                .iter()
                .zip(q8)
                .map(|(&q, &v)| v as i32 * ((q >> (2 * s)) & 3) as i32)
                .sum();
            isum += (x.scales[g] & 0xF) as i32 * isuml;
        }
        sumf += dall * isum as f32 - dmin * summs as f32;
    }
    sumf
}

/// llama.cpp's AVX2 `ggml_vec_dot_q2_K_q8_K`: the min terms by `madd` of
/// the mins with `bsums`, then per 32 values one `maddubs` and one `madd`
/// with the scales; both FMAs into the same f32 lanes.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_avx2(w: &[u8], a: &[u8]) -> f32 {
    use std::arch::x86_64::*;
    let Some((w, a)) = blocks(w, a) else {
        return f32::NAN;
    };
    let m3 = _mm256_set1_epi8(3);
    let m4 = _mm_set1_epi8(0xF);
    let mut acc = _mm256_setzero_ps();
    for (x, y) in w.iter().zip(a) {
        let d = y.scale() * f16_to_f32(x.d);
        let dmin = -y.scale() * f16_to_f32(x.dmin);
        // SAFETY (all loads below): each pointer is to a field of a block
        // with at least as many bytes as the load reads; unaligned loads.
        let mins_and_scales = unsafe { _mm_loadu_si128(x.scales.as_ptr().cast()) };
        let scales8 = _mm_and_si128(mins_and_scales, m4);
        let mins8 = _mm_and_si128(_mm_srli_epi16::<4>(mins_and_scales), m4);
        let bsums = unsafe { _mm256_loadu_si256(y.bsums.as_ptr().cast()) };
        let prod = _mm256_madd_epi16(_mm256_cvtepi8_epi16(mins8), bsums);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(dmin), _mm256_cvtepi32_ps(prod), acc);

        let all_scales = _mm256_cvtepi8_epi16(scales8);
        let l_scales = _mm256_castsi256_si128(all_scales);
        let h_scales = _mm256_extracti128_si256::<1>(all_scales);
        let scales = [
            _mm256_set_m128i(l_scales, l_scales),
            _mm256_set_m128i(h_scales, h_scales),
        ];
        let mut sumi = _mm256_setzero_si256();
        for j in 0..2 {
            let q2bits = unsafe { _mm256_loadu_si256(x.qs.as_ptr().add(32 * j).cast()) };
            let mut p = [_mm256_setzero_si256(); 4];
            for k in 0..4 {
                let q2 = _mm256_and_si256(_mm256_srl_epi16(q2bits, _mm_cvtsi32_si128(2 * k as i32)), m3);
                let q8 = unsafe { _mm256_loadu_si256(y.qs.as_ptr().add(128 * j + 32 * k).cast()) };
                let pick = _mm256_set_m128i(
                    _mm_set1_epi16(super::word(2 * k + 1)),
                    _mm_set1_epi16(super::word(2 * k)),
                );
                p[k] = _mm256_madd_epi16(_mm256_shuffle_epi8(scales[j], pick), _mm256_maddubs_epi16(q2, q8));
            }
            let p01 = _mm256_add_epi32(p[0], p[1]);
            let p23 = _mm256_add_epi32(p[2], p[3]);
            sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(p01, p23));
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
    }
    super::hsum_float_8(acc)
}

/// AVX-512 VNNI: 64 two-bit quants per `vpdpbusd`, the 4-bit scales
/// through `vpdpwssd`, the min terms as in AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn dot_avx512(w: &[u8], a: &[u8]) -> f32 {
    use super::avx512::{permute, spread};
    use std::arch::x86_64::*;
    const IDX: [[i32; 16]; 4] = [spread(0, 4), spread(4, 4), spread(8, 4), spread(12, 4)];
    let Some((w, a)) = blocks(w, a) else {
        return f32::NAN;
    };
    let m3 = _mm512_set1_epi8(3);
    let m4 = _mm_set1_epi8(0xF);
    let mut acc = _mm512_setzero_ps();
    let mut acc_m = _mm256_setzero_ps();
    for (x, y) in w.iter().zip(a) {
        let d = y.scale() * f16_to_f32(x.d);
        let dmin = -y.scale() * f16_to_f32(x.dmin);
        // SAFETY (all loads below): each pointer is to a field of a block
        // with at least as many bytes as the load reads; unaligned loads.
        let mins_and_scales = unsafe { _mm_loadu_si128(x.scales.as_ptr().cast()) };
        let mins8 = _mm_and_si128(_mm_srli_epi16::<4>(mins_and_scales), m4);
        let bsums = unsafe { _mm256_loadu_si256(y.bsums.as_ptr().cast()) };
        let prod = _mm256_madd_epi16(_mm256_cvtepu8_epi16(mins8), bsums);
        acc_m = _mm256_fmadd_ps(_mm256_set1_ps(dmin), _mm256_cvtepi32_ps(prod), acc_m);
        // Scales below 16, with a zero high i16.
        let sc32 = _mm512_cvtepu8_epi32(_mm_and_si128(mins_and_scales, m4));
        let mut sumi = _mm512_setzero_si512();
        for h in 0..2 {
            let qs = unsafe { _mm512_broadcast_i64x4(_mm256_loadu_si256(x.qs.as_ptr().add(32 * h).cast())) };
            for p in 0..2 {
                let c = 2 * h + p;
                // Shift 4p in the lower half, 4p + 2 in the upper.
                let t = _mm512_srl_epi16(qs, _mm_cvtsi32_si128(4 * p as i32));
                let q = _mm512_and_si512(_mm512_mask_srli_epi16::<2>(t, 0xFFFF_0000, t), m3);
                let q8 = unsafe { _mm512_loadu_si512(y.qs.as_ptr().add(64 * c).cast()) };
                let dot = _mm512_dpbusd_epi32(_mm512_setzero_si512(), q, q8);
                sumi = _mm512_dpwssd_epi32(sumi, dot, permute(sc32, &IDX[c]));
            }
        }
        acc = _mm512_fmadd_ps(_mm512_set1_ps(d), _mm512_cvtepi32_ps(sumi), acc);
    }
    _mm512_reduce_add_ps(acc) + super::hsum_float_8(acc_m)
}
