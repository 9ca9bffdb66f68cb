//! AVX2 and AVX-512 VNNI kernels for `ggml_repack_b32`'s order (Q4_0 and
//! IQ4_NL weights that llama.cpp repacks): sixteen weight rows against up
//! to four activation rows, one f32 lane per output and one FMA per
//! output and block, as the portable kernel.
//!
//! The block sums are transposed so that lane `r` of one register holds
//! weight row `r`'s sum, which is where llama.cpp's interleaved layout
//! puts it: the 16 quant bytes of four rows fill a register's 128-bit
//! lanes, and a 4 x 4 transpose of 32-bit words (per 128-bit lane) turns
//! four such registers into four whose lane `r` holds bytes `4k..4k + 4`
//! of row `r`. Each then meets the four activation quants of those
//! elements broadcast to every lane, so the integer sum needs no
//! horizontal reduction; the rows' f16 scales are gathered with scalar
//! loads (beside the vector pipes) and converted at once. The decoded
//! weights of a block serve every activation row of the call (batches).
//! With two threads a 4096 x 4096 matvec (9.4 MB of weights) takes about
//! 150 us here, about the machine's read bandwidth.
//!
//! AVX-512 VNNI multiplies unsigned codes (`q` for Q4_0, level + 128 for
//! IQ4_NL) by the signed activations with `vpdpbusd` and takes
//! `off * sum(a)` off (exact in i32); AVX2 multiplies the signed levels
//! with llama.cpp's sign trick (`vpsignb`, `vpmaddubsw`: no pair exceeds
//! 2 * 127 * 127, so nothing saturates).

use super::ggml_repack_b32::{blocks, levels, Act, ACTS, A_BYTES, ROWS, W_BYTES};
use std::arch::x86_64::*;

/// How far ahead to prefetch each weight row, in bytes; zero for none.
/// Long rows: none (the hardware prefetchers follow the sixteen streams;
/// software prefetches only slowed the 4096-column matvec, 2 threads:
/// 150 vs 170 us). Short rows (under 2 KiB): the same place in the next
/// call's sixteen rows, which lie just past these (on par with the plain
/// kernels at 2048 columns, where none was 5-10% slower).
#[inline(always)]
fn prefetch_distance(nb: usize) -> usize {
    let row = nb * W_BYTES;
    if row < 2048 {
        ROWS * row
    } else {
        0
    }
}

/// The little-endian u16 at `p`, widened.
#[inline(always)]
unsafe fn u16_at(p: *const u8) -> u64 {
    // SAFETY: two readable bytes at `p` (caller).
    unsafe { p.cast::<u16>().read_unaligned() as u64 }
}

/// The f16 scales (byte 0 of each block) of four rows, as 16-bit words.
#[inline(always)]
unsafe fn pack4(p: &[*const u8], k: usize) -> i64 {
    // SAFETY: whole blocks at p[4k..4k + 4] (caller).
    unsafe {
        (u16_at(p[4 * k]) | u16_at(p[4 * k + 1]) << 16 | u16_at(p[4 * k + 2]) << 32 | u16_at(p[4 * k + 3]) << 48) as i64
    }
}

/// The i32 at `p` (four activation quants).
#[inline(always)]
unsafe fn i32_at(p: *const u8) -> i32 {
    // SAFETY: four readable bytes at `p` (caller).
    unsafe { p.cast::<i32>().read_unaligned() }
}

/// Sixteen rows with AVX-512 VNNI (see the module comment).
///
/// # Safety
/// AVX-512 F/BW/VL/VNNI, AVX2, FMA and F16C must be available.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn tile512<const IQ: bool>(w: &[&[u8]; ROWS], acts: &[Act<'_>], out: &mut [[f32; ROWS]; ACTS]) {
    let Some(nb) = blocks(w, acts) else {
        *out = [[f32::NAN; ROWS]; ACTS];
        return;
    };
    // SAFETY: the features are enabled here; every row has `nb` blocks
    // and there are at most ACTS activation rows (`blocks`).
    unsafe {
        match acts.len() {
            1 => run512::<IQ, 1>(w, acts, nb, out),
            2 => run512::<IQ, 2>(w, acts, nb, out),
            3 => run512::<IQ, 3>(w, acts, nb, out),
            _ => run512::<IQ, 4>(w, acts, nb, out),
        }
    }
}

/// # Safety
/// As `tile512`, and `blocks(w, acts) == Some(nb)` with `acts.len() == R`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn run512<const IQ: bool, const R: usize>(
    w: &[&[u8]; ROWS],
    acts: &[Act<'_>],
    nb: usize,
    out: &mut [[f32; ROWS]; ACTS],
) {
    let off: i32 = if IQ { 128 } else { 8 };
    let table: [u8; 16] = levels(IQ).map(|v| (v as i16 + off as i16) as u8);
    // SAFETY: 16 bytes.
    let lut = _mm512_broadcast_i32x4(unsafe { _mm_loadu_si128(table.as_ptr().cast()) });
    let m4 = _mm512_set1_epi8(0x0F);
    let base = w.map(|r| r.as_ptr());
    let pf = prefetch_distance(nb);
    let mut acc = [_mm512_setzero_ps(); R];
    for i in 0..nb {
        // SAFETY (pointer reads): block i < nb of every weight row and
        // activation row (caller).
        unsafe {
            let p: [*const u8; ROWS] = std::array::from_fn(|r| base[r].add(i * W_BYTES));
            if pf != 0 && i % 2 == 0 {
                // Two blocks (36 bytes) per prefetch reach every line. A
                // prefetch never faults (wrapping address).
                for q in p {
                    _mm_prefetch::<_MM_HINT_T0>(q.wrapping_add(pf).cast());
                }
            }
            // z[t]'s 128-bit lane L: the quant bytes of row 4L + t.
            let z: [__m512i; 4] = std::array::from_fn(|t| {
                let v = _mm512_castsi128_si512(_mm_loadu_si128(p[t].add(2).cast()));
                let v = _mm512_inserti32x4::<1>(v, _mm_loadu_si128(p[4 + t].add(2).cast()));
                let v = _mm512_inserti32x4::<2>(v, _mm_loadu_si128(p[8 + t].add(2).cast()));
                _mm512_inserti32x4::<3>(v, _mm_loadu_si128(p[12 + t].add(2).cast()))
            });
            let u0 = _mm512_unpacklo_epi32(z[0], z[1]);
            let u1 = _mm512_unpackhi_epi32(z[0], z[1]);
            let u2 = _mm512_unpacklo_epi32(z[2], z[3]);
            let u3 = _mm512_unpackhi_epi32(z[2], z[3]);
            // t[k] lane r: bytes 4k..4k + 4 of row r.
            let t = [
                _mm512_unpacklo_epi64(u0, u2),
                _mm512_unpackhi_epi64(u0, u2),
                _mm512_unpacklo_epi64(u1, u3),
                _mm512_unpackhi_epi64(u1, u3),
            ];
            let code = |v: __m512i| if IQ { _mm512_shuffle_epi8(lut, v) } else { v };
            // Elements 4k..4k + 4 (low nibbles) and 16 + 4k.. (high ones).
            let lo = t.map(|v| code(_mm512_and_si512(v, m4)));
            let hi = t.map(|v| code(_mm512_and_si512(_mm512_srli_epi32::<4>(v), m4)));
            let dw = _mm512_cvtph_ps(_mm256_set_epi64x(
                pack4(&p, 3),
                pack4(&p, 2),
                pack4(&p, 1),
                pack4(&p, 0),
            ));
            for (a, acc) in acc.iter_mut().enumerate() {
                let act = &acts[a];
                let y = act.bytes.as_ptr().add(i * A_BYTES + 2);
                let mut s = _mm512_set1_epi32(-off * *act.sums.as_ptr().add(i));
                for k in 0..4 {
                    s = _mm512_dpbusd_epi32(s, lo[k], _mm512_set1_epi32(i32_at(y.add(4 * k))));
                    s = _mm512_dpbusd_epi32(s, hi[k], _mm512_set1_epi32(i32_at(y.add(16 + 4 * k))));
                }
                let d = _mm512_mul_ps(dw, _mm512_set1_ps(*act.d.as_ptr().add(i)));
                *acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), d, *acc);
            }
        }
    }
    for (o, acc) in out.iter_mut().zip(acc) {
        // SAFETY: `o` holds 16 f32 values.
        unsafe { _mm512_storeu_ps(o.as_mut_ptr(), acc) };
    }
}

/// Sixteen rows with AVX2, eight at a time (see the module comment).
///
/// # Safety
/// AVX2, FMA and F16C must be available.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn tile_avx2<const IQ: bool>(w: &[&[u8]; ROWS], acts: &[Act<'_>], out: &mut [[f32; ROWS]; ACTS]) {
    let Some(nb) = blocks(w, acts) else {
        *out = [[f32::NAN; ROWS]; ACTS];
        return;
    };
    for h in 0..2 {
        let base: [*const u8; 8] = std::array::from_fn(|r| w[8 * h + r].as_ptr());
        // SAFETY: as `tile512`'s call, for AVX2.
        let acc = unsafe { run_avx2::<IQ>(base, acts, nb) };
        for (o, acc) in out.iter_mut().zip(acc).take(acts.len()) {
            // SAFETY: eight of `o`'s 16 f32 values.
            unsafe { _mm256_storeu_ps(o.as_mut_ptr().add(8 * h), acc) };
        }
    }
}

/// Eight rows (block pointers `base`) against `acts`: lane r of result
/// `a` is row r against `acts[a]`.
///
/// # Safety
/// AVX2, FMA and F16C must be available; every row at `base` and every
/// activation row has `nb` blocks; `acts.len() <= ACTS`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn run_avx2<const IQ: bool>(base: [*const u8; 8], acts: &[Act<'_>], nb: usize) -> [__m256; ACTS] {
    let table = levels(IQ);
    // SAFETY: 16 bytes.
    let lut = _mm256_broadcastsi128_si256(unsafe { _mm_loadu_si128(table.as_ptr().cast()) });
    let m4 = _mm256_set1_epi8(0x0F);
    let ones = _mm256_set1_epi16(1);
    let pf = prefetch_distance(nb);
    let mut acc = [_mm256_setzero_ps(); ACTS];
    for i in 0..nb {
        // SAFETY (pointer reads): block i < nb of every row (caller).
        unsafe {
            let p: [*const u8; 8] = std::array::from_fn(|r| base[r].add(i * W_BYTES));
            if pf != 0 && i % 2 == 0 {
                for q in p {
                    // Eight rows per call here: the next eight lie half as
                    // far (a hint only, never a fault).
                    _mm_prefetch::<_MM_HINT_T0>(q.wrapping_add(pf / 2).cast());
                }
            }
            // z[t]'s 128-bit lane L: the quant bytes of row 4L + t.
            let z: [__m256i; 4] = std::array::from_fn(|t| {
                let v = _mm256_castsi128_si256(_mm_loadu_si128(p[t].add(2).cast()));
                _mm256_inserti128_si256::<1>(v, _mm_loadu_si128(p[4 + t].add(2).cast()))
            });
            let u0 = _mm256_unpacklo_epi32(z[0], z[1]);
            let u1 = _mm256_unpackhi_epi32(z[0], z[1]);
            let u2 = _mm256_unpacklo_epi32(z[2], z[3]);
            let u3 = _mm256_unpackhi_epi32(z[2], z[3]);
            let t = [
                _mm256_unpacklo_epi64(u0, u2),
                _mm256_unpackhi_epi64(u0, u2),
                _mm256_unpacklo_epi64(u1, u3),
                _mm256_unpackhi_epi64(u1, u3),
            ];
            let lo = t.map(|v| _mm256_shuffle_epi8(lut, _mm256_and_si256(v, m4)));
            let hi = t.map(|v| _mm256_shuffle_epi8(lut, _mm256_and_si256(_mm256_srli_epi32::<4>(v), m4)));
            let codes = [lo[0], lo[1], lo[2], lo[3], hi[0], hi[1], hi[2], hi[3]];
            let abs = codes.map(|c| _mm256_sign_epi8(c, c));
            let dw = _mm256_cvtph_ps(_mm_set_epi64x(pack4(&p, 1), pack4(&p, 0)));
            for (a, act) in acts.iter().enumerate().take(ACTS) {
                let y = act.bytes.as_ptr().add(i * A_BYTES + 2);
                let mut s = _mm256_setzero_si256();
                for k in 0..8 {
                    // Codes k < 4 meet elements 4k..4k + 4, k >= 4 elements
                    // 16 + 4(k - 4)..: bytes 4k.. of the quants either way.
                    let ya = _mm256_set1_epi32(i32_at(y.add(4 * k)));
                    let pr = _mm256_maddubs_epi16(abs[k], _mm256_sign_epi8(ya, codes[k]));
                    s = _mm256_add_epi32(s, _mm256_madd_epi16(pr, ones));
                }
                let d = _mm256_mul_ps(dw, _mm256_set1_ps(*act.d.as_ptr().add(i)));
                acc[a] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), d, acc[a]);
            }
        }
    }
    acc
}
