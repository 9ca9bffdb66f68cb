//! Elementwise ops checked against PyTorch (fixtures from
//! tools/torch_fixtures/elementwise.py), plus what fixtures cannot hold:
//! errors, the `&Tensor` operators, large inputs that take the parallel
//! path, and agreement between layouts.

use super::torch_common::{assert_close, fixture_tol, load, Case};
use crate::{Case as Check, Target};
use rustorch_core::executor::Operand;
use rustorch_core::op::BinaryOp;
use rustorch_core::{DType, Error, Op, Result, Scalar, Tensor};
use serde_json::Value;

/// Input `i` of a case with its views applied, as the Python side did.
fn input(tg: &Target, c: &Case, i: usize) -> Tensor {
    let mut x = c.input(tg, i);
    let views = &c.args["views"][i];
    for v in views.as_array().into_iter().flatten() {
        let v = v.as_array().unwrap();
        let n = |k: usize| v[k].as_i64().unwrap();
        x = match v[0].as_str().unwrap() {
            "t" => x.transpose(n(1) as isize, n(2) as isize),
            "narrow" => x.narrow(n(1) as isize, n(2) as usize, n(3) as usize),
            "expand" => {
                let dims: Vec<isize> = v[1]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|d| d.as_i64().unwrap() as isize)
                    .collect();
                x.expand(&dims)
            }
            "step" => {
                let dim = n(1) as isize;
                let len = x.size(dim).unwrap();
                x.slice(dim, 0, len, n(2) as usize)
            }
            other => panic!("{}: unknown view {other}", c.name),
        }
        .unwrap();
    }
    if views.as_array().is_some_and(|v| !v.is_empty()) {
        assert!(!x.is_contiguous(), "{}: the view should be non-contiguous", c.name);
    }
    x
}

fn scalar(c: &Case) -> Scalar {
    let v = &c.args["scalar"];
    match c.arg_str("scalar_kind") {
        "float" => Scalar::Float(v.as_f64().unwrap()),
        "int" => Scalar::Int(v.as_i64().unwrap()),
        "bool" => Scalar::Bool(v.as_bool().unwrap()),
        k => panic!("{}: unknown scalar kind {k}", c.name),
    }
}

fn bound(v: &Value) -> Option<f64> {
    match v {
        Value::Null => None,
        Value::String(s) if s == "nan" => Some(f64::NAN),
        v => Some(v.as_f64().expect("numeric bound")),
    }
}

fn unary(x: &Tensor, op: &str) -> Result<Tensor> {
    match op {
        "neg" => x.neg(),
        "abs" => x.abs(),
        "exp" => x.exp(),
        "log" => x.log(),
        "sqrt" => x.sqrt(),
        "rsqrt" => x.rsqrt(),
        "sin" => x.sin(),
        "cos" => x.cos(),
        "tanh" => x.tanh(),
        "sigmoid" => x.sigmoid(),
        "relu" => x.relu(),
        "gelu" => x.gelu(),
        "gelu_tanh" => x.gelu_tanh(),
        "silu" => x.silu(),
        "softplus" => x.softplus(),
        _ => panic!("unknown unary op {op}"),
    }
}

fn binary(a: &Tensor, b: &Tensor, op: &str) -> Result<Tensor> {
    match op {
        "add" => a.add(b),
        "sub" => a.sub(b),
        "mul" => a.mul(b),
        "div" => a.div(b),
        "pow" => a.pow(b),
        "maximum" => a.maximum(b),
        "minimum" => a.minimum(b),
        "eq" => a.eq(b),
        "ne" => a.ne(b),
        "lt" => a.lt(b),
        "le" => a.le(b),
        "gt" => a.gt(b),
        "ge" => a.ge(b),
        _ => panic!("unknown binary op {op}"),
    }
}

fn with_scalar(x: &Tensor, s: Scalar, op: &str) -> Result<Tensor> {
    match op {
        "add" => x.add_scalar(s),
        "sub" => x.sub_scalar(s),
        "mul" => x.mul_scalar(s),
        "div" => x.div_scalar(s),
        "pow" => x.pow_scalar(s),
        "eq" => x.eq_scalar(s),
        "ne" => x.ne_scalar(s),
        "lt" => x.lt_scalar(s),
        "le" => x.le_scalar(s),
        "gt" => x.gt_scalar(s),
        "ge" => x.ge_scalar(s),
        _ => panic!("unknown scalar op {op}"),
    }
}

/// Runs an op through the target's executor on the operands as they are, for ops the Tensor
/// API does not expose (integer truncating division).
fn raw_op(tg: &Target, op: &Op, inputs: &[&Tensor]) -> std::result::Result<Tensor, String> {
    let operands: Vec<Operand> = inputs
        .iter()
        .map(|t| Operand {
            buffer: t.buffer().clone(),
            layout: t.layout().clone(),
        })
        .collect();
    let mut out = tg.exec.execute(op, &operands).map_err(|e| e.to_string())?;
    let (buffer, meta) = out.remove(0);
    let host = tg.exec.download(&buffer).map_err(|e| e.to_string())?;
    Ok(tg.tensor(host, meta.shape))
}

fn run(tg: &Target, c: &Case) -> Result<Tensor> {
    let op = c.arg_str("op");
    match c.arg_str("kind") {
        "unary" => unary(&input(tg, c, 0), op),
        "clamp" => input(tg, c, 0).clamp(bound(&c.args["min"]), bound(&c.args["max"])),
        "binary" | "compare" => binary(&input(tg, c, 0), &input(tg, c, 1), op),
        "scalar" | "compare_scalar" => with_scalar(&input(tg, c, 0), scalar(c), op),
        "where" => Tensor::where_cond(&input(tg, c, 0), &input(tg, c, 1), &input(tg, c, 2)),
        "trunc_div" => Ok(raw_op(tg, &Op::Binary(BinaryOp::Div), &[&input(tg, c, 0), &input(tg, c, 1)]).unwrap()),
        k => panic!("{}: unknown kind {k}", c.name),
    }
}

pub fn matches_pytorch(tg: &Target) {
    let cases = load("elementwise");
    assert!(cases.len() > 300, "fixture file looks truncated");
    for c in &cases {
        let got = run(tg, c).unwrap_or_else(|e| panic!("{}: {e}", c.name));
        let want = &c.outputs[0];
        assert_close(tg, &c.name, &got, want, fixture_tol(want.dtype));
    }
}

fn f32s(tg: &Target, v: &[f32], shape: &[usize]) -> Tensor {
    tg.from_slice(v, shape.to_vec()).unwrap()
}

pub fn shape_and_dtype_errors_are_errors(tg: &Target) {
    let a = tg.zeros([2, 3], DType::F32).unwrap();
    let b = tg.zeros([4], DType::F32).unwrap();
    assert!(matches!(a.add(&b), Err(Error::Shape { .. })));
    assert!(matches!(&a * &b, Err(Error::Shape { .. })));
    assert!(a.lt(&b).is_err());
    let cond = tg.zeros([2, 3], DType::U8).unwrap();
    assert!(matches!(Tensor::where_cond(&cond, &a, &a), Err(Error::DType { .. })));
    let bad_cond = tg.zeros([5], DType::Bool).unwrap();
    assert!(Tensor::where_cond(&bad_cond, &a, &a).is_err());
    let i = tg.zeros([3], DType::I64).unwrap();
    assert!(i.gelu().is_err() && i.silu().is_err() && i.softplus().is_err());
    let bools = tg.zeros([3], DType::Bool).unwrap();
    assert!(bools.neg().is_err() && bools.sub(&bools).is_err() && bools.pow(&bools).is_err());
    let z = tg.zeros([3], DType::C64).unwrap();
    assert!(z.abs().is_err() && z.lt(&z).is_err() && z.maximum(&z).is_err() && z.clamp(Some(0.0), None).is_err());
    assert!(a.clamp(None, None).is_err());
}

pub fn integer_errors_follow_pytorch(tg: &Target) {
    // Negative integer powers: PyTorch raises; so do we (no panic, no garbage).
    let base = tg.from_slice(&[2i64, 3, 4], [3]).unwrap();
    let exps = tg.from_slice(&[1i64, -1, 2], [3]).unwrap();
    let e = base.pow(&exps).unwrap_err().to_string();
    assert!(e.contains("negative integer powers"), "{e}");
    assert!(base.pow_scalar(-2).is_err());
    assert_eq!(base.pow_scalar(2).unwrap().to_vec::<i64>().unwrap(), vec![4, 9, 16]);
    // The raw integer division refuses a zero divisor; Tensor::div is true division.
    let zero = tg.from_slice(&[1i32, 0, 2], [3]).unwrap();
    let num = tg.from_slice(&[7i32, 7, -7], [3]).unwrap();
    let e = raw_op(tg, &Op::Binary(BinaryOp::Div), &[&num, &zero]).unwrap_err();
    assert!(e.contains("ZeroDivisionError"), "{e}");
    let q = num.div(&zero).unwrap();
    assert_eq!(q.dtype(), DType::F32);
    assert_eq!(q.to_vec::<f32>().unwrap(), vec![7.0, f32::INFINITY, -3.5]);
    // A NaN bound cannot clamp integers.
    let r = raw_op(
        tg,
        &Op::Clamp {
            min: Some(f64::NAN),
            max: None,
        },
        &[&num],
    );
    assert!(r.unwrap_err().contains("NaN"));
}

pub fn operators_on_references(tg: &Target) {
    let a = f32s(tg, &[1.0, 2.0, 3.0, 4.0], &[2, 2]);
    let b = f32s(tg, &[10.0, 20.0], &[2]);
    assert_eq!(
        (&a + &b).unwrap().to_vec::<f32>().unwrap(),
        vec![11.0, 22.0, 13.0, 24.0]
    );
    assert_eq!(
        (&a - &b).unwrap().to_vec::<f32>().unwrap(),
        vec![-9.0, -18.0, -7.0, -16.0]
    );
    assert_eq!(
        (&a * &b).unwrap().to_vec::<f32>().unwrap(),
        vec![10.0, 40.0, 30.0, 80.0]
    );
    assert_eq!(
        (&b / &a).unwrap().to_vec::<f32>().unwrap(),
        vec![10.0, 10.0, 10.0 / 3.0, 5.0]
    );
    assert_eq!((-&a).unwrap().to_vec::<f32>().unwrap(), vec![-1.0, -2.0, -3.0, -4.0]);
    assert_eq!((&a * 0.5).unwrap().to_vec::<f32>().unwrap(), vec![0.5, 1.0, 1.5, 2.0]);
    assert_eq!((&a + 1.0).unwrap().to_vec::<f32>().unwrap(), vec![2.0, 3.0, 4.0, 5.0]);
    let i = tg.from_slice(&[1i64, 2], [2]).unwrap();
    assert_eq!((&i * 0.5).unwrap().dtype(), DType::F32);
    assert_eq!(i.mul_scalar(3).unwrap().dtype(), DType::I64);
}

/// Deterministic values spread over [-range, range].
fn spread(n: usize, range: f64, seed: u64) -> Vec<f32> {
    (0..n)
        .map(|i| {
            let h = (i as u64 ^ seed).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 11;
            ((h as f64 / (1u64 << 53) as f64) * 2.0 - 1.0) as f32 * range as f32
        })
        .collect()
}

pub fn large_inputs_match_an_f64_reference(tg: &Target) {
    // Large enough for the parallel path, with a length that is no multiple
    // of the vector width or the chunk size.
    let n = 300_007;
    let xs = spread(n, 9.0, 1);
    let x = f32s(tg, &xs, &[n]);
    let check = |name: &str, got: Tensor, f: &dyn Fn(f64) -> f64, tol: f64| {
        let got = got.to_vec::<f32>().unwrap();
        for (i, (&g, &v)) in got.iter().zip(&xs).enumerate() {
            let w = f(v as f64);
            assert!(
                (g as f64 - w).abs() <= tol * (1.0 + w.abs()),
                "{name}: element {i} (x = {v}) is {g}, want {w}"
            );
        }
    };
    check("exp", x.exp().unwrap(), &f64::exp, 1e-6);
    check("tanh", x.tanh().unwrap(), &f64::tanh, 1e-6);
    check("silu", x.silu().unwrap(), &|v| v / (1.0 + (-v).exp()), 1e-6);
    let phi = |v: f64| 0.5 * libm::erfc(-v / std::f64::consts::SQRT_2);
    check("gelu", x.gelu().unwrap(), &|v| v * phi(v), 1e-6);
    check("sin", x.sin().unwrap(), &f64::sin, 1e-6);
    let ys = spread(n, 3.0, 2);
    let y = f32s(tg, &ys, &[n]);
    let sum = x.add(&y).unwrap().to_vec::<f32>().unwrap();
    let prod = x.mul(&y).unwrap().to_vec::<f32>().unwrap();
    for i in 0..n {
        assert_eq!(sum[i], xs[i] + ys[i]);
        assert_eq!(prod[i], xs[i] * ys[i]);
    }
}

pub fn layouts_agree_on_large_inputs(tg: &Target) {
    // [rows, cols] + [cols], transposed and strided operands, all above the
    // parallel threshold: each must equal the contiguous computation.
    let (rows, cols) = (517, 129);
    let a = f32s(tg, &spread(rows * cols, 4.0, 3), &[rows, cols]);
    let b = f32s(tg, &spread(cols, 4.0, 4), &[cols]);
    let want = a
        .add(&b.broadcast_as([rows, cols]).unwrap().contiguous().unwrap())
        .unwrap();
    assert_eq!(
        a.add(&b).unwrap().to_vec::<f32>().unwrap(),
        want.to_vec::<f32>().unwrap()
    );
    let at = f32s(tg, &spread(rows * cols, 4.0, 5), &[cols, rows]).t().unwrap();
    let want = at.contiguous().unwrap().mul(&a).unwrap().to_vec::<f32>().unwrap();
    assert_eq!(at.mul(&a).unwrap().to_vec::<f32>().unwrap(), want);
    let g = at.gelu().unwrap().to_vec::<f32>().unwrap();
    assert_eq!(g, at.contiguous().unwrap().gelu().unwrap().to_vec::<f32>().unwrap());
    // f16 through the f32 block path, strided.
    let h = at.to_dtype(DType::F16).unwrap();
    let want = h.contiguous().unwrap().silu().unwrap().to_vec::<half::f16>().unwrap();
    assert_eq!(h.silu().unwrap().to_vec::<half::f16>().unwrap(), want);
    let c = a.gt_scalar(0.0).unwrap();
    let w = Tensor::where_cond(&c, &a, &at).unwrap().to_vec::<f32>().unwrap();
    let (av, tv) = (
        a.to_vec::<f32>().unwrap(),
        at.contiguous().unwrap().to_vec::<f32>().unwrap(),
    );
    for i in 0..rows * cols {
        assert_eq!(w[i], if av[i] > 0.0 { av[i] } else { tv[i] });
    }
}

pub fn half_precision_rounds_once(tg: &Target) {
    // f16 and bf16 compute in f32 and round once: 1 + 2^-11 rounds to even
    // in f16, and bf16 keeps NaN a NaN.
    let one = tg.from_slice(&[half::f16::from_f32(1.0)], [1]).unwrap();
    let eps = tg.from_slice(&[half::f16::from_f32(2f32.powi(-11))], [1]).unwrap();
    assert_eq!(one.add(&eps).unwrap().to_vec::<half::f16>().unwrap()[0].to_f32(), 1.0);
    let b = tg
        .from_slice(&[half::bf16::NAN, half::bf16::from_f32(3.0)], [2])
        .unwrap();
    let r = b.mul_scalar(2.0).unwrap().to_vec::<half::bf16>().unwrap();
    assert!(r[0].is_nan());
    assert_eq!(r[1].to_f32(), 6.0);
}

/// The checks of this group, in file order.
pub const CASES: &[Check] = &[
    ("matches_pytorch", matches_pytorch),
    ("shape_and_dtype_errors_are_errors", shape_and_dtype_errors_are_errors),
    ("integer_errors_follow_pytorch", integer_errors_follow_pytorch),
    ("operators_on_references", operators_on_references),
    (
        "large_inputs_match_an_f64_reference",
        large_inputs_match_an_f64_reference,
    ),
    ("layouts_agree_on_large_inputs", layouts_agree_on_large_inputs),
    ("half_precision_rounds_once", half_precision_rounds_once),
];
