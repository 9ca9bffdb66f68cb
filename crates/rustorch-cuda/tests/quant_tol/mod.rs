//! The CUDA backend's tolerance for the quantized products against the
//! CPU's, shared by tests/conformance.rs (which applies it) and
//! tests/qmatmul_tolerance.rs (which measures what it must cover).
//!
//! Why there is one: the CPU computes as llama.cpp's CPU backend does,
//! quantizing each activation row to the weight type's dot type (Q8_0 /
//! Q8_1 / Q8_K blocks, or F16 / BF16 for those weights) before integer
//! dot products; the GPU multiplies the f32 activations by the exactly
//! dequantized weights (its lookups, `qembedding_*`, are exact). The
//! difference is the activation quantization's error, which grows with
//! the activations' block maxima and the row length, not with the result
//! (it stays when the product cancels to near zero): hence an absolute
//! tolerance.
//!
//! The numbers: tests/qmatmul_tolerance.rs, on the conformance suite's own
//! inputs (the random suite's x in [-3, 3) and weights in [-1, 1) over 256
//! columns, drawn 100 times per type; quant_ops' products; the 36
//! llama.cpp fixtures of ggml_matmul with 576 and 1536 columns), found at
//! most, for |CPU - exact product| plus a worst-case bound on the GPU's
//! f32 rounding (`k * 2^-24 * sum |x_i w_i|`):
//!
//! | op | largest distance | tolerance (atol) |
//! |---|---|---|
//! | qmatmul_f32 | 5.2e-3 (all of it the GPU's bound) | 1e-2 |
//! | qmatmul_f16 (x rounded to f16) | 1.6e-2 | 3e-2 |
//! | qmatmul_bf16 (x rounded to bf16) | 0.10 | 0.2 |
//! | qmatmul_q* / iq* (Q8 activations) | 0.22 to 0.27 (Q5_1, Q2_K) | 0.5 |
//! | qmatmul_xN (several weights) | as the largest of the above | 0.5 |
//! | qmatmul_swiglu (Q4_0 gate, Q6_K up) | 10.8, results up to 1.8e3 | 20 |
//! | qmatmul_geglu (the same) | 6.9, results up to 2.1e3 | 20 |
//!
//! that is, about twice the largest distance, rounded up; a relative term
//! would not shrink them (the test prints the smallest covering atol for
//! rtol up to 1e-2: at most a fifth less). The gated products are the
//! activation of products with that error, times values up to about 40.

use rustorch_conformance::Tol;

/// The tolerance of a quantized product (`op`: `qmatmul_<type>`,
/// `qmatmul_x<n>`, `qmatmul_swiglu`, `qmatmul_geglu`); `None` for any
/// other op.
pub fn qmatmul(op: &str) -> Option<Tol> {
    let atol = match op.strip_prefix("qmatmul_")? {
        "f32" => 1e-2,
        "f16" => 3e-2,
        "bf16" => 0.2,
        "swiglu" | "geglu" => 20.0,
        // Every quantized type, and several weights of any type.
        _ => 0.5,
    };
    Some(Tol { atol, rtol: 0.0 })
}
