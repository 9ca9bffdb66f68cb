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
//! versions are the same arithmetic, faster, and some have AVX2 versions
//! (two 8-lane halves per 16-lane vector) for CPUs without AVX-512. The references are llama.cpp
//! 0.3.36's `ggml/src/ggml-cpu/{vec.h,vec.cpp,ops.cpp,llamafile/sgemm.cpp}`;
//! the tests compare with tensors that llama.cpp computed
//! (tests/ggml_ops.rs, fixtures from tools/gen_ggml_ops_fixtures.py).

pub(crate) mod attention;
pub(crate) mod bf16dot;
pub(crate) mod expf;
pub(crate) mod flash_attn;
pub(crate) mod floatdot;
pub(crate) mod geglu;
pub(crate) mod half_arith;
pub(crate) mod reduce;
pub(crate) mod softmax;
pub(crate) mod swiglu;

/// How far ahead of its read position a float matvec prefetches each
/// weight row (into the next rows once near a row's end). The hardware
/// prefetchers alone leave a single core's stream 10-25% short of
/// llama.cpp's at the same instructions on this project's AMD Zen 4
/// machine (F32 and F16 matvecs, one thread; 0.5-2 KiB ahead measured
/// no gain, 8-16 KiB the most).
pub(crate) const PREFETCH_AHEAD_BYTES: usize = 8192;
/// Rows shorter than this (attention's keys and values) are not
/// prefetched: the lines ahead would not be theirs.
pub(crate) const PREFETCH_MIN_ROW_BYTES: usize = 2048;

/// Prefetches the `bytes` (whole 64-byte lines) that start
/// `PREFETCH_AHEAD_BYTES` past `at`. A prefetch never faults, so the
/// address may lie past the end of the buffer.
///
/// # Safety
/// SSE (every x86-64 CPU).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) unsafe fn prefetch_ahead(at: *const u8, bytes: usize) {
    use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
    let p = at.wrapping_add(PREFETCH_AHEAD_BYTES) as *const i8;
    let mut o = 0;
    while o < bytes {
        // SAFETY: prefetching is a hint; it reads nothing architecturally.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(o)) };
        o += 64;
    }
}

/// Whether this CPU runs the AVX-512 versions (which need AVX-512 F and DQ
/// plus F16C, as GGML's do).
#[cfg(target_arch = "x86_64")]
pub(crate) fn has_avx512() -> bool {
    use std::sync::OnceLock;
    static HAS: OnceLock<bool> = OnceLock::new();
    *HAS.get_or_init(|| {
        is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512dq")
            && is_x86_feature_detected!("avx512vl")
            && is_x86_feature_detected!("f16c")
            && is_x86_feature_detected!("fma")
    })
}

/// Whether this CPU runs the AVX2 versions, for CPUs without AVX-512
/// (they need AVX2 and FMA, and F16C to widen f16 as the AVX-512 versions
/// do; every x86-64 CPU since Haswell and Zen 1 has all three).
#[cfg(target_arch = "x86_64")]
pub(crate) fn has_avx2_fma_f16c() -> bool {
    use std::sync::OnceLock;
    static HAS: OnceLock<bool> = OnceLock::new();
    *HAS.get_or_init(|| {
        is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c")
    })
}
