//! Q3_K weights (16 groups of 16: `d * sc * q`, q in -4..=3, sc in 6 bits
//! minus 32).
//!
//! Block layout: half `h` (128 values) takes 32 bytes of `qs`; value
//! `128h + 32s + l` is bits `2s..2s+2` of `qs[32h + l]`, minus 4 unless bit
//! `4h + s` of `hmask[l]` is set.

// Group and chunk indices address several arrays with different strides.
#![allow(clippy::needless_range_loop)]

use super::q3k_scales;
use crate::quant::blocks::{cast_blocks, f16_to_f32, BlockQ3K, BlockQ8K};
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

fn blocks<'a>(w: &'a [u8], a: &'a [u8]) -> Option<(&'a [BlockQ3K], &'a [BlockQ8K])> {
    Some((cast_blocks(w)?, cast_blocks(a)?))
}

/// llama.cpp's `ggml_vec_dot_q3_K_q8_K_generic`: eight i32 lanes per block
/// (lane `l` takes values `l mod 8`), scaled into eight f32 lanes.
unsafe fn dot_scalar(w: &[u8], a: &[u8]) -> f32 {
    let Some((w, a)) = blocks(w, a) else {
        return f32::NAN;
    };
    let mut sums = [0f32; 8];
    for (x, y) in w.iter().zip(a) {
        let mut q = [0i8; 256];
        for h in 0..2 {
            for s in 0..4 {
                for l in 0..32 {
                    let low = ((x.qs[32 * h + l] >> (2 * s)) & 3) as i8;
                    let minus = if x.hmask[l] & (1 << (4 * h + s)) != 0 { 0 } else { 4 };
                    q[128 * h + 32 * s + l] = low - minus;
                }
            }
        }
        let scales = q3k_scales(&x.scales);
        let mut aux32 = [0i32; 8];
        for (k, (&qv, &v)) in q.iter().zip(&y.qs).enumerate() {
            aux32[k % 8] += scales[k / 16] as i32 * (qv as i32 * v as i32);
        }
        let d = f16_to_f32(x.d) * y.scale();
        for (s, &v) in sums.iter_mut().zip(&aux32) {
            *s += d * v as f32;
        }
    }
    sums.iter().fold(0f32, |acc, &s| acc + s)
}

/// llama.cpp's AVX2 `ggml_vec_dot_q3_K_q8_K`: the low two bits and the
/// "minus 4" of a clear high bit in two `maddubs`, subtracted in i16, then
/// `madd` with the scales.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_avx2(w: &[u8], a: &[u8]) -> f32 {
    use std::arch::x86_64::*;
    let Some((w, a)) = blocks(w, a) else {
        return f32::NAN;
    };
    let m3 = _mm256_set1_epi8(3);
    let mone = _mm256_set1_epi8(1);
    let mut acc = _mm256_setzero_ps();
    for (x, y) in w.iter().zip(a) {
        let d = y.scale() * f16_to_f32(x.d);
        let sc = q3k_scales(&x.scales);
        // SAFETY (all loads below): each pointer is to a field of a block
        // (or a local array) with at least as many bytes as the load
        // reads; unaligned loads.
        let all_scales = _mm256_cvtepi8_epi16(unsafe { _mm_loadu_si128(sc.as_ptr().cast()) });
        let l_scales = _mm256_castsi256_si128(all_scales);
        let h_scales = _mm256_extracti128_si256::<1>(all_scales);
        let scales = [
            _mm256_set_m128i(l_scales, l_scales),
            _mm256_set_m128i(h_scales, h_scales),
        ];
        let hbits = unsafe { _mm256_loadu_si256(x.hmask.as_ptr().cast()) };
        let mut sumi = _mm256_setzero_si256();
        for j in 0..2 {
            let q3bits = unsafe { _mm256_loadu_si256(x.qs.as_ptr().add(32 * j).cast()) };
            let mut p = [_mm256_setzero_si256(); 4];
            for k in 0..4 {
                let shift = _mm_cvtsi32_si128(2 * k as i32);
                let bit = _mm_cvtsi32_si128((4 * j + k) as i32);
                let q3l = _mm256_and_si256(_mm256_srl_epi16(q3bits, shift), m3);
                // 4 where the high bit is clear, 0 where it is set.
                let q3h = _mm256_slli_epi16::<2>(_mm256_srl_epi16(
                    _mm256_andnot_si256(hbits, _mm256_sll_epi16(mone, bit)),
                    bit,
                ));
                let q8 = unsafe { _mm256_loadu_si256(y.qs.as_ptr().add(128 * j + 32 * k).cast()) };
                let p16 = _mm256_sub_epi16(_mm256_maddubs_epi16(q3l, q8), _mm256_maddubs_epi16(q3h, q8));
                // i16 elements 2k (lower lane) and 2k + 1 (upper lane).
                let pick = _mm256_set_m128i(
                    _mm_set1_epi16(super::word(2 * k + 1)),
                    _mm_set1_epi16(super::word(2 * k)),
                );
                p[k] = _mm256_madd_epi16(_mm256_shuffle_epi8(scales[j], pick), p16);
            }
            let p01 = _mm256_add_epi32(p[0], p[1]);
            let p23 = _mm256_add_epi32(p[2], p[3]);
            sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(p01, p23));
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
    }
    super::hsum_float_8(acc)
}

/// AVX-512 VNNI: quants made unsigned (`q + 4` = low bits + 4 * high bit,
/// at most 7) for `vpdpbusd`, scales through `vpdpwssd`, and
/// `4 * sum(scale * bsum)` subtracted once per block.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn dot_avx512(w: &[u8], a: &[u8]) -> f32 {
    use super::avx512::{permute, scales_i8_to_dpwssd, spread};
    use std::arch::x86_64::*;
    const IDX: [[i32; 16]; 4] = [spread(0, 4), spread(4, 4), spread(8, 4), spread(12, 4)];
    let Some((w, a)) = blocks(w, a) else {
        return f32::NAN;
    };
    let m3 = _mm512_set1_epi8(3);
    let m4 = _mm512_set1_epi8(4);
    // Quarter `c = 2h + p` of the block: bit 2c of hmask in the lower
    // half (values 64c..64c+32), bit 2c + 1 in the upper half.
    let bits: [__m512i; 4] = std::array::from_fn(|c| {
        _mm512_inserti64x4::<1>(
            _mm512_set1_epi8(1 << (2 * c)),
            _mm256_set1_epi8((1u8 << (2 * c + 1)) as i8),
        )
    });
    let mut acc = _mm512_setzero_ps();
    for (x, y) in w.iter().zip(a) {
        let d = y.scale() * f16_to_f32(x.d);
        let sc = q3k_scales(&x.scales);
        // SAFETY (all loads below): each pointer is to a field of a block
        // (or a local array) with at least as many bytes as the load
        // reads; unaligned loads.
        let scales = unsafe { _mm_loadu_si128(sc.as_ptr().cast()) };
        let bsums = unsafe { _mm256_loadu_si256(y.bsums.as_ptr().cast()) };
        let offset = _mm256_slli_epi32::<2>(_mm256_madd_epi16(bsums, _mm256_cvtepi8_epi16(scales)));
        let sc32 = scales_i8_to_dpwssd(scales);
        let hmask = unsafe { _mm512_broadcast_i64x4(_mm256_loadu_si256(x.hmask.as_ptr().cast())) };
        let mut sumi = _mm512_zextsi256_si512(_mm256_sub_epi32(_mm256_setzero_si256(), offset));
        for h in 0..2 {
            let qs = unsafe { _mm512_broadcast_i64x4(_mm256_loadu_si256(x.qs.as_ptr().add(32 * h).cast())) };
            for p in 0..2 {
                let c = 2 * h + p;
                // Shift 2s for s = 2p in the lower half, 2s + 2 in the upper.
                let t = _mm512_srl_epi16(qs, _mm_cvtsi32_si128(4 * p as i32));
                let low = _mm512_and_si512(_mm512_mask_srli_epi16::<2>(t, 0xFFFF_0000, t), m3);
                let q = _mm512_mask_add_epi8(low, _mm512_test_epi8_mask(hmask, bits[c]), low, m4);
                let q8 = unsafe { _mm512_loadu_si512(y.qs.as_ptr().add(64 * c).cast()) };
                let dot = _mm512_dpbusd_epi32(_mm512_setzero_si512(), q, q8);
                sumi = _mm512_dpwssd_epi32(sumi, dot, permute(sc32, &IDX[c]));
            }
        }
        acc = _mm512_fmadd_ps(_mm512_set1_ps(d), _mm512_cvtepi32_ps(sumi), acc);
    }
    _mm512_reduce_add_ps(acc)
}
