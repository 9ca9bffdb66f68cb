//! Reference quantizers of IQ4_NL and IQ4_XS (llama.cpp's
//! `quantize_row_iq4_nl_ref` and `quantize_row_iq4_xs_ref`, both through
//! `quantize_row_iq4_nl_impl` without importance weights).

use super::search::{best_index_int8, nearest_int, signed_max, GROUP_MAX_EPS};
use crate::quant::blocks::*;

const V: &[i8; 16] = &KVALUES_IQ4NL;

/// Weighted (by x^2) least-squares scale for the levels chosen at
/// inverse scale `id`: returns (sum w q x, sum w q^2).
#[inline]
fn fit(xb: &[f32; 32], id: f32, l: Option<&mut [u8; 32]>) -> (f32, f32) {
    let (mut sumqx, mut sumq2) = (0f32, 0f32);
    let mut idx = [0u8; 32];
    for (j, &x) in xb.iter().enumerate() {
        let i = best_index_int8(V, id * x);
        idx[j] = i as u8;
        let q = V[i] as f32;
        let w = x * x;
        sumqx += w * q * x;
        sumq2 += w * q * q;
    }
    if let Some(l) = l {
        *l = idx;
    }
    (sumqx, sumq2)
}

/// The scale of one group of 32 (`ntry` extra candidate scales on each side
/// of the first guess; llama.cpp's IQ4_NL reference uses none, IQ4_XS 7),
/// with the levels of the first guess written to `l`.
fn group_scale(xb: &[f32; 32], ntry: i32, l: &mut [u8; 32]) -> f32 {
    let (max, amax) = signed_max(xb);
    if amax < GROUP_MAX_EPS {
        *l = [0; 32];
        return 0.0;
    }
    let v0 = V[0] as f32;
    let d = if ntry > 0 { -max / v0 } else { max / v0 };
    let (sumqx, sumq2) = fit(xb, 1.0 / d, Some(l));
    let mut d = if sumq2 > 0.0 { sumqx / sumq2 } else { 0.0 };
    let mut best = d * sumqx;
    for itry in -ntry..=ntry {
        let id = (itry + V[0] as i32) as f32 / max;
        let (sumqx, sumq2) = fit(xb, id, None);
        if sumq2 > 0.0 && sumqx * sumqx > best * sumq2 {
            d = sumqx / sumq2;
            best = d * sumqx;
        }
    }
    d
}

/// Element j and j + 16 of a group of 32 share byte j.
#[inline]
fn pack_nibbles(l: &[u8; 32]) -> [u8; 16] {
    std::array::from_fn(|j| l[j] | (l[j + 16] << 4))
}

impl Quantize<32> for BlockIQ4NL {
    fn quantize(x: &[f32; 32]) -> Self {
        let mut l = [0u8; 32];
        // As in llama.cpp's reference, the levels stay those of the first
        // guess while the stored scale is the refitted one.
        let d = group_scale(x, -1, &mut l);
        BlockIQ4NL {
            d: f32_to_f16(d),
            qs: pack_nibbles(&l),
        }
    }
}

impl Quantize<QK_K> for BlockIQ4XS {
    fn quantize(x: &[f32; QK_K]) -> Self {
        let (groups, _) = x.as_chunks::<32>();
        let mut l = [[0u8; 32]; 8];
        let mut scales = [0f32; 8];
        for ((s, g), l) in scales.iter_mut().zip(groups).zip(l.iter_mut()) {
            *s = group_scale(g, 7, l);
        }
        let (max_scale, _) = signed_max(&scales);
        let mut y = BlockIQ4XS::default();
        let d = -max_scale / 32.0;
        y.d = f32_to_f16(d);
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let mut scales_h = 0u16;
        for (ib, (g, l)) in groups.iter().zip(l.iter_mut()).enumerate() {
            let ls = nearest_int(id * scales[ib]).clamp(-32, 31);
            let dl = d * ls as f32;
            let idl = if dl != 0.0 { 1.0 / dl } else { 0.0 };
            for (q, &v) in l.iter_mut().zip(g) {
                *q = best_index_int8(V, idl * v) as u8;
            }
            let ls = (ls + 32) as u8;
            y.scales_l[ib / 2] |= (ls & 0xF) << (4 * (ib % 2));
            scales_h |= ((ls >> 4) as u16) << (2 * ib);
            y.qs[16 * ib..16 * ib + 16].copy_from_slice(&pack_nibbles(l));
        }
        y.scales_h = scales_h.to_le_bytes();
        y
    }
}

/// IQ4_NL as llama.cpp's `quantize_iq4_nl` without importance weights,
/// the path `llama-quantize` takes (through `ggml_quantize_chunk`). Unlike
/// `quantize_row_iq4_nl_ref` it tries 7 candidate scales on each side and
/// picks the levels again at the final scale, so the bytes differ.
pub(crate) fn iq4nl_searched(x: &[f32; 32]) -> BlockIQ4NL {
    let mut l = [0u8; 32];
    let d = group_scale(x, 7, &mut l);
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    for (q, &v) in l.iter_mut().zip(x) {
        *q = best_index_int8(V, id * v) as u8;
    }
    BlockIQ4NL {
        d: f32_to_f16(d),
        qs: pack_nibbles(&l),
    }
}
