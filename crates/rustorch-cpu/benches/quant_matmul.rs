//! Quantized matvec and matmul for every weight type, plus this machine's
//! memory read bandwidth. bench/compare_llamacpp_quant.py runs these and
//! llama.cpp's test-backend-ops on the same shapes in one run and prints
//! GB/s of weights streamed for both.
//!
//! Ids: `qmatvec/<TYPE>_<rows>x<cols>` (one activation row),
//! `qmatmul/<TYPE>_<rows>x<cols>x<batch>` and `membw/read_1GiB`. Weights
//! are `rows x cols` (`rows` outputs, `cols` inputs). Each run includes
//! quantizing the activations, as llama.cpp's MUL_MAT does.
//! Filter with criterion's usual argument: `-- qmatvec/Q4_K_`. The
//! 262144x640 matvec (a large vocabulary's output matrix) runs for Q8_0
//! only.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use rayon::prelude::*;
use rustorch_core::quant::{QTensor, QType};
use rustorch_cpu::qmatmul::{self, QMatRef};
use std::hint::black_box;
use std::time::Duration;

pub const TYPES: [QType; 17] = [
    QType::F32,
    QType::F16,
    QType::BF16,
    QType::Q4_0,
    QType::Q4_1,
    QType::Q5_0,
    QType::Q5_1,
    QType::Q8_0,
    QType::Q8_1,
    QType::Q2K,
    QType::Q3K,
    QType::Q4K,
    QType::Q5K,
    QType::Q6K,
    QType::Q8K,
    QType::IQ4NL,
    QType::IQ4XS,
];

/// Deterministic values in [-1, 1).
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect()
}

/// Bytes starting on a 64-byte (cache-line) boundary, as llama.cpp's
/// buffers do: a plain `Vec<u8>` this large comes from mmap at 16 bytes
/// past a page, so every 64-byte load would straddle two cache lines.
struct CacheAligned {
    storage: Vec<u8>,
    start: usize,
    len: usize,
}

impl CacheAligned {
    fn copy_of(bytes: &[u8]) -> Self {
        let mut storage = vec![0u8; bytes.len() + 64];
        let start = storage.as_ptr().align_offset(64);
        storage[start..start + bytes.len()].copy_from_slice(bytes);
        CacheAligned {
            storage,
            start,
            len: bytes.len(),
        }
    }

    fn bytes(&self) -> &[u8] {
        &self.storage[self.start..self.start + self.len]
    }
}

/// `rows x cols` weights: 64 quantized rows repeated (speed does not
/// depend on the values, and quantizing 16M values per type is slow).
fn weights(qtype: QType, rows: usize, cols: usize) -> CacheAligned {
    let tile = QTensor::quantize(qtype, [64, cols], &values(64 * cols, 7)).expect("quantize");
    let mut bytes = Vec::with_capacity(tile.bytes().len() * rows.div_ceil(64));
    while bytes.len() < tile.bytes().len() / 64 * rows {
        bytes.extend_from_slice(tile.bytes());
    }
    bytes.truncate(tile.bytes().len() / 64 * rows);
    CacheAligned::copy_of(&bytes)
}

fn bench_shape(c: &mut Criterion, group: &str, rows: usize, cols: usize, batch: usize) {
    bench_types(c, group, rows, cols, batch, &TYPES);
}

fn bench_types(c: &mut Criterion, group: &str, rows: usize, cols: usize, batch: usize, types: &[QType]) {
    let mut g = c.benchmark_group(group);
    g.sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    let x = values(batch * cols, 11);
    for &qtype in types {
        if !qmatmul::can_matmul(qtype) {
            eprintln!("{group}/{qtype}: no kernel, skipped");
            continue;
        }
        let weights = weights(qtype, rows, cols);
        let bytes = weights.bytes();
        let w = QMatRef::new(qtype, rows, cols, bytes).expect("weights");
        g.throughput(Throughput::Bytes(bytes.len() as u64));
        let id = if batch == 1 {
            format!("{qtype}_{rows}x{cols}")
        } else {
            format!("{qtype}_{rows}x{cols}x{batch}")
        };
        g.bench_function(id, |b| b.iter(|| black_box(qmatmul::qmatmul(&w, &x).expect("qmatmul"))));
    }
    g.finish();
}

fn qmatvec(c: &mut Criterion) {
    bench_shape(c, "qmatvec", 4096, 4096, 1);
    bench_shape(c, "qmatvec", 5632, 2048, 1);
    // A tied output matrix far larger than the caches: Gemma 3 270M's
    // 262144-token vocabulary at 640 columns (Q8_0 in its Q4_K_M file;
    // SmolLM2's is 49152 x 576), which dominates their generation. 640
    // columns are not whole K-quant super-blocks, so Q8_0 only.
    bench_types(c, "qmatvec", 262144, 640, 1, &[QType::Q8_0]);
}

/// Q4_K matvecs in the interleaved ("x8") layout that the model loader
/// gives the weights llama.cpp repacks (`ggml_repack_gemv`), where this
/// CPU has that path: 2048 x 2048 (TinyLlama's attention projections,
/// L3-resident when repeated) and 65536 x 2048 (75 MB, past this
/// machine's 32 MB L3: a generation step's stream from memory).
fn qmatvec_x8(c: &mut Criterion) {
    let mut g = c.benchmark_group("qmatvec_x8");
    g.sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    for (rows, cols) in [(2048usize, 2048usize), (65536, 2048)] {
        if !qmatmul::interleave_pays(QType::Q4K, rows) {
            eprintln!("qmatvec_x8: no interleaved Q4_K path on this CPU, skipped");
            return;
        }
        let x = values(cols, 11);
        let mut bytes = weights(QType::Q4K, rows, cols).bytes().to_vec();
        qmatmul::interleave_rows(QType::Q4K, rows, cols, &mut bytes).expect("interleave");
        let aligned = CacheAligned::copy_of(&bytes);
        let w = QMatRef::interleaved(QType::Q4K, rows, cols, aligned.bytes()).expect("weights");
        g.throughput(Throughput::Bytes(bytes.len() as u64));
        g.bench_function(format!("Q4_K_{rows}x{cols}"), |b| {
            b.iter(|| black_box(qmatmul::qmatmul(&w, &x).expect("qmatmul")))
        });
    }
    g.finish();
}

/// Legacy-type matvecs in the AMX build's order on weights packed as its
/// kernels stream them (`qmatmul::amx_pack`, what `RUSTORCH_GGML_ORDER=amx`
/// loads), at 5632 x 2048 and past the L3 at 32768 x 2048.
fn qmatvec_amx_order(c: &mut Criterion) {
    let mut g = c.benchmark_group("qmatvec_amx_order");
    g.sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    for (rows, cols) in [(5632usize, 2048usize), (32768, 2048)] {
        let x = values(cols, 11);
        for qtype in [QType::Q4_0, QType::Q4_1, QType::Q8_0] {
            let packed =
                qmatmul::amx_pack(qtype, rows, cols, weights(qtype, rows, cols).bytes().to_vec()).expect("pack");
            let aligned = CacheAligned::copy_of(&packed);
            let w = QMatRef::amx_packed(qtype, rows, cols, aligned.bytes()).expect("weights");
            g.throughput(Throughput::Bytes(packed.len() as u64));
            g.bench_function(format!("{qtype}_{rows}x{cols}"), |b| {
                b.iter(|| black_box(qmatmul::qmatmul(&w, &x).expect("qmatmul")))
            });
        }
    }
    g.finish();
}

/// Legacy-type products of many activation rows in the AMX build's order
/// on packed weights (the tile kernel where AMX runs, `vpdpbusd` rows
/// elsewhere; `RUSTORCH_NO_AMX=1` compares the two on one CPU), at
/// SmolLM2-135M's prompt-processing shapes: gate (1536 x 576) and down
/// (576 x 1536) for a 128-row feed-forward chunk and a 512-row batch.
/// Throughput is in multiply-adds (`elem/s` = MAC/s).
fn qmatmul_amx_order(c: &mut Criterion) {
    let mut g = c.benchmark_group("qmatmul_amx_order");
    g.sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    for (rows, cols, batch) in [(1536usize, 576usize, 128usize), (576, 1536, 128), (1536, 576, 512)] {
        let x = values(batch * cols, 11);
        for qtype in [QType::Q4_1, QType::Q8_0] {
            let packed =
                qmatmul::amx_pack(qtype, rows, cols, weights(qtype, rows, cols).bytes().to_vec()).expect("pack");
            let aligned = CacheAligned::copy_of(&packed);
            let w = QMatRef::amx_packed(qtype, rows, cols, aligned.bytes()).expect("weights");
            g.throughput(Throughput::Elements((rows * cols * batch) as u64));
            // Inside a spinning team, as a model's forward pass runs: between
            // products the workers spin instead of sleeping (on a virtual
            // machine, waking a sleeping worker costs up to a millisecond).
            g.bench_function(format!("{qtype}_{rows}x{cols}x{batch}"), |b| {
                b.iter_custom(|iters| {
                    rustorch_cpu::team::run_team(|| {
                        let start = std::time::Instant::now();
                        for _ in 0..iters {
                            black_box(qmatmul::qmatmul(&w, &x).expect("qmatmul"));
                        }
                        start.elapsed()
                    })
                })
            });
        }
    }
    g.finish();
}

/// The AMX tile unit's instructions alone and in the kernels' patterns
/// (`qmatmul::amx_probe`): steps per second; `imul_chain`'s is a third of
/// the clock (a dependent multiply per step), which gives cycles per step.
#[cfg(not(target_arch = "x86_64"))]
fn amx_probe(_: &mut Criterion) {
    eprintln!("amx_probe: skipped (x86-64 only)");
}

#[cfg(target_arch = "x86_64")]
fn amx_probe(c: &mut Criterion) {
    use qmatmul::amx_probe::{self, Probe};
    if !amx_probe::available() {
        eprintln!("amx_probe: skipped (AMX is not usable on this CPU)");
        return;
    }
    const STEPS: u64 = 10_000;
    let mut g = c.benchmark_group("amx_probe");
    g.sample_size(10).measurement_time(Duration::from_secs(1));
    g.throughput(Throughput::Elements(STEPS));
    for probe in Probe::ALL {
        g.bench_function(probe.name(), |b| {
            b.iter_custom(|iters| {
                let start = std::time::Instant::now();
                assert!(amx_probe::run(probe, iters * STEPS));
                start.elapsed()
            })
        });
    }
    g.finish();
}

fn qmatmul(c: &mut Criterion) {
    bench_shape(c, "qmatmul", 4096, 4096, 512);
}

/// Read bandwidth: a 1 GiB buffer (far past the caches) summed by all
/// threads, as a matvec streams its weights.
fn membw(c: &mut Criterion) {
    let words: Vec<u64> = (0..(1usize << 27)).map(|i| i as u64).collect();
    let mut g = c.benchmark_group("membw");
    g.sample_size(10).measurement_time(Duration::from_secs(4));
    g.throughput(Throughput::Bytes((words.len() * 8) as u64));
    g.bench_function("read_1GiB", |b| {
        b.iter(|| {
            let s: u64 = words
                .par_chunks(1 << 16)
                .map(|ch| ch.iter().fold(0u64, |a, v| a.wrapping_add(*v)))
                .reduce(|| 0, u64::wrapping_add);
            black_box(s)
        })
    });
    g.finish();
}

criterion_group!(
    benches,
    membw,
    qmatvec,
    qmatvec_x8,
    qmatvec_amx_order,
    qmatmul_amx_order,
    amx_probe,
    qmatmul
);
criterion_main!(benches);
