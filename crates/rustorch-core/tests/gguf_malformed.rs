//! Broken files: each committed malformed file gives its expected error
//! kind and a message saying where; valid files cut at every byte offset and
//! randomly corrupted never panic.

// Ops run on the CPU backend, which registers itself once linked.
use proptest::prelude::*;
use rustorch_core::gguf::{Gguf, LoadedTensor};
use rustorch_cpu as _;
use serde_json::Value as Json;
use std::path::PathBuf;

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/gguf")
}

fn read_manifest(dir: &str) -> Vec<Json> {
    let path = fixtures().join(dir).join("manifest.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str::<Json>(&text).unwrap().as_array().unwrap().clone()
}

fn valid_files() -> Vec<(String, Vec<u8>)> {
    read_manifest("valid")
        .iter()
        .map(|f| {
            let rel = f["file"].as_str().unwrap().to_string();
            let bytes = std::fs::read(fixtures().join(&rel)).unwrap();
            (rel, bytes)
        })
        .collect()
}

/// Touches everything a parsed file offers, as a consumer would.
fn walk(g: &Gguf) {
    for (k, v) in g.metadata().iter() {
        let _ = v.summary(4);
        let _ = g.get(k).unwrap();
    }
    for t in g.tensors() {
        let data = g.tensor_data(t.name()).unwrap();
        assert_eq!(data.len(), t.n_bytes());
        if let LoadedTensor::Dense(x) = g.load_tensor(t.name()).unwrap() {
            assert_eq!(x.numel(), t.numel());
        }
    }
}

#[test]
fn malformed_corpus_gives_the_expected_errors() {
    let cases = read_manifest("malformed");
    assert!(cases.len() >= 50, "corpus has {} files", cases.len());
    let mut failures = Vec::new();
    for case in cases {
        let rel = case["file"].as_str().unwrap();
        let path = fixtures().join(rel);
        let bytes = std::fs::read(&path).unwrap();
        let err = match Gguf::from_bytes(&bytes) {
            Ok(g) => {
                failures.push(format!("{rel}: parsed as {g:?}"));
                continue;
            }
            Err(e) => e,
        };
        let msg = err.to_string();
        let kind = format!("{:?}", err.kind());
        if kind != case["kind"].as_str().unwrap() {
            failures.push(format!("{rel}: kind {kind}, expected {}: {msg}", case["kind"]));
        }
        for want in case["message_contains"].as_array().unwrap() {
            let want = want.as_str().unwrap();
            if !msg.contains(want) {
                failures.push(format!("{rel}: message {msg:?} lacks {want:?}"));
            }
        }
        // The mapped reader reports the same thing.
        let mapped = Gguf::open(&path).expect_err(rel);
        assert_eq!(mapped.to_string(), msg, "{rel}");
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn every_truncation_of_a_valid_file_is_an_error() {
    for (name, bytes) in valid_files() {
        let g = Gguf::from_bytes(&bytes).unwrap();
        walk(&g);
        // Trailing padding is optional: a file is complete once the header
        // and every tensor's data are there.
        let needed = g
            .tensors()
            .iter()
            .map(|t| g.data_offset() + t.offset() + t.n_bytes() as u64)
            .chain([g.header_len()])
            .max()
            .unwrap() as usize;
        for cut in 0..bytes.len() {
            match Gguf::from_bytes(&bytes[..cut]) {
                Ok(t) if cut >= needed => walk(&t),
                Ok(_) => panic!("{name} cut at {cut} (of {needed} needed) parsed"),
                Err(e) if cut < needed => {
                    let msg = e.to_string();
                    assert!(
                        msg.contains("offset") || msg.contains("bytes"),
                        "{name} cut at {cut}: {msg}"
                    );
                }
                Err(e) => panic!("{name} cut at {cut} (needs {needed}) failed: {e}"),
            }
        }
    }
}

#[test]
fn version_1_is_refused_clearly() {
    let (_, mut bytes) = valid_files().remove(0);
    bytes[4..8].copy_from_slice(&1u32.to_le_bytes());
    let e = Gguf::from_bytes(&bytes).unwrap_err();
    assert!(e.to_string().contains("unsupported GGUF version 1"), "{e}");
}

#[test]
fn missing_file_names_the_path() {
    let e = Gguf::open("/nonexistent/model.gguf").unwrap_err();
    assert_eq!(e.kind(), rustorch_core::gguf::ErrorKind::Io);
    assert!(e.to_string().contains("/nonexistent/model.gguf"), "{e}");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    /// Random byte overwrites of valid files: parse or fail, never panic,
    /// and whatever parses can be walked.
    #[test]
    fn corrupted_files_never_panic(
        file in 0usize..5,
        edits in prop::collection::vec((any::<usize>(), any::<u8>()), 1..8),
    ) {
        let files = valid_files();
        let (_, mut bytes) = files[file % files.len()].clone();
        for (at, b) in edits {
            let i = at % bytes.len();
            bytes[i] = b;
        }
        if let Ok(g) = Gguf::from_bytes(&bytes) {
            walk(&g);
        }
    }

    /// Corruptions concentrated on the header and counts, where lengths live.
    #[test]
    fn corrupted_lengths_never_panic(
        file in 0usize..5,
        at in 0usize..256,
        value in prop_oneof![Just(u64::MAX), Just(1u64 << 62), Just(1u64 << 32), 0u64..4096],
    ) {
        let files = valid_files();
        let (_, mut bytes) = files[file % files.len()].clone();
        let at = at % (bytes.len() - 8);
        bytes[at..at + 8].copy_from_slice(&value.to_le_bytes());
        if let Ok(g) = Gguf::from_bytes(&bytes) {
            walk(&g);
        }
    }
}
