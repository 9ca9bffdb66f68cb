//! Reductions, softmax, cumsum, sort and topk checked against PyTorch
//! (fixtures from tools/torch_fixtures/reduce.py), plus error handling and
//! properties that fixtures cannot hold (very large inputs, accuracy).

use super::torch_common::{assert_close, fixture_tol, load, Case};
use crate::{Case as Check, Target};
use rustorch_core::CpuStorage;
use rustorch_core::{DType, Result, Tensor};
use serde_json::Value;
use std::panic::{catch_unwind, AssertUnwindSafe};

/// Rebuilds a generated input: element i is ((i * mul) % mod - off) / div.
fn gen_input(tg: &Target, spec: &Value) -> Tensor {
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
    tg.tensor(CpuStorage::from_f64_iter(dtype, it), shape)
}

fn ints(v: &Value) -> Vec<isize> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_i64().unwrap() as isize)
        .collect()
}

/// The case's input with its views applied, as the Python side did.
fn input(tg: &Target, c: &Case) -> Tensor {
    let mut x = if c.has_arg("gen") {
        gen_input(tg, &c.args["gen"])
    } else {
        c.input(tg, 0)
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
fn check(tg: &Target, ops: &[&str]) {
    let cases: Vec<Case> = load("reduce")
        .into_iter()
        .filter(|c| ops.contains(&c.arg_str("op")))
        .collect();
    assert!(!cases.is_empty(), "no fixtures for {ops:?}");
    let mut failures = Vec::new();
    for c in &cases {
        let r = catch_unwind(AssertUnwindSafe(|| {
            let x = input(tg, c);
            let outs = run(c, &x).unwrap_or_else(|e| panic!("{}: {e}", c.name));
            assert_eq!(outs.len(), c.outputs.len(), "{}: output count", c.name);
            for (i, (got, want)) in outs.iter().zip(&c.outputs).enumerate() {
                let got = if c.has_arg("sample") {
                    subsample(got, c.arg_i64("sample") as usize)
                } else {
                    got.clone()
                };
                assert_close(
                    tg,
                    &format!("{} (output {i})", c.name),
                    &got,
                    want,
                    fixture_tol(want.dtype),
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

pub fn sum_mean_max_min_prod(tg: &Target) {
    check(tg, &["sum", "mean", "max", "min", "prod"]);
}

pub fn var_std(tg: &Target) {
    check(tg, &["var", "std"]);
}

pub fn argmax_argmin(tg: &Target) {
    check(tg, &["argmax", "argmin"]);
}

pub fn softmax_log_softmax(tg: &Target) {
    check(tg, &["softmax", "log_softmax"]);
}

pub fn cumsum(tg: &Target) {
    check(tg, &["cumsum"]);
}

pub fn sort_topk(tg: &Target) {
    check(tg, &["sort", "topk"]);
}

fn t(tg: &Target, v: Vec<f32>, shape: &[usize]) -> Tensor {
    tg.from_vec(v, shape.to_vec()).unwrap()
}

pub fn invalid_input_is_an_error(tg: &Target) {
    let x = t(tg, (0..10).map(|i| i as f32).collect(), &[2, 5]);
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
    let i = tg.from_vec(vec![1i64, 2, 3], [3]).unwrap();
    assert!(i.mean_all().is_err());
    assert!(i.var(&[], 1, false).is_err());
    assert!(i.softmax(0).is_err());
    let c = tg.from_vec(vec![rustorch_core::C64::new(1.0, 2.0)], [1]).unwrap();
    assert!(c.max_all().is_err());
    assert!(c.sort(0, false).is_err());
    // max, min and argmax of nothing
    let e = tg.zeros([0, 3], DType::F32).unwrap();
    assert!(e.max(&[0], false).is_err());
    assert!(e.min_all().is_err());
    assert!(e.argmax(0, false).is_err());
    assert!(e.sum(&[0], false).is_ok());
    // 0-d tensors take dim 0 or -1 only
    let s = tg.scalar(2.0f32);
    assert!(s.softmax(1).is_err());
    assert!(s.argmax(-2, false).is_err());
    assert_eq!(s.cumsum(-1).unwrap().to_vec::<f32>().unwrap(), vec![2.0]);
    assert_eq!(s.sum(&[0], true).unwrap().dims(), &[] as &[usize]);
    assert!(s.sum(&[1], false).is_err());
}

/// f32 sums of a million values stay close to the exact sum (pairwise
/// blocks of lane sums); a sequential f32 loop would be off by ~1e-4.
pub fn long_f32_sums_are_accurate(tg: &Target) {
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
    let x = t(tg, v.clone(), &[n]);
    let got = x.sum_all().unwrap().to_scalar::<f32>().unwrap() as f64;
    assert!(((got - exact) / exact).abs() < 2e-7, "sum {got} vs exact {exact}");
    let mean = x.mean_all().unwrap().to_scalar::<f32>().unwrap() as f64;
    assert!(((mean - exact / n as f64) / (exact / n as f64)).abs() < 2e-7);
    // The same values as columns: the outer-reduction path.
    let cols = t(tg, v, &[n / 8, 8]).sum(&[0], false).unwrap().to_vec::<f32>().unwrap();
    let total: f64 = cols.iter().map(|&c| c as f64).sum();
    assert!(
        ((total - exact) / exact).abs() < 2e-7,
        "column sums {total} vs exact {exact}"
    );
}

/// NaN and ties across the chunks that long rows are split into.
pub fn long_rows_keep_first_index_and_nan(tg: &Target) {
    let n = 300_001;
    let mut v = vec![0f32; n];
    v[70_000] = 5.0;
    v[250_000] = 5.0;
    let x = t(tg, v.clone(), &[n]);
    assert_eq!(x.argmax(0, false).unwrap().to_scalar::<i64>().unwrap(), 70_000);
    assert_eq!(x.max_all().unwrap().to_scalar::<f32>().unwrap(), 5.0);
    v[200_000] = f32::NAN;
    v[290_000] = f32::NAN;
    let x = t(tg, v, &[n]);
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
    let idx = t(tg, w, &[rows, 4]).argmax(0, false).unwrap().to_vec::<i64>().unwrap();
    assert_eq!(idx, vec![0, 12_000, 5_000, 0]);
}

/// Stable sort and topk against a plain stable sort, on data with ties.
pub fn sort_matches_a_stable_reference(tg: &Target) {
    let (rows, len) = (37, 513);
    let v: Vec<f32> = (0..rows * len).map(|i| ((i * 7919) % 23) as f32 - 11.0).collect();
    let x = t(tg, v.clone(), &[rows, len]);
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
pub fn softmax_properties_on_large_inputs(tg: &Target) {
    let (rows, len) = (256, 4099);
    let v: Vec<f32> = (0..rows * len)
        .map(|i| (((i * 37) % 1009) as f32 - 500.0) / 25.0)
        .collect();
    let x = t(tg, v, &[rows, len]);
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

/// The checks of this group, in file order.
pub const CASES: &[Check] = &[
    ("sum_mean_max_min_prod", sum_mean_max_min_prod),
    ("var_std", var_std),
    ("argmax_argmin", argmax_argmin),
    ("softmax_log_softmax", softmax_log_softmax),
    ("cumsum", cumsum),
    ("sort_topk", sort_topk),
    ("invalid_input_is_an_error", invalid_input_is_an_error),
    ("long_f32_sums_are_accurate", long_f32_sums_are_accurate),
    ("long_rows_keep_first_index_and_nan", long_rows_keep_first_index_and_nan),
    ("sort_matches_a_stable_reference", sort_matches_a_stable_reference),
    ("softmax_properties_on_large_inputs", softmax_properties_on_large_inputs),
];
