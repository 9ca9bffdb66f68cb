//! Every SIMD level against the scalar kernels, the scalar kernels against
//! an f64 dot product of the dequantized rows, and the public matmul.
//!
//! Error bounds. Let u = 2^-24 (f32 unit roundoff) and, for a row pair,
//! `mag` = sum over blocks of |d_w d_a| * sum_j |qw_j qa_j| plus, for the
//! `_1` types, |m_w| * (|s_a| + |d_a| * sum_j |qa_j|). Every kernel forms
//! exact integer partial sums, scales them by d_w * d_a (one rounding;
//! llama.cpp's Q4_0 order, (isum * d_w) * d_a, two) and adds the terms in
//! some order whose longest chain of additions is below nb + 32 (scalar:
//! nb; SIMD: nb / 8 per accumulator, the lane and accumulator reduction,
//! and at most seven tail blocks). The absolute value of every partial
//! term is at most the block's share of `mag` (a SIMD lane sums a subset
//! of the block's products), so each kernel is within gamma(nb + 32) * mag
//! of the exact sum of its terms, gamma(n) = n * u / (1 - n * u); two
//! kernels are within twice that of each other.

use super::{batch_kernel, cols_kernel, kernel, rows_kernel, tile_kernels, ActPair, Tiles};
use crate::qmatmul::{qmatmul_isa, vec_dot_type, Isa, QMatRef, QuantizedRows};
use rustorch_core::quant::blocks::{f16_to_f32, f32_to_f16, KVALUES_IQ4NL};
use rustorch_core::quant::{dequantize, QType};

const TYPES: [QType; 7] = [
    QType::Q4_0,
    QType::Q4_1,
    QType::Q5_0,
    QType::Q5_1,
    QType::Q8_0,
    QType::Q8_1,
    QType::IQ4NL,
];

/// Row lengths: one block, two, the SIMD tails (7, 9 and 15 blocks) and a
/// long row with a tail.
const LENGTHS: [usize; 6] = [32, 64, 7 * 32, 9 * 32, 15 * 32, 4096 + 32];

struct Rng(u64);

impl Rng {
    /// splitmix64.
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32
    }

    /// A scale of random sign and magnitude 2^-20 .. 2^max_exp (f16
    /// subnormals included), as f16 bytes.
    fn scale(&mut self, max_exp: f32) -> [u8; 2] {
        let e = -20.0 + self.unit() * (max_exp + 20.0);
        let v = e.exp2() * if self.next() & 1 == 0 { 1.0 } else { -1.0 };
        f32_to_f16(v)
    }
}

/// What kind of block to make.
#[derive(Clone, Copy)]
enum Kind {
    Random,
    /// Largest quants (all ones or all zeros bits, Q8 weights -128 or
    /// 127, activations +-127) and largest scales.
    Extreme(bool),
    /// All bytes zero.
    Zero,
}

fn kind(rng: &mut Rng) -> Kind {
    match rng.below(8) {
        0 => Kind::Zero,
        1 => Kind::Extreme(rng.next() & 1 == 0),
        _ => Kind::Random,
    }
}

/// `nb` weight blocks of `qtype`.
fn weight_row(qtype: QType, nb: usize, rng: &mut Rng) -> Vec<u8> {
    let size = qtype.type_size();
    let mut out = vec![0u8; nb * size];
    for b in out.chunks_exact_mut(size) {
        match kind(rng) {
            Kind::Zero => {}
            Kind::Random => {
                b.iter_mut().for_each(|x| *x = rng.next() as u8);
                b[0..2].copy_from_slice(&rng.scale(8.0));
                // m of Q4_1/Q5_1; the unused s of Q8_1 weights stays random.
                if matches!(qtype, QType::Q4_1 | QType::Q5_1) {
                    b[2..4].copy_from_slice(&rng.scale(8.0));
                }
            }
            Kind::Extreme(high) => {
                let q8 = matches!(qtype, QType::Q8_0 | QType::Q8_1);
                let fill = match (q8, high) {
                    (true, true) => 0x7F,
                    (true, false) => 0x80,
                    (false, true) => 0xFF,
                    (false, false) => 0x00,
                };
                b.iter_mut().for_each(|x| *x = fill);
                let d = if high { 65504.0 } else { -65504.0 };
                b[0..2].copy_from_slice(&f32_to_f16(d));
                if matches!(qtype, QType::Q4_1 | QType::Q5_1) {
                    b[2..4].copy_from_slice(&f32_to_f16(-d));
                }
            }
        }
    }
    out
}

/// `nb` activation blocks of `dot` (Q8_0 or Q8_1) with quants in
/// -127..=127, as the activation quantizer makes them, and for Q8_1
/// `s = f16(d * sum(q))`. Q8_1 scales stay below 16 so that s is finite.
fn act_row(dot: QType, nb: usize, rng: &mut Rng) -> Vec<u8> {
    let size = dot.type_size();
    let qs0 = if dot == QType::Q8_1 { 4 } else { 2 };
    let max_exp = if dot == QType::Q8_1 { 3.9 } else { 12.0 };
    let mut out = vec![0u8; nb * size];
    for b in out.chunks_exact_mut(size) {
        match kind(rng) {
            Kind::Zero => continue,
            Kind::Random => {
                let d = rng.scale(max_exp);
                b[0..2].copy_from_slice(&[d[0], d[1] & 0x7F]);
                for q in &mut b[qs0..] {
                    *q = (rng.below(255) as i32 - 127) as i8 as u8;
                }
            }
            Kind::Extreme(high) => {
                let d = f32_to_f16(if dot == QType::Q8_1 { 15.5 } else { 4000.0 });
                b[0..2].copy_from_slice(&d);
                let q = if high { 127i8 } else { -127 };
                b[qs0..].iter_mut().for_each(|x| *x = q as u8);
            }
        }
        if dot == QType::Q8_1 {
            let sum: i32 = b[4..].iter().map(|&q| q as i8 as i32).sum();
            let s = f32_to_f16(f16_to_f32([b[0], b[1]]) * sum as f32);
            b[2..4].copy_from_slice(&s);
        }
    }
    out
}

/// The integer weight values of one block, decoded from the raw bytes
/// independently of the kernels.
fn weight_ints(qtype: QType, b: &[u8]) -> [i32; 32] {
    let nib = |qs: &[u8], j: usize| (if j < 16 { qs[j] & 0xF } else { qs[j - 16] >> 4 }) as i32;
    let bit = |qh: &[u8], j: usize| ((u32::from_le_bytes(qh.try_into().unwrap()) >> j) & 1) as i32;
    std::array::from_fn(|j| match qtype {
        QType::Q4_0 => nib(&b[2..18], j) - 8,
        QType::Q4_1 => nib(&b[4..20], j),
        QType::Q5_0 => nib(&b[6..22], j) + 16 * bit(&b[2..6], j) - 16,
        QType::Q5_1 => nib(&b[8..24], j) + 16 * bit(&b[4..8], j),
        QType::Q8_0 => b[2 + j] as i8 as i32,
        QType::Q8_1 => b[4 + j] as i8 as i32,
        QType::IQ4NL => KVALUES_IQ4NL[nib(&b[2..18], j) as usize] as i32,
        _ => unreachable!("not a 32-value weight type"),
    })
}

/// `mag` (module comment) and the bound on |sum m_w (s_a - d_a sum(qa))|:
/// s is f16(d * sum(q)) with d the f32 scale before its rounding to the
/// f16 d_a, so |s - d_a sum| <= 2^-11 |d sum| + 2^-11 |d| |sum| (f16
/// rounding, normal range) plus 2^-25 (1 + |sum|) (subnormal half-ulps);
/// with |d| <= |d_a| (1 + 2^-10) that is below
/// (2^-10 + 2^-19) |d_a sum| + 2^-24 (1 + |sum|).
fn bounds(qtype: QType, w: &[u8], a: &[u8]) -> (f64, f64) {
    let dot = vec_dot_type(qtype).unwrap();
    let (ws, as_) = (qtype.type_size(), dot.type_size());
    let qs0 = if dot == QType::Q8_1 { 4 } else { 2 };
    let f = |b: &[u8], at: usize| f16_to_f32([b[at], b[at + 1]]) as f64;
    let (mut mag, mut s_err) = (0f64, 0f64);
    for (wb, ab) in w.chunks_exact(ws).zip(a.chunks_exact(as_)) {
        let qw = weight_ints(qtype, wb);
        let qa: Vec<i32> = ab[qs0..].iter().map(|&q| q as i8 as i32).collect();
        let (dw, da) = (f(wb, 0), f(ab, 0));
        let prod: f64 = qw.iter().zip(&qa).map(|(x, y)| (x * y).abs() as f64).sum();
        mag += (dw * da).abs() * prod;
        if dot == QType::Q8_1 {
            let (m, s) = (f(wb, 2), f(ab, 2));
            let sum: i32 = qa.iter().sum();
            let abs_sum: f64 = qa.iter().map(|q| q.abs() as f64).sum();
            mag += m.abs() * (s.abs() + da.abs() * abs_sum);
            s_err += m.abs()
                * ((2f64.powi(-10) + 2f64.powi(-19)) * (da * sum as f64).abs()
                    + 2f64.powi(-24) * (1.0 + sum.abs() as f64));
        }
    }
    (mag, s_err)
}

/// gamma(n) * mag with gamma(n) = n u / (1 - n u).
fn gamma(n: usize, mag: f64) -> f64 {
    let nu = n as f64 * 2f64.powi(-24);
    nu / (1.0 - nu) * mag
}

/// The f64 dot product of the dequantized rows.
fn dequant_dot(qtype: QType, w: &[u8], a: &[u8], n: usize) -> f64 {
    let wd = dequantize(qtype, w, n).unwrap();
    let ad = dequantize(vec_dot_type(qtype).unwrap(), a, n).unwrap();
    wd.iter().zip(&ad).map(|(&x, &y)| x as f64 * y as f64).sum()
}

/// The levels with legacy kernels of their own: every one but AMX, whose
/// products of these types are the AVX-512 VNNI ones (`find` falls back).
fn kernel_levels() -> impl Iterator<Item = Isa> {
    Isa::ALL.into_iter().filter(|i| *i != Isa::Amx)
}

#[test]
fn amx_level_uses_the_avx512_kernels() {
    for qtype in TYPES {
        assert!(kernel(qtype, Isa::Amx).is_none(), "{qtype}");
        let want = if cfg!(target_arch = "x86_64") {
            Isa::Avx512Vnni
        } else {
            Isa::Scalar
        };
        assert_eq!(
            crate::qmatmul::kernels::find(qtype, Isa::Amx).map(|f| f.0),
            Some(want),
            "{qtype}"
        );
    }
}

fn call(qtype: QType, isa: Isa, w: &[u8], a: &[u8]) -> f32 {
    assert!(isa.is_available());
    let k = kernel(qtype, isa).unwrap_or_else(|| panic!("no {isa} kernel for {qtype}"));
    // SAFETY: the level is available (asserted) and the rows match:
    // callers build `w` and `a` with the same number of blocks.
    unsafe { k(w, a) }
}

/// `call` with the kernel of batched products (`batch_kernel`, which the
/// four-row and four-by-four kernels follow) where a type has one.
fn call_batch(qtype: QType, isa: Isa, w: &[u8], a: &[u8]) -> f32 {
    match batch_kernel(qtype, isa) {
        // SAFETY: as in `call`.
        Some(k) => unsafe { k(w, a) },
        None => call(qtype, isa, w, a),
    }
}

/// Activation rows of both kinds: raw random blocks, and the quantization
/// of random floats (with an all-zero stretch) by the activation encoder.
fn act_rows(dot: QType, n: usize, rng: &mut Rng) -> Vec<Vec<u8>> {
    let mut x: Vec<f32> = (0..n).map(|_| (rng.unit() - 0.5) * 8.0).collect();
    x[..32.min(n / 2)].iter_mut().for_each(|v| *v = 0.0);
    let quantized = QuantizedRows::quantize(dot, &x, n).unwrap().bytes().to_vec();
    vec![act_row(dot, n / 32, rng), quantized]
}

#[test]
fn every_type_has_every_level() {
    for qtype in TYPES {
        for isa in kernel_levels() {
            let has = kernel(qtype, isa).is_some();
            assert_eq!(has, isa == Isa::Scalar || cfg!(target_arch = "x86_64"), "{qtype} {isa}");
        }
    }
}

#[test]
fn simd_matches_scalar() {
    let mut rng = Rng(1);
    let levels: Vec<Isa> = kernel_levels()
        .filter(|i| *i != Isa::Scalar && i.is_available())
        .collect();
    for qtype in TYPES {
        let dot = vec_dot_type(qtype).unwrap();
        for n in LENGTHS {
            for _ in 0..4 {
                let w = weight_row(qtype, n / 32, &mut rng);
                for a in act_rows(dot, n, &mut rng) {
                    let want = call(qtype, Isa::Scalar, &w, &a);
                    assert!(want.is_finite(), "{qtype} n={n}: scalar {want}");
                    let (mag, _) = bounds(qtype, &w, &a);
                    let tol = 2.0 * gamma(n / 32 + 32, mag);
                    for &isa in &levels {
                        let got = call(qtype, isa, &w, &a);
                        let err = (got as f64 - want as f64).abs();
                        assert!(
                            err <= tol,
                            "{qtype} {isa} n={n}: {got} vs scalar {want} (err {err:e}, tol {tol:e})"
                        );
                    }
                }
            }
        }
    }
}

/// The integer parts are exact at every level: with all scales 1 and no
/// offsets, every result is a small integer computed without rounding.
#[test]
fn integer_sums_are_exact() {
    let mut rng = Rng(2);
    for qtype in TYPES {
        let dot = vec_dot_type(qtype).unwrap();
        // At most 31 blocks: each block's |isum| <= 32 * 128 * 127 < 2^19,
        // so every partial sum, in any order, is an integer below 2^24
        // that f32 holds exactly.
        for nb in [1, 2, 7, 9, 15, 31] {
            let n = nb * 32;
            let mut w = weight_row(qtype, n / 32, &mut rng);
            let mut a = act_row(dot, n / 32, &mut rng);
            for b in w.chunks_exact_mut(qtype.type_size()) {
                b[0..2].copy_from_slice(&f32_to_f16(1.0));
                if matches!(qtype, QType::Q4_1 | QType::Q5_1) {
                    b[2..4].copy_from_slice(&f32_to_f16(0.0));
                }
            }
            for b in a.chunks_exact_mut(dot.type_size()) {
                b[0..2].copy_from_slice(&f32_to_f16(1.0));
            }
            let exact: i64 = w
                .chunks_exact(qtype.type_size())
                .zip(a.chunks_exact(dot.type_size()))
                .map(|(wb, ab)| {
                    let qa = &ab[dot.type_size() - 32..];
                    weight_ints(qtype, wb)
                        .iter()
                        .zip(qa)
                        .map(|(&x, &y)| x as i64 * y as i8 as i64)
                        .sum::<i64>()
                })
                .sum();
            for isa in kernel_levels().filter(|i| i.is_available()) {
                assert_eq!(call(qtype, isa, &w, &a), exact as f32, "{qtype} {isa} n={n}");
            }
        }
    }
}

#[test]
fn scalar_matches_dequantized_f64() {
    let mut rng = Rng(3);
    for qtype in TYPES {
        let dot = vec_dot_type(qtype).unwrap();
        for n in LENGTHS {
            for _ in 0..4 {
                let w = weight_row(qtype, n / 32, &mut rng);
                for a in act_rows(dot, n, &mut rng) {
                    let got = call(qtype, Isa::Scalar, &w, &a) as f64;
                    let want = dequant_dot(qtype, &w, &a, n);
                    let (mag, s_err) = bounds(qtype, &w, &a);
                    // Kernel rounding plus the dequantized weights' own
                    // rounding (Q4_1/Q5_1: d * q + m, u each, within mag).
                    let tol = gamma(n / 32 + 32, mag) + s_err;
                    assert!(
                        (got - want).abs() <= tol,
                        "{qtype} n={n}: {got} vs {want} (tol {tol:e})"
                    );
                }
            }
        }
    }
}

#[test]
fn mismatched_rows_give_nan() {
    let mut rng = Rng(4);
    for qtype in TYPES {
        let dot = vec_dot_type(qtype).unwrap();
        let w = weight_row(qtype, 3, &mut rng);
        let a = act_row(dot, 2, &mut rng);
        for isa in kernel_levels().filter(|i| i.is_available()) {
            assert!(call(qtype, isa, &w, &a).is_nan(), "{qtype} {isa}");
            assert!(call(qtype, isa, &w[1..], &a).is_nan(), "{qtype} {isa}");
        }
    }
}

#[test]
fn qmatmul_matches_reference() {
    let mut rng = Rng(5);
    let (rows, cols) = (6, 9 * 32);
    for qtype in TYPES {
        let dot = vec_dot_type(qtype).unwrap();
        let wbytes = weight_row(qtype, rows * cols / 32, &mut rng);
        let w = QMatRef::new(qtype, rows, cols, &wbytes).unwrap();
        let row_bytes = qtype.bytes_for(cols).unwrap();
        for m in [1, 3] {
            let x: Vec<f32> = (0..m * cols).map(|_| (rng.unit() - 0.5) * 4.0).collect();
            let act = QuantizedRows::quantize(dot, &x, cols).unwrap();
            for isa in kernel_levels().filter(|i| i.is_available()) {
                let out = qmatmul_isa(isa, &w, &x).unwrap();
                assert_eq!(out.len(), m * rows);
                for i in 0..m {
                    for j in 0..rows {
                        let wr = &wbytes[j * row_bytes..(j + 1) * row_bytes];
                        let got = out[i * rows + j];
                        if isa == Isa::Scalar {
                            let one = if m > 1 { call_batch } else { call };
                            assert_eq!(got, one(qtype, Isa::Scalar, wr, act.row(i)), "{qtype} m={m} ({i}, {j})");
                        }
                        let want = dequant_dot(qtype, wr, act.row(i), cols);
                        let (mag, s_err) = bounds(qtype, wr, act.row(i));
                        let tol = gamma(cols / 32 + 32, mag) + s_err;
                        let err = (got as f64 - want).abs();
                        assert!(
                            err <= tol,
                            "{qtype} {isa} m={m} ({i}, {j}): {got} vs {want} (tol {tol:e})"
                        );
                    }
                }
            }
        }
    }
}

/// The same f32 value, NaN included (the four-row kernels must repeat the
/// one-row kernels' arithmetic exactly, so even NaN and infinity from
/// extreme scales must come out the same).
fn same(x: f32, y: f32) -> bool {
    x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan())
}

#[test]
fn four_row_kernels_equal_one_row_kernels() {
    let mut rng = Rng(6);
    for qtype in TYPES {
        let dot = vec_dot_type(qtype).unwrap();
        for isa in kernel_levels().filter(|i| i.is_available()) {
            let Some(k4) = rows_kernel(qtype, isa) else {
                assert!(
                    isa == Isa::Scalar || !cfg!(target_arch = "x86_64"),
                    "{qtype} {isa}: no 4-row kernel"
                );
                continue;
            };
            for n in LENGTHS {
                for _ in 0..3 {
                    let w = weight_row(qtype, n / 32, &mut rng);
                    let mut rows = act_rows(dot, n, &mut rng);
                    rows.extend(act_rows(dot, n, &mut rng));
                    let a = [&rows[0][..], &rows[1][..], &rows[2][..], &rows[3][..]];
                    let mut out = [0f32; 4];
                    // SAFETY: the level is available and all four rows
                    // have the weight row's block count.
                    unsafe { k4(&w, a, &mut out) };
                    for r in 0..4 {
                        let want = call_batch(qtype, isa, &w, a[r]);
                        assert!(same(out[r], want), "{qtype} {isa} n={n} row {r}: {} vs {want}", out[r]);
                    }
                }
            }
            // Rows that do not match give NaN, as the one-row kernels do.
            let w = weight_row(qtype, 3, &mut rng);
            let good = act_row(dot, 3, &mut rng);
            let bad = act_row(dot, 2, &mut rng);
            let mut out = [0f32; 4];
            // SAFETY: the level is available; the kernel checks lengths.
            unsafe { k4(&w, [&good, &good, &bad, &good], &mut out) };
            assert!(out.iter().all(|v| v.is_nan()), "{qtype} {isa}: {out:?}");
        }
    }
}

/// The types whose kernels follow llama.cpp's x86 order (ggml_q8_0,
/// ggml_exact, ggml_iq4_nl): the same bits at every level.
const LLAMA_ORDER: [QType; 6] = [
    QType::Q4_0,
    QType::Q4_1,
    QType::Q5_0,
    QType::Q5_1,
    QType::Q8_0,
    QType::IQ4NL,
];

#[test]
fn llama_order_kernels_agree_bit_for_bit_across_levels() {
    let mut rng = Rng(7);
    for qtype in LLAMA_ORDER {
        let dot = vec_dot_type(qtype).unwrap();
        for n in LENGTHS {
            for _ in 0..3 {
                let w = weight_row(qtype, n / 32, &mut rng);
                for a in act_rows(dot, n, &mut rng) {
                    let want = call(qtype, Isa::Scalar, &w, &a);
                    let want_batch = call_batch(qtype, Isa::Scalar, &w, &a);
                    for isa in kernel_levels().filter(|i| i.is_available()) {
                        let got = call(qtype, isa, &w, &a);
                        assert!(same(got, want), "{qtype} {isa} n={n}: {got} vs scalar {want}");
                        let got = call_batch(qtype, isa, &w, &a);
                        assert!(
                            same(got, want_batch),
                            "{qtype} {isa} n={n} batch: {got} vs scalar {want_batch}"
                        );
                    }
                }
            }
        }
    }
}

/// The four-weight-row (matvec) kernels repeat the one-row kernels'
/// arithmetic exactly.
#[test]
fn four_weight_row_kernels_equal_one_row_kernels() {
    let mut rng = Rng(8);
    for qtype in TYPES {
        let dot = vec_dot_type(qtype).unwrap();
        for isa in kernel_levels().filter(|i| i.is_available()) {
            let Some(k4) = cols_kernel(qtype, isa) else {
                continue;
            };
            for n in LENGTHS {
                let ws: Vec<Vec<u8>> = (0..4).map(|_| weight_row(qtype, n / 32, &mut rng)).collect();
                let a = act_row(dot, n / 32, &mut rng);
                let mut out = [0f32; 4];
                // SAFETY: the level is available and the rows match.
                unsafe { k4(&a, [&ws[0][..], &ws[1][..], &ws[2][..], &ws[3][..]], &mut out) };
                for r in 0..4 {
                    let want = call(qtype, isa, &ws[r], &a);
                    assert!(same(out[r], want), "{qtype} {isa} n={n} row {r}: {} vs {want}", out[r]);
                }
            }
        }
    }
}

/// Packs rows `2k`, `2k + 1` of `acts` with the tiles' packer.
fn packed_pairs(tiles: &Tiles, acts: &[&[u8]], nb: usize) -> Vec<Vec<ActPair>> {
    acts.chunks(2)
        .map(|p| {
            let mut out = vec![ActPair::EMPTY; nb];
            // SAFETY: the tiles' level is available (callers check); the
            // rows have the same length.
            unsafe { (tiles.pack)(p[0], p[1], &mut out) };
            out
        })
        .collect()
}

/// The four-by-four and four-by-eight (batch) kernels repeat the one-row
/// kernels' arithmetic exactly for each of their pairs, and answer NaN for
/// rows (or packed pairs) that do not match.
#[test]
fn batch_tiles_equal_one_row_kernels() {
    let mut rng = Rng(9);
    for qtype in TYPES {
        let dot = vec_dot_type(qtype).unwrap();
        for isa in kernel_levels().filter(|i| i.is_available()) {
            let Some(tiles) = tile_kernels(qtype, isa) else {
                continue;
            };
            for n in LENGTHS {
                let nb = n / 32;
                let ws: Vec<Vec<u8>> = (0..4).map(|_| weight_row(qtype, nb, &mut rng)).collect();
                let acts: Vec<Vec<u8>> = (0..8).map(|_| act_row(dot, nb, &mut rng)).collect();
                let w = [&ws[0][..], &ws[1][..], &ws[2][..], &ws[3][..]];
                let a: [&[u8]; 8] = std::array::from_fn(|i| &acts[i][..]);
                let pairs = packed_pairs(&tiles, &a, nb);
                let mut out4 = [[0f32; 4]; 4];
                let mut out8 = [[0f32; 8]; 4];
                // SAFETY: the level is available and the rows match.
                unsafe {
                    (tiles.tile4)(w, [a[0], a[1], a[2], a[3]], [&pairs[0], &pairs[1]], &mut out4);
                    (tiles.tile8)(w, a, std::array::from_fn(|k| &pairs[k][..]), &mut out8);
                }
                for r in 0..4 {
                    for i in 0..8 {
                        let want = call_batch(qtype, isa, w[r], a[i]);
                        let got = out8[r][i];
                        assert!(same(got, want), "{qtype} {isa} n={n} 4x8 ({r}, {i}): {got} vs {want}");
                        if i < 4 {
                            let got = out4[r][i];
                            assert!(same(got, want), "{qtype} {isa} n={n} 4x4 ({r}, {i}): {got} vs {want}");
                        }
                    }
                }
            }
            let good_w = weight_row(qtype, 3, &mut rng);
            let short_w = weight_row(qtype, 2, &mut rng);
            let good_a = act_row(dot, 3, &mut rng);
            let short_a = act_row(dot, 2, &mut rng);
            let good_p = packed_pairs(&tiles, &[&good_a, &good_a], 3).remove(0);
            let short_p = packed_pairs(&tiles, &[&short_a, &short_a], 2).remove(0);
            // (weight rows, activation row 1, its pair)
            type Case<'a> = ([&'a [u8]; 4], &'a [u8], &'a [ActPair]);
            let cases: [Case; 3] = [
                ([&good_w, &good_w, &short_w, &good_w], &good_a, &good_p),
                ([&good_w, &good_w, &good_w, &good_w], &short_a, &good_p),
                ([&good_w, &good_w, &good_w, &good_w], &good_a, &short_p),
            ];
            for (w, odd_a, odd_p) in cases {
                let a = [&good_a[..], odd_a, &good_a, &good_a];
                let mut out4 = [[0f32; 4]; 4];
                let mut out8 = [[0f32; 8]; 4];
                // SAFETY: the level is available; the kernels check lengths.
                unsafe {
                    (tiles.tile4)(w, a, [&good_p, odd_p], &mut out4);
                    (tiles.tile8)(
                        w,
                        [a[0], a[1], a[2], a[3], a[0], a[1], a[2], a[3]],
                        [&good_p, odd_p, &good_p, &good_p],
                        &mut out8,
                    );
                }
                assert!(out4.iter().flatten().all(|v| v.is_nan()), "{qtype} {isa}: {out4:?}");
                assert!(out8.iter().flatten().all(|v| v.is_nan()), "{qtype} {isa}: {out8:?}");
            }
        }
    }
}
