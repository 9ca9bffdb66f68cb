//! Reference quantizers of the K-quant super-blocks (llama.cpp's
//! `quantize_row_{q2,q3,q4,q5,q6,q8}_K_ref`), written with the same float
//! operations in the same order as the C code.

// The loops index several parallel arrays by group, as the C code does;
// keeping its shape makes the two easy to compare line by line.
#![allow(clippy::needless_range_loop)]

use super::search::{make_q3_quants, make_qkx2_quants, make_qx_quants, nearest_int, signed_max, GROUP_MAX_EPS};
use crate::quant::blocks::*;

/// Packs 2-bit values: element 128h + 32s + l goes to bits 2s of
/// qs[32h + l].
fn pack_2bit(l: &[u8; QK_K]) -> [u8; 64] {
    let mut qs = [0u8; 64];
    for h in 0..2 {
        for i in 0..32 {
            let j = 128 * h + i;
            qs[32 * h + i] = l[j] | (l[j + 32] << 2) | (l[j + 64] << 4) | (l[j + 96] << 6);
        }
    }
    qs
}

impl Quantize<QK_K> for BlockQ2K {
    fn quantize(x: &[f32; QK_K]) -> Self {
        const Q4SCALE: f32 = 15.0;
        let mut l = [0u8; QK_K];
        let mut aux = [0u8; 16];
        let mut scales = [0f32; 16];
        let mut mins = [0f32; 16];
        let (mut max_scale, mut max_min) = (0f32, 0f32);
        for j in 0..16 {
            let xs = &x[16 * j..16 * j + 16];
            let weights: [f32; 16] = std::array::from_fn(|i| xs[i].abs());
            let (scale, min) = make_qkx2_quants(
                3,
                xs,
                &weights,
                &mut l[16 * j..16 * j + 16],
                &mut aux,
                -0.5,
                0.1,
                15,
                true,
            );
            scales[j] = scale;
            mins[j] = min;
            if scale > max_scale {
                max_scale = scale;
            }
            if min > max_min {
                max_min = min;
            }
        }
        let mut y = BlockQ2K::default();
        if max_scale > 0.0 {
            let iscale = Q4SCALE / max_scale;
            for j in 0..16 {
                y.scales[j] = nearest_int(iscale * scales[j]) as u8;
            }
            y.d = f32_to_f16(max_scale / Q4SCALE);
        }
        if max_min > 0.0 {
            let iscale = Q4SCALE / max_min;
            for j in 0..16 {
                y.scales[j] |= (nearest_int(iscale * mins[j]) << 4) as u8;
            }
            y.dmin = f32_to_f16(max_min / Q4SCALE);
        }
        // Requantize against the rounded scales.
        let (d_all, m_all) = (f16_to_f32(y.d), f16_to_f32(y.dmin));
        for j in 0..16 {
            let d = d_all * (y.scales[j] & 0xF) as f32;
            if d == 0.0 {
                continue;
            }
            let dm = m_all * (y.scales[j] >> 4) as f32;
            for i in 16 * j..16 * j + 16 {
                l[i] = nearest_int((x[i] + dm) / d).clamp(0, 3) as u8;
            }
        }
        y.qs = pack_2bit(&l);
        y
    }
}

impl Quantize<QK_K> for BlockQ3K {
    fn quantize(x: &[f32; QK_K]) -> Self {
        let mut l = [0u8; QK_K];
        let mut scales = [0f32; 16];
        let (mut max_scale, mut amax) = (0f32, 0f32);
        for j in 0..16 {
            let (xs, ls) = (sub16(x, j), sub16_mut(&mut l, j));
            scales[j] = make_q3_quants(4, xs, ls);
            let scale = scales[j].abs();
            if scale > amax {
                amax = scale;
                max_scale = scales[j];
            }
        }
        let mut y = BlockQ3K::default();
        if max_scale != 0.0 {
            let iscale = -32.0 / max_scale;
            for j in 0..16 {
                let q = (nearest_int(iscale * scales[j]) as i8).clamp(-32, 31) + 32;
                let q = q as u8;
                if j < 8 {
                    y.scales[j] = q & 0xF;
                } else {
                    y.scales[j - 8] |= (q & 0xF) << 4;
                }
                y.scales[j % 4 + 8] |= (q >> 4) << (2 * (j / 4));
            }
            y.d = f32_to_f16(1.0 / iscale);
        }
        let d_all = f16_to_f32(y.d);
        let sc = q3k_scales(&y.scales);
        for j in 0..16 {
            let d = d_all * sc[j] as f32;
            if d == 0.0 {
                continue;
            }
            for i in 16 * j..16 * j + 16 {
                l[i] = (nearest_int(x[i] / d).clamp(-4, 3) + 4) as u8;
            }
        }
        // High bit of element j into bit j / 32 of hmask[j % 32].
        for (j, q) in l.iter_mut().enumerate() {
            if *q > 3 {
                y.hmask[j % 32] |= 1 << (j / 32);
                *q -= 4;
            }
        }
        y.qs = pack_2bit(&l);
        y
    }
}

fn sub16(x: &[f32; QK_K], j: usize) -> &[f32; 16] {
    let (chunks, _) = x.as_chunks::<16>();
    &chunks[j]
}

fn sub16_mut(l: &mut [u8; QK_K], j: usize) -> &mut [u8; 16] {
    let (chunks, _) = l.as_chunks_mut::<16>();
    &mut chunks[j]
}

/// Scales and mins of the 8 groups of 32 of a Q4_K/Q5_K block, with
/// weights `sqrt(mean(x^2)) + |x|` and the given search parameters.
fn groups_of_32(x: &[f32; QK_K], nmax: i32, rmin: f32, nstep: i32, l: &mut [u8; QK_K]) -> ([f32; 8], [f32; 8]) {
    let mut scales = [0f32; 8];
    let mut mins = [0f32; 8];
    let mut aux = [0u8; 32];
    for j in 0..8 {
        let xs = &x[32 * j..32 * j + 32];
        let sum_x2 = xs.iter().fold(0f32, |s, &v| s + v * v);
        let av_x = (sum_x2 / 32.0).sqrt();
        let weights: [f32; 32] = std::array::from_fn(|i| av_x + xs[i].abs());
        let ls = &mut l[32 * j..32 * j + 32];
        (scales[j], mins[j]) = make_qkx2_quants(nmax, xs, &weights, ls, &mut aux, rmin, 0.1, nstep, false);
    }
    (scales, mins)
}

/// Quantizes the 8 scales and mins to 6 bits, packs them as
/// `scale_min_k4` reads them, and requantizes the values against the
/// rounded scales. Returns (d, dmin, packed scales).
fn pack_scales_k4(
    x: &[f32; QK_K],
    scales: &[f32; 8],
    mins: &[f32; 8],
    nmax: i32,
    l: &mut [u8; QK_K],
) -> ([u8; 2], [u8; 2], [u8; 12]) {
    let max_scale = scales.iter().fold(0f32, |m, &s| if s > m { s } else { m });
    let max_min = mins.iter().fold(0f32, |m, &s| if s > m { s } else { m });
    let inv_scale = if max_scale > 0.0 { 63.0 / max_scale } else { 0.0 };
    let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
    let mut s = [0u8; 12];
    for j in 0..8 {
        let ls = (nearest_int(inv_scale * scales[j]) as u8).min(63);
        let lm = (nearest_int(inv_min * mins[j]) as u8).min(63);
        if j < 4 {
            s[j] = ls;
            s[j + 4] = lm;
        } else {
            s[j + 4] = (ls & 0xF) | ((lm & 0xF) << 4);
            s[j - 4] |= (ls >> 4) << 6;
            s[j] |= (lm >> 4) << 6;
        }
    }
    let d = f32_to_f16(max_scale / 63.0);
    let dmin = f32_to_f16(max_min / 63.0);
    let (d_all, m_all) = (f16_to_f32(d), f16_to_f32(dmin));
    for j in 0..8 {
        let (sc, m) = scale_min_k4(j, &s);
        let d = d_all * sc as f32;
        if d == 0.0 {
            continue;
        }
        let dm = m_all * m as f32;
        for i in 32 * j..32 * j + 32 {
            l[i] = nearest_int((x[i] + dm) / d).clamp(0, nmax) as u8;
        }
    }
    (d, dmin, s)
}

impl Quantize<QK_K> for BlockQ4K {
    fn quantize(x: &[f32; QK_K]) -> Self {
        let mut l = [0u8; QK_K];
        let (scales, mins) = groups_of_32(x, 15, -1.0, 20, &mut l);
        let (d, dmin, scales) = pack_scales_k4(x, &scales, &mins, 15, &mut l);
        let mut qs = [0u8; 128];
        for c in 0..4 {
            for i in 0..32 {
                qs[32 * c + i] = l[64 * c + i] | (l[64 * c + 32 + i] << 4);
            }
        }
        BlockQ4K { d, dmin, scales, qs }
    }
}

impl Quantize<QK_K> for BlockQ5K {
    fn quantize(x: &[f32; QK_K]) -> Self {
        let mut l = [0u8; QK_K];
        let (scales, mins) = groups_of_32(x, 31, -0.5, 15, &mut l);
        let (d, dmin, scales) = pack_scales_k4(x, &scales, &mins, 31, &mut l);
        let mut qs = [0u8; 128];
        let mut qh = [0u8; 32];
        for c in 0..4 {
            for i in 0..32 {
                let (l1, l2) = (l[64 * c + i], l[64 * c + 32 + i]);
                qh[i] |= ((l1 >> 4) << (2 * c)) | ((l2 >> 4) << (2 * c + 1));
                qs[32 * c + i] = (l1 & 0xF) | ((l2 & 0xF) << 4);
            }
        }
        BlockQ5K {
            d,
            dmin,
            scales,
            qh,
            qs,
        }
    }
}

impl Quantize<QK_K> for BlockQ6K {
    fn quantize(x: &[f32; QK_K]) -> Self {
        let mut l = [0u8; QK_K];
        let mut scales = [0f32; 16];
        for (ib, s) in scales.iter_mut().enumerate() {
            *s = make_qx_quants(32, &x[16 * ib..16 * ib + 16], &mut l[16 * ib..16 * ib + 16]);
        }
        let (max_scale, max_abs_scale) = signed_max(&scales);
        let mut y = BlockQ6K::default();
        if max_abs_scale < GROUP_MAX_EPS {
            return y;
        }
        let iscale = -128.0 / max_scale;
        y.d = f32_to_f16(1.0 / iscale);
        for (o, &s) in y.scales.iter_mut().zip(&scales) {
            *o = nearest_int(iscale * s).min(127) as i8;
        }
        let d_all = f16_to_f32(y.d);
        for j in 0..16 {
            let d = d_all * y.scales[j] as f32;
            if d == 0.0 {
                continue;
            }
            for i in 16 * j..16 * j + 16 {
                l[i] = (nearest_int(x[i] / d).clamp(-32, 31) + 32) as u8;
            }
        }
        for h in 0..2 {
            let (ql, qh) = (&mut y.ql[64 * h..64 * h + 64], &mut y.qh[32 * h..32 * h + 32]);
            for i in 0..32 {
                let j = 128 * h + i;
                let (q1, q2, q3, q4) = (l[j], l[j + 32], l[j + 64], l[j + 96]);
                ql[i] = (q1 & 0xF) | ((q3 & 0xF) << 4);
                ql[i + 32] = (q2 & 0xF) | ((q4 & 0xF) << 4);
                qh[i] = (q1 >> 4) | ((q2 >> 4) << 2) | ((q3 >> 4) << 4) | ((q4 >> 4) << 6);
            }
        }
        y
    }
}

impl Quantize<QK_K> for BlockQ8K {
    fn quantize(x: &[f32; QK_K]) -> Self {
        BlockQ8K::quantize_with(x, q8k_block)
    }
}

/// `q8k_block`'s signature: a backend passes a copy of it compiled for its
/// SIMD level to `BlockQ8K::quantize_with` (each activation row of a
/// K-quant product goes through it; compiled for the baseline it ran at
/// SSE2 speed). The results are the same bits.
pub type Q8kBlockFn = fn(&[f32; QK_K], &mut [i8; QK_K], &mut [i16; 16]) -> Option<f32>;

impl BlockQ8K {
    /// `quantize_row_q8_K_ref` of one block, with `block` computing the
    /// quants (`q8k_block` or a copy of it compiled for wider SIMD).
    pub fn quantize_with(x: &[f32; QK_K], block: Q8kBlockFn) -> Self {
        let mut y = BlockQ8K::default();
        let mut bsums = [0i16; 16];
        if let Some(d) = block(x, &mut y.qs, &mut bsums) {
            for (b, s) in y.bsums.iter_mut().zip(bsums) {
                *b = s.to_le_bytes();
            }
            y.d = d.to_le_bytes();
        }
        y
    }
}

/// `quantize_row_q8_K_ref` of one block into `qs` and `bsums`; its scale
/// `d`, or `None` (all zeros) when every value is zero: the largest
/// magnitude from sixteen running lanes (max is exact and order-free), then
/// the first value with that magnitude, which is the one `signed_max`'s
/// scan keeps. Safe Rust, always inlined, so that a backend can compile it
/// into `#[target_feature]` copies.
#[inline(always)]
pub fn q8k_block(x: &[f32; QK_K], qs: &mut [i8; QK_K], bsums: &mut [i16; 16]) -> Option<f32> {
    let mut lanes = [0f32; 16];
    for c in x.chunks_exact(16) {
        for (m, &v) in lanes.iter_mut().zip(c) {
            let a = v.abs();
            *m = if a > *m { a } else { *m };
        }
    }
    let amax = lanes.iter().fold(0f32, |m, &a| if a > m { a } else { m });
    if amax == 0.0 {
        return None;
    }
    let max = *x.iter().find(|v| v.abs() == amax)?;
    // -127 rather than -128 keeps every quant in [-127, 127].
    let iscale = -127.0 / max;
    for (q, &v) in qs.iter_mut().zip(x) {
        *q = nearest_int(iscale * v).min(127) as i8;
    }
    for (b, g) in bsums.iter_mut().zip(qs.chunks_exact(16)) {
        *b = g.iter().map(|&q| q as i32).sum::<i32>() as i16;
    }
    Some(1.0 / iscale)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `quantize_row_q8_K_ref` as C writes it: one scan for the signed
    /// maximum, then the quants and the sums.
    fn q8k_scalar(x: &[f32; QK_K]) -> BlockQ8K {
        let (max, amax) = signed_max(x);
        let mut y = BlockQ8K::default();
        if amax == 0.0 {
            return y;
        }
        let iscale = -127.0 / max;
        for (q, &v) in y.qs.iter_mut().zip(x) {
            *q = nearest_int(iscale * v).min(127) as i8;
        }
        for (g, qs) in y.qs.chunks_exact(16).enumerate() {
            let sum: i32 = qs.iter().map(|&q| q as i32).sum();
            y.bsums[g] = (sum as i16).to_le_bytes();
        }
        y.d = (1.0 / iscale).to_le_bytes();
        y
    }

    /// The vectorized block equals the scan, for the magnitude's first
    /// holder of either sign among ties, zeros, tiny and huge values.
    #[test]
    fn q8k_block_equals_the_scan() {
        let mut seed = 3u64;
        let mut next = || {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5
        };
        let mut cases: Vec<[f32; QK_K]> = Vec::new();
        for scale in [1.0f32, 1e-30, 3e4, 1e-42] {
            cases.push(std::array::from_fn(|_| next() * scale));
        }
        let mut ties = [0.25f32; QK_K];
        ties[17] = -2.0;
        ties[200] = 2.0;
        cases.push(ties);
        ties[17] = 2.0;
        ties[200] = -2.0;
        cases.push(ties);
        cases.push([0.0; QK_K]);
        let mut one = [-0.0f32; QK_K];
        one[255] = -1.5;
        cases.push(one);
        for (k, x) in cases.iter().enumerate() {
            let (a, b) = (BlockQ8K::quantize(x), q8k_scalar(x));
            assert_eq!((a.d, a.qs, a.bsums), (b.d, b.qs, b.bsums), "case {k}");
        }
    }
}
