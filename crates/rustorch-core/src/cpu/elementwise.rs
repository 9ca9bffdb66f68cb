//! Placeholder until the kernels land: every op here reports itself as
//! unsupported, so the executor returns a clear error.

use super::{CpuInput, CpuResult};
use crate::device::Device;
use crate::error::BackendError;
use crate::op::{Op, TensorMeta};

pub fn execute(op: &Op, _inputs: &[CpuInput<'_>], _outputs: &[TensorMeta]) -> CpuResult {
    Err(BackendError::unsupported(Device::Cpu, op.name(), "not implemented yet"))
}
