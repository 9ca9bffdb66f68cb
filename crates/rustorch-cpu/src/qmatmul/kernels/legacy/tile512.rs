//! The batched (m >= 2) products of Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 and
//! IQ4_NL weights: four weight rows against four (`dot_tile`) or eight
//! (`dot_tile8`) activation rows per call, in llama.cpp's exact order (see
//! `ggml_exact`).
//!
//! As in `exact512`, a 512-bit accumulator holds the eight f32 lanes of
//! two outputs: here one weight row against two activation rows, so each
//! weight block is decoded once into both halves of a register and meets
//! two (or four) pairs of activation blocks. Eight (sixteen) accumulators
//! give independent FMA chains; every output's own per-lane f32 sequence
//! is the scalar kernel's, so the bits are the same. Eight activation rows
//! halve the weight decoding per product.
//!
//! The activation rows come packed in pairs (`ActPair`, made once per
//! product by `pack_pair`): both rows' quants in one 64-byte load, the
//! offset correction `-OFF * sum(a)` per lane, and each row's scale in f32
//! over its half. That takes work out of the inner loop that every weight
//! quad would repeat: the correction's `vpdpbusd` (the multiply pipes are
//! the bottleneck), the cross-lane inserts, and the f16 scale conversions.
//! The 16 scales `d_w * d_a` of a block pair come from one multiply of the
//! pair's scales by the four weight scales repeated in each 128-bit lane,
//! and each output pair's scale from an in-lane shuffle (`lane_scale`).
//! On the 2-core Zen 4: 18.8 -> 14.2 ns per block of a four-by-eight tile
//! (a time test on rows in cache), bits unchanged.

use super::exact512::Unsigned;
use super::{ActPair, Layout, WIq4Nl, W4_0, W4_1, W5_0, W5_1, W8_0};
use rustorch_core::quant::blocks::f16_to_f32;
use std::arch::x86_64::*;

/// A weight block decoded to unsigned `q + OFF` in both 256-bit halves.
pub(super) trait Broadcast: Unsigned {
    /// # Safety
    /// AVX-512 F/BW must be available; `w` must point at a whole block.
    unsafe fn both(w: *const u8) -> __m512i;
}

/// The nibbles of the 16 bytes at `q` in element order, in both halves.
#[inline(always)]
unsafe fn nib_both(q: *const u8) -> __m512i {
    // SAFETY: 16 readable bytes at `q` (caller); AVX-512F in the kernel.
    // The bytes fill all four 128-bit lanes; lanes 1 and 3 shifted right
    // by 4 hold the high nibbles (elements 16..32 of each half).
    unsafe {
        let x = _mm512_broadcast_i32x4(_mm_loadu_si128(q.cast()));
        let shift = _mm512_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4, 0, 0, 0, 0, 4, 4, 4, 4);
        _mm512_and_si512(_mm512_srlv_epi32(x, shift), _mm512_set1_epi8(0x0F))
    }
}

/// `u` plus 16 in the bytes whose bit is set in the u32 at `qh`, in both
/// halves.
#[inline(always)]
unsafe fn fifth_both(u: __m512i, qh: *const u8) -> __m512i {
    // SAFETY: four readable bytes at `qh` (caller); AVX-512BW in the kernel.
    unsafe {
        let h = qh.cast::<u32>().read_unaligned() as u64;
        _mm512_mask_add_epi8(u, h | h << 32, u, _mm512_set1_epi8(16))
    }
}

impl Broadcast for W4_0 {
    #[inline(always)]
    unsafe fn both(w: *const u8) -> __m512i {
        // SAFETY: a whole block at `w` (caller): qs at 2..18.
        unsafe { nib_both(w.add(2)) }
    }
}

impl Broadcast for WIq4Nl {
    #[inline(always)]
    unsafe fn both(w: *const u8) -> __m512i {
        // SAFETY: a whole block at `w` (caller): qs at 2..18; levels + 128.
        unsafe { _mm512_shuffle_epi8(super::exact512::iq4nl_table(), nib_both(w.add(2))) }
    }
}

impl Broadcast for W4_1 {
    #[inline(always)]
    unsafe fn both(w: *const u8) -> __m512i {
        // SAFETY: a whole block at `w` (caller): qs at 4..20.
        unsafe { nib_both(w.add(4)) }
    }
}

impl Broadcast for W5_0 {
    #[inline(always)]
    unsafe fn both(w: *const u8) -> __m512i {
        // SAFETY: a whole block at `w` (caller): qh at 2..6, qs at 6..22.
        unsafe { fifth_both(nib_both(w.add(6)), w.add(2)) }
    }
}

impl Broadcast for W5_1 {
    #[inline(always)]
    unsafe fn both(w: *const u8) -> __m512i {
        // SAFETY: a whole block at `w` (caller): qh at 4..8, qs at 8..24.
        unsafe { fifth_both(nib_both(w.add(8)), w.add(4)) }
    }
}

impl Broadcast for W8_0 {
    #[inline(always)]
    unsafe fn both(w: *const u8) -> __m512i {
        // SAFETY: a whole block at `w` (caller): qs at 2..34; XOR 0x80
        // makes the signed bytes `q + 128`.
        unsafe {
            let x = _mm512_broadcast_i64x4(_mm256_loadu_si256(w.add(2).cast()));
            _mm512_xor_si512(x, _mm512_set1_epi8(i8::MIN))
        }
    }
}

/// The 16-bit word at byte `at` of four blocks, packed.
#[inline(always)]
unsafe fn pack4(p: [*const u8; 4], at: usize) -> i64 {
    // SAFETY: two readable bytes at `p[k] + at` (caller).
    let h = |k: usize| unsafe { p[k].add(at).cast::<u16>().read_unaligned() as u64 };
    (h(0) | h(1) << 16 | h(2) << 32 | h(3) << 48) as i64
}

/// Lane `4 r + i`: `f32(word r of w) op f32(word i of a)` operands: the
/// weight value repeated over i and the activation value over r.
#[inline(always)]
unsafe fn grid(w: i64, a: i64) -> (__m512, __m512) {
    // SAFETY: AVX-512F and F16C in the kernel.
    unsafe {
        let f = _mm512_castps256_ps512(_mm256_cvtph_ps(_mm_set_epi64x(a, w)));
        let rep = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
        let tile = _mm512_setr_epi32(4, 5, 6, 7, 4, 5, 6, 7, 4, 5, 6, 7, 4, 5, 6, 7);
        (_mm512_permutexvar_ps(rep, f), _mm512_permutexvar_ps(tile, f))
    }
}

/// Element `r` of every 128-bit lane of `d`, across that lane: the scale
/// of weight row `r` from a vector that holds the four weight rows' scales
/// (times an activation scale) in each lane. An in-lane shuffle; the
/// cross-lane `vpermps` that picked the scales from one 4 x 4 grid took a
/// quarter of this kernel's time on Zen 4.
#[inline(always)]
unsafe fn lane_scale(d: __m512, r: usize) -> __m512 {
    // SAFETY: AVX-512F in the kernel.
    unsafe {
        match r {
            0 => _mm512_permute_ps::<0x00>(d),
            1 => _mm512_permute_ps::<0x55>(d),
            2 => _mm512_permute_ps::<0xAA>(d),
            _ => _mm512_permute_ps::<0xFF>(d),
        }
    }
}

/// Checks the rows: all weight rows as long as `w[0]`, all activation
/// rows matching it, every pair `nb` blocks long. Returns `nb`.
#[inline(always)]
fn tile_blocks<T: Layout>(w: &[&[u8]; 4], a: &[&[u8]], pairs: &[&[ActPair]]) -> Option<usize> {
    let nb = super::blocks::<T>(w[0], a.first()?)?;
    (w[1..].iter().all(|r| r.len() == w[0].len())
        && a[1..].iter().all(|r| r.len() == a[0].len())
        && pairs.iter().all(|p| p.len() == nb))
    .then_some(nb)
}

/// Packs activation rows `r0` and `r1` (`T`'s activation type, the same
/// length) for the tiles, one `ActPair` per block into `out` (as many as
/// the rows have blocks; fewer leaves the tail of the rows out, more
/// leaves the rest of `out` alone).
///
/// # Safety
/// As `dot_tile`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn pack_pair<T: Broadcast>(r0: &[u8], r1: &[u8], out: &mut [ActPair]) {
    let nb = (r0.len().min(r1.len()) / T::A_BYTES).min(out.len());
    let zero = _mm512_setzero_si512();
    for (b, pair) in out[..nb].iter_mut().enumerate() {
        let (x, y) = (&r0[b * T::A_BYTES..][..T::A_BYTES], &r1[b * T::A_BYTES..][..T::A_BYTES]);
        // SAFETY: `x` and `y` are whole blocks, the quants at A_QS..A_QS +
        // 32; `pair` is 64-byte aligned (`ActPair`); AVX-512 in this kernel.
        unsafe {
            let q = _mm512_inserti64x4::<1>(
                _mm512_castsi256_si512(_mm256_loadu_si256(x.as_ptr().add(T::A_QS).cast())),
                _mm256_loadu_si256(y.as_ptr().add(T::A_QS).cast()),
            );
            _mm512_store_si512(pair.qs.as_mut_ptr().cast(), q);
            // -OFF * sum(a) per lane, so that u = q + OFF gives q . a.
            let neg = if T::OFF == 0 {
                zero
            } else {
                _mm512_sub_epi32(zero, _mm512_dpbusd_epi32(zero, _mm512_set1_epi8(T::OFF as i8), q))
            };
            _mm512_store_si512(pair.neg_corr.as_mut_ptr().cast(), neg);
            let d = _mm512_mask_blend_ps(
                0xFF00,
                _mm512_set1_ps(f16_to_f32([x[0], x[1]])),
                _mm512_set1_ps(f16_to_f32([y[0], y[1]])),
            );
            _mm512_store_ps(pair.d.as_mut_ptr(), d);
        }
    }
}

/// `out[r][i]` = the dot product of weight row `w[r]` with activation row
/// `a[i]`, equal bit for bit to `ggml_exact::dot_scalar` on that pair;
/// `pairs[k]` holds rows `a[2k]` and `a[2k + 1]` (`pack_pair`).
///
/// # Safety
/// AVX-512 F/BW/VL/VNNI, AVX2, FMA and F16C must be available
/// (`Isa::Avx512Vnni`).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn dot_tile<T: Broadcast>(
    w: [&[u8]; 4],
    a: [&[u8]; 4],
    pairs: [&[ActPair]; 2],
    out: &mut [[f32; 4]; 4],
) {
    let mut o = [[0f32; 8]; 4];
    // SAFETY: forwarded; four activation rows, one group.
    unsafe { tile::<T, 1>(w, &a, &pairs, &mut o) };
    for (dst, src) in out.iter_mut().zip(o) {
        dst.copy_from_slice(&src[..4]);
    }
}

/// `dot_tile` for eight activation rows: each weight block is decoded once
/// for twice as many products (Gemma 3's Q5_0 projections: the decode is a
/// third of the four-row tile's instructions).
///
/// # Safety
/// As `dot_tile`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn dot_tile8<T: Broadcast>(
    w: [&[u8]; 4],
    a: [&[u8]; 8],
    pairs: [&[ActPair]; 4],
    out: &mut [[f32; 8]; 4],
) {
    // SAFETY: forwarded; eight activation rows, two groups.
    unsafe { tile::<T, 2>(w, &a, &pairs, out) }
}

/// Four weight rows against `4 G` activation rows (`a.len()`, packed in
/// `2 G` pairs), into `out[r][..4 G]`.
///
/// # Safety
/// As `dot_tile`; `a.len() == 4 * G`, `pairs.len() == 2 * G`, `G <= 2`.
#[allow(clippy::needless_range_loop)]
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn tile<T: Broadcast, const G: usize>(
    w: [&[u8]; 4],
    a: &[&[u8]],
    pairs: &[&[ActPair]],
    out: &mut [[f32; 8]; 4],
) {
    debug_assert!(a.len() == 4 * G && pairs.len() == 2 * G && G <= 2);
    let Some(nb) = tile_blocks::<T>(&w, a, pairs) else {
        *out = [[f32::NAN; 8]; 4];
        return;
    };
    // Plain loops over small arrays throughout: closures (`array::map`)
    // are not always inlined into a `target_feature` function, and a call
    // per block costs several times the block's work.
    let wp: [*const u8; 4] = [w[0].as_ptr(), w[1].as_ptr(), w[2].as_ptr(), w[3].as_ptr()];
    let mut ap = [[std::ptr::null::<u8>(); 4]; G];
    let mut pp = [[std::ptr::null::<ActPair>(); 2]; G];
    for g in 0..G {
        for i in 0..4 {
            ap[g][i] = a[4 * g + i].as_ptr();
        }
        for h in 0..2 {
            pp[g][h] = pairs[2 * g + h].as_ptr();
        }
    }
    // acc[r][g][h]: weight row r against activation rows 4g + 2h (low
    // half) and 4g + 2h + 1 (high half).
    let mut acc = [[[_mm512_setzero_ps(); 2]; G]; 4];
    let mut summs = [_mm512_setzero_ps(); G];
    for b in 0..nb {
        // SAFETY (pointer reads): block b < nb of every weight row,
        // activation row and pair (`tile_blocks`).
        unsafe {
            let mut wb = [std::ptr::null::<u8>(); 4];
            for r in 0..4 {
                wb[r] = wp[r].add(b * T::W_BYTES);
            }
            // The four weight scales in every 128-bit lane.
            let dw = _mm512_broadcast_f32x4(_mm_cvtph_ps(_mm_set_epi64x(0, pack4(wb, 0))));
            let mut av = [[_mm512_setzero_si512(); 2]; G];
            let mut nc = [[_mm512_setzero_si512(); 2]; G];
            // d[g][h]: `d_w[r] * d_a` with r the position in each 128-bit
            // lane, row 4g + 2h in the low half and 4g + 2h + 1 in the high.
            let mut d = [[_mm512_setzero_ps(); 2]; G];
            for g in 0..G {
                for h in 0..2 {
                    let pair = &*pp[g][h].add(b);
                    av[g][h] = _mm512_load_si512(pair.qs.as_ptr().cast());
                    nc[g][h] = _mm512_load_si512(pair.neg_corr.as_ptr().cast());
                    d[g][h] = _mm512_mul_ps(dw, _mm512_load_ps(pair.d.as_ptr()));
                }
            }
            for r in 0..4 {
                let u = T::both(wb[r]);
                for g in 0..G {
                    for h in 0..2 {
                        let p = _mm512_dpbusd_epi32(nc[g][h], u, av[g][h]);
                        let s = lane_scale(d[g][h], r);
                        acc[r][g][h] = _mm512_fmadd_ps(s, _mm512_cvtepi32_ps(p), acc[r][g][h]);
                    }
                }
            }
            if T::MIN {
                let mw = pack4(wb, 2);
                for g in 0..G {
                    let mut ab = [std::ptr::null::<u8>(); 4];
                    for i in 0..4 {
                        ab[i] = ap[g][i].add(b * T::A_BYTES);
                    }
                    let (m, s) = grid(mw, pack4(ab, 2));
                    summs[g] = _mm512_fmadd_ps(m, s, summs[g]);
                }
            }
        }
    }
    let mut lanes = [0f32; 16];
    let mut mins = [0f32; 16];
    for g in 0..G {
        // SAFETY: both arrays hold 16 f32 values; AVX-512F in the caller.
        unsafe { _mm512_storeu_ps(mins.as_mut_ptr(), summs[g]) };
        for r in 0..4 {
            for h in 0..2 {
                // SAFETY: as above.
                unsafe { _mm512_storeu_ps(lanes.as_mut_ptr(), acc[r][g][h]) };
                for k in 0..2 {
                    let l = &lanes[8 * k..8 * k + 8];
                    let mut s = [0f32; 4];
                    for j in 0..4 {
                        s[j] = l[4 + j] + l[j];
                    }
                    let hsum = (s[0] + s[2]) + (s[1] + s[3]);
                    let i = 2 * h + k;
                    out[r][4 * g + i] = if T::MIN { hsum + mins[4 * r + i] } else { hsum };
                }
            }
        }
    }
}
