//! Every SIMD kernel against the scalar one, and the scalar kernel against
//! an f64 dot product of the dequantized operands.

use super::super::exact;
use crate::qmatmul::{qmatmul_isa, Isa, QMatRef, QuantizedRows};
use rustorch_core::quant::blocks::{f32_to_f16, QK_K};
use rustorch_core::quant::{dequantize, quantize, QType};

/// The types whose kernels are implemented at every level.
const TYPES: [QType; 7] = [
    QType::Q4K,
    QType::Q6K,
    QType::Q5K,
    QType::Q8K,
    QType::Q3K,
    QType::Q2K,
    QType::IQ4XS,
];

/// Row lengths: one block, two, and a typical hidden size.
const LENGTHS: [usize; 3] = [256, 512, 4096];

/// SplitMix64: a small deterministic generator, so failures reproduce.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [-1, 1).
    fn f32(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }

    fn byte(&mut self) -> u8 {
        self.next() as u8
    }
}

/// Byte offsets of the f16 super-block scales (`d`, then `dmin` where the
/// type has one) and whether `d` is an f32 (Q8_K).
fn scale_fields(qtype: QType) -> (&'static [usize], Option<usize>) {
    match qtype {
        QType::Q2K => (&[80, 82], None),
        QType::Q3K => (&[108], None),
        QType::Q4K | QType::Q5K => (&[0, 2], None),
        QType::Q6K => (&[208], None),
        QType::IQ4XS => (&[0], None),
        QType::Q8K => (&[], Some(0)),
        other => panic!("not a Q8_K-activation type: {other}"),
    }
}

/// Overwrites the block scales with finite values of magnitude below
/// `max` (random bytes there could be NaN or infinite).
fn set_scales(qtype: QType, block: &mut [u8], rng: &mut Rng, max: f32) {
    let (f16s, f32_at) = scale_fields(qtype);
    for &o in f16s {
        block[o..o + 2].copy_from_slice(&f32_to_f16(max * rng.f32()));
    }
    if let Some(o) = f32_at {
        block[o..o + 4].copy_from_slice(&(max * rng.f32()).to_le_bytes());
    }
}

/// Weight rows of `n` values of several kinds: quantized from random data
/// with varied block magnitudes, random bytes, extreme bytes (all-ones
/// quants and scales, or a mix of 0x00/0xFF/0x7F/0x80), and rows with
/// all-zero blocks among random ones.
fn weight_rows(qtype: QType, n: usize, rng: &mut Rng) -> Vec<(String, Vec<u8>)> {
    let size = qtype.type_size();
    let blocks = n / QK_K;
    let mut rows = Vec::new();

    let data: Vec<f32> = (0..n).map(|i| rng.f32() * (1 + i / QK_K % 5) as f32).collect();
    rows.push(("quantized".into(), quantize(qtype, &data).expect("quantizable type")));

    let mut random = vec![0u8; blocks * size];
    for b in random.chunks_exact_mut(size) {
        b.iter_mut().for_each(|v| *v = rng.byte());
        set_scales(qtype, b, rng, 0.05);
    }
    rows.push(("random bytes".into(), random.clone()));

    let mut ones = vec![0xFFu8; blocks * size];
    for b in ones.chunks_exact_mut(size) {
        set_scales(qtype, b, rng, 1.0);
    }
    rows.push(("all-ones bytes".into(), ones));

    let mut mixed = vec![0u8; blocks * size];
    for b in mixed.chunks_exact_mut(size) {
        b.iter_mut()
            .for_each(|v| *v = [0x00, 0xFF, 0x7F, 0x80][rng.byte() as usize % 4]);
        set_scales(qtype, b, rng, 1.0);
    }
    rows.push(("extreme bytes".into(), mixed));

    let mut zeros = random;
    for (i, b) in zeros.chunks_exact_mut(size).enumerate() {
        if i % 2 == 0 {
            b.fill(0);
        }
    }
    rows.push(("zero blocks".into(), zeros));
    rows
}

/// Activation rows (as Q8_K bytes): random values, all quants at +-127
/// (every value +-1), and random rows with all-zero blocks.
fn activation_rows(n: usize, rng: &mut Rng) -> Vec<(String, Vec<u8>)> {
    let q8k = |x: &[f32]| {
        QuantizedRows::quantize(QType::Q8K, x, n)
            .expect("whole Q8_K blocks")
            .row(0)
            .to_vec()
    };
    let random: Vec<f32> = (0..n).map(|_| rng.f32() * 3.0).collect();
    let signs: Vec<f32> = (0..n).map(|_| if rng.byte() & 1 == 0 { 1.0 } else { -1.0 }).collect();
    let mut holes = random.clone();
    for (i, v) in holes.iter_mut().enumerate() {
        if (i / QK_K) % 2 == 1 {
            *v = 0.0;
        }
    }
    vec![
        ("random".into(), q8k(&random)),
        ("+-127".into(), q8k(&signs)),
        ("zero blocks".into(), q8k(&holes)),
    ]
}

/// The f64 dot product of the dequantized rows and a magnitude `m` that
/// bounds the sum of the absolute per-block f32 terms of any kernel:
/// `sum_i (|scale part of w_i| + |min part of w_i|) * |a_i|`, the parts
/// found by dequantizing with `dmin` (then `d`) set to zero.
fn reference(qtype: QType, w: &[u8], a: &[u8]) -> (f64, f64) {
    let n = a.len() / QType::Q8K.type_size() * QK_K;
    let deq = |bytes: &[u8]| dequantize(qtype, bytes, n).expect("valid row");
    let av = dequantize(QType::Q8K, a, n).expect("valid Q8_K row");
    let wv = deq(w);
    let dot: f64 = wv.iter().zip(&av).map(|(&x, &y)| x as f64 * y as f64).sum();
    let (f16s, _) = scale_fields(qtype);
    let parts: Vec<Vec<f32>> = if f16s.len() == 2 {
        let size = qtype.type_size();
        let zeroed = |field: usize| {
            let mut c = w.to_vec();
            for b in c.chunks_exact_mut(size) {
                b[field..field + 2].fill(0);
            }
            deq(&c)
        };
        vec![zeroed(f16s[1]), zeroed(f16s[0])]
    } else {
        vec![wv]
    };
    let m = parts
        .iter()
        .map(|p| {
            p.iter()
                .zip(&av)
                .map(|(&x, &y)| (x as f64 * y as f64).abs())
                .sum::<f64>()
        })
        .sum();
    (dot, m)
}

fn scalar(qtype: QType, w: &[u8], a: &[u8]) -> f32 {
    let k = exact(qtype, Isa::Scalar).expect("every type has a scalar kernel");
    // SAFETY: scalar kernels run anywhere; `w` and `a` cover the same
    // number of values in the weight type and Q8_K.
    unsafe { k(w, a) }
}

#[test]
fn simd_kernels_match_scalar() {
    let mut rng = Rng(7);
    let mut checked = 0;
    for qtype in TYPES {
        for isa in [Isa::Avx2, Isa::Avx512Vnni] {
            if !isa.is_available() {
                continue;
            }
            // The widest kernel at or below `isa` (llama.cpp has no AVX-512
            // K-quant dot products, so neither do we for most types).
            let (level, kernel) = super::super::find(qtype, isa).expect("every type has a kernel");
            if level == Isa::Scalar {
                continue;
            }
            for n in LENGTHS {
                let acts = activation_rows(n, &mut rng);
                for (wname, w) in weight_rows(qtype, n, &mut rng) {
                    for (aname, a) in &acts {
                        let want = scalar(qtype, &w, a);
                        // SAFETY: `isa` is available (checked above) and
                        // the rows cover the same `n` values.
                        let got = unsafe { kernel(&w, a) };
                        let (_, m) = reference(qtype, &w, a);
                        // The kernels compute the same exact integer sums
                        // per block and differ only in the order of at
                        // most 2 * (n / 256 + 16) f32 additions, each off
                        // by at most 2^-24 of the partial sum, which is
                        // bounded by `m`: 64 * 6e-8 < 1e-5.
                        let tol = 1e-5 * m;
                        assert!(
                            ((got - want) as f64).abs() <= tol,
                            "{qtype} {isa} n={n} weights {wname}, activations {aname}: {got} vs scalar {want} (tol {tol})"
                        );
                        checked += 1;
                    }
                }
            }
        }
    }
    if Isa::Avx2.is_available() {
        assert!(checked > 0);
    }
}

#[test]
fn scalar_kernels_match_f64_dequantized_dot() {
    let mut rng = Rng(11);
    for qtype in TYPES {
        for n in LENGTHS {
            let acts = activation_rows(n, &mut rng);
            for (wname, w) in weight_rows(qtype, n, &mut rng) {
                for (aname, a) in &acts {
                    let got = scalar(qtype, &w, a) as f64;
                    let (want, m) = reference(qtype, &w, a);
                    // Dequantization rounds each weight at most three
                    // times (d * sc, dmin * m, the product and difference)
                    // and each activation once; the kernel rounds d_w * d_a,
                    // the i32 sum's conversion, the product, and its f32
                    // additions (at most n / 256 + 16). Every error is
                    // relative to a term bounded by `m`, so the total is
                    // below (4 + 3 + 32) * 2^-24 * m < 1e-5 * m.
                    let tol = 1e-5 * m;
                    assert!(
                        (got - want).abs() <= tol,
                        "{qtype} n={n} weights {wname}, activations {aname}: {got} vs f64 {want} (tol {tol})"
                    );
                }
            }
        }
    }
}

#[test]
fn qmatmul_uses_the_kernels_for_one_and_several_rows() {
    let mut rng = Rng(13);
    let (rows, cols) = (5, 512);
    for qtype in TYPES {
        let data: Vec<f32> = (0..rows * cols).map(|_| rng.f32()).collect();
        let wbytes = quantize(qtype, &data).expect("quantizable type");
        let w = QMatRef::new(qtype, rows, cols, &wbytes).expect("whole rows");
        for m in [1, 3] {
            let x: Vec<f32> = (0..m * cols).map(|_| rng.f32() * 2.0).collect();
            let act = QuantizedRows::quantize(QType::Q8K, &x, cols).expect("whole Q8_K blocks");
            for isa in Isa::ALL.into_iter().filter(|i| i.is_available()) {
                let out = qmatmul_isa(isa, &w, &x).expect("valid product");
                assert_eq!(out.len(), m * rows);
                let row_bytes = wbytes.len() / rows;
                for i in 0..m {
                    for j in 0..rows {
                        let wr = &wbytes[j * row_bytes..(j + 1) * row_bytes];
                        let (want, mag) = reference(qtype, wr, act.row(i));
                        // As in the two tests above.
                        let tol = 1e-5 * mag;
                        let got = out[i * rows + j] as f64;
                        assert!(
                            (got - want).abs() <= tol,
                            "{qtype} {isa} m={m} out[{i}][{j}] = {got}, f64 reference {want}"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn unpacked_scales_match_the_bit_layout() {
    let mut rng = Rng(17);
    for _ in 0..1000 {
        let packed: [u8; 12] = std::array::from_fn(|_| rng.byte());
        let sm = super::k4_scales_mins(&packed);
        for j in 0..8 {
            assert_eq!(
                (sm[j], sm[8 + j]),
                rustorch_core::quant::blocks::scale_min_k4(j, &packed)
            );
        }
        assert_eq!(
            super::q3k_scales(&packed),
            rustorch_core::quant::blocks::q3k_scales(&packed)
        );
    }
}

/// The four-weight-row matvec kernels (`cols_kernel`) equal the scalar
/// kernel, which follows llama.cpp's order, bit for bit: every group of
/// four rows mixes the row kinds of `weight_rows` (quantized, random,
/// all-ones and extreme bytes, zero blocks), with super-block scales up
/// to f16's largest finite values in some rows.
#[test]
fn four_row_kernels_equal_scalar_bit_for_bit() {
    let mut rng = Rng(19);
    let mut checked = 0;
    for qtype in TYPES {
        for isa in Isa::ALL.into_iter().filter(|i| i.is_available()) {
            let Some(cols) = super::cols_kernel(qtype, isa) else {
                continue;
            };
            for n in LENGTHS {
                let acts = activation_rows(n, &mut rng);
                let mut rows: Vec<Vec<u8>> = weight_rows(qtype, n, &mut rng).into_iter().map(|(_, r)| r).collect();
                // Huge scales: products and sums near f32's range.
                let mut huge = rows[1].clone();
                for b in huge.chunks_exact_mut(qtype.type_size()) {
                    set_scales(qtype, b, &mut rng, 65000.0);
                }
                rows.push(huge);
                for start in 0..rows.len() {
                    let w: [&[u8]; 4] = std::array::from_fn(|k| rows[(start + k) % rows.len()].as_slice());
                    for (aname, a) in &acts {
                        let mut got = [0f32; 4];
                        // SAFETY: `isa` is available and the rows cover the
                        // same `n` values.
                        unsafe { cols(a, w, &mut got) };
                        for (k, g) in got.into_iter().enumerate() {
                            let want = scalar(qtype, w[k], a);
                            assert!(
                                g.to_bits() == want.to_bits() || (g.is_nan() && want.is_nan()),
                                "{qtype} {isa} n={n} row {k} of group {start}, activations {aname}: {g} vs scalar {want}"
                            );
                            checked += 1;
                        }
                    }
                }
            }
        }
    }
    if Isa::Avx512Vnni.is_available() {
        assert!(checked > 0);
    }
}

/// Rows of unequal length, or not whole blocks, give NaN, not a panic.
#[test]
fn four_row_kernels_reject_mismatched_rows() {
    for qtype in TYPES {
        for isa in Isa::ALL.into_iter().filter(|i| i.is_available()) {
            let Some(cols) = super::cols_kernel(qtype, isa) else {
                continue;
            };
            let (w, a) = (vec![0u8; 2 * qtype.type_size()], vec![0u8; 2 * QType::Q8K.type_size()]);
            let short = &w[..qtype.type_size()];
            let mut out = [0f32; 4];
            // SAFETY: `isa` is available; the kernel checks the lengths.
            unsafe { cols(&a, [&w, &w, short, &w], &mut out) };
            assert!(out.iter().all(|v| v.is_nan()), "{qtype} {isa}");
        }
    }
}
