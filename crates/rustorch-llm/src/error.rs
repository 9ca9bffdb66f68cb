//! Errors of the LLM runtime.

use rustorch_core::gguf::GgufError;

/// What can go wrong building a tokenizer (or, later, a model) from a GGUF file.
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
}

pub type Result<T> = std::result::Result<T, LlmError>;
