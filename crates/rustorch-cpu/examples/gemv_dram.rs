//! Matvec speed with the weights far past the caches, as in token
//! generation, next to a plain read of the same bytes by the same threads:
//! how close each weight type's gemv comes to the memory's bandwidth.
//!
//! usage: cargo run --release --example gemv_dram -- [TYPES] [COLS] [KIB]
//!   TYPES: comma-separated GGUF types (default Q4_K,Q6_K,Q8_0,Q4_1)
//!   COLS: columns of each matrix (default 2048); KIB: bytes per type
//!   (default 524288, 512 MiB; a small size measures from the caches). Threads: RAYON_NUM_THREADS (default: all cores).
//! The matrix is a 64-row tile repeated (speed does not depend on values);
//! each pass reads it once, in the repacked order where llama.cpp repacks,
//! and in the layout the model loader would give it (`QWeight::for_matmul_in`;
//! GEMV_DRAM_ROWS=1 keeps rows one after another; RUSTORCH_HUGEPAGES=0 puts
//! the matrix on 4 KiB pages).

use rayon::prelude::*;
use rustorch_core::quant::{QTensor, QType};
use rustorch_cpu::qmatmul::{self, QMatRef};
use std::hint::black_box;
use std::time::Instant;

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

/// Best of `reps` passes, in GB/s of `bytes`.
fn best_gbs(bytes: usize, reps: usize, mut pass: impl FnMut()) -> f64 {
    pass();
    let mut best = f64::MAX;
    for _ in 0..reps {
        let t = Instant::now();
        pass();
        best = best.min(t.elapsed().as_secs_f64());
    }
    bytes as f64 / best / 1e9
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let types = args.first().map_or("Q4_K,Q6_K,Q8_0,Q4_1", |s| s.as_str());
    let cols: usize = args.get(1).map_or(Ok(2048), |s| s.parse())?;
    let kib: usize = args.get(2).map_or(Ok(512 << 10), |s| s.parse())?;
    println!(
        "threads: {}, columns: {cols}, {kib} KiB per matrix",
        rayon::current_num_threads()
    );
    // Passes enough to read about 2 GiB, at least 5.
    let reps = ((2usize << 20) / kib.max(1)).max(5);
    let x = values(cols, 11);
    for name in types.split(',') {
        let qtype = QType::ALL
            .into_iter()
            .find(|t| t.name().eq_ignore_ascii_case(name))
            .ok_or_else(|| format!("unknown type {name}"))?;
        let tile = QTensor::quantize(qtype, [64, cols], &values(64 * cols, 7))?;
        let row_bytes = tile.bytes().len() / 64;
        let rows = (((kib << 10) / row_bytes) / 64 * 64).max(64);
        // 64-byte aligned, as llama.cpp's buffers are; on huge pages where
        // the kernel gives them, as the model loader's copies are
        // (`RUSTORCH_HUGEPAGES=0`: 4 KiB pages).
        let mut storage = Vec::with_capacity(rows * row_bytes + 64);
        rustorch_core::huge_pages::advise(&mut storage);
        storage.resize(rows * row_bytes + 64, 0u8);
        let start = storage.as_ptr().align_offset(64);
        for chunk in storage[start..start + rows * row_bytes].chunks_mut(tile.bytes().len()) {
            chunk.copy_from_slice(&tile.bytes()[..chunk.len()]);
        }
        let layout = if qmatmul::interleave_pays(qtype, rows) && std::env::var_os("GEMV_DRAM_ROWS").is_none() {
            qmatmul::interleave_rows(qtype, rows, cols, &mut storage[start..start + rows * row_bytes])?;
            "interleaved"
        } else {
            "rows"
        };
        let bytes = &storage[start..start + rows * row_bytes];
        let w = if layout == "interleaved" {
            QMatRef::interleaved(qtype, rows, cols, bytes)?
        } else {
            QMatRef::new(qtype, rows, cols, bytes)?.with_repack(true)
        };
        let gemv = best_gbs(bytes.len(), reps, || {
            black_box(qmatmul::qmatmul(&w, &x).expect("qmatmul"));
        });
        let read = best_gbs(bytes.len(), reps, || {
            let s: u64 = bytes
                .par_chunks(1 << 16)
                .map(|ch| {
                    ch.chunks_exact(8)
                        .fold(0u64, |a, v| a.wrapping_add(u64::from_le_bytes(v.try_into().unwrap())))
                })
                .reduce(|| 0, u64::wrapping_add);
            black_box(s);
        });
        println!(
            "{name:>6} {rows}x{cols} ({layout}): gemv {gemv:6.1} GB/s, plain read {read:6.1} GB/s, ratio {:.2}",
            gemv / read
        );
    }
    Ok(())
}
