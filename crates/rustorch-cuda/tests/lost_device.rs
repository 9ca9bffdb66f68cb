//! A real device fault on the GPU (a kernel writing outside every
//! allocation, `CudaBackend::provoke_fault_for_tests`): the next call that
//! waits for the GPU reports `DeviceLost`, the executor marks the device
//! lost for good, and from then on every op runs on the CPU with results
//! equal to a CPU-only run; nothing hangs. Its own test binary, since the
//! fault spoils the CUDA context for the whole process. Without a GPU (CI)
//! the test passes after one line saying why.

use rustorch_core::{Backend, BackendError, CpuStorage, Device, Error, Executor, ExecutorConfig, Tensor};
use std::sync::Arc;

#[test]
fn a_kernel_fault_loses_the_device_and_work_goes_on_on_the_cpu() {
    if !rustorch_cuda::driver_present() || rustorch_cuda::CudaBackend::device_count().unwrap_or(0) == 0 {
        eprintln!("lost_device: skipped: no CUDA device here");
        return;
    }
    let gpu = Arc::new(rustorch_cuda::CudaBackend::new(0).expect("CUDA backend"));
    let exec = Arc::new(Executor::from_backends(
        ExecutorConfig {
            trace: true,
            min_offload_elems: 0,
            ..ExecutorConfig::default()
        },
        vec![
            gpu.clone() as Arc<dyn Backend>,
            Arc::new(rustorch_cpu::CpuBackend::new()),
        ],
    ));
    let cpu = Arc::new(Executor::from_backends(
        ExecutorConfig::default(),
        vec![Arc::new(rustorch_cpu::CpuBackend::new())],
    ));
    let data: Vec<f32> = (0..4096).map(|i| (i as f32 * 0.01).cos()).collect();
    let x = Tensor::from_storage_in(&exec, CpuStorage::from_vec(data.clone()), [64, 64]).unwrap();
    let y = x.mul(&x).unwrap();
    assert_eq!(y.device(), Device::Cuda(0));

    gpu.provoke_fault_for_tests().expect("the launch itself is accepted");
    match exec.synchronize() {
        Err(Error::Backend {
            device: Device::Cuda(0),
            source: BackendError::DeviceLost { .. },
            ..
        }) => {}
        other => panic!("expected DeviceLost from the GPU, got {other:?}"),
    }
    let why = exec.lost_reason(Device::Cuda(0)).expect("the GPU is marked lost");
    assert!(why.contains("lost") || why.contains("ILLEGAL"), "{why}");

    // Data that lived on the lost GPU is gone: reading it is an error, not
    // a hang or garbage.
    assert!(y.to_vec::<f32>().is_err());

    // New work runs on the CPU and equals a CPU-only run.
    let x = Tensor::from_storage_in(&exec, CpuStorage::from_vec(data.clone()), [64, 64]).unwrap();
    let z = x.matmul(&x).unwrap().softmax(-1).unwrap();
    assert_eq!(z.device(), Device::Cpu);
    let expect = {
        let x = Tensor::from_storage_in(&cpu, CpuStorage::from_vec(data), [64, 64]).unwrap();
        x.matmul(&x).unwrap().softmax(-1).unwrap().to_vec::<f32>().unwrap()
    };
    assert_eq!(z.to_vec::<f32>().unwrap(), expect);
    let report = exec
        .device_reports()
        .into_iter()
        .find(|r| r.device == Device::Cuda(0))
        .expect("a report for the GPU");
    assert!(report.disabled.is_some_and(|why| why.starts_with("lost: ")));
}
