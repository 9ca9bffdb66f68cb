//! llama.cpp's repacked Q4_K and Q2_K gemv order
//! (`ggml_gemv_{q4_K,q2_K}_8x8_q8_K`, see `ggml_repack`) with AVX-512
//! VNNI, for products of fewer than four activation rows (token
//! generation).
//!
//! Each output keeps one f32 accumulator for its products and one for its
//! mins; per super-block `acc = fma(f32(S), d_w * d_a, acc)` and
//! `acc_min = fma(f32(M), dmin_w * d_a, acc_min)`, where `S` is the whole
//! block's scaled integer dot product and `M` its mins times the
//! activation's group sums: exact integers, so any instructions may form
//! them. Eight weight rows go at once (the eight llama.cpp interleaves;
//! `llama_repacks` guarantees rows % 8 == 0), their 16-lane sums are
//! reduced together, and the f32 steps of all eight run in one 256-bit
//! register.
//!
//! Q4_K reads 128 values of a row per step as one 64-byte load: two
//! `vpdpbusd` (low and high nibbles, against activations arranged once per
//! block for all eight rows), one `vpackssdw` of the two (each lane's sum
//! of four products fits an i16) and one `vpdpwssd` with the four groups'
//! scales, picked by an in-lane `vpshufb`: 3 VNNI instructions per 128
//! values instead of 4, and no cross-lane permutes (on the 2-core EPYC,
//! 28 -> 36 GiB/s from cache, TinyLlama Q4_K_M generation +13%). It
//! prefetches the next group of eight rows into L2 as one sequential
//! stream. Q2_K multiplies as `kernels::kquants::cols512` (one `vpdpbusd`
//! and one `vpdpwssd` per 64 values) and prefetches each row a few blocks
//! ahead.

// Chunk-pair indices address several arrays with different strides.
#![allow(clippy::needless_range_loop)]

use super::{OutPtr, QMatRef};
use rayon::prelude::*;
use rustorch_core::quant::blocks::BlockQ8K;

/// Every output in the gemv order, Q4_K or Q2_K weights (the types
/// `llama_repacks`), with AVX-512 VNNI (which the caller checked is
/// available).
#[cfg(target_arch = "x86_64")]
pub(super) fn gemv(w: &QMatRef<'_>, acts: &[&[BlockQ8K]], out: &mut [f32]) {
    use rustorch_core::quant::blocks::blocks_as_bytes;
    let n = w.rows();
    let chunk = chunk_rows(n);
    let acts: Vec<&[u8]> = acts.iter().map(|a| blocks_as_bytes(a)).collect();
    let out_ptr = OutPtr(out.as_mut_ptr());
    (0..n.div_ceil(chunk)).into_par_iter().for_each(|c| {
        let (j0, j1) = (c * chunk, ((c + 1) * chunk).min(n));
        // SAFETY: this task alone writes the outputs of weight rows j0..j1.
        unsafe { gemv_rows::<false>(w, &acts, j0..j1, &out_ptr) };
    });
}

/// `gemv` for Q4_K weights in GGUF's layout on CPUs with AVX2 but not
/// AVX-512 VNNI: one weight row at a time (`simd::gemv_q4k_avx2`), the
/// same order and bits.
#[cfg(target_arch = "x86_64")]
pub(super) fn gemv_q4k_avx2(w: &QMatRef<'_>, acts: &[&[BlockQ8K]], out: &mut [f32]) {
    use rustorch_core::quant::blocks::{cast_blocks, BlockQ4K};
    let n = w.rows();
    let chunk = chunk_rows(n);
    let out_ptr = OutPtr(out.as_mut_ptr());
    (0..n.div_ceil(chunk)).into_par_iter().for_each(|c| {
        for j in c * chunk..((c + 1) * chunk).min(n) {
            let wr: &[BlockQ4K] = cast_blocks(w.row(j)).expect("Q4_K weight rows are whole blocks");
            for (i, a) in acts.iter().enumerate() {
                // SAFETY: the caller checked AVX2 (with FMA and F16C).
                let v = unsafe { simd::gemv_q4k_avx2(wr, a) };
                // SAFETY: this task alone writes the outputs of weight rows
                // c * chunk.. (columns of every output row); see `OutPtr`.
                unsafe { out_ptr.write(i * n + j, v) };
            }
        }
    });
}

/// Weight rows per task of `gemv`: whole groups of eight, a few chunks per
/// thread to balance.
#[cfg(target_arch = "x86_64")]
pub(super) fn chunk_rows(n: usize) -> usize {
    let threads = rayon::current_num_threads().max(1);
    (n / (threads * 4)).clamp(8, 128).next_multiple_of(8)
}

/// `gemv`'s outputs for weight rows `rows` (a start that is a multiple of
/// eight), on this thread; `acts` are Q8_K rows as bytes (no allocation
/// per task: a decode step runs thousands of these). `AMX`: Q4_K in the
/// AMX build's order instead (`amx_order_k`: the products' and the mins'
/// FMAs into one accumulator, `acc = fma(-f32(M), dmin_w * d_a, acc)`).
///
/// # Safety
/// `out` points at `acts.len() x w.rows()` outputs, and no other thread
/// writes those of `rows` meanwhile; AVX-512 VNNI is available, and VBMI
/// too for interleaved weights (`x8_gemv_available`).
#[cfg(target_arch = "x86_64")]
pub(super) unsafe fn gemv_rows<const AMX: bool>(
    w: &QMatRef<'_>,
    acts: &[&[u8]],
    rows: std::ops::Range<usize>,
    out_ptr: &OutPtr,
) {
    use rustorch_core::quant::blocks::{cast_blocks, BlockQ4K};
    use rustorch_core::quant::QType;
    let q2k = w.qtype() == QType::Q2K;
    let n = w.rows();
    let (j0, j1) = (rows.start, rows.end);
    if w.interleaved {
        // Chunks hold whole groups of the interleaved layout.
        // SAFETY: forwarded from the caller.
        unsafe { x8_rows::<AMX>(w, acts, 0, rows, out_ptr) };
        return;
    }
    let mut j = j0;
    while j + 8 <= j1 {
        let rows: [&[u8]; 8] = std::array::from_fn(|k| w.row(j + k));
        for (i, a) in acts.iter().enumerate() {
            let mut r = [0f32; 8];
            // SAFETY: AVX-512 VNNI is available (the caller checked);
            // the kernel checks the row lengths.
            unsafe {
                if q2k {
                    simd::gemv8_q2k(a, rows, &mut r)
                } else {
                    simd::gemv8_q4k::<AMX>(a, rows, &mut r)
                }
            };
            for (k, v) in r.into_iter().enumerate() {
                // SAFETY: this task owns weight rows j0..j1 (columns
                // of every output row); see `OutPtr`.
                unsafe { out_ptr.write(i * n + j + k, v) };
            }
        }
        j += 8;
    }
    // `llama_repacks` holds (the AMX order covers rows % 32 == 0), so
    // rows % 8 == 0 and this is only a fallback for Q4_K.
    for j in j..if q2k || AMX { j } else { j1 } {
        let wr: &[BlockQ4K] = cast_blocks(w.row(j)).expect("Q4_K weight rows are whole blocks");
        for (i, a) in acts.iter().enumerate() {
            let a: &[BlockQ8K] = cast_blocks(a).expect("Q8_K activation rows are whole blocks");
            // SAFETY: AVX-512 VNNI is available (the caller checked).
            let v = unsafe { simd::gemv_q4k_vnni(wr, a) };
            // SAFETY: as above.
            unsafe { out_ptr.write(i * n + j, v) };
        }
    }
}

/// Activation rows up to which `ggml_repack::product` multiplies `x8`
/// Q4_K weights with `gemm_small` rather than the panels.
#[cfg(target_arch = "x86_64")]
pub(super) const SMALL_BATCH_ROWS: usize = 64;

/// A small batch against `x8` Q4_K weights (the caller checked AVX-512
/// VNNI and VBMI): the first `m - m % 4` rows four at a time in the gemm
/// order (`simd::gemm_q4k_x8`), the rest in the gemv order, as llama.cpp
/// splits them. Tasks take whole groups of eight weight rows, read once
/// from memory and then from the caches for every activation row.
#[cfg(target_arch = "x86_64")]
pub(super) fn gemm_small(w: &QMatRef<'_>, acts: &[&[BlockQ8K]], out: &mut [f32]) {
    use rustorch_core::quant::blocks::blocks_as_bytes;
    let (m, n) = (acts.len(), w.rows());
    let chunk = chunk_rows(n);
    let acts: Vec<&[u8]> = acts.iter().map(|a| blocks_as_bytes(a)).collect();
    let out_ptr = OutPtr(out.as_mut_ptr());
    (0..n.div_ceil(chunk)).into_par_iter().for_each(|c| {
        let rows = c * chunk..((c + 1) * chunk).min(n);
        // SAFETY: this task alone writes the outputs of these weight rows;
        // the caller checked AVX-512 VNNI and VBMI.
        unsafe { x8_rows::<false>(w, &acts, m - m % 4, rows, &out_ptr) };
    });
}

/// The outputs of `x8` weight rows `rows` (whole groups of eight) for
/// every activation row (bytes): the first `gemm_rows` (a multiple of
/// four) in the gemm order, four at a time, the rest in the gemv order
/// (`AMX`: the AMX build's order, with `gemm_rows` zero).
///
/// # Safety
/// As `gemv_rows`; AVX-512 VBMI is available too.
#[cfg(target_arch = "x86_64")]
unsafe fn x8_rows<const AMX: bool>(
    w: &QMatRef<'_>,
    acts: &[&[u8]],
    gemm_rows: usize,
    rows: std::ops::Range<usize>,
    out_ptr: &OutPtr,
) {
    let n = w.rows();
    for j in rows.step_by(8) {
        let group = &w.bytes[j * w.row_bytes..(j + 8) * w.row_bytes];
        let write = |i: usize, r: [f32; 8]| {
            for (k, v) in r.into_iter().enumerate() {
                // SAFETY: the caller's task alone writes these weight rows'
                // outputs (columns of every output row); see `OutPtr`.
                unsafe { out_ptr.write(i * n + j + k, v) };
            }
        };
        for i in (0..gemm_rows).step_by(4) {
            let mut r = [[0f32; 8]; 4];
            // SAFETY: AVX-512 VNNI and VBMI are available (the caller's
            // contract); the kernel checks the lengths.
            unsafe { simd::gemm_q4k_x8([acts[i], acts[i + 1], acts[i + 2], acts[i + 3]], group, &mut r) };
            for (k, rk) in r.into_iter().enumerate() {
                write(i + k, rk);
            }
        }
        for (i, a) in acts.iter().enumerate().skip(gemm_rows) {
            let mut r = [0f32; 8];
            // SAFETY: as above.
            unsafe { simd::gemv8_q4k_x8::<AMX>(a, group, &mut r) };
            write(i, r);
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod simd {
    use super::super::kernels::kquants::cols512::{
        bcast256, f32_at, group_sums, k4_scales4, lane_scales, load4x16, load64, scale_idxs, scaled, A_BSUMS, A_BYTES,
        A_QS,
    };
    use super::super::kernels::kquants::cols512b::{two_bit_shifts, two_bits};
    use super::super::kernels::prefetch_rows_ahead;
    use rustorch_core::quant::blocks::{BlockQ4K, BlockQ8K};
    use std::arch::x86_64::*;

    const Q4K_BYTES: usize = 144;
    const PREFETCH_AHEAD: usize = 768;

    /// One super-block's f32 steps for eight outputs: the gemv order's
    /// `acc = fma(S, d, acc)`, `acc_min = fma(M, dmin, acc_min)` (output
    /// `acc - acc_min`), or with `AMX` the AMX build's `acc = fma(S, d,
    /// acc)`, `acc = fma(-M, dmin, acc)` (`acc_min` stays +0, and `x - 0`
    /// is `x`).
    #[inline(always)]
    unsafe fn block_step<const AMX: bool>(
        s: __m256,
        m: __m256,
        d: __m256,
        dmin: __m256,
        acc: &mut __m256,
        acc_min: &mut __m256,
    ) {
        // SAFETY: FMA in the kernels.
        unsafe {
            *acc = _mm256_fmadd_ps(s, d, *acc);
            if AMX {
                *acc = _mm256_fnmadd_ps(m, dmin, *acc);
            } else {
                *acc_min = _mm256_fmadd_ps(m, dmin, *acc_min);
            }
        }
    }

    /// Sum of the 16 i32 lanes of each of `v[0..8]`: lane `r` of the result.
    #[inline(always)]
    unsafe fn sums8(v: [__m512i; 8]) -> __m256i {
        // SAFETY: AVX-512F in the kernel. Integers: any order is exact.
        unsafe {
            let pair =
                |a: __m512i, b: __m512i| _mm512_add_epi32(_mm512_unpacklo_epi32(a, b), _mm512_unpackhi_epi32(a, b));
            // Per 128-bit lane: [a0 + a2, b0 + b2, a1 + a3, b1 + b3].
            let (x01, x23, x45, x67) = (pair(v[0], v[1]), pair(v[2], v[3]), pair(v[4], v[5]), pair(v[6], v[7]));
            let quad =
                |a: __m512i, b: __m512i| _mm512_add_epi32(_mm512_unpacklo_epi64(a, b), _mm512_unpackhi_epi64(a, b));
            // Per 128-bit lane: partial sums of rows [0, 1, 2, 3] / [4, 5, 6, 7].
            let (z0, z1) = (quad(x01, x23), quad(x45, x67));
            let t = _mm512_add_epi32(
                _mm512_shuffle_i64x2::<0b01_00_01_00>(z0, z1),
                _mm512_shuffle_i64x2::<0b11_10_11_10>(z0, z1),
            );
            let u = _mm512_add_epi32(t, _mm512_shuffle_i64x2::<0b10_11_00_01>(t, t));
            _mm512_castsi512_si256(_mm512_shuffle_i64x2::<0b00_00_10_00>(u, u))
        }
    }

    /// The mins products `M` of rows 0..4 (`sc[0]`, `sc[1]`) and 4..8
    /// (`sc[2]`, `sc[3]`): i16 8..16 of each row's 256-bit half are its
    /// mins. Lane `r` of the result is row `r`'s.
    #[inline(always)]
    unsafe fn mins8(sc: &[__m512i; 4], q8s: __m128i) -> __m256i {
        // SAFETY: AVX-512 in the kernel.
        unsafe {
            let q = _mm512_maskz_broadcast_i32x4(0xF0F0, q8s);
            let p: [__m512i; 4] = std::array::from_fn(|k| _mm512_madd_epi16(sc[k], q));
            // Lanes 4..8 and 12..16 of p[k] are rows 2k, 2k + 1: rows 0..4
            // then 4..8, one per 128-bit lane.
            let idx = _mm512_setr_epi32(4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31);
            let lo = _mm512_permutex2var_epi32(p[0], idx, p[1]);
            let hi = _mm512_permutex2var_epi32(p[2], idx, p[3]);
            let v = _mm512_add_epi32(_mm512_unpacklo_epi32(lo, hi), _mm512_unpackhi_epi32(lo, hi));
            let v = _mm512_add_epi32(v, _mm512_shuffle_epi32::<0b01_00_11_10>(v));
            // Lane r holds [r, r + 4, r, r + 4].
            _mm512_castsi512_si256(_mm512_permutexvar_epi32(
                _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 0, 0, 0, 0, 0, 0, 0, 0),
                v,
            ))
        }
    }

    /// `vpshufb` control for values `128 p .. 128 p + 128` over a row's
    /// eight scale bytes repeated in each 128-bit lane, matching
    /// `_mm512_packs_epi32(lo, hi)`: in 128-bit lane `L`, i16 0..4 come from
    /// `lo` (group `4 p`, or `4 p + 2` for `L >= 2`) and i16 4..8 from `hi`
    /// (the next group); each gets its group's scale, zero-extended.
    #[inline(always)]
    fn scale_pick(p: usize) -> __m512i {
        let mut b = [0x80u8 as i8; 64];
        for lane in 0..4 {
            for k in 0..8 {
                b[16 * lane + 2 * k] = (4 * p + 2 * (lane / 2) + k / 4) as i8;
            }
        }
        // SAFETY: 64 bytes; AVX-512F in the kernel.
        unsafe { _mm512_loadu_si512(b.as_ptr().cast()) }
    }

    /// Eight outputs in the gemv order: `out[r]` is weight row `w[r]`
    /// against the activation row `a` (Q8_K bytes); NaN for rows of other
    /// lengths.
    ///
    /// # Safety
    /// AVX-512 F/BW/VL/VNNI, AVX2, FMA and F16C must be available.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    pub(in super::super) unsafe fn gemv8_q4k<const AMX: bool>(a: &[u8], w: [&[u8]; 8], out: &mut [f32; 8]) {
        let nb = a.len() / A_BYTES;
        if !a.len().is_multiple_of(A_BYTES) || w.iter().any(|r| r.len() != nb * Q4K_BYTES) {
            *out = [f32::NAN; 8];
            return;
        }
        let m4 = _mm512_set1_epi8(0x0F);
        let pick: [__m512i; 2] = std::array::from_fn(scale_pick);
        let (mut acc, mut acc_min) = (_mm256_setzero_ps(), _mm256_setzero_ps());
        for i in 0..nb {
            // SAFETY (pointer reads): block i < nb of the activation row
            // and of every weight row (checked above).
            unsafe {
                let y = a.as_ptr().add(i * A_BYTES);
                let wb: [*const u8; 8] = std::array::from_fn(|r| w[r].as_ptr().add(i * Q4K_BYTES));
                // The next group of eight rows into L2 (TinyLlama Q4_K_M
                // generation 14.5 -> 27.4 t/s on the 2-core EPYC against
                // eight per-row prefetches 768 bytes ahead).
                prefetch_rows_ahead(w[0].as_ptr(), 8 * nb * Q4K_BYTES, i, 8 * Q4K_BYTES);
                let half = |h: usize| std::array::from_fn::<_, 4, _>(|k| wb[4 * h + k]);
                let (x0, x1) = (load4x16(half(0), 0), load4x16(half(1), 0));
                let (sm0, sm1) = (k4_scales4(x0), k4_scales4(x1));
                let sc = [
                    _mm512_cvtepu8_epi16(_mm512_castsi512_si256(sm0)),
                    _mm512_cvtepu8_epi16(_mm512_extracti64x4_epi64::<1>(sm0)),
                    _mm512_cvtepu8_epi16(_mm512_castsi512_si256(sm1)),
                    _mm512_cvtepu8_epi16(_mm512_extracti64x4_epi64::<1>(sm1)),
                ];
                // Row r's eight scale bytes in every 128-bit lane: chunk
                // j's lane scales are then one in-lane byte shuffle each.
                let row_scales: [__m512i; 8] = [
                    _mm512_shuffle_i32x4::<0x00>(sm0, sm0),
                    _mm512_shuffle_i32x4::<0x55>(sm0, sm0),
                    _mm512_shuffle_i32x4::<0xAA>(sm0, sm0),
                    _mm512_shuffle_i32x4::<0xFF>(sm0, sm0),
                    _mm512_shuffle_i32x4::<0x00>(sm1, sm1),
                    _mm512_shuffle_i32x4::<0x55>(sm1, sm1),
                    _mm512_shuffle_i32x4::<0xAA>(sm1, sm1),
                    _mm512_shuffle_i32x4::<0xFF>(sm1, sm1),
                ];
                let mut lanes = [_mm512_setzero_si512(); 8];
                for p in 0..2 {
                    // Values 128 p .. 128 p + 128: groups 4 p .. 4 p + 4 of
                    // 32. A row's 64 code bytes hold groups 4 p, 4 p + 2 in
                    // their low nibbles' 256-bit halves and 4 p + 1, 4 p + 3
                    // in their high ones; the activations are arranged to
                    // match once for all eight rows.
                    let (v0, v1) = (load64(y.add(A_QS + 128 * p)), load64(y.add(A_QS + 128 * p + 64)));
                    let act_lo = _mm512_shuffle_i64x2::<0b01_00_01_00>(v0, v1);
                    let act_hi = _mm512_shuffle_i64x2::<0b11_10_11_10>(v0, v1);
                    for r in 0..8 {
                        let x = load64(wb[r].add(16 + 64 * p));
                        let lo = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_and_si512(x, m4), act_lo);
                        let hi = _mm512_dpbusd_epi32(
                            _mm512_setzero_si512(),
                            _mm512_and_si512(_mm512_srli_epi16::<4>(x), m4),
                            act_hi,
                        );
                        // Each lane's sum of four products fits an i16
                        // (|4 * 15 * 128| < 2^15): pack both, then one
                        // vpdpwssd scales and adds them.
                        let packed = _mm512_packs_epi32(lo, hi);
                        lanes[r] = _mm512_dpwssd_epi32(lanes[r], packed, _mm512_shuffle_epi8(row_scales[r], pick[p]));
                    }
                }
                let s = _mm256_cvtepi32_ps(sums8(lanes));
                let m = _mm256_cvtepi32_ps(mins8(&sc, group_sums(y)));
                let yd = _mm256_set1_ps(f32_at(y));
                // Dword 0 of each row's first 16 bytes: [d, dmin] (f16).
                let dd = _mm512_castsi512_si256(_mm512_permutex2var_epi32(
                    x0,
                    _mm512_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28, 0, 0, 0, 0, 0, 0, 0, 0),
                    x1,
                ));
                let d = _mm256_mul_ps(_mm256_cvtph_ps(_mm256_cvtepi32_epi16(dd)), yd);
                let dmin = _mm256_mul_ps(_mm256_cvtph_ps(_mm256_cvtepi32_epi16(_mm256_srli_epi32::<16>(dd))), yd);
                block_step::<AMX>(s, m, d, dmin, &mut acc, &mut acc_min);
            }
        }
        // SAFETY: `out` holds eight f32 values.
        unsafe { _mm256_storeu_ps(out.as_mut_ptr(), _mm256_sub_ps(acc, acc_min)) };
    }

    /// `vpermd` indices picking the activation quads of vector `(k, m)`:
    /// `[2 m] x 8, [2 m + 1] x 8` for the low nibbles (group `2 k`, dwords
    /// 0..8 of the chunk's 64 activation bytes), plus 8 for the high ones.
    const fn act_quads(m: usize, hi: bool) -> [i32; 16] {
        let mut v = [0i32; 16];
        let base = (2 * m + if hi { 8 } else { 0 }) as i32;
        let mut l = 0;
        while l < 16 {
            v[l] = base + (l / 8) as i32;
            l += 1;
        }
        v
    }
    const ACT_QUADS: [[[i32; 16]; 4]; 2] = {
        let mut t = [[[0i32; 16]; 4]; 2];
        let mut m = 0;
        while m < 4 {
            t[0][m] = act_quads(m, false);
            t[1][m] = act_quads(m, true);
            m += 1;
        }
        t
    };

    /// `vpermi2b` indices over `(sm0, sm1)` (`k4_scales4` of rows 0..4 and
    /// 4..8: byte `16 r' + g` is scale `g`, `16 r' + 8 + g` min `g`) that
    /// give dword lane `l` the i16 pair `[v[g0], v[g1]]` of row `l % 8`,
    /// `(g0, g1)` = `groups[l / 8]`, `v` the scales (`mins` false) or mins;
    /// odd bytes are zeroed by the mask.
    const fn pair_idx(groups: [usize; 2], mins: bool) -> [u8; 64] {
        let mut v = [0u8; 64];
        let mut l = 0;
        while l < 16 {
            let r = l % 8;
            let g0 = groups[l / 8];
            let row = if r < 4 { 16 * r } else { 64 + 16 * (r - 4) };
            let at = row + if mins { 8 } else { 0 } + g0;
            v[4 * l] = at as u8;
            v[4 * l + 2] = (at + 1) as u8;
            l += 1;
        }
        v
    }
    /// Scale pairs of chunk `k` (groups `2 k`, `2 k + 1` in both halves).
    const SCALE_PAIRS: [[u8; 64]; 4] = [
        pair_idx([0, 0], false),
        pair_idx([2, 2], false),
        pair_idx([4, 4], false),
        pair_idx([6, 6], false),
    ];
    /// Min pairs: groups (0, 1) | (2, 3) and (4, 5) | (6, 7) in the halves.
    const MIN_PAIRS: [[u8; 64]; 2] = [pair_idx([0, 2], true), pair_idx([4, 6], true)];

    /// `gemv8_q4k` for one group of eight rows in the `x8` layout (see
    /// `super::super::interleave_rows`): the same integer sums `S` and `M` of each super-block
    /// and the same f32 steps, so the same bits. Per 64 values of the eight
    /// rows: four loads, two `vpdpbusd` each, one `vpdpwssd` with the
    /// scales, against `gemv8_q4k`'s per-row lanes that each need a
    /// horizontal sum; and one sequential stream.
    ///
    /// # Safety
    /// AVX-512 F/BW/VL/VNNI/VBMI, AVX2, FMA and F16C must be available.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx2,fma,f16c")]
    pub(in super::super) unsafe fn gemv8_q4k_x8<const AMX: bool>(a: &[u8], group: &[u8], out: &mut [f32; 8]) {
        let nb = a.len() / A_BYTES;
        if !a.len().is_multiple_of(A_BYTES) || group.len() != 8 * nb * Q4K_BYTES {
            *out = [f32::NAN; 8];
            return;
        }
        let load = |p: &[i32; 16]| unsafe { _mm512_loadu_si512(p.as_ptr().cast()) };
        let loadb = |p: &[u8; 64]| unsafe { _mm512_loadu_si512(p.as_ptr().cast()) };
        let act_idx: [[__m512i; 4]; 2] = std::array::from_fn(|h| std::array::from_fn(|m| load(&ACT_QUADS[h][m])));
        let scale_idx: [__m512i; 4] = std::array::from_fn(|k| loadb(&SCALE_PAIRS[k]));
        let min_idx: [__m512i; 2] = std::array::from_fn(|t| loadb(&MIN_PAIRS[t]));
        let gs_idx = [
            _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1),
            _mm512_setr_epi32(2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3),
        ];
        const EVEN_BYTES: u64 = 0x5555_5555_5555_5555;
        const HIGH_WORDS: u32 = 0xAAAA_AAAA;
        let m4 = _mm512_set1_epi8(0x0F);
        let fold = |v: __m512i| _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64::<1>(v));
        let (mut acc, mut acc_min) = (_mm256_setzero_ps(), _mm256_setzero_ps());
        for i in 0..nb {
            // SAFETY (pointer reads): block i < nb of the activation row and
            // of the group (checked above).
            unsafe {
                let y = a.as_ptr().add(i * A_BYTES);
                let g = group.as_ptr().add(i * 8 * Q4K_BYTES);
                prefetch_rows_ahead(group.as_ptr(), X8_PREFETCH_AHEAD, i, 8 * Q4K_BYTES);
                let (x0, x1) = (load64(g), load64(g.add(64)));
                let (sm0, sm1) = (k4_scales4(x0), k4_scales4(x1));
                let mut sums = _mm512_setzero_si512();
                for k in 0..4 {
                    let act = load64(y.add(A_QS + 64 * k));
                    let (mut lo, mut hi) = (_mm512_setzero_si512(), _mm512_setzero_si512());
                    for m in 0..4 {
                        let x = load64(g.add(super::super::X8_HEAD + (4 * k + m) * 64));
                        lo = _mm512_dpbusd_epi32(
                            lo,
                            _mm512_and_si512(x, m4),
                            _mm512_permutexvar_epi32(act_idx[0][m], act),
                        );
                        hi = _mm512_dpbusd_epi32(
                            hi,
                            _mm512_and_si512(_mm512_srli_epi16::<4>(x), m4),
                            _mm512_permutexvar_epi32(act_idx[1][m], act),
                        );
                    }
                    // Each lane sums 16 products, within an i16
                    // (|16 * 15 * 128| < 2^15): [lo, hi] as an i16 pair per
                    // dword, then one vpdpwssd with the pair's scales.
                    let pair = _mm512_mask_blend_epi16(HIGH_WORDS, lo, _mm512_slli_epi32::<16>(hi));
                    let sc = _mm512_maskz_permutex2var_epi8(EVEN_BYTES, sm0, scale_idx[k], sm1);
                    sums = _mm512_dpwssd_epi32(sums, pair, sc);
                }
                let gs = _mm512_castsi128_si512(group_sums(y));
                let mut mins = _mm512_setzero_si512();
                for t in 0..2 {
                    let mp = _mm512_maskz_permutex2var_epi8(EVEN_BYTES, sm0, min_idx[t], sm1);
                    mins = _mm512_dpwssd_epi32(mins, mp, _mm512_permutexvar_epi32(gs_idx[t], gs));
                }
                let s = _mm256_cvtepi32_ps(fold(sums));
                let m = _mm256_cvtepi32_ps(fold(mins));
                let yd = _mm256_set1_ps(f32_at(y));
                // Dword 0 of each row's first 16 bytes: [d, dmin] (f16).
                let dd = _mm512_castsi512_si256(_mm512_permutex2var_epi32(
                    x0,
                    _mm512_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28, 0, 0, 0, 0, 0, 0, 0, 0),
                    x1,
                ));
                let d = _mm256_mul_ps(_mm256_cvtph_ps(_mm256_cvtepi32_epi16(dd)), yd);
                let dmin = _mm256_mul_ps(_mm256_cvtph_ps(_mm256_cvtepi32_epi16(_mm256_srli_epi32::<16>(dd))), yd);
                block_step::<AMX>(s, m, d, dmin, &mut acc, &mut acc_min);
            }
        }
        // SAFETY: `out` holds eight f32 values.
        unsafe { _mm256_storeu_ps(out.as_mut_ptr(), _mm256_sub_ps(acc, acc_min)) };
    }

    /// `R` activation rows against one group of eight weight rows in the
    /// `x8` layout, in llama.cpp's repacked gemm order (`Order::RepackGemm`,
    /// the order of its first `m - m % 4` rows): an f32 step per 64-value
    /// chunk for the products and for the mins, `acc = fma(S_c, d_w * d_a,
    /// acc)` and `acc_min = fma(M_c, dmin_w * d_a, acc_min)`, output `acc -
    /// acc_min`. The integer sums are `gemv8_q4k_x8`'s, per chunk instead of
    /// per block; each 64-byte load of weight codes is split into nibbles
    /// once for the `R` rows. Small batches (a short prompt) run this
    /// instead of the panels, whose unpacking of every weight pays only
    /// over many rows.
    ///
    /// # Safety
    /// As `gemv8_q4k_x8`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx2,fma,f16c")]
    pub(in super::super) unsafe fn gemm_q4k_x8<const R: usize>(a: [&[u8]; R], group: &[u8], out: &mut [[f32; 8]; R]) {
        let len = a.first().map_or(0, |r| r.len());
        let nb = len / A_BYTES;
        if !len.is_multiple_of(A_BYTES) || a.iter().any(|r| r.len() != len) || group.len() != 8 * nb * Q4K_BYTES {
            *out = [[f32::NAN; 8]; R];
            return;
        }
        let load = |p: &[i32; 16]| unsafe { _mm512_loadu_si512(p.as_ptr().cast()) };
        let loadb = |p: &[u8; 64]| unsafe { _mm512_loadu_si512(p.as_ptr().cast()) };
        let act_idx: [[__m512i; 4]; 2] = std::array::from_fn(|h| std::array::from_fn(|m| load(&ACT_QUADS[h][m])));
        let scale_idx: [__m512i; 4] = std::array::from_fn(|k| loadb(&SCALE_PAIRS[k]));
        let min_idx: [__m512i; 2] = std::array::from_fn(|t| loadb(&MIN_PAIRS[t]));
        let gs_idx = [
            _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1),
            _mm512_setr_epi32(2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3),
        ];
        const EVEN_BYTES: u64 = 0x5555_5555_5555_5555;
        const HIGH_WORDS: u32 = 0xAAAA_AAAA;
        let m4 = _mm512_set1_epi8(0x0F);
        let fold = |v: __m512i| _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64::<1>(v));
        let mut acc = [_mm256_setzero_ps(); R];
        let mut acc_min = [_mm256_setzero_ps(); R];
        for i in 0..nb {
            // SAFETY (pointer reads): block i < nb of every activation row
            // and of the group (checked above).
            unsafe {
                let ys: [*const u8; R] = std::array::from_fn(|r| a[r].as_ptr().add(i * A_BYTES));
                let g = group.as_ptr().add(i * 8 * Q4K_BYTES);
                prefetch_rows_ahead(group.as_ptr(), X8_PREFETCH_AHEAD, i, 8 * Q4K_BYTES);
                let (x0, x1) = (load64(g), load64(g.add(64)));
                let (sm0, sm1) = (k4_scales4(x0), k4_scales4(x1));
                // Dword 0 of each row's first 16 bytes: [d, dmin] (f16).
                let dd = _mm512_castsi512_si256(_mm512_permutex2var_epi32(
                    x0,
                    _mm512_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28, 0, 0, 0, 0, 0, 0, 0, 0),
                    x1,
                ));
                let dw = _mm256_cvtph_ps(_mm256_cvtepi32_epi16(dd));
                let dminw = _mm256_cvtph_ps(_mm256_cvtepi32_epi16(_mm256_srli_epi32::<16>(dd)));
                let yd: [__m256; R] = std::array::from_fn(|r| _mm256_set1_ps(f32_at(ys[r])));
                for k in 0..4 {
                    let act: [__m512i; R] = std::array::from_fn(|r| load64(ys[r].add(A_QS + 64 * k)));
                    let mut lo = [_mm512_setzero_si512(); R];
                    let mut hi = [_mm512_setzero_si512(); R];
                    for m in 0..4 {
                        let x = load64(g.add(super::super::X8_HEAD + (4 * k + m) * 64));
                        let (xl, xh) = (_mm512_and_si512(x, m4), _mm512_and_si512(_mm512_srli_epi16::<4>(x), m4));
                        for r in 0..R {
                            lo[r] = _mm512_dpbusd_epi32(lo[r], xl, _mm512_permutexvar_epi32(act_idx[0][m], act[r]));
                            hi[r] = _mm512_dpbusd_epi32(hi[r], xh, _mm512_permutexvar_epi32(act_idx[1][m], act[r]));
                        }
                    }
                    // As in `gemv8_q4k_x8`, per chunk: [lo, hi] as i16 pairs
                    // against the pair of group scales.
                    let sc = _mm512_maskz_permutex2var_epi8(EVEN_BYTES, sm0, scale_idx[k], sm1);
                    for r in 0..R {
                        let pair = _mm512_mask_blend_epi16(HIGH_WORDS, lo[r], _mm512_slli_epi32::<16>(hi[r]));
                        let s = _mm256_cvtepi32_ps(fold(_mm512_dpwssd_epi32(_mm512_setzero_si512(), pair, sc)));
                        acc[r] = _mm256_fmadd_ps(s, _mm256_mul_ps(dw, yd[r]), acc[r]);
                    }
                }
                // The mins: the low half of each product holds chunk 2t, the
                // high half chunk 2t + 1.
                let mp: [__m512i; 2] =
                    std::array::from_fn(|t| _mm512_maskz_permutex2var_epi8(EVEN_BYTES, sm0, min_idx[t], sm1));
                for r in 0..R {
                    let gs = _mm512_castsi128_si512(group_sums(ys[r]));
                    let dmin = _mm256_mul_ps(dminw, yd[r]);
                    for t in 0..2 {
                        let mins =
                            _mm512_dpwssd_epi32(_mm512_setzero_si512(), mp[t], _mm512_permutexvar_epi32(gs_idx[t], gs));
                        let lo = _mm256_cvtepi32_ps(_mm512_castsi512_si256(mins));
                        let hi = _mm256_cvtepi32_ps(_mm512_extracti64x4_epi64::<1>(mins));
                        acc_min[r] = _mm256_fmadd_ps(lo, dmin, acc_min[r]);
                        acc_min[r] = _mm256_fmadd_ps(hi, dmin, acc_min[r]);
                    }
                }
            }
        }
        for r in 0..R {
            // SAFETY: each output row holds eight f32 values.
            unsafe { _mm256_storeu_ps(out[r].as_mut_ptr(), _mm256_sub_ps(acc[r], acc_min[r])) };
        }
    }

    /// How far ahead of the block being read the `x8` matvec prefetches:
    /// sixteen blocks of eight rows, 18 KiB. On the 2-core EPYC with the
    /// weights on huge pages (`gemv_dram Q4_K 2048`), one thread streamed
    /// 17-19 GB/s at four blocks and 26-28 at 8, 16 or 32 (TinyLlama
    /// Q4_K_M generation on one thread 27.6 -> 33.9 t/s); two threads
    /// streamed alike at 8 to 32 (33-34 GB/s at 5632 columns).
    const X8_PREFETCH_AHEAD: usize = 16 * 8 * Q4K_BYTES;

    const Q2K_BYTES: usize = 84;

    /// The sums of each row's eight i32 lanes, `v[k]` holding rows 2k and
    /// 2k + 1 in its 256-bit halves: lane `r` of the result is row `r`'s.
    #[inline(always)]
    unsafe fn sums8_halves(v: [__m512i; 4]) -> __m256i {
        // SAFETY: AVX-512F in the kernel. Integers: any order is exact.
        unsafe {
            let pair =
                |a: __m512i, b: __m512i| _mm512_add_epi32(_mm512_unpacklo_epi32(a, b), _mm512_unpackhi_epi32(a, b));
            let quad =
                |a: __m512i, b: __m512i| _mm512_add_epi32(_mm512_unpacklo_epi64(a, b), _mm512_unpackhi_epi64(a, b));
            // Per 128-bit lane: partials of [v0, v1, v2, v3]; lanes 0, 1
            // are the even rows 0, 2, 4, 6, lanes 2, 3 the odd ones.
            let z = quad(pair(v[0], v[1]), pair(v[2], v[3]));
            let t = _mm512_add_epi32(z, _mm512_shuffle_i64x2::<0b10_11_00_01>(z, z));
            _mm512_castsi512_si256(_mm512_permutexvar_epi32(
                _mm512_setr_epi32(0, 8, 1, 9, 2, 10, 3, 11, 0, 0, 0, 0, 0, 0, 0, 0),
                t,
            ))
        }
    }

    /// `gemv8_q4k` for Q2_K: the scales and mins of its 16-value groups.
    ///
    /// # Safety
    /// As `gemv8_q4k`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    pub(in super::super) unsafe fn gemv8_q2k(a: &[u8], w: [&[u8]; 8], out: &mut [f32; 8]) {
        let nb = a.len() / A_BYTES;
        if !a.len().is_multiple_of(A_BYTES) || w.iter().any(|r| r.len() != nb * Q2K_BYTES) {
            *out = [f32::NAN; 8];
            return;
        }
        let m4 = _mm512_set1_epi8(0x0F);
        // SAFETY: AVX-512 enabled above.
        let (idx, shift) = unsafe { (scale_idxs(4), two_bit_shifts()) };
        let (mut acc, mut acc_min) = (_mm256_setzero_ps(), _mm256_setzero_ps());
        for i in 0..nb {
            // SAFETY (pointer reads): block i < nb of the activation row
            // and of every weight row (checked above).
            unsafe {
                let y = a.as_ptr().add(i * A_BYTES);
                let wb: [*const u8; 8] = std::array::from_fn(|r| w[r].as_ptr().add(i * Q2K_BYTES));
                for p in wb {
                    for off in [0, 64] {
                        // A prefetch never faults (wrapping address).
                        _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(PREFETCH_AHEAD + off).cast());
                    }
                }
                let half = |h: usize| std::array::from_fn::<_, 4, _>(|k| wb[4 * h + k]);
                let packed = [load4x16(half(0), 0), load4x16(half(1), 0)];
                // Rows 2k, 2k + 1 in sc[k] / mn[k] (i16, one row per half).
                let widen = |v: __m512i, k: usize| {
                    let h = if k.is_multiple_of(2) {
                        _mm512_castsi512_si256(v)
                    } else {
                        _mm512_extracti64x4_epi64::<1>(v)
                    };
                    _mm512_cvtepu8_epi16(h)
                };
                let sc: [__m512i; 4] = std::array::from_fn(|k| widen(_mm512_and_si512(packed[k / 2], m4), k));
                let mn: [__m512i; 4] =
                    std::array::from_fn(|k| widen(_mm512_and_si512(_mm512_srli_epi16::<4>(packed[k / 2]), m4), k));
                let mut lanes = [_mm512_setzero_si512(); 8];
                for j in 0..4 {
                    let act = load64(y.add(A_QS + 64 * j));
                    for r in 0..8 {
                        let codes = two_bits(wb[r].add(16), j, &shift);
                        lanes[r] = scaled(
                            lanes[r],
                            _mm512_setzero_si512(),
                            codes,
                            act,
                            lane_scales(idx[r % 2][j], sc[r / 2]),
                        );
                    }
                }
                let bs = bcast256(y.add(A_BSUMS));
                let s = _mm256_cvtepi32_ps(sums8(lanes));
                let m = _mm256_cvtepi32_ps(sums8_halves(mn.map(|v| _mm512_madd_epi16(bs, v))));
                // d, dmin: bytes 80..84 of each row.
                let dd: [i32; 8] = std::array::from_fn(|r| wb[r].add(80).cast::<i32>().read_unaligned());
                let dd = _mm256_loadu_si256(dd.as_ptr().cast());
                let yd = _mm256_set1_ps(f32_at(y));
                let d = _mm256_mul_ps(_mm256_cvtph_ps(_mm256_cvtepi32_epi16(dd)), yd);
                let dmin = _mm256_mul_ps(_mm256_cvtph_ps(_mm256_cvtepi32_epi16(_mm256_srli_epi32::<16>(dd))), yd);
                acc = _mm256_fmadd_ps(s, d, acc);
                acc_min = _mm256_fmadd_ps(m, dmin, acc_min);
            }
        }
        // SAFETY: `out` holds eight f32 values.
        unsafe { _mm256_storeu_ps(out.as_mut_ptr(), _mm256_sub_ps(acc, acc_min)) };
    }

    /// One output in the gemv order (rows beyond the groups of eight):
    /// per super-block, the scaled integer sums straight from the block's
    /// bytes (`vpdpbusd` on the 64 codes of each pair of groups,
    /// `vpdpwssd` with their scales, as in `ggml_superblock`).
    ///
    /// # Safety
    /// AVX-512 F/BW/VL/VNNI, AVX2 and FMA must be available.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    pub(in super::super) unsafe fn gemv_q4k_vnni(w: &[BlockQ4K], a: &[BlockQ8K]) -> f32 {
        use rustorch_core::quant::blocks::{f16_to_f32, scale_min_k4};
        let m4 = _mm256_set1_epi8(0xF);
        let (mut acc, mut acc_min) = (0f32, 0f32);
        for (x, y) in w.iter().zip(a) {
            let mut sc = [0i32; 8];
            let mut mp = 0i32;
            for (g, s) in sc.iter_mut().enumerate() {
                let (scale, min) = scale_min_k4(g, &x.scales);
                *s = scale as i32;
                mp += min as i32 * (y.bsum(2 * g) as i32 + y.bsum(2 * g + 1) as i32);
            }
            let mut total = _mm512_setzero_si512();
            for c in 0..4 {
                // SAFETY: 32 of the 128 quant bytes, 64 of the 256 activations.
                let (v, act) = unsafe {
                    (
                        _mm256_loadu_si256(x.qs.as_ptr().add(32 * c).cast()),
                        _mm512_loadu_si512(y.qs.as_ptr().add(64 * c).cast()),
                    )
                };
                let lo = _mm256_and_si256(v, m4);
                let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(v), m4);
                let codes = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi);
                let p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), codes, act);
                // Scales (below 64) in the low i16 of each lane: see
                // `ggml_superblock`; lanes 0..8 are group 2c, 8..16 group 2c + 1.
                let s = _mm512_mask_blend_epi32(0xFF00, _mm512_set1_epi32(sc[2 * c]), _mm512_set1_epi32(sc[2 * c + 1]));
                total = _mm512_dpwssd_epi32(total, p, s);
            }
            let s = _mm512_reduce_add_epi32(total);
            let d = f16_to_f32(x.d) * y.scale();
            let dmin = f16_to_f32(x.dmin) * y.scale();
            acc = (s as f32).mul_add(d, acc);
            acc_min = (mp as f32).mul_add(dmin, acc_min);
        }
        acc - acc_min
    }

    /// `gemv_q4k_vnni` with AVX2: `vpmaddubsw` (codes below 16 times
    /// activations: pairs fit an i16) and `vpmaddwd` with the group's scale;
    /// the integers are exact, so the bits are the same.
    ///
    /// # Safety
    /// AVX2, FMA and F16C must be available.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(in super::super) unsafe fn gemv_q4k_avx2(w: &[BlockQ4K], a: &[BlockQ8K]) -> f32 {
        use super::super::kernels::kquants::k4_scales_mins;
        use rustorch_core::quant::blocks::f16_to_f32;
        let m4 = _mm256_set1_epi8(0xF);
        let (mut acc, mut acc_min) = (0f32, 0f32);
        for (x, y) in w.iter().zip(a) {
            // The eight scales (bytes 0..8) and mins (8..16).
            let sc = k4_scales_mins(&x.scales);
            // sum over groups of mins[g] * (the activation's group sum).
            // SAFETY: `bsums` is 32 bytes; `sc[8..16]` 8 bytes.
            let mp = unsafe {
                let bs_lo = _mm_loadu_si128(y.bsums.as_ptr().cast());
                let bs_hi = _mm_loadu_si128(y.bsums.as_ptr().add(8).cast());
                let groups = _mm_hadd_epi16(bs_lo, bs_hi);
                let mins = _mm_cvtepu8_epi16(_mm_loadl_epi64(sc.as_ptr().add(8).cast()));
                hsum_i32x4(_mm_madd_epi16(mins, groups))
            };
            let mut total = _mm256_setzero_si256();
            for c in 0..4 {
                // SAFETY: 32 of the 128 quant bytes, 64 of the 256 activations.
                let (v, a_lo, a_hi) = unsafe {
                    (
                        _mm256_loadu_si256(x.qs.as_ptr().add(32 * c).cast()),
                        _mm256_loadu_si256(y.qs.as_ptr().add(64 * c).cast()),
                        _mm256_loadu_si256(y.qs.as_ptr().add(64 * c + 32).cast()),
                    )
                };
                // Low nibbles: group 2c; high nibbles: group 2c + 1.
                let lo = _mm256_and_si256(v, m4);
                let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(v), m4);
                let p_lo = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, a_lo), _mm256_set1_epi16(sc[2 * c] as i16));
                let p_hi = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, a_hi), _mm256_set1_epi16(sc[2 * c + 1] as i16));
                total = _mm256_add_epi32(total, _mm256_add_epi32(p_lo, p_hi));
            }
            let s = hsum_i32x4(_mm_add_epi32(
                _mm256_castsi256_si128(total),
                _mm256_extracti128_si256::<1>(total),
            ));
            let d = f16_to_f32(x.d) * y.scale();
            let dmin = f16_to_f32(x.dmin) * y.scale();
            acc = (s as f32).mul_add(d, acc);
            acc_min = (mp as f32).mul_add(dmin, acc_min);
        }
        acc - acc_min
    }

    /// The sum of four i32 lanes (exact: any order).
    #[target_feature(enable = "avx2")]
    #[inline]
    fn hsum_i32x4(t: __m128i) -> i32 {
        let t = _mm_add_epi32(t, _mm_shuffle_epi32::<0b01_00_11_10>(t));
        let t = _mm_add_epi32(t, _mm_shuffle_epi32::<0b10_11_00_01>(t));
        _mm_cvtsi128_si32(t)
    }
}

#[cfg(test)]
mod tests {
    use crate::qmatmul::{qmatmul_isa, Isa, QMatRef};
    use rustorch_core::quant::{QTensor, QType};

    /// Deterministic values in [-1, 1).
    fn values(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed | 1;
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                (s >> 40) as f32 / (1u64 << 23) as f32 - 1.0
            })
            .collect()
    }

    /// The AVX-512 and AVX2 gemvs equal the portable repacked gemv order
    /// (`ggml_superblock`, which tests/ggml_matmul.rs checks against
    /// llama.cpp) bit for bit, on quantized rows and on random bytes with
    /// extreme codes and scales, for 1..4 activation rows.
    #[test]
    fn gemv_equals_the_portable_order_bit_for_bit() {
        if Isa::Avx512Vnni.is_available() {
            check(QType::Q4K, 0, 2, Isa::Avx512Vnni);
            check(QType::Q2K, 80, 82, Isa::Avx512Vnni);
        }
        if Isa::Avx2.is_available() {
            check(QType::Q4K, 0, 2, Isa::Avx2);
        }
    }

    /// `d` and `dmin` at byte offsets `d_at`, `dmin_at` of a block; the
    /// product at `isa` against the portable one.
    fn check(qtype: QType, d_at: usize, dmin_at: usize, isa: Isa) {
        let (rows, cols) = (24, 768);
        let mut bytes = QTensor::quantize(qtype, [rows, cols], &values(rows * cols, 3))
            .expect("quantize")
            .bytes()
            .to_vec();
        // Rows 8..16: random bytes; 16..24: all-ones bytes; finite f16
        // d and dmin from small to f16's largest.
        let size = qtype.type_size();
        let mut s = 99u64;
        for (b, blk) in bytes.chunks_exact_mut(size).enumerate() {
            let row = b / (cols / 256);
            if row >= 8 {
                for v in blk.iter_mut() {
                    s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                    *v = if row >= 16 { 0xFF } else { (s >> 33) as u8 };
                }
                let d = [0.001f32, 1.0, 65504.0][b % 3];
                blk[d_at..d_at + 2].copy_from_slice(&rustorch_core::quant::blocks::f32_to_f16(d));
                blk[dmin_at..dmin_at + 2].copy_from_slice(&rustorch_core::quant::blocks::f32_to_f16(-d / 2.0));
            }
        }
        let w = QMatRef::new(qtype, rows, cols, &bytes).expect("whole rows");
        assert!(w.repacked());
        for m in 1..4 {
            let mut x = values(m * cols, 7 + m as u64);
            // One row of +-extremes (activation quants at +-127).
            for v in x[..cols].iter_mut() {
                *v = if *v < 0.0 { -1.0 } else { 1.0 };
            }
            let want = qmatmul_isa(Isa::Scalar, &w, &x).expect("product");
            let got = qmatmul_isa(isa, &w, &x).expect("product");
            for (k, (g, e)) in got.iter().zip(&want).enumerate() {
                assert!(
                    g.to_bits() == e.to_bits() || (g.is_nan() && e.is_nan()),
                    "{qtype} {isa:?} m={m} output {k}: {g} vs portable {e}"
                );
            }
        }
    }
}
