//! Dequantization of the non-linear 4-bit types IQ4_NL and IQ4_XS.

use crate::quant::blocks::*;

impl Dequantize<32> for BlockIQ4NL {
    #[inline]
    fn dequantize(&self, out: &mut [f32; 32]) {
        let d = f16_to_f32(self.d);
        let (lo, hi) = out.split_at_mut(16);
        for ((&q, l), h) in self.qs.iter().zip(lo).zip(hi) {
            *l = d * KVALUES_IQ4NL[(q & 0xF) as usize] as f32;
            *h = d * KVALUES_IQ4NL[(q >> 4) as usize] as f32;
        }
    }
}

impl Dequantize<QK_K> for BlockIQ4XS {
    fn dequantize(&self, out: &mut [f32; QK_K]) {
        let d = f16_to_f32(self.d);
        let scales_h = u16::from_le_bytes(self.scales_h);
        for (ib, (out, qs)) in out.chunks_exact_mut(32).zip(self.qs.chunks_exact(16)).enumerate() {
            let ls = ((self.scales_l[ib / 2] >> (4 * (ib % 2))) & 0xF) | ((((scales_h >> (2 * ib)) & 3) as u8) << 4);
            let dl = d * (ls as i32 - 32) as f32;
            let (lo, hi) = out.split_at_mut(16);
            for ((&q, l), h) in qs.iter().zip(lo).zip(hi) {
                *l = dl * KVALUES_IQ4NL[(q & 0xF) as usize] as f32;
                *h = dl * KVALUES_IQ4NL[(q >> 4) as usize] as f32;
            }
        }
    }
}
