//! Elementwise ops: unary math and activations, clamp, binary arithmetic,
//! comparisons and `where`, all with NumPy broadcasting and any input
//! layout.
//!
//! `plan` merges the output's dims into rows; `kernel` runs an element
//! function over rows (specialized for contiguous, broadcast and strided
//! inputs, f16/bf16 through f32 blocks) under the widest SIMD level, in the
//! chunks that `par` hands to the calling thread and rayon helpers;
//! `unary`, `binary` and `compare` hold the element functions and the
//! per-dtype dispatch; `stream` writes large contiguous f32 arithmetic
//! with streaming stores.

mod binary;
mod compare;
mod kernel;
mod par;
mod plan;
mod stream;
mod unary;

use super::{CpuInput, CpuResult, CpuStorage};
use rustorch_core::error::BackendError;
use rustorch_core::op::{Op, TensorMeta};

pub fn execute(op: &Op, inputs: &[CpuInput<'_>], outputs: &[TensorMeta]) -> CpuResult {
    let out = outputs
        .first()
        .ok_or_else(|| BackendError::invalid(op.name(), "no output shape was given"))?;
    let arity = match op {
        Op::Unary(_) | Op::Clamp { .. } => 1,
        Op::Binary(_) | Op::Compare(_) => 2,
        Op::Where => 3,
        _ => return Err(BackendError::invalid(op.name(), "not an elementwise op")),
    };
    if inputs.len() != arity {
        return Err(BackendError::invalid(
            op.name(),
            format!("expected {arity} inputs, got {}", inputs.len()),
        ));
    }
    if out.shape.numel() == 0 {
        return Ok(vec![CpuStorage::zeros(out.dtype, 0)]);
    }
    match op {
        Op::Unary(u) => unary::unary(op, *u, inputs[0], out),
        Op::Clamp { min, max } => unary::clamp(op, *min, *max, inputs[0], out),
        Op::Binary(b) => binary::binary(op, *b, inputs[0], inputs[1], out),
        Op::Compare(c) => compare::compare(op, *c, inputs[0], inputs[1], out),
        _ => compare::where_(op, inputs, out),
    }
}
