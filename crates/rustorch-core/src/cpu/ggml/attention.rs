//! Attention over an f16 key/value cache as llama.cpp computes it without
//! flash attention (llama-graph.cpp `build_attn_mha`):
//!
//! ```text
//! kq  = ggml_mul_mat(k, q)                  // q rounded to f16; f16 dot products
//! kq  = ggml_soft_max_ext(kq, mask, scale)  // see softmax.rs
//! kqv = ggml_mul_mat(v, kq)                 // probabilities rounded to f16
//! ```
//!
//! The cache holds values transposed (`v_trans`, llama.cpp's layout
//! without flash attention): `vt[h][d]` is a row over cache positions, so
//! both products are dot products of contiguous f16 rows, in the order of
//! the path GGML takes for them (f16dot.rs): tinyBLAS when the batch has
//! at least two query positions, `ggml_vec_dot_f16` for one. GGML iterates
//! the query heads as separate matrices, so "two positions" counts
//! positions, never heads; grouped-query heads read key/value head
//! `h / (Hq / Hkv)`, as GGML's broadcast does.
//!
//! The number of cache positions `L` that llama.cpp attends over is the
//! used length padded to 256 (llama_kv_cache::get_n_kv); positions past
//! the used ones are masked with -inf, so they add exact zeros to every
//! sum. Any `L` that is a multiple of 64 therefore gives the same bits, as
//! long as the cache holds finite values there (it starts zeroed).

use super::f16dot::{dot, dot_rows, F16Path};
use super::softmax::soft_max_ext_row;
use crate::cpu::copy::input_slice;
use crate::cpu::{CpuInput, CpuStorage, StorageElement};
use crate::error::BackendError;
use crate::op::Op;
use half::f16;
use rayon::prelude::*;

/// An f16 operand read in place: `[heads, rows, len]` with unit stride in
/// the last dimension (a cache view needs no copy).
struct Rows<'a> {
    data: &'a [f16],
    offset: usize,
    head_stride: usize,
    row_stride: usize,
    len: usize,
}

impl<'a> Rows<'a> {
    fn new(op: &Op, input: CpuInput<'a>, what: &str) -> Result<Rows<'a>, BackendError> {
        let data = <f16 as StorageElement>::slice(input.storage)
            .ok_or_else(|| BackendError::invalid(op.name(), format!("{what} must be f16")))?;
        let (dims, strides) = (input.layout.dims(), input.layout.strides());
        if dims[2] > 1 && strides[2] != 1 {
            return Err(BackendError::invalid(
                op.name(),
                format!("{what} needs contiguous rows (its last stride is {})", strides[2]),
            ));
        }
        Ok(Rows {
            data,
            offset: input.layout.offset(),
            head_stride: strides[0],
            row_stride: strides[1],
            len: dims[2],
        })
    }

    fn row(&self, h: usize, r: usize) -> &'a [f16] {
        let s = self.offset + h * self.head_stride + r * self.row_stride;
        &self.data[s..s + self.len]
    }
}

/// Dot products computed together (independent FMA chains; f16dot.rs).
const ROWS: usize = 4;

/// Inputs: q f32 `[Hq, T, D]`, k f16 `[Hkv, L, D]`, vt f16 `[Hkv, Dv, L]`,
/// mask f32 `[T, L]` (added after scaling). Returns f32 `[Hq, T, Dv]`.
pub(crate) fn cached_attention(op: &Op, inputs: &[CpuInput<'_>], scale: f32) -> Result<Vec<CpuStorage>, BackendError> {
    let q = input_slice::<f32>(op, inputs[0])?;
    let k = Rows::new(op, inputs[1], "keys")?;
    let vt = Rows::new(op, inputs[2], "transposed values")?;
    let mask = input_slice::<f32>(op, inputs[3])?;
    let (qd, kd, vd) = (inputs[0].dims(), inputs[1].dims(), inputs[2].dims());
    let (hq, t, d) = (qd[0], qd[1], qd[2]);
    let (hkv, l, dv) = (kd[0], kd[1], vd[1]);
    let group = hq / hkv;
    let kq_path = F16Path::choose(l, d, t);
    let kqv_path = F16Path::choose(dv, l, t);

    let mut out = vec![0f32; hq * t * dv];
    let work = |(row, o): (usize, &mut [f32])| {
        let (h, i) = (row / t, row % t);
        let hk = h / group;
        let mask_row = &mask[i * l..(i + 1) * l];
        let q16: Vec<f16> = q[row * d..(row + 1) * d].iter().map(|&v| f16::from_f32(v)).collect();
        // A score under a -inf mask becomes -inf whatever its value, so it
        // is not computed (half of a causal prompt's products).
        let mut scores = vec![0f32; l];
        let live: Vec<usize> = (0..l).filter(|&j| mask_row[j] != f32::NEG_INFINITY).collect();
        let mut groups = live.chunks_exact(ROWS);
        for g in &mut groups {
            let s = dot_rows(kq_path, std::array::from_fn::<_, ROWS, _>(|r| k.row(hk, g[r])), &q16);
            for (&j, v) in g.iter().zip(s) {
                scores[j] = v;
            }
        }
        for &j in groups.remainder() {
            scores[j] = dot(kq_path, k.row(hk, j), &q16);
        }
        let mut p = vec![0f32; l];
        soft_max_ext_row(&scores, Some(mask_row), scale, &mut p);
        let p16: Vec<f16> = p.iter().map(|&v| f16::from_f32(v)).collect();
        let span = nonzero_span(&p16);
        let probs = &p16[span.clone()];
        let mut cols = o.chunks_exact_mut(ROWS);
        for (g, out) in (&mut cols).enumerate() {
            let rows = std::array::from_fn::<_, ROWS, _>(|r| &vt.row(hk, g * ROWS + r)[span.clone()]);
            out.copy_from_slice(&dot_rows(kqv_path, rows, probs));
        }
        let done = dv / ROWS * ROWS;
        for (c, v) in cols.into_remainder().iter_mut().enumerate() {
            *v = dot(kqv_path, &vt.row(hk, done + c)[span.clone()], probs);
        }
    };
    if dv == 0 {
        return Ok(vec![CpuStorage::from_vec(out)]);
    }
    if hq * t * l * (d + dv) < 1 << 16 {
        out.chunks_mut(dv).enumerate().for_each(work);
    } else {
        out.par_chunks_mut(dv).enumerate().for_each(work);
    }
    Ok(vec![CpuStorage::from_vec(out)])
}

/// The part of a probability row that the value products must read: whole
/// 64-element blocks from the first to the last nonzero one (all of it
/// when the row has no zero block at either end).
///
/// Skipping zero blocks keeps GGML's bits: a zero probability adds an exact
/// zero (`acc + v * 0 == acc` for the finite cache values, and an
/// accumulator that starts at +0 never becomes -0). Blocks of 64 keep the
/// lane assignment of both orders (tinyBLAS's 16 lanes, and
/// `ggml_vec_dot_f16`'s four 16-lane accumulators over 64-element steps);
/// a span that ends before the row's end is a multiple of 64 long, so
/// `ggml_vec_dot_f16`'s f64 tail then only drops zeros too.
fn nonzero_span(p: &[f16]) -> std::ops::Range<usize> {
    const STEP: usize = 64;
    let is_zero = |v: &f16| v.to_bits() & 0x7fff == 0;
    let first = p.iter().position(|v| !is_zero(v));
    let Some(first) = first else {
        return 0..0;
    };
    let last = p.iter().rposition(|v| !is_zero(v)).unwrap_or(first);
    let start = first / STEP * STEP;
    let end = ((last / STEP + 1) * STEP).min(p.len());
    start..end
}

/// Inputs: x and g f32 of one shape; `act(x) * g` row by row over the last
/// dimension, SiLU for `Op::SwiGlu` and GELU for `Op::GeGlu`.
pub(crate) fn gated(op: &Op, inputs: &[CpuInput<'_>]) -> Result<Vec<CpuStorage>, BackendError> {
    let row: fn(&[f32], &[f32], &mut [f32]) = match op {
        Op::GeGlu => super::geglu::geglu_row,
        _ => super::swiglu::swiglu_row,
    };
    let x = input_slice::<f32>(op, inputs[0])?;
    let g = input_slice::<f32>(op, inputs[1])?;
    let n = inputs[0].dims().last().copied().unwrap_or(1).max(1);
    let mut out = vec![0f32; x.len()];
    let rows = |((o, xr), gr): ((&mut [f32], &[f32]), &[f32])| row(xr, gr, o);
    if x.len() < 1 << 15 {
        out.chunks_mut(n).zip(x.chunks(n)).zip(g.chunks(n)).for_each(rows);
    } else {
        out.par_chunks_mut(n)
            .zip(x.par_chunks(n))
            .zip(g.par_chunks(n))
            .for_each(rows);
    }
    Ok(vec![CpuStorage::from_vec(out)])
}
