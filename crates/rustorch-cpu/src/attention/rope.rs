//! Rotary position embeddings (RoPE).
//!
//! Row `r` of `x` (viewed as [rows, D]) sits at position `r % T`; its first
//! R = 2 * cos.dims()[1] features are rotated by that position's angles and
//! the rest copied. NeoX pairs feature i with i + R/2 (Hugging Face's
//! `rotate_half`); Interleaved pairs 2i with 2i + 1 (Meta's complex form).

use crate::copy::input_slice;
use crate::norm::float::{acc_input, FloatElem, Real};
use crate::norm::map_rows;
use crate::CpuInput;
use rustorch_core::error::BackendError;
use rustorch_core::op::{Op, RopeLayout};

pub(super) fn rope<T: FloatElem>(op: &Op, inputs: &[CpuInput<'_>], layout: RopeLayout) -> Result<Vec<T>, BackendError> {
    let dims = inputs[0].dims();
    let rank = dims.len();
    let (t, d) = (dims[rank - 2], dims[rank - 1]);
    let half = inputs[1].dims()[1];
    let x = input_slice::<T>(op, inputs[0])?;
    let cos = acc_input::<T>(op, inputs[1])?;
    let sin = acc_input::<T>(op, inputs[2])?;
    if x.is_empty() {
        return Ok(Vec::new());
    }
    if cos.len() != t * half || sin.len() != t * half || 2 * half > d {
        return Err(BackendError::invalid(
            op.name(),
            "cos and sin must be [T, R/2] with R <= D",
        ));
    }
    let fma = has_fma();
    Ok(map_rows::<T>(&x, d, |r, xr, out| {
        let p = (r % t) * half;
        let (c, s) = (&cos[p..p + half], &sin[p..p + half]);
        #[cfg(target_arch = "x86_64")]
        if fma {
            // SAFETY: the CPU has FMA (checked by `has_fma`).
            unsafe { rotate_fma(layout, xr, out, c, s) };
        } else {
            rotate(layout, xr, out, c, s);
        }
        #[cfg(not(target_arch = "x86_64"))]
        rotate(layout, xr, out, c, s);
        out[2 * half..].copy_from_slice(&xr[2 * half..]);
    }))
}

fn has_fma() -> bool {
    #[cfg(target_arch = "x86_64")]
    return is_x86_feature_detected!("fma");
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// `rotate` compiled with FMA instructions (without them `mul_add` is a
/// libm call per element).
///
/// # Safety
/// The CPU must support FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "fma")]
unsafe fn rotate_fma<A: Real>(layout: RopeLayout, x: &[A], out: &mut [A], c: &[A], s: &[A]) {
    rotate(layout, x, out, c, s)
}

/// Rotates the first `2 * c.len()` features of one row with `Real::rotate`
/// (GGML's arithmetic): NeoX pairs x[i] with x[i + R/2], Interleaved pairs
/// x[2i] with x[2i + 1] (`(a + ib) * (cos + i sin)`).
#[inline(always)]
fn rotate<A: Real>(layout: RopeLayout, x: &[A], out: &mut [A], c: &[A], s: &[A]) {
    let h = c.len();
    match layout {
        RopeLayout::NeoX => {
            let (x1, x2) = (&x[..h], &x[h..2 * h]);
            let (o1, o2) = out[..2 * h].split_at_mut(h);
            for i in 0..h {
                (o1[i], o2[i]) = A::rotate(x1[i], x2[i], c[i], s[i]);
            }
        }
        RopeLayout::Interleaved => {
            for (i, (o, p)) in out.chunks_exact_mut(2).zip(x.chunks_exact(2)).take(h).enumerate() {
                (o[0], o[1]) = A::rotate(p[0], p[1], c[i], s[i]);
            }
        }
    }
}
