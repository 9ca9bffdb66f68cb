//! Portable kernels with llama.cpp's generic arithmetic: an exact integer
//! sum per block, then the block's float multiply-add in the same order
//! as `ggml_vec_dot_*_generic` (ggml-cpu/quants.c). Rust never contracts
//! `a * b + c` into a fused multiply-add, so each product rounds as in C.

use crate::quant::blocks::*;

/// The 5-bit quants of a Q5 block: nibbles from `qs` (element j in the low
/// nibble of byte j, element j + 16 in the high one), bit j of `qh` on top.
#[inline(always)]
pub(super) fn q5_quants(qs: &[u8; 16], qh: [u8; 4]) -> [u8; 32] {
    let qh = u32::from_le_bytes(qh);
    let mut q = [0u8; 32];
    for j in 0..16 {
        q[j] = (qs[j] & 0x0F) | ((((qh >> j) & 1) as u8) << 4);
        q[j + 16] = (qs[j] >> 4) | ((((qh >> (j + 16)) & 1) as u8) << 4);
    }
    q
}

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

/// `sumi * d_w * d_a` per block, as `ggml_vec_dot_q4_0_q8_0_generic`.
pub(super) unsafe fn dot_q4_0(w: &[u8], a: &[u8]) -> f32 {
    let Some((w, a)) = rows::<BlockQ4_0, BlockQ8_0>(w, a) else {
        return f32::NAN;
    };
    let mut sum = 0f32;
    for (x, y) in w.iter().zip(a) {
        let sumi = nibble_dot(&x.qs, &y.qs, |q| q as i32 - 8);
        sum += sumi as f32 * f16_to_f32(x.d) * f16_to_f32(y.d);
    }
    sum
}

/// `(d_w * d_a) * sumi + m_w * s_a` per block, as
/// `ggml_vec_dot_q4_1_q8_1_generic`.
pub(super) unsafe fn dot_q4_1(w: &[u8], a: &[u8]) -> f32 {
    let Some((w, a)) = rows::<BlockQ4_1, BlockQ8_1>(w, a) else {
        return f32::NAN;
    };
    let mut sum = 0f32;
    for (x, y) in w.iter().zip(a) {
        let sumi = nibble_dot(&x.qs, &y.qs, |q| q as i32);
        sum += (f16_to_f32(x.d) * f16_to_f32(y.d)) * sumi as f32 + f16_to_f32(x.m) * f16_to_f32(y.s);
    }
    sum
}

/// `(d_w * d_a) * sumi` per block, as `ggml_vec_dot_q5_0_q8_0_generic`.
pub(super) unsafe fn dot_q5_0(w: &[u8], a: &[u8]) -> f32 {
    let Some((w, a)) = rows::<BlockQ5_0, BlockQ8_0>(w, a) else {
        return f32::NAN;
    };
    let mut sum = 0f32;
    for (x, y) in w.iter().zip(a) {
        let q = q5_quants(&x.qs, x.qh);
        let sumi: i32 = q.iter().zip(&y.qs).map(|(&q, &b)| (q as i32 - 16) * b as i32).sum();
        sum += (f16_to_f32(x.d) * f16_to_f32(y.d)) * sumi as f32;
    }
    sum
}

/// `(d_w * d_a) * sumi + m_w * s_a` per block, as
/// `ggml_vec_dot_q5_1_q8_1_generic`.
pub(super) unsafe fn dot_q5_1(w: &[u8], a: &[u8]) -> f32 {
    let Some((w, a)) = rows::<BlockQ5_1, BlockQ8_1>(w, a) else {
        return f32::NAN;
    };
    let mut sum = 0f32;
    for (x, y) in w.iter().zip(a) {
        let q = q5_quants(&x.qs, x.qh);
        let sumi: i32 = q.iter().zip(&y.qs).map(|(&q, &b)| q as i32 * b as i32).sum();
        sum += (f16_to_f32(x.d) * f16_to_f32(y.d)) * sumi as f32 + f16_to_f32(x.m) * f16_to_f32(y.s);
    }
    sum
}

/// `sumi * (d_w * d_a)` per block, as `ggml_vec_dot_q8_0_q8_0_generic`.
pub(super) unsafe fn dot_q8_0(w: &[u8], a: &[u8]) -> f32 {
    let Some((w, a)) = rows::<BlockQ8_0, BlockQ8_0>(w, a) else {
        return f32::NAN;
    };
    let mut sum = 0f32;
    for (x, y) in w.iter().zip(a) {
        sum += i8_dot(&x.qs, &y.qs) as f32 * (f16_to_f32(x.d) * f16_to_f32(y.d));
    }
    sum
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
