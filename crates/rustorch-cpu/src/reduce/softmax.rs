//! softmax and log_softmax over one dimension, numerically stable: each
//! slice has its maximum subtracted before exponentiating.
//!
//! Over the last dimension (the common case) rows run in parallel and each
//! row takes three vectorized passes: the maximum, the exponentials fused
//! with their sum (into an L1-resident scratch row), and the scaling that
//! writes the output. Over another dimension, each outer block is
//! processed as `[len, inner]` rows combined column-wise, recomputing the
//! exponentials in the last pass instead of storing them.
//! f16 and bf16 compute in f32 and round once.

use super::acc::Elem;
use super::simd::{exp_f32, f32_to_bf16, f32_to_f16, max_f32, max_f64, max_rows_f32};
use super::{chunk_size, fill_chunks, Geom, PAR_SOFTMAX};
use crate::copy::input_slice;
use crate::simd_dispatch;
use crate::{unsupported_dtype, CpuInput, CpuResult, CpuStorage, StorageElement};
use half::{bf16, f16};
use rustorch_core::dtype::DType;
use rustorch_core::op::Op;
use std::mem::MaybeUninit;

pub(super) fn softmax(op: &Op, input: CpuInput<'_>, dim: usize, log: bool) -> CpuResult {
    let g = Geom::around(op, input.dims(), dim)?;
    match input.dtype() {
        DType::F32 => run::<f32>(op, input, g, log),
        DType::F16 => run::<f16>(op, input, g, log),
        DType::BF16 => run::<bf16>(op, input, g, log),
        DType::F64 => run::<f64>(op, input, g, log),
        d => Err(unsupported_dtype(op, d)),
    }
}

fn run<T: SoftmaxElem>(op: &Op, input: CpuInput<'_>, g: Geom, log: bool) -> CpuResult {
    let x = input_slice::<T>(op, input)?;
    let n = x.len();
    if n == 0 {
        return Ok(vec![CpuStorage::from_vec(Vec::<T>::new())]);
    }
    let block = g.len * g.inner;
    let out = if g.inner == 1 {
        let rows_per_task = chunk_size(g.outer, (PAR_SOFTMAX / 4 / g.len).max(1));
        fill_chunks(n, rows_per_task * g.len, n >= PAR_SOFTMAX, |start, os| {
            let mut scratch = Scratch::default();
            let xs = &x[start..start + os.len()];
            for (xr, or) in xs.chunks(g.len).zip(os.chunks_mut(g.len)) {
                T::row(xr, or, log, &mut scratch);
            }
        })
    } else {
        fill_chunks(n, block, n >= PAR_SOFTMAX && g.outer > 1, |start, os| {
            let mut scratch = Scratch::default();
            T::block(&x[start..start + os.len()], os, g.len, g.inner, log, &mut scratch);
        })
    };
    Ok(vec![CpuStorage::from_vec(out)])
}

/// Reusable per-task buffers.
#[derive(Default)]
struct Scratch {
    /// The input as f32 (f16/bf16 only).
    x: Vec<f32>,
    /// Exponentials of a row, or one output row before narrowing.
    tmp: Vec<f32>,
    /// Column maxima and sums (or log-sum-exps) of a block.
    m: Vec<f32>,
    s: Vec<f32>,
    f64: Vec<f64>,
}

trait SoftmaxElem: StorageElement + Send + Sync {
    /// Softmax of one contiguous row; writes every element of `out`.
    fn row(x: &[Self], out: &mut [MaybeUninit<Self>], log: bool, s: &mut Scratch);
    /// Softmax over the rows of a `[len, inner]` block, per column; writes
    /// every element of `out`.
    fn block(x: &[Self], out: &mut [MaybeUninit<Self>], len: usize, inner: usize, log: bool, s: &mut Scratch);
}

impl SoftmaxElem for f32 {
    fn row(x: &[f32], out: &mut [MaybeUninit<f32>], log: bool, s: &mut Scratch) {
        if !log && crate::vecmath::softmax_row_avx512(x, out) {
            return;
        }
        let m = max_f32(x);
        if log {
            let c = m + exp_sum(x, m).ln();
            shift_store(x, c, out);
        } else {
            s.tmp.resize(x.len(), 0.0);
            let sum = exp_store_sum(x, &mut s.tmp, m);
            scale_store(&s.tmp, 1.0 / sum, out);
        }
    }
    fn block(x: &[f32], out: &mut [MaybeUninit<f32>], len: usize, inner: usize, log: bool, s: &mut Scratch) {
        block_f32(x, len, inner, log, s, |i, row| {
            store_f32(row, &mut out[i * inner..(i + 1) * inner])
        });
    }
}

macro_rules! half_elem {
    ($t:ty) => {
        impl SoftmaxElem for $t {
            fn row(x: &[$t], out: &mut [MaybeUninit<$t>], log: bool, s: &mut Scratch) {
                let xs = <$t as Elem>::load(x, &mut s.x);
                let m = max_f32(xs);
                s.tmp.resize(xs.len(), 0.0);
                if log {
                    let c = m + exp_sum(xs, m).ln();
                    shift(xs, c, &mut s.tmp);
                } else {
                    let sum = exp_store_sum(xs, &mut s.tmp, m);
                    scale(&mut s.tmp, 1.0 / sum);
                }
                <$t as Narrow>::narrow(&s.tmp, out);
            }
            fn block(x: &[$t], out: &mut [MaybeUninit<$t>], len: usize, inner: usize, log: bool, s: &mut Scratch) {
                let mut xs = std::mem::take(&mut s.x);
                let xf = <$t as Elem>::load(x, &mut xs);
                block_f32(xf, len, inner, log, s, |i, row| {
                    <$t as Narrow>::narrow(row, &mut out[i * inner..(i + 1) * inner])
                });
                s.x = xs;
            }
        }
    };
}
half_elem!(f16);
half_elem!(bf16);

/// Rounds f32 results into f16/bf16 outputs (vectorized).
trait Narrow: Sized {
    fn narrow(src: &[f32], out: &mut [MaybeUninit<Self>]);
}
impl Narrow for f16 {
    fn narrow(src: &[f32], out: &mut [MaybeUninit<f16>]) {
        f32_to_f16(src, out)
    }
}
impl Narrow for bf16 {
    fn narrow(src: &[f32], out: &mut [MaybeUninit<bf16>]) {
        f32_to_bf16(src, out)
    }
}

impl SoftmaxElem for f64 {
    fn row(x: &[f64], out: &mut [MaybeUninit<f64>], log: bool, s: &mut Scratch) {
        let m = max_f64(x);
        if log {
            let sum: f64 = x.iter().map(|&v| (v - m).exp()).sum();
            let c = m + sum.ln();
            out.iter_mut().zip(x).for_each(|(o, &v)| {
                o.write(v - c);
            });
        } else {
            s.f64.clear();
            s.f64.extend(x.iter().map(|&v| (v - m).exp()));
            let inv = 1.0 / s.f64.iter().sum::<f64>();
            out.iter_mut().zip(&s.f64).for_each(|(o, &e)| {
                o.write(e * inv);
            });
        }
    }
    fn block(x: &[f64], out: &mut [MaybeUninit<f64>], len: usize, inner: usize, log: bool, s: &mut Scratch) {
        // Rare enough to go column by column through a gathered line.
        let mut line = vec![0.0; len];
        let mut res: Vec<MaybeUninit<f64>> = vec![MaybeUninit::new(0.0); len];
        for j in 0..inner {
            for (i, l) in line.iter_mut().enumerate() {
                *l = x[i * inner + j];
            }
            Self::row(&line, &mut res, log, s);
            for (i, r) in res.iter().enumerate() {
                out[i * inner + j] = *r;
            }
        }
    }
}

/// A `[len, inner]` f32 block, per column: column maxima, then sums of
/// exponentials, then each output row computed into a scratch row and
/// handed to `store(row_index, values)`.
fn block_f32(x: &[f32], len: usize, inner: usize, log: bool, s: &mut Scratch, mut store: impl FnMut(usize, &[f32])) {
    let rows = || x.chunks_exact(inner).take(len);
    s.m.clear();
    s.m.extend_from_slice(&x[..inner]);
    for r in rows().skip(1) {
        max_rows_f32(&mut s.m, r);
    }
    s.s.clear();
    s.s.resize(inner, 0.0);
    for r in rows() {
        exp_acc_rows(r, &s.m, &mut s.s);
    }
    s.tmp.resize(inner, 0.0);
    if log {
        // c = m + ln(sum): each column's log-sum-exp.
        for (c, &m) in s.s.iter_mut().zip(&s.m) {
            *c = m + c.ln();
        }
        for (i, r) in rows().enumerate() {
            sub_rows(r, &s.s, &mut s.tmp);
            store(i, &s.tmp);
        }
    } else {
        s.s.iter_mut().for_each(|v| *v = 1.0 / *v);
        for (i, r) in rows().enumerate() {
            exp_scale_rows(r, &s.m, &s.s, &mut s.tmp);
            store(i, &s.tmp);
        }
    }
}

simd_dispatch! {
    /// `out[i] = exp(x[i] - m)`; returns the sum of the `out[i]`.
    fn exp_store_sum(x: &[f32], out: &mut [f32], m: f32) -> f32 {
        let mut acc = [0f32; 16];
        let n = x.len().min(out.len());
        let (x, out) = (&x[..n], &mut out[..n]);
        let mut xc = x.chunks_exact(16);
        let mut oc = out.chunks_exact_mut(16);
        for (c, o) in (&mut xc).zip(&mut oc) {
            for i in 0..16 {
                let e = exp_f32(c[i] - m);
                o[i] = e;
                acc[i] += e;
            }
        }
        let mut s = acc.iter().sum::<f32>();
        for (&v, o) in xc.remainder().iter().zip(oc.into_remainder()) {
            *o = exp_f32(v - m);
            s += *o;
        }
        s
    }
}

simd_dispatch! {
    /// Sum of `exp(x[i] - m)`.
    fn exp_sum(x: &[f32], m: f32) -> f32 {
        let mut acc = [0f32; 16];
        let xc = x.chunks_exact(16);
        let rest = xc.remainder();
        for c in xc {
            for i in 0..16 {
                acc[i] += exp_f32(c[i] - m);
            }
        }
        let mut s = acc.iter().sum::<f32>();
        for &v in rest {
            s += exp_f32(v - m);
        }
        s
    }
}

simd_dispatch! {
    /// `out[i] = src[i] * k`, written once into the output.
    fn scale_store(src: &[f32], k: f32, out: &mut [MaybeUninit<f32>]) {
        for (o, &v) in out.iter_mut().zip(src) {
            o.write(v * k);
        }
    }
}

simd_dispatch! {
    /// `out[i] = x[i] - c`, written once into the output.
    fn shift_store(x: &[f32], c: f32, out: &mut [MaybeUninit<f32>]) {
        for (o, &v) in out.iter_mut().zip(x) {
            o.write(v - c);
        }
    }
}

simd_dispatch! {
    /// Copies f32 values into the output.
    fn store_f32(src: &[f32], out: &mut [MaybeUninit<f32>]) {
        for (o, &v) in out.iter_mut().zip(src) {
            o.write(v);
        }
    }
}

simd_dispatch! {
    /// `xs[i] *= k`.
    fn scale(xs: &mut [f32], k: f32) {
        for v in xs.iter_mut() {
            *v *= k;
        }
    }
}

simd_dispatch! {
    /// `out[i] = x[i] - c`.
    fn shift(x: &[f32], c: f32, out: &mut [f32]) {
        for (o, &v) in out.iter_mut().zip(x) {
            *o = v - c;
        }
    }
}

simd_dispatch! {
    /// `s[j] += exp(x[j] - m[j])`.
    fn exp_acc_rows(x: &[f32], m: &[f32], s: &mut [f32]) {
        for ((acc, &v), &mx) in s.iter_mut().zip(x).zip(m) {
            *acc += exp_f32(v - mx);
        }
    }
}

simd_dispatch! {
    /// `out[j] = exp(x[j] - m[j]) * inv[j]`.
    fn exp_scale_rows(x: &[f32], m: &[f32], inv: &[f32], out: &mut [f32]) {
        for (((o, &v), &mx), &k) in out.iter_mut().zip(x).zip(m).zip(inv) {
            *o = exp_f32(v - mx) * k;
        }
    }
}

simd_dispatch! {
    /// `out[j] = x[j] - c[j]`.
    fn sub_rows(x: &[f32], c: &[f32], out: &mut [f32]) {
        for ((o, &v), &cc) in out.iter_mut().zip(x).zip(c) {
            *o = v - cc;
        }
    }
}
