//! The loop both `op_cost` examples time: an add of 576 floats (a SmolLM2
//! decode step's residual add), `ITERATIONS` times (first argument).
use rustorch_core::{DType, Tensor};
use std::time::Instant;

pub fn run() -> rustorch_core::Result<()> {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(2_000_000);
    let a = Tensor::randn([1, 576], DType::F32, 6)?;
    let b = Tensor::randn([1, 576], DType::F32, 7)?;
    let _ = a.add(&b)?;
    let start = Instant::now();
    for _ in 0..n {
        std::hint::black_box(a.add(&b)?);
    }
    println!(
        "add_1x576: {:.3} us per op",
        start.elapsed().as_secs_f64() * 1e6 / n as f64
    );
    Ok(())
}
