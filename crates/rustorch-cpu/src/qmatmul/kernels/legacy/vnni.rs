//! AVX-512 VNNI kernels: two blocks per 512-bit vector (block k in the
//! lower 256 bits, block k + 1 in the upper), unsigned-by-signed byte
//! products summed straight into i32 lanes by `vpdpbusd`, eight blocks
//! per iteration into four independent accumulators.
//!
//! `vpdpbusd` multiplies unsigned by signed bytes without saturation, so
//! signed weights are made unsigned by an offset (`q + 8`, `q + 16`,
//! `q + 128`) and the offset's share, `off * sum(a)`, is taken off with a
//! second `vpdpbusd` against a constant: exact for any byte values.
//! Blocks left over (fewer than eight) go through the AVX2 block code.

use super::avx2::{hsum128, pack4, u16_at, Avx2Dot};
use super::{blocks, blocks4, Layout, W4_0, W4_1, W5_0, W5_1, W8_0, W8_1};
use rustorch_core::quant::blocks::f16_to_f32;
use std::arch::x86_64::*;

/// The integer work of one weight type on two consecutive blocks.
///
/// Split in two so that two blocks decoded once can meet several
/// activation rows (`dot4`): `decode2` makes the weights unsigned bytes
/// `q + OFF`, `mul2` the exact dot products of `q` with the activations.
pub(super) trait VnniDot: Avx2Dot {
    /// What `decode2` adds to the signed weight quants.
    const OFF: u8;

    /// The 64 quants of the two blocks at `w` and `w + W_BYTES`, plus
    /// `OFF`, as unsigned bytes (block k in bytes 0..32).
    ///
    /// # Safety
    /// AVX-512 F/BW/VNNI must be available and `w` must point at two
    /// whole weight blocks.
    unsafe fn decode2(w: *const u8) -> __m512i;

    /// Sixteen i32 lanes: the sum of lanes 0..8 is the exact integer dot
    /// product of the decoded block k (`u`, bytes 0..32) with the
    /// activation quants in bytes 0..32 of `a`, lanes 8..16 that of block
    /// k + 1 with bytes 32..64.
    ///
    /// # Safety
    /// AVX-512 F/BW/VNNI must be available.
    #[inline(always)]
    unsafe fn mul2(u: __m512i, a: __m512i) -> __m512i {
        // SAFETY: forwarded from the caller.
        unsafe {
            if Self::OFF == 0 {
                _mm512_dpbusd_epi32(_mm512_setzero_si512(), u, a)
            } else {
                offset_dot(u, Self::OFF, a)
            }
        }
    }

    /// `mul2(decode2(w), a)`.
    ///
    /// # Safety
    /// As `decode2`.
    #[inline(always)]
    unsafe fn pair(w: *const u8, a: __m512i) -> __m512i {
        // SAFETY: forwarded from the caller.
        unsafe { Self::mul2(Self::decode2(w), a) }
    }
}

/// `f16(w[k]) * f16(a[k])` for eight blocks (byte 0 of each block at `w`
/// and at `a`; pass pointers offset by 2 for `m_w * s_a`).
#[inline(always)]
unsafe fn scales8<T: Layout>(w: *const u8, a: *const u8) -> __m256 {
    // SAFETY: the caller guarantees eight whole blocks at `w` and `a`;
    // AVX-512F and F16C are enabled in the calling kernel.
    unsafe { scales8_packed::<T>(wscales8::<T>(w), a) }
}

/// The f16 values at byte 0 of eight weight blocks at `w`, packed for
/// `scales8_packed` (computed once per weight row in `dot4`).
#[inline(always)]
unsafe fn wscales8<T: Layout>(w: *const u8) -> [i64; 2] {
    // SAFETY: the caller guarantees eight whole blocks at `w`.
    unsafe { [pack4(w, T::W_BYTES), pack4(w.add(4 * T::W_BYTES), T::W_BYTES)] }
}

/// `scales8` with the weight scales packed beforehand.
#[inline(always)]
unsafe fn scales8_packed<T: Layout>(w: [i64; 2], a: *const u8) -> __m256 {
    // SAFETY: the caller guarantees eight whole blocks at `a`; AVX-512F
    // and F16C are enabled in the calling kernel.
    unsafe {
        let h = _mm256_set_epi64x(
            pack4(a.add(4 * T::A_BYTES), T::A_BYTES),
            pack4(a, T::A_BYTES),
            w[1],
            w[0],
        );
        let f = _mm512_cvtph_ps(h);
        let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(f)));
        _mm256_mul_ps(_mm512_castps512_ps256(f), hi)
    }
}

/// `sum over blocks of d_w * d_a * isum (+ m_w * s_a)`.
///
/// # Safety
/// AVX-512 F/BW/VL/VNNI, AVX2, FMA and F16C must be available
/// (`Isa::Avx512Vnni`).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn dot<T: VnniDot>(w: &[u8], a: &[u8]) -> f32 {
    let Some(nb) = blocks::<T>(w, a) else {
        return f32::NAN;
    };
    let (wp, ap) = (w.as_ptr(), a.as_ptr());
    let mut acc = [_mm512_setzero_ps(); 4];
    let mut mins = _mm256_setzero_ps();
    let mut i = 0;
    // SAFETY (all pointer reads below): block i + k < nb, and `blocks`
    // checked that `w` holds nb weight blocks and `a` nb activation blocks.
    while i + 8 <= nb {
        let (wb, ab) = unsafe { (wp.add(i * T::W_BYTES), ap.add(i * T::A_BYTES)) };
        let d = _mm512_castps256_ps512(unsafe { scales8::<T>(wb, ab) });
        if T::MIN {
            mins = _mm256_add_ps(mins, unsafe { scales8::<T>(wb.add(2), ab.add(2)) });
        }
        for (k, acc) in acc.iter_mut().enumerate() {
            let p = unsafe {
                let a0 = _mm256_loadu_si256(ab.add(2 * k * T::A_BYTES + T::A_QS).cast());
                let a1 = _mm256_loadu_si256(ab.add((2 * k + 1) * T::A_BYTES + T::A_QS).cast());
                let av = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(a0), a1);
                T::pair(wb.add(2 * k * T::W_BYTES), av)
            };
            // Lanes 0..8 take block 2k's scale, lanes 8..16 block 2k+1's.
            let (lo, hi) = (2 * k as i32, 2 * k as i32 + 1);
            let idx = _mm512_setr_epi32(lo, lo, lo, lo, lo, lo, lo, lo, hi, hi, hi, hi, hi, hi, hi, hi);
            let s = _mm512_permutexvar_ps(idx, d);
            *acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), s, *acc);
        }
        i += 8;
    }
    let mut tail = _mm256_setzero_ps();
    let mut tail_min = 0f32;
    while i < nb {
        let (wb, ab) = unsafe { (wp.add(i * T::W_BYTES), ap.add(i * T::A_BYTES)) };
        let (dw, da) = unsafe { (u16_at(wb) as u16, u16_at(ab) as u16) };
        let d = f16_to_f32(dw.to_le_bytes()) * f16_to_f32(da.to_le_bytes());
        let p = unsafe { <T as Avx2Dot>::block(wb, _mm256_loadu_si256(ab.add(T::A_QS).cast())) };
        tail = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(d), tail);
        if T::MIN {
            let (m, s) = unsafe { (u16_at(wb.add(2)) as u16, u16_at(ab.add(2)) as u16) };
            tail_min += f16_to_f32(m.to_le_bytes()) * f16_to_f32(s.to_le_bytes());
        }
        i += 1;
    }
    let total = _mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3]));
    let rest = _mm256_add_ps(tail, mins);
    let rest = _mm_add_ps(_mm256_castps256_ps128(rest), _mm256_extractf128_ps::<1>(rest));
    _mm512_reduce_add_ps(total) + unsafe { hsum128(rest) } + tail_min
}

/// `dot` of one weight row with four activation rows: each pair of blocks
/// is decoded once and multiplied with the four rows' quants. Each output
/// goes through exactly the f32 operations `dot` performs for its row, so
/// the results are bit-identical to four `dot` calls.
///
/// # Safety
/// AVX-512 F/BW/VL/VNNI, AVX2, FMA and F16C must be available
/// (`Isa::Avx512Vnni`).
// `k` and `r` index several arrays (accumulators, scales, rows) at once.
#[allow(clippy::needless_range_loop)]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn dot4<T: VnniDot>(w: &[u8], a: [&[u8]; 4], out: &mut [f32; 4]) {
    let Some(nb) = blocks4::<T>(w, &a) else {
        *out = [f32::NAN; 4];
        return;
    };
    let wp = w.as_ptr();
    let ap = [a[0].as_ptr(), a[1].as_ptr(), a[2].as_ptr(), a[3].as_ptr()];
    let mut acc = [[_mm512_setzero_ps(); 4]; 4];
    let mut mins = [_mm256_setzero_ps(); 4];
    let mut i = 0;
    // SAFETY (all pointer reads below): block i + k < nb, and `blocks4`
    // checked that `w` holds nb weight blocks and each `a[r]` nb
    // activation blocks.
    while i + 8 <= nb {
        let wb = unsafe { wp.add(i * T::W_BYTES) };
        // The weight scales (and offsets) are gathered once for the four
        // rows; the products are the ones `scales8` forms.
        let (ws, wm) = unsafe { (wscales8::<T>(wb), wscales8::<T>(wb.add(2))) };
        let mut d = [_mm512_setzero_ps(); 4];
        for r in 0..4 {
            let ab = unsafe { ap[r].add(i * T::A_BYTES) };
            d[r] = _mm512_castps256_ps512(unsafe { scales8_packed::<T>(ws, ab) });
            if T::MIN {
                mins[r] = _mm256_add_ps(mins[r], unsafe { scales8_packed::<T>(wm, ab.add(2)) });
            }
        }
        for k in 0..4 {
            let u = unsafe { T::decode2(wb.add(2 * k * T::W_BYTES)) };
            // Lanes 0..8 take block 2k's scale, lanes 8..16 block 2k+1's.
            let (lo, hi) = (2 * k as i32, 2 * k as i32 + 1);
            let idx = _mm512_setr_epi32(lo, lo, lo, lo, lo, lo, lo, lo, hi, hi, hi, hi, hi, hi, hi, hi);
            for r in 0..4 {
                let p = unsafe {
                    let ab = ap[r].add(i * T::A_BYTES);
                    let a0 = _mm256_loadu_si256(ab.add(2 * k * T::A_BYTES + T::A_QS).cast());
                    let a1 = _mm256_loadu_si256(ab.add((2 * k + 1) * T::A_BYTES + T::A_QS).cast());
                    T::mul2(u, _mm512_inserti64x4::<1>(_mm512_castsi256_si512(a0), a1))
                };
                let s = _mm512_permutexvar_ps(idx, d[r]);
                acc[r][k] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), s, acc[r][k]);
            }
        }
        i += 8;
    }
    let mut tail = [_mm256_setzero_ps(); 4];
    let mut tail_min = [0f32; 4];
    while i < nb {
        let wb = unsafe { wp.add(i * T::W_BYTES) };
        let u = unsafe { <T as Avx2Dot>::decode(wb) };
        let dw = f16_to_f32((unsafe { u16_at(wb) } as u16).to_le_bytes());
        for r in 0..4 {
            let ab = unsafe { ap[r].add(i * T::A_BYTES) };
            let d = dw * f16_to_f32((unsafe { u16_at(ab) } as u16).to_le_bytes());
            let p = unsafe { <T as Avx2Dot>::mul(u, _mm256_loadu_si256(ab.add(T::A_QS).cast())) };
            tail[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(d), tail[r]);
            if T::MIN {
                let (m, s) = unsafe { (u16_at(wb.add(2)) as u16, u16_at(ab.add(2)) as u16) };
                tail_min[r] += f16_to_f32(m.to_le_bytes()) * f16_to_f32(s.to_le_bytes());
            }
        }
        i += 1;
    }
    for r in 0..4 {
        let total = _mm512_add_ps(_mm512_add_ps(acc[r][0], acc[r][1]), _mm512_add_ps(acc[r][2], acc[r][3]));
        let rest = _mm256_add_ps(tail[r], mins[r]);
        let rest = _mm_add_ps(_mm256_castps256_ps128(rest), _mm256_extractf128_ps::<1>(rest));
        out[r] = _mm512_reduce_add_ps(total) + unsafe { hsum128(rest) } + tail_min[r];
    }
}

/// The nibbles of two blocks' 16 quant bytes (at `q` and `q + stride`) as
/// bytes 0..=15, in element order: block 0's low nibbles (elements
/// 0..16), its high nibbles (16..32), then block 1's.
#[inline(always)]
unsafe fn nibbles2(q: *const u8, stride: usize) -> __m512i {
    // SAFETY: 16 readable bytes at `q` and `q + stride` (caller). Each
    // block's bytes are broadcast to a 256-bit half; shifting the upper
    // 128 bits of each half right by 4 brings the high nibbles down.
    unsafe {
        let x0 = _mm256_broadcastsi128_si256(_mm_loadu_si128(q.cast()));
        let x1 = _mm256_broadcastsi128_si256(_mm_loadu_si128(q.add(stride).cast()));
        let x = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(x0), x1);
        let shift = _mm512_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4, 0, 0, 0, 0, 4, 4, 4, 4);
        _mm512_and_si512(_mm512_srlv_epi32(x, shift), _mm512_set1_epi8(0x0F))
    }
}

/// Adds 16 to byte j of `u` where bit j of the two blocks' `qh` (u32 at
/// `qh` and `qh + stride`) is set.
#[inline(always)]
unsafe fn add_high_bits(u: __m512i, qh: *const u8, stride: usize) -> __m512i {
    // SAFETY: four readable bytes at `qh` and `qh + stride` (caller).
    unsafe {
        let lo = qh.cast::<u32>().read_unaligned() as u64;
        let hi = qh.add(stride).cast::<u32>().read_unaligned() as u64;
        _mm512_mask_add_epi8(u, lo | hi << 32, u, _mm512_set1_epi8(16))
    }
}

/// `sum(u * a) - off * sum(a)` per lane: the dot product of `u - off`
/// with `a`.
#[inline(always)]
unsafe fn offset_dot(u: __m512i, off: u8, a: __m512i) -> __m512i {
    // SAFETY: AVX-512 VNNI in the kernel.
    unsafe {
        let zero = _mm512_setzero_si512();
        let p = _mm512_dpbusd_epi32(zero, u, a);
        let c = _mm512_dpbusd_epi32(zero, _mm512_set1_epi8(off as i8), a);
        _mm512_sub_epi32(p, c)
    }
}

/// Two consecutive blocks' 32 signed quant bytes at `q` and `q + stride`.
#[inline(always)]
unsafe fn bytes2(q: *const u8, stride: usize) -> __m512i {
    // SAFETY: 32 readable bytes at `q` and `q + stride` (caller).
    unsafe {
        let x0 = _mm256_loadu_si256(q.cast());
        let x1 = _mm256_loadu_si256(q.add(stride).cast());
        _mm512_inserti64x4::<1>(_mm512_castsi256_si512(x0), x1)
    }
}

impl VnniDot for W4_0 {
    const OFF: u8 = 8;

    #[inline(always)]
    unsafe fn decode2(w: *const u8) -> __m512i {
        // SAFETY: two whole blocks at `w` (caller): qs at 2..18.
        unsafe { nibbles2(w.add(2), Self::W_BYTES) }
    }
}

impl VnniDot for W4_1 {
    const OFF: u8 = 0;

    #[inline(always)]
    unsafe fn decode2(w: *const u8) -> __m512i {
        // SAFETY: two whole blocks at `w` (caller): qs at 4..20.
        unsafe { nibbles2(w.add(4), Self::W_BYTES) }
    }
}

impl VnniDot for W5_0 {
    const OFF: u8 = 16;

    #[inline(always)]
    unsafe fn decode2(w: *const u8) -> __m512i {
        // SAFETY: two whole blocks at `w` (caller): qh at 2..6, qs at 6..22.
        unsafe { add_high_bits(nibbles2(w.add(6), Self::W_BYTES), w.add(2), Self::W_BYTES) }
    }
}

impl VnniDot for W5_1 {
    const OFF: u8 = 0;

    #[inline(always)]
    unsafe fn decode2(w: *const u8) -> __m512i {
        // SAFETY: two whole blocks at `w` (caller): qh at 4..8, qs at 8..24.
        unsafe { add_high_bits(nibbles2(w.add(8), Self::W_BYTES), w.add(4), Self::W_BYTES) }
    }
}

/// Signed weight bytes: `w + 128` (w XOR 0x80) is unsigned.
#[inline(always)]
unsafe fn unsigned(w: __m512i) -> __m512i {
    // SAFETY: AVX-512 in the kernel.
    unsafe { _mm512_xor_si512(w, _mm512_set1_epi8(-128)) }
}

impl VnniDot for W8_0 {
    const OFF: u8 = 128;

    #[inline(always)]
    unsafe fn decode2(w: *const u8) -> __m512i {
        // SAFETY: two whole blocks at `w` (caller): qs at 2..34.
        unsafe { unsigned(bytes2(w.add(2), Self::W_BYTES)) }
    }
}

impl VnniDot for W8_1 {
    const OFF: u8 = 128;

    #[inline(always)]
    unsafe fn decode2(w: *const u8) -> __m512i {
        // SAFETY: two whole blocks at `w` (caller): qs at 4..36.
        unsafe { unsigned(bytes2(w.add(4), Self::W_BYTES)) }
    }
}
