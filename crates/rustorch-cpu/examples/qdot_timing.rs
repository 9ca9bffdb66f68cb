//! Throughput of the quantized matmul for the 32-value block types: GB/s
//! of weights streamed for a 4096 x 4096 weight matrix, with one
//! activation row (matvec, the decode step of an LLM) and with 64.
//!
//! cargo run --release --example qdot_timing -- [TYPE...] [--isa LEVEL...] [--m M...]
//!
//! Threads come from rayon (RAYON_NUM_THREADS). Weights are random blocks
//! with finite scales; the speed does not depend on the values.

use rustorch_core::quant::blocks::f32_to_f16;
use rustorch_core::quant::QType;
use rustorch_cpu::qmatmul::{qmatmul_quantized_into, vec_dot_type, Isa, QMatRef, QuantizedRows};
use std::time::{Duration, Instant};

const N: usize = 4096;
const K: usize = 4096;
const TYPES: [QType; 7] = [
    QType::Q4_0,
    QType::Q4_1,
    QType::Q5_0,
    QType::Q5_1,
    QType::Q8_0,
    QType::Q8_1,
    QType::IQ4NL,
];

fn random_weights(qtype: QType, seed: u64) -> Vec<u8> {
    let mut s = seed;
    let mut next = move || {
        s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (s >> 33) as u8
    };
    let size = qtype.type_size();
    let mut w = vec![0u8; qtype.bytes_for(N * K).expect("whole blocks")];
    for b in w.chunks_exact_mut(size) {
        b.iter_mut().for_each(|x| *x = next());
        b[0..2].copy_from_slice(&f32_to_f16(0.01 + next() as f32 * 1e-4));
        if matches!(qtype, QType::Q4_1 | QType::Q5_1) {
            b[2..4].copy_from_slice(&f32_to_f16(-0.05));
        }
    }
    w
}

/// Seconds per call: the median of runs after a warm-up, over at least
/// `budget` of wall time.
fn time(mut f: impl FnMut(), budget: Duration) -> f64 {
    f();
    let mut runs = Vec::new();
    let start = Instant::now();
    while runs.len() < 5 || start.elapsed() < budget {
        let t = Instant::now();
        f();
        runs.push(t.elapsed().as_secs_f64());
    }
    runs.sort_by(f64::total_cmp);
    runs[runs.len() / 2]
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut types = Vec::new();
    let mut isas = Vec::new();
    let mut ms = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--isa" => isas.extend(it.next().and_then(|s| Isa::parse(s))),
            "--m" => ms.extend(it.next().and_then(|s| s.parse::<usize>().ok())),
            t => match TYPES.iter().find(|q| q.to_string().eq_ignore_ascii_case(t)) {
                Some(&q) => types.push(q),
                None => {
                    eprintln!("unknown argument {t}");
                    std::process::exit(2);
                }
            },
        }
    }
    if types.is_empty() {
        types = TYPES.to_vec();
    }
    if isas.is_empty() {
        isas = Isa::ALL.into_iter().filter(|i| i.is_available()).collect();
    }
    if ms.is_empty() {
        ms = vec![1, 64];
    }
    println!(
        "{} x {} weights, {} rayon threads; GB/s of weights per product",
        N,
        K,
        rayon::current_num_threads()
    );
    println!("{:<7} {:<11} {:>4} {:>10} {:>9}", "type", "isa", "m", "ms", "GB/s");
    for &qtype in &types {
        let bytes = random_weights(qtype, 7);
        let w = QMatRef::new(qtype, N, K, &bytes).expect("valid weights");
        let dot = vec_dot_type(qtype).expect("a matmul type");
        for &m in &ms {
            let x: Vec<f32> = (0..m * K).map(|i| ((i * 7919) % 2001) as f32 / 1000.0 - 1.0).collect();
            let act = QuantizedRows::quantize(dot, &x, K).expect("valid activations");
            let mut out = vec![0f32; m * N];
            for &isa in &isas {
                let budget = Duration::from_millis(if m == 1 { 300 } else { 600 });
                let secs = time(
                    || qmatmul_quantized_into(isa, &w, &act, &mut out).expect("valid product"),
                    budget,
                );
                let gbs = bytes.len() as f64 / secs / 1e9;
                println!(
                    "{:<7} {:<11} {:>4} {:>10.3} {:>9.2}",
                    qtype.to_string(),
                    isa.name(),
                    m,
                    secs * 1e3,
                    gbs
                );
            }
        }
    }
}
