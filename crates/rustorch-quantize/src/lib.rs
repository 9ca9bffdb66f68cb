//! Quantizing GGUF files the way `llama-quantize` does: its choice of a
//! type per tensor for each file type (`mix`, llama.cpp's
//! `llama_tensor_get_type`), and the whole-file conversion (`file`),
//! byte-identical to llama-quantize's output. A file-level tool on top of
//! the formats of `rustorch_core::quant`, used by `rustorch-cli quantize`.

pub mod file;
pub mod mix;
