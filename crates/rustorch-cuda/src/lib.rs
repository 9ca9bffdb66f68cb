//! RusTorch's CUDA backend.
//!
//! One `CudaBackend` per GPU, registered through the backend registry when
//! the crate is linked (the facade's `cuda` feature). The driver, NVRTC and
//! cuBLAS are loaded at run time (cudarc's dynamic loading): a program built
//! with this crate runs where there is no GPU, and the provider reports why
//! there is no CUDA device instead of failing.
//!
//! Kernels are CUDA C sources in `kernels/`, compiled by NVRTC for the
//! device's architecture on first use and cached on disk (`compile`); dense
//! products go to cuBLAS. Work is queued on one stream per device: only
//! downloads, `synchronize`, the tracing timer, the indexing ops (which
//! read back a flag for out-of-range indices), `attention_at` and
//! `write_into_at` (a flag for positions outside the cache) and integer
//! division and powers (a flag for zero divisors and negative exponents)
//! wait for it, and a fault
//! in queued work surfaces as `BackendError::DeviceLost` from whichever call
//! finds it. A pass of ops can be recorded once as a CUDA graph and replayed
//! (`capture`). Ops it cannot run yet it declines in `supports`, and the
//! executor runs them elsewhere (the trace shows where).

mod backend;
mod buffer;
mod capture;
pub mod compile;
mod error;
mod launch;
mod ops;
pub mod transfer;

pub use backend::CudaBackend;
pub use buffer::CudaBuffer;

use rustorch_core::backend::Backend;
use rustorch_core::registry::{BackendProvider, BACKEND_PROVIDERS};
use std::sync::Arc;

/// The kernel sources, by module name, with the shared header
/// (`kernels/common.cuh`) each includes.
pub const KERNEL_SOURCES: &[(&str, &str)] = &[
    ("elementwise", include_str!("../kernels/elementwise.cu")),
    ("cast", include_str!("../kernels/cast.cu")),
    ("reduce", include_str!("../kernels/reduce.cu")),
    ("index", include_str!("../kernels/index.cu")),
    ("rope", include_str!("../kernels/rope.cu")),
    ("attention", include_str!("../kernels/attention.cu")),
    ("sort", include_str!("../kernels/sort.cu")),
    ("conv", include_str!("../kernels/conv.cu")),
    ("quant", include_str!("../kernels/quant.cu")),
];
pub(crate) const COMMON_HEADER: &str = include_str!("../kernels/common.cuh");
/// Rows held in registers (the RMS norm's code), for reduce.cu and quant.cu.
pub(crate) const ROWS_HEADER: &str = include_str!("../kernels/rows.cuh");
/// The fused norm + products kernels, included by kernels/quant.cu.
pub(crate) const NORM_PRODUCTS_HEADER: &str = include_str!("../kernels/norm_products.cuh");
/// The MMQ products (llama.cpp CUDA's arithmetic, ops/mmq.rs), included by
/// kernels/quant.cu.
pub(crate) const MMQ_HEADER: &str = include_str!("../kernels/mmq.cuh");

/// Whether the CUDA driver library can be loaded here.
pub fn driver_present() -> bool {
    // SAFETY: only tries to open the library; no CUDA call is made.
    unsafe { cudarc::driver::sys::is_culib_present() }
}

/// Registers the CUDA devices (`rustorch_core::registry`).
struct CudaProvider;

impl BackendProvider for CudaProvider {
    fn name(&self) -> &'static str {
        "cuda"
    }
    fn priority(&self) -> i32 {
        100
    }
    fn devices(&self) -> Result<Vec<Arc<dyn Backend>>, String> {
        if !driver_present() {
            return Err("no CUDA driver (libcuda.so.1 not found): no NVIDIA GPU here".into());
        }
        let count = CudaBackend::device_count().map_err(|e| format!("the CUDA driver failed to start: {e}"))?;
        if count == 0 {
            return Err("the CUDA driver finds no device".into());
        }
        let mut out: Vec<Arc<dyn Backend>> = Vec::new();
        let mut errors = Vec::new();
        for i in 0..count {
            match CudaBackend::new(i) {
                Ok(b) => out.push(Arc::new(b)),
                Err(e) => errors.push(format!("cuda:{i}: {e}")),
            }
        }
        if out.is_empty() {
            return Err(errors.join("; "));
        }
        Ok(out)
    }
}

#[linkme::distributed_slice(BACKEND_PROVIDERS)]
static CUDA_PROVIDER: &'static dyn BackendProvider = &CudaProvider;
