//! Quantization mixes: which GGML type each tensor of a model gets when the
//! model is quantized to a llama.cpp file type (`Q4_K_M`, `Q5_K_S`, ...).
//!
//! This follows `llama_tensor_get_type` in llama.cpp's
//! `src/llama-quant.cpp` (the version the project pins, 0.3.36) rule for
//! rule, without an importance matrix and without user overrides of single
//! tensors: the choice depends on the tensor's name and category, its layer
//! (counted in the order llama.cpp visits tensors), the number of layers,
//! the number of experts, grouped-query attention, and falls back to a type
//! with smaller blocks when a row is not a whole number of blocks.
//! Architecture-specific rules are modeled for llama (including the 70B
//! rule) and Falcon; other architectures get the generic rules.
//!
//! ```
//! use rustorch_quantize::mix::{choose_types, FileType, MixOptions, ModelParams, TensorDesc};
//! use rustorch_core::quant::QType;
//! let params = ModelParams { arch: "llama".into(), n_layer: 1, n_head: 8, n_head_kv: 2, n_expert: 0 };
//! let tensors = [
//!     TensorDesc { name: "blk.0.attn_v.weight", dims: &[256, 64], qtype: QType::F16 },
//!     TensorDesc { name: "blk.0.attn_norm.weight", dims: &[256], qtype: QType::F32 },
//! ];
//! let types = choose_types(FileType::Q4KM, &params, &tensors, &MixOptions::default())?;
//! assert_eq!(types[0].qtype, QType::Q6K);   // use_more_bits: first layer
//! assert_eq!(types[1].qtype, QType::F32);   // norms are never quantized
//! # Ok::<(), rustorch_quantize::mix::MixError>(())
//! ```

use rustorch_core::quant::QType;
use std::cmp::Ordering;
use std::fmt;

/// `GGML_QNT_VERSION`: what quantizers write as `general.quantization_version`.
pub const QUANTIZATION_VERSION: u32 = 2;

/// A llama.cpp file type (`llama_ftype`, stored as `general.file_type`),
/// restricted to the ones whose every tensor type this library can
/// quantize without an importance matrix.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FileType {
    AllF32,
    F16,
    Q4_0,
    Q4_1,
    Q8_0,
    Q5_0,
    Q5_1,
    Q2K,
    Q3KS,
    Q3KM,
    Q3KL,
    Q4KS,
    Q4KM,
    Q5KS,
    Q5KM,
    Q6K,
    IQ4NL,
    IQ4XS,
    BF16,
}

impl FileType {
    pub const ALL: [FileType; 19] = [
        FileType::AllF32,
        FileType::F16,
        FileType::BF16,
        FileType::Q4_0,
        FileType::Q4_1,
        FileType::Q5_0,
        FileType::Q5_1,
        FileType::Q8_0,
        FileType::Q2K,
        FileType::Q3KS,
        FileType::Q3KM,
        FileType::Q3KL,
        FileType::Q4KS,
        FileType::Q4KM,
        FileType::Q5KS,
        FileType::Q5KM,
        FileType::Q6K,
        FileType::IQ4NL,
        FileType::IQ4XS,
    ];

    /// The `llama_ftype` value written as `general.file_type`.
    pub fn id(self) -> u32 {
        match self {
            FileType::AllF32 => 0,
            FileType::F16 => 1,
            FileType::Q4_0 => 2,
            FileType::Q4_1 => 3,
            FileType::Q8_0 => 7,
            FileType::Q5_0 => 8,
            FileType::Q5_1 => 9,
            FileType::Q2K => 10,
            FileType::Q3KS => 11,
            FileType::Q3KM => 12,
            FileType::Q3KL => 13,
            FileType::Q4KS => 14,
            FileType::Q4KM => 15,
            FileType::Q5KS => 16,
            FileType::Q5KM => 17,
            FileType::Q6K => 18,
            FileType::IQ4NL => 25,
            FileType::IQ4XS => 30,
            FileType::BF16 => 32,
        }
    }

    /// The name `llama-quantize` takes.
    pub fn name(self) -> &'static str {
        match self {
            FileType::AllF32 => "F32",
            FileType::F16 => "F16",
            FileType::BF16 => "BF16",
            FileType::Q4_0 => "Q4_0",
            FileType::Q4_1 => "Q4_1",
            FileType::Q5_0 => "Q5_0",
            FileType::Q5_1 => "Q5_1",
            FileType::Q8_0 => "Q8_0",
            FileType::Q2K => "Q2_K",
            FileType::Q3KS => "Q3_K_S",
            FileType::Q3KM => "Q3_K_M",
            FileType::Q3KL => "Q3_K_L",
            FileType::Q4KS => "Q4_K_S",
            FileType::Q4KM => "Q4_K_M",
            FileType::Q5KS => "Q5_K_S",
            FileType::Q5KM => "Q5_K_M",
            FileType::Q6K => "Q6_K",
            FileType::IQ4NL => "IQ4_NL",
            FileType::IQ4XS => "IQ4_XS",
        }
    }

    /// Parses a name as `llama-quantize` does: case-insensitive, with its
    /// aliases `Q3_K` = `Q3_K_M`, `Q4_K` = `Q4_K_M`, `Q5_K` = `Q5_K_M`.
    pub fn parse(s: &str) -> Option<FileType> {
        let up = s.to_ascii_uppercase();
        match up.as_str() {
            "Q3_K" => return Some(FileType::Q3KM),
            "Q4_K" => return Some(FileType::Q4KM),
            "Q5_K" => return Some(FileType::Q5KM),
            _ => {}
        }
        FileType::ALL.iter().copied().find(|f| f.name() == up)
    }

    pub fn from_id(id: u32) -> Option<FileType> {
        FileType::ALL.iter().copied().find(|f| f.id() == id)
    }

    /// `llama_ftype_get_default_type`: the type most tensors get.
    pub fn default_type(self) -> QType {
        match self {
            FileType::AllF32 => QType::F32,
            FileType::F16 => QType::F16,
            FileType::BF16 => QType::BF16,
            FileType::Q4_0 => QType::Q4_0,
            FileType::Q4_1 => QType::Q4_1,
            FileType::Q5_0 => QType::Q5_0,
            FileType::Q5_1 => QType::Q5_1,
            FileType::Q8_0 => QType::Q8_0,
            FileType::Q2K => QType::Q2K,
            FileType::Q3KS | FileType::Q3KM | FileType::Q3KL => QType::Q3K,
            FileType::Q4KS | FileType::Q4KM => QType::Q4K,
            FileType::Q5KS | FileType::Q5KM => QType::Q5K,
            FileType::Q6K => QType::Q6K,
            FileType::IQ4NL => QType::IQ4NL,
            FileType::IQ4XS => QType::IQ4XS,
        }
    }
}

impl fmt::Display for FileType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The hyperparameters the rules look at.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelParams {
    /// `general.architecture`.
    pub arch: String,
    /// `{arch}.block_count`.
    pub n_layer: usize,
    /// `{arch}.attention.head_count` (of layer 0 when it is per layer).
    pub n_head: usize,
    /// `{arch}.attention.head_count_kv`; `n_head` when absent.
    pub n_head_kv: usize,
    /// `{arch}.expert_count`; 0 when absent.
    pub n_expert: usize,
}

impl ModelParams {
    /// `hparams.n_gqa()`: query heads per key/value head, 0 without kv heads.
    pub fn n_gqa(&self) -> usize {
        self.n_head.checked_div(self.n_head_kv).unwrap_or(0)
    }

    /// llama.cpp's `LLM_TYPE_70B` for llama: 80 layers with grouped-query
    /// attention (80 layers without it is the 65B).
    fn is_llama_70b(&self) -> bool {
        self.arch == "llama" && self.n_layer == 80 && self.n_head != self.n_head_kv
    }

    fn is_falcon(&self) -> bool {
        self.arch == "falcon"
    }
}

/// A tensor as the rules see it: `dims` in GGUF order (`dims[0]` is the row
/// length) and its current type.
#[derive(Clone, Copy, Debug)]
pub struct TensorDesc<'a> {
    pub name: &'a str,
    pub dims: &'a [u64],
    pub qtype: QType,
}

/// The options of `llama_model_quantize_params` that change types.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MixOptions {
    /// `--pure`: every quantizable tensor gets the default type (still
    /// subject to the block-size fallback).
    pub pure: bool,
    /// `--leave-output-tensor` is `quantize_output_tensor = false`.
    pub quantize_output_tensor: bool,
    /// `--output-tensor-type`.
    pub output_tensor_type: Option<QType>,
    /// `--token-embedding-type`.
    pub token_embedding_type: Option<QType>,
}

impl Default for MixOptions {
    fn default() -> Self {
        MixOptions {
            pure: false,
            quantize_output_tensor: true,
            output_tensor_type: None,
            token_embedding_type: None,
        }
    }
}

/// The type chosen for one tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TypeChoice {
    pub qtype: QType,
    /// Whether the rules' type did not fit the row length and a type with
    /// smaller blocks (or F16) was taken instead.
    pub fallback: bool,
}

/// Why types could not be chosen.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum MixError {
    #[error("tensor {name}: cannot tell its layer (expected a name starting with \"blk.N.\")")]
    NoLayer { name: String },
    #[error("tensor {name}: layer {layer} is not below the model's {n_layer} layers")]
    BadLayer { name: String, layer: i64, n_layer: usize },
    #[error("tensor {name}: no fallback is defined for type {qtype} when rows of {ncols} are not whole blocks")]
    NoFallback { name: String, qtype: QType, ncols: u64 },
}

/// The broad categories of `tensor_get_category`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Category {
    TokenEmbd,
    AttnQ,
    AttnV,
    AttnK,
    AttnQkv,
    AttnKvB,
    AttnOutput,
    FfnUp,
    FfnGate,
    FfnDown,
    Output,
    Other,
}

fn category(name: &str) -> Category {
    if name == "output.weight" {
        return Category::Output;
    }
    if name == "token_embd.weight" || name == "per_layer_token_embd.weight" {
        return Category::TokenEmbd;
    }
    // Substring tests in llama.cpp's order: the first match wins.
    const TABLE: [(&str, Category); 10] = [
        ("attn_qkv.weight", Category::AttnQkv),
        ("attn_kv_b.weight", Category::AttnKvB),
        ("attn_v.weight", Category::AttnV),
        ("attn_k.weight", Category::AttnK),
        ("attn_q.weight", Category::AttnQ),
        ("attn_output.weight", Category::AttnOutput),
        ("ffn_up", Category::FfnUp),
        ("ffn_gate", Category::FfnGate),
        ("ffn_down", Category::FfnDown),
        ("", Category::Other),
    ];
    TABLE
        .iter()
        .find(|(pat, _)| name.contains(pat))
        .map_or(Category::Other, |&(_, c)| c)
}

fn is_attn_v_like(c: Category) -> bool {
    matches!(c, Category::AttnV | Category::AttnQkv | Category::AttnKvB)
}

/// `tensor_allows_quantization`: 2-D and larger tensors named `*weight`,
/// minus norms, expert routers and a list of small or special tensors.
pub fn allows_quantization(name: &str, n_dims: usize, opts: &MixOptions) -> bool {
    if n_dims < 2 {
        return false;
    }
    // llama.cpp tests `name.rfind("weight") == name.size() - 6`; for names
    // shorter than 6 bytes both sides are `npos`, so those pass too.
    let mut q = name.ends_with("weight") || name.len() == 5;
    q &= !name.contains("_norm.weight");
    q &= opts.quantize_output_tensor || name != "output.weight";
    const EXCLUDED: [&str; 36] = [
        "ffn_gate_inp.weight",
        "ffn_gate_tid2eid.weight",
        "altup",
        "laurel",
        "per_layer_model_proj",
        "ssm_conv1d",
        "shortconv.conv.weight",
        "indexer.k_proj.weight",
        "indexer.q_proj.weight",
        "time_mix_first.weight",
        "time_mix_w0.weight",
        "time_mix_w1.weight",
        "time_mix_w2.weight",
        "time_mix_v0.weight",
        "time_mix_v1.weight",
        "time_mix_v2.weight",
        "time_mix_a0.weight",
        "time_mix_a1.weight",
        "time_mix_a2.weight",
        "time_mix_g1.weight",
        "time_mix_g2.weight",
        "time_mix_decay_w1.weight",
        "time_mix_decay_w2.weight",
        "time_mix_lerp_fused.weight",
        "attn_rel_b.weight",
        ".position_embd",
        "sam.pos_embd",
        "sam.neck.",
        "sam.net_",
        ".rel_pos",
        ".patch_embd",
        ".patch_merger",
        "a.rvq.codebook",
        "mm.a.code_embd",
        // Whole names below (positional embeddings and BERT token types);
        // a substring test is exact for them since both end in ".weight".
        "\0position_embd.weight",
        "\0token_types.weight",
    ];
    for pat in EXCLUDED {
        match pat.strip_prefix('\0') {
            Some(whole) => q &= name != whole,
            None => q &= !name.contains(pat),
        }
    }
    q
}

/// The order in which llama.cpp visits (and writes) tensors: its
/// `weights_map` sorts by layer (`blk.N.`, tensors outside layers first)
/// and then by name, bytewise.
pub fn llama_order(a: &str, b: &str) -> Ordering {
    layer_of(a)
        .unwrap_or(-1)
        .cmp(&layer_of(b).unwrap_or(-1))
        .then_with(|| a.as_bytes().cmp(b.as_bytes()))
}

/// `sscanf(name, "blk.%d.", &layer)`: the number after `blk.`, which must
/// be followed by a dot for the layer to count. Like `%d` it takes an
/// optional sign and skips leading whitespace.
fn layer_of(name: &str) -> Option<i64> {
    let rest = name.strip_prefix("blk.")?;
    let rest = rest.trim_start_matches([' ', '\t', '\n', '\r', '\x0b', '\x0c']);
    let (neg, digits) = match rest.as_bytes().first() {
        Some(b'-') => (true, &rest[1..]),
        Some(b'+') => (false, &rest[1..]),
        _ => (false, rest),
    };
    let end = digits.bytes().take_while(u8::is_ascii_digit).count();
    if end == 0 {
        return None;
    }
    // An out-of-range number is not a layer of any real model; treat it as
    // none rather than wrapping like C.
    let v: i64 = digits[..end].parse().ok()?;
    Some(if neg { -v } else { v })
}

/// The counters of `quantize_state_impl`.
struct State<'p> {
    params: &'p ModelParams,
    ftype: FileType,
    n_attention_wv: usize,
    i_attention_wv: usize,
    i_ffn_down: usize,
    i_ffn_gate: usize,
    i_ffn_up: usize,
    has_tied_embeddings: bool,
}

fn use_more_bits(i_layer: i64, n_layers: i64) -> bool {
    i_layer < n_layers / 8 || i_layer >= 7 * n_layers / 8 || (i_layer - n_layers / 8) % 3 == 2
}

impl State<'_> {
    /// `layer_info`: the counter's value, or with experts the layer parsed
    /// from the name (experts of one layer are not necessarily adjacent).
    fn layer_info(&self, counter: usize, name: &str) -> Result<(i64, i64), MixError> {
        let n_layer = self.params.n_layer as i64;
        if self.params.n_expert.max(1) > 1 {
            let layer = layer_of(name).ok_or_else(|| MixError::NoLayer { name: name.to_string() })?;
            if layer < 0 || layer >= n_layer {
                return Err(MixError::BadLayer {
                    name: name.to_string(),
                    layer,
                    n_layer: self.params.n_layer,
                });
            }
            return Ok((layer, n_layer));
        }
        Ok((counter as i64, n_layer))
    }

    /// `llama_tensor_get_type_impl` for the file types of [`FileType`]
    /// (branches for IQ1/IQ2/IQ3 and MXFP4 file types cannot be reached).
    fn rules(&mut self, mut t: QType, name: &str, ne0: u64, cat: Category) -> Result<QType, MixError> {
        use FileType as F;
        let ftype = self.ftype;
        let p = self.params;
        let falcon = p.is_falcon();
        if cat == Category::Output || (self.has_tied_embeddings && cat == Category::TokenEmbd) {
            // Tied embeddings: the token embeddings are the output matrix.
            if falcon || !ne0.is_multiple_of(t.block_size() as u64) {
                t = QType::Q8_0;
            } else if t != QType::Q8_0 {
                t = QType::Q6K;
            }
        } else if cat == Category::TokenEmbd {
            // Only IQ and ternary file types change the token embeddings.
        } else if is_attn_v_like(cat) {
            let gqa4 = p.n_gqa() >= 4;
            match ftype {
                F::Q2K => t = if gqa4 { QType::Q4K } else { QType::Q3K },
                F::Q3KM => {
                    t = if self.i_attention_wv < 2 {
                        QType::Q5K
                    } else {
                        QType::Q4K
                    }
                }
                F::Q3KL => t = QType::Q5K,
                F::IQ4NL | F::IQ4XS if gqa4 => t = QType::Q5K,
                F::Q4KM | F::Q5KM if use_more_bits(self.i_attention_wv as i64, self.n_attention_wv as i64) => {
                    t = QType::Q6K
                }
                F::Q4KS if self.i_attention_wv < 4 => t = QType::Q5K,
                _ => {}
            }
            if p.is_llama_70b() && matches!(t, QType::Q3K | QType::Q4K) {
                // 8 query heads share each value head: more bits cost little.
                t = QType::Q5K;
            }
            if p.n_expert == 8 {
                t = QType::Q8_0;
            }
            self.i_attention_wv += 1;
        } else if cat == Category::AttnK {
            if p.n_expert == 8 {
                t = QType::Q8_0;
            }
        } else if cat == Category::AttnQ {
            // Only IQ3 file types change it.
        } else if cat == Category::FfnDown {
            let (i_layer, n_layer) = self.layer_info(self.i_ffn_down, name)?;
            match ftype {
                F::Q2K => t = QType::Q3K,
                F::Q3KM => {
                    t = if i_layer < n_layer / 16 {
                        QType::Q5K
                    } else if !falcon || use_more_bits(i_layer, n_layer) {
                        QType::Q4K
                    } else {
                        QType::Q3K
                    }
                }
                F::Q3KL => t = if falcon { QType::Q4K } else { QType::Q5K },
                F::Q4KM => {
                    if falcon {
                        t = if i_layer < n_layer / 16 {
                            QType::Q6K
                        } else if use_more_bits(i_layer, n_layer) {
                            QType::Q5K
                        } else {
                            QType::Q4K
                        };
                    } else if use_more_bits(i_layer, n_layer) {
                        t = QType::Q6K;
                    }
                }
                // Without an imatrix; with one, llama.cpp skips this.
                F::IQ4NL | F::IQ4XS if i_layer < n_layer / 8 => t = QType::Q5K,
                F::Q5KM if use_more_bits(i_layer, n_layer) => t = QType::Q6K,
                F::Q4KS if !falcon && i_layer < n_layer / 8 => t = QType::Q5K,
                _ => {}
            }
            self.i_ffn_down += 1;
        } else if cat == Category::AttnOutput {
            if !falcon {
                if p.n_expert == 8 {
                    if matches!(
                        ftype,
                        F::Q2K | F::Q3KS | F::Q3KM | F::IQ4NL | F::Q4KS | F::Q4KM | F::IQ4XS
                    ) {
                        t = QType::Q5K;
                    }
                } else {
                    match ftype {
                        F::Q2K => t = QType::Q3K,
                        F::Q3KM => t = QType::Q4K,
                        F::Q3KL => t = QType::Q5K,
                        _ => {}
                    }
                }
            } else if ftype == F::Q3KL {
                t = QType::Q4K;
            }
        } else if cat == Category::AttnQkv {
            match ftype {
                F::Q3KM | F::Q3KL => t = QType::Q4K,
                F::Q4KM => t = QType::Q5K,
                F::Q5KM => t = QType::Q6K,
                _ => {}
            }
        } else if cat == Category::FfnGate {
            // Only IQ3_XS changes it, but the layer is still checked.
            self.layer_info(self.i_ffn_gate, name)?;
            self.i_ffn_gate += 1;
        } else if cat == Category::FfnUp {
            self.layer_info(self.i_ffn_up, name)?;
            self.i_ffn_up += 1;
        }
        Ok(t)
    }
}

/// `tensor_type_fallback`: a type whose blocks fit rows of `ncols`.
fn fallback(name: &str, t: QType, ncols: u64) -> Result<(QType, bool), MixError> {
    let qk = t.block_size() as u64;
    if ncols.is_multiple_of(qk) {
        return Ok((t, false));
    }
    let mut r = match t {
        QType::IQ1S
        | QType::IQ1M
        | QType::IQ2XXS
        | QType::IQ2XS
        | QType::IQ2S
        | QType::IQ3XXS
        | QType::IQ3S
        | QType::IQ4XS => QType::IQ4NL,
        QType::Q2K | QType::Q3K | QType::TQ1_0 | QType::TQ2_0 => QType::Q4_0,
        QType::Q4K => QType::Q5_0,
        QType::Q5K => QType::Q5_1,
        QType::Q6K => QType::Q8_0,
        // A 32-element type has nothing smaller to go to: F16 below.
        _ if qk <= 32 => t,
        _ => {
            return Err(MixError::NoFallback {
                name: name.to_string(),
                qtype: t,
                ncols,
            })
        }
    };
    if !ncols.is_multiple_of(r.block_size() as u64) {
        r = QType::F16;
    }
    Ok((r, true))
}

/// The type of every tensor when a model is quantized to `ftype`, as
/// `llama-quantize` picks it. `tensors` may be in any order: the layer
/// counters follow llama.cpp's order ([`llama_order`]); the result is in
/// the order of `tensors`.
pub fn choose_types(
    ftype: FileType,
    params: &ModelParams,
    tensors: &[TensorDesc<'_>],
    opts: &MixOptions,
) -> Result<Vec<TypeChoice>, MixError> {
    let mut order: Vec<usize> = (0..tensors.len()).collect();
    order.sort_by(|&a, &b| llama_order(tensors[a].name, tensors[b].name));

    let cats: Vec<Category> = tensors.iter().map(|t| category(t.name)).collect();
    let mut st = State {
        params,
        ftype,
        n_attention_wv: cats.iter().filter(|&&c| is_attn_v_like(c)).count(),
        i_attention_wv: 0,
        i_ffn_down: 0,
        i_ffn_gate: 0,
        i_ffn_up: 0,
        has_tied_embeddings: !cats.contains(&Category::Output),
    };
    let default = ftype.default_type();
    let mut out = vec![
        TypeChoice {
            qtype: QType::F32,
            fallback: false
        };
        tensors.len()
    ];
    for i in order {
        let t = &tensors[i];
        let cat = cats[i];
        out[i] = if !allows_quantization(t.name, t.dims.len(), opts) {
            TypeChoice {
                qtype: t.qtype,
                fallback: false,
            }
        } else if let (Some(q), Category::TokenEmbd) = (opts.token_embedding_type, cat) {
            TypeChoice {
                qtype: q,
                fallback: false,
            }
        } else if let (Some(q), Category::Output) = (opts.output_tensor_type, cat) {
            TypeChoice {
                qtype: q,
                fallback: false,
            }
        } else if !default.is_quantized() {
            TypeChoice {
                qtype: default,
                fallback: false,
            }
        } else {
            let ne0 = t.dims.first().copied().unwrap_or(1);
            let mut q = default;
            if !opts.pure {
                q = st.rules(q, t.name, ne0, cat)?;
            }
            let (qtype, fallback) = fallback(t.name, q, ne0)?;
            TypeChoice { qtype, fallback }
        };
    }
    Ok(out)
}

/// Quantizes `data` (whole blocks of `qtype`) to the bytes `llama-quantize`
/// writes for it. These are [`rustorch_core::quant::quantize`]'s except for IQ4_NL, where
/// `llama-quantize` runs llama.cpp's `quantize_iq4_nl` (with a scale
/// search) rather than the reference `quantize_row_iq4_nl_ref`.
pub fn quantize_like_llama_cpp(qtype: QType, data: &[f32]) -> Result<Vec<u8>, rustorch_core::quant::QuantError> {
    if qtype != QType::IQ4NL {
        return rustorch_core::quant::quantize(qtype, data);
    }
    let size = qtype
        .bytes_for(data.len())
        .ok_or(rustorch_core::quant::QuantError::NotWholeBlocks {
            qtype,
            elements: data.len(),
        })?;
    let mut out = vec![0u8; size];
    rustorch_core::quant::quantize_iq4_nl_searched(data, &mut out)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn llama(n_layer: usize, n_head: usize, n_head_kv: usize) -> ModelParams {
        ModelParams {
            arch: "llama".into(),
            n_layer,
            n_head,
            n_head_kv,
            n_expert: 0,
        }
    }

    #[test]
    fn names_parse_like_llama_quantize() {
        assert_eq!(FileType::parse("q4_k"), Some(FileType::Q4KM));
        assert_eq!(FileType::parse("Q5_K_S"), Some(FileType::Q5KS));
        assert_eq!(FileType::parse("f32"), Some(FileType::AllF32));
        assert_eq!(FileType::parse("Q4_K_X"), None);
        for f in FileType::ALL {
            assert_eq!(FileType::parse(f.name()), Some(f));
            assert_eq!(FileType::from_id(f.id()), Some(f));
        }
    }

    #[test]
    fn order_sorts_by_layer_then_bytes() {
        let mut v = vec![
            "blk.10.a",
            "output.weight",
            "blk.2.b",
            "blk.2.a",
            "token_embd.weight",
            "blk.x",
        ];
        v.sort_by(|a, b| llama_order(a, b));
        assert_eq!(
            v,
            [
                "blk.x",
                "output.weight",
                "token_embd.weight",
                "blk.2.a",
                "blk.2.b",
                "blk.10.a"
            ]
        );
        assert_eq!(layer_of("blk.7.attn_q.weight"), Some(7));
        assert_eq!(layer_of("blk.-1.x"), Some(-1));
        assert_eq!(layer_of("blk..x"), None);
    }

    #[test]
    fn fallbacks_follow_block_sizes() {
        assert_eq!(fallback("t", QType::Q4K, 64), Ok((QType::Q5_0, true)));
        assert_eq!(fallback("t", QType::Q6K, 96), Ok((QType::Q8_0, true)));
        assert_eq!(fallback("t", QType::Q3K, 176), Ok((QType::F16, true)));
        assert_eq!(fallback("t", QType::Q4_0, 176), Ok((QType::F16, true)));
        assert_eq!(fallback("t", QType::Q4_0, 256), Ok((QType::Q4_0, false)));
        assert!(matches!(
            fallback("t", QType::Q8K, 100),
            Err(MixError::NoFallback { .. })
        ));
    }

    #[test]
    fn moe_layers_come_from_names() {
        let p = ModelParams {
            n_expert: 4,
            ..llama(2, 8, 8)
        };
        let bad = [TensorDesc {
            name: "blk.5.ffn_down_exps.weight",
            dims: &[256, 256, 4],
            qtype: QType::F16,
        }];
        let e = choose_types(FileType::Q4KM, &p, &bad, &MixOptions::default()).unwrap_err();
        assert!(matches!(e, MixError::BadLayer { layer: 5, .. }), "{e}");
    }

    #[test]
    fn pure_and_overrides() {
        let p = llama(1, 4, 4);
        let ts = [
            TensorDesc {
                name: "output.weight",
                dims: &[256, 100],
                qtype: QType::F32,
            },
            TensorDesc {
                name: "blk.0.attn_v.weight",
                dims: &[256, 256],
                qtype: QType::F32,
            },
        ];
        let pure = MixOptions {
            pure: true,
            ..MixOptions::default()
        };
        let got = choose_types(FileType::Q4KM, &p, &ts, &pure).unwrap();
        assert_eq!(
            got.iter().map(|c| c.qtype).collect::<Vec<_>>(),
            [QType::Q4K, QType::Q4K]
        );
        let keep = MixOptions {
            quantize_output_tensor: false,
            output_tensor_type: None,
            ..MixOptions::default()
        };
        let got = choose_types(FileType::Q4_0, &p, &ts, &keep).unwrap();
        assert_eq!(
            got.iter().map(|c| c.qtype).collect::<Vec<_>>(),
            [QType::F32, QType::Q4_0]
        );
    }
}
