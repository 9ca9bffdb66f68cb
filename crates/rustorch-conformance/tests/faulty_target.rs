//! `FaultyBackend` with no faults injected is a separate device computing with the CPU kernels:
//! it must pass the whole conformance suite, exactly (its tolerance is none). This proves the
//! suite really runs ops on a device other than the CPU, through uploads and downloads.

use rustorch_conformance::FaultyBackend;
use std::sync::Arc;

rustorch_conformance::backend_tests!(
    faulty_without_faults,
    || Arc::new(FaultyBackend::new()),
    rustorch_conformance::exact
);
