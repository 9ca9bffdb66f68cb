//! `Op::AttentionAt`: causal attention over a key/value cache at positions
//! read from a tensor. Query row i sits at position p = pos + i and sees
//! the keys j <= p (and p - j < w within a sliding window of w), so only
//! the cache rows up to pos + T are read, however large the cache is.
//!
//! Plain f32 arithmetic: the scores `scale * q . k_j`, their maximum
//! subtracted before `exp`, the weighted sum of the value rows divided by
//! the sum of the weights at the end. Work is split over the (head, query
//! row) pairs; each task widens the key and value rows it reads, through
//! their strides, so a cache view is never copied whole. The model path of
//! this backend keeps its llama.cpp-exact attention (`ggml::attention`);
//! this is the reference the CUDA kernels are checked against.

use crate::norm::float::{acc_input, FloatElem};
use crate::norm::rows::{self, Split};
use crate::{CpuInput, CpuResult, CpuStorage};
use half::{bf16, f16};
use rustorch_core::dtype::DType;
use rustorch_core::error::BackendError;
use rustorch_core::op::Op;
use std::borrow::Cow;

/// Below this many multiply-adds, stay on the calling thread.
const PAR_WORK: usize = 1 << 16;
/// Smallest amount of work (multiply-adds) worth a rayon task.
const TASK_WORK: usize = 1 << 15;

/// Inputs: q `[H, T, D]` (f32, f16 or bf16), k `[Hkv, N, D]`, v
/// `[Hkv, N, Dv]` (f32, f16 or bf16, one dtype), pos (one i32 or i64
/// element). Returns f32 `[H, T, Dv]`.
pub(crate) fn attention_at(op: &Op, inputs: &[CpuInput<'_>], scale: f32, window: Option<usize>) -> CpuResult {
    if inputs.len() != 4 || inputs[..3].iter().any(|t| t.dims().len() != 3) {
        return Err(BackendError::invalid(op.name(), "expects q, k and v of rank 3 and pos"));
    }
    let (qd, kd, vd) = (inputs[0].dims(), inputs[1].dims(), inputs[2].dims());
    let (h, t, d) = (qd[0], qd[1], qd[2]);
    let (hkv, n, dv) = (kd[0], kd[1], vd[2]);
    if hkv == 0 || !h.is_multiple_of(hkv) || vd[0] != hkv || vd[1] != n || kd[2] != d {
        return Err(BackendError::invalid(
            op.name(),
            "expects q [H, T, D], k [Hkv, N, D], v [Hkv, N, Dv] with H a multiple of Hkv",
        ));
    }
    if window == Some(0) {
        return Err(BackendError::invalid(
            op.name(),
            "a window must hold at least one position",
        ));
    }
    if h * t * dv == 0 {
        // Nothing to compute: the position is not read (nor is it on the GPU).
        return Ok(vec![CpuStorage::F32(Vec::new())]);
    }
    let pos = read_pos(op, inputs[3])?;
    if pos < 0 || pos as u64 + t as u64 > n as u64 {
        return Err(BackendError::invalid(
            op.name(),
            format!("position {pos} with {t} query rows does not fit a cache of {n} positions"),
        ));
    }
    let q: Cow<'_, [f32]> = match inputs[0].dtype() {
        DType::F32 => acc_input::<f32>(op, inputs[0])?,
        DType::F16 => acc_input::<f16>(op, inputs[0])?,
        DType::BF16 => acc_input::<bf16>(op, inputs[0])?,
        other => return Err(crate::unsupported_dtype(op, other)),
    };
    if inputs[2].dtype() != inputs[1].dtype() {
        return Err(BackendError::invalid(op.name(), "k and v must have one dtype"));
    }
    let shape = Shape {
        h,
        t,
        d,
        dv,
        group: h / hkv,
        pos: pos as usize,
        window,
        scale,
    };
    let out = match inputs[1].dtype() {
        DType::F32 => attend::<f32>(op, &q, inputs[1], inputs[2], shape)?,
        DType::F16 => attend::<f16>(op, &q, inputs[1], inputs[2], shape)?,
        DType::BF16 => attend::<bf16>(op, &q, inputs[1], inputs[2], shape)?,
        other => return Err(crate::unsupported_dtype(op, other)),
    };
    Ok(vec![CpuStorage::F32(out)])
}

/// The one element of `pos`, widened to i64.
fn read_pos(op: &Op, input: CpuInput<'_>) -> Result<i64, BackendError> {
    let at = input.layout.offset();
    let value = match input.storage {
        _ if input.layout.numel() != 1 => None,
        CpuStorage::I64(v) => v.get(at).copied(),
        CpuStorage::I32(v) => v.get(at).map(|&x| i64::from(x)),
        _ => None,
    };
    value.ok_or_else(|| BackendError::invalid(op.name(), "pos must be one i32 or i64 element"))
}

#[derive(Clone, Copy)]
struct Shape {
    h: usize,
    t: usize,
    d: usize,
    dv: usize,
    group: usize,
    pos: usize,
    window: Option<usize>,
    scale: f32,
}

/// A cache operand `[Hkv, N, len]` read in place through its strides.
struct Cache<'a, E> {
    data: &'a [E],
    offset: usize,
    strides: [usize; 3],
}

impl<'a, E: FloatElem<Acc = f32>> Cache<'a, E> {
    fn new(op: &Op, input: CpuInput<'a>) -> Result<Self, BackendError> {
        let data = input
            .storage
            .as_slice::<E>()
            .ok_or_else(|| crate::unsupported_dtype(op, input.dtype()))?;
        let s = input.layout.strides();
        Ok(Cache {
            data,
            offset: input.layout.offset(),
            strides: [s[0], s[1], s[2]],
        })
    }

    /// Row `j` of head `head`, widened into `dst` (its length is the row's).
    fn row(&self, head: usize, j: usize, dst: &mut [f32]) {
        if dst.is_empty() {
            return;
        }
        let [sh, sj, sc] = self.strides;
        let base = self.offset + head * sh + j * sj;
        if sc == 1 || dst.len() == 1 {
            E::load_row(&self.data[base..base + dst.len()], dst);
        } else {
            for (c, x) in dst.iter_mut().enumerate() {
                E::load_row(std::slice::from_ref(&self.data[base + c * sc]), std::slice::from_mut(x));
            }
        }
    }
}

/// Per-task scratch: the scores of the visible keys and one widened row.
struct Scratch {
    scores: Vec<f32>,
    row: Vec<f32>,
}

fn attend<E: FloatElem<Acc = f32>>(
    op: &Op,
    q: &[f32],
    k: CpuInput<'_>,
    v: CpuInput<'_>,
    s: Shape,
) -> Result<Vec<f32>, BackendError> {
    let (k, v) = (Cache::<E>::new(op, k)?, Cache::<E>::new(op, v)?);
    // Keys row i of the step sees: a window of at most w ending at p.
    let visible = |i: usize| {
        let p = s.pos + i;
        let lo = s.window.map_or(0, |w| (p + 1).saturating_sub(w));
        lo..p + 1
    };
    let work = (s.pos + s.t) * (s.d + s.dv) + 1;
    let tasks = s.h * s.t;
    let split = Split {
        chunk: s.dv,
        parallel: tasks * work >= PAR_WORK,
        min_chunks: (TASK_WORK / work).max(1),
    };
    let new_state = || Scratch {
        scores: Vec::new(),
        row: vec![0.0; s.d.max(s.dv)],
    };
    let out = rows::build(tasks * s.dv, split, 0.0f32, new_state, |st, task, out: &mut [f32]| {
        let (head, i) = (task / s.t, task % s.t);
        let kv = head / s.group;
        let qrow = &q[task * s.d..(task + 1) * s.d];
        let keys = visible(i);
        st.scores.clear();
        let mut max = f32::NEG_INFINITY;
        for j in keys.clone() {
            let kr = &mut st.row[..s.d];
            k.row(kv, j, kr);
            let x = s.scale * qrow.iter().zip(kr.iter()).map(|(a, b)| a * b).sum::<f32>();
            max = max.max(x);
            st.scores.push(x);
        }
        // Row i always sees key p itself, so the weights are not all zero
        // (unless the scores overflow to infinities: then NaN, as softmax).
        let mut sum = 0.0f32;
        for (j, x) in keys.zip(st.scores.iter()) {
            let w = (x - max).exp();
            sum += w;
            let vr = &mut st.row[..s.dv];
            v.row(kv, j, vr);
            for (o, y) in out.iter_mut().zip(vr.iter()) {
                *o += w * y;
            }
        }
        let inv = 1.0 / sum;
        for o in out.iter_mut() {
            *o *= inv;
        }
    });
    Ok(out)
}
