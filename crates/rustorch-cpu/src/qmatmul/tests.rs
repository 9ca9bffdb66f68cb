//! The batched driver against the one-row kernels: tiling, the four-row
//! kernels and the leftover rows must give every output exactly the value
//! the one-row kernel of the same level gives for that pair of rows.

use super::{kernels, qmatmul_quantized_into, vec_dot_type, Isa, QMatRef, QuantizedRows};
use rustorch_core::quant::{QTensor, QType};

/// Deterministic values in [-1, 1).
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect()
}

#[test]
fn batched_outputs_equal_one_row_kernels() {
    // 37 and 70 weight rows divide by neither the weight tile (a multiple
    // of 4, or n / 8 rounded up) nor 4; m = 130 spans three activation
    // tiles of 64 with a partial one; the others cover the leftovers of
    // the four-row kernels.
    let types = [
        QType::Q4_0,
        QType::Q4_1,
        QType::Q5_0,
        QType::Q8_0,
        QType::IQ4NL,
        QType::Q4K,
        QType::Q5K,
        QType::Q6K,
    ];
    // (No type has a multiple of 8 rows here: llama.cpp repacks those
    // Q4_0, IQ4_NL and Q4_K weights and sums them in another order,
    // `ggml_repack`.)
    // F16 is not here: llama.cpp sums it in another order from two
    // activation rows on (tinyBLAS, not ggml_vec_dot_f16), and so does
    // `qmatmul`; tests/ggml_matmul.rs checks both paths against llama.cpp.
    let cols = 512;
    for (t, qtype) in types.into_iter().enumerate() {
        for rows in [37, 70] {
            let w = QTensor::quantize(qtype, [rows, cols], &values(rows * cols, 3 + t as u64)).unwrap();
            let mat = QMatRef::of_tensor(&w).unwrap();
            let dot = vec_dot_type(qtype).unwrap();
            for m in [1, 2, 3, 4, 5, 17, 64, 130] {
                if m >= super::ggml_tiled::MIN_ROWS && super::ggml_tiled::applies(qtype) {
                    // llama.cpp's tiled K-quant order (ggml_paths_tests.rs).
                    continue;
                }
                let act = QuantizedRows::quantize(dot, &values(m * cols, 100 + m as u64), cols).unwrap();
                for isa in Isa::ALL.into_iter().filter(|i| i.is_available()) {
                    let mut out = vec![f32::NAN; m * rows];
                    qmatmul_quantized_into(isa, &mat, &act, &mut out).unwrap();
                    let (level, one) = kernels::find(qtype, isa).unwrap();
                    // IQ4_NL: llama.cpp's batches (tinyBLAS) sum in another
                    // order than its matvecs (`kernels::batch`).
                    let one = kernels::batch(qtype, level).filter(|_| m > 1).unwrap_or(one);
                    for i in 0..m {
                        for j in 0..rows {
                            let wr = &w.bytes()[j * mat.row_bytes..(j + 1) * mat.row_bytes];
                            // SAFETY: `find` returned a level at or below
                            // `isa`, which is available; the rows match.
                            let want = unsafe { one(wr, act.row(i)) };
                            let got = out[i * rows + j];
                            assert!(want.is_finite(), "{qtype} ({i}, {j}): {want}");
                            assert_eq!(
                                got.to_bits(),
                                want.to_bits(),
                                "{qtype} {isa} rows={rows} m={m} ({i}, {j})"
                            );
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn batched_product_checks_shapes() {
    let w = QTensor::quantize(QType::Q4_0, [8, 64], &values(8 * 64, 1)).unwrap();
    let mat: QMatRef<'_> = QMatRef::of_tensor(&w).unwrap();
    let act = QuantizedRows::quantize(QType::Q8_0, &values(5 * 64, 2), 64).unwrap();
    let mut short = vec![0f32; 5 * 8 - 1];
    assert!(qmatmul_quantized_into(Isa::Scalar, &mat, &act, &mut short).is_err());
}

/// Interleaved Q4_K weights (`interleave_rows`) give the bits of the same
/// weights row after row, at every level this CPU has (the VNNI matvec,
/// the AVX-512 panels, the portable tiles) and batch size (matvec,
/// gemm rows with a gemv remainder), with several groups per task.
#[test]
fn interleaved_weights_multiply_like_rows() {
    let (rows, cols) = (72, 512);
    let w = QTensor::quantize(QType::Q4K, [rows, cols], &values(rows * cols, 41)).unwrap();
    let plain = QMatRef::of_tensor(&w).unwrap();
    let mut bytes = w.bytes().to_vec();
    super::interleave_rows(QType::Q4K, rows, cols, &mut bytes).unwrap();
    assert_ne!(bytes, w.bytes(), "the layout changed");
    let il = QMatRef::interleaved(QType::Q4K, rows, cols, &bytes).unwrap();
    assert!(il.repacked() && plain.repacked());
    for m in [1, 2, 3, 4, 5, 8, 9, 16, 33, 64, 65, 70] {
        let act = QuantizedRows::quantize(QType::Q8K, &values(m * cols, 200 + m as u64), cols).unwrap();
        for isa in Isa::ALL.into_iter().filter(|i| i.is_available()) {
            let (mut a, mut b) = (vec![f32::NAN; m * rows], vec![f32::NAN; m * rows]);
            qmatmul_quantized_into(isa, &plain, &act, &mut a).unwrap();
            qmatmul_quantized_into(isa, &il, &act, &mut b).unwrap();
            for (k, (x, y)) in a.iter().zip(&b).enumerate() {
                assert!(x.is_finite(), "{isa} m={m} output {k}: {x}");
                assert_eq!(x.to_bits(), y.to_bits(), "{isa} m={m} output {k}: {x} vs {y}");
            }
        }
    }
}

/// The interleaved layout only takes what it can hold: whole groups of
/// eight rows of Q4_K that llama.cpp repacks.
#[test]
fn interleaving_checks_its_input() {
    let w = QTensor::quantize(QType::Q4K, [12, 256], &values(12 * 256, 5)).unwrap();
    let mut bytes = w.bytes().to_vec();
    assert!(super::interleave_rows(QType::Q4K, 12, 256, &mut bytes).is_err());
    assert_eq!(bytes, w.bytes(), "a refused input is left as it was");
    assert!(QMatRef::interleaved(QType::Q4K, 12, 256, w.bytes()).is_err());
    let q8 = QTensor::quantize(QType::Q8_0, [8, 256], &values(8 * 256, 6)).unwrap();
    assert!(QMatRef::interleaved(QType::Q8_0, 8, 256, q8.bytes()).is_err());
}

/// Small Q6_K batches (straight from the weight rows) give the bits of
/// the panels in llama.cpp's tiled order, on both sides of the
/// small-batch limit.
#[cfg(target_arch = "x86_64")]
#[test]
fn small_q6k_batches_equal_the_panels() {
    use super::ggml_superblock::{q8k_rows, Order};
    if !Isa::Avx512Vnni.is_available() {
        eprintln!("skipped: this CPU has no AVX-512 VNNI");
        return;
    }
    let (rows, cols) = (72, 768);
    let w = QTensor::quantize(QType::Q6K, [rows, cols], &values(rows * cols, 43)).unwrap();
    let wm = QMatRef::of_tensor(&w).unwrap();
    for m in [8, 9, 16, 33, 64, 65] {
        let act = QuantizedRows::quantize(QType::Q8K, &values(m * cols, 300 + m as u64), cols).unwrap();
        let (mut a, mut b) = (vec![f32::NAN; m * rows], vec![f32::NAN; m * rows]);
        qmatmul_quantized_into(Isa::Avx512Vnni, &wm, &act, &mut a).unwrap();
        super::ggml_panel::product_vnni(Isa::Avx512Vnni, &wm, &q8k_rows(&act), &mut b, &|_| Order::Tiled);
        for (k, (x, y)) in a.iter().zip(&b).enumerate() {
            assert!(x.is_finite(), "m={m} output {k}: {x}");
            assert_eq!(x.to_bits(), y.to_bits(), "m={m} output {k}: {x} vs {y}");
        }
    }
}
