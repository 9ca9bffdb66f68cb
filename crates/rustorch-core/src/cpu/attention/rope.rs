//! Rotary position embeddings (RoPE).
//!
//! Row `r` of `x` (viewed as [rows, D]) sits at position `r % T`; its first
//! R = 2 * cos.dims()[1] features are rotated by that position's angles and
//! the rest copied. NeoX pairs feature i with i + R/2 (Hugging Face's
//! `rotate_half`); Interleaved pairs 2i with 2i + 1 (Meta's complex form).

use crate::cpu::copy::input_slice;
use crate::cpu::norm::float::{acc_input, FloatElem, Real};
use crate::cpu::norm::map_rows;
use crate::cpu::CpuInput;
use crate::error::BackendError;
use crate::op::{Op, RopeLayout};

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
    Ok(map_rows::<T>(&x, d, |r, xr, out| {
        let p = (r % t) * half;
        let (c, s) = (&cos[p..p + half], &sin[p..p + half]);
        match layout {
            RopeLayout::NeoX => rotate_neox(xr, out, c, s),
            RopeLayout::Interleaved => rotate_interleaved(xr, out, c, s),
        }
        out[2 * half..].copy_from_slice(&xr[2 * half..]);
    }))
}

/// `(a, b) -> (a cos - b sin, b cos + a sin)` with a = x[i], b = x[i + R/2].
fn rotate_neox<A: Real>(x: &[A], out: &mut [A], c: &[A], s: &[A]) {
    let h = c.len();
    let (x1, x2) = (&x[..h], &x[h..2 * h]);
    let (o1, o2) = out[..2 * h].split_at_mut(h);
    for i in 0..h {
        o1[i] = x1[i] * c[i] - x2[i] * s[i];
        o2[i] = x2[i] * c[i] + x1[i] * s[i];
    }
}

/// `(a + ib) * (cos + i sin)` with a = x[2i], b = x[2i + 1].
fn rotate_interleaved<A: Real>(x: &[A], out: &mut [A], c: &[A], s: &[A]) {
    for (i, (o, p)) in out.chunks_exact_mut(2).zip(x.chunks_exact(2)).take(c.len()).enumerate() {
        o[0] = p[0] * c[i] - p[1] * s[i];
        o[1] = p[0] * s[i] + p[1] * c[i];
    }
}
