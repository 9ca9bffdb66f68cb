//! Q8_K weights (256 i8 quants, f32 `d`) against Q8_K activations.
//!
//! llama.cpp's CPU backend has no kernel for this pair; the arithmetic is
//! the obvious one: per block `d_w * d_a * sum(q_w * q_a)`.

use crate::qmatmul::kernels::DotFn;
use crate::qmatmul::Isa;
use rustorch_core::quant::blocks::{cast_blocks, BlockQ8K};

pub(super) fn kernel(isa: Isa) -> Option<DotFn> {
    match isa {
        Isa::Scalar => Some(dot_scalar),
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => Some(dot_avx2),
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512Vnni => Some(dot_avx512),
        // AMX (and other architectures): `find` falls back a level.
        _ => None,
    }
}

fn blocks<'a>(w: &'a [u8], a: &'a [u8]) -> Option<(&'a [BlockQ8K], &'a [BlockQ8K])> {
    Some((cast_blocks(w)?, cast_blocks(a)?))
}

unsafe fn dot_scalar(w: &[u8], a: &[u8]) -> f32 {
    let Some((w, a)) = blocks(w, a) else {
        return f32::NAN;
    };
    let mut sumf = 0f32;
    for (x, y) in w.iter().zip(a) {
        let isum: i32 = x.qs.iter().zip(&y.qs).map(|(&p, &q)| p as i32 * q as i32).sum();
        sumf += x.scale() * y.scale() * isum as f32;
    }
    sumf
}

/// Both operands sign-extended to i16 and multiplied with `madd`: exact
/// for every i8 (the `maddubs` sign trick would saturate at -128 * -128).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_avx2(w: &[u8], a: &[u8]) -> f32 {
    use std::arch::x86_64::*;
    let Some((w, a)) = blocks(w, a) else {
        return f32::NAN;
    };
    let mut acc = _mm256_setzero_ps();
    for (x, y) in w.iter().zip(a) {
        let mut sumi = _mm256_setzero_si256();
        for k in 0..16 {
            // SAFETY: 16 bytes at offset 16k of 256-byte arrays.
            let (p, q) = unsafe {
                (
                    _mm_loadu_si128(x.qs.as_ptr().add(16 * k).cast()),
                    _mm_loadu_si128(y.qs.as_ptr().add(16 * k).cast()),
                )
            };
            sumi = _mm256_add_epi32(
                sumi,
                _mm256_madd_epi16(_mm256_cvtepi8_epi16(p), _mm256_cvtepi8_epi16(q)),
            );
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(x.scale() * y.scale()), _mm256_cvtepi32_ps(sumi), acc);
    }
    super::hsum_float_8(acc)
}

/// Weights made unsigned (`q + 128`, an xor) for `vpdpbusd`; the extra
/// `128 * sum(q_a)` comes off through the activations' `bsums`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn dot_avx512(w: &[u8], a: &[u8]) -> f32 {
    use std::arch::x86_64::*;
    let Some((w, a)) = blocks(w, a) else {
        return f32::NAN;
    };
    let flip = _mm512_set1_epi8(-128);
    let mut acc = _mm512_setzero_ps();
    for (x, y) in w.iter().zip(a) {
        // SAFETY (all loads below): each pointer is to a field of a block
        // with at least as many bytes as the load reads; unaligned loads.
        let bsums = unsafe { _mm256_loadu_si256(y.bsums.as_ptr().cast()) };
        let offset = _mm256_slli_epi32::<7>(_mm256_madd_epi16(bsums, _mm256_set1_epi16(1)));
        let mut sumi = _mm512_zextsi256_si512(_mm256_sub_epi32(_mm256_setzero_si256(), offset));
        for k in 0..4 {
            let p = unsafe { _mm512_loadu_si512(x.qs.as_ptr().add(64 * k).cast()) };
            let q = unsafe { _mm512_loadu_si512(y.qs.as_ptr().add(64 * k).cast()) };
            sumi = _mm512_dpbusd_epi32(sumi, _mm512_xor_si512(p, flip), q);
        }
        acc = _mm512_fmadd_ps(_mm512_set1_ps(x.scale() * y.scale()), _mm512_cvtepi32_ps(sumi), acc);
    }
    _mm512_reduce_add_ps(acc)
}
