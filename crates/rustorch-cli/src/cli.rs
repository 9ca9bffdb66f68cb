//! Command-line grammar.
//!
//! Generation is the default command (`rustorch-cli -m MODEL -p PROMPT`),
//! so its options live at the top level; every other action is a
//! subcommand. Options of one do not mix with the other
//! (`args_conflicts_with_subcommands`).

use clap::{Args, Parser, Subcommand};
use std::path::PathBuf;

#[derive(Parser, Debug)]
#[command(
    name = "rustorch-cli",
    version,
    about = "RusTorch: run, inspect and quantize GGUF models",
    args_conflicts_with_subcommands = true
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,

    #[command(flatten)]
    pub generate: GenerateArgs,
}

/// Options of the default command, text generation.
#[derive(Args, Debug, Default)]
pub struct GenerateArgs {
    /// Model file (GGUF) to generate with
    #[arg(short = 'm', long, value_name = "MODEL")]
    pub model: Option<PathBuf>,

    /// Prompt to continue
    #[arg(short = 'p', long, value_name = "PROMPT")]
    pub prompt: Option<String>,

    /// Tokens to generate (at most; generation also stops at end-of-generation tokens)
    #[arg(short = 'n', long = "n-predict", value_name = "N", default_value_t = 128)]
    pub n_predict: usize,

    /// Device: cpu or auto (GPU backends are not compiled in yet)
    #[arg(short = 'b', long, value_name = "BACKEND", default_value = "auto")]
    pub backend: String,

    /// CPU threads (default: all cores)
    #[arg(short = 't', long, value_name = "N")]
    pub threads: Option<usize>,

    /// Context size in tokens (default: 4096, or the model's training context if smaller)
    #[arg(short = 'c', long = "ctx-size", value_name = "N")]
    pub ctx_size: Option<usize>,

    /// Sampling temperature (0 = greedy)
    #[arg(long, default_value_t = 0.8)]
    pub temp: f32,

    /// Top-k sampling (0 = off)
    #[arg(long, default_value_t = 40)]
    pub top_k: i32,

    /// Top-p (nucleus) sampling (1.0 = off)
    #[arg(long, default_value_t = 0.95)]
    pub top_p: f32,

    /// Min-p sampling (0.0 = off)
    #[arg(long, default_value_t = 0.05)]
    pub min_p: f32,

    /// Repetition penalty over the last 64 tokens (1.0 = off)
    #[arg(long, default_value_t = 1.0)]
    pub repeat_penalty: f32,

    /// Random seed (default: random, printed at the end)
    #[arg(long)]
    pub seed: Option<u32>,

    /// Stop when the output contains this text (repeatable)
    #[arg(long = "stop", value_name = "TEXT")]
    pub stop: Vec<String>,

    /// Wrap the prompt as a user message in the model's chat template
    #[arg(long)]
    pub chat: bool,

    /// Chat template to use instead of the model's (Jinja source, or "chatml"); implies --chat
    #[arg(long, value_name = "TEMPLATE")]
    pub chat_template: Option<String>,

    /// Print the executor's trace (where each op ran) after generating
    #[arg(long)]
    pub verbose: bool,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Print a GGUF file's header, metadata, tensor table and per-type sizes
    Info(InfoArgs),
    /// List the devices the executor detects and the backends compiled in
    Devices,
    /// Convert an F32/F16/BF16 model (or, with --allow-requantize, a quantized
    /// one) to a quantized type or llama.cpp mix
    Quantize(QuantizeArgs),
}

#[derive(Args, Debug)]
pub struct InfoArgs {
    /// GGUF file
    pub file: PathBuf,

    /// Print arrays whole instead of their first entries
    #[arg(long)]
    pub all: bool,
}

#[derive(Args, Debug)]
pub struct QuantizeArgs {
    /// Input model (GGUF with F32, F16 or BF16 weights; quantized weights
    /// need --allow-requantize)
    pub input: PathBuf,

    /// Output file
    pub output: PathBuf,

    /// Target: Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q2_K Q3_K_S Q3_K_M Q3_K_L Q4_K_S Q4_K_M
    /// Q5_K_S Q5_K_M Q6_K IQ4_NL IQ4_XS F16 BF16 F32 (Q3_K, Q4_K, Q5_K are
    /// Q3_K_M, Q4_K_M, Q5_K_M, as in llama-quantize)
    #[arg(value_name = "TYPE")]
    pub qtype: String,

    /// Worker threads (default: all cores)
    #[arg(long, short = 't', value_name = "N")]
    pub threads: Option<usize>,

    /// Give every quantizable tensor TYPE, with no per-tensor mix (as
    /// llama-quantize --pure)
    #[arg(long)]
    pub pure: bool,

    /// Keep output.weight as it is (as llama-quantize --leave-output-tensor)
    #[arg(long)]
    pub leave_output_tensor: bool,

    /// Accept an already quantized model: its tensors are dequantized to
    /// f32 and quantized again (as llama-quantize --allow-requantize)
    #[arg(long)]
    pub allow_requantize: bool,
}
