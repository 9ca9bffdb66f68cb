//! The host's time to issue one op of each kind on the first CUDA device
//! through the executor (strict), with shapes so small that the GPU's work
//! is negligible: what a prompt pass pays per op when it is bound by the
//! host (executor dispatch, allocation, launches, cuBLAS calls). One line
//! per case: `name us_per_op` (issue only, before the synchronization).
//!
//! cargo run --release -p rustorch-cuda --example host_costs [N]

#[path = "common/mod.rs"]
mod common;

use rustorch_core::op::GateActivation;
use rustorch_core::quant::{self, QType};
use rustorch_core::{DType, QWeight, Tensor};
use std::time::Instant;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let n: usize = std::env::args().nth(1).and_then(|s| s.parse().ok()).unwrap_or(2000);
    let (device, exec) = common::strict_cuda_executor()?;
    let on_gpu = |shape: &[usize], dtype: DType, seed: u64| common::random_on(&exec, device, shape, dtype, seed);
    let time =
        |name: &str, f: &dyn Fn() -> Result<(), rustorch_core::Error>| -> Result<(), Box<dyn std::error::Error>> {
            for _ in 0..50 {
                f()?;
            }
            exec.synchronize()?;
            let t = Instant::now();
            for _ in 0..n {
                f()?;
            }
            let issue = t.elapsed();
            exec.synchronize()?;
            println!("{name} {:.2}", issue.as_secs_f64() * 1e6 / n as f64);
            Ok(())
        };
    let (k, rows) = (256, 256);
    let x = on_gpu(&[16], DType::F32, 1)?;
    let y = on_gpu(&[16], DType::F32, 2)?;
    time("add_16", &|| x.add(&y).map(drop))?;
    let xm = on_gpu(&[65, k], DType::F32, 3)?;
    time("rms_norm_65x256", &|| xm.rms_norm(None, 1e-6).map(drop))?;
    let a16 = on_gpu(&[65, k], DType::F16, 4)?;
    let b16 = on_gpu(&[k, rows], DType::F16, 5)?;
    time("matmul_f16_65x256x256", &|| a16.matmul(&b16).map(drop))?;
    let wv = Tensor::randn(vec![rows * k], DType::F32, 6)?.to_vec::<f32>()?;
    let weight = |q: QType| -> Result<QWeight, Box<dyn std::error::Error>> {
        Ok(QWeight::from_bytes_in(&exec, q, rows, k, quant::quantize(q, &wv)?)?.to_device(device)?)
    };
    for q in [QType::Q4K, QType::Q8_0, QType::F16] {
        let w = weight(q)?;
        let name = q.name().to_lowercase();
        time(&format!("qmatmul_{name}_m65"), &|| xm.qmatmul(&w).map(drop))?;
        time(&format!("qmatmul_many3_{name}_m65"), &|| {
            xm.qmatmul_many(&[&w, &w, &w]).map(drop)
        })?;
        time(&format!("qmatmul_gated_{name}_m65"), &|| {
            xm.qmatmul_gated(&w, &w, GateActivation::SwiGlu).map(drop)
        })?;
        let x1 = on_gpu(&[1, k], DType::F32, 7)?;
        time(&format!("qmatmul_{name}_m1"), &|| x1.qmatmul(&w).map(drop))?;
    }
    let host = Tensor::randn(vec![512, 512], DType::F32, 8)?.with_executor(&exec)?;
    time("upload_1MiB", &|| host.to_device(device).map(drop))?;
    // A recorded decode step's host work besides the replay (models'
    // recorded.rs): the token's embedding row and its position written into
    // device tensors, the logits read back and wrapped as a host tensor.
    let row = Tensor::randn(vec![1, 2048], DType::F32, 9)?.with_executor(&exec)?;
    let x_in = std::cell::RefCell::new(on_gpu(&[1, 2048], DType::F32, 10)?);
    time("step_write_row_2048", &|| x_in.borrow_mut().write_slice(0, 0, &row))?;
    let p = Tensor::from_vec(vec![7i64], [1])?.with_executor(&exec)?;
    let pos = std::cell::RefCell::new(Tensor::zeros_in(&exec, [1], DType::I64, device)?);
    time("step_write_pos", &|| pos.borrow_mut().write_slice(0, 0, &p))?;
    let logits = on_gpu(&[1, 32000], DType::F32, 11)?;
    time("step_read_logits_32000", &|| logits.to_vec::<f32>().map(drop))?;
    let values = logits.to_vec::<f32>()?;
    time("step_host_logits_tensor", &|| {
        Tensor::from_vec(values.clone(), [1, 32000])?
            .with_executor(&exec)
            .map(drop)
    })?;
    Ok(())
}
