//! `rustorch-cli -fa on` (the default) and `-fa off` against llama.cpp's llama-completion with
//! flash attention on (its default on the CPU) and off: greedy text of the real SmolLM2-135M
//! Q4_1 and Gemma-3-270M Q4_K_M files for prompts that take each of GGML's flash-attention
//! paths (fixtures/flash_attn.json, from tools/gen_flash_fixtures.sh: a short prompt, the one-row
//! path; 151 tokens, the tiled path; 519-523 tokens, a 512-position micro-batch tiled and the rest
//! one row at a time, then generation over a 768-position cache, the split-keys path).
//!
//! The fixture is llama.cpp's output on the CPU it records (`cpu`: an AMD EPYC, AVX-512 without
//! AVX512-FP16 or AMX). On another kind of CPU these tests check that the CLI reproduces that
//! build, not llama.cpp built there, and say so (tools/llamacpp_diff.py compares with that).

mod common;

use common::{cli, fixture_cpu, real_model, stderr, stdout};
use sha2::{Digest, Sha256};

fn sha256(path: &str) -> String {
    let bytes = std::fs::read(path).expect("the model reads");
    Sha256::digest(&bytes).iter().map(|b| format!("{b:02x}")).collect()
}

/// fixtures/flash_attn.json, after checking its `cpu` record.
fn fixture() -> serde_json::Value {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/flash_attn.json");
    let fx: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    fixture_cpu::note_if_other_cpu("rustorch-cli's flash-attention fixtures", &fx["cpu"]);
    fx
}

#[test]
fn greedy_text_equals_llama_cpps_with_and_without_flash_attention() {
    let fx = fixture();
    let ctx = fx["ctx"].as_u64().expect("ctx").to_string();
    let mut differing = 0;
    let mut compared = 0;
    for m in fx["models"].as_array().expect("models") {
        let name = m["model"].as_str().expect("model");
        let path = real_model(name);
        assert_eq!(
            sha256(&path),
            m["sha256"].as_str().expect("sha256"),
            "{path} is not the fixture's {name} file"
        );
        for case in m["cases"].as_array().expect("cases") {
            let prompt = case["prompt"].as_str().expect("prompt");
            let n = case["n_gen"].as_u64().expect("n_gen").to_string();
            let (on, off) = (
                case["fa_on"].as_str().expect("fa_on"),
                case["fa_off"].as_str().expect("fa_off"),
            );
            differing += usize::from(on != off);
            for (fa, want) in [("on", on), ("off", off), ("auto", on)] {
                let o = cli([
                    "-m", &path, "-p", prompt, "-n", &n, "-c", &ctx, "--temp", "0", "-t", "2", "-fa", fa,
                ]);
                assert!(o.status.success(), "{}", stderr(&o));
                assert_eq!(
                    stdout(&o).trim_end_matches('\n'),
                    want.trim_end_matches('\n'),
                    "{name}, -fa {fa}, a prompt of {} bytes",
                    prompt.len()
                );
                compared += 1;
            }
        }
    }
    assert!(compared > 0, "the fixture holds no cases");
    // The two attentions' texts differ in the fixture (else the test could not tell them apart).
    assert!(differing >= 2, "only {differing} cases differ between -fa on and off");
}

#[test]
fn a_bad_flash_attention_value_is_an_error_naming_the_choices() {
    let o = cli(["-m", "missing.gguf", "-p", "hi", "-fa", "maybe"]);
    assert!(!o.status.success());
    let err = stderr(&o);
    assert!(err.contains("maybe") && err.contains("on"), "{err}");
}

/// `rustorch-cli perplexity` prints llama-perplexity's final estimate digit for digit, with flash
/// attention (both tools' default) and without: 20 chunks of 128 positions (llama-perplexity runs
/// 16 of them as parallel sequences in micro-batches of 32 rows each, the one-row path, then 4 in
/// 128-row micro-batches, the tiled path) and Gemma 3 in chunks of 512.
#[test]
fn perplexity_equals_llama_perplexitys_with_and_without_flash_attention() {
    let fx = fixture();
    let text = concat!(env!("CARGO_MANIFEST_DIR"), "/../rustorch-llm/tests/fixtures/GPL-3");
    for case in fx["perplexity"].as_array().expect("perplexity") {
        let name = case["model"].as_str().expect("model");
        let path = real_model(name);
        let fa = case["fa"].as_str().expect("fa");
        let mut args: Vec<String> = ["perplexity", "-m", &path, "-f", text, "-t", "2", "-fa", fa]
            .iter()
            .map(|s| s.to_string())
            .collect();
        args.extend(
            case["args"]
                .as_array()
                .expect("args")
                .iter()
                // llama-perplexity's -b is --batch-size here (-b picks the backend).
                .map(|a| match a.as_str().unwrap() {
                    "-b" => "--batch-size".to_string(),
                    other => other.to_string(),
                }),
        );
        let o = cli(&args);
        assert!(o.status.success(), "{}", stderr(&o));
        let out = stdout(&o);
        let got = out
            .lines()
            .find(|l| l.starts_with("Final estimate"))
            .unwrap_or_default();
        assert_eq!(
            got,
            case["final"].as_str().expect("final"),
            "{name} {:?} -fa {fa}",
            case["args"]
        );
    }
}
