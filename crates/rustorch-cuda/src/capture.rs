//! Recording a pass's device work as a CUDA graph (`Backend::capture`) and
//! replaying it: a decode step's few hundred kernels, each costing the host
//! a launch (and our executor its routing), become one graph launch.
//!
//! While a pass records, the stream captures instead of running, so the
//! backend changes three things: buffers come from an arena owned by the
//! recording (fixed addresses that every replay reuses; the device pool's
//! stream-ordered allocations would become graph nodes with their own
//! lifetime rules), frees of other buffers wait for the capture's end (a
//! free queued now would be recorded and repeated at each replay), and
//! whatever needs the host to wait (downloads, synchronization, the bad-input
//! flags' read-back) fails or is skipped, as documented where it happens.

use crate::backend::CudaBackend;
use crate::buffer::{CudaBuffer, Memory, MemoryUse};
use cudarc::driver::sys;
use cudarc::driver::{CudaGraph, CudaSlice};
use rustorch_core::backend::Replay;
use rustorch_core::{BackendError, DType, Device};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

/// Buffers of a recording start on this boundary (cuBLAS and vector loads
/// want at least 16 bytes; the pool gives 256 too).
const ALIGN: usize = 256;

/// Device memory that a recording's buffers are cut from.
#[derive(Debug)]
pub(crate) struct Arena {
    memory: CudaBuffer,
}

/// A capture in progress (`MemoryUse::capture`).
#[derive(Debug)]
pub(crate) struct Recording {
    arena: Arc<Arena>,
    used: usize,
    /// Buffers dropped while recording, freed once it ends.
    deferred: Vec<CudaSlice<u8>>,
}

/// Keeps a freed slice until the capture ends (see `CudaBuffer`'s drop).
pub(crate) fn defer_free(usage: &MemoryUse, slice: CudaSlice<u8>) {
    if let Ok(mut c) = usage.capture.lock() {
        if let Some(rec) = c.as_mut() {
            rec.deferred.push(slice);
            return;
        }
    }
    drop(slice);
}

/// A finished recording: the graph, and the arena its buffers live in.
/// Fields drop in order: the graph goes before the memory it uses.
struct CudaReplay {
    device: Device,
    graph: Mutex<SendGraph>,
    _arena: Arc<Arena>,
}

/// cudarc's graph holds raw driver handles; one replay at a time goes
/// through the mutex, which is what the driver asks of a graph.
struct SendGraph(CudaGraph);

// SAFETY: the handles are used only under `CudaReplay::graph`'s lock, with
// the context bound by cudarc on each call.
unsafe impl Send for SendGraph {}

impl Replay for CudaReplay {
    fn replay(&self) -> Result<(), BackendError> {
        let g = self.graph.lock().map_err(|_| BackendError::Device {
            device: self.device,
            message: "a thread panicked while replaying this recording".into(),
        })?;
        g.0.launch()
            .map_err(|e| crate::error::driver(self.device, "replaying a recorded pass", e, 0))
    }
}

impl CudaBackend {
    /// A buffer of `len` elements of `dtype` cut from the running
    /// recording's arena; `OutOfMemory` when the arena is full.
    pub(crate) fn alloc_recorded(&self, dtype: DType, len: usize) -> Result<CudaBuffer, BackendError> {
        let bytes = len * dtype.size_in_bytes();
        let mut c = self.usage.capture.lock().map_err(|_| self.poisoned())?;
        let rec = c.as_mut().ok_or_else(|| BackendError::Device {
            device: self.device,
            message: "no recording to allocate from".into(),
        })?;
        let start = rec.used.div_ceil(ALIGN) * ALIGN;
        let size = rec.arena.memory.n_bytes();
        if start + bytes > size {
            return Err(BackendError::OutOfMemory {
                device: self.device,
                requested_bytes: bytes,
            });
        }
        rec.used = start + bytes;
        self.usage.handed_out.fetch_add(bytes as u64, Ordering::Relaxed);
        Ok(CudaBuffer {
            device: self.device,
            dtype,
            len,
            mem: Memory::Arena {
                arena: rec.arena.clone(),
                ptr: rec.arena.memory.ptr() + start as u64,
                bytes,
            },
            usage: self.usage.clone(),
            row_acts: None,
        })
    }

    /// An error for what cannot happen inside a recording, or `Ok`.
    pub(crate) fn not_recording(&self, what: &str) -> Result<(), BackendError> {
        if self.usage.capturing() {
            return Err(BackendError::unsupported(
                self.device,
                what,
                "the host cannot wait for the GPU inside a captured pass",
            ));
        }
        Ok(())
    }

    /// `Backend::capture`: see there and the module's comment.
    pub(crate) fn record(
        &self,
        arena_bytes: usize,
        pass: &mut (dyn FnMut() -> bool + Send),
    ) -> Result<Box<dyn Replay>, BackendError> {
        // Before the recording starts: a plain allocation.
        let arena = Arc::new(Arena {
            memory: self.alloc(DType::U8, arena_bytes.max(ALIGN))?,
        });
        {
            let mut c = self.usage.capture.lock().map_err(|_| self.poisoned())?;
            if c.is_some() {
                return Err(BackendError::invalid("capture", "this GPU is recording another pass"));
            }
            *c = Some(Recording {
                arena: arena.clone(),
                used: 0,
                deferred: Vec::new(),
            });
            self.usage.capturing.store(true, Ordering::Release);
        }
        // The stream leaves capture mode and the backend its recording
        // state however the pass ends (an error, a panic).
        struct Finish<'a> {
            b: &'a CudaBackend,
            capturing: bool,
        }
        impl Finish<'_> {
            fn end(&mut self) -> Result<Option<CudaGraph>, cudarc::driver::DriverError> {
                let graph = if std::mem::take(&mut self.capturing) {
                    self.b.stream.end_capture(sys::CUgraphInstantiate_flags_enum(0))
                } else {
                    Ok(None)
                };
                let rec = self.b.usage.capture.lock().ok().and_then(|mut c| c.take());
                self.b.usage.capturing.store(false, Ordering::Release);
                // Deferred frees run now, outside the recording.
                drop(rec);
                graph
            }
        }
        impl Drop for Finish<'_> {
            fn drop(&mut self) {
                let _ = self.end();
            }
        }
        let mut finish = Finish {
            b: self,
            capturing: false,
        };
        // Thread-local mode: a call on this thread that would wait for the
        // GPU fails (and invalidates the capture) instead of hanging or
        // running outside the graph; other threads are not affected.
        self.stream
            .begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .map_err(|e| self.err("starting a capture", e, 0))?;
        finish.capturing = true;
        let ok = pass();
        let graph = finish.end();
        if !ok {
            return Err(BackendError::invalid(
                "capture",
                "the pass failed; nothing was recorded",
            ));
        }
        let graph = graph
            .map_err(|e| self.err("ending a capture", e, 0))?
            .ok_or_else(|| BackendError::Device {
                device: self.device,
                message: "the driver returned no graph for the captured pass".into(),
            })?;
        // Uploads the graph's launch data now rather than at its first replay.
        graph
            .upload()
            .map_err(|e| self.err("uploading a recorded pass", e, 0))?;
        Ok(Box::new(CudaReplay {
            device: self.device,
            graph: Mutex::new(SendGraph(graph)),
            _arena: arena,
        }))
    }
}
