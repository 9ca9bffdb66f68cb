//! Loading PyTorch fixtures and comparing tensors with them.
//!
//! Fixtures are written by tools/gen_torch_fixtures.py into fixtures/torch/; see that script for
//! the format. Tolerances are per dtype and explained in `fixture_tol`; the target's own
//! tolerance (its distance from the CPU) is added to them.
#![allow(dead_code)]

use crate::Target;
pub use crate::Tol;
use rustorch_core::{CpuStorage, DType, Tensor, C64};
use serde_json::Value;

pub struct FixtureTensor {
    pub dtype: DType,
    pub shape: Vec<usize>,
    /// Real values (complex: interleaved re, im).
    pub data: Vec<f64>,
}

pub struct Case {
    pub name: String,
    pub args: Value,
    pub inputs: Vec<FixtureTensor>,
    pub outputs: Vec<FixtureTensor>,
}

impl Case {
    /// Input `i` as a tensor on the target.
    pub fn input(&self, tg: &Target, i: usize) -> Tensor {
        self.inputs[i].to_tensor(tg)
    }

    pub fn arg_f64(&self, key: &str) -> f64 {
        self.args[key]
            .as_f64()
            .unwrap_or_else(|| panic!("{}: missing numeric arg {key}", self.name))
    }
    pub fn arg_i64(&self, key: &str) -> i64 {
        self.args[key]
            .as_i64()
            .unwrap_or_else(|| panic!("{}: missing integer arg {key}", self.name))
    }
    pub fn arg_bool(&self, key: &str) -> bool {
        self.args[key]
            .as_bool()
            .unwrap_or_else(|| panic!("{}: missing bool arg {key}", self.name))
    }
    pub fn arg_str(&self, key: &str) -> &str {
        self.args[key]
            .as_str()
            .unwrap_or_else(|| panic!("{}: missing string arg {key}", self.name))
    }
    pub fn arg_vec_i64(&self, key: &str) -> Vec<i64> {
        self.args[key]
            .as_array()
            .unwrap_or_else(|| panic!("{}: missing list arg {key}", self.name))
            .iter()
            .map(|v| v.as_i64().expect("integer list"))
            .collect()
    }
    pub fn has_arg(&self, key: &str) -> bool {
        !self.args[key].is_null()
    }
}

fn num(v: &Value) -> f64 {
    match v {
        Value::Number(n) => n.as_f64().expect("number"),
        Value::Bool(b) => *b as i64 as f64,
        Value::String(s) => match s.as_str() {
            "nan" => f64::NAN,
            "inf" => f64::INFINITY,
            "-inf" => f64::NEG_INFINITY,
            _ => panic!("bad number {s}"),
        },
        _ => panic!("bad number {v}"),
    }
}

fn parse_tensor(v: &Value) -> FixtureTensor {
    let dtype = DType::parse(v["dtype"].as_str().expect("dtype")).expect("known dtype");
    let shape = v["shape"]
        .as_array()
        .expect("shape")
        .iter()
        .map(|d| d.as_u64().unwrap() as usize)
        .collect();
    let data = v["data"].as_array().expect("data").iter().map(num).collect();
    FixtureTensor { dtype, shape, data }
}

impl FixtureTensor {
    /// The fixture's values on the target.
    pub fn to_tensor(&self, tg: &Target) -> Tensor {
        let storage = if self.dtype == DType::C64 {
            CpuStorage::C64(
                self.data
                    .chunks(2)
                    .map(|c| C64::new(c[0] as f32, c[1] as f32))
                    .collect(),
            )
        } else if self.dtype == DType::I64 {
            // i64 values beyond 2^53 do not appear in fixtures.
            CpuStorage::I64(self.data.iter().map(|&x| x as i64).collect())
        } else {
            CpuStorage::from_f64_iter(self.dtype, self.data.iter().copied())
        };
        tg.tensor(storage, self.shape.clone())
    }
}

/// Loads fixtures/torch/FAMILY.json.
pub fn load(family: &str) -> Vec<Case> {
    let path = format!("{}/fixtures/torch/{family}.json", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("cannot read {path}: {e}"));
    let doc: Value = serde_json::from_str(&text).expect("fixture JSON");
    doc["cases"]
        .as_array()
        .expect("cases")
        .iter()
        .map(|c| Case {
            name: c["name"].as_str().expect("name").to_string(),
            args: c["args"].clone(),
            inputs: c["inputs"]
                .as_array()
                .expect("inputs")
                .iter()
                .map(parse_tensor)
                .collect(),
            outputs: c["outputs"]
                .as_array()
                .expect("outputs")
                .iter()
                .map(parse_tensor)
                .collect(),
        })
        .collect()
}

/// Default tolerance per dtype, |got - want| <= atol + rtol * |want|:
/// - integers and bools are exact;
/// - f64: 1e-10, room for a different summation order;
/// - f32: 1e-5 relative (~80 ulp), room for SIMD accumulation orders
///   and polynomial exp/tanh that differ from PyTorch's SLEEF by a few ulp;
/// - f16: 2e-3 (2 ulp at 2^-10 spacing): both compute in f32 and round
///   once, but intermediate roundings may differ by one ulp;
/// - bf16: 1.6e-2 (2 ulp at 2^-7 spacing), same reasoning.
pub fn fixture_tol(d: DType) -> Tol {
    match d {
        DType::Bool | DType::U8 | DType::I32 | DType::I64 => Tol { atol: 0.0, rtol: 0.0 },
        DType::F64 => Tol {
            atol: 1e-10,
            rtol: 1e-10,
        },
        DType::F32 | DType::C64 => Tol { atol: 1e-5, rtol: 1e-5 },
        DType::F16 => Tol { atol: 1e-3, rtol: 2e-3 },
        DType::BF16 => Tol {
            atol: 8e-3,
            rtol: 1.6e-2,
        },
    }
}

/// Compares a tensor with a fixture within `tol` plus the target's tolerance, after checking that
/// it was computed on the target; panics naming the case and the worst element.
pub fn assert_close(tg: &Target, case: &str, got: &Tensor, want: &FixtureTensor, tol: Tol) {
    tg.check_ran_here(case, Some(got));
    tg.count_fixture_check();
    let tol = tol.plus(tg.tol(case, want.dtype));
    assert_eq!(got.dtype(), want.dtype, "{case}: dtype");
    assert_eq!(got.dims(), want.shape.as_slice(), "{case}: shape");
    let got_v: Vec<f64> = if got.dtype() == DType::C64 {
        got.to_vec::<C64>()
            .unwrap()
            .iter()
            .flat_map(|c| [c.re as f64, c.im as f64])
            .collect()
    } else {
        got.to_f64_vec().unwrap()
    };
    assert_eq!(got_v.len(), want.data.len(), "{case}: element count");
    let mut worst: Option<(usize, f64)> = None;
    for (i, (&g, &w)) in got_v.iter().zip(&want.data).enumerate() {
        if !tol.accepts(g, w) {
            let excess = (g - w).abs() - (tol.atol + tol.rtol * w.abs());
            if worst.is_none_or(|(_, e)| excess > e || excess.is_nan()) {
                worst = Some((i, excess));
            }
        }
    }
    if let Some((i, _)) = worst {
        panic!(
            "{case}: element {i} is {} but PyTorch gives {} (tolerance atol {} rtol {})",
            got_v[i], want.data[i], tol.atol, tol.rtol
        );
    }
}

/// Compares with the dtype's default tolerance.
pub fn assert_matches(tg: &Target, case: &Case, out_index: usize, got: &Tensor) {
    let want = &case.outputs[out_index];
    assert_close(tg, &case.name, got, want, fixture_tol(want.dtype));
}
