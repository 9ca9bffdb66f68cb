//! Errors of the LLM runtime.

use rustorch::gguf::GgufError;

/// What can go wrong loading or running a model, rendering a chat template or sampling.
#[derive(Debug, thiserror::Error)]
pub enum LlmError {
    #[error(transparent)]
    Gguf(#[from] GgufError),
    #[error("unknown tokenizer model '{0}' in tokenizer.ggml.model (supported: 'llama' = SentencePiece BPE, 'gpt2' = byte-level BPE)")]
    UnknownTokenizerModel(String),
    #[error("tokenizer model '{0}' (tokenizer.ggml.model) is known to llama.cpp but not supported by rustorch yet")]
    UnsupportedTokenizerModel(String),
    #[error("unknown pre-tokenizer type '{0}' in tokenizer.ggml.pre")]
    UnknownPreTokenizer(String),
    #[error("pre-tokenizer type '{0}' (tokenizer.ggml.pre) is known to llama.cpp but not supported by rustorch yet")]
    UnsupportedPreTokenizer(String),
    #[error("bad tokenizer metadata {key}: {reason}")]
    BadMetadata { key: String, reason: String },
    #[error(transparent)]
    Tensor(#[from] rustorch::Error),
    #[error("unsupported model architecture '{0}' (general.architecture); supported: llama, gemma3")]
    UnsupportedArchitecture(String),
    #[error("not supported yet: {0}")]
    Unsupported(String),
    #[error("the model file has no tensor '{0}'")]
    MissingTensor(String),
    #[error("tensor {name} has shape {found:?}, expected {expected:?}")]
    BadTensorShape {
        name: String,
        expected: Vec<usize>,
        found: Vec<usize>,
    },
    #[error("the context is full: {used} of {n_ctx} positions are used and {requested} more were requested")]
    ContextFull {
        n_ctx: usize,
        used: usize,
        requested: usize,
    },
    #[error("{0}")]
    InvalidArgument(String),
    /// A chat template failed to compile or render; `origin` names where it came from and
    /// `message` is minijinja's (kind, detail, template line).
    #[error("chat template ({origin}): {message}")]
    ChatTemplate { origin: String, message: String },
    /// A sampler setting out of range.
    #[error("bad sampler setting {field}: {reason}")]
    BadSamplerConfig { field: &'static str, reason: String },
    /// Logits a sampler cannot draw from (empty, or no finite value).
    #[error("cannot sample: {0}")]
    Sampling(String),
}

pub type Result<T> = std::result::Result<T, LlmError>;
