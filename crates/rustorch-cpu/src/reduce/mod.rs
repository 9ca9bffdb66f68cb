//! Reductions and the ops that work along one dimension: sum, mean, max,
//! min, prod, argmax/argmin, var/std (`basic`), softmax and log-softmax
//! (`softmax`), cumsum (`scan`), sort and top-k (`sort`).
//!
//! Every kernel reads its input as contiguous row-major data (reductions
//! also read permuted views, such as transposes, in place) and views it as
//! `[outer, len, inner]` around the dimension(s) it works on:
//! `inner == 1` means each output comes from a contiguous run (rows), and
//! `inner > 1` means the reduced dimension is outer in memory, so kernels
//! combine whole `inner`-wide rows at a time (vectorized across columns).

mod acc;
mod basic;
mod outer;
mod plan;
mod rows;
mod scan;
mod simd;
mod softmax;
mod sort;

use super::{CpuInput, CpuResult};
use rayon::prelude::*;
use rustorch_core::error::BackendError;
use rustorch_core::op::{Op, TensorMeta};
use std::mem::MaybeUninit;

pub fn execute(op: &Op, inputs: &[CpuInput<'_>], outputs: &[TensorMeta]) -> CpuResult {
    let (input, out) = match (inputs.first(), outputs.first()) {
        (Some(i), Some(o)) => (*i, o),
        _ => return Err(BackendError::invalid(op.name(), "expects one input and an output")),
    };
    match op {
        Op::Reduce { op: r, dims, .. } => basic::reduce(op, *r, dims, input, out),
        Op::Softmax { dim } => softmax::softmax(op, input, *dim, false),
        Op::LogSoftmax { dim } => softmax::softmax(op, input, *dim, true),
        Op::Cumsum { dim } => scan::cumsum(op, input, *dim, out),
        Op::Sort { dim, descending } => sort::sort(
            op,
            input,
            *dim,
            input.dims().get(*dim).copied().unwrap_or(0),
            *descending,
        ),
        Op::TopK { k, dim, largest } => sort::sort(op, input, *dim, *k, *largest),
        _ => Err(BackendError::invalid(op.name(), "not a reduction op")),
    }
}

/// A contiguous tensor seen around one dimension: `outer` blocks of `len`
/// rows of `inner` elements.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Geom {
    pub outer: usize,
    pub len: usize,
    pub inner: usize,
}

impl Geom {
    /// The geometry of a contiguous shape around dimension `dim`.
    pub fn around(op: &Op, dims: &[usize], dim: usize) -> Result<Geom, BackendError> {
        if dim >= dims.len() {
            return Err(BackendError::invalid(
                op.name(),
                format!("dimension {dim} out of range for rank {}", dims.len()),
            ));
        }
        Ok(Geom {
            outer: dims[..dim].iter().product(),
            len: dims[dim],
            inner: dims[dim + 1..].iter().product(),
        })
    }
}

/// Element counts from which kernels split work over threads. Waking
/// rayon's sleeping workers costs microseconds, so cheap per-element work
/// (sums, maxima: tens of elements per nanosecond) needs many more elements
/// to gain from threads than exp-heavy softmax or sorting does.
pub(super) const PAR_REDUCE: usize = 1 << 18;
pub(super) const PAR_SOFTMAX: usize = 1 << 16;
pub(super) const PAR_SCAN: usize = 1 << 16;
pub(super) const PAR_SORT: usize = 1 << 14;

/// A vector of `n` elements filled in place by `fill(first, chunk)` for
/// consecutive chunks of `chunk` elements (the last may be shorter), in
/// parallel when `parallel`. Outputs are written once instead of being
/// zero-filled first, which costs a whole extra pass over memory for
/// memory-bound kernels. `fill` must write every element of its chunk.
pub(super) fn fill_chunks<T: Send>(
    n: usize,
    chunk: usize,
    parallel: bool,
    fill: impl Fn(usize, &mut [MaybeUninit<T>]) + Sync,
) -> Vec<T> {
    let mut out: Vec<T> = Vec::with_capacity(n);
    let spare = &mut out.spare_capacity_mut()[..n];
    let chunk = chunk.max(1);
    if parallel {
        spare
            .par_chunks_mut(chunk)
            .enumerate()
            .for_each(|(i, c)| fill(i * chunk, c));
    } else {
        spare
            .chunks_mut(chunk)
            .enumerate()
            .for_each(|(i, c)| fill(i * chunk, c));
    }
    // SAFETY: the chunks cover all n elements and `fill` writes every
    // element of each chunk (every caller's loops cover their whole chunk);
    // the capacity is n.
    unsafe { out.set_len(n) };
    out
}

/// Splits `n` items into chunks for rayon so that each task gets at least
/// `min_items` of them and every thread gets a few tasks.
pub(super) fn chunk_size(n: usize, min_items: usize) -> usize {
    let tasks = rayon::current_num_threads() * 4;
    n.div_ceil(tasks).max(min_items).max(1)
}
