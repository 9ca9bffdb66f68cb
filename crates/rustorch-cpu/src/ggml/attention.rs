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
//! the path GGML takes for them (floatdot.rs): tinyBLAS when the batch has
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

use super::floatdot::{dot, dot_rows, dot_tiny_4x4, dot_vec_shared, FloatOrder};
use super::softmax::{soft_max_ext_live, soft_max_ext_row, soft_max_ext_visible, visible_range};
use crate::copy::input_slice;
use crate::{CpuInput, CpuStorage, StorageElement};
use half::f16;
use rayon::prelude::*;
use rustorch_core::error::BackendError;
use rustorch_core::op::{GateActivation, Op};

/// An f16 operand read in place: `[heads, rows, len]` with unit stride in
/// the last dimension (a cache view needs no copy).
pub(super) struct Rows<'a> {
    data: &'a [f16],
    offset: usize,
    head_stride: usize,
    row_stride: usize,
    len: usize,
}

impl<'a> Rows<'a> {
    pub(super) fn new(op: &Op, input: CpuInput<'a>, what: &str) -> Result<Rows<'a>, BackendError> {
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

    /// Up to `n` values of row `r` of head `h`, or none past the data.
    pub(super) fn row_from(&self, h: usize, r: usize, n: usize) -> &'a [f16] {
        let s = self.offset + h * self.head_stride + r * self.row_stride;
        self.data.get(s..(s + n).min(self.data.len())).unwrap_or(&[])
    }

    pub(super) fn row(&self, h: usize, r: usize) -> &'a [f16] {
        let s = self.offset + h * self.head_stride + r * self.row_stride;
        &self.data[s..s + self.len]
    }
}

/// Dot products computed together (independent FMA chains; floatdot.rs).
const ROWS: usize = 4;

/// How many key or value rows ahead a decode step prefetches: a layer's
/// cache was last read a whole token ago, so its rows come from the L3 or
/// DRAM, and their loads stalled the products.
pub(super) const AHEAD: usize = 4;

/// Asks for the cache lines of `x` (into L1).
#[inline(always)]
pub(super) fn prefetch(x: &[f16]) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        let p = x.as_ptr().cast::<i8>();
        for off in (0..std::mem::size_of_val(x)).step_by(64) {
            // SAFETY: a prefetch reads nothing and never faults; the
            // address is inside `x`.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(off)) };
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = x;
}

/// Inputs: q f32 `[Hq, T, D]`, k f16 `[Hkv, L, D]`, vt f16 `[Hkv, Dv, L]`,
/// mask f32 `[T, L]` (added after scaling). Returns f32 `[Hq, T, Dv]`.
pub(crate) fn cached_attention(op: &Op, inputs: &[CpuInput<'_>], scale: f32) -> Result<Vec<CpuStorage>, BackendError> {
    attend(op, inputs, scale, true)
}

/// `cached_attention`; `groups` allows the four-row path (tests compare it
/// with the one-row path).
fn attend(op: &Op, inputs: &[CpuInput<'_>], scale: f32, groups: bool) -> Result<Vec<CpuStorage>, BackendError> {
    let q = input_slice::<f32>(op, inputs[0])?;
    let k = Rows::new(op, inputs[1], "keys")?;
    let vt = Rows::new(op, inputs[2], "transposed values")?;
    let mask = input_slice::<f32>(op, inputs[3])?;
    let (qd, kd, vd) = (inputs[0].dims(), inputs[1].dims(), inputs[2].dims());
    let (hq, t, d) = (qd[0], qd[1], qd[2]);
    let (hkv, l, dv) = (kd[0], kd[1], vd[1]);
    let group = hq / hkv;
    let kq_path = FloatOrder::choose(l, d, t, 16);
    let kqv_path = FloatOrder::choose(dv, l, t, 16);

    let mut out = vec![0f32; hq * t * dv];
    let work = |(row, o): (usize, &mut [f32])| {
        let (h, i) = (row / t, row % t);
        let hk = h / group;
        let mask_row = &mask[i * l..(i + 1) * l];
        let q16 = to_f16(&q[row * d..(row + 1) * d]);
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
        let p16 = probabilities(&scores, mask_row, scale);
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
    if groups && kq_path == FloatOrder::TinyBlas && kqv_path == FloatOrder::TinyBlas {
        // Four query rows of one head at a time (a head's last group holds
        // the t % 4 rows left, so no group crosses heads): each key and
        // value row loaded then meets four query rows (`dot_tiny_4x4`).
        let queries = Queries {
            q: &q,
            mask: &mask,
            visible: &visible_keys(&mask, t, l),
            t,
            d,
            l,
            dv,
        };
        if hkv * l * (d + dv) * std::mem::size_of::<f32>() <= wide_all_bytes() {
            // Every head widened at once, and one parallel loop over all
            // rows (no join per head).
            let wides: Vec<WideCache> = (0..hkv)
                .into_par_iter()
                .map(|hk| WideCache::new(&k, &vt, hk, l, dv))
                .collect();
            out.par_chunks_mut(t * dv).enumerate().for_each(|(h, out_h)| {
                out_h
                    .par_chunks_mut(4 * dv)
                    .enumerate()
                    .for_each_init(FourRowScratch::default, |s, (g, o)| {
                        four_rows(&queries, &wides[h / group], scale, h * t + 4 * g, o, s)
                    })
            });
            return Ok(vec![CpuStorage::from_vec(out)]);
        }
        // A long cache: one key/value head at a time, so that only its keys
        // and values are widened at once (the query heads of a group are
        // contiguous in the output).
        for (hk, out_k) in out.chunks_mut(group * t * dv).enumerate() {
            let wide = WideCache::new(&k, &vt, hk, l, dv);
            out_k.par_chunks_mut(t * dv).enumerate().for_each(|(h, out_h)| {
                out_h
                    .par_chunks_mut(4 * dv)
                    .enumerate()
                    .for_each_init(FourRowScratch::default, |s, (g, o)| {
                        four_rows(&queries, &wide, scale, (hk * group + h) * t + 4 * g, o, s)
                    })
            });
        }
        return Ok(vec![CpuStorage::from_vec(out)]);
    }
    if groups && t == 1 && kq_path == FloatOrder::VecDot && kqv_path == FloatOrder::VecDot {
        // One new position (token generation): the query heads of a
        // key/value head go together, so that each key and value row is
        // read and widened once for all of them.
        let dec = Decode {
            q: &q,
            mask: &mask,
            k: &k,
            vt: &vt,
            group,
            scale,
            d,
        };
        match heads_per_task(group) {
            4 => out
                .par_chunks_mut(4 * dv)
                .enumerate()
                .for_each(|(c, o)| dec.heads::<4>(4 * c, o)),
            3 => out
                .par_chunks_mut(3 * dv)
                .enumerate()
                .for_each(|(c, o)| dec.heads::<3>(3 * c, o)),
            2 => out
                .par_chunks_mut(2 * dv)
                .enumerate()
                .for_each(|(c, o)| dec.heads::<2>(2 * c, o)),
            _ => out
                .par_chunks_mut(dv)
                .enumerate()
                .for_each(|(c, o)| dec.heads::<1>(c, o)),
        }
        return Ok(vec![CpuStorage::from_vec(out)]);
    }
    if hq * t * l * (d + dv) < 1 << 16 {
        out.chunks_mut(dv).enumerate().for_each(work);
    } else {
        out.par_chunks_mut(dv).enumerate().for_each(work);
    }
    Ok(vec![CpuStorage::from_vec(out)])
}

/// The most query heads (at most four: their accumulators fill the
/// registers) that divide a key/value head's `group`, so that no task
/// spans two key/value heads.
pub(super) fn heads_per_task(group: usize) -> usize {
    (1..=4).rev().find(|n| group.is_multiple_of(*n)).unwrap_or(1)
}

/// `cached_attention` for one query position, in `ggml_vec_dot_f16`'s
/// order for both products (GGML's path for a single position).
struct Decode<'a> {
    q: &'a [f32],
    mask: &'a [f32],
    k: &'a Rows<'a>,
    vt: &'a Rows<'a>,
    group: usize,
    scale: f32,
    d: usize,
}

impl Decode<'_> {
    /// Query heads `h0..h0 + N` (one key/value head) into `o` (`N x Dv`),
    /// with the bits of the one-head path (`attend`'s `work`): each key
    /// row meets the `N` queries (`dot_vec_shared`: the same products in
    /// the same order), and each value row the `N` probability rows over
    /// the union of their nonzero spans; as in `four_rows`, the extra
    /// blocks hold zero probabilities, which add exact zeros, and every
    /// span starts on a 64-element boundary, so each lane sums the same
    /// elements in the same order.
    fn heads<const N: usize>(&self, h0: usize, o: &mut [f32]) {
        let (d, l) = (self.d, self.mask.len());
        let dv = o.len() / N;
        let hk = h0 / self.group;
        let q16: [Vec<f16>; N] = std::array::from_fn(|r| to_f16(&self.q[(h0 + r) * d..(h0 + r + 1) * d]));
        let q32: [Vec<f32>; N] = std::array::from_fn(|r| widen(&q16[r]));
        let mut scores: [Vec<f32>; N] = std::array::from_fn(|_| vec![0f32; l]);
        for j in 0..l {
            if self.mask[j] == f32::NEG_INFINITY {
                continue;
            }
            prefetch(self.k.row_from(hk, j + AHEAD, d));
            let key = self.k.row(hk, j);
            let s: [f32; N] = dot_vec_shared(std::array::from_fn(|r| &q32[r][..]), key)
                .unwrap_or_else(|| std::array::from_fn(|r| dot(FloatOrder::VecDot, key, &q16[r])));
            for (sc, v) in scores.iter_mut().zip(s) {
                sc[j] = v;
            }
        }
        let p16: [Vec<f16>; N] = std::array::from_fn(|r| probabilities(&scores[r], self.mask, self.scale));
        let span = p16
            .iter()
            .map(|p| nonzero_span(p))
            .filter(|s| !s.is_empty())
            .reduce(|a, b| a.start.min(b.start)..a.end.max(b.end))
            .unwrap_or(0..0);
        let p32: [Vec<f32>; N] = std::array::from_fn(|r| widen(&p16[r][span.clone()]));
        for c in 0..dv {
            if c + AHEAD < dv {
                prefetch(&self.vt.row(hk, c + AHEAD)[span.clone()]);
            }
            let vrow = &self.vt.row(hk, c)[span.clone()];
            let s: [f32; N] = dot_vec_shared(std::array::from_fn(|r| &p32[r][..]), vrow)
                .unwrap_or_else(|| std::array::from_fn(|r| dot(FloatOrder::VecDot, vrow, &p16[r][span.clone()])));
            for (r, v) in s.into_iter().enumerate() {
                o[r * dv + c] = v;
            }
        }
    }
}

/// f16 values widened to f32 (exact).
pub(super) fn widen(x: &[f16]) -> Vec<f32> {
    use half::slice::HalfFloatSliceExt;
    let mut out = vec![0f32; x.len()];
    x.convert_to_f32_slice(&mut out);
    out
}

/// The queries and mask of `cached_attention`, and their sizes.
struct Queries<'a> {
    q: &'a [f32],
    mask: &'a [f32],
    /// Per query position, the keys from the first to the last its mask
    /// does not hide (`visible_keys`), shared by every head.
    visible: &'a [Option<std::ops::Range<usize>>],
    t: usize,
    d: usize,
    l: usize,
    dv: usize,
}

/// For each of the `t` mask rows (`l` keys each), the range from the first
/// key it does not hide to the last; `None` for a row that hides all.
/// Computed once per op instead of once per head and group of rows.
pub(super) fn visible_keys(mask: &[f32], t: usize, l: usize) -> Vec<Option<std::ops::Range<usize>>> {
    (0..t).map(|i| visible_range(&mask[i * l..(i + 1) * l])).collect()
}

/// One key/value head's keys and transposed values widened to f32 once per
/// op, for the batched path: every query row of a prompt batch reads every
/// key and value row, and a conversion per load cost as much as the
/// products. Widening an f16 value is exact, and a product of two widened
/// f16 values is exact in f32, so the FMAs give the f16 products' bits.
struct WideCache {
    k: Vec<f32>,
    vt: Vec<f32>,
    l: usize,
    d: usize,
}

impl WideCache {
    fn new(k: &Rows<'_>, vt: &Rows<'_>, hk: usize, l: usize, dv: usize) -> WideCache {
        use half::slice::HalfFloatSliceExt;
        let d = k.len;
        let mut wide = WideCache {
            k: vec![0f32; l * d],
            vt: vec![0f32; dv * l],
            l,
            d,
        };
        if d > 0 {
            for (j, row) in wide.k.chunks_exact_mut(d).enumerate() {
                k.row(hk, j).convert_to_f32_slice(row);
            }
        }
        if l > 0 {
            for (c, row) in wide.vt.chunks_exact_mut(l).enumerate() {
                vt.row(hk, c).convert_to_f32_slice(row);
            }
        }
        wide
    }

    fn key(&self, j: usize) -> &[f32] {
        &self.k[j * self.d..(j + 1) * self.d]
    }

    fn value_row(&self, c: usize) -> &[f32] {
        &self.vt[c * self.l..(c + 1) * self.l]
    }
}

/// The most bytes of widened keys and values that the batched path holds
/// for all key/value heads at once; past it (a long cache), it widens and
/// runs one head at a time.
const WIDE_ALL_BYTES: usize = 16 << 20;

#[cfg(not(test))]
fn wide_all_bytes() -> usize {
    WIDE_ALL_BYTES
}

#[cfg(test)]
thread_local! {
    /// `WIDE_ALL_BYTES` as this test thread sets it (0: the per-head path).
    static WIDE_LIMIT: std::cell::Cell<usize> = const { std::cell::Cell::new(WIDE_ALL_BYTES) };
}

#[cfg(test)]
fn wide_all_bytes() -> usize {
    WIDE_LIMIT.with(|c| c.get())
}

/// Buffers of one worker for `four_rows`, kept across its tasks.
#[derive(Default)]
struct FourRowScratch {
    q: [Vec<f32>; 4],
    scores: [Vec<f32>; 4],
    p32: [Vec<f32>; 4],
}

/// Query rows `row0..row0 + n` (one head; `n = o.len() / Dv`, 1 to 4) into
/// `o` (`n x Dv`), in tinyBLAS's order for both products, with the bits of
/// the one-row path (fewer than four rows, a head's last group, fill the
/// tile with copies of its last row, whose results are dropped):
/// - scores are computed for the keys that any of the four rows sees;
///   each row's masked scores are then set to 0 as in the one-row path
///   (the mask hides them anyway);
/// - the value products run over the union of the four rows' nonzero
///   spans: the extra blocks hold zero probabilities, which add exact
///   zeros, and the union starts on a 64-element boundary like each span,
///   so every lane sums the same elements in the same order.
fn four_rows(qs: &Queries<'_>, wide: &WideCache, scale: f32, row0: usize, o: &mut [f32], s: &mut FourRowScratch) {
    use half::slice::HalfFloatSliceExt;
    let (t, d, l, dv) = (qs.t, qs.d, qs.l, qs.dv);
    let rows = o.len() / dv;
    debug_assert!((1..=4).contains(&rows));
    // Tile row r computes query row `row0 + src(r)`.
    let src = |r: usize| r.min(rows - 1);
    let i0 = row0 % t;
    for (r, q) in s.q.iter_mut().enumerate() {
        // Rounded to f16 as GGML converts the operand, then widened back.
        let q16 = to_f16(&qs.q[(row0 + src(r)) * d..(row0 + src(r) + 1) * d]);
        q.resize(d, 0.0);
        q16.convert_to_f32_slice(q);
    }
    let qr: [&[f32]; 4] = std::array::from_fn(|r| &s.q[r][..]);
    let masks: [&[f32]; 4] = std::array::from_fn(|r| &qs.mask[(i0 + src(r)) * l..(i0 + src(r) + 1) * l]);
    // Keys from the first that any row sees to the last: products of keys
    // masked inside that range are computed, then set to 0 below, as the
    // one-row path leaves them.
    let keys = (0..4)
        .filter_map(|r| qs.visible[i0 + src(r)].clone())
        .reduce(|a, b| a.start.min(b.start)..a.end.max(b.end))
        .unwrap_or(0..0);
    for sc in s.scores.iter_mut() {
        if sc.len() < l {
            sc.resize(l, 0.0);
        }
    }
    let mut j = keys.start;
    while j + 4 <= keys.end {
        // Queries as the tile's rows: each row's four scores are adjacent.
        let out = dot_tiny_4x4(qr, std::array::from_fn(|c| wide.key(j + c)));
        for (sc, o) in s.scores.iter_mut().zip(&out) {
            sc[j..j + 4].copy_from_slice(o);
        }
        j += 4;
    }
    for j in j..keys.end {
        for (sc, q) in s.scores.iter_mut().zip(qr) {
            sc[j] = dot(FloatOrder::TinyBlas, q, wide.key(j));
        }
    }
    // Each distinct row's probabilities, rounded to f16 and widened back,
    // in `p32[r]` over the blocks its softmax computes (`live[r]`), and the
    // union of the rows' nonzero 64-element blocks (`span`).
    let mut span: Option<std::ops::Range<usize>> = None;
    let mut live: [std::ops::Range<usize>; 4] = std::array::from_fn(|_| 0..0);
    for r in 0..rows {
        let (mask, p32) = (masks[r], &mut s.p32[r]);
        if p32.len() < l {
            p32.resize(l, 0.0);
        }
        let rs = match qs.visible[i0 + r].clone() {
            Some(visible) => {
                // The scores the tiles did not write this time are stale
                // but finite, and hidden by the mask (-inf either way).
                let lo_hi = soft_max_ext_visible(&s.scores[r][..l], mask, scale, &mut p32[..l], visible);
                live[r] = lo_hi.clone();
                round_through_f16(&mut p32[lo_hi.clone()], lo_hi.start, l)
            }
            None => {
                // Every key hidden: GGML's NaN row, all of it (the stale
                // scores are finite, so every element is -inf before the
                // exponentials).
                soft_max_ext_row(&s.scores[r][..l], Some(mask), scale, &mut p32[..l]);
                live[r] = 0..l;
                round_through_f16(&mut p32[..l], 0, l)
            }
        };
        if !rs.is_empty() {
            span = Some(match span {
                Some(u) => u.start.min(rs.start)..u.end.max(rs.end),
                None => rs,
            });
        }
    }
    let span = span.unwrap_or(0..0);
    // Zeros where a row's softmax wrote nothing (its hidden blocks) inside
    // the span the value products read.
    for (p32, live) in s.p32.iter_mut().zip(&live).take(rows) {
        let (a, b) = (
            live.start.clamp(span.start, span.end),
            live.end.clamp(span.start, span.end),
        );
        if a < b {
            p32[span.start..a].fill(0.0);
            p32[b..span.end].fill(0.0);
        } else {
            p32[span.clone()].fill(0.0);
        }
    }
    let probs: [&[f32]; 4] = std::array::from_fn(|r| &s.p32[src(r)][span.clone()]);
    let mut c = 0;
    while c + 4 <= dv {
        let out = dot_tiny_4x4(std::array::from_fn(|m| &wide.value_row(c + m)[span.clone()]), probs);
        for (m, sm) in out.iter().enumerate() {
            for r in 0..rows {
                o[r * dv + c + m] = sm[r];
            }
        }
        c += 4;
    }
    for c in c..dv {
        for r in 0..rows {
            o[r * dv + c] = dot(FloatOrder::TinyBlas, &wide.value_row(c)[span.clone()], probs[r]);
        }
    }
}

/// `p` (the elements `at..at + p.len()` of a row of `len`) rounded to f16
/// and widened back in place, as the value product reads probabilities
/// (`probabilities` then `widen`), and the row's `nonzero_span` over them,
/// the row's other elements being zeros.
fn round_through_f16(p: &mut [f32], at: usize, len: usize) -> std::ops::Range<usize> {
    use half::slice::HalfFloatSliceExt;
    const STEP: usize = 64;
    let mut buf = [f16::ZERO; STEP];
    let (mut first, mut last) = (None, 0);
    let mut i = 0;
    while i < p.len() {
        // Up to the next 64-element boundary of the row.
        let n = (STEP - (at + i) % STEP).min(p.len() - i);
        let part = &mut p[i..i + n];
        buf[..n].convert_from_f32_slice(part);
        buf[..n].convert_to_f32_slice(part);
        if any_nonzero(&buf[..n]) {
            let block = (at + i) / STEP;
            first.get_or_insert(block);
            last = block;
        }
        i += n;
    }
    match first {
        Some(first) => first * STEP..((last + 1) * STEP).min(len),
        None => 0..0,
    }
}

/// An f32 operand rounded to f16, as GGML converts it for an f16 product.
pub(super) fn to_f16(x: &[f32]) -> Vec<f16> {
    use half::slice::HalfFloatSliceExt;
    // Vectorized (F16C where present), rounding to nearest even as
    // `f16::from_f32` does one at a time.
    let mut out = vec![f16::ZERO; x.len()];
    out.convert_from_f32_slice(x);
    out
}

/// `ggml_soft_max_ext` of a score row under its mask, rounded to f16 for
/// the value product.
fn probabilities(scores: &[f32], mask: &[f32], scale: f32) -> Vec<f16> {
    let mut p = vec![0f32; scores.len()];
    // Masked scores are 0 here (never computed), so only the unmasked
    // span needs the exponentials.
    soft_max_ext_live(scores, mask, scale, &mut p);
    to_f16(&p)
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
    let Some(first) = p.chunks(STEP).position(any_nonzero) else {
        return 0..0;
    };
    let last = p.chunks(STEP).rposition(any_nonzero).unwrap_or(first);
    (first * STEP)..((last + 1) * STEP).min(p.len())
}

/// Whether any of `b` is nonzero (or NaN): an OR over the magnitudes'
/// bits, which vectorizes.
fn any_nonzero(b: &[f16]) -> bool {
    b.iter().fold(0u16, |a, v| a | (v.to_bits() & 0x7fff)) != 0
}

/// Inputs: x and g f32 of one shape; `act(x) * g` row by row over the last
/// dimension, SiLU for `Op::SwiGlu` and GELU for `Op::GeGlu`.
pub(crate) fn gated(op: &Op, inputs: &[CpuInput<'_>]) -> Result<Vec<CpuStorage>, BackendError> {
    let act = match op {
        Op::GeGlu => GateActivation::GeGlu,
        _ => GateActivation::SwiGlu,
    };
    let row = gate_row(act);
    let x = input_slice::<f32>(op, inputs[0])?;
    let g = input_slice::<f32>(op, inputs[1])?;
    let n = inputs[0].dims().last().copied().unwrap_or(1).max(1);
    let mut out = vec![0f32; x.len()];
    let rows = |((o, xr), gr): ((&mut [f32], &[f32]), &[f32])| row(xr, gr, o);
    if x.len() < PARALLEL_GATED {
        out.chunks_mut(n).zip(x.chunks(n)).zip(g.chunks(n)).for_each(rows);
    } else {
        out.par_chunks_mut(n)
            .zip(x.par_chunks(n))
            .zip(g.par_chunks(n))
            .for_each(rows);
    }
    Ok(vec![CpuStorage::from_vec(out)])
}

/// Elements from which the gated activations split their rows over threads.
const PARALLEL_GATED: usize = 1 << 15;

/// GGML's row function of a gated activation.
fn gate_row(act: GateActivation) -> fn(&[f32], &[f32], &mut [f32]) {
    match act {
        GateActivation::GeGlu => super::geglu::geglu_row,
        GateActivation::SwiGlu => super::swiglu::swiglu_row,
    }
}

/// `act(x, g)` row by row over rows of `n` values, written over `x`: the
/// values of `Op::SwiGlu` / `Op::GeGlu` (`gated`) without an output
/// tensor (`Op::QMatMulGated`). Each row goes through a 256-value buffer:
/// the row functions treat every whole 16-value block alike wherever it
/// starts, and only a row's tail past its last whole block differently,
/// which stays the tail of the row's last piece (256 is a multiple of 16).
pub(crate) fn gated_rows_in_place(act: GateActivation, x: &mut [f32], g: &[f32], n: usize) {
    const PIECE: usize = 256;
    let row = gate_row(act);
    let n = n.max(1);
    let rows = |(xr, gr): (&mut [f32], &[f32])| {
        let mut buf = [0f32; PIECE];
        for (xc, gc) in xr.chunks_mut(PIECE).zip(gr.chunks(PIECE)) {
            let out = &mut buf[..xc.len()];
            row(xc, gc, out);
            xc.copy_from_slice(out);
        }
    };
    if x.len() < PARALLEL_GATED {
        x.chunks_mut(n).zip(g.chunks(n)).for_each(rows);
    } else {
        x.par_chunks_mut(n).zip(g.par_chunks(n)).for_each(rows);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::CpuStorage;
    use rustorch_core::layout::Layout;

    fn input<'a>(storage: &'a CpuStorage, layout: &'a Layout) -> CpuInput<'a> {
        CpuInput { storage, layout }
    }

    /// `attend` with and without its grouped paths on random inputs:
    /// `[hq, t, d]` queries, `[hkv, l, d]` keys, `[hkv, dv, l]` values, and
    /// row `i` seeing keys `visible(i, j)`; returns both outputs.
    #[allow(clippy::too_many_arguments)]
    fn grouped_and_single(
        (hq, hkv, t, l, d, dv): (usize, usize, usize, usize, usize, usize),
        spread: f32,
        scale: f32,
        visible: impl Fn(usize, usize) -> bool,
    ) -> (Vec<f32>, Vec<f32>) {
        let mut seed = 7u64;
        let mut next = || {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * spread
        };
        let q: Vec<f32> = (0..hq * t * d).map(|_| next()).collect();
        let k: Vec<f16> = (0..hkv * l * d).map(|_| f16::from_f32(next())).collect();
        let v: Vec<f16> = (0..hkv * dv * l).map(|_| f16::from_f32(next())).collect();
        let mut mask = Vec::with_capacity(t * l);
        for i in 0..t {
            mask.extend((0..l).map(|j| if visible(i, j) { 0f32 } else { f32::NEG_INFINITY }));
        }
        let (qs, ks, vs, ms) = (
            CpuStorage::from_vec(q),
            CpuStorage::from_vec(k),
            CpuStorage::from_vec(v),
            CpuStorage::from_vec(mask),
        );
        let (ql, kl, vl, ml) = (
            Layout::contiguous([hq, t, d]),
            Layout::contiguous([hkv, l, d]),
            Layout::contiguous([hkv, dv, l]),
            Layout::contiguous([t, l]),
        );
        let inputs = [input(&qs, &ql), input(&ks, &kl), input(&vs, &vl), input(&ms, &ml)];
        let op = Op::CachedAttention { scale };
        let grouped = attend(&op, &inputs, scale, true).unwrap();
        let single = attend(&op, &inputs, scale, false).unwrap();
        let g = grouped[0].as_slice::<f32>().unwrap().to_vec();
        let s = single[0].as_slice::<f32>().unwrap().to_vec();
        assert_eq!(g.len(), hq * t * dv);
        (g, s)
    }

    fn assert_same_bits(g: &[f32], s: &[f32], what: &str) {
        for (i, (a, b)) in g.iter().zip(s).enumerate() {
            assert_eq!(a.to_bits(), b.to_bits(), "{what}: output {i}: {a} vs {b}");
        }
    }

    /// The four-row path gives the one-row path's bits: grouped-query
    /// heads, a cache longer than the used positions (masked), rows with
    /// different visible keys and spans.
    #[test]
    fn four_row_groups_equal_single_rows() {
        let n_past = 70;
        let (g, s) = grouped_and_single((4, 2, 8, 192, 64, 64), 4.0, 0.125, |i, j| j <= n_past + i * 9);
        assert_same_bits(&g, &s, "four rows");
        // Query counts that are not whole groups of four (a prompt's last
        // micro-batch): each head's last group is partial.
        for t in [2, 5, 7, 10] {
            let (g, s) = grouped_and_single((4, 2, t, 192, 64, 64), 4.0, 0.125, |i, j| j <= n_past + i * 9);
            assert_same_bits(&g, &s, &format!("{t} rows"));
        }
    }

    /// The four-row path's softmax rows (computed over each row's visible
    /// blocks only, on scratch that holds earlier groups' scores): sharp
    /// scores whose probabilities underflow in some rows' blocks only, a
    /// mask with a hole in some rows, and a row that sees no key (GGML's
    /// NaN row) give the one-row path's bits.
    #[test]
    fn four_row_softmax_spans_equal_single_rows() {
        // One thread, so that one worker's scratch serves every group.
        let pool = rayon::ThreadPoolBuilder::new().num_threads(1).build().unwrap();
        let visible =
            |i: usize, j: usize| i != 5 && j <= 70 + i * 9 && !(i.is_multiple_of(3) && (64..140).contains(&j));
        for (t, spread) in [(8, 4.0), (8, 40.0), (7, 40.0), (12, 12.0)] {
            let (g, s) = pool.install(|| grouped_and_single((4, 2, t, 256, 64, 64), spread, 0.125, visible));
            assert_same_bits(&g, &s, &format!("{t} rows, spread {spread}"));
            assert!(g.iter().any(|v| v.is_nan()), "the hidden row's NaN");
        }
        // A sliding window: the rows of a group start at different blocks,
        // after rows of earlier groups that saw those blocks.
        let window = |i: usize, j: usize| j <= 70 + i * 9 && j + 100 > 70 + i * 9;
        for t in [8, 16, 11] {
            let (g, s) = pool.install(|| grouped_and_single((4, 2, t, 256, 64, 64), 4.0, 0.125, window));
            assert_same_bits(&g, &s, &format!("window, {t} rows"));
        }
    }

    /// The long-cache form of the four-row path (one key/value head
    /// widened at a time) gives the same bits.
    #[test]
    fn four_row_groups_one_head_at_a_time_equal_single_rows() {
        WIDE_LIMIT.with(|c| c.set(0));
        let (g, s) = grouped_and_single((8, 2, 8, 192, 64, 64), 4.0, 0.125, |i, j| j <= 70 + i * 9);
        let (g7, s7) = grouped_and_single((8, 2, 7, 192, 64, 64), 4.0, 0.125, |i, j| j <= 70 + i * 9);
        WIDE_LIMIT.with(|c| c.set(WIDE_ALL_BYTES));
        assert_same_bits(&g, &s, "one head at a time");
        assert_same_bits(&g7, &s7, "one head at a time, 7 rows");
    }

    /// The one-position path (query heads of a key/value head together)
    /// gives the one-head path's bits: groups of 8, 3, 5 and 1 heads (tasks
    /// of 4, 3, 1 and 1), head sizes 64 and 128, a sliding window's hole,
    /// a cache length that is not whole 64-element steps (the fallback),
    /// and sharp scores whose probabilities underflow to zero in some
    /// heads' blocks only, so that the heads' nonzero spans differ.
    #[test]
    fn one_position_head_groups_equal_single_heads() {
        let shapes = [
            (16, 2, 1, 256, 64, 64),
            (6, 2, 1, 192, 64, 64),
            (5, 1, 1, 128, 128, 128),
            (2, 2, 1, 64, 64, 64),
            (8, 1, 1, 200, 64, 64),
        ];
        for shape in shapes {
            let l = shape.3;
            for (spread, scale) in [(4.0, 0.125), (8.0, 2.0)] {
                let (g, s) = grouped_and_single(shape, spread, scale, |_, j| j < l - 20 && !(30..100).contains(&j));
                assert_same_bits(&g, &s, &format!("{shape:?} spread {spread} scale {scale}"));
            }
        }
    }
}
