//! The portable kernel for Q8_1 weights (no x86-exact kernel), with llama.cpp's generic arithmetic: an exact integer
//! sum per block, then the block's float multiply-add in the same order
//! as `ggml_vec_dot_*_generic` (ggml-cpu/quants.c). Rust never contracts
//! `a * b + c` into a fused multiply-add, so each product rounds as in C.

use rustorch_core::quant::blocks::*;

#[inline(always)]
fn i8_dot(w: &[i8; 32], a: &[i8; 32]) -> i32 {
    w.iter().zip(a).map(|(&x, &y)| x as i32 * y as i32).sum()
}

#[inline(always)]
fn rows<'a, W: Block, A: Block>(w: &'a [u8], a: &'a [u8]) -> Option<(&'a [W], &'a [A])> {
    let (w, a) = (cast_blocks::<W>(w)?, cast_blocks::<A>(a)?);
    (w.len() == a.len()).then_some((w, a))
}

/// Q8_1 weights against Q8_0 activations (no llama.cpp counterpart): as
/// Q8_0, the weight's `s` unused.
pub(super) unsafe fn dot_q8_1(w: &[u8], a: &[u8]) -> f32 {
    let Some((w, a)) = rows::<BlockQ8_1, BlockQ8_0>(w, a) else {
        return f32::NAN;
    };
    let mut sum = 0f32;
    for (x, y) in w.iter().zip(a) {
        sum += i8_dot(&x.qs, &y.qs) as f32 * (f16_to_f32(x.d) * f16_to_f32(y.d));
    }
    sum
}
