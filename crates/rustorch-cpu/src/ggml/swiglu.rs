//! `ggml_swiglu` (vec.cpp `ggml_vec_swiglu_f32`): silu(x) * g per row, with
//! `ggml_v_silu` on each full 16-lane block and libm's `expf` after it.

use super::expf::{silu_libm, v_silu};

/// `out[i] = silu(x[i]) * g[i]` for one row (all of one length).
pub(crate) fn swiglu_row(x: &[f32], g: &[f32], out: &mut [f32]) {
    let n = x.len();
    let blocks = n / 16 * 16;
    #[cfg(target_arch = "x86_64")]
    if super::has_avx512() {
        // SAFETY: AVX-512 F and FMA are present (checked above); the slices
        // cover `blocks` elements.
        unsafe { avx512::blocks(&x[..blocks], &g[..blocks], &mut out[..blocks]) };
    } else {
        silu_blocks(&x[..blocks], &g[..blocks], &mut out[..blocks]);
    }
    #[cfg(not(target_arch = "x86_64"))]
    for i in 0..blocks {
        out[i] = v_silu(x[i]) * g[i];
    }
    for i in blocks..n {
        out[i] = silu_libm(x[i]) * g[i];
    }
}

crate::simd_dispatch! {
    /// `v_silu(x) * g` one lane at a time where AVX-512 is missing, compiled
    /// with FMA where the CPU has it (`mul_add` is otherwise a libm call):
    /// the same bits.
    fn silu_blocks(x: &[f32], g: &[f32], out: &mut [f32]) {
        for ((o, &x), &g) in out.iter_mut().zip(x).zip(g) {
            *o = v_silu(x) * g;
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::super::expf::avx512::v_silu;
    use std::arch::x86_64::*;

    /// # Safety
    /// AVX-512 F and FMA; equal lengths, a multiple of 16.
    #[target_feature(enable = "avx512f,fma")]
    pub(super) unsafe fn blocks(x: &[f32], g: &[f32], out: &mut [f32]) {
        let mut i = 0;
        while i + 16 <= x.len() {
            // SAFETY: i + 16 <= len of all three slices.
            unsafe {
                let y = _mm512_mul_ps(
                    v_silu(_mm512_loadu_ps(x.as_ptr().add(i))),
                    _mm512_loadu_ps(g.as_ptr().add(i)),
                );
                _mm512_storeu_ps(out.as_mut_ptr().add(i), y);
            }
            i += 16;
        }
    }
}
