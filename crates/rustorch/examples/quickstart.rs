//! A first tour: create tensors, run ops through the hybrid executor, and
//! print where each op ran.
//!
//!     cargo run --release --example quickstart

use rustorch::op::{AttnMask, RopeLayout};
use rustorch::{DType, Executor, ExecutorConfig, Tensor};
use std::sync::Arc;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // An executor with tracing on; every backend compiled in and present
    // is registered ahead of the CPU (this build: the CPU only).
    let config = ExecutorConfig {
        trace: true,
        ..ExecutorConfig::from_env()?
    };
    let exec = Arc::new(Executor::with_backends(config, Vec::new())?);
    println!("devices, best first: {:?}\n", exec.devices());

    // A tiny attention block: project, rotate, attend, normalize.
    let (t, d, heads) = (6usize, 32usize, 4usize);
    let hd = d / heads;
    let x = Tensor::randn([1, t, d], DType::F32, 42)?.with_executor(&exec)?;
    let wq = Tensor::randn([d, d], DType::F32, 1)?
        .with_executor(&exec)?
        .mul_scalar(0.2)?;
    let norm_w = Tensor::ones([d], DType::F32)?.with_executor(&exec)?;

    let h = x.rms_norm(Some(&norm_w), 1e-5)?;
    let q = h.matmul(&wq)?.reshape([1, t, heads, hd])?.transpose(1, 2)?; // [1, H, T, hd]
    let (cos, sin) = Tensor::rope_cos_sin_seq(t, hd, 10000.0, DType::F32)?;
    let (cos, sin) = (cos.with_executor(&exec)?, sin.with_executor(&exec)?);
    let q = q.rope(&cos, &sin, RopeLayout::NeoX)?;
    let att = Tensor::scaled_dot_product_attention(&q, &q, &q, AttnMask::Causal, None, None)?;
    let out = att.transpose(1, 2)?.reshape([1, t, d])?.add(&x)?;

    let probs = out.softmax(-1)?;
    let (top, idx) = probs.topk(3, -1, true)?;
    println!(
        "output shape {:?}, row sums {:?}",
        out.dims(),
        probs.sum(&[-1], false)?.to_vec::<f32>()?
    );
    println!("top-3 feature per position: {:?}", idx.to_vec::<i64>()?);
    println!("their probabilities: {:?}\n", top.to_vec::<f32>()?);

    println!("where every op ran:\n{}", exec.trace_table());
    Ok(())
}
