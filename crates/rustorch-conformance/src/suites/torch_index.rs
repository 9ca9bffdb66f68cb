//! index_select, gather, scatter_add, embedding, cat and stack against
//! PyTorch (tests/fixtures/torch/index.json, from
//! tools/torch_fixtures/index.py), plus error cases and the parallel paths.

use super::torch_common::{assert_matches, load, Case};
use crate::{Case as Check, Target};
use rustorch_core::{DType, Error, Tensor};
use serde_json::Value;

/// Applies the fixture's view list (see apply_view in index.py) to a tensor.
fn apply_view(case: &str, mut t: Tensor, views: &Value) -> Tensor {
    let Some(list) = views.as_array() else { return t };
    let int = |v: &Value| v.as_i64().unwrap_or_else(|| panic!("{case}: bad view arg {v}"));
    let ints = |v: &Value| v.as_array().expect("list").iter().map(int).collect::<Vec<_>>();
    for v in list {
        t = match v[0].as_str().expect("view kind") {
            "t" => t.transpose(int(&v[1]) as isize, int(&v[2]) as isize),
            "narrow" => t.narrow(int(&v[1]) as isize, int(&v[2]) as usize, int(&v[3]) as usize),
            "expand" => t.expand(&ints(&v[1]).iter().map(|&d| d as isize).collect::<Vec<_>>()),
            "permute" => t.permute(&ints(&v[1]).iter().map(|&d| d as isize).collect::<Vec<_>>()),
            "slice" => t.slice(
                int(&v[1]) as isize,
                int(&v[2]) as usize,
                int(&v[3]) as usize,
                int(&v[4]) as usize,
            ),
            k => panic!("{case}: unknown view {k}"),
        }
        .unwrap_or_else(|e| panic!("{case}: view {v}: {e}"));
    }
    assert!(
        list.is_empty() || !t.is_contiguous(),
        "{case}: the view should be non-contiguous"
    );
    t
}

fn inputs(tg: &Target, case: &Case) -> Vec<Tensor> {
    (0..case.inputs.len())
        .map(|i| apply_view(&case.name, case.input(tg, i), &case.args["views"][i.to_string()]))
        .collect()
}

pub fn index_ops_match_torch(tg: &Target) {
    let cases = load("index");
    let mut seen = std::collections::BTreeMap::new();
    for case in &cases {
        let x = inputs(tg, case);
        let refs: Vec<&Tensor> = x.iter().collect();
        let dim = case.args["dim"].as_i64().unwrap_or(0) as isize;
        let op = case.arg_str("op");
        let got = match op {
            "index_select" => x[0].index_select(dim, &x[1]),
            "gather" => x[0].gather(dim, &x[1]),
            "scatter_add" => x[0].scatter_add(dim, &x[1], &x[2]),
            "embedding" => x[0].embedding(&x[1]),
            "cat" => Tensor::cat(&refs, dim),
            "stack" => Tensor::stack(&refs, dim),
            o => panic!("{}: unknown op {o}", case.name),
        }
        .unwrap_or_else(|e| panic!("{}: {e}", case.name));
        assert_matches(tg, case, 0, &got);
        *seen.entry(op.to_string()).or_insert(0) += 1;
    }
    assert_eq!(seen.len(), 6, "{seen:?}");
    assert!(cases.len() > 100);
}

fn i64s(tg: &Target, v: &[i64], shape: &[usize]) -> Tensor {
    tg.from_slice(v, shape.to_vec()).unwrap()
}

fn expect_invalid(what: &str, r: rustorch_core::Result<Tensor>, needles: &[&str]) {
    match r {
        Ok(t) => panic!("{what}: expected an error, got {t:?}"),
        Err(e) => {
            let msg = e.to_string();
            for n in needles {
                assert!(msg.contains(n), "{what}: error {msg:?} should mention {n:?}");
            }
        }
    }
}

pub fn out_of_range_indices_are_errors(tg: &Target) {
    let x = tg.randn([3, 4], DType::F32, 1).unwrap();
    expect_invalid(
        "index_select high",
        x.index_select(1, &i64s(tg, &[0, 4], &[2])),
        &["index 4", "size 4"],
    );
    expect_invalid(
        "index_select negative",
        x.index_select(0, &i64s(tg, &[-1], &[1])),
        &["index -1", "size 3"],
    );
    let idx32 = tg.from_slice(&[1i32, 7], [1, 2]).unwrap();
    expect_invalid("gather i32", x.gather(1, &idx32), &["index 7", "size 4"]);
    let src = tg.ones([1, 2], DType::F32).unwrap();
    expect_invalid(
        "scatter_add",
        x.scatter_add(0, &i64s(tg, &[0, 3], &[1, 2]), &src),
        &["index 3", "size 3"],
    );
    expect_invalid(
        "scatter_add negative",
        x.scatter_add(1, &i64s(tg, &[-2, 0], &[1, 2]), &src),
        &["index -2"],
    );
    let w = tg.randn([5, 2], DType::F16, 2).unwrap();
    expect_invalid(
        "embedding",
        w.embedding(&i64s(tg, &[0, 5], &[2])),
        &["index 5", "size 5"],
    );
    let ids8 = tg.from_slice(&[200u8], [1]).unwrap();
    expect_invalid("embedding u8", w.embedding(&ids8), &["index 200"]);
    // The error is the caller's: no other device is tried.
    assert!(matches!(
        x.index_select(0, &i64s(tg, &[9], &[1])),
        Err(Error::Backend {
            source: rustorch_core::BackendError::InvalidInput { .. },
            ..
        })
    ));
}

pub fn bad_arguments_are_errors(tg: &Target) {
    let x = tg.randn([3, 4], DType::F32, 1).unwrap();
    let fidx = tg.zeros([2], DType::F32).unwrap();
    assert!(x.index_select(0, &fidx).is_err(), "float index");
    assert!(x.index_select(2, &i64s(tg, &[0], &[1])).is_err(), "dim out of range");
    assert!(
        x.index_select(-3, &i64s(tg, &[0], &[1])).is_err(),
        "negative dim out of range"
    );
    assert!(x.index_select(0, &i64s(tg, &[0, 1], &[1, 2])).is_err(), "2-D index");
    assert!(x.gather(0, &i64s(tg, &[0, 1], &[2])).is_err(), "gather rank mismatch");
    assert!(
        x.gather(0, &i64s(tg, &[0; 10], &[2, 5])).is_err(),
        "gather index too wide"
    );
    let src64 = tg.ones([1, 2], DType::F64).unwrap();
    assert!(
        x.scatter_add(0, &i64s(tg, &[0, 1], &[1, 2]), &src64).is_err(),
        "scatter dtype mismatch"
    );
    let small = tg.ones([1, 1], DType::F32).unwrap();
    assert!(
        x.scatter_add(0, &i64s(tg, &[0, 1], &[1, 2]), &small).is_err(),
        "source smaller than index"
    );
    let w3 = tg.zeros([2, 3, 4], DType::F32).unwrap();
    assert!(w3.embedding(&i64s(tg, &[0], &[1])).is_err(), "3-D table");
    assert!(Tensor::cat(&[], 0).is_err(), "cat of nothing");
    let y = tg.zeros([3, 5], DType::F32).unwrap();
    assert!(Tensor::cat(&[&x, &y], 0).is_err(), "cat shape mismatch");
    assert!(Tensor::cat(&[&x, &y], 2).is_err(), "cat dim out of range");
    assert!(Tensor::stack(&[&x, &y], 0).is_err(), "stack shape mismatch");
    assert!(Tensor::stack(&[&x, &x], 3).is_err(), "stack dim out of range");
}

/// Deterministic pseudo-random integers for the large cases.
fn lcg(n: usize, modulo: u64, seed: u64) -> Vec<i64> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((s >> 33) % modulo) as i64
        })
        .collect()
}

/// Large enough for the parallel paths; checked against plain loops.
pub fn large_inputs_match_plain_loops(tg: &Target) {
    let (r, c) = (300, 257);
    let xv: Vec<i64> = lcg(r * c, 1000, 1);
    let x = i64s(tg, &xv, &[r, c]);
    // index_select along both dims.
    let idx = lcg(400, r as u64, 2);
    let got = x
        .index_select(0, &i64s(tg, &idx, &[400]))
        .unwrap()
        .to_vec::<i64>()
        .unwrap();
    let want: Vec<i64> = idx
        .iter()
        .flat_map(|&i| xv[i as usize * c..(i as usize + 1) * c].to_vec())
        .collect();
    assert_eq!(got, want, "index_select dim 0");
    let idx = lcg(150, c as u64, 3);
    let got = x
        .index_select(1, &i64s(tg, &idx, &[150]))
        .unwrap()
        .to_vec::<i64>()
        .unwrap();
    let want: Vec<i64> = (0..r)
        .flat_map(|i| idx.iter().map(move |&j| (i, j)))
        .map(|(i, j)| xv[i * c + j as usize])
        .collect();
    assert_eq!(got, want, "index_select dim 1");
    // gather along dim 0 of the transposed tensor (strided source).
    let xt = x.t().unwrap();
    let gi = lcg(c * r, c as u64, 4);
    let got = xt.gather(1, &i64s(tg, &gi, &[c, r])).unwrap().to_vec::<i64>().unwrap();
    let want: Vec<i64> = (0..c * r).map(|e| xv[gi[e] as usize * c + e / r]).collect();
    assert_eq!(got, want, "gather");
    // scatter_add along dim 1 with many repeats.
    let si = lcg(r * 200, c as u64, 5);
    let src: Vec<i64> = lcg(r * 200, 50, 6);
    let got = x
        .scatter_add(1, &i64s(tg, &si, &[r, 200]), &i64s(tg, &src, &[r, 200]))
        .unwrap()
        .to_vec::<i64>()
        .unwrap();
    let mut want = xv.clone();
    for e in 0..r * 200 {
        want[(e / 200) * c + si[e] as usize] += src[e];
    }
    assert_eq!(got, want, "scatter_add");
    // scatter_add along dim 0 (one slab, sequential).
    let si = lcg(200 * c, r as u64, 7);
    let got = x
        .scatter_add(0, &i64s(tg, &si, &[200, c]), &i64s(tg, &src[..200 * c], &[200, c]))
        .unwrap()
        .to_vec::<i64>()
        .unwrap();
    let mut want = xv.clone();
    for e in 0..200 * c {
        want[si[e] as usize * c + e % c] += src[e];
    }
    assert_eq!(got, want, "scatter_add dim 0");
}

pub fn index_select_accepts_a_scalar_index(tg: &Target) {
    let x = tg.from_slice(&[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], [3, 2]).unwrap();
    let i = tg.scalar(2i64);
    let y = x.index_select(0, &i).unwrap();
    assert_eq!(y.dims(), &[1, 2]);
    assert_eq!(y.to_vec::<f32>().unwrap(), vec![5.0, 6.0]);
}

/// The checks of this group, in file order.
pub const CASES: &[Check] = &[
    ("index_ops_match_torch", index_ops_match_torch),
    ("out_of_range_indices_are_errors", out_of_range_indices_are_errors),
    ("bad_arguments_are_errors", bad_arguments_are_errors),
    ("large_inputs_match_plain_loops", large_inputs_match_plain_loops),
    (
        "index_select_accepts_a_scalar_index",
        index_select_accepts_a_scalar_index,
    ),
];
