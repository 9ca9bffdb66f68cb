//! The tiled and repacked K-quant paths: the AVX2 and AVX-512 super-block sums
//! against the portable ones (bit for bit), and every product against an
//! f64 product of the dequantized operands. tests/ggml_matmul.rs checks
//! them against llama.cpp itself.

use super::ggml_superblock::{chunk_sums_portable, Unpack};
use super::{qmatmul_quantized_into, Isa, QuantizedRows};
use rustorch_core::quant::blocks::{cast_blocks, BlockQ2K, BlockQ4K, BlockQ5K, BlockQ6K, BlockQ8K};
use rustorch_core::quant::{dequantize, QTensor, QType};

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

/// Activation blocks: random, and all at the extremes (+-127).
fn act_blocks() -> Vec<u8> {
    let mut x = values(3 * 256, 5);
    for (i, v) in x[512..].iter_mut().enumerate() {
        *v = if i % 3 == 0 { -1.0 } else { 1.0 };
    }
    QuantizedRows::quantize(QType::Q8K, &x, 256).unwrap().bytes().to_vec()
}

/// Weight blocks: quantized values, and random bytes with finite scales
/// (all codes and scales, extreme ones included).
fn weight_blocks(qtype: QType) -> Vec<u8> {
    let mut b = QTensor::quantize(qtype, [1, 512], &values(512, 9))
        .unwrap()
        .bytes()
        .to_vec();
    let size = qtype.type_size();
    let mut s = 77u64;
    for fill in [None, Some(0xFFu8)] {
        let mut blk: Vec<u8> = (0..size)
            .map(|_| {
                s = s.wrapping_mul(6364136223846793005).wrapping_add(1);
                fill.unwrap_or((s >> 33) as u8)
            })
            .collect();
        // Keep d (and dmin) finite: f16 1.0.
        let at: &[usize] = match qtype {
            QType::Q6K => &[208],
            _ => &[0, 2],
        };
        for &o in at {
            blk[o..o + 2].copy_from_slice(&[0x00, 0x3C]);
        }
        b.extend(blk);
    }
    b
}

/// The weights dequantized with `dmin` zeroed (the scale part) and with
/// `d` zeroed (the min part), for types with mins; else the weights.
fn scale_and_min_parts(qtype: QType, w: &[u8], n: usize) -> Vec<Vec<f32>> {
    let fields = match qtype {
        QType::Q2K => Some((80, 82)),
        QType::Q4K | QType::Q5K => Some((0, 2)),
        _ => None,
    };
    let Some((d, dmin)) = fields else {
        return vec![dequantize(qtype, w, n).unwrap()];
    };
    [dmin, d]
        .into_iter()
        .map(|field| {
            let mut c = w.to_vec();
            for b in c.chunks_exact_mut(qtype.type_size()) {
                b[field..field + 2].fill(0);
            }
            dequantize(qtype, &c, n).unwrap()
        })
        .collect()
}

#[cfg(target_arch = "x86_64")]
#[test]
fn simd_unpacking_and_super_block_sums_equal_portable_ones() {
    if !Isa::Avx2.is_available() {
        eprintln!("skipped: no AVX2");
        return;
    }
    fn check<W: Unpack + rustorch_core::quant::blocks::Block>(qtype: QType) {
        let wb = weight_blocks(qtype);
        let ab = act_blocks();
        let ws: &[W] = cast_blocks(&wb).unwrap();
        let ys: &[BlockQ8K] = cast_blocks(&ab).unwrap();
        for (k, x) in ws.iter().enumerate() {
            let u = x.unpack();
            // SAFETY: AVX2 checked above.
            let v = unsafe { x.unpack_avx2() };
            assert_eq!(
                (u.codes, u.lane_scales, u.mins, u.bias_scales),
                (v.codes, v.lane_scales, v.mins, v.bias_scales),
                "{qtype} block {k}: AVX2 unpacking"
            );
            assert_eq!((u.d.to_bits(), u.dmin.to_bits()), (v.d.to_bits(), v.dmin.to_bits()));
            for (l, y) in ys.iter().enumerate() {
                let want = chunk_sums_portable(&u, y);
                // SAFETY: AVX2 checked above.
                let avx2 = unsafe { super::ggml_superblock::chunk_sums_avx2(&u, y) };
                assert_eq!(avx2, want, "{qtype} weight block {k}, activation block {l}: AVX2");
                if Isa::Avx512Vnni.is_available() {
                    // SAFETY: AVX-512 VNNI checked just above.
                    let vnni = unsafe { super::ggml_superblock::chunk_sums_vnni(&u, y) };
                    assert_eq!(
                        vnni, want,
                        "{qtype} weight block {k}, activation block {l}: AVX-512 VNNI"
                    );
                }
            }
        }
    }
    check::<BlockQ2K>(QType::Q2K);
    check::<BlockQ4K>(QType::Q4K);
    check::<BlockQ5K>(QType::Q5K);
    check::<BlockQ6K>(QType::Q6K);
}

#[test]
fn tiled_and_repacked_products_match_f64() {
    let cols = 512;
    for qtype in [QType::Q2K, QType::Q3K, QType::Q4K, QType::Q5K, QType::Q6K, QType::IQ4XS] {
        // 24 rows: Q4_K and Q2_K take the repacked order; 20: the tiled one.
        for rows in [20, 24] {
            let w = QTensor::quantize(qtype, [rows, cols], &values(rows * cols, 3)).unwrap();
            let wf = dequantize(qtype, w.bytes(), rows * cols).unwrap();
            let parts = scale_and_min_parts(qtype, w.bytes(), rows * cols);
            let mat = crate::qmatmul::QMatRef::of_tensor(&w).unwrap();
            assert_eq!(mat.repacked(), matches!(qtype, QType::Q4K | QType::Q2K) && rows == 24);
            for m in [5, 8, 9] {
                let act = QuantizedRows::quantize(QType::Q8K, &values(m * cols, 40 + m as u64), cols).unwrap();
                let af = dequantize(QType::Q8K, act.bytes(), m * cols).unwrap();
                for isa in Isa::ALL.into_iter().filter(|i| i.is_available()) {
                    let mut out = vec![f32::NAN; m * rows];
                    qmatmul_quantized_into(isa, &mat, &act, &mut out).unwrap();
                    for i in 0..m {
                        for j in 0..rows {
                            let (mut dot, mut mag) = (0f64, 0f64);
                            for k in 0..cols {
                                let a = af[i * cols + k] as f64;
                                dot += wf[j * cols + k] as f64 * a;
                                for p in &parts {
                                    mag += (p[j * cols + k] as f64 * a).abs();
                                }
                            }
                            // Dequantization rounds each weight a few times
                            // and the products round a few f32 terms per
                            // super-block (the integer sums are exact); each
                            // error is a few 2^-24 of a term bounded by
                            // `mag`, the sum of |scale part| and |min part|
                            // times |activation|: 1e-5 * mag covers them
                            // (the bound of kernels/kquants/tests.rs).
                            let got = out[i * rows + j] as f64;
                            assert!(
                                (got - dot).abs() <= 1e-5 * mag,
                                "{qtype} {isa} rows={rows} m={m} ({i}, {j}): {got} vs f64 {dot}"
                            );
                        }
                    }
                }
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[test]
fn avx2_four_by_four_outputs_equal_the_scalar_ones() {
    use super::ggml_superblock::{outputs, Order};
    if !(Isa::Avx2.is_available() && std::arch::is_x86_feature_detected!("fma")) {
        eprintln!("skipped: no AVX2 and FMA");
        return;
    }
    // Rows of three super-blocks: every block of `weight_blocks` (extreme
    // codes and scales among them) meets every activation block.
    fn check<W: Unpack + rustorch_core::quant::blocks::Block>(qtype: QType) {
        let wb = weight_blocks(qtype);
        let ws: &[W] = cast_blocks(&wb).unwrap();
        let ab = act_blocks();
        let ys: &[BlockQ8K] = cast_blocks(&ab).unwrap();
        let n = ws.len();
        let unpacked: Vec<_> = ws.iter().map(|w| w.unpack()).collect();
        // Weight row r holds blocks r, r + 1, r + 2 (mod n), activation row
        // k blocks k, k + 2, k + 1 (mod 3), so that every pairing occurs.
        let rows: Vec<Vec<_>> = (0..4)
            .map(|r| (0..3).map(|b| unpacked[(r + b) % n].clone()).collect())
            .collect();
        let acts: Vec<Vec<BlockQ8K>> = (0..4)
            .map(|k| (0..3).map(|b| ys[(k + 2 * b) % ys.len()]).collect())
            .collect();
        let bias = rows.iter().flatten().any(|u| u.bias_scales != [0; 16]);
        for order in [
            Order::Tiled,
            Order::RepackGemv,
            Order::RepackGemm,
            Order::RepackGemmHalves,
            Order::Amx,
        ] {
            let us = std::array::from_fn(|r| rows[r].as_slice());
            let a = std::array::from_fn(|k| acts[k].as_slice());
            let want = outputs::<4, 4>([order; 4], us, a, chunk_sums_portable);
            // SAFETY: AVX2 and FMA checked above; every row has 3 blocks.
            let got = unsafe { super::ggml_superblock_avx2::outputs_4x4(order, us, a, bias) };
            assert_eq!(
                got.map(|r| r.map(f32::to_bits)),
                want.map(|r| r.map(f32::to_bits)),
                "{qtype} {order:?}"
            );
        }
    }
    check::<BlockQ2K>(QType::Q2K);
    check::<BlockQ4K>(QType::Q4K);
    check::<BlockQ5K>(QType::Q5K);
    check::<BlockQ6K>(QType::Q6K);
}
