//! GGML's f16 vector helpers (`ggml_vec_mad_f16`, `ggml_vec_scale_f16`),
//! which compute differently depending on the CPU llama.cpp was built for.
//!
//! Flash attention's one-row path keeps its value accumulator in f16 and
//! updates it with these two helpers (ops.cpp). Their vector steps come
//! from `simd-mappings.h`:
//!
//! - **Widened** (every x86 build without AVX512-FP16, such as a native
//!   build on AMD Zen 4): each element widened to f32, one f32 FMA
//!   (`y + x * v`) or product (`y * v`) with the scalar `v` in f32, rounded
//!   to f16.
//! - **Native** (a build with `__AVX512FP16__`: `-march=native` on Intel
//!   Sapphire Rapids and later): the scalar rounded to f16 first, then one
//!   half-precision FMA or product per element, rounded once
//!   (`_mm512_fmadd_ph`, `_mm512_mul_ph`), in steps of `GGML_F16_STEP` =
//!   128 elements. Elements past the last whole step take the scalar tail,
//!   which is the widened arithmetic. So heads of 64 values are computed
//!   alike on both builds and heads of 128 or 256 (Gemma 3) are not.
//!
//! The native arithmetic is emulated exactly with f32 operations (no FP16
//! instructions needed): a product of two f16 values is exact in f32, the
//! sum with the accumulator is formed with its rounding error (TwoSum) and
//! rounded to odd, and one rounding of that to f16 is then the correctly
//! rounded half-precision FMA (f32 carries more than the two extra bits
//! that rounding to odd needs). The tests check it against exact integer
//! arithmetic, and against the CPU's own `vfmadd231sh` where it has one.
//!
//! Which arithmetic runs is a process-wide choice, like the product order
//! (`quant::matmul::ggml_order`): `RUSTORCH_GGML_F16=widened|native`, else
//! what `set_default_ggml_half` chose (`rustorch-cli` passes
//! `GgmlHalf::native()`, the CPU's own build), else `Widened`, the
//! library's default on every CPU, which the committed fixtures assume.

use half::f16;
use std::sync::OnceLock;

/// GGML's `GGML_F16_STEP` with AVX512-FP16: the native steps cover the
/// first `n & !(STEP - 1)` elements.
pub(crate) const NATIVE_STEP: usize = 128;

/// How llama.cpp's f16 vector helpers round (see the module comment).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GgmlHalf {
    /// f32 arithmetic, rounded to f16 (builds without AVX512-FP16).
    Widened,
    /// Half-precision arithmetic (builds with AVX512-FP16).
    Native,
}

impl GgmlHalf {
    /// `RUSTORCH_GGML_F16`'s values: `widened` or `native`.
    pub fn parse(s: &str) -> Option<GgmlHalf> {
        match s.to_ascii_lowercase().as_str() {
            "widened" | "f32" => Some(GgmlHalf::Widened),
            "native" | "fp16" | "avx512fp16" => Some(GgmlHalf::Native),
            _ => None,
        }
    }

    /// What llama.cpp built natively on this CPU does: `-march=native`
    /// defines `__AVX512FP16__` exactly where the CPU has AVX512-FP16.
    pub fn native() -> GgmlHalf {
        #[cfg(target_arch = "x86_64")]
        if is_x86_feature_detected!("avx512fp16") {
            return GgmlHalf::Native;
        }
        GgmlHalf::Widened
    }

    /// One line for `rustorch-cli devices`.
    pub fn describe(self) -> &'static str {
        match self {
            GgmlHalf::Widened => "widened (f32 steps rounded to f16, builds without AVX512-FP16)",
            GgmlHalf::Native => "native (half-precision steps, builds with AVX512-FP16)",
        }
    }
}

static HALF: OnceLock<GgmlHalf> = OnceLock::new();

/// This process's f16 arithmetic, fixed at its first read:
/// `RUSTORCH_GGML_F16`, else what `set_default_ggml_half` chose, else
/// `Widened` (an unknown value reads as the default; `rustorch-cli` rejects
/// it first).
pub fn ggml_half() -> GgmlHalf {
    *HALF.get_or_init(|| env_half().unwrap_or(GgmlHalf::Widened))
}

fn env_half() -> Option<GgmlHalf> {
    std::env::var("RUSTORCH_GGML_F16")
        .ok()
        .and_then(|v| GgmlHalf::parse(&v))
}

/// Makes `half` this process's arithmetic where `RUSTORCH_GGML_F16` does not
/// name one. Call it before any attention runs; afterwards it no longer
/// changes, and this returns false.
pub fn set_default_ggml_half(half: GgmlHalf) -> bool {
    HALF.set(env_half().unwrap_or(half)).is_ok()
}

/// `f16(x * s + y)` with one rounding, as `vfmadd231ph` computes it, for f16
/// values `x`, `s`, `y` given widened.
#[inline]
pub(crate) fn fma_half(x: f32, s: f32, y: f32) -> f32 {
    // Exact: two 11-bit significands make at most 22 bits, and the
    // smallest product (2^-48) is far above f32's normal range's floor.
    let p = x * s;
    let sum = p + y;
    // TwoSum: `sum + err` is `p + y` exactly.
    let pb = sum - p;
    let err = (p - (sum - pb)) + (y - pb);
    f16::from_f32(round_to_odd(sum, err)).to_f32()
}

/// `sum` moved to its odd neighbour on the side of `err` when `sum` is
/// inexact and even, so that one later rounding to a format with fewer
/// bits is the correct rounding of `sum + err`.
#[inline]
fn round_to_odd(sum: f32, err: f32) -> f32 {
    let bits = sum.to_bits();
    if err == 0.0 || bits & 1 == 1 {
        return sum;
    }
    // Same sign: the exact value lies further from zero, the next
    // magnitude up; else the next magnitude down.
    if (bits ^ err.to_bits()) >> 31 == 0 {
        f32::from_bits(bits + 1)
    } else {
        f32::from_bits(bits - 1)
    }
}

/// `f16(y * s)` with one rounding (`vmulph`): the product is exact in f32.
#[inline]
pub(crate) fn mul_half(y: f32, s: f32) -> f32 {
    f16::from_f32(y * s).to_f32()
}

/// `ggml_vec_mad_f16` on an accumulator of f16 values kept widened:
/// `acc[i] = f16(acc[i] + v[i] * s)`.
pub(crate) fn mad_f16(acc: &mut [f32], v: &[f16], s: f32, half: GgmlHalf) {
    debug_assert!(v.len() >= acc.len());
    let native = match half {
        GgmlHalf::Native => acc.len() & !(NATIVE_STEP - 1),
        GgmlHalf::Widened => 0,
    };
    let (head, tail) = acc.split_at_mut(native);
    if !head.is_empty() {
        // `_mm512_set1_ph((_Float16) v)`: the scalar rounded to nearest.
        let s16 = f16::from_f32(s).to_f32();
        #[cfg(target_arch = "x86_64")]
        if super::has_avx512() {
            // SAFETY: AVX-512 F and F16C are present (checked above); `v`
            // holds a value per element of `head`.
            unsafe { avx512::mad_native(head, v, s16) };
        } else {
            mad_native_scalar(head, v, s16);
        }
        #[cfg(not(target_arch = "x86_64"))]
        mad_native_scalar(head, v, s16);
    }
    mad_widened(tail, &v[native..], s);
}

fn mad_native_scalar(acc: &mut [f32], v: &[f16], s16: f32) {
    for (a, &x) in acc.iter_mut().zip(v) {
        *a = fma_half(x.to_f32(), s16, *a);
    }
}

/// The widened steps (and every build's scalar tail): one f32 FMA, rounded.
fn mad_widened(acc: &mut [f32], v: &[f16], s: f32) {
    #[cfg(target_arch = "x86_64")]
    if acc.len().is_multiple_of(16) && super::has_avx512() {
        // SAFETY: AVX-512 F and F16C are present (checked above); `v`
        // holds a value per element.
        unsafe { avx512::mad_widened(acc, v, s) };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if acc.len().is_multiple_of(8) && super::has_avx2_fma_f16c() {
        // SAFETY: AVX2, FMA and F16C are present (checked above); `v`
        // holds a value per element.
        unsafe { avx2::mad_widened(acc, v, s) };
        return;
    }
    for (a, &x) in acc.iter_mut().zip(v) {
        *a = f16::from_f32(x.to_f32().mul_add(s, *a)).to_f32();
    }
}

/// `ggml_vec_scale_f16` on that accumulator: `acc[i] = f16(acc[i] * s)`.
pub(crate) fn scale_f16(acc: &mut [f32], s: f32, half: GgmlHalf) {
    let native = match half {
        GgmlHalf::Native => acc.len() & !(NATIVE_STEP - 1),
        GgmlHalf::Widened => 0,
    };
    let (head, tail) = acc.split_at_mut(native);
    if !head.is_empty() {
        let s16 = f16::from_f32(s).to_f32();
        for a in head {
            *a = mul_half(*a, s16);
        }
    }
    #[cfg(target_arch = "x86_64")]
    if tail.len().is_multiple_of(8) && super::has_avx2_fma_f16c() {
        // SAFETY: AVX2 and F16C are present (checked above).
        unsafe { avx2::scale_widened(tail, s) };
        return;
    }
    for a in tail {
        *a = f16::from_f32(*a * s).to_f32();
    }
}

/// The widened steps 8 lanes at a time, for CPUs without AVX-512 (the
/// scalar loops' bits: one f32 FMA or product, rounded to f16 to nearest
/// even; the scalar loops called libm's `fmaf` and converted each element
/// on its own, a third of a decode step's time on an AVX2-only EPYC).
#[cfg(target_arch = "x86_64")]
mod avx2 {
    use half::f16;
    use std::arch::x86_64::*;

    /// `acc[e] = f16(v[e] * s + acc[e])`.
    ///
    /// # Safety
    /// AVX2, FMA and F16C; `acc.len()` a multiple of 8, `v` at least as long.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn mad_widened(acc: &mut [f32], v: &[f16], s: f32) {
        debug_assert!(v.len() >= acc.len());
        let sv = _mm256_set1_ps(s);
        for (i, a) in acc.chunks_exact_mut(8).enumerate() {
            let x = _mm256_cvtph_ps(_mm_loadu_si128(v.as_ptr().add(8 * i).cast()));
            let y = _mm256_fmadd_ps(x, sv, _mm256_loadu_ps(a.as_ptr()));
            let r = _mm256_cvtph_ps(_mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(y));
            _mm256_storeu_ps(a.as_mut_ptr(), r);
        }
    }

    /// `acc[e] = f16(acc[e] * s)`.
    ///
    /// # Safety
    /// AVX2 and F16C; `acc.len()` a multiple of 8.
    #[target_feature(enable = "avx2,f16c")]
    pub(super) unsafe fn scale_widened(acc: &mut [f32], s: f32) {
        let sv = _mm256_set1_ps(s);
        for a in acc.chunks_exact_mut(8) {
            let y = _mm256_mul_ps(_mm256_loadu_ps(a.as_ptr()), sv);
            let r = _mm256_cvtph_ps(_mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(y));
            _mm256_storeu_ps(a.as_mut_ptr(), r);
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use half::f16;
    use std::arch::x86_64::*;

    /// `acc[e] = f16(v[e] * s + acc[e])` (one f32 FMA, then f16 rounding),
    /// the widened steps.
    ///
    /// # Safety
    /// AVX-512 F and F16C; `acc.len()` a multiple of 16, `v` at least as
    /// long.
    #[target_feature(enable = "avx512f,fma,f16c")]
    pub(super) unsafe fn mad_widened(acc: &mut [f32], v: &[f16], s: f32) {
        debug_assert!(v.len() >= acc.len());
        let sv = _mm512_set1_ps(s);
        for (i, a) in acc.chunks_exact_mut(16).enumerate() {
            let x = _mm512_cvtph_ps(_mm256_loadu_si256(v.as_ptr().add(16 * i).cast()));
            let y = _mm512_fmadd_ps(x, sv, _mm512_loadu_ps(a.as_ptr()));
            let r = _mm512_cvtph_ps(_mm512_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(y));
            _mm512_storeu_ps(a.as_mut_ptr(), r);
        }
    }

    /// `fma_half` on 16 lanes at a time: `acc[e] = f16(v[e] * s16 + acc[e])`
    /// with one rounding.
    ///
    /// # Safety
    /// AVX-512 F and F16C; `acc.len()` a multiple of 16, `v` at least as
    /// long; `s16` an f16 value.
    #[target_feature(enable = "avx512f,f16c")]
    pub(super) unsafe fn mad_native(acc: &mut [f32], v: &[f16], s16: f32) {
        debug_assert!(v.len() >= acc.len() && acc.len().is_multiple_of(16));
        let sv = _mm512_set1_ps(s16);
        let one = _mm512_set1_epi32(1);
        for (i, a) in acc.chunks_exact_mut(16).enumerate() {
            let x = _mm512_cvtph_ps(_mm256_loadu_si256(v.as_ptr().add(16 * i).cast()));
            let y = _mm512_loadu_ps(a.as_ptr());
            let p = _mm512_mul_ps(x, sv);
            let sum = _mm512_add_ps(p, y);
            let pb = _mm512_sub_ps(sum, p);
            let err = _mm512_add_ps(_mm512_sub_ps(p, _mm512_sub_ps(sum, pb)), _mm512_sub_ps(y, pb));
            // Round to odd: inexact lanes with an even significand step one
            // unit towards the error's side.
            let bits = _mm512_castps_si512(sum);
            let inexact = _mm512_cmp_ps_mask::<_CMP_NEQ_OQ>(err, _mm512_setzero_ps());
            let even = _mm512_testn_epi32_mask(bits, one);
            let away = _mm512_srli_epi32::<31>(_mm512_xor_si512(bits, _mm512_castps_si512(err)));
            // +1 where the signs agree (away is 0), -1 where they differ.
            let step = _mm512_sub_epi32(one, _mm512_slli_epi32::<1>(away));
            let odd = _mm512_mask_add_epi32(bits, inexact & even, bits, step);
            let r = _mm512_cvtph_ps(_mm512_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm512_castsi512_ps(odd)));
            _mm512_storeu_ps(a.as_mut_ptr(), r);
        }
    }
}

#[cfg(test)]
mod tests;
