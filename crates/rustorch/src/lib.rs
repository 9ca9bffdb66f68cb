//! RusTorch: the crate users depend on. The core API (tensors, ops, the
//! executor, GGUF) and the backends this build links: the CPU always
//! (`rustorch::cpu`), the GPUs of the `cuda`, `wgpu` and `opencl` features
//! when they come. A linked backend registers its devices itself
//! (`registry`), so `Executor::global()` and every tensor see them.

pub use rustorch_core::*;
/// The CPU backend, and its kernels' knobs (llama.cpp's arithmetic orders,
/// threads, memory bandwidth).
pub use rustorch_cpu as cpu;
/// The CUDA backend (feature `cuda`): its devices register themselves.
#[cfg(feature = "cuda")]
pub use rustorch_cuda as cuda;
