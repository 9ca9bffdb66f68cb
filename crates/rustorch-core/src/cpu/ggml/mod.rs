//! Arithmetic that reproduces llama.cpp's CPU backend (GGML) bit for bit.
//!
//! Greedy decoding must give llama.cpp's tokens, and a single different
//! rounding in one layer can flip an 8-bit activation rounding in the next
//! one and grow from there. So the ops that an LLM forward pass runs follow
//! GGML's x86 code (built with AVX-512, as llama.cpp's native builds are)
//! operation for operation: the same polynomial for `exp`, the same
//! accumulation lanes and reduction trees for dot products and sums, f64
//! where GGML sums in `ggml_float`, and libm's `expf` for the scalar tails
//! where GGML calls it.
//!
//! Every function has a portable version that emulates GGML's vector lanes
//! in scalar code, so the results are the same on any CPU; the AVX-512
//! versions are the same arithmetic, faster. The references are llama.cpp
//! 0.3.36's `ggml/src/ggml-cpu/{vec.h,vec.cpp,ops.cpp,llamafile/sgemm.cpp}`;
//! the tests compare with tensors that llama.cpp computed
//! (tests/ggml_ops.rs, fixtures from tools/gen_ggml_ops_fixtures.py).

pub(crate) mod attention;
pub(crate) mod bf16dot;
pub(crate) mod expf;
pub(crate) mod floatdot;
pub(crate) mod geglu;
pub(crate) mod reduce;
pub(crate) mod softmax;
pub(crate) mod swiglu;

/// Whether this CPU runs the AVX-512 versions (which need AVX-512 F and DQ
/// plus F16C, as GGML's do).
#[cfg(target_arch = "x86_64")]
pub(crate) fn has_avx512() -> bool {
    use std::sync::OnceLock;
    static HAS: OnceLock<bool> = OnceLock::new();
    *HAS.get_or_init(|| {
        is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512dq")
            && is_x86_feature_detected!("f16c")
            && is_x86_feature_detected!("fma")
    })
}
