//! `ggml_geglu` (vec.h `ggml_vec_geglu_f32` with `GGML_GELU_FP16`, which
//! GGML's CPU backend defines): GELU (tanh form) read from a table indexed
//! by the f16 rounding of the input, the table holding f16 values, times g;
//! inputs at or below -10 give 0 and at or above 10 give `x * g`.

use half::f16;
use std::sync::OnceLock;

const GELU_COEF_A: f32 = 0.044715;
const SQRT_2_OVER_PI: f32 = 0.797_884_6;

/// `ggml_gelu_f32` as GCC compiles it (`-ffp-contract=fast`): the
/// `1.0f + GELU_COEF_A*x*x` becomes one FMA of `GELU_COEF_A*x` and `x`;
/// `tanhf` is libm's (Rust's `f32::tanh` calls it on Linux).
fn gelu_f32(x: f32) -> f32 {
    let inner = (GELU_COEF_A * x).mul_add(x, 1.0);
    0.5 * x * (1.0 + (SQRT_2_OVER_PI * x * inner).tanh())
}

/// `ggml_table_gelu_f16`: the f16 GELU of every f16 bit pattern, kept
/// widened to f32 (exact) so that a lookup is one load (256 KiB, in L2).
fn table() -> &'static [f32] {
    static TABLE: OnceLock<Vec<f32>> = OnceLock::new();
    TABLE.get_or_init(|| {
        (0..=u16::MAX)
            .map(|bits| f16::from_f32(gelu_f32(f16::from_bits(bits).to_f32())).to_f32())
            .collect()
    })
}

/// Inputs rounded to f16 at a time (one stack buffer).
const CHUNK: usize = 256;

/// `out[i] = gelu(x[i]) * g[i]` with GGML's table.
pub(crate) fn geglu_row(x: &[f32], g: &[f32], out: &mut [f32]) {
    use half::slice::HalfFloatSliceExt;
    let t = table();
    let mut h = [f16::ZERO; CHUNK];
    for ((xc, gc), oc) in x.chunks(CHUNK).zip(g.chunks(CHUNK)).zip(out.chunks_mut(CHUNK)) {
        // The f16 rounding of the inputs, vectorized (F16C where present;
        // the same round-to-nearest-even as one at a time).
        let h = &mut h[..xc.len()];
        h.convert_from_f32_slice(xc);
        for i in 0..xc.len() {
            oc[i] = if xc[i] <= -10.0 {
                0.0
            } else if xc[i] >= 10.0 {
                xc[i] * gc[i]
            } else {
                t[h[i].to_bits() as usize] * gc[i]
            };
        }
    }
}
