//! Q2_K, Q3_K and IQ4_XS rows against Q8_K rows in llama.cpp's exact x86
//! order (`ggml_vec_dot_{q2_K,q3_K,iq4_xs}_q8_K`, `__AVX2__` branches,
//! which native AVX-512 builds compile too); see `ggml_k` for the scheme.
//! Lane `l` of a super-block holds values `4l..4l + 4` of each 32-value
//! chunk, times the scale of its 16-value (Q2_K, Q3_K) or 32-value
//! (IQ4_XS) group; one `fma(d, lane, acc)` per super-block, `d = y.d * x.d`.
//! Q2_K first adds its mins per lane, `fma(dmin, mins[2l] * bsums[2l] +
//! mins[2l+1] * bsums[2l+1], acc)` with `dmin = -y.d * x.dmin`.

#![allow(clippy::needless_range_loop)]

use super::ggml_k::hsum8;
use rustorch_core::quant::blocks::{
    cast_blocks, f16_to_f32, Block, BlockIQ4XS, BlockQ2K, BlockQ3K, BlockQ8K, KVALUES_IQ4NL,
};

fn blocks<'a, W: Block>(w: &'a [u8], a: &'a [u8]) -> Option<(&'a [W], &'a [BlockQ8K])> {
    let (w, a): (&[W], &[BlockQ8K]) = (cast_blocks(w)?, cast_blocks(a)?);
    (w.len() == a.len()).then_some((w, a))
}

/// The eight lanes of a super-block whose 32-value chunk `c` has values
/// `q(c, e)` and whose scale for chunk `c`, half `h` (values 16h..16h+16)
/// is `sc(c, h)`.
#[inline(always)]
fn lanes(y: &BlockQ8K, q: impl Fn(usize, usize) -> i32, sc: impl Fn(usize, usize) -> i32) -> [i32; 8] {
    let mut lanes = [0i32; 8];
    for c in 0..8 {
        let a = &y.qs[32 * c..32 * c + 32];
        for l in 0..8 {
            let s: i32 = (4 * l..4 * l + 4).map(|e| q(c, e) * a[e] as i32).sum();
            lanes[l] += sc(c, l / 4) * s;
        }
    }
    lanes
}

/// Value `e` of chunk `c` of a Q2_K block (chunk `4j + k` takes bits
/// `2k..2k + 2` of `qs[32j ..]`).
#[inline(always)]
fn q2(x: &BlockQ2K, c: usize, e: usize) -> i32 {
    ((x.qs[32 * (c / 4) + e] >> (2 * (c % 4))) & 3) as i32
}

/// Portable `ggml_vec_dot_q2_K_q8_K` (AVX2 order).
///
/// # Safety
/// None beyond the `DotFn` contract (it is `unsafe` only to share its type).
pub(super) unsafe fn dot_q2k_scalar(w: &[u8], a: &[u8]) -> f32 {
    let Some((w, a)) = blocks::<BlockQ2K>(w, a) else {
        return f32::NAN;
    };
    let mut acc = [0f32; 8];
    for (x, y) in w.iter().zip(a) {
        let d = y.scale() * f16_to_f32(x.d);
        let dmin = -y.scale() * f16_to_f32(x.dmin);
        let mn = |s: usize| (x.scales[s] >> 4) as i32;
        for l in 0..8 {
            let p = mn(2 * l) * y.bsum(2 * l) as i32 + mn(2 * l + 1) * y.bsum(2 * l + 1) as i32;
            acc[l] = dmin.mul_add(p as f32, acc[l]);
        }
        let v = lanes(y, |c, e| q2(x, c, e), |c, h| (x.scales[2 * c + h] & 0xF) as i32);
        for l in 0..8 {
            acc[l] = d.mul_add(v[l] as f32, acc[l]);
        }
    }
    hsum8(acc)
}

/// Value `e` of chunk `c` of a Q3_K block: two bits as Q2_K's, minus 4
/// where bit `c` of `hmask[e]` is clear.
#[inline(always)]
fn q3(x: &BlockQ3K, c: usize, e: usize) -> i32 {
    let lo = ((x.qs[32 * (c / 4) + e] >> (2 * (c % 4))) & 3) as i32;
    lo - if (x.hmask[e] >> c) & 1 == 0 { 4 } else { 0 }
}

/// Portable `ggml_vec_dot_q3_K_q8_K` (AVX2 order).
///
/// # Safety
/// As `dot_q2k_scalar`.
pub(super) unsafe fn dot_q3k_scalar(w: &[u8], a: &[u8]) -> f32 {
    let Some((w, a)) = blocks::<BlockQ3K>(w, a) else {
        return f32::NAN;
    };
    let mut acc = [0f32; 8];
    for (x, y) in w.iter().zip(a) {
        let d = y.scale() * f16_to_f32(x.d);
        let sc = super::q3k_scales(&x.scales);
        let v = lanes(y, |c, e| q3(x, c, e), |c, h| sc[2 * c + h] as i32);
        for l in 0..8 {
            acc[l] = d.mul_add(v[l] as f32, acc[l]);
        }
    }
    hsum8(acc)
}

/// Portable `ggml_vec_dot_iq4_xs_q8_K` (AVX2 order). Chunk `c` is group
/// `c`: its low nibbles are values 0..16, its high nibbles 16..32.
///
/// # Safety
/// As `dot_q2k_scalar`.
pub(super) unsafe fn dot_iq4xs_scalar(w: &[u8], a: &[u8]) -> f32 {
    let Some((w, a)) = blocks::<BlockIQ4XS>(w, a) else {
        return f32::NAN;
    };
    let mut acc = [0f32; 8];
    for (x, y) in w.iter().zip(a) {
        let d = f16_to_f32(x.d) * y.scale();
        let sh = u16::from_le_bytes(x.scales_h);
        let ls = |c: usize| {
            let lo = (x.scales_l[c / 2] >> (4 * (c % 2))) & 0xF;
            let hi = ((sh >> (2 * c)) & 3) as u8;
            (lo | hi << 4) as i32 - 32
        };
        let v = lanes(
            y,
            |c, e| KVALUES_IQ4NL[((x.qs[16 * c + e % 16] >> (4 * (e / 16))) & 0xF) as usize] as i32,
            |c, _| ls(c),
        );
        for l in 0..8 {
            acc[l] = d.mul_add(v[l] as f32, acc[l]);
        }
    }
    hsum8(acc)
}

#[cfg(target_arch = "x86_64")]
pub(super) use simd::{dot_iq4xs_avx2, dot_q2k_avx2, dot_q3k_avx2};

#[cfg(target_arch = "x86_64")]
mod simd {
    use super::{blocks, hsum8};
    use rustorch_core::quant::blocks::{BlockIQ4XS, BlockQ2K, BlockQ3K, KVALUES_IQ4NL};
    use std::arch::x86_64::*;

    /// f16 to f32 with F16C (exact).
    #[inline(always)]
    fn f16(b: [u8; 2]) -> f32 {
        // SAFETY: only called from kernels with F16C enabled.
        unsafe { _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(u16::from_le_bytes(b) as i32))) }
    }

    #[inline(always)]
    unsafe fn lanes8(v: __m256) -> [f32; 8] {
        let mut out = [0f32; 8];
        // SAFETY: `out` holds eight f32 values; AVX in every caller.
        unsafe { _mm256_storeu_ps(out.as_mut_ptr(), v) };
        out
    }

    /// i16 scales `lo` for values 0..16 and `hi` for 16..32 of a chunk.
    #[inline(always)]
    unsafe fn halves(lo: i16, hi: i16) -> __m256i {
        // SAFETY: AVX2 in every caller.
        unsafe { _mm256_setr_m128i(_mm_set1_epi16(lo), _mm_set1_epi16(hi)) }
    }

    /// `ggml_vec_dot_q2_K_q8_K`, AVX2 branch.
    ///
    /// # Safety
    /// AVX2, FMA and F16C must be available (`Isa::Avx2`).
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(in super::super) unsafe fn dot_q2k_avx2(w: &[u8], a: &[u8]) -> f32 {
        let Some((w, a)) = blocks::<BlockQ2K>(w, a) else {
            return f32::NAN;
        };
        let m3 = _mm256_set1_epi8(3);
        let m4 = _mm_set1_epi8(0xF);
        let mut acc = _mm256_setzero_ps();
        for (x, y) in w.iter().zip(a) {
            let d = y.scale() * f16(x.d);
            let dmin = -y.scale() * f16(x.dmin);
            // SAFETY: `scales` is 16 bytes, `bsums` 32.
            let (ms, bsums) = unsafe {
                (
                    _mm_loadu_si128(x.scales.as_ptr().cast()),
                    _mm256_loadu_si256(y.bsums.as_ptr().cast()),
                )
            };
            let mins = _mm256_cvtepi8_epi16(_mm_and_si128(_mm_srli_epi16::<4>(ms), m4));
            acc = _mm256_fmadd_ps(
                _mm256_set1_ps(dmin),
                _mm256_cvtepi32_ps(_mm256_madd_epi16(mins, bsums)),
                acc,
            );
            let sc = x.scales.map(|s| (s & 0xF) as i16);
            let mut sumi = _mm256_setzero_si256();
            for j in 0..2 {
                // SAFETY: half j of `qs` (32 bytes) and of the activations.
                let q2bits = unsafe { _mm256_loadu_si256(x.qs.as_ptr().add(32 * j).cast()) };
                let q = [
                    _mm256_and_si256(q2bits, m3),
                    _mm256_and_si256(_mm256_srli_epi16::<2>(q2bits), m3),
                    _mm256_and_si256(_mm256_srli_epi16::<4>(q2bits), m3),
                    _mm256_and_si256(_mm256_srli_epi16::<6>(q2bits), m3),
                ];
                let mut p = [_mm256_setzero_si256(); 4];
                for k in 0..4 {
                    let c = 4 * j + k;
                    // SAFETY: values 32c..32c + 32 of 256.
                    let q8 = unsafe { _mm256_loadu_si256(y.qs.as_ptr().add(32 * c).cast()) };
                    // SAFETY: AVX2 enabled above.
                    let s = unsafe { halves(sc[2 * c], sc[2 * c + 1]) };
                    p[k] = _mm256_madd_epi16(s, _mm256_maddubs_epi16(q[k], q8));
                }
                let p01 = _mm256_add_epi32(p[0], p[1]);
                let p23 = _mm256_add_epi32(p[2], p[3]);
                sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(p01, p23));
            }
            acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
        }
        // SAFETY: AVX enabled above.
        hsum8(unsafe { lanes8(acc) })
    }

    /// `ggml_vec_dot_q3_K_q8_K`, AVX2 branch (the `- 4` of values whose
    /// high bit is clear applied as a separate `maddubs`, as llama.cpp does;
    /// the lanes are the same integers either way).
    ///
    /// # Safety
    /// As `dot_q2k_avx2`.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(in super::super) unsafe fn dot_q3k_avx2(w: &[u8], a: &[u8]) -> f32 {
        let Some((w, a)) = blocks::<BlockQ3K>(w, a) else {
            return f32::NAN;
        };
        let m3 = _mm256_set1_epi8(3);
        let mone = _mm256_set1_epi8(1);
        let mut acc = _mm256_setzero_ps();
        for (x, y) in w.iter().zip(a) {
            let d = y.scale() * f16(x.d);
            let sc = super::super::q3k_scales(&x.scales).map(|s| s as i16);
            // SAFETY: `hmask` is 32 bytes.
            let hbits = unsafe { _mm256_loadu_si256(x.hmask.as_ptr().cast()) };
            let mut sumi = _mm256_setzero_si256();
            for j in 0..2 {
                // SAFETY: half j of `qs` (32 bytes).
                let q3bits = unsafe { _mm256_loadu_si256(x.qs.as_ptr().add(32 * j).cast()) };
                let mut p = [_mm256_setzero_si256(); 4];
                for k in 0..4 {
                    let c = 4 * j + k;
                    let cnt = _mm_cvtsi32_si128(2 * k as i32);
                    let lo = _mm256_and_si256(_mm256_srl_epi16(q3bits, cnt), m3);
                    // 4 where bit c of the hmask byte is clear, else 0.
                    let clear = _mm256_andnot_si256(_mm256_srl_epi16(hbits, _mm_cvtsi32_si128(c as i32)), mone);
                    let hi = _mm256_slli_epi16::<2>(clear);
                    // SAFETY: values 32c..32c + 32 of 256.
                    let q8 = unsafe { _mm256_loadu_si256(y.qs.as_ptr().add(32 * c).cast()) };
                    let p16 = _mm256_sub_epi16(_mm256_maddubs_epi16(lo, q8), _mm256_maddubs_epi16(hi, q8));
                    // SAFETY: AVX2 enabled above.
                    let s = unsafe { halves(sc[2 * c], sc[2 * c + 1]) };
                    p[k] = _mm256_madd_epi16(s, p16);
                }
                let p01 = _mm256_add_epi32(p[0], p[1]);
                let p23 = _mm256_add_epi32(p[2], p[3]);
                sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(p01, p23));
            }
            acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
        }
        // SAFETY: AVX enabled above.
        hsum8(unsafe { lanes8(acc) })
    }

    /// `ggml_vec_dot_iq4_xs_q8_K`, AVX2 branch.
    ///
    /// # Safety
    /// As `dot_q2k_avx2`.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(in super::super) unsafe fn dot_iq4xs_avx2(w: &[u8], a: &[u8]) -> f32 {
        let Some((w, a)) = blocks::<BlockIQ4XS>(w, a) else {
            return f32::NAN;
        };
        // SAFETY: the table is 16 bytes.
        let values = unsafe { _mm_loadu_si128(KVALUES_IQ4NL.as_ptr().cast()) };
        let m4b = _mm_set1_epi8(0xF);
        let mut acc = _mm256_setzero_ps();
        for (x, y) in w.iter().zip(a) {
            let sh = u16::from_le_bytes(x.scales_h);
            let mut sumi = _mm256_setzero_si256();
            for g in 0..8 {
                // SAFETY: group g's 16 quant bytes and 32 activations.
                let (bits, q8) = unsafe {
                    (
                        _mm_loadu_si128(x.qs.as_ptr().add(16 * g).cast()),
                        _mm256_loadu_si256(y.qs.as_ptr().add(32 * g).cast()),
                    )
                };
                let lo = _mm_shuffle_epi8(values, _mm_and_si128(bits, m4b));
                let hi = _mm_shuffle_epi8(values, _mm_and_si128(_mm_srli_epi16::<4>(bits), m4b));
                let q4 = _mm256_setr_m128i(lo, hi);
                // llama.cpp's `mul_add_epi8`: |q4| times q8 with q4's sign.
                let p16 = _mm256_maddubs_epi16(_mm256_sign_epi8(q4, q4), _mm256_sign_epi8(q8, q4));
                let l = (x.scales_l[g / 2] >> (4 * (g % 2))) & 0xF;
                let ls = (l | (((sh >> (2 * g)) & 3) as u8) << 4) as i16 - 32;
                sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p16, _mm256_set1_epi16(ls)));
            }
            let d = f16(x.d) * y.scale();
            acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
        }
        // SAFETY: AVX enabled above.
        hsum8(unsafe { lanes8(acc) })
    }
}
