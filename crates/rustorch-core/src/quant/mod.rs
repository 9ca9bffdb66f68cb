//! Quantized GGML block formats.

mod qtype;

pub use qtype::QType;
