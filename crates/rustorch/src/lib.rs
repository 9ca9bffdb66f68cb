//! RusTorch: the crate users depend on. Re-exports the core API; backend
//! features (cuda, wgpu, opencl) will register their devices here.

pub use rustorch_core::*;
