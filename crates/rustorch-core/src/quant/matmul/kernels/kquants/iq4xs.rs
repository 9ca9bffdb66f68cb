//! IQ4_XS weights (8 groups of 32: `d * (ls - 32) * KVALUES_IQ4NL[q]`, q in
//! 4 bits, ls in 6 bits).
//!
//! Block layout: group `g` takes 16 bytes of `qs`, its values `0..16` in
//! the low nibbles and `16..32` in the high nibbles; `ls` of group `g` is
//! nibble `g % 2` of `scales_l[g / 2]` plus bits `2g..2g+2` of `scales_h`
//! as bits 4-5.

// Group and chunk indices address several arrays with different strides.
#![allow(clippy::needless_range_loop)]

use crate::quant::blocks::{cast_blocks, f16_to_f32, BlockIQ4XS, BlockQ8K, KVALUES_IQ4NL};
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

fn blocks<'a>(w: &'a [u8], a: &'a [u8]) -> Option<(&'a [BlockIQ4XS], &'a [BlockQ8K])> {
    Some((cast_blocks(w)?, cast_blocks(a)?))
}

/// The signed scales `ls - 32` of the eight groups.
#[inline(always)]
fn group_scales(x: &BlockIQ4XS) -> [i32; 8] {
    let h = u16::from_le_bytes(x.scales_h) as i32;
    std::array::from_fn(|g| {
        let low = (x.scales_l[g / 2] >> (4 * (g % 2))) as i32 & 0xF;
        (low | (((h >> (2 * g)) & 3) << 4)) - 32
    })
}

/// llama.cpp's `ggml_vec_dot_iq4_xs_q8_K_generic`: one f32 term per group.
unsafe fn dot_scalar(w: &[u8], a: &[u8]) -> f32 {
    let Some((w, a)) = blocks(w, a) else {
        return f32::NAN;
    };
    let mut sumf = 0f32;
    for (x, y) in w.iter().zip(a) {
        let d4d8 = f16_to_f32(x.d) * y.scale();
        let ls = group_scales(x);
        for g in 0..8 {
            let qs = &x.qs[16 * g..16 * g + 16];
            let q8 = &y.qs[32 * g..32 * g + 32];
            let mut sumi = 0i32;
            for (j, &q) in qs.iter().enumerate() {
                sumi += q8[j] as i32 * KVALUES_IQ4NL[(q & 0xF) as usize] as i32;
                sumi += q8[j + 16] as i32 * KVALUES_IQ4NL[(q >> 4) as usize] as i32;
            }
            sumf += d4d8 * ls[g] as f32 * sumi as f32;
        }
    }
    sumf
}

/// llama.cpp's AVX2 `ggml_vec_dot_iq4_xs_q8_K`: levels by table lookup
/// (`pshufb`), signed x signed products by the sign trick (`maddubs` of
/// `|w|` and `a * sign(w)`, exact for activations in -127..=127), `madd`
/// with the group scale.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_avx2(w: &[u8], a: &[u8]) -> f32 {
    use std::arch::x86_64::*;
    let Some((w, a)) = blocks(w, a) else {
        return f32::NAN;
    };
    // SAFETY: 16 bytes of a 16-byte table.
    let values = unsafe { _mm_loadu_si128(KVALUES_IQ4NL.as_ptr().cast()) };
    let m4b = _mm_set1_epi8(0xF);
    let levels = |bits: __m128i| {
        _mm256_set_m128i(
            _mm_shuffle_epi8(values, _mm_and_si128(_mm_srli_epi16::<4>(bits), m4b)),
            _mm_shuffle_epi8(values, _mm_and_si128(bits, m4b)),
        )
    };
    let mul_add = |x: __m256i, y: __m256i| _mm256_maddubs_epi16(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x));
    let mut accum = _mm256_setzero_ps();
    for (x, y) in w.iter().zip(a) {
        let ls = group_scales(x);
        let mut sumi1 = _mm256_setzero_si256();
        let mut sumi2 = _mm256_setzero_si256();
        for ib in (0..8).step_by(2) {
            // SAFETY: 16 bytes at 16 * ib (+ 16) of the 128-byte `qs` and 32
            // at 32 * ib (+ 32) of the 256-byte `qs` of the activations.
            let (b1, b2, q8b1, q8b2) = unsafe {
                (
                    _mm_loadu_si128(x.qs.as_ptr().add(16 * ib).cast()),
                    _mm_loadu_si128(x.qs.as_ptr().add(16 * ib + 16).cast()),
                    _mm256_loadu_si256(y.qs.as_ptr().add(32 * ib).cast()),
                    _mm256_loadu_si256(y.qs.as_ptr().add(32 * ib + 32).cast()),
                )
            };
            let p16_1 = mul_add(levels(b1), q8b1);
            let p16_2 = mul_add(levels(b2), q8b2);
            sumi1 = _mm256_add_epi32(_mm256_madd_epi16(p16_1, _mm256_set1_epi16(ls[ib] as i16)), sumi1);
            sumi2 = _mm256_add_epi32(_mm256_madd_epi16(p16_2, _mm256_set1_epi16(ls[ib + 1] as i16)), sumi2);
        }
        let d = f16_to_f32(x.d) * y.scale();
        accum = _mm256_fmadd_ps(
            _mm256_set1_ps(d),
            _mm256_cvtepi32_ps(_mm256_add_epi32(sumi1, sumi2)),
            accum,
        );
    }
    super::hsum_float_8(accum)
}

/// AVX-512 VNNI: levels looked up as unsigned `level + 128` (1..=241) for
/// `vpdpbusd`, the extra `128 * sum(a)` per group taken off through the
/// `bsums`. Four products of up to 241 * 128 leave i16, so the group scale
/// is applied with `vpmulld` instead of `vpdpwssd`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn dot_avx512(w: &[u8], a: &[u8]) -> f32 {
    use super::avx512::permute;
    use std::arch::x86_64::*;
    // Lanes 0..8 take the scale of group 2k, lanes 8..16 of group 2k + 1,
    // from a vector holding each group's scale twice.
    const IDX: [[i32; 16]; 4] = {
        let mut idx = [[0i32; 16]; 4];
        let mut k = 0;
        while k < 4 {
            let mut l = 0;
            while l < 16 {
                idx[k][l] = 4 * k as i32 + 2 * (l as i32 / 8);
                l += 1;
            }
            k += 1;
        }
        idx
    };
    let Some((w, a)) = blocks(w, a) else {
        return f32::NAN;
    };
    let table: [u8; 16] = std::array::from_fn(|i| (KVALUES_IQ4NL[i] as i32 + 128) as u8);
    // SAFETY: 16 bytes of a 16-byte array.
    let table = _mm512_broadcast_i32x4(unsafe { _mm_loadu_si128(table.as_ptr().cast()) });
    let m4 = _mm512_set1_epi8(0xF);
    let mut acc = _mm512_setzero_ps();
    for (x, y) in w.iter().zip(a) {
        let ls = group_scales(x);
        let twice: [i16; 16] = std::array::from_fn(|i| ls[i / 2] as i16);
        // SAFETY (all loads below): each pointer is to a field of a block
        // (or a local array) with at least as many bytes as the load
        // reads; unaligned loads.
        let ls16 = unsafe { _mm256_loadu_si256(twice.as_ptr().cast()) };
        let bsums = unsafe { _mm256_loadu_si256(y.bsums.as_ptr().cast()) };
        let offset = _mm256_slli_epi32::<7>(_mm256_madd_epi16(bsums, ls16));
        let ls32 = _mm512_cvtepi16_epi32(ls16);
        let mut sumi = _mm512_zextsi256_si512(_mm256_sub_epi32(_mm256_setzero_si256(), offset));
        for (k, idx) in IDX.iter().enumerate() {
            // 128-bit lanes: group 2k, group 2k, group 2k + 1, group 2k + 1;
            // low nibbles in the even lanes, high nibbles in the odd ones.
            let two = _mm512_castsi256_si512(unsafe { _mm256_loadu_si256(x.qs.as_ptr().add(32 * k).cast()) });
            let spread = _mm512_shuffle_i64x2::<0b01_01_00_00>(two, two);
            let nib = _mm512_and_si512(_mm512_mask_srli_epi16::<4>(spread, 0xFF00_FF00, spread), m4);
            let q = _mm512_shuffle_epi8(table, nib);
            let q8 = unsafe { _mm512_loadu_si512(y.qs.as_ptr().add(64 * k).cast()) };
            let dot = _mm512_dpbusd_epi32(_mm512_setzero_si512(), q, q8);
            sumi = _mm512_add_epi32(sumi, _mm512_mullo_epi32(dot, permute(ls32, idx)));
        }
        let d = f16_to_f32(x.d) * y.scale();
        acc = _mm512_fmadd_ps(_mm512_set1_ps(d), _mm512_cvtepi32_ps(sumi), acc);
    }
    _mm512_reduce_add_ps(acc)
}
