//! Q6_K weights (16 groups of 16: `d * sc * (q - 32)`, q in 6 bits, sc i8).
//!
//! Block layout: each half `h` of 128 values takes 64 bytes of `ql` and 32
//! of `qh`. With `l` in 0..32, value `l` is the low nibble of `ql[l]` plus
//! bits 0-1 of `qh[l]` as bits 4-5; value `32 + l` the low nibble of
//! `ql[32 + l]` plus bits 2-3; values `64 + l` and `96 + l` the high
//! nibbles of the same bytes plus bits 4-5 and 6-7.

use crate::quant::blocks::{cast_blocks, f16_to_f32, BlockQ6K, BlockQ8K};
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

fn blocks<'a>(w: &'a [u8], a: &'a [u8]) -> Option<(&'a [BlockQ6K], &'a [BlockQ8K])> {
    Some((cast_blocks(w)?, cast_blocks(a)?))
}

/// The 256 signed quants (`q - 32`) of a block.
fn unpack(x: &BlockQ6K) -> [i8; 256] {
    let mut a = [0i8; 256];
    for h in 0..2 {
        let (ql, qh) = (&x.ql[64 * h..64 * h + 64], &x.qh[32 * h..32 * h + 32]);
        let a = &mut a[128 * h..128 * h + 128];
        for l in 0..32 {
            a[l] = ((ql[l] & 0xF) | ((qh[l] & 3) << 4)) as i8 - 32;
            a[l + 32] = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) as i8 - 32;
            a[l + 64] = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i8 - 32;
            a[l + 96] = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i8 - 32;
        }
    }
    a
}

/// llama.cpp's `ggml_vec_dot_q6_K_q8_K_generic`: eight i32 lanes per block
/// (lane `l` takes values `l mod 8`), scaled into eight f32 lanes.
unsafe fn dot_scalar(w: &[u8], a: &[u8]) -> f32 {
    let Some((w, a)) = blocks(w, a) else {
        return f32::NAN;
    };
    let mut sums = [0f32; 8];
    for (x, y) in w.iter().zip(a) {
        let q = unpack(x);
        let mut aux32 = [0i32; 8];
        for (k, (&qv, &v)) in q.iter().zip(&y.qs).enumerate() {
            aux32[k % 8] += x.scales[k / 16] as i32 * (qv as i32 * v as i32);
        }
        let d = f16_to_f32(x.d) * y.scale();
        for (s, &v) in sums.iter_mut().zip(&aux32) {
            *s += d * v as f32;
        }
    }
    sums.iter().fold(0f32, |acc, &s| acc + s)
}

/// llama.cpp's AVX2 `ggml_vec_dot_q6_K_q8_K`: the unsigned 6-bit quants in
/// `maddubs`, the scales in `madd`, and the `- 32` offset subtracted once
/// per block as `32 * sum(scale * bsum)`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_avx2(w: &[u8], a: &[u8]) -> f32 {
    use std::arch::x86_64::*;
    let Some((w, a)) = blocks(w, a) else {
        return f32::NAN;
    };
    let m3 = _mm256_set1_epi8(3);
    let m15 = _mm256_set1_epi8(15);
    let mut acc = _mm256_setzero_ps();
    for (x, y) in w.iter().zip(a) {
        let d = y.scale() * f16_to_f32(x.d);
        // SAFETY (all loads below): each pointer is to a field of a block
        // with at least as many bytes as the load reads; unaligned loads.
        let q8sums = unsafe { _mm256_loadu_si256(y.bsums.as_ptr().cast()) };
        let scales = unsafe { _mm_loadu_si128(x.scales.as_ptr().cast()) };
        let q8sclsub = _mm256_slli_epi32::<5>(_mm256_madd_epi16(q8sums, _mm256_cvtepi8_epi16(scales)));
        let mut sumi = _mm256_setzero_si256();
        for j in 0..2 {
            let q4bits1 = unsafe { _mm256_loadu_si256(x.ql.as_ptr().add(64 * j).cast()) };
            let q4bits2 = unsafe { _mm256_loadu_si256(x.ql.as_ptr().add(64 * j + 32).cast()) };
            let q4bits_h = unsafe { _mm256_loadu_si256(x.qh.as_ptr().add(32 * j).cast()) };
            let q4h_0 = _mm256_slli_epi16::<4>(_mm256_and_si256(q4bits_h, m3));
            let q4h_1 = _mm256_slli_epi16::<2>(_mm256_and_si256(q4bits_h, _mm256_set1_epi8(12)));
            let q4h_2 = _mm256_and_si256(q4bits_h, _mm256_set1_epi8(48));
            let q4h_3 = _mm256_srli_epi16::<2>(_mm256_and_si256(q4bits_h, _mm256_set1_epi8(-64)));
            let q4 = [
                _mm256_or_si256(_mm256_and_si256(q4bits1, m15), q4h_0),
                _mm256_or_si256(_mm256_and_si256(q4bits2, m15), q4h_1),
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16::<4>(q4bits1), m15), q4h_2),
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16::<4>(q4bits2), m15), q4h_3),
            ];
            let mut p = [_mm256_setzero_si256(); 4];
            for k in 0..4 {
                let q8 = unsafe { _mm256_loadu_si256(y.qs.as_ptr().add(128 * j + 32 * k).cast()) };
                // Scales of groups 8j + 2k and 8j + 2k + 1, eight bytes each.
                let g = (8 * j + 2 * k) as i64;
                let pick = _mm_set_epi64x(0x0101_0101_0101_0101 * (g + 1), 0x0101_0101_0101_0101 * g);
                let scale = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(scales, pick));
                p[k] = _mm256_madd_epi16(scale, _mm256_maddubs_epi16(q4[k], q8));
            }
            sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(p[0], p[1]));
            sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(p[2], p[3]));
        }
        sumi = _mm256_sub_epi32(sumi, q8sclsub);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
    }
    super::hsum_float_8(acc)
}

/// AVX-512 VNNI: 64 unsigned 6-bit quants per `vpdpbusd` (four products
/// per lane, at most 4 * 63 * 128 = 32256, inside i16), the scales through
/// `vpdpwssd`, and the offset as in AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn dot_avx512(w: &[u8], a: &[u8]) -> f32 {
    use super::avx512::{permute, scales_i8_to_dpwssd, spread};
    use std::arch::x86_64::*;
    const IDX: [[i32; 16]; 4] = [spread(0, 4), spread(4, 4), spread(8, 4), spread(12, 4)];
    let Some((w, a)) = blocks(w, a) else {
        return f32::NAN;
    };
    let m4 = _mm512_set1_epi8(0xF);
    let m30 = _mm512_set1_epi8(0x30);
    let mut acc = _mm512_setzero_ps();
    for (x, y) in w.iter().zip(a) {
        let d = y.scale() * f16_to_f32(x.d);
        // SAFETY (all loads below): each pointer is to a field of a block
        // with at least as many bytes as the load reads; unaligned loads.
        let q8sums = unsafe { _mm256_loadu_si256(y.bsums.as_ptr().cast()) };
        let scales = unsafe { _mm_loadu_si128(x.scales.as_ptr().cast()) };
        let offset = _mm256_slli_epi32::<5>(_mm256_madd_epi16(q8sums, _mm256_cvtepi8_epi16(scales)));
        let sc32 = scales_i8_to_dpwssd(scales);
        let mut sumi = _mm512_zextsi256_si512(_mm256_sub_epi32(_mm256_setzero_si256(), offset));
        for h in 0..2 {
            let ql = unsafe { _mm512_loadu_si512(x.ql.as_ptr().add(64 * h).cast()) };
            let qh = unsafe { _mm512_broadcast_i64x4(_mm256_loadu_si256(x.qh.as_ptr().add(32 * h).cast())) };
            // Lower half: bits 0-1 (values 0..32) and 4-5 (64..96) of qh;
            // upper half: bits 2-3 (32..64) and 6-7 (96..128), moved down.
            let qh = _mm512_mask_srli_epi16::<2>(qh, 0xFFFF_0000, qh);
            let lo = _mm512_or_si512(
                _mm512_and_si512(ql, m4),
                _mm512_and_si512(_mm512_slli_epi16::<4>(qh), m30),
            );
            let hi = _mm512_or_si512(
                _mm512_and_si512(_mm512_srli_epi16::<4>(ql), m4),
                _mm512_and_si512(qh, m30),
            );
            for (k, q) in [lo, hi].into_iter().enumerate() {
                let q8 = unsafe { _mm512_loadu_si512(y.qs.as_ptr().add(128 * h + 64 * k).cast()) };
                let dot = _mm512_dpbusd_epi32(_mm512_setzero_si512(), q, q8);
                sumi = _mm512_dpwssd_epi32(sumi, dot, permute(sc32, &IDX[2 * h + k]));
            }
        }
        acc = _mm512_fmadd_ps(_mm512_set1_ps(d), _mm512_cvtepi32_ps(sumi), acc);
    }
    _mm512_reduce_add_ps(acc)
}

/// `dot_avx512` of one weight row with four activation rows: each block's
/// 6-bit quants and scales are unpacked once and multiplied with the four
/// rows. Each output goes through exactly the integer and f32 operations
/// `dot_avx512` performs for its row, so the results are bit-identical.
///
/// # Safety
/// As `dot_avx512` (`Isa::Avx512Vnni`).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn dot4_avx512(w: &[u8], a: [&[u8]; 4], out: &mut [f32; 4]) {
    use super::avx512::{permute, scales_i8_to_dpwssd, spread};
    use std::arch::x86_64::*;
    const IDX: [[i32; 16]; 4] = [spread(0, 4), spread(4, 4), spread(8, 4), spread(12, 4)];
    let Some((w, a)) = super::blocks4::<BlockQ6K>(w, a) else {
        *out = [f32::NAN; 4];
        return;
    };
    let m4 = _mm512_set1_epi8(0xF);
    let m30 = _mm512_set1_epi8(0x30);
    let mut acc = [_mm512_setzero_ps(); 4];
    for (b, x) in w.iter().enumerate() {
        // SAFETY (all loads below): each pointer is to a field of a block
        // with at least as many bytes as the load reads; unaligned loads.
        let scales = unsafe { _mm_loadu_si128(x.scales.as_ptr().cast()) };
        let scales16 = _mm256_cvtepi8_epi16(scales);
        let sc32 = scales_i8_to_dpwssd(scales);
        let mut q = [_mm512_setzero_si512(); 4];
        let mut sc = [_mm512_setzero_si512(); 4];
        for h in 0..2 {
            let ql = unsafe { _mm512_loadu_si512(x.ql.as_ptr().add(64 * h).cast()) };
            let qh = unsafe { _mm512_broadcast_i64x4(_mm256_loadu_si256(x.qh.as_ptr().add(32 * h).cast())) };
            // As in `dot_avx512`.
            let qh = _mm512_mask_srli_epi16::<2>(qh, 0xFFFF_0000, qh);
            q[2 * h] = _mm512_or_si512(
                _mm512_and_si512(ql, m4),
                _mm512_and_si512(_mm512_slli_epi16::<4>(qh), m30),
            );
            q[2 * h + 1] = _mm512_or_si512(
                _mm512_and_si512(_mm512_srli_epi16::<4>(ql), m4),
                _mm512_and_si512(qh, m30),
            );
        }
        for (s, idx) in sc.iter_mut().zip(&IDX) {
            *s = permute(sc32, idx);
        }
        for r in 0..4 {
            let y = &a[r][b];
            let d = y.scale() * f16_to_f32(x.d);
            let q8sums = unsafe { _mm256_loadu_si256(y.bsums.as_ptr().cast()) };
            let offset = _mm256_slli_epi32::<5>(_mm256_madd_epi16(q8sums, scales16));
            let mut sumi = _mm512_zextsi256_si512(_mm256_sub_epi32(_mm256_setzero_si256(), offset));
            for k in 0..4 {
                let q8 = unsafe { _mm512_loadu_si512(y.qs.as_ptr().add(64 * k).cast()) };
                let dot = _mm512_dpbusd_epi32(_mm512_setzero_si512(), q[k], q8);
                sumi = _mm512_dpwssd_epi32(sumi, dot, sc[k]);
            }
            acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(d), _mm512_cvtepi32_ps(sumi), acc[r]);
        }
    }
    for r in 0..4 {
        out[r] = _mm512_reduce_add_ps(acc[r]);
    }
}
