//! RusTorch's LLM runtime: GGUF models that produce the same tokens as llama.cpp.
//!
//! So far this crate holds the tokenizer ([`tokenizer`]), built from a GGUF file's
//! `tokenizer.ggml.*` metadata exactly as llama.cpp's `llama_vocab` builds it, and checked token
//! for token against llama.cpp's `llama-tokenize` (see `tests/tokenizer_llamacpp.rs`).
//!
//! ```no_run
//! use rustorch::gguf::Gguf;
//! use rustorch_llm::Tokenizer;
//!
//! let gguf = Gguf::open("SmolLM2-135M-Instruct.Q4_1.gguf")?;
//! let tok = Tokenizer::from_gguf(&gguf)?;
//! let ids = tok.encode("<|im_start|>user\nhi<|im_end|>", true, true);
//! assert_eq!(tok.decode(&ids), "user\nhi");
//! # Ok::<(), rustorch_llm::LlmError>(())
//! ```

pub mod chat;
pub mod error;
pub mod kld;
pub mod model;
pub mod perplexity;
pub mod sampling;
pub mod tokenizer;

pub use chat::{ChatTemplate, Message};
pub use error::{LlmError, Result};
pub use model::{Logits, Model};
pub use sampling::{Sampler, SamplerConfig, StopMatcher};
pub use tokenizer::{TokenAttr, Tokenizer, VocabType};
