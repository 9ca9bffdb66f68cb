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
    finish::<N>(acc, wr, ar, decode)
}

/// The tail past the last whole group of `LANES` values, then a pairwise
/// reduction of the lanes: shared by every kernel so that all levels give
/// the same bits.
#[inline(always)]
fn finish<const N: usize>(mut acc: [f32; LANES], wr: &[u8], ar: &[u8], decode: impl Fn([u8; N]) -> f32) -> f32 {
    let mut tail = 0f32;
    for (wv, av) in wr.chunks_exact(N).zip(ar.chunks_exact(N)) {
        tail += decode(wv.try_into().unwrap()) * decode(av.try_into().unwrap());
    }
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
unsafe fn dot_f16_scalar(w: &[u8], a: &[u8]) -> f32 {
    dot_with::<2>(w, a, f16_le)
}

/// F16 with the hardware conversion (`vcvtph2ps`), which LLVM does not
/// emit for the portable decoder. Lane `l` of the accumulators sums values
/// `l, l + 32, ...` with fused multiply-adds, exactly as `dot_with` does,
/// and the reduction is shared, so the result is bit-identical to the
/// scalar kernel (the conversion is exact).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_f16_avx2(w: &[u8], a: &[u8]) -> f32 {
    use std::arch::x86_64::*;
    let groups = w.len().min(a.len()) / (2 * LANES);
    let mut acc = [_mm256_setzero_ps(); 4];
    for g in 0..groups {
        for (k, acc) in acc.iter_mut().enumerate() {
            let off = g * 2 * LANES + 16 * k;
            // SAFETY: off + 16 <= groups * 64 <= both lengths; unaligned loads.
            let (wv, av) = unsafe {
                (
                    _mm256_cvtph_ps(_mm_loadu_si128(w.as_ptr().add(off).cast())),
                    _mm256_cvtph_ps(_mm_loadu_si128(a.as_ptr().add(off).cast())),
                )
            };
            *acc = _mm256_fmadd_ps(wv, av, *acc);
        }
    }
    let mut lanes = [0f32; LANES];
    for (k, v) in acc.iter().enumerate() {
        // SAFETY: lanes has room for 4 x 8 floats.
        unsafe { _mm256_storeu_ps(lanes.as_mut_ptr().add(8 * k), *v) };
    }
    let done = groups * 2 * LANES;
    finish::<2>(lanes, &w[done..], &a[done..], f16_le)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn dot_f16_avx512(w: &[u8], a: &[u8]) -> f32 {
    use std::arch::x86_64::*;
    let groups = w.len().min(a.len()) / (2 * LANES);
    let mut acc = [_mm512_setzero_ps(); 2];
    for g in 0..groups {
        for (k, acc) in acc.iter_mut().enumerate() {
            let off = g * 2 * LANES + 32 * k;
            // SAFETY: off + 32 <= groups * 64 <= both lengths; unaligned loads.
            let (wv, av) = unsafe {
                (
                    _mm512_cvtph_ps(_mm256_loadu_si256(w.as_ptr().add(off).cast())),
                    _mm512_cvtph_ps(_mm256_loadu_si256(a.as_ptr().add(off).cast())),
                )
            };
            *acc = _mm512_fmadd_ps(wv, av, *acc);
        }
    }
    let mut lanes = [0f32; LANES];
    for (k, v) in acc.iter().enumerate() {
        // SAFETY: lanes has room for 2 x 16 floats.
        unsafe { _mm512_storeu_ps(lanes.as_mut_ptr().add(16 * k), *v) };
    }
    let done = groups * 2 * LANES;
    finish::<2>(lanes, &w[done..], &a[done..], f16_le)
}
float_kernels!(2, bf16_le, dot_bf16_scalar, dot_bf16_avx2, dot_bf16_avx512);

#[cfg(test)]
mod tests {
    use super::*;

    /// The F16C kernels keep the portable kernel's lanes and reduction, so
    /// every level must give the same bits, for lengths with and without a
    /// tail, including infinities and subnormal halves.
    #[test]
    fn f16_levels_are_bit_identical_to_scalar() {
        let mut s = 0x1234_5678_9abc_def1u64;
        let mut bits = || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            // Mostly moderate values; every 97th an arbitrary bit pattern
            // other than NaN (subnormals, infinities, extremes).
            let h = if s.is_multiple_of(97) {
                (s >> 16) as u16
            } else {
                0x3000 | ((s >> 20) as u16 & 0x0fff) ^ ((s as u16) & 0x8000)
            };
            if (h & 0x7c00) == 0x7c00 && (h & 0x3ff) != 0 {
                0x3c00
            } else {
                h
            }
        };
        for n in [1usize, 31, 32, 33, 64, 100, 4096 + 17] {
            let w: Vec<u8> = (0..n).flat_map(|_| bits().to_le_bytes()).collect();
            let a: Vec<u8> = (0..n).flat_map(|_| bits().to_le_bytes()).collect();
            // SAFETY: matching rows; each level is called only when available.
            let want = unsafe { dot_f16_scalar(&w, &a) };
            for isa in [Isa::Avx2, Isa::Avx512Vnni].into_iter().filter(|i| i.is_available()) {
                let got = unsafe { kernel(QType::F16, isa).expect("f16 kernel")(&w, &a) };
                assert_eq!(got.to_bits(), want.to_bits(), "{isa} n={n}: {got} vs {want}");
            }
        }
    }
}
