//! `rustorch-cli quantize` and `rustorch_quantize::mix` against llama.cpp's
//! `llama-quantize` (tests/fixtures/quantize.json, written by
//! tools/gen_quantize_fixtures.py):
//!
//! - for the test models of `common::model`, every file type gives the
//!   same tensor types, the same bytes per tensor, and the same file;
//! - for larger shapes (16/32/80 layers, GQA or not, tied embeddings,
//!   experts), `choose_types` gives the types `llama-quantize --dry-run`
//!   printed.

mod common;

use common::{cli, stderr, write_model, TempDir};
use rustorch::gguf::Gguf;
use rustorch::quant::QType;
use rustorch_quantize::mix::{choose_types, FileType, MixOptions, ModelParams, TensorDesc};
use serde_json::Value;
use sha2::{Digest, Sha256};

/// The fixture, after checking its `cpu` record: llama-quantize was built for the CPU that wrote
/// it (its float rounding steps may contract to FMA there), so a note says when this CPU is of
/// another kind.
fn fixture() -> Value {
    let text = include_str!("fixtures/quantize.json");
    let fx: Value = serde_json::from_str(text).expect("the fixture is JSON");
    common::fixture_cpu::note_if_other_cpu("rustorch-cli's llama-quantize fixtures", &fx["cpu"]);
    fx
}

fn hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

#[test]
fn mix_types_match_llama_quantize_dry_run() {
    let fx = fixture();
    let configs = fx["configs"].as_object().unwrap();
    assert!(configs.len() >= 5);
    let mut failures = Vec::new();
    let mut checked = 0;
    for (cname, cfg) in configs {
        let p = &cfg["params"];
        let n = |k: &str| p[k].as_u64().unwrap() as usize;
        let params = ModelParams {
            arch: "llama".into(),
            n_layer: n("n_layer"),
            n_head: n("n_head"),
            n_head_kv: n("n_head_kv"),
            n_expert: n("n_expert"),
        };
        let tensors: Vec<(String, Vec<u64>, QType)> = cfg["tensors"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| {
                let f: Vec<&str> = t.as_str().unwrap().split(' ').collect();
                let dims = f[1].split('x').map(|d| d.parse().unwrap()).collect();
                (f[0].to_string(), dims, QType::parse(f[2]).unwrap())
            })
            .collect();
        let descs: Vec<TensorDesc<'_>> = tensors
            .iter()
            .map(|(name, dims, q)| TensorDesc { name, dims, qtype: *q })
            .collect();
        for (ft, expected) in cfg["types"].as_object().unwrap() {
            let ftype = FileType::parse(ft).unwrap();
            let got = choose_types(ftype, &params, &descs, &MixOptions::default()).unwrap();
            let expected: Vec<&str> = expected.as_str().unwrap().split(' ').collect();
            assert_eq!(expected.len(), got.len(), "{cname} {ft}");
            for ((t, want), g) in tensors.iter().zip(&expected).zip(&got) {
                checked += 1;
                if g.qtype.name() != *want {
                    failures.push(format!("{cname} {ft} {}: llama.cpp {want}, ours {}", t.0, g.qtype));
                }
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {checked} differ:\n{}",
        failures.len(),
        failures.join("\n")
    );
    assert!(checked > 10_000, "{checked}");
}

#[test]
fn quantized_models_match_llama_quantize_bytes() {
    let fx = fixture();
    let dir = TempDir::new("llamacpp");
    let mut failures = Vec::new();
    let mut n_outputs = 0;
    for (name, entry) in fx["models"].as_object().unwrap() {
        let input = write_model(&dir, name);
        let input_sha = hex(&std::fs::read(&input).unwrap());
        assert_eq!(
            input_sha,
            entry["input_sha256"].as_str().unwrap(),
            "{name}: the generated input differs from the one llama.cpp quantized"
        );
        for (ft, want) in entry["outputs"].as_object().unwrap() {
            n_outputs += 1;
            let out = dir.path(&format!("{name}-{ft}.gguf"));
            let o = cli(["quantize".as_ref(), input.as_os_str(), out.as_os_str(), ft.as_ref()]);
            assert!(o.status.success(), "{name} {ft}: {}", stderr(&o));
            let g = Gguf::open(&out).unwrap();
            assert_eq!(
                g.get_u32("general.file_type").unwrap(),
                FileType::parse(ft).unwrap().id()
            );
            let want_tensors = want["tensors"].as_array().unwrap();
            assert_eq!(g.tensors().len(), want_tensors.len(), "{name} {ft}");
            for (t, w) in g.tensors().iter().zip(want_tensors) {
                let f: Vec<&str> = w.as_str().unwrap().split(' ').collect();
                let (wname, wtype, wsha) = (f[0], f[1], f[2]);
                let sha = hex(g.data_of(t));
                if t.name() != wname || t.qtype().name() != wtype || sha[..16] != *wsha {
                    failures.push(format!(
                        "{name} {ft}: ours {} {} {}, llama.cpp {wname} {wtype} {wsha}",
                        t.name(),
                        t.qtype(),
                        &sha[..16]
                    ));
                }
            }
            let file_sha = hex(g.as_bytes());
            if file_sha != want["file_sha256"].as_str().unwrap() {
                failures.push(format!("{name} {ft}: whole file differs"));
            }
            drop(g);
            let _ = std::fs::remove_file(&out);
        }
    }
    assert_eq!(n_outputs, 2 * FileType::ALL.len());
    assert!(
        failures.is_empty(),
        "{} differences:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
