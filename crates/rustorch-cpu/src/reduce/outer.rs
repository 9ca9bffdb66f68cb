//! Reductions over an outer dimension of `[outer, len, inner]`: whole
//! rows of `inner` columns combine into a row of accumulators (vectorized
//! across columns). Sums add pairwise over row ranges for accuracy.
//!
//! With many outer blocks, threads take ranges of blocks and write their
//! results in place. With few, the work splits into column ranges and,
//! when those are still too few, row ranges whose partial results merge
//! at the end.

use super::acc::{Acc, Elem};
use super::basic::{Kind, Part};
use super::{chunk_size, Geom, PAR_REDUCE};
use rayon::prelude::*;
use std::ops::Range;

/// Rows an outer reduction adds one after the other before switching to
/// pairwise addition of partial results.
const OUTER_BLOCK: usize = 128;
/// Columns one task accumulates at a time: 16 KiB of f32 accumulators,
/// which stay in L1 while the rows stream through.
const OUTER_COLS: usize = 4096;

/// Reduces over the middle dimension of `[outer, len, inner]`.
pub(super) fn outer_pass<T: Elem>(kind: Kind, data: &[T], g: Geom, means: &[T::A]) -> Part<T::A> {
    let threads = rayon::current_num_threads();
    let parallel = data.len() >= PAR_REDUCE;
    let n_out = g.outer * g.inner;
    let mut vals = vec![T::A::ZERO; n_out];
    let mut idx = vec![0usize; n_out];
    if !parallel || g.outer >= 2 * threads {
        let per = if parallel {
            chunk_size(g.outer, (PAR_REDUCE / 8 / (g.len * g.inner)).max(1))
        } else {
            g.outer
        };
        let work = |(i, (v, k)): (usize, (&mut [T::A], &mut [usize]))| {
            let mut buf = Vec::new();
            for (j, (v, k)) in v.chunks_mut(g.inner).zip(k.chunks_mut(g.inner)).enumerate() {
                blocks_into::<T>(kind, data, g, i * per + j, means, &mut buf, v, k);
            }
        };
        let chunks = vals.chunks_mut(per * g.inner).zip(idx.chunks_mut(per * g.inner));
        if parallel {
            let chunks = vals
                .par_chunks_mut(per * g.inner)
                .zip(idx.par_chunks_mut(per * g.inner));
            chunks.enumerate().for_each(work);
        } else {
            chunks.enumerate().for_each(work);
        }
        return Part { vals, idx };
    }
    split_pass::<T>(kind, data, g, means, vals, idx)
}

/// One whole block `b` into its results `vals`/`idx` (`inner` of each),
/// a column range at a time.
#[allow(clippy::too_many_arguments)]
fn blocks_into<T: Elem>(
    kind: Kind,
    data: &[T],
    g: Geom,
    b: usize,
    means: &[T::A],
    buf: &mut Vec<T::A>,
    vals: &mut [T::A],
    idx: &mut [usize],
) {
    let slab = &data[b * g.len * g.inner..(b + 1) * g.len * g.inner];
    for c0 in (0..g.inner).step_by(OUTER_COLS) {
        let cols = c0..(c0 + OUTER_COLS).min(g.inner);
        let m = block_means(kind, means, g, b, &cols);
        let (v, k) = (&mut vals[cols.clone()], &mut idx[cols.clone()]);
        outer_part::<T>(kind, slab, g.inner, cols, 0..g.len, m, buf, v, k);
    }
}

fn block_means<'a, A>(kind: Kind, means: &'a [A], g: Geom, b: usize, cols: &Range<usize>) -> &'a [A] {
    if kind == Kind::SqDev {
        &means[b * g.inner + cols.start..b * g.inner + cols.end]
    } else {
        &[]
    }
}

/// One task of a split outer reduction: block `b`, columns `cols`, rows `rows`.
struct Task {
    b: usize,
    cols: Range<usize>,
    rows: Range<usize>,
}

/// Few blocks: tasks over column ranges and, if needed for the threads,
/// row ranges; each task streams through its rows' contiguous columns.
fn split_pass<T: Elem>(
    kind: Kind,
    data: &[T],
    g: Geom,
    means: &[T::A],
    mut vals: Vec<T::A>,
    mut idx: Vec<usize>,
) -> Part<T::A> {
    let threads = rayon::current_num_threads();
    let col_chunk = g.inner.min(OUTER_COLS);
    let col_tasks = g.outer * g.inner.div_ceil(col_chunk);
    let splits = (2 * threads).div_ceil(col_tasks);
    let row_chunk = g.len.div_ceil(splits).max(OUTER_BLOCK).min(g.len);
    let mut tasks = Vec::new();
    for b in 0..g.outer {
        for c0 in (0..g.inner).step_by(col_chunk) {
            for r0 in (0..g.len).step_by(row_chunk) {
                let cols = c0..(c0 + col_chunk).min(g.inner);
                let rows = r0..(r0 + row_chunk).min(g.len);
                tasks.push(Task { b, cols, rows });
            }
        }
    }
    let parts: Vec<Part<T::A>> = tasks
        .par_iter()
        .map_init(Vec::new, |buf, t| {
            let slab = &data[t.b * g.len * g.inner..(t.b + 1) * g.len * g.inner];
            let m = block_means(kind, means, g, t.b, &t.cols);
            let mut p = Part {
                vals: vec![T::A::ZERO; t.cols.len()],
                idx: vec![0; t.cols.len()],
            };
            outer_part::<T>(
                kind,
                slab,
                g.inner,
                t.cols.clone(),
                t.rows.clone(),
                m,
                buf,
                &mut p.vals,
                &mut p.idx,
            );
            p
        })
        .collect();
    // Merge the row ranges of each (block, columns) in order, then place.
    let mut i = 0;
    while i < tasks.len() {
        let (b, cols) = (tasks[i].b, tasks[i].cols.clone());
        let at = b * g.inner + cols.start..b * g.inner + cols.end;
        vals[at.clone()].copy_from_slice(&parts[i].vals);
        idx[at.clone()].copy_from_slice(&parts[i].idx);
        i += 1;
        while i < tasks.len() && tasks[i].b == b && tasks[i].cols == cols {
            merge(kind, &mut vals[at.clone()], &mut idx[at.clone()], &parts[i]);
            i += 1;
        }
    }
    Part { vals, idx }
}

/// Reduces rows `rows` of one `[len, width]` slab over columns `cols` into
/// `vals` (and `idx` for arg kinds), both `cols.len()` long.
#[allow(clippy::too_many_arguments)]
fn outer_part<T: Elem>(
    kind: Kind,
    slab: &[T],
    width: usize,
    cols: Range<usize>,
    rows: Range<usize>,
    means: &[T::A],
    buf: &mut Vec<T::A>,
    vals: &mut [T::A],
    idx: &mut [usize],
) {
    let row = |i: usize| &slab[i * width + cols.start..i * width + cols.end];
    // Sums add pairwise over halves of the row range, for accuracy.
    if matches!(kind, Kind::Sum | Kind::SqDev) && rows.len() > OUTER_BLOCK {
        let mid = rows.start + (rows.len() / 2).div_ceil(OUTER_BLOCK) * OUTER_BLOCK;
        outer_part::<T>(kind, slab, width, cols.clone(), rows.start..mid, means, buf, vals, idx);
        let mut right = vec![T::A::ZERO; vals.len()];
        outer_part::<T>(kind, slab, width, cols, mid..rows.end, means, buf, &mut right, idx);
        T::A::add_rows(vals, &right);
        return;
    }
    let start = match kind {
        Kind::Sum | Kind::SqDev => {
            vals.fill(T::A::ZERO);
            rows.start
        }
        Kind::Prod => {
            vals.fill(T::A::ONE);
            rows.start
        }
        _ => {
            vals.copy_from_slice(T::load(row(rows.start), buf));
            idx.fill(rows.start);
            rows.start + 1
        }
    };
    for i in start..rows.end {
        let x = T::load(row(i), buf);
        match kind {
            Kind::Sum => T::A::add_rows(vals, x),
            Kind::Prod => T::A::mul_rows(vals, x),
            Kind::Max => T::A::max_rows(vals, x),
            Kind::Min => T::A::min_rows(vals, x),
            Kind::SqDev => T::A::sq_dev_rows(vals, x, means),
            Kind::ArgMax => T::A::arg_rows(vals, idx, x, i, true),
            Kind::ArgMin => T::A::arg_rows(vals, idx, x, i, false),
        }
    }
}

/// Folds the partial result of a later row range into `vals`/`idx`.
fn merge<A: Acc>(kind: Kind, vals: &mut [A], idx: &mut [usize], p: &Part<A>) {
    match kind {
        Kind::Sum | Kind::SqDev => A::add_rows(vals, &p.vals),
        Kind::Prod => A::mul_rows(vals, &p.vals),
        Kind::Max => A::max_rows(vals, &p.vals),
        Kind::Min => A::min_rows(vals, &p.vals),
        Kind::ArgMax | Kind::ArgMin => {
            let beats = if kind == Kind::ArgMax {
                A::beats_max
            } else {
                A::beats_min
            };
            for ((v, i), (&pv, &pi)) in vals.iter_mut().zip(idx.iter_mut()).zip(p.vals.iter().zip(&p.idx)) {
                if beats(pv, *v) {
                    *v = pv;
                    *i = pi;
                }
            }
        }
    }
}
