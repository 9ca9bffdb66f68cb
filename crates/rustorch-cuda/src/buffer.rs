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
    /// Page-locked host memory mapped into the device's address space
    /// (`Backend::alloc_host_readable`): kernels write it through `ptr`,
    /// the host reads it in place.
    Mapped(MappedHost),
}

/// A `cuMemHostAlloc` allocation (mapped), freed when it drops.
#[derive(Debug)]
pub(crate) struct MappedHost {
    pub(crate) host: *mut u8,
    pub(crate) device: u64,
    pub(crate) bytes: usize,
    pub(crate) ctx: Arc<cudarc::driver::CudaContext>,
}

// SAFETY: the pointers name memory this value owns alone; the host reads it
// only after synchronizing with the device work that writes it.
unsafe impl Send for MappedHost {}
unsafe impl Sync for MappedHost {}

impl MappedHost {
    /// `bytes` (at least one) of mapped, page-locked host memory;
    /// `write_combined`: fast for the host to write and the device to read,
    /// and never read by the host (upload staging).
    pub(crate) fn new(
        ctx: &Arc<cudarc::driver::CudaContext>,
        bytes: usize,
        write_combined: bool,
    ) -> Result<MappedHost, cudarc::driver::DriverError> {
        use cudarc::driver::sys;
        ctx.bind_to_thread()?;
        let mut host: *mut std::ffi::c_void = std::ptr::null_mut();
        let mut device: sys::CUdeviceptr = 0;
        let mut flags = sys::CU_MEMHOSTALLOC_DEVICEMAP | sys::CU_MEMHOSTALLOC_PORTABLE;
        if write_combined {
            flags |= sys::CU_MEMHOSTALLOC_WRITECOMBINED;
        }
        // SAFETY: out-pointers to locals; the allocation is freed on drop
        // (or here, when its device address cannot be had).
        unsafe {
            sys::cuMemHostAlloc(&mut host, bytes.max(1), flags).result()?;
            if let Err(e) = sys::cuMemHostGetDevicePointer_v2(&mut device, host, 0).result() {
                let _ = sys::cuMemFreeHost(host);
                return Err(e);
            }
        }
        Ok(MappedHost {
            host: host.cast(),
            device,
            bytes,
            ctx: ctx.clone(),
        })
    }

    /// The bytes as the host sees them (the caller has synchronized with
    /// the device work that writes them).
    pub(crate) fn bytes(&self) -> &[u8] {
        // SAFETY: `bytes` bytes allocated at `host`, alive while self is.
        unsafe { std::slice::from_raw_parts(self.host, self.bytes) }
    }

    /// Writes `src` at byte `offset` (the caller has synchronized with the
    /// device work that reads them, and checked the range).
    pub(crate) fn write(&self, offset: usize, src: &[u8]) {
        debug_assert!(offset + src.len() <= self.bytes, "a write past a mapped buffer's end");
        // SAFETY: in bounds (checked above) of the `bytes` bytes allocated at
        // `host`, which only this value's owner writes, and no device work
        // touches them now.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), self.host.add(offset), src.len()) }
    }
}

impl Drop for MappedHost {
    fn drop(&mut self) {
        // Its owner has waited for the device work that uses it (a
        // buffer's stream, a staging buffer's event).
        let _ = self.ctx.bind_to_thread();
        // SAFETY: allocated by cuMemHostAlloc in `new`, freed once.
        unsafe {
            let _ = cudarc::driver::sys::cuMemFreeHost(self.host.cast());
        }
    }
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
            Memory::Mapped(m) => m.device,
        }
    }

    pub fn n_bytes(&self) -> usize {
        match &self.mem {
            Memory::Owned(s) => s.len(),
            Memory::Arena { bytes, .. } => *bytes,
            Memory::Mapped(m) => m.bytes,
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
