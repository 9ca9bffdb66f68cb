//! RusTorch core: tensors, dtypes, layouts, devices, the `Backend` trait,
//! the hybrid `Executor`, and the CPU backend that every other backend is
//! checked against.

pub mod backend;
pub mod block_cache;
pub mod cpu;
pub mod device;
pub mod dtype;
pub mod error;
pub mod executor;
pub mod gguf;
pub mod huge_pages;
pub mod layout;
pub mod membw;
pub mod op;
pub mod quant;
pub mod rng;
pub mod shape;
pub mod team;
pub mod tensor;

pub use backend::{Backend, Buffer, DeviceBuffer, TensorRef};
pub use device::{Device, DeviceCapability};
pub use dtype::{DType, Scalar, WithDType, C64};
pub use error::{BackendError, Error, Result};
pub use executor::{Executor, ExecutorConfig, OpProfile, ProfileMode, TraceEvent};
pub use layout::Layout;
pub use op::{AttnMask, Conv2dParams, Op, OpClass, Pool2dParams, RopeLayout, TensorMeta};
pub use shape::Shape;
pub use tensor::{FlashPaths, QWeight, Tensor};
