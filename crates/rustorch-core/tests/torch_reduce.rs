//! Reductions, softmax, cumsum, sort and topk checked against PyTorch
//! (fixtures from tools/torch_fixtures/reduce.py), plus error handling and
//! properties that fixtures cannot hold (very large inputs, accuracy).

mod common;

use common::{assert_close, load, Case, Tol};
use rustorch_core::op::ReduceOp;
use rustorch_core::{DType, Layout, Op, Result, Tensor, TensorMeta};
use rustorch_cpu::{CpuBackend, CpuInput, CpuStorage};
use serde_json::Value;
use std::panic::{catch_unwind, AssertUnwindSafe};

/// Rebuilds a generated input: element i is ((i * mul) % mod - off) / div.
fn gen_input(spec: &Value) -> Tensor {
    let shape: Vec<usize> = spec["shape"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d.as_u64().unwrap() as usize)
        .collect();
    let dtype = DType::parse(spec["dtype"].as_str().unwrap()).unwrap();
    let g = |k: &str| spec[k].as_i64().unwrap();
    let (mul, m, off, div) = (g("mul"), g("mod"), g("off"), g("div"));
    let n: usize = shape.iter().product();
    let it = (0..n as i64).map(|i| ((i * mul) % m - off) as f64 / div as f64);
    Tensor::from_storage(CpuStorage::from_f64_iter(dtype, it), shape).unwrap()
}

fn ints(v: &Value) -> Vec<isize> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_i64().unwrap() as isize)
        .collect()
}

/// The case's input with its views applied, as the Python side did.
fn input(c: &Case) -> Tensor {
    let mut x = if c.has_arg("gen") {
        gen_input(&c.args["gen"])
    } else {
        c.input(0)
    };
    for v in c.args["views"].as_array().into_iter().flatten() {
        let v = v.as_array().unwrap();
        let n = |i: usize| v[i].as_i64().unwrap();
        x = match v[0].as_str().unwrap() {
            "t" => x.transpose(n(1) as isize, n(2) as isize),
            "narrow" => x.narrow(n(1) as isize, n(2) as usize, n(3) as usize),
            "expand" => x.expand(&ints(&v[1])),
            other => panic!("{}: unknown view {other}", c.name),
        }
        .unwrap();
    }
    if c.args["views"].as_array().is_some_and(|v| !v.is_empty()) {
        assert!(!x.is_contiguous(), "{}: the view should be non-contiguous", c.name);
    }
    x
}

fn run(c: &Case, x: &Tensor) -> Result<Vec<Tensor>> {
    let dims = || ints(&c.args["dims"]);
    let kd = || c.arg_bool("keepdim");
    let dim = || c.arg_i64("dim") as isize;
    let one = |t: Result<Tensor>| t.map(|t| vec![t]);
    let two = |t: Result<(Tensor, Tensor)>| t.map(|(a, b)| vec![a, b]);
    match c.arg_str("op") {
        "sum" => one(x.sum(&dims(), kd())),
        "mean" => one(x.mean(&dims(), kd())),
        "max" => one(x.max(&dims(), kd())),
        "min" => one(x.min(&dims(), kd())),
        "prod" => one(x.prod(&dims(), kd())),
        "var" => one(x.var(&dims(), c.arg_i64("correction") as u32, kd())),
        "std" => one(x.std(&dims(), c.arg_i64("correction") as u32, kd())),
        "argmax" => one(x.argmax(dim(), kd())),
        "argmin" => one(x.argmin(dim(), kd())),
        "softmax" => one(x.softmax(dim())),
        "log_softmax" => one(x.log_softmax(dim())),
        "cumsum" => one(x.cumsum(dim())),
        "sort" => two(x.sort(dim(), c.arg_bool("descending"))),
        "topk" => two(x.topk(c.arg_i64("k") as usize, dim(), c.arg_bool("largest"))),
        other => panic!("{}: unknown op {other}", c.name),
    }
}

/// Every `stride`-th element of the flattened tensor (what the fixture
/// stores for large outputs).
fn subsample(t: &Tensor, stride: usize) -> Tensor {
    let n = t.numel();
    t.reshape([n]).unwrap().slice(0, 0, n, stride).unwrap()
}

/// Runs every case whose op is in `ops`; reports all failures at once.
fn check(ops: &[&str]) {
    let cases: Vec<Case> = load("reduce")
        .into_iter()
        .filter(|c| ops.contains(&c.arg_str("op")))
        .collect();
    assert!(!cases.is_empty(), "no fixtures for {ops:?}");
    let mut failures = Vec::new();
    for c in &cases {
        let r = catch_unwind(AssertUnwindSafe(|| {
            let x = input(c);
            let outs = run(c, &x).unwrap_or_else(|e| panic!("{}: {e}", c.name));
            assert_eq!(outs.len(), c.outputs.len(), "{}: output count", c.name);
            for (i, (got, want)) in outs.iter().zip(&c.outputs).enumerate() {
                let got = if c.has_arg("sample") {
                    subsample(got, c.arg_i64("sample") as usize)
                } else {
                    got.clone()
                };
                assert_close(
                    &format!("{} (output {i})", c.name),
                    &got,
                    want,
                    Tol::for_dtype(want.dtype),
                );
            }
        }));
        if let Err(e) = r {
            let msg = e
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()));
            failures.push(msg.unwrap_or_else(|| c.name.clone()));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases failed:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

#[test]
fn sum_mean_max_min_prod() {
    check(&["sum", "mean", "max", "min", "prod"]);
}

#[test]
fn var_std() {
    check(&["var", "std"]);
}

#[test]
fn argmax_argmin() {
    check(&["argmax", "argmin"]);
}

#[test]
fn softmax_log_softmax() {
    check(&["softmax", "log_softmax"]);
}

#[test]
fn cumsum() {
    check(&["cumsum"]);
}

#[test]
fn sort_topk() {
    check(&["sort", "topk"]);
}

fn t(v: Vec<f32>, shape: &[usize]) -> Tensor {
    Tensor::from_vec(v, shape.to_vec()).unwrap()
}

#[test]
fn invalid_input_is_an_error() {
    let x = t((0..10).map(|i| i as f32).collect(), &[2, 5]);
    assert!(x.sum(&[2], false).is_err());
    assert!(x.sum(&[-3], false).is_err());
    assert!(x.sum(&[1, 1], false).is_err());
    assert!(x.sum(&[1, -1], false).is_err());
    assert!(x.max(&[5], true).is_err());
    assert!(x.var(&[7], 1, false).is_err());
    assert!(x.argmax(2, false).is_err());
    assert!(x.argmin(-3, false).is_err());
    assert!(x.softmax(2).is_err());
    assert!(x.log_softmax(-3).is_err());
    assert!(x.cumsum(4).is_err());
    assert!(x.sort(2, false).is_err());
    assert!(x.topk(6, 1, true).is_err());
    assert!(x.topk(3, 0, true).is_err());
    assert!(x.topk(1, 2, true).is_err());
    assert!(x.topk(2, 1, true).is_ok());
    // dtypes without a meaning for the op
    let i = Tensor::from_vec(vec![1i64, 2, 3], [3]).unwrap();
    assert!(i.mean_all().is_err());
    assert!(i.var(&[], 1, false).is_err());
    assert!(i.softmax(0).is_err());
    let c = Tensor::from_vec(vec![rustorch_core::C64::new(1.0, 2.0)], [1]).unwrap();
    assert!(c.max_all().is_err());
    assert!(c.sort(0, false).is_err());
    // max, min and argmax of nothing
    let e = Tensor::zeros([0, 3], DType::F32).unwrap();
    assert!(e.max(&[0], false).is_err());
    assert!(e.min_all().is_err());
    assert!(e.argmax(0, false).is_err());
    assert!(e.sum(&[0], false).is_ok());
    // 0-d tensors take dim 0 or -1 only
    let s = Tensor::scalar(2.0f32);
    assert!(s.softmax(1).is_err());
    assert!(s.argmax(-2, false).is_err());
    assert_eq!(s.cumsum(-1).unwrap().to_vec::<f32>().unwrap(), vec![2.0]);
    assert_eq!(s.sum(&[0], true).unwrap().dims(), &[] as &[usize]);
    assert!(s.sum(&[1], false).is_err());
}

/// The kernels themselves reject what validation would have caught, so a
/// backend caller that skips `infer_outputs` gets an error, not a panic.
#[test]
fn kernels_reject_bad_ops_without_panicking() {
    let storage = CpuStorage::F32((0..6).map(|i| i as f32).collect());
    let layout = Layout::contiguous([2, 3]);
    let input = [CpuInput {
        storage: &storage,
        layout: &layout,
    }];
    let out = [TensorMeta::new([2, 3], DType::F32)];
    let two = [TensorMeta::new([2, 3], DType::F32), TensorMeta::new([2, 3], DType::I64)];
    assert!(CpuBackend::run(&Op::Softmax { dim: 2 }, &input, &out).is_err());
    assert!(CpuBackend::run(&Op::Cumsum { dim: 9 }, &input, &out).is_err());
    assert!(CpuBackend::run(
        &Op::TopK {
            k: 4,
            dim: 1,
            largest: true
        },
        &input,
        &two
    )
    .is_err());
    assert!(CpuBackend::run(
        &Op::Sort {
            dim: 3,
            descending: false
        },
        &input,
        &two
    )
    .is_err());
    assert!(CpuBackend::run(&Op::Softmax { dim: 0 }, &input, &[]).is_err());
    let ints = CpuStorage::I64(vec![1; 6]);
    let input = [CpuInput {
        storage: &ints,
        layout: &layout,
    }];
    assert!(CpuBackend::run(&Op::Softmax { dim: 1 }, &input, &out).is_err());
    let mean = Op::Reduce {
        op: ReduceOp::Mean,
        dims: vec![1],
        keepdim: false,
    };
    assert!(CpuBackend::run(&mean, &input, &[TensorMeta::new([2], DType::F32)]).is_err());
}

/// f32 sums of a million values stay close to the exact sum (pairwise
/// blocks of lane sums); a sequential f32 loop would be off by ~1e-4.
#[test]
fn long_f32_sums_are_accurate() {
    let n = 1 << 20;
    let mut state = 12345u64;
    let v: Vec<f32> = (0..n)
        .map(|_| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((state >> 40) as f32) / (1u64 << 24) as f32
        })
        .collect();
    let exact: f64 = v.iter().map(|&x| x as f64).sum();
    let x = t(v.clone(), &[n]);
    let got = x.sum_all().unwrap().to_scalar::<f32>().unwrap() as f64;
    assert!(((got - exact) / exact).abs() < 2e-7, "sum {got} vs exact {exact}");
    let mean = x.mean_all().unwrap().to_scalar::<f32>().unwrap() as f64;
    assert!(((mean - exact / n as f64) / (exact / n as f64)).abs() < 2e-7);
    // The same values as columns: the outer-reduction path.
    let cols = t(v, &[n / 8, 8]).sum(&[0], false).unwrap().to_vec::<f32>().unwrap();
    let total: f64 = cols.iter().map(|&c| c as f64).sum();
    assert!(
        ((total - exact) / exact).abs() < 2e-7,
        "column sums {total} vs exact {exact}"
    );
}

/// NaN and ties across the chunks that long rows are split into.
#[test]
fn long_rows_keep_first_index_and_nan() {
    let n = 300_001;
    let mut v = vec![0f32; n];
    v[70_000] = 5.0;
    v[250_000] = 5.0;
    let x = t(v.clone(), &[n]);
    assert_eq!(x.argmax(0, false).unwrap().to_scalar::<i64>().unwrap(), 70_000);
    assert_eq!(x.max_all().unwrap().to_scalar::<f32>().unwrap(), 5.0);
    v[200_000] = f32::NAN;
    v[290_000] = f32::NAN;
    let x = t(v, &[n]);
    assert_eq!(x.argmax(0, false).unwrap().to_scalar::<i64>().unwrap(), 200_000);
    assert_eq!(x.argmin(0, false).unwrap().to_scalar::<i64>().unwrap(), 200_000);
    assert!(x.max_all().unwrap().to_scalar::<f32>().unwrap().is_nan());
    assert!(x.min_all().unwrap().to_scalar::<f32>().unwrap().is_nan());
    assert!(x.sum_all().unwrap().to_scalar::<f32>().unwrap().is_nan());
    // Outer reduction split over row ranges: the first of two maxima wins.
    let rows = 20_000;
    let mut w = vec![1f32; rows * 4];
    w[5_000 * 4 + 2] = 9.0;
    w[15_000 * 4 + 2] = 9.0;
    w[12_000 * 4 + 1] = f32::NAN;
    let idx = t(w, &[rows, 4]).argmax(0, false).unwrap().to_vec::<i64>().unwrap();
    assert_eq!(idx, vec![0, 12_000, 5_000, 0]);
}

/// Stable sort and topk against a plain stable sort, on data with ties.
#[test]
fn sort_matches_a_stable_reference() {
    let (rows, len) = (37, 513);
    let v: Vec<f32> = (0..rows * len).map(|i| ((i * 7919) % 23) as f32 - 11.0).collect();
    let x = t(v.clone(), &[rows, len]);
    for desc in [false, true] {
        let (vals, idx) = x.sort(1, desc).unwrap();
        let (tv, ti) = x.topk(17, 1, desc).unwrap();
        let (vals, idx) = (vals.to_vec::<f32>().unwrap(), idx.to_vec::<i64>().unwrap());
        let (tv, ti) = (tv.to_vec::<f32>().unwrap(), ti.to_vec::<i64>().unwrap());
        for r in 0..rows {
            let mut want: Vec<(f32, usize)> = (0..len).map(|i| (v[r * len + i], i)).collect();
            want.sort_by(|a, b| if desc { b.0.total_cmp(&a.0) } else { a.0.total_cmp(&b.0) });
            for (j, &(wv, wi)) in want.iter().enumerate() {
                assert_eq!(
                    (vals[r * len + j], idx[r * len + j]),
                    (wv, wi as i64),
                    "row {r} pos {j}"
                );
            }
            for (j, &(wv, wi)) in want.iter().take(17).enumerate() {
                assert_eq!(
                    (tv[r * 17 + j], ti[r * 17 + j]),
                    (wv, wi as i64),
                    "topk row {r} pos {j}"
                );
            }
        }
    }
}

/// Softmax rows sum to one and log_softmax is its log, on a large input
/// that takes the parallel path; f16 agrees with f32 after rounding.
#[test]
fn softmax_properties_on_large_inputs() {
    let (rows, len) = (256, 4099);
    let v: Vec<f32> = (0..rows * len)
        .map(|i| (((i * 37) % 1009) as f32 - 500.0) / 25.0)
        .collect();
    let x = t(v, &[rows, len]);
    let p = x.softmax(-1).unwrap();
    let sums = p.sum(&[-1], false).unwrap().to_vec::<f32>().unwrap();
    assert!(sums.iter().all(|s| (s - 1.0).abs() < 1e-5), "row sums {:?}", &sums[..4]);
    let lp = x.log_softmax(-1).unwrap().to_vec::<f32>().unwrap();
    let pv = p.to_vec::<f32>().unwrap();
    for (a, b) in pv.iter().zip(&lp).step_by(101) {
        assert!((a.ln() - b).abs() < 1e-4 * b.abs().max(1.0), "{} vs {}", a.ln(), b);
    }
    let h = x
        .to_dtype(DType::F16)
        .unwrap()
        .softmax(-1)
        .unwrap()
        .to_dtype(DType::F32)
        .unwrap();
    let hv = h.to_vec::<f32>().unwrap();
    let xh = x
        .to_dtype(DType::F16)
        .unwrap()
        .to_dtype(DType::F32)
        .unwrap()
        .softmax(-1)
        .unwrap();
    for (a, b) in hv.iter().zip(xh.to_vec::<f32>().unwrap()).step_by(13) {
        assert!((a - b).abs() <= 1e-3 * b.abs() + 1e-7, "{a} vs {b}");
    }
}
