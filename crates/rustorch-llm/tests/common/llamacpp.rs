//! llama.cpp reference fixtures (tests/fixtures/llamacpp/, written by
//! tools/gen_llamacpp_fixtures.py with llama-cpp-python 0.3.36) and the model
//! files they describe.
//!
//! Include it from a test with
//! `#[path = "common/llamacpp.rs"] mod llamacpp;`.
//!
//! - [`models`]: models.json, one [`ModelEntry`] per model id;
//! - [`fixture`]: `<id>.json`, a [`Fixture`] with per-prompt tokens, greedy
//!   continuations, logit gaps, top logits and llama-perplexity's result;
//! - [`final_logits`]: `<id>.logits.bin`, whole final-position logit vectors;
//! - [`model_path`]: the GGUF file of an id. The shipped models come from
//!   `RUSTORCH_SMOLLM2_GGUF` / `RUSTORCH_GEMMA3_GGUF`, or when unset from
//!   tools/fetch_models.py (`real_model`, shared with the other crates' tests;
//!   a test fails when neither gives the file). The requantized SmolLM2 files are made once
//!   by `rustorch_quantize::file::quantize_gguf` into
//!   `$RUSTORCH_CACHE/models/requant/` (default `~/.cache/rustorch/models/requant/`),
//!   written atomically, and checked against the sha256 llama-quantize's file had.
//!
//! The fixtures are llama.cpp's results on the CPU that wrote them (models.json's `cpu`); [`fixture`]
//! checks that record and notes when this CPU is of another kind (`fixture_cpu`): the tests then
//! check RusTorch's reproduction of that build, not identity with llama.cpp built here.
#![allow(dead_code)]

#[path = "../../../rustorch-core/tests/common/fixture_cpu.rs"]
pub mod fixture_cpu;
#[path = "../../../rustorch-core/tests/common/real_model.rs"]
pub mod real_model;

use rustorch::gguf::Gguf;
use rustorch_quantize::file::{quantize_gguf, QuantizeOptions};
use rustorch_quantize::mix::FileType;
use serde::Deserialize;
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// Every model id, shipped files first.
pub const MODEL_IDS: [&str; 7] = [
    "smollm2-q4_1",
    "gemma3-q4_k_m",
    "smollm2-q8_0",
    "smollm2-q4_k_m",
    "smollm2-q5_k_m",
    "smollm2-q6_k",
    "smollm2-f16",
];

/// The llama.cpp settings every fixture was made with.
#[derive(Clone, Debug, Deserialize)]
pub struct Settings {
    pub llama_cpp_python: String,
    pub flash_attn: bool,
    pub flash_attn_type: String,
    pub type_k: String,
    pub type_v: String,
    pub n_threads: usize,
    pub n_threads_batch: usize,
    pub n_ctx: usize,
    pub n_batch: usize,
    pub n_ubatch: usize,
    pub use_mmap: bool,
    pub use_extra_bufts: bool,
    pub prompt_eval: String,
    pub generation: String,
    pub tokenize: String,
    /// Sliding-window layers keep every cell (llama_context_default_params).
    pub swa_full: bool,
}

/// One entry of models.json.
#[derive(Clone, Debug, Deserialize)]
pub struct ModelEntry {
    /// "smollm2" or "gemma3": the shipped model the file is (made from).
    pub source: String,
    pub source_file: String,
    pub source_sha256: String,
    /// llama-quantize's type name ("Q8_0", "Q4_K_M", ...), `None` for a
    /// shipped file.
    pub requant: Option<String>,
    pub requant_command: Option<String>,
    /// sha256 of the model file the fixture was made from.
    pub sha256: String,
    pub size: u64,
    pub settings: Settings,
    /// `llama_print_system_info()` of the reference build: the features it was compiled with.
    pub system_info: String,
    /// The CPU it ran on (tools/cpu_record.py; `fixture_cpu::check_record` reads it).
    pub cpu: serde_json::Value,
    /// `{arch}.*` and a few tokenizer keys as llama.cpp read them, as strings.
    pub metadata: BTreeMap<String, String>,
}

/// One prompt of a fixture.
#[derive(Clone, Debug, Deserialize)]
pub struct PromptCase {
    pub text: String,
    /// llama.cpp's tokenization: add_special = true (BOS per metadata),
    /// parse_special = true.
    pub tokens: Vec<u32>,
    /// `n_gen` greedy ids (argmax, lowest id on exact ties), not stopped at
    /// end-of-generation tokens.
    pub greedy: Vec<u32>,
    /// `gaps[k]`: top-1 minus top-2 logit of the logits that chose
    /// `greedy[k]` (k = 0: after the prompt).
    pub gaps: Vec<f32>,
    /// The 10 largest final-position logits after the prompt, `(id, logit)`,
    /// largest first.
    pub top: Vec<(u32, f32)>,
}

/// llama-perplexity's result on tests/fixtures/GPL-3.
#[derive(Clone, Debug, Deserialize)]
pub struct Perplexity {
    /// The command line (MODEL stands for the model file).
    pub command: String,
    pub text: String,
    pub ctx: usize,
    pub chunks: usize,
    pub batch: usize,
    pub threads: usize,
    pub flash_attn: String,
    /// Tokens scored per chunk: ctx - 1 - ctx/2.
    pub scored_per_chunk: usize,
    /// The running estimate printed after each chunk (4 decimals).
    pub running: Vec<f64>,
    /// `Final estimate: PPL = ppl +/- ppl_err`.
    pub ppl: f64,
    pub ppl_err: f64,
}

/// `<id>.json`.
#[derive(Clone, Debug, Deserialize)]
pub struct Fixture {
    pub id: String,
    pub generator: String,
    pub settings: Settings,
    pub n_vocab: usize,
    pub n_gen: usize,
    /// File name of the logits, next to the fixture.
    pub logits_file: String,
    /// The prompts (indices into `prompts`) whose logits are in `logits_file`.
    pub logits_prompts: Vec<usize>,
    pub prompts: Vec<PromptCase>,
    pub perplexity: Perplexity,
}

pub fn fixtures_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/llamacpp")
}

/// The GPL-3 text llama-perplexity scored.
pub fn gpl3_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/GPL-3")
}

fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> T {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// models.json.
pub fn models() -> BTreeMap<String, ModelEntry> {
    read_json(&fixtures_dir().join("models.json"))
}

/// The models.json entry of `id`.
pub fn model_entry(id: &str) -> ModelEntry {
    models()
        .remove(id)
        .unwrap_or_else(|| panic!("models.json has no model {id:?}"))
}

/// `<id>.json`: llama.cpp's results. Notes (once per process) when they were
/// written on another kind of CPU than this one.
pub fn fixture(id: &str) -> Fixture {
    let cpu = model_entry(id).cpu;
    fixture_cpu::note_if_other_cpu("rustorch-llm's llama.cpp fixtures (tests/fixtures/llamacpp)", &cpu);
    read_json(&fixtures_dir().join(format!("{id}.json")))
}

/// The final-position logits of the prompts `fx.logits_prompts`, in that
/// order, each `fx.n_vocab` long.
pub fn final_logits(fx: &Fixture) -> Vec<Vec<f32>> {
    let path = fixtures_dir().join(&fx.logits_file);
    let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let want = fx.n_vocab * fx.logits_prompts.len() * 4;
    assert_eq!(
        bytes.len(),
        want,
        "{}: {} bytes, expected n_vocab {} x {} prompts x 4",
        path.display(),
        bytes.len(),
        fx.n_vocab,
        fx.logits_prompts.len()
    );
    let (words, _) = bytes.as_chunks::<4>();
    words
        .chunks(fx.n_vocab)
        .map(|c| c.iter().map(|w| f32::from_le_bytes(*w)).collect())
        .collect()
}

/// The shipped model file `source` ("smollm2", "gemma3"): its variable's
/// path, or the file tools/fetch_models.py fetches (`real_model`).
pub fn source_path(source: &str) -> PathBuf {
    real_model::real_model(source)
}

pub fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

pub fn sha256_file(path: &Path) -> String {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    sha256_hex(&bytes)
}

/// A sink that hashes what is written.
struct HashingWriter<W> {
    inner: W,
    hasher: Sha256,
}

impl<W: Write> Write for HashingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hasher.update(&buf[..n]);
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// Quantizes the shipped model of `entry` to `entry.requant` with
/// `quantize_gguf` (allow_requantize, default mix options: what
/// `llama-quantize --allow-requantize IN OUT TYPE` does) and writes the file
/// to `out`; returns the file's sha256. `src` must be the shipped file.
pub fn requantize(src: &Path, entry: &ModelEntry, out: impl Write) -> String {
    let name = entry.requant.as_deref().expect("a requantized model id");
    let ftype = FileType::parse(name).unwrap_or_else(|| panic!("unknown file type {name:?}"));
    let g = Gguf::open(src).unwrap_or_else(|e| panic!("{}: {e}", src.display()));
    let opts = QuantizeOptions {
        allow_requantize: true,
        ..QuantizeOptions::default()
    };
    let q = quantize_gguf(&g, ftype, &opts, |_| {}).unwrap_or_else(|e| panic!("quantizing to {name}: {e}"));
    let mut w = HashingWriter {
        inner: std::io::BufWriter::new(out),
        hasher: Sha256::new(),
    };
    q.writer.write_to(&mut w).expect("writing the quantized model");
    w.hasher.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// Where requantized models are cached.
pub fn requant_cache_dir() -> PathBuf {
    let base = match std::env::var_os("RUSTORCH_CACHE") {
        Some(p) => PathBuf::from(p),
        None => PathBuf::from(std::env::var_os("HOME").expect("HOME is set")).join(".cache/rustorch"),
    };
    base.join("models/requant")
}

/// Serializes the making of cached files within one test binary (files are
/// renamed into place, so separate processes cannot see partial files).
static MAKING: Mutex<()> = Mutex::new(());

/// The model file of fixture id `id`. Requantized files are made on first
/// use and checked against models.json's sha256.
pub fn model_path(id: &str) -> PathBuf {
    let entry = model_entry(id);
    let src = source_path(&entry.source);
    if entry.requant.is_none() {
        return src;
    }
    let _guard = MAKING.lock().unwrap_or_else(|e| e.into_inner());
    let dir = requant_cache_dir();
    let path = dir.join(format!("{id}.gguf"));
    if path.exists() {
        let sha = sha256_file(&path);
        if sha == entry.sha256 {
            return path;
        }
        eprintln!("{}: sha256 {sha} is stale, making it again", path.display());
    }
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    let tmp = dir.join(format!(".{id}.gguf.{}.tmp", std::process::id()));
    let file = std::fs::File::create(&tmp).unwrap_or_else(|e| panic!("{}: {e}", tmp.display()));
    let sha = requantize(&src, &entry, file);
    if sha != entry.sha256 {
        let _ = std::fs::remove_file(&tmp);
        panic!(
            "{id}: rustorch's {} requantization of {} has sha256 {sha}, llama-quantize's {}",
            entry.requant.as_deref().unwrap_or_default(),
            src.display(),
            entry.sha256
        );
    }
    std::fs::rename(&tmp, &path).unwrap_or_else(|e| panic!("{} -> {}: {e}", tmp.display(), path.display()));
    path
}
