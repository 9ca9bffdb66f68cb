//! Float reductions must give bit-identical results for equal inputs: the
//! same values, shape and layout give the same bits whatever the number of
//! threads, the thread a reduction runs on, or where in memory its input
//! (or a gathered copy of a strided input) happens to sit. The conformance
//! suite compares CPU runs exactly, and results must match llama.cpp's.

use half::{bf16, f16};
use rustorch_core::op::ReduceOp;
use rustorch_core::{DType, Layout, Op, TensorMeta};
use rustorch_cpu::{CpuBackend, CpuInput, CpuStorage};

const OPS: [ReduceOp; 8] = [
    ReduceOp::Sum,
    ReduceOp::Mean,
    ReduceOp::Prod,
    ReduceOp::Var { correction: 1 },
    ReduceOp::Std { correction: 0 },
    ReduceOp::Max,
    ReduceOp::Min,
    ReduceOp::ArgMax,
];
const DTYPES: [DType; 4] = [DType::F32, DType::F64, DType::F16, DType::BF16];

/// Values in [0.98, 1.02) (xorshift), so that products of many of them
/// neither overflow nor vanish, while sums still round at every step.
fn values(dtype: DType, n: usize, seed: u64) -> CpuStorage {
    let mut s = seed | 1;
    let v = (0..n).map(|_| {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        1.0 + 0.02 * ((s >> 11) as f64 / (1u64 << 53) as f64 - 0.5)
    });
    match dtype {
        DType::F32 => CpuStorage::F32(v.map(|x| x as f32).collect()),
        DType::F64 => CpuStorage::F64(v.collect()),
        DType::F16 => CpuStorage::F16(v.map(f16::from_f64).collect()),
        DType::BF16 => CpuStorage::BF16(v.map(bf16::from_f64).collect()),
        _ => unreachable!("float dtypes only"),
    }
}

fn strides(dims: &[usize]) -> Vec<usize> {
    let mut s = vec![1; dims.len()];
    for i in (0..dims.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * dims[i + 1];
    }
    s
}

/// One input: its storage and a layout over it showing `dims`.
struct Input {
    what: String,
    storage: CpuStorage,
    layout: Layout,
}

/// `dims` seen contiguously, expanded (dim 0 broadcast, stride 0), stepped
/// (every other element of the last dim, from offset 1) and transposed.
fn inputs(dtype: DType, dims: &[usize]) -> Vec<Input> {
    let n: usize = dims.iter().product();
    let r = dims.len();
    let mut v = vec![Input {
        what: format!("{dtype:?} {dims:?} contiguous"),
        storage: values(dtype, n, 7),
        layout: Layout::contiguous(dims.to_vec()),
    }];
    let mut one = dims.to_vec();
    one[0] = 1;
    let mut st = strides(&one);
    st[0] = 0;
    v.push(Input {
        what: format!("{dtype:?} {dims:?} expanded"),
        storage: values(dtype, n / dims[0], 11),
        layout: Layout::from_parts(dims.to_vec().into(), st, 0).unwrap(),
    });
    let mut wide = dims.to_vec();
    wide[r - 1] *= 2;
    let mut st = strides(&wide);
    st[r - 1] = 2;
    v.push(Input {
        what: format!("{dtype:?} {dims:?} stepped"),
        storage: values(dtype, 2 * n, 13),
        layout: Layout::from_parts(dims.to_vec().into(), st, 1).unwrap(),
    });
    if r >= 2 {
        let mut swapped = dims.to_vec();
        swapped.swap(r - 1, r - 2);
        v.push(Input {
            what: format!("{dtype:?} {dims:?} transposed"),
            storage: values(dtype, n, 17),
            layout: Layout::contiguous(swapped).transpose("t", -1, -2).unwrap(),
        });
    }
    v
}

/// The result's bits (f64 holds every value of the narrower types exactly).
fn reduce_bits(input: &Input, op: ReduceOp, dims: &[usize]) -> Vec<u64> {
    let kept: Vec<usize> = (0..input.layout.rank())
        .filter(|d| !dims.contains(d))
        .map(|d| input.layout.dims()[d])
        .collect();
    let dtype = if op == ReduceOp::ArgMax {
        DType::I64
    } else {
        input.storage.dtype()
    };
    let op = Op::Reduce {
        op,
        dims: dims.to_vec(),
        keepdim: false,
    };
    let run = [CpuInput {
        storage: &input.storage,
        layout: &input.layout,
    }];
    let out = CpuBackend::run(&op, &run, &[TensorMeta::new(kept, dtype)]).expect("reduction runs");
    out[0].to_f64_vec().iter().map(|x| x.to_bits()).collect()
}

/// Every (input, op, reduced dims) of `shapes`, with the reduced dims sets
/// `dims_of(shape)`.
fn cases(shapes: &[(&[usize], &[&[usize]])]) -> Vec<(Input, ReduceOp, Vec<usize>)> {
    let mut v = Vec::new();
    for &(shape, dim_sets) in shapes {
        for dtype in DTYPES {
            for input in inputs(dtype, shape) {
                for op in OPS {
                    for &dims in dim_sets {
                        if op == ReduceOp::ArgMax && dims.len() > 1 {
                            continue;
                        }
                        v.push((clone_input(&input), op, dims.to_vec()));
                    }
                }
            }
        }
    }
    v
}

fn clone_input(i: &Input) -> Input {
    Input {
        what: i.what.clone(),
        storage: i.storage.clone(),
        layout: i.layout.clone(),
    }
}

/// Small inputs (one thread does them), repeated from several threads at
/// once: a strided input is gathered into a fresh buffer each time, at an
/// address that depends on the thread's allocator state.
#[test]
fn small_reductions_repeat_bit_for_bit_across_threads() {
    let all = cases(&[
        (&[3, 4, 37], &[&[2], &[0], &[1], &[0, 2], &[0, 1, 2]]),
        (&[5, 203], &[&[1], &[0], &[0, 1]]),
    ]);
    let want: Vec<Vec<u64>> = all.iter().map(|(i, op, d)| reduce_bits(i, *op, d)).collect();
    std::thread::scope(|s| {
        for t in 0..4 {
            let (all, want) = (&all, &want);
            s.spawn(move || {
                for rep in 0..200 {
                    // Allocations of varying sizes between the runs move the
                    // next gathered buffer around.
                    let junk = vec![0u8; 16 * ((t * 7 + rep * 3) % 13) + 8];
                    for ((input, op, dims), want) in all.iter().zip(want) {
                        let got = reduce_bits(input, *op, dims);
                        assert_eq!(
                            &got, want,
                            "{} {op:?} over {dims:?}: run {rep} on thread {t} differs",
                            input.what
                        );
                    }
                    drop(junk);
                }
            });
        }
    });
}

/// The same contiguous values at every alignment (behind 0 to 31 elements
/// of padding, so the layout differs only in its offset): a reduction must
/// not group its additions by the address of its data.
#[test]
fn reductions_do_not_depend_on_alignment() {
    for dtype in DTYPES {
        for len in [1usize, 7, 37, 64, 203, 1000, 5000] {
            let data = values(dtype, len, 5);
            let base = Input {
                what: format!("{dtype:?} [{len}]"),
                storage: data.clone(),
                layout: Layout::contiguous([len]),
            };
            for op in OPS {
                let want = reduce_bits(&base, op, &[0]);
                for offset in 1..32 {
                    let shifted = Input {
                        what: format!("{dtype:?} [{len}] at offset {offset}"),
                        storage: pad_front(&data, offset),
                        layout: Layout::contiguous_with_offset([len], offset),
                    };
                    assert_eq!(reduce_bits(&shifted, op, &[0]), want, "{} {op:?}", shifted.what);
                }
            }
        }
    }
}

/// `s` behind `pad` leading zeros.
fn pad_front(s: &CpuStorage, pad: usize) -> CpuStorage {
    fn pad_vec<T: Copy + Default>(v: &[T], pad: usize) -> Vec<T> {
        let mut out = vec![T::default(); pad];
        out.extend_from_slice(v);
        out
    }
    match s {
        CpuStorage::F32(v) => CpuStorage::F32(pad_vec(v, pad)),
        CpuStorage::F64(v) => CpuStorage::F64(pad_vec(v, pad)),
        CpuStorage::F16(v) => CpuStorage::F16(pad_vec(v, pad)),
        CpuStorage::BF16(v) => CpuStorage::BF16(pad_vec(v, pad)),
        _ => unreachable!("float dtypes only"),
    }
}

/// Inputs large enough to be split over threads, in rayon pools of
/// different sizes: the split may follow the thread count, the grouping of
/// the additions may not.
#[test]
fn large_reductions_do_not_depend_on_thread_count() {
    let all = cases(&[
        // One long row, and two: split within rows.
        (&[600_000], &[&[0]]),
        (&[2, 300_000], &[&[1], &[0, 1]]),
        // Few outer blocks over a long reduced dim: split over rows.
        (&[1 << 16, 8], &[&[0]]),
        (&[4, 1 << 14, 16], &[&[1]]),
    ]);
    let want: Vec<Vec<u64>> = all.iter().map(|(i, op, d)| reduce_bits(i, *op, d)).collect();
    for threads in [1, 2, 3, 5, 8, 16] {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
        for _ in 0..2 {
            for ((input, op, dims), want) in all.iter().zip(&want) {
                let got = pool.install(|| reduce_bits(input, *op, dims));
                assert_eq!(
                    &got, want,
                    "{} {op:?} over {dims:?}: {threads} threads differ from the global pool",
                    input.what
                );
            }
        }
    }
}
