//! The MMQ products (ops/mmq.rs: more than 8 activation rows, the int8
//! tensor cores in llama.cpp CUDA's arithmetic) against the exact product
//! of the activations and the dequantized weights (f64), and against the
//! CPU backend, for every type with a kernel, over shapes with partial
//! tiles (rows, activation rows) and a partial last stage of 128 values.
//! Both sides quantize the activations to 8 bits (the GPU to q8_1 blocks
//! of 32, the CPU to the weight type's dot type), so each is a quantization
//! error away from the exact product: on an H200, at most 0.73 for results
//! up to 120 (0.7%; the DM types, whose f16-rounded scales and block sums
//! add to it) from the exact product, at most 0.90 (1.0%) from the CPU.
//! The bounds, 1.5% and 2% of the largest result, leave room for that; a
//! wrong nibble, scale or tile is off by about the size of the results.
//! Without a GPU (CI) the test passes after one line saying why.

use rustorch_core::quant::{self, QType};
use rustorch_core::{Backend, CpuStorage, Device, Executor, ExecutorConfig, QWeight, Tensor};
use std::sync::Arc;

fn gpu() -> Option<rustorch_cuda::CudaBackend> {
    if !rustorch_cuda::driver_present() || rustorch_cuda::CudaBackend::device_count().unwrap_or(0) == 0 {
        eprintln!("mmq: skipped: no CUDA device here");
        return None;
    }
    let b = rustorch_cuda::CudaBackend::new(0).expect("CUDA backend");
    b.set_mmq_products(true);
    Some(b)
}

fn executor(b: Arc<dyn Backend>, strict: bool) -> Arc<Executor> {
    Arc::new(Executor::from_backends(
        ExecutorConfig {
            min_offload_elems: 0,
            strict,
            trace: true,
            ..ExecutorConfig::default()
        },
        vec![b],
    ))
}

/// Values in [-scale, scale) from a fixed LCG.
fn values(n: usize, seed: u64, scale: f32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
        })
        .collect()
}

fn product(exec: &Arc<Executor>, q: QType, bytes: &[u8], x: &[f32], m: usize, n: usize, k: usize) -> Vec<f32> {
    let w = QWeight::from_bytes_in(exec, q, n, k, bytes.to_vec()).unwrap();
    let xt = Tensor::from_storage_in(exec, CpuStorage::F32(x.to_vec()), [m, k]).unwrap();
    xt.qmatmul(&w).unwrap().to_vec::<f32>().unwrap()
}

#[test]
fn mmq_products_are_a_quantization_error_from_the_exact_product() {
    let Some(on) = gpu() else { return };
    let gpu_exec = executor(Arc::new(on), true);
    let cpu_exec = executor(Arc::new(rustorch_cpu::CpuBackend::new()), false);
    let types = [
        QType::Q4_0,
        QType::Q4_1,
        QType::Q5_0,
        QType::Q5_1,
        QType::Q8_0,
        QType::Q4K,
        QType::Q5K,
        QType::Q6K,
    ];
    let mut failures = Vec::new();
    for q in types {
        // k: whole stages, and for the 32-value types a last stage of 64.
        let ks: &[usize] = if q.block_size() == 256 {
            &[512, 768]
        } else {
            &[512, 576]
        };
        for &k in ks {
            for (m, n) in [(9, 300), (100, 129), (130, 256)] {
                let seed = (m * 1000 + n + k) as u64;
                let wv = values(n * k, seed, 1.0);
                let x = values(m * k, seed + 7, 3.0);
                let bytes = quant::quantize(q, &wv).unwrap();
                let deq = quant::dequantize(q, &bytes, n * k).unwrap();
                let got = product(&gpu_exec, q, &bytes, &x, m, n, k);
                let trace = gpu_exec.trace();
                gpu_exec.clear_trace();
                let event = trace
                    .iter()
                    .rev()
                    .find(|e| e.op.starts_with("qmatmul"))
                    .expect("the product's event");
                assert_eq!(event.device, Device::Cuda(0), "{q} ran on {:?}", event.device);
                let cpu = product(&cpu_exec, q, &bytes, &x, m, n, k);
                let (mut worst_exact, mut worst_cpu, mut largest) = (0.0f64, 0.0f64, 0.0f64);
                for r in 0..m {
                    for c in 0..n {
                        let exact: f64 = (0..k).map(|i| x[r * k + i] as f64 * deq[c * k + i] as f64).sum();
                        let g = got[r * n + c] as f64;
                        worst_exact = worst_exact.max((g - exact).abs());
                        worst_cpu = worst_cpu.max((g - cpu[r * n + c] as f64).abs());
                        largest = largest.max(exact.abs());
                    }
                }
                eprintln!(
                    "mmq {q} m={m} n={n} k={k}: |gpu - exact| <= {worst_exact:.3e}, |gpu - cpu| <= {worst_cpu:.3e}, |exact| <= {largest:.1}"
                );
                if !(worst_exact <= 0.015 * largest && worst_cpu <= 0.02 * largest) {
                    failures.push(format!(
                        "{q} m={m} n={n} k={k}: {worst_exact} from exact, {worst_cpu} from the CPU"
                    ));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}
