//! Q4_K weights (8 groups of 32: `d * sc * q - dmin * m`, q in 4 bits).
//!
//! Block layout: 32-byte chunk `c` of `qs` holds group `2c` in its low
//! nibbles and group `2c + 1` in its high nibbles.

// Group and chunk indices address several arrays with different strides.
#![allow(clippy::needless_range_loop)]

use super::k4_scales_mins;
use crate::quant::blocks::{cast_blocks, f16_to_f32, BlockQ4K, BlockQ8K};
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

fn blocks<'a>(w: &'a [u8], a: &'a [u8]) -> Option<(&'a [BlockQ4K], &'a [BlockQ8K])> {
    Some((cast_blocks(w)?, cast_blocks(a)?))
}

/// llama.cpp's `ggml_vec_dot_q4_K_q8_K_generic`: eight i32 lanes per block
/// (lane `l` takes values `l mod 8`), scaled into eight f32 lanes; the min
/// terms are subtracted from a separate sum per block.
unsafe fn dot_scalar(w: &[u8], a: &[u8]) -> f32 {
    let Some((w, a)) = blocks(w, a) else {
        return f32::NAN;
    };
    let mut sums = [0f32; 8];
    let mut sumf = 0f32;
    for (x, y) in w.iter().zip(a) {
        let sm = k4_scales_mins(&x.scales);
        let mut aux32 = [0i32; 8];
        for g in 0..8 {
            let scale = sm[g] as i32;
            let chunk = &x.qs[32 * (g / 2)..32 * (g / 2) + 32];
            let shift = 4 * (g % 2);
            let q8 = &y.qs[32 * g..32 * g + 32];
            for (k, (&q, &v)) in chunk.iter().zip(q8).enumerate() {
                aux32[k % 8] += scale * (((q >> shift) & 0xF) as i32 * v as i32);
            }
        }
        let sumi: i32 = (0..16).map(|j| y.bsum(j) as i32 * sm[8 + j / 2] as i32).sum();
        let d = f16_to_f32(x.d) * y.scale();
        for (s, &v) in sums.iter_mut().zip(&aux32) {
            *s += d * v as f32;
        }
        let dmin = f16_to_f32(x.dmin) * y.scale();
        sumf -= dmin * sumi as f32;
    }
    sums.iter().fold(sumf, |acc, &s| acc + s)
}

/// llama.cpp's AVX2 `ggml_vec_dot_q4_K_q8_K`: per 64 values, two `maddubs`
/// (nibbles x activations, pairs in i16) and two `madd` with the group
/// scale; per block one f32 FMA, and the mins through `bsums`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_avx2(w: &[u8], a: &[u8]) -> f32 {
    use std::arch::x86_64::*;
    let Some((w, a)) = blocks(w, a) else {
        return f32::NAN;
    };
    let m4 = _mm256_set1_epi8(0xF);
    let mut acc = _mm256_setzero_ps();
    let mut acc_m = _mm_setzero_ps();
    for (x, y) in w.iter().zip(a) {
        let d = y.scale() * f16_to_f32(x.d);
        let dmin = -y.scale() * f16_to_f32(x.dmin);
        let sm = k4_scales_mins(&x.scales);
        // SAFETY (all loads below): each pointer is to a field of a block
        // with at least as many bytes as the load reads; unaligned loads.
        let mins_and_scales = _mm256_cvtepu8_epi16(unsafe { _mm_loadu_si128(sm.as_ptr().cast()) });
        let q8sums = unsafe { _mm256_loadu_si256(y.bsums.as_ptr().cast()) };
        let q8s = _mm_hadd_epi16(_mm256_castsi256_si128(q8sums), _mm256_extracti128_si256::<1>(q8sums));
        let prod = _mm_madd_epi16(_mm256_extracti128_si256::<1>(mins_and_scales), q8s);
        acc_m = _mm_fmadd_ps(_mm_set1_ps(dmin), _mm_cvtepi32_ps(prod), acc_m);

        let sc128 = _mm256_castsi256_si128(mins_and_scales);
        let scales = _mm256_set_m128i(sc128, sc128);
        let mut sumi = _mm256_setzero_si256();
        for j in 0..4 {
            // Broadcast i16 element 2j (and 2j + 1) of `scales`.
            let scale_l = _mm256_shuffle_epi8(scales, _mm256_set1_epi16(super::word(2 * j)));
            let scale_h = _mm256_shuffle_epi8(scales, _mm256_set1_epi16(super::word(2 * j + 1)));
            let q4bits = unsafe { _mm256_loadu_si256(x.qs.as_ptr().add(32 * j).cast()) };
            let q4l = _mm256_and_si256(q4bits, m4);
            let q4h = _mm256_and_si256(_mm256_srli_epi16::<4>(q4bits), m4);
            let q8l = unsafe { _mm256_loadu_si256(y.qs.as_ptr().add(64 * j).cast()) };
            let p16l = _mm256_madd_epi16(scale_l, _mm256_maddubs_epi16(q4l, q8l));
            let q8h = unsafe { _mm256_loadu_si256(y.qs.as_ptr().add(64 * j + 32).cast()) };
            let p16h = _mm256_madd_epi16(scale_h, _mm256_maddubs_epi16(q4h, q8h));
            sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(p16l, p16h));
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
    }
    acc_m = _mm_add_ps(acc_m, _mm_movehl_ps(acc_m, acc_m));
    acc_m = _mm_add_ss(acc_m, _mm_movehdup_ps(acc_m));
    super::hsum_float_8(acc) + _mm_cvtss_f32(acc_m)
}

/// AVX-512 VNNI: per 64 values (one 32-byte chunk, broadcast to both
/// halves, low nibbles in the lower half and high nibbles in the upper),
/// one `vpdpbusd` against 64 contiguous activations and one `vpdpwssd`
/// with the two group scales (nibble sums of four products are at most
/// 4 * 15 * 128, well inside i16).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn dot_avx512(w: &[u8], a: &[u8]) -> f32 {
    use super::avx512::{permute, spread};
    use std::arch::x86_64::*;
    const IDX: [[i32; 16]; 4] = [spread(0, 8), spread(2, 8), spread(4, 8), spread(6, 8)];
    let Some((w, a)) = blocks(w, a) else {
        return f32::NAN;
    };
    let m4 = _mm512_set1_epi8(0xF);
    let mut acc = _mm512_setzero_ps();
    let mut acc_m = _mm_setzero_ps();
    for (x, y) in w.iter().zip(a) {
        let d = y.scale() * f16_to_f32(x.d);
        let dmin = -y.scale() * f16_to_f32(x.dmin);
        let sm = k4_scales_mins(&x.scales);
        // SAFETY (all loads below): each pointer is to a field of a block
        // with at least as many bytes as the load reads; unaligned loads.
        let sm128 = unsafe { _mm_loadu_si128(sm.as_ptr().cast()) };
        let mins = _mm256_extracti128_si256::<1>(_mm256_cvtepu8_epi16(sm128));
        let q8sums = unsafe { _mm256_loadu_si256(y.bsums.as_ptr().cast()) };
        let q8s = _mm_hadd_epi16(_mm256_castsi256_si128(q8sums), _mm256_extracti128_si256::<1>(q8sums));
        acc_m = _mm_fmadd_ps(_mm_set1_ps(dmin), _mm_cvtepi32_ps(_mm_madd_epi16(mins, q8s)), acc_m);

        // Lanes 0..8: the scales (< 64) with a zero high i16.
        let sc32 = _mm512_cvtepu8_epi32(sm128);
        let mut sumi = _mm512_setzero_si512();
        for (j, idx) in IDX.iter().enumerate() {
            let chunk = unsafe { _mm512_broadcast_i64x4(_mm256_loadu_si256(x.qs.as_ptr().add(32 * j).cast())) };
            let q4 = _mm512_and_si512(_mm512_mask_srli_epi16::<4>(chunk, 0xFFFF_0000, chunk), m4);
            let q8 = unsafe { _mm512_loadu_si512(y.qs.as_ptr().add(64 * j).cast()) };
            let dot = _mm512_dpbusd_epi32(_mm512_setzero_si512(), q4, q8);
            sumi = _mm512_dpwssd_epi32(sumi, dot, permute(sc32, idx));
        }
        acc = _mm512_fmadd_ps(_mm512_set1_ps(d), _mm512_cvtepi32_ps(sumi), acc);
    }
    acc_m = _mm_add_ps(acc_m, _mm_movehl_ps(acc_m, acc_m));
    acc_m = _mm_add_ss(acc_m, _mm_movehdup_ps(acc_m));
    _mm512_reduce_add_ps(acc) + _mm_cvtss_f32(acc_m)
}

/// `dot_avx512` of one weight row with four activation rows: each block's
/// scales, mins and nibbles are unpacked once and multiplied with the four
/// rows. Each output goes through exactly the integer and f32 operations
/// `dot_avx512` performs for its row, so the results are bit-identical.
///
/// # Safety
/// As `dot_avx512` (`Isa::Avx512Vnni`).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn dot4_avx512(w: &[u8], a: [&[u8]; 4], out: &mut [f32; 4]) {
    use super::avx512::{permute, spread};
    use std::arch::x86_64::*;
    const IDX: [[i32; 16]; 4] = [spread(0, 8), spread(2, 8), spread(4, 8), spread(6, 8)];
    let Some((w, a)) = super::blocks4::<BlockQ4K>(w, a) else {
        *out = [f32::NAN; 4];
        return;
    };
    let m4 = _mm512_set1_epi8(0xF);
    let mut acc = [_mm512_setzero_ps(); 4];
    let mut acc_m = [_mm_setzero_ps(); 4];
    for (b, x) in w.iter().enumerate() {
        let sm = k4_scales_mins(&x.scales);
        // SAFETY (all loads below): each pointer is to a field of a block
        // with at least as many bytes as the load reads; unaligned loads.
        let sm128 = unsafe { _mm_loadu_si128(sm.as_ptr().cast()) };
        let mins = _mm256_extracti128_si256::<1>(_mm256_cvtepu8_epi16(sm128));
        let sc32 = _mm512_cvtepu8_epi32(sm128);
        let mut q4 = [_mm512_setzero_si512(); 4];
        let mut sc = [_mm512_setzero_si512(); 4];
        for j in 0..4 {
            let chunk = unsafe { _mm512_broadcast_i64x4(_mm256_loadu_si256(x.qs.as_ptr().add(32 * j).cast())) };
            q4[j] = _mm512_and_si512(_mm512_mask_srli_epi16::<4>(chunk, 0xFFFF_0000, chunk), m4);
            sc[j] = permute(sc32, &IDX[j]);
        }
        for r in 0..4 {
            let y = &a[r][b];
            let d = y.scale() * f16_to_f32(x.d);
            let dmin = -y.scale() * f16_to_f32(x.dmin);
            let q8sums = unsafe { _mm256_loadu_si256(y.bsums.as_ptr().cast()) };
            let q8s = _mm_hadd_epi16(_mm256_castsi256_si128(q8sums), _mm256_extracti128_si256::<1>(q8sums));
            acc_m[r] = _mm_fmadd_ps(_mm_set1_ps(dmin), _mm_cvtepi32_ps(_mm_madd_epi16(mins, q8s)), acc_m[r]);
            let mut sumi = _mm512_setzero_si512();
            for j in 0..4 {
                let q8 = unsafe { _mm512_loadu_si512(y.qs.as_ptr().add(64 * j).cast()) };
                let dot = _mm512_dpbusd_epi32(_mm512_setzero_si512(), q4[j], q8);
                sumi = _mm512_dpwssd_epi32(sumi, dot, sc[j]);
            }
            acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(d), _mm512_cvtepi32_ps(sumi), acc[r]);
        }
    }
    for r in 0..4 {
        let mut m = acc_m[r];
        m = _mm_add_ps(m, _mm_movehl_ps(m, m));
        m = _mm_add_ss(m, _mm_movehdup_ps(m));
        out[r] = _mm512_reduce_add_ps(acc[r]) + _mm_cvtss_f32(m);
    }
}
