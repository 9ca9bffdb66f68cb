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
//!   once, so a helper that wakes late only means it takes fewer chunks,
//!   and one that starts after the work is gone leaves at once without the
//!   caller waiting for it (the jobs are detached `rayon::spawn`s that
//!   enter the op through a counter the caller closes; see `Shared`);
//! - chunks are claimed from a shared cursor with sizes that shrink as the
//!   work runs out (guided scheduling: remaining / (2 threads), at least
//!   `MIN_CHUNK`), so the threads finish within a small chunk of each other
//!   whatever their start times and speeds (other processes share the cores);
//! - at the end the caller spins (then yields) while a helper is still
//!   inside a chunk, instead of sleeping and waiting to be woken.
//!
//! A panic in a helper's chunk is caught there and re-raised in the caller.

use crate::copy::PAR_THRESHOLD;
use std::any::Any;
use std::mem::MaybeUninit;
use std::panic::{self, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

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

/// What the caller shares with its helpers. `state` holds the `CLOSED` bit
/// and the number of helpers inside `job`.
struct Shared {
    state: AtomicUsize,
    panic: Mutex<Option<Box<dyn Any + Send>>>,
    /// The caller's claim loop, its lifetime erased: only called by a
    /// helper that entered (incremented `state`) before the caller closed
    /// the op, and the caller waits for every such helper before returning.
    job: *const (dyn Fn() + Sync + 'static),
}

// SAFETY: `job` is only dereferenced under the protocol above, while the
// closure it points to is alive; the closure itself is `Sync`.
unsafe impl Send for Shared {}
// SAFETY: as for `Send`; the other fields are thread-safe.
unsafe impl Sync for Shared {}

/// Set in `Shared::state` once the caller has finished its own claims: a
/// helper that starts later leaves without touching the job.
const CLOSED: usize = 1 << (usize::BITS - 1);

/// Closes the op and waits for the helpers inside it; runs on the normal
/// path and when the caller's own chunk work unwinds, so no helper is ever
/// left running on the caller's (borrowed) data.
struct CloseAndWait<'a>(&'a Shared);

impl Drop for CloseAndWait<'_> {
    fn drop(&mut self) {
        self.0.state.fetch_or(CLOSED, Ordering::AcqRel);
        let mut spins = 0u32;
        while self.0.state.load(Ordering::Acquire) & !CLOSED != 0 {
            if spins < SPINS {
                spins += 1;
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
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
        let job = || claim_loop(n, threads, align, &next, &ptr, &work);
        let job: &(dyn Fn() + Sync + '_) = &job;
        // SAFETY: only the lifetime changes (same fat-pointer layout);
        // `Shared::job` documents when it may be called, and
        // `CloseAndWait` enforces it before `job` goes out of scope.
        let job: *const (dyn Fn() + Sync + 'static) = unsafe { std::mem::transmute(job) };
        let shared = Arc::new(Shared {
            state: AtomicUsize::new(0),
            panic: Mutex::new(None),
            job,
        });
        {
            let _join = CloseAndWait(&shared);
            for _ in 1..threads.min(n.div_ceil(MIN_CHUNK)) {
                let sh = Arc::clone(&shared);
                rayon::spawn(move || {
                    if sh.state.fetch_add(1, Ordering::Acquire) & CLOSED == 0 {
                        // SAFETY: this helper entered before the caller
                        // closed the op, so the caller is still waiting in
                        // `CloseAndWait` and `job` is alive.
                        let r = panic::catch_unwind(AssertUnwindSafe(|| unsafe { (*sh.job)() }));
                        if let Err(p) = r {
                            *sh.panic.lock().unwrap_or_else(|e| e.into_inner()) = Some(p);
                        }
                    }
                    sh.state.fetch_sub(1, Ordering::Release);
                });
            }
            // SAFETY: the closure behind `job` lives until the end of this
            // function.
            unsafe { (*shared.job)() };
        }
        let payload = shared.panic.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(p) = payload {
            // A helper's chunk is incomplete: the vector stays empty.
            panic::resume_unwind(p);
        }
    }
    // SAFETY: the chunks claimed by the threads cover [0, n) (the cursor
    // only stops at n), `work` initialized every element of its chunk (a
    // helper's panic was re-raised above), every helper that entered has
    // left, and the capacity is n.
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

    /// A panic in any chunk (on a helper or on the caller) reaches the
    /// caller.
    #[test]
    fn a_panicking_chunk_reaches_the_caller() {
        let n = 200_000;
        let r = std::panic::catch_unwind(|| {
            fill_chunks::<u32>(n, 1, |s, c| {
                assert!(s + c.len() < n, "the last chunk fails");
                for o in c {
                    o.write(0);
                }
            })
        });
        assert!(r.is_err());
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
