//! The batched (m >= 2) products of Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 and
//! IQ4_NL weights: four weight rows against four (`dot_tile`) or eight
//! (`dot_tile8`) activation rows per call, in llama.cpp's exact order (see
//! `ggml_exact`).
//!
//! As in `exact512`, a 512-bit accumulator holds the eight f32 lanes of
//! two outputs: here one weight row against two activation rows, so each
//! weight block is decoded once into both halves of a register and meets
//! two (or four) pairs of activation blocks, and the 16 scales `d_w * d_a`
//! of a block and four activation rows come from one `vcvtph2ps` and one
//! multiply. Eight (sixteen) accumulators give independent FMA chains;
//! every output's own per-lane f32 sequence is the scalar kernel's, so
//! the bits are the same. Eight activation rows halve the weight decoding
//! per product (a third of the four-row tile's instructions for Q5_0):
//! `qmatmul/Q5_0_4096x4096x512` 107 -> 97 ms, `Q8_0` 87 -> 76 ms on the
//! 2-core EPYC.

use super::exact512::Unsigned;
use super::{Layout, WIq4Nl, W4_0, W4_1, W5_0, W5_1, W8_0};
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

/// Checks the rows: all weight rows as long as `w[0]`, all activation
/// rows matching it. Returns the block count.
#[inline(always)]
fn tile_blocks<T: Layout>(w: &[&[u8]; 4], a: &[&[u8]]) -> Option<usize> {
    let nb = super::blocks::<T>(w[0], a.first()?)?;
    (w[1..].iter().all(|r| r.len() == w[0].len()) && a[1..].iter().all(|r| r.len() == a[0].len())).then_some(nb)
}

/// `out[r][i]` = the dot product of weight row `w[r]` with activation row
/// `a[i]`, equal bit for bit to `ggml_exact::dot_scalar` on that pair.
///
/// # Safety
/// AVX-512 F/BW/VL/VNNI, AVX2, FMA and F16C must be available
/// (`Isa::Avx512Vnni`).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn dot_tile<T: Broadcast>(w: [&[u8]; 4], a: [&[u8]; 4], out: &mut [[f32; 4]; 4]) {
    let mut o = [[0f32; 8]; 4];
    // SAFETY: forwarded; four activation rows, one group.
    unsafe { tile::<T, 1>(w, &a, &mut o) };
    *out = o.map(|r| std::array::from_fn(|i| r[i]));
}

/// `dot_tile` for eight activation rows: each weight block is decoded once
/// for twice as many products (Gemma 3's Q5_0 projections: the decode is a
/// third of the four-row tile's instructions).
///
/// # Safety
/// As `dot_tile`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn dot_tile8<T: Broadcast>(w: [&[u8]; 4], a: [&[u8]; 8], out: &mut [[f32; 8]; 4]) {
    // SAFETY: forwarded; eight activation rows, two groups.
    unsafe { tile::<T, 2>(w, &a, out) }
}

/// Four weight rows against `4 G` activation rows (`a.len()`), into
/// `out[r][..4 G]`.
///
/// # Safety
/// As `dot_tile`; `a.len() == 4 * G`, `G <= 2`.
#[allow(clippy::needless_range_loop)]
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn tile<T: Broadcast, const G: usize>(w: [&[u8]; 4], a: &[&[u8]], out: &mut [[f32; 8]; 4]) {
    debug_assert!(a.len() == 4 * G && G <= 2);
    let Some(nb) = tile_blocks::<T>(&w, a) else {
        *out = [[f32::NAN; 8]; 4];
        return;
    };
    let wp = w.map(|r| r.as_ptr());
    let ap: [[*const u8; 4]; G] = std::array::from_fn(|g| std::array::from_fn(|i| a[4 * g + i].as_ptr()));
    let zero = _mm512_setzero_si512();
    // acc[r][g][h]: weight row r against activation rows 4g + 2h (low
    // half) and 4g + 2h + 1 (high half).
    let mut acc = [[[_mm512_setzero_ps(); 2]; G]; 4];
    let mut summs = [_mm512_setzero_ps(); G];
    let load2 = |p: *const u8, q: *const u8| {
        // SAFETY: whole activation blocks at `p` and `q` (the loop below).
        unsafe {
            _mm512_inserti64x4::<1>(
                _mm512_castsi256_si512(_mm256_loadu_si256(p.add(T::A_QS).cast())),
                _mm256_loadu_si256(q.add(T::A_QS).cast()),
            )
        }
    };
    for b in 0..nb {
        // SAFETY (pointer reads): block b < nb of every weight and
        // activation row (`tile_blocks`).
        unsafe {
            let wb = wp.map(|p| p.add(b * T::W_BYTES));
            let ab = ap.map(|g| g.map(|p| p.add(b * T::A_BYTES)));
            let av: [[__m512i; 2]; G] = ab.map(|g| [load2(g[0], g[1]), load2(g[2], g[3])]);
            // -OFF * sum(a) per lane, so that u = q + OFF gives q . a.
            let nc = av.map(|g| {
                g.map(|v| {
                    if T::OFF == 0 {
                        zero
                    } else {
                        _mm512_sub_epi32(zero, _mm512_dpbusd_epi32(zero, _mm512_set1_epi8(T::OFF as i8), v))
                    }
                })
            });
            let dw = pack4(wb, 0);
            let d: [__m512; G] = ab.map(|g| {
                let (w, a) = grid(dw, pack4(g, 0));
                _mm512_mul_ps(w, a)
            });
            for r in 0..4 {
                let u = T::both(wb[r]);
                for g in 0..G {
                    for h in 0..2 {
                        let p = _mm512_dpbusd_epi32(nc[g][h], u, av[g][h]);
                        let (lo, hi) = ((4 * r + 2 * h) as i32, (4 * r + 2 * h + 1) as i32);
                        let idx = _mm512_setr_epi32(lo, lo, lo, lo, lo, lo, lo, lo, hi, hi, hi, hi, hi, hi, hi, hi);
                        let s = _mm512_permutexvar_ps(idx, d[g]);
                        acc[r][g][h] = _mm512_fmadd_ps(s, _mm512_cvtepi32_ps(p), acc[r][g][h]);
                    }
                }
            }
            if T::MIN {
                let mw = pack4(wb, 2);
                for g in 0..G {
                    let (m, s) = grid(mw, pack4(ab[g], 2));
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
                    let s: [f32; 4] = std::array::from_fn(|j| l[4 + j] + l[j]);
                    let hsum = (s[0] + s[2]) + (s[1] + s[3]);
                    let i = 2 * h + k;
                    out[r][4 * g + i] = if T::MIN { hsum + mins[4 * r + i] } else { hsum };
                }
            }
        }
    }
}
