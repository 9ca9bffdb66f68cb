//! AVX2 kernels (with FMA and F16C), in the style of llama.cpp's x86
//! `ggml_vec_dot_*`: one block per 256-bit vector, products of unsigned
//! and signed bytes with `vpmaddubsw`, pairs of those summed to i32 with
//! `vpmaddwd`, then converted to f32 and scaled per block.
//!
//! Scales are converted four blocks at a time: the f16 scales are gathered
//! with scalar loads (which run beside the vector pipes) and converted by
//! one `vcvtph2ps`. Two accumulators hide the FMA latency.

use super::{blocks, blocks4, Layout, WIq4Nl, W4_0, W4_1, W5_0, W5_1, W8_0, W8_1};
use rustorch_core::quant::blocks::{f16_to_f32, KVALUES_IQ4NL};
use std::arch::x86_64::*;

/// The per-block integer work of one weight type.
///
/// Split in two so that a block decoded once can meet several activation
/// rows (`dot4`): `decode` unpacks the weight quants into one vector,
/// `mul` multiplies that vector with 32 activation quants.
pub(super) trait Avx2Dot: Layout {
    /// The block's 32 weight quants at `w` in the form `mul` takes.
    ///
    /// # Safety
    /// AVX2 must be available and `w` must point at a whole weight block.
    unsafe fn decode(w: *const u8) -> __m256i;

    /// Eight i32 lanes whose sum is the exact integer dot product of the
    /// decoded block `u` with the 32 activation quants `a`.
    ///
    /// # Safety
    /// AVX2 must be available.
    unsafe fn mul(u: __m256i, a: __m256i) -> __m256i;

    /// `mul(decode(w), a)`.
    ///
    /// # Safety
    /// As `decode`.
    #[inline(always)]
    unsafe fn block(w: *const u8, a: __m256i) -> __m256i {
        // SAFETY: forwarded from the caller.
        unsafe { Self::mul(Self::decode(w), a) }
    }
}

/// The little-endian u16 at `p`.
#[inline(always)]
pub(super) unsafe fn u16_at(p: *const u8) -> u64 {
    // SAFETY: the caller guarantees two readable bytes at `p`.
    u16::from_le_bytes(unsafe { p.cast::<[u8; 2]>().read_unaligned() }) as u64
}

/// Four f16 values `stride` bytes apart, packed as four 16-bit words.
#[inline(always)]
pub(super) unsafe fn pack4(p: *const u8, stride: usize) -> i64 {
    // SAFETY: the caller guarantees four blocks of `stride` bytes at `p`.
    unsafe {
        (u16_at(p) | u16_at(p.add(stride)) << 16 | u16_at(p.add(2 * stride)) << 32 | u16_at(p.add(3 * stride)) << 48)
            as i64
    }
}

/// `f16(w[k]) * f16(a[k])` for four blocks: the f16 at byte 0 of each of
/// the four weight blocks at `w` times the one at byte 0 of each
/// activation block at `a`.
#[inline(always)]
unsafe fn scales4<T: Layout>(w: *const u8, a: *const u8) -> __m128 {
    // SAFETY: the caller guarantees four whole blocks at `w` and `a`; the
    // intrinsics need F16C and AVX, enabled in the calling kernel.
    unsafe {
        let h = _mm_set_epi64x(pack4(a, T::A_BYTES), pack4(w, T::W_BYTES));
        let f = _mm256_cvtph_ps(h);
        _mm_mul_ps(_mm256_castps256_ps128(f), _mm256_extractf128_ps::<1>(f))
    }
}

#[inline(always)]
unsafe fn hsum(v: __m256) -> f32 {
    // SAFETY: AVX is enabled in the calling kernel.
    unsafe {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
        hsum128(s)
    }
}

#[inline(always)]
pub(super) unsafe fn hsum128(s: __m128) -> f32 {
    // SAFETY: SSE3 is part of every level that calls this.
    unsafe {
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)))
    }
}

/// `sum over blocks of d_w * d_a * isum (+ m_w * s_a)`.
///
/// # Safety
/// AVX2, FMA and F16C must be available (`Isa::Avx2`).
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn dot<T: Avx2Dot>(w: &[u8], a: &[u8]) -> f32 {
    let Some(nb) = blocks::<T>(w, a) else {
        return f32::NAN;
    };
    let (wp, ap) = (w.as_ptr(), a.as_ptr());
    let mut acc = [_mm256_setzero_ps(); 2];
    let mut mins = _mm_setzero_ps();
    let mut i = 0;
    // SAFETY (all pointer reads below): block i + k < nb, and `blocks`
    // checked that `w` holds nb weight blocks and `a` nb activation blocks.
    while i + 4 <= nb {
        let (wb, ab) = unsafe { (wp.add(i * T::W_BYTES), ap.add(i * T::A_BYTES)) };
        let d = unsafe { scales4::<T>(wb, ab) };
        if T::MIN {
            // m_w (byte 2) times s_a (byte 2) for the four blocks.
            mins = _mm_add_ps(mins, unsafe { scales4::<T>(wb.add(2), ab.add(2)) });
        }
        let d = _mm256_castps128_ps256(d);
        for k in 0..4 {
            let p = unsafe {
                let av = _mm256_loadu_si256(ab.add(k * T::A_BYTES + T::A_QS).cast());
                T::block(wb.add(k * T::W_BYTES), av)
            };
            let s = _mm256_permutevar8x32_ps(d, _mm256_set1_epi32(k as i32));
            acc[k & 1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), s, acc[k & 1]);
        }
        i += 4;
    }
    let mut tail = 0f32;
    while i < nb {
        let (wb, ab) = unsafe { (wp.add(i * T::W_BYTES), ap.add(i * T::A_BYTES)) };
        let (dw, da) = unsafe { (u16_at(wb) as u16, u16_at(ab) as u16) };
        let d = f16_to_f32(dw.to_le_bytes()) * f16_to_f32(da.to_le_bytes());
        let p = unsafe { T::block(wb, _mm256_loadu_si256(ab.add(T::A_QS).cast())) };
        acc[0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(d), acc[0]);
        if T::MIN {
            let (m, s) = unsafe { (u16_at(wb.add(2)) as u16, u16_at(ab.add(2)) as u16) };
            tail += f16_to_f32(m.to_le_bytes()) * f16_to_f32(s.to_le_bytes());
        }
        i += 1;
    }
    unsafe { hsum(_mm256_add_ps(acc[0], acc[1])) + hsum128(mins) + tail }
}

/// `dot` of one weight row with four activation rows: each block is
/// decoded once and multiplied with the four rows' quants. Each output
/// goes through exactly the f32 operations `dot` performs for its row, so
/// the results are bit-identical to four `dot` calls.
///
/// # Safety
/// AVX2, FMA and F16C must be available (`Isa::Avx2`).
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn dot4<T: Avx2Dot>(w: &[u8], a: [&[u8]; 4], out: &mut [f32; 4]) {
    let Some(nb) = blocks4::<T>(w, &a) else {
        *out = [f32::NAN; 4];
        return;
    };
    let wp = w.as_ptr();
    let ap = [a[0].as_ptr(), a[1].as_ptr(), a[2].as_ptr(), a[3].as_ptr()];
    let mut acc = [[_mm256_setzero_ps(); 2]; 4];
    let mut mins = [_mm_setzero_ps(); 4];
    let mut i = 0;
    // SAFETY (all pointer reads below): block i + k < nb, and `blocks4`
    // checked that `w` holds nb weight blocks and each `a[r]` nb
    // activation blocks.
    while i + 4 <= nb {
        let wb = unsafe { wp.add(i * T::W_BYTES) };
        let mut d = [_mm256_setzero_ps(); 4];
        for r in 0..4 {
            let ab = unsafe { ap[r].add(i * T::A_BYTES) };
            d[r] = _mm256_castps128_ps256(unsafe { scales4::<T>(wb, ab) });
            if T::MIN {
                mins[r] = _mm_add_ps(mins[r], unsafe { scales4::<T>(wb.add(2), ab.add(2)) });
            }
        }
        for k in 0..4 {
            let u = unsafe { T::decode(wb.add(k * T::W_BYTES)) };
            let sel = _mm256_set1_epi32(k as i32);
            for r in 0..4 {
                let p = unsafe {
                    let av = _mm256_loadu_si256(ap[r].add((i + k) * T::A_BYTES + T::A_QS).cast());
                    T::mul(u, av)
                };
                let s = _mm256_permutevar8x32_ps(d[r], sel);
                acc[r][k & 1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), s, acc[r][k & 1]);
            }
        }
        i += 4;
    }
    let mut tail = [0f32; 4];
    while i < nb {
        let wb = unsafe { wp.add(i * T::W_BYTES) };
        let u = unsafe { T::decode(wb) };
        let dw = f16_to_f32((unsafe { u16_at(wb) } as u16).to_le_bytes());
        for r in 0..4 {
            let ab = unsafe { ap[r].add(i * T::A_BYTES) };
            let da = f16_to_f32((unsafe { u16_at(ab) } as u16).to_le_bytes());
            let d = dw * da;
            let p = unsafe { T::mul(u, _mm256_loadu_si256(ab.add(T::A_QS).cast())) };
            acc[r][0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(d), acc[r][0]);
            if T::MIN {
                let (m, s) = unsafe { (u16_at(wb.add(2)) as u16, u16_at(ab.add(2)) as u16) };
                tail[r] += f16_to_f32(m.to_le_bytes()) * f16_to_f32(s.to_le_bytes());
            }
        }
        i += 1;
    }
    for r in 0..4 {
        out[r] = unsafe { hsum(_mm256_add_ps(acc[r][0], acc[r][1])) + hsum128(mins[r]) + tail[r] };
    }
}

/// 32 nibbles of the 16 bytes at `q` as bytes 0..=15: low nibbles in
/// bytes 0..16 (elements 0..16), high nibbles in bytes 16..32.
#[inline(always)]
unsafe fn nibbles(q: *const u8) -> __m256i {
    // SAFETY: 16 readable bytes at `q` (caller); AVX2 in the kernel. The
    // broadcast load puts the bytes in both halves; shifting the upper
    // half's dwords right by 4 brings each byte's high nibble down (bits
    // crossing into a neighbour byte are masked off).
    unsafe {
        let x = _mm256_broadcastsi128_si256(_mm_loadu_si128(q.cast()));
        let x = _mm256_srlv_epi32(x, _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4));
        _mm256_and_si256(x, _mm256_set1_epi8(0x0F))
    }
}

/// 0x10 in byte j where bit j of the u32 at `qh` is set, else 0.
#[inline(always)]
unsafe fn high_bits(qh: *const u8) -> __m256i {
    // SAFETY: four readable bytes at `qh` (caller); AVX2 in the kernel.
    // Byte j takes byte j / 8 of the mask; OR-ing every bit except bit
    // j % 8 and comparing with all-ones tests that bit (llama.cpp's
    // `bytes_from_bits_32`).
    unsafe {
        let bits = qh.cast::<i32>().read_unaligned();
        let shuf = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0);
        let x = _mm256_shuffle_epi8(_mm256_set1_epi32(bits), shuf);
        let x = _mm256_or_si256(x, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe));
        let set = _mm256_cmpeq_epi8(x, _mm256_set1_epi64x(-1));
        _mm256_and_si256(set, _mm256_set1_epi8(0x10))
    }
}

/// i16 pairs to i32 lanes.
#[inline(always)]
unsafe fn pairs(p16: __m256i) -> __m256i {
    // SAFETY: AVX2 in the kernel.
    unsafe { _mm256_madd_epi16(p16, _mm256_set1_epi16(1)) }
}

/// Unsigned quants `u` minus `off`, times signed `a`: the i16 products
/// `u*a` and `off*a` cannot saturate (|u|, off <= 31, |a| <= 128).
#[inline(always)]
unsafe fn offset_dot(u: __m256i, off: i8, a: __m256i) -> __m256i {
    // SAFETY: AVX2 in the kernel.
    unsafe {
        let p = _mm256_maddubs_epi16(u, a);
        let c = _mm256_maddubs_epi16(_mm256_set1_epi8(off), a);
        pairs(_mm256_sub_epi16(p, c))
    }
}

/// Signed `x` times signed `a`, through |x| and a with x's sign. Exact
/// for x in -128..=127 (|x| = 128 reads as unsigned 128) and a in
/// -127..=127 (activation quants never reach -128); an i16 pair is at
/// most 2 * 128 * 127 < 32768.
#[inline(always)]
unsafe fn signed_dot(x: __m256i, a: __m256i) -> __m256i {
    // SAFETY: AVX2 in the kernel.
    unsafe { pairs(_mm256_maddubs_epi16(_mm256_sign_epi8(x, x), _mm256_sign_epi8(a, x))) }
}

impl Avx2Dot for W4_0 {
    #[inline(always)]
    unsafe fn decode(w: *const u8) -> __m256i {
        // SAFETY: a whole block at `w` (caller): qs at 2..18.
        unsafe { nibbles(w.add(2)) }
    }

    #[inline(always)]
    unsafe fn mul(u: __m256i, a: __m256i) -> __m256i {
        // SAFETY: AVX2 in the kernel.
        unsafe { offset_dot(u, 8, a) }
    }
}

impl Avx2Dot for W4_1 {
    #[inline(always)]
    unsafe fn decode(w: *const u8) -> __m256i {
        // SAFETY: a whole block at `w` (caller): qs at 4..20.
        unsafe { nibbles(w.add(4)) }
    }

    #[inline(always)]
    unsafe fn mul(u: __m256i, a: __m256i) -> __m256i {
        // SAFETY: AVX2 in the kernel. Products of 15 and 127 cannot
        // saturate an i16 pair.
        unsafe { pairs(_mm256_maddubs_epi16(u, a)) }
    }
}

impl Avx2Dot for W5_0 {
    #[inline(always)]
    unsafe fn decode(w: *const u8) -> __m256i {
        // SAFETY: a whole block at `w` (caller): qh at 2..6, qs at 6..22.
        unsafe { _mm256_or_si256(nibbles(w.add(6)), high_bits(w.add(2))) }
    }

    #[inline(always)]
    unsafe fn mul(u: __m256i, a: __m256i) -> __m256i {
        // SAFETY: AVX2 in the kernel.
        unsafe { offset_dot(u, 16, a) }
    }
}

impl Avx2Dot for W5_1 {
    #[inline(always)]
    unsafe fn decode(w: *const u8) -> __m256i {
        // SAFETY: a whole block at `w` (caller): qh at 4..8, qs at 8..24.
        unsafe { _mm256_or_si256(nibbles(w.add(8)), high_bits(w.add(4))) }
    }

    #[inline(always)]
    unsafe fn mul(u: __m256i, a: __m256i) -> __m256i {
        // SAFETY: AVX2 in the kernel. 31 * 127 * 2 cannot saturate an i16.
        unsafe { pairs(_mm256_maddubs_epi16(u, a)) }
    }
}

impl Avx2Dot for W8_0 {
    #[inline(always)]
    unsafe fn decode(w: *const u8) -> __m256i {
        // SAFETY: a whole block at `w` (caller): qs at 2..34.
        unsafe { _mm256_loadu_si256(w.add(2).cast()) }
    }

    #[inline(always)]
    unsafe fn mul(u: __m256i, a: __m256i) -> __m256i {
        // SAFETY: AVX2 in the kernel.
        unsafe { signed_dot(u, a) }
    }
}

impl Avx2Dot for W8_1 {
    #[inline(always)]
    unsafe fn decode(w: *const u8) -> __m256i {
        // SAFETY: a whole block at `w` (caller): qs at 4..36.
        unsafe { _mm256_loadu_si256(w.add(4).cast()) }
    }

    #[inline(always)]
    unsafe fn mul(u: __m256i, a: __m256i) -> __m256i {
        // SAFETY: AVX2 in the kernel.
        unsafe { signed_dot(u, a) }
    }
}

impl Avx2Dot for WIq4Nl {
    #[inline(always)]
    unsafe fn decode(w: *const u8) -> __m256i {
        // SAFETY: a whole block at `w` (caller): qs at 2..18.
        unsafe {
            let table = _mm256_broadcastsi128_si256(_mm_loadu_si128(KVALUES_IQ4NL.as_ptr().cast()));
            _mm256_shuffle_epi8(table, nibbles(w.add(2)))
        }
    }

    #[inline(always)]
    unsafe fn mul(u: __m256i, a: __m256i) -> __m256i {
        // SAFETY: AVX2 in the kernel. The levels are in -127..=113, so
        // `signed_dot` is exact.
        unsafe { signed_dot(u, a) }
    }
}
