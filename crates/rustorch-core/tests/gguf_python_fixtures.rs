//! Files written by the `gguf` Python package (tools/gen_gguf_fixtures.py)
//! read back with every metadata value and tensor byte as the script's
//! manifest says, and rewritten byte for byte by `GgufWriter`.

// Ops run on the CPU backend, which registers itself once linked.
use rustorch_core::gguf::{Array, Gguf, GgufWriter, LoadedTensor, Value};
use rustorch_core::quant::QType;
use rustorch_cpu as _;
use serde_json::Value as Json;
use std::path::PathBuf;

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/gguf")
}

fn manifest() -> Vec<Json> {
    let path = fixtures().join("valid/manifest.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str::<Json>(&text).unwrap().as_array().unwrap().clone()
}

fn hex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

/// Asserts a metadata value equals its manifest entry; floats by bits.
fn check_value(ctx: &str, v: &Value, m: &Json) {
    let ty = m["type"].as_str().unwrap();
    let int = |j: &Json| -> i128 {
        j.as_i64()
            .map(i128::from)
            .or_else(|| j.as_u64().map(i128::from))
            .unwrap_or_else(|| panic!("{ctx}: not an integer: {j}"))
    };
    match (v, ty) {
        (Value::U8(x), "u8") => assert_eq!(i128::from(*x), int(&m["value"]), "{ctx}"),
        (Value::I8(x), "i8") => assert_eq!(i128::from(*x), int(&m["value"]), "{ctx}"),
        (Value::U16(x), "u16") => assert_eq!(i128::from(*x), int(&m["value"]), "{ctx}"),
        (Value::I16(x), "i16") => assert_eq!(i128::from(*x), int(&m["value"]), "{ctx}"),
        (Value::U32(x), "u32") => assert_eq!(i128::from(*x), int(&m["value"]), "{ctx}"),
        (Value::I32(x), "i32") => assert_eq!(i128::from(*x), int(&m["value"]), "{ctx}"),
        (Value::U64(x), "u64") => assert_eq!(i128::from(*x), int(&m["value"]), "{ctx}"),
        (Value::I64(x), "i64") => assert_eq!(i128::from(*x), int(&m["value"]), "{ctx}"),
        (Value::F32(x), "f32") => assert_eq!(i128::from(x.to_bits()), int(&m["bits"]), "{ctx}"),
        (Value::F64(x), "f64") => assert_eq!(i128::from(x.to_bits()), int(&m["bits"]), "{ctx}"),
        (Value::Bool(x), "bool") => assert_eq!(Some(*x), m["value"].as_bool(), "{ctx}"),
        (Value::String(x), "string") => assert_eq!(Some(x.as_str()), m["value"].as_str(), "{ctx}"),
        (Value::Array(a), "array") => {
            let items = m["items"].as_array().unwrap();
            assert_eq!(a.elem_type().name(), m["elem"].as_str().unwrap(), "{ctx}: element type");
            assert_eq!(a.len(), items.len(), "{ctx}: length");
            for (i, item) in items.iter().enumerate() {
                check_value(&format!("{ctx}[{i}]"), &a.get(i).unwrap(), item);
            }
        }
        _ => panic!("{ctx}: read {v:?} ({}), manifest says {ty}", v.type_desc()),
    }
}

fn check_file(g: &Gguf, f: &Json) {
    let file = f["file"].as_str().unwrap();
    assert_eq!(u64::from(g.version()), f["version"].as_u64().unwrap(), "{file}");
    assert_eq!(g.alignment(), f["alignment"].as_u64().unwrap(), "{file}");
    assert_eq!(g.data_offset(), f["data_offset"].as_u64().unwrap(), "{file}");

    let kv = f["metadata"].as_array().unwrap();
    let keys: Vec<&str> = g.metadata().keys().collect();
    let want: Vec<&str> = kv.iter().map(|e| e["key"].as_str().unwrap()).collect();
    assert_eq!(keys, want, "{file}: keys in file order");
    for e in kv {
        let key = e["key"].as_str().unwrap();
        check_value(&format!("{file}: {key}"), g.get(key).unwrap(), e);
    }

    let tensors = f["tensors"].as_array().unwrap();
    assert_eq!(g.tensors().len(), tensors.len(), "{file}: tensor count");
    for (info, t) in g.tensors().iter().zip(tensors) {
        let name = t["name"].as_str().unwrap();
        let ctx = format!("{file}: {name}");
        assert_eq!(info.name(), name, "{file}: tensor order");
        assert_eq!(Some(info.qtype()), QType::parse(t["type"].as_str().unwrap()), "{ctx}");
        let dims: Vec<u64> = t["dims"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d.as_u64().unwrap())
            .collect();
        let shape: Vec<usize> = t["shape"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d.as_u64().unwrap() as usize)
            .collect();
        assert_eq!(info.dims(), &dims[..], "{ctx}: dims");
        assert_eq!(info.shape(), shape, "{ctx}: shape");
        assert_eq!(info.offset(), t["offset"].as_u64().unwrap(), "{ctx}: offset");
        let bytes = hex(t["hex"].as_str().unwrap());
        assert_eq!(info.n_bytes(), bytes.len(), "{ctx}: size");
        assert_eq!(g.tensor_data(name).unwrap(), &bytes[..], "{ctx}: bytes");

        match (g.load_tensor(name).unwrap(), t.get("values_f64_bits")) {
            (LoadedTensor::Dense(x), Some(values)) => {
                assert_eq!(x.dims(), &shape[..], "{ctx}: tensor shape");
                let got: Vec<u64> = x.to_f64_vec().unwrap().iter().map(|v| v.to_bits()).collect();
                let want: Vec<u64> = values.as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).collect();
                assert_eq!(got, want, "{ctx}: values");
            }
            (LoadedTensor::Raw { info: i, bytes: b }, None) => {
                assert_eq!(i.name(), name);
                assert_eq!(b, &bytes[..], "{ctx}: raw bytes");
                assert!(g.to_tensor(name).is_err(), "{ctx}: to_tensor of a non-dense type");
            }
            (l, v) => panic!("{ctx}: loaded {l:?} but manifest values {v:?}"),
        }
    }
}

#[test]
fn python_written_files_read_as_the_manifest_says() {
    let files = manifest();
    assert!(files.len() >= 5);
    for f in &files {
        let path = fixtures().join(f["file"].as_str().unwrap());
        let mapped = Gguf::open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert!(mapped.is_mapped());
        check_file(&mapped, f);
        let owned = Gguf::from_bytes(&std::fs::read(&path).unwrap()).unwrap();
        assert!(!owned.is_mapped());
        check_file(&owned, f);
    }
}

/// Copies every entry and tensor of a file into a writer.
fn rewrite(g: &Gguf) -> GgufWriter<'_> {
    let mut w = GgufWriter::new();
    for (k, v) in g.metadata().iter() {
        w.add_metadata(k, v.clone()).unwrap();
    }
    for t in g.tensors() {
        w.add_tensor_bytes(t.name(), t.qtype(), &t.shape(), g.data_of(t))
            .unwrap();
    }
    w
}

#[test]
fn writer_reproduces_python_files_byte_for_byte() {
    for f in manifest() {
        let path = fixtures().join(f["file"].as_str().unwrap());
        let original = std::fs::read(&path).unwrap();
        let g = Gguf::from_bytes(&original).unwrap();
        let mut written = rewrite(&g).to_bytes();
        if g.version() == 2 {
            // The writer always writes version 3; v2 has the same layout.
            written[4..8].copy_from_slice(&2u32.to_le_bytes());
        }
        assert_eq!(written.len(), original.len(), "{}", path.display());
        assert!(written == original, "{}: rewritten file differs", path.display());
    }
}

#[test]
fn typed_accessors_on_python_file() {
    let g = Gguf::open(fixtures().join("valid/all_types.gguf")).unwrap();
    assert_eq!(g.get_str("general.architecture").unwrap(), "testarch");
    assert_eq!(g.get_u8("test.u8").unwrap(), 200);
    assert_eq!(g.get_i8("test.i8").unwrap(), -100);
    assert_eq!(g.get_u16("test.u16").unwrap(), 60000);
    assert_eq!(g.get_i16("test.i16").unwrap(), -30000);
    assert_eq!(g.get_u32("test.u32").unwrap(), 4_000_000_000);
    assert_eq!(g.get_i32("test.i32").unwrap(), -2_000_000_000);
    assert_eq!(g.get_u64("test.u64").unwrap(), (1u64 << 63) + 5);
    assert_eq!(g.get_i64("test.i64").unwrap(), -(1i64 << 62) - 7);
    assert_eq!(g.get_f32("test.f32").unwrap(), 1.2345f32);
    assert_eq!(g.get_f64("test.f64").unwrap(), std::f64::consts::E);
    assert!(g.get_bool("test.bool_true").unwrap());
    assert!(!g.get_bool("test.bool_false").unwrap());
    assert_eq!(
        g.get_str("test.unicode").unwrap(),
        "h\u{e9}llo w\u{f6}rld \u{2713} \u{1F600}"
    );
    assert_eq!(g.get_str("test.nul_inside").unwrap(), "a\0b");
    assert_eq!(g.get_u8_array("test.arr_u8").unwrap(), &[0, 1, 255]);
    assert_eq!(g.get_i32_array("test.arr_i32").unwrap(), &[-1, 0, 1]);
    assert_eq!(g.get_u64_array("test.arr_u64").unwrap(), &[u64::MAX, 0]);
    assert_eq!(g.get_f32_array("test.arr_f32").unwrap(), &[0.5, -1.25, 1e-30]);
    assert_eq!(g.get_bool_array("test.arr_bool").unwrap(), &[true, false, true]);
    assert_eq!(
        g.get_str_array("test.arr_str").unwrap(),
        &["alpha", "", "\u{3b2}\u{3b3}", "<0x0A>"]
    );
    let nested = g.get_array("test.nested_i32").unwrap();
    assert_eq!(
        nested,
        &Array::Array(vec![
            Array::I32(vec![1, 2, 3]),
            Array::I32(vec![4]),
            Array::I32(vec![5, 6])
        ])
    );
    assert_eq!(g.get_array("test.nested_deep").unwrap().depth(), 3);
    assert_eq!(g.get_usize("test.u32").unwrap(), 4_000_000_000);
}
