//! Weights that llama.cpp repacks, multiplied in its repacked order:
//! Q4_K and Q2_K here, Q4_0 and IQ4_NL in `ggml_repack_b32`.
//!
//! llama.cpp's model loader puts every 2-D Q4_K weight with a multiple of 8
//! rows into its CPU_REPACK buffer on AVX2 CPUs, and Q2_K ones on AVX-512
//! CPUs (`block_q4_Kx8`, `block_q2_Kx8`: eight rows interleaved;
//! repack.cpp, `ggml_repack_get_optimal_repack_type`), except the tensors
//! it reads as inputs (`token_embd`). We follow its AVX-512 build on every
//! CPU (the arithmetic is emulated where the instructions are missing).
//! Products with those weights run `ggml_gemm_*_8x8_q8_K` for the first
//! `m - m % 4` activation rows and `ggml_gemv_*_8x8_q8_K` for the rest
//! (`forward_mul_mat_one_chunk`), and both sum differently from the plain
//! `vec_dot`: each output has one f32 lane of its own, and
//!
//! - gemv: per super-block `b`, `acc = fma(S_b, d_w * d_a, acc)` and
//!   `acc_min = fma(M_b, dmin_w * d_a, acc_min)`, where `S_b` is the whole
//!   super-block's scaled integer dot product and `M_b` the sum of
//!   `mins[g] * (sum of the activation's group g)`;
//! - gemm: the same, but once per 64 values for Q4_K (groups `2sb` and
//!   `2sb + 1`: four FMAs per super-block for each sum) and once per 128
//!   for Q2_K (two);
//! - the output is `acc - acc_min`.
//!
//! The gemm's activations are quantized by `ggml_quantize_mat_q8_K_4x8`,
//! which picks the sign of the scale differently from
//! `quantize_row_q8_K` only when `+amax` and `-amax` both occur; then every
//! quant, scale and integer sum changes sign, and each product and FMA
//! above is sign-symmetric, so the bits are the same: plain Q8_K rows are
//! enough.
//!
//! Only the order matters for the bits, not where the bytes lie, so the
//! weights stay in GGUF's layout: the kernels read eight rows at a time
//! where llama.cpp reads one interleaved block.

use super::ggml_superblock::{q8k_rows, run_tiles, Order};
use super::{Isa, QMatRef, QuantizedRows};
use rustorch_core::quant::blocks::{BlockQ2K, BlockQ4K};
use rustorch_core::quant::QType;

/// Whether llama.cpp (on an AVX-512 CPU) would repack a weight matrix of this
/// type and row count, and so multiply it in its repacked order: Q4_0,
/// IQ4_NL (`ggml_repack_b32`), Q4_K and Q2_K (this module) with a
/// multiple of 8 rows (`ggml_repack_get_optimal_repack_type`).
pub fn llama_repacks(qtype: QType, rows: usize) -> bool {
    matches!(qtype, QType::Q4_0 | QType::IQ4NL | QType::Q4K | QType::Q2K) && rows.is_multiple_of(8)
}

/// Whether `product` runs `ggml_repack_gemv::gemv` (fewer than four
/// activation rows of Q4_K or Q2_K, with AVX-512 VNNI at or below `isa`).
#[cfg(target_arch = "x86_64")]
pub(super) fn gemv_applies(isa: Isa, w: &QMatRef<'_>, act: &QuantizedRows) -> bool {
    matches!(w.qtype(), QType::Q4K | QType::Q2K)
        && act.rows() < 4
        && isa >= Isa::Avx512Vnni
        && Isa::Avx512Vnni.is_available()
        && (!w.is_interleaved() || super::x8_gemv_available())
}

/// `out = act @ w^T` in llama.cpp's repacked order (shapes and types
/// checked by the caller; `w` is one of the types `llama_repacks`, `act`
/// its dot type). Q4_K and Q2_K: each weight row's super-blocks are
/// unpacked once (`ggml_superblock`), then met by every activation row.
pub(super) fn product(isa: Isa, w: &QMatRef<'_>, act: &QuantizedRows, out: &mut [f32]) {
    if matches!(w.qtype(), QType::Q4_0 | QType::IQ4NL) {
        super::ggml_repack_b32::product(isa, w, act, out);
        return;
    }
    let m = act.rows();
    let gemm_rows = m - m % 4;
    let acts = q8k_rows(act);
    #[cfg(target_arch = "x86_64")]
    if gemv_applies(isa, w, act) {
        // Matvec-like products: no weight row is met twice, so the blocks
        // are summed straight from their bytes (`ggml_repack_gemv`).
        super::ggml_repack_gemv::gemv(w, &acts, out);
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if w.qtype() == QType::Q4K
        && w.is_interleaved()
        && m <= super::ggml_repack_gemv::SMALL_BATCH_ROWS
        && isa >= Isa::Avx512Vnni
        && Isa::Avx512Vnni.is_available()
        && super::x8_gemv_available()
    {
        // A few rows: straight from the interleaved weights, no unpacking.
        super::ggml_repack_gemv::gemm_small(w, &acts, out);
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if w.qtype() == QType::Q4K && m < 4 && !w.is_interleaved() && isa >= Isa::Avx2 && Isa::Avx2.is_available() {
        // The gemv order without AVX-512 VNNI: straight from the blocks too.
        super::ggml_repack_gemv::gemv_q4k_avx2(w, &acts, out);
        return;
    }
    let (gemm, qtype) = match w.qtype() {
        QType::Q2K => (Order::RepackGemmHalves, QType::Q2K),
        _ => (Order::RepackGemm, QType::Q4K),
    };
    let order = |i: usize| if i < gemm_rows { gemm } else { Order::RepackGemv };
    if super::ggml_panel::available(isa) {
        super::ggml_panel::product(isa, w, &acts, out, &order);
        return;
    }
    if qtype == QType::Q2K {
        run_tiles::<BlockQ2K>(isa, w, &acts, &order, out);
    } else {
        run_tiles::<BlockQ4K>(isa, w, &acts, &order, out);
    }
}
