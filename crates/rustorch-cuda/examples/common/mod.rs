//! What the timing examples share: an executor on the first CUDA device in
//! strict mode (nothing falls back: a case the GPU declines fails), and
//! random tensors placed there.

use rustorch_core::{Backend, DType, Device, Executor, ExecutorConfig, Tensor};
use std::sync::Arc;

/// The first CUDA device, and a strict executor preferring it (the CPU
/// backend beside it only for host tensors).
pub fn strict_cuda_executor() -> Result<(Device, Arc<Executor>), Box<dyn std::error::Error>> {
    let backend = Arc::new(rustorch_cuda::CudaBackend::new(0)?);
    let device = Device::Cuda(0);
    let exec = Arc::new(Executor::from_backends(
        ExecutorConfig {
            strict: true,
            preferred_device: Some(device),
            min_offload_elems: 0,
            ..ExecutorConfig::default()
        },
        vec![backend as Arc<dyn Backend>, Arc::new(rustorch_cpu::CpuBackend::new())],
    ));
    Ok((device, exec))
}

/// Normal random values of `shape` (from `seed`) in `dtype`, on `device`.
pub fn random_on(
    exec: &Arc<Executor>,
    device: Device,
    shape: &[usize],
    dtype: DType,
    seed: u64,
) -> Result<Tensor, Box<dyn std::error::Error>> {
    Ok(Tensor::randn(shape.to_vec(), DType::F32, seed)?
        .to_dtype(dtype)?
        .with_executor(exec)?
        .to_device(device)?)
}
