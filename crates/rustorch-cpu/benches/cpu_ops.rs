//! CPU op benchmarks. bench/compare_torch.py runs these and the same
//! shapes through PyTorch in one run and prints the throughput ratios.
//!
//! Every benchmark id is `<op>/<shape>`; compare_torch.py uses the same ids.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use rustorch_core::op::Conv2dParams;
use rustorch_core::{DType, FlashPaths, Tensor};
use std::hint::black_box;
use std::time::Duration;

fn matmul(c: &mut Criterion) {
    let mut g = c.benchmark_group("matmul_f32");
    g.sample_size(10).measurement_time(Duration::from_secs(4));
    for n in [512usize, 1024, 2048] {
        let a = Tensor::randn([n, n], DType::F32, 1).unwrap();
        let b = Tensor::randn([n, n], DType::F32, 2).unwrap();
        g.throughput(Throughput::Elements((2 * n * n * n) as u64));
        g.bench_with_input(BenchmarkId::from_parameter(n), &n, |bch, _| {
            bch.iter(|| black_box(a.matmul(&b).unwrap()))
        });
    }
    g.finish();

    let mut g = c.benchmark_group("matmul_f16");
    g.sample_size(10).measurement_time(Duration::from_secs(4));
    let n = 1024usize;
    let a = Tensor::randn([n, n], DType::F16, 1).unwrap();
    let b = Tensor::randn([n, n], DType::F16, 2).unwrap();
    g.throughput(Throughput::Elements((2 * n * n * n) as u64));
    g.bench_with_input(BenchmarkId::from_parameter(n), &n, |bch, _| {
        bch.iter(|| black_box(a.matmul(&b).unwrap()))
    });
    g.finish();
}

fn row_ops(c: &mut Criterion) {
    let mut g = c.benchmark_group("softmax_f32");
    for (rows, cols) in [(4096usize, 1024usize), (64, 32000)] {
        let x = Tensor::randn([rows, cols], DType::F32, 3).unwrap();
        g.throughput(Throughput::Bytes((rows * cols * 4) as u64));
        g.bench_with_input(BenchmarkId::from_parameter(format!("{rows}x{cols}")), &0, |bch, _| {
            bch.iter(|| black_box(x.softmax(-1).unwrap()))
        });
    }
    g.finish();

    let mut g = c.benchmark_group("rms_norm_f32");
    for (rows, cols) in [(4096usize, 4096usize), (512, 2048)] {
        let x = Tensor::randn([rows, cols], DType::F32, 4).unwrap();
        let w = Tensor::randn([cols], DType::F32, 5).unwrap();
        g.throughput(Throughput::Bytes((rows * cols * 4) as u64));
        g.bench_with_input(BenchmarkId::from_parameter(format!("{rows}x{cols}")), &0, |bch, _| {
            bch.iter(|| black_box(x.rms_norm(Some(&w), 1e-5).unwrap()))
        });
    }
    g.finish();
}

fn elementwise(c: &mut Criterion) {
    let n = 1usize << 22;
    let a = Tensor::randn([n], DType::F32, 6).unwrap();
    let b = Tensor::randn([n], DType::F32, 7).unwrap();
    let mut g = c.benchmark_group("elementwise_f32");
    g.throughput(Throughput::Elements(n as u64));
    g.bench_function("add_4M", |bch| bch.iter(|| black_box(a.add(&b).unwrap())));
    g.bench_function("mul_4M", |bch| bch.iter(|| black_box(a.mul(&b).unwrap())));
    g.bench_function("silu_4M", |bch| bch.iter(|| black_box(a.silu().unwrap())));
    g.bench_function("gelu_4M", |bch| bch.iter(|| black_box(a.gelu().unwrap())));
    g.bench_function("exp_4M", |bch| bch.iter(|| black_box(a.exp().unwrap())));
    g.finish();
}

/// A decode step's small ops (SmolLM2's 576-wide hidden state): what one
/// op costs beyond its arithmetic (the executor's dispatch, the output's
/// allocation), which hundreds of them per generated token add up.
fn small_ops(c: &mut Criterion) {
    let a = Tensor::randn([1, 576], DType::F32, 6).unwrap();
    let b = Tensor::randn([1, 576], DType::F32, 7).unwrap();
    let w = Tensor::randn([576], DType::F32, 8).unwrap();
    let mut g = c.benchmark_group("small_ops");
    g.bench_function("add_1x576", |bch| bch.iter(|| black_box(a.add(&b).unwrap())));
    g.bench_function("rms_norm_1x576", |bch| {
        bch.iter(|| black_box(a.rms_norm(Some(&w), 1e-5).unwrap()))
    });
    g.bench_function("reshape_transpose_1x576", |bch| {
        bch.iter(|| black_box(a.reshape([1, 9, 64]).unwrap().transpose(0, 1).unwrap()))
    });
    g.finish();
}

fn conv(c: &mut Criterion) {
    // A ResNet-50 stage-1 3x3 layer at batch 8.
    let x = Tensor::randn([8, 64, 56, 56], DType::F32, 8).unwrap();
    let w = Tensor::randn([64, 64, 3, 3], DType::F32, 9).unwrap();
    let p = Conv2dParams {
        stride: [1, 1],
        padding: [1, 1],
        dilation: [1, 1],
        groups: 1,
    };
    let mut g = c.benchmark_group("conv2d_f32");
    g.sample_size(10).measurement_time(Duration::from_secs(4));
    g.throughput(Throughput::Elements((2 * 8 * 64 * 56 * 56 * 64 * 9) as u64));
    g.bench_function("resnet_8x64x56x56_k3", |bch| {
        bch.iter(|| black_box(x.conv2d(&w, None, p).unwrap()))
    });
    g.finish();
}

/// Attention over an f16 cache for one new position (token generation),
/// TinyLlama's heads (32 query, 4 key/value, 64 dims) at several cache
/// lengths. It runs on a worker of rayon's pool, as the model's forward
/// pass does, so that the op's split into tasks costs what it costs there.
fn decode_attention(c: &mut Criterion) {
    let mut g = c.benchmark_group("cached_attention");
    // (query heads, key/value heads, cache length, live positions):
    // TinyLlama's heads, and SmolLM2's (9 x 3) early in a short generation;
    // llama.cpp pads the attended length to 256, so early in a conversation
    // most of it is masked.
    let d = 64usize;
    for (hq, hkv, l, live) in [
        (32usize, 4usize, 64usize, 64usize),
        (32, 4, 256, 32),
        (32, 4, 256, 256),
        (32, 4, 1024, 1024),
        (9, 3, 128, 100),
    ] {
        let q = Tensor::randn([hq, 1, d], DType::F32, 10).unwrap();
        let k = Tensor::randn([hkv, l, d], DType::F32, 11)
            .unwrap()
            .to_dtype(DType::F16)
            .unwrap();
        let vt = Tensor::randn([hkv, d, l], DType::F32, 12)
            .unwrap()
            .to_dtype(DType::F16)
            .unwrap();
        let m: Vec<f32> = (0..l).map(|j| if j < live { 0.0 } else { f32::NEG_INFINITY }).collect();
        let mask = Tensor::from_vec(m, [1, l]).unwrap();
        g.throughput(Throughput::Bytes((2 * hkv * live * d * 2) as u64));
        let name = if live == l {
            format!("decode_{hq}x{hkv}x{d}_L{l}")
        } else {
            format!("decode_{hq}x{hkv}x{d}_L{l}_live{live}")
        };
        g.bench_function(&name, |bch| {
            rayon::scope(|_| bch.iter(|| black_box(Tensor::cached_attention(&q, &k, &vt, &mask, 0.125).unwrap())))
        });
        // Flash attention (llama.cpp's default): values as rows, GGML's
        // one-row path.
        let v = vt.transpose(1, 2).unwrap().contiguous().unwrap();
        let paths = FlashPaths {
            tiled_rows: 0,
            kv_len: l.next_multiple_of(256),
            threads: rayon::current_num_threads(),
        };
        g.bench_function(format!("flash_{name}"), |bch| {
            rayon::scope(|_| bch.iter(|| black_box(Tensor::flash_attention(&q, &k, &v, &mask, 0.125, paths).unwrap())))
        });
    }
    g.finish();
}

/// Attention of a prompt's micro-batch over an f16 cache (prompt
/// processing): TinyLlama's heads (32 query, 4 key/value) and SmolLM2's
/// (9, 3), `t` new positions after `past` cached ones, under the causal
/// mask, as `Model::forward` runs it. The flash cases run inside a
/// spinning team, as the forward pass does.
fn prompt_attention(c: &mut Criterion) {
    let d = 64usize;
    let mut g = c.benchmark_group("cached_attention");
    g.sample_size(10);
    for (hq, hkv, t, past) in [
        (32usize, 4usize, 256usize, 0usize),
        (32, 4, 256, 256),
        (32, 4, 512, 0),
        (9, 3, 256, 256),
    ] {
        let l = t + past;
        let q = Tensor::randn([hq, t, d], DType::F32, 10).unwrap();
        let k = Tensor::randn([hkv, l, d], DType::F32, 11)
            .unwrap()
            .to_dtype(DType::F16)
            .unwrap();
        let vt = Tensor::randn([hkv, d, l], DType::F32, 12)
            .unwrap()
            .to_dtype(DType::F16)
            .unwrap();
        let m: Vec<f32> = (0..t * l)
            .map(|e| if e % l <= past + e / l { 0.0 } else { f32::NEG_INFINITY })
            .collect();
        let mask = Tensor::from_vec(m, [t, l]).unwrap();
        // Multiply-adds of the live (unmasked) products, both of them.
        let live: usize = (0..t).map(|i| past + i + 1).sum();
        g.throughput(Throughput::Elements((2 * hq * live * d) as u64));
        g.bench_function(format!("prompt_{hq}x{hkv}x{d}_T{t}_past{past}"), |bch| {
            rayon::scope(|_| bch.iter(|| black_box(Tensor::cached_attention(&q, &k, &vt, &mask, 0.125).unwrap())))
        });
        // Flash attention (llama.cpp's default): values as rows, GGML's
        // tiled path.
        let v = vt.transpose(1, 2).unwrap().contiguous().unwrap();
        let paths = FlashPaths {
            tiled_rows: t,
            kv_len: l.next_multiple_of(256),
            threads: rayon::current_num_threads(),
        };
        g.bench_function(format!("flash_prompt_{hq}x{hkv}x{d}_T{t}_past{past}"), |bch| {
            rustorch_cpu::team::run_team(|| {
                bch.iter(|| black_box(Tensor::flash_attention(&q, &k, &v, &mask, 0.125, paths).unwrap()))
            })
        });
    }
    g.finish();
}

criterion_group!(
    benches,
    matmul,
    row_ops,
    elementwise,
    small_ops,
    conv,
    decode_attention,
    prompt_attention
);
criterion_main!(benches);
