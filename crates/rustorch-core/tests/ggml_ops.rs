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

// Ops run on the CPU backend, which registers itself once linked.
use rustorch_core::{DType, Tensor};
use rustorch_cpu as _;
use serde_json::Value;
use std::path::PathBuf;

#[path = "common/fixture_cpu.rs"]
mod fixture_cpu;

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/ggml_ops")
}

/// index.json, after checking its `cpu` record (and noting when this CPU is of another kind).
fn index() -> Value {
    let text = std::fs::read_to_string(dir().join("index.json")).expect("fixture index.json");
    let index: Value = serde_json::from_str(&text).expect("index.json is JSON");
    fixture_cpu::note_if_other_cpu("rustorch-core's ggml_ops fixtures", &index["cpu"]);
    index
}

/// A fixture tensor with its shape from the index.
fn load(eval: &Value, name: &str) -> Tensor {
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
    Tensor::from_vec(values, shape).expect("the file holds the listed shape")
}

/// Panics at the first element whose bits differ, naming it and the ulp
/// distance, after counting how many differ.
fn assert_same_bits(what: &str, got: &Tensor, want: &Tensor) {
    assert_eq!(got.dims(), want.dims(), "{what}: shape");
    let (g, w) = (got.to_vec::<f32>().unwrap(), want.to_vec::<f32>().unwrap());
    let bad: Vec<usize> = (0..g.len()).filter(|&i| g[i].to_bits() != w[i].to_bits()).collect();
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
fn causal_mask(n_past: usize, t: usize, l: usize) -> Tensor {
    let mut m = Vec::with_capacity(t * l);
    for i in 0..t {
        m.extend((0..l).map(|j| if j <= n_past + i { 0f32 } else { f32::NEG_INFINITY }));
    }
    Tensor::from_vec(m, [t, l]).unwrap()
}

/// Replays one layer's evaluations; `attn_len` picks how many cache
/// positions attention reads (llama.cpp's n_kv or the used length rounded
/// up to 64: the padding is masked and must not change a bit).
fn replay_attention(layer: usize, attn_len: impl Fn(usize, usize) -> usize) {
    let index = index();
    let scale = index["scale"].as_f64().unwrap() as f32;
    const N_ALLOC: usize = 512;
    let mut k_cache: Option<Tensor> = None;
    let mut vt_cache: Option<Tensor> = None;
    for (e, eval) in index["evals"].as_array().unwrap().iter().enumerate() {
        let n_past = eval["n_past"].as_u64().unwrap() as usize;
        let n_kv = eval["n_kv"].as_u64().unwrap() as usize;
        let q = load(eval, &format!("e{e}-l{layer}-q.bin"));
        let k = load(eval, &format!("e{e}-l{layer}-k.bin"));
        let v = load(eval, &format!("e{e}-l{layer}-v.bin"));
        let want = load(eval, &format!("e{e}-l{layer}-kqv_out.bin"));
        let (t, hkv, d) = (k.dims()[0], k.dims()[1], k.dims()[2]);
        let dv = v.dims()[2];
        let kc = k_cache.get_or_insert_with(|| Tensor::zeros([hkv, N_ALLOC, d], DType::F16).unwrap());
        let vc = vt_cache.get_or_insert_with(|| Tensor::zeros([hkv, dv, N_ALLOC], DType::F16).unwrap());
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
            &causal_mask(n_past, t, l),
            scale,
        )
        .unwrap();
        let hq = out.dims()[0];
        let got = out.transpose(0, 1).unwrap().reshape([t, hq * dv]).unwrap();
        assert_same_bits(
            &format!("layer {layer}, evaluation {e} (T = {t}, L = {l})"),
            &got,
            &want,
        );
    }
}

#[test]
fn attention_equals_llamacpp_with_its_cache_length() {
    for layer in [0, 7] {
        replay_attention(layer, |_, n_kv| n_kv);
    }
}

#[test]
fn attention_equals_llamacpp_with_the_used_length_rounded_to_64() {
    for layer in [0, 7] {
        replay_attention(layer, |used, _| used.div_ceil(64) * 64);
    }
}

#[test]
fn swiglu_equals_llamacpp() {
    let index = index();
    for (e, eval) in index["evals"].as_array().unwrap().iter().enumerate() {
        for layer in [0, 7] {
            let gate = load(eval, &format!("e{e}-l{layer}-gate.bin"));
            let up = load(eval, &format!("e{e}-l{layer}-up.bin"));
            let want = load(eval, &format!("e{e}-l{layer}-swiglu.bin"));
            assert_same_bits(
                &format!("swiglu, layer {layer}, evaluation {e}"),
                &gate.swiglu(&up).unwrap(),
                &want,
            );
        }
    }
}

#[test]
fn geglu_equals_llamacpp() {
    let index = index();
    let gemma = &index["gemma"];
    for layer in gemma["layers"].as_array().unwrap() {
        let layer = layer.as_u64().unwrap();
        let gate = load(gemma, &format!("gemma-l{layer}-gate.bin"));
        let up = load(gemma, &format!("gemma-l{layer}-up.bin"));
        let want = load(gemma, &format!("gemma-l{layer}-geglu.bin"));
        assert_same_bits(&format!("geglu, Gemma layer {layer}"), &gate.geglu(&up).unwrap(), &want);
    }
}

#[test]
fn cached_attention_rejects_bad_inputs() {
    let q = Tensor::zeros([9, 2, 64], DType::F32).unwrap();
    let k = Tensor::zeros([3, 64, 64], DType::F16).unwrap();
    let vt = Tensor::zeros([3, 64, 64], DType::F16).unwrap();
    let mask = Tensor::zeros([2, 64], DType::F32).unwrap();
    assert!(Tensor::cached_attention(&q, &k, &vt, &mask, 0.125).is_ok());
    // f32 keys, a mask of the wrong length, 8 query heads over 3 kv heads.
    let k32 = Tensor::zeros([3, 64, 64], DType::F32).unwrap();
    let err = Tensor::cached_attention(&q, &k32, &vt, &mask, 0.125).unwrap_err();
    assert!(err.to_string().contains("f16"), "{err}");
    let bad_mask = Tensor::zeros([2, 63], DType::F32).unwrap();
    assert!(Tensor::cached_attention(&q, &k, &vt, &bad_mask, 0.125).is_err());
    let q8 = Tensor::zeros([8, 2, 64], DType::F32).unwrap();
    assert!(Tensor::cached_attention(&q8, &k, &vt, &mask, 0.125).is_err());
    let g = Tensor::zeros([2, 3], DType::F32).unwrap();
    assert!(Tensor::zeros([3, 2], DType::F32).unwrap().swiglu(&g).is_err());
}

#[test]
fn flash_attention_rejects_bad_inputs() {
    use rustorch_core::FlashPaths;
    let paths = FlashPaths {
        tiled_rows: 2,
        kv_len: 256,
        threads: 2,
    };
    let q = Tensor::zeros([9, 2, 64], DType::F32).unwrap();
    let k = Tensor::zeros([3, 64, 64], DType::F16).unwrap();
    let v = Tensor::zeros([3, 64, 32], DType::F16).unwrap();
    let mask = Tensor::zeros([2, 64], DType::F32).unwrap();
    let out = Tensor::flash_attention(&q, &k, &v, &mask, 0.125, paths).unwrap();
    assert_eq!(out.dims(), &[9, 2, 32]);
    // f32 values, values over another length (transposed, as the plain
    // attention's cache holds them), a short mask, 8 query heads over 3.
    let v32 = Tensor::zeros([3, 64, 32], DType::F32).unwrap();
    let err = Tensor::flash_attention(&q, &k, &v32, &mask, 0.125, paths).unwrap_err();
    assert!(err.to_string().contains("f16"), "{err}");
    let vt = Tensor::zeros([3, 32, 64], DType::F16).unwrap();
    let err = Tensor::flash_attention(&q, &k, &vt, &mask, 0.125, paths).unwrap_err();
    assert!(err.to_string().contains("v [Hkv, L, Dv]"), "{err}");
    let bad_mask = Tensor::zeros([2, 63], DType::F32).unwrap();
    assert!(Tensor::flash_attention(&q, &k, &v, &bad_mask, 0.125, paths).is_err());
    let q8 = Tensor::zeros([8, 2, 64], DType::F32).unwrap();
    assert!(Tensor::flash_attention(&q8, &k, &v, &mask, 0.125, paths).is_err());
}
