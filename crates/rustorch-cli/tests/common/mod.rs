//! Helpers shared by the CLI's integration tests.

#![allow(dead_code)] // each test binary uses a different part

pub mod model;

// Shared with the other crates' tests.
#[path = "../../../rustorch-core/tests/common/fixture_cpu.rs"]
pub mod fixture_cpu;
#[path = "../../../rustorch-core/tests/common/real_model.rs"]
mod shared_real_model;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// A fresh scratch folder, removed on drop.
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        let p = std::env::temp_dir().join(format!("rustorch-cli-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).expect("the temp dir is writable");
        TempDir(p)
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The llama.cpp build the committed fixtures describe (no AMX, no
/// AVX512-FP16; see their `cpu` records): the binary would otherwise take
/// the native build's arithmetic of the CPU it runs on.
pub const FIXTURE_BUILD: [(&str, &str); 2] = [("RUSTORCH_GGML_ORDER", "reference"), ("RUSTORCH_GGML_F16", "widened")];

/// Runs the built `rustorch-cli` with `args` (in the fixtures' build).
pub fn cli<I, S>(args: I) -> Output
where
    I: IntoIterator<Item = S>,
    S: AsRef<std::ffi::OsStr>,
{
    Command::new(env!("CARGO_BIN_EXE_rustorch-cli"))
        .args(args)
        .envs(FIXTURE_BUILD)
        .env("RUST_BACKTRACE", "1")
        .output()
        .expect("the binary runs")
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Writes test model `name` of `model::SPECS` into `dir`.
pub fn write_model(dir: &TempDir, name: &str) -> PathBuf {
    let spec = model::SPECS.iter().find(|s| s.name == name).expect("a known spec");
    let path = dir.path(&format!("{name}.gguf"));
    std::fs::write(&path, model::build(spec)).expect("the temp dir is writable");
    path
}

/// Asserts a failed run printed exactly one `error: ...` line containing
/// `needle`, and no panic.
pub fn assert_one_line_error(o: &Output, needle: &str) {
    let err = stderr(o);
    assert!(!o.status.success(), "expected failure; stderr: {err}");
    assert!(!err.contains("panicked") && !err.contains("backtrace"), "{err}");
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 1, "one line expected: {err:?}");
    assert!(lines[0].starts_with("error: "), "{err:?}");
    assert!(lines[0].contains(needle), "{needle:?} not in {err:?}");
}

pub fn exists(p: &Path) -> bool {
    p.exists()
}

/// The path of real model `name` ("smollm2", "gemma3"), as an argument for
/// the CLI: its `RUSTORCH_*_GGUF` variable's file, or the one
/// tools/fetch_models.py fetches; the test fails when neither works.
pub fn real_model(name: &str) -> String {
    let path = shared_real_model::real_model(name);
    path.to_str()
        .unwrap_or_else(|| panic!("{}: not a UTF-8 path", path.display()))
        .to_string()
}

/// Checks the `cpu` record of rustorch-llm's llama.cpp fixtures (written by
/// tools/gen_llamacpp_fixtures.py, which the CLI's generation and perplexity
/// tests compare with) and notes when this CPU is of another kind.
pub fn note_llamacpp_fixtures_cpu() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../rustorch-llm/tests/fixtures/llamacpp/models.json"
    );
    let models: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let models = models.as_object().expect("models.json maps ids to entries");
    for entry in models.values() {
        fixture_cpu::note_if_other_cpu(
            "rustorch-llm's llama.cpp fixtures (tests/fixtures/llamacpp)",
            &entry["cpu"],
        );
    }
}

/// Runs the built `rustorch-cli` with `args`, feeding `input` on stdin.
pub fn cli_with_stdin<I, S>(args: I, input: &[u8], envs: &[(&str, &std::ffi::OsStr)]) -> Output
where
    I: IntoIterator<Item = S>,
    S: AsRef<std::ffi::OsStr>,
{
    use std::io::Write;
    use std::process::Stdio;
    let mut child = Command::new(env!("CARGO_BIN_EXE_rustorch-cli"))
        .args(args)
        .envs(FIXTURE_BUILD)
        .envs(envs.iter().copied())
        .env("RUST_BACKTRACE", "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the binary runs");
    let mut stdin = child.stdin.take().expect("stdin is piped");
    stdin.write_all(input).expect("the child reads its stdin");
    drop(stdin);
    child.wait_with_output().expect("the binary runs")
}
