//! Copies between host memory and the GPU, three ways, and the choice
//! between them by size.
//!
//! - `Pageable`: the driver's copy straight from (to) the caller's memory;
//!   the driver stages it through its own pinned buffers, synchronously.
//! - `Pinned`: our own page-locked buffers, two of `CHUNK` bytes per
//!   direction: the host copies one chunk while the DMA engine moves the
//!   other (double buffering), so the copy runs at the bus's speed.
//! - `Mapped`: the same buffers mapped into the GPU's address space; a copy
//!   kernel on the GPU reads (writes) them over the bus instead of the DMA
//!   engine (zero-copy).
//!
//! `Method::for_size` holds the choice measured on the device machine
//! (`examples/cuda_transfers.rs`, table in docs/BENCHMARKS.md);
//! `RUSTORCH_CUDA_TRANSFER=pageable|pinned|mapped` forces one method.

use crate::backend::CudaBackend;
use crate::buffer::MappedHost;
use crate::launch::Strided;
use cudarc::driver::sys::{self, CUdeviceptr};
use cudarc::driver::{CudaEvent, DriverError};
use rustorch_core::BackendError;
use std::sync::Mutex;

/// Bytes per staging buffer (two per direction).
const CHUNK: usize = 32 << 20;

/// `src` into `dst` (same length) on several host threads for large
/// copies: one thread copies ~10 GB/s into pinned memory, below the bus
/// (the transfer table in docs/BENCHMARKS.md), so staging needs more.
fn host_copy(src: &[u8], dst: &mut [u8]) {
    const PER_THREAD: usize = 2 << 20;
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(8)
        .min(src.len() / PER_THREAD);
    if threads <= 1 {
        dst.copy_from_slice(src);
        return;
    }
    let share = src.len().div_ceil(threads);
    // Each share in a slot that its thread empties, or this one where no
    // thread could be started.
    type Share<'a> = std::sync::Mutex<Option<(&'a [u8], &'a mut [u8])>>;
    let copy = |slot: &Share<'_>| {
        if let Some((s, d)) = slot.lock().ok().and_then(|mut j| j.take()) {
            d.copy_from_slice(s);
        }
    };
    let shares: Vec<Share<'_>> = src
        .chunks(share)
        .zip(dst.chunks_mut(share))
        .map(|job| std::sync::Mutex::new(Some(job)))
        .collect();
    std::thread::scope(|scope| {
        for slot in &shares {
            if std::thread::Builder::new().spawn_scoped(scope, || copy(slot)).is_err() {
                copy(slot);
            }
        }
    });
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Method {
    Pageable,
    Pinned,
    Mapped,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    Upload,
    Download,
}

impl Method {
    pub const ALL: [Method; 3] = [Method::Pageable, Method::Pinned, Method::Mapped];

    pub fn name(self) -> &'static str {
        match self {
            Method::Pageable => "pageable",
            Method::Pinned => "pinned",
            Method::Mapped => "mapped",
        }
    }

    /// `RUSTORCH_CUDA_TRANSFER`, when set to a method's name.
    pub(crate) fn forced() -> Result<Option<Method>, String> {
        match std::env::var("RUSTORCH_CUDA_TRANSFER") {
            Err(_) => Ok(None),
            Ok(v) => Method::ALL
                .into_iter()
                .find(|m| m.name() == v.trim())
                .map(Some)
                .ok_or_else(|| format!("RUSTORCH_CUDA_TRANSFER={v}: expected pageable, pinned or mapped")),
        }
    }

    /// The faster method for `bytes` in `dir`, from the measurement on an
    /// H200 host (docs/BENCHMARKS.md, "Transfers"): below 16 MiB up and
    /// 1 MiB down the driver's own pageable copy is as fast or faster (our
    /// staging's fixed costs dominate); above, our pinned staging with
    /// its host copies on several threads moves 2-4x as much (25-30 GB/s
    /// up, 20-24 GB/s down, against the driver's 6-12). Mapped memory
    /// measured the same as pinned there but occupies the GPU's SMs.
    pub fn for_size(dir: Direction, bytes: usize) -> Method {
        const MIB: usize = 1 << 20;
        let staged_from = match dir {
            Direction::Upload => 16 * MIB,
            Direction::Download => MIB,
        };
        if bytes < staged_from {
            Method::Pageable
        } else {
            Method::Pinned
        }
    }
}

/// A page-locked host buffer of `CHUNK` bytes, mapped into the device's
/// address space, and the event after the last device work on it.
struct HostBuf {
    mem: MappedHost,
    done: CudaEvent,
}

impl Drop for HostBuf {
    fn drop(&mut self) {
        // No device work may still use the memory when it goes (`mem`,
        // dropped after this).
        let _ = self.done.synchronize();
    }
}

impl HostBuf {
    fn new(b: &CudaBackend, write_combined: bool) -> Result<HostBuf, DriverError> {
        let mem = MappedHost::new(&b.ctx, CHUNK, write_combined)?;
        let done = b.ctx.new_event(None)?;
        Ok(HostBuf { mem, done })
    }
}

/// The staging buffers of one backend, made on first use.
#[derive(Default)]
pub(crate) struct Staging {
    bufs: Mutex<Option<Buffers>>,
}

struct Buffers {
    up: [HostBuf; 2],
    down: [HostBuf; 2],
}

// SAFETY: the raw pointers are page-locked host memory owned by the
// buffers; every use goes through the `Mutex`.
unsafe impl Send for Buffers {}

impl CudaBackend {
    /// Copies `src` to device address `dst` (which holds `src.len()` bytes)
    /// by `method`. On return `src` may be reused: every method has copied
    /// it out of the caller's memory (the driver's pageable copy stages it
    /// before returning).
    pub(crate) fn copy_to_device(&self, method: Method, src: &[u8], dst: CUdeviceptr) -> Result<(), BackendError> {
        let fail = |e: DriverError| self.err("upload", e, src.len());
        if src.is_empty() {
            return Ok(());
        }
        self.ctx.bind_to_thread().map_err(fail)?;
        // What an upload writes may be weights, which a kernel may read
        // before its wait.
        self.serialize_next_launch();
        if method == Method::Pageable {
            // SAFETY: `dst` holds `src.len()` bytes; pageable copies are
            // staged by the driver before the call returns.
            return unsafe { sys::cuMemcpyHtoDAsync_v2(dst, src.as_ptr().cast(), src.len(), self.stream.cu_stream()) }
                .result()
                .map_err(fail);
        }
        let mut guard = self.staging.bufs.lock().map_err(|_| self.poisoned())?;
        let bufs = self.staging_buffers(&mut guard)?;
        for (k, piece) in src.chunks(CHUNK).enumerate() {
            let buf = &bufs.up[k % 2];
            // The device may still read this buffer's previous chunk.
            buf.done.synchronize().map_err(fail)?;
            // SAFETY: the buffer holds CHUNK >= piece.len() bytes and no
            // device work reads it now.
            host_copy(piece, unsafe {
                std::slice::from_raw_parts_mut(buf.mem.host, piece.len())
            });
            let at = dst + (k * CHUNK) as u64;
            match method {
                // SAFETY: page-locked source of `piece.len()` bytes,
                // destination inside `dst`'s allocation.
                Method::Pinned => {
                    unsafe { sys::cuMemcpyHtoDAsync_v2(at, buf.mem.host.cast(), piece.len(), self.stream.cu_stream()) }
                        .result()
                        .map_err(fail)?
                }
                _ => self.copy_kernel(buf.mem.device, at, piece.len())?,
            }
            buf.done.record(&self.stream).map_err(fail)?;
        }
        Ok(())
    }

    /// Copies `dst.len()` bytes from device address `src` into `dst` by
    /// `method`, waiting for the work queued before it.
    pub(crate) fn copy_to_host(&self, method: Method, src: CUdeviceptr, dst: &mut [u8]) -> Result<(), BackendError> {
        let n = dst.len();
        let fail = |e: DriverError| self.err("download", e, n);
        if n == 0 {
            return Ok(());
        }
        self.ctx.bind_to_thread().map_err(fail)?;
        if method == Method::Pageable {
            // SAFETY: `src` holds `n` bytes; the synchronize below waits
            // for the copy before `dst` is read.
            unsafe { sys::cuMemcpyDtoHAsync_v2(dst.as_mut_ptr().cast(), src, n, self.stream.cu_stream()) }
                .result()
                .map_err(fail)?;
            return self.stream.synchronize().map_err(fail);
        }
        let mut guard = self.staging.bufs.lock().map_err(|_| self.poisoned())?;
        let bufs = self.staging_buffers(&mut guard)?;
        let chunks = n.div_ceil(CHUNK);
        let len = |k: usize| CHUNK.min(n - k * CHUNK);
        // Queue chunk k into buffer k % 2; the host empties chunk k - 1's
        // buffer while the device fills chunk k's.
        let enqueue = |k: usize| -> Result<(), BackendError> {
            let buf = &bufs.down[k % 2];
            let from = src + (k * CHUNK) as u64;
            match method {
                // SAFETY: page-locked destination of CHUNK bytes, whose
                // previous contents the host has copied out already.
                Method::Pinned => {
                    unsafe { sys::cuMemcpyDtoHAsync_v2(buf.mem.host.cast(), from, len(k), self.stream.cu_stream()) }
                        .result()
                        .map_err(fail)?
                }
                _ => self.copy_kernel(from, buf.mem.device, len(k))?,
            }
            buf.done.record(&self.stream).map_err(fail)
        };
        enqueue(0)?;
        for k in 0..chunks {
            if k + 1 < chunks {
                enqueue(k + 1)?;
            }
            let buf = &bufs.down[k % 2];
            buf.done.synchronize().map_err(fail)?;
            // SAFETY: the device finished writing this chunk (its event),
            // and the buffer holds CHUNK >= len(k) bytes.
            let staged = unsafe { std::slice::from_raw_parts(buf.mem.host, len(k)) };
            host_copy(staged, &mut dst[k * CHUNK..k * CHUNK + len(k)]);
        }
        Ok(())
    }

    /// A new buffer holding `src` (bytes of `dtype`), copied by `method`:
    /// what `Backend::upload` does with the method `Method::for_size`
    /// picks (for measuring the methods against each other).
    pub fn upload_with(
        &self,
        method: Method,
        dtype: rustorch_core::DType,
        src: &[u8],
    ) -> Result<crate::CudaBuffer, BackendError> {
        let len = src.len() / dtype.size_in_bytes().max(1);
        if len * dtype.size_in_bytes() != src.len() {
            return Err(BackendError::invalid(
                "upload",
                format!("{} bytes are not a whole number of {dtype} values", src.len()),
            ));
        }
        let buf = self.alloc(dtype, len)?;
        self.copy_to_device(method, src, buf.ptr())?;
        Ok(buf)
    }

    /// Copies all of `buf` into `dst` (of the same size in bytes) by
    /// `method`, as `Backend::download` does.
    pub fn download_with(&self, method: Method, buf: &crate::CudaBuffer, dst: &mut [u8]) -> Result<(), BackendError> {
        let n = buf.len * buf.dtype.size_in_bytes();
        if dst.len() != n {
            return Err(BackendError::invalid(
                "download",
                format!("{} bytes into a host buffer of {}", n, dst.len()),
            ));
        }
        self.copy_to_host(method, buf.ptr(), dst)
    }

    fn staging_buffers<'a>(&self, slot: &'a mut Option<Buffers>) -> Result<&'a Buffers, BackendError> {
        if slot.is_none() {
            let make = |wc| HostBuf::new(self, wc).map_err(|e| self.err("allocating pinned staging", e, CHUNK));
            *slot = Some(Buffers {
                up: [make(true)?, make(true)?],
                down: [make(false)?, make(false)?],
            });
        }
        Ok(slot.as_ref().expect("made above"))
    }

    /// `n` bytes from device address `from` to `to` by a kernel (16 bytes
    /// per thread where both are aligned), for mapped host memory.
    fn copy_kernel(&self, from: CUdeviceptr, to: CUdeviceptr, n: usize) -> Result<(), BackendError> {
        let aligned = from.is_multiple_of(16) && to.is_multiple_of(16);
        let name = if aligned { "copy_b1_v" } else { "copy_b1" };
        let f = self.function("elementwise", name)?;
        let layout = Strided::from_parts(&[n], &[1], 0).expect("one dim");
        let n64 = n as i64;
        let mut args = crate::launch::Launch::new(self, &f);
        args.arg(&from).arg(&layout).arg(&to).arg(&n64);
        let per_thread = if aligned { 16 } else { 1 };
        // SAFETY: copy_b1(_v)(x, layout, y, n) over `n` bytes that both
        // addresses hold.
        unsafe { args.launch(crate::launch::grid(n.div_ceil(per_thread), self.sm_count)) }
            .map_err(|e| self.launch_err(name, e))?;
        // Its launch took copy_to_device's flag: set it again, after it.
        self.serialize_next_launch();
        Ok(())
    }
}
