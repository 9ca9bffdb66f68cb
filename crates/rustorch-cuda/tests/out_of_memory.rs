//! Out of memory on the GPU itself: a backend capped at 1 MiB
//! (`CudaBackend::with_memory_limit`, what `RUSTORCH_CUDA_MEM_LIMIT` sets)
//! ahead of the CPU. Ops that fit run on the GPU; an upload or an output
//! past the cap fails as the driver's out-of-memory does, the executor runs
//! the op on the CPU with the attempt in the trace, and the results equal
//! the CPU's. Without a GPU (CI) the test passes after one line saying why.

use rustorch_core::{Backend, CpuStorage, Device, Executor, ExecutorConfig, Tensor};
use std::sync::Arc;

const CAP: usize = 1 << 20;

fn capped_gpu() -> Option<Arc<dyn Backend>> {
    if !rustorch_cuda::driver_present() || rustorch_cuda::CudaBackend::device_count().unwrap_or(0) == 0 {
        eprintln!("out_of_memory: skipped: no CUDA device here");
        return None;
    }
    Some(Arc::new(
        rustorch_cuda::CudaBackend::with_memory_limit(0, Some(CAP)).expect("CUDA backend"),
    ))
}

fn tensor(exec: &Arc<Executor>, n: usize, seed: f32) -> Tensor {
    let v: Vec<f32> = (0..n).map(|i| ((i as f32) * 0.37 + seed).sin()).collect();
    Tensor::from_storage_in(exec, CpuStorage::from_vec(v), [n]).expect("tensor")
}

#[test]
fn ops_past_the_memory_cap_fall_back_to_the_cpu_with_equal_results() {
    let Some(gpu) = capped_gpu() else { return };
    let exec = Arc::new(Executor::from_backends(
        ExecutorConfig {
            trace: true,
            min_offload_elems: 0,
            ..ExecutorConfig::default()
        },
        vec![gpu, Arc::new(rustorch_cpu::CpuBackend::new())],
    ));
    let cpu = Arc::new(Executor::from_backends(
        ExecutorConfig::default(),
        vec![Arc::new(rustorch_cpu::CpuBackend::new())],
    ));

    // Fits: 64 KiB operands and result, on the GPU.
    let small = tensor(&exec, 16 << 10, 0.1);
    let y = small.mul(&small).unwrap();
    assert_eq!(y.device(), Device::Cuda(0));
    let expect = {
        let s = tensor(&cpu, 16 << 10, 0.1);
        s.mul(&s).unwrap().to_vec::<f32>().unwrap()
    };
    assert_eq!(y.to_vec::<f32>().unwrap(), expect);

    // The upload of a 2 MiB operand does not fit: the op runs on the CPU.
    let big = tensor(&exec, 512 << 10, 0.2);
    let z = big.add(&big).unwrap();
    assert_eq!(z.device(), Device::Cpu);
    let ev = exec.trace().pop().expect("a trace event");
    assert_eq!(ev.device, Device::Cpu);
    assert!(
        ev.fallbacks
            .iter()
            .any(|(d, why)| *d == Device::Cuda(0) && why.contains("out of memory")),
        "{:?}",
        ev.fallbacks
    );
    let expect = {
        let b = tensor(&cpu, 512 << 10, 0.2);
        b.add(&b).unwrap().to_vec::<f32>().unwrap()
    };
    assert_eq!(z.to_vec::<f32>().unwrap(), expect);

    // Inputs already on the GPU, an output past the cap: 512 x 1 times
    // 1 x 1024 is 2 MiB of f32.
    let a = Tensor::from_storage_in(
        &exec,
        CpuStorage::from_vec((0..512).map(|i| i as f32 * 0.01).collect::<Vec<f32>>()),
        [512, 1],
    )
    .unwrap()
    .to_device(Device::Cuda(0))
    .unwrap();
    let b = Tensor::from_storage_in(
        &exec,
        CpuStorage::from_vec((0..1024).map(|i| 1.0 - i as f32 * 0.001).collect::<Vec<f32>>()),
        [1, 1024],
    )
    .unwrap()
    .to_device(Device::Cuda(0))
    .unwrap();
    let c = a.matmul(&b).unwrap();
    assert_eq!(c.device(), Device::Cpu);
    let ev = exec.trace().pop().expect("a trace event");
    assert!(
        ev.fallbacks.iter().any(|(_, why)| why.contains("out of memory")),
        "{:?}",
        ev.fallbacks
    );
    let expect = {
        let a = Tensor::from_storage_in(
            &cpu,
            CpuStorage::from_vec((0..512).map(|i| i as f32 * 0.01).collect::<Vec<f32>>()),
            [512, 1],
        )
        .unwrap();
        let b = Tensor::from_storage_in(
            &cpu,
            CpuStorage::from_vec((0..1024).map(|i| 1.0 - i as f32 * 0.001).collect::<Vec<f32>>()),
            [1, 1024],
        )
        .unwrap();
        a.matmul(&b).unwrap().to_vec::<f32>().unwrap()
    };
    assert_eq!(c.to_vec::<f32>().unwrap(), expect);

    // The GPU still works after the failures, and holds what it should.
    let w = small.add(&small).unwrap();
    assert_eq!(w.device(), Device::Cuda(0));
}
