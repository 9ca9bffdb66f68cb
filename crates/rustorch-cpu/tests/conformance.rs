//! The CPU backend against the conformance suite. With the CPU as the target, the random-input
//! suite compares the CPU with itself (a fresh `CpuBackend` in a strict executor against the
//! reference executor's); the PyTorch and llama.cpp fixtures are the independent references.

use rustorch_cpu::CpuBackend;
use std::sync::Arc;

rustorch_conformance::backend_tests!(cpu, || Arc::new(CpuBackend::new()), rustorch_conformance::exact);
