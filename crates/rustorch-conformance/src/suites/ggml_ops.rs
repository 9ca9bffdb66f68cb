//! `Tensor::cached_attention`, `Tensor::swiglu` and `Tensor::geglu` against
//! llama.cpp, bit for bit, on tensors llama.cpp computed inside SmolLM2 and
//! Gemma 3 (fixtures written by
//! tools/gen_ggml_ops_fixtures.py from llama-cpp-python 0.3.36's graph
//! callbacks).
//!
//! For each fixture layer the test replays llama.cpp's evaluations: a
//! prompt of 11 tokens as one batch (GGML's tinyBLAS f16 products), then two
//! single tokens (its `ggml_vec_dot_f16` products), writing llama.cpp's keys
//! and values into an f16 cache and attending with llama.cpp's queries. The
//! outputs must equal llama.cpp's `kqv_out` exactly: the LLM runtime's
//! greedy output matches llama.cpp's only if every op does.
//!
//! "llama.cpp" here is the build that wrote the fixtures, on the CPU that
//! index.json's `cpu` records (an AMD EPYC: AVX-512 without AVX512-FP16 or
//! AMX), whose arithmetic RusTorch's defaults reproduce on any CPU. On
//! another kind of CPU the tests check that reproduction and say so;
//! tools/llamacpp_diff.py compares with llama.cpp built there.

use crate::{Case as Check, Target};
use rustorch_core::{DType, Tensor};
use serde_json::Value;
use std::path::PathBuf;

use super::fixture_cpu;

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures/ggml_ops")
}

/// index.json, after checking its `cpu` record (and noting when this CPU is of another kind).
fn index() -> Value {
    let text = std::fs::read_to_string(dir().join("index.json")).expect("fixture index.json");
    let index: Value = serde_json::from_str(&text).expect("index.json is JSON");
    fixture_cpu::note_if_other_cpu("rustorch-conformance's ggml_ops fixtures", &index["cpu"]);
    index
}

/// A fixture tensor with its shape from the index.
fn load(tg: &Target, eval: &Value, name: &str) -> Tensor {
    let shape: Vec<usize> = eval["files"][name]
        .as_array()
        .unwrap_or_else(|| panic!("{name} is listed in index.json"))
        .iter()
        .map(|d| d.as_u64().expect("dims are integers") as usize)
        .collect();
    let bytes = std::fs::read(dir().join(name)).expect("fixture file");
    let values: Vec<f32> = bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    tg.from_vec(values, shape).expect("the file holds the listed shape")
}

/// Panics at the first element whose bits differ, naming it and the ulp
/// distance, after counting how many differ.
fn assert_same_bits(tg: &Target, what: &str, got: &Tensor, want: &Tensor) {
    tg.check_ran_here(what, Some(got));
    tg.count_fixture_check();
    let tol = tg.tol(what, DType::F32);
    assert_eq!(got.dims(), want.dims(), "{what}: shape");
    let (g, w) = (got.to_vec::<f32>().unwrap(), want.to_vec::<f32>().unwrap());
    let bad: Vec<usize> = (0..g.len())
        .filter(|&i| !tol.accepts(g[i] as f64, w[i] as f64))
        .collect();
    if let Some(&i) = bad.first() {
        let ulp = (g[i].to_bits() as i64 - w[i].to_bits() as i64).abs();
        panic!(
            "{what}: {} of {} values differ from llama.cpp; first at {i}: {} vs {} ({ulp} ulp)",
            bad.len(),
            g.len(),
            g[i],
            w[i]
        );
    }
}

/// Additive causal mask `[T, L]` for queries at `n_past..n_past + T`.
fn causal_mask(tg: &Target, n_past: usize, t: usize, l: usize) -> Tensor {
    let mut m = Vec::with_capacity(t * l);
    for i in 0..t {
        m.extend((0..l).map(|j| if j <= n_past + i { 0f32 } else { f32::NEG_INFINITY }));
    }
    tg.from_vec(m, [t, l]).unwrap()
}

/// Replays one layer's evaluations; `attn_len` picks how many cache
/// positions attention reads (llama.cpp's n_kv or the used length rounded
/// up to 64: the padding is masked and must not change a bit).
fn replay_attention(tg: &Target, layer: usize, attn_len: impl Fn(usize, usize) -> usize) {
    let index = index();
    let scale = index["scale"].as_f64().unwrap() as f32;
    const N_ALLOC: usize = 512;
    let mut k_cache: Option<Tensor> = None;
    let mut vt_cache: Option<Tensor> = None;
    for (e, eval) in index["evals"].as_array().unwrap().iter().enumerate() {
        let n_past = eval["n_past"].as_u64().unwrap() as usize;
        let n_kv = eval["n_kv"].as_u64().unwrap() as usize;
        let q = load(tg, eval, &format!("e{e}-l{layer}-q.bin"));
        let k = load(tg, eval, &format!("e{e}-l{layer}-k.bin"));
        let v = load(tg, eval, &format!("e{e}-l{layer}-v.bin"));
        let want = load(tg, eval, &format!("e{e}-l{layer}-kqv_out.bin"));
        let (t, hkv, d) = (k.dims()[0], k.dims()[1], k.dims()[2]);
        let dv = v.dims()[2];
        let kc = k_cache.get_or_insert_with(|| tg.zeros([hkv, N_ALLOC, d], DType::F16).unwrap());
        let vc = vt_cache.get_or_insert_with(|| tg.zeros([hkv, dv, N_ALLOC], DType::F16).unwrap());
        // The cache rounds keys and values to f16 (GGML's set_rows into an
        // f16 cache); values are stored transposed.
        kc.write_slice(1, n_past, &k.transpose(0, 1).unwrap().to_dtype(DType::F16).unwrap())
            .unwrap();
        vc.write_slice(2, n_past, &v.permute(&[1, 2, 0]).unwrap().to_dtype(DType::F16).unwrap())
            .unwrap();
        let l = attn_len(n_past + t, n_kv);
        let out = Tensor::cached_attention(
            &q.transpose(0, 1).unwrap(),
            &kc.narrow(1, 0, l).unwrap(),
            &vc.narrow(2, 0, l).unwrap(),
            &causal_mask(tg, n_past, t, l),
            scale,
        )
        .unwrap();
        let hq = out.dims()[0];
        let got = out.transpose(0, 1).unwrap().reshape([t, hq * dv]).unwrap();
        assert_same_bits(
            tg,
            &format!("cached_attention, layer {layer}, evaluation {e} (T = {t}, L = {l})"),
            &got,
            &want,
        );
    }
}

pub fn attention_equals_llamacpp_with_its_cache_length(tg: &Target) {
    for layer in [0, 7] {
        replay_attention(tg, layer, |_, n_kv| n_kv);
    }
}

pub fn attention_equals_llamacpp_with_the_used_length_rounded_to_64(tg: &Target) {
    for layer in [0, 7] {
        replay_attention(tg, layer, |used, _| used.div_ceil(64) * 64);
    }
}

pub fn swiglu_equals_llamacpp(tg: &Target) {
    let index = index();
    for (e, eval) in index["evals"].as_array().unwrap().iter().enumerate() {
        for layer in [0, 7] {
            let gate = load(tg, eval, &format!("e{e}-l{layer}-gate.bin"));
            let up = load(tg, eval, &format!("e{e}-l{layer}-up.bin"));
            let want = load(tg, eval, &format!("e{e}-l{layer}-swiglu.bin"));
            assert_same_bits(
                tg,
                &format!("swiglu, layer {layer}, evaluation {e}"),
                &gate.swiglu(&up).unwrap(),
                &want,
            );
        }
    }
}

pub fn geglu_equals_llamacpp(tg: &Target) {
    let index = index();
    let gemma = &index["gemma"];
    for layer in gemma["layers"].as_array().unwrap() {
        let layer = layer.as_u64().unwrap();
        let gate = load(tg, gemma, &format!("gemma-l{layer}-gate.bin"));
        let up = load(tg, gemma, &format!("gemma-l{layer}-up.bin"));
        let want = load(tg, gemma, &format!("gemma-l{layer}-geglu.bin"));
        assert_same_bits(
            tg,
            &format!("geglu, Gemma layer {layer}"),
            &gate.geglu(&up).unwrap(),
            &want,
        );
    }
}

pub fn cached_attention_rejects_bad_inputs(tg: &Target) {
    let q = tg.zeros([9, 2, 64], DType::F32).unwrap();
    let k = tg.zeros([3, 64, 64], DType::F16).unwrap();
    let vt = tg.zeros([3, 64, 64], DType::F16).unwrap();
    let mask = tg.zeros([2, 64], DType::F32).unwrap();
    assert!(Tensor::cached_attention(&q, &k, &vt, &mask, 0.125).is_ok());
    // f32 keys, a mask of the wrong length, 8 query heads over 3 kv heads.
    let k32 = tg.zeros([3, 64, 64], DType::F32).unwrap();
    let err = Tensor::cached_attention(&q, &k32, &vt, &mask, 0.125).unwrap_err();
    assert!(err.to_string().contains("f16"), "{err}");
    let bad_mask = tg.zeros([2, 63], DType::F32).unwrap();
    assert!(Tensor::cached_attention(&q, &k, &vt, &bad_mask, 0.125).is_err());
    let q8 = tg.zeros([8, 2, 64], DType::F32).unwrap();
    assert!(Tensor::cached_attention(&q8, &k, &vt, &mask, 0.125).is_err());
    let g = tg.zeros([2, 3], DType::F32).unwrap();
    assert!(tg.zeros([3, 2], DType::F32).unwrap().swiglu(&g).is_err());
}

pub fn flash_attention_rejects_bad_inputs(tg: &Target) {
    use rustorch_core::FlashPaths;
    let paths = FlashPaths {
        tiled_rows: 2,
        kv_len: 256,
        threads: 2,
    };
    let q = tg.zeros([9, 2, 64], DType::F32).unwrap();
    let k = tg.zeros([3, 64, 64], DType::F16).unwrap();
    let v = tg.zeros([3, 64, 32], DType::F16).unwrap();
    let mask = tg.zeros([2, 64], DType::F32).unwrap();
    let out = Tensor::flash_attention(&q, &k, &v, &mask, 0.125, paths).unwrap();
    assert_eq!(out.dims(), &[9, 2, 32]);
    // f32 values, values over another length (transposed, as the plain
    // attention's cache holds them), a short mask, 8 query heads over 3.
    let v32 = tg.zeros([3, 64, 32], DType::F32).unwrap();
    let err = Tensor::flash_attention(&q, &k, &v32, &mask, 0.125, paths).unwrap_err();
    assert!(err.to_string().contains("f16"), "{err}");
    let vt = tg.zeros([3, 32, 64], DType::F16).unwrap();
    let err = Tensor::flash_attention(&q, &k, &vt, &mask, 0.125, paths).unwrap_err();
    assert!(err.to_string().contains("v [Hkv, L, Dv]"), "{err}");
    let bad_mask = tg.zeros([2, 63], DType::F32).unwrap();
    assert!(Tensor::flash_attention(&q, &k, &v, &bad_mask, 0.125, paths).is_err());
    let q8 = tg.zeros([8, 2, 64], DType::F32).unwrap();
    assert!(Tensor::flash_attention(&q8, &k, &v, &mask, 0.125, paths).is_err());
}

/// The checks of this group, in file order.
pub const CASES: &[Check] = &[
    (
        "attention_equals_llamacpp_with_its_cache_length",
        attention_equals_llamacpp_with_its_cache_length,
    ),
    (
        "attention_equals_llamacpp_with_the_used_length_rounded_to_64",
        attention_equals_llamacpp_with_the_used_length_rounded_to_64,
    ),
    ("swiglu_equals_llamacpp", swiglu_equals_llamacpp),
    ("geglu_equals_llamacpp", geglu_equals_llamacpp),
    (
        "cached_attention_rejects_bad_inputs",
        cached_attention_rejects_bad_inputs,
    ),
    ("flash_attention_rejects_bad_inputs", flash_attention_rejects_bad_inputs),
];
