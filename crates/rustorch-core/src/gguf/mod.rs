//! GGUF files: the container llama.cpp and GGML use for models.
//!
//! [`Gguf`] maps a file (or takes bytes), validates all of it up front, and
//! then gives typed metadata, the tensor table, zero-copy tensor bytes and
//! dense tensors as `Tensor`s. [`GgufWriter`] writes version 3 files.
//!
//! ```no_run
//! use rustorch_core::gguf::Gguf;
//! let g = Gguf::open("model.gguf")?;
//! let arch = g.get_str("general.architecture")?;
//! let tokens = g.get_str_array("tokenizer.ggml.tokens")?;
//! for t in g.tensors() {
//!     println!("{} {} {:?}", t.name(), t.qtype(), t.shape());
//! }
//! let bytes: &[u8] = g.tensor_data("token_embd.weight")?;
//! # Ok::<(), rustorch_core::gguf::GgufError>(())
//! ```
//!
//! Dimensions: `TensorInfo::dims()` are in file (GGML) order, `ne[0]`
//! first; `TensorInfo::shape()` and every `Tensor` are row-major, the
//! reverse. docs/GGUF.md describes the format, the checks and the limits.

mod cursor;
mod error;
mod metadata;
mod parse;
mod reader;
mod tensor;
mod value;
mod writer;

pub use error::{ErrorKind, GgufError, Result};
pub use metadata::{well_known_type, Metadata, WELL_KNOWN_KEYS};
pub use parse::MAX_ARRAY_DEPTH;
pub use reader::Gguf;
pub use tensor::{dense_dtype, qtype_for_dtype, LoadedTensor, TensorInfo, MAX_DIMS};
pub use value::{Array, Value, ValueType};
pub use writer::GgufWriter;

/// The first four bytes of every GGUF file.
pub const MAGIC: &[u8; 4] = b"GGUF";

/// Data alignment when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;
