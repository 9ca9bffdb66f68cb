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

/// `ggml_table_gelu_f16`: the f16 GELU of every f16 bit pattern.
fn table() -> &'static [f16] {
    static TABLE: OnceLock<Vec<f16>> = OnceLock::new();
    TABLE.get_or_init(|| {
        (0..=u16::MAX)
            .map(|bits| f16::from_f32(gelu_f32(f16::from_bits(bits).to_f32())))
            .collect()
    })
}

/// `out[i] = gelu(x[i]) * g[i]` with GGML's table.
pub(crate) fn geglu_row(x: &[f32], g: &[f32], out: &mut [f32]) {
    let t = table();
    for i in 0..x.len() {
        out[i] = if x[i] <= -10.0 {
            0.0
        } else if x[i] >= 10.0 {
            x[i] * g[i]
        } else {
            t[f16::from_f32(x[i]).to_bits() as usize].to_f32() * g[i]
        };
    }
}
