//! `Op::QMatMul` against llama.cpp itself: every fixture in fixtures/ggml_matmul/ holds weights
//! quantized by llama.cpp and what llama.cpp 0.3.36's CPU backend computed for `ggml_mul_mat`
//! with them for several activation row counts m (tools/gen_ggml_matmul_fixtures.py; README.md
//! there has the format). Weights llama.cpp repacked are prepared for the target's products
//! (`QWeight::for_matmul_on`), the others given as plain blocks.
//!
//! The products must equal llama.cpp's bit for bit, within the target's tolerance (none for the
//! CPU). The CPU's kernels at every instruction-set level are checked against the same fixtures
//! in rustorch-cpu's tests/ggml_matmul.rs. The fixtures record the CPU they were written on;
//! on another kind of CPU this checks RusTorch's reproduction of that build (see
//! `fixture_cpu`).

use crate::{Case as Check, Target};
use rustorch_core::quant::QType;
use rustorch_core::QWeight;
use std::path::{Path, PathBuf};

use super::fixture_cpu;

pub const CASES: &[Check] = &[("qmatmul_op_equals_llama_cpp", qmatmul_op_equals_llama_cpp)];

/// Row counts the fixtures hold results for, in file order (the generator's M_LIST).
const M_LIST: [usize; 10] = [1, 2, 3, 4, 5, 7, 8, 9, 16, 33];
/// Types whose repacked path (llama.cpp's CPU_REPACK buffer) the CPU reproduces; as in
/// rustorch-cpu's tests/ggml_matmul.rs, other repacked fixtures are pending there and skipped.
const REPACK_DONE: &[&str] = &["Q4_0", "IQ4_NL", "Q4_K", "Q2_K"];

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/ggml_matmul")
}

fn f32s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

fn qmatmul_op_equals_llama_cpp(tg: &Target) {
    let cpu = std::fs::read_to_string(dir().join("cpu.json")).expect("the fixtures' cpu.json");
    let cpu = serde_json::from_str(&cpu).expect("cpu.json is JSON");
    fixture_cpu::note_if_other_cpu("rustorch-conformance's ggml_matmul fixtures", &cpu);
    let mut names: Vec<String> = std::fs::read_dir(dir())
        .expect("fixture directory")
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.ends_with(".bin"))
        .collect();
    names.sort();
    assert!(!names.is_empty(), "no fixtures in {}", dir().display());
    let mut errs = Vec::new();
    let mut checked = 0;
    for name in &names {
        // NAME_ROWSxCOLS.bin: a repacked flag, the weights, then llama.cpp's products per m.
        let (ty, shape) = name.strip_suffix(".bin").unwrap().rsplit_once('_').unwrap();
        let (rows, cols) = shape.split_once('x').unwrap();
        let (rows, cols): (usize, usize) = (rows.parse().unwrap(), cols.parse().unwrap());
        let qtype = QType::parse(ty).unwrap_or_else(|| panic!("{name}: unknown type {ty}"));
        if qtype == QType::BF16 && !fixture_cpu::same_bf16_order(&cpu) {
            fixture_cpu::note_bf16_order_differs("rustorch-conformance's ggml_matmul fixtures");
            continue;
        }
        let bytes = std::fs::read(dir().join(name)).unwrap();
        let repacked = u32::from_le_bytes(bytes[..4].try_into().unwrap()) != 0;
        if repacked && !REPACK_DONE.contains(&qtype.name()) {
            continue;
        }
        let x = f32s(&std::fs::read(dir().join(format!("x_{cols}.f32"))).unwrap());
        let wlen = qtype.bytes_for(cols).unwrap() * rows;
        let weights = bytes[4..4 + wlen].to_vec();
        let w = if repacked {
            QWeight::for_matmul_on(&tg.exec, tg.device, qtype, rows, cols, weights)
        } else {
            tg.qweight(qtype, rows, cols, weights)
        }
        .unwrap_or_else(|e| panic!("{name}: {e}"));
        let mut at = 4 + wlen;
        for m in M_LIST {
            let want = f32s(&bytes[at..at + 4 * m * rows]);
            at += 4 * m * rows;
            let xs = tg.from_vec(x[..m * cols].to_vec(), [m, cols]).unwrap();
            let got = xs.qmatmul(&w).unwrap_or_else(|e| panic!("{name}, m = {m}: {e}"));
            let what = format!("{name} (repacked by llama.cpp: {repacked}), m = {m}");
            tg.check_ran_here(&what, Some(&got));
            tg.count_fixture_check();
            checked += 1;
            let got = got.to_vec::<f32>().unwrap();
            let tol = tg.tol(
                &format!("qmatmul_{}", qtype.name().to_lowercase()),
                rustorch_core::DType::F32,
            );
            if let Some(k) = (0..want.len()).find(|&k| !tol.accepts(got[k] as f64, want[k] as f64)) {
                errs.push(format!(
                    "{what}: first difference at row {} col {}: {:e} vs llama.cpp {:e}",
                    k / rows,
                    k % rows,
                    got[k],
                    want[k]
                ));
            }
        }
    }
    assert!(checked > 0, "no fixture checked");
    assert!(errs.is_empty(), "{} mismatches:\n{}", errs.len(), errs.join("\n"));
}
