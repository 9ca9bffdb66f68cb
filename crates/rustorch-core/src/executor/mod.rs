//! The hybrid executor: routes each op to the best device that can run it,
//! moves inputs when it must, falls back on failure, and traces decisions.

mod config;
mod profile;
mod trace;

pub use config::ExecutorConfig;
pub use profile::{format_profile, OpProfile, ProfileMode};
pub use trace::{format_table, TraceEvent};

use crate::backend::{Backend, Buffer, TensorRef};
use crate::device::{Device, DeviceCapability};
use crate::error::{BackendError, Error, Result};
use crate::layout::Layout;
use crate::op::{infer_outputs, Op, TensorMeta};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// A tensor's data as the executor handles it: a buffer and a layout.
#[derive(Clone, Debug)]
pub struct Operand {
    pub buffer: Buffer,
    pub layout: Layout,
}

/// A device the executor knows, and whether it is in use.
#[derive(Clone, Debug)]
pub struct DeviceReport {
    pub device: Device,
    pub capability: DeviceCapability,
    /// `None` when the device is in use, else why it is not.
    pub disabled: Option<String>,
}

pub struct Executor {
    /// Backends in priority order; the CPU backend, when present, last.
    backends: Vec<Arc<dyn Backend>>,
    /// Registered backends that the configuration keeps out, with why.
    disabled: Vec<(Arc<dyn Backend>, String)>,
    config: ExecutorConfig,
    /// Devices a `BackendError::DeviceLost` took out of routing, with why.
    lost: Mutex<Vec<(Device, String)>>,
    /// Whether `lost` holds anything: routing reads this per op instead of
    /// taking the lock.
    any_lost: std::sync::atomic::AtomicBool,
    events: Mutex<Vec<TraceEvent>>,
    seq: AtomicU64,
    profiler: profile::Profiler,
    /// The device a `capture` is recording on, while one runs: ops then run
    /// there or fail, and nothing moves between devices.
    capturing: Mutex<Option<Device>>,
    /// Whether `capturing` holds a device: routing reads this per op.
    any_capture: std::sync::atomic::AtomicBool,
    /// One-element tensors of scalars already copied to a device
    /// (`device_scalar`), so that `x.mul_scalar(s)` on a GPU uploads `s`
    /// once, not per call, and can be recorded in a capture afterwards.
    scalars: Mutex<Vec<(Device, crate::dtype::DType, ScalarBits, Buffer)>>,
}

/// A scalar's exact bits, as a cache key (f64 has no `Eq`).
type ScalarBits = (u8, u64);

/// An op's start, when its time is read: the backend's timer and the host's
/// clock.
struct OpClock {
    timer: Box<dyn crate::backend::OpTimer>,
    host: Instant,
}

fn scalar_bits(s: crate::dtype::Scalar) -> ScalarBits {
    use crate::dtype::Scalar;
    match s {
        Scalar::Bool(b) => (0, b as u64),
        Scalar::Int(i) => (1, i as u64),
        Scalar::Float(f) => (2, f.to_bits()),
        Scalar::Complex(re, im) => (3, (re.to_bits() as u64) << 32 | im.to_bits() as u64),
    }
}

/// How many device scalars `device_scalar` keeps (a model uses a few dozen).
const MAX_DEVICE_SCALARS: usize = 512;

impl std::fmt::Debug for Executor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Executor")
            .field("devices", &self.devices())
            .field("config", &self.config)
            .finish()
    }
}

/// Which of several candidate devices an op should try, in order, and why.
struct Candidate {
    backend: Arc<dyn Backend>,
    reason: String,
}

impl Executor {
    /// An executor with every device the linked backends find
    /// (`registry`), highest priority first, the CPU last. Devices the
    /// configuration keeps out (`disable_gpu`) are listed by
    /// `device_reports` with why.
    pub fn new(config: ExecutorConfig) -> Self {
        Executor::from_backends(config, crate::registry::enumerate().backends)
    }

    /// An executor with exactly these backends (routing order: as given,
    /// any CPU backend moved last), and no others; a second backend for a
    /// device already taken is dropped.
    pub fn from_backends(config: ExecutorConfig, backends: Vec<Arc<dyn Backend>>) -> Self {
        let mut e = Executor {
            backends: Vec::new(),
            disabled: Vec::new(),
            lost: Mutex::new(Vec::new()),
            any_lost: std::sync::atomic::AtomicBool::new(false),
            config,
            events: Mutex::new(Vec::new()),
            seq: AtomicU64::new(0),
            profiler: profile::Profiler::default(),
            capturing: Mutex::new(None),
            any_capture: std::sync::atomic::AtomicBool::new(false),
            scalars: Mutex::new(Vec::new()),
        };
        for b in backends {
            let _ = e.register(b);
        }
        e
    }

    /// An executor configured from the environment, with the given
    /// accelerator backends (highest priority first) ahead of the devices
    /// the linked backends find.
    pub fn with_backends(config: ExecutorConfig, backends: Vec<Arc<dyn Backend>>) -> Result<Self> {
        let found = crate::registry::enumerate();
        let mut e = Executor::from_backends(config, Vec::new());
        for b in backends {
            e.register(b)?;
        }
        for b in found.backends {
            if e.backend(b.device()).is_none() {
                e.register(b)?;
            }
        }
        e.check_preferred()?;
        Ok(e)
    }

    /// The executor tensors use when none is given: the environment's
    /// configuration and every device the linked backends find. A bad
    /// `RUSTORCH_*` variable is reported on stderr once and ignored, since
    /// there is no caller to return it to; use `ExecutorConfig::from_env`
    /// to see it as an error.
    pub fn global() -> Arc<Executor> {
        static GLOBAL: OnceLock<Arc<Executor>> = OnceLock::new();
        GLOBAL
            .get_or_init(|| {
                let exec = ExecutorConfig::from_env()
                    .and_then(|c| Executor::with_backends(c, Vec::new()))
                    .unwrap_or_else(|e| {
                        eprintln!("rustorch: ignoring the environment's executor settings: {e}");
                        Executor::new(ExecutorConfig::default())
                    });
                Arc::new(exec)
            })
            .clone()
    }

    /// Adds a backend: ahead of the CPU (after accelerators registered
    /// before it), or last for the CPU itself.
    pub fn register(&mut self, backend: Arc<dyn Backend>) -> Result<()> {
        let dev = backend.device();
        if self
            .backends
            .iter()
            .chain(self.disabled.iter().map(|(b, _)| b))
            .any(|b| b.device() == dev)
        {
            return Err(Error::invalid(
                "register",
                format!("a backend for {dev} is already registered"),
            ));
        }
        if dev.is_cpu() {
            self.backends.push(backend);
            return Ok(());
        }
        if self.config.disable_gpu {
            self.disabled.push((
                backend,
                "disabled by RUSTORCH_DISABLE_GPU / ExecutorConfig::disable_gpu".into(),
            ));
            return Ok(());
        }
        let at = self
            .backends
            .iter()
            .position(|b| b.device().is_cpu())
            .unwrap_or(self.backends.len());
        self.backends.insert(at, backend);
        Ok(())
    }

    fn check_preferred(&self) -> Result<()> {
        if let Some(d) = self.config.preferred_device {
            if self.backend(d).is_none() {
                let reason = match self.disabled.iter().find(|(b, _)| b.device() == d) {
                    Some((_, why)) => why.clone(),
                    None => format!(
                        "no backend for it is compiled in or present (available: {})",
                        self.devices()
                            .iter()
                            .map(|d| d.to_string())
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                };
                return Err(Error::DeviceNotAvailable { device: d, reason });
            }
        }
        Ok(())
    }

    pub fn config(&self) -> &ExecutorConfig {
        &self.config
    }

    /// Devices in use, in priority order.
    pub fn devices(&self) -> Vec<Device> {
        self.backends.iter().map(|b| b.device()).collect()
    }

    /// Every device known, with capabilities, including disabled ones.
    pub fn device_reports(&self) -> Vec<DeviceReport> {
        let active = self.backends.iter().map(|b| DeviceReport {
            device: b.device(),
            capability: b.capability(),
            disabled: self.lost_reason(b.device()).map(|why| format!("lost: {why}")),
        });
        let off = self.disabled.iter().map(|(b, why)| DeviceReport {
            device: b.device(),
            capability: b.capability(),
            disabled: Some(why.clone()),
        });
        active.chain(off).collect()
    }

    /// The devices in use whose backend says it can run `op` on inputs like
    /// `inputs`, in routing order (a loader's "can anything run this?").
    pub fn devices_supporting(&self, op: &Op, inputs: &[TensorMeta]) -> Vec<Device> {
        self.backends
            .iter()
            .filter(|b| b.supports(op, inputs))
            .map(|b| b.device())
            .collect()
    }

    /// Why `device` was taken out of routing, if a fault took it out.
    pub fn lost_reason(&self, device: Device) -> Option<String> {
        let lost = self.lost.lock().ok()?;
        lost.iter().find(|(d, _)| *d == device).map(|(_, why)| why.clone())
    }

    fn is_lost(&self, device: Device) -> bool {
        self.any_lost.load(Ordering::Acquire) && self.lost.lock().is_ok_and(|l| l.iter().any(|(d, _)| *d == device))
    }

    /// Takes the device of a `DeviceLost` error out of routing (the first
    /// report wins; the device's later errors say the same).
    fn note(&self, e: &BackendError) {
        if let Some(device) = e.lost_device() {
            if let Ok(mut lost) = self.lost.lock() {
                if !lost.iter().any(|(d, _)| *d == device) {
                    lost.push((device, e.to_string()));
                    self.any_lost.store(true, Ordering::Release);
                }
            }
        }
    }

    /// `e` from `device` as the caller sees it, after `note`.
    fn backend_error(&self, op: impl Into<String>, device: Device, e: BackendError) -> Error {
        self.note(&e);
        Error::Backend {
            op: op.into(),
            device,
            source: e,
        }
    }

    /// Waits until every device has finished the work queued on it. A
    /// fault in that work is reported here (and its device leaves routing).
    pub fn synchronize(&self) -> Result<()> {
        for b in &self.backends {
            if self.is_lost(b.device()) {
                continue;
            }
            b.synchronize()
                .map_err(|e| self.backend_error("synchronize", b.device(), e))?;
        }
        Ok(())
    }

    pub fn backend(&self, device: Device) -> Option<&Arc<dyn Backend>> {
        self.backends.iter().find(|b| b.device() == device)
    }

    fn backend_or_err(&self, device: Device) -> Result<&Arc<dyn Backend>> {
        self.backend(device).ok_or_else(|| Error::DeviceNotAvailable {
            device,
            reason: "no backend registered with this executor".into(),
        })
    }

    /// Trace events recorded so far (empty unless tracing is on).
    pub fn trace(&self) -> Vec<TraceEvent> {
        self.events.lock().map(|e| e.clone()).unwrap_or_default()
    }

    pub fn clear_trace(&self) {
        if let Ok(mut e) = self.events.lock() {
            e.clear();
        }
    }

    /// The trace as a printable table.
    pub fn trace_table(&self) -> String {
        format_table(&self.trace())
    }

    /// Whether op times are summed (`ExecutorConfig::profile`).
    pub fn profiling(&self) -> bool {
        self.config.profile != ProfileMode::Off
    }

    /// Summed op times since the start or the last `clear_profile`, the
    /// most time first (empty unless profiling).
    pub fn profile(&self) -> Vec<OpProfile> {
        self.profiler.lines()
    }

    pub fn clear_profile(&self) {
        self.profiler.clear();
    }

    /// The profile as a printable table; `wall`, the wall time of the run
    /// it covers, adds the time spent outside ops.
    pub fn profile_table(&self, wall: Option<std::time::Duration>) -> String {
        format_profile(&self.profile(), wall)
    }

    /// The time an op starts, when tracing or profiling will read its
    /// duration: otherwise no clock is read (two reads per op, and on some
    /// virtual machines a clock read is a system call).
    fn op_clock(&self, backend: &dyn Backend) -> Option<OpClock> {
        (self.config.trace || self.config.profile != ProfileMode::Off).then(|| OpClock {
            timer: backend.timer(),
            host: Instant::now(),
        })
    }

    /// The time `clock` measured, and the host's time from the clock's
    /// start until now (issuing the op: moving inputs, the backend's own
    /// work; for an asynchronous device, before its work ends); a device
    /// fault found while reading it is the op's error.
    fn op_time(&self, op: &str, device: Device, clock: Option<OpClock>) -> Result<(Duration, Duration)> {
        match clock {
            None => Ok((Duration::ZERO, Duration::ZERO)),
            Some(c) => {
                let host = c.host.elapsed();
                let elapsed = c.timer.elapsed().map_err(|e| self.backend_error(op, device, e))?;
                Ok((elapsed, host))
            }
        }
    }

    /// Adds an op's time to the profile, when profiling (`op` names it).
    fn profile_op<'a>(
        &self,
        op: impl FnOnce() -> String,
        shapes: impl IntoIterator<Item = &'a crate::shape::Shape>,
        (elapsed, host): (Duration, Duration),
    ) {
        if self.config.profile != ProfileMode::Off {
            self.profiler.add(self.config.profile, op(), shapes, elapsed, host);
        }
    }

    fn record(&self, mut ev: TraceEvent) {
        if !self.config.trace {
            return;
        }
        ev.seq = self.seq.fetch_add(1, Ordering::Relaxed);
        if self.config.print_trace {
            eprint!(
                "{}",
                format_table(std::slice::from_ref(&ev))
                    .lines()
                    .nth(2)
                    .map(|l| format!("[rustorch trace] {l}\n"))
                    .unwrap_or_default()
            );
        }
        if let Ok(mut e) = self.events.lock() {
            e.push(ev);
        }
    }

    /// `f()`, many ops in a row (a forward pass, a generation loop), inside
    /// every backend's `Backend::run_pass` (the CPU's threads spin for the
    /// whole of it instead of sleeping between ops).
    pub fn run_pass<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        let mut f = Some(f);
        let mut out = None;
        nest_passes(&self.backends, &mut || {
            if let Some(f) = f.take() {
                out = Some(f());
            }
        });
        match (out, f) {
            (Some(r), _) => r,
            // A backend that broke the contract and dropped the pass.
            (None, Some(f)) => f(),
            (None, None) => unreachable!("the pass ran but left no result"),
        }
    }

    /// Runs `f` with the device work of its ops on `device` recorded for
    /// replay (`Backend::capture`) instead of run: `f`'s ops are queued
    /// into the recording, and their outputs (buffers in the recording's
    /// `arena_bytes` of memory) hold results only once the recording is
    /// replayed. While `f` runs, every op of this executor must run on
    /// `device` with its inputs already there: no fallback and no transfer
    /// (what would run elsewhere could not be replayed), so an op `device`
    /// lacks fails `f` instead. Tracing and profiling, which time each op,
    /// refuse a capture. Returns the recording and `f`'s value, or the
    /// first error (`f`'s own, else the backend's); nothing is kept then.
    pub fn capture<R: Send, E: From<Error> + Send>(
        &self,
        device: Device,
        arena_bytes: usize,
        f: impl FnOnce() -> std::result::Result<R, E> + Send,
    ) -> std::result::Result<(Box<dyn crate::backend::Replay>, R), E> {
        let backend = self.begin_capture(device)?;
        // Routing goes back to normal however `f` ends.
        struct End<'a>(&'a Executor);
        impl Drop for End<'_> {
            fn drop(&mut self) {
                if let Ok(mut c) = self.0.capturing.lock() {
                    *c = None;
                }
                self.0.any_capture.store(false, Ordering::Release);
            }
        }
        let _end = End(self);
        let mut f = Some(f);
        let mut out: Option<std::result::Result<R, E>> = None;
        let recorded = backend.capture(arena_bytes, &mut || {
            let r = f.take().map(|f| f());
            let ok = matches!(r, Some(Ok(_)));
            out = r;
            ok
        });
        match (recorded, out) {
            (Ok(replay), Some(Ok(r))) => Ok((replay, r)),
            (_, Some(Err(e))) => Err(e),
            (Err(e), _) => Err(self.backend_error("capture", device, e).into()),
            (Ok(_), None) => {
                Err(Error::invalid("capture", "the backend kept a recording without running the pass").into())
            }
        }
    }

    /// `capture`'s checks, and its routing state set: the backend to record on.
    fn begin_capture(&self, device: Device) -> Result<Arc<dyn Backend>> {
        const OP: &str = "capture";
        if self.config.trace || self.config.profile != ProfileMode::Off {
            return Err(Error::invalid(
                OP,
                "tracing or profiling is on: a recorded pass would hide each op's device and time",
            ));
        }
        if let Some(reason) = self.lost_reason(device) {
            return Err(Error::DeviceNotAvailable { device, reason });
        }
        let backend = self.backend_or_err(device)?.clone();
        let mut c = self
            .capturing
            .lock()
            .map_err(|_| Error::invalid(OP, "a thread panicked during a capture"))?;
        if let Some(d) = *c {
            return Err(Error::invalid(OP, format!("a capture on {d} is running already")));
        }
        *c = Some(device);
        self.any_capture.store(true, Ordering::Release);
        Ok(backend)
    }

    /// Queues a recording of `Executor::capture` made on `device` again.
    pub fn replay(&self, device: Device, recording: &dyn crate::backend::Replay) -> Result<()> {
        if let Some(reason) = self.lost_reason(device) {
            return Err(Error::DeviceNotAvailable { device, reason });
        }
        recording.replay().map_err(|e| self.backend_error("replay", device, e))
    }

    /// The device a running `capture` records on.
    fn capture_device(&self) -> Option<Device> {
        if !self.any_capture.load(Ordering::Acquire) {
            return None;
        }
        self.capturing.lock().ok().and_then(|c| *c)
    }

    /// Bytes `device`'s backend has handed out so far (`Backend::bytes_allocated`).
    pub fn bytes_allocated(&self, device: Device) -> Option<u64> {
        self.backend(device).and_then(|b| b.bytes_allocated())
    }

    /// Copies host data onto a device.
    pub fn upload(&self, host: crate::storage::HostSlice<'_>, device: Device) -> Result<Buffer> {
        let b = self.backend_or_err(device)?;
        b.upload(host).map_err(|e| self.backend_error("upload", device, e))
    }

    /// The one-element buffer holding `s` as `dtype` on `device`: made by
    /// `make` the first time, then shared (callers only read it). A scalar
    /// op on a GPU then copies its scalar over once, and a recorded pass
    /// (`capture`) can use scalars that an earlier run copied.
    pub(crate) fn device_scalar(
        &self,
        device: Device,
        dtype: crate::dtype::DType,
        s: crate::dtype::Scalar,
        make: impl FnOnce() -> Result<Buffer>,
    ) -> Result<Buffer> {
        let key = scalar_bits(s);
        let found = self.scalars.lock().ok().and_then(|v| {
            v.iter()
                .find(|e| e.0 == device && e.1 == dtype && e.2 == key)
                .map(|e| e.3.clone())
        });
        if let Some(b) = found {
            return Ok(b);
        }
        let b = make()?;
        if let Ok(mut v) = self.scalars.lock() {
            if v.len() < MAX_DEVICE_SCALARS {
                v.push((device, dtype, key, b.clone()));
            }
        }
        Ok(b)
    }

    /// `len` zeros of `dtype`, made on `device` (`Backend::alloc_zeroed`).
    pub fn alloc_zeroed(&self, device: Device, dtype: crate::dtype::DType, len: usize) -> Result<Buffer> {
        let b = self.backend_or_err(device)?;
        b.alloc_zeroed(dtype, len)
            .map_err(|e| self.backend_error("alloc_zeroed", device, e))
    }

    /// `Backend::alloc_host_readable` on `device`, or `alloc_zeroed` where
    /// the device has no such memory.
    pub fn alloc_host_readable(&self, device: Device, dtype: crate::dtype::DType, len: usize) -> Result<Buffer> {
        let b = self.backend_or_err(device)?;
        match b.alloc_host_readable(dtype, len) {
            Ok(Some(buf)) => Ok(buf),
            Ok(None) => self.alloc_zeroed(device, dtype, len),
            Err(e) => Err(self.backend_error("alloc_host_readable", device, e)),
        }
    }

    /// A GGML-typed weight on `device`, in the layout its backend prepares
    /// for `spec.usage` (`Backend::prepare_weight`).
    pub fn prepare_weight(
        &self,
        device: Device,
        spec: crate::backend::WeightSpec,
        bytes: std::borrow::Cow<'_, [u8]>,
    ) -> Result<Buffer> {
        let b = self.backend_or_err(device)?;
        b.prepare_weight(spec, bytes)
            .map_err(|e| self.backend_error("prepare_weight", device, e))
    }

    /// Copies a buffer back to host memory.
    pub fn download(&self, buffer: &Buffer) -> Result<crate::storage::CpuStorage> {
        if let Some(layout) = buffer.private_layout() {
            return Err(Error::invalid(
                "download",
                format!(
                    "a weight in {}'s own layout ({layout}) has no plain bytes to read",
                    buffer.device()
                ),
            ));
        }
        if let Some(s) = buffer.as_any().downcast_ref::<crate::storage::CpuStorage>() {
            return Ok(s.clone());
        }
        let device = buffer.device();
        let b = self.backend_or_err(device)?;
        b.download(buffer.as_ref())
            .map_err(|e| self.backend_error("download", device, e))
    }

    /// Moves a buffer to another device (a no-op when it is already there).
    pub fn transfer(&self, buffer: &Buffer, device: Device) -> Result<Buffer> {
        let from = buffer.device();
        if from == device {
            return Ok(buffer.clone());
        }
        let start = Instant::now();
        let out = match buffer.as_any().downcast_ref::<crate::storage::CpuStorage>() {
            Some(s) if buffer.private_layout().is_none() => self.upload(s.as_host(), device)?,
            _ => {
                let host = self.download(buffer)?;
                match device {
                    // The downloaded storage is a CPU buffer already (the
                    // CPU backend's upload would copy it once more).
                    Device::Cpu => Arc::new(host) as Buffer,
                    _ => self.upload(host.as_host(), device)?,
                }
            }
        };
        self.record(TraceEvent {
            seq: 0,
            op: "to_device".into(),
            input_shapes: vec![],
            dtype: buffer.dtype().to_string(),
            device,
            reason: format!("explicit transfer from {from}"),
            fallbacks: vec![],
            bytes_moved: buffer.len() * buffer.dtype().size_in_bytes(),
            elapsed: start.elapsed(),
        });
        Ok(out)
    }

    /// Writes `src` into the `region` of `dst` in place, on `dst`'s device
    /// (`src` moves there first when it lives elsewhere; a source of another
    /// dtype is converted as the cast op converts). `dst` must not be
    /// shared: in-place writes never change what another tensor sees.
    pub fn write_into(&self, dst: &mut Buffer, region: &Layout, src: &Operand) -> Result<()> {
        const OP: &str = "write_into";
        let device = dst.device();
        let backend = self.backend_or_err(device)?.clone();
        if region.shape() != src.layout.shape() {
            return Err(Error::shape(
                OP,
                "source shape differs from the destination region",
                &[region.shape(), src.layout.shape()],
            ));
        }
        let start = self.op_clock(backend.as_ref());
        if self.write_host_readable(OP, dst, region, src, &backend)? {
            return Ok(());
        }
        let (local, bytes_moved) = self.on_device(OP, &src.buffer, &backend)?;
        let target = unique_target(OP, dst)?;
        let src_ref = TensorRef {
            buffer: local.as_ref(),
            layout: &src.layout,
        };
        backend
            .write_into(target, region, src_ref)
            .map_err(|e| self.backend_error(OP, device, e))?;
        let (elapsed, host) = self.op_time(OP, device, start)?;
        self.profile_op(|| OP.into(), [src.layout.shape()], (elapsed, host));
        if self.config.trace {
            self.record(TraceEvent {
                seq: 0,
                op: OP.into(),
                input_shapes: vec![src.layout.shape().clone()],
                dtype: src.buffer.dtype().to_string(),
                device,
                reason: "destination's device".into(),
                fallbacks: vec![],
                bytes_moved,
                elapsed,
            });
        }
        Ok(())
    }

    /// `write_into`'s host-to-device case without an upload where it can
    /// be (`Backend::write_host_readable`: `dst` in host memory the device
    /// maps): a contiguous host source of `dst`'s dtype into a contiguous
    /// region, outside a recording. `false`: not such a case, or the
    /// backend declined; nothing was written.
    fn write_host_readable(
        &self,
        op: &str,
        dst: &mut Buffer,
        region: &Layout,
        src: &Operand,
        backend: &Arc<dyn Backend>,
    ) -> Result<bool> {
        let Some(host) = src.buffer.as_any().downcast_ref::<crate::storage::CpuStorage>() else {
            return Ok(false);
        };
        let n = region.shape().numel();
        if self.capture_device().is_some()
            || host.dtype() != dst.dtype()
            || !region.is_contiguous()
            || !src.layout.is_contiguous()
            || src.layout.offset() + n > host.len()
        {
            return Ok(false);
        }
        let target = unique_target(op, dst)?;
        let size = host.dtype().size_in_bytes();
        let bytes = &host.as_host().as_bytes()[src.layout.offset() * size..(src.layout.offset() + n) * size];
        backend
            .write_host_readable(&*target, region, bytes)
            .map_err(|e| self.backend_error(op, backend.device(), e))
    }

    /// `write_into` at a position read when the write runs
    /// (`Backend::write_into_at`): `region` is the region for position 0,
    /// moved by `pos * step` elements, where `pos` is a one-element I32 or
    /// I64 tensor that `dst`'s device reads itself (a GPU in its kernel, so
    /// a replayed CUDA graph writes where `pos` says at each replay). The
    /// region moved by `max_pos` steps must lie inside `dst`, and a
    /// position outside `0..=max_pos` is `InvalidInput` with nothing
    /// written. `src` and `pos` move to `dst`'s device when they live
    /// elsewhere; `dst` must not be shared, as for `write_into`.
    ///
    /// A backend without the method (the trait's default, unsupported)
    /// still gets the write: the position is read on the host (a download
    /// that waits for the device, so not for graph replay) and the moved
    /// region goes to its `write_into`.
    pub fn write_into_at(
        &self,
        dst: &mut Buffer,
        region: &Layout,
        step: usize,
        max_pos: usize,
        pos: &Operand,
        src: &Operand,
    ) -> Result<()> {
        const OP: &str = "write_into_at";
        let device = dst.device();
        let backend = self.backend_or_err(device)?.clone();
        if region.shape() != src.layout.shape() {
            return Err(Error::shape(
                OP,
                "source shape differs from the destination region",
                &[region.shape(), src.layout.shape()],
            ));
        }
        let pos_ref = TensorRef {
            buffer: pos.buffer.as_ref(),
            layout: &pos.layout,
        };
        crate::backend::check_write_at(dst.len(), region, step, max_pos, pos_ref).map_err(|m| Error::invalid(OP, m))?;
        let start = self.op_clock(backend.as_ref());
        let (local_src, src_moved) = self.on_device(OP, &src.buffer, &backend)?;
        let (local_pos, pos_moved) = self.on_device(OP, &pos.buffer, &backend)?;
        let target = unique_target(OP, dst)?;
        let src_ref = TensorRef {
            buffer: local_src.as_ref(),
            layout: &src.layout,
        };
        let pos_ref = TensorRef {
            buffer: local_pos.as_ref(),
            layout: &pos.layout,
        };
        let mut reason = "destination's device";
        match backend.write_into_at(target, region, step, max_pos, pos_ref, src_ref) {
            Ok(()) => {}
            Err(BackendError::Unsupported { .. }) => {
                // The documented fallback: the position read on the host
                // from the buffer the caller gave (no copy of host memory).
                let downloaded;
                let host = match pos.buffer.as_any().downcast_ref::<crate::storage::CpuStorage>() {
                    Some(s) => s,
                    None => {
                        downloaded = self.download(&pos.buffer)?;
                        &downloaded
                    }
                };
                let at =
                    crate::backend::write_pos_on_host(host, &pos.layout, max_pos).map_err(|m| Error::invalid(OP, m))?;
                backend
                    .write_into(target, &region.shifted(at * step), src_ref)
                    .map_err(|e| self.backend_error(OP, device, e))?;
                reason = "destination's device (position read on the host: no write_into_at there)";
            }
            Err(e) => return Err(self.backend_error(OP, device, e)),
        }
        let (elapsed, host) = self.op_time(OP, device, start)?;
        self.profile_op(|| OP.into(), [src.layout.shape()], (elapsed, host));
        if self.config.trace {
            self.record(TraceEvent {
                seq: 0,
                op: OP.into(),
                input_shapes: vec![src.layout.shape().clone(), pos.layout.shape().clone()],
                dtype: src.buffer.dtype().to_string(),
                device,
                reason: reason.into(),
                fallbacks: vec![],
                bytes_moved: src_moved + pos_moved,
                elapsed,
            });
        }
        Ok(())
    }

    /// `Backend::rope_write_kv_at` on the caches' device, where every input
    /// already is: `Some` rotated queries, or `None` where the backend does
    /// not fuse this case or the inputs are elsewhere (the caller then runs
    /// the ops one by one). Both regions are checked as `write_into_at`
    /// checks its region.
    #[allow(clippy::too_many_arguments)]
    pub fn rope_write_kv_at(
        &self,
        kc: &mut Buffer,
        vc: &mut Buffer,
        k_at: (&Layout, usize),
        v_at: (&Layout, usize),
        max_pos: usize,
        pos: &Operand,
        layout: crate::op::RopeLayout,
        qkv: [&Operand; 3],
        cos_sin: [&Operand; 2],
    ) -> Result<Option<Buffer>> {
        self.fused_kv_write(
            "rope_write_kv_at",
            (kc, vc),
            (k_at, v_at, max_pos, pos),
            &[qkv[0], qkv[1], qkv[2], cos_sin[0], cos_sin[1]],
            |b, kt, vt, at| b.rope_write_kv_at(kt, vt, at, layout, qkv.map(operand_ref), cos_sin.map(operand_ref)),
        )
    }

    /// `Backend::rope_attention_at` on the caches' device, where every input
    /// already is: `Some` attention output, or `None` where the backend
    /// does not fuse this case or the inputs are elsewhere (the caller then
    /// runs the ops one by one, nothing having been written). `caches` are
    /// kc's and vc's layouts as the attention reads them; the regions are
    /// checked as for `rope_write_kv_at`.
    #[allow(clippy::too_many_arguments)]
    pub fn rope_attention_at(
        &self,
        (kc, vc): (&mut Buffer, &mut Buffer),
        caches: [&Layout; 2],
        (k_at, v_at, max_pos): ((&Layout, usize), (&Layout, usize), usize),
        pos: &Operand,
        layout: crate::op::RopeLayout,
        qkv: [&Operand; 3],
        tables: [&Operand; 2],
        attention: (f32, Option<usize>),
    ) -> Result<Option<Buffer>> {
        self.fused_kv_write(
            "rope_attention_at",
            (kc, vc),
            (k_at, v_at, max_pos, pos),
            &[qkv[0], qkv[1], qkv[2], tables[0], tables[1]],
            |b, kt, vt, at| {
                b.rope_attention_at(
                    kt,
                    vt,
                    at,
                    caches,
                    layout,
                    qkv.map(operand_ref),
                    tables.map(operand_ref),
                    attention,
                )
            },
        )
    }

    /// A backend call that writes the key and value caches at a position
    /// (`call`, given the caches and the checked `KvWriteAt`) where the
    /// caches, `pos` and every one of `inputs` are on one device: its
    /// output, or `None` where they are not or the backend declines.
    #[allow(clippy::type_complexity)]
    fn fused_kv_write(
        &self,
        op: &'static str,
        (kc, vc): (&mut Buffer, &mut Buffer),
        ((k_region, k_step), (v_region, v_step), max_pos, pos): ((&Layout, usize), (&Layout, usize), usize, &Operand),
        inputs: &[&Operand],
        call: impl FnOnce(
            &dyn Backend,
            &mut dyn crate::backend::DeviceBuffer,
            &mut dyn crate::backend::DeviceBuffer,
            &crate::backend::KvWriteAt<'_>,
        ) -> std::result::Result<Buffer, BackendError>,
    ) -> Result<Option<Buffer>> {
        let device = kc.device();
        if vc.device() != device || inputs.iter().chain([&pos]).any(|o| o.buffer.device() != device) {
            return Ok(None);
        }
        let backend = self.backend_or_err(device)?.clone();
        for (dst, region, step) in [(&*kc, k_region, k_step), (&*vc, v_region, v_step)] {
            crate::backend::check_write_at(dst.len(), region, step, max_pos, operand_ref(pos))
                .map_err(|m| Error::invalid(op, m))?;
        }
        let start = self.op_clock(backend.as_ref());
        let at = crate::backend::KvWriteAt {
            k_region,
            k_step,
            v_region,
            v_step,
            max_pos,
            pos: operand_ref(pos),
        };
        let kt = unique_target(op, kc)?;
        let vt = unique_target(op, vc)?;
        let out = match call(backend.as_ref(), kt, vt, &at) {
            Ok(out) => out,
            Err(BackendError::Unsupported { .. }) => return Ok(None),
            Err(e) => return Err(self.backend_error(op, device, e)),
        };
        let (elapsed, host) = self.op_time(op, device, start)?;
        self.profile_op(|| op.into(), [inputs[0].layout.shape()], (elapsed, host));
        if self.config.trace {
            self.record(TraceEvent {
                seq: 0,
                op: op.into(),
                input_shapes: inputs.iter().chain([&pos]).map(|o| o.layout.shape().clone()).collect(),
                dtype: inputs[0].buffer.dtype().to_string(),
                device,
                reason: "the caches' device (one fused launch)".into(),
                fallbacks: vec![],
                bytes_moved: 0,
                elapsed,
            });
        }
        Ok(Some(out))
    }

    /// `buffer` on `backend`'s device for an in-place write there, and the
    /// bytes moved to put it there (0 when it already was).
    fn on_device(&self, op: &str, buffer: &Buffer, backend: &Arc<dyn Backend>) -> Result<(Buffer, usize)> {
        let device = backend.device();
        if buffer.device() == device {
            return Ok((buffer.clone(), 0));
        }
        let moved = self
            .move_for_op(buffer, backend)
            .map_err(|e| self.backend_error(op, device, e))?;
        Ok((moved, buffer.len() * buffer.dtype().size_in_bytes()))
    }

    /// Validates and runs one op, choosing the device, and returns its
    /// outputs (contiguous, on the device that ran it).
    pub fn execute(&self, op: &Op, inputs: &[Operand]) -> Result<Vec<(Buffer, TensorMeta)>> {
        let metas: Vec<TensorMeta> = inputs
            .iter()
            .map(|i| TensorMeta::new(i.layout.shape().clone(), i.buffer.dtype()))
            .collect();
        let outputs = infer_outputs(op, &metas)?;
        if self.backends.is_empty() {
            return Err(Error::DeviceNotAvailable {
                device: Device::Cpu,
                reason: "this executor has no backend: the program links no backend crate (depend on `rustorch`, or on `rustorch-cpu` and use it)".into(),
            });
        }
        if let Some(parts) = self.parts_to_run(op, &metas, inputs) {
            return self.execute_parts(&parts, inputs);
        }
        let mut candidates = self.candidates(op, &metas, inputs, &outputs);
        if let Some(device) = self.capture_device() {
            // A recording replays one device's work: the op runs there or
            // the capture fails.
            candidates.retain(|c| c.backend.device() == device);
            candidates.truncate(1);
            if candidates.is_empty() {
                return Err(Error::NoDeviceCouldRun {
                    op: op.name(),
                    attempts: vec![(
                        device,
                        BackendError::unsupported(
                            device,
                            op.name(),
                            "inside a captured pass, and this device does not support it",
                        ),
                    )],
                });
            }
        } else if self.config.strict {
            // One device, the preferred one where set, and no fallback.
            let want = self
                .config
                .preferred_device
                .or_else(|| candidates.first().map(|c| c.backend.device()));
            candidates.retain(|c| Some(c.backend.device()) == want);
            candidates.truncate(1);
            if candidates.is_empty() {
                let device = want.unwrap_or(Device::Cpu);
                return Err(Error::NoDeviceCouldRun {
                    op: op.name(),
                    attempts: vec![(
                        device,
                        BackendError::unsupported(
                            device,
                            op.name(),
                            "strict mode (no fallback): this device does not support it",
                        ),
                    )],
                });
            }
        }
        let mut attempts: Vec<(Device, BackendError)> = Vec::new();
        // Counts copies made for failed attempts too: they cost the same.
        let mut bytes_moved = 0usize;
        for cand in candidates {
            let device = cand.backend.device();
            let mut local: Vec<Buffer> = Vec::with_capacity(inputs.len());
            let mut moved_ok = true;
            for i in inputs {
                if i.buffer.device() == device {
                    local.push(i.buffer.clone());
                    continue;
                }
                match self.move_for_op(&i.buffer, &cand.backend) {
                    Ok(b) => {
                        bytes_moved += i.buffer.len() * i.buffer.dtype().size_in_bytes();
                        local.push(b);
                    }
                    Err(e) => {
                        self.note(&e);
                        attempts.push((device, e));
                        moved_ok = false;
                        break;
                    }
                }
            }
            if !moved_ok {
                continue;
            }
            let refs: Vec<TensorRef<'_>> = local
                .iter()
                .zip(inputs)
                .map(|(b, i)| TensorRef {
                    buffer: b.as_ref(),
                    layout: &i.layout,
                })
                .collect();
            let start = self.op_clock(cand.backend.as_ref());
            match cand.backend.execute(op, &refs, &outputs) {
                Ok(bufs) => {
                    // A backend's bad output would only fail later, far from
                    // its cause (a short buffer panics when read): treat it
                    // as a device error here, and fall back.
                    if let Some(message) = bad_outputs(device, &bufs, &outputs) {
                        attempts.push((device, BackendError::Device { device, message }));
                        continue;
                    }
                    let (elapsed, host) = self.op_time(&op.name(), device, start)?;
                    self.profile_op(|| op.name(), metas.iter().map(|m| &m.shape), (elapsed, host));
                    if self.config.trace {
                        self.record(TraceEvent {
                            seq: 0,
                            op: op.name(),
                            input_shapes: metas.iter().map(|m| m.shape.clone()).collect(),
                            dtype: metas
                                .first()
                                .or(outputs.first())
                                .map(|m| m.dtype.to_string())
                                .unwrap_or_default(),
                            device,
                            reason: cand.reason,
                            fallbacks: attempts.iter().map(|(d, e)| (*d, e.to_string())).collect(),
                            bytes_moved,
                            elapsed,
                        });
                    }
                    return Ok(bufs.into_iter().zip(outputs).collect());
                }
                Err(e) if e.allows_fallback() => {
                    self.note(&e);
                    attempts.push((device, e));
                }
                Err(e) => return Err(self.backend_error(op.name(), device, e)),
            }
        }
        Err(Error::NoDeviceCouldRun {
            op: op.name(),
            attempts,
        })
    }

    /// A fused op's parts (`Op::decompose`), when it should run as them:
    /// the device it would go to first (the preferred one, else the one
    /// holding its inputs) lacks the fused op but runs every part, so the
    /// op stays where its data is. The decomposition is built only then:
    /// with host data and no preferred device (every CPU-only run) this
    /// returns before any allocation.
    fn parts_to_run(&self, op: &Op, metas: &[TensorMeta], inputs: &[Operand]) -> Option<crate::op::Decomposition> {
        let first = self
            .config
            .preferred_device
            .or_else(|| resident_device(inputs))
            .filter(|d| !self.is_lost(*d))?;
        let backend = self.backend(first)?;
        if backend.supports(op, metas) {
            return None;
        }
        let parts = op.decompose()?;
        let mut step_metas: Vec<Vec<TensorMeta>> = Vec::with_capacity(parts.steps.len());
        for step in &parts.steps {
            let ins: Vec<TensorMeta> = step
                .inputs
                .iter()
                .map(|v| step_value(v, metas, &step_metas).cloned())
                .collect::<Option<_>>()?;
            if !backend.supports(&step.op, &ins) {
                return None;
            }
            step_metas.push(infer_outputs(&step.op, &ins).ok()?);
        }
        Some(parts)
    }

    /// Runs a fused op's parts one by one (each routed as any op is, so
    /// each goes where the data is).
    fn execute_parts(&self, parts: &crate::op::Decomposition, inputs: &[Operand]) -> Result<Vec<(Buffer, TensorMeta)>> {
        let mut done: Vec<Vec<(Buffer, TensorMeta)>> = Vec::with_capacity(parts.steps.len());
        let operand = |v: &crate::op::StepValue, done: &[Vec<(Buffer, TensorMeta)>]| -> Result<Operand> {
            match *v {
                crate::op::StepValue::Input(i) => inputs
                    .get(i)
                    .cloned()
                    .ok_or_else(|| Error::invalid("decompose", format!("a part reads input {i}, which is missing"))),
                crate::op::StepValue::Output { step, index } => done
                    .get(step)
                    .and_then(|outs| outs.get(index))
                    .map(|(b, m)| Operand {
                        buffer: b.clone(),
                        layout: Layout::contiguous(m.shape.clone()),
                    })
                    .ok_or_else(|| Error::invalid("decompose", "a part reads a value no earlier part made")),
            }
        };
        for step in &parts.steps {
            let ins = step
                .inputs
                .iter()
                .map(|v| operand(v, &done))
                .collect::<Result<Vec<_>>>()?;
            done.push(self.execute(&step.op, &ins)?);
        }
        parts
            .outputs
            .iter()
            .map(|v| {
                operand(v, &done).map(|o| {
                    let meta = TensorMeta::new(o.layout.shape().clone(), o.buffer.dtype());
                    (o.buffer, meta)
                })
            })
            .collect()
    }

    /// Copies a buffer to the device of `target`, through host memory.
    fn move_for_op(&self, buffer: &Buffer, target: &Arc<dyn Backend>) -> std::result::Result<Buffer, BackendError> {
        if self.capture_device().is_some() {
            return Err(BackendError::unsupported(
                target.device(),
                "move",
                format!(
                    "inside a captured pass an input must live on the device already (this one is on {})",
                    buffer.device()
                ),
            ));
        }
        if let Some(layout) = buffer.private_layout() {
            return Err(BackendError::unsupported(
                target.device(),
                "move",
                format!(
                    "an input is a weight in {}'s own layout ({layout}); prepare it for {} instead",
                    buffer.device(),
                    target.device()
                ),
            ));
        }
        if let Some(s) = buffer.as_any().downcast_ref::<crate::storage::CpuStorage>() {
            return target.upload(s.as_host());
        }
        let src = self.backend(buffer.device()).ok_or_else(|| BackendError::Device {
            device: buffer.device(),
            message: "input lives on a device with no registered backend".into(),
        })?;
        let host = src.download(buffer.as_ref())?;
        target.upload(host.as_host())
    }

    /// Devices to try, best first: the preferred device, then the device the
    /// inputs already live on, then the priority chain. Accelerators that
    /// would need inputs copied for a small op are left to the CPU.
    fn candidates(&self, op: &Op, metas: &[TensorMeta], inputs: &[Operand], outputs: &[TensorMeta]) -> Vec<Candidate> {
        let mut out: Vec<Candidate> = Vec::new();
        let push = |b: &Arc<dyn Backend>, reason: String, out: &mut Vec<Candidate>| {
            if !out.iter().any(|c| c.backend.device() == b.device()) {
                out.push(Candidate {
                    backend: b.clone(),
                    reason,
                });
            }
        };
        let supported = |b: &Arc<dyn Backend>| !self.is_lost(b.device()) && b.supports(op, metas);
        if let Some(d) = self.config.preferred_device {
            if let Some(b) = self.backend(d) {
                if supported(b) {
                    push(b, "preferred device".into(), &mut out);
                }
            }
        }
        if let Some(d) = resident_device(inputs) {
            if let Some(b) = self.backend(d) {
                if supported(b) {
                    push(b, "inputs already there".into(), &mut out);
                }
            }
        }
        let out_elems: usize = outputs.iter().map(|m| m.shape.numel()).sum();
        // Reasons are only spelled out when someone will read them.
        let tracing = self.config.trace;
        let mut skipped: Vec<String> = Vec::new();
        for b in &self.backends {
            let d = b.device();
            if !supported(b) {
                if tracing {
                    let why = if self.is_lost(d) { "lost" } else { "lacks it" };
                    skipped.push(format!("{d} {why}"));
                }
                continue;
            }
            if !d.is_cpu() && out_elems < self.config.min_offload_elems {
                if tracing {
                    skipped.push(format!("{d}: below offload size"));
                }
                continue;
            }
            // A device after another candidate only runs when that one failed.
            let which = if out.is_empty() { "first" } else { "next" };
            let reason = if !tracing {
                String::new()
            } else if skipped.is_empty() {
                format!("{which} capable in chain")
            } else {
                format!("{which} capable in chain ({})", skipped.join(", "))
            };
            push(b, reason, &mut out);
        }
        out
    }
}

/// The device holding most input bytes, if not the CPU.
fn resident_device(inputs: &[Operand]) -> Option<Device> {
    let mut resident: Option<(Device, usize)> = None;
    for i in inputs {
        let d = i.buffer.device();
        let bytes = i.buffer.len() * i.buffer.dtype().size_in_bytes();
        if !d.is_cpu() && resident.is_none_or(|(_, b)| bytes > b) {
            resident = Some((d, bytes));
        }
    }
    resident.map(|(d, _)| d)
}

/// The metadata of a step's value, given the fused op's inputs and the
/// outputs of the steps before.
fn step_value<'a>(
    v: &crate::op::StepValue,
    inputs: &'a [TensorMeta],
    steps: &'a [Vec<TensorMeta>],
) -> Option<&'a TensorMeta> {
    match *v {
        crate::op::StepValue::Input(i) => inputs.get(i),
        crate::op::StepValue::Output { step, index } => steps.get(step)?.get(index),
    }
}

/// `pass` inside the `run_pass` of `backends[0]`, inside that of `backends[1]`, ...
fn nest_passes(backends: &[Arc<dyn Backend>], pass: &mut (dyn FnMut() + Send)) {
    match backends.split_first() {
        None => pass(),
        Some((first, rest)) => first.run_pass(&mut || nest_passes(rest, pass)),
    }
}

/// Why `bufs` cannot be the outputs `want` of an op run on `device`, if so.
fn bad_outputs(device: Device, bufs: &[Buffer], want: &[TensorMeta]) -> Option<String> {
    if bufs.len() != want.len() {
        return Some(format!("returned {} outputs, expected {}", bufs.len(), want.len()));
    }
    bufs.iter().zip(want).enumerate().find_map(|(i, (b, m))| {
        if b.device() != device {
            Some(format!("returned output {i} on {}", b.device()))
        } else if b.dtype() != m.dtype || b.len() != m.shape.numel() {
            Some(format!(
                "returned output {i} as {} elements of {}, expected {} of {}",
                b.len(),
                b.dtype(),
                m.shape.numel(),
                m.dtype
            ))
        } else {
            None
        }
    })
}

/// An operand as a backend reads it.
fn operand_ref(o: &Operand) -> TensorRef<'_> {
    TensorRef {
        buffer: o.buffer.as_ref(),
        layout: &o.layout,
    }
}

/// The destination of an in-place write, which no other tensor may share:
/// a write must not change what a view or a clone sees.
fn unique_target<'a>(op: &str, dst: &'a mut Buffer) -> Result<&'a mut dyn crate::backend::DeviceBuffer> {
    let others = Arc::strong_count(dst) - 1;
    Arc::get_mut(dst).ok_or_else(|| {
        Error::invalid(
            op,
            format!("the destination's storage is shared with {others} other tensor(s) or view(s); drop them first"),
        )
    })
}
