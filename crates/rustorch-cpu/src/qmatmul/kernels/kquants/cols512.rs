//! Four weight rows against one activation row (matvecs) with AVX-512
//! VNNI, in llama.cpp's exact `vec_dot` order for Q4_K, Q5_K and Q6_K (see
//! `ggml_k` for that order; `cols512b` has Q2_K, Q3_K and IQ4_XS).
//!
//! Only the eight i32 lanes of each super-block and the f32 operations
//! after them decide the bits, so the lanes are formed differently: one
//! `vpdpbusd` multiplies the 64 unsigned codes of two 32-value chunks by
//! their activations (lane `t` of the 16: chunk `t / 8`, values
//! `4 (t % 8)..+4`), one `vpdpwssd` multiplies each lane by its scale and
//! adds it to the block's 16 lanes, and the two chunk parities are added
//! at the end: lane `l` of chunk pair sums = llama.cpp's lane `l`, the
//! same integer. With codes below 64 and activations in -127..=127 a
//! lane's four products stay below 2^15 in magnitude, so `vpdpwssd`, which
//! multiplies the lane's low i16 by the scale in the other operand's low
//! i16 (its high i16 is zero), is exact. The f32 work then runs for two
//! rows per 512-bit register (`Acc4`), each row keeping its own eight
//! lanes and llama.cpp's sequence of FMAs.
//!
//! Four rows stream at once; the next four are prefetched into L2.

// Chunk-pair indices address several arrays with different strides.
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;

/// Q8_K block layout: `d` (f32) at 0, 256 quants at 4, 16 `bsums` at 260.
pub(in crate::qmatmul) const A_BYTES: usize = 292;
pub(in crate::qmatmul) const A_QS: usize = 4;
pub(in crate::qmatmul) const A_BSUMS: usize = 260;

/// The checks every kernel makes: the rows cover the same whole number of
/// blocks. Returns that number.
pub(in crate::qmatmul) fn check(a: &[u8], w: &[&[u8]; 4], w_bytes: usize) -> Option<usize> {
    if !a.len().is_multiple_of(A_BYTES) || w.iter().any(|r| r.len() != a.len() / A_BYTES * w_bytes) {
        return None;
    }
    Some(a.len() / A_BYTES)
}

/// How far ahead the four-row matvecs prefetch at least: the next four
/// rows are too close when rows are short. For 2048-column rows (6.7 KiB
/// for four Q6_K rows) 12, 16 and 24 KiB ahead all stream Q6_K at 0.90-0.96
/// of a plain read from DRAM on the 2-core EPYC, against 0.82 one group
/// ahead (Q5_K 0.88 against 0.70; `examples/gemv_dram.rs`).
const MIN_PREFETCH_AHEAD: usize = 16 << 10;

/// Block `i`'s share of the rows at least four rows (and
/// `MIN_PREFETCH_AHEAD` bytes) ahead into L2 (see
/// `kernels::prefetch_rows_ahead`).
#[inline(always)]
pub(in crate::qmatmul) fn prefetch_next(w0: *const u8, nb: usize, i: usize, w_bytes: usize) {
    let ahead = (4 * nb * w_bytes).max(MIN_PREFETCH_AHEAD);
    crate::qmatmul::kernels::prefetch_rows_ahead(w0, ahead, i, 4 * w_bytes);
}

/// The 32 bytes at `p` in both 256-bit halves.
#[inline(always)]
pub(in crate::qmatmul) unsafe fn bcast256(p: *const u8) -> __m512i {
    // SAFETY: 32 readable bytes at `p` (caller); AVX-512F in the kernel.
    unsafe { _mm512_broadcast_i64x4(_mm256_loadu_si256(p.cast())) }
}

/// The 64 bytes at `p`.
#[inline(always)]
pub(in crate::qmatmul) unsafe fn load64(p: *const u8) -> __m512i {
    // SAFETY: 64 readable bytes at `p` (caller); AVX-512F in the kernel.
    unsafe { _mm512_loadu_si512(p.cast()) }
}

/// The 16 bytes at `p[r] + at` in 128-bit lane `r`.
#[inline(always)]
pub(in crate::qmatmul) unsafe fn load4x16(p: [*const u8; 4], at: usize) -> __m512i {
    // SAFETY: 16 readable bytes at each `p[r] + at` (caller); AVX-512F.
    unsafe {
        let l = |r: usize| _mm_loadu_si128(p[r].add(at).cast());
        let lo = _mm256_inserti128_si256::<1>(_mm256_castsi128_si256(l(0)), l(1));
        let hi = _mm256_inserti128_si256::<1>(_mm256_castsi128_si256(l(2)), l(3));
        _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi)
    }
}

/// `[x_lo + x_hi, y_lo + y_hi]` (256-bit halves): the two chunk parities
/// of two rows' lanes added, row `x` in the low half.
#[inline(always)]
pub(in crate::qmatmul) unsafe fn fold2(x: __m512i, y: __m512i) -> __m512i {
    // SAFETY: AVX-512F in the kernel.
    unsafe {
        let lo = _mm512_shuffle_i64x2::<0b01_00_01_00>(x, y);
        let hi = _mm512_shuffle_i64x2::<0b11_10_11_10>(x, y);
        _mm512_add_epi32(lo, hi)
    }
}

/// The scales of lanes 0..16 of a chunk pair: i16 `idx[2t]` of `sc16` in
/// the low half of lane `t`, zero in the high half.
#[inline(always)]
pub(in crate::qmatmul) unsafe fn lane_scales(idx: __m512i, sc16: __m512i) -> __m512i {
    // SAFETY: AVX-512BW in the kernel.
    unsafe { _mm512_maskz_permutexvar_epi16(0x5555_5555, idx, sc16) }
}

/// `acc + scale * (codes . act)` per lane (see the module comment).
#[inline(always)]
pub(in crate::qmatmul) unsafe fn scaled(
    acc: __m512i,
    init: __m512i,
    codes: __m512i,
    act: __m512i,
    sc: __m512i,
) -> __m512i {
    // SAFETY: AVX-512 VNNI in the kernel.
    unsafe { _mm512_dpwssd_epi32(acc, _mm512_dpbusd_epi32(init, codes, act), sc) }
}

/// Permutation indices for `lane_scales`: lane `t` of chunk pair `j` of
/// the row in half `h` (i16 `16 h ..`) takes scale `16 h + first + t / per`
/// where `first = j * 16 / per` (`per` lanes share a scale: 8 for 32-value
/// groups, 4 for 16-value ones), indexed `[h][j]`.
const fn scale_idx_table(per: usize) -> [[[i16; 32]; 4]; 2] {
    let mut out = [[[0i16; 32]; 4]; 2];
    let mut h = 0;
    while h < 2 {
        let mut j = 0;
        while j < 4 {
            let mut t = 0;
            while t < 16 {
                out[h][j][2 * t] = (16 * h + j * 16 / per + t / per) as i16;
                t += 1;
            }
            j += 1;
        }
        h += 1;
    }
    out
}

static SCALE_IDX8: [[[i16; 32]; 4]; 2] = scale_idx_table(8);
static SCALE_IDX4: [[[i16; 32]; 4]; 2] = scale_idx_table(4);

/// The 64 bytes of `v`.
#[inline(always)]
unsafe fn load_idx(v: &[i16; 32]) -> __m512i {
    // SAFETY: `v` holds 64 bytes; AVX-512F in the kernel.
    unsafe { _mm512_loadu_si512(v.as_ptr().cast()) }
}

/// The `scale_idx_table(per)` vectors (`per` is 8 or 4), loaded once per
/// call (no closures: they would not inherit the kernel's features).
#[inline(always)]
pub(in crate::qmatmul) unsafe fn scale_idxs(per: usize) -> [[__m512i; 4]; 2] {
    let t = if per == 8 { &SCALE_IDX8 } else { &SCALE_IDX4 };
    // SAFETY: AVX-512F in the kernel.
    unsafe {
        [
            [
                load_idx(&t[0][0]),
                load_idx(&t[0][1]),
                load_idx(&t[0][2]),
                load_idx(&t[0][3]),
            ],
            [
                load_idx(&t[1][0]),
                load_idx(&t[1][1]),
                load_idx(&t[1][2]),
                load_idx(&t[1][3]),
            ],
        ]
    }
}

/// The little-endian u16 at `p`, widened.
#[inline(always)]
unsafe fn u16_at(p: *const u8) -> i64 {
    // SAFETY: two readable bytes at `p` (caller).
    unsafe { p.cast::<u16>().read_unaligned() as i64 }
}

/// The f16 at `p[r] + at` of each row, as f32, times `yd`: lane `r`
/// (llama.cpp's `y.d * x.d`; the product of two f32 is commutative).
#[inline(always)]
pub(in crate::qmatmul) unsafe fn d4(p: [*const u8; 4], at: usize, yd: f32) -> __m128 {
    // SAFETY: two readable bytes at each `p[r] + at` (caller); F16C.
    unsafe {
        let h =
            u16_at(p[0].add(at)) | u16_at(p[1].add(at)) << 16 | u16_at(p[2].add(at)) << 32 | u16_at(p[3].add(at)) << 48;
        _mm_mul_ps(_mm_cvtph_ps(_mm_cvtsi64_si128(h)), _mm_set1_ps(yd))
    }
}

/// The f32 at `p`.
#[inline(always)]
pub(in crate::qmatmul) unsafe fn f32_at(p: *const u8) -> f32 {
    // SAFETY: four readable bytes at `p` (caller).
    unsafe { p.cast::<f32>().read_unaligned() }
}

/// Eight f32 lanes per row, rows 0 and 1 in `acc01` (low, high half),
/// 2 and 3 in `acc23`.
pub(in crate::qmatmul) struct Acc4 {
    pub acc01: __m512,
    pub acc23: __m512,
}

impl Acc4 {
    #[inline(always)]
    pub unsafe fn new() -> Self {
        // SAFETY: AVX-512F in the kernel.
        unsafe {
            Acc4 {
                acc01: _mm512_setzero_ps(),
                acc23: _mm512_setzero_ps(),
            }
        }
    }

    /// `acc = fma(d[r], f32(lanes of row r), acc)` for each row.
    #[inline(always)]
    pub unsafe fn fma(&mut self, d: __m128, p01: __m512i, p23: __m512i) {
        // SAFETY: AVX-512F in the kernel.
        unsafe {
            let dz = _mm512_castps128_ps512(d);
            let s01 = _mm512_permutexvar_ps(_mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1), dz);
            let s23 = _mm512_permutexvar_ps(_mm512_setr_epi32(2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3), dz);
            self.acc01 = _mm512_fmadd_ps(s01, _mm512_cvtepi32_ps(p01), self.acc01);
            self.acc23 = _mm512_fmadd_ps(s23, _mm512_cvtepi32_ps(p23), self.acc23);
        }
    }

    /// `acc = fma(-d[r], f32(lanes of row r), acc)` for each row: an FMA
    /// with the negated scale, as `-y.d * x.dmin` is.
    #[inline(always)]
    pub unsafe fn fnma(&mut self, d: __m128, p01: __m512i, p23: __m512i) {
        // SAFETY: AVX-512F in the kernel.
        unsafe {
            let dz = _mm512_castps128_ps512(d);
            let s01 = _mm512_permutexvar_ps(_mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1), dz);
            let s23 = _mm512_permutexvar_ps(_mm512_setr_epi32(2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3), dz);
            self.acc01 = _mm512_fnmadd_ps(s01, _mm512_cvtepi32_ps(p01), self.acc01);
            self.acc23 = _mm512_fnmadd_ps(s23, _mm512_cvtepi32_ps(p23), self.acc23);
        }
    }

    /// llama.cpp's `hsum_float_8` of each row's lanes.
    #[inline(always)]
    pub unsafe fn hsum(&self) -> [f32; 4] {
        let mut l = [0f32; 32];
        // SAFETY: `l` holds 32 f32 values; AVX-512F in the kernel.
        unsafe {
            _mm512_storeu_ps(l.as_mut_ptr(), self.acc01);
            _mm512_storeu_ps(l.as_mut_ptr().add(16), self.acc23);
        }
        std::array::from_fn(|r| {
            let h = &l[8 * r..8 * r + 8];
            super::ggml_k::hsum8(std::array::from_fn(|i| h[i]))
        })
    }
}

/// The four i32 lanes of each 128-bit lane of `v`, summed: lane `r` of
/// the result (exact integers, any order).
#[inline(always)]
pub(in crate::qmatmul) unsafe fn sum_lanes4(v: __m512i) -> __m128i {
    // SAFETY: AVX-512F in the kernel.
    unsafe {
        let v = _mm512_add_epi32(v, _mm512_shuffle_epi32::<0b01_00_11_10>(v));
        let v = _mm512_add_epi32(v, _mm512_shuffle_epi32::<0b10_11_00_01>(v));
        _mm512_castsi512_si128(_mm512_permutexvar_epi32(
            _mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0),
            v,
        ))
    }
}

/// Q4_K/Q5_K scales and mins of four rows (lane `r` holds row `r`'s bytes
/// 0..16: `d`, `dmin` and the 12 packed bytes), unpacked with llama.cpp's
/// `utmp` arithmetic: bytes 0..8 of lane `r` are row `r`'s scales, 8..16
/// its mins.
#[inline(always)]
pub(in crate::qmatmul) unsafe fn k4_scales4(x: __m512i) -> __m512i {
    // SAFETY: AVX-512F in the kernel. Dwords of each lane: [dd, u0, u1, u2].
    unsafe {
        let a = _mm512_shuffle_epi32::<0b11_10_11_01>(x); // [u0, u2, u1, u2]
        let b = _mm512_shuffle_epi32::<0b10_10_01_01>(x); // [u0, u0, u1, u1]
        let lo_shift = _mm512_setr_epi32(0, 0, 0, 4, 0, 0, 0, 4, 0, 0, 0, 4, 0, 0, 0, 4);
        let m6 = 0x3f3f_3f3f;
        let m4 = 0x0f0f_0f0f;
        let lo_mask = _mm512_setr_epi32(m6, m4, m6, m4, m6, m4, m6, m4, m6, m4, m6, m4, m6, m4, m6, m4);
        let t1 = _mm512_and_si512(_mm512_srlv_epi32(a, lo_shift), lo_mask);
        let m2 = 0x0303_0303;
        let hi_mask = _mm512_setr_epi32(0, m2, 0, m2, 0, m2, 0, m2, 0, m2, 0, m2, 0, m2, 0, m2);
        let t2 = _mm512_slli_epi32::<4>(_mm512_and_si512(_mm512_srli_epi32::<6>(b), hi_mask));
        _mm512_or_si512(t1, t2)
    }
}

/// The Q4_K/Q5_K parts shared by both: per row, scales and mins as i16
/// (rows 0, 1 in `sc01`, 2, 3 in `sc23`: i16 0..8 scales, 8..16 mins of
/// each row's 256-bit half), `d` and `dmin` times `y.d`.
struct K4Head {
    sc01: __m512i,
    sc23: __m512i,
    d: __m128,
    dmin: __m128,
}

#[inline(always)]
unsafe fn k4_head(w: [*const u8; 4], yd: f32) -> K4Head {
    // SAFETY: whole blocks at `w` (caller); AVX-512 in the kernel.
    unsafe {
        let x = load4x16(w, 0);
        let sm = k4_scales4(x);
        // Dword 0 of each lane is the row's [d, dmin]: converted together,
        // times y.d, then split into d (low half) and dmin (high half).
        let dd = _mm512_castsi512_si128(_mm512_permutexvar_epi32(
            _mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0),
            x,
        ));
        let f = _mm256_mul_ps(_mm256_cvtph_ps(dd), _mm256_set1_ps(yd));
        let f = _mm256_permutevar8x32_ps(f, _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7));
        K4Head {
            sc01: _mm512_cvtepu8_epi16(_mm512_castsi512_si256(sm)),
            sc23: _mm512_cvtepu8_epi16(_mm512_extracti64x4_epi64::<1>(sm)),
            d: _mm256_castps256_ps128(f),
            dmin: _mm256_extractf128_ps::<1>(f),
        }
    }
}

/// The min products of each row with the activation's group sums `q8s`
/// (i16 x 8): llama.cpp's `_mm_madd_epi16(mins, q8s)`, four i32 per row,
/// row `r` in 128-bit lane `r`.
#[inline(always)]
unsafe fn k4_min_products(h: &K4Head, q8s: __m128i) -> __m512i {
    // SAFETY: AVX-512 in the kernel.
    unsafe {
        // Mins are i16 8..16 of each row's half: the group sums go there,
        // zeros against the scales.
        let q = _mm512_maskz_broadcast_i32x4(0xF0F0, q8s);
        let p01 = _mm512_madd_epi16(h.sc01, q);
        let p23 = _mm512_madd_epi16(h.sc23, q);
        // Lanes 4..8 and 12..16 of each hold rows 0, 1 (2, 3).
        _mm512_permutex2var_epi32(
            p01,
            _mm512_setr_epi32(4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31),
            p23,
        )
    }
}

/// The activation's eight 32-value group sums (`_mm_hadd_epi16` of the
/// 16 `bsums`).
#[inline(always)]
pub(in crate::qmatmul) unsafe fn group_sums(y: *const u8) -> __m128i {
    // SAFETY: a whole Q8_K block at `y` (caller); AVX2 in the kernel.
    unsafe {
        let bs = _mm256_loadu_si256(y.add(A_BSUMS).cast());
        _mm_hadd_epi16(_mm256_castsi256_si128(bs), _mm256_extracti128_si256::<1>(bs))
    }
}

/// Q4_K and Q5_K blocks: d, dmin, 12 scale bytes, (Q5_K: 32 qh bytes),
/// 128 qs bytes.
const Q4K_BYTES: usize = 144;
const Q5K_BYTES: usize = 176;
const Q6K_BYTES: usize = 210;

/// `ggml_vec_dot_q4_K_q8_K` for four weight rows.
///
/// # Safety
/// AVX-512 F/BW/VL/VNNI, AVX2, FMA and F16C must be available
/// (`Isa::Avx512Vnni`).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(in crate::qmatmul) unsafe fn dot_cols_q4k(a: &[u8], w: [&[u8]; 4], out: &mut [f32; 4]) {
    let Some(nb) = check(a, &w, Q4K_BYTES) else {
        *out = [f32::NAN; 4];
        return;
    };
    let m4 = _mm512_set1_epi8(0x0F);
    let shift = _mm512_setr_epi64(0, 0, 0, 0, 4, 4, 4, 4);
    // SAFETY: AVX-512 enabled above.
    let idx = unsafe { scale_idxs(8) };
    let mut acc = unsafe { Acc4::new() };
    let mut acc_m = _mm512_setzero_ps();
    for i in 0..nb {
        // SAFETY (pointer reads): block i < nb of the activation row and
        // of every weight row (`check`).
        unsafe {
            let y = a.as_ptr().add(i * A_BYTES);
            let wb = w.map(|r| r.as_ptr().add(i * Q4K_BYTES));
            prefetch_next(w[0].as_ptr(), nb, i, Q4K_BYTES);
            let h = k4_head(wb, f32_at(y));
            let mut lanes = [_mm512_setzero_si512(); 4];
            for j in 0..4 {
                let act = load64(y.add(A_QS + 64 * j));
                for r in 0..4 {
                    let codes = _mm512_and_si512(_mm512_srlv_epi64(bcast256(wb[r].add(16 + 32 * j)), shift), m4);
                    let sc = lane_scales(idx[r % 2][j], if r < 2 { h.sc01 } else { h.sc23 });
                    lanes[r] = scaled(lanes[r], _mm512_setzero_si512(), codes, act, sc);
                }
            }
            acc.fma(h.d, fold2(lanes[0], lanes[1]), fold2(lanes[2], lanes[3]));
            // acc_m lane 4r + k: fma(-dmin_r, prod_k, acc_m): llama.cpp's
            // `fma(dmin, prod, acc_m)` with `dmin = -y.d * x.dmin`.
            let mins = _mm512_cvtepi32_ps(k4_min_products(&h, group_sums(y)));
            let dmin = _mm512_permutexvar_ps(
                _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3),
                _mm512_castps128_ps512(h.dmin),
            );
            acc_m = _mm512_fnmadd_ps(dmin, mins, acc_m);
        }
    }
    let mut m = [0f32; 16];
    // SAFETY: `m` holds 16 f32 values; AVX-512F enabled above.
    unsafe { _mm512_storeu_ps(m.as_mut_ptr(), acc_m) };
    // SAFETY: AVX-512F enabled above.
    let s = unsafe { acc.hsum() };
    *out = std::array::from_fn(|r| {
        let m = &m[4 * r..4 * r + 4];
        s[r] + ((m[0] + m[2]) + (m[1] + m[3]))
    });
}

/// `ggml_vec_dot_q5_K_q8_K` for four weight rows.
///
/// # Safety
/// As `dot_cols_q4k`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(in crate::qmatmul) unsafe fn dot_cols_q5k(a: &[u8], w: [&[u8]; 4], out: &mut [f32; 4]) {
    let Some(nb) = check(a, &w, Q5K_BYTES) else {
        *out = [f32::NAN; 4];
        return;
    };
    let m4 = _mm512_set1_epi8(0x0F);
    let bit4 = _mm512_set1_epi8(0x10);
    let shift = _mm512_setr_epi64(0, 0, 0, 0, 4, 4, 4, 4);
    // Bit c of each qh byte to bit 4: rotate the 64-bit words left by
    // 4 - c (mod 64; the bit stays in its byte), c = 2j (low half), 2j + 1.
    let rot: [__m512i; 4] = std::array::from_fn(|j| {
        let (r0, r1) = ((4 - 2 * j as i64).rem_euclid(64), (3 - 2 * j as i64).rem_euclid(64));
        _mm512_setr_epi64(r0, r0, r0, r0, r1, r1, r1, r1)
    });
    // SAFETY: AVX-512 enabled above.
    let idx = unsafe { scale_idxs(8) };
    let mut acc = unsafe { Acc4::new() };
    let mut summs = _mm_setzero_ps();
    for i in 0..nb {
        // SAFETY (pointer reads): as in `dot_cols_q4k`.
        unsafe {
            let y = a.as_ptr().add(i * A_BYTES);
            let wb = w.map(|r| r.as_ptr().add(i * Q5K_BYTES));
            prefetch_next(w[0].as_ptr(), nb, i, Q5K_BYTES);
            let h = k4_head(wb, f32_at(y));
            let qh = wb.map(|p| bcast256(p.add(16)));
            let mut lanes = [_mm512_setzero_si512(); 4];
            for j in 0..4 {
                let act = load64(y.add(A_QS + 64 * j));
                for r in 0..4 {
                    let lo = _mm512_and_si512(_mm512_srlv_epi64(bcast256(wb[r].add(48 + 32 * j)), shift), m4);
                    let hi = _mm512_and_si512(_mm512_rolv_epi64(qh[r], rot[j]), bit4);
                    let sc = lane_scales(idx[r % 2][j], if r < 2 { h.sc01 } else { h.sc23 });
                    lanes[r] = scaled(lanes[r], _mm512_setzero_si512(), _mm512_or_si512(lo, hi), act, sc);
                }
            }
            acc.fma(h.d, fold2(lanes[0], lanes[1]), fold2(lanes[2], lanes[3]));
            // llama.cpp sums the four min products as integers and does
            // `summs += dmin * f32(sum)` (contracted to an FMA).
            let m = _mm_cvtepi32_ps(sum_lanes4(k4_min_products(&h, group_sums(y))));
            summs = _mm_fnmadd_ps(h.dmin, m, summs);
        }
    }
    let mut sm = [0f32; 4];
    // SAFETY: `sm` holds four f32 values; AVX-512F enabled above.
    unsafe { _mm_storeu_ps(sm.as_mut_ptr(), summs) };
    // SAFETY: AVX-512F enabled above.
    let s = unsafe { acc.hsum() };
    *out = std::array::from_fn(|r| s[r] + sm[r]);
}

/// `ggml_vec_dot_q6_K_q8_K` for four weight rows.
///
/// # Safety
/// As `dot_cols_q4k`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(in crate::qmatmul) unsafe fn dot_cols_q6k(a: &[u8], w: [&[u8]; 4], out: &mut [f32; 4]) {
    let mut o = [[0f32; 4]; 1];
    // SAFETY: forwarded from the caller.
    unsafe { cols_q6k::<VEC_DOT, 1>([a], w, &mut o) };
    *out = o[0];
}

/// Q6_K for four weight rows against `A` activation rows in llama.cpp's
/// tiled order (`ggml_tiled`, `Order::Tiled`): per super-block, the whole
/// block's integer sum `S` (the same integers as `dot_cols_q6k`, summed
/// over each row's lanes: any order is exact), then `acc = fma(f32(S) *
/// d_w, d_a, acc)`; `out[k][r]` for activation row `k`, weight row `r`.
/// Each weight vector is decoded once for the `A` rows. The tiled path's
/// small batches run this.
///
/// # Safety
/// As `dot_cols_q4k`, for every activation row.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(in crate::qmatmul) unsafe fn tiled_cols_q6k<const A: usize>(a: [&[u8]; A], w: [&[u8]; 4], out: &mut [[f32; 4]; A]) {
    // SAFETY: forwarded from the caller.
    unsafe { cols_q6k::<TILED, A>(a, w, out) }
}

/// As `tiled_cols_q6k`, in llama.cpp's AMX build's order (`amx_order_k`):
/// `acc = fma(f32(S), d_w * d_a, acc)` per super-block.
///
/// # Safety
/// As `dot_cols_q4k`, for every activation row.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(in crate::qmatmul) unsafe fn amx_cols_q6k<const A: usize>(a: [&[u8]; A], w: [&[u8]; 4], out: &mut [[f32; 4]; A]) {
    // SAFETY: forwarded from the caller.
    unsafe { cols_q6k::<AMX, A>(a, w, out) }
}

/// `cols_q6k`'s orders: `vec_dot_q6_K_q8_K`'s lanes, the tiled order's
/// `fma(f32(S) * d_w, d_a, acc)`, the AMX build's `fma(f32(S), d_w * d_a,
/// acc)`.
const VEC_DOT: u8 = 0;
const TILED: u8 = 1;
const AMX: u8 = 2;

/// `dot_cols_q6k` (`VEC_DOT`, one activation row), `tiled_cols_q6k`
/// (`TILED`) and `amx_cols_q6k` (`AMX`).
///
/// # Safety
/// As `dot_cols_q4k`, for every activation row.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn cols_q6k<const ORDER: u8, const A: usize>(a: [&[u8]; A], w: [&[u8]; 4], out: &mut [[f32; 4]; A]) {
    let Some(nb) = a
        .iter()
        .map(|x| check(x, &w, Q6K_BYTES))
        .reduce(|p, q| p.filter(|_| p == q))
        .flatten()
    else {
        *out = [[f32::NAN; 4]; A];
        return;
    };
    let m4 = _mm512_set1_epi8(0x0F);
    let bits45 = _mm512_set1_epi8(0x30);
    // Chunk pair j = (2j, 2j + 1) is chunks k0 = 2 (j % 2), k0 + 1 of half
    // j / 2: their high bits are bits 2k..2k + 2 of each qh byte, rotated
    // to bits 4, 5.
    let rot: [__m512i; 2] = std::array::from_fn(|jm| {
        let k0 = 2 * jm as i64;
        let (r0, r1) = ((4 - 2 * k0).rem_euclid(64), (2 - 2 * k0).rem_euclid(64));
        _mm512_setr_epi64(r0, r0, r0, r0, r1, r1, r1, r1)
    });
    // SAFETY: AVX-512 enabled above.
    let idx = unsafe { scale_idxs(4) };
    let mut acc = unsafe { Acc4::new() };
    let mut tiled = [_mm_setzero_ps(); A];
    for i in 0..nb {
        // SAFETY (pointer reads): as in `dot_cols_q4k`.
        unsafe {
            let ys: [*const u8; A] = std::array::from_fn(|k| a[k].as_ptr().add(i * A_BYTES));
            let wb = w.map(|r| r.as_ptr().add(i * Q6K_BYTES));
            prefetch_next(w[0].as_ptr(), nb, i, Q6K_BYTES);
            // Scales (i8 at 192..208) sign-extended: rows 0, 1 / 2, 3.
            let s8 = load4x16(wb, 192);
            let sc01 = _mm512_cvtepi8_epi16(_mm512_castsi512_si256(s8));
            let sc23 = _mm512_cvtepi8_epi16(_mm512_extracti64x4_epi64::<1>(s8));
            let mut lanes = [[_mm512_setzero_si512(); 4]; A];
            for j in 0..4 {
                let act: [__m512i; A] = std::array::from_fn(|k| load64(ys[k].add(A_QS + 64 * j)));
                for r in 0..4 {
                    let ql = load64(wb[r].add(64 * (j / 2)));
                    let ql = if j % 2 == 0 { ql } else { _mm512_srli_epi16::<4>(ql) };
                    let lo = _mm512_and_si512(ql, m4);
                    let hi = _mm512_and_si512(
                        _mm512_rolv_epi64(bcast256(wb[r].add(128 + 32 * (j / 2))), rot[j % 2]),
                        bits45,
                    );
                    let codes = _mm512_or_si512(lo, hi);
                    let sc = lane_scales(idx[r % 2][j], if r < 2 { sc01 } else { sc23 });
                    for k in 0..A {
                        lanes[k][r] = scaled(lanes[k][r], _mm512_setzero_si512(), codes, act[k], sc);
                    }
                }
            }
            // d4 with a factor of 1.0: the weights' scales alone (exact).
            let dw = if ORDER == VEC_DOT {
                _mm_setzero_ps()
            } else {
                d4(wb, 208, 1.0)
            };
            for k in 0..A {
                let y = ys[k];
                // The `- 32` of every quant, per lane l as llama.cpp takes it:
                // 32 * (bsums[2l] * sc[2l] + bsums[2l + 1] * sc[2l + 1]).
                let bs = bcast256(y.add(A_BSUMS));
                let sub01 = _mm512_slli_epi32::<5>(_mm512_madd_epi16(bs, sc01));
                let sub23 = _mm512_slli_epi32::<5>(_mm512_madd_epi16(bs, sc23));
                let p01 = _mm512_sub_epi32(fold2(lanes[k][0], lanes[k][1]), sub01);
                let p23 = _mm512_sub_epi32(fold2(lanes[k][2], lanes[k][3]), sub23);
                if ORDER != VEC_DOT {
                    // Rows' eight lanes to one sum each: [r0 | r1 | r2 | r3]
                    // by 128-bit lanes, then within them.
                    let z = _mm512_add_epi32(
                        _mm512_shuffle_i64x2::<0b10_00_10_00>(p01, p23),
                        _mm512_shuffle_i64x2::<0b11_01_11_01>(p01, p23),
                    );
                    let s = _mm_cvtepi32_ps(sum_lanes4(z));
                    let da = _mm_set1_ps(f32_at(y));
                    tiled[k] = if ORDER == TILED {
                        _mm_fmadd_ps(_mm_mul_ps(s, dw), da, tiled[k])
                    } else {
                        _mm_fmadd_ps(s, _mm_mul_ps(dw, da), tiled[k])
                    };
                } else {
                    acc.fma(d4(wb, 208, f32_at(y)), p01, p23);
                }
            }
        }
    }
    if ORDER != VEC_DOT {
        for k in 0..A {
            // SAFETY: each output row holds four f32 values; SSE enabled above.
            unsafe { _mm_storeu_ps(out[k].as_mut_ptr(), tiled[k]) };
        }
        return;
    }
    // SAFETY: AVX-512F enabled above.
    out[0] = unsafe { acc.hsum() };
}
