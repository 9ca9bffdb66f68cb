//! Real models, checked against what the `gguf` Python package reads from
//! them: SmolLM2-135M-Instruct Q4_1 and Gemma 3 270M Q4_K_M.
//!
//! `tools/fetch_models.py` fetches the files; `tools/gen_model_fixtures.py`
//! wrote `tests/fixtures/models/{smollm2,gemma3}.json` from them with the
//! package. For each model the tests check the header, every metadata
//! entry, the tensor table, the SHA-256 of every tensor dequantized to f32
//! (and sample values bit for bit), and quantize -> dequantize round trips
//! of real weights (byte-exact against the package where it can quantize,
//! error-bounded for the K-quants and IQ4 it cannot).
//!
//! Paths come from RUSTORCH_SMOLLM2_GGUF and RUSTORCH_GEMMA3_GGUF; where
//! one is unset the tests fetch the model with tools/fetch_models.py
//! (cached after the first download), and fail, saying how to provide it,
//! when that does not work:
//!
//! ```sh
//! cargo test -p rustorch-core --test real_models
//! ```

// Ops run on the CPU backend, which registers itself once linked.
use rustorch_core::gguf::{Array, Gguf, Value as GValue};
use rustorch_core::quant::{self, QType};
use rustorch_cpu as _;
use serde_json::Value;
use sha2::{Digest, Sha256};
use std::time::Instant;

#[path = "common/real_model.rs"]
mod real_model;

struct Model {
    /// tools/fetch_models.py's name, also the fixture's.
    name: &'static str,
}

const SMOLLM2: Model = Model { name: "smollm2" };
const GEMMA3: Model = Model { name: "gemma3" };

/// Opens the model (its variable's file, or fetched) and its fixture.
fn open(m: &Model) -> (Gguf, Value) {
    let path = real_model::real_model(m.name);
    let g = Gguf::open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let fixture = format!("{}/tests/fixtures/models/{}.json", env!("CARGO_MANIFEST_DIR"), m.name);
    let text = std::fs::read_to_string(&fixture).unwrap_or_else(|e| panic!("{fixture}: {e}"));
    let f: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{fixture}: {e}"));
    (g, f)
}

fn hex(digest: &[u8]) -> String {
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

fn sha256(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

/// Feeds f32 values to the hash as little-endian bytes.
fn update_f32(h: &mut Sha256, v: &[f32]) {
    #[cfg(target_endian = "little")]
    {
        // SAFETY: f32 has no padding and u8 has alignment 1, so the values'
        // memory is readable as 4 * len initialized bytes; on a
        // little-endian target those are the little-endian encodings.
        let bytes = unsafe { std::slice::from_raw_parts(v.as_ptr().cast::<u8>(), 4 * v.len()) };
        h.update(bytes);
    }
    #[cfg(not(target_endian = "little"))]
    for x in v {
        h.update(x.to_le_bytes());
    }
}

fn sha256_f32(v: &[f32]) -> String {
    let mut h = Sha256::new();
    update_f32(&mut h, v);
    hex(&h.finalize())
}

fn str_of<'a>(v: &'a Value, what: &str) -> &'a str {
    v.as_str()
        .unwrap_or_else(|| panic!("fixture: {what} is not a string: {v}"))
}

fn u64_of(v: &Value, what: &str) -> u64 {
    v.as_u64()
        .unwrap_or_else(|| panic!("fixture: {what} is not an integer: {v}"))
}

fn f32_of(v: &Value, what: &str) -> f32 {
    // The fixture holds f32 values widened to f64, which JSON keeps exactly.
    v.as_f64()
        .unwrap_or_else(|| panic!("fixture: {what} is not a number: {v}")) as f32
}

fn qtype_of(v: &Value, what: &str) -> QType {
    let s = str_of(v, what);
    QType::parse(s).unwrap_or_else(|| panic!("fixture: {what}: unknown type {s}"))
}

fn list<'a>(f: &'a Value, key: &str) -> &'a Vec<Value> {
    f[key]
        .as_array()
        .unwrap_or_else(|| panic!("fixture: {key} is not a list"))
}

// ---------------------------------------------------------------------------
// Header and metadata

fn check_header_and_metadata(m: &Model) {
    let (g, f) = open(m);
    let file = &f["file"];
    // The right file, before anything else: a different download would
    // otherwise show up as puzzling tensor mismatches.
    assert_eq!(
        g.as_bytes().len() as u64,
        u64_of(&file["size"], "file.size"),
        "{}: file size differs from the fixture's {}",
        m.name,
        file["name"]
    );
    assert_eq!(
        sha256(g.as_bytes()),
        str_of(&file["sha256"], "file.sha256"),
        "{}: not the file the fixture describes ({})",
        m.name,
        file["name"]
    );

    let h = &f["header"];
    assert_eq!(u64::from(g.version()), u64_of(&h["version"], "version"));
    assert_eq!(g.alignment(), u64_of(&h["alignment"], "alignment"));
    assert_eq!(g.data_offset(), u64_of(&h["data_offset"], "data_offset"));
    assert_eq!(g.tensors().len() as u64, u64_of(&h["tensor_count"], "tensor_count"));
    assert_eq!(g.metadata().len() as u64, u64_of(&h["kv_count"], "kv_count"));

    // Every entry, in file order, with its type and value.
    let want = list(&f, "metadata");
    let got: Vec<(&str, &GValue)> = g.metadata().iter().collect();
    assert_eq!(got.len(), want.len(), "{}: metadata entries", m.name);
    for ((key, value), w) in got.iter().zip(want) {
        let wkey = str_of(&w["key"], "metadata key");
        assert_eq!(*key, wkey, "{}: metadata order", m.name);
        assert_eq!(
            u64::from(value.value_type().id()),
            u64_of(&w["type"], wkey),
            "{key}: value type (ours {})",
            value.type_desc()
        );
        match value {
            GValue::Array(a) => check_array(key, a, w),
            v => check_scalar(key, v, &w["value"]),
        }
    }

    // The model facts a runtime needs, through the typed accessors.
    let facts = &f["facts"];
    let arch = g.get_str("general.architecture").expect("architecture");
    assert_eq!(arch, str_of(&facts["architecture"], "architecture"));
    for k in [
        "context_length",
        "block_count",
        "embedding_length",
        "feed_forward_length",
        "attention.head_count",
        "attention.head_count_kv",
    ] {
        let key = format!("{arch}.{k}");
        let want = u64_of(&facts[k], k);
        assert_eq!(u64::from(g.get_u32(&key).expect(&key)), want, "{key}");
        assert_eq!(g.get_usize(&key).expect(&key) as u64, want, "{key}");
    }
}

fn check_scalar(key: &str, v: &GValue, w: &Value) {
    let ok = match *v {
        GValue::U8(x) => w.as_u64() == Some(x.into()),
        GValue::U16(x) => w.as_u64() == Some(x.into()),
        GValue::U32(x) => w.as_u64() == Some(x.into()),
        GValue::U64(x) => w.as_u64() == Some(x),
        GValue::I8(x) => w.as_i64() == Some(x.into()),
        GValue::I16(x) => w.as_i64() == Some(x.into()),
        GValue::I32(x) => w.as_i64() == Some(x.into()),
        GValue::I64(x) => w.as_i64() == Some(x),
        // Bit for bit: the fixture's f64 is the f32 widened exactly.
        GValue::F32(x) => w.as_f64().map(|d| (d as f32).to_bits()) == Some(x.to_bits()),
        GValue::F64(x) => w.as_f64().map(f64::to_bits) == Some(x.to_bits()),
        GValue::Bool(x) => w.as_bool() == Some(x),
        GValue::String(ref s) => w.as_str() == Some(s.as_str()),
        GValue::Array(_) => unreachable!("arrays are checked by check_array"),
    };
    assert!(ok, "{key}: ours {v:?}, gguf package {w}");
}

/// The elements as GGUF encodes them (what the fixture's hash covers).
fn array_encoding(key: &str, a: &Array) -> Vec<u8> {
    fn le<T: Copy, const N: usize>(v: &[T], f: impl Fn(T) -> [u8; N]) -> Vec<u8> {
        v.iter().flat_map(|&x| f(x)).collect()
    }
    match a {
        Array::U8(v) => v.clone(),
        Array::I8(v) => le(v, i8::to_le_bytes),
        Array::U16(v) => le(v, u16::to_le_bytes),
        Array::I16(v) => le(v, i16::to_le_bytes),
        Array::U32(v) => le(v, u32::to_le_bytes),
        Array::I32(v) => le(v, i32::to_le_bytes),
        Array::U64(v) => le(v, u64::to_le_bytes),
        Array::I64(v) => le(v, i64::to_le_bytes),
        Array::F32(v) => le(v, f32::to_le_bytes),
        Array::F64(v) => le(v, f64::to_le_bytes),
        Array::Bool(v) => v.iter().map(|&b| u8::from(b)).collect(),
        Array::String(v) => v
            .iter()
            .flat_map(|s| (s.len() as u64).to_le_bytes().into_iter().chain(s.bytes()))
            .collect(),
        Array::Array(_) => panic!("{key}: nested arrays are not in these models"),
    }
}

fn check_array(key: &str, a: &Array, w: &Value) {
    assert_eq!(
        u64::from(a.elem_type().id()),
        u64_of(&w["elem"], key),
        "{key}: element type (ours {})",
        a.type_desc()
    );
    assert_eq!(a.len() as u64, u64_of(&w["len"], key), "{key}: length");
    let head = w["head"].as_array().expect("head");
    for (i, hv) in head.iter().enumerate() {
        let ours = a.get(i).unwrap_or_else(|| panic!("{key}: no element {i}"));
        check_scalar(&format!("{key}[{i}]"), &ours, hv);
    }
    assert_eq!(
        sha256(&array_encoding(key, a)),
        str_of(&w["sha256"], key),
        "{key}: array contents differ"
    );
}

#[test]
fn smollm2_header_and_metadata() {
    check_header_and_metadata(&SMOLLM2);
}

#[test]
fn gemma3_header_and_metadata() {
    check_header_and_metadata(&GEMMA3);
}

// ---------------------------------------------------------------------------
// Tensor table and dequantized values

/// Values per dequantization step: bounds memory (the Gemma 3 embedding is
/// 168 million values) while each step is still split over rayon tasks.
const CHUNK_VALUES: usize = 1 << 20;

/// Dequantizes a tensor of `row_len`-value rows a chunk of rows at a time,
/// handing each chunk to `sink` in order.
fn dequantize_rows(qtype: QType, bytes: &[u8], numel: usize, row_len: usize, mut sink: impl FnMut(usize, &[f32])) {
    let rows = numel / row_len;
    let row_bytes = qtype
        .bytes_for(row_len)
        .expect("whole blocks: checked when the file was opened");
    assert_eq!(rows * row_bytes, bytes.len());
    let step = (CHUNK_VALUES / row_len).max(1);
    for r in (0..rows).step_by(step) {
        let n = step.min(rows - r);
        let chunk = &bytes[r * row_bytes..(r + n) * row_bytes];
        let v = quant::dequantize(qtype, chunk, n * row_len).unwrap_or_else(|e| panic!("{qtype}: {e}"));
        sink(r * row_len, &v);
    }
}

fn check_tensors(m: &Model) {
    let (g, f) = open(m);
    let want = list(&f, "tensors");
    assert_eq!(g.tensors().len(), want.len(), "{}: tensor count", m.name);
    let t0 = Instant::now();
    let mut failures = Vec::new();
    let mut values = 0usize;
    for (t, w) in g.tensors().iter().zip(want) {
        let name = str_of(&w["name"], "tensor name");
        assert_eq!(t.name(), name, "{}: tensor order", m.name);
        assert_eq!(t.qtype(), qtype_of(&w["type"], name), "{name}: type");
        let dims: Vec<u64> = list(w, "dims").iter().map(|d| u64_of(d, name)).collect();
        assert_eq!(t.dims(), dims.as_slice(), "{name}: dims");
        let shape: Vec<usize> = list(w, "shape").iter().map(|d| u64_of(d, name) as usize).collect();
        assert_eq!(t.shape(), shape, "{name}: shape");
        assert_eq!(t.offset(), u64_of(&w["offset"], name), "{name}: offset");
        assert_eq!(t.n_bytes() as u64, u64_of(&w["n_bytes"], name), "{name}: bytes");
        let bytes = g.tensor_data(name).expect(name);
        assert_eq!(bytes.len(), t.n_bytes(), "{name}: data slice");

        // Hash every value; keep the sampled ones for a bitwise check that
        // points at the element when the hash differs.
        let samples: Vec<(usize, f32)> = list(w, "samples")
            .iter()
            .map(|s| (u64_of(&s[0], name) as usize, f32_of(&s[1], name)))
            .collect();
        let mut h = Sha256::new();
        let mut bad_samples = Vec::new();
        dequantize_rows(t.qtype(), bytes, t.numel(), t.dims()[0] as usize, |start, v| {
            update_f32(&mut h, v);
            for &(i, want) in &samples {
                if (start..start + v.len()).contains(&i) && v[i - start].to_bits() != want.to_bits() {
                    bad_samples.push(format!("[{i}] ours {} package {want}", v[i - start]));
                }
            }
        });
        values += t.numel();
        let digest = hex(&h.finalize());
        if digest != str_of(&w["sha256"], name) || !bad_samples.is_empty() {
            failures.push(format!("{name} ({}): sha256 {digest}; {bad_samples:?}", t.qtype()));
        }
    }
    eprintln!(
        "{}: dequantized and hashed {} tensors, {values} values, in {:.2?}",
        m.name,
        want.len(),
        t0.elapsed()
    );
    assert!(
        failures.is_empty(),
        "{}: {} tensors differ from the gguf package:\n{}",
        m.name,
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn smollm2_tensors_dequantize_like_gguf() {
    check_tensors(&SMOLLM2);
}

#[test]
fn gemma3_tensors_dequantize_like_gguf() {
    check_tensors(&GEMMA3);
}

// ---------------------------------------------------------------------------
// Quantize -> dequantize round trips of real weights

/// RMS of the error over each 256-value row relative to that row's RMS,
/// averaged over rows, as in tests/quant_roundtrip.rs.
fn rel_rmse(got: &[f32], want: &[f32]) -> f64 {
    let rms = |x: &mut dyn Iterator<Item = f64>| {
        let (s, n) = x.fold((0.0, 0usize), |(s, n), v| (s + v * v, n + 1));
        (s / n as f64).sqrt()
    };
    let rows = got.len().div_ceil(256);
    got.chunks(256)
        .zip(want.chunks(256))
        .map(|(g, w)| {
            let e = rms(&mut g.iter().zip(w).map(|(&a, &b)| f64::from(a) - f64::from(b)));
            e / rms(&mut w.iter().map(|&b| f64::from(b))).max(1e-30)
        })
        .sum::<f64>()
        / rows as f64
}

/// Types the `gguf` package cannot quantize, with a bound on the relative
/// RMSE of one round trip of real weights. tests/quant_roundtrip.rs bounds
/// the same types on synthetic weights (about 1.3x its measured errors);
/// real weights have similar or smaller errors (measured here: printed with
/// --nocapture), so the bounds are reused as they are. They are far from
/// trivially loose: each is below the next coarser type's error.
const K_BOUNDS: [(QType, f64); 8] = [
    (QType::Q8K, 0.018),
    (QType::Q6K, 0.029),
    (QType::Q5K, 0.054),
    (QType::Q4K, 0.105),
    (QType::IQ4NL, 0.122),
    (QType::IQ4XS, 0.122),
    (QType::Q3K, 0.23),
    (QType::Q2K, 0.42),
];

fn check_roundtrips(m: &Model) {
    let (g, f) = open(m);
    let mut report = String::new();
    for r in list(&f, "roundtrip") {
        let name = str_of(&r["name"], "roundtrip name");
        let t = g.tensor_info(name).expect(name);
        assert_eq!(t.qtype(), qtype_of(&r["source_type"], name), "{name}");
        let x = quant::dequantize(t.qtype(), g.data_of(t), t.numel()).expect(name);

        // Byte-exact against the package for every type it quantizes.
        for target in list(r, "targets") {
            let qt = qtype_of(&target["type"], name);
            let q = quant::quantize(qt, &x).unwrap_or_else(|e| panic!("{name} -> {qt}: {e}"));
            assert_eq!(
                sha256(&q),
                str_of(&target["bytes_sha256"], name),
                "{name} -> {qt}: quantized bytes differ from the gguf package's"
            );
            let y = quant::dequantize(qt, &q, x.len()).expect(name);
            assert_eq!(
                sha256_f32(&y),
                str_of(&target["values_sha256"], name),
                "{name} -> {qt}: round-trip values differ"
            );
            report += &format!("{name} -> {qt}: rel RMSE {:.5}\n", rel_rmse(&y, &x));
        }

        // Error bounds for the types the package cannot quantize (rows of
        // 256-value super-blocks only; IQ4_NL would take 32, but one rule
        // keeps the table short).
        if t.dims()[0] % 256 != 0 {
            continue;
        }
        for (qt, bound) in K_BOUNDS {
            let q = quant::quantize(qt, &x).unwrap_or_else(|e| panic!("{name} -> {qt}: {e}"));
            let y = quant::dequantize(qt, &q, x.len()).expect(name);
            let err = rel_rmse(&y, &x);
            report += &format!("{name} -> {qt}: rel RMSE {err:.5} (bound {bound})\n");
            assert!(err <= bound, "{name} -> {qt}: relative RMSE {err} above {bound}");
            // Values already on this type's grid (the source tensor's own
            // type) come back (nearly) unchanged: measured 0 for Q4_K and
            // 1e-5 for Q6_K, whose 8-bit sub-block scales can round
            // differently. Other types must lose something.
            if qt == t.qtype() {
                assert!(
                    err <= 0.02 * bound,
                    "{name} -> {qt}: requantizing its own type moved it by {err}"
                );
            } else {
                assert!(err > 0.0, "{name} -> {qt}: a lossy type reproduced its input exactly");
            }
        }
    }
    println!("{}:\n{report}", m.name);
}

#[test]
fn smollm2_quantize_roundtrips() {
    check_roundtrips(&SMOLLM2);
}

#[test]
fn gemma3_quantize_roundtrips() {
    check_roundtrips(&GEMMA3);
}
