//! Running a forward pass on rayon's pool with its other workers kept
//! awake.
//!
//! A decode step is hundreds of short ops, each split over the pool, with
//! a few microseconds of one-thread work (norms, rope, cache writes)
//! between them. A rayon worker that finds no work yields a few dozen
//! times and then sleeps on a futex, and waking it for the next op costs
//! tens of microseconds on a virtual machine: on the 2-core EPYC a sixth of
//! a TinyLlama decode step went to the scheduler. llama.cpp's thread pool
//! spins between the ops of a graph instead; here each other worker runs a
//! "spinner" for the length of the pass, which takes every piece of work
//! the pass splits off (`rayon::yield_now`) and never sleeps.
//! `RUSTORCH_SPIN=0` turns the spinners off (their cores then idle between
//! ops, at the cost of the wake-ups).

use std::sync::atomic::{AtomicBool, Ordering};

/// `f()` on a worker of rayon's global pool (the calling thread when it
/// is one already, as in a nested call, then without spinners), with the
/// pool's other workers spinning until `f` returns.
pub(super) fn run_spinning<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    if rayon::current_thread_index().is_some() {
        return f();
    }
    if std::env::var("RUSTORCH_SPIN").is_ok_and(|v| v == "0") {
        // Idle workers sleep (for a machine shared with other work).
        return rayon::scope(|_| f());
    }
    let done = AtomicBool::new(false);
    rayon::scope(|s| {
        let owner = rayon::current_thread_index();
        for _ in 1..rayon::current_num_threads() {
            let done = &done;
            s.spawn(move |_| {
                // The pass's own thread may take a spinner while it waits
                // for stolen work; spinning there would never return to
                // the pass, so it drops it (and that worker sleeps as usual).
                if rayon::current_thread_index() == owner {
                    return;
                }
                while !done.load(Ordering::Acquire) {
                    if rayon::yield_now() != Some(rayon::Yield::Executed) {
                        std::hint::spin_loop();
                    }
                }
            });
        }
        let out = f();
        done.store(true, Ordering::Release);
        out
    })
}
