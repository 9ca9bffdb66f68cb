//! RusTorch core: what every device shares. Tensors, dtypes, shapes and
//! layouts, ops and their shape inference, the `Backend` trait, the hybrid
//! `Executor` and the registry it is built from, GGUF files and the GGML
//! quantization formats (blocks, quantize, dequantize). No kernels: the
//! CPU backend is the `rustorch-cpu` crate, and every device's backend
//! registers itself (`registry`).

pub mod backend;
pub mod device;
pub mod dtype;
pub mod error;
pub mod executor;
pub mod gguf;
pub mod huge_pages;
pub mod layout;
pub mod op;
pub mod quant;
pub mod registry;
pub mod rng;
pub mod shape;
pub mod storage;
pub mod tensor;

pub use backend::{Backend, Buffer, DeviceBuffer, HostTimer, OpTimer, Replay, TensorRef, WeightSpec, WeightUsage};
pub use device::{Device, DeviceCapability};
pub use dtype::{DType, Scalar, WithDType, C64};
pub use error::{BackendError, Error, Result};
pub use executor::{Executor, ExecutorConfig, OpProfile, ProfileMode, TraceEvent};
pub use layout::Layout;
pub use op::{AttnMask, Conv2dParams, CpuHints, Op, OpClass, Pool2dParams, RopeLayout, TensorMeta};
pub use shape::Shape;
pub use storage::{CpuStorage, HostSlice, StorageElement};
pub use tensor::{FlashPaths, QWeight, Tensor};
