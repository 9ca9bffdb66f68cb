//! `Target`: the backend under test, inside a strict, traced executor, with its tolerances.

use rustorch_core::backend::Backend;
use rustorch_core::{CpuStorage, DType, Device, Executor, ExecutorConfig, Shape, StorageElement, Tensor};
use rustorch_cpu::CpuBackend;
use std::sync::{Arc, Mutex};

/// Allowed difference `|got - want| <= atol + rtol * |want|`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Tol {
    pub atol: f64,
    pub rtol: f64,
}

impl Tol {
    /// Bit-for-bit agreement (NaN matches NaN).
    pub const EXACT: Tol = Tol { atol: 0.0, rtol: 0.0 };

    /// Both allowances together: a backend within `self` of the CPU, whose results are within
    /// `other` of a fixture, is within `self.plus(other)` of the fixture.
    pub fn plus(self, other: Tol) -> Tol {
        Tol {
            atol: self.atol + other.atol,
            rtol: self.rtol + other.rtol,
        }
    }

    pub fn scaled(self, k: f64) -> Tol {
        Tol {
            atol: self.atol * k,
            rtol: self.rtol * k,
        }
    }

    pub fn is_exact(self) -> bool {
        self == Tol::EXACT
    }

    /// Whether `got` is within the tolerance of `want` (NaN matches NaN, infinities themselves).
    pub fn accepts(self, got: f64, want: f64) -> bool {
        if want.is_nan() {
            got.is_nan()
        } else if want.is_infinite() || self.is_exact() {
            got == want
        } else {
            (got - want).abs() <= self.atol + self.rtol * want.abs()
        }
    }
}

/// How far a backend's results may be from the CPU backend's, per op and dtype.
///
/// `op` is `Op::name()` for the random-input suite (`"add"`, `"cast_to_f16"`, `"qmatmul_q4_0"`)
/// and the fixture case's name for the fixture suites (which start with the op's name, e.g.
/// `"add_f32_broadcast"`); `dtype` is the dtype compared. The fixture suites add this to the
/// fixture's own tolerance (the CPU's distance from PyTorch or llama.cpp), so the CPU's function is
/// [`exact`].
pub type TolFn = fn(op: &str, dtype: DType) -> Tol;

/// The CPU's tolerance against itself: none. Every CPU kernel, reductions included, gives
/// bit-identical results for equal inputs (same values, shape and layout), whatever the thread
/// count, the scheduling or the address of the data: sums, products, variances and their kin
/// group their operations along a tree that depends on the sizes only.
pub fn exact(_op: &str, _dtype: DType) -> Tol {
    Tol::EXACT
}

/// What a suite runs against: the backend under test, first in a strict executor (no fallback:
/// an op it cannot run is an error, never a silent move to the CPU) that prefers its device and
/// traces every op, with the CPU backend second only as the host the data comes from; and a
/// separate CPU-only executor as the reference for random inputs.
pub struct Target {
    pub name: String,
    pub device: Device,
    pub backend: Arc<dyn Backend>,
    pub exec: Arc<Executor>,
    /// A CPU-only executor, not strict: the reference results.
    pub cpu: Arc<Executor>,
    tol: TolFn,
    /// Summary lines the suites leave for the report (coverage of the random suite).
    notes: Mutex<Vec<String>>,
    fixture_checks: std::sync::atomic::AtomicUsize,
    /// Ops the backend's `supports` declined since `clear_declined`.
    declined: Arc<std::sync::atomic::AtomicUsize>,
}

impl Target {
    pub fn new(name: &str, backend: Arc<dyn Backend>, tol: TolFn) -> Target {
        let device = backend.device();
        let config = ExecutorConfig {
            strict: true,
            preferred_device: Some(device),
            trace: true,
            // Every op goes to the target, however small.
            min_offload_elems: 0,
            ..ExecutorConfig::default()
        };
        let declined = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let watched = Arc::new(crate::watch::Watched {
            inner: backend.clone(),
            declined: declined.clone(),
        });
        let exec = Arc::new(Executor::from_backends(
            config,
            vec![watched, Arc::new(CpuBackend::new())],
        ));
        assert_eq!(
            exec.devices().first(),
            Some(&device),
            "{name}: the target's device must lead the executor's chain"
        );
        let cpu = Arc::new(Executor::from_backends(
            ExecutorConfig {
                min_offload_elems: 0,
                ..ExecutorConfig::default()
            },
            vec![Arc::new(CpuBackend::new()) as Arc<dyn Backend>],
        ));
        Target {
            name: name.to_string(),
            device,
            backend,
            exec,
            cpu,
            tol,
            notes: Mutex::new(Vec::new()),
            declined,
            fixture_checks: std::sync::atomic::AtomicUsize::new(0),
        }
    }

    /// The backend's tolerance for `op` on `dtype` (see [`TolFn`]).
    pub fn tol(&self, op: &str, dtype: DType) -> Tol {
        (self.tol)(op, dtype)
    }

    /// Host data as a tensor on the target's device, under the target's executor.
    pub fn tensor(&self, storage: CpuStorage, shape: impl Into<Shape>) -> Tensor {
        let t = Tensor::from_storage_in(&self.exec, storage, shape).expect("a tensor of the data's size");
        t.to_device(self.device).expect("upload to the target")
    }

    pub fn from_vec<T: StorageElement>(&self, data: Vec<T>, shape: impl Into<Shape>) -> rustorch_core::Result<Tensor> {
        let shape = shape.into();
        Tensor::from_storage_in(&self.exec, CpuStorage::from_vec(data), shape)?.to_device(self.device)
    }

    pub fn from_slice<T: StorageElement>(&self, data: &[T], shape: impl Into<Shape>) -> rustorch_core::Result<Tensor> {
        self.from_vec(data.to_vec(), shape)
    }

    /// A tensor made elsewhere (a host-side constructor: `Tensor::zeros`, `arange`, ...) moved to
    /// the target and bound to its executor, so that the ops on it run there.
    pub fn adopt(&self, t: rustorch_core::Result<Tensor>) -> rustorch_core::Result<Tensor> {
        let t = t?;
        let host = Tensor::from_storage_in(&self.exec, t.to_cpu_storage()?, t.shape().clone())?;
        host.to_device(self.device)
    }

    pub fn zeros(&self, shape: impl Into<Shape>, dtype: DType) -> rustorch_core::Result<Tensor> {
        self.adopt(Tensor::zeros(shape, dtype))
    }

    pub fn full(
        &self,
        shape: impl Into<Shape>,
        value: impl Into<rustorch_core::Scalar>,
        dtype: DType,
    ) -> rustorch_core::Result<Tensor> {
        self.adopt(Tensor::full(shape, value, dtype))
    }

    pub fn ones(&self, shape: impl Into<Shape>, dtype: DType) -> rustorch_core::Result<Tensor> {
        self.adopt(Tensor::ones(shape, dtype))
    }

    pub fn randn(&self, shape: impl Into<Shape>, dtype: DType, seed: u64) -> rustorch_core::Result<Tensor> {
        self.adopt(Tensor::randn(shape, dtype, seed))
    }

    pub fn rand(&self, shape: impl Into<Shape>, dtype: DType, seed: u64) -> rustorch_core::Result<Tensor> {
        self.adopt(Tensor::rand(shape, dtype, seed))
    }

    pub fn arange(&self, start: f64, end: f64, step: f64, dtype: DType) -> rustorch_core::Result<Tensor> {
        self.adopt(Tensor::arange(start, end, step, dtype))
    }

    /// A GGML-typed weight (raw blocks) on the target, under its executor.
    pub fn qweight(
        &self,
        qtype: rustorch_core::quant::QType,
        rows: usize,
        cols: usize,
        bytes: Vec<u8>,
    ) -> rustorch_core::Result<rustorch_core::QWeight> {
        rustorch_core::QWeight::from_bytes_in(&self.exec, qtype, rows, cols, bytes)?.to_device(self.device)
    }

    pub fn scalar<T: StorageElement>(&self, value: T) -> Tensor {
        self.tensor(CpuStorage::from_vec(vec![value]), Shape::scalar())
    }

    /// Asserts that every op since the last check ran on the target with no fallback, and that
    /// `result` (when given) lives there, then clears the trace. Strict mode already forbids
    /// falling back; this proves the ops were not quietly run elsewhere (an executor bug, or a
    /// tensor of another executor in the expression).
    pub fn check_ran_here(&self, what: &str, result: Option<&Tensor>) {
        let events = self.exec.trace();
        self.exec.clear_trace();
        // Transfers are not ops: reading a result back to the host is one.
        for e in events.iter().filter(|e| e.op != "to_device") {
            assert!(
                e.device == self.device && e.fallbacks.is_empty(),
                "{what}: {} ran on {} (reason: {}, fallbacks: {:?}), not on the target {}",
                e.op,
                e.device,
                e.reason,
                e.fallbacks,
                self.device
            );
        }
        if let Some(t) = result {
            assert!(
                Arc::ptr_eq(t.executor(), &self.exec),
                "{what}: the result belongs to another executor: its ops did not run on the target"
            );
            assert_eq!(
                t.device(),
                self.device,
                "{what}: the result does not live on the target"
            );
        }
    }

    /// Counts one comparison with a fixture (PyTorch's or llama.cpp's), for the report.
    pub fn count_fixture_check(&self) {
        self.fixture_checks.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// Fixture comparisons made so far.
    pub fn fixture_checks(&self) -> usize {
        self.fixture_checks.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Leaves a line for the end of the test's output (coverage summaries).
    /// How many times the backend declined an op since the last `clear_declined`.
    pub fn declined(&self) -> usize {
        self.declined.load(std::sync::atomic::Ordering::SeqCst)
    }
    pub fn clear_declined(&self) {
        self.declined.store(0, std::sync::atomic::Ordering::SeqCst);
    }

    pub fn note(&self, line: String) {
        self.notes.lock().unwrap_or_else(|e| e.into_inner()).push(line);
    }

    pub fn notes(&self) -> Vec<String> {
        self.notes.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}
