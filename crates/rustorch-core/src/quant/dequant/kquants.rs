//! Dequantization of the K-quant super-blocks (Q2_K ... Q8_K).
//!
//! The per-group scale products (`d * sc`, `dmin * m`) are formed first and
//! then applied to each quant, as llama.cpp and the `gguf` package do, so
//! the results are bit-identical to both.

use crate::quant::blocks::*;

impl Dequantize<QK_K> for BlockQ2K {
    fn dequantize(&self, out: &mut [f32; QK_K]) {
        let d = f16_to_f32(self.d);
        let dmin = f16_to_f32(self.dmin);
        // Element 128 * half + 32 * shift + l sits in bits 2 * shift of
        // qs[32 * half + l]; its group of 16 is 8 * half + 2 * shift + l / 16.
        for (half, (out, qs)) in out.chunks_exact_mut(128).zip(self.qs.chunks_exact(32)).enumerate() {
            for (shift, out) in out.chunks_exact_mut(32).enumerate() {
                for (g, (out, qs)) in out.chunks_exact_mut(16).zip(qs.chunks_exact(16)).enumerate() {
                    let sc = self.scales[8 * half + 2 * shift + g];
                    let dl = d * (sc & 0xF) as f32;
                    let ml = dmin * (sc >> 4) as f32;
                    for (o, &q) in out.iter_mut().zip(qs) {
                        *o = dl * ((q >> (2 * shift)) & 3) as f32 - ml;
                    }
                }
            }
        }
    }
}

impl Dequantize<QK_K> for BlockQ3K {
    fn dequantize(&self, out: &mut [f32; QK_K]) {
        let d = f16_to_f32(self.d);
        let scales = q3k_scales(&self.scales);
        // As Q2_K for the low two bits; the high bit of element e is bit
        // e / 32 of hmask[e % 32], and a clear bit means "minus 4".
        for (half, (out, qs)) in out.chunks_exact_mut(128).zip(self.qs.chunks_exact(32)).enumerate() {
            for (shift, out) in out.chunks_exact_mut(32).enumerate() {
                let hbit = 4 * half + shift;
                for (g, ((out, qs), hm)) in out
                    .chunks_exact_mut(16)
                    .zip(qs.chunks_exact(16))
                    .zip(self.hmask.chunks_exact(16))
                    .enumerate()
                {
                    let dl = d * scales[8 * half + 2 * shift + g] as f32;
                    for ((o, &q), &h) in out.iter_mut().zip(qs).zip(hm) {
                        let low = ((q >> (2 * shift)) & 3) as i32;
                        let minus = (((h >> hbit) & 1) ^ 1) as i32 * 4;
                        *o = dl * (low - minus) as f32;
                    }
                }
            }
        }
    }
}

impl Dequantize<QK_K> for BlockQ4K {
    fn dequantize(&self, out: &mut [f32; QK_K]) {
        let d = f16_to_f32(self.d);
        let dmin = f16_to_f32(self.dmin);
        // Chunk c of 64 values: groups 2c (low nibbles of qs[32c..]) and
        // 2c + 1 (high nibbles).
        for (c, (out, qs)) in out.chunks_exact_mut(64).zip(self.qs.chunks_exact(32)).enumerate() {
            let (sc1, m1) = scale_min_k4(2 * c, &self.scales);
            let (sc2, m2) = scale_min_k4(2 * c + 1, &self.scales);
            let (d1, m1) = (d * sc1 as f32, dmin * m1 as f32);
            let (d2, m2) = (d * sc2 as f32, dmin * m2 as f32);
            let (lo, hi) = out.split_at_mut(32);
            for ((&q, l), h) in qs.iter().zip(lo).zip(hi) {
                *l = d1 * (q & 0xF) as f32 - m1;
                *h = d2 * (q >> 4) as f32 - m2;
            }
        }
    }
}

impl Dequantize<QK_K> for BlockQ5K {
    fn dequantize(&self, out: &mut [f32; QK_K]) {
        let d = f16_to_f32(self.d);
        let dmin = f16_to_f32(self.dmin);
        // As Q4_K; the fifth bit of chunk c is bit 2c (low half) or 2c + 1
        // (high half) of qh[l].
        for (c, (out, qs)) in out.chunks_exact_mut(64).zip(self.qs.chunks_exact(32)).enumerate() {
            let (sc1, m1) = scale_min_k4(2 * c, &self.scales);
            let (sc2, m2) = scale_min_k4(2 * c + 1, &self.scales);
            let (d1, m1) = (d * sc1 as f32, dmin * m1 as f32);
            let (d2, m2) = (d * sc2 as f32, dmin * m2 as f32);
            let (lo, hi) = out.split_at_mut(32);
            for (((&q, &h), l), hv) in qs.iter().zip(&self.qh).zip(lo).zip(hi) {
                let h1 = ((h >> (2 * c)) & 1) << 4;
                let h2 = ((h >> (2 * c + 1)) & 1) << 4;
                *l = d1 * ((q & 0xF) | h1) as f32 - m1;
                *hv = d2 * ((q >> 4) | h2) as f32 - m2;
            }
        }
    }
}

impl Dequantize<QK_K> for BlockQ6K {
    fn dequantize(&self, out: &mut [f32; QK_K]) {
        let d = f16_to_f32(self.d);
        let dl: [f32; 16] = std::array::from_fn(|i| d * self.scales[i] as f32);
        // Half n (128 values) uses ql[64n..64n+64], qh[32n..32n+32]; its
        // quarter k (32 values) takes the low (k even) or high (k odd)
        // nibble of ql[64n + 32 * (k % 2) + l] and bits 2k of qh[32n + l].
        for (n, out) in out.chunks_exact_mut(128).enumerate() {
            let ql = &self.ql[64 * n..64 * n + 64];
            let qh = &self.qh[32 * n..32 * n + 32];
            for (k, out) in out.chunks_exact_mut(32).enumerate() {
                let ql = &ql[32 * (k % 2)..32 * (k % 2) + 32];
                let nib = 4 * (k / 2);
                for (l, o) in out.iter_mut().enumerate() {
                    let q = ((ql[l] >> nib) & 0xF) | (((qh[l] >> (2 * k)) & 3) << 4);
                    *o = dl[8 * n + 2 * k + l / 16] * (q as i32 - 32) as f32;
                }
            }
        }
    }
}

impl Dequantize<QK_K> for BlockQ8K {
    fn dequantize(&self, out: &mut [f32; QK_K]) {
        let d = self.scale();
        for (o, &q) in out.iter_mut().zip(&self.qs) {
            *o = d * q as f32;
        }
    }
}
