//! Device memory: a `CudaBuffer` owns raw bytes holding `len` elements of
//! its dtype (bool as one byte, 0 or 1).

use cudarc::driver::{CudaSlice, DevicePtr};
use rustorch_core::backend::DeviceBuffer;
use rustorch_core::{DType, Device};
use std::any::Any;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// Bytes in use on one device, checked against `RUSTORCH_CUDA_MEM_LIMIT`.
#[derive(Debug, Default)]
pub(crate) struct MemoryUse {
    pub(crate) bytes: AtomicUsize,
}

#[derive(Debug)]
pub struct CudaBuffer {
    pub(crate) device: Device,
    pub(crate) dtype: DType,
    pub(crate) len: usize,
    pub(crate) data: CudaSlice<u8>,
    pub(crate) usage: Arc<MemoryUse>,
}

impl CudaBuffer {
    /// The device address of the first byte.
    pub(crate) fn ptr(&self) -> u64 {
        let (p, _sync) = self.data.device_ptr(self.data.stream());
        p
    }
    pub fn n_bytes(&self) -> usize {
        self.data.len()
    }
}

impl Drop for CudaBuffer {
    fn drop(&mut self) {
        self.usage.bytes.fetch_sub(self.data.len(), Ordering::Relaxed);
    }
}

impl DeviceBuffer for CudaBuffer {
    fn device(&self) -> Device {
        self.device
    }
    fn dtype(&self) -> DType {
        self.dtype
    }
    fn len(&self) -> usize {
        self.len
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
    fn as_any_mut(&mut self) -> Option<&mut dyn Any> {
        Some(self)
    }
}
