//! Q4_K and Q2_K weights that llama.cpp repacks, multiplied in its
//! repacked order.
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

use super::ggml_superblock::{run_tiles, Order};
use super::{Isa, QMatRef, QuantizedRows};
use crate::quant::blocks::{cast_blocks, BlockQ2K, BlockQ4K, BlockQ8K};
use crate::quant::QType;

/// Whether llama.cpp (on an AVX-512 CPU) would repack a weight matrix of this
/// type and row count, and so multiply it in this module's order.
pub fn llama_repacks(qtype: QType, rows: usize) -> bool {
    matches!(qtype, QType::Q4K | QType::Q2K) && rows.is_multiple_of(8)
}

/// `out = act @ w^T` in llama.cpp's repacked order (shapes and types
/// checked by the caller; `w` is Q4_K or Q2_K, `act` Q8_K). Each weight row's
/// super-blocks are unpacked once (`ggml_superblock`), then met by every
/// activation row.
pub(super) fn product(isa: Isa, w: &QMatRef<'_>, act: &QuantizedRows, out: &mut [f32]) {
    let m = act.rows();
    let gemm_rows = m - m % 4;
    let acts: Vec<&[BlockQ8K]> = (0..m)
        .map(|i| cast_blocks(act.row(i)).expect("Q8_K activation rows are whole blocks"))
        .collect();
    #[cfg(target_arch = "x86_64")]
    if gemm_rows == 0 && w.qtype() == QType::Q4K && isa >= Isa::Avx512Vnni && Isa::Avx512Vnni.is_available() {
        // Matvec-like products: no weight row is met twice, so the blocks
        // are summed straight from their bytes (`gemv_q4k_vnni`).
        gemv_q4k(w, &acts, out);
        return;
    }
    let (gemm, qtype) = match w.qtype() {
        QType::Q2K => (Order::RepackGemmHalves, QType::Q2K),
        _ => (Order::RepackGemm, QType::Q4K),
    };
    let order = |i: usize| if i < gemm_rows { gemm } else { Order::RepackGemv };
    if super::ggml_panel::available(isa) {
        super::ggml_panel::product(isa, w, act, out, &order);
        return;
    }
    if qtype == QType::Q2K {
        run_tiles::<BlockQ2K>(isa, w, &acts, &order, out);
    } else {
        run_tiles::<BlockQ4K>(isa, w, &acts, &order, out);
    }
}

/// Every output in the gemv order, Q4_K, with AVX-512 VNNI.
#[cfg(target_arch = "x86_64")]
fn gemv_q4k(w: &QMatRef<'_>, acts: &[&[BlockQ8K]], out: &mut [f32]) {
    use rayon::prelude::*;
    let n = w.rows();
    let out_ptr = super::OutPtr(out.as_mut_ptr());
    const JB: usize = 16;
    (0..n.div_ceil(JB)).into_par_iter().for_each(|jb| {
        for j in jb * JB..((jb + 1) * JB).min(n) {
            let wr: &[BlockQ4K] = cast_blocks(w.row(j)).expect("Q4_K weight rows are whole blocks");
            for (i, a) in acts.iter().enumerate() {
                // SAFETY: AVX-512 VNNI is available (the caller checked).
                let v = unsafe { gemv_q4k_vnni(wr, a) };
                // SAFETY: this task owns weight rows jb * JB.. (column j of
                // every output row); see `OutPtr`.
                unsafe { out_ptr.write(i * n + j, v) };
            }
        }
    });
}

/// One output in the gemv order: per super-block, the scaled integer sums
/// straight from the block's bytes (`vpdpbusd` on the 64 codes of each
/// pair of groups, `vpdpwssd` with their scales, as in `ggml_superblock`).
///
/// # Safety
/// AVX-512 F/BW/VL/VNNI, AVX2 and FMA must be available.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn gemv_q4k_vnni(w: &[BlockQ4K], a: &[BlockQ8K]) -> f32 {
    use crate::quant::blocks::{f16_to_f32, scale_min_k4};
    use std::arch::x86_64::*;
    let m4 = _mm256_set1_epi8(0xF);
    let (mut acc, mut acc_min) = (0f32, 0f32);
    for (x, y) in w.iter().zip(a) {
        let mut sc = [0i32; 8];
        let mut mp = 0i32;
        for (g, s) in sc.iter_mut().enumerate() {
            let (scale, min) = scale_min_k4(g, &x.scales);
            *s = scale as i32;
            mp += min as i32 * (y.bsum(2 * g) as i32 + y.bsum(2 * g + 1) as i32);
        }
        let mut total = _mm512_setzero_si512();
        for c in 0..4 {
            // SAFETY: 32 of the 128 quant bytes, 64 of the 256 activations.
            let (v, act) = unsafe {
                (
                    _mm256_loadu_si256(x.qs.as_ptr().add(32 * c).cast()),
                    _mm512_loadu_si512(y.qs.as_ptr().add(64 * c).cast()),
                )
            };
            let lo = _mm256_and_si256(v, m4);
            let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(v), m4);
            let codes = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi);
            let p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), codes, act);
            // Scales (below 64) in the low i16 of each lane: see
            // `ggml_superblock`; lanes 0..8 are group 2c, 8..16 group 2c + 1.
            let s = _mm512_mask_blend_epi32(0xFF00, _mm512_set1_epi32(sc[2 * c]), _mm512_set1_epi32(sc[2 * c + 1]));
            total = _mm512_dpwssd_epi32(total, p, s);
        }
        let s = _mm512_reduce_add_epi32(total);
        let d = f16_to_f32(x.d) * y.scale();
        let dmin = f16_to_f32(x.dmin) * y.scale();
        acc = (s as f32).mul_add(d, acc);
        acc_min = (mp as f32).mul_add(dmin, acc_min);
    }
    acc - acc_min
}
