//! RusTorch's backend conformance suite (issue 31, step 5).
//!
//! One suite for every backend: each op, dtype and layout case is run on the backend under test
//! ([`Target`]: a strict, traced executor preferring the backend's device, so an op it cannot run
//! is an error and the trace proves where each op ran) and compared with an independent
//! reference:
//!
//! - the PyTorch fixtures (`suites::torch_*`, from tools/gen_torch_fixtures.py);
//! - the GGML fixtures computed by llama.cpp (`suites::ggml_*`, from
//!   tools/gen_ggml_ops_fixtures.py and tools/gen_ggml_matmul_fixtures.py) and the quantized ops
//!   against the CPU's kernels (`suites::quant_ops`);
//! - random inputs against a CPU-only executor (`suites::random`), for every `Op` variant, every
//!   dtype it takes, on contiguous and strided layouts; what the backend's `supports` declines is
//!   counted and listed, not failed.
//!
//! A backend's tests are one call of [`backend_tests!`]. [`FaultyBackend`] wraps the CPU kernels
//! as a second device that fails on request, to prove routing, fallback and lost-device handling
//! (tests/routing.rs), and, without faults, is itself a target that must pass everything.

pub mod faulty;
pub mod suites;
mod target;
mod watch;

pub use faulty::{FaultyBackend, FaultyBuffer};
pub use rustorch_core::Backend;
pub use target::{exact, Target, Tol, TolFn};

use std::panic::{catch_unwind, AssertUnwindSafe};

/// A named check of a suite.
pub type Case = (&'static str, fn(&Target));

/// Runs every check of a group on `target`, each even when an earlier one failed, and fails
/// with the list of the checks that failed (their own messages are printed above it).
pub fn run_group(group: &str, target: &Target, cases: &[Case]) {
    let mut failed = Vec::new();
    let mut declined = Vec::new();
    for (name, check) in cases {
        target.exec.clear_trace();
        target.clear_declined();
        if catch_unwind(AssertUnwindSafe(|| check(target))).is_err() {
            // A check that needs an op the target's `supports` declines stops at the strict
            // executor's refusal: listed, not failed (as the random suite counts it). The CPU,
            // the reference, declines nothing.
            if target.declined() > 0 && !target.device.is_cpu() {
                declined.push(*name);
            } else {
                failed.push(*name);
            }
        }
    }
    if !declined.is_empty() {
        target.note(format!(
            "{} of {} checks need ops the backend declines: {}",
            declined.len(),
            cases.len(),
            declined.join(", ")
        ));
    }
    if target.fixture_checks() > 0 {
        target.note(format!("{} fixture comparisons", target.fixture_checks()));
    }
    for line in target.notes() {
        // Straight to stderr: the harness hides the output of passing tests, and coverage is
        // worth seeing with `--nocapture` as well as in a failing run.
        eprintln!("{}: {group}: {line}", target.name);
    }
    assert!(
        failed.is_empty(),
        "{}: {group}: {} of {} checks failed: {}",
        target.name,
        failed.len(),
        cases.len(),
        failed.join(", ")
    );
}

/// The conformance tests of one backend: one `#[test]` per suite group, in a module `$name`.
///
/// `$make` is a closure returning the backend under test (anything that coerces to
/// `Arc<dyn Backend>`), called afresh for each test; `$tol` a [`TolFn`] giving the backend's
/// tolerance against the CPU per op and dtype ([`exact`] for the CPU itself).
///
/// ```ignore
/// rustorch_conformance::backend_tests!(cpu, || std::sync::Arc::new(rustorch_cpu::CpuBackend::new()),
///     rustorch_conformance::exact);
/// ```
#[macro_export]
macro_rules! backend_tests {
    ($name:ident, $make:expr, $tol:expr) => {
        mod $name {
            #[allow(unused_imports)]
            use super::*;

            fn target() -> $crate::Target {
                let backend: ::std::sync::Arc<dyn $crate::Backend> = ($make)();
                $crate::Target::new(stringify!($name), backend, $tol)
            }

            $crate::backend_tests!(@groups
                torch_elementwise torch_reduce torch_nn torch_index torch_linalg torch_conv torch_create
                ggml_ops ggml_matmul quant_ops
                random_elementwise random_reduce random_other
            );
        }
    };
    // A backend that may be absent here (no GPU): `$make` returns `Result<backend, reason>`,
    // and each test without one passes after one line saying why.
    (@optional $name:ident, $make:expr, $tol:expr) => {
        mod $name {
            #[allow(unused_imports)]
            use super::*;

            fn target() -> Option<$crate::Target> {
                let made: Result<::std::sync::Arc<dyn $crate::Backend>, String> = ($make)();
                match made {
                    Ok(backend) => Some($crate::Target::new(stringify!($name), backend, $tol)),
                    Err(why) => {
                        eprintln!("{}: skipped: {why}", stringify!($name));
                        None
                    }
                }
            }

            $crate::backend_tests!(@optional_groups
                torch_elementwise torch_reduce torch_nn torch_index torch_linalg torch_conv torch_create
                ggml_ops ggml_matmul quant_ops
                random_elementwise random_reduce random_other
            );
        }
    };
    (@optional_groups $($group:ident)*) => {
        $(
            #[test]
            fn $group() {
                if let Some(t) = target() {
                    $crate::run_group(stringify!($group), &t, $crate::suites::$group::CASES);
                }
            }
        )*
    };
    (@groups $($group:ident)*) => {
        $(
            #[test]
            fn $group() {
                $crate::run_group(stringify!($group), &target(), $crate::suites::$group::CASES);
            }
        )*
    };
}
