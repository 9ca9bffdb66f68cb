//! Reductions over an outer dimension of `[outer, len, inner]`: whole
//! rows of `inner` columns combine into a row of accumulators (vectorized
//! across columns). Sums add pairwise over row ranges for accuracy.

use super::acc::{Acc, Elem};
use super::basic::{Kind, Part};
use super::{Geom, PAR_REDUCE};
use rayon::prelude::*;
use std::ops::Range;

/// Rows an outer reduction adds one after the other before switching to
/// pairwise addition of partial results.
const OUTER_BLOCK: usize = 128;
/// Columns one outer-reduction task accumulates: 16 KiB of f32
/// accumulators, which stay in L1 while the rows stream through.
const OUTER_COLS: usize = 4096;

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
pub(super) fn outer_pass<T: Elem>(kind: Kind, data: &[T], g: Geom, means: &[T::A]) -> Part<T::A> {
    let threads = rayon::current_num_threads();
    let parallel = data.len() >= PAR_REDUCE;
    // Whole rows when they fit: each task then streams through contiguous
    // memory. More tasks come from splitting the rows into ranges whose
    // partial results merge at the end.
    let col_chunk = g.inner.min(OUTER_COLS);
    let row_chunk = if parallel {
        let col_tasks = g.outer * g.inner.div_ceil(col_chunk);
        let splits = (2 * threads).div_ceil(col_tasks);
        g.len.div_ceil(splits).max(OUTER_BLOCK).min(g.len)
    } else {
        g.len
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
