//! Decode attention as a model's forward pass meets it: one new position
//! against each of `LAYERS` separate f16 caches in turn, with enough other
//! memory read between two layers (`EVICT_BYTES`, a layer's weights) that
//! each layer's cache comes back from the L3 or DRAM, as it does in token
//! generation. SmolLM2-135M's heads (9 query, 3 key/value, 64 dims).
//!
//!     cargo run --release -p rustorch-cpu --example attn_decode_timing [live]
//!
//! Prints the mean time per attention call (the eviction reads excluded).
//! `RAYON_NUM_THREADS` sets the thread count.

// Ops run on the CPU backend, which registers itself once linked.
use rustorch_core::{DType, Tensor};
use rustorch_cpu as _;
use std::hint::black_box;
use std::time::{Duration, Instant};

const LAYERS: usize = 30;
const EVICT_BYTES: usize = 3 << 20;
const ALLOC: usize = 256;

fn main() {
    let live: usize = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(100);
    let (hq, hkv, d) = (9usize, 3usize, 64usize);
    let l = live.div_ceil(64) * 64;
    let caches: Vec<(Tensor, Tensor)> = (0..LAYERS as u64)
        .map(|s| {
            let k = Tensor::randn([hkv, ALLOC, d], DType::F32, 2 * s)
                .unwrap()
                .to_dtype(DType::F16)
                .unwrap();
            let vt = Tensor::randn([hkv, d, ALLOC], DType::F32, 2 * s + 1)
                .unwrap()
                .to_dtype(DType::F16)
                .unwrap();
            (k.narrow(1, 0, l).unwrap(), vt.narrow(2, 0, l).unwrap())
        })
        .collect();
    let q = Tensor::randn([hq, 1, d], DType::F32, 99).unwrap();
    let m: Vec<f32> = (0..l).map(|j| if j < live { 0.0 } else { f32::NEG_INFINITY }).collect();
    let mask = Tensor::from_vec(m, [1, l]).unwrap();
    let evict_bytes: usize = std::env::var("EVICT_BYTES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(EVICT_BYTES);
    let evict: Vec<Vec<u64>> = (0..LAYERS).map(|i| vec![i as u64; evict_bytes / 8]).collect();
    rayon::scope(|_| {
        let mut spent = Duration::ZERO;
        let mut calls = 0u32;
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(2) {
            for (il, (k, vt)) in caches.iter().enumerate() {
                black_box(evict[il].iter().fold(0u64, |a, v| a.wrapping_add(*v)));
                let t = Instant::now();
                black_box(Tensor::cached_attention(&q, k, vt, &mask, 0.125).unwrap());
                spent += t.elapsed();
                calls += 1;
            }
        }
        println!(
            "live {live}, L {l}: {:.2} us per call ({calls} calls)",
            spent.as_secs_f64() * 1e6 / calls as f64
        );
    });
}
