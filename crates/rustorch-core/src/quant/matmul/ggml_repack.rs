//! Q4_K weights that llama.cpp repacks, multiplied in its repacked order.
//!
//! llama.cpp's model loader puts every 2-D Q4_K weight with a multiple of 8
//! rows into its CPU_REPACK buffer on AVX2 CPUs (`block_q4_Kx8`: eight
//! rows interleaved; repack.cpp, `ggml_repack_get_optimal_repack_type`),
//! except the tensors it reads as inputs (`token_embd`). Products with
//! those weights run `ggml_gemm_q4_K_8x8_q8_K` for the first `m - m % 4`
//! activation rows and `ggml_gemv_q4_K_8x8_q8_K` for the rest
//! (`forward_mul_mat_one_chunk`), and both sum differently from the
//! plain `vec_dot`: each output has one f32 lane of its own, and
//!
//! - gemv: per super-block `b`, `acc = fma(S_b, d_w * d_a, acc)` and
//!   `acc_min = fma(M_b, dmin_w * d_a, acc_min)`, where `S_b` is the whole
//!   super-block's scaled integer dot product and `M_b` the sum of
//!   `mins[g] * (sum of the activation's group g)`;
//! - gemm: the same, but once per pair of groups (`sb` in 0..4: groups
//!   `2sb` and `2sb + 1`), four FMAs per super-block for each sum;
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

use super::{OutPtr, QMatRef, QuantizedRows};
use crate::quant::blocks::{cast_blocks, f16_to_f32, scale_min_k4, BlockQ4K, BlockQ8K};
use crate::quant::QType;
use rayon::prelude::*;

/// Whether llama.cpp (on an AVX2 CPU) would repack a weight matrix of this
/// type and row count, and so multiply it in this module's order.
pub fn llama_repacks(qtype: QType, rows: usize) -> bool {
    qtype == QType::Q4K && rows.is_multiple_of(8)
}

/// The scaled integer sums of one Q4_K block with one Q8_K block for each
/// pair of groups: `s[sb]` the products, `m[sb]` the min terms.
#[inline(always)]
fn pair_sums(x: &BlockQ4K, y: &BlockQ8K) -> ([i32; 4], [i32; 4]) {
    let sm: [(u8, u8); 8] = std::array::from_fn(|g| scale_min_k4(g, &x.scales));
    let q8s: [i32; 8] = std::array::from_fn(|g| y.bsum(2 * g) as i32 + y.bsum(2 * g + 1) as i32);
    let mut s = [0i32; 4];
    let mut m = [0i32; 4];
    for sb in 0..4 {
        let chunk = &x.qs[32 * sb..32 * sb + 32];
        let (lo, hi) = (&y.qs[64 * sb..64 * sb + 32], &y.qs[64 * sb + 32..64 * sb + 64]);
        let mut dl = 0i32;
        let mut dh = 0i32;
        for e in 0..32 {
            dl += (chunk[e] & 0xF) as i32 * lo[e] as i32;
            dh += (chunk[e] >> 4) as i32 * hi[e] as i32;
        }
        let ((s0, m0), (s1, m1)) = (sm[2 * sb], sm[2 * sb + 1]);
        s[sb] = s0 as i32 * dl + s1 as i32 * dh;
        m[sb] = m0 as i32 * q8s[2 * sb] + m1 as i32 * q8s[2 * sb + 1];
    }
    (s, m)
}

/// One output in the gemv (`per_pair = false`) or gemm order, portably.
fn dot_portable(w: &[BlockQ4K], a: &[BlockQ8K], per_pair: bool) -> f32 {
    let mut acc = 0f32;
    let mut acc_min = 0f32;
    for (x, y) in w.iter().zip(a) {
        let (s, m) = pair_sums(x, y);
        let d = f16_to_f32(x.d) * y.scale();
        let dmin = f16_to_f32(x.dmin) * y.scale();
        if per_pair {
            for sb in 0..4 {
                acc = (s[sb] as f32).mul_add(d, acc);
                acc_min = (m[sb] as f32).mul_add(dmin, acc_min);
            }
        } else {
            let (s, m) = (s.iter().sum::<i32>(), m.iter().sum::<i32>());
            acc = (s as f32).mul_add(d, acc);
            acc_min = (m as f32).mul_add(dmin, acc_min);
        }
    }
    acc - acc_min
}

/// `out = act @ w^T` in llama.cpp's repacked order (shapes and types
/// checked by the caller; `w` is Q4_K, `act` Q8_K).
pub(super) fn product(w: &QMatRef<'_>, act: &QuantizedRows, out: &mut [f32]) {
    let (m, n) = (act.rows(), w.rows());
    let gemm_rows = m - m % 4;
    let acts: Vec<&[BlockQ8K]> = (0..m)
        .map(|i| cast_blocks(act.row(i)).expect("Q8_K activation rows are whole blocks"))
        .collect();
    let out_ptr = OutPtr(out.as_mut_ptr());
    const JB: usize = 8;
    (0..n.div_ceil(JB)).into_par_iter().for_each(|jb| {
        for j in jb * JB..((jb + 1) * JB).min(n) {
            let wr: &[BlockQ4K] = cast_blocks(w.row(j)).expect("Q4_K weight rows are whole blocks");
            for (i, a) in acts.iter().enumerate() {
                let v = dot_portable(wr, a, i < gemm_rows);
                // SAFETY: each task writes the outputs of its own weight
                // rows j (column j of every output row); see `OutPtr`.
                unsafe { out_ptr.write(i * n + j, v) };
            }
        }
    });
}
