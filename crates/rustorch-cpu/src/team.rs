//! A spinning thread team for the short parallel loops of token generation.
//!
//! A decode step is hundreds of ops of a few microseconds each (a
//! SmolLM2-135M step: 120 matrix-vector products of 0.2-1 MB and 30
//! attentions over one query row). Split through rayon, each pays for
//! its split and join: pushing halves on a deque, a thief taking them
//! through crossbeam's epoch machinery, the join waiting (or sleeping on
//! a futex) for the stolen half, a few microseconds per op on a 2-core
//! machine, as much as the work in the smallest products. llama.cpp's
//! thread pool spins between a graph's ops instead, and starting an op
//! costs it one atomic store.
//!
//! `run_team(f)` runs `f` on a worker of rayon's pool with the pool's
//! other workers held for it ("helpers") until `f` returns. Inside `f`,
//! `for_each(n, work)` publishes `work` to the helpers with one store and
//! all threads claim its indices from a shared counter; it returns once
//! every helper has left the loop. Helpers spin between jobs (running
//! any rayon work meanwhile, so the ops still split through rayon make
//! progress), and never sleep until `f` returns. Outside a team (another
//! thread, nested in a job, more workers than hardware threads, or
//! `RUSTORCH_SPIN=0`), `for_each` is a rayon
//! parallel loop: results never depend on which runs.

use rayon::prelude::*;
use std::cell::{Cell, UnsafeCell};
use std::panic::{self, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;

/// Keeps each hot atomic on its own cache lines (two, for the adjacent
/// line prefetcher), so that helpers polling one do not slow the others.
#[repr(align(128))]
struct Padded<T>(T);

/// The most workers a team holds (a bitmask of its helpers is one `u64`).
const MAX_WORKERS: usize = 64;

/// A type-erased `&(dyn Fn(usize) + Sync)`, valid while the job that
/// published it runs.
type Job = *const (dyn Fn(usize) + Sync + 'static);

struct Team {
    /// The current job's number, raised (SeqCst) once its fields are set.
    gen: Padded<AtomicUsize>,
    /// The next index of the current job to claim.
    next: Padded<AtomicUsize>,
    /// The current job and its index count: written by the owner only
    /// while no helper can read them (before `gen` is raised, after every
    /// registered helper has finished the previous job).
    job: UnsafeCell<Option<Job>>,
    len: UnsafeCell<usize>,
    /// Indices per claim of the current job (`grain`), written as `len`.
    grain: UnsafeCell<usize>,
    /// The helpers taking part (bit h: helper h), set as each starts.
    registered: AtomicU64,
    /// Helper h's last finished job number (h: the helper's worker index;
    /// the owner's entry is unused).
    done: Vec<Padded<AtomicUsize>>,
    /// Set when `f` has returned: helpers leave.
    exit: AtomicBool,
    /// A panic payload from a helper's piece of a job, re-raised by the owner.
    panic: Mutex<Option<Box<dyn std::any::Any + Send>>>,
}

// SAFETY: `job` and `len` are written by the owner thread only while no
// helper reads them (see their comment) and read by helpers only between
// seeing `gen` raised and storing `done`; everything else is atomic or
// locked.
unsafe impl Sync for Team {}

thread_local! {
    /// The team this thread owns, while it runs `run_team`'s `f` and is not
    /// inside one of its jobs.
    static OWNED: Cell<*const Team> = const { Cell::new(std::ptr::null()) };
    /// Whether this thread is running some `run_team`'s `f` (in a job or not).
    static OWNING: Cell<bool> = const { Cell::new(false) };
}

/// Whether `RUSTORCH_SPIN=0` turned teams off (idle workers then sleep
/// between ops, for a machine shared with other work).
fn spinning_enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| !std::env::var("RUSTORCH_SPIN").is_ok_and(|v| v == "0"))
}

/// The threads the OS runs at once for this process. With more workers
/// than these, spinning helpers wait for one another's time slices at
/// every job (a SmolLM2 decode step at 4 workers on 2 cores: 1 token/s
/// instead of 240), so `run_team` then leaves the loops to rayon, whose
/// idle workers sleep.
fn hardware_threads() -> usize {
    static N: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *N.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// `f()` on a worker of rayon's global pool with the pool's other workers
/// spinning for it until it returns, so that `for_each` inside `f` starts
/// at once on every thread. From a rayon worker already (a nested call,
/// or a caller inside `rayon::scope`), `f()` runs as it is: an enclosing
/// `run_team` already holds the pool.
pub fn run_team<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    let spin = spinning_enabled() && rayon::current_num_threads() <= hardware_threads();
    run_team_on(None, spin, f)
}

/// `run_team` on `pool`'s workers (`None`: rayon's global pool), with a
/// spinning team where `spin` holds.
fn run_team_on<R: Send>(pool: Option<&rayon::ThreadPool>, spin: bool, f: impl FnOnce() -> R + Send) -> R {
    if rayon::current_thread_index().is_some() {
        return f();
    }
    let threads = pool.map_or_else(rayon::current_num_threads, |p| p.current_num_threads());
    if !spin || threads < 2 {
        return match pool {
            Some(p) => p.scope(|_| f()),
            None => rayon::scope(|_| f()),
        };
    }
    // One team at a time in the process (two threads running models, or
    // tests): each team's scope ends only once every worker has run its
    // helper job, and a worker spinning for one team's owner would never
    // run the other's, so two teams could each wait for the other's worker.
    // A team holds every worker anyway: a second one gains nothing.
    static ONE_TEAM: Mutex<()> = Mutex::new(());
    let _one_team = ONE_TEAM.lock().unwrap_or_else(|e| e.into_inner());
    let team = Team {
        gen: Padded(AtomicUsize::new(0)),
        next: Padded(AtomicUsize::new(0)),
        job: UnsafeCell::new(None),
        len: UnsafeCell::new(0),
        grain: UnsafeCell::new(1),
        registered: AtomicU64::new(0),
        done: (0..threads.min(MAX_WORKERS))
            .map(|_| Padded(AtomicUsize::new(0)))
            .collect(),
        exit: AtomicBool::new(false),
        panic: Mutex::new(None),
    };
    match pool {
        Some(p) => p.scope(|s| lead(&team, s, f)),
        None => rayon::scope(|s| lead(&team, s, f)),
    }
}

/// The owner's side of `run_team_on` inside its scope: the helpers'
/// jobs, then `f`.
fn lead<'scope, R>(team: &'scope Team, s: &rayon::Scope<'scope>, f: impl FnOnce() -> R) -> R {
    OWNING.with(|o| o.set(true));
    // One helper job per worker, each in that worker's own queue, so that
    // no worker can take a second one: a helper running rayon work while
    // it spins could otherwise start another helper's job inside its own
    // loop, and its first loop (which the owner waits for) would never
    // finish a job again.
    s.spawn_broadcast(move |_, ctx| {
        // The owner runs its worker's job itself once it waits (in a rayon
        // join, or for the scope's end): helping there would not return to
        // its `f` before this team ends. It drops it.
        let h = ctx.index();
        if h < team.done.len() && !OWNING.with(|o| o.get()) {
            team.help(h);
        }
    });
    OWNED.with(|o| o.set(team));
    // Whether `f` returns or panics, the helpers must leave before the
    // scope can end.
    struct Leave<'a>(&'a Team);
    impl Drop for Leave<'_> {
        fn drop(&mut self) {
            OWNED.with(|o| o.set(std::ptr::null()));
            OWNING.with(|o| o.set(false));
            self.0.exit.store(true, Ordering::Release);
        }
    }
    let _leave = Leave(team);
    f()
}

/// `work(i)` for every `i` in `0..n`, in parallel: through the team this
/// thread owns (see `run_team`), or else rayon. `work` must not depend on
/// which thread runs an index, or in what order.
pub fn for_each(n: usize, work: impl Fn(usize) + Sync) {
    for_each_claiming(n, None, work);
}

/// `for_each` where every index is claimed on its own: for loops of a few
/// dozen long items (tens of microseconds each), where runs of several
/// would leave a thread idle while another finishes its last run. Outside
/// a team, rayon splits the loop down to single items too.
pub fn for_each_single(n: usize, work: impl Fn(usize) + Sync) {
    for_each_claiming(n, Some(1), work);
}

/// `for_each` with claims of `grain` indices (`None`: the default runs).
fn for_each_claiming(n: usize, grain: Option<usize>, work: impl Fn(usize) + Sync) {
    if n == 0 {
        return;
    }
    let team = OWNED.with(|o| o.get());
    if team.is_null() || n == 1 {
        if n == 1 {
            work(0);
        } else if grain == Some(1) {
            (0..n).into_par_iter().with_max_len(1).for_each(&work);
        } else {
            (0..n).into_par_iter().for_each(&work);
        }
        return;
    }
    // SAFETY: `OWNED` points at the team of the enclosing `run_team` on this
    // thread, which outlives this call (it is cleared before the team is
    // dropped).
    let team = unsafe { &*team };
    // Jobs nested in this one run through rayon (the helpers are busy
    // with this one, and the job fields are in use).
    OWNED.with(|o| o.set(std::ptr::null()));
    struct Restore<'a>(&'a Team);
    impl Drop for Restore<'_> {
        fn drop(&mut self) {
            OWNED.with(|o| o.set(self.0));
        }
    }
    let _restore = Restore(team);
    team.run(n, grain, &work);
}

impl Team {
    /// Owner side of one job.
    fn run(&self, n: usize, grain: Option<usize>, work: &(dyn Fn(usize) + Sync)) {
        // SAFETY: only the lifetime changes (same fat-pointer layout); no
        // helper calls `job` after this function returns (it waits below
        // for every helper that can have seen this job).
        let job: Job = unsafe { std::mem::transmute::<&(dyn Fn(usize) + Sync), Job>(work) };
        // SAFETY: every registered helper finished the previous job before
        // it returned (the wait below), and a helper that registers later
        // takes no job published before it registered: none reads these now.
        let grain = grain.unwrap_or_else(|| default_grain(n, self.done.len()));
        unsafe {
            *self.job.get() = Some(job);
            *self.len.get() = n;
            *self.grain.get() = grain;
        }
        self.next.0.store(0, Ordering::Relaxed);
        let gen = self.gen.0.load(Ordering::Relaxed) + 1;
        self.gen.0.store(gen, Ordering::SeqCst);
        let mine = panic::catch_unwind(AssertUnwindSafe(|| claim(&self.next.0, n, grain, work)));
        // Every helper registered by now may have seen this job; those
        // registering later see its number as already past.
        let mut waiting = self.registered.load(Ordering::SeqCst);
        let mut idle = Idle::default();
        while waiting != 0 {
            let h = waiting.trailing_zeros() as usize;
            if self.done[h].0.load(Ordering::Acquire) >= gen {
                waiting &= waiting - 1;
            } else {
                idle.wait();
            }
        }
        if let Err(p) = mine {
            panic::resume_unwind(p);
        }
        let theirs = self.panic.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(p) = theirs {
            panic::resume_unwind(p);
        }
    }

    /// Helper `h`'s loop, until the owner's `f` returns.
    fn help(&self, h: usize) {
        self.registered.fetch_or(1 << h, Ordering::SeqCst);
        // Jobs up to this one were published before this helper could be
        // waited for: they are not its to take.
        let mut seen = self.gen.0.load(Ordering::SeqCst);
        self.done[h].0.store(seen, Ordering::Release);
        let mut idle = Idle::default();
        loop {
            let gen = self.gen.0.load(Ordering::Acquire);
            if gen != seen {
                // SAFETY: the owner set these before raising `gen` to this
                // job's number and keeps them until this helper stores
                // `done` below (it waits for every registered helper).
                let (job, n, grain) = unsafe {
                    (
                        (*self.job.get()).expect("a job was published"),
                        *self.len.get(),
                        *self.grain.get(),
                    )
                };
                // SAFETY: `job` is alive until the owner sees `done` below.
                let r = panic::catch_unwind(AssertUnwindSafe(|| claim(&self.next.0, n, grain, unsafe { &*job })));
                if let Err(p) = r {
                    *self.panic.lock().unwrap_or_else(|e| e.into_inner()) = Some(p);
                }
                seen = gen;
                self.done[h].0.store(gen, Ordering::Release);
                idle = Idle::default();
                continue;
            }
            if self.exit.load(Ordering::Acquire) {
                return;
            }
            // Ops that still split through rayon run here meanwhile.
            if rayon::yield_now() == Some(rayon::Yield::Executed) {
                idle = Idle::default();
            } else {
                idle.wait();
            }
        }
    }
}

/// A waiting thread's pause: spin for the short gaps between a decode
/// step's ops (a few microseconds: a system call there would cost as
/// much as the gap), then give the core to the OS on every round. Without
/// the second part a team with more threads than free cores (a busy
/// machine, other processes or test threads) spends whole time slices
/// spinning while the thread it waits for is not running: a test run on
/// a loaded 2-core machine took minutes for what takes seconds.
#[derive(Default)]
struct Idle(u32);

impl Idle {
    /// Spins before yielding: a few tens of microseconds of `pause`.
    const SPINS: u32 = 1 << 11;

    fn wait(&mut self) {
        if self.0 < Self::SPINS {
            self.0 += 1;
            std::hint::spin_loop();
        } else {
            std::thread::yield_now();
        }
    }
}

/// Claims runs of `grain` indices of a job until none is left.
fn claim(next: &AtomicUsize, n: usize, grain: usize, work: &(dyn Fn(usize) + Sync)) {
    loop {
        let start = next.fetch_add(grain, Ordering::Relaxed);
        if start >= n {
            return;
        }
        for i in start..(start + grain).min(n) {
            work(i);
        }
    }
}

/// Indices per claim for `n` over `threads`: two claims per thread, so
/// that a thread that starts late or runs slow leaves its second run to
/// the others. Finer claims were slower on the 2-core EPYC (a 49152 x 576
/// Q4_1 matvec: 216 us with one claim per thread, 240 us with two, 323 us
/// with sixteen): each moves the counter's cache line between cores, and
/// each jump to another part of the weights restarts the prefetchers.
fn default_grain(n: usize, threads: usize) -> usize {
    n.div_ceil(threads * 2).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU32;

    #[test]
    fn every_index_runs_once_inside_and_outside_a_team() {
        for n in [0usize, 1, 2, 7, 64, 1000] {
            let hits: Vec<AtomicU32> = (0..n).map(|_| AtomicU32::new(0)).collect();
            let hit = |i: usize| {
                hits[i].fetch_add(1, Ordering::Relaxed);
            };
            for_each(n, hit);
            for_each_single(n, hit);
            run_team(|| {
                for _ in 0..50 {
                    for_each(n, hit);
                    for_each_single(n, hit);
                }
            });
            assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 102), "n = {n}");
        }
    }

    /// More workers than two (a hang at 4 and 8 workers before): a helper
    /// spinning between jobs runs stolen rayon work, and must not start a
    /// second helper loop there (the owner would wait for its first loop
    /// forever). Spinning even where the workers outnumber the cores.
    #[test]
    fn teams_of_three_to_eight_workers_finish() {
        const ROUNDS: usize = 10;
        for threads in [3usize, 4, 8] {
            let (tx, rx) = std::sync::mpsc::channel();
            std::thread::spawn(move || {
                let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
                let mut total = 0usize;
                for _ in 0..ROUNDS {
                    let sum = AtomicUsize::new(0);
                    run_team_on(Some(&pool), true, || {
                        for _ in 0..20 {
                            for_each(64, |i| {
                                sum.fetch_add(i, Ordering::Relaxed);
                            });
                            // Rayon work split from the owner, for helpers to steal.
                            let s: usize = (0..256usize).into_par_iter().with_max_len(1).sum();
                            sum.fetch_add(s, Ordering::Relaxed);
                        }
                    });
                    total += sum.load(Ordering::Relaxed);
                }
                tx.send(total).unwrap();
            });
            let total = rx.recv_timeout(std::time::Duration::from_secs(120));
            let want = ROUNDS * 20 * ((0..64).sum::<usize>() + (0..256).sum::<usize>());
            assert_eq!(total, Ok(want), "{threads} workers");
        }
    }

    /// Two threads running teams on one pool at once (two models, or tests
    /// in parallel): a worker spinning for one owner must not hold up the
    /// end of the other's team (a hang before teams took turns).
    #[test]
    fn two_teams_at_once_finish() {
        let pool = std::sync::Arc::new(rayon::ThreadPoolBuilder::new().num_threads(3).build().unwrap());
        let (tx, rx) = std::sync::mpsc::channel();
        for _ in 0..2 {
            let (pool, tx) = (pool.clone(), tx.clone());
            std::thread::spawn(move || {
                let mut total = 0usize;
                for _ in 0..40 {
                    let sum = AtomicUsize::new(0);
                    run_team_on(Some(&pool), true, || {
                        for _ in 0..10 {
                            for_each(64, |i| {
                                sum.fetch_add(i, Ordering::Relaxed);
                            });
                            let s: usize = (0..64usize).into_par_iter().with_max_len(1).sum();
                            sum.fetch_add(s, Ordering::Relaxed);
                        }
                    });
                    total += sum.load(Ordering::Relaxed);
                }
                tx.send(total).unwrap();
            });
        }
        let want = 40 * 10 * 2 * (0..64).sum::<usize>();
        for _ in 0..2 {
            assert_eq!(rx.recv_timeout(std::time::Duration::from_secs(120)), Ok(want));
        }
    }

    #[test]
    fn nested_loops_run_through_rayon() {
        let total = AtomicUsize::new(0);
        run_team(|| {
            for_each(8, |_| {
                for_each(16, |j| {
                    total.fetch_add(j, Ordering::Relaxed);
                });
            });
        });
        assert_eq!(total.load(Ordering::Relaxed), 8 * (0..16).sum::<usize>());
    }

    #[test]
    fn a_panic_in_a_job_reaches_the_caller_and_the_team_ends() {
        let r = panic::catch_unwind(|| {
            run_team(|| {
                for_each(64, |i| {
                    if i == 40 {
                        panic!("index 40");
                    }
                })
            })
        });
        assert!(r.is_err());
        // The pool is usable afterwards.
        let sum = AtomicUsize::new(0);
        run_team(|| {
            for_each(10, |i| {
                sum.fetch_add(i, Ordering::Relaxed);
            })
        });
        assert_eq!(sum.load(Ordering::Relaxed), 45);
    }
}
