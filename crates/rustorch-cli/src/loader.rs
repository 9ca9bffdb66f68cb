//! What every model-running command does first: check the backend, size
//! the thread pool, find the model (fetching the default one when no `-m`
//! is given) and load it behind a progress bar.

use crate::cli::{FlashAttn, ModelArgs, SamplingArgs};
use crate::error::CliError;
use crate::fetch;
use indicatif::{ProgressBar, ProgressStyle};
use rustorch::{Device, Executor};
use rustorch_llm::chat::ChatTemplate;
use rustorch_llm::model::{KvCache, Placement};
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
    parse_backend(backend).map(|_| ())
}

/// What `-b` asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum BackendChoice {
    Cpu,
    Auto,
    Cuda(usize),
}

fn parse_backend(backend: &str) -> Result<BackendChoice, CliError> {
    match backend {
        "cpu" => Ok(BackendChoice::Cpu),
        "auto" => Ok(BackendChoice::Auto),
        "cuda" => Ok(BackendChoice::Cuda(0)),
        b if b.starts_with("cuda:") => b[5..]
            .parse()
            .map(BackendChoice::Cuda)
            .map_err(|_| CliError::msg(format!("backend '{b}': expected cuda:N with N a GPU number"))),
        b @ ("metal" | "vulkan" | "opencl") => Err(CliError::msg(format!(
            "backend '{b}' is not in this build of rustorch-cli (models run on: cpu{}; `rustorch-cli devices` lists the devices found)",
            if cfg!(feature = "cuda") { ", cuda" } else { "" }
        ))),
        other => Err(CliError::msg(format!(
            "unknown backend '{other}'; choose cpu, cuda, cuda:N, metal, vulkan, opencl or auto"
        ))),
    }
}

/// Why no CUDA device can run the model here, in words.
fn no_cuda_reason() -> String {
    if !cfg!(feature = "cuda") {
        return "this build of rustorch-cli has no CUDA support (build it with its default features, or --features cuda)".into();
    }
    rustorch::registry::enumerate()
        .unavailable
        .into_iter()
        .find(|(name, _)| *name == "cuda")
        .map_or_else(|| "no CUDA device found".into(), |(_, why)| why)
}

/// The device `-b` picks: the CPU, or a GPU the global executor has.
fn pick_device(choice: BackendChoice) -> Result<Device, CliError> {
    let gpus: Vec<Device> = Executor::global()
        .devices()
        .into_iter()
        .filter(|d| matches!(d, Device::Cuda(_)))
        .collect();
    match choice {
        BackendChoice::Cpu => Ok(Device::Cpu),
        BackendChoice::Cuda(n) => {
            if gpus.contains(&Device::Cuda(n)) {
                Ok(Device::Cuda(n))
            } else if gpus.is_empty() {
                Err(CliError::msg(format!("backend 'cuda': {}", no_cuda_reason())))
            } else {
                let have: Vec<String> = gpus.iter().map(|d| d.to_string()).collect();
                Err(CliError::msg(format!(
                    "backend 'cuda:{n}': no such GPU (found: {})",
                    have.join(", ")
                )))
            }
        }
        BackendChoice::Auto => match gpus.first() {
            Some(&d) => {
                let name = Executor::global()
                    .device_reports()
                    .into_iter()
                    .find(|r| r.device == d)
                    .map(|r| r.capability.name)
                    .unwrap_or_default();
                eprintln!("backend: auto picked {d} ({name})");
                Ok(d)
            }
            None => {
                eprintln!("backend: auto picked cpu ({})", no_cuda_reason());
                Ok(Device::Cpu)
            }
        },
    }
}

/// `--gpu-layers` for a model of `n_layer` layers: `all` puts every layer
/// and the output projection on the GPU (`n_layer + 1`); `auto` is decided
/// by `auto_layers` from the file and the GPU's free memory.
fn gpu_layers(arg: &str, n_layer: usize) -> Result<Option<usize>, CliError> {
    match arg {
        "all" => Ok(Some(n_layer + 1)),
        "auto" => Ok(None),
        n => n
            .parse()
            .map(Some)
            .map_err(|_| CliError::msg(format!("--gpu-layers {n}: expected a number of layers, auto or all"))),
    }
}

/// `-ngl auto`: as many layers (from the last) as fit in `device`'s free
/// memory with their KV cache of the default context, keeping a tenth of
/// it and 256 MiB free for activations and workspace; the output too when
/// everything else fit. Returns the count and a line saying why.
fn auto_layers(path: &Path, exec: &Executor, device: Device) -> Result<(usize, String), CliError> {
    let g = rustorch::gguf::Gguf::open(path).map_err(|e| CliError::msg(format!("{}: {e}", path.display())))?;
    let cfg = rustorch_llm::model::ModelConfig::from_gguf(&g)?;
    let mut layer_bytes = vec![0usize; cfg.n_layer];
    let mut output_bytes = 0usize;
    let tied = !g.tensors().iter().any(|t| t.name() == "output.weight");
    for t in g.tensors() {
        let name = t.name();
        if let Some(rest) = name.strip_prefix("blk.") {
            if let Some(i) = rest.split('.').next().and_then(|i| i.parse::<usize>().ok()) {
                if i < cfg.n_layer {
                    layer_bytes[i] += t.n_bytes();
                }
            }
        } else if name == "output.weight" || name == "output_norm.weight" || (tied && name == "token_embd.weight") {
            output_bytes += t.n_bytes();
        }
    }
    let n_ctx = DEFAULT_CTX.min(cfg.n_ctx_train.max(1));
    let kv_bytes = n_ctx * cfg.n_head_kv * (cfg.head_dim_k + cfg.head_dim_v) * 2;
    let free = exec
        .device_reports()
        .into_iter()
        .find(|r| r.device == device)
        .and_then(|r| r.capability.free_memory)
        .map_or(usize::MAX, |f| f as usize);
    let reserve = free / 10 + (256 << 20);
    let n = Placement::fitting(&layer_bytes, kv_bytes, output_bytes, free, reserve);
    let mib = |b: usize| b as f64 / (1 << 20) as f64;
    let why = format!(
        "-ngl auto: {n} of {} layers fit {device}'s {:.0} MiB free (weights {:.0} MiB, KV cache {:.0} MiB at {n_ctx} positions, {:.0} MiB kept free)",
        cfg.n_layer,
        mib(free),
        mib(layer_bytes.iter().sum::<usize>() + output_bytes),
        mib(kv_bytes * cfg.n_layer),
        mib(reserve)
    );
    Ok((n, why))
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

/// Loads `path` on the device `-b` picks (`-ngl` layers of it on a GPU,
/// the rest on the CPU), showing a per-layer progress bar on a terminal;
/// returns the model and the time it took.
pub fn load(path: &Path, args: &ModelArgs) -> Result<(Model, Duration), CliError> {
    let start = Instant::now();
    let device = pick_device(parse_backend(&args.backend)?)?;
    let bar = ProgressBar::new(1);
    bar.set_style(
        ProgressStyle::with_template("loading {bar:30} {pos}/{len} layers {elapsed}")
            .expect("the template is a valid indicatif template"),
    );
    let global = Executor::global();
    // On the CPU, the model gets the CPU alone: a linked GPU backend would
    // only move activations back and forth.
    let exec = if device.is_cpu() {
        if global.devices().iter().all(|d| d.is_cpu()) {
            global
        } else {
            std::sync::Arc::new(Executor::from_backends(
                global.config().clone(),
                vec![std::sync::Arc::new(rustorch::cpu::CpuBackend::new())],
            ))
        }
    } else {
        // The placement decides where a model's work runs: an op whose
        // inputs all live on the host (a layer -ngl leaves on the CPU)
        // stays there instead of being offloaded for its size, and every
        // other op follows its data to the GPU.
        let mut config = global.config().clone();
        config.min_offload_elems = usize::MAX;
        let backends = global
            .devices()
            .into_iter()
            .filter_map(|d| global.backend(d).cloned())
            .collect();
        std::sync::Arc::new(Executor::from_backends(config, backends))
    };
    if !device.is_cpu() {
        // A first start compiles the GPU's kernels (cached on disk after).
        let spin = ProgressBar::new_spinner();
        spin.set_message(format!("preparing {device} (compiling its kernels on first use)"));
        spin.enable_steady_tick(Duration::from_millis(120));
        let ready = exec
            .backend(device)
            .ok_or_else(|| CliError::msg(format!("{device}: no backend")))?
            .warm_up();
        spin.finish_and_clear();
        ready.map_err(|e| CliError::msg(format!("{device}: {e}")))?;
    }
    // -ngl auto is decided from the file before loading.
    let auto = if !device.is_cpu() && args.gpu_layers == "auto" {
        let (n, why) = auto_layers(path, &exec, device)?;
        eprintln!("{why}");
        Some(n)
    } else {
        None
    };
    let mut layers_arg_error = None;
    let model = Model::load_placed(
        path,
        &exec,
        |cfg| {
            if device.is_cpu() {
                return Placement::all_on(Device::Cpu, cfg.n_layer);
            }
            let n = match gpu_layers(&args.gpu_layers, cfg.n_layer) {
                Ok(n) => n.or(auto).unwrap_or(cfg.n_layer + 1),
                Err(e) => {
                    layers_arg_error = Some(e);
                    0
                }
            };
            Placement::offload(device, n, cfg.n_layer)
        },
        |done, total| {
            bar.set_length(total as u64);
            bar.set_position(done as u64);
        },
    )
    .map_err(|e| CliError::msg(format!("{}: {e}", path.display())))?;
    bar.finish_and_clear();
    if let Some(e) = layers_arg_error {
        return Err(e);
    }
    if !device.is_cpu() {
        let p = model.placement();
        eprintln!(
            "placement: {} of {} layers on {device}{}",
            p.offloaded_layers(),
            p.layers.len(),
            if p.output.is_cpu() {
                ", output on cpu"
            } else {
                ", output too"
            }
        );
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
