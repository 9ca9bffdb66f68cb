//! Portable kernels for the types without an x86-exact kernel (Q8_1, IQ4_NL), with llama.cpp's generic arithmetic: an exact integer
//! sum per block, then the block's float multiply-add in the same order
//! as `ggml_vec_dot_*_generic` (ggml-cpu/quants.c). Rust never contracts
//! `a * b + c` into a fused multiply-add, so each product rounds as in C.

use crate::quant::blocks::*;

/// sum(w[j] * a[j]) for nibble-packed weights (element j in the low nibble
/// of byte j, element j + 16 in the high one), each nibble mapped to its
/// integer value by `decode`.
#[inline(always)]
fn nibble_dot(qs: &[u8; 16], a: &[i8; 32], decode: impl Fn(u8) -> i32) -> i32 {
    let (a0, a1) = a.split_at(16);
    let mut s0 = 0i32;
    let mut s1 = 0i32;
    for j in 0..16 {
        s0 += decode(qs[j] & 0x0F) * a0[j] as i32;
        s1 += decode(qs[j] >> 4) * a1[j] as i32;
    }
    s0 + s1
}

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

/// `(d_a * d_w) * sumi` per block, as `ggml_vec_dot_iq4_nl_q8_0_generic`.
pub(super) unsafe fn dot_iq4_nl(w: &[u8], a: &[u8]) -> f32 {
    let Some((w, a)) = rows::<BlockIQ4NL, BlockQ8_0>(w, a) else {
        return f32::NAN;
    };
    let mut sum = 0f32;
    for (x, y) in w.iter().zip(a) {
        let d = f16_to_f32(y.d) * f16_to_f32(x.d);
        let sumi = nibble_dot(&x.qs, &y.qs, |q| KVALUES_IQ4NL[q as usize] as i32);
        sum += d * sumi as f32;
    }
    sum
}
