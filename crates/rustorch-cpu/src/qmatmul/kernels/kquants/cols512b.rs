//! Four weight rows against one activation row with AVX-512 VNNI for
//! Q2_K, Q3_K and IQ4_XS, in llama.cpp's exact `vec_dot` order (see
//! `ggml_k2`); the scheme is `cols512`'s.
//!
//! Q3_K's signed quants are `u - 4` with unsigned codes `u` in 0..8, and
//! IQ4_XS's are `u - 128` with `u` looked up from a shifted table: the
//! offset times each lane's activation sum starts the `vpdpbusd` sums,
//! which are then the signed lanes exactly. IQ4_XS lanes reach 4 * 127^2,
//! past an i16, so they take their scales with `vpmulld`.

// Chunk-pair indices address several arrays with different strides.
#![allow(clippy::needless_range_loop)]

use super::cols512::{
    bcast256, check, d4, f32_at, fold2, lane_scales, load4x16, load64, prefetch_next, scale_idxs, scaled, Acc4,
    A_BSUMS, A_BYTES, A_QS,
};
use rustorch_core::quant::blocks::KVALUES_IQ4NL;
use std::arch::x86_64::*;

const Q2K_BYTES: usize = 84;
const Q3K_BYTES: usize = 110;
const IQ4XS_BYTES: usize = 136;

/// The i8 at lane `r`'s bytes 0..16 of `x` sign-extended to i16: rows 0,
/// 1 (`.0`) and 2, 3 (`.1`), each row in one 256-bit half.
#[inline(always)]
unsafe fn i16_halves(x: __m512i, signed: bool) -> (__m512i, __m512i) {
    // SAFETY: AVX-512BW in the kernel.
    unsafe {
        let (lo, hi) = (_mm512_castsi512_si256(x), _mm512_extracti64x4_epi64::<1>(x));
        if signed {
            (_mm512_cvtepi8_epi16(lo), _mm512_cvtepi8_epi16(hi))
        } else {
            (_mm512_cvtepu8_epi16(lo), _mm512_cvtepu8_epi16(hi))
        }
    }
}

/// Codes `(qs[32 (j / 2) + e] >> 2k) & 3` for the chunks k0 = 2 (j % 2)
/// (low half) and k0 + 1 of the 64 two-bit bytes at `qs`.
#[inline(always)]
pub(in crate::qmatmul) unsafe fn two_bits(qs: *const u8, j: usize, shift: &[__m512i; 2]) -> __m512i {
    // SAFETY: 64 readable bytes at `qs` (caller); AVX-512F in the kernel.
    unsafe {
        let v = bcast256(qs.add(32 * (j / 2)));
        _mm512_and_si512(_mm512_srlv_epi64(v, shift[j % 2]), _mm512_set1_epi8(3))
    }
}

/// Shift counts for `two_bits`.
#[inline(always)]
pub(in crate::qmatmul) unsafe fn two_bit_shifts() -> [__m512i; 2] {
    // SAFETY: AVX-512F in the kernel.
    std::array::from_fn(|jm| unsafe {
        let (s0, s1) = (4 * jm as i64, 4 * jm as i64 + 2);
        _mm512_setr_epi64(s0, s0, s0, s0, s1, s1, s1, s1)
    })
}

/// `ggml_vec_dot_q2_K_q8_K` for four weight rows.
///
/// # Safety
/// AVX-512 F/BW/VL/VNNI, AVX2, FMA and F16C must be available
/// (`Isa::Avx512Vnni`).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn dot_cols_q2k(a: &[u8], w: [&[u8]; 4], out: &mut [f32; 4]) {
    let Some(nb) = check(a, &w, Q2K_BYTES) else {
        *out = [f32::NAN; 4];
        return;
    };
    let m4 = _mm512_set1_epi8(0x0F);
    // SAFETY: AVX-512 enabled above.
    let (idx, shift) = unsafe { (scale_idxs(4), two_bit_shifts()) };
    let mut acc = unsafe { Acc4::new() };
    for i in 0..nb {
        // SAFETY (pointer reads): block i < nb of the activation row and
        // of every weight row (`check`).
        unsafe {
            let y = a.as_ptr().add(i * A_BYTES);
            let wb = w.map(|r| r.as_ptr().add(i * Q2K_BYTES));
            prefetch_next(w[0].as_ptr(), nb, i, Q2K_BYTES);
            let yd = f32_at(y);
            let packed = load4x16(wb, 0);
            let (sc01, sc23) = i16_halves(_mm512_and_si512(packed, m4), false);
            let (mn01, mn23) = i16_halves(_mm512_and_si512(_mm512_srli_epi16::<4>(packed), m4), false);
            // First the mins, lane l: fma(dmin, mins[2l] * bsums[2l] +
            // mins[2l + 1] * bsums[2l + 1], acc), dmin = -y.d * x.dmin.
            let bs = bcast256(y.add(A_BSUMS));
            acc.fnma(d4(wb, 82, yd), _mm512_madd_epi16(bs, mn01), _mm512_madd_epi16(bs, mn23));
            let mut lanes = [_mm512_setzero_si512(); 4];
            for j in 0..4 {
                let act = load64(y.add(A_QS + 64 * j));
                for r in 0..4 {
                    let codes = two_bits(wb[r].add(16), j, &shift);
                    let sc = lane_scales(idx[r % 2][j], if r < 2 { sc01 } else { sc23 });
                    lanes[r] = scaled(lanes[r], _mm512_setzero_si512(), codes, act, sc);
                }
            }
            acc.fma(d4(wb, 80, yd), fold2(lanes[0], lanes[1]), fold2(lanes[2], lanes[3]));
        }
    }
    // SAFETY: AVX-512F enabled above.
    *out = unsafe { acc.hsum() };
}

/// Q3_K's sixteen 6-bit scales minus 32 for four rows (lane `r` holds row
/// `r`'s bytes 94..110: two quant bytes, the 12 packed bytes, `d`),
/// unpacked with llama.cpp's word arithmetic: bytes 0..16 of lane `r`.
#[inline(always)]
unsafe fn q3k_scales4(x: __m512i) -> __m512i {
    // SAFETY: AVX-512F/BW in the kernel.
    unsafe {
        // Dwords [a0, a1, tmp, d] of each lane.
        let x = _mm512_bsrli_epi128::<2>(x);
        let a = _mm512_shuffle_epi32::<0b01_00_01_00>(x); // [a0, a1, a0, a1]
        let t = _mm512_shuffle_epi32::<0b10_10_10_10>(x); // [tmp; 4]
        let lo = _mm512_and_si512(
            _mm512_srlv_epi32(a, _mm512_setr_epi32(0, 0, 4, 4, 0, 0, 4, 4, 0, 0, 4, 4, 0, 0, 4, 4)),
            _mm512_set1_epi8(0x0F),
        );
        let hi = _mm512_and_si512(
            _mm512_srlv_epi32(t, _mm512_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6, 0, 2, 4, 6, 0, 2, 4, 6)),
            _mm512_set1_epi8(3),
        );
        _mm512_sub_epi8(_mm512_or_si512(lo, _mm512_slli_epi32::<4>(hi)), _mm512_set1_epi8(32))
    }
}

/// `ggml_vec_dot_q3_K_q8_K` for four weight rows.
///
/// # Safety
/// As `dot_cols_q2k`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn dot_cols_q3k(a: &[u8], w: [&[u8]; 4], out: &mut [f32; 4]) {
    let Some(nb) = check(a, &w, Q3K_BYTES) else {
        *out = [f32::NAN; 4];
        return;
    };
    let bit2 = _mm512_set1_epi8(4);
    // Bit c of each hmask byte to bit 2: rotate left by 2 - c (mod 64).
    let rot: [__m512i; 4] = std::array::from_fn(|j| {
        let (r0, r1) = ((2 - 2 * j as i64).rem_euclid(64), (1 - 2 * j as i64).rem_euclid(64));
        _mm512_setr_epi64(r0, r0, r0, r0, r1, r1, r1, r1)
    });
    // SAFETY: AVX-512 enabled above.
    let (idx, shift) = unsafe { (scale_idxs(4), two_bit_shifts()) };
    let mut acc = unsafe { Acc4::new() };
    for i in 0..nb {
        // SAFETY (pointer reads): as in `dot_cols_q2k`.
        unsafe {
            let y = a.as_ptr().add(i * A_BYTES);
            let wb = w.map(|r| r.as_ptr().add(i * Q3K_BYTES));
            prefetch_next(w[0].as_ptr(), nb, i, Q3K_BYTES);
            let (sc01, sc23) = i16_halves(q3k_scales4(load4x16(wb, 94)), true);
            let hm = wb.map(|p| bcast256(p));
            let mut lanes = [_mm512_setzero_si512(); 4];
            for j in 0..4 {
                let act = load64(y.add(A_QS + 64 * j));
                // -4 times each lane's activation sum: the codes are q + 4.
                let init = _mm512_sub_epi32(
                    _mm512_setzero_si512(),
                    _mm512_dpbusd_epi32(_mm512_setzero_si512(), bit2, act),
                );
                for r in 0..4 {
                    let lo = two_bits(wb[r].add(32), j, &shift);
                    let hi = _mm512_and_si512(_mm512_rolv_epi64(hm[r], rot[j]), bit2);
                    let sc = lane_scales(idx[r % 2][j], if r < 2 { sc01 } else { sc23 });
                    lanes[r] = scaled(lanes[r], init, _mm512_or_si512(lo, hi), act, sc);
                }
            }
            acc.fma(
                d4(wb, 108, f32_at(y)),
                fold2(lanes[0], lanes[1]),
                fold2(lanes[2], lanes[3]),
            );
        }
    }
    // SAFETY: AVX-512F enabled above.
    *out = unsafe { acc.hsum() };
}

/// The eight IQ4_XS group scales (`ls - 32`) of rows `p0` and `p1` as i32,
/// one row per 256-bit half.
#[inline(always)]
unsafe fn iq4xs_scales2(p0: *const u8, p1: *const u8) -> __m512i {
    // SAFETY: whole blocks at `p0`, `p1` (caller); AVX-512F in the kernel.
    unsafe {
        let both = |at: usize, f: fn(*const u8) -> i32| {
            _mm512_inserti64x4::<1>(
                _mm512_castsi256_si512(_mm256_set1_epi32(f(p0.add(at)))),
                _mm256_set1_epi32(f(p1.add(at))),
            )
        };
        let sl = both(4, |p| p.cast::<i32>().read_unaligned());
        let sh = both(2, |p| p.cast::<u16>().read_unaligned() as i32);
        let lo = _mm512_and_si512(
            _mm512_srlv_epi32(
                sl,
                _mm512_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28, 0, 4, 8, 12, 16, 20, 24, 28),
            ),
            _mm512_set1_epi32(0xF),
        );
        let hi = _mm512_and_si512(
            _mm512_srlv_epi32(
                sh,
                _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 0, 2, 4, 6, 8, 10, 12, 14),
            ),
            _mm512_set1_epi32(3),
        );
        _mm512_sub_epi32(_mm512_or_si512(lo, _mm512_slli_epi32::<4>(hi)), _mm512_set1_epi32(32))
    }
}

/// `ggml_vec_dot_iq4_xs_q8_K` for four weight rows.
///
/// # Safety
/// As `dot_cols_q2k`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn dot_cols_iq4xs(a: &[u8], w: [&[u8]; 4], out: &mut [f32; 4]) {
    let Some(nb) = check(a, &w, IQ4XS_BYTES) else {
        *out = [f32::NAN; 4];
        return;
    };
    let m4 = _mm512_set1_epi8(0x0F);
    let shift = _mm512_setr_epi64(0, 0, 4, 4, 0, 0, 4, 4);
    // The levels plus 128 (1..=241), as unsigned codes.
    let table = _mm512_broadcast_i32x4(_mm_add_epi8(
        // SAFETY: the table is 16 bytes.
        unsafe { _mm_loadu_si128(KVALUES_IQ4NL.as_ptr().cast()) },
        _mm_set1_epi8(i8::MIN),
    ));
    // Lane t of chunk pair j takes group 2j + t / 8: i32 `8 h + 2j + t / 8`.
    let idx: [[__m512i; 4]; 2] = std::array::from_fn(|h| {
        std::array::from_fn(|j| {
            let g = (8 * h + 2 * j) as i32;
            let (a, b) = (g, g + 1);
            _mm512_setr_epi32(a, a, a, a, a, a, a, a, b, b, b, b, b, b, b, b)
        })
    });
    let mut acc = unsafe { Acc4::new() };
    for i in 0..nb {
        // SAFETY (pointer reads): as in `dot_cols_q2k`.
        unsafe {
            let y = a.as_ptr().add(i * A_BYTES);
            let wb = w.map(|r| r.as_ptr().add(i * IQ4XS_BYTES));
            prefetch_next(w[0].as_ptr(), nb, i, IQ4XS_BYTES);
            let ls01 = iq4xs_scales2(wb[0], wb[1]);
            let ls23 = iq4xs_scales2(wb[2], wb[3]);
            let mut lanes = [_mm512_setzero_si512(); 4];
            for j in 0..4 {
                let act = load64(y.add(A_QS + 64 * j));
                // -128 times each lane's activation sum.
                let init = _mm512_sub_epi32(
                    _mm512_setzero_si512(),
                    _mm512_slli_epi32::<7>(_mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8(1), act)),
                );
                for r in 0..4 {
                    // Groups 2j, 2j + 1 (16 bytes each): low nibbles are
                    // values 0..16, high ones 16..32.
                    let v = bcast256(wb[r].add(8 + 32 * j));
                    let v = _mm512_shuffle_i64x2::<0b01_01_00_00>(v, v);
                    let codes = _mm512_shuffle_epi8(table, _mm512_and_si512(_mm512_srlv_epi64(v, shift), m4));
                    let p = _mm512_dpbusd_epi32(init, codes, act);
                    let ls = _mm512_permutexvar_epi32(idx[r % 2][j], if r < 2 { ls01 } else { ls23 });
                    lanes[r] = _mm512_add_epi32(lanes[r], _mm512_mullo_epi32(p, ls));
                }
            }
            acc.fma(
                d4(wb, 0, f32_at(y)),
                fold2(lanes[0], lanes[1]),
                fold2(lanes[2], lanes[3]),
            );
        }
    }
    // SAFETY: AVX-512F enabled above.
    *out = unsafe { acc.hsum() };
}
