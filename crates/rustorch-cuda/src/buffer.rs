//! Device memory: a `CudaBuffer` owns raw bytes holding `len` elements of
//! its dtype (bool as one byte, 0 or 1), either alone (from the device's
//! pool) or as a piece of a capture's arena (`crate::capture`).

use cudarc::driver::{CudaSlice, CudaStream, DevicePtr};
use rustorch_core::backend::DeviceBuffer;
use rustorch_core::{DType, Device};
use std::any::Any;
use std::mem::ManuallyDrop;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// What a backend and its buffers share about memory.
#[derive(Debug, Default)]
pub(crate) struct MemoryUse {
    /// Bytes held now, checked against `RUSTORCH_CUDA_MEM_LIMIT`.
    pub(crate) bytes: AtomicUsize,
    /// Bytes handed out since the backend was made (`Backend::bytes_allocated`).
    pub(crate) handed_out: AtomicU64,
    /// Whether a capture is recording (`capture` holds its state): read
    /// by every allocation and every free.
    pub(crate) capturing: AtomicBool,
    pub(crate) capture: Mutex<Option<crate::capture::Recording>>,
}

impl MemoryUse {
    pub(crate) fn capturing(&self) -> bool {
        self.capturing.load(Ordering::Acquire)
    }
}

/// Where a buffer's bytes live.
#[derive(Debug)]
pub(crate) enum Memory {
    /// Allocated for this buffer alone; freed (stream-ordered) when it drops.
    Owned(ManuallyDrop<CudaSlice<u8>>),
    /// A piece of a capture's arena, which it keeps alive; the arena's
    /// memory goes back when the recording and every such buffer are gone.
    Arena {
        /// Held, never read: the arena's memory must outlive this buffer.
        #[allow(dead_code)]
        arena: Arc<crate::capture::Arena>,
        ptr: u64,
        bytes: usize,
    },
}

#[derive(Debug)]
pub struct CudaBuffer {
    pub(crate) device: Device,
    pub(crate) dtype: DType,
    pub(crate) len: usize,
    pub(crate) mem: Memory,
    pub(crate) usage: Arc<MemoryUse>,
    /// The buffer's one row quantized for the MMVQ kernels by the launch
    /// that wrote it; dropped by any later write into the buffer.
    pub(crate) row_acts: Option<Box<RowActs>>,
}

/// A one-row f32 buffer quantized for the MMVQ kernels by the launch that
/// wrote the row (the decode step's add + norm, ops/quant.rs), so that the
/// products reading the row skip their own quantization: per activation
/// layout (`ActLayout` as an index), the addresses of its quants, scales,
/// sums and s in `buf`, or `None` where the row's length has no whole
/// blocks of that layout.
#[derive(Debug)]
pub(crate) struct RowActs {
    /// Values in the row.
    pub(crate) k: usize,
    pub(crate) layouts: [Option<[u64; 4]>; 2],
    /// Held, never read: the quantized row lives in it.
    pub(crate) _buf: CudaBuffer,
}

/// Drops what a buffer about to be written in place remembers of its old
/// values (`CudaBuffer::row_acts`); other buffers are left alone.
pub(crate) fn forget_row_acts(buf: &mut dyn DeviceBuffer) {
    if let Some(c) = buf.as_any_mut().and_then(|a| a.downcast_mut::<CudaBuffer>()) {
        c.row_acts = None;
    }
}

impl CudaBuffer {
    /// The device address of the first byte.
    pub(crate) fn ptr(&self) -> u64 {
        match &self.mem {
            Memory::Owned(s) => {
                let (p, _sync) = s.device_ptr(s.stream());
                p
            }
            Memory::Arena { ptr, .. } => *ptr,
        }
    }

    pub fn n_bytes(&self) -> usize {
        match &self.mem {
            Memory::Owned(s) => s.len(),
            Memory::Arena { bytes, .. } => *bytes,
        }
    }

    /// Sets every byte to zero, in stream order (recorded when capturing).
    pub(crate) fn zero(&self, stream: &CudaStream) -> Result<(), cudarc::driver::DriverError> {
        let n = self.n_bytes();
        if n == 0 {
            return Ok(());
        }
        stream.context().bind_to_thread()?;
        // SAFETY: the buffer holds `n` bytes at `ptr` on this stream's device.
        unsafe { cudarc::driver::result::memset_d8_async(self.ptr(), 0, n, stream.cu_stream()) }
    }
}

impl Drop for CudaBuffer {
    fn drop(&mut self) {
        if let Memory::Owned(slice) = &mut self.mem {
            self.usage.bytes.fetch_sub(slice.len(), Ordering::Relaxed);
            // SAFETY: taken once, here; the field is never used again.
            let slice = unsafe { ManuallyDrop::take(slice) };
            if self.usage.capturing() {
                // A free queued while the stream records would go into the
                // recording (and free the memory at each replay): it waits
                // for the capture's end instead.
                crate::capture::defer_free(&self.usage, slice);
            }
        }
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
