//! F32, F16 and BF16 weights against activations in the same type (as
//! llama.cpp pairs them), accumulated in f32.

use super::DotFn;
use crate::quant::blocks::f16_bits_to_f32;
use crate::quant::matmul::Isa;
use crate::quant::QType;

pub(super) fn kernel(qtype: QType, isa: Isa) -> Option<DotFn> {
    // One portable body each; the SIMD levels are the same code compiled
    // with the wider instruction set so that LLVM vectorizes it.
    match (qtype, isa) {
        (QType::F32, Isa::Scalar) => Some(dot_f32_scalar),
        (QType::F16, Isa::Scalar) => Some(dot_f16_scalar),
        (QType::BF16, Isa::Scalar) => Some(dot_bf16_scalar),
        #[cfg(target_arch = "x86_64")]
        (QType::F32, Isa::Avx2) => Some(dot_f32_avx2),
        #[cfg(target_arch = "x86_64")]
        (QType::F16, Isa::Avx2) => Some(dot_f16_avx2),
        #[cfg(target_arch = "x86_64")]
        (QType::BF16, Isa::Avx2) => Some(dot_bf16_avx2),
        #[cfg(target_arch = "x86_64")]
        (QType::F32, Isa::Avx512Vnni) => Some(dot_f32_avx512),
        #[cfg(target_arch = "x86_64")]
        (QType::F16, Isa::Avx512Vnni) => Some(dot_f16_avx512),
        #[cfg(target_arch = "x86_64")]
        (QType::BF16, Isa::Avx512Vnni) => Some(dot_bf16_avx512),
        _ => None,
    }
}

/// Lanes summed independently and reduced at the end, so that the loop
/// vectorizes without reassociating floating-point sums.
const LANES: usize = 32;

#[inline(always)]
fn dot_with<const N: usize>(w: &[u8], a: &[u8], decode: impl Fn([u8; N]) -> f32) -> f32 {
    let mut acc = [0f32; LANES];
    let wc = w.chunks_exact(N * LANES);
    let ac = a.chunks_exact(N * LANES);
    let (wr, ar) = (wc.remainder(), ac.remainder());
    for (wb, ab) in wc.zip(ac) {
        for l in 0..LANES {
            let wv = decode(wb[l * N..l * N + N].try_into().unwrap());
            let av = decode(ab[l * N..l * N + N].try_into().unwrap());
            acc[l] = wv.mul_add(av, acc[l]);
        }
    }
    let mut tail = 0f32;
    for (wv, av) in wr.chunks_exact(N).zip(ar.chunks_exact(N)) {
        tail += decode(wv.try_into().unwrap()) * decode(av.try_into().unwrap());
    }
    // Pairwise reduction of the lanes.
    let mut width = LANES;
    while width > 1 {
        width /= 2;
        for l in 0..width {
            acc[l] += acc[l + width];
        }
    }
    acc[0] + tail
}

#[inline(always)]
fn f32_le(b: [u8; 4]) -> f32 {
    f32::from_le_bytes(b)
}

#[inline(always)]
fn f16_le(b: [u8; 2]) -> f32 {
    f16_bits_to_f32(u16::from_le_bytes(b))
}

#[inline(always)]
fn bf16_le(b: [u8; 2]) -> f32 {
    f32::from_bits((u16::from_le_bytes(b) as u32) << 16)
}

macro_rules! float_kernels {
    ($n:literal, $decode:ident, $scalar:ident, $avx2:ident, $avx512:ident) => {
        unsafe fn $scalar(w: &[u8], a: &[u8]) -> f32 {
            dot_with::<$n>(w, a, $decode)
        }
        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn $avx2(w: &[u8], a: &[u8]) -> f32 {
            dot_with::<$n>(w, a, $decode)
        }
        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
        unsafe fn $avx512(w: &[u8], a: &[u8]) -> f32 {
            dot_with::<$n>(w, a, $decode)
        }
    };
}

float_kernels!(4, f32_le, dot_f32_scalar, dot_f32_avx2, dot_f32_avx512);
float_kernels!(2, f16_le, dot_f16_scalar, dot_f16_avx2, dot_f16_avx512);
float_kernels!(2, bf16_le, dot_bf16_scalar, dot_bf16_avx2, dot_bf16_avx512);
