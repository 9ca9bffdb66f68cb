//! GGML dequantization and quantization against fixtures made by the `gguf`
//! Python package and llama.cpp's reference C functions
//! (tools/gen_quant_fixtures.py): dequantized values must be bit-identical
//! and quantized bytes byte-identical.

use rustorch_core::quant::{self, QType};
use serde_json::Value;

fn fixture(name: &str) -> Value {
    let path = format!("{}/tests/fixtures/quant/{name}.json", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn hex(s: &Value) -> Vec<u8> {
    let s = s.as_str().expect("hex string");
    (0..s.len() / 2)
        .map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).expect("hex digit"))
        .collect()
}

fn hex_f32(s: &Value) -> Vec<f32> {
    hex(s)
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

/// Bit-identical, NaN payloads included.
fn assert_bits_eq(name: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{name}: length");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            g.to_bits() == w.to_bits(),
            "{name}: element {i} (block {}): got {g:e} ({:#010x}), want {w:e} ({:#010x})",
            i / 32,
            g.to_bits(),
            w.to_bits()
        );
    }
}

const TYPES: [&str; 17] = [
    "F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q8_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K",
    "Q8_K", "IQ4_NL", "IQ4_XS",
];

#[test]
fn fixture_sizes_match_qtype() {
    for name in TYPES {
        let f = fixture(name);
        let t = QType::parse(name).expect(name);
        assert_eq!(f["ggml_id"].as_u64(), Some(t.ggml_id() as u64), "{name}");
        assert_eq!(f["block_size"].as_u64(), Some(t.block_size() as u64), "{name}");
        assert_eq!(f["type_size"].as_u64(), Some(t.type_size() as u64), "{name}");
    }
}

#[test]
fn dequantize_matches_gguf_bit_for_bit() {
    for name in TYPES {
        let f = fixture(name);
        let t = QType::parse(name).expect(name);
        let bytes = hex(&f["dequant"]["bytes"]);
        let want = hex_f32(&f["dequant"]["values"]);
        let n = f["dequant"]["n"].as_u64().expect("n") as usize;
        assert_eq!(want.len(), n);
        let got = quant::dequantize(t, &bytes, n).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_bits_eq(name, &got, &want);
        // The same through a caller-provided buffer.
        let mut out = vec![f32::NAN; n];
        quant::dequantize_into(t, &bytes, &mut out).expect(name);
        assert_bits_eq(name, &out, &want);
    }
}

#[test]
fn dequantize_is_the_same_when_run_in_parallel() {
    // Repeat the fixture blocks past the parallel threshold and check that
    // every copy decodes identically.
    for name in ["Q4_0", "Q6_K", "IQ4_XS", "BF16"] {
        let f = fixture(name);
        let t = QType::parse(name).expect(name);
        let bytes = hex(&f["dequant"]["bytes"]);
        let want = hex_f32(&f["dequant"]["values"]);
        let reps = (1 << 17) / want.len() + 1;
        let big: Vec<u8> = bytes.iter().copied().cycle().take(bytes.len() * reps).collect();
        let got = quant::dequantize(t, &big, want.len() * reps).expect(name);
        for chunk in got.chunks_exact(want.len()) {
            assert_bits_eq(name, chunk, &want);
        }
    }
}

#[test]
fn quantize_matches_reference_byte_for_byte() {
    let mut checked = 0;
    for name in TYPES {
        let f = fixture(name);
        if f.get("quant").is_none() {
            continue;
        }
        let t = QType::parse(name).expect(name);
        let x = hex_f32(&f["quant"]["input"]);
        let want = hex(&f["quant"]["bytes"]);
        let got = quant::quantize(t, &x).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(got.len(), want.len(), "{name}");
        let bs = t.type_size();
        for (i, (g, w)) in got.chunks(bs).zip(want.chunks(bs)).enumerate() {
            assert_eq!(
                g,
                w,
                "{name}: block {i} differs (input {:?})",
                &x[i * t.block_size()..][..t.block_size().min(8)]
            );
        }
        checked += 1;
    }
    // F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 (gguf, equal to llama.cpp),
    // Q8_1, Q8_K (numpy ports, equal to llama.cpp), and the K-quants and
    // IQ4 (llama.cpp's quantize_row_*_ref).
    assert_eq!(checked, 16);
}
