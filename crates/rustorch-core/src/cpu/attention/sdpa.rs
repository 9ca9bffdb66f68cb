//! Scaled dot-product attention: `softmax(q k^T * scale + mask) v`.
//!
//! Each (batch, query head, query) row is independent, so rows run in
//! parallel; consecutive rows of a task share one key/value head, which
//! stays in cache. Per row: scores with `Real::dot` (the SIMD `dot_f32` for
//! f32 and half types), masking, a numerically stable softmax (subtract the
//! row maximum before exponentiating), then a weighted sum of value rows.
//! Half types compute in f32 and round once.
//!
//! Rows where every key is masked (an all-false bool mask row, an all -inf
//! float mask row, `CausalFromEnd` with more queries than keys, or no keys
//! at all) give zeros. That is what PyTorch 2.15 returns on the CPU for
//! such rows (its math reference would give NaN).

use crate::cpu::copy::input_slice;
use crate::cpu::norm::float::{acc_input, zeros, FloatElem, Real};
use crate::cpu::CpuInput;
use crate::dtype::DType;
use crate::error::BackendError;
use crate::layout::Layout;
use crate::op::{AttnMask, Op};
use crate::shape::Shape;
use rayon::prelude::*;
use std::borrow::Cow;

/// Below this many multiply-adds, stay on the calling thread.
const PAR_WORK: usize = 1 << 16;
/// Smallest amount of work (multiply-adds) worth a rayon task.
const TASK_WORK: usize = 1 << 15;

/// An explicit mask, broadcast to [B, Hq, Tq, Tk] through zero strides.
struct Mask<'a, A: Clone> {
    values: MaskValues<'a, A>,
    strides: [usize; 4],
}

enum MaskValues<'a, A: Clone> {
    /// True keeps a position.
    Keep(Cow<'a, [bool]>),
    /// Added to the scaled scores.
    Add(Cow<'a, [A]>),
}

fn load_mask<'a, T: FloatElem>(op: &Op, m: CpuInput<'a>, target: [usize; 4]) -> Result<Mask<'a, T::Acc>, BackendError> {
    let values = if m.dtype() == DType::Bool {
        MaskValues::Keep(input_slice::<bool>(op, m)?)
    } else {
        MaskValues::Add(acc_input::<T>(op, m)?)
    };
    let l = Layout::contiguous(m.layout.shape().clone())
        .broadcast_as("sdpa", &Shape::from(target))
        .map_err(|e| BackendError::invalid(op.name(), e.to_string()))?;
    let s = l.strides();
    Ok(Mask { values, strides: [s[0], s[1], s[2], s[3]] })
}

pub(super) fn sdpa<T: FloatElem>(
    op: &Op,
    inputs: &[CpuInput<'_>],
    mask: AttnMask,
    scale: Option<f64>,
) -> Result<Vec<T>, BackendError> {
    let (qd, kd, vd) = (inputs[0].dims(), inputs[1].dims(), inputs[2].dims());
    let (b, hq, tq, d) = (qd[0], qd[1], qd[2], qd[3]);
    let (hkv, tk, dv) = (kd[1], kd[2], vd[3]);
    let rows = b * hq * tq;
    let mut out = zeros::<T>(rows * dv);
    if out.is_empty() {
        return Ok(out);
    }
    if hkv == 0 || hq % hkv != 0 {
        return Err(BackendError::invalid(op.name(), "query heads must be a multiple of key/value heads"));
    }
    let group = hq / hkv;
    let q = acc_input::<T>(op, inputs[0])?;
    let k = acc_input::<T>(op, inputs[1])?;
    let v = acc_input::<T>(op, inputs[2])?;
    let explicit = match (mask, inputs.get(3)) {
        (AttnMask::Explicit, Some(m)) => Some(load_mask::<T>(op, *m, [b, hq, tq, tk])?),
        (AttnMask::Explicit, None) => return Err(BackendError::invalid(op.name(), "explicit mask input missing")),
        _ => None,
    };
    let scale = T::Acc::from_f64(scale.unwrap_or(1.0 / (d as f64).sqrt()));

    let row = |scratch: &mut (Vec<T::Acc>, Vec<T::Acc>), r: usize, out_row: &mut [T]| {
        let (scores, acc) = scratch;
        let (bi, h, i) = (r / (hq * tq), (r / tq) % hq, r % tq);
        let kv = (bi * hkv + h / group) * tk;
        // Keys this query may see: a prefix of 0..tk for the causal modes.
        let end = match mask {
            AttnMask::Causal => (i + 1).min(tk),
            AttnMask::CausalFromEnd => (i + 1 + tk).saturating_sub(tq).min(tk),
            AttnMask::None | AttnMask::Explicit => tk,
        };
        let scores = &mut scores[..end];
        let qr = &q[r * d..(r + 1) * d];
        for (j, s) in scores.iter_mut().enumerate() {
            *s = T::Acc::dot(qr, &k[(kv + j) * d..(kv + j + 1) * d]) * scale;
        }
        if let Some(m) = &explicit {
            let st = m.strides;
            let base = bi * st[0] + h * st[1] + i * st[2];
            match &m.values {
                MaskValues::Keep(keep) => {
                    for (j, s) in scores.iter_mut().enumerate() {
                        if !keep[base + j * st[3]] {
                            *s = T::Acc::NEG_INFINITY;
                        }
                    }
                }
                MaskValues::Add(add) => {
                    for (j, s) in scores.iter_mut().enumerate() {
                        *s += add[base + j * st[3]];
                    }
                }
            }
        }
        let mx = T::Acc::max(scores);
        if end == 0 || mx == T::Acc::NEG_INFINITY {
            return; // every key masked: the row stays zero
        }
        let sum = T::Acc::exp_sub_sum(scores, mx);
        let values = &v[kv * dv..(kv + end) * dv];
        match T::as_acc_mut(out_row) {
            Some(o) => weighted_sum(scores, values, sum, o),
            None => {
                acc.fill(T::Acc::ZERO);
                weighted_sum(scores, values, sum, acc);
                T::store_row(acc, out_row);
            }
        }
    };

    let scratch_dv = if T::as_acc(&[]).is_some() { 0 } else { dv };
    let init = || (vec![T::Acc::ZERO; tk], vec![T::Acc::ZERO; scratch_dv]);
    let row_work = tk * (d + dv) + 1;
    if rows * row_work >= PAR_WORK {
        out.par_chunks_mut(dv)
            .enumerate()
            .with_min_len((TASK_WORK / row_work).max(1))
            .for_each_init(init, |s, (r, o)| row(s, r, o));
    } else {
        let mut s = init();
        for (r, o) in out.chunks_mut(dv).enumerate() {
            row(&mut s, r, o);
        }
    }
    Ok(out)
}

/// `out += sum_j p_j v_j / sum` over the value rows `values` ([len(p), Dv]);
/// `out` starts at zero.
fn weighted_sum<A: Real>(p: &[A], values: &[A], sum: A, out: &mut [A]) {
    let dv = out.len();
    for (&w, vr) in p.iter().zip(values.chunks_exact(dv)) {
        // Masked keys have weight exactly 0: skip their value rows.
        if w != A::ZERO {
            A::axpy(w, vr, out);
        }
    }
    A::scale(out, A::ONE / sum);
}
