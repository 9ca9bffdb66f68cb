//! Q4_0, Q4_1, Q5_0 and Q5_1 weights (and Q8_0 matvecs) in llama.cpp's
//! exact x86 order.
//!
//! `ggml_vec_dot_{q4_0,q5_0}_q8_0` and `ggml_vec_dot_{q4_1,q5_1}_q8_1`
//! (arch/x86/quants.c, AVX2 branch) and tinyBLAS_Q0_AVX (Q4_0 and Q5_0 at
//! m >= 2) all compute an output as ggml_q8_0 describes: eight f32 lanes,
//! lane l = `fma(d_w * d_a, sum of products 4l..4l+3, lane)` per block,
//! then `hsum`. The types with an offset add `summs = fma(m_w, s_a, summs)`
//! per block (GCC contracts llama.cpp's `summs += m * s` into
//! `vfmadd231ss`; seen in libggml-cpu.so) and return `hsum + summs`.
//! The integer sums are exact at every level, so only this float order
//! decides the bits. (Q4_0 weights with rows % 8 == 0 are repacked by
//! llama.cpp and take another path.)

use super::{Layout, WIq4Nl, W4_0, W4_1, W5_0, W5_1};
use rustorch_core::quant::blocks::{f16_to_f32, KVALUES_IQ4NL};

/// llama.cpp's `hsum` of eight f32 lanes (`hsum_float_8`).
#[inline(always)]
pub(super) fn reduce8(acc: [f32; 8]) -> f32 {
    let r: [f32; 4] = std::array::from_fn(|i| acc[4 + i] + acc[i]);
    (r[0] + r[2]) + (r[1] + r[3])
}

/// A weight type's quants as signed integers, in element order.
pub(super) trait Decode: Layout {
    fn quants(block: &[u8]) -> [i32; 32];
}

fn nibbles(qs: &[u8], off: i32) -> [i32; 32] {
    std::array::from_fn(|j| {
        if j < 16 {
            (qs[j] & 0x0F) as i32 - off
        } else {
            (qs[j - 16] >> 4) as i32 - off
        }
    })
}

fn fives(qh: &[u8], qs: &[u8], off: i32) -> [i32; 32] {
    let h = u32::from_le_bytes([qh[0], qh[1], qh[2], qh[3]]);
    let n = nibbles(qs, 0);
    std::array::from_fn(|j| n[j] | (((h >> j) & 1) as i32) << 4).map(|q| q - off)
}

impl Decode for W4_0 {
    fn quants(b: &[u8]) -> [i32; 32] {
        nibbles(&b[2..18], 8)
    }
}
impl Decode for W4_1 {
    fn quants(b: &[u8]) -> [i32; 32] {
        nibbles(&b[4..20], 0)
    }
}
impl Decode for W5_0 {
    fn quants(b: &[u8]) -> [i32; 32] {
        fives(&b[2..6], &b[6..22], 16)
    }
}
impl Decode for W5_1 {
    fn quants(b: &[u8]) -> [i32; 32] {
        fives(&b[4..8], &b[8..24], 0)
    }
}

impl Decode for WIq4Nl {
    fn quants(b: &[u8]) -> [i32; 32] {
        nibbles(&b[2..18], 0).map(|q| KVALUES_IQ4NL[q as usize] as i32)
    }
}

#[inline(always)]
fn f16_at(b: &[u8], at: usize) -> f32 {
    f16_to_f32([b[at], b[at + 1]])
}

/// Portable version of the order above.
///
/// # Safety
/// None beyond the `DotFn` contract (it is `unsafe` only to share its type).
pub(super) unsafe fn dot_scalar<T: Decode>(w: &[u8], a: &[u8]) -> f32 {
    let Some(nb) = super::blocks::<T>(w, a) else {
        return f32::NAN;
    };
    let mut acc = [0f32; 8];
    let mut summs = 0f32;
    for i in 0..nb {
        let x = &w[i * T::W_BYTES..(i + 1) * T::W_BYTES];
        let y = &a[i * T::A_BYTES..(i + 1) * T::A_BYTES];
        let q = T::quants(x);
        let yq = &y[T::A_QS..T::A_QS + 32];
        let d = f16_at(x, 0) * f16_at(y, 0);
        for (l, lane) in acc.iter_mut().enumerate() {
            let s: i32 = (0..4).map(|t| q[4 * l + t] * yq[4 * l + t] as i8 as i32).sum();
            *lane = d.mul_add(s as f32, *lane);
        }
        if T::MIN {
            summs = f16_at(x, 2).mul_add(f16_at(y, 2), summs);
        }
    }
    if T::MIN {
        reduce8(acc) + summs
    } else {
        reduce8(acc)
    }
}

#[cfg(target_arch = "x86_64")]
pub(super) use simd::{dot_avx2, dot_rows_avx2};

#[cfg(target_arch = "x86_64")]
mod simd {
    use super::super::avx2::{u16_at, Avx2Dot};
    use super::super::blocks;
    use super::reduce8;
    use std::arch::x86_64::*;

    #[inline(always)]
    unsafe fn hsum8(v: __m256) -> f32 {
        let mut lanes = [0f32; 8];
        // SAFETY: `lanes` holds eight f32 values; AVX in every caller.
        unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), v) };
        reduce8(lanes)
    }

    /// The f16 values in the low and high 16 bits of `h`, converted by
    /// F16C (`vcvtph2ps`; exact, as every f16 conversion is). Both come
    /// from one zeroing `vmovd`: a lone u16 would be inserted into a
    /// stale register (`vpinsrw`), a false dependency on the accumulator.
    #[inline(always)]
    fn f16x2(h: u64) -> (f32, f32) {
        // SAFETY: only called from kernels with F16C enabled.
        unsafe {
            let v = _mm_cvtph_ps(_mm_cvtsi32_si128(h as u32 as i32));
            (_mm_cvtss_f32(v), _mm_cvtss_f32(_mm_movehdup_ps(v)))
        }
    }

    /// # Safety
    /// AVX2, FMA and F16C must be available (`Isa::Avx2`).
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(in super::super) unsafe fn dot_avx2<T: Avx2Dot>(w: &[u8], a: &[u8]) -> f32 {
        let Some(nb) = blocks::<T>(w, a) else {
            return f32::NAN;
        };
        let (wp, ap) = (w.as_ptr(), a.as_ptr());
        let mut acc = _mm256_setzero_ps();
        let mut summs = 0f32;
        for i in 0..nb {
            // SAFETY: block i < nb of both rows (`blocks`).
            unsafe {
                let (wb, ab) = (wp.add(i * T::W_BYTES), ap.add(i * T::A_BYTES));
                let (dw, da) = f16x2(u16_at(wb) | u16_at(ab) << 16);
                let d = dw * da;
                let p = T::block(wb, _mm256_loadu_si256(ab.add(T::A_QS).cast()));
                acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(p), acc);
                if T::MIN {
                    let (m, s) = f16x2(u16_at(wb.add(2)) | u16_at(ab.add(2)) << 16);
                    summs = m.mul_add(s, summs);
                }
            }
        }
        // SAFETY: AVX enabled above.
        let h = unsafe { hsum8(acc) };
        if T::MIN {
            h + summs
        } else {
            h
        }
    }

    /// One weight row against four activation rows, each output exactly
    /// as `dot_avx2` computes it (the same block products, scales and
    /// order), with each weight block decoded once for the four: a
    /// batch's kernel where AVX-512 VNNI is missing (decoding a Q5 block's
    /// high bits again for every activation row was most of a prompt's
    /// product). Rows that do not match give NaN.
    ///
    /// # Safety
    /// AVX2, FMA and F16C must be available (`Isa::Avx2`).
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(in super::super) unsafe fn dot_rows_avx2<T: Avx2Dot>(w: &[u8], a: [&[u8]; 4], out: &mut [f32; 4]) {
        let Some(nb) = blocks::<T>(w, a[0]).filter(|&nb| a.iter().all(|r| blocks::<T>(w, r) == Some(nb))) else {
            *out = [f32::NAN; 4];
            return;
        };
        let wp = w.as_ptr();
        let mut acc = [_mm256_setzero_ps(); 4];
        let mut summs = [0f32; 4];
        for i in 0..nb {
            // SAFETY: block i < nb of every row (`blocks`).
            unsafe {
                let wb = wp.add(i * T::W_BYTES);
                let u = T::decode(wb);
                for r in 0..4 {
                    let ab = a[r].as_ptr().add(i * T::A_BYTES);
                    let (dw, da) = f16x2(u16_at(wb) | u16_at(ab) << 16);
                    let p = T::mul(u, _mm256_loadu_si256(ab.add(T::A_QS).cast()));
                    acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(dw * da), _mm256_cvtepi32_ps(p), acc[r]);
                    if T::MIN {
                        let (m, s) = f16x2(u16_at(wb.add(2)) | u16_at(ab.add(2)) << 16);
                        summs[r] = m.mul_add(s, summs[r]);
                    }
                }
            }
        }
        for r in 0..4 {
            // SAFETY: AVX enabled above.
            let h = unsafe { hsum8(acc[r]) };
            out[r] = if T::MIN { h + summs[r] } else { h };
        }
    }
}
