//! Building an output vector chunk by chunk, in parallel when it is worth
//! it. Shared by the normalization, indexing and attention kernels.

use rayon::prelude::*;
use std::mem::MaybeUninit;

/// How to split an output into tasks.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Split {
    /// Elements per chunk (one row, usually); the last chunk may be shorter.
    pub chunk: usize,
    /// Whether to use rayon at all.
    pub parallel: bool,
    /// Fewest chunks per rayon task, so tiny tasks do not drown in overhead.
    pub min_chunks: usize,
}

impl Split {
    /// Rows of `chunk` elements, parallel when the whole output has at least
    /// `threshold` elements, with tasks of at least `task` elements.
    pub(crate) fn rows(len: usize, chunk: usize, threshold: usize, task: usize) -> Split {
        Split {
            chunk,
            parallel: len >= threshold,
            min_chunks: (task / chunk.max(1)).max(1),
        }
    }
}

/// A vector of `len` elements built by `fill(state, chunk_index, chunk)`,
/// each chunk first set to `init`; `state` is per-task scratch made by
/// `new_state`.
///
/// Why not `vec![init; len]` and then fill: for large outputs that is a
/// separate pass over memory (the allocator clears reused blocks), after
/// which the output's cache lines are gone again when `fill` writes them.
/// Setting each chunk right before filling it keeps that pass in L1 cache,
/// which makes memory-bound kernels such as rms_norm about 20% faster.
pub(crate) fn build<T, S>(
    len: usize,
    split: Split,
    init: T,
    new_state: impl Fn() -> S + Sync + Send,
    fill: impl Fn(&mut S, usize, &mut [T]) + Sync + Send,
) -> Vec<T>
where
    T: Copy + Send + Sync,
{
    let mut out: Vec<T> = Vec::with_capacity(len);
    if len == 0 || split.chunk == 0 {
        // A zero chunk size only comes with an empty output; stay safe anyway.
        out.resize(len, init);
        return out;
    }
    let spare = &mut out.spare_capacity_mut()[..len];
    let body = |state: &mut S, (i, c): (usize, &mut [MaybeUninit<T>])| fill(state, i, init_slice(c, init));
    if split.parallel {
        spare
            .par_chunks_mut(split.chunk)
            .enumerate()
            .with_min_len(split.min_chunks)
            .for_each_init(&new_state, body);
    } else {
        let mut state = new_state();
        spare
            .chunks_mut(split.chunk)
            .enumerate()
            .for_each(|c| body(&mut state, c));
    }
    // SAFETY: the chunks cover `spare[..len]`, the first `len` slots of the
    // capacity, and `init_slice` wrote every element of every chunk.
    unsafe { out.set_len(len) };
    out
}

/// Writes `v` to every element and returns the slice as initialized.
fn init_slice<T: Copy>(s: &mut [MaybeUninit<T>], v: T) -> &mut [T] {
    for e in s.iter_mut() {
        e.write(v);
    }
    // SAFETY: every element was just written, and `MaybeUninit<T>` has the
    // size, alignment and layout of `T`.
    unsafe { std::slice::from_raw_parts_mut(s.as_mut_ptr().cast::<T>(), s.len()) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_chunk_is_filled_in_order() {
        for parallel in [false, true] {
            let split = Split {
                chunk: 7,
                parallel,
                min_chunks: 2,
            };
            let v = build(
                100,
                split,
                0usize,
                || (),
                |_, i, c| {
                    for (j, x) in c.iter_mut().enumerate() {
                        *x = i * 7 + j;
                    }
                },
            );
            assert_eq!(v, (0..100).collect::<Vec<_>>());
            // A fill that writes nothing leaves the initial value.
            let v = build(10, split, 3u8, || (), |_, _, _| {});
            assert_eq!(v, vec![3u8; 10]);
        }
        assert!(build(0, Split::rows(0, 0, 1, 1), 0f32, || (), |_, _, _| {}).is_empty());
    }
}
