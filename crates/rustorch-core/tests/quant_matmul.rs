//! Quantized matmul (`quant::matmul`) for every weight type and every
//! instruction-set level this CPU has, checked against two independent
//! references computed here in f64:
//!
//! 1. the exact product of the operands the kernels see: the dequantized
//!    weights and the dequantized activation rows (after quantization to
//!    the dot type). Integer dot products are exact, so the only error left
//!    is f32 rounding of the per-block terms and their sum;
//! 2. the product of the dequantized weights with the original f32
//!    activations, within the error that quantizing the activations adds.
//!
//! The kernels at each level are also compared with the scalar kernel.

use rustorch_core::quant::blocks::{cast_blocks, f16_to_f32, BlockQ4_1, BlockQ5_1, BlockQ8_1};
use rustorch_core::quant::{self, QTensor, QType, QuantError};
use rustorch_cpu::qmatmul::{self, Isa, QMatRef, QuantizedRows};

const TYPES: [QType; 17] = [
    QType::F32,
    QType::F16,
    QType::BF16,
    QType::Q4_0,
    QType::Q4_1,
    QType::Q5_0,
    QType::Q5_1,
    QType::Q8_0,
    QType::Q8_1,
    QType::Q2K,
    QType::Q3K,
    QType::Q4K,
    QType::Q5K,
    QType::Q6K,
    QType::Q8K,
    QType::IQ4NL,
    QType::IQ4XS,
];

/// Deterministic samples (xorshift64* + Box-Muller).
struct Rng(u64);

impl Rng {
    fn uniform(&mut self) -> f64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        ((self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }

    /// Normal values whose scale changes every 32 values, with a few
    /// outliers and an all-zero stretch, like real weights and activations.
    fn values(&mut self, n: usize) -> Vec<f32> {
        let mut scale = 1.0;
        (0..n)
            .map(|i| {
                if i % 32 == 0 {
                    scale = 10f64.powf(self.uniform() * 3.0 - 2.0);
                }
                if (64..96).contains(&(i % 1024)) {
                    return 0.0;
                }
                let (u, v) = (self.uniform(), self.uniform());
                let z = (-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos() * scale;
                (if self.uniform() < 0.01 { z * 8.0 } else { z }) as f32
            })
            .collect()
    }
}

fn available_isas() -> Vec<Isa> {
    Isa::ALL.into_iter().filter(|i| i.is_available()).collect()
}

struct Problem {
    qtype: QType,
    w: QTensor,
    x: Vec<f32>,
    rows: usize,
    cols: usize,
    m: usize,
}

impl Problem {
    fn new(qtype: QType, rows: usize, cols: usize, m: usize, seed: u64) -> Problem {
        let mut rng = Rng(seed);
        let w = QTensor::quantize(qtype, [rows, cols], &rng.values(rows * cols)).expect("quantize weights");
        let x = rng.values(m * cols);
        Problem {
            qtype,
            w,
            x,
            rows,
            cols,
            m,
        }
    }

    fn weights(&self) -> Vec<f64> {
        let w = quant::dequantize(self.qtype, self.w.bytes(), self.rows * self.cols).expect("dequantize weights");
        w.into_iter().map(f64::from).collect()
    }

    fn run(&self, isa: Isa) -> Vec<f32> {
        let mat = QMatRef::of_tensor(&self.w).expect("matrix view");
        qmatmul::qmatmul_isa(isa, &mat, &self.x).unwrap_or_else(|e| panic!("{} {isa}: {e}", self.qtype))
    }
}

/// For the `_1` types the activation block carries s = d * sum(q), which the
/// kernels use for the weight-minimum term m_w * s_a. It is computed from
/// the f32 scale (the dequantized activations use the f16 one: relative
/// 2^-11) and then rounded to f16 (another 2^-11): an error of up to 2^-10
/// relative that the exact-operand reference does not have. Returns its
/// bound per (activation row, weight row).
fn s_rounding_bound(p: &Problem, act: &QuantizedRows, i: usize, j: usize) -> f64 {
    let row_bytes = p.qtype.bytes_for(p.cols).unwrap();
    let wrow = &p.w.bytes()[j * row_bytes..(j + 1) * row_bytes];
    let mins: Vec<f32> = match p.qtype {
        QType::Q4_1 => cast_blocks::<BlockQ4_1>(wrow)
            .unwrap()
            .iter()
            .map(|b| f16_to_f32(b.m))
            .collect(),
        QType::Q5_1 => cast_blocks::<BlockQ5_1>(wrow)
            .unwrap()
            .iter()
            .map(|b| f16_to_f32(b.m))
            .collect(),
        _ => return 0.0,
    };
    let a = cast_blocks::<BlockQ8_1>(act.row(i)).unwrap();
    mins.iter()
        .zip(a)
        .map(|(m, b)| (*m as f64 * f16_to_f32(b.s) as f64).abs() * 2f64.powi(-10) * 1.01)
        .sum()
}

#[test]
fn every_format_has_a_kernel() {
    let missing: Vec<_> = TYPES.iter().filter(|t| !qmatmul::can_matmul(**t)).collect();
    assert!(missing.is_empty(), "no matmul kernel for {missing:?}");
    for t in TYPES {
        eprintln!(
            "{t}: dot type {:?}, kernels up to {:?}",
            qmatmul::vec_dot_type(t),
            qmatmul::kernel_isa(t)
        );
    }
}

#[test]
fn kernels_compute_the_exact_product_of_their_operands() {
    for (n, &qtype) in TYPES.iter().enumerate() {
        if !qmatmul::can_matmul(qtype) {
            continue; // reported by every_format_has_a_kernel
        }
        for (rows, cols, m) in [(37, 512, 1), (19, 1024, 4)] {
            let p = Problem::new(qtype, rows, cols, m, 1 + n as u64 * 7919 + m as u64);
            let dot = qmatmul::vec_dot_type(qtype).unwrap();
            let act = QuantizedRows::quantize(dot, &p.x, cols).unwrap();
            let w = p.weights();
            for isa in available_isas() {
                let got = p.run(isa);
                for i in 0..m {
                    let a: Vec<f64> = quant::dequantize(dot, act.row(i), cols)
                        .unwrap()
                        .into_iter()
                        .map(f64::from)
                        .collect();
                    for j in 0..rows {
                        let wr = &w[j * cols..(j + 1) * cols];
                        let exact: f64 = wr.iter().zip(&a).map(|(x, y)| x * y).sum();
                        let magnitude: f64 = wr.iter().zip(&a).map(|(x, y)| (x * y).abs()).sum();
                        // f32 rounding: at most one rounding per block term
                        // and per addition, n * 2^-24 relative to the sum of
                        // magnitudes for n values (the float types round
                        // each product), doubled for scale products.
                        let tol = magnitude * cols as f64 * 2f64.powi(-23) + s_rounding_bound(&p, &act, i, j) + 1e-30;
                        let g = got[i * rows + j] as f64;
                        assert!(
                            (g - exact).abs() <= tol,
                            "{qtype} {isa} [{i},{j}]: got {g}, exact {exact}, tol {tol}"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn simd_kernels_agree_with_the_scalar_kernel() {
    for (n, &qtype) in TYPES.iter().enumerate() {
        if !qmatmul::can_matmul(qtype) {
            continue;
        }
        let p = Problem::new(qtype, 24, 4096 + 256, 3, 99 + n as u64);
        let scalar = p.run(Isa::Scalar);
        let dot = qmatmul::vec_dot_type(qtype).unwrap();
        let act = QuantizedRows::quantize(dot, &p.x, p.cols).unwrap();
        let w = p.weights();
        for isa in available_isas().into_iter().filter(|i| *i != Isa::Scalar) {
            let got = p.run(isa);
            for i in 0..p.m {
                let a = quant::dequantize(dot, act.row(i), p.cols).unwrap();
                for j in 0..p.rows {
                    let magnitude: f64 = w[j * p.cols..(j + 1) * p.cols]
                        .iter()
                        .zip(&a)
                        .map(|(x, y)| (x * *y as f64).abs())
                        .sum();
                    // Same integer sums; only the order of f32 additions
                    // of block terms differs.
                    let tol = magnitude * 1e-5 + 1e-30;
                    let (g, s) = (got[i * p.rows + j], scalar[i * p.rows + j]);
                    assert!(
                        ((g - s) as f64).abs() <= tol,
                        "{qtype} {isa} [{i},{j}]: {g} vs scalar {s} (tol {tol})"
                    );
                }
            }
        }
    }
}

/// The error that quantizing one activation block to the dot type adds per
/// value: rounding to the nearest step d/2, with d = amax/127 itself
/// rounded to f16 (relative 2^-11, times |q| <= 127) for Q8_0/Q8_1.
fn activation_error(dot: QType, block: &[f32]) -> Vec<f64> {
    let amax = block.iter().fold(0f64, |m, v| m.max(v.abs() as f64));
    match dot {
        QType::F32 => vec![0.0; block.len()],
        QType::F16 => block.iter().map(|v| v.abs() as f64 * 2f64.powi(-11)).collect(),
        QType::BF16 => block.iter().map(|v| v.abs() as f64 * 2f64.powi(-8)).collect(),
        QType::Q8_0 | QType::Q8_1 => vec![amax / 254.0 + amax * 2f64.powi(-11); block.len()],
        QType::Q8K => vec![amax / 254.0 * 1.0001; block.len()],
        other => panic!("unexpected dot type {other}"),
    }
}

#[test]
fn results_approximate_the_float_product() {
    for (n, &qtype) in TYPES.iter().enumerate() {
        if !qmatmul::can_matmul(qtype) {
            continue;
        }
        let (rows, cols, m) = (16, 768, 3);
        let p = Problem::new(qtype, rows, cols, m, 4242 + n as u64);
        let dot = qmatmul::vec_dot_type(qtype).unwrap();
        let block = dot.block_size();
        let w = p.weights();
        let got = p.run(Isa::detected());
        for i in 0..m {
            let x = &p.x[i * cols..(i + 1) * cols];
            let err: Vec<f64> = x.chunks(block).flat_map(|b| activation_error(dot, b)).collect();
            for j in 0..rows {
                let wr = &w[j * cols..(j + 1) * cols];
                let want: f64 = wr.iter().zip(x).map(|(a, b)| a * *b as f64).sum();
                let magnitude: f64 = wr.iter().zip(x).map(|(a, b)| (a * *b as f64).abs()).sum();
                let tol: f64 = wr.iter().zip(&err).map(|(a, e)| a.abs() * e).sum::<f64>() * 1.01
                    + magnitude * cols as f64 * 2f64.powi(-23)
                    + 1e-30;
                let g = got[i * rows + j] as f64;
                assert!(
                    (g - want).abs() <= tol,
                    "{qtype} [{i},{j}]: got {g}, float product {want}, tol {tol}"
                );
            }
        }
    }
}

#[test]
fn activations_round_as_llama_cpp_x86_does() {
    // amax = 127 makes the step exactly 1, so x.5 values are ties: the AVX
    // path rounds them to even (`_mm256_round_ps`), where the reference
    // quantizer's roundf would round away from zero.
    let mut x = vec![0f32; 32];
    x[..8].copy_from_slice(&[127.0, 0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 3.25]);
    let act = QuantizedRows::quantize(QType::Q8_0, &x, 32).unwrap();
    let row = act.row(0);
    assert_eq!(f16_to_f32([row[0], row[1]]), 1.0);
    let q: Vec<i8> = row[2..10].iter().map(|b| *b as i8).collect();
    assert_eq!(q, [127, 0, 2, 2, 0, -2, -2, 3]);

    let act = QuantizedRows::quantize(QType::Q8_1, &x, 32).unwrap();
    let b = &cast_blocks::<BlockQ8_1>(act.row(0)).unwrap()[0];
    assert_eq!(f16_to_f32(b.s), (127 + 2 + 2 - 2 - 2 + 3) as f32);

    // The scale is amax / 127 and the multiplier 127 / amax (not 1 / d).
    let x: Vec<f32> = (0..32).map(|i| (i as f32 - 15.3) * 0.37).collect();
    let act = QuantizedRows::quantize(QType::Q8_0, &x, 32).unwrap();
    let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
    let row = act.row(0);
    assert_eq!(f16_to_f32([row[0], row[1]]), half::f16::from_f32(amax / 127.0).to_f32());
    for (k, v) in x.iter().enumerate() {
        assert_eq!(
            row[2 + k] as i8,
            (v * (127.0 / amax)).round_ties_even() as i8,
            "value {k}"
        );
    }
}

#[test]
fn bad_shapes_and_types_are_errors() {
    let p = Problem::new(QType::Q8_0, 4, 64, 1, 5);
    let mat = QMatRef::of_tensor(&p.w).unwrap();
    // Activations that are not whole rows.
    assert!(qmatmul::qmatmul(&mat, &p.x[..63]).is_err());
    // Wrong number of bytes for the shape.
    assert!(matches!(
        QMatRef::new(QType::Q8_0, 4, 64, &p.w.bytes()[1..]),
        Err(QuantError::ByteLength { .. })
    ));
    // A row that is not whole blocks.
    assert!(matches!(
        QMatRef::new(QType::Q4K, 1, 100, &[]),
        Err(QuantError::NotWholeBlocks { .. })
    ));
    // Activations in the wrong dot type.
    let act = QuantizedRows::quantize(QType::Q8K, &vec![1.0; 256], 256).unwrap();
    let w = QTensor::quantize(QType::Q8_0, [2, 256], &vec![0.5; 512]).unwrap();
    let mut out = vec![0f32; 2];
    let err =
        qmatmul::qmatmul_quantized_into(Isa::Scalar, &QMatRef::of_tensor(&w).unwrap(), &act, &mut out).unwrap_err();
    assert!(err.to_string().contains("Q8_0 weights need Q8_0 activations"), "{err}");
    // Output of the wrong size.
    let act = QuantizedRows::quantize(QType::Q8_0, &vec![1.0; 256], 256).unwrap();
    assert!(
        qmatmul::qmatmul_quantized_into(Isa::Scalar, &QMatRef::of_tensor(&w).unwrap(), &act, &mut out[..1]).is_err()
    );
    // A type without a kernel.
    let w = QMatRef::new(QType::IQ2XXS, 1, 256, &[0u8; 66]).unwrap();
    assert!(matches!(
        qmatmul::qmatmul(&w, &[0.0; 256]),
        Err(QuantError::Unsupported { .. })
    ));
}

#[test]
fn matvec_and_batched_products_agree() {
    // The driver takes different paths for one row and for many; every
    // row of a batch must equal the matvec of that row: bit for bit where
    // llama.cpp's order is the same for both (Q4_0; F16 at 70 rows, which
    // is not a multiple of 4, so tinyBLAS is not chosen), and within float
    // rounding for the K-quants, whose batches of 8 or more rows take
    // llama.cpp's tiled path (one FMA per super-block) instead of vec_dot.
    // Both orders round each of 2 super-blocks' partial sums once or twice,
    // so 1e-5 of the row's largest magnitude is ample, and any real error
    // (a wrong block or scale) is orders of magnitude larger.
    for qtype in [QType::Q4_0, QType::Q4K, QType::F16] {
        if !qmatmul::can_matmul(qtype) {
            continue;
        }
        let p = Problem::new(qtype, 70, 512, 9, 17);
        let mat = QMatRef::of_tensor(&p.w).unwrap();
        let batch = qmatmul::qmatmul(&mat, &p.x).unwrap();
        for i in 0..p.m {
            let one = qmatmul::qmatmul(&mat, &p.x[i * p.cols..(i + 1) * p.cols]).unwrap();
            let row = &batch[i * p.rows..(i + 1) * p.rows];
            if qtype == QType::Q4K {
                let scale = row.iter().fold(0f32, |m, v| m.max(v.abs())).max(1.0);
                for (j, (a, b)) in one.iter().zip(row).enumerate() {
                    assert!((a - b).abs() <= 1e-5 * scale, "{qtype} row {i} col {j}: {a} vs {b}");
                }
            } else {
                assert_eq!(one, row, "{qtype} row {i}");
            }
        }
    }
}
