//! The suite groups: each a list of checks (`CASES`) that take the [`Target`](crate::Target).
//!
//! The `torch_*` groups replay PyTorch's fixtures, `ggml_*` llama.cpp's, `quant_ops` checks the
//! quantized ops against the CPU's kernels, and `random_*` every op on random inputs against a
//! CPU-only executor.

// The record of the CPU llama.cpp's fixtures were written on, shared with the tests of
// rustorch-core, rustorch-cpu, rustorch-llm and rustorch-cli.
#[path = "../../../rustorch-core/tests/common/fixture_cpu.rs"]
mod fixture_cpu;
pub mod ggml_matmul;
pub mod ggml_ops;
pub mod quant_ops;
mod random;
pub mod torch_common;
pub mod torch_conv;
pub mod torch_create;
pub mod torch_elementwise;
pub mod torch_index;
pub mod torch_linalg;
pub mod torch_nn;
pub mod torch_reduce;

pub use random::{random_elementwise, random_other, random_reduce};
