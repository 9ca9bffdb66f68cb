//! Times single ops on the first CUDA device through the executor (strict:
//! nothing falls back), for bench/device_cuda.sh, which runs PyTorch's
//! versions in the same run and prints the ratios. One line per case:
//! `name milliseconds`, the median of `REPS` timed runs after warm-up, each
//! ended by a synchronization.
//!
//! cargo run --release -p rustorch-cuda --example cuda_bench [REPS]

#[path = "common/mod.rs"]
mod common;

use rustorch_core::quant::{self, QType};
use rustorch_core::{DType, QWeight, Tensor};
use std::time::Instant;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let reps: usize = std::env::args().nth(1).and_then(|s| s.parse().ok()).unwrap_or(20);
    let (device, exec) = common::strict_cuda_executor()?;
    let on_gpu = |shape: &[usize], dtype: DType, seed: u64| common::random_on(&exec, device, shape, dtype, seed);
    // Prints `name ms` and returns the ms.
    let time =
        |name: &str, f: &dyn Fn() -> Result<Tensor, rustorch_core::Error>| -> Result<f64, Box<dyn std::error::Error>> {
            for _ in 0..3 {
                f()?;
            }
            exec.synchronize()?;
            let mut ms = Vec::with_capacity(reps);
            for _ in 0..reps {
                let t = Instant::now();
                let out = f()?;
                exec.synchronize()?;
                ms.push(t.elapsed().as_secs_f64() * 1e3);
                drop(out);
            }
            ms.sort_by(|a, b| a.total_cmp(b));
            let median = ms[ms.len() / 2];
            println!("{name} {median:.4}");
            Ok(median)
        };
    let n = 4096;
    for dtype in [DType::F32, DType::BF16] {
        let a = on_gpu(&[n, n], dtype, 1)?;
        let b = on_gpu(&[n, n], dtype, 2)?;
        time(&format!("matmul_4096_{dtype}"), &|| a.matmul(&b))?;
    }
    let big = 64 << 20;
    let x = on_gpu(&[big], DType::F32, 3)?;
    let y = on_gpu(&[big], DType::F32, 4)?;
    time("add_64M_f32", &|| x.add(&y))?;
    time("mul_64M_f32", &|| x.mul(&y))?;
    time("sum_64M_f32", &|| x.sum_all())?;
    let rows = x.reshape([big / 4096, 4096])?;
    time("softmax_64M_f32", &|| rows.softmax(-1))?;
    time("rms_norm_64M_f32", &|| rows.rms_norm(None, 1e-6))?;
    // Quantized products of a 4096 x 4096 weight: one to 64 activation
    // rows (the MMVQ kernels, bound by reading the blocks; 64 rows in eight
    // passes) and a 512-row prompt (dequantized tiles and cuBLAS). For one
    // and eight rows also the weight bytes read per second
    // (`..._gbps`, GB/s; the time includes the activation quantization and
    // the executor's dispatch, which dominate for a 9.4 MB weight).
    // RusTorch only: PyTorch has no GGML types.
    let gbps = |bytes: usize, ms: f64| bytes as f64 / (ms * 1e-3) / 1e9;
    let wv = Tensor::randn(vec![n * n], DType::F32, 5)?.to_vec::<f32>()?;
    for qtype in [QType::Q4_0, QType::Q8_0, QType::Q4K, QType::Q6K] {
        let bytes = quant::quantize(qtype, &wv)?;
        let wbytes = bytes.len();
        let w = QWeight::from_bytes_in(&exec, qtype, n, n, bytes)?.to_device(device)?;
        for m in [1, 8, 64, 512] {
            let x = on_gpu(&[m, n], DType::F32, 6)?;
            let name = format!("qmatmul_{}_4096_m{m}", qtype.name().to_lowercase());
            let ms = time(&name, &|| x.qmatmul(&w))?;
            if m <= 8 {
                println!("{name}_gbps {:.1}", gbps(wbytes, ms));
            }
        }
    }
    // A weight larger than the L2 cache (32768 x 4096: 75 MB in Q4_0),
    // one activation row: the MMVQ kernels' DRAM bandwidth.
    let rows = 32768;
    let wv = Tensor::randn(vec![rows * n], DType::F32, 7)?.to_vec::<f32>()?;
    for qtype in [QType::Q4_0, QType::Q8_0, QType::Q4K] {
        let bytes = quant::quantize(qtype, &wv)?;
        let wbytes = bytes.len();
        let w = QWeight::from_bytes_in(&exec, qtype, rows, n, bytes)?.to_device(device)?;
        let x = on_gpu(&[1, n], DType::F32, 8)?;
        let name = format!("qmatmul_{}_32768x4096_m1", qtype.name().to_lowercase());
        let ms = time(&name, &|| x.qmatmul(&w))?;
        println!("{name}_gbps {:.1}", gbps(wbytes, ms));
    }
    Ok(())
}
