//! `FaultyBackend`: a second device that computes with another backend's kernels and fails on
//! request, to prove routing, fallback, strict mode and lost-device handling without hardware.
//!
//! It is a real separate device (`Device::Plugin(n)` by default): it owns its buffers
//! (`FaultyBuffer`), so data only reaches it through `upload` and only comes back through
//! `download`, and the executor must move whatever lives elsewhere. Without faults its results are
//! the wrapped backend's bit for bit (the CPU's, by default), which makes it a conformance target
//! that must pass everything.
//!
//! Every `Backend` method is written once, in the one `impl Backend for FaultyBackend` below, as
//! "inject the configured fault, then delegate to the inner backend with the buffers unwrapped":
//! a method added to the trait is one more delegating method there.

use rustorch_core::backend::{Backend, Buffer, DeviceBuffer, OpTimer, TensorRef, WeightSpec};
use rustorch_core::device::DeviceCapability;
use rustorch_core::{BackendError, CpuStorage, DType, Device, HostSlice, Layout, Op, TensorMeta};
use rustorch_cpu::CpuBackend;
use std::any::Any;
use std::borrow::Cow;
use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

/// The device a `FaultyBackend` takes unless told otherwise.
pub const DEFAULT_DEVICE: Device = Device::Plugin(0);

/// Memory on a `FaultyBackend`'s device: the inner backend's buffer, wrapped so that the executor
/// cannot take it for host memory (it is not a `CpuStorage`) and every move goes through the
/// wrapper.
#[derive(Debug)]
pub struct FaultyBuffer {
    device: Device,
    inner: Buffer,
}

impl FaultyBuffer {
    /// The wrapped backend's buffer.
    pub fn inner(&self) -> &Buffer {
        &self.inner
    }
}

impl DeviceBuffer for FaultyBuffer {
    fn device(&self) -> Device {
        self.device
    }
    fn dtype(&self) -> DType {
        self.inner.dtype()
    }
    fn len(&self) -> usize {
        self.inner.len()
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
    fn private_layout(&self) -> Option<&'static str> {
        self.inner.private_layout()
    }
    fn as_any_mut(&mut self) -> Option<&mut dyn Any> {
        Some(self)
    }
}

/// A backend wrapper that injects faults: built with [`FaultyBackend::new`] (CPU kernels) or
/// [`FaultyBackend::wrapping`], then configured with the builder methods. Each fault is one of
/// the ways a real device fails:
///
/// - [`refuse_op`](Self::refuse_op), [`refuse_dtype`](Self::refuse_dtype): `supports` says no
///   (an op or dtype the device has no kernel for);
/// - [`oom_after`](Self::oom_after): `OutOfMemory` once a number of uploads and executions
///   succeeded;
/// - [`fail_op`](Self::fail_op): `BackendError::Device` from an op's execution (a kernel fault);
/// - [`reject_op`](Self::reject_op): `BackendError::InvalidInput` (the caller's mistake, which
///   the executor must not retry elsewhere);
/// - [`short_output`](Self::short_output), [`host_output`](Self::host_output): a buggy kernel
///   whose outputs are one element short, or come back in host memory;
/// - [`fault_later`](Self::fault_later): an op that seems to succeed, whose fault surfaces at the
///   next call (as a GPU kernel's illegal address surfaces at the next synchronization): from
///   then on the device is lost;
/// - [`lose`](Self::lose): the device is lost; every later call reports `DeviceLost`.
pub struct FaultyBackend {
    inner: Arc<dyn Backend>,
    device: Device,
    name: String,
    refused_ops: HashSet<String>,
    refused_dtypes: HashSet<DType>,
    oom_after: Option<usize>,
    failing_ops: HashSet<String>,
    rejecting_ops: HashSet<String>,
    short_output_ops: HashSet<String>,
    host_output_ops: HashSet<String>,
    late_fault_ops: HashSet<String>,
    op_time: Option<std::time::Duration>,
    lost: AtomicBool,
    uploads: AtomicUsize,
    downloads: AtomicUsize,
    executes: AtomicUsize,
    /// Uploads and executions attempted, counted against `oom_after`.
    work: AtomicUsize,
}

impl std::fmt::Debug for FaultyBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FaultyBackend")
            .field("device", &self.device)
            .field("inner", &self.inner.device())
            .finish_non_exhaustive()
    }
}

impl Default for FaultyBackend {
    fn default() -> Self {
        FaultyBackend::new()
    }
}

impl FaultyBackend {
    /// The CPU kernels as `Device::Plugin(0)`, with no faults.
    pub fn new() -> Self {
        FaultyBackend::wrapping(Arc::new(CpuBackend::new()))
    }

    /// `inner`'s kernels as `Device::Plugin(0)`, with no faults.
    pub fn wrapping(inner: Arc<dyn Backend>) -> Self {
        FaultyBackend {
            inner,
            device: DEFAULT_DEVICE,
            name: "fault-injecting test device".into(),
            refused_ops: HashSet::new(),
            refused_dtypes: HashSet::new(),
            oom_after: None,
            failing_ops: HashSet::new(),
            rejecting_ops: HashSet::new(),
            short_output_ops: HashSet::new(),
            host_output_ops: HashSet::new(),
            late_fault_ops: HashSet::new(),
            op_time: None,
            lost: AtomicBool::new(false),
            uploads: AtomicUsize::new(0),
            downloads: AtomicUsize::new(0),
            executes: AtomicUsize::new(0),
            work: AtomicUsize::new(0),
        }
    }

    /// Another device than `Device::Plugin(0)`, to register several.
    pub fn on(mut self, device: Device) -> Self {
        self.device = device;
        self
    }
    /// The name `capability()` reports.
    pub fn named(mut self, name: &str) -> Self {
        self.name = name.to_string();
        self
    }
    /// `supports` says no to this op (`Op::name`). `"write_into_at"`, which is a method of its
    /// own rather than an op, answers unsupported when refused, as a backend without it does.
    pub fn refuse_op(mut self, name: &str) -> Self {
        self.refused_ops.insert(name.to_string());
        self
    }
    /// `supports` says no to ops with an input of this dtype, and casts to it.
    pub fn refuse_dtype(mut self, d: DType) -> Self {
        self.refused_dtypes.insert(d);
        self
    }
    /// `n` uploads and executions succeed, every later one is out of memory.
    pub fn oom_after(mut self, n: usize) -> Self {
        self.oom_after = Some(n);
        self
    }
    /// Executing this op reports a device error.
    pub fn fail_op(mut self, name: &str) -> Self {
        self.failing_ops.insert(name.to_string());
        self
    }
    /// Executing this op reports `InvalidInput`.
    pub fn reject_op(mut self, name: &str) -> Self {
        self.rejecting_ops.insert(name.to_string());
        self
    }
    /// This op's outputs come back one element short.
    pub fn short_output(mut self, name: &str) -> Self {
        self.short_output_ops.insert(name.to_string());
        self
    }
    /// This op's outputs come back in host memory, not on the device.
    pub fn host_output(mut self, name: &str) -> Self {
        self.host_output_ops.insert(name.to_string());
        self
    }
    /// Executing this op returns outputs, then loses the device: the fault surfaces at the next
    /// call (a download of those outputs, the next op, a synchronization).
    pub fn fault_later(mut self, name: &str) -> Self {
        self.late_fault_ops.insert(name.to_string());
        self
    }
    /// Every op takes `d` by this device's clock (`Backend::timer`), as a device that times
    /// its queued work with events reports it.
    pub fn timed(mut self, d: std::time::Duration) -> Self {
        self.op_time = Some(d);
        self
    }
    /// Whether the device is lost.
    pub fn is_lost(&self) -> bool {
        self.lost.load(Ordering::SeqCst)
    }
    /// Loses the device now: every later call reports `DeviceLost`.
    pub fn lose(&self) {
        self.lost.store(true, Ordering::SeqCst);
    }
    /// Successful uploads so far.
    pub fn uploads(&self) -> usize {
        self.uploads.load(Ordering::SeqCst)
    }
    /// Successful downloads so far.
    pub fn downloads(&self) -> usize {
        self.downloads.load(Ordering::SeqCst)
    }
    /// Successful executions so far.
    pub fn executes(&self) -> usize {
        self.executes.load(Ordering::SeqCst)
    }

    /// Counts one unit of work, failing once the memory budget is spent.
    fn spend(&self, bytes: usize) -> Result<(), BackendError> {
        let done = self.work.fetch_add(1, Ordering::SeqCst);
        match self.oom_after {
            Some(n) if done >= n => Err(BackendError::OutOfMemory {
                device: self.device,
                requested_bytes: bytes,
            }),
            _ => Ok(()),
        }
    }

    fn check_alive(&self) -> Result<(), BackendError> {
        if self.lost.load(Ordering::SeqCst) {
            return Err(BackendError::DeviceLost {
                device: self.device,
                message: "device lost".into(),
            });
        }
        Ok(())
    }

    /// The inner buffer of one of this device's buffers; anything else is the executor's bug.
    fn own<'a>(&self, op: &str, b: &'a dyn DeviceBuffer) -> Result<&'a dyn DeviceBuffer, BackendError> {
        match b.as_any().downcast_ref::<FaultyBuffer>() {
            Some(p) if p.device == self.device => Ok(p.inner.as_ref()),
            _ => Err(BackendError::invalid(
                op,
                format!("input lives on {}, not on {}", b.device(), self.device),
            )),
        }
    }

    fn wrap(&self, inner: Buffer) -> Buffer {
        Arc::new(FaultyBuffer {
            device: self.device,
            inner,
        })
    }
}

impl Backend for FaultyBackend {
    fn device(&self) -> Device {
        self.device
    }

    fn capability(&self) -> DeviceCapability {
        let mut cap = self.inner.capability();
        cap.name = self.name.clone();
        cap.dtypes.retain(|d| !self.refused_dtypes.contains(d));
        cap.features
            .push(format!("computes with {}'s kernels", self.inner.device()));
        cap
    }

    fn supports(&self, op: &Op, inputs: &[TensorMeta]) -> bool {
        let cast_target = match op {
            Op::Cast { to } => Some(*to),
            _ => None,
        };
        self.inner.supports(op, inputs)
            && !self.refused_ops.contains(&op.name())
            && !inputs
                .iter()
                .map(|m| m.dtype)
                .chain(cast_target)
                .any(|d| self.refused_dtypes.contains(&d))
    }

    fn upload(&self, host: HostSlice<'_>) -> Result<Buffer, BackendError> {
        self.check_alive()?;
        self.spend(host.len() * host.dtype().size_in_bytes())?;
        let inner = self.inner.upload(host)?;
        self.uploads.fetch_add(1, Ordering::SeqCst);
        Ok(self.wrap(inner))
    }

    fn alloc_zeroed(&self, dtype: DType, len: usize) -> Result<Buffer, BackendError> {
        self.check_alive()?;
        self.spend(len * dtype.size_in_bytes())?;
        let inner = self.inner.alloc_zeroed(dtype, len)?;
        Ok(self.wrap(inner))
    }

    fn prepare_weight(&self, spec: WeightSpec, bytes: Cow<'_, [u8]>) -> Result<Buffer, BackendError> {
        self.check_alive()?;
        self.spend(bytes.len())?;
        let inner = self.inner.prepare_weight(spec, bytes)?;
        self.uploads.fetch_add(1, Ordering::SeqCst);
        Ok(self.wrap(inner))
    }

    fn download(&self, buffer: &dyn DeviceBuffer) -> Result<CpuStorage, BackendError> {
        self.check_alive()?;
        let data = self.inner.download(self.own("download", buffer)?)?;
        self.downloads.fetch_add(1, Ordering::SeqCst);
        Ok(data)
    }

    fn execute(&self, op: &Op, inputs: &[TensorRef<'_>], outputs: &[TensorMeta]) -> Result<Vec<Buffer>, BackendError> {
        self.check_alive()?;
        let name = op.name();
        if self.failing_ops.contains(&name) {
            return Err(BackendError::Device {
                device: self.device,
                message: format!("kernel {name} faulted"),
            });
        }
        if self.rejecting_ops.contains(&name) {
            return Err(BackendError::invalid(name, "rejected by the fault-injecting device"));
        }
        self.spend(outputs.iter().map(|m| m.size_in_bytes()).sum())?;
        let ins = inputs
            .iter()
            .map(|t| {
                Ok(TensorRef {
                    buffer: self.own(&name, t.buffer)?,
                    layout: t.layout,
                })
            })
            .collect::<Result<Vec<_>, BackendError>>()?;
        let mut out = self.inner.execute(op, &ins, outputs)?;
        self.executes.fetch_add(1, Ordering::SeqCst);
        if self.short_output_ops.contains(&name) {
            out = out
                .iter()
                .map(|b| self.inner.upload(shorten(&self.inner.download(b.as_ref())?).as_host()))
                .collect::<Result<_, BackendError>>()?;
        }
        if self.late_fault_ops.contains(&name) {
            self.lose();
        }
        if self.host_output_ops.contains(&name) {
            return out
                .iter()
                .map(|b| Ok(Arc::new(self.inner.download(b.as_ref())?) as Buffer))
                .collect();
        }
        Ok(out.into_iter().map(|b| self.wrap(b)).collect())
    }

    fn write_into(&self, dst: &mut dyn DeviceBuffer, region: &Layout, src: TensorRef<'_>) -> Result<(), BackendError> {
        self.check_alive()?;
        let src = TensorRef {
            buffer: self.own("write_into", src.buffer)?,
            layout: src.layout,
        };
        let device = self.device;
        let dst = dst
            .as_any_mut()
            .and_then(|a| a.downcast_mut::<FaultyBuffer>())
            .filter(|b| b.device == device)
            .ok_or_else(|| BackendError::invalid("write_into", format!("destination is not on {device}")))?;
        // The executor writes in place only into buffers no other tensor shares, so the inner
        // buffer is this wrapper's alone.
        let inner = Arc::get_mut(&mut dst.inner)
            .ok_or_else(|| BackendError::invalid("write_into", "the destination's inner buffer is shared"))?;
        self.inner.write_into(inner, region, src)
    }

    fn write_into_at(
        &self,
        dst: &mut dyn DeviceBuffer,
        region: &Layout,
        step: usize,
        max_pos: usize,
        pos: TensorRef<'_>,
        src: TensorRef<'_>,
    ) -> Result<(), BackendError> {
        const OP: &str = "write_into_at";
        self.check_alive()?;
        if self.refused_ops.contains(OP) {
            // A device without the method, as the trait's default answers.
            return Err(BackendError::unsupported(
                self.device,
                OP,
                "refused by the fault-injecting device",
            ));
        }
        let src = TensorRef {
            buffer: self.own(OP, src.buffer)?,
            layout: src.layout,
        };
        let pos = TensorRef {
            buffer: self.own(OP, pos.buffer)?,
            layout: pos.layout,
        };
        let device = self.device;
        let dst = dst
            .as_any_mut()
            .and_then(|a| a.downcast_mut::<FaultyBuffer>())
            .filter(|b| b.device == device)
            .ok_or_else(|| BackendError::invalid(OP, format!("destination is not on {device}")))?;
        let inner = Arc::get_mut(&mut dst.inner)
            .ok_or_else(|| BackendError::invalid(OP, "the destination's inner buffer is shared"))?;
        self.inner.write_into_at(inner, region, step, max_pos, pos, src)
    }

    fn run_pass(&self, pass: &mut (dyn FnMut() + Send)) {
        self.inner.run_pass(pass)
    }

    fn synchronize(&self) -> Result<(), BackendError> {
        self.check_alive()?;
        self.inner.synchronize()
    }

    fn timer(&self) -> Box<dyn OpTimer> {
        match self.op_time {
            Some(d) => Box::new(FixedTimer(d)),
            None => self.inner.timer(),
        }
    }
}

/// A device clock that measures every op as the same time (`FaultyBackend::timed`).
struct FixedTimer(std::time::Duration);

impl OpTimer for FixedTimer {
    fn elapsed(self: Box<Self>) -> Result<std::time::Duration, BackendError> {
        Ok(self.0)
    }
}

/// The storage without its last element.
fn shorten(s: &CpuStorage) -> CpuStorage {
    let v = s.to_f64_vec();
    CpuStorage::from_f64_iter(s.dtype(), v[..v.len().saturating_sub(1)].iter().copied())
}
