//! Reductions of contiguous rows: blocks of `BLOCK` elements reduced with
//! lane accumulators, combined pairwise, so f32 sums stay within a few ulp
//! of PyTorch's cascade sums even for long rows. Many rows run in
//! parallel; a few long rows are each split over the threads.

use super::acc::{Acc, Elem};
use super::basic::{Kind, Part};
use super::{chunk_size, PAR_REDUCE};
use rayon::prelude::*;

/// Elements reduced by one lane-accumulator kernel call; longer rows are
/// summed pairwise over blocks of this size.
const BLOCK: usize = 1024;
/// A row at least this long is split over threads when there are few rows.
const PAR_ROW: usize = PAR_REDUCE;

/// Reduces every contiguous row of `len` elements.
pub(super) fn rows_pass<T: Elem>(kind: Kind, data: &[T], len: usize, means: &[T::A]) -> Part<T::A> {
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
