//! softmax and log_softmax over one dimension, numerically stable: each
//! slice has its maximum subtracted before exponentiating.
//!
//! Over the last dimension (the common case) rows run in parallel and each
//! row takes three vectorized passes: the maximum, the exponentials fused
//! with their sum, and the scaling. Over another dimension, each outer
//! block is processed as `[len, inner]` rows combined column-wise.
//! f16 and bf16 compute in f32 and round once.

use super::acc::Elem;
use super::simd::{max_rows_f32, mul_rows_f32};
use super::{chunk_size, Geom};
use crate::cpu::copy::{input_slice, PAR_THRESHOLD};
use crate::cpu::vecmath::{exp_f32, max_f32};
use crate::cpu::{unsupported_dtype, CpuInput, CpuResult, CpuStorage, StorageElement};
use crate::dtype::DType;
use crate::op::Op;
use crate::simd_dispatch;
use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};
use rayon::prelude::*;

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
    let mut out = vec![T::default(); x.len()];
    if x.is_empty() {
        return Ok(vec![CpuStorage::from_vec(out)]);
    }
    let block = g.len * g.inner;
    if g.inner == 1 {
        let rows_per_task = chunk_size(g.outer, (PAR_THRESHOLD / 4 / g.len).max(1));
        let work = |(xs, os): (&[T], &mut [T])| {
            let mut scratch = Scratch::default();
            for (x, o) in xs.chunks(g.len).zip(os.chunks_mut(g.len)) {
                T::row(x, o, log, &mut scratch);
            }
        };
        let chunk = rows_per_task * g.len;
        if x.len() >= PAR_THRESHOLD {
            x.par_chunks(chunk)
                .zip(out.par_chunks_mut(chunk))
                .for_each(work);
        } else {
            work((&x[..], &mut out[..]));
        }
    } else {
        let work = |(xs, os): (&[T], &mut [T])| {
            let mut scratch = Scratch::default();
            T::block(xs, os, g.len, g.inner, log, &mut scratch);
        };
        if x.len() >= PAR_THRESHOLD && g.outer > 1 {
            x.par_chunks(block)
                .zip(out.par_chunks_mut(block))
                .for_each(work);
        } else {
            x.chunks(block).zip(out.chunks_mut(block)).for_each(work);
        }
    }
    Ok(vec![CpuStorage::from_vec(out)])
}

/// Reusable per-task buffers (f32 copies of f16/bf16 data, column sums).
#[derive(Default)]
struct Scratch {
    a: Vec<f32>,
    b: Vec<f32>,
    m: Vec<f32>,
    s: Vec<f32>,
    buf: Vec<f32>,
}

trait SoftmaxElem: StorageElement + Send + Sync {
    /// Softmax of one contiguous row into `out`.
    fn row(x: &[Self], out: &mut [Self], log: bool, scratch: &mut Scratch);
    /// Softmax over the rows of a `[len, inner]` block, per column.
    fn block(
        x: &[Self],
        out: &mut [Self],
        len: usize,
        inner: usize,
        log: bool,
        scratch: &mut Scratch,
    );
}

impl SoftmaxElem for f32 {
    fn row(x: &[f32], out: &mut [f32], log: bool, _: &mut Scratch) {
        row_f32(x, out, log);
    }
    fn block(x: &[f32], out: &mut [f32], len: usize, inner: usize, log: bool, s: &mut Scratch) {
        block_f32(x, out, len, inner, log, s);
    }
}

macro_rules! half_elem {
    ($t:ty) => {
        impl SoftmaxElem for $t {
            fn row(x: &[$t], out: &mut [$t], log: bool, s: &mut Scratch) {
                let xs = <$t as Elem>::load(x, &mut s.a);
                s.b.resize(xs.len(), 0.0);
                row_f32(xs, &mut s.b, log);
                out.convert_from_f32_slice(&s.b);
            }
            fn block(
                x: &[$t],
                out: &mut [$t],
                len: usize,
                inner: usize,
                log: bool,
                s: &mut Scratch,
            ) {
                let mut a = std::mem::take(&mut s.a);
                let mut b = std::mem::take(&mut s.b);
                let xs = <$t as Elem>::load(x, &mut a);
                b.resize(xs.len(), 0.0);
                block_f32(xs, &mut b, len, inner, log, s);
                out.convert_from_f32_slice(&b);
                s.a = a;
                s.b = b;
            }
        }
    };
}
half_elem!(f16);
half_elem!(bf16);

impl SoftmaxElem for f64 {
    fn row(x: &[f64], out: &mut [f64], log: bool, _: &mut Scratch) {
        let m = super::simd::max_f64(x);
        if log {
            let s: f64 = x.iter().map(|&v| (v - m).exp()).sum();
            let c = m + s.ln();
            out.iter_mut().zip(x).for_each(|(o, &v)| *o = v - c);
        } else {
            let mut s = 0.0;
            for (o, &v) in out.iter_mut().zip(x) {
                *o = (v - m).exp();
                s += *o;
            }
            let inv = 1.0 / s;
            out.iter_mut().for_each(|o| *o *= inv);
        }
    }
    fn block(x: &[f64], out: &mut [f64], len: usize, inner: usize, log: bool, _: &mut Scratch) {
        let mut line = vec![0.0; len];
        let mut res = vec![0.0; len];
        let mut none = Scratch::default();
        for j in 0..inner {
            for (i, l) in line.iter_mut().enumerate() {
                *l = x[i * inner + j];
            }
            Self::row(&line, &mut res, log, &mut none);
            for (i, r) in res.iter().enumerate() {
                out[i * inner + j] = *r;
            }
        }
    }
}

/// One f32 row: max, fused exp-and-sum, scale (or subtract, for log).
fn row_f32(x: &[f32], out: &mut [f32], log: bool) {
    let m = max_f32(x);
    if log {
        let c = m + exp_sum(x, m).ln();
        sub_scalar(x, out, c);
    } else {
        let s = exp_store_sum(x, out, m);
        scale(out, 1.0 / s);
    }
}

/// A `[len, inner]` f32 block, per column: the same three passes, each
/// combining whole rows so that the columns vectorize.
fn block_f32(x: &[f32], out: &mut [f32], len: usize, inner: usize, log: bool, s: &mut Scratch) {
    let rows = || x.chunks_exact(inner);
    s.m.clear();
    s.m.extend_from_slice(&x[..inner]);
    for r in rows().skip(1) {
        max_rows_f32(&mut s.m, r);
    }
    s.s.clear();
    s.s.resize(inner, 0.0);
    if log {
        for r in rows() {
            exp_acc_rows(r, &s.m, &mut s.s);
        }
        // c = m + ln(sum): the log-sum-exp of each column.
        s.buf.clear();
        s.buf
            .extend(s.m.iter().zip(&s.s).map(|(&m, &sum)| m + sum.ln()));
        for (r, o) in rows().zip(out.chunks_exact_mut(inner)) {
            sub_rows(r, &s.buf, o);
        }
    } else {
        for (r, o) in rows().zip(out.chunks_exact_mut(inner)) {
            exp_store_acc_rows(r, &s.m, o, &mut s.s);
        }
        s.s.iter_mut().for_each(|v| *v = 1.0 / *v);
        for o in out.chunks_exact_mut(inner).take(len) {
            mul_rows_f32(o, &s.s);
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
    /// `out[i] *= k`.
    fn scale(out: &mut [f32], k: f32) {
        for o in out.iter_mut() {
            *o *= k;
        }
    }
}

simd_dispatch! {
    /// `out[i] = x[i] - c`.
    fn sub_scalar(x: &[f32], out: &mut [f32], c: f32) {
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
    /// `out[j] = exp(x[j] - m[j])` and `s[j] += out[j]`.
    fn exp_store_acc_rows(x: &[f32], m: &[f32], out: &mut [f32], s: &mut [f32]) {
        for (((o, acc), &v), &mx) in out.iter_mut().zip(s.iter_mut()).zip(x).zip(m) {
            let e = exp_f32(v - mx);
            *o = e;
            *acc += e;
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
