//! `Watched`: the backend under test as the target's executor sees it, counting the ops its
//! `supports` declines, so that a check stopped by a declined op is reported as such rather
//! than as a wrong result. Every other method is the backend's own.

use rustorch_core::backend::{Backend, Buffer, DeviceBuffer, OpTimer, TensorRef, WeightSpec};
use rustorch_core::device::DeviceCapability;
use rustorch_core::{BackendError, CpuStorage, DType, Device, HostSlice, Layout, Op, TensorMeta};
use std::borrow::Cow;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

pub(crate) struct Watched {
    pub(crate) inner: Arc<dyn Backend>,
    pub(crate) declined: Arc<AtomicUsize>,
}

impl Backend for Watched {
    fn device(&self) -> Device {
        self.inner.device()
    }
    fn capability(&self) -> DeviceCapability {
        self.inner.capability()
    }
    fn supports(&self, op: &Op, inputs: &[TensorMeta]) -> bool {
        let yes = self.inner.supports(op, inputs);
        if !yes {
            self.declined.fetch_add(1, Ordering::SeqCst);
        }
        yes
    }
    fn upload(&self, host: HostSlice<'_>) -> Result<Buffer, BackendError> {
        self.inner.upload(host)
    }
    fn alloc_zeroed(&self, dtype: DType, len: usize) -> Result<Buffer, BackendError> {
        self.inner.alloc_zeroed(dtype, len)
    }
    fn prepare_weight(&self, spec: WeightSpec, bytes: Cow<'_, [u8]>) -> Result<Buffer, BackendError> {
        self.inner.prepare_weight(spec, bytes)
    }
    fn download(&self, buffer: &dyn DeviceBuffer) -> Result<CpuStorage, BackendError> {
        self.inner.download(buffer)
    }
    fn execute(&self, op: &Op, inputs: &[TensorRef<'_>], outputs: &[TensorMeta]) -> Result<Vec<Buffer>, BackendError> {
        self.inner.execute(op, inputs, outputs)
    }
    fn write_into(&self, dst: &mut dyn DeviceBuffer, region: &Layout, src: TensorRef<'_>) -> Result<(), BackendError> {
        self.inner.write_into(dst, region, src)
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
        self.inner.write_into_at(dst, region, step, max_pos, pos, src)
    }
    fn run_pass(&self, pass: &mut (dyn FnMut() + Send)) {
        self.inner.run_pass(pass)
    }
    fn synchronize(&self) -> Result<(), BackendError> {
        self.inner.synchronize()
    }
    fn timer(&self) -> Box<dyn OpTimer> {
        self.inner.timer()
    }
}
