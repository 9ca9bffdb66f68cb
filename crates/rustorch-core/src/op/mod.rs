//! The closed vocabulary of operations every backend speaks.
//!
//! An `Op` carries its parameters; its inputs are tensors passed beside it.
//! Output shapes and dtypes are computed once, here, for every backend
//! (`infer_outputs`), so a backend only ever sees validated inputs.

mod decompose;
mod infer;

pub use decompose::{Decomposition, Step, StepValue};
pub use infer::infer_outputs;

use crate::dtype::DType;
use crate::quant::QType;
use std::fmt;

/// Op families, used to route ops and to describe device capabilities.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum OpClass {
    /// Copies, casts, concatenation.
    DataMovement,
    Elementwise,
    Activation,
    Reduction,
    LinearAlgebra,
    Indexing,
    Normalization,
    Attention,
    Convolution,
    Distribution,
}

impl OpClass {
    pub const ALL: [OpClass; 10] = [
        OpClass::DataMovement,
        OpClass::Elementwise,
        OpClass::Activation,
        OpClass::Reduction,
        OpClass::LinearAlgebra,
        OpClass::Indexing,
        OpClass::Normalization,
        OpClass::Attention,
        OpClass::Convolution,
        OpClass::Distribution,
    ];
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum UnaryOp {
    Neg,
    Abs,
    Exp,
    Log,
    Sqrt,
    Rsqrt,
    Sin,
    Cos,
    Tanh,
    Sigmoid,
    Relu,
    /// Exact GELU: x * Φ(x), with the error function.
    Gelu,
    /// GELU with PyTorch's `approximate="tanh"` formula.
    GeluTanh,
    Silu,
    /// PyTorch's softplus with beta 1 and threshold 20.
    Softplus,
}

impl UnaryOp {
    pub fn name(self) -> &'static str {
        match self {
            UnaryOp::Neg => "neg",
            UnaryOp::Abs => "abs",
            UnaryOp::Exp => "exp",
            UnaryOp::Log => "log",
            UnaryOp::Sqrt => "sqrt",
            UnaryOp::Rsqrt => "rsqrt",
            UnaryOp::Sin => "sin",
            UnaryOp::Cos => "cos",
            UnaryOp::Tanh => "tanh",
            UnaryOp::Sigmoid => "sigmoid",
            UnaryOp::Relu => "relu",
            UnaryOp::Gelu => "gelu",
            UnaryOp::GeluTanh => "gelu_tanh",
            UnaryOp::Silu => "silu",
            UnaryOp::Softplus => "softplus",
        }
    }

    /// Ops that keep integer dtypes (the rest need a floating input).
    pub fn keeps_integers(self) -> bool {
        matches!(self, UnaryOp::Neg | UnaryOp::Abs | UnaryOp::Relu)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BinaryOp {
    Add,
    Sub,
    Mul,
    Div,
    Pow,
    Maximum,
    Minimum,
}

impl BinaryOp {
    pub fn name(self) -> &'static str {
        match self {
            BinaryOp::Add => "add",
            BinaryOp::Sub => "sub",
            BinaryOp::Mul => "mul",
            BinaryOp::Div => "div",
            BinaryOp::Pow => "pow",
            BinaryOp::Maximum => "maximum",
            BinaryOp::Minimum => "minimum",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CmpOp {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

impl CmpOp {
    pub fn name(self) -> &'static str {
        match self {
            CmpOp::Eq => "eq",
            CmpOp::Ne => "ne",
            CmpOp::Lt => "lt",
            CmpOp::Le => "le",
            CmpOp::Gt => "gt",
            CmpOp::Ge => "ge",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    Sum,
    Mean,
    Max,
    Min,
    Prod,
    /// Index of the maximum; exactly one reduced dim. Output i64.
    ArgMax,
    /// Index of the minimum; exactly one reduced dim. Output i64.
    ArgMin,
    /// Variance with `correction` subtracted from the count (1 = unbiased).
    Var {
        correction: u32,
    },
    Std {
        correction: u32,
    },
}

impl ReduceOp {
    pub fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Mean => "mean",
            ReduceOp::Max => "max",
            ReduceOp::Min => "min",
            ReduceOp::Prod => "prod",
            ReduceOp::ArgMax => "argmax",
            ReduceOp::ArgMin => "argmin",
            ReduceOp::Var { .. } => "var",
            ReduceOp::Std { .. } => "std",
        }
    }
}

/// Which pairs of features RoPE rotates together.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RopeLayout {
    /// GPT-NeoX / Hugging Face Llama: feature i pairs with i + rot/2.
    NeoX,
    /// Original / GGML "normal" mode: feature 2i pairs with 2i + 1.
    Interleaved,
}

/// Masking used by scaled dot-product attention.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AttnMask {
    None,
    /// PyTorch's `is_causal=True`: query i sees keys 0..=i (top-left aligned).
    Causal,
    /// Causal aligned to the end: with Tq queries and Tk keys, query i sees
    /// keys 0..=i + Tk - Tq. This is what decoding with a KV cache needs.
    CausalFromEnd,
    /// An extra input tensor, broadcastable to [.., Tq, Tk]: added to the
    /// scores when floating, or keep/drop (true keeps) when bool.
    Explicit,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Conv2dParams {
    pub stride: [usize; 2],
    pub padding: [usize; 2],
    pub dilation: [usize; 2],
    pub groups: usize,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Pool2dParams {
    pub kernel: [usize; 2],
    pub stride: [usize; 2],
    pub padding: [usize; 2],
}

/// Every operation a backend may be asked to run.
///
/// Views (reshape, transpose, narrow, expand...) are not ops: they only
/// change a tensor's layout. `Copy` materializes any layout contiguously.
/// The activation of a gated feed-forward (`Op::QMatMulGated`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GateActivation {
    /// `silu(gate) * up` (`Op::SwiGlu`): Llama-family models.
    SwiGlu,
    /// `gelu(gate) * up` (`Op::GeGlu`): Gemma models.
    GeGlu,
}

/// How llama.cpp's CPU build would run an op, which the CPU backend needs
/// to reproduce its arithmetic bit for bit; every other backend ignores it
/// (it never changes an op's meaning, only the rounding order on the CPU).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct CpuHints {
    /// `QMatMul`: the weight is also looked up by row (a tied token
    /// embedding); llama.cpp keeps such a weight in its plain CPU buffer,
    /// so its products take the plain order, never a repacked or AMX one.
    pub plain_weight_order: bool,
    /// `FlashAttention`: query rows `0..tiled_rows` take GGML's tiled path
    /// (they belong to a llama.cpp micro-batch of at least 64 positions),
    /// the rest its one-row path.
    pub tiled_rows: u32,
    /// `FlashAttention`: one query row over a llama.cpp cache of
    /// `kv_len >= 512` positions takes its split-keys path with `threads`
    /// chunks.
    pub kv_len: u32,
    pub threads: u32,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Op {
    /// Strided input to contiguous output, same dtype.
    Copy,
    Cast {
        to: DType,
    },
    Unary(UnaryOp),
    /// Clamp to `[min, max]`; either bound may be absent.
    Clamp {
        min: Option<f64>,
        max: Option<f64>,
    },
    /// Two same-dtype inputs, broadcast together.
    Binary(BinaryOp),
    /// Two same-dtype inputs, broadcast together; bool output.
    Compare(CmpOp),
    /// Inputs: condition (bool), a, b (same dtype); all broadcast.
    Where,
    Reduce {
        op: ReduceOp,
        dims: Vec<usize>,
        keepdim: bool,
    },
    Softmax {
        dim: usize,
    },
    LogSoftmax {
        dim: usize,
    },
    Cumsum {
        dim: usize,
    },
    /// Two outputs: values and i64 indices.
    TopK {
        k: usize,
        dim: usize,
        largest: bool,
    },
    /// Stable sort; two outputs: values and i64 indices.
    Sort {
        dim: usize,
        descending: bool,
    },
    /// [.., m, k] x [.., k, n] with broadcast batch dims; both at least 2-D.
    MatMul,
    /// `x @ w^T` with the weight in a GGML type, computed as llama.cpp's CPU
    /// backend does (activations quantized to the type's dot type). Inputs:
    /// x f32 [.., k], then w as raw u8 blocks [n, row_bytes] holding n rows
    /// of k values of `qtype`. Output f32 [.., n].
    QMatMul {
        qtype: QType,
        /// Reads `plain_weight_order`.
        cpu: CpuHints,
    },
    /// Several `QMatMul`s of one activation: `x @ w_i^T` for each weight,
    /// with the activations quantized once per dot type instead of once per
    /// weight (the Q, K and V projections, or gate and up, share an input).
    /// Inputs: x f32 [.., k], then one u8 weight per entry of `qtypes`.
    /// Outputs: one f32 [.., n_i] per weight, equal to the single products.
    QMatMuls {
        qtypes: Vec<QType>,
    },
    /// A gated feed-forward's first half: `act(x @ w_gate^T, x @ w_up^T)`,
    /// the values of `QMatMuls` over the two weights followed by `SwiGlu`
    /// or `GeGlu` (`act`), written over the gate product, so that no third
    /// `[.., n]` tensor exists (a prompt's largest). Inputs: x f32 [.., k],
    /// the gate and up weights (u8, of `qtypes`, with one row count).
    /// Output: f32 [.., n].
    QMatMulGated {
        qtypes: [QType; 2],
        act: GateActivation,
    },
    /// Inputs: source, 1-D integer index.
    IndexSelect {
        dim: usize,
    },
    /// Inputs: source, integer index of the source's rank.
    Gather {
        dim: usize,
    },
    /// Inputs: destination, integer index, source. Output: destination with
    /// source values added at the indexed positions.
    ScatterAdd {
        dim: usize,
    },
    /// Inputs: weight [vocab, dim], integer ids of any shape.
    Embedding,
    /// Embedding lookup in a GGML-typed table: rows dequantized to f32.
    /// Inputs: w as raw u8 blocks [vocab, row_bytes], integer ids of any
    /// shape. Output f32 [ids.., dim].
    QEmbedding {
        qtype: QType,
    },
    /// Any number of inputs of one dtype, equal but for `dim`.
    Cat {
        dim: usize,
    },
    /// Normalizes over the last `normalized_dims` dims. Inputs: x, then
    /// weight and bias when present.
    LayerNorm {
        eps: f64,
        normalized_dims: usize,
        has_weight: bool,
        has_bias: bool,
    },
    /// Over the last dim. Inputs: x, then weight when present.
    RmsNorm {
        eps: f64,
        has_weight: bool,
    },
    /// A residual add and the RMS norm of its sum (a decode step's block
    /// boundary): inputs x, a (f32, one shape) and the norm's weight (1-D,
    /// the last dim's size); outputs s = x + a and `RmsNorm` of s with the
    /// weight, the values of `Binary(Add)` and `RmsNorm` (one launch
    /// instead of two on a GPU).
    AddRmsNorm {
        eps: f64,
    },
    /// `AddRmsNorm` whose normed output feeds `then` (a `QMatMuls` or
    /// `QMatMulGated`) directly: a decode step's block boundary, where a
    /// GPU computes the norm inside the products' launch (each block
    /// redundantly) instead of in a launch of its own. Inputs: x, a, the
    /// norm's weight, then `then`'s inputs after its first. Outputs: s =
    /// x + a, then `then`'s outputs: the values of `AddRmsNorm` followed
    /// by `then` on its normed output (the norm is not an output).
    AddRmsNormThen {
        eps: f64,
        then: Box<Op>,
    },
    /// Inference batch norm over dim 1. Inputs: x, running_mean,
    /// running_var, then weight and bias when present.
    BatchNorm {
        eps: f64,
        has_weight: bool,
        has_bias: bool,
    },
    /// Inputs: x [.., T, D], cos [T, R/2], sin [T, R/2]. The first R
    /// features rotate; the rest pass through.
    Rope {
        layout: RopeLayout,
    },
    /// Inputs: q [B, Hq, Tq, D], k [B, Hkv, Tk, D], v [B, Hkv, Tk, Dv], then
    /// the mask for `AttnMask::Explicit`. Hq must be a multiple of Hkv
    /// (grouped-query attention). Scale defaults to 1/sqrt(D).
    Sdpa {
        mask: AttnMask,
        scale: Option<f64>,
    },
    /// Attention over an f16 key/value cache with llama.cpp's CPU rounding
    /// (its path without flash attention): queries and probabilities
    /// rounded to f16, GGML's dot-product orders, `ggml_soft_max_ext`.
    /// Inputs: q f32 [Hq, T, D], k f16 [Hkv, L, D], vt f16 [Hkv, Dv, L]
    /// (values transposed: one row per feature over the L positions), mask
    /// f32 [T, L] added after `scale`. Hq must be a multiple of Hkv. Output
    /// f32 [Hq, T, Dv].
    CachedAttention {
        scale: f32,
    },
    /// Attention over an f16 key/value cache with llama.cpp's CPU flash
    /// attention (`ggml_flash_attn_ext`, its default): the paths and
    /// roundings of the CPU backend's `ggml::flash_attn`, chosen by
    /// `cpu.{tiled_rows, kv_len, threads}`. Inputs: q f32 [Hq, T, D], k f16
    /// [Hkv, L, D], v f16 [Hkv, L, Dv] (values as rows, llama.cpp's cache
    /// layout with flash attention), mask f32 [T, L] (0 or -inf). Output
    /// f32 [Hq, T, Dv].
    FlashAttention {
        scale: f32,
        cpu: CpuHints,
    },
    /// Attention over a key/value cache whose query position is read from a
    /// tensor, so that nothing about the step is a host scalar (a CUDA
    /// graph replays fixed kernel arguments). Inputs: q `[H, T, D]` (f32,
    /// f16 or bf16), k `[Hkv, N, D]` and v `[Hkv, N, Dv]` (the cache at its
    /// full capacity N, values as rows; f32, f16 or bf16, one dtype), pos
    /// one i32 or i64 element (shape `[1]` or `[]`). Query row i sits at
    /// position p = pos + i and attends keys j <= p, and p - j < w as well
    /// with `window: Some(w)` (a sliding window, llama.cpp's standard SWA
    /// rule); keys at or past pos + T are never read. Softmax of
    /// `scale * q.k` in f32. H must be a multiple of Hkv. Output f32
    /// `[H, T, Dv]`. pos < 0 or pos + T > N is an `InvalidInput` of the
    /// backend.
    AttentionAt {
        scale: f32,
        window: Option<usize>,
    },
    /// `silu(x) * g` with GGML's arithmetic (`ggml_swiglu`), row by row over
    /// the last dim. Inputs: x, g f32 of one shape.
    SwiGlu,
    /// `gelu(x) * g` with GGML's arithmetic (`ggml_geglu`: the tanh-form
    /// GELU read from an f16 table). Inputs: x, g f32 of one shape.
    GeGlu,
    /// Inputs: x [N, C, L], w [O, C/groups, K], then bias [O] when present.
    Conv1d {
        stride: usize,
        padding: usize,
        dilation: usize,
        groups: usize,
        has_bias: bool,
    },
    /// Inputs: x [N, C, H, W], w [O, C/groups, KH, KW], then bias [O].
    Conv2d {
        params: Conv2dParams,
        has_bias: bool,
    },
    /// Inputs: x [N, C, H, W], w [C, O/groups, KH, KW], then bias [O].
    ConvTranspose2d {
        params: Conv2dParams,
        output_padding: [usize; 2],
        has_bias: bool,
    },
    MaxPool2d {
        params: Pool2dParams,
    },
    AvgPool2d {
        params: Pool2dParams,
        count_include_pad: bool,
    },
}

impl Op {
    pub fn class(&self) -> OpClass {
        match self {
            Op::Copy | Op::Cast { .. } | Op::Cat { .. } => OpClass::DataMovement,
            Op::Unary(u) => match u {
                UnaryOp::Relu
                | UnaryOp::Gelu
                | UnaryOp::GeluTanh
                | UnaryOp::Silu
                | UnaryOp::Sigmoid
                | UnaryOp::Softplus
                | UnaryOp::Tanh => OpClass::Activation,
                _ => OpClass::Elementwise,
            },
            Op::Clamp { .. } | Op::Binary(_) | Op::Compare(_) | Op::Where => OpClass::Elementwise,
            Op::Reduce { .. }
            | Op::Softmax { .. }
            | Op::LogSoftmax { .. }
            | Op::Cumsum { .. }
            | Op::TopK { .. }
            | Op::Sort { .. } => OpClass::Reduction,
            Op::MatMul | Op::QMatMul { .. } | Op::QMatMuls { .. } | Op::QMatMulGated { .. } => OpClass::LinearAlgebra,
            Op::IndexSelect { .. }
            | Op::Gather { .. }
            | Op::ScatterAdd { .. }
            | Op::Embedding
            | Op::QEmbedding { .. } => OpClass::Indexing,
            Op::LayerNorm { .. } | Op::RmsNorm { .. } | Op::AddRmsNorm { .. } | Op::BatchNorm { .. } => {
                OpClass::Normalization
            }
            Op::AddRmsNormThen { then, .. } => then.class(),
            Op::Rope { .. }
            | Op::Sdpa { .. }
            | Op::CachedAttention { .. }
            | Op::FlashAttention { .. }
            | Op::AttentionAt { .. } => OpClass::Attention,
            Op::SwiGlu | Op::GeGlu => OpClass::Activation,
            Op::Conv1d { .. }
            | Op::Conv2d { .. }
            | Op::ConvTranspose2d { .. }
            | Op::MaxPool2d { .. }
            | Op::AvgPool2d { .. } => OpClass::Convolution,
        }
    }

    /// Short name, as shown in traces and errors.
    pub fn name(&self) -> String {
        match self {
            Op::Copy => "copy".into(),
            Op::Cast { to } => format!("cast_to_{to}"),
            Op::Unary(u) => u.name().into(),
            Op::Clamp { .. } => "clamp".into(),
            Op::Binary(b) => b.name().into(),
            Op::Compare(c) => c.name().into(),
            Op::Where => "where".into(),
            Op::Reduce { op, .. } => op.name().into(),
            Op::Softmax { .. } => "softmax".into(),
            Op::LogSoftmax { .. } => "log_softmax".into(),
            Op::Cumsum { .. } => "cumsum".into(),
            Op::TopK { .. } => "topk".into(),
            Op::Sort { .. } => "sort".into(),
            Op::MatMul => "matmul".into(),
            Op::QMatMul { qtype, .. } => format!("qmatmul_{}", qtype.name().to_lowercase()),
            Op::QMatMuls { qtypes } => format!("qmatmul_x{}", qtypes.len()),
            Op::QMatMulGated { act, .. } => match act {
                GateActivation::SwiGlu => "qmatmul_swiglu".into(),
                GateActivation::GeGlu => "qmatmul_geglu".into(),
            },
            Op::IndexSelect { .. } => "index_select".into(),
            Op::Gather { .. } => "gather".into(),
            Op::ScatterAdd { .. } => "scatter_add".into(),
            Op::Embedding => "embedding".into(),
            Op::QEmbedding { qtype } => format!("qembedding_{}", qtype.name().to_lowercase()),
            Op::Cat { .. } => "cat".into(),
            Op::LayerNorm { .. } => "layer_norm".into(),
            Op::RmsNorm { .. } => "rms_norm".into(),
            Op::AddRmsNorm { .. } => "add_rms_norm".into(),
            Op::AddRmsNormThen { then, .. } => format!("add_rms_norm_{}", then.name()),
            Op::BatchNorm { .. } => "batch_norm".into(),
            Op::Rope {
                layout: RopeLayout::NeoX,
            } => "rope_neox".into(),
            Op::Rope {
                layout: RopeLayout::Interleaved,
            } => "rope_interleaved".into(),
            Op::Sdpa { .. } => "sdpa".into(),
            Op::CachedAttention { .. } => "cached_attention".into(),
            Op::FlashAttention { .. } => "flash_attention".into(),
            Op::AttentionAt { .. } => "attention_at".into(),
            Op::SwiGlu => "swiglu".into(),
            Op::GeGlu => "geglu".into(),
            Op::Conv1d { .. } => "conv1d".into(),
            Op::Conv2d { .. } => "conv2d".into(),
            Op::ConvTranspose2d { .. } => "conv_transpose2d".into(),
            Op::MaxPool2d { .. } => "max_pool2d".into(),
            Op::AvgPool2d { .. } => "avg_pool2d".into(),
        }
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name())
    }
}

/// Shape and dtype of a tensor, without its data.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TensorMeta {
    pub shape: crate::shape::Shape,
    pub dtype: DType,
}

impl TensorMeta {
    pub fn new(shape: impl Into<crate::shape::Shape>, dtype: DType) -> Self {
        TensorMeta {
            shape: shape.into(),
            dtype,
        }
    }

    pub fn size_in_bytes(&self) -> usize {
        self.shape.numel() * self.dtype.size_in_bytes()
    }
}

/// An op's name for errors, formatted only when one is made: checking an
/// op's inputs (`infer_outputs`, on every op) allocated `Op::name` each
/// time otherwise.
#[derive(Clone, Copy, Debug)]
pub struct OpName<'a>(pub &'a Op);

impl std::fmt::Display for OpName<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0.name())
    }
}

impl From<OpName<'_>> for String {
    fn from(n: OpName<'_>) -> String {
        n.0.name()
    }
}
