//! llama.cpp's AMX build's order for K-quant weights (Q4_K, Q5_K, Q6_K,
//! IQ4_XS), the K-quant half of `RUSTORCH_GGML_ORDER=amx` (`amx_order`
//! has the legacy types).
//!
//! The AMX build keeps these weights in its AMX buffer too and multiplies
//! them with `tinygemm_kernel_vnni` (one activation row) or
//! `tinygemm_kernel_amx` and `acc_C` (more), `ggml-cpu/amx/mmq.cpp`. Both
//! form, per output and 256-value super-block, two exact integers
//!
//! ```text
//! S = sum_g sc_g * sum_{v in g} q_v * a_v     q signed: Q6_K's q - 32, IQ4_XS's level
//! M = sum_g m_g * sum_{v in g} a_v            Q4_K and Q5_K (their mins)
//! ```
//!
//! (`sc_g`, `m_g` the weight's group scales and mins, `a` the Q8_K
//! activations), then, from `acc = 0`, block after block,
//!
//! ```text
//! acc = fma(f32(S), d_w * d_a, acc)
//! acc = fma(-f32(M), dmin_w * d_a, acc)        types with mins
//! ```
//!
//! where the plain CPU build (the default order) takes other f32 steps:
//! per 16-value group, per 64-value chunk, or `f32(S) * d_w` first. The
//! activations are quantized as on the plain path (`quantize_row_q8_K_ref`
//! in both builds). The integers are exact, so any instructions that form
//! them give the AMX build's bits; the kernels here are the default
//! order's, with this order's f32 steps:
//!
//! - a few activation rows: Q4_K by `ggml_repack_gemv::gemv_rows` (from
//!   the interleaved layout or GGUF rows), Q6_K by `amx_cols_q6k`;
//! - batches and the other types: `ggml_panel` with `Order::Amx` (its AMX
//!   tile products where the CPU has them);
//! - without AVX-512 VNNI: `portable`, on the default order's portable
//!   integer sums.
//!
//! The tests spell the order out from the GGUF blocks (`tests::AmxSums`).
//!
//! It covers what llama.cpp's loader puts in the AMX buffer: matrices only
//! multiplied, rows a multiple of 32 and columns of 256
//! (`supports_op` in `ggml-cpu/amx/amx.cpp`).

// Group and value indices address several arrays.
#![allow(clippy::needless_range_loop)]

use super::ggml_superblock::{q8k_rows, run_tiles, Order};
use super::ggml_tiled::iq4xs_sum;
use super::{Isa, OutPtr, QMatRef, QuantizedRows};
use rayon::prelude::*;
use rustorch_core::quant::blocks::{f16_to_f32, BlockIQ4XS, BlockQ4K, BlockQ5K, BlockQ6K, BlockQ8K};
use rustorch_core::quant::QType;

/// A K-quant type with AMX kernels in llama.cpp, rows a multiple of 32,
/// columns of 256.
pub(super) fn shape_covered(qtype: QType, rows: usize, cols: usize) -> bool {
    matches!(qtype, QType::Q4K | QType::Q5K | QType::Q6K | QType::IQ4XS)
        && rows.is_multiple_of(32)
        && cols.is_multiple_of(256)
}

/// Every output without SIMD, from the default order's exact integers: the
/// shared super-block sums (`ggml_superblock`, `Order::Amx`) for Q4_K,
/// Q5_K and Q6_K, the tiled path's for IQ4_XS (rows of either layout).
fn portable(isa: Isa, w: &QMatRef<'_>, acts: &[&[BlockQ8K]], out: &mut [f32]) {
    let amx = |_: usize| Order::Amx;
    match w.qtype() {
        QType::Q4K => run_tiles::<BlockQ4K>(isa, w, acts, &amx, out),
        QType::Q5K => run_tiles::<BlockQ5K>(isa, w, acts, &amx, out),
        QType::Q6K => run_tiles::<BlockQ6K>(isa, w, acts, &amx, out),
        QType::IQ4XS => {
            let n = w.rows();
            let out_ptr = OutPtr(out.as_mut_ptr());
            (0..n).into_par_iter().for_each(|j| {
                let row: Vec<BlockIQ4XS> = w.row_blocks(j).collect();
                for (i, a) in acts.iter().enumerate() {
                    let v = row.iter().zip(a.iter()).fold(0f32, |acc, (x, y)| {
                        (iq4xs_sum(x, y) as f32).mul_add(f16_to_f32(x.d) * y.scale(), acc)
                    });
                    // SAFETY: this task alone writes weight row j's outputs
                    // (column j of every output row); see `OutPtr`.
                    unsafe { out_ptr.write(i * n + j, v) };
                }
            });
        }
        other => unreachable!("the AMX order has no {other} kernel (`shape_covered` said so)"),
    }
}

/// Activation rows below which products run as matvecs (each weight row
/// read once, straight from its bytes) rather than panels.
#[cfg(target_arch = "x86_64")]
const FEW_ROWS: usize = 4;

/// `out = act @ w^T` in the AMX build's order (`shape_covered` and the
/// caller's checks hold; `act` is Q8_K).
pub(super) fn product(isa: Isa, w: &QMatRef<'_>, act: &QuantizedRows, out: &mut [f32]) {
    let acts = q8k_rows(act);
    #[cfg(target_arch = "x86_64")]
    if acts.len() < FEW_ROWS && isa >= Isa::Avx512Vnni && Isa::Avx512Vnni.is_available() && few_rows(w, &acts, out) {
        return;
    }
    if super::ggml_panel::available(isa) {
        super::ggml_panel::product(isa, w, &acts, out, &|_| Order::Amx);
        return;
    }
    portable(isa, w, &acts, out);
}

/// The matvec kernels for a few activation rows (the caller checked
/// AVX-512 VNNI): Q4_K and Q6_K; false, doing nothing, for other types.
#[cfg(target_arch = "x86_64")]
fn few_rows(w: &QMatRef<'_>, acts: &[&[BlockQ8K]], out: &mut [f32]) -> bool {
    use super::kernels::kquants::cols512::amx_cols_q6k;
    use rustorch_core::quant::blocks::blocks_as_bytes;
    let n = w.rows();
    let bytes: Vec<&[u8]> = acts.iter().map(|a| blocks_as_bytes(a)).collect();
    let out_ptr = OutPtr(out.as_mut_ptr());
    match w.qtype() {
        QType::Q4K if !w.is_interleaved() || super::x8_gemv_available() => {
            let chunk = super::ggml_repack_gemv::chunk_rows(n);
            (0..n.div_ceil(chunk)).into_par_iter().for_each(|c| {
                let rows = c * chunk..((c + 1) * chunk).min(n);
                // SAFETY: this task alone writes these weight rows'
                // outputs; AVX-512 VNNI (the caller) and VBMI for
                // interleaved weights (checked above); rows % 32 == 0.
                unsafe { super::ggml_repack_gemv::gemv_rows::<true>(w, &bytes, rows, &out_ptr) };
            });
            true
        }
        QType::Q6K => {
            // Sixteen weight rows per task, four per kernel call.
            const JB: usize = 16;
            (0..n / JB).into_par_iter().for_each(|jb| {
                for j in (jb * JB..(jb + 1) * JB).step_by(4) {
                    let ws = [w.row(j), w.row(j + 1), w.row(j + 2), w.row(j + 3)];
                    for (i, a) in bytes.iter().enumerate() {
                        let mut r = [[0f32; 4]; 1];
                        // SAFETY: AVX-512 VNNI (the caller); the kernel
                        // checks the row lengths.
                        unsafe { amx_cols_q6k([a], ws, &mut r) };
                        for (k, v) in r[0].into_iter().enumerate() {
                            // SAFETY: this task alone writes weight rows
                            // jb * 16.. (columns of every output row).
                            unsafe { out_ptr.write(i * n + j + k, v) };
                        }
                    }
                }
            });
            true
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustorch_core::quant::blocks::{cast_blocks, scale_min_k4, Block, KVALUES_IQ4NL};
    use rustorch_core::quant::{dequantize, quantize};

    /// The sum of activation group `g` (16 values) of `y`.
    fn bsum(y: &BlockQ8K, g: usize) -> i32 {
        i16::from_le_bytes(y.bsums[g]) as i32
    }

    /// The order spelled out from the GGUF blocks (independently of the
    /// kernels): a weight type's super-block integers and scales.
    trait AmxSums: Block {
        /// Whether the type has mins (the second f32 step).
        const MINS: bool;
        /// `(S, M)` of one super-block against one activation block.
        fn sums(x: &Self, y: &BlockQ8K) -> (i32, i32);
        /// `(d_w, dmin_w)`, widened (`dmin_w` 0 without mins).
        fn scales(x: &Self) -> (f32, f32);
    }

    /// Q4_K and Q5_K: 8 groups of 32 with 6-bit scales and mins; `q(g, e)` is
    /// value `e` of group `g`.
    fn k4_sums(scales: &[u8; 12], y: &BlockQ8K, q: impl Fn(usize, usize) -> i32) -> (i32, i32) {
        let (mut s, mut m) = (0, 0);
        for g in 0..8 {
            let (sc, mn) = scale_min_k4(g, scales);
            let raw: i32 = (0..32).map(|e| q(g, e) * y.qs[32 * g + e] as i32).sum();
            s += sc as i32 * raw;
            m += mn as i32 * (bsum(y, 2 * g) + bsum(y, 2 * g + 1));
        }
        (s, m)
    }

    impl AmxSums for BlockQ4K {
        const MINS: bool = true;
        fn sums(x: &Self, y: &BlockQ8K) -> (i32, i32) {
            k4_sums(&x.scales, y, |g, e| {
                ((x.qs[32 * (g / 2) + e] >> (4 * (g % 2))) & 0xF) as i32
            })
        }
        fn scales(x: &Self) -> (f32, f32) {
            (f16_to_f32(x.d), f16_to_f32(x.dmin))
        }
    }

    impl AmxSums for BlockQ5K {
        const MINS: bool = true;
        fn sums(x: &Self, y: &BlockQ8K) -> (i32, i32) {
            k4_sums(&x.scales, y, |g, e| {
                let low = (x.qs[32 * (g / 2) + e] >> (4 * (g % 2))) & 0xF;
                let high = (x.qh[e] >> g) & 1;
                (low | high << 4) as i32
            })
        }
        fn scales(x: &Self) -> (f32, f32) {
            (f16_to_f32(x.d), f16_to_f32(x.dmin))
        }
    }

    impl AmxSums for BlockQ6K {
        const MINS: bool = false;
        fn sums(x: &Self, y: &BlockQ8K) -> (i32, i32) {
            let mut s = 0;
            for g in 0..16 {
                let raw: i32 = (16 * g..16 * g + 16)
                    .map(|v| {
                        // Value v = 128 h + 32 k + l: low bits in nibble k / 2
                        // of ql[64 h + 32 (k % 2) + l], high bits 2k.. of
                        // qh[32 h + l].
                        let (h, k, l) = (v / 128, (v % 128) / 32, v % 32);
                        let low = (x.ql[64 * h + 32 * (k % 2) + l] >> (4 * (k / 2))) & 0xF;
                        let high = (x.qh[32 * h + l] >> (2 * k)) & 3;
                        ((low | high << 4) as i32 - 32) * y.qs[v] as i32
                    })
                    .sum();
                s += x.scales[g] as i32 * raw;
            }
            (s, 0)
        }
        fn scales(x: &Self) -> (f32, f32) {
            (f16_to_f32(x.d), 0.0)
        }
    }

    impl AmxSums for BlockIQ4XS {
        const MINS: bool = false;
        fn sums(x: &Self, y: &BlockQ8K) -> (i32, i32) {
            let sh = u16::from_le_bytes(x.scales_h);
            let mut s = 0;
            for g in 0..8 {
                let lo = (x.scales_l[g / 2] >> (4 * (g % 2))) & 0xF;
                let ls = (lo | (((sh >> (2 * g)) & 3) as u8) << 4) as i32 - 32;
                let raw: i32 = (0..32)
                    .map(|e| {
                        let q = (x.qs[16 * g + e % 16] >> (4 * (e / 16))) & 0xF;
                        KVALUES_IQ4NL[q as usize] as i32 * y.qs[32 * g + e] as i32
                    })
                    .sum();
                s += ls * raw;
            }
            (s, 0)
        }
        fn scales(x: &Self) -> (f32, f32) {
            (f16_to_f32(x.d), 0.0)
        }
    }

    /// One weight row against one activation row, the order spelled out.
    fn dot<W: AmxSums>(w: &[W], a: &[BlockQ8K]) -> f32 {
        let mut acc = 0f32;
        for (x, y) in w.iter().zip(a) {
            let (s, m) = W::sums(x, y);
            let (d, dmin) = W::scales(x);
            acc = (s as f32).mul_add(d * y.scale(), acc);
            if W::MINS {
                acc = (-(m as f32)).mul_add(dmin * y.scale(), acc);
            }
        }
        acc
    }

    fn values(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed;
        (0..n)
            .map(|_| {
                s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 2.0
            })
            .collect()
    }

    /// Every output, the order spelled out from the GGUF blocks.
    fn spelled_out<W: AmxSums>(w: &[u8], rows: usize, act: &QuantizedRows) -> Vec<f32> {
        let acts = q8k_rows(act);
        let ws: &[W] = cast_blocks(w).expect("whole blocks");
        let nb = ws.len() / rows;
        let mut out = vec![0f32; acts.len() * rows];
        for (i, a) in acts.iter().enumerate() {
            for j in 0..rows {
                out[i * rows + j] = dot(&ws[j * nb..(j + 1) * nb], a);
            }
        }
        out
    }

    fn check<W: AmxSums>(qtype: QType) {
        let (rows, cols) = (64, 512);
        let w = quantize(qtype, &values(rows * cols, 7)).expect("quantizes");
        for m in [1, 2, 3, 5, 40] {
            let act = QuantizedRows::quantize(QType::Q8K, &values(m * cols, 11 + m as u64), cols).expect("activations");
            let want = spelled_out::<W>(&w, rows, &act);
            let mut layouts = vec![("gguf", w.clone())];
            if super::super::interleave_pays(qtype, rows) {
                let mut x8 = w.clone();
                super::super::interleave_rows(qtype, rows, cols, &mut x8).expect("interleaves");
                layouts.push(("x8", x8));
            }
            for (layout, bytes) in &layouts {
                let wm = if *layout == "x8" {
                    QMatRef::interleaved(qtype, rows, cols, bytes).expect("matrix")
                } else {
                    QMatRef::new(qtype, rows, cols, bytes).expect("matrix")
                };
                for isa in Isa::ALL.into_iter().filter(|i| i.is_available()) {
                    let mut got = vec![f32::NAN; m * rows];
                    product(isa, &wm, &act, &mut got);
                    for (k, (g, e)) in got.iter().zip(&want).enumerate() {
                        assert_eq!(
                            g.to_bits(),
                            e.to_bits(),
                            "{qtype} {layout} {isa} m={m}: output {k}: {g} against {e}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn products_equal_the_order_spelled_out() {
        check::<BlockQ4K>(QType::Q4K);
        check::<BlockQ5K>(QType::Q5K);
        check::<BlockQ6K>(QType::Q6K);
        check::<BlockIQ4XS>(QType::IQ4XS);
    }

    /// The spelled-out order is not the default one (else the tests above
    /// could not tell the orders apart), and its integers are the
    /// dequantized values' (a sanity check of `AmxSums`).
    #[test]
    fn the_order_differs_from_the_default_and_sums_the_values() {
        let (rows, cols) = (32, 2048);
        let x = values(cols, 5);
        let act = QuantizedRows::quantize(QType::Q8K, &x, cols).expect("activations");
        for qtype in [QType::Q4K, QType::Q5K, QType::Q6K, QType::IQ4XS] {
            let w = quantize(qtype, &values(rows * cols, 3)).expect("quantizes");
            let wm = QMatRef::new(qtype, rows, cols, &w).expect("matrix");
            let want = match qtype {
                QType::Q4K => spelled_out::<BlockQ4K>(&w, rows, &act),
                QType::Q5K => spelled_out::<BlockQ5K>(&w, rows, &act),
                QType::Q6K => spelled_out::<BlockQ6K>(&w, rows, &act),
                _ => spelled_out::<BlockIQ4XS>(&w, rows, &act),
            };
            let mut default = vec![0f32; rows];
            super::super::qmatmul_quantized_into(Isa::detected(), &wm.with_repack(false), &act, &mut default)
                .expect("the default order");
            let differ = want
                .iter()
                .zip(&default)
                .filter(|(a, b)| a.to_bits() != b.to_bits())
                .count();
            assert!(differ > 0, "{qtype}: no output differs from the default order");
            // Against f64 sums of the dequantized weights and activations.
            let wf = dequantize(qtype, &w, rows * cols).expect("dequantizes");
            let af = dequantize(QType::Q8K, act.row(0), cols).expect("dequantizes");
            for j in 0..rows {
                let exact: f64 = (0..cols).map(|c| wf[j * cols + c] as f64 * af[c] as f64).sum();
                let scale: f64 = (0..cols).map(|c| (wf[j * cols + c] as f64 * af[c] as f64).abs()).sum();
                assert!(
                    (want[j] as f64 - exact).abs() <= 1e-5 * scale.max(1e-6),
                    "{qtype} row {j}: {} against {exact}",
                    want[j]
                );
            }
        }
    }
}
