//! Reductions over an outer dimension of `[outer, len, inner]`: whole
//! rows of `inner` columns combine into a row of accumulators (vectorized
//! across columns). Sums and products combine pairwise over row ranges
//! (for accuracy), along a tree that depends on `len` only.
//!
//! With many outer blocks, threads take ranges of blocks and write their
//! results in place. With few, the work splits into column ranges and
//! each runs its tree with the halves of large nodes on other threads.
//! Either way every result comes from the same tree of operations, so
//! results are bit-identical whatever the thread count or scheduling
//! (columns are independent: splitting them changes nothing).

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
    // The thread count only picks how the work is spread: both paths run
    // the same tree of operations for every result.
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

/// Few blocks: tasks over the column ranges of each block; each runs the
/// rows' tree with its large nodes' halves in parallel.
fn split_pass<T: Elem>(
    kind: Kind,
    data: &[T],
    g: Geom,
    means: &[T::A],
    mut vals: Vec<T::A>,
    mut idx: Vec<usize>,
) -> Part<T::A> {
    let col_chunk = g.inner.min(OUTER_COLS);
    vals.par_chunks_mut(g.inner)
        .zip(idx.par_chunks_mut(g.inner))
        .enumerate()
        .for_each(|(b, (v, k))| {
            let slab = &data[b * g.len * g.inner..(b + 1) * g.len * g.inner];
            v.par_chunks_mut(col_chunk)
                .zip(k.par_chunks_mut(col_chunk))
                .enumerate()
                .for_each(|(c, (v, k))| {
                    let cols = c * col_chunk..c * col_chunk + v.len();
                    let m = block_means(kind, means, g, b, &cols);
                    outer_tree::<T>(kind, slab, g.inner, cols, 0..g.len, m, v, k);
                });
        });
    Part { vals, idx }
}

/// Work (elements) below which a node of the rows' tree runs on one thread.
const PAR_NODE: usize = PAR_REDUCE / 8;

/// `outer_part` with the two halves of every node over `PAR_NODE` elements
/// run in parallel. Sums and products split exactly where `outer_part`
/// does, so the result is the same; maxima, minima and their indices are
/// exact under any grouping (ties and NaN keep the first row, as one pass
/// in order does), so they split at the same points only to run in
/// parallel.
#[allow(clippy::too_many_arguments)]
fn outer_tree<T: Elem>(
    kind: Kind,
    slab: &[T],
    width: usize,
    cols: Range<usize>,
    rows: Range<usize>,
    means: &[T::A],
    vals: &mut [T::A],
    idx: &mut [usize],
) {
    if rows.len() <= OUTER_BLOCK || rows.len() * cols.len() < PAR_NODE {
        return outer_part::<T>(kind, slab, width, cols, rows, means, &mut Vec::new(), vals, idx);
    }
    let mid = split_point(&rows);
    let mut right = Part {
        vals: vec![T::A::ZERO; vals.len()],
        idx: vec![0; vals.len()],
    };
    rayon::join(
        || outer_tree::<T>(kind, slab, width, cols.clone(), rows.start..mid, means, vals, idx),
        || {
            let (v, k) = (&mut right.vals, &mut right.idx);
            outer_tree::<T>(kind, slab, width, cols.clone(), mid..rows.end, means, v, k)
        },
    );
    merge(kind, vals, idx, &right);
}

/// Where the rows of a pairwise node split: at a multiple of `OUTER_BLOCK`
/// rows near the middle (both halves non-empty for more than `OUTER_BLOCK`
/// rows).
fn split_point(rows: &Range<usize>) -> usize {
    rows.start + (rows.len() / 2).div_ceil(OUTER_BLOCK) * OUTER_BLOCK
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
    // Sums and products combine pairwise over halves of the row range, for
    // accuracy; the tree depends on the row range only (`outer_tree` runs
    // the same one in parallel).
    if matches!(kind, Kind::Sum | Kind::SqDev | Kind::Prod) && rows.len() > OUTER_BLOCK {
        let mid = split_point(&rows);
        outer_part::<T>(kind, slab, width, cols.clone(), rows.start..mid, means, buf, vals, idx);
        let mut right = vec![T::A::ZERO; vals.len()];
        outer_part::<T>(kind, slab, width, cols, mid..rows.end, means, buf, &mut right, idx);
        if kind == Kind::Prod {
            T::A::mul_rows(vals, &right);
        } else {
            T::A::add_rows(vals, &right);
        }
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
