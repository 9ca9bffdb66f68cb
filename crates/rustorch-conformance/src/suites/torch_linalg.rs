//! Matrix products against PyTorch (fixtures from tools/torch_fixtures/linalg.py).

use super::torch_common::{load, Case};
use crate::{Case as Check, Target};
use rustorch_core::{DType, Tensor};
use serde_json::Value;

/// Applies the fixture's view ops (the same ones linalg.py applied).
fn apply_views(mut t: Tensor, spec: &Value) -> Tensor {
    for v in spec.as_array().expect("view list") {
        let v = v.as_array().expect("view op");
        let int = |i: usize| v[i].as_i64().expect("integer");
        let list = |i: usize| -> Vec<isize> {
            v[i].as_array()
                .expect("list")
                .iter()
                .map(|x| x.as_i64().expect("integer") as isize)
                .collect()
        };
        t = match v[0].as_str().expect("view kind") {
            "transpose" => t.transpose(int(1) as isize, int(2) as isize),
            "narrow" => t.narrow(int(1) as isize, int(2) as usize, int(3) as usize),
            "expand" => t.expand(&list(1)),
            "permute" => t.permute(&list(1)),
            k => panic!("unknown view {k}"),
        }
        .expect("view");
    }
    t
}

fn operands(tg: &Target, c: &Case) -> (Tensor, Tensor) {
    let views = &c.args["views"];
    (
        apply_views(c.input(tg, 0), &views[0]),
        apply_views(c.input(tg, 1), &views[1]),
    )
}

pub fn matmul_matches_torch(tg: &Target) {
    let cases = load("linalg");
    assert!(cases.len() > 50);
    for c in &cases {
        let (a, b) = operands(tg, c);
        let got = match c.arg_str("op") {
            "matmul" => a.matmul(&b),
            "mm" => a.mm(&b),
            "bmm" => a.bmm(&b),
            op => panic!("unknown op {op}"),
        }
        .unwrap_or_else(|e| panic!("{}: {e}", c.name));
        super::torch_common::assert_matches(tg, c, 0, &got);
    }
}

pub fn views_are_really_strided(tg: &Target) {
    // Guards the fixtures: the view cases must reach the kernel as strided
    // layouts, not as contiguous copies.
    let cases = load("linalg");
    let c = cases.iter().find(|c| c.name == "transposed_f32").expect("case");
    let (a, b) = operands(tg, c);
    assert!(!a.is_contiguous() && !b.is_contiguous());
    let c = cases.iter().find(|c| c.name == "expanded_rhs_f32").expect("case");
    assert_eq!(operands(tg, c).1.strides()[0], 0);
}

pub fn bad_shapes_are_errors(tg: &Target) {
    let t = |s: &[usize]| tg.zeros(s.to_vec(), DType::F32).unwrap();
    assert!(t(&[3, 4]).matmul(&t(&[5, 2])).is_err(), "inner mismatch");
    assert!(t(&[4]).matmul(&t(&[5])).is_err(), "dot length mismatch");
    assert!(t(&[2, 3, 4]).matmul(&t(&[3, 4, 5])).is_err(), "batch mismatch");
    assert!(tg.scalar(1.0f32).matmul(&t(&[1, 1])).is_err(), "0-D operand");
    assert!(t(&[2, 3, 4]).mm(&t(&[4, 5])).is_err(), "mm needs 2-D");
    assert!(t(&[2, 3, 4]).bmm(&t(&[4, 5])).is_err(), "bmm needs 3-D");
    assert!(t(&[2, 3, 4]).bmm(&t(&[1, 4, 5])).is_err(), "bmm does not broadcast");
    let i = tg.zeros([2, 2], DType::I64).unwrap();
    assert!(i.matmul(&i).is_err(), "integer matmul");
    let h = tg.zeros([2, 2], DType::F16).unwrap();
    assert!(t(&[2, 2]).matmul(&h).is_err(), "mixed dtypes");
}

/// Reference product in f64 for sizes too large to store as fixtures:
/// exercises the threaded paths (one large gemm, many small ones in
/// parallel, and the folded-batch path).
fn reference(a: &[f32], b: &[f32], batch: usize, m: usize, k: usize, n: usize, b_shared: bool) -> Vec<f64> {
    let mut out = vec![0.0; batch * m * n];
    for bi in 0..batch {
        let bo = if b_shared { 0 } else { bi * k * n };
        for i in 0..m {
            for j in 0..n {
                let mut s = 0.0f64;
                for p in 0..k {
                    s += a[bi * m * k + i * k + p] as f64 * b[bo + p * n + j] as f64;
                }
                out[bi * m * n + i * n + j] = s;
            }
        }
    }
    out
}

pub fn large_products_match_reference(tg: &Target) {
    for &(batch, m, k, n, shared) in &[
        (1, 130, 150, 140, false),
        (64, 12, 40, 16, false),
        (6, 50, 70, 30, true),
    ] {
        let a = tg.randn([batch, m, k], DType::F32, 7).unwrap();
        let b = if shared {
            tg.randn([k, n], DType::F32, 8).unwrap()
        } else {
            tg.randn([batch, k, n], DType::F32, 8).unwrap()
        };
        let got = a.matmul(&b).unwrap().to_vec::<f32>().unwrap();
        let want = reference(&a.to_vec().unwrap(), &b.to_vec().unwrap(), batch, m, k, n, shared);
        for (g, w) in got.iter().zip(&want) {
            assert!(
                (*g as f64 - w).abs() <= 1e-4 * (1.0 + w.abs()),
                "{batch}x{m}x{k}x{n}: {g} vs {w}"
            );
        }
    }
}

/// The checks of this group, in file order.
pub const CASES: &[Check] = &[
    ("matmul_matches_torch", matmul_matches_torch),
    ("views_are_really_strided", views_are_really_strided),
    ("bad_shapes_are_errors", bad_shapes_are_errors),
    ("large_products_match_reference", large_products_match_reference),
];
