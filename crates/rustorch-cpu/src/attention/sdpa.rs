//! Scaled dot-product attention: `softmax(q k^T * scale + mask) v`.
//!
//! Work is split by (batch, key/value head, query position): one task
//! handles the `group = Hq / Hkv` query heads that share a key/value head,
//! so every key and value row is loaded once for the whole group and then
//! reused from L1 cache (grouped-query attention would otherwise stream the
//! same keys from memory `group` times). Tasks run in parallel.
//!
//! Per query row: scores four keys at a time with `Real::dot4`, whose four
//! independent accumulator chains run about four times faster than single
//! `dot_f32` calls, which wait on one chain (`dot_f32` takes the last few
//! keys); masking; a numerically stable softmax (subtract the row maximum
//! before exponentiating); then the weighted sum of value rows, four at a
//! time. Half types compute in f32 and round once.
//!
//! Rows where every key is masked (an all-false bool mask row, an all -inf
//! float mask row, `CausalFromEnd` with more queries than keys, or no keys
//! at all) give zeros. That is what PyTorch 2.15 returns on the CPU for
//! such rows (its math reference would give NaN).

use crate::copy::{gather, input_slice};
use crate::norm::float::{acc_input, FloatElem, Real};
use crate::norm::rows::{self, Split};
use crate::CpuInput;
use rustorch_core::dtype::{DType, WithDType};
use rustorch_core::error::BackendError;
use rustorch_core::layout::Layout;
use rustorch_core::op::{AttnMask, Op};
use rustorch_core::shape::Shape;
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
    Ok(Mask {
        values,
        strides: [s[0], s[1], s[2], s[3]],
    })
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
    if b * hq * tq * dv == 0 {
        return Ok(Vec::new());
    }
    if hkv == 0 || !hq.is_multiple_of(hkv) {
        return Err(BackendError::invalid(
            op.name(),
            "query heads must be a multiple of key/value heads",
        ));
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
    let ctx = Ctx {
        q: &q,
        k: &k,
        v: &v,
        mask: explicit.as_ref(),
        mode: mask,
        scale: T::Acc::from_f64(scale.unwrap_or(1.0 / (d as f64).sqrt())),
        dims: Dims {
            hq,
            hkv,
            tq,
            tk,
            d,
            dv,
            group,
        },
    };

    // The output is built as [B, Hkv, Tq, group, Dv]: one chunk per task.
    let chunk = group * dv;
    let tasks = b * hkv * tq;
    let work = group * tk * (d + dv) + 1;
    let split = Split {
        chunk,
        parallel: tasks * work >= PAR_WORK,
        min_chunks: (TASK_WORK / work).max(1),
    };
    let scratch_out = if T::as_acc(&[]).is_some() { 0 } else { chunk };
    let new_state = || Scratch {
        scores: vec![T::Acc::ZERO; group * tk],
        sums: vec![T::Acc::ZERO; group],
        out: vec![T::Acc::ZERO; scratch_out],
    };
    let grouped = rows::build(
        tasks * chunk,
        split,
        <T as WithDType>::zero(),
        new_state,
        |s, task, out: &mut [T]| match T::as_acc_mut(out) {
            Some(o) => ctx.task(s, task, o),
            None => {
                let mut acc = std::mem::take(&mut s.out);
                acc.fill(T::Acc::ZERO);
                ctx.task(s, task, &mut acc);
                T::store_row(&acc, out);
                s.out = acc;
            }
        },
    );
    if group == 1 || tq == 1 {
        return Ok(grouped); // already [B, Hq, Tq, Dv]
    }
    // [B, Hkv, Tq, group, Dv] -> [B, Hkv, group, Tq, Dv] = [B, Hq, Tq, Dv].
    let view = Layout::from_parts(
        Shape::from([b, hkv, group, tq, dv]),
        vec![hkv * tq * chunk, tq * chunk, dv, chunk, 1],
        0,
    )
    .map_err(|e| BackendError::invalid(op.name(), e.to_string()))?;
    Ok(gather(&grouped, &view))
}

#[derive(Clone, Copy)]
struct Dims {
    hq: usize,
    hkv: usize,
    tq: usize,
    tk: usize,
    d: usize,
    dv: usize,
    group: usize,
}

/// Per-task scratch: scores [group, Tk], softmax sums, and an output row
/// block in the compute type for half types.
struct Scratch<A> {
    scores: Vec<A>,
    sums: Vec<A>,
    out: Vec<A>,
}

/// Everything a task reads.
struct Ctx<'a, A: Real> {
    q: &'a [A],
    k: &'a [A],
    v: &'a [A],
    mask: Option<&'a Mask<'a, A>>,
    mode: AttnMask,
    scale: A,
    dims: Dims,
}

impl<A: Real> Ctx<'_, A> {
    /// Attention for query position `i` of every head in one group:
    /// `task` indexes [B, Hkv, Tq]; `out` is [group, Dv], zeroed.
    fn task(&self, s: &mut Scratch<A>, task: usize, out: &mut [A]) {
        let Dims {
            hq,
            hkv,
            tq,
            tk,
            d,
            dv,
            group,
        } = self.dims;
        let (bg, i) = (task / tq, task % tq);
        let (bi, g) = (bg / hkv, bg % hkv);
        // Keys this query may see: a prefix of 0..tk for the causal modes.
        let end = match self.mode {
            AttnMask::Causal => (i + 1).min(tk),
            AttnMask::CausalFromEnd => (i + 1 + tk).saturating_sub(tq).min(tk),
            AttnMask::None | AttnMask::Explicit => tk,
        };
        if end == 0 {
            return; // no visible key: the rows stay zero
        }
        let kv = bg * tk;
        let krow = |j: usize| &self.k[(kv + j) * d..(kv + j + 1) * d];
        let vrow = |j: usize| &self.v[(kv + j) * dv..(kv + j + 1) * dv];
        let head = |r: usize| g * group + r;
        let qrow = |r: usize| {
            let row = (bi * hq + head(r)) * tq + i;
            &self.q[row * d..(row + 1) * d]
        };
        let scores = &mut s.scores[..group * tk];
        // Scores, keys outermost: four key rows are loaded once and stay in
        // L1 while every head of the group takes its dot products.
        let quads = end / 4;
        for jq in 0..quads {
            let j = 4 * jq;
            let ks = [krow(j), krow(j + 1), krow(j + 2), krow(j + 3)];
            for r in 0..group {
                let dots = A::dot4(qrow(r), ks);
                for (t, x) in dots.into_iter().enumerate() {
                    scores[r * tk + j + t] = x * self.scale;
                }
            }
        }
        for j in 4 * quads..end {
            for r in 0..group {
                scores[r * tk + j] = A::dot(qrow(r), krow(j)) * self.scale;
            }
        }
        // Mask, then softmax weights per row.
        for r in 0..group {
            let row = &mut scores[r * tk..r * tk + end];
            if let Some(m) = self.mask {
                m.apply(bi, head(r), i, row);
            }
            let mx = A::max(row);
            s.sums[r] = if mx == A::NEG_INFINITY {
                A::ZERO // every key masked: the row stays zero
            } else {
                A::exp_sub_sum(row, mx)
            };
        }
        // Weighted sum of value rows, keys outermost again.
        let weights = |r: usize, j: usize| scores[r * tk + j];
        for jq in 0..quads {
            let j = 4 * jq;
            let vs = [vrow(j), vrow(j + 1), vrow(j + 2), vrow(j + 3)];
            for (r, o) in out.chunks_exact_mut(dv).enumerate() {
                let p = [weights(r, j), weights(r, j + 1), weights(r, j + 2), weights(r, j + 3)];
                // Masked keys have weight exactly 0: skip groups of them.
                if s.sums[r] != A::ZERO && p.iter().any(|&w| w != A::ZERO) {
                    A::axpy4(p, vs, o);
                }
            }
        }
        for j in 4 * quads..end {
            for (r, o) in out.chunks_exact_mut(dv).enumerate() {
                let p = weights(r, j);
                if s.sums[r] != A::ZERO && p != A::ZERO {
                    A::axpy(p, vrow(j), o);
                }
            }
        }
        for (r, o) in out.chunks_exact_mut(dv).enumerate() {
            if s.sums[r] != A::ZERO {
                A::scale(o, A::ONE / s.sums[r]);
            }
        }
    }
}

impl<A: Real> Mask<'_, A> {
    /// Applies the mask row of (batch, head, query) to `scores`.
    fn apply(&self, b: usize, h: usize, i: usize, scores: &mut [A]) {
        let st = self.strides;
        let base = b * st[0] + h * st[1] + i * st[2];
        match &self.values {
            MaskValues::Keep(keep) => {
                for (j, s) in scores.iter_mut().enumerate() {
                    if !keep[base + j * st[3]] {
                        *s = A::NEG_INFINITY;
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
}
