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

/// Options of the default command, text generation (not implemented yet).
#[derive(Args, Debug, Default)]
pub struct GenerateArgs {
    /// Model file (GGUF) to generate with
    #[arg(short = 'm', long, value_name = "MODEL")]
    pub model: Option<PathBuf>,

    /// Prompt to continue
    #[arg(short = 'p', long, value_name = "PROMPT")]
    pub prompt: Option<String>,
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
