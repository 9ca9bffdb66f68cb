//! Creation ops and casts against PyTorch fixtures (tools/torch_fixtures/create.py).

use super::torch_common::{assert_matches, load};
use crate::{Case as Check, Target};
use rustorch_core::{DType, Tensor};

fn dtype_arg(name: &str) -> DType {
    DType::parse(name).unwrap_or_else(|| panic!("unknown dtype {name}"))
}

pub fn creation_and_casts_match_pytorch(tg: &Target) {
    let cases = load("create");
    assert!(cases.len() > 50, "fixture file looks truncated");
    for c in &cases {
        let got = if c.name.starts_with("arange_") {
            tg.arange(
                c.arg_f64("start"),
                c.arg_f64("end"),
                c.arg_f64("step"),
                c.outputs[0].dtype,
            )
            .unwrap()
        } else if c.name.starts_with("linspace_") {
            tg.adopt(Tensor::linspace(
                c.arg_f64("start"),
                c.arg_f64("end"),
                c.arg_i64("steps") as usize,
                c.outputs[0].dtype,
            ))
            .unwrap()
        } else if c.name.starts_with("eye_") {
            tg.adopt(Tensor::eye(c.arg_i64("n") as usize, DType::F32)).unwrap()
        } else if c.name.starts_with("full_") {
            let shape: Vec<usize> = c.arg_vec_i64("shape").iter().map(|&d| d as usize).collect();
            tg.full(shape, c.arg_f64("value"), c.outputs[0].dtype).unwrap()
        } else if c.name == "cast_transposed_f32_to_f16" {
            c.input(tg, 0).t().unwrap().to_dtype(DType::F16).unwrap()
        } else if c.name.starts_with("cast_") {
            c.input(tg, 0).to_dtype(dtype_arg(c.arg_str("to"))).unwrap()
        } else {
            panic!("unhandled case {}", c.name)
        };
        assert_matches(tg, c, 0, &got);
    }
}

pub fn random_tensors_are_seeded_and_distributed(tg: &Target) {
    let a = tg.randn([10000], DType::F32, 3).unwrap().to_vec::<f32>().unwrap();
    let b = tg.randn([10000], DType::F32, 3).unwrap().to_vec::<f32>().unwrap();
    let c = tg.randn([10000], DType::F32, 4).unwrap().to_vec::<f32>().unwrap();
    assert_eq!(a, b, "same seed, same values");
    assert_ne!(a, c, "another seed, other values");
    let n = a.len() as f64;
    let mean = a.iter().map(|&x| x as f64).sum::<f64>() / n;
    let var = a.iter().map(|&x| (x as f64 - mean).powi(2)).sum::<f64>() / n;
    assert!(mean.abs() < 0.05 && (var - 1.0).abs() < 0.05, "mean {mean} var {var}");
    let u = tg.rand([10000], DType::F64, 9).unwrap().to_vec::<f64>().unwrap();
    assert!(u.iter().all(|&x| (0.0..1.0).contains(&x)));
    let umean = u.iter().sum::<f64>() / u.len() as f64;
    assert!((umean - 0.5).abs() < 0.02);
    assert!(tg.rand([2], DType::I64, 0).is_err(), "integer rand is an error");
}

pub fn bad_creation_arguments_are_errors(tg: &Target) {
    assert!(tg.arange(0.0, 1.0, 0.0, DType::F32).is_err());
    assert!(tg.arange(0.0, f64::INFINITY, 1.0, DType::F32).is_err());
    assert!(tg.from_vec(vec![1.0f32, 2.0], [3]).is_err());
    assert!(
        tg.zeros([usize::MAX, 2], DType::F32).is_err(),
        "overflowing sizes are an error"
    );
    assert!(tg.full([1 << 40, 1 << 40], 1.0, DType::F32).is_err());
    let t = tg.zeros([2, 3], DType::F32).unwrap();
    assert!(
        t.to_vec::<f64>().is_err(),
        "asking for the wrong element type is an error"
    );
}

/// The checks of this group, in file order.
pub const CASES: &[Check] = &[
    ("creation_and_casts_match_pytorch", creation_and_casts_match_pytorch),
    (
        "random_tensors_are_seeded_and_distributed",
        random_tensors_are_seeded_and_distributed,
    ),
    ("bad_creation_arguments_are_errors", bad_creation_arguments_are_errors),
];
