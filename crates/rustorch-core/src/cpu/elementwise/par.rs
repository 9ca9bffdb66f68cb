//! The parallel driver of the elementwise ops: fills an output vector in
//! chunks on the calling thread and rayon helpers.
//!
//! A plain `par_chunks_mut(..).for_each(..)` from a thread outside the pool
//! injects the job, puts the caller to sleep, and wakes it when the last
//! chunk is done: two thread wake-ups (10-25 us each on this 2-core VM) on
//! the critical path of every call, more than the whole op takes below
//! ~256K elements and a few percent of a 4M-element add. Here, like an
//! OpenMP parallel loop, the caller works too:
//! - it spawns `threads - 1` helper jobs and starts on the first chunk at
//!   once, so a helper that wakes late only means it takes fewer chunks;
//! - chunks are claimed from a shared cursor with sizes that shrink as the
//!   work runs out (guided scheduling: remaining / (2 threads), at least
//!   `MIN_CHUNK`), so the threads finish within a small chunk of each other
//!   whatever their start times and speeds (other processes share the cores);
//! - at the end the caller spins (then yields) while a helper is still
//!   inside a chunk, instead of sleeping and waiting to be woken.

use crate::cpu::copy::PAR_THRESHOLD;
use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Smallest chunk a thread claims (a few microseconds of the cheapest op,
/// so the claims' atomic operations stay negligible).
const MIN_CHUNK: usize = 8192;
/// Chunk starts are multiples of this (when the plan does not ask for
/// more), keeping them aligned like the whole buffer for the vector loops.
const ALIGN: usize = 1024;
/// Spins on a busy helper before yielding the core to it.
const SPINS: u32 = 1 << 14;

/// The output buffer shared by the threads that fill it.
struct OutPtr<U>(*mut MaybeUninit<U>);

// SAFETY: the pointer is only used to build disjoint chunk slices (see
// `claim_loop`), each written by the one thread that claimed it; `U: Send`
// lets values written there move to the caller's thread.
unsafe impl<U: Send> Sync for OutPtr<U> {}

/// The length of the next chunk when `remaining` elements are left.
fn chunk_len(remaining: usize, threads: usize, align: usize) -> usize {
    let guided = (remaining / (2 * threads)).max(MIN_CHUNK);
    (guided.div_ceil(align) * align).min(remaining)
}

/// Claims chunks from `next` until none is left and runs `work` on each.
fn claim_loop<U: Send>(
    n: usize,
    threads: usize,
    align: usize,
    next: &AtomicUsize,
    out: &OutPtr<U>,
    work: &(impl Fn(usize, &mut [MaybeUninit<U>]) + Sync),
) {
    let mut start = next.load(Ordering::Relaxed);
    loop {
        if start >= n {
            return;
        }
        let len = chunk_len(n - start, threads, align);
        match next.compare_exchange_weak(start, start + len, Ordering::Relaxed, Ordering::Relaxed) {
            Ok(_) => {
                // SAFETY: the successful exchange moved the cursor past
                // [start, start + len), so no other thread claims any of
                // it; the range lies within the n-element buffer (len is
                // at most n - start), which outlives this call.
                let chunk = unsafe { std::slice::from_raw_parts_mut(out.0.add(start), len) };
                work(start, chunk);
                start = next.load(Ordering::Relaxed);
            }
            Err(current) => start = current,
        }
    }
}

/// Splits `n` outputs into chunks whose starts are multiples of `granule`,
/// fills each with `work(start, chunk)` (in parallel from `PAR_THRESHOLD`
/// elements on), and returns the vector. `work` must write every element of
/// its chunk.
pub(super) fn fill_chunks<U: Send>(
    n: usize,
    granule: usize,
    work: impl Fn(usize, &mut [MaybeUninit<U>]) + Sync,
) -> Vec<U> {
    let mut out: Vec<U> = Vec::with_capacity(n);
    let threads = rayon::current_num_threads();
    if n < PAR_THRESHOLD || threads == 1 {
        work(0, &mut out.spare_capacity_mut()[..n]);
    } else {
        let align = if granule > 1 { granule } else { ALIGN };
        let ptr = OutPtr(out.spare_capacity_mut().as_mut_ptr());
        let next = AtomicUsize::new(0);
        // Helpers inside a chunk (not those that have not started: the
        // scope's own join waits for them, and they find nothing to do).
        let busy = AtomicUsize::new(0);
        let (ptr, next, busy, work) = (&ptr, &next, &busy, &work);
        rayon::in_place_scope(|s| {
            for _ in 1..threads.min(n.div_ceil(MIN_CHUNK)) {
                s.spawn(move |_| {
                    busy.fetch_add(1, Ordering::Acquire);
                    claim_loop(n, threads, align, next, ptr, work);
                    busy.fetch_sub(1, Ordering::Release);
                });
            }
            claim_loop(n, threads, align, next, ptr, work);
            let mut spins = 0u32;
            while busy.load(Ordering::Acquire) > 0 {
                if spins < SPINS {
                    spins += 1;
                    std::hint::spin_loop();
                } else {
                    std::thread::yield_now();
                }
            }
        });
    }
    // SAFETY: the chunks claimed by the threads cover [0, n) (the cursor
    // only stops at n), `work` initialized every element of its chunk, the
    // scope has joined every helper, and the capacity is n.
    unsafe { out.set_len(n) };
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every element is written exactly once, by chunks that start at
    /// multiples of the granule, for sizes around the thresholds.
    #[test]
    fn chunks_cover_the_output_once() {
        for (n, granule) in [
            (10usize, 1usize),
            (PAR_THRESHOLD - 1, 1),
            (PAR_THRESHOLD, 1),
            (PAR_THRESHOLD + 7, 1),
            (300_001, 1),
            (96 * 1000, 96 * 10),
        ] {
            let writes = AtomicUsize::new(0);
            let v: Vec<usize> = fill_chunks(n, granule, |start, chunk| {
                assert_eq!(start % granule, 0, "chunk start {start} off the granule {granule}");
                writes.fetch_add(chunk.len(), Ordering::Relaxed);
                for (i, o) in chunk.iter_mut().enumerate() {
                    o.write(start + i);
                }
            });
            assert_eq!(writes.load(Ordering::Relaxed), n, "n = {n}");
            assert!(v.iter().enumerate().all(|(i, &x)| i == x), "n = {n}");
        }
    }

    /// Called from inside a rayon worker (nested parallelism), the helpers
    /// go to that worker's own queue; nothing deadlocks and the result is
    /// complete.
    #[test]
    fn nested_in_a_parallel_loop() {
        use rayon::prelude::*;
        let sums: Vec<usize> = (0..4usize)
            .into_par_iter()
            .map(|k| {
                fill_chunks(100_000, 1, |s, c| {
                    for (i, o) in c.iter_mut().enumerate() {
                        o.write(s + i + k);
                    }
                })
                .iter()
                .sum()
            })
            .collect();
        let base: usize = (0..100_000).sum();
        assert_eq!(sums, (0..4).map(|k| base + 100_000 * k).collect::<Vec<_>>());
    }
}
