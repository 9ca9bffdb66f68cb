//! Attention building blocks: rotary position embeddings, scaled
//! dot-product attention, and attention at positions held in a tensor.

mod at;
mod rope;
mod sdpa;

pub(crate) use at::attention_at;

use super::{unsupported_dtype, CpuInput, CpuResult, CpuStorage};
use half::{bf16, f16};
use rustorch_core::dtype::DType;
use rustorch_core::error::BackendError;
use rustorch_core::op::{Op, TensorMeta};

pub fn execute(op: &Op, inputs: &[CpuInput<'_>], _outputs: &[TensorMeta]) -> CpuResult {
    match inputs[0].dtype() {
        DType::F32 => run::<f32>(op, inputs),
        DType::F64 => run::<f64>(op, inputs),
        DType::F16 => run::<f16>(op, inputs),
        DType::BF16 => run::<bf16>(op, inputs),
        d => Err(unsupported_dtype(op, d)),
    }
}

fn run<T: super::norm::float::FloatElem>(op: &Op, inputs: &[CpuInput<'_>]) -> CpuResult {
    let out = match *op {
        Op::Rope { layout } => rope::rope::<T>(op, inputs, layout)?,
        Op::Sdpa { mask, scale } => sdpa::sdpa::<T>(op, inputs, mask, scale)?,
        _ => return Err(BackendError::invalid(op.name(), "not an attention op")),
    };
    Ok(vec![CpuStorage::from_vec(out)])
}
