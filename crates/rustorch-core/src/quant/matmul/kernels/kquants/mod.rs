//! K-quant (Q2_K .. Q8_K) and IQ4_XS weights against Q8_K activations.
//!
//! One module per weight type, each with three kernels:
//! - scalar: llama.cpp's generic `ggml_vec_dot_*_q8_K` arithmetic (the same
//!   integer sums and the same f32 lanes and order);
//! - AVX2: the structure of llama.cpp's x86 kernels (`maddubs` products of
//!   unsigned weights and signed activations, `madd` with the 16-bit scales
//!   of each 16- or 32-value group), with the same f32 accumulation;
//! - AVX-512 VNNI: `vpdpbusd` (u8 x i8, four products per i32 lane, no
//!   saturation) on 64 values at a time, then the group scales applied with
//!   `vpdpwssd` (see `avx512`), or `vpmulld` where a lane can leave i16.
//!
//! The min and offset terms use the activations' `bsums` (sums of 16
//! quants), as llama.cpp does: `sum -= dmin * sum(mins * bsums)`.
//!
//! Every kernel computes each super-block's integer sums exactly (for
//! activations in -127..=127, the range `quantize_row_q8_K_ref` produces;
//! the AVX2 IQ4_XS kernel, like llama.cpp's, needs that range, the others
//! are exact for any i8), so levels differ only in how the per-block f32
//! terms are added.

use super::{DotFn, DotRowsFn};
use crate::quant::matmul::Isa;
use crate::quant::QType;

mod ggml_k;
mod iq4xs;
mod q2k;
mod q3k;
mod q8k;

#[cfg(test)]
mod tests;

pub(super) fn kernel(qtype: QType, isa: Isa) -> Option<DotFn> {
    let by_type: fn(Isa) -> Option<DotFn> = match qtype {
        QType::Q2K => q2k::kernel,
        QType::Q3K => q3k::kernel,
        QType::Q4K | QType::Q5K | QType::Q6K => return ggml_kernel(qtype, isa),
        QType::Q8K => q8k::kernel,
        QType::IQ4XS => iq4xs::kernel,
        _ => return None,
    };
    by_type(isa)
}

/// The kernels in llama.cpp's exact order (`ggml_k`): the portable one
/// and the AVX2 one, which is also what llama.cpp runs on AVX-512 CPUs.
fn ggml_kernel(qtype: QType, isa: Isa) -> Option<DotFn> {
    let k: DotFn = match (qtype, isa) {
        (QType::Q4K, Isa::Scalar) => ggml_k::dot_q4k_scalar,
        (QType::Q5K, Isa::Scalar) => ggml_k::dot_q5k_scalar,
        (QType::Q6K, Isa::Scalar) => ggml_k::dot_q6k_scalar,
        #[cfg(target_arch = "x86_64")]
        (QType::Q4K, Isa::Avx2) => ggml_k::dot_q4k_avx2,
        #[cfg(target_arch = "x86_64")]
        (QType::Q5K, Isa::Avx2) => ggml_k::dot_q5k_avx2,
        #[cfg(target_arch = "x86_64")]
        (QType::Q6K, Isa::Avx2) => ggml_k::dot_q6k_avx2,
        _ => return None,
    };
    Some(k)
}

/// The four-activation-row kernel at exactly `isa`, where one exists.
pub(super) fn rows_kernel(qtype: QType, isa: Isa) -> Option<DotRowsFn> {
    let _ = (qtype, isa);
    None
}

/// The eight 6-bit scales and mins of a Q4_K/Q5_K block, unpacked with
/// llama.cpp's word arithmetic (`utmp`): bytes 0..8 are the scales of
/// groups 0..8, bytes 8..16 their mins.
#[inline(always)]
fn k4_scales_mins(packed: &[u8; 12]) -> [u8; 16] {
    const KMASK1: u32 = 0x3f3f_3f3f;
    const KMASK2: u32 = 0x0f0f_0f0f;
    const KMASK3: u32 = 0x0303_0303;
    let word = |i: usize| u32::from_le_bytes([packed[4 * i], packed[4 * i + 1], packed[4 * i + 2], packed[4 * i + 3]]);
    let (u0, u1, u2) = (word(0), word(1), word(2));
    let u3 = ((u2 >> 4) & KMASK2) | (((u1 >> 6) & KMASK3) << 4);
    let mins_lo = u1 & KMASK1;
    let sc_hi = (u2 & KMASK2) | (((u0 >> 6) & KMASK3) << 4);
    let sc_lo = u0 & KMASK1;
    let mut out = [0u8; 16];
    for (i, w) in [sc_lo, sc_hi, mins_lo, u3].into_iter().enumerate() {
        out[4 * i..4 * i + 4].copy_from_slice(&w.to_le_bytes());
    }
    out
}

/// The sixteen signed scales of a Q3_K block (`scale - 32`), unpacked with
/// llama.cpp's word arithmetic.
#[inline(always)]
fn q3k_scales(packed: &[u8; 12]) -> [i8; 16] {
    const KMASK1: u32 = 0x0303_0303;
    const KMASK2: u32 = 0x0f0f_0f0f;
    let word = |i: usize| u32::from_le_bytes([packed[4 * i], packed[4 * i + 1], packed[4 * i + 2], packed[4 * i + 3]]);
    let (a0, a1, tmp) = (word(0), word(1), word(2));
    let words = [
        (a0 & KMASK2) | ((tmp & KMASK1) << 4),
        (a1 & KMASK2) | (((tmp >> 2) & KMASK1) << 4),
        ((a0 >> 4) & KMASK2) | (((tmp >> 4) & KMASK1) << 4),
        ((a1 >> 4) & KMASK2) | (((tmp >> 6) & KMASK1) << 4),
    ];
    let mut out = [0i8; 16];
    for (i, w) in words.into_iter().enumerate() {
        for (k, b) in w.to_le_bytes().into_iter().enumerate() {
            out[4 * i + k] = b as i8 - 32;
        }
    }
    out
}

/// The `pshufb` control word (as an i16 to broadcast) that copies i16
/// element `e` of each 128-bit lane to every element.
#[inline(always)]
fn word(e: usize) -> i16 {
    (((2 * e + 1) << 8) | (2 * e)) as i16
}

/// Sum of the 8 lanes as llama.cpp's `hsum_float_8`: high half plus low
/// half, then pairs, then the last two.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
fn hsum_float_8(x: std::arch::x86_64::__m256) -> f32 {
    use std::arch::x86_64::*;
    let mut res = _mm256_extractf128_ps::<1>(x);
    res = _mm_add_ps(res, _mm256_castps256_ps128(x));
    res = _mm_add_ps(res, _mm_movehl_ps(res, res));
    res = _mm_add_ss(res, _mm_movehdup_ps(res));
    _mm_cvtss_f32(res)
}

/// Shared pieces of the AVX-512 VNNI kernels.
///
/// `vpdpbusd` leaves in each i32 lane the sum of four u8 x i8 products.
/// With weights below 64 and activations in -128..=127 that sum has
/// magnitude at most 4 * 63 * 128 = 32256, so it fits in the low i16 of
/// the lane (the high i16 is its sign extension). `vpdpwssd` against a
/// vector whose i32 lanes hold `(scale as i16, 0)` then adds exactly
/// `lane * scale` to an i32 accumulator: one instruction applies a group
/// scale, where AVX2 needs `maddubs` + `madd` + `add`.
#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    /// i32 lanes `(scales[lane] as i16, 0)` for the 16 signed scales, the
    /// operand `vpdpwssd` needs (see the module comment).
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    pub(super) fn scales_i8_to_dpwssd(scales: __m128i) -> __m512i {
        _mm512_cvtepu16_epi32(_mm256_cvtepi8_epi16(scales))
    }

    /// Index vector for `_mm512_permutexvar_epi32` that repeats each of
    /// the lanes `first..first + 16 / reps` of a vector `reps` times.
    pub(super) const fn spread(first: i32, reps: i32) -> [i32; 16] {
        let mut idx = [0i32; 16];
        let mut l = 0;
        while l < 16 {
            idx[l] = first + l as i32 / reps;
            l += 1;
        }
        idx
    }

    /// `_mm512_permutexvar_epi32` with a constant index array.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    pub(super) fn permute(v: __m512i, idx: &[i32; 16]) -> __m512i {
        // SAFETY: `idx` is 64 readable bytes; unaligned loads are allowed.
        let idx = unsafe { _mm512_loadu_si512(idx.as_ptr().cast()) };
        _mm512_permutexvar_epi32(idx, v)
    }
}
