//! Random inputs against the CPU: every `Op` variant, every dtype it takes, on contiguous and
//! strided layouts, run on the target and on a CPU-only executor; the results must agree within
//! the target's tolerance (exactly, for the CPU itself and for backends computing with its
//! kernels).
//!
//! Ops are run through `Executor::execute` with hand-made operands, so every layout a backend
//! can be given is reachable (transposed, narrowed, expanded with stride 0, stepped, with an
//! offset), and no tensor method stands between the op and the backend. A dtype that
//! `op::infer_outputs` rejects is not one the op takes and is skipped; a case the target's
//! `supports` declines is counted and listed, not failed. `variant` names every `Op` variant in
//! one exhaustive match, so a new variant does not compile until it is listed, and the group
//! fails if a listed variant produced no case.

use crate::Target;
use rustorch_core::executor::Operand;
use rustorch_core::op::{infer_outputs, BinaryOp, CmpOp, CpuHints, GateActivation, ReduceOp, UnaryOp};
use rustorch_core::quant::{self, QType};
use rustorch_core::{
    AttnMask, Buffer, Conv2dParams, CpuStorage, DType, Layout, Op, Pool2dParams, RopeLayout, Shape, TensorMeta, C64,
};
use std::collections::BTreeMap;

pub mod random_elementwise {
    pub const CASES: &[crate::Case] = &[("elementwise_ops_agree_with_the_cpu", super::elementwise)];
}
pub mod random_reduce {
    pub const CASES: &[crate::Case] = &[("reductions_agree_with_the_cpu", super::reduce)];
}
pub mod random_other {
    pub const CASES: &[crate::Case] = &[
        ("other_ops_agree_with_the_cpu", super::other),
        ("every_op_variant_is_covered", super::every_variant_is_covered),
    ];
}

/// What an input holds.
#[derive(Clone, Copy, Debug)]
enum Kind {
    /// Random values of the dtype under test.
    Same,
    /// Random values of a fixed dtype.
    Fixed(DType),
    /// Random values of a fixed dtype in [-1, 1), a third of `Fixed`'s
    /// range: a norm's weight at a model's scale, for products of long rows
    /// (with `Fixed`'s weights, products of 2048 values reach 3e4, past
    /// the sizes the backends' product tolerances are set for).
    Unit(DType),
    /// i64 indices in `0..bound`.
    Index(usize),
    /// A weight of `rows` x `cols` values quantized to `qtype`, as raw u8 blocks.
    Quant(QType, usize, usize),
    /// An f32 attention mask: 0, or -inf above the causal diagonal (`[T, L]`).
    CausalMask,
    /// A position: every element `value`, of an integer dtype.
    Position(i64, DType),
}

struct Spec {
    op: Op,
    inputs: Vec<(Vec<usize>, Kind)>,
}

fn spec(op: Op, inputs: &[(&[usize], Kind)]) -> Spec {
    Spec {
        op,
        inputs: inputs.iter().map(|(s, k)| (s.to_vec(), *k)).collect(),
    }
}

/// The ways an input's layout is built over its buffer.
#[derive(Clone, Copy, Debug, PartialEq)]
enum View {
    Contiguous,
    /// The last two dims swapped over a buffer in the other order.
    Transposed,
    /// Rows 2.. of a buffer with 3 more in dim 0 (an offset, and a larger buffer).
    Narrowed,
    /// Dim 0 broadcast from a buffer of one row (stride 0).
    Expanded,
    /// Every other element of the last dim, from offset 1.
    Stepped,
}

const VIEWS: [View; 5] = [
    View::Contiguous,
    View::Transposed,
    View::Narrowed,
    View::Expanded,
    View::Stepped,
];

/// Deterministic samples (xorshift64*), so a failure reproduces.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// Uniform in [-1, 1).
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 52) as f64 - 1.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// `n` random values of `dtype`: floats in [-3, 3), integers in [-5, 5) ([0, 10) for u8, with no
/// zero, so that integer division is defined), bools half and half.
fn values(rng: &mut Rng, dtype: DType, n: usize) -> CpuStorage {
    match dtype {
        DType::C64 => CpuStorage::C64(
            (0..n)
                .map(|_| C64::new(3.0 * rng.unit() as f32, 3.0 * rng.unit() as f32))
                .collect(),
        ),
        DType::Bool => CpuStorage::from_f64_iter(dtype, (0..n).map(|_| (rng.next() >> 63) as f64)),
        DType::U8 => CpuStorage::from_f64_iter(dtype, (0..n).map(|_| 1.0 + rng.below(9) as f64)),
        DType::I32 | DType::I64 => CpuStorage::from_f64_iter(
            dtype,
            (0..n).map(|_| {
                let v = rng.below(10) as f64 - 5.0;
                if v == 0.0 {
                    3.0
                } else {
                    v
                }
            }),
        ),
        _ => CpuStorage::from_f64_iter(dtype, (0..n).map(|_| 3.0 * rng.unit())),
    }
}

fn contiguous_strides(dims: &[usize]) -> Vec<usize> {
    let mut s = vec![1; dims.len()];
    for i in (0..dims.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * dims[i + 1];
    }
    s
}

/// The buffer's dims and the layout over it that shows `dims` through `view`, or `None` when the
/// view does not apply to this shape.
fn view_layout(dims: &[usize], view: View) -> Option<(Vec<usize>, Layout)> {
    let r = dims.len();
    let shape = Shape::from(dims.to_vec());
    match view {
        View::Contiguous => Some((dims.to_vec(), Layout::contiguous(shape))),
        View::Transposed if r >= 2 => {
            let mut p = dims.to_vec();
            p.swap(r - 1, r - 2);
            let l = Layout::contiguous(Shape::from(p.clone()))
                .transpose("view", -1, -2)
                .ok()?;
            Some((p, l))
        }
        View::Narrowed if r >= 1 => {
            let mut p = dims.to_vec();
            p[0] += 3;
            let l = Layout::contiguous(Shape::from(p.clone()))
                .narrow("view", 0, 2, dims[0])
                .ok()?;
            Some((p, l))
        }
        View::Expanded if r >= 1 && dims[0] > 1 => {
            let mut p = dims.to_vec();
            p[0] = 1;
            let mut strides = contiguous_strides(&p);
            strides[0] = 0;
            Some((p, Layout::from_parts(shape, strides, 0).ok()?))
        }
        View::Stepped if r >= 1 && dims[r - 1] > 0 => {
            let mut p = dims.to_vec();
            p[r - 1] *= 2;
            let mut strides = contiguous_strides(&p);
            strides[r - 1] = 2;
            Some((p, Layout::from_parts(shape, strides, 1).ok()?))
        }
        _ => None,
    }
}

/// One input's host data and layout.
fn make_input(rng: &mut Rng, dims: &[usize], kind: Kind, dtype: DType, view: View) -> (CpuStorage, Layout) {
    // Quantized blocks and masks keep their own layout: they are rows of bytes, or a pattern.
    let view = match kind {
        Kind::Quant(..) | Kind::CausalMask => View::Contiguous,
        _ => view,
    };
    let (pdims, layout) = view_layout(dims, view).unwrap_or_else(|| view_layout(dims, View::Contiguous).unwrap());
    let n: usize = pdims.iter().product();
    let storage = match kind {
        Kind::Same => values(rng, dtype, n),
        Kind::Fixed(d) => values(rng, d, n),
        Kind::Unit(d) => CpuStorage::from_f64_iter(d, (0..n).map(|_| rng.unit())),
        Kind::Index(bound) => CpuStorage::I64((0..n).map(|_| rng.below(bound) as i64).collect()),
        Kind::Quant(qtype, rows, cols) => {
            let v: Vec<f32> = (0..rows * cols).map(|_| rng.unit() as f32).collect();
            CpuStorage::U8(quant::quantize(qtype, &v).expect("a type with a quantizer"))
        }
        Kind::Position(value, d) => CpuStorage::from_f64_iter(d, (0..n).map(|_| value as f64)),
        Kind::CausalMask => {
            let (t, l) = (dims[0], dims[1]);
            CpuStorage::F32(
                (0..t * l)
                    .map(|k| if k % l <= k / l + l - t { 0.0 } else { f32::NEG_INFINITY })
                    .collect(),
            )
        }
    };
    (storage, layout)
}

/// Counts per op name: cases run, and cases declined with the dtypes declined.
#[derive(Default)]
struct Coverage {
    ran: BTreeMap<String, usize>,
    declined: BTreeMap<String, Vec<String>>,
}

/// The host values of a buffer, as f64 pairs (complex: re, im).
fn host_values(s: &CpuStorage) -> Vec<f64> {
    match s {
        CpuStorage::C64(v) => v.iter().flat_map(|c| [c.re as f64, c.im as f64]).collect(),
        s => s.to_f64_vec(),
    }
}

fn run_specs(tg: &Target, specs: &[Spec], group: &str) {
    let mut cov = Coverage::default();
    let mut failures = Vec::new();
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    for sp in specs {
        let name = sp.op.name();
        let takes_dtype = sp.inputs.iter().any(|(_, k)| matches!(k, Kind::Same));
        let dtypes: &[DType] = if takes_dtype { &DType::ALL } else { &[DType::F32] };
        for &dtype in dtypes {
            let metas: Vec<TensorMeta> = sp
                .inputs
                .iter()
                .map(|(dims, kind)| {
                    let d = match kind {
                        Kind::Same => dtype,
                        Kind::Fixed(d) | Kind::Unit(d) => *d,
                        Kind::Index(_) => DType::I64,
                        Kind::Quant(..) => DType::U8,
                        Kind::CausalMask => DType::F32,
                        Kind::Position(_, d) => *d,
                    };
                    TensorMeta::new(dims.clone(), d)
                })
                .collect();
            if infer_outputs(&sp.op, &metas).is_err() {
                continue; // not a dtype this op takes
            }
            if !tg.backend.supports(&sp.op, &metas) {
                cov.declined.entry(name.clone()).or_default().push(dtype.to_string());
                continue;
            }
            for view in VIEWS {
                let what = format!("{name} {dtype} {view:?} {:?}", sp.inputs);
                let inputs: Vec<(CpuStorage, Layout)> = sp
                    .inputs
                    .iter()
                    .zip(&metas)
                    .map(|((dims, kind), m)| make_input(&mut rng, dims, *kind, m.dtype, view))
                    .collect();
                if view != View::Contiguous && inputs.iter().all(|(_, l)| l.is_contiguous()) {
                    continue; // the view applies to none of these inputs
                }
                *cov.ran.entry(name.clone()).or_default() += 1;
                if let Err(e) = run_case(tg, &sp.op, &inputs, &what) {
                    eprintln!("{}: {e}", tg.name);
                    failures.push(what);
                }
            }
        }
    }
    let ran: usize = cov.ran.values().sum();
    let per_op: Vec<String> = cov
        .ran
        .iter()
        .map(|(op, n)| match cov.declined.get(op) {
            Some(d) => format!("{op} {n}/declined {}", d.len()),
            None => format!("{op} {n}"),
        })
        .collect();
    let declined_only: Vec<String> = cov
        .declined
        .iter()
        .filter(|(op, _)| !cov.ran.contains_key(*op))
        .map(|(op, d)| format!("{op} declined ({})", d.join(" ")))
        .collect();
    tg.note(format!(
        "{group}: {ran} random cases ran, {} declined; per op: {}{}{}",
        cov.declined.values().map(Vec::len).sum::<usize>(),
        per_op.join(", "),
        if declined_only.is_empty() { "" } else { "; " },
        declined_only.join(", ")
    ));
    // The CPU is the reference: it runs every case. Another backend may decline a whole
    // group for now (the note above lists what), but a group with nothing run and nothing
    // declined would be a suite that checks nothing.
    if tg.device.is_cpu() {
        assert!(
            cov.declined.is_empty(),
            "{group}: the CPU declined cases: {declined_only:?}"
        );
    }
    assert!(
        ran > 0 || !cov.declined.is_empty(),
        "{group}: no random case ran on {}",
        tg.name
    );
    assert!(
        failures.is_empty(),
        "{group}: {} random cases differ from the CPU:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// Runs one case on the target and on the CPU-only executor and compares.
fn run_case(tg: &Target, op: &Op, inputs: &[(CpuStorage, Layout)], what: &str) -> Result<(), String> {
    let on = |exec: &rustorch_core::Executor, device| -> Result<Vec<CpuStorage>, String> {
        let ops = inputs
            .iter()
            .map(|(s, l)| {
                Ok(Operand {
                    buffer: exec.upload(s.as_host(), device).map_err(|e| e.to_string())?,
                    layout: l.clone(),
                })
            })
            .collect::<Result<Vec<_>, String>>()?;
        let outs = exec.execute(op, &ops).map_err(|e| e.to_string())?;
        outs.iter()
            .map(|(b, _): &(Buffer, TensorMeta)| {
                if b.device() != device {
                    return Err(format!("an output lives on {}, not on {device}", b.device()));
                }
                exec.download(b).map_err(|e| e.to_string())
            })
            .collect()
    };
    let want = on(&tg.cpu, rustorch_core::Device::Cpu);
    tg.exec.clear_trace();
    let got = on(&tg.exec, tg.device);
    let events = tg.exec.trace();
    tg.exec.clear_trace();
    if let Some(e) = events.iter().find(|e| e.device != tg.device || !e.fallbacks.is_empty()) {
        return Err(format!("{what}: {} ran on {} ({:?})", e.op, e.device, e.fallbacks));
    }
    if got.is_ok() && !events.iter().any(|e| e.op == op.name()) {
        return Err(format!("{what}: the trace has no {} event", op.name()));
    }
    match (got, want) {
        // The reference rejects these inputs (an integer overflow, say): so must the target.
        (Err(_), Err(_)) => Ok(()),
        (Err(e), Ok(_)) => Err(format!("{what}: the target failed: {e}")),
        (Ok(_), Err(e)) => Err(format!("{what}: the target ran what the CPU rejects: {e}")),
        (Ok(got), Ok(want)) => {
            if got.len() != want.len() {
                return Err(format!("{what}: {} outputs, the CPU gives {}", got.len(), want.len()));
            }
            for (k, (g, w)) in got.iter().zip(&want).enumerate() {
                if g.dtype() != w.dtype() || g.len() != w.len() {
                    return Err(format!(
                        "{what}: output {k} is {} x {}, the CPU's {} x {}",
                        g.dtype(),
                        g.len(),
                        w.dtype(),
                        w.len()
                    ));
                }
                let tol = tg.tol(&op.name(), g.dtype());
                let (gv, wv) = (host_values(g), host_values(w));
                if let Some(i) = (0..gv.len()).find(|&i| !tol.accepts(gv[i], wv[i])) {
                    return Err(format!(
                        "{what}: output {k} element {i} is {} but the CPU gives {} (tolerance {tol:?})",
                        gv[i], wv[i]
                    ));
                }
            }
            Ok(())
        }
    }
}

const UNARY: [UnaryOp; 15] = [
    UnaryOp::Neg,
    UnaryOp::Abs,
    UnaryOp::Exp,
    UnaryOp::Log,
    UnaryOp::Sqrt,
    UnaryOp::Rsqrt,
    UnaryOp::Sin,
    UnaryOp::Cos,
    UnaryOp::Tanh,
    UnaryOp::Sigmoid,
    UnaryOp::Relu,
    UnaryOp::Gelu,
    UnaryOp::GeluTanh,
    UnaryOp::Silu,
    UnaryOp::Softplus,
];
const BINARY: [BinaryOp; 7] = [
    BinaryOp::Add,
    BinaryOp::Sub,
    BinaryOp::Mul,
    BinaryOp::Div,
    BinaryOp::Pow,
    BinaryOp::Maximum,
    BinaryOp::Minimum,
];
const CMP: [CmpOp; 6] = [CmpOp::Eq, CmpOp::Ne, CmpOp::Lt, CmpOp::Le, CmpOp::Gt, CmpOp::Ge];
const REDUCE: [ReduceOp; 9] = [
    ReduceOp::Sum,
    ReduceOp::Mean,
    ReduceOp::Max,
    ReduceOp::Min,
    ReduceOp::Prod,
    ReduceOp::ArgMax,
    ReduceOp::ArgMin,
    ReduceOp::Var { correction: 1 },
    ReduceOp::Std { correction: 0 },
];
/// The GGML types with a reference quantizer, whose products and lookups are checked.
const QTYPES: [QType; 17] = [
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

const S: Kind = Kind::Same;

fn elementwise_specs() -> Vec<Spec> {
    let mut v = vec![spec(Op::Copy, &[(&[3, 5], S)]), spec(Op::Copy, &[(&[2, 3, 4], S)])];
    for to in DType::ALL {
        v.push(spec(Op::Cast { to }, &[(&[4, 6], S)]));
    }
    for u in UNARY {
        v.push(spec(Op::Unary(u), &[(&[4, 6], S)]));
    }
    for (min, max) in [(Some(-1.0), Some(2.0)), (None, Some(0.5)), (Some(-0.5), None)] {
        v.push(spec(Op::Clamp { min, max }, &[(&[4, 6], S)]));
    }
    for b in BINARY {
        v.push(spec(Op::Binary(b), &[(&[4, 6], S), (&[4, 6], S)]));
        v.push(spec(Op::Binary(b), &[(&[3, 4, 6], S), (&[6], S)]));
    }
    for c in CMP {
        v.push(spec(Op::Compare(c), &[(&[4, 6], S), (&[4, 6], S)]));
        v.push(spec(Op::Compare(c), &[(&[4, 6], S), (&[4, 1], S)]));
    }
    v.push(spec(
        Op::Where,
        &[(&[4, 6], Kind::Fixed(DType::Bool)), (&[4, 6], S), (&[4, 6], S)],
    ));
    v.push(spec(Op::SwiGlu, &[(&[4, 40], S), (&[4, 40], S)]));
    v.push(spec(Op::GeGlu, &[(&[4, 40], S), (&[4, 40], S)]));
    v
}

fn reduce_specs() -> Vec<Spec> {
    let mut v = Vec::new();
    for op in REDUCE {
        for (dims, keepdim) in [(vec![1], false), (vec![0, 2], true), (vec![2], true)] {
            if matches!(op, ReduceOp::ArgMax | ReduceOp::ArgMin) && dims.len() > 1 {
                continue; // one dim at a time
            }
            v.push(spec(Op::Reduce { op, dims, keepdim }, &[(&[3, 4, 7], S)]));
        }
    }
    // Long rows, few of them: backends split such rows over several
    // workers (the CUDA backend over thread blocks) and join the parts.
    for op in REDUCE {
        if op != ReduceOp::Prod {
            v.push(spec(
                Op::Reduce {
                    op,
                    dims: vec![1],
                    keepdim: false,
                },
                &[(&[3, 70_000], S)],
            ));
        }
    }
    // Rows of every length class a backend may treat apart (a warp, a block,
    // more than a block holds).
    for n in [700, 3000, 9000] {
        v.push(spec(Op::Softmax { dim: 1 }, &[(&[6, n], S)]));
        v.push(spec(Op::LogSoftmax { dim: 1 }, &[(&[6, n], S)]));
    }
    // Sorts of rows longer than a GPU block sorts in shared memory.
    v.push(spec(
        Op::Sort {
            dim: 1,
            descending: false,
        },
        &[(&[2, 5000], S)],
    ));
    v.push(spec(
        Op::TopK {
            k: 5,
            dim: 1,
            largest: true,
        },
        &[(&[2, 5000], S)],
    ));
    for dim in [0, 1] {
        v.push(spec(Op::Softmax { dim }, &[(&[5, 7], S)]));
        v.push(spec(Op::LogSoftmax { dim }, &[(&[5, 7], S)]));
        v.push(spec(Op::Cumsum { dim }, &[(&[5, 7], S)]));
        v.push(spec(
            Op::Sort {
                dim,
                descending: dim == 0,
            },
            &[(&[5, 7], S)],
        ));
        for largest in [true, false] {
            v.push(spec(Op::TopK { k: 3, dim, largest }, &[(&[5, 7], S)]));
        }
    }
    v
}

fn other_specs() -> Vec<Spec> {
    let f32_ = Kind::Fixed(DType::F32);
    let f16_ = Kind::Fixed(DType::F16);
    let mut v = vec![
        spec(Op::MatMul, &[(&[5, 6], S), (&[6, 4], S)]),
        spec(Op::MatMul, &[(&[2, 3, 6], S), (&[6, 4], S)]),
        spec(Op::IndexSelect { dim: 1 }, &[(&[4, 6], S), (&[5], Kind::Index(6))]),
        spec(Op::Gather { dim: 0 }, &[(&[4, 6], S), (&[3, 6], Kind::Index(4))]),
        spec(
            Op::ScatterAdd { dim: 1 },
            &[(&[4, 6], S), (&[4, 3], Kind::Index(6)), (&[4, 3], S)],
        ),
        spec(Op::Embedding, &[(&[7, 5], S), (&[2, 3], Kind::Index(7))]),
        spec(Op::Cat { dim: 0 }, &[(&[2, 5], S), (&[3, 5], S)]),
        spec(Op::Cat { dim: 1 }, &[(&[3, 2], S), (&[3, 4], S), (&[3, 1], S)]),
        spec(
            Op::RmsNorm {
                eps: 1e-6,
                has_weight: true,
            },
            &[(&[3, 16], S), (&[16], S)],
        ),
        spec(
            Op::RmsNorm {
                eps: 1e-5,
                has_weight: false,
            },
            &[(&[3, 16], S)],
        ),
        // Rows a warp, a block, or more than a block holds (see softmax).
        spec(
            Op::RmsNorm {
                eps: 1e-6,
                has_weight: true,
            },
            &[(&[4, 700], S), (&[700], S)],
        ),
        spec(
            Op::RmsNorm {
                eps: 1e-6,
                has_weight: true,
            },
            &[(&[4, 3000], S), (&[3000], S)],
        ),
        spec(
            Op::RmsNorm {
                eps: 1e-6,
                has_weight: false,
            },
            &[(&[4, 9000], S)],
        ),
        // f32 only; rows a warp, a block, and more than a block holds.
        spec(
            Op::AddRmsNorm { eps: 1e-6 },
            &[(&[3, 16], f32_), (&[3, 16], f32_), (&[16], f32_)],
        ),
        spec(
            Op::AddRmsNorm { eps: 1e-5 },
            &[(&[4, 700], f32_), (&[4, 700], f32_), (&[700], f32_)],
        ),
        spec(
            Op::AddRmsNorm { eps: 1e-6 },
            &[(&[2, 9000], f32_), (&[2, 9000], f32_), (&[9000], f32_)],
        ),
        spec(
            Op::BatchNorm {
                eps: 1e-5,
                has_weight: true,
                has_bias: true,
            },
            &[
                (&[2, 3, 5], S),
                (&[3], S),
                (&[3], Kind::Fixed(DType::F32)),
                (&[3], S),
                (&[3], S),
            ],
        ),
        spec(
            Op::Rope {
                layout: RopeLayout::NeoX,
            },
            &[(&[2, 5, 8], S), (&[5, 4], S), (&[5, 4], S)],
        ),
        spec(
            Op::Rope {
                layout: RopeLayout::Interleaved,
            },
            &[(&[2, 5, 8], S), (&[5, 2], S), (&[5, 2], S)],
        ),
        spec(
            Op::CachedAttention { scale: 0.25 },
            &[
                (&[4, 3, 16], f32_),
                (&[2, 8, 16], f16_),
                (&[2, 16, 8], f16_),
                (&[3, 8], Kind::CausalMask),
            ],
        ),
        spec(
            Op::FlashAttention {
                scale: 0.25,
                cpu: CpuHints {
                    tiled_rows: 0,
                    kv_len: 8,
                    threads: 1,
                    ..CpuHints::default()
                },
            },
            &[
                (&[4, 3, 16], f32_),
                (&[2, 8, 16], f16_),
                (&[2, 8, 16], f16_),
                (&[3, 8], Kind::CausalMask),
            ],
        ),
        spec(
            Op::Conv1d {
                stride: 2,
                padding: 1,
                dilation: 1,
                groups: 1,
                has_bias: true,
            },
            &[(&[2, 3, 9], S), (&[4, 3, 3], S), (&[4], S)],
        ),
        spec(
            Op::Conv2d {
                params: Conv2dParams {
                    stride: [1, 2],
                    padding: [1, 0],
                    dilation: [1, 1],
                    groups: 2,
                },
                has_bias: false,
            },
            &[(&[2, 4, 5, 6], S), (&[4, 2, 3, 3], S)],
        ),
        spec(
            Op::ConvTranspose2d {
                params: Conv2dParams {
                    stride: [2, 1],
                    padding: [1, 0],
                    dilation: [1, 1],
                    groups: 1,
                },
                output_padding: [1, 0],
                has_bias: true,
            },
            &[(&[2, 3, 4, 4], S), (&[3, 2, 3, 2], S), (&[2], S)],
        ),
        spec(
            Op::MaxPool2d {
                params: Pool2dParams {
                    kernel: [2, 3],
                    stride: [2, 1],
                    padding: [1, 1],
                },
            },
            &[(&[2, 3, 5, 6], S)],
        ),
        spec(
            Op::AvgPool2d {
                params: Pool2dParams {
                    kernel: [3, 2],
                    stride: [1, 2],
                    padding: [1, 0],
                },
                count_include_pad: false,
            },
            &[(&[2, 3, 5, 6], S)],
        ),
    ];
    for has_bias in [true, false] {
        v.push(spec(
            Op::LayerNorm {
                eps: 1e-5,
                normalized_dims: 1,
                has_weight: true,
                has_bias,
            },
            &if has_bias {
                vec![(&[3, 16][..], S), (&[16][..], S), (&[16][..], S)]
            } else {
                vec![(&[3, 16][..], S), (&[16][..], S)]
            },
        ));
    }
    for mask in [AttnMask::None, AttnMask::Causal, AttnMask::CausalFromEnd] {
        v.push(spec(
            Op::Sdpa { mask, scale: None },
            &[(&[1, 4, 3, 8], S), (&[1, 2, 5, 8], S), (&[1, 2, 5, 6], S)],
        ));
    }
    v.push(spec(
        Op::Sdpa {
            mask: AttnMask::Explicit,
            scale: Some(0.3),
        },
        &[(&[1, 2, 3, 8], S), (&[1, 2, 5, 8], S), (&[1, 2, 5, 8], S), (&[3, 5], S)],
    ));
    v.extend(attention_at_specs());
    let (rows, cols) = (16, 256);
    for q in QTYPES {
        v.push(spec(
            Op::QMatMul {
                qtype: q,
                cpu: CpuHints::default(),
            },
            &[
                (&[3, cols], f32_),
                (&[rows, q.bytes_for(cols).unwrap()], Kind::Quant(q, rows, cols)),
            ],
        ));
        v.push(spec(
            Op::QEmbedding { qtype: q },
            &[
                (&[rows, q.bytes_for(cols).unwrap()], Kind::Quant(q, rows, cols)),
                (&[2, 3], Kind::Index(rows)),
            ],
        ));
    }
    let w = |q: QType| (vec![rows, q.bytes_for(cols).unwrap()], Kind::Quant(q, rows, cols));
    let (a, b) = (QType::Q4_0, QType::Q6K);
    v.push(Spec {
        op: Op::QMatMul {
            qtype: a,
            cpu: CpuHints {
                plain_weight_order: true,
                ..CpuHints::default()
            },
        },
        inputs: vec![(vec![2, cols], f32_), w(a)],
    });
    v.push(Spec {
        op: Op::QMatMuls { qtypes: vec![a, b, a] },
        inputs: vec![(vec![3, cols], f32_), w(a), w(b), w(a)],
    });
    for act in [GateActivation::SwiGlu, GateActivation::GeGlu] {
        v.push(Spec {
            op: Op::QMatMulGated { qtypes: [a, b], act },
            inputs: vec![(vec![3, cols], f32_), w(a), w(b)],
        });
    }
    // Prompt-sized flash attention (a GPU's batched paths take 64 rows and
    // more): head dims 64 and 128, grouped-query heads, row and key counts
    // that leave partial tiles, a causal mask that hides whole tiles.
    for (hq, hkv, t, l, d) in [(4usize, 2, 80, 96u32, 64), (2, 1, 130, 140, 128)] {
        v.push(spec(
            Op::FlashAttention {
                scale: 1.0 / (d as f32).sqrt(),
                cpu: CpuHints {
                    tiled_rows: 0,
                    kv_len: l,
                    threads: 1,
                    ..CpuHints::default()
                },
            },
            &[
                (&[hq, t, d], f32_),
                (&[hkv, l as usize, d], f16_),
                (&[hkv, l as usize, d], f16_),
                (&[t, l as usize], Kind::CausalMask),
            ],
        ));
    }
    // One activation row through Q and K of one type and V of another (a
    // Q4_K_M or Q5_K_M file's decode step: a GPU takes the three in one
    // launch).
    let wk = |q: QType, rows: usize| (vec![rows, q.bytes_for(cols).unwrap()], Kind::Quant(q, rows, cols));
    v.push(Spec {
        op: Op::QMatMuls {
            qtypes: vec![QType::Q4K, QType::Q4K, QType::Q6K],
        },
        inputs: vec![
            (vec![1, cols], f32_),
            wk(QType::Q4K, 40),
            wk(QType::Q4K, 8),
            wk(QType::Q6K, 8),
        ],
    });
    v.push(Spec {
        op: Op::QMatMuls {
            qtypes: vec![QType::Q5K, QType::Q5K, QType::Q6K],
        },
        inputs: vec![
            (vec![1, cols], f32_),
            wk(QType::Q5K, 24),
            wk(QType::Q5K, 8),
            wk(QType::Q6K, 16),
        ],
    });
    v.extend(add_rms_norm_then_specs());
    v
}

/// `Op::AddRmsNormThen`: a decode step's boundaries (one row; a GPU norms
/// the row inside the products' launch) with the K and 32-value activation
/// layouts, rows that are not whole 256-value blocks, float weights, mixed
/// types, and two rows (the parts, one by one).
fn add_rms_norm_then_specs() -> Vec<Spec> {
    let f32_ = Kind::Fixed(DType::F32);
    let w = |q: QType, rows: usize, cols: usize| (vec![rows, q.bytes_for(cols).unwrap()], Kind::Quant(q, rows, cols));
    let then = |op: Op| Op::AddRmsNormThen {
        eps: 1e-5,
        then: Box::new(op),
    };
    let head = |m: usize, k: usize| {
        // Rows of 2048 with `Fixed`'s norm weights give products past their
        // tolerance's range (`Kind::Unit`).
        let w = if k >= 1024 { Kind::Unit(DType::F32) } else { f32_ };
        vec![(vec![m, k], f32_), (vec![m, k], f32_), (vec![k], w)]
    };
    let many = |qtypes: Vec<QType>, m: usize, k: usize, rows: &[usize]| {
        let mut inputs = head(m, k);
        inputs.extend(qtypes.iter().zip(rows).map(|(&q, &r)| w(q, r, k)));
        Spec {
            op: then(Op::QMatMuls { qtypes }),
            inputs,
        }
    };
    let gated = |q: QType, act: GateActivation, m: usize, k: usize, rows: usize| {
        let mut inputs = head(m, k);
        inputs.extend([w(q, rows, k), w(q, rows, k)]);
        Spec {
            op: then(Op::QMatMulGated { qtypes: [q, q], act }),
            inputs,
        }
    };
    use QType::*;
    vec![
        many(vec![Q4K, Q4K, Q6K], 1, 512, &[40, 8, 8]),
        many(vec![Q8_0, Q8_0, Q8_0], 1, 96, &[24, 8, 8]),
        many(vec![Q5_0, Q5_0], 1, 576, &[33, 7]),
        many(vec![F16, F16, F16], 1, 256, &[20, 4, 4]),
        many(vec![Q4_0, Q6K], 2, 256, &[16, 8]),
        gated(Q4K, GateActivation::SwiGlu, 1, 512, 72),
        gated(Q8_0, GateActivation::GeGlu, 1, 160, 40),
        gated(F16, GateActivation::SwiGlu, 1, 256, 48),
        gated(Q6K, GateActivation::SwiGlu, 3, 256, 16),
        // Decode sizes: rows of 2048 half values (1024 f32), which a GPU may
        // read through other kernels than the short rows above (the CUDA
        // `_cp` entries), and more columns than a launch has warps.
        many(vec![F16, F16, F16], 1, 2048, &[2560, 1024, 1024]),
        gated(F16, GateActivation::SwiGlu, 1, 2048, 5000),
        gated(BF16, GateActivation::GeGlu, 1, 2048, 300),
        many(vec![F32, F32], 1, 1024, &[64, 40]),
    ]
}

/// `Op::AttentionAt`: q of each float dtype over caches of f32, f16 and
/// bf16, grouped-query heads, one and several query rows, windows, the
/// first and the last positions, caches that a GPU splits over several
/// blocks (600 and 9000 positions: 10 and 64 splits), head dims up to 256,
/// and positions outside the cache (both backends must refuse them).
fn attention_at_specs() -> Vec<Spec> {
    let at = |window: Option<usize>| Op::AttentionAt { scale: 0.125, window };
    let pos = |p: i64, d: DType| (vec![1], Kind::Position(p, d));
    let mut v = Vec::new();
    let i64_ = DType::I64;
    // (H, Hkv, T, N, D, Dv, window, cache dtype, pos, pos dtype)
    let cases = [
        (6, 2, 3, 40, 64, 32, None, DType::F16, 17, i64_),
        (6, 2, 1, 40, 64, 32, None, DType::F32, 0, DType::I32),
        (6, 2, 3, 40, 64, 64, Some(5), DType::BF16, 37, i64_),
        (6, 2, 3, 40, 64, 32, Some(2), DType::F32, 0, i64_),
        (4, 1, 2, 600, 128, 128, None, DType::F16, 598, i64_),
        (4, 4, 1, 600, 128, 64, Some(300), DType::BF16, 450, DType::I32),
        (8, 2, 1, 300, 256, 256, Some(129), DType::F32, 299, i64_),
        (2, 1, 2, 9000, 64, 64, None, DType::F16, 8990, i64_),
        (2, 1, 1, 9000, 64, 32, Some(1000), DType::F32, 5000, i64_),
        // Refused: past the end, negative, and a position that fits only
        // for fewer query rows.
        (6, 2, 3, 40, 64, 32, None, DType::F16, 38, i64_),
        (6, 2, 1, 40, 64, 32, Some(4), DType::F16, -1, DType::I32),
        (2, 1, 2, 600, 64, 32, None, DType::F32, 599, i64_),
    ];
    for (h, hkv, t, n, d, dv, window, cache, p, pd) in cases {
        v.push(Spec {
            op: at(window),
            inputs: vec![
                (vec![h, t, d], S),
                (vec![hkv, n, d], Kind::Fixed(cache)),
                (vec![hkv, n, dv], Kind::Fixed(cache)),
                pos(p, pd),
            ],
        });
    }
    v
}

/// Every `Op` variant by number: an exhaustive match, so that a new variant must be added here
/// (and given a case above) before this compiles.
fn variant(op: &Op) -> usize {
    match op {
        Op::Copy => 0,
        Op::Cast { .. } => 1,
        Op::Unary(_) => 2,
        Op::Clamp { .. } => 3,
        Op::Binary(_) => 4,
        Op::Compare(_) => 5,
        Op::Where => 6,
        Op::Reduce { .. } => 7,
        Op::Softmax { .. } => 8,
        Op::LogSoftmax { .. } => 9,
        Op::Cumsum { .. } => 10,
        Op::TopK { .. } => 11,
        Op::Sort { .. } => 12,
        Op::MatMul => 13,
        Op::QMatMul { .. } => 14,
        Op::QMatMuls { .. } => 15,
        Op::QMatMulGated { .. } => 16,
        Op::IndexSelect { .. } => 17,
        Op::Gather { .. } => 18,
        Op::ScatterAdd { .. } => 19,
        Op::Embedding => 20,
        Op::QEmbedding { .. } => 21,
        Op::Cat { .. } => 22,
        Op::LayerNorm { .. } => 23,
        Op::RmsNorm { .. } => 24,
        Op::BatchNorm { .. } => 25,
        Op::Rope { .. } => 26,
        Op::Sdpa { .. } => 27,
        Op::CachedAttention { .. } => 28,
        Op::FlashAttention { .. } => 29,
        Op::SwiGlu => 30,
        Op::GeGlu => 31,
        Op::Conv1d { .. } => 32,
        Op::Conv2d { .. } => 33,
        Op::ConvTranspose2d { .. } => 34,
        Op::MaxPool2d { .. } => 35,
        Op::AvgPool2d { .. } => 36,
        Op::AttentionAt { .. } => 37,
        Op::AddRmsNorm { .. } => 38,
        Op::AddRmsNormThen { .. } => 39,
    }
}
const VARIANTS: usize = 40;

fn elementwise(tg: &Target) {
    run_specs(tg, &elementwise_specs(), "elementwise");
}

fn reduce(tg: &Target) {
    run_specs(tg, &reduce_specs(), "reductions");
}

fn other(tg: &Target) {
    run_specs(tg, &other_specs(), "other ops");
}

/// Every variant has a spec, and every spec is an op `infer_outputs` accepts for some dtype (a
/// spec with bad shapes would silently check nothing).
fn every_variant_is_covered(_tg: &Target) {
    let mut seen = [false; VARIANTS];
    for sp in elementwise_specs().iter().chain(&reduce_specs()).chain(&other_specs()) {
        seen[variant(&sp.op)] = true;
        let valid = DType::ALL.iter().any(|&d| {
            let metas: Vec<TensorMeta> = sp
                .inputs
                .iter()
                .map(|(dims, k)| {
                    let dt = match k {
                        Kind::Same => d,
                        Kind::Fixed(x) | Kind::Unit(x) => *x,
                        Kind::Index(_) => DType::I64,
                        Kind::Quant(..) => DType::U8,
                        Kind::CausalMask => DType::F32,
                        Kind::Position(_, d) => *d,
                    };
                    TensorMeta::new(dims.clone(), dt)
                })
                .collect();
            infer_outputs(&sp.op, &metas).is_ok()
        });
        assert!(
            valid,
            "{} {:?}: no dtype makes these inputs valid",
            sp.op.name(),
            sp.inputs
        );
    }
    let missing: Vec<usize> = (0..VARIANTS).filter(|&i| !seen[i]).collect();
    assert!(missing.is_empty(), "Op variants without a random case: {missing:?}");
}
