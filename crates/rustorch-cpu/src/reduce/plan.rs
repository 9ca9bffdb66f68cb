//! How a reduction reads its input: as `[outer, len, inner]` with `len`
//! the reduced elements, straight from memory where possible.

use super::acc::Elem;
use super::Geom;
use crate::copy::{gather, input_slice};
use crate::{unsupported_dtype, CpuInput};
use rustorch_core::error::BackendError;
use rustorch_core::layout::Layout;
use rustorch_core::op::Op;
use std::borrow::Cow;

/// The input's elements in memory order, with the reduced dims numbered
/// for that order.
pub(super) struct Physical<'a, T: Clone> {
    pub data: Cow<'a, [T]>,
    pub shape: Vec<usize>,
    /// Reduced dims, as positions in `shape`.
    pub dims: Vec<usize>,
    /// The kept dims (logical numbers) in the order results come out.
    pub kept: Vec<usize>,
}

/// A contiguous input as is; a permuted view of contiguous data (a
/// transpose, say) as that data with its dims renumbered, so no copy is
/// made and results come out in memory order (`to_logical` fixes that
/// up, on the small output). Anything else is gathered.
pub(super) fn physical<'a, T: Elem>(
    op: &Op,
    input: CpuInput<'a>,
    dims: &[usize],
) -> Result<Physical<'a, T>, BackendError> {
    let layout = input.layout;
    let logical_kept = || (0..layout.rank()).filter(|d| !dims.contains(d)).collect();
    if !layout.is_contiguous() {
        let storage = input
            .storage
            .as_slice::<T>()
            .ok_or_else(|| unsupported_dtype(op, input.dtype()))?;
        let mut perm: Vec<usize> = (0..layout.rank()).collect();
        perm.sort_by_key(|&d| std::cmp::Reverse(layout.strides()[d]));
        let shape: Vec<usize> = perm.iter().map(|&d| layout.dims()[d]).collect();
        let strides = perm.iter().map(|&d| layout.strides()[d]).collect();
        let sorted = Layout::from_parts(shape.clone().into(), strides, layout.offset())
            .map_err(|e| BackendError::invalid(op.name(), e.to_string()))?;
        if let Some(range) = sorted.contiguous_range() {
            if let Some(data) = storage.get(range) {
                return Ok(Physical {
                    data: Cow::Borrowed(data),
                    shape,
                    dims: (0..perm.len()).filter(|&p| dims.contains(&perm[p])).collect(),
                    kept: perm.into_iter().filter(|d| !dims.contains(d)).collect(),
                });
            }
        }
    }
    Ok(Physical {
        data: input_slice::<T>(op, input)?,
        shape: layout.dims().to_vec(),
        dims: dims.to_vec(),
        kept: logical_kept(),
    })
}

/// Reorders results that came out with the kept dims in the order `kept`
/// into the logical (ascending) order.
pub(super) fn to_logical<V: Copy + Send + Sync>(
    op: &Op,
    v: Vec<V>,
    kept: &[usize],
    in_dims: &[usize],
) -> Result<Vec<V>, BackendError> {
    if kept.windows(2).all(|w| w[0] < w[1]) {
        return Ok(v);
    }
    let sizes: Vec<usize> = kept.iter().map(|&d| in_dims[d]).collect();
    let mut logical = kept.to_vec();
    logical.sort_unstable();
    let perm: Vec<isize> = logical
        .iter()
        .filter_map(|d| kept.iter().position(|k| k == d))
        .map(|p| p as isize)
        .collect();
    let layout = Layout::contiguous(sizes)
        .permute(&op.name(), &perm)
        .map_err(|e| BackendError::invalid(op.name(), e.to_string()))?;
    Ok(gather(&v, &layout))
}

/// Views contiguous `src` of `shape` as `[outer, len, inner]` with `len`
/// the reduced elements, gathering a permuted copy when the reduced
/// dimensions do not form one run.
pub(super) fn arrange<'a, T: Copy + Send + Sync>(
    op: &Op,
    src: Cow<'a, [T]>,
    shape: &[usize],
    dims: &[usize],
) -> Result<(Cow<'a, [T]>, Geom), BackendError> {
    // Runs of adjacent kept / reduced dims, size-1 dims dropped.
    let mut runs: Vec<(usize, bool)> = Vec::new();
    for (i, &d) in shape.iter().enumerate() {
        if d == 1 {
            continue;
        }
        let red = dims.contains(&i);
        match runs.last_mut() {
            Some((n, r)) if *r == red => *n *= d,
            _ => runs.push((d, red)),
        }
    }
    let geom = |outer, len, inner| Geom { outer, len, inner };
    let g = match runs.as_slice() {
        [] => geom(1, 1, 1),
        [(n, false)] => geom(*n, 1, 1),
        [(n, true)] => geom(1, *n, 1),
        [(a, false), (b, true)] => geom(*a, *b, 1),
        [(a, true), (b, false)] => geom(1, *a, *b),
        [(a, false), (b, true), (c, false)] => geom(*a, *b, *c),
        _ => {
            let kept = (0..shape.len()).filter(|i| !dims.contains(i));
            let perm: Vec<isize> = kept.chain(dims.iter().copied()).map(|d| d as isize).collect();
            let layout = Layout::contiguous(shape.to_vec())
                .permute(&op.name(), &perm)
                .map_err(|e| BackendError::invalid(op.name(), e.to_string()))?;
            let len: usize = dims.iter().map(|&d| shape[d]).product();
            let total = src.len();
            return Ok((Cow::Owned(gather(&src, &layout)), geom(total / len.max(1), len, 1)));
        }
    };
    Ok((src, g))
}
