//! Running a forward pass with rayon's other workers held for it.
//!
//! A decode step is hundreds of short ops, each split over the pool, with
//! a few microseconds of one-thread work (norms, rope, cache writes)
//! between them. A rayon worker that finds no work yields a few dozen
//! times and then sleeps on a futex, and waking it for the next op costs
//! tens of microseconds on a virtual machine: on the 2-core EPYC a sixth of
//! a TinyLlama decode step went to the scheduler. llama.cpp's thread pool
//! spins between the ops of a graph instead. Here the pass runs inside
//! `rustorch_core::team::run_team`: the other workers spin for the length
//! of the pass, take the decode step's loops as soon as they are published
//! (`team::for_each`) and run any rayon work meanwhile.
//! `RUSTORCH_SPIN=0` turns the spinning off (the cores then idle between
//! ops, at the cost of the wake-ups).

/// `f()` with the pool's workers held for it (see the module comment):
/// wrap a whole generation loop in it to keep them across its steps too.
/// Nested calls run `f()` as it is.
pub fn run_spinning<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    rustorch_core::team::run_team(f)
}
