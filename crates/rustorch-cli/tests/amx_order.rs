//! `RUSTORCH_GGML_ORDER=amx` against llama.cpp built with AMX, and the default order against
//! llama.cpp built without it: greedy text of random-weight models at SmolLM2-135M's shape in
//! Q4_1 and Q8_0, and at mkmodel.py's `kquant` shape in Q4_K_M, Q5_K_M and IQ4_XS
//! (fixtures/amx_order.json, from tools/gen_amx_order_fixtures.sh on an AMX host).
//! The AMX build's order does not need AMX to compute (`quant::matmul::amx_order`), so this runs
//! on any machine. Random weights give nearly flat logits, so one differing bit in a product soon
//! changes the greedy tokens; the two builds' texts themselves differ in most cases.
//!
//! The models are made here as the fixture's were: tools/mkmodel.py SHAPE (seeded; needs python3
//! with numpy and gguf, else the test says so and skips), then `rustorch-cli quantize`; the files'
//! sha256 must equal the fixture's. They are cached in $RUSTORCH_CACHE/models/amx-order (default
//! ~/.cache/rustorch/models/amx-order).

mod common;

use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use std::process::Command;

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn cache_dir() -> PathBuf {
    let root = std::env::var_os("RUSTORCH_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").expect("HOME is set")).join(".cache/rustorch"));
    root.join("models/amx-order")
}

fn sha256(path: &Path) -> String {
    let bytes = std::fs::read(path).expect("the model reads");
    Sha256::digest(&bytes).iter().map(|b| format!("{b:02x}")).collect()
}

/// The model of `shape` and `qtype` made as the fixture's was, or None (with the reason
/// printed) when python3 cannot run mkmodel.py here.
fn model(shape: &str, qtype: &str, want_sha: &str) -> Option<PathBuf> {
    let dir = cache_dir();
    std::fs::create_dir_all(&dir).expect("the cache folder can be made");
    let out = dir.join(format!("{shape}-{qtype}.gguf"));
    if out.exists() && sha256(&out) == want_sha {
        return Some(out);
    }
    let f16 = dir.join(format!("{shape}-f16.gguf"));
    if !f16.exists() {
        let partial = dir.join(format!("{shape}-f16.gguf.partial"));
        let made = Command::new("python3")
            .arg(repo_root().join("tools/mkmodel.py"))
            .arg(shape)
            .arg(&partial)
            .status();
        if !matches!(made, Ok(s) if s.success()) {
            eprintln!("skipped: python3 with numpy and gguf could not run tools/mkmodel.py");
            return None;
        }
        std::fs::rename(&partial, &f16).expect("the model is renamed into place");
    }
    let o = Command::new(env!("CARGO_BIN_EXE_rustorch-cli"))
        .arg("quantize")
        .arg(&f16)
        .arg(&out)
        .arg(qtype)
        .output()
        .expect("the binary runs");
    assert!(o.status.success(), "quantize {qtype}: {}", common::stderr(&o));
    let got = sha256(&out);
    assert_eq!(
        got, want_sha,
        "{shape} {qtype}: the model made here differs from the fixture's (numpy's generator or the quantizer changed?)"
    );
    Some(out)
}

fn greedy(model: &Path, prompt: &str, n: usize, order: &str) -> String {
    let o = Command::new(env!("CARGO_BIN_EXE_rustorch-cli"))
        .args(["-m"])
        .arg(model)
        .args([
            "-p",
            prompt,
            "-n",
            &n.to_string(),
            "--temp",
            "0",
            "-t",
            "2",
            "-fa",
            "off",
        ])
        .env("RUSTORCH_GGML_ORDER", order)
        .output()
        .expect("the binary runs");
    assert!(o.status.success(), "{}", common::stderr(&o));
    common::stdout(&o)
}

#[test]
fn greedy_text_equals_llama_cpps_with_and_without_amx() {
    let text = std::fs::read_to_string(repo_root().join("crates/rustorch-cli/tests/fixtures/amx_order.json"))
        .expect("the fixture reads");
    let fx: serde_json::Value = serde_json::from_str(&text).expect("the fixture parses");
    // Written on an AMX host: elsewhere the test checks RusTorch's reproduction of its two builds.
    common::fixture_cpu::note_if_other_cpu("rustorch-cli's AMX-order fixtures", &fx["cpu"]);
    let n = fx["n_gen"].as_u64().expect("n_gen") as usize;
    let (mut differing_builds, mut differing_kquant) = (0, 0);
    for m in fx["models"].as_array().expect("models") {
        let (shape, qtype) = (m["shape"].as_str().expect("shape"), m["qtype"].as_str().expect("qtype"));
        let Some(path) = model(shape, qtype, m["sha256"].as_str().expect("sha256")) else {
            return;
        };
        for case in m["cases"].as_array().expect("cases") {
            let prompt = case["prompt"].as_str().expect("prompt");
            let (amx, noamx) = (
                case["amx"].as_str().expect("amx"),
                case["noamx"].as_str().expect("noamx"),
            );
            let kquant = qtype.contains("_K") || qtype.starts_with("IQ");
            differing_builds += usize::from(amx != noamx);
            differing_kquant += usize::from(kquant && amx != noamx);
            // The build without AMX is compared on the legacy types only: for K-quants, llama.cpp's
            // plain CPU path has scalar f32 steps whose rounding depends on how GCC compiles them
            // for the target CPU (its K-quant text differs between that device build, for Sapphire
            // Rapids, and a native build on this project's AMD machine, whose bits the default
            // order reproduces: rustorch-core/tests/ggml_matmul.rs,
            // rustorch-llm/tests/llamacpp_*.rs). The AMX build's K-quant kernels are intrinsics
            // throughout, so the AMX order is compared for every model.
            let reference = (!kquant).then_some(("reference", noamx, "without AMX"));
            for (order, want, build) in std::iter::once(("amx", amx, "with AMX")).chain(reference) {
                let got = greedy(&path, prompt, n, order);
                assert_eq!(
                    got.trim_end_matches('\n'),
                    want.trim_end_matches('\n'),
                    "{shape} {qtype}, {prompt:?}: RUSTORCH_GGML_ORDER={order} against llama.cpp built {build}"
                );
            }
        }
    }
    // The fixture tells the two orders apart (else the test could not fail on a wrong order),
    // for the K-quants too.
    assert!(
        differing_builds >= 4 && differing_kquant >= 2,
        "only {differing_builds} cases differ between the builds ({differing_kquant} of K-quant models)"
    );
}

#[test]
fn an_unknown_order_is_a_one_line_error() {
    let o = Command::new(env!("CARGO_BIN_EXE_rustorch-cli"))
        .args(["-m", "missing.gguf", "-p", "hi"])
        .env("RUSTORCH_GGML_ORDER", "fast")
        .output()
        .expect("the binary runs");
    common::assert_one_line_error(&o, "RUSTORCH_GGML_ORDER");
}
