//! Helpers shared by the CLI's integration tests.

#![allow(dead_code)] // each test binary uses a different part

pub mod model;

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

/// Runs the built `rustorch-cli` with `args`.
pub fn cli<I, S>(args: I) -> Output
where
    I: IntoIterator<Item = S>,
    S: AsRef<std::ffi::OsStr>,
{
    Command::new(env!("CARGO_BIN_EXE_rustorch-cli"))
        .args(args)
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

/// The path in environment variable `env` (a real model from
/// tools/fetch_models.py), or `None` (with a note) outside CI when it is
/// not set. Under CI the variable must be set.
pub fn real_model(env: &str) -> Option<String> {
    match std::env::var(env) {
        Ok(p) => Some(p),
        Err(_) => {
            assert!(
                std::env::var("CI").is_err(),
                "{env} must be set under CI (tools/fetch_models.py --print-env)"
            );
            eprintln!("skipping: {env} is not set (tools/fetch_models.py --print-env)");
            None
        }
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
