//! K-quant (Q2_K .. Q8_K) and IQ4_XS weights against Q8_K activations.
//!
//! Q2_K .. Q6_K and IQ4_XS follow llama.cpp's `vec_dot` arithmetic bit for
//! bit (`ggml_k`, `ggml_k2`: a portable kernel that emulates the AVX2
//! branch's lanes, and AVX2 kernels where written; llama.cpp has no wider
//! branch for them). Products of 8 or more rows, and repacked Q4_K weights,
//! take llama.cpp's other paths (`matmul::ggml_tiled`, `matmul::ggml_repack`).
//! Q8_K weights, which llama.cpp cannot multiply, have their own kernels
//! (`q8k`).
//!
//! Every kernel computes each super-block's integer sums exactly (for
//! activations in -127..=127, the range `quantize_row_q8_K_ref` produces),
//! so only the f32 operations decide the bits.

use super::{DotColsFn, DotFn, DotRowsFn};
use crate::qmatmul::Isa;
use rustorch_core::quant::QType;

#[cfg(target_arch = "x86_64")]
pub(in crate::qmatmul) mod cols512;
#[cfg(target_arch = "x86_64")]
pub(in crate::qmatmul) mod cols512b;
mod ggml_k;
mod ggml_k2;
mod q8k;

#[cfg(test)]
mod tests;

pub(super) fn kernel(qtype: QType, isa: Isa) -> Option<DotFn> {
    let by_type: fn(Isa) -> Option<DotFn> = match qtype {
        QType::Q2K | QType::Q3K | QType::Q4K | QType::Q5K | QType::Q6K | QType::IQ4XS => {
            return ggml_kernel(qtype, isa)
        }
        QType::Q8K => q8k::kernel,
        _ => return None,
    };
    by_type(isa)
}

/// The kernels in llama.cpp's exact order (`ggml_k`): the portable one
/// and the AVX2 one, which is also what llama.cpp runs on AVX-512 CPUs.
/// At the AVX-512 VNNI level the single-row kernel is the AVX2 one and
/// matvecs take four rows at a time (`cols_kernel`).
fn ggml_kernel(qtype: QType, isa: Isa) -> Option<DotFn> {
    let k: DotFn = match (qtype, isa) {
        (QType::Q4K, Isa::Scalar) => ggml_k::dot_q4k_scalar,
        (QType::Q5K, Isa::Scalar) => ggml_k::dot_q5k_scalar,
        (QType::Q6K, Isa::Scalar) => ggml_k::dot_q6k_scalar,
        (QType::Q2K, Isa::Scalar) => ggml_k2::dot_q2k_scalar,
        (QType::Q3K, Isa::Scalar) => ggml_k2::dot_q3k_scalar,
        (QType::IQ4XS, Isa::Scalar) => ggml_k2::dot_iq4xs_scalar,
        #[cfg(target_arch = "x86_64")]
        (QType::Q4K, Isa::Avx2 | Isa::Avx512Vnni) => ggml_k::dot_q4k_avx2,
        #[cfg(target_arch = "x86_64")]
        (QType::Q5K, Isa::Avx2 | Isa::Avx512Vnni) => ggml_k::dot_q5k_avx2,
        #[cfg(target_arch = "x86_64")]
        (QType::Q6K, Isa::Avx2 | Isa::Avx512Vnni) => ggml_k::dot_q6k_avx2,
        #[cfg(target_arch = "x86_64")]
        (QType::Q2K, Isa::Avx2 | Isa::Avx512Vnni) => ggml_k2::dot_q2k_avx2,
        #[cfg(target_arch = "x86_64")]
        (QType::Q3K, Isa::Avx2 | Isa::Avx512Vnni) => ggml_k2::dot_q3k_avx2,
        #[cfg(target_arch = "x86_64")]
        (QType::IQ4XS, Isa::Avx2 | Isa::Avx512Vnni) => ggml_k2::dot_iq4xs_avx2,
        _ => return None,
    };
    Some(k)
}

/// The four-weight-row kernel at exactly `isa`, where one exists: `out[r]`
/// equals `kernel(qtype, isa)` on `w[r]` bit for bit.
pub(super) fn cols_kernel(qtype: QType, isa: Isa) -> Option<DotColsFn> {
    let k: DotColsFn = match (qtype, isa) {
        #[cfg(target_arch = "x86_64")]
        (QType::Q4K, Isa::Avx512Vnni) => cols512::dot_cols_q4k,
        #[cfg(target_arch = "x86_64")]
        (QType::Q5K, Isa::Avx512Vnni) => cols512::dot_cols_q5k,
        #[cfg(target_arch = "x86_64")]
        (QType::Q6K, Isa::Avx512Vnni) => cols512::dot_cols_q6k,
        #[cfg(target_arch = "x86_64")]
        (QType::Q2K, Isa::Avx512Vnni) => cols512b::dot_cols_q2k,
        #[cfg(target_arch = "x86_64")]
        (QType::Q3K, Isa::Avx512Vnni) => cols512b::dot_cols_q3k,
        #[cfg(target_arch = "x86_64")]
        (QType::IQ4XS, Isa::Avx512Vnni) => cols512b::dot_cols_iq4xs,
        _ => return None,
    };
    Some(k)
}

/// The four-activation-row kernel at exactly `isa`, where one exists (none
/// today: llama.cpp's batched K-quant paths are `ggml_tiled` and
/// `ggml_repack`, and below 8 rows it runs one `vec_dot` per output).
pub(super) fn rows_kernel(qtype: QType, isa: Isa) -> Option<DotRowsFn> {
    let _ = (qtype, isa);
    None
}

/// The eight 6-bit scales and mins of a Q4_K/Q5_K block, unpacked with
/// llama.cpp's word arithmetic (`utmp`): bytes 0..8 are the scales of
/// groups 0..8, bytes 8..16 their mins.
#[inline(always)]
pub(in crate::qmatmul) fn k4_scales_mins(packed: &[u8; 12]) -> [u8; 16] {
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
