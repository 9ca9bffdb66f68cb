//! Reference quantizers of the 32-value block types (llama.cpp's
//! `quantize_row_{q4_0,q4_1,q5_0,q5_1,q8_0,q8_1}_ref`). For finite inputs
//! their bytes are identical to the `gguf` package's `quantize` (Q8_1,
//! which the package lacks, follows llama.cpp).
//!
//! Float-to-int casts truncate like C's; Rust's saturate instead of being
//! undefined on NaN or out-of-range values, so bad inputs give defined
//! (meaningless) quants rather than a panic.

use super::search::signed_max;
use crate::quant::blocks::*;

/// Largest magnitude; the first of a tie.
#[inline]
fn abs_max(x: &[f32]) -> f32 {
    x.iter().fold(0f32, |m, &v| if m > v.abs() { m } else { v.abs() })
}

/// Smallest and largest value, starting from (FLT_MAX, -FLT_MAX) as C does.
#[inline]
fn min_max(x: &[f32]) -> (f32, f32) {
    let (mut min, mut max) = (f32::MAX, -f32::MAX);
    for &v in x {
        if v < min {
            min = v;
        }
        if v > max {
            max = v;
        }
    }
    (min, max)
}

#[inline]
fn inverse(d: f32) -> f32 {
    if d != 0.0 {
        1.0 / d
    } else {
        0.0
    }
}

/// Packs 5-bit values: low nibbles into `qs` (element j and j + 16 share
/// byte j), fifth bits into the 32-bit `qh`.
#[inline]
fn pack_q5(q: &[u8; 32]) -> ([u8; 16], [u8; 4]) {
    let mut qs = [0u8; 16];
    let mut qh = 0u32;
    for j in 0..16 {
        qs[j] = (q[j] & 0x0F) | ((q[j + 16] & 0x0F) << 4);
        qh |= (((q[j] & 0x10) >> 4) as u32) << j;
        qh |= (((q[j + 16] & 0x10) >> 4) as u32) << (j + 16);
    }
    (qs, qh.to_le_bytes())
}

impl Quantize<32> for BlockQ4_0 {
    fn quantize(x: &[f32; 32]) -> Self {
        // The value of largest magnitude maps to -8, so its sign is kept.
        let (max, _) = signed_max(x);
        let d = max / -8.0;
        let id = inverse(d);
        let mut qs = [0u8; 16];
        for j in 0..16 {
            let q0 = ((x[j] * id + 8.5) as i8).min(15) as u8;
            let q1 = ((x[j + 16] * id + 8.5) as i8).min(15) as u8;
            qs[j] = q0 | (q1 << 4);
        }
        BlockQ4_0 { d: f32_to_f16(d), qs }
    }
}

impl Quantize<32> for BlockQ4_1 {
    fn quantize(x: &[f32; 32]) -> Self {
        let (min, max) = min_max(x);
        let d = (max - min) / 15.0;
        let id = inverse(d);
        let mut qs = [0u8; 16];
        for j in 0..16 {
            let q0 = (((x[j] - min) * id + 0.5) as i8).min(15) as u8;
            let q1 = (((x[j + 16] - min) * id + 0.5) as i8).min(15) as u8;
            qs[j] = q0 | (q1 << 4);
        }
        BlockQ4_1 {
            d: f32_to_f16(d),
            m: f32_to_f16(min),
            qs,
        }
    }
}

impl Quantize<32> for BlockQ5_0 {
    fn quantize(x: &[f32; 32]) -> Self {
        let (max, _) = signed_max(x);
        let d = max / -16.0;
        let id = inverse(d);
        let q: [u8; 32] = std::array::from_fn(|j| ((x[j] * id + 16.5) as i8).min(31) as u8);
        let (qs, qh) = pack_q5(&q);
        BlockQ5_0 {
            d: f32_to_f16(d),
            qh,
            qs,
        }
    }
}

impl Quantize<32> for BlockQ5_1 {
    fn quantize(x: &[f32; 32]) -> Self {
        let (min, max) = min_max(x);
        let d = (max - min) / 31.0;
        let id = inverse(d);
        // C casts straight to uint8_t; in range the clamp changes nothing.
        let q: [u8; 32] = std::array::from_fn(|j| (((x[j] - min) * id + 0.5) as u8).min(31));
        let (qs, qh) = pack_q5(&q);
        BlockQ5_1 {
            d: f32_to_f16(d),
            m: f32_to_f16(min),
            qh,
            qs,
        }
    }
}

/// Q8_0 and Q8_1 share the scale and the rounding (half away from zero).
#[inline]
fn q8(x: &[f32; 32]) -> (f32, [i8; 32]) {
    let d = abs_max(x) / 127.0;
    let id = inverse(d);
    (d, std::array::from_fn(|j| (x[j] * id).round() as i8))
}

impl Quantize<32> for BlockQ8_0 {
    fn quantize(x: &[f32; 32]) -> Self {
        let (d, qs) = q8(x);
        BlockQ8_0 { d: f32_to_f16(d), qs }
    }
}

impl Quantize<32> for BlockQ8_1 {
    fn quantize(x: &[f32; 32]) -> Self {
        let (d, qs) = q8(x);
        let sum: i32 = qs.iter().map(|&q| q as i32).sum();
        BlockQ8_1 {
            d: f32_to_f16(d),
            s: f32_to_f16(sum as f32 * d),
            qs,
        }
    }
}
