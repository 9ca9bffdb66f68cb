//! RoPE angle tables computed the way GGML's CPU backend computes them.
//!
//! `ggml_rope_cache_init` starts at theta = position and multiplies by
//! `theta_scale = base^(-2 / n_rot)` once per pair, in f32, then takes
//! `cosf`/`sinf` of `freq_scale * theta / freq_factor`. Repeating those f32
//! steps (rather than computing `p * base^(-2i / n_rot)` exactly) keeps our
//! rotations within an ulp of llama.cpp's at every position.

use super::config::RopeParams;
use crate::error::Result;
use rustorch::{Executor, Tensor};
use std::sync::Arc;

/// Cos and sin tables `[positions.len(), n_rot / 2]` for `Tensor::rope`.
pub fn tables(
    exec: &Arc<Executor>,
    p: &RopeParams,
    freq_factors: Option<&[f32]>,
    positions: std::ops::Range<usize>,
) -> Result<(Tensor, Tensor)> {
    let half = p.n_rot / 2;
    let theta_scale = p.base.powf(-2.0 / p.n_rot as f32);
    let t = positions.len();
    let mut cos = Vec::with_capacity(t * half);
    let mut sin = Vec::with_capacity(t * half);
    for pos in positions {
        let mut theta = pos as f32;
        for i in 0..half {
            let ff = freq_factors.map_or(1.0, |f| f[i]);
            let angle = p.freq_scale * (theta / ff);
            cos.push(angle.cos());
            sin.push(angle.sin());
            theta *= theta_scale;
        }
    }
    let cos = Tensor::from_vec(cos, [t, half])?.with_executor(exec)?;
    let sin = Tensor::from_vec(sin, [t, half])?.with_executor(exec)?;
    Ok((cos, sin))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustorch::RopeLayout;

    #[test]
    fn angles_follow_ggml_recurrence() {
        let p = RopeParams {
            base: 10000.0,
            freq_scale: 1.0,
            n_rot: 8,
            layout: RopeLayout::NeoX,
        };
        let (c, s) = tables(&Executor::global(), &p, None, 3..5).unwrap();
        assert_eq!(c.dims(), &[2, 4]);
        let c = c.to_vec::<f32>().unwrap();
        let s = s.to_vec::<f32>().unwrap();
        // Position 3, pair 0: angle 3 exactly; pair 1: 3 * 10000^(-1/4).
        assert_eq!(c[0], 3f32.cos());
        assert_eq!(s[0], 3f32.sin());
        let a1 = 3f32 * 10000f32.powf(-0.25);
        assert!((c[1] - a1.cos()).abs() < 1e-6 && (s[1] - a1.sin()).abs() < 1e-6);
        // Position 4 starts again from theta = 4.
        assert_eq!(c[4], 4f32.cos());
    }

    /// Our tables and `Tensor::rope` against llama.cpp's RoPE outputs inside
    /// SmolLM2 (fixtures in rustorch-conformance/fixtures/ggml_ops, written
    /// by tools/gen_ggml_ops_fixtures.py): bit for bit, for the prompt batch
    /// and two single tokens at later positions, layers 0 and 7.
    #[test]
    fn rope_equals_llamacpp() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../rustorch-conformance/fixtures/ggml_ops");
        let index: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("index.json")).unwrap()).unwrap();
        let load = |name: &str| -> Vec<f32> {
            std::fs::read(dir.join(name))
                .unwrap()
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect()
        };
        let base = index["rope_base"].as_f64().unwrap() as f32;
        let exec = Executor::global();
        let mut checked = 0;
        for (e, eval) in index["evals"].as_array().unwrap().iter().enumerate() {
            let n_past = eval["n_past"].as_u64().unwrap() as usize;
            for layer in [0, 7] {
                for which in ["q", "k"] {
                    let shape: Vec<usize> = eval["files"][format!("e{e}-l{layer}-{which}.bin")]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|d| d.as_u64().unwrap() as usize)
                        .collect();
                    let (t, h, d) = (shape[0], shape[1], shape[2]);
                    let p = RopeParams {
                        base,
                        freq_scale: 1.0,
                        n_rot: d,
                        layout: RopeLayout::Interleaved,
                    };
                    let (cos, sin) = tables(&exec, &p, None, n_past..n_past + t).unwrap();
                    let x = Tensor::from_vec(load(&format!("e{e}-l{layer}-{which}_pre.bin")), [t, h, d]).unwrap();
                    let got = x
                        .transpose(0, 1)
                        .unwrap()
                        .rope(&cos, &sin, p.layout)
                        .unwrap()
                        .transpose(0, 1)
                        .unwrap()
                        .to_vec::<f32>()
                        .unwrap();
                    let want = load(&format!("e{e}-l{layer}-{which}.bin"));
                    let bad = (0..want.len())
                        .filter(|&i| got[i].to_bits() != want[i].to_bits())
                        .count();
                    assert_eq!(bad, 0, "evaluation {e}, layer {layer}, {which}: {bad} values differ");
                    checked += want.len();
                }
            }
        }
        assert!(checked > 10_000);
    }
}
