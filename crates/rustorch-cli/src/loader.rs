//! What every model-running command does first: check the backend, size
//! the thread pool, find the model (fetching the default one when no `-m`
//! is given) and load it behind a progress bar.

use crate::cli::{FlashAttn, ModelArgs, SamplingArgs};
use crate::error::CliError;
use crate::fetch;
use indicatif::{ProgressBar, ProgressStyle};
use rustorch::Executor;
use rustorch_llm::chat::ChatTemplate;
use rustorch_llm::model::KvCache;
use rustorch_llm::{Model, Sampler, SamplerConfig};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Context used when `-c` is not given (capped by the model's own).
pub const DEFAULT_CTX: usize = 4096;

/// Checks `-b` and `-t` and returns the model file to use.
pub fn prepare(args: &ModelArgs) -> Result<PathBuf, CliError> {
    check_backend(&args.backend)?;
    set_threads(args.threads.unwrap_or_else(crate::threads::default_threads))?;
    model_path(args.model.as_deref())
}

/// The file `-m` names, or the default model (fetched on first use).
pub fn model_path(model: Option<&Path>) -> Result<PathBuf, CliError> {
    match model {
        Some(p) if !p.exists() => Err(CliError::msg(format!("{}: no such file", p.display()))),
        Some(p) => Ok(p.to_path_buf()),
        None => fetch::default_model(),
    }
}

pub fn check_backend(backend: &str) -> Result<(), CliError> {
    match backend {
        "cpu" | "auto" => Ok(()),
        b @ ("cuda" | "metal" | "vulkan" | "opencl") => Err(CliError::msg(format!(
            "backend '{b}' cannot run models in this build of rustorch-cli (models run on: cpu; `rustorch-cli devices` lists the devices found)"
        ))),
        other => Err(CliError::msg(format!(
            "unknown backend '{other}'; choose cpu, cuda, metal, vulkan, opencl or auto"
        ))),
    }
}

/// Sizes rayon's global pool, which the CPU kernels run on.
pub fn set_threads(t: usize) -> Result<(), CliError> {
    if t == 0 {
        return Err(CliError::msg("--threads must be at least 1"));
    }
    // Fails only if the global pool already exists, which it does not before a model loads.
    rayon::ThreadPoolBuilder::new()
        .num_threads(t)
        .build_global()
        .map_err(|e| CliError::msg(format!("cannot set {t} threads: {e}")))
}

/// Loads `path` with the global executor, showing a per-layer progress bar
/// on a terminal; returns the model and the time it took.
pub fn load(path: &Path, backend: &str) -> Result<(Model, Duration), CliError> {
    let start = Instant::now();
    let bar = ProgressBar::new(1);
    bar.set_style(
        ProgressStyle::with_template("loading {bar:30} {pos}/{len} layers {elapsed}")
            .expect("the template is a valid indicatif template"),
    );
    // The models' ops (GGML-typed products, attention) have CPU kernels
    // only so far: a linked GPU backend would only move activations back
    // and forth, so models get the CPU alone until they run on the GPU.
    let global = Executor::global();
    let exec = if global.devices().iter().all(|d| d.is_cpu()) {
        global
    } else {
        std::sync::Arc::new(Executor::from_backends(
            global.config().clone(),
            vec![std::sync::Arc::new(rustorch::cpu::CpuBackend::new())],
        ))
    };
    let model = Model::load_with(path, &exec, |done, total| {
        bar.set_length(total as u64);
        bar.set_position(done as u64);
    })
    .map_err(|e| CliError::msg(format!("{}: {e}", path.display())))?;
    bar.finish_and_clear();
    if backend == "auto" {
        eprintln!("backend: auto picked cpu (models run on the CPU in this build)");
    }
    Ok((model, start.elapsed()))
}

/// `-c`, or the default context capped by the model's training context.
/// A KV cache of `n_ctx` positions for the attention `--flash-attn` asks
/// for (flash attention unless it says off, as llama.cpp on the CPU).
pub fn new_cache(model: &Model, flash: FlashAttn, n_ctx: usize) -> Result<KvCache, CliError> {
    Ok(match flash {
        FlashAttn::Off => model.new_cache(n_ctx)?,
        FlashAttn::On | FlashAttn::Auto => model.new_flash_cache(n_ctx)?,
    })
}

pub fn context_size(model: &Model, ctx: Option<usize>) -> Result<usize, CliError> {
    match ctx {
        Some(0) => Err(CliError::msg("--ctx-size must be at least 1")),
        Some(c) => Ok(c),
        None => Ok(DEFAULT_CTX.min(model.config().n_ctx_train.max(1))),
    }
}

/// The chat template: `--chat-template` (Jinja source or "chatml"), else
/// the model's own, else ChatML (llama.cpp's fallback).
pub fn chat_template(model: &Model, source: Option<&str>) -> Result<ChatTemplate, CliError> {
    let tok = model.tokenizer();
    let source = source.or(model.chat_template()).unwrap_or("chatml");
    let piece = |id: Option<u32>| id.and_then(|i| tok.token_text(i)).unwrap_or("").to_string();
    Ok(ChatTemplate::new(source, &piece(tok.bos()), &piece(tok.eos()))?
        .with_special_tokens_added(tok.add_bos(), tok.add_eos()))
}

pub fn sampler(args: &SamplingArgs) -> Result<Sampler, CliError> {
    Ok(Sampler::new(SamplerConfig {
        temperature: args.temp,
        top_k: args.top_k,
        top_p: args.top_p,
        min_p: args.min_p,
        repeat_penalty: args.repeat_penalty,
        seed: args.seed,
        ..SamplerConfig::default()
    })?)
}
