//! Dequantization of the 32-value block types (Q4_0 ... Q8_1).
//!
//! Each value is computed with the same float operations, in the same
//! order, as llama.cpp's `dequantize_row_*` and the `gguf` package, so the
//! results are bit-identical (no fused multiply-add: Rust never contracts).

use crate::quant::blocks::*;

impl Dequantize<32> for BlockQ4_0 {
    #[inline]
    fn dequantize(&self, out: &mut [f32; 32]) {
        let d = f16_to_f32(self.d);
        let (lo, hi) = out.split_at_mut(16);
        for ((&q, l), h) in self.qs.iter().zip(lo).zip(hi) {
            *l = ((q & 0x0F) as i32 - 8) as f32 * d;
            *h = ((q >> 4) as i32 - 8) as f32 * d;
        }
    }
}

impl Dequantize<32> for BlockQ4_1 {
    #[inline]
    fn dequantize(&self, out: &mut [f32; 32]) {
        let d = f16_to_f32(self.d);
        let m = f16_to_f32(self.m);
        let (lo, hi) = out.split_at_mut(16);
        for ((&q, l), h) in self.qs.iter().zip(lo).zip(hi) {
            *l = (q & 0x0F) as f32 * d + m;
            *h = (q >> 4) as f32 * d + m;
        }
    }
}

/// The 5-bit values of a Q5 block: low nibbles from `qs`, bit j of `qh`
/// on top of element j.
#[inline]
fn q5_values(qs: &[u8; 16], qh: [u8; 4]) -> [u8; 32] {
    let qh = u32::from_le_bytes(qh);
    let mut q = [0u8; 32];
    for j in 0..16 {
        q[j] = (qs[j] & 0x0F) | ((((qh >> j) & 1) as u8) << 4);
        q[j + 16] = (qs[j] >> 4) | ((((qh >> (j + 16)) & 1) as u8) << 4);
    }
    q
}

impl Dequantize<32> for BlockQ5_0 {
    #[inline]
    fn dequantize(&self, out: &mut [f32; 32]) {
        let d = f16_to_f32(self.d);
        let q = q5_values(&self.qs, self.qh);
        for (o, &q) in out.iter_mut().zip(&q) {
            *o = (q as i32 - 16) as f32 * d;
        }
    }
}

impl Dequantize<32> for BlockQ5_1 {
    #[inline]
    fn dequantize(&self, out: &mut [f32; 32]) {
        let d = f16_to_f32(self.d);
        let m = f16_to_f32(self.m);
        let q = q5_values(&self.qs, self.qh);
        for (o, &q) in out.iter_mut().zip(&q) {
            *o = q as f32 * d + m;
        }
    }
}

impl Dequantize<32> for BlockQ8_0 {
    #[inline]
    fn dequantize(&self, out: &mut [f32; 32]) {
        let d = f16_to_f32(self.d);
        for (o, &q) in out.iter_mut().zip(&self.qs) {
            *o = q as f32 * d;
        }
    }
}

impl Dequantize<32> for BlockQ8_1 {
    /// `d * q`; the stored sum `s` is redundant for the values.
    #[inline]
    fn dequantize(&self, out: &mut [f32; 32]) {
        let d = f16_to_f32(self.d);
        for (o, &q) in out.iter_mut().zip(&self.qs) {
            *o = q as f32 * d;
        }
    }
}
