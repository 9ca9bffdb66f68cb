//! Reductions of contiguous rows: blocks of `BLOCK` elements reduced with
//! lane accumulators, combined pairwise, so f32 sums stay within a few ulp
//! of PyTorch's cascade sums even for long rows. Many rows run in
//! parallel; a few long rows are each split over the threads.
//!
//! The pairwise tree of a row is a function of its length only, and a row
//! split over threads runs that same tree (its halves on other threads), so
//! results are bit-identical whatever the thread count or scheduling.

use super::acc::{Acc, Elem};
use super::basic::{Kind, Part};
use super::PAR_REDUCE;
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
    // The thread count only picks how the work is spread: every path runs
    // `row_reduce`'s tree for each row, so the results are the same.
    let results: Vec<(T::A, usize)> = if len >= PAR_ROW && rows < 2 * rayon::current_num_threads() {
        data.chunks(len)
            .enumerate()
            .map(|(r, row)| row_par::<T>(kind, row, 0, mean(r)))
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

/// A long row split over threads: `row_reduce`'s tree, with the two halves
/// of each node above `PAR_PIECE` elements run in parallel (rayon balances
/// them over however many threads there are; the split points, and so the
/// result, do not depend on that).
fn row_par<T: Elem>(kind: Kind, row: &[T], base: usize, mean: T::A) -> (T::A, usize) {
    if row.len() <= PAR_PIECE {
        return row_reduce::<T>(kind, row, base, mean, &mut Vec::new());
    }
    let half = split_point(row.len());
    let (l, r) = rayon::join(
        || row_par::<T>(kind, &row[..half], base, mean),
        || row_par::<T>(kind, &row[half..], base + half, mean),
    );
    combine(kind, l, r)
}

/// Elements below which a piece of a long row is not split further over
/// threads: enough work (tens of microseconds) to amortize a task.
const PAR_PIECE: usize = PAR_REDUCE / 8;

/// Where a row of `len > BLOCK` elements splits: at a block boundary near
/// the middle, so both halves are non-empty.
fn split_point(len: usize) -> usize {
    (len / 2).div_ceil(BLOCK) * BLOCK
}

/// Reduces one non-empty row whose first element has index `base`:
/// blocks of `BLOCK` elements with lane accumulators, combined pairwise.
fn row_reduce<T: Elem>(kind: Kind, row: &[T], base: usize, mean: T::A, buf: &mut Vec<T::A>) -> (T::A, usize) {
    if row.len() <= BLOCK {
        return block(kind, T::load(row, buf), base, mean);
    }
    let half = split_point(row.len());
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
