//! The quantized-weight ops as tensor ops (`QWeight`, `Tensor::qmatmul`,
//! `QWeight::embedding`) and in-place writes (`Tensor::write_slice`, and
//! `Tensor::write_slice_at` against the CPU's `write_slice`).
//!
//! References: `quant::matmul::qmatmul` (itself checked against exact
//! products in quant_matmul.rs) and `quant::dequantize` (bit-exact with the
//! gguf package in quant_fixtures.rs): the ops must give the same bits, but
//! for a product on a backend with its own arithmetic, which must be within
//! the target's tolerance for the op (the CPU's is exact). The checks that
//! compare the target with itself (several products against one, the gated
//! op against its parts) stay bit for bit.

use crate::{Case as Check, Target};
use rustorch_core::quant::{self, QType};
use rustorch_core::{DType, QWeight, Tensor};
use rustorch_cpu::qmatmul::{qmatmul, QMatRef};

fn values(n: usize, seed: u32) -> Vec<f32> {
    // A small LCG: deterministic, no dependency.
    let mut s = seed.wrapping_mul(2654435761).wrapping_add(1);
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(1664525).wrapping_add(1013904223);
            (s >> 8) as f32 / (1u32 << 24) as f32 * 2.0 - 1.0
        })
        .collect()
}

/// `qmatmul_gated` gives the bits of the two products followed by the
/// activation op, for a matvec and batches (the largest through its
/// parallel path), rows of 600 outputs (two whole 256-value pieces and a
/// tail that is not a whole 16-value block), and weights of two types.
pub fn qmatmul_gated_equals_the_products_then_the_activation(tg: &Target) {
    use rustorch_core::op::GateActivation;
    let (cols, n) = (256, 600);
    let weight = |qtype: QType, rows: usize, seed: u32| {
        let bytes = quant::quantize(qtype, &values(rows * cols, seed)).unwrap();
        tg.qweight(qtype, rows, cols, bytes).unwrap()
    };
    // Mixed types, and one type for both (a GPU may then fuse the whole
    // op into one kernel for a single row: the bits must stay the same).
    for (gq, uq) in [
        (QType::Q4_1, QType::Q8_0),
        (QType::Q4K, QType::Q6K),
        (QType::Q4K, QType::Q4K),
        (QType::Q8_0, QType::Q8_0),
        (QType::Q4_0, QType::Q4_0),
        (QType::F16, QType::F16),
    ] {
        let (gate, up) = (weight(gq, n, 31), weight(uq, n, 32));
        for m in [1usize, 3, 40, 64] {
            let x = tg.from_vec(values(m * cols, 7 + m as u32), [m, cols]).unwrap();
            let [g, u]: [Tensor; 2] = x.qmatmul_many(&[&gate, &up]).unwrap().try_into().unwrap();
            for act in [GateActivation::SwiGlu, GateActivation::GeGlu] {
                let want = match act {
                    GateActivation::SwiGlu => g.swiglu(&u).unwrap(),
                    GateActivation::GeGlu => g.geglu(&u).unwrap(),
                };
                let got = x.qmatmul_gated(&gate, &up, act).unwrap();
                assert_eq!(got.dims(), &[m, n]);
                let (a, b) = (got.to_vec::<f32>().unwrap(), want.to_vec::<f32>().unwrap());
                let same = a.iter().zip(&b).all(|(p, q)| p.to_bits() == q.to_bits());
                assert!(same, "{gq}/{uq}, {m} rows, {act:?}");
            }
        }
    }
    // Long rows and one activation row (a decode step's feed-forward, whose
    // rows a GPU may split over several warps).
    for q in [QType::F16, QType::Q4K, QType::Q8_0] {
        let long = 4608;
        let w = |rows: usize, seed: u32| {
            let bytes = quant::quantize(q, &values(rows * long, seed)).unwrap();
            tg.qweight(q, rows, long, bytes).unwrap()
        };
        let (gate, up) = (w(96, 41), w(96, 42));
        let x = tg.from_vec(values(long, 9), [1, long]).unwrap();
        let [g, u]: [Tensor; 2] = x.qmatmul_many(&[&gate, &up]).unwrap().try_into().unwrap();
        let want = g.swiglu(&u).unwrap().to_vec::<f32>().unwrap();
        let got = x
            .qmatmul_gated(&gate, &up, GateActivation::SwiGlu)
            .unwrap()
            .to_vec::<f32>()
            .unwrap();
        assert!(
            got.iter().zip(&want).all(|(p, q)| p.to_bits() == q.to_bits()),
            "{q}, rows of {long}"
        );
    }
    // The gate and up weights must have one row count.
    let x = tg.from_vec(values(2 * cols, 5), [2, cols]).unwrap();
    let (gate, up) = (weight(QType::Q8_0, 32, 1), weight(QType::Q8_0, 48, 2));
    assert!(x.qmatmul_gated(&gate, &up, GateActivation::SwiGlu).is_err());
}

/// `add_rms_norm` gives the bits of `add` then `rms_norm` on the target
/// (a GPU fuses them into one launch), for rows a warp and a block hold,
/// a strided input, and a row longer than a block (its parts then).
pub fn add_rms_norm_equals_add_then_rms_norm(tg: &Target) {
    // One row of 2048 and of 576 (a decode step's norms, which a GPU may
    // fuse with the quantization of the row for the products after it).
    for (rows, n) in [(1usize, 64usize), (1, 2048), (1, 576), (3, 2048), (2, 9000)] {
        let x = tg.from_vec(values(rows * n, 3), [rows, n]).unwrap();
        let a = tg.from_vec(values(rows * n, 4), [rows, n]).unwrap();
        let w = tg.from_vec(values(n, 5), [n]).unwrap();
        let (s, y) = x.add_rms_norm(&a, &w, 1e-6).unwrap();
        let want_s = x.add(&a).unwrap();
        let want_y = want_s.rms_norm(Some(&w), 1e-6).unwrap();
        for (got, want, what) in [(&s, &want_s, "sum"), (&y, &want_y, "norm")] {
            let (p, q) = (got.to_vec::<f32>().unwrap(), want.to_vec::<f32>().unwrap());
            assert!(
                p.iter().zip(&q).all(|(u, v)| u.to_bits() == v.to_bits()),
                "{rows} x {n}: the {what} differs"
            );
        }
    }
    // A strided x (a transposed view).
    let x = tg
        .from_vec(values(32 * 8, 6), [32, 8])
        .unwrap()
        .transpose(0, 1)
        .unwrap();
    let a = tg.from_vec(values(8 * 32, 7), [8, 32]).unwrap();
    let w = tg.from_vec(values(32, 8), [32]).unwrap();
    let (_, y) = x.add_rms_norm(&a, &w, 1e-5).unwrap();
    let want = x.add(&a).unwrap().rms_norm(Some(&w), 1e-5).unwrap();
    assert_eq!(y.to_vec::<f32>().unwrap(), want.to_vec::<f32>().unwrap());
    // Shapes that do not match are errors.
    let b = tg.from_vec(values(16, 9), [2, 8]).unwrap();
    assert!(x.add_rms_norm(&b, &w, 1e-5).is_err());
}

/// The products of a row that `add_rms_norm` wrote give the bits of the
/// same products of a fresh copy of that row (a GPU may quantize the row
/// for them in the norm's own launch), plain, grouped and gated, for rows
/// of 2048 and 576 values (whole 256-value blocks or not), and again after
/// the row is written in place (what was quantized before must not be
/// reused).
pub fn products_of_a_normed_row_equal_those_of_a_copy(tg: &Target) {
    use rustorch_core::op::GateActivation;
    for n in [2048usize, 576] {
        let types: &[QType] = if n % 256 == 0 {
            &[QType::Q4K, QType::Q6K, QType::Q8_0, QType::Q4_1]
        } else {
            &[QType::Q8_0, QType::Q4_1]
        };
        let x = tg.from_vec(values(n, 61), [1, n]).unwrap();
        let a = tg.from_vec(values(n, 62), [1, n]).unwrap();
        let w = tg.from_vec(values(n, 63), [n]).unwrap();
        let (_, mut y) = x.add_rms_norm(&a, &w, 1e-6).unwrap();
        for round in 0..2 {
            let copy = tg.from_vec(y.to_vec::<f32>().unwrap(), [1, n]).unwrap();
            for (i, &q) in types.iter().enumerate() {
                let weight = |rows: usize, seed: u32| {
                    let bytes = quant::quantize(q, &values(rows * n, seed)).unwrap();
                    tg.qweight(q, rows, n, bytes).unwrap()
                };
                let (w1, w2, w3) = (
                    weight(96, 70 + i as u32),
                    weight(64, 80 + i as u32),
                    weight(96, 90 + i as u32),
                );
                let bits = |t: Tensor| {
                    t.to_vec::<f32>()
                        .unwrap()
                        .iter()
                        .map(|v| v.to_bits())
                        .collect::<Vec<_>>()
                };
                let what = format!("{q}, row of {n}, round {round}");
                assert_eq!(
                    bits(y.qmatmul(&w1).unwrap()),
                    bits(copy.qmatmul(&w1).unwrap()),
                    "{what}: plain"
                );
                let many = |t: &Tensor| -> Vec<Vec<u32>> {
                    t.qmatmul_many(&[&w1, &w2]).unwrap().into_iter().map(bits).collect()
                };
                assert_eq!(many(&y), many(&copy), "{what}: grouped");
                let gated = |t: &Tensor| bits(t.qmatmul_gated(&w1, &w3, GateActivation::SwiGlu).unwrap());
                assert_eq!(gated(&y), gated(&copy), "{what}: gated");
            }
            // Write half the row in place, then check again.
            let src = tg.from_vec(values(n / 2, 64), [1, n / 2]).unwrap();
            y.write_slice(1, n / 4, &src).unwrap();
        }
    }
}

pub fn qmatmul_many_equals_one_product_per_weight(tg: &Target) {
    // Weights of one type, one activation row (the query, key and value
    // projections of a decode step, which a GPU may compute in one launch).
    // Also mixed types, of which a GPU may group those of one type.
    // Rows of 512 values, and of 4608 (a GPU may then split each row over
    // several warps).
    let sets: [([QType; 3], usize); 10] = [
        ([QType::Q4K; 3], 512),
        ([QType::Q6K; 3], 512),
        ([QType::Q8_0; 3], 512),
        ([QType::Q4_1; 3], 512),
        ([QType::Q4_0; 3], 512),
        ([QType::F16; 3], 512),
        ([QType::Q4K, QType::Q4K, QType::Q6K], 512),
        ([QType::Q6K, QType::Q4K, QType::Q6K], 512),
        ([QType::F16; 3], 4608),
        ([QType::Q8_0; 3], 4608),
    ];
    for (set, cols) in sets {
        let qtype = set[0];
        let x = tg.from_vec(values(cols, 40), [1, cols]).unwrap();
        let ws: Vec<QWeight> = [96usize, 32, 40]
            .into_iter()
            .zip(set)
            .enumerate()
            .map(|(i, (rows, qtype))| {
                let bytes = quant::quantize(qtype, &values(rows * cols, 50 + i as u32)).unwrap();
                tg.qweight(qtype, rows, cols, bytes).unwrap()
            })
            .collect();
        for take in [2, 3] {
            let refs: Vec<&QWeight> = ws[..take].iter().collect();
            let many = x.qmatmul_many(&refs).unwrap();
            for (w, got) in ws.iter().zip(&many) {
                let want = x.qmatmul(w).unwrap();
                assert_eq!(got.dims(), want.dims());
                let (g, e) = (got.to_vec::<f32>().unwrap(), want.to_vec::<f32>().unwrap());
                assert!(
                    g.iter().zip(&e).all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{qtype} first, {take} weights"
                );
            }
        }
    }
    // Q4_1 pairs with Q8_1 activations, Q8_0 and Q5_0 with Q8_0, Q6_K with
    // Q8_K: three dot types, one of them shared.
    let cols = 256;
    let x = tg.from_vec(values(3 * cols, 9), [3, cols]).unwrap();
    let ws: Vec<QWeight> = [(QType::Q4_1, 16), (QType::Q8_0, 8), (QType::Q5_0, 24), (QType::Q6K, 4)]
        .into_iter()
        .enumerate()
        .map(|(i, (qtype, rows))| {
            let bytes = quant::quantize(qtype, &values(rows * cols, 20 + i as u32)).unwrap();
            tg.qweight(qtype, rows, cols, bytes).unwrap()
        })
        .collect();
    let refs: Vec<&QWeight> = ws.iter().collect();
    let many = x.qmatmul_many(&refs).unwrap();
    assert_eq!(many.len(), ws.len());
    for (w, got) in ws.iter().zip(&many) {
        let want = x.qmatmul(w).unwrap();
        assert_eq!(got.dims(), want.dims());
        let (g, e) = (got.to_vec::<f32>().unwrap(), want.to_vec::<f32>().unwrap());
        assert!(
            g.iter().zip(&e).all(|(a, b)| a.to_bits() == b.to_bits()),
            "{}",
            w.qtype()
        );
    }
    // A weight whose columns differ from the activations' is an error.
    let other = tg
        .qweight(
            QType::Q8_0,
            2,
            64,
            quant::quantize(QType::Q8_0, &values(128, 3)).unwrap(),
        )
        .unwrap();
    assert!(x.qmatmul_many(&[&ws[0], &other]).is_err());
    assert!(x.qmatmul_many(&[]).is_err());
}

pub fn qmatmul_op_gives_the_kernel_bits(tg: &Target) {
    for qtype in [
        QType::Q4_0,
        QType::Q4_1,
        QType::Q8_0,
        QType::Q4K,
        QType::Q6K,
        QType::F16,
        QType::F32,
    ] {
        let (rows, cols, m) = (48, 256, 3);
        let bytes = quant::quantize(qtype, &values(rows * cols, 1)).unwrap();
        let x = values(m * cols, 2);
        let want = qmatmul(&QMatRef::new(qtype, rows, cols, &bytes).unwrap(), &x).unwrap();
        let w = tg.qweight(qtype, rows, cols, bytes).unwrap();
        let got = tg.from_vec(x, [m, cols]).unwrap().qmatmul(&w).unwrap();
        assert_eq!(got.dims(), &[m, rows]);
        // The kernel's bits on the CPU (whose tolerance is exact); another
        // backend multiplies in its own arithmetic (the CUDA backend keeps
        // the activations in f32, where the kernel quantizes them first),
        // within its tolerance for the op.
        let tol = tg.tol(&format!("qmatmul_{}", qtype.name().to_lowercase()), DType::F32);
        let got = got.to_vec::<f32>().unwrap();
        if let Some(i) = (0..want.len()).find(|&i| !tol.accepts(got[i] as f64, want[i] as f64)) {
            panic!(
                "{qtype}: element {i} is {} where the kernel gives {} ({tol:?})",
                got[i], want[i]
            );
        }
    }
}

pub fn qembedding_dequantizes_the_rows(tg: &Target) {
    let (rows, cols) = (10, 64);
    let bytes = quant::quantize(QType::Q8_0, &values(rows * cols, 3)).unwrap();
    let all = quant::dequantize(QType::Q8_0, &bytes, rows * cols).unwrap();
    let w = tg.qweight(QType::Q8_0, rows, cols, bytes).unwrap();
    let ids = tg.from_vec(vec![7i64, 0, 7, 9], [2, 2]).unwrap();
    let got = w.embedding(&ids).unwrap();
    assert_eq!(got.dims(), &[2, 2, cols]);
    let got = got.to_vec::<f32>().unwrap();
    for (k, &id) in [7usize, 0, 7, 9].iter().enumerate() {
        assert_eq!(&got[k * cols..(k + 1) * cols], &all[id * cols..(id + 1) * cols]);
    }
    let bad = tg.from_vec(vec![10i64], [1]).unwrap();
    let err = w.embedding(&bad).unwrap_err().to_string();
    assert!(err.contains("out of range"), "{err}");
}

pub fn bad_quantized_inputs_are_errors(tg: &Target) {
    let bytes = quant::quantize(QType::Q4_0, &values(4 * 64, 4)).unwrap();
    assert!(tg.qweight(QType::Q4_0, 4, 64, bytes[1..].to_vec()).is_err());
    assert!(tg.qweight(QType::Q4_0, 4, 48, bytes.clone()).is_err());
    let w = tg.qweight(QType::Q4_0, 4, 64, bytes).unwrap();
    let wrong_cols = tg.zeros([2, 32], DType::F32).unwrap();
    assert!(wrong_cols.qmatmul(&w).is_err());
    let wrong_dtype = tg.zeros([2, 64], DType::F64).unwrap();
    assert!(wrong_dtype.qmatmul(&w).is_err());
}

pub fn write_slice_writes_in_place(tg: &Target) {
    let mut cache = tg.zeros([2, 5, 3], DType::F16).unwrap();
    let src = tg
        .from_vec((0..12).map(|i| i as f32).collect::<Vec<_>>(), [2, 2, 3])
        .unwrap()
        .to_dtype(DType::F16)
        .unwrap();
    cache.write_slice(1, 3, &src).unwrap();
    let got = cache.to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap();
    let mut want = vec![0f32; 30];
    for h in 0..2 {
        for t in 0..2 {
            for d in 0..3 {
                want[h * 15 + (3 + t) * 3 + d] = (h * 6 + t * 3 + d) as f32;
            }
        }
    }
    assert_eq!(got, want);
    // A region past the end or a shape mismatch: errors, no change.
    assert!(cache.write_slice(1, 4, &src).is_err());
    assert!(cache.write_slice(0, 0, &src).is_err());
    assert!(cache.write_slice(1, 0, &src.reshape([2, 3, 2]).unwrap()).is_err());
    assert_eq!(cache.to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap(), want);
    // A view shares the storage: writing would change it, so it is refused.
    let view = cache.narrow(1, 0, 2).unwrap();
    let err = cache.write_slice(1, 0, &src).unwrap_err().to_string();
    assert!(err.contains("shared"), "{err}");
    drop(view);
    cache.write_slice(1, 0, &src).unwrap();
}

/// A source of another dtype is converted as `to_dtype` converts it (the KV
/// cache writes f32 keys into f16 storage this way), from any layout.
pub fn write_slice_converts_like_to_dtype(tg: &Target) {
    // Values that round (ties to even included), overflow, underflow and NaN in f16.
    let values: Vec<f32> = (0..48)
        .map(|i| match i % 6 {
            0 => 1.0 + (i as f32) * 4.8828125e-4, // 1 + k * 2^-11: half-way cases
            1 => -(i as f32) * 0.1234567,
            2 => 70000.0 * i as f32,
            3 => 1e-9 * i as f32,
            4 => f32::NAN,
            _ => (i as f32).sqrt() / 3.0,
        })
        .collect();
    let src = tg.from_vec(values, [2, 8, 3]).unwrap();
    for (dim, src) in [(1isize, src.clone()), (2, src.transpose(1, 2).unwrap())] {
        let dims = src.dims().to_vec();
        let mut shape = dims.clone();
        shape[dim as usize] += 4;
        let mut direct = tg.zeros(shape.clone(), DType::F16).unwrap();
        let mut via_cast = tg.zeros(shape, DType::F16).unwrap();
        direct.write_slice(dim, 2, &src).unwrap();
        via_cast
            .write_slice(dim, 2, &src.to_dtype(DType::F16).unwrap())
            .unwrap();
        let bits = |t: &Tensor| {
            t.to_vec::<half::f16>()
                .unwrap()
                .iter()
                .map(|h| h.to_bits())
                .collect::<Vec<u16>>()
        };
        assert_eq!(bits(&direct), bits(&via_cast), "dim {dim}");
        assert!(bits(&direct).iter().any(|&b| b != 0));
    }
    // Into f32 from f16 and into bf16 too.
    let h = tg
        .from_vec(vec![1.5f32, -2.25, 3.0, 0.1], [1, 4])
        .unwrap()
        .to_dtype(DType::F16)
        .unwrap();
    let mut f = tg.zeros([2, 4], DType::F32).unwrap();
    f.write_slice(0, 1, &h).unwrap();
    assert_eq!(
        f.to_vec::<f32>().unwrap()[4..],
        h.to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap()[..]
    );
    let mut b = tg.zeros([1, 4], DType::BF16).unwrap();
    b.write_slice(0, 0, &h).unwrap();
    assert_eq!(
        b.to_vec::<half::bf16>().unwrap(),
        h.to_dtype(DType::BF16).unwrap().to_vec::<half::bf16>().unwrap()
    );
}

/// A position tensor for `write_slice_at`: `value` as i32 or i64, of shape
/// `[1]` or `[]`, on the target (or left in host memory, for the executor
/// to move).
fn position(tg: &Target, value: i64, dtype: DType, scalar: bool, on_target: bool) -> Tensor {
    let storage = match dtype {
        DType::I32 => rustorch_core::CpuStorage::from_vec(vec![value as i32]),
        _ => rustorch_core::CpuStorage::from_vec(vec![value]),
    };
    let shape = if scalar {
        rustorch_core::Shape::scalar()
    } else {
        rustorch_core::Shape::from([1])
    };
    let host = Tensor::from_storage_in(&tg.exec, storage, shape).unwrap();
    if on_target {
        host.to_device(tg.device).unwrap()
    } else {
        host
    }
}

/// `values` of `shape` as `dtype`, under `exec` (on the CPU).
fn filled(exec: &std::sync::Arc<rustorch_core::Executor>, shape: &[usize], dtype: DType, seed: u32) -> Tensor {
    let n = shape.iter().product();
    let v: Vec<f32> = values(n, seed).iter().map(|x| (x * 100.0).round() / 8.0).collect();
    Tensor::from_storage_in(exec, rustorch_core::CpuStorage::from_vec(v), shape.to_vec())
        .unwrap()
        .to_dtype(dtype)
        .unwrap()
}

/// Asserts that the target's last `write_into_at` ran there with its own
/// method, not the executor's fallback that reads the position on the host
/// (which a captured CUDA graph could not replay).
fn ran_on_device(tg: &Target, what: &str) {
    let events = tg.exec.trace();
    let e = events
        .iter()
        .rev()
        .find(|e| e.op == "write_into_at")
        .unwrap_or_else(|| panic!("{what}: no write_into_at in the trace"));
    assert!(
        e.device == tg.device && !e.reason.contains("on the host"),
        "{what}: write_into_at ran on {} ({})",
        e.device,
        e.reason
    );
}

/// `write_slice_at` writes exactly what the CPU's `write_slice` writes, for
/// every position in range, with i32 and i64 positions of shape `[1]` and
/// `[]` (on the target or in host memory): a KV cache `[Hkv, N, D]` in f16
/// written one f32 token `[Hkv, 1, D]` at a time along dim 1, a transposed
/// (strided) source, a destination that is itself a view at an offset, a
/// last-dim write of integers, and a write of several rows at once.
pub fn write_slice_at_equals_the_cpus_write_slice(tg: &Target) {
    struct Case {
        what: &'static str,
        dst: (&'static [usize], DType),
        /// The source's dims as made, and whether it is transposed (dims 1, 2) before writing.
        src: (&'static [usize], DType, bool),
        dim: isize,
        /// The destination is rows 1.. of a larger buffer along dim 0.
        dst_view: bool,
    }
    let cases = [
        Case {
            what: "kv cache, f32 token into f16",
            dst: (&[2, 6, 4], DType::F16),
            src: (&[2, 1, 4], DType::F32, false),
            dim: 1,
            dst_view: false,
        },
        Case {
            what: "transposed source",
            dst: (&[3, 5, 4], DType::F32),
            src: (&[3, 4, 2], DType::F32, true),
            dim: 1,
            dst_view: false,
        },
        Case {
            what: "destination view at an offset",
            dst: (&[3, 7, 2], DType::BF16),
            src: (&[3, 3, 2], DType::F32, false),
            dim: 1,
            dst_view: true,
        },
        Case {
            what: "last dim, integers",
            dst: (&[2, 3, 7], DType::I64),
            src: (&[2, 3, 3], DType::I64, false),
            dim: -1,
            dst_view: false,
        },
        Case {
            what: "first dim, several rows",
            dst: (&[5, 3, 1], DType::F64),
            src: (&[2, 3, 1], DType::F16, false),
            dim: 0,
            dst_view: false,
        },
    ];
    for (k, c) in cases.iter().enumerate() {
        let seed = 40 + 3 * k as u32;
        // The case's tensors made on the CPU, moved to the target where
        // asked, then viewed: moving copies a tensor contiguous, so views
        // come after.
        let here = |t: Tensor, on_target: bool| if on_target { tg.adopt(Ok(t)).unwrap() } else { t };
        let make_dst = |on_target: bool| {
            if c.dst_view {
                let mut dims = c.dst.0.to_vec();
                dims[0] += 1;
                // The view owns the storage once the whole tensor is dropped here.
                here(filled(&tg.cpu, &dims, c.dst.1, seed), on_target)
                    .narrow(0, 1, c.dst.0[0])
                    .unwrap()
            } else {
                here(filled(&tg.cpu, c.dst.0, c.dst.1, seed), on_target)
            }
        };
        let make_src = |on_target: bool| {
            let t = here(filled(&tg.cpu, c.src.0, c.src.1, seed + 1), on_target);
            if c.src.2 {
                t.transpose(1, 2).unwrap()
            } else {
                t
            }
        };
        let (src, cpu_src) = (make_src(true), make_src(false));
        let d = if c.dim < 0 {
            (c.dst.0.len() as isize + c.dim) as usize
        } else {
            c.dim as usize
        };
        let max_pos = c.dst.0[d] - src.dims()[d];
        for start in 0..=max_pos {
            for (pdtype, scalar, on_target) in [
                (DType::I32, false, true),
                (DType::I64, true, true),
                (DType::I64, false, false),
            ] {
                let what = format!(
                    "{} at {start} ({pdtype}, scalar {scalar}, on target {on_target})",
                    c.what
                );
                let mut want = make_dst(false);
                want.write_slice(c.dim, start, &cpu_src).unwrap();
                let mut got = make_dst(true);
                let pos = position(tg, start as i64, pdtype, scalar, on_target);
                tg.exec.clear_trace();
                got.write_slice_at(c.dim, &pos, &src)
                    .unwrap_or_else(|e| panic!("{what}: {e}"));
                ran_on_device(tg, &what);
                assert_eq!(got.device(), tg.device, "{what}");
                assert_eq!(got.to_cpu_storage().unwrap(), want.to_cpu_storage().unwrap(), "{what}");
            }
        }
    }
}

/// A position outside `0..=size - len`, of another dtype or size, and the
/// `write_slice` mistakes (ranks, lengths, shared storage) are errors, with
/// the destination unchanged; a good write still works after them.
pub fn write_slice_at_rejects_bad_positions(tg: &Target) {
    let mut cache = tg.adopt(Ok(filled(&tg.cpu, &[2, 5, 3], DType::F16, 60))).unwrap();
    let src = tg.adopt(Ok(filled(&tg.cpu, &[2, 2, 3], DType::F32, 61))).unwrap();
    let before = cache.to_cpu_storage().unwrap();
    for (value, pdtype) in [
        (-1i64, DType::I32),
        (4, DType::I32),
        (4, DType::I64),
        (-5, DType::I64),
        (1 << 40, DType::I64),
        (i64::MIN, DType::I64),
    ] {
        let pos = position(tg, value, pdtype, false, true);
        let err = cache.write_slice_at(1, &pos, &src).unwrap_err().to_string();
        assert!(err.contains("outside 0..=3"), "position {value} ({pdtype}): {err}");
        assert_eq!(cache.to_cpu_storage().unwrap(), before, "position {value} ({pdtype})");
    }
    let good = position(tg, 1, DType::I32, false, true);
    for (bad, why) in [
        (tg.from_vec(vec![1.0f32], [1]).unwrap(), "f32 position"),
        (tg.from_vec(vec![1u8], [1]).unwrap(), "u8 position"),
        (tg.from_vec(vec![1i64, 2], [2]).unwrap(), "two positions"),
        (tg.from_vec(vec![1i32], [1, 1]).unwrap(), "position of rank 2"),
        (tg.from_vec(Vec::<i64>::new(), [0]).unwrap(), "no position"),
    ] {
        assert!(cache.write_slice_at(1, &bad, &src).is_err(), "{why}");
    }
    // The shape mistakes write_slice rejects.
    assert!(
        cache.write_slice_at(0, &good, &src).is_err(),
        "source longer than the dim"
    );
    assert!(
        cache
            .write_slice_at(1, &good, &src.reshape([2, 3, 2]).unwrap())
            .is_err(),
        "other dims differ"
    );
    assert!(
        cache.write_slice_at(1, &good, &src.reshape([4, 3]).unwrap()).is_err(),
        "ranks differ"
    );
    assert!(cache.write_slice_at(3, &good, &src).is_err(), "no such dim");
    assert_eq!(cache.to_cpu_storage().unwrap(), before);
    // A view shares the storage: refused, as by write_slice.
    let view = cache.narrow(1, 0, 2).unwrap();
    let err = cache.write_slice_at(1, &good, &src).unwrap_err().to_string();
    assert!(err.contains("shared"), "{err}");
    drop(view);
    // An empty write checks its position too, and writes nothing.
    let mut empty_dim = tg.zeros([2, 5, 0], DType::F32).unwrap();
    let nothing = tg.zeros([2, 2, 0], DType::F32).unwrap();
    empty_dim
        .write_slice_at(1, &position(tg, 3, DType::I64, true, true), &nothing)
        .unwrap();
    assert!(empty_dim
        .write_slice_at(1, &position(tg, 4, DType::I64, true, true), &nothing)
        .is_err());
    // The device is still good after the rejected positions.
    cache.write_slice_at(1, &good, &src).unwrap();
    let mut want = filled(&tg.cpu, &[2, 5, 3], DType::F16, 60);
    want.write_slice(1, 1, &filled(&tg.cpu, &[2, 2, 3], DType::F32, 61))
        .unwrap();
    assert_eq!(cache.to_cpu_storage().unwrap(), want.to_cpu_storage().unwrap());
}

/// The checks of this group, in file order.
pub const CASES: &[Check] = &[
    (
        "qmatmul_gated_equals_the_products_then_the_activation",
        qmatmul_gated_equals_the_products_then_the_activation,
    ),
    (
        "qmatmul_many_equals_one_product_per_weight",
        qmatmul_many_equals_one_product_per_weight,
    ),
    (
        "add_rms_norm_equals_add_then_rms_norm",
        add_rms_norm_equals_add_then_rms_norm,
    ),
    (
        "products_of_a_normed_row_equal_those_of_a_copy",
        products_of_a_normed_row_equal_those_of_a_copy,
    ),
    ("qmatmul_op_gives_the_kernel_bits", qmatmul_op_gives_the_kernel_bits),
    ("qembedding_dequantizes_the_rows", qembedding_dequantizes_the_rows),
    ("bad_quantized_inputs_are_errors", bad_quantized_inputs_are_errors),
    ("write_slice_writes_in_place", write_slice_writes_in_place),
    ("write_slice_converts_like_to_dtype", write_slice_converts_like_to_dtype),
    (
        "write_slice_at_equals_the_cpus_write_slice",
        write_slice_at_equals_the_cpus_write_slice,
    ),
    (
        "write_slice_at_rejects_bad_positions",
        write_slice_at_rejects_bad_positions,
    ),
];
