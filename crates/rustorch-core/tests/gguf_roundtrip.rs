//! GgufWriter -> Gguf round trips, accessor errors and writer errors.

// Ops run on the CPU backend, which registers itself once linked.
use half::{bf16, f16};
use rustorch_core::gguf::{Array, ErrorKind, Gguf, GgufWriter, LoadedTensor, Value, ValueType, MAX_ARRAY_DEPTH};
use rustorch_core::quant::QType;
use rustorch_core::{DType, Tensor};
use rustorch_cpu as _;

/// One value of every type, every array type (empty ones too), nested
/// arrays of mixed element types, and awkward floats.
fn all_values() -> Vec<(String, Value)> {
    let mut v: Vec<(String, Value)> = vec![
        ("u8".into(), Value::U8(u8::MAX)),
        ("i8".into(), Value::I8(i8::MIN)),
        ("u16".into(), Value::U16(u16::MAX)),
        ("i16".into(), Value::I16(i16::MIN)),
        ("u32".into(), Value::U32(u32::MAX)),
        ("i32".into(), Value::I32(i32::MIN)),
        ("u64".into(), Value::U64(u64::MAX)),
        ("i64".into(), Value::I64(i64::MIN)),
        ("f32".into(), Value::F32(-0.0)),
        ("f32.subnormal".into(), Value::F32(f32::from_bits(1))),
        ("f32.inf".into(), Value::F32(f32::NEG_INFINITY)),
        ("f64".into(), Value::F64(f64::MAX)),
        ("bool.t".into(), Value::Bool(true)),
        ("bool.f".into(), Value::Bool(false)),
        ("str".into(), Value::from("tab\tnewline\n\u{1F980}")),
        ("str.empty".into(), Value::from("")),
        ("".into(), Value::from("an empty key is legal")),
        ("arr.u8".into(), Value::from(vec![1u8, 2, 3])),
        ("arr.i8".into(), Value::from(vec![-1i8, 1])),
        ("arr.u16".into(), Value::from(vec![7u16])),
        ("arr.i16".into(), Value::from(vec![-7i16, 300])),
        ("arr.u32".into(), Value::from(vec![0u32, u32::MAX])),
        ("arr.i32".into(), Value::from(vec![i32::MIN])),
        ("arr.u64".into(), Value::from(vec![u64::MAX; 3])),
        ("arr.i64".into(), Value::from(vec![i64::MAX, -1])),
        ("arr.f32".into(), Value::from(vec![1.5f32, f32::INFINITY, -0.0])),
        ("arr.f64".into(), Value::from(vec![1e-310f64])),
        ("arr.bool".into(), Value::from(vec![false, true])),
        ("arr.str".into(), Value::from(vec!["", "x", "\u{3b1}\u{3b2}"])),
        (
            "arr.nested".into(),
            Value::from(vec![
                Array::U8(vec![1]),
                Array::String(vec!["a".into()]),
                Array::Array(vec![Array::F64(vec![2.0]), Array::empty(ValueType::Bool)]),
                Array::empty(ValueType::Array),
            ]),
        ),
    ];
    for t in ValueType::ALL {
        v.push((format!("empty.{t}"), Value::Array(Array::empty(t))));
    }
    v
}

#[test]
fn metadata_of_every_type_round_trips() {
    let mut w = GgufWriter::new();
    for (k, v) in all_values() {
        w.add_metadata(k, v).unwrap();
    }
    // NaN payloads survive bit for bit (compared separately: NaN != NaN).
    w.add_metadata("nan32", f32::from_bits(0x7fc0_1234)).unwrap();
    w.add_metadata("nan64", Value::from(vec![f64::from_bits(0xfff8_0000_0000_0042)]))
        .unwrap();
    let bytes = w.to_bytes();
    let g = Gguf::from_bytes(&bytes).unwrap();
    assert_eq!(g.version(), 3);
    assert_eq!(g.alignment(), 32);
    assert!(g.tensors().is_empty());
    let want = all_values();
    let got: Vec<(&str, &Value)> = g.metadata().iter().take(want.len()).collect();
    assert_eq!(got.len(), want.len());
    for ((gk, gv), (wk, wv)) in got.iter().zip(&want) {
        assert_eq!(gk, wk);
        assert_eq!(*gv, wv, "{wk}");
    }
    assert_eq!(g.get_f32("nan32").unwrap().to_bits(), 0x7fc0_1234);
    assert_eq!(g.get_f64_array("nan64").unwrap()[0].to_bits(), 0xfff8_0000_0000_0042);
    // Writing what was read gives the same file.
    let mut w2 = GgufWriter::new();
    for (k, v) in g.metadata().iter() {
        w2.add_metadata(k, v.clone()).unwrap();
    }
    assert!(w2.to_bytes() == bytes);
}

fn sample_tensors() -> Vec<(String, Tensor)> {
    vec![
        ("f32.3d".into(), Tensor::randn([2, 3, 5], DType::F32, 1).unwrap()),
        ("f16.2d".into(), Tensor::randn([7, 3], DType::F16, 2).unwrap()),
        ("bf16.1d".into(), Tensor::randn([9], DType::BF16, 3).unwrap()),
        ("f64.4d".into(), Tensor::randn([2, 1, 3, 2], DType::F64, 4).unwrap()),
        (
            "i32".into(),
            Tensor::from_vec(vec![i32::MIN, 0, i32::MAX], [3]).unwrap(),
        ),
        ("i64".into(), Tensor::from_vec(vec![i64::MIN, 7], [1, 2]).unwrap()),
        ("empty".into(), Tensor::zeros([0, 3], DType::F32).unwrap()),
    ]
}

#[test]
fn tensors_round_trip_with_every_alignment() {
    for alignment in [1u32, 2, 8, 32, 64, 4096] {
        let mut w = GgufWriter::new();
        w.add_metadata("general.architecture", "test").unwrap();
        w.set_alignment(alignment).unwrap();
        for (name, t) in sample_tensors() {
            w.add_tensor(name, &t).unwrap();
        }
        // A transposed (non-contiguous) view is written row-major.
        let base = Tensor::randn([3, 4], DType::F32, 5).unwrap();
        w.add_tensor("transposed", &base.t().unwrap()).unwrap();
        // A 0-dimensional tensor becomes shape [1].
        w.add_tensor("scalar", &Tensor::scalar(2.5f32)).unwrap();
        let q4: Vec<u8> = (0..2 * 144).map(|i| (i * 7 % 256) as u8).collect();
        w.add_tensor_bytes("q4k", QType::Q4K, &[2, 256], q4.clone()).unwrap();
        let q8: Vec<u8> = (0..3 * 34).map(|i| (i * 13 % 256) as u8).collect();
        w.add_tensor_bytes("q8", QType::Q8_0, &[3, 1, 32], &q8[..]).unwrap();

        let bytes = w.to_bytes();
        let g = Gguf::from_bytes(&bytes).unwrap();
        assert_eq!(g.alignment(), u64::from(alignment));
        assert_eq!(g.get_u32("general.alignment").unwrap(), alignment);
        assert_eq!(g.data_offset() % u64::from(alignment), 0);
        for t in g.tensors() {
            assert_eq!(t.offset() % u64::from(alignment), 0, "{}", t.name());
        }
        for (name, t) in sample_tensors() {
            let r = g.to_tensor(&name).unwrap();
            assert_eq!(r.dims(), t.dims(), "{name}");
            assert_eq!(r.dtype(), t.dtype(), "{name}");
            let (a, b) = (r.to_cpu_storage().unwrap(), t.to_cpu_storage().unwrap());
            assert_eq!(a, b, "{name} at alignment {alignment}");
        }
        let tr = g.to_tensor("transposed").unwrap();
        assert_eq!(tr.dims(), &[4, 3]);
        assert_eq!(tr.to_vec::<f32>().unwrap(), base.t().unwrap().to_vec::<f32>().unwrap());
        assert_eq!(
            g.tensor_info("transposed").unwrap().dims(),
            &[3, 4],
            "GGUF order is reversed"
        );
        assert_eq!(g.to_tensor("scalar").unwrap().to_vec::<f32>().unwrap(), vec![2.5]);
        match g.load_tensor("q4k").unwrap() {
            LoadedTensor::Raw { info, bytes } => {
                assert_eq!(info.qtype(), QType::Q4K);
                assert_eq!(info.shape(), vec![2, 256]);
                assert_eq!(info.dims(), &[256, 2]);
                assert_eq!(bytes, &q4[..]);
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(g.tensor_data("q8").unwrap(), &q8[..]);
        assert_eq!(g.tensor_info("q8").unwrap().shape(), vec![3, 1, 32]);
    }
}

#[test]
fn written_files_open_through_the_map() {
    let dir = std::env::temp_dir().join(format!("rustorch-gguf-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("t.gguf");
    let mut w = GgufWriter::new();
    w.add_metadata("general.name", "mapped").unwrap();
    let t = Tensor::randn([4, 8], DType::F16, 9).unwrap();
    w.add_tensor("w", &t).unwrap();
    // Over 4 MiB, so that `copy_out` copies and releases it in several slices.
    let big = Tensor::randn([1100, 1024], DType::F32, 10).unwrap();
    w.add_tensor("big", &big).unwrap();
    let n = w.write_file(&path).unwrap();
    assert_eq!(n, std::fs::metadata(&path).unwrap().len());
    let g = Gguf::open(&path).unwrap();
    assert!(g.is_mapped());
    assert_eq!(g.get_str("general.name").unwrap(), "mapped");
    assert_eq!(
        g.to_tensor("w").unwrap().to_vec::<f16>().unwrap(),
        t.to_vec::<f16>().unwrap()
    );
    // The slice points into the map: no copy.
    let data = g.tensor_data("w").unwrap();
    let file = g.as_bytes();
    assert_eq!(data.as_ptr(), file[g.data_offset() as usize..].as_ptr());
    // Releasing a tensor's pages keeps its bytes readable (the kernel reads
    // them back from the file).
    let before = data.to_vec();
    g.release(g.tensor_info("w").unwrap());
    assert_eq!(g.tensor_data("w").unwrap(), &before[..]);
    // copy_out releases as it goes and still returns every byte.
    let big_bytes: Vec<u8> = big
        .to_vec::<f32>()
        .unwrap()
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let copied = g.copy_out(g.tensor_info("big").unwrap());
    assert_eq!(copied, big_bytes);
    assert_eq!(g.tensor_data("big").unwrap(), &big_bytes[..]);
    std::fs::remove_dir_all(&dir).unwrap();
}

fn small_file() -> Gguf {
    let mut w = GgufWriter::new();
    w.add_metadata("general.architecture", "llama").unwrap();
    w.add_metadata("n", 5u32).unwrap();
    w.add_metadata("neg", -3i32).unwrap();
    w.add_metadata("big", u64::MAX).unwrap();
    w.add_metadata("toks", vec!["a", "b"]).unwrap();
    w.add_metadata("flag", true).unwrap();
    w.add_tensor_bytes("q", QType::Q4_0, &[32], vec![0u8; 18]).unwrap();
    w.add_tensor_bytes("i8", QType::I8, &[2], vec![1u8, 255]).unwrap();
    w.add_tensor("bf", &Tensor::from_vec(vec![bf16::ONE, bf16::NEG_ONE], [2]).unwrap())
        .unwrap();
    Gguf::from_vec(w.to_bytes()).unwrap()
}

#[test]
fn accessor_errors_name_key_and_types() {
    let g = small_file();
    let e = g.get_u32("missing.key").unwrap_err();
    assert_eq!(e.kind(), ErrorKind::MissingKey);
    assert!(e.to_string().contains("missing.key"), "{e}");

    let e = g.get_u64("n").unwrap_err();
    assert_eq!(e.kind(), ErrorKind::WrongType);
    assert_eq!(e.to_string(), "metadata key \"n\" has type u32, asked for u64");
    let e = g.get_str("toks").unwrap_err();
    assert_eq!(
        e.to_string(),
        "metadata key \"toks\" has type array of string, asked for string"
    );
    let e = g.get_f32_array("toks").unwrap_err();
    assert_eq!(
        e.to_string(),
        "metadata key \"toks\" has type array of string, asked for array of f32"
    );
    let e = g.get_array("flag").unwrap_err();
    assert_eq!(e.to_string(), "metadata key \"flag\" has type bool, asked for array");

    assert_eq!(g.get_usize("n").unwrap(), 5);
    assert_eq!(g.get_usize("neg").unwrap_err().kind(), ErrorKind::ValueOutOfRange);
    assert_eq!(g.get_usize("flag").unwrap_err().kind(), ErrorKind::WrongType);
    if usize::BITS < 64 {
        assert_eq!(g.get_usize("big").unwrap_err().kind(), ErrorKind::ValueOutOfRange);
    }
    assert_eq!(g.get_str_array("toks").unwrap(), &["a", "b"]);
    assert_eq!(g.get_str("general.architecture").unwrap(), "llama");

    let e = g.tensor_data("nope").unwrap_err();
    assert_eq!(e.kind(), ErrorKind::TensorNotFound);
    assert!(e.to_string().contains("nope"));
    let e = g.to_tensor("q").unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotDense);
    assert!(
        e.to_string().contains("Q4_0") && e.to_string().contains("load_tensor"),
        "{e}"
    );
    assert_eq!(g.to_tensor("i8").unwrap_err().kind(), ErrorKind::NotDense);
    assert!(matches!(g.load_tensor("i8").unwrap(), LoadedTensor::Raw { .. }));
    assert_eq!(
        g.to_tensor("bf").unwrap().to_vec::<bf16>().unwrap(),
        vec![bf16::ONE, bf16::NEG_ONE]
    );
}

#[test]
fn writer_rejects_bad_input() {
    let mut w = GgufWriter::new();
    w.add_metadata("k", 1u8).unwrap();
    assert_eq!(w.add_metadata("k", 2u8).unwrap_err().kind(), ErrorKind::DuplicateKey);
    let e = w.add_metadata("general.alignment", "32").unwrap_err();
    assert_eq!(e.kind(), ErrorKind::WellKnownKeyType);
    assert!(e.to_string().contains("expected u32"), "{e}");
    assert_eq!(
        w.add_metadata("general.alignment", 48u32).unwrap_err().kind(),
        ErrorKind::BadAlignment
    );
    assert_eq!(
        w.add_metadata("general.name", 1u32).unwrap_err().kind(),
        ErrorKind::WellKnownKeyType
    );
    assert_eq!(w.set_alignment(0).unwrap_err().kind(), ErrorKind::BadAlignment);
    assert_eq!(w.set_alignment(24).unwrap_err().kind(), ErrorKind::BadAlignment);

    let mut deep = Array::U8(vec![1]);
    for _ in 0..MAX_ARRAY_DEPTH {
        deep = Array::Array(vec![deep]);
    }
    assert_eq!(
        w.add_metadata("deep", deep).unwrap_err().kind(),
        ErrorKind::NestingTooDeep
    );

    w.add_tensor_bytes("t", QType::F32, &[2], vec![0u8; 8]).unwrap();
    assert_eq!(
        w.add_tensor_bytes("t", QType::F32, &[2], vec![0u8; 8])
            .unwrap_err()
            .kind(),
        ErrorKind::DuplicateTensor
    );
    let e = w.add_tensor_bytes("short", QType::F32, &[3], vec![0u8; 8]).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidTensor);
    assert!(e.to_string().contains("12 bytes, got 8"), "{e}");
    assert_eq!(
        w.add_tensor_bytes("q", QType::Q4_0, &[2, 16], vec![0u8; 18])
            .unwrap_err()
            .kind(),
        ErrorKind::NotBlockMultiple
    );
    assert_eq!(
        w.add_tensor_bytes("r5", QType::F32, &[1, 1, 1, 1, 1], vec![0u8; 4])
            .unwrap_err()
            .kind(),
        ErrorKind::BadDimCount
    );
    assert_eq!(
        w.add_tensor_bytes("r0", QType::F32, &[], vec![0u8; 4])
            .unwrap_err()
            .kind(),
        ErrorKind::BadDimCount
    );
    assert_eq!(
        w.add_tensor_bytes("huge", QType::F32, &[usize::MAX, 2], vec![])
            .unwrap_err()
            .kind(),
        ErrorKind::ElementCountOverflow
    );
    let b = Tensor::from_vec(vec![true, false], [2]).unwrap();
    let e = w.add_tensor("bool", &b).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidTensor);
    assert!(e.to_string().contains("bool"), "{e}");
    // The rejected calls left the writer as it was.
    let g = Gguf::from_vec(w.to_bytes()).unwrap();
    assert_eq!(g.metadata().len(), 1);
    assert_eq!(g.tensors().len(), 1);
}

#[test]
fn summaries_cut_long_arrays() {
    let v = Value::from((0..100u32).collect::<Vec<_>>());
    assert_eq!(v.summary(3), "[0, 1, 2, ... (100 items)]");
    assert_eq!(Value::from(vec!["a", "b"]).summary(3), "[\"a\", \"b\"]");
    let nested = Value::from(vec![Array::U8(vec![1, 2, 3, 4]), Array::U8(vec![])]);
    assert_eq!(nested.summary(2), "[[1, 2, ... (4 items)], []]");
    assert_eq!(Value::F32(1.0).to_string(), "1.0");
}

/// From the fuzzer: a 64-byte file with `general.alignment` = 2^30 and no
/// tensors is legal; its data section starts past its end. Writing it back
/// pads the header to the alignment, as llama.cpp does.
#[test]
fn huge_alignment_without_tensors() {
    let mut bytes = b"GGUF".to_vec();
    bytes.extend_from_slice(&3u32.to_le_bytes());
    bytes.extend_from_slice(&0u64.to_le_bytes());
    bytes.extend_from_slice(&1u64.to_le_bytes());
    bytes.extend_from_slice(&17u64.to_le_bytes());
    bytes.extend_from_slice(b"general.alignment");
    bytes.extend_from_slice(&4u32.to_le_bytes());
    bytes.extend_from_slice(&(1u32 << 30).to_le_bytes());
    let g = Gguf::from_bytes(&bytes).unwrap();
    assert_eq!(g.alignment(), 1 << 30);
    assert_eq!(g.data_offset(), 1 << 30);
    assert_eq!(g.header_len(), bytes.len() as u64);
    let mut w = GgufWriter::new();
    w.add_metadata("general.alignment", 1u32 << 30).unwrap();
    let n = w.write_to(std::io::sink()).unwrap();
    assert_eq!(n, 1 << 30);
}
