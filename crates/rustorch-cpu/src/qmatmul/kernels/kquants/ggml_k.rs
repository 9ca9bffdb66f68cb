//! Q4_K, Q5_K and Q6_K rows against Q8_K rows in llama.cpp's exact x86
//! order (`ggml_vec_dot_q{4,5,6}_K_q8_K`, arch/x86/quants.c).
//!
//! llama.cpp 0.3.36 has no AVX-512 branch for these: a native build with
//! AVX-512 compiles the `__AVX2__` one. Its integer sums are exact, so only
//! the partition of each super-block's products into eight i32 lanes and
//! the f32 operations that follow decide the bits:
//!
//! - eight i32 lanes per super-block; lane `l` holds, for every 32-value
//!   chunk of the block, the scaled products of values `4l..4l + 4` of that
//!   chunk (`maddubs` + `madd` with the group scale);
//! - `acc[l] = fma(d, lane, acc[l])` once per super-block, with
//!   `d = y.d * x.d`; the result is llama.cpp's `hsum_float_8(acc)`;
//! - Q4_K adds four more f32 lanes for its mins: lane `k` takes
//!   `fma(dmin, mins[2k] * q8s[2k] + mins[2k+1] * q8s[2k+1], lane)` with
//!   `dmin = -y.d * x.dmin` and `q8s[g]` the sum of the activation's
//!   32-value group g (two `bsums`), reduced as `(a0 + a2) + (a1 + a3)`
//!   and added to the 8-lane sum;
//! - Q5_K sums its min products as integers and accumulates one f32:
//!   `summs = fma(dmin, that sum, summs)` (GCC contracts `summs += dmin * i`),
//!   returning `hsum + summs`;
//! - Q6_K subtracts `32 * (bsums[2l] * sc[2l] + bsums[2l+1] * sc[2l+1])`
//!   from lane `l` before its FMA (the `- 32` of every quant).
//!
//! The portable kernels compute those lanes in scalar code, the AVX2 ones
//! with llama.cpp's instructions; both give the same bits on any CPU.

// Lane, group and chunk indices address several arrays with different strides.
#![allow(clippy::needless_range_loop)]

use super::k4_scales_mins;
use rustorch_core::quant::blocks::{cast_blocks, f16_to_f32, Block, BlockQ4K, BlockQ5K, BlockQ6K, BlockQ8K};

/// llama.cpp's `hsum_float_8`: upper four lanes added to the lower four,
/// then lanes {2, 3} to {0, 1}, then lane 1 to lane 0.
#[inline(always)]
pub(super) fn hsum8(acc: [f32; 8]) -> f32 {
    let r: [f32; 4] = std::array::from_fn(|i| acc[4 + i] + acc[i]);
    (r[0] + r[2]) + (r[1] + r[3])
}

fn blocks<'a, W: Block>(w: &'a [u8], a: &'a [u8]) -> Option<(&'a [W], &'a [BlockQ8K])> {
    let (w, a): (&[W], &[BlockQ8K]) = (cast_blocks(w)?, cast_blocks(a)?);
    (w.len() == a.len()).then_some((w, a))
}

/// The sums of the activation's eight 32-value groups (`_mm_hadd_epi16`
/// of the 16 `bsums`; each is at most 32 * 127 in magnitude, no wrap).
#[inline(always)]
pub(super) fn group_sums(y: &BlockQ8K) -> [i32; 8] {
    std::array::from_fn(|g| y.bsum(2 * g) as i32 + y.bsum(2 * g + 1) as i32)
}

/// The four i32 lanes of llama.cpp's min products (`_mm_madd_epi16` of the
/// mins with the group sums).
#[inline(always)]
fn min_lanes(sm: &[u8; 16], y: &BlockQ8K) -> [i32; 4] {
    let q8s = group_sums(y);
    std::array::from_fn(|k| sm[8 + 2 * k] as i32 * q8s[2 * k] + sm[9 + 2 * k] as i32 * q8s[2 * k + 1])
}

/// The eight i32 lanes of a Q4_K or Q5_K super-block: `q(g, e)` is value
/// `e` (0..32) of group `g` (0..8), scaled by the group's 6-bit scale.
#[inline(always)]
fn k4_lanes(sm: &[u8; 16], y: &BlockQ8K, q: impl Fn(usize, usize) -> i32) -> [i32; 8] {
    let mut lanes = [0i32; 8];
    for g in 0..8 {
        let sc = sm[g] as i32;
        let q8 = &y.qs[32 * g..32 * g + 32];
        for l in 0..8 {
            let s: i32 = (4 * l..4 * l + 4).map(|e| q(g, e) * q8[e] as i32).sum();
            lanes[l] += sc * s;
        }
    }
    lanes
}

/// Portable `ggml_vec_dot_q4_K_q8_K` (AVX2 order).
///
/// # Safety
/// None beyond the `DotFn` contract (it is `unsafe` only to share its type).
pub(super) unsafe fn dot_q4k_scalar(w: &[u8], a: &[u8]) -> f32 {
    let Some((w, a)) = blocks::<BlockQ4K>(w, a) else {
        return f32::NAN;
    };
    let mut acc = [0f32; 8];
    let mut acc_m = [0f32; 4];
    for (x, y) in w.iter().zip(a) {
        let d = y.scale() * f16_to_f32(x.d);
        let dmin = -y.scale() * f16_to_f32(x.dmin);
        let sm = k4_scales_mins(&x.scales);
        for (m, p) in acc_m.iter_mut().zip(min_lanes(&sm, y)) {
            *m = dmin.mul_add(p as f32, *m);
        }
        let lanes = k4_lanes(&sm, y, |g, e| ((x.qs[32 * (g / 2) + e] >> (4 * (g % 2))) & 0xF) as i32);
        for (s, v) in acc.iter_mut().zip(lanes) {
            *s = d.mul_add(v as f32, *s);
        }
    }
    hsum8(acc) + ((acc_m[0] + acc_m[2]) + (acc_m[1] + acc_m[3]))
}

/// Portable `ggml_vec_dot_q5_K_q8_K` (AVX2 order).
///
/// # Safety
/// As `dot_q4k_scalar`.
pub(super) unsafe fn dot_q5k_scalar(w: &[u8], a: &[u8]) -> f32 {
    let Some((w, a)) = blocks::<BlockQ5K>(w, a) else {
        return f32::NAN;
    };
    let mut acc = [0f32; 8];
    let mut summs = 0f32;
    for (x, y) in w.iter().zip(a) {
        let d = y.scale() * f16_to_f32(x.d);
        let dmin = -y.scale() * f16_to_f32(x.dmin);
        let sm = k4_scales_mins(&x.scales);
        let m = min_lanes(&sm, y);
        summs = dmin.mul_add(((m[0] + m[1]) + (m[2] + m[3])) as f32, summs);
        let lanes = k4_lanes(&sm, y, |g, e| {
            let lo = (x.qs[32 * (g / 2) + e] >> (4 * (g % 2))) & 0xF;
            let hi = (x.qh[e] >> g) & 1;
            (lo | hi << 4) as i32
        });
        for (s, v) in acc.iter_mut().zip(lanes) {
            *s = d.mul_add(v as f32, *s);
        }
    }
    hsum8(acc) + summs
}

/// Value `e` (0..32) of the 32-value chunk `c` (0..8) of a Q6_K block,
/// without its `- 32` offset: chunk `4h + k` of half `h` takes the low
/// (k = 0, 1) or high (k = 2, 3) nibbles of `ql[64h + 32 (k % 2) ..]` and
/// bits `2k..2k + 2` of `qh[32h ..]`.
#[inline(always)]
fn q6(x: &BlockQ6K, c: usize, e: usize) -> i32 {
    let (h, k) = (c / 4, c % 4);
    let lo = (x.ql[64 * h + 32 * (k % 2) + e] >> (4 * (k / 2))) & 0xF;
    let hi = (x.qh[32 * h + e] >> (2 * k)) & 3;
    (lo | hi << 4) as i32
}

/// Portable `ggml_vec_dot_q6_K_q8_K` (AVX2 order).
///
/// # Safety
/// As `dot_q4k_scalar`.
pub(super) unsafe fn dot_q6k_scalar(w: &[u8], a: &[u8]) -> f32 {
    let Some((w, a)) = blocks::<BlockQ6K>(w, a) else {
        return f32::NAN;
    };
    let mut acc = [0f32; 8];
    for (x, y) in w.iter().zip(a) {
        let d = y.scale() * f16_to_f32(x.d);
        let sc = x.scales.map(|s| s as i32);
        let mut lanes: [i32; 8] = std::array::from_fn(|l| {
            -32 * (y.bsum(2 * l) as i32 * sc[2 * l] + y.bsum(2 * l + 1) as i32 * sc[2 * l + 1])
        });
        for c in 0..8 {
            let q8 = &y.qs[32 * c..32 * c + 32];
            for l in 0..8 {
                let s: i32 = (4 * l..4 * l + 4).map(|e| q6(x, c, e) * q8[e] as i32).sum();
                // Values 0..16 of the chunk are group 2c, 16..32 group 2c + 1.
                lanes[l] += sc[2 * c + l / 4] * s;
            }
        }
        for (s, v) in acc.iter_mut().zip(lanes) {
            *s = d.mul_add(v as f32, *s);
        }
    }
    hsum8(acc)
}

#[cfg(target_arch = "x86_64")]
pub(super) use simd::{dot_q4k_avx2, dot_q5k_avx2, dot_q6k_avx2};

#[cfg(target_arch = "x86_64")]
mod simd {
    use super::{blocks, hsum8, k4_scales_mins, min_lanes};
    use rustorch_core::quant::blocks::{BlockQ4K, BlockQ5K, BlockQ6K};
    use std::arch::x86_64::*;

    /// f16 to f32 with F16C (exact, as every such conversion is).
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

    /// `ggml_vec_dot_q4_K_q8_K`, AVX2 branch.
    ///
    /// # Safety
    /// AVX2, FMA and F16C must be available (`Isa::Avx2`).
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(in super::super) unsafe fn dot_q4k_avx2(w: &[u8], a: &[u8]) -> f32 {
        let Some((w, a)) = blocks::<BlockQ4K>(w, a) else {
            return f32::NAN;
        };
        let m4 = _mm256_set1_epi8(0xF);
        let mut acc = _mm256_setzero_ps();
        let mut acc_m = _mm_setzero_ps();
        for (x, y) in w.iter().zip(a) {
            let d = y.scale() * f16(x.d);
            let dmin = -y.scale() * f16(x.dmin);
            let sm = k4_scales_mins(&x.scales);
            let m = min_lanes(&sm, y);
            let prod = _mm_setr_epi32(m[0], m[1], m[2], m[3]);
            acc_m = _mm_fmadd_ps(_mm_set1_ps(dmin), _mm_cvtepi32_ps(prod), acc_m);
            let mut sumi = _mm256_setzero_si256();
            for j in 0..4 {
                // SAFETY: chunk j of the 128 quant bytes and values
                // 64j..64j + 64 of the 256 activations are in bounds.
                let (q4bits, q8l, q8h) = unsafe {
                    (
                        _mm256_loadu_si256(x.qs.as_ptr().add(32 * j).cast()),
                        _mm256_loadu_si256(y.qs.as_ptr().add(64 * j).cast()),
                        _mm256_loadu_si256(y.qs.as_ptr().add(64 * j + 32).cast()),
                    )
                };
                let q4l = _mm256_and_si256(q4bits, m4);
                let q4h = _mm256_and_si256(_mm256_srli_epi16::<4>(q4bits), m4);
                let pl = _mm256_madd_epi16(_mm256_set1_epi16(sm[2 * j] as i16), _mm256_maddubs_epi16(q4l, q8l));
                let ph = _mm256_madd_epi16(_mm256_set1_epi16(sm[2 * j + 1] as i16), _mm256_maddubs_epi16(q4h, q8h));
                sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(pl, ph));
            }
            acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
        }
        let mut m = [0f32; 4];
        // SAFETY: `m` holds four f32 values.
        unsafe { _mm_storeu_ps(m.as_mut_ptr(), acc_m) };
        // SAFETY: AVX enabled above.
        hsum8(unsafe { lanes8(acc) }) + ((m[0] + m[2]) + (m[1] + m[3]))
    }

    /// `ggml_vec_dot_q5_K_q8_K`, AVX2 branch.
    ///
    /// # Safety
    /// As `dot_q4k_avx2`.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(in super::super) unsafe fn dot_q5k_avx2(w: &[u8], a: &[u8]) -> f32 {
        let Some((w, a)) = blocks::<BlockQ5K>(w, a) else {
            return f32::NAN;
        };
        let m4 = _mm256_set1_epi8(0xF);
        let mone = _mm256_set1_epi8(1);
        let mut acc = _mm256_setzero_ps();
        let mut summs = 0f32;
        for (x, y) in w.iter().zip(a) {
            let d = y.scale() * f16(x.d);
            let dmin = -y.scale() * f16(x.dmin);
            let sm = k4_scales_mins(&x.scales);
            let m = min_lanes(&sm, y);
            summs = dmin.mul_add(((m[0] + m[1]) + (m[2] + m[3])) as f32, summs);
            // SAFETY: `qh` is 32 bytes.
            let hbits = unsafe { _mm256_loadu_si256(x.qh.as_ptr().cast()) };
            let mut sumi = _mm256_setzero_si256();
            for j in 0..4 {
                // SAFETY: as in `dot_q4k_avx2`.
                let (q5bits, q8_0, q8_1) = unsafe {
                    (
                        _mm256_loadu_si256(x.qs.as_ptr().add(32 * j).cast()),
                        _mm256_loadu_si256(y.qs.as_ptr().add(64 * j).cast()),
                        _mm256_loadu_si256(y.qs.as_ptr().add(64 * j + 32).cast()),
                    )
                };
                // Bit 2j (2j + 1) of each qh byte, moved to bit 4.
                // (16-bit shifts: the mask keeps bit 0 of each byte, which
                // came from the same byte.)
                let b0 = _mm256_and_si256(_mm256_srl_epi16(hbits, _mm_cvtsi32_si128(2 * j as i32)), mone);
                let b1 = _mm256_and_si256(_mm256_srl_epi16(hbits, _mm_cvtsi32_si128(2 * j as i32 + 1)), mone);
                let q5_0 = _mm256_add_epi8(_mm256_and_si256(q5bits, m4), _mm256_slli_epi16::<4>(b0));
                let q5_1 = _mm256_add_epi8(
                    _mm256_and_si256(_mm256_srli_epi16::<4>(q5bits), m4),
                    _mm256_slli_epi16::<4>(b1),
                );
                let p0 = _mm256_madd_epi16(_mm256_set1_epi16(sm[2 * j] as i16), _mm256_maddubs_epi16(q5_0, q8_0));
                let p1 = _mm256_madd_epi16(
                    _mm256_set1_epi16(sm[2 * j + 1] as i16),
                    _mm256_maddubs_epi16(q5_1, q8_1),
                );
                sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(p0, p1));
            }
            acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
        }
        // SAFETY: AVX enabled above.
        hsum8(unsafe { lanes8(acc) }) + summs
    }

    /// `ggml_vec_dot_q6_K_q8_K`, AVX2 branch.
    ///
    /// # Safety
    /// As `dot_q4k_avx2`.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(in super::super) unsafe fn dot_q6k_avx2(w: &[u8], a: &[u8]) -> f32 {
        let Some((w, a)) = blocks::<BlockQ6K>(w, a) else {
            return f32::NAN;
        };
        let m3 = _mm256_set1_epi8(3);
        let m15 = _mm256_set1_epi8(15);
        let mut acc = _mm256_setzero_ps();
        for (x, y) in w.iter().zip(a) {
            let d = y.scale() * f16(x.d);
            // SAFETY: `bsums` is 32 bytes, `scales` 16.
            let (q8sums, scales) = unsafe {
                (
                    _mm256_loadu_si256(y.bsums.as_ptr().cast()),
                    _mm_loadu_si128(x.scales.as_ptr().cast()),
                )
            };
            let q8sclsub = _mm256_slli_epi32::<5>(_mm256_madd_epi16(q8sums, _mm256_cvtepi8_epi16(scales)));
            // (Indexed in place: `scales.map` was left a call per block.)
            let sc = |g: usize| x.scales[g] as i16;
            let mut sumi = _mm256_setzero_si256();
            for j in 0..2 {
                // SAFETY: half j of `ql` (64 bytes), `qh` (32 bytes) and
                // the activations (128 values) are in bounds.
                let (b1, b2, bh) = unsafe {
                    (
                        _mm256_loadu_si256(x.ql.as_ptr().add(64 * j).cast()),
                        _mm256_loadu_si256(x.ql.as_ptr().add(64 * j + 32).cast()),
                        _mm256_loadu_si256(x.qh.as_ptr().add(32 * j).cast()),
                    )
                };
                let h0 = _mm256_slli_epi16::<4>(_mm256_and_si256(bh, m3));
                let h1 = _mm256_slli_epi16::<2>(_mm256_and_si256(bh, _mm256_set1_epi8(12)));
                let h2 = _mm256_and_si256(bh, _mm256_set1_epi8(48));
                let h3 = _mm256_srli_epi16::<2>(_mm256_and_si256(bh, _mm256_set1_epi8(-64)));
                let q = [
                    _mm256_or_si256(_mm256_and_si256(b1, m15), h0),
                    _mm256_or_si256(_mm256_and_si256(b2, m15), h1),
                    _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16::<4>(b1), m15), h2),
                    _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16::<4>(b2), m15), h3),
                ];
                let mut p = [_mm256_setzero_si256(); 4];
                for k in 0..4 {
                    // SAFETY: values 128j + 32k .. + 32 of 256.
                    let q8 = unsafe { _mm256_loadu_si256(y.qs.as_ptr().add(128 * j + 32 * k).cast()) };
                    let is = 4 * j + k;
                    // Values 0..16 take scale 2is, 16..32 scale 2is + 1.
                    let s = _mm256_setr_m128i(_mm_set1_epi16(sc(2 * is)), _mm_set1_epi16(sc(2 * is + 1)));
                    p[k] = _mm256_madd_epi16(s, _mm256_maddubs_epi16(q[k], q8));
                }
                sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(p[0], p[1]));
                sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(p[2], p[3]));
            }
            sumi = _mm256_sub_epi32(sumi, q8sclsub);
            acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
        }
        // SAFETY: AVX enabled above.
        hsum8(unsafe { lanes8(acc) })
    }
}
