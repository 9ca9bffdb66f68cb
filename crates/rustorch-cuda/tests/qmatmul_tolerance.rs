//! Where the CUDA backend's tolerance for its f32 products of quantized
//! weights (`quant_tol::f32_path`: F32/F16/BF16 weights, and the
//! dequantize-and-cuBLAS path of more than 64 activation rows) comes from,
//! measured on the CPU, without a GPU. (The MMVQ kernels' tolerance,
//! `quant_tol::qmatmul` for the quantized types, is measured by
//! tests/quant_decode_host.rs.)
//!
//! The CPU backend computes `x @ W^T` as llama.cpp does: each activation
//! row quantized to the weight type's dot type (Q8_0, Q8_1, Q8_K, or F16 /
//! BF16 for those weights), then integer dot products. The GPU's f32 path
//! multiplies the f32 activations by the exactly dequantized weights in f32. So the
//! two differ by the activation quantization's error, plus the GPU's f32
//! rounding. Here, for every weight type and for the inputs the
//! conformance suite gives (the random suite's, quant_ops', and the
//! llama.cpp fixtures of ggml_matmul), each CPU result is compared with
//! the exact product of the activations and the dequantized weights (in
//! f64); to that distance is added a bound on the GPU's own f32 error,
//! `k * 2^-24 * sum |x_i w_i|` (any summation order, fused or not), and
//! the sum must be within the tolerance. `--nocapture` prints the table
//! the tolerance was chosen from.

mod quant_tol;

use rustorch_core::op::GateActivation;
use rustorch_core::quant::{self, QType};
use rustorch_core::{CpuStorage, Executor, ExecutorConfig, QWeight, Tensor};
use std::sync::Arc;

const TYPES: [QType; 17] = [
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

/// Unit roundoff of f32.
const U: f64 = 1.0 / (1u64 << 24) as f64;

fn cpu() -> Arc<Executor> {
    Arc::new(Executor::from_backends(
        ExecutorConfig {
            min_offload_elems: 0,
            ..ExecutorConfig::default()
        },
        vec![Arc::new(rustorch_cpu::CpuBackend::new())],
    ))
}

/// The random suite's samples (xorshift64*, uniform in [-1, 1)).
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 52) as f64 - 1.0
    }
}

/// quant_ops' samples (its `values`: an LCG, uniform in [-1, 1)).
fn lcg_values(n: usize, seed: u32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(2654435761).wrapping_add(1);
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(1664525).wrapping_add(1013904223);
            (s >> 8) as f32 / (1u32 << 24) as f32 * 2.0 - 1.0
        })
        .collect()
}

/// The exact products `x @ W^T` (f64) of `m` rows with the dequantized
/// weight, and each one's bound on the GPU's f32 error.
fn exact(x: &[f32], w: &[f32], m: usize, n: usize, k: usize) -> (Vec<f64>, Vec<f64>) {
    let mut val = vec![0f64; m * n];
    let mut bound = vec![0f64; m * n];
    for r in 0..m {
        for j in 0..n {
            let (xr, wj) = (&x[r * k..(r + 1) * k], &w[j * k..(j + 1) * k]);
            let s: f64 = xr.iter().zip(wj).map(|(&a, &b)| a as f64 * b as f64).sum();
            let a: f64 = xr.iter().zip(wj).map(|(&a, &b)| (a as f64 * b as f64).abs()).sum();
            val[r * n + j] = s;
            // k roundings of partial sums (and products, when not fused),
            // then the final f32 result itself.
            bound[r * n + j] = k as f64 * U * a + U * s.abs();
        }
    }
    (val, bound)
}

/// The worst case of one op name over the inputs measured.
#[derive(Default)]
struct Worst {
    /// Largest |cpu - exact| + gpu bound.
    dev: f64,
    /// Its share from the GPU's bound.
    gpu: f64,
    /// Largest |cpu| seen.
    want: f64,
    /// Values compared.
    count: usize,
    /// The smallest atol that covers every value with rtol `RTOLS[i]`.
    atol_for: [f64; 4],
    /// Values outside the tolerance.
    outside: Vec<String>,
}

/// The rtols the report gives the smallest covering atol for.
const RTOLS: [f64; 4] = [0.0, 1e-3, 3e-3, 1e-2];

impl Worst {
    fn add(&mut self, tol: rustorch_conformance::Tol, what: &str, cpu: f64, exact: f64, gpu: f64) {
        let dev = (cpu - exact).abs() + gpu;
        if dev > self.dev {
            self.dev = dev;
            self.gpu = gpu;
        }
        self.want = self.want.max(cpu.abs());
        for (a, r) in self.atol_for.iter_mut().zip(RTOLS) {
            *a = a.max(dev - r * cpu.abs());
        }
        self.count += 1;
        if dev > tol.atol + tol.rtol * cpu.abs() && self.outside.len() < 3 {
            self.outside.push(format!(
                "{what}: the CPU gives {cpu:e}, the exact product is {exact:e}, the GPU's bound {gpu:e}: {dev:e} apart, past {tol:?}"
            ));
        }
    }
}

/// `x [m, k] @ W^T` on the CPU backend for a weight of `wv` values quantized
/// to `qtype`, added to `worst` against the exact product.
#[allow(clippy::too_many_arguments)]
fn product(
    exec: &Arc<Executor>,
    worst: &mut Worst,
    what: &str,
    qtype: QType,
    x: &[f32],
    wv: &[f32],
    (m, n, k): (usize, usize, usize),
) {
    let bytes = quant::quantize(qtype, wv).unwrap();
    let deq = quant::dequantize(qtype, &bytes, n * k).unwrap();
    let w = QWeight::from_bytes_in(exec, qtype, n, k, bytes).unwrap();
    let xt = Tensor::from_storage_in(exec, CpuStorage::F32(x.to_vec()), [m, k]).unwrap();
    let got = xt.qmatmul(&w).unwrap().to_vec::<f32>().unwrap();
    let (want, bound) = exact(x, &deq, m, n, k);
    let tol = quant_tol::f32_path(&format!("qmatmul_{}", qtype.name().to_lowercase())).unwrap();
    for i in 0..m * n {
        worst.add(tol, what, got[i] as f64, want[i], bound[i]);
    }
}

fn report(rows: &[(String, Worst)]) -> Vec<String> {
    eprintln!(
        "{:<16} {:>8} {:>12} {:>12} {:>12}   smallest atol for rtol {RTOLS:?}",
        "op", "values", "max dev", "(gpu part)", "max |cpu|"
    );
    let mut outside = Vec::new();
    for (name, w) in rows {
        eprintln!(
            "{:<16} {:>8} {:>12.4e} {:>12.4e} {:>12.4e}   {:.3e} {:.3e} {:.3e} {:.3e}",
            name, w.count, w.dev, w.gpu, w.want, w.atol_for[0], w.atol_for[1], w.atol_for[2], w.atol_for[3]
        );
        outside.extend(w.outside.iter().cloned());
    }
    outside
}

#[test]
fn qmatmul_tolerance_covers_the_cpus_activation_quantization() {
    let exec = cpu();
    let mut rows: Vec<(String, Worst)> = Vec::new();
    for qtype in TYPES {
        let mut worst = Worst::default();
        // The random suite: x [3, 256] in [-3, 3), 16 weight rows in
        // [-1, 1) (random.rs: `values`, `Kind::Quant`); many draws, where
        // the suite makes five per type.
        let (m, n, k) = (3, 16, 256);
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ qtype.ggml_id() as u64);
        for trial in 0..100 {
            let x: Vec<f32> = (0..m * k).map(|_| (3.0 * rng.unit()) as f32).collect();
            let wv: Vec<f32> = (0..n * k).map(|_| rng.unit() as f32).collect();
            product(
                &exec,
                &mut worst,
                &format!("{qtype} random #{trial}"),
                qtype,
                &x,
                &wv,
                (m, n, k),
            );
        }
        // quant_ops' qmatmul_op_gives_the_kernel_bits (and its other
        // products, whose samples are alike): 48 rows, x [3, 256], both in
        // [-1, 1).
        let (m, n, k) = (3, 48, 256);
        product(
            &exec,
            &mut worst,
            &format!("{qtype} quant_ops"),
            qtype,
            &lcg_values(m * k, 2),
            &lcg_values(n * k, 1),
            (m, n, k),
        );
        rows.push((format!("qmatmul_{}", qtype.name().to_lowercase()), worst));
    }
    fixtures(&mut rows);
    gated(&exec, &mut rows);
    let outside = report(&rows);
    assert!(outside.is_empty(), "{}", outside.join("\n"));
}

/// ggml_matmul's fixtures: llama.cpp's products (which the CPU gives bit
/// for bit) of N(0, 1) activations with 1% outliers times 8, and weights
/// N(0, 0.05), 576 and 1536 columns, up to 33 rows.
fn fixtures(rows: &mut [(String, Worst)]) {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../rustorch-conformance/fixtures/ggml_matmul");
    let f32s = |b: &[u8]| -> Vec<f32> {
        b.chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect()
    };
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .expect("the ggml_matmul fixtures")
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.ends_with(".bin"))
        .collect();
    names.sort();
    assert!(!names.is_empty());
    for name in names {
        let (ty, shape) = name.strip_suffix(".bin").unwrap().rsplit_once('_').unwrap();
        let (n, k) = shape.split_once('x').unwrap();
        let (n, k): (usize, usize) = (n.parse().unwrap(), k.parse().unwrap());
        let qtype = QType::parse(ty).unwrap();
        let bytes = std::fs::read(dir.join(&name)).unwrap();
        let x = f32s(&std::fs::read(dir.join(format!("x_{k}.f32"))).unwrap());
        let wlen = qtype.bytes_for(k).unwrap() * n;
        let deq = quant::dequantize(qtype, &bytes[4..4 + wlen], n * k).unwrap();
        let (want, bound) = exact(&x, &deq, 33, n, k);
        let op = format!("qmatmul_{}", qtype.name().to_lowercase());
        let tol = quant_tol::f32_path(&op).unwrap();
        let worst = &mut rows.iter_mut().find(|(o, _)| *o == op).unwrap().1;
        let mut at = 4 + wlen;
        for m in [1usize, 2, 3, 4, 5, 7, 8, 9, 16, 33] {
            let got = f32s(&bytes[at..at + 4 * m * n]);
            at += 4 * m * n;
            for i in 0..m * n {
                worst.add(tol, &format!("{name} m = {m}"), got[i] as f64, want[i], bound[i]);
            }
        }
    }
}

/// The random suite's gated products (Q4_0 gate, Q6_K up, x [3, 256] in
/// [-3, 3)), against the activation applied to the exact products; the
/// GPU's share is the activation's change over the products' f32 bounds
/// (plus a few ulp of its own f32 evaluation).
fn gated(exec: &Arc<Executor>, rows: &mut Vec<(String, Worst)>) {
    let (m, n, k) = (3, 16, 256);
    let silu = |g: f64| g / (1.0 + (-g).exp());
    let gelu = |g: f64| 0.5 * g * (1.0 + (0.7978845608028654 * (g + 0.044715 * g * g * g)).tanh());
    for act in [GateActivation::SwiGlu, GateActivation::GeGlu] {
        let op = match act {
            GateActivation::SwiGlu => "qmatmul_swiglu",
            GateActivation::GeGlu => "qmatmul_geglu",
        };
        let tol = quant_tol::f32_path(op).unwrap();
        let f = |g: f64, u: f64| match act {
            GateActivation::SwiGlu => silu(g) * u,
            GateActivation::GeGlu => gelu(g) * u,
        };
        let mut worst = Worst::default();
        let mut rng = Rng(0x2545_F491_4F6C_DD1D ^ op.len() as u64);
        for trial in 0..100 {
            let x: Vec<f32> = (0..m * k).map(|_| (3.0 * rng.unit()) as f32).collect();
            let gv: Vec<f32> = (0..n * k).map(|_| rng.unit() as f32).collect();
            let uv: Vec<f32> = (0..n * k).map(|_| rng.unit() as f32).collect();
            let (gb, ub) = (
                quant::quantize(QType::Q4_0, &gv).unwrap(),
                quant::quantize(QType::Q6K, &uv).unwrap(),
            );
            let (gd, ud) = (
                quant::dequantize(QType::Q4_0, &gb, n * k).unwrap(),
                quant::dequantize(QType::Q6K, &ub, n * k).unwrap(),
            );
            let gate = QWeight::from_bytes_in(exec, QType::Q4_0, n, k, gb).unwrap();
            let up = QWeight::from_bytes_in(exec, QType::Q6K, n, k, ub).unwrap();
            let xt = Tensor::from_storage_in(exec, CpuStorage::F32(x.clone()), [m, k]).unwrap();
            let got = xt.qmatmul_gated(&gate, &up, act).unwrap().to_vec::<f32>().unwrap();
            let ((g, gbnd), (u, ubnd)) = (exact(&x, &gd, m, n, k), exact(&x, &ud, m, n, k));
            for i in 0..m * n {
                let want = f(g[i], u[i]);
                let mut gpu: f64 = 0.0;
                for sg in [-1.0, 1.0] {
                    for su in [-1.0, 1.0] {
                        gpu = gpu.max((f(g[i] + sg * gbnd[i], u[i] + su * ubnd[i]) - want).abs());
                    }
                }
                gpu += 8.0 * U * want.abs();
                worst.add(tol, &format!("{op} random #{trial}"), got[i] as f64, want, gpu);
            }
        }
        rows.push((op.to_string(), worst));
    }
}
