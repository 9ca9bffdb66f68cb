//! The CUDA backend's tolerance for the quantized products against the
//! CPU's, shared by tests/conformance.rs (which applies it),
//! tests/quant_decode_host.rs (which measures the MMVQ kernels' distance
//! from the CPU) and tests/qmatmul_tolerance.rs (which measures the f32
//! paths' distance).
//!
//! The CPU computes as llama.cpp's CPU backend does, quantizing each
//! activation row to the weight type's dot type (Q8_0 / Q8_1 / Q8_K
//! blocks, or F16 / BF16 for those weights) before integer dot products.
//! The GPU has two arithmetics:
//!
//! **MMVQ** (every quantized weight type, up to 64 activation rows: decode,
//! small batches, and every product of the conformance suite, whose
//! batches have at most 33 rows). The activations are quantized on the
//! GPU by the CPU's rules to the CPU's dot type, K-quants and IQ4_XS to
//! Q8_K (256-value blocks, f32 scale) as the CPU does, not to llama.cpp
//! CUDA's Q8_1 blocks of 32, which would leave the quantization error
//! below between the two; quants, scales and sums are the CPU's bit for
//! bit (quant_decode_host.rs checks it). The integer sums per block are
//! exact on both sides, and so are the f16 x f16 scale products; what
//! differs is how the f32 terms (scale x integer sum, per 32-value piece
//! on the GPU, per block or per SIMD lane on the CPU) are rounded and
//! added: each side is within about (terms + 5) * 2^-24 * sum |term| of
//! the exact sum, i.e. at most about 60 u * sum_i |x_i w_i| for rows of
//! 1536 values (48 blocks on the CPU's side), 1.3e-3 for the suite's
//! largest sum_i |x_i w_i| (~350). Measured (quant_decode_host.rs, the
//! GPU's arithmetic compiled on the host, on the suite's inputs and the
//! llama.cpp fixtures): at most 3.1e-5 (Q4_1, Q5_1; the others 0.8e-5 to
//! 2.7e-5), about 1e-7 * sum_i |x_i w_i|, a few ulp of the results (up to
//! 128). The tolerance, 2e-3, covers the worst-case bound and is 65 times
//! the measured distance; it was 0.5 with f32 activations.
//!
//! **f32** (F32, F16, BF16 weights; quantized weights with more than 64
//! activation rows, through dequantization and cuBLAS): the f32
//! activations times the exactly dequantized weights, so the difference is
//! the CPU's activation quantization error, which grows with the
//! activations' block maxima and the row length, not with the result (it
//! stays when the product cancels to near zero): hence an absolute
//! tolerance. tests/qmatmul_tolerance.rs, on the conformance suite's
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
//! `qmatmul_xN` and the gated ops keep these f32-path numbers: they are
//! not measured against the MMVQ arithmetic yet (xN may mix any types).

// Each test crate that includes this module uses part of it.
#![allow(dead_code)]

use rustorch_conformance::Tol;

/// The tolerance of a quantized product (`op`: `qmatmul_<type>`,
/// `qmatmul_x<n>`, `qmatmul_swiglu`, `qmatmul_geglu`) as the conformance
/// suite applies it: the MMVQ arithmetic's for the types that have it
/// (the suite's products all take it); `None` for any other op.
pub fn qmatmul(op: &str) -> Option<Tol> {
    let name = op.strip_prefix("qmatmul_")?;
    if MMVQ_TYPES.contains(&name) {
        return Some(Tol { atol: 2e-3, rtol: 0.0 });
    }
    f32_path(op)
}

/// The weight types with an MMVQ kernel, as op-name suffixes.
pub const MMVQ_TYPES: [&str; 14] = [
    "q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q8_1", "iq4_nl", "q2_k", "q3_k", "q4_k", "q5_k", "q6_k", "q8_k", "iq4_xs",
];

/// The tolerance of the f32 arithmetic (f32 activations times dequantized
/// weights) for `op`; `None` for any op but the quantized products.
pub fn f32_path(op: &str) -> Option<Tol> {
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
