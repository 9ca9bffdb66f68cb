//! `rustorch-cli`: the RusTorch command line.
//!
//! Running with `-p PROMPT` (and `-m MODEL`, or nothing for the default
//! model) and no subcommand generates text (`generate`). Subcommands:
//! `chat` (interactive conversation), `tokenize`, `perplexity`, `bench`
//! (llama.cpp's tools' protocols and output shapes), `info` (a GGUF file's
//! metadata and tensors), `devices` (what the executor detects),
//! `quantize` (F32/F16/BF16 models to GGML quantized types and llama.cpp's
//! mixes), `membw` (memory read bandwidth, the bound of generation speed).

mod bench;
mod chat;
mod cli;
mod devices;
mod error;
mod fetch;
mod format;
mod generate;
mod greedy;
mod info;
mod interrupt;
mod loader;
mod membw;
mod perplexity;
mod quantize;
mod stream;
mod threads;
mod token_reads;
mod tokenize;

use clap::Parser;
use cli::{Cli, Command};
use error::CliError;
use std::process::ExitCode;

/// Freed small and mid-sized blocks stay with their thread for the next op
/// (see `block_cache`): a decode step's hundreds of small ops spent a third
/// of their framework time in glibc's shared bins.
#[global_allocator]
static ALLOCATOR: rustorch::cpu::block_cache::BlockCache = rustorch::cpu::block_cache::BlockCache;

fn main() -> ExitCode {
    exit_quietly_on_closed_pipe();
    // llama.cpp spells --flash-attn `-fa`, --ubatch-size `-ub` and
    // --gpu-layers `-ngl`, which clap would read as several short flags.
    let args = std::env::args_os().map(|a| match a.to_str() {
        Some("-fa") => "--flash-attn".into(),
        Some("-ngl") => "--gpu-layers".into(),
        Some("-ub") => "--ubatch-size".into(),
        _ => a,
    });
    let cli = match Cli::try_parse_from(args) {
        Ok(c) => c,
        Err(e) => {
            // --help and --version come here too, with exit code 0.
            let _ = e.print();
            return ExitCode::from(u8::try_from(e.exit_code()).unwrap_or(2));
        }
    };
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `rustorch-cli devices | head` closes stdout early: end quietly as other
/// command-line tools do (the default SIGPIPE action), not with a panic
/// from `println!` (Rust ignores SIGPIPE, so each write would fail).
fn exit_quietly_on_closed_pipe() {
    #[cfg(unix)]
    // SAFETY: restores the default action of one signal before any thread
    // starts; no handler of ours is involved.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

fn run(cli: Cli) -> Result<(), CliError> {
    check_ggml_order()?;
    check_ggml_half()?;
    rustorch_llm::model::keep_freed_buffers();
    match cli.command {
        Some(Command::Info(args)) => info::run(&args),
        Some(Command::Devices) => devices::run(),
        Some(Command::Quantize(args)) => quantize::run(&args),
        Some(Command::Tokenize(args)) => tokenize::run(&args),
        Some(Command::Perplexity(args)) => perplexity::run(&args),
        Some(Command::Bench(args)) => bench::run(&args),
        Some(Command::Chat(args)) => chat::run(&args),
        Some(Command::Membw(args)) => membw::run(&args),
        Some(Command::Greedy(args)) => greedy::run(&args),
        None => generate::run(&cli.generate),
    }
}

/// `RUSTORCH_GGML_ORDER`, when set, must name an order (the library reads an
/// unknown value as the default; here it is an error, not a silent default).
/// Unset, the order is llama.cpp's on this CPU when built natively: its AMX
/// build's where the CPU has AMX-INT8, the plain one elsewhere.
fn check_ggml_order() -> Result<(), CliError> {
    use rustorch::cpu::qmatmul::{set_default_ggml_order, GgmlOrder};
    match std::env::var("RUSTORCH_GGML_ORDER") {
        Ok(v) if GgmlOrder::parse(&v).is_none() => Err(CliError::msg(format!(
            "RUSTORCH_GGML_ORDER={v:?} is not an order: use amx (llama.cpp's AMX build, the default on CPUs with AMX) or reference (its plain CPU build, the default elsewhere)"
        ))),
        _ => {
            set_default_ggml_order(GgmlOrder::native());
            Ok(())
        }
    }
}

/// `RUSTORCH_GGML_F16`, when set, must name an arithmetic. Unset, it is
/// llama.cpp's on this CPU when built natively: half-precision steps where
/// the CPU has AVX512-FP16 (`__AVX512FP16__`), widened steps elsewhere.
fn check_ggml_half() -> Result<(), CliError> {
    use rustorch::cpu::{set_default_ggml_half, GgmlHalf};
    match std::env::var("RUSTORCH_GGML_F16") {
        Ok(v) if GgmlHalf::parse(&v).is_none() => Err(CliError::msg(format!(
            "RUSTORCH_GGML_F16={v:?} is not an f16 arithmetic: use native (llama.cpp built with AVX512-FP16, the default on CPUs that have it) or widened (builds without it, the default elsewhere)"
        ))),
        _ => {
            set_default_ggml_half(GgmlHalf::native());
            Ok(())
        }
    }
}
