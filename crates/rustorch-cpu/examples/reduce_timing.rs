//! Time of large float reductions through the CPU kernels (no executor):
//! contiguous and strided (stepped, expanded) inputs, whole-tensor sums,
//! row sums and sums over an outer dimension. Prints the best and median of
//! the runs, and a checksum of the results' bits so that two builds can be
//! compared for equal results too.
//! usage: cargo run --release -p rustorch-cpu --example reduce_timing [REPS]

use half::f16;
use rustorch_core::op::ReduceOp;
use rustorch_core::{Layout, Op, TensorMeta};
use rustorch_cpu::{CpuBackend, CpuInput, CpuStorage};
use std::time::Instant;

const N: usize = 64 << 20;

fn values(n: usize) -> Vec<f32> {
    let mut s = 0x9E37_79B9_7F4A_7C15u64;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 40) as f32 / (1u64 << 24) as f32 - 0.5
        })
        .collect()
}

fn time(name: &str, reps: usize, storage: &CpuStorage, layout: &Layout, op: ReduceOp, dims: &[usize]) {
    let out_dims: Vec<usize> = (0..layout.rank())
        .filter(|d| !dims.contains(d))
        .map(|d| layout.dims()[d])
        .collect();
    let op = Op::Reduce {
        op,
        dims: dims.to_vec(),
        keepdim: false,
    };
    let out = [TensorMeta::new(out_dims, storage.dtype())];
    let input = [CpuInput { storage, layout }];
    let mut times = Vec::new();
    let mut check = 0u64;
    for _ in 0..reps {
        let t = Instant::now();
        let r = CpuBackend::run(&op, &input, &out).expect("reduction");
        times.push(t.elapsed().as_secs_f64() * 1e3);
        check = r[0]
            .to_f64_vec()
            .iter()
            .fold(0u64, |h, v| h.rotate_left(5) ^ v.to_bits());
    }
    times.sort_by(f64::total_cmp);
    let gbs = layout.numel() as f64 * storage.dtype().size_in_bytes() as f64 / times[0] / 1e6;
    println!(
        "{name:<34} best {:8.2} ms  median {:8.2} ms  ({gbs:6.1} GB/s)  bits {check:016x}",
        times[0],
        times[times.len() / 2]
    );
}

fn main() {
    let reps: usize = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(7);
    println!("threads {}", rayon::current_num_threads());
    let v = values(N);
    let contig = CpuStorage::F32(v.clone());
    let flat = Layout::contiguous([N]);
    time("sum f32 [64M] all", reps, &contig, &flat, ReduceOp::Sum, &[0]);
    let rows = Layout::contiguous([64, N / 64]);
    time("sum f32 [64, 1M] dim 1", reps, &contig, &rows, ReduceOp::Sum, &[1]);
    time("sum f32 [64, 1M] dim 0", reps, &contig, &rows, ReduceOp::Sum, &[0]);
    let sq = Layout::contiguous([8192, N / 8192]);
    time("sum f32 [8192, 8192] dim 0", reps, &contig, &sq, ReduceOp::Sum, &[0]);
    let mid = Layout::contiguous([16, 4096, N / 16 / 4096]);
    time(
        "sum f32 [16, 4096, 1024] dim 1",
        reps,
        &contig,
        &mid,
        ReduceOp::Sum,
        &[1],
    );
    time(
        "var f32 [64M] all",
        reps,
        &contig,
        &flat,
        ReduceOp::Var { correction: 1 },
        &[0],
    );
    // Near 1, so that products of 8192 values neither overflow nor vanish.
    let near_one = CpuStorage::F32(v.iter().map(|&x| 1.0 + x / 64.0).collect());
    time(
        "prod f32 [8192, 8192] dim 0",
        reps,
        &near_one,
        &sq,
        ReduceOp::Prod,
        &[0],
    );
    drop(near_one);
    // Stepped: every other element of a buffer twice as long, from offset 1.
    let mut twice = v.clone();
    twice.extend_from_slice(&v);
    let stepped = CpuStorage::F32(twice);
    let step = Layout::from_parts([N].into(), vec![2], 1).expect("stepped layout");
    time("sum f32 [64M] stepped all", reps, &stepped, &step, ReduceOp::Sum, &[0]);
    drop(stepped);
    // Expanded: one row of 1M broadcast to 64 rows (stride 0).
    let row = CpuStorage::F32(v[..N / 64].to_vec());
    let expanded = Layout::from_parts([64, N / 64].into(), vec![0, 1], 0).expect("expanded layout");
    time(
        "sum f32 [64, 1M] expanded all",
        reps,
        &row,
        &expanded,
        ReduceOp::Sum,
        &[0, 1],
    );
    time(
        "sum f32 [64, 1M] expanded dim 0",
        reps,
        &row,
        &expanded,
        ReduceOp::Sum,
        &[0],
    );
    let half = CpuStorage::F16(v.iter().map(|&x| f16::from_f32(x)).collect());
    time("sum f16 [64M] all", reps, &half, &flat, ReduceOp::Sum, &[0]);
}
