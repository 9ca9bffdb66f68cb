//! GGUF models run through RusTorch's tensor ops: the llama and gemma3
//! architectures, a preallocated KV cache, batched prefill and one-token
//! decoding.
//!
//! ```no_run
//! use rustorch_llm::model::{Logits, Model};
//!
//! let model = Model::load("SmolLM2-135M-Instruct.Q4_1.gguf")?;
//! let prompt = model.tokenizer().encode("The capital of France is", true, true);
//! let mut cache = model.new_cache(512)?;
//! let next = model.generate_greedy(&mut cache, &prompt, 8)?;
//! println!("{}", model.tokenizer().decode(&next));
//! # Ok::<(), rustorch_llm::LlmError>(())
//! ```
//!
//! Context policy: a cache holds `n_ctx` positions; a forward pass that
//! would go past them fails with `LlmError::ContextFull` and leaves the
//! cache as it was (callers may `truncate` or `clear` it and go on).

mod config;
mod forward;
mod kv_cache;
mod memory;
mod recorded;
pub use memory::keep_freed_buffers;
mod rope;
mod weights;

pub use config::{Arch, ModelConfig, RopeParams, SlidingWindow};
pub use forward::Logits;
pub use kv_cache::KvCache;
pub use weights::{LayerWeights, Placement, Weights};

use crate::error::Result;
use crate::tokenizer::Tokenizer;
use rustorch::gguf::Gguf;
use rustorch::{Device, Executor};
use std::path::Path;
use std::sync::Arc;

/// A loaded model: configuration, weights, tokenizer, and the executor its
/// ops run on.
pub struct Model {
    config: ModelConfig,
    weights: Weights,
    tokenizer: Tokenizer,
    chat_template: Option<String>,
    name: Option<String>,
    exec: Arc<Executor>,
    placement: Placement,
    /// The recorded decode step, where the model runs on one GPU.
    recorded: recorded::RecordedDecode,
}

/// Metadata arrays the tokenizer copies when it is built; nothing reads them after.
const TOKENIZER_ARRAYS: [&str; 4] = [
    "tokenizer.ggml.tokens",
    "tokenizer.ggml.scores",
    "tokenizer.ggml.token_type",
    "tokenizer.ggml.merges",
];

impl Model {
    /// Loads a GGUF file with the global executor.
    pub fn load(path: impl AsRef<Path>) -> Result<Model> {
        Self::load_with(path, &Executor::global(), |_, _| {})
    }

    /// Loads a GGUF file onto the CPU; `progress(done, total)` is called
    /// per layer.
    pub fn load_with(
        path: impl AsRef<Path>,
        exec: &Arc<Executor>,
        progress: impl FnMut(usize, usize),
    ) -> Result<Model> {
        Self::load_placed(path, exec, |cfg| Placement::all_on(Device::Cpu, cfg.n_layer), progress)
    }

    /// Loads a GGUF file with its parts where `place` puts them, given the
    /// file's configuration (`Placement::offload` is llama.cpp's `-ngl`).
    pub fn load_placed(
        path: impl AsRef<Path>,
        exec: &Arc<Executor>,
        place: impl FnOnce(&ModelConfig) -> Placement,
        progress: impl FnMut(usize, usize),
    ) -> Result<Model> {
        let mut g = Gguf::open(path.as_ref())?;
        let config = ModelConfig::from_gguf(&g)?;
        let tokenizer = Tokenizer::from_gguf(&g)?;
        // The tokenizer now holds what it needs in compact form. Free the
        // parsed arrays (one heap string per token and merge: ~20 MB for
        // Gemma 3) and the header's mapped pages before the weights are
        // copied, so that they do not add to the load's peak memory.
        for key in TOKENIZER_ARRAYS {
            g.remove_metadata(key);
        }
        g.release_header();
        memory::return_freed_heap();
        let placement = place(&config);
        Self::assemble(&g, config, tokenizer, exec, placement, progress)
    }

    /// Builds a model from a parsed file (the file may be dropped after).
    pub fn from_gguf(g: &Gguf, exec: &Arc<Executor>, progress: impl FnMut(usize, usize)) -> Result<Model> {
        let config = ModelConfig::from_gguf(g)?;
        let tokenizer = Tokenizer::from_gguf(g)?;
        let placement = Placement::all_on(Device::Cpu, config.n_layer);
        Self::assemble(g, config, tokenizer, exec, placement, progress)
    }

    /// Loads the weights and completes the model.
    fn assemble(
        g: &Gguf,
        config: ModelConfig,
        tokenizer: Tokenizer,
        exec: &Arc<Executor>,
        placement: Placement,
        progress: impl FnMut(usize, usize),
    ) -> Result<Model> {
        let weights = Weights::load(g, &config, exec, &placement, progress)?;
        let md = g.metadata();
        let text = |k: &str| md.get_str(k).ok().map(str::to_string);
        Ok(Model {
            config,
            weights,
            tokenizer,
            chat_template: text("tokenizer.chat_template"),
            name: text("general.name"),
            exec: exec.clone(),
            placement,
            recorded: Default::default(),
        })
    }

    pub fn config(&self) -> &ModelConfig {
        &self.config
    }
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }
    pub fn weights(&self) -> &Weights {
        &self.weights
    }
    /// Where each part of the model lives.
    pub fn placement(&self) -> &Placement {
        &self.placement
    }
    /// `f()`, a generation loop or any run of passes, as one pass of the
    /// executor (`Executor::run_pass`: the CPU's threads spin for the whole
    /// of it instead of being woken for each step). Nested calls (each
    /// forward pass makes one) run as they are.
    pub fn run_pass<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        self.exec.run_pass(f)
    }

    pub fn executor(&self) -> &Arc<Executor> {
        &self.exec
    }
    /// `tokenizer.chat_template` from the file, if it has one.
    pub fn chat_template(&self) -> Option<&str> {
        self.chat_template.as_deref()
    }
    /// `general.name` from the file, if it has one.
    pub fn name(&self) -> Option<&str> {
        self.name.as_deref()
    }

    /// An empty KV cache for `n_ctx` positions.
    pub fn new_cache(&self, n_ctx: usize) -> Result<KvCache> {
        KvCache::on_devices(&self.config, &self.exec, &self.placement.layers, n_ctx, false)
    }

    /// A cache of `n_ctx` positions for flash attention (llama.cpp's default
    /// on the CPU; `new_cache` reproduces `-fa off`).
    pub fn new_flash_cache(&self, n_ctx: usize) -> Result<KvCache> {
        KvCache::on_devices(&self.config, &self.exec, &self.placement.layers, n_ctx, true)
    }

    /// Logits of the last of `tokens` after running them, as a vector.
    pub fn forward_last(&self, cache: &mut KvCache, tokens: &[u32]) -> Result<Vec<f32>> {
        Ok(self.forward(cache, tokens, Logits::Last)?.to_vec::<f32>()?)
    }

    /// Greedy decoding: runs `prompt` as one batch, then `n` tokens one at
    /// a time, each the argmax of the previous logits (ties go to the
    /// lowest id, as llama.cpp's greedy sampler does). Does not stop at
    /// end-of-generation tokens.
    pub fn generate_greedy(&self, cache: &mut KvCache, prompt: &[u32], n: usize) -> Result<Vec<u32>> {
        // One pass for every step (`run_pass`).
        self.run_pass(|| {
            let mut out = Vec::with_capacity(n);
            let mut logits = self.forward_last(cache, prompt)?;
            for step in 0..n {
                let next = argmax(&logits);
                out.push(next);
                if step + 1 < n {
                    logits = self.forward_last(cache, &[next])?;
                }
            }
            Ok(out)
        })
    }
}

/// Index of the largest value; the first one on ties.
pub fn argmax(xs: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &x) in xs.iter().enumerate() {
        if x > xs[best] {
            best = i;
        }
    }
    best as u32
}
