//! sum, mean, max, min, prod, argmax, argmin, var and std over any set of
//! dimensions.
//!
//! The reduced and kept dimensions are merged into runs; the common
//! patterns `[kept, reduced]` (rows), `[reduced, kept]` and
//! `[kept, reduced, kept]` (outer reductions) run straight on the input,
//! anything else is first gathered into `[kept..., reduced...]` order.
//! Sums are pairwise over blocks of lane-accumulated sums, so f32 results
//! stay within a few ulp of PyTorch's cascade sums even for long rows.

use super::acc::{Acc, Elem};
use super::{chunk_size, Geom, PAR_REDUCE};
use crate::cpu::copy::{gather, input_slice};
use crate::cpu::{unsupported_dtype, CpuInput, CpuResult, CpuStorage};
use crate::dtype::{DType, C64};
use crate::error::BackendError;
use crate::layout::Layout;
use crate::op::{Op, ReduceOp, TensorMeta};
use half::{bf16, f16};
use rayon::prelude::*;
use std::borrow::Cow;
use std::ops::Range;

/// Elements reduced by one lane-accumulator kernel call; longer rows are
/// summed pairwise over blocks of this size.
const BLOCK: usize = 1024;
/// Rows an outer reduction adds one after the other before switching to
/// pairwise addition of partial results.
const OUTER_BLOCK: usize = 128;
/// A row at least this long is split over threads when there are few rows.
const PAR_ROW: usize = PAR_REDUCE;

pub(super) fn reduce(op: &Op, r: ReduceOp, dims: &[usize], input: CpuInput<'_>, out: &TensorMeta) -> CpuResult {
    match input.dtype() {
        DType::F32 => reduce_typed::<f32>(op, r, dims, input, out),
        DType::F64 => reduce_typed::<f64>(op, r, dims, input, out),
        DType::F16 => reduce_typed::<f16>(op, r, dims, input, out),
        DType::BF16 => reduce_typed::<bf16>(op, r, dims, input, out),
        DType::I64 => reduce_typed::<i64>(op, r, dims, input, out),
        DType::I32 => reduce_typed::<i32>(op, r, dims, input, out),
        DType::U8 => reduce_typed::<u8>(op, r, dims, input, out),
        DType::Bool => reduce_typed::<bool>(op, r, dims, input, out),
        DType::C64 => reduce_complex(op, r, dims, input, out),
    }
}

/// What one pass computes. Mean is a sum pass; var and std are a sum pass
/// for the means, then a squared-deviation pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Sum,
    Prod,
    Max,
    Min,
    SqDev,
    ArgMax,
    ArgMin,
}

/// Per-output results of a pass: values, and for arg kinds the indices.
struct Part<A> {
    vals: Vec<A>,
    idx: Vec<usize>,
}

fn reduce_typed<T: Elem>(op: &Op, r: ReduceOp, dims: &[usize], input: CpuInput<'_>, out: &TensorMeta) -> CpuResult {
    if input.layout.numel() == 0 {
        return empty_reduction(op, r, out);
    }
    let src = physical::<T>(op, input, dims)?;
    let (data, g) = arrange(op, src.data, &src.shape, &src.dims)?;
    let n = g.len;
    let kept = &src.kept;
    let store = |v: Vec<T::A>| {
        let v = to_logical(op, v, kept, input.dims())?;
        T::A::into_storage(v, out.dtype)
            .map(|s| vec![s])
            .ok_or_else(|| unsupported_dtype(op, out.dtype))
    };
    let means = |sums: Vec<T::A>| sums.into_iter().map(|s| T::A::div_count(s, n)).collect::<Vec<_>>();
    match r {
        ReduceOp::Sum => store(pass::<T>(Kind::Sum, &data, g, &[]).vals),
        ReduceOp::Prod => store(pass::<T>(Kind::Prod, &data, g, &[]).vals),
        ReduceOp::Max => store(pass::<T>(Kind::Max, &data, g, &[]).vals),
        ReduceOp::Min => store(pass::<T>(Kind::Min, &data, g, &[]).vals),
        ReduceOp::Mean => store(means(pass::<T>(Kind::Sum, &data, g, &[]).vals)),
        ReduceOp::ArgMax | ReduceOp::ArgMin => {
            let kind = if r == ReduceOp::ArgMax {
                Kind::ArgMax
            } else {
                Kind::ArgMin
            };
            let p = pass::<T>(kind, &data, g, &[]);
            let idx = p.idx.into_iter().map(|i| i as i64).collect();
            Ok(vec![CpuStorage::I64(to_logical(op, idx, kept, input.dims())?)])
        }
        ReduceOp::Var { correction } | ReduceOp::Std { correction } => {
            let mu = means(pass::<T>(Kind::Sum, &data, g, &[]).vals);
            let m2 = pass::<T>(Kind::SqDev, &data, g, &mu).vals;
            let is_std = matches!(r, ReduceOp::Std { .. });
            store(
                m2.into_iter()
                    .map(|m| {
                        let v = T::A::variance(m, n, correction);
                        if is_std {
                            v.sqrt()
                        } else {
                            v
                        }
                    })
                    .collect(),
            )
        }
    }
}

/// The input's elements in memory order, with the reduced dims numbered
/// for that order.
struct Physical<'a, T: Clone> {
    data: Cow<'a, [T]>,
    shape: Vec<usize>,
    /// Reduced dims, as positions in `shape`.
    dims: Vec<usize>,
    /// The kept dims (logical numbers) in the order results come out.
    kept: Vec<usize>,
}

/// A contiguous input as is; a permuted view of contiguous data (a
/// transpose, say) as that data with its dims renumbered, so no copy is
/// made and results come out in memory order (`to_logical` fixes that
/// up, on the small output). Anything else is gathered.
fn physical<'a, T: Elem>(op: &Op, input: CpuInput<'a>, dims: &[usize]) -> Result<Physical<'a, T>, BackendError> {
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
fn to_logical<V: Copy + Send + Sync>(
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

/// Reductions of zero elements: PyTorch's identities (0 for sum, 1 for
/// prod, NaN for mean, var and std).
fn empty_reduction(op: &Op, r: ReduceOp, out: &TensorMeta) -> CpuResult {
    let n = out.shape.numel();
    let fill = match r {
        _ if n == 0 => 0.0,
        ReduceOp::Sum => 0.0,
        ReduceOp::Prod => 1.0,
        ReduceOp::Mean | ReduceOp::Var { .. } | ReduceOp::Std { .. } => f64::NAN,
        ReduceOp::Max | ReduceOp::Min | ReduceOp::ArgMax | ReduceOp::ArgMin => {
            return Err(BackendError::invalid(op.name(), "cannot reduce an empty dimension"))
        }
    };
    Ok(vec![CpuStorage::from_f64_iter(out.dtype, std::iter::repeat_n(fill, n))])
}

/// Views contiguous `src` of `shape` as `[outer, len, inner]` with `len`
/// the reduced elements, gathering a permuted copy when the reduced
/// dimensions do not form one run.
fn arrange<'a, T: Copy + Send + Sync>(
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

/// One pass over `[outer, len, inner]` data: one result per
/// `(outer, inner)` pair. `means` (for `SqDev`) has one value per result.
fn pass<T: Elem>(kind: Kind, data: &[T], g: Geom, means: &[T::A]) -> Part<T::A> {
    if g.inner == 1 {
        rows_pass::<T>(kind, data, g.len, means)
    } else {
        outer_pass::<T>(kind, data, g, means)
    }
}

// ---------------------------------------------------------------- rows

/// Reduces every contiguous row of `len` elements.
fn rows_pass<T: Elem>(kind: Kind, data: &[T], len: usize, means: &[T::A]) -> Part<T::A> {
    let rows = data.len() / len;
    let mean = |r: usize| means.get(r).copied().unwrap_or(T::A::ZERO);
    let results: Vec<(T::A, usize)> = if len >= PAR_ROW && rows < 2 * rayon::current_num_threads() {
        data.chunks(len)
            .enumerate()
            .map(|(r, row)| row_par::<T>(kind, row, mean(r)))
            .collect()
    } else if data.len() >= PAR_REDUCE {
        data.par_chunks(len)
            .with_min_len((PAR_REDUCE / 8 / len).max(1))
            .enumerate()
            .map_init(Vec::new, |buf, (r, row)| row_reduce::<T>(kind, row, 0, mean(r), buf))
            .collect()
    } else {
        let mut buf = Vec::new();
        data.chunks(len)
            .enumerate()
            .map(|(r, row)| row_reduce::<T>(kind, row, 0, mean(r), &mut buf))
            .collect()
    };
    let (vals, idx) = results.into_iter().unzip();
    Part { vals, idx }
}

/// A long row split over threads; partial results combine pairwise, in order.
fn row_par<T: Elem>(kind: Kind, row: &[T], mean: T::A) -> (T::A, usize) {
    let chunk = chunk_size(row.len(), BLOCK).div_ceil(BLOCK) * BLOCK;
    let parts: Vec<(T::A, usize)> = row
        .par_chunks(chunk)
        .enumerate()
        .map_init(Vec::new, |buf, (i, c)| row_reduce::<T>(kind, c, i * chunk, mean, buf))
        .collect();
    fold_pairwise(kind, &parts)
}

fn fold_pairwise<A: Acc>(kind: Kind, parts: &[(A, usize)]) -> (A, usize) {
    match parts {
        [] => (A::ZERO, 0),
        [p] => *p,
        _ => {
            let (l, r) = parts.split_at(parts.len() / 2);
            combine(kind, fold_pairwise(kind, l), fold_pairwise(kind, r))
        }
    }
}

/// Reduces one non-empty row whose first element has index `base`:
/// blocks of `BLOCK` elements with lane accumulators, combined pairwise.
fn row_reduce<T: Elem>(kind: Kind, row: &[T], base: usize, mean: T::A, buf: &mut Vec<T::A>) -> (T::A, usize) {
    if row.len() <= BLOCK {
        return block(kind, T::load(row, buf), base, mean);
    }
    // Split at a block boundary near the middle; both halves are non-empty.
    let half = (row.len() / 2).div_ceil(BLOCK) * BLOCK;
    let l = row_reduce::<T>(kind, &row[..half], base, mean, buf);
    let r = row_reduce::<T>(kind, &row[half..], base + half, mean, buf);
    combine(kind, l, r)
}

fn block<A: Acc>(kind: Kind, xs: &[A], base: usize, mean: A) -> (A, usize) {
    match kind {
        Kind::Sum => (A::sum(xs), 0),
        Kind::Prod => (A::prod(xs), 0),
        Kind::Max => (A::max(xs), 0),
        Kind::Min => (A::min(xs), 0),
        Kind::SqDev => (A::sq_dev(xs, mean), 0),
        Kind::ArgMax | Kind::ArgMin => {
            // The extreme value first (vectorized), then its first position;
            // NaN is the extreme when present.
            let m = if kind == Kind::ArgMax { A::max(xs) } else { A::min(xs) };
            let i = A::position(xs, m);
            (m, base + if i < xs.len() { i } else { 0 })
        }
    }
}

/// Combines the results of two consecutive pieces, `a` first.
fn combine<A: Acc>(kind: Kind, a: (A, usize), b: (A, usize)) -> (A, usize) {
    let pick = |take_b: bool| if take_b { b } else { a };
    match kind {
        Kind::Sum | Kind::SqDev => (A::add(a.0, b.0), 0),
        Kind::Prod => (A::mul(a.0, b.0), 0),
        Kind::Max | Kind::ArgMax => pick(A::beats_max(b.0, a.0)),
        Kind::Min | Kind::ArgMin => pick(A::beats_min(b.0, a.0)),
    }
}

// --------------------------------------------------------------- outer

/// One task of an outer reduction: block `b`, columns `cols`, rows `rows`.
#[derive(Clone)]
struct Task {
    b: usize,
    cols: Range<usize>,
    rows: Range<usize>,
}

/// Reduces over the middle dimension of `[outer, len, inner]`, combining
/// whole rows of columns at a time. Work splits over blocks and column
/// ranges, and over row ranges when those are too few for the threads.
fn outer_pass<T: Elem>(kind: Kind, data: &[T], g: Geom, means: &[T::A]) -> Part<T::A> {
    let threads = rayon::current_num_threads();
    let parallel = data.len() >= PAR_REDUCE;
    let (col_chunk, row_chunk) = if parallel {
        let per_block = (2 * threads).div_ceil(g.outer);
        let cols = g.inner.div_ceil(per_block).max(64).min(g.inner);
        let tasks = g.outer * g.inner.div_ceil(cols);
        let splits = if tasks < threads {
            (2 * threads).div_ceil(tasks)
        } else {
            1
        };
        let rows = g.len.div_ceil(splits).max(OUTER_BLOCK).min(g.len);
        (cols, rows)
    } else {
        (g.inner, g.len)
    };
    let mut tasks = Vec::new();
    for b in 0..g.outer {
        for c0 in (0..g.inner).step_by(col_chunk) {
            for r0 in (0..g.len).step_by(row_chunk) {
                let cols = c0..(c0 + col_chunk).min(g.inner);
                tasks.push(Task {
                    b,
                    cols,
                    rows: r0..(r0 + row_chunk).min(g.len),
                });
            }
        }
    }
    let run = |buf: &mut Vec<T::A>, t: &Task| {
        let slab = &data[t.b * g.len * g.inner..(t.b + 1) * g.len * g.inner];
        let m = if kind == Kind::SqDev {
            &means[t.b * g.inner + t.cols.start..t.b * g.inner + t.cols.end]
        } else {
            &[][..]
        };
        outer_part::<T>(kind, slab, g.inner, t.cols.clone(), t.rows.clone(), m, buf)
    };
    let parts: Vec<Part<T::A>> = if parallel {
        tasks.par_iter().map_init(Vec::new, run).collect()
    } else {
        let mut buf = Vec::new();
        tasks.iter().map(|t| run(&mut buf, t)).collect()
    };
    // Merge the row splits of each (block, columns) in order, then place.
    let n_out = g.outer * g.inner;
    let mut vals = vec![T::A::ZERO; n_out];
    let mut idx = vec![
        0usize;
        if matches!(kind, Kind::ArgMax | Kind::ArgMin) {
            n_out
        } else {
            0
        }
    ];
    let mut i = 0;
    while i < tasks.len() {
        let mut j = i + 1;
        while j < tasks.len() && tasks[j].b == tasks[i].b && tasks[j].cols == tasks[i].cols {
            j += 1;
        }
        let mut merged = parts[i..j].iter();
        if let Some(first) = merged.next() {
            let mut acc = Part {
                vals: first.vals.clone(),
                idx: first.idx.clone(),
            };
            for p in merged {
                merge_parts(kind, &mut acc, p);
            }
            let at = tasks[i].b * g.inner + tasks[i].cols.start;
            vals[at..at + acc.vals.len()].copy_from_slice(&acc.vals);
            if !idx.is_empty() {
                idx[at..at + acc.idx.len()].copy_from_slice(&acc.idx);
            }
        }
        i = j;
    }
    Part { vals, idx }
}

/// Reduces rows `rows` of one `[len, width]` slab over columns `cols`.
fn outer_part<T: Elem>(
    kind: Kind,
    slab: &[T],
    width: usize,
    cols: Range<usize>,
    rows: Range<usize>,
    means: &[T::A],
    buf: &mut Vec<T::A>,
) -> Part<T::A> {
    let row = |i: usize| &slab[i * width + cols.start..i * width + cols.end];
    let w = cols.len();
    // Sums add pairwise over halves of the row range, for accuracy.
    if matches!(kind, Kind::Sum | Kind::SqDev) && rows.len() > OUTER_BLOCK {
        let mid = rows.start + (rows.len() / 2).div_ceil(OUTER_BLOCK) * OUTER_BLOCK;
        let mut a = outer_part::<T>(kind, slab, width, cols.clone(), rows.start..mid, means, buf);
        let b = outer_part::<T>(kind, slab, width, cols, mid..rows.end, means, buf);
        T::A::add_rows(&mut a.vals, &b.vals);
        return a;
    }
    let (mut vals, start) = match kind {
        Kind::Sum | Kind::SqDev => (vec![T::A::ZERO; w], rows.start),
        Kind::Prod => (vec![T::A::ONE; w], rows.start),
        _ => (T::load(row(rows.start), buf).to_vec(), rows.start + 1),
    };
    let arg = matches!(kind, Kind::ArgMax | Kind::ArgMin);
    let mut idx = if arg { vec![rows.start; w] } else { Vec::new() };
    for i in start..rows.end {
        let x = T::load(row(i), buf);
        match kind {
            Kind::Sum => T::A::add_rows(&mut vals, x),
            Kind::Prod => T::A::mul_rows(&mut vals, x),
            Kind::Max => T::A::max_rows(&mut vals, x),
            Kind::Min => T::A::min_rows(&mut vals, x),
            Kind::SqDev => T::A::sq_dev_rows(&mut vals, x, means),
            Kind::ArgMax => T::A::arg_rows(&mut vals, &mut idx, x, i, true),
            Kind::ArgMin => T::A::arg_rows(&mut vals, &mut idx, x, i, false),
        }
    }
    Part { vals, idx }
}

/// Folds the partial result of a later row range into `acc`.
fn merge_parts<A: Acc>(kind: Kind, acc: &mut Part<A>, p: &Part<A>) {
    match kind {
        Kind::Sum | Kind::SqDev => A::add_rows(&mut acc.vals, &p.vals),
        Kind::Prod => A::mul_rows(&mut acc.vals, &p.vals),
        Kind::Max => A::max_rows(&mut acc.vals, &p.vals),
        Kind::Min => A::min_rows(&mut acc.vals, &p.vals),
        Kind::ArgMax | Kind::ArgMin => {
            let beats = if kind == Kind::ArgMax {
                A::beats_max
            } else {
                A::beats_min
            };
            let (vals, idx) = (&mut acc.vals, &mut acc.idx);
            for ((v, i), (&pv, &pi)) in vals.iter_mut().zip(idx.iter_mut()).zip(p.vals.iter().zip(&p.idx)) {
                if beats(pv, *v) {
                    *v = pv;
                    *i = pi;
                }
            }
        }
    }
}

// ------------------------------------------------------------- complex

/// Sum and product of complex numbers (the only reductions PyTorch defines
/// for them besides mean, which needs a real dtype here). Scalar code:
/// complex reductions are rare and memory-bound.
fn reduce_complex(op: &Op, r: ReduceOp, dims: &[usize], input: CpuInput<'_>, out: &TensorMeta) -> CpuResult {
    let src = input_slice::<C64>(op, input)?;
    let (identity, f): (C64, fn(C64, C64) -> C64) = match r {
        ReduceOp::Sum => (C64::new(0.0, 0.0), |a, b| a + b),
        ReduceOp::Prod => (C64::new(1.0, 0.0), |a, b| a * b),
        _ => return Err(unsupported_dtype(op, DType::C64)),
    };
    if src.is_empty() {
        return Ok(vec![CpuStorage::C64(vec![identity; out.shape.numel()])]);
    }
    let (data, g) = arrange(op, src, input.dims(), dims)?;
    let mut res = vec![identity; g.outer * g.inner];
    for b in 0..g.outer {
        for i in 0..g.len {
            let row = &data[(b * g.len + i) * g.inner..(b * g.len + i + 1) * g.inner];
            for (a, &x) in res[b * g.inner..(b + 1) * g.inner].iter_mut().zip(row) {
                *a = f(*a, x);
            }
        }
    }
    Ok(vec![CpuStorage::from_vec(res)])
}
