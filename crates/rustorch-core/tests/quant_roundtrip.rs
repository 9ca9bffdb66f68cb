//! Quantization by round trips: for every type, dequantize(quantize(x))
//! stays within a per-type error of x, quantizing the result again moves it
//! little, bad inputs never panic, and size errors are reported.
//!
//! K-quants, IQ4 and Q8_K/Q8_1 have no quantizer in the `gguf` package, so
//! these bounds (plus the numpy ports in quant_fixtures for Q8_1/Q8_K) are
//! what checks them; the legacy types are also byte-checked there.

// Ops run on the CPU backend, which registers itself once linked.
use rustorch_core::quant::{self, QTensor, QType, QuantError};
use rustorch_cpu as _;

/// Deterministic normal samples (xorshift64* + Box-Muller).
struct Rng(u64);

impl Rng {
    fn uniform(&mut self) -> f64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        ((self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }

    fn normal(&mut self) -> f32 {
        let (u, v) = (self.uniform(), self.uniform());
        ((-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()) as f32
    }

    /// Rows with a varying scale and a few outliers, like real weights.
    fn weights(&mut self, n: usize) -> Vec<f32> {
        let mut x = Vec::with_capacity(n);
        let mut scale = 1.0;
        for i in 0..n {
            if i % 256 == 0 {
                scale = (10f64).powf(self.uniform() * 4.0 - 3.0) as f32;
            }
            let v = self.normal() * scale;
            x.push(if self.uniform() < 0.01 { v * 6.0 } else { v });
        }
        x
    }
}

fn rms(x: &[f32]) -> f64 {
    (x.iter().map(|&v| (v as f64).powi(2)).sum::<f64>() / x.len() as f64).sqrt()
}

/// RMS of the error over each 256-value row, relative to that row's RMS,
/// averaged over rows (so that rows of every magnitude count alike).
fn rel_rmse(got: &[f32], want: &[f32]) -> f64 {
    let rows = got.chunks(256).zip(want.chunks(256));
    let n = got.len().div_ceil(256) as f64;
    rows.map(|(g, w)| {
        let diff: Vec<f32> = g.iter().zip(w).map(|(a, b)| a - b).collect();
        rms(&diff) / rms(w).max(1e-30)
    })
    .sum::<f64>()
        / n
}

/// (type, bound on the relative RMSE of one round trip). The bounds are
/// about 1.3x the errors measured on these inputs (printed by the test with
/// --nocapture): F16 0.0002, BF16 0.0017, Q8_0 0.0074, Q8_K 0.0143, Q6_K
/// 0.023, Q5_K 0.042, Q5_1 0.044, Q5_0 0.059, Q4_K 0.085, Q4_1 0.090,
/// IQ4_NL/IQ4_XS 0.097, Q4_0 0.117, Q3_K 0.179, Q2_K 0.323.
const BOUNDS: [(QType, f64); 17] = [
    (QType::F32, 0.0),
    (QType::F16, 4e-4),
    (QType::BF16, 3e-3),
    (QType::Q8_0, 0.0095),
    (QType::Q8_1, 0.0095),
    (QType::Q8K, 0.018),
    (QType::Q6K, 0.029),
    (QType::Q5_0, 0.072),
    (QType::Q5_1, 0.057),
    (QType::Q5K, 0.054),
    (QType::Q4_0, 0.145),
    (QType::Q4_1, 0.115),
    (QType::Q4K, 0.105),
    (QType::IQ4NL, 0.122),
    (QType::IQ4XS, 0.122),
    (QType::Q3K, 0.23),
    (QType::Q2K, 0.42),
];

#[test]
fn round_trip_error_is_bounded_per_type() {
    let x = Rng(0x5EED).weights(64 * 256);
    let mut report = String::new();
    for (t, bound) in BOUNDS {
        let q = quant::quantize(t, &x).unwrap_or_else(|e| panic!("{t}: {e}"));
        assert_eq!(q.len(), t.bytes_for(x.len()).unwrap_or(0), "{t}");
        let y = quant::dequantize(t, &q, x.len()).unwrap_or_else(|e| panic!("{t}: {e}"));
        let err = rel_rmse(&y, &x);
        report += &format!("{t}: relative RMSE {err:.5} (bound {bound})\n");
        assert!(err <= bound, "{t}: relative RMSE {err} above {bound}");
        if t.is_quantized() {
            // Not trivially exact either: a quantizer that copied its input
            // would be caught above, one that did nothing is caught here.
            assert!(err > 0.0, "{t}: a lossy type reproduced its input exactly");
        }
    }
    println!("{report}");
}

#[test]
fn requantizing_dequantized_values_is_stable() {
    // y = deq(q(x)) lies on the type's grid, so quantizing it again must
    // land very near y: far nearer than y is to x.
    let x = Rng(77).weights(32 * 256);
    let mut report = String::new();
    for (t, _) in BOUNDS {
        if !t.is_quantized() {
            continue;
        }
        let y = quant::dequantize(t, &quant::quantize(t, &x).expect("q"), x.len()).expect("dq");
        let y2 = quant::dequantize(t, &quant::quantize(t, &y).expect("q"), x.len()).expect("dq");
        let first = rel_rmse(&y, &x);
        let drift = rel_rmse(&y2, &y);
        report += &format!("{t}: first {first:.5}, drift {drift:.6}\n");
        assert!(
            drift <= 0.25 * first,
            "{t}: requantizing moved values by {drift} (first error {first})"
        );
        // A third pass must not drift further away.
        let y3 = quant::dequantize(t, &quant::quantize(t, &y2).expect("q"), x.len()).expect("dq");
        assert!(rel_rmse(&y3, &y) <= 0.35 * first, "{t}: drift grows");
    }
    println!("{report}");
}

#[test]
fn legacy_types_reproduce_their_own_grid_exactly() {
    // Values d * q with d a power of two and the extreme q present are on
    // the grid: the reference quantizers must give them back unchanged.
    let mut rng = Rng(3);
    let d = 0.125f32;
    let mut x: Vec<f32> = (0..256)
        .map(|_| ((rng.uniform() * 16.0) as i32 - 8) as f32 * d)
        .collect();
    for b in x.chunks_mut(32) {
        b[5] = -8.0 * d; // the largest magnitude is negative, as Q4_0 needs
    }
    for t in [QType::Q4_0, QType::Q5_0] {
        let y = quant::dequantize(t, &quant::quantize(t, &x).expect("q"), x.len()).expect("dq");
        assert_eq!(y, x, "{t}");
    }
    // Q8: d = amax / 127, so amax = 127 * 2^-3 gives d = 2^-3 exactly.
    let mut x: Vec<f32> = (0..256)
        .map(|_| ((rng.uniform() * 255.0) as i32 - 127) as f32 * d)
        .collect();
    for b in x.chunks_mut(32) {
        b[7] = 127.0 * d;
    }
    for t in [QType::Q8_0, QType::Q8_1] {
        let y = quant::dequantize(t, &quant::quantize(t, &x).expect("q"), x.len()).expect("dq");
        assert_eq!(y, x, "{t}");
    }
}

#[test]
fn q8_activation_blocks_carry_their_sums() {
    use rustorch_core::quant::blocks::{cast_blocks, f16_to_f32, BlockQ8K, BlockQ8_1};
    let x = Rng(9).weights(4 * 256);
    let q = quant::quantize(QType::Q8K, &x).expect("q8k");
    let blocks: &[BlockQ8K] = cast_blocks(&q).expect("whole blocks");
    assert_eq!(blocks.len(), 4);
    for b in blocks {
        for g in 0..16 {
            let sum: i32 = b.qs[16 * g..16 * g + 16].iter().map(|&v| v as i32).sum();
            assert_eq!(b.bsum(g) as i32, sum);
        }
        assert!(b.qs.iter().all(|&v| v >= -127), "Q8_K quants stay in [-127, 127]");
    }
    let q = quant::quantize(QType::Q8_1, &x).expect("q8_1");
    for (b, x) in cast_blocks::<BlockQ8_1>(&q)
        .expect("whole blocks")
        .iter()
        .zip(x.chunks(32))
    {
        // s uses the f32 scale, before its rounding to f16.
        let d = x.iter().fold(0f32, |m, v| m.max(v.abs())) / 127.0;
        let sum: i32 = b.qs.iter().map(|&v| v as i32).sum();
        assert_eq!(f16_to_f32(b.s), half::f16::from_f32(sum as f32 * d).to_f32());
        assert_eq!(f16_to_f32(b.d), half::f16::from_f32(d).to_f32());
    }
}

#[test]
fn zero_and_constant_blocks() {
    for (t, _) in BOUNDS {
        let n = t.block_size().max(256);
        let zeros = vec![0f32; n];
        let y = quant::dequantize(t, &quant::quantize(t, &zeros).expect("q"), n).expect("dq");
        assert!(y.iter().all(|&v| v == 0.0), "{t}: zeros must stay zeros");
        let c = vec![0.5f32; n];
        let y = quant::dequantize(t, &quant::quantize(t, &c).expect("q"), n).expect("dq");
        assert!(
            y.iter().all(|&v| (v - 0.5).abs() < 0.02),
            "{t}: a constant 0.5 came back as {:?}",
            &y[..4]
        );
    }
}

#[test]
fn bad_values_never_panic() {
    let mut x = Rng(11).weights(512);
    x[3] = f32::NAN;
    x[40] = f32::INFINITY;
    x[300] = f32::NEG_INFINITY;
    x[301] = f32::MAX;
    x[302] = f32::MIN_POSITIVE / 4.0;
    for (t, _) in BOUNDS {
        let q = quant::quantize(t, &x).unwrap_or_else(|e| panic!("{t}: {e}"));
        let y = quant::dequantize(t, &q, x.len()).unwrap_or_else(|e| panic!("{t}: {e}"));
        assert_eq!(y.len(), x.len());
        // Random bytes of every length-correct kind decode without panics.
        let mut r = Rng(t.ggml_id() as u64 + 1);
        let junk: Vec<u8> = (0..q.len()).map(|_| (r.uniform() * 256.0) as u8).collect();
        assert!(quant::dequantize(t, &junk, x.len()).is_ok(), "{t}");
    }
}

#[test]
fn size_errors_name_the_type_and_sizes() {
    let e = quant::dequantize(QType::Q4K, &[0u8; 143], 256).expect_err("short");
    assert_eq!(
        e,
        QuantError::ByteLength {
            qtype: QType::Q4K,
            elements: 256,
            expected: 144,
            actual: 143
        }
    );
    assert!(e.to_string().contains("Q4_K") && e.to_string().contains("144"), "{e}");
    let e = quant::dequantize(QType::Q4_0, &[0u8; 18], 31).expect_err("partial block");
    assert!(matches!(
        e,
        QuantError::NotWholeBlocks {
            qtype: QType::Q4_0,
            elements: 31
        }
    ));
    let mut out = vec![0f32; 64];
    assert!(quant::dequantize_into(QType::Q8_0, &[0u8; 34], &mut out).is_err());
    assert!(quant::quantize(QType::Q6K, &[0.0; 255]).is_err());
    let e = quant::dequantize(QType::IQ2XXS, &[0u8; 66], 256).expect_err("unsupported");
    assert!(
        matches!(
            e,
            QuantError::Unsupported {
                qtype: QType::IQ2XXS,
                ..
            }
        ),
        "{e}"
    );
    assert!(quant::quantize(QType::I8, &[1.0]).is_err());
    // A huge element count is rejected before anything is allocated.
    assert!(quant::dequantize(QType::Q4_0, &[], usize::MAX / 2 + 1).is_err());
    assert!(quant::dequantize(QType::F32, &[], 0)
        .map(|v| v.is_empty())
        .unwrap_or(false));
}

#[test]
fn qtensor_checks_shapes_and_dequantizes_to_a_tensor() {
    let x = Rng(5).weights(3 * 512);
    let q = QTensor::quantize(QType::Q4K, vec![3, 512], &x).expect("quantize");
    assert_eq!(q.qtype(), QType::Q4K);
    assert_eq!(q.bytes().len(), 3 * 2 * 144);
    let t = q.dequantize().expect("dequantize");
    assert_eq!(t.shape().dims(), &[3, 512]);
    let v = t.to_vec::<f32>().expect("to_vec");
    assert_eq!(v, quant::dequantize(QType::Q4K, q.bytes(), x.len()).expect("dq"));
    // Rows must be whole blocks even when the total is.
    assert!(matches!(
        QTensor::quantize(QType::Q4K, vec![512, 3], &x),
        Err(QuantError::Shape { .. })
    ));
    assert!(QTensor::new(QType::Q8_0, vec![2, 32], vec![0; 67]).is_err());
    let back = QTensor::new(QType::Q4K, vec![3, 512], q.clone().into_bytes()).expect("same bytes");
    assert_eq!(back, q);
    // From a tensor, and the error conversion into the crate's Error.
    let from = QTensor::from_tensor(&t, QType::Q8_0).expect("from_tensor");
    assert_eq!(from.shape().dims(), &[3, 512]);
    let e: rustorch_core::Error = QuantError::Unsupported {
        qtype: QType::IQ1S,
        what: "dequantize",
    }
    .into();
    assert!(e.to_string().contains("IQ1_S"), "{e}");
}

#[test]
fn all_zero_blocks_follow_llama_cpp_signs() {
    // An all-zero block keeps d = 0.0 / -8 = -0.0 in llama.cpp whatever the
    // sign of its zeros; the `gguf` package takes the sign of the first
    // element instead (its only known difference from llama.cpp). RusTorch
    // follows llama.cpp, which made the files it reads.
    let mut x = [0f32; 32];
    x[0] = -0.0;
    for t in [QType::Q4_0, QType::Q5_0] {
        let q = quant::quantize(t, &x).expect("quantize");
        assert_eq!(&q[..2], &[0x00, 0x80], "{t}");
    }
}
