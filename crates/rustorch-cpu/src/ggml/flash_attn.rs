//! Attention over an f16 key/value cache as llama.cpp computes it with
//! flash attention on the CPU (`ggml_compute_forward_flash_attn_ext_f16`,
//! ops.cpp), its default (`-fa auto` turns it on for the CPU).
//!
//! GGML picks one of three paths per op, and each rounds differently:
//!
//! - **Tiled** (its micro-batch has at least 64 query positions,
//!   `ggml_compute_forward_flash_attn_ext_tiled`): keys and values widened
//!   to f32, queries kept in f32. Keys go in tiles of 64 from position 0;
//!   per tile each score is one FMA chain over the head dimension from 0
//!   (`simd_gemm`), times `scale`, plus the mask; a row whose tile is all
//!   -inf skips it; else `M' = max(M, tile max)`, and when it grew the row's
//!   accumulator and sum are multiplied by libm's `expf(M - M')`; the tile's
//!   exponentials are `ggml_vec_soft_max_f32`'s (`ggml_v_expf` per 16 lanes,
//!   each block's horizontal sum added to an f64 that is then added to the
//!   f32 sum), and each output feature continues one FMA chain over the
//!   tile's keys. At the end the row is multiplied by `1 / S` (0 when `S`
//!   is 0).
//! - **One row** (fewer than 64 query positions: token generation, short
//!   prompts; `..._f16_one_chunk`): the query rounded to f16, each visible
//!   key's score a `ggml_vec_dot_f16`, then an online softmax one key at a
//!   time whose value accumulator is f16 (rounded after every step; in
//!   half-precision arithmetic where the build has AVX512-FP16, see
//!   `half_arith`).
//! - **Split keys** (one query position and at least 512 cache positions):
//!   the one-row path over `threads` chunks of the keys, each left
//!   unnormalized, then combined in chunk order
//!   (`ggml_flash_attn_ext_reduce_partials`).
//!
//! Within a path each query row's result depends on nothing but its own
//! inputs, so rows may be grouped and scheduled freely. Keys a row's mask
//! hides add exact zeros (or are skipped, as GGML skips them), so the
//! attended length may be any multiple of 64 covering the visible keys;
//! the split path's chunks are llama.cpp's, from its cache length
//! (`kv_len`, the used positions padded to 256).

use super::attention::{heads_per_task, prefetch, to_f16, visible_keys, widen, Rows, AHEAD};
use super::floatdot::{dot, dot_vec_shared, FloatOrder};
use super::half_arith::{ggml_half, mad_f16, scale_f16, GgmlHalf};
use super::softmax::exp_blocks_ggml;
use crate::copy::input_slice;
use crate::{CpuInput, CpuStorage};
use half::f16;
use rayon::prelude::*;
use rustorch_core::error::BackendError;
use rustorch_core::op::Op;
use std::ops::Range;

/// GGML's key tile (`GGML_FA_TILE_KV`), and its query tile
/// (`GGML_FA_TILE_Q`): a micro-batch of fewer query positions takes the
/// one-row path.
pub(crate) const TILE: usize = 64;

/// Query rows computed together on the tiled path (each key and value
/// loaded meets four rows).
const GROUP_ROWS: usize = 4;

/// Query rows per task of the tiled path: four groups of four, which take
/// each key/value tile in turn while it is in L1. A task of one group
/// streamed every tile (32 KiB of keys and values) from L2 for each four
/// rows, as much as the registers' arithmetic on it.
const BLOCK_ROWS: usize = 4 * GROUP_ROWS;

/// GGML's split-keys path needs at least this many cache positions.
const SPLIT_MIN_KEYS: usize = 512;

/// The parameters of `Op::FlashAttention`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct FlashParams {
    pub scale: f32,
    /// Query rows `0..tiled_rows` take the tiled path, the rest the
    /// one-row path.
    pub tiled_rows: usize,
    /// llama.cpp's attended cache length (`n_kv`) for the split path.
    pub kv_len: usize,
    /// llama.cpp's thread count (the split path's chunk count).
    pub threads: usize,
}

/// Inputs: q f32 `[Hq, T, D]`, k f16 `[Hkv, L, D]`, v f16 `[Hkv, L, Dv]`,
/// mask f32 `[T, L]` (0 or -inf). Returns f32 `[Hq, T, Dv]`.
pub(crate) fn flash_attention(
    op: &Op,
    inputs: &[CpuInput<'_>],
    p: FlashParams,
) -> Result<Vec<CpuStorage>, BackendError> {
    flash_attention_rounding(op, inputs, p, ggml_half())
}

/// `flash_attention` with the one-row path's f16 steps rounding as `half`
/// says (the process's choice, `ggml_half`, in the op).
fn flash_attention_rounding(
    op: &Op,
    inputs: &[CpuInput<'_>],
    p: FlashParams,
    half: GgmlHalf,
) -> Result<Vec<CpuStorage>, BackendError> {
    let q = input_slice::<f32>(op, inputs[0])?;
    let k = Rows::new(op, inputs[1], "keys")?;
    let v = Rows::new(op, inputs[2], "values")?;
    let mask = input_slice::<f32>(op, inputs[3])?;
    let (qd, kd, vd) = (inputs[0].dims(), inputs[1].dims(), inputs[2].dims());
    let a = Attn {
        q: &q,
        k: &k,
        v: &v,
        mask: &mask,
        hq: qd[0],
        t: qd[1],
        d: qd[2],
        hkv: kd[0],
        l: kd[1],
        dv: vd[2],
        scale: p.scale,
        half,
    };
    let mut out = vec![0f32; a.hq * a.t * a.dv];
    if a.dv == 0 || a.t == 0 {
        return Ok(vec![CpuStorage::from_vec(out)]);
    }
    let tiled_rows = p.tiled_rows.min(a.t);
    if tiled_rows > 0 {
        a.tiled(tiled_rows, &mut out);
    }
    if tiled_rows < a.t {
        if a.t == 1 && p.kv_len >= SPLIT_MIN_KEYS && p.threads > 1 {
            a.split_keys(p.kv_len, p.threads, &mut out);
        } else {
            a.one_rows(tiled_rows, &mut out);
        }
    }
    Ok(vec![CpuStorage::from_vec(out)])
}

/// The operands and sizes of one op.
struct Attn<'a> {
    q: &'a [f32],
    k: &'a Rows<'a>,
    v: &'a Rows<'a>,
    mask: &'a [f32],
    hq: usize,
    t: usize,
    d: usize,
    hkv: usize,
    l: usize,
    dv: usize,
    scale: f32,
    /// How the one-row path's f16 accumulator steps round (the build's
    /// `ggml_vec_mad_f16`, `ggml_vec_scale_f16`).
    half: GgmlHalf,
}

impl Attn<'_> {
    fn group(&self) -> usize {
        self.hq / self.hkv
    }

    fn q_row(&self, h: usize, i: usize) -> &[f32] {
        let at = (h * self.t + i) * self.d;
        &self.q[at..at + self.d]
    }

    fn mask_row(&self, i: usize) -> &[f32] {
        &self.mask[i * self.l..(i + 1) * self.l]
    }

    /// The tiled path for query rows `0..rows` of every head: one flat
    /// list of tasks (a head's block of `BLOCK_ROWS` rows each) claimed one
    /// at a time, the blocks that see the most keys first. Under the causal
    /// mask a prompt's last block costs many times its first; claimed
    /// largest first, the small ones even out the threads at the end.
    fn tiled(&self, rows: usize, out: &mut [f32]) {
        let (t, dv) = (self.t, self.dv);
        let visible = visible_keys(self.mask, rows, self.l);
        let wide = WideKv::new(self);
        let blocks = rows.div_ceil(BLOCK_ROWS);
        let out = RowsOut(out.as_mut_ptr());
        crate::team::for_each_single(self.hq * blocks, |task| {
            let (h, b) = (task / blocks, blocks - 1 - task % blocks);
            let i0 = b * BLOCK_ROWS;
            let n = (rows - i0).min(BLOCK_ROWS);
            // SAFETY: this task alone writes rows i0..i0 + n of head h, which
            // lie within `out` (`Hq x T x Dv`).
            let o = unsafe { out.row((h * t + i0) * dv, n * dv) };
            self.tiled_block(&wide, &visible[i0..i0 + n], h, i0, o);
        });
    }

    /// Rows `i0..i0 + n` (`n = visible.len()`, at most `BLOCK_ROWS`) of
    /// head `h` through the tiled path into `out` (`n x Dv`): for each key
    /// tile, each group of four rows that sees any of it. Every row's steps
    /// are those of its group alone, in tile order.
    fn tiled_block(&self, wide: &WideKv, visible: &[Option<Range<usize>>], h: usize, i0: usize, out: &mut [f32]) {
        let (d, dv, n, hk) = (self.d, self.dv, visible.len(), h / self.group());
        // The value accumulators of the block's rows.
        let mut acc = vec![0f32; n.div_ceil(GROUP_ROWS) * GROUP_ROWS * dv];
        let mut m = [f32::NEG_INFINITY; BLOCK_ROWS];
        let mut sum = [0f32; BLOCK_ROWS];
        // Each group's tiles: from the one holding its first visible key to
        // its last visible key (none when no row of it sees a key).
        let tiles: Vec<Option<Range<usize>>> = visible
            .chunks(GROUP_ROWS)
            .map(|rows| {
                rows.iter()
                    .flatten()
                    .cloned()
                    .reduce(|a, b| a.start.min(b.start)..a.end.max(b.end))
                    .map(|span| span.start / TILE * TILE..span.end)
            })
            .collect();
        let Some(all) = tiles
            .iter()
            .flatten()
            .cloned()
            .reduce(|a, b| a.start.min(b.start)..a.end.max(b.end))
        else {
            // No row sees any key: S = 0, so GGML writes zeros.
            out.fill(0.0);
            return;
        };
        // `qk_tile` writes every score of a group: no clearing per tile.
        let mut scores = [[0f32; TILE]; GROUP_ROWS];
        for c in all.step_by(TILE) {
            let live = TILE.min(self.l - c);
            for (g, span) in tiles.iter().enumerate() {
                if !span.as_ref().is_some_and(|span| span.contains(&c)) {
                    continue;
                }
                let r0 = g * GROUP_ROWS;
                let ng = (n - r0).min(GROUP_ROWS);
                // Padding rows repeat the group's last real one; their
                // results are dropped.
                let q: [&[f32]; GROUP_ROWS] = std::array::from_fn(|r| self.q_row(h, i0 + r0 + r.min(ng - 1)));
                let acc = &mut acc[r0 * dv..(r0 + GROUP_ROWS) * dv];
                qk_tile(q, wide.kt(hk), wide.lp, c, d, &mut scores);
                let mut any = false;
                for r in 0..ng {
                    let row = &mut scores[r];
                    let tile_max = scale_mask_max(row, &self.mask_row(i0 + r0 + r)[c..c + live], self.scale);
                    if tile_max == f32::NEG_INFINITY {
                        row.fill(0.0);
                        continue;
                    }
                    any = true;
                    let (mr, sr) = (&mut m[r0 + r], &mut sum[r0 + r]);
                    let m_new = mr.max(tile_max);
                    if m_new > *mr {
                        // libm's expf, as GGML's scalar `expf`.
                        let ms = (*mr - m_new).exp();
                        for a in &mut acc[r * dv..(r + 1) * dv] {
                            *a *= ms;
                        }
                        *sr *= ms;
                    }
                    *mr = m_new;
                    *sr = (*sr as f64 + exp_blocks_ggml(row, m_new)) as f32;
                }
                if !any {
                    continue;
                }
                for row in scores.iter_mut().skip(ng) {
                    row.fill(0.0);
                }
                pv_tile(&scores, wide.v(hk), c, live, dv, acc);
            }
        }
        for r in 0..n {
            normalize_into(&acc[r * dv..(r + 1) * dv], sum[r], &mut out[r * dv..(r + 1) * dv]);
        }
    }

    /// The one-row path for query rows `from..T` of every head.
    fn one_rows(&self, from: usize, out: &mut [f32]) {
        let (t, dv) = (self.t, self.dv);
        let n = heads_per_task(self.group());
        let rows = t - from;
        let tasks = self.hq / n * rows;
        let out = RowsOut(out.as_mut_ptr());
        let work = |k: usize| {
            let (h0, i) = (k / rows * n, from + k % rows);
            for (r, p) in self.heads(h0, n, i, 0..self.l).iter().enumerate() {
                // SAFETY: task k alone writes row i of heads h0..h0 + n, and
                // every such row lies within `out` (`Hq x T x Dv`).
                p.normalized_into(unsafe { out.row(((h0 + r) * t + i) * dv, dv) });
            }
        };
        if tasks * n * self.l * (self.d + dv) < 1 << 16 {
            (0..tasks).for_each(work);
        } else {
            // A decode step's attention: a few tasks of a few microseconds,
            // started through the pass's team (`crate::team`).
            crate::team::for_each(tasks, work);
        }
    }

    /// GGML's one-row online softmax for query row `i` of heads `h0..h0 +
    /// n` (one key/value head's) over keys `keys`, unnormalized.
    fn heads(&self, h0: usize, n: usize, i: usize, keys: Range<usize>) -> Vec<Partial> {
        match n {
            4 => self.one_heads::<4>(h0, i, keys).into(),
            3 => self.one_heads::<3>(h0, i, keys).into(),
            2 => self.one_heads::<2>(h0, i, keys).into(),
            _ => (h0..h0 + n)
                .map(|h| self.one_heads::<1>(h, i, keys.clone())[0].clone())
                .collect(),
        }
    }

    /// `heads` for `N` heads: each key row is read (and its scores formed)
    /// once for all of them, and each value row widened once; every head's
    /// steps are its own, in key order.
    fn one_heads<const N: usize>(&self, h0: usize, i: usize, keys: Range<usize>) -> [Partial; N] {
        let (d, dv) = (self.d, self.dv);
        let hk = h0 / self.group();
        let q16: [Vec<f16>; N] = std::array::from_fn(|r| to_f16(self.q_row(h0 + r, i)));
        let q32: [Vec<f32>; N] = std::array::from_fn(|r| widen(&q16[r]));
        let mask = self.mask_row(i);
        let end = keys.end.min(self.l);
        // Rows of 64 values are shorter than one native f16 step, so every
        // build rounds them alike (`half_arith`): one kernel serves both.
        #[cfg(target_arch = "x86_64")]
        if dv == 64 && d.is_multiple_of(64) && super::has_avx512() {
            let q: [&[f32]; N] = std::array::from_fn(|r| &q32[r][..]);
            // SAFETY: AVX-512 F, FMA and F16C are present (checked above);
            // queries and key rows hold `d` values, a multiple of 64, and
            // value rows 64; keys `keys.start..end` exist.
            let (m, sum, acc) =
                unsafe { avx512::one_heads_64(q, self.k, self.v, hk, &mask[..end], keys.start, self.scale) };
            return std::array::from_fn(|r| Partial {
                m: m[r],
                sum: sum[r],
                acc: acc[r].to_vec(),
            });
        }
        let mut m = [f32::NEG_INFINITY; N];
        let mut sum = [0f32; N];
        let mut acc: [Vec<f32>; N] = std::array::from_fn(|_| vec![0f32; dv]);
        for (j, &mv) in mask.iter().enumerate().take(end).skip(keys.start) {
            if mv == f32::NEG_INFINITY {
                continue;
            }
            prefetch(self.k.row_from(hk, j + AHEAD, d));
            prefetch(self.v.row_from(hk, j + AHEAD, dv));
            let key = self.k.row(hk, j);
            // The same products in the same order as `dot` (floatdot.rs).
            let s: [f32; N] = dot_vec_shared(std::array::from_fn(|r| &q32[r][..]), key)
                .unwrap_or_else(|| std::array::from_fn(|r| dot(FloatOrder::VecDot, key, &q16[r])));
            let vrow = self.v.row(hk, j);
            for r in 0..N {
                let s = s[r] * self.scale + mv;
                let (ms, vs) = if s > m[r] {
                    let ms = (m[r] - s).exp();
                    m[r] = s;
                    scale_f16(&mut acc[r], ms, self.half);
                    (ms, 1.0)
                } else {
                    (1.0, (s - m[r]).exp())
                };
                mad_f16(&mut acc[r], vrow, vs, self.half);
                // `S = S*ms + vs`, which GCC and clang contract into one FMA.
                sum[r] = sum[r].mul_add(ms, vs);
            }
        }
        let mut acc = acc.into_iter();
        std::array::from_fn(|r| Partial {
            m: m[r],
            sum: sum[r],
            acc: acc.next().expect("one accumulator per head"),
        })
    }

    /// GGML's split-keys path for one query position: `threads` chunks of
    /// `kv_len` keys, combined in order.
    fn split_keys(&self, kv_len: usize, threads: usize, out: &mut [f32]) {
        let chunk = kv_len.div_ceil(threads);
        let starts: Vec<usize> = (0..threads).map(|c| c * chunk).filter(|&s| s < kv_len).collect();
        let n = heads_per_task(self.group());
        out.par_chunks_mut(n * self.dv).enumerate().for_each(|(g, o)| {
            let per_chunk: Vec<Vec<Partial>> = starts
                .iter()
                .map(|&s| self.heads(g * n, n, 0, s..(s + chunk).min(kv_len)))
                .collect();
            for (r, o) in o.chunks_mut(self.dv).enumerate() {
                let parts: Vec<&Partial> = per_chunk.iter().map(|ps| &ps[r]).collect();
                combine(&parts, o);
            }
        });
    }
}

/// A buffer written by parallel tasks that each own some of its rows: the
/// output (both paths) and the widened keys and values (`WideKv::new`).
struct RowsOut(*mut f32);

// SAFETY: tasks write disjoint rows (see `one_rows`, `tiled`, `WideKv::new`).
unsafe impl Sync for RowsOut {}

impl RowsOut {
    /// `len` outputs from `at`.
    ///
    /// # Safety
    /// They lie within the output, and no other task touches them meanwhile.
    #[allow(clippy::mut_from_ref)]
    unsafe fn row(&self, at: usize, len: usize) -> &mut [f32] {
        // SAFETY: forwarded from the caller.
        unsafe { std::slice::from_raw_parts_mut(self.0.add(at), len) }
    }
}

/// One row's unnormalized result over some keys: the running max, the sum
/// of exponentials and the value accumulator (f16 values widened).
#[derive(Clone)]
struct Partial {
    m: f32,
    sum: f32,
    acc: Vec<f32>,
}

impl Partial {
    /// `acc / sum` (zeros when the sum is 0) into `out`.
    fn normalized_into(&self, out: &mut [f32]) {
        normalize_into(&self.acc, self.sum, out);
    }
}

/// `out = acc * (1 / sum)`, zeros when `sum` is 0 (GGML's `V /= S`: one
/// reciprocal, then a product per element).
fn normalize_into(acc: &[f32], sum: f32, out: &mut [f32]) {
    let inv = if sum == 0.0 { 0.0 } else { 1.0 / sum };
    for (o, &a) in out.iter_mut().zip(acc) {
        *o = a * inv;
    }
}

/// `ggml_flash_attn_ext_reduce_partials` for one head: chunks combined in
/// order (a chunk whose sum is 0 skipped), then normalized.
fn combine(parts: &[&Partial], out: &mut [f32]) {
    let mut m = f32::NEG_INFINITY;
    let mut sum = 0f32;
    let mut acc = vec![0f32; out.len()];
    for p in parts {
        if p.sum == 0.0 {
            continue;
        }
        let m_new = m.max(p.m);
        let scale_old = (m - m_new).exp();
        let scale_new = (p.m - m_new).exp();
        // `a * scale_old + b * scale_new`: GCC and clang fuse the first
        // product into the addition.
        for (a, &b) in acc.iter_mut().zip(&p.acc) {
            *a = a.mul_add(scale_old, b * scale_new);
        }
        sum = sum.mul_add(scale_old, p.sum * scale_new);
        m = m_new;
    }
    // (No chunk added anything when the sum is 0: the accumulator is zeros.)
    normalize_into(&acc, sum, out);
}

/// The key/value heads widened to f32 for the tiled path: keys transposed
/// (`kt[dk][j]` per head, so that a tile's 64 keys are four vectors) and
/// values as rows (`v[j][dv]` per head), each padded with zeros to whole
/// tiles.
struct WideKv {
    kt: Vec<f32>,
    v: Vec<f32>,
    /// Positions, padded to whole tiles.
    lp: usize,
    d: usize,
    dv: usize,
}

impl WideKv {
    /// Every head's, in tasks of one head's tile of keys and values.
    fn new(a: &Attn<'_>) -> WideKv {
        let (l, d, dv) = (a.l, a.d, a.dv);
        let lp = l.div_ceil(TILE) * TILE;
        let tiles = lp / TILE;
        let mut kt = vec![0f32; a.hkv * d * lp];
        let mut v = vec![0f32; a.hkv * lp * dv];
        let (kt_out, v_out) = (RowsOut(kt.as_mut_ptr()), RowsOut(v.as_mut_ptr()));
        crate::team::for_each(a.hkv * tiles, |task| {
            let (hk, c) = (task / tiles, task % tiles);
            let keys = c * TILE..(c * TILE + TILE).min(l);
            // The tile's keys widened a row at a time (F16C), then
            // transposed.
            let mut rows = vec![0f32; keys.len() * d];
            for (row, j) in rows.chunks_exact_mut(d).zip(keys.clone()) {
                half::slice::HalfFloatSliceExt::convert_to_f32_slice(a.k.row(hk, j), row);
            }
            for dk in 0..d {
                // SAFETY: this task alone writes keys `keys` of head hk's
                // feature dk, within `kt` (`Hkv x D x lp`).
                let out = unsafe { kt_out.row((hk * d + dk) * lp + keys.start, keys.len()) };
                for (x, row) in out.iter_mut().zip(rows.chunks_exact(d)) {
                    *x = row[dk];
                }
            }
            for j in keys {
                // SAFETY: this task alone writes head hk's value row j,
                // within `v` (`Hkv x lp x Dv`).
                let row = unsafe { v_out.row((hk * lp + j) * dv, dv) };
                half::slice::HalfFloatSliceExt::convert_to_f32_slice(a.v.row(hk, j), row);
            }
        });
        WideKv { kt, v, lp, d, dv }
    }

    /// Head hk's transposed keys (`D x lp`).
    fn kt(&self, hk: usize) -> &[f32] {
        &self.kt[hk * self.d * self.lp..(hk + 1) * self.d * self.lp]
    }

    /// Head hk's value rows (`lp x Dv`).
    fn v(&self, hk: usize) -> &[f32] {
        &self.v[hk * self.lp * self.dv..(hk + 1) * self.lp * self.dv]
    }
}

/// `scores[r][j]` = the FMA chain over `dk` of `q[r][dk] * k[c + j][dk]`
/// from 0 (`simd_gemm`'s order), for the tile's 64 keys.
fn qk_tile(q: [&[f32]; GROUP_ROWS], kt: &[f32], lp: usize, c: usize, d: usize, scores: &mut [[f32; TILE]; GROUP_ROWS]) {
    #[cfg(target_arch = "x86_64")]
    if super::has_avx512() {
        // SAFETY: AVX-512 F is present (checked above); `kt` holds `d` rows
        // of `lp` keys, and `c + 64 <= lp`; each `q[r]` holds `d` values.
        unsafe { avx512::qk_tile(q, kt, lp, c, d, scores) };
        return;
    }
    qk_tile_portable(q, kt, lp, c, d, scores);
}

crate::simd_dispatch! {
    /// `qk_tile` in portable code (compiled with FMA where the CPU has it,
    /// so that `mul_add` is one instruction): each score's chain runs over
    /// `dk` in order as before, the 64 keys side by side.
    fn qk_tile_portable(q: [&[f32]; GROUP_ROWS], kt: &[f32], lp: usize, c: usize, d: usize, scores: &mut [[f32; TILE]; GROUP_ROWS]) {
        for (r, row) in scores.iter_mut().enumerate() {
            *row = [0f32; TILE];
            for dk in 0..d {
                let (k, qv) = (&kt[dk * lp + c..dk * lp + c + TILE], q[r][dk]);
                for (s, &kv) in row.iter_mut().zip(k) {
                    *s = kv.mul_add(qv, *s);
                }
            }
        }
    }
}

/// A tile's scores times `scale` plus the mask (-inf past its `mask.len()`
/// keys), in place; returns their maximum (exact in any order: no score is
/// NaN).
fn scale_mask_max(row: &mut [f32; TILE], mask: &[f32], scale: f32) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if super::has_avx512() {
        // SAFETY: AVX-512 F is present (checked above); `mask` has at most
        // 64 elements (a tile's keys).
        return unsafe { avx512::scale_mask_max(row, mask, scale) };
    }
    for (j, x) in row.iter_mut().enumerate() {
        *x = match mask.get(j) {
            Some(&m) => *x * scale + m,
            None => f32::NEG_INFINITY,
        };
    }
    row.iter().fold(f32::NEG_INFINITY, |a, &b| if b > a { b } else { a })
}

/// `acc[r][e]` continues its FMA chain with `p[r][j] * v[c + j][e]` for the
/// tile's first `live` keys in order (`simd_gemm`'s order; the keys after
/// `live` have probability 0, which adds nothing).
fn pv_tile(p: &[[f32; TILE]; GROUP_ROWS], v: &[f32], c: usize, live: usize, dv: usize, acc: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if dv.is_multiple_of(16) && super::has_avx512() {
        // SAFETY: AVX-512 F is present (checked above); `v` holds rows
        // `c..c + live` of `dv` values, `acc` four rows of `dv`.
        unsafe { avx512::pv_tile(p, v, c, live, dv, acc) };
        return;
    }
    pv_tile_portable(p, v, c, live, dv, acc);
}

crate::simd_dispatch! {
    /// `pv_tile` in portable code (compiled with FMA where the CPU has it).
    fn pv_tile_portable(p: &[[f32; TILE]; GROUP_ROWS], v: &[f32], c: usize, live: usize, dv: usize, acc: &mut [f32]) {
        for (r, pr) in p.iter().enumerate() {
            let a = &mut acc[r * dv..(r + 1) * dv];
            for (j, &pj) in pr[..live].iter().enumerate() {
                let vr = &v[(c + j) * dv..(c + j + 1) * dv];
                for (x, &y) in a.iter_mut().zip(vr) {
                    *x = y.mul_add(pj, *x);
                }
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
// Register tiles are indexed by row and vector.
#[allow(clippy::needless_range_loop)]
mod avx512 {
    use super::super::attention::{prefetch, Rows, AHEAD};
    use super::super::floatdot::avx512::dot_vec_rows_loading;
    use super::{GROUP_ROWS, TILE};
    use std::arch::x86_64::*;

    /// # Safety
    /// AVX-512 F; `kt` holds `d` rows of `lp` floats with `c + 64 <= lp`;
    /// each `q[r]` holds `d` floats.
    #[target_feature(enable = "avx512f,fma")]
    pub(super) unsafe fn qk_tile(
        q: [&[f32]; GROUP_ROWS],
        kt: &[f32],
        lp: usize,
        c: usize,
        d: usize,
        scores: &mut [[f32; TILE]; GROUP_ROWS],
    ) {
        debug_assert!(c + TILE <= lp && kt.len() >= d * lp && q.iter().all(|r| r.len() >= d));
        let mut acc = [[_mm512_setzero_ps(); 4]; GROUP_ROWS];
        let base = kt.as_ptr().add(c);
        for dk in 0..d {
            let row = base.add(dk * lp);
            let b = [
                _mm512_loadu_ps(row),
                _mm512_loadu_ps(row.add(16)),
                _mm512_loadu_ps(row.add(32)),
                _mm512_loadu_ps(row.add(48)),
            ];
            for r in 0..GROUP_ROWS {
                let p = _mm512_set1_ps(*q[r].get_unchecked(dk));
                for x in 0..4 {
                    acc[r][x] = _mm512_fmadd_ps(b[x], p, acc[r][x]);
                }
            }
        }
        for r in 0..GROUP_ROWS {
            for x in 0..4 {
                _mm512_storeu_ps(scores[r].as_mut_ptr().add(16 * x), acc[r][x]);
            }
        }
    }

    /// # Safety
    /// AVX-512 F; `dv` a multiple of 16; `v` holds rows `c..c + live` of
    /// `dv` floats; `acc` holds four rows of `dv`.
    #[target_feature(enable = "avx512f,fma")]
    pub(super) unsafe fn pv_tile(
        p: &[[f32; TILE]; GROUP_ROWS],
        v: &[f32],
        c: usize,
        live: usize,
        dv: usize,
        acc: &mut [f32],
    ) {
        debug_assert!(v.len() >= (c + live) * dv && acc.len() >= GROUP_ROWS * dv);
        let wide = dv / 64 * 64;
        for e0 in (0..wide).step_by(64) {
            pv_block::<4>(p, v, c, live, dv, e0, acc);
        }
        for e0 in (wide..dv).step_by(16) {
            pv_block::<1>(p, v, c, live, dv, e0, acc);
        }
    }

    /// `pv_tile` for features `e0..e0 + 16 * NV`: `4 x NV` accumulators
    /// kept in registers over the tile's keys.
    #[target_feature(enable = "avx512f,fma")]
    #[inline]
    unsafe fn pv_block<const NV: usize>(
        p: &[[f32; TILE]; GROUP_ROWS],
        v: &[f32],
        c: usize,
        live: usize,
        dv: usize,
        e0: usize,
        acc: &mut [f32],
    ) {
        let mut a = [[_mm512_setzero_ps(); NV]; GROUP_ROWS];
        for r in 0..GROUP_ROWS {
            for x in 0..NV {
                a[r][x] = _mm512_loadu_ps(acc.as_ptr().add(r * dv + e0 + 16 * x));
            }
        }
        let base = v.as_ptr().add(c * dv + e0);
        for j in 0..live {
            let row = base.add(j * dv);
            let b: [__m512; NV] = std::array::from_fn(|x| _mm512_loadu_ps(row.add(16 * x)));
            for r in 0..GROUP_ROWS {
                let pj = _mm512_set1_ps(*p[r].get_unchecked(j));
                for x in 0..NV {
                    a[r][x] = _mm512_fmadd_ps(b[x], pj, a[r][x]);
                }
            }
        }
        for r in 0..GROUP_ROWS {
            for x in 0..NV {
                _mm512_storeu_ps(acc.as_mut_ptr().add(r * dv + e0 + 16 * x), a[r][x]);
            }
        }
    }

    /// `Attn::one_heads` for value rows of 64: each head's accumulator in
    /// four registers over the keys `start..mask.len()` (every head's steps
    /// as there, in key order). Returns each head's (M, S, accumulator).
    ///
    /// # Safety
    /// AVX-512 F, FMA and F16C; every `q[r]` and key row of one length, a
    /// multiple of 64; value rows of 64; keys `..mask.len()` exist.
    #[target_feature(enable = "avx512f,avx512vl,fma,f16c")]
    pub(super) unsafe fn one_heads_64<const N: usize>(
        q: [&[f32]; N],
        k: &Rows<'_>,
        v: &Rows<'_>,
        hk: usize,
        mask: &[f32],
        start: usize,
        scale: f32,
    ) -> ([f32; N], [f32; N], [[f32; 64]; N]) {
        let d = q[0].len();
        let mut m = [f32::NEG_INFINITY; N];
        let mut sum = [0f32; N];
        let mut acc = [[_mm512_setzero_ps(); 4]; N];
        for (j, &mv) in mask.iter().enumerate().skip(start) {
            if mv == f32::NEG_INFINITY {
                continue;
            }
            prefetch(k.row_from(hk, j + AHEAD, d));
            prefetch(v.row_from(hk, j + AHEAD, 64));
            let key = k.row(hk, j);
            let s: [f32; N] = dot_vec_rows_loading(q, q[0], key);
            let vp = v.row(hk, j).as_ptr();
            let vv: [__m512; 4] = std::array::from_fn(|e| _mm512_cvtph_ps(_mm256_loadu_si256(vp.add(16 * e).cast())));
            for r in 0..N {
                let x = s[r] * scale + mv;
                let (ms, vs) = if x > m[r] {
                    let ms = (m[r] - x).exp();
                    m[r] = x;
                    let msv = _mm512_set1_ps(ms);
                    for e in 0..4 {
                        acc[r][e] = round_f16(_mm512_mul_ps(acc[r][e], msv));
                    }
                    (ms, 1.0)
                } else {
                    (1.0, (x - m[r]).exp())
                };
                let vsv = _mm512_set1_ps(vs);
                for e in 0..4 {
                    acc[r][e] = round_f16(_mm512_fmadd_ps(vv[e], vsv, acc[r][e]));
                }
                sum[r] = sum[r].mul_add(ms, vs);
            }
        }
        let mut out = [[0f32; 64]; N];
        for r in 0..N {
            for e in 0..4 {
                _mm512_storeu_ps(out[r].as_mut_ptr().add(16 * e), acc[r][e]);
            }
        }
        (m, sum, out)
    }

    /// Each lane rounded to f16 (to nearest even) and widened back.
    #[target_feature(enable = "avx512f,f16c")]
    #[inline]
    unsafe fn round_f16(x: __m512) -> __m512 {
        _mm512_cvtph_ps(_mm512_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(x))
    }

    /// # Safety
    /// AVX-512 F; `mask.len() <= 64`.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn scale_mask_max(row: &mut [f32; TILE], mask: &[f32], scale: f32) -> f32 {
        debug_assert!(mask.len() <= TILE);
        let sv = _mm512_set1_ps(scale);
        let ninf = _mm512_set1_ps(f32::NEG_INFINITY);
        let mut mx = ninf;
        for x in 0..4 {
            let lo = 16 * x;
            let n = mask.len().saturating_sub(lo).min(16);
            let keep: __mmask16 = if n == 16 { 0xffff } else { (1u16 << n) - 1 };
            let m = _mm512_mask_loadu_ps(ninf, keep, mask.as_ptr().add(lo.min(mask.len())));
            // (x * scale rounded, then + mask rounded: two steps, as GGML.)
            let v = _mm512_add_ps(_mm512_mul_ps(_mm512_loadu_ps(row.as_ptr().add(lo)), sv), m);
            let v = _mm512_mask_blend_ps(keep, ninf, v);
            _mm512_storeu_ps(row.as_mut_ptr().add(lo), v);
            mx = _mm512_max_ps(mx, v);
        }
        _mm512_reduce_max_ps(mx)
    }
}

#[cfg(test)]
mod tests;
