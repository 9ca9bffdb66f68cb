//! Hyperparameters read from a GGUF file's metadata, the way llama.cpp's
//! `llama_model_loader` reads them (same keys, same defaults).

use crate::error::{LlmError, Result};
use rustorch::gguf::{Gguf, Metadata, Value};
use rustorch::RopeLayout;

/// Architectures this runtime can run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    /// Llama 1/2/3, TinyLlama, SmolLM2, Mistral: pre-norm blocks with
    /// grouped-query attention and a SwiGLU feed-forward.
    Llama,
    /// Gemma 3: QK-norm, post-attention and post-FFN norms, GeGLU, scaled
    /// embeddings, sliding-window attention on most layers.
    Gemma3,
}

impl Arch {
    pub fn name(self) -> &'static str {
        match self {
            Arch::Llama => "llama",
            Arch::Gemma3 => "gemma3",
        }
    }
}

/// Rotary embedding settings for one kind of layer.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RopeParams {
    /// Base of the frequencies (`rope.freq_base`).
    pub base: f32,
    /// Position scale (`1 / rope.scaling.factor` for linear scaling).
    pub freq_scale: f32,
    /// Features rotated per head (the rest pass through).
    pub n_rot: usize,
    pub layout: RopeLayout,
}

/// Sliding-window attention: `is_swa[il]` layers let a query at position
/// p see keys at positions p - window + 1 ..= p.
#[derive(Clone, Debug, PartialEq)]
pub struct SlidingWindow {
    pub window: usize,
    pub is_swa: Vec<bool>,
    /// RoPE of the sliding-window layers (Gemma 3 uses base 10000 there).
    pub rope: RopeParams,
}

#[derive(Clone, Debug, PartialEq)]
pub struct ModelConfig {
    pub arch: Arch,
    pub n_vocab: usize,
    /// Context length the model was trained with.
    pub n_ctx_train: usize,
    pub n_embd: usize,
    pub n_layer: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim_k: usize,
    pub head_dim_v: usize,
    pub n_ff: usize,
    pub rms_eps: f32,
    pub rope: RopeParams,
    pub sliding_window: Option<SlidingWindow>,
    /// Multiplies q k^T (1/sqrt(head_dim) unless the metadata says otherwise).
    pub attn_scale: f32,
    /// Final logits become `cap * tanh(logits / cap)` when set.
    pub final_logit_softcap: Option<f32>,
}

fn key(arch: &str, k: &str) -> String {
    format!("{arch}.{k}")
}

fn bad(key: &str, reason: impl Into<String>) -> LlmError {
    LlmError::BadMetadata {
        key: key.to_string(),
        reason: reason.into(),
    }
}

/// A float metadata value (f32 or f64 in files), if present.
fn opt_f32(md: &Metadata, k: &str) -> Result<Option<f32>> {
    if !md.contains_key(k) {
        return Ok(None);
    }
    match md.get(k)? {
        Value::F32(x) => Ok(Some(*x)),
        Value::F64(x) => Ok(Some(*x as f32)),
        other => Err(bad(k, format!("expected a float, found {}", other.type_desc()))),
    }
}

fn opt_usize(md: &Metadata, k: &str) -> Result<Option<usize>> {
    if !md.contains_key(k) {
        return Ok(None);
    }
    Ok(Some(md.get_usize(k)?))
}

fn req_usize(md: &Metadata, k: &str) -> Result<usize> {
    md.get_usize(k).map_err(LlmError::from)
}

impl ModelConfig {
    pub fn from_gguf(g: &Gguf) -> Result<ModelConfig> {
        let md = g.metadata();
        let arch_name = md.get_str("general.architecture")?;
        let arch = match arch_name {
            "llama" => Arch::Llama,
            "gemma3" => Arch::Gemma3,
            other => {
                return Err(LlmError::UnsupportedArchitecture(other.to_string()));
            }
        };
        let a = arch_name;
        let n_embd = req_usize(md, &key(a, "embedding_length"))?;
        let n_layer = req_usize(md, &key(a, "block_count"))?;
        let n_head = req_usize(md, &key(a, "attention.head_count"))?;
        let n_head_kv = opt_usize(md, &key(a, "attention.head_count_kv"))?.unwrap_or(n_head);
        let n_ff = req_usize(md, &key(a, "feed_forward_length"))?;
        let n_ctx_train = req_usize(md, &key(a, "context_length"))?;
        if n_head == 0 || n_head_kv == 0 || n_head % n_head_kv != 0 {
            return Err(bad(
                &key(a, "attention.head_count_kv"),
                format!("{n_head} query heads are not a multiple of {n_head_kv} key/value heads"),
            ));
        }
        if n_layer == 0 || n_embd == 0 {
            return Err(bad(&key(a, "block_count"), "the model has no layers or no width"));
        }
        let default_head = n_embd / n_head;
        let head_dim_k = opt_usize(md, &key(a, "attention.key_length"))?.unwrap_or(default_head);
        let head_dim_v = opt_usize(md, &key(a, "attention.value_length"))?.unwrap_or(default_head);
        let rms_key = key(a, "attention.layer_norm_rms_epsilon");
        let rms_eps = opt_f32(md, &rms_key)?.ok_or_else(|| bad(&rms_key, "missing"))?;

        let n_rot = opt_usize(md, &key(a, "rope.dimension_count"))?.unwrap_or(head_dim_k);
        if n_rot > head_dim_k || n_rot % 2 != 0 {
            return Err(bad(
                &key(a, "rope.dimension_count"),
                format!("{n_rot} rotated features do not fit heads of {head_dim_k}"),
            ));
        }
        let base = opt_f32(md, &key(a, "rope.freq_base"))?.unwrap_or(10000.0);
        let freq_scale = rope_freq_scale(md, a)?;
        let layout = match arch {
            // convert_hf_to_gguf permutes Llama's q/k weights so that GGML's
            // normal (interleaved) rope applies; Gemma keeps NeoX order.
            Arch::Llama => RopeLayout::Interleaved,
            Arch::Gemma3 => RopeLayout::NeoX,
        };
        let rope = RopeParams {
            base,
            freq_scale,
            n_rot,
            layout,
        };

        let sliding_window = match arch {
            Arch::Gemma3 => match opt_usize(md, &key(a, "attention.sliding_window"))? {
                Some(w) if w > 0 => {
                    let pattern = opt_usize(md, &key(a, "attention.sliding_window_pattern"))?.unwrap_or(6);
                    // llama_hparams::set_swa_pattern: every pattern-th layer
                    // (the last of each group) attends globally.
                    let is_swa = (0..n_layer)
                        .map(|il| pattern == 0 || il % pattern < pattern - 1)
                        .collect();
                    let swa_base = opt_f32(md, &key(a, "rope.freq_base_swa"))?.unwrap_or(10000.0);
                    Some(SlidingWindow {
                        window: w,
                        is_swa,
                        rope: RopeParams {
                            base: swa_base,
                            freq_scale: 1.0,
                            ..rope
                        },
                    })
                }
                _ => None,
            },
            Arch::Llama => None,
        };

        let attn_scale = match opt_f32(md, &key(a, "attention.scale"))? {
            Some(s) if s != 0.0 => s,
            _ => match arch {
                // llama_model_gemma3::load_arch_hparams: 27B (62 layers)
                // scales by the hidden size per head, the rest by head_dim.
                Arch::Gemma3 if n_layer == 62 => 1.0 / ((n_embd / n_head) as f32).sqrt(),
                _ => 1.0 / (head_dim_k as f32).sqrt(),
            },
        };
        let final_logit_softcap = opt_f32(md, &key(a, "final_logit_softcapping"))?.filter(|&c| c != 0.0);

        let n_vocab = g
            .tensor_info("token_embd.weight")
            .map(|t| t.shape()[0])
            .map_err(|_| LlmError::MissingTensor("token_embd.weight".into()))?;
        Ok(ModelConfig {
            arch,
            n_vocab,
            n_ctx_train,
            n_embd,
            n_layer,
            n_head,
            n_head_kv,
            head_dim_k,
            head_dim_v,
            n_ff,
            rms_eps,
            rope,
            sliding_window,
            attn_scale,
            final_logit_softcap,
        })
    }

    /// RoPE settings of layer `il`.
    pub fn rope_for_layer(&self, il: usize) -> RopeParams {
        match &self.sliding_window {
            Some(sw) if sw.is_swa[il] => sw.rope,
            _ => self.rope,
        }
    }

    /// The window of layer `il`, if it attends through one.
    pub fn window_for_layer(&self, il: usize) -> Option<usize> {
        match &self.sliding_window {
            Some(sw) if sw.is_swa[il] => Some(sw.window),
            _ => None,
        }
    }
}

/// `rope.scaling.*`: linear scaling divides positions by the factor; YaRN
/// and the others are refused rather than silently ignored.
fn rope_freq_scale(md: &Metadata, a: &str) -> Result<f32> {
    let type_key = key(a, "rope.scaling.type");
    let kind = if md.contains_key(&type_key) {
        md.get_str(&type_key)?.to_string()
    } else {
        "none".to_string()
    };
    let factor = opt_f32(md, &key(a, "rope.scaling.factor"))?.unwrap_or(0.0);
    match kind.as_str() {
        "none" => Ok(1.0),
        "linear" => {
            if factor > 0.0 {
                Ok(1.0 / factor)
            } else {
                Ok(1.0)
            }
        }
        other => Err(LlmError::Unsupported(format!(
            "rope scaling type '{other}' ({type_key}) is not supported yet"
        ))),
    }
}
