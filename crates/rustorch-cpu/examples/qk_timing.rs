//! Throughput of the K-quant matmul kernels: GB/s of weights streamed for
//! a 4096 x 4096 weight matrix, per weight type and instruction-set level,
//! with one activation row (matvec, token generation) and 64 (prompt).
//!
//!     cargo run --release -p rustorch-cpu --example qk_timing [types...]
//!
//! Activations are quantized once beforehand, so the times are the
//! kernels and the threaded driver only. One 4096 x 4096 matrix fits in
//! a large L3 cache, so repeated products read it from cache; the
//! "m=1 cold" column cycles through enough copies (over 128 MB) that every
//! product streams its weights from memory, as a model's matvecs do. `RAYON_NUM_THREADS` sets the
//! thread count; `QK_TIMING_SECS` the time spent per measurement (0.5 s).

use rustorch_core::quant::QType;
use rustorch_cpu::qmatmul::{qmatmul_quantized_into, vec_dot_type, Isa, QMatRef, QuantizedRows};
use std::time::{Duration, Instant};

const ROWS: usize = 4096;
const COLS: usize = 4096;

/// Random bytes with finite, small super-block scales (random bytes there
/// could be NaN): any bit pattern of the quants is a valid block.
fn weights(qtype: QType, seed: &mut u64) -> Vec<u8> {
    let size = qtype.type_size();
    let mut next = || {
        *seed ^= *seed << 13;
        *seed ^= *seed >> 7;
        *seed ^= *seed << 17;
        *seed
    };
    let mut bytes: Vec<u8> = (0..ROWS * COLS / 256 * size).map(|_| next() as u8).collect();
    let (f16s, f32_at): (&[usize], Option<usize>) = match qtype {
        QType::Q2K => (&[80, 82], None),
        QType::Q3K => (&[108], None),
        QType::Q4K | QType::Q5K => (&[0, 2], None),
        QType::Q6K => (&[208], None),
        QType::IQ4XS => (&[0], None),
        _ => (&[], Some(0)),
    };
    let f16_small = 0x2000u16.to_le_bytes(); // 2^-7
    for b in bytes.chunks_exact_mut(size) {
        for &o in f16s {
            b[o..o + 2].copy_from_slice(&f16_small);
        }
        if let Some(o) = f32_at {
            b[o..o + 4].copy_from_slice(&0.01f32.to_le_bytes());
        }
    }
    bytes
}

/// Seconds per call: one warm-up call, then as many as fit in `budget`
/// (at least one); the median of the timed calls.
fn time(budget: Duration, mut f: impl FnMut()) -> f64 {
    f();
    let start = Instant::now();
    let mut times = Vec::new();
    while times.is_empty() || start.elapsed() < budget {
        let t = Instant::now();
        f();
        times.push(t.elapsed().as_secs_f64());
    }
    times.sort_by(f64::total_cmp);
    times[times.len() / 2]
}

fn main() {
    let budget = Duration::from_secs_f64(
        std::env::var("QK_TIMING_SECS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(0.5),
    );
    let all = [
        QType::Q4K,
        QType::Q6K,
        QType::Q5K,
        QType::Q8K,
        QType::Q3K,
        QType::Q2K,
        QType::IQ4XS,
    ];
    let args: Vec<String> = std::env::args().skip(1).collect();
    let types: Vec<QType> = all
        .into_iter()
        .filter(|t| args.is_empty() || args.iter().any(|a| a.eq_ignore_ascii_case(&t.to_string())))
        .collect();
    println!(
        "{ROWS} x {COLS} weights, {} threads; GB/s of weights (ms per product)",
        rayon::current_num_threads()
    );
    println!(
        "{:<7} {:<11} {:>20} {:>20} {:>20}",
        "type", "isa", "m=1", "m=1 cold", "m=64"
    );
    let mut seed = 0x9E37_79B9_7F4A_7C15u64;
    for qtype in types {
        let bytes = weights(qtype, &mut seed);
        let w = match QMatRef::new(qtype, ROWS, COLS, &bytes) {
            Ok(w) => w,
            Err(e) => {
                eprintln!("{qtype}: {e}");
                continue;
            }
        };
        let dot = vec_dot_type(qtype).expect("K-quant types have a dot type");
        let copies: Vec<Vec<u8>> = (0..(128 << 20) / bytes.len() + 1).map(|_| bytes.clone()).collect();
        let cold: Vec<QMatRef> = copies
            .iter()
            .map(|b| QMatRef::new(qtype, ROWS, COLS, b).expect("same shape"))
            .collect();
        for isa in Isa::ALL.into_iter().filter(|i| i.is_available()) {
            let mut cells = Vec::new();
            for (m, mats) in [
                (1, std::slice::from_ref(&w)),
                (1, &cold[..]),
                (64, std::slice::from_ref(&w)),
            ] {
                let x: Vec<f32> = (0..m * COLS)
                    .map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0)
                    .collect();
                let act = QuantizedRows::quantize(dot, &x, COLS).expect("whole Q8_K blocks");
                let mut out = vec![0f32; m * ROWS];
                // The scalar kernels are slow at m = 64: time one call.
                let b = if isa == Isa::Scalar && m > 1 {
                    Duration::ZERO
                } else {
                    budget
                };
                let mut next = 0;
                let secs = time(b, || {
                    next = (next + 1) % mats.len();
                    qmatmul_quantized_into(isa, &mats[next], &act, &mut out).expect("valid product");
                });
                cells.push(format!(
                    "{:>8.2} ({:>7.2} ms)",
                    bytes.len() as f64 / secs / 1e9,
                    secs * 1e3
                ));
            }
            println!(
                "{:<7} {:<11} {:>20} {:>20} {:>20}",
                qtype.to_string(),
                isa.name(),
                cells[0],
                cells[1],
                cells[2]
            );
        }
    }
}
