//! F32, F16 and BF16 weights, as llama.cpp multiplies them: the
//! activations brought to the weight type (`QuantizedRows`; f32 stays
//! f32), then tinyBLAS's order from two activation rows on (when the
//! weight rows are a multiple of 4 and the row length of its step) or
//! `ggml_vec_dot_*`'s otherwise. `crate::ggml::floatdot` (f16, f32)
//! and `bf16dot` have both orders; the attention products share them.
//!
//! Speed: the vec order (every matvec) hands out chunks of 64 weight rows
//! to the threads in turn, as GGML does (both cores then stream nearby
//! memory; halves of the matrix measured 5-10% slower), computes four
//! rows per call for F32 (independent FMA chains sharing each activation
//! load) and one for F16 and BF16, whose activation row F16 widens to f32
//! once, and prefetches the 16-bit weights ahead (`cpu::ggml::
//! PREFETCH_AHEAD_BYTES`); weights must start on a cache line for any of
//! this to matter (a 64-byte load across two lines costs two). The tinyBLAS
//! order (prompt batches) computes four weight rows by six activation rows
//! per call, as tinyBLAS itself does (24 accumulators, ten loads per 24
//! FMAs; 4x4 measured 1.5x slower for F32 and F16), on tiles of weight
//! rows that stay in L2 while activation rows go past them.

use super::{OutPtr, QMatRef, QuantizedRows};
use crate::ggml::bf16dot;
use crate::ggml::floatdot::{self, FloatOrder};
use half::{bf16, f16};
use rayon::prelude::*;
use rustorch_core::quant::QType;
use std::borrow::Cow;

/// One float weight type's dot products in llama.cpp's orders.
trait FloatDot: floatdot::Elem {
    /// Whether the vec order takes four weight rows per call (else one).
    /// Measured on this project's AMD Zen 4 machine, 2 threads, weights
    /// on cache lines: four rows ~10% faster for F32, one row 20-25%
    /// faster for F16 (widened activations) and no worse for BF16.
    const FOUR_ROW_MATVEC: bool = false;
    /// tinyBLAS's step (its `KN`) on this CPU.
    fn tiny_step() -> usize {
        16
    }
    fn rows4(order: FloatOrder, w: [&[Self]; 4], x: &[Self]) -> [f32; 4] {
        floatdot::dot_rows(order, w, x)
    }
    fn rows1(order: FloatOrder, w: &[Self], x: &[Self]) -> f32 {
        floatdot::dot(order, w, x)
    }
    /// Four weight rows against `C` activation rows in tinyBLAS's order.
    fn tiny_tile<const C: usize>(w: [&[Self]; 4], x: [&[Self]; C]) -> [[f32; C]; 4] {
        floatdot::dot_tiny_tile(w, x)
    }
    /// Little-endian bytes as values (every bit pattern is one).
    fn from_le(b: &[u8]) -> Self;
    /// Whether the vec order loads a matvec's activations widened to f32
    /// once (exact) rather than converting them at every load.
    const WIDEN_MATVEC_ACT: bool = false;
    fn to_f32(self) -> f32;
}

impl FloatDot for f32 {
    const FOUR_ROW_MATVEC: bool = true;
    fn from_le(b: &[u8]) -> f32 {
        f32::from_le_bytes([b[0], b[1], b[2], b[3]])
    }
    fn to_f32(self) -> f32 {
        self
    }
}

impl FloatDot for f16 {
    const WIDEN_MATVEC_ACT: bool = true;
    fn from_le(b: &[u8]) -> f16 {
        f16::from_le_bytes([b[0], b[1]])
    }
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }
}

impl FloatDot for bf16 {
    fn tiny_step() -> usize {
        bf16dot::tiny_step()
    }
    fn rows4(order: FloatOrder, w: [&[bf16]; 4], x: &[bf16]) -> [f32; 4] {
        bf16dot::dot_rows(order, w, x)
    }
    fn rows1(order: FloatOrder, w: &[bf16], x: &[bf16]) -> f32 {
        bf16dot::dot_rows(order, [w], x)[0]
    }
    fn tiny_tile<const C: usize>(w: [&[bf16]; 4], x: [&[bf16]; C]) -> [[f32; C]; 4] {
        bf16dot::dot_tiny_tile(w, x)
    }
    fn from_le(b: &[u8]) -> bf16 {
        bf16::from_le_bytes([b[0], b[1]])
    }
    fn to_f32(self) -> f32 {
        bf16::to_f32(self)
    }
}

/// `bytes` as values of `E`: borrowed when aligned (GGUF tensors and `Vec`
/// buffers are), else copied.
fn values<E: FloatDot>(bytes: &[u8]) -> Cow<'_, [E]> {
    // SAFETY: `E` is f32, f16 or bf16 (the only `FloatDot` types), for
    // which every bit pattern is a valid value; `align_to` only yields the
    // aligned middle part. x86 and ARM are little-endian, as GGUF is.
    let (pre, mid, post) = unsafe { bytes.align_to::<E>() };
    if pre.is_empty() && post.is_empty() {
        Cow::Borrowed(mid)
    } else {
        let size = std::mem::size_of::<E>();
        Cow::Owned(bytes.chunks_exact(size).map(E::from_le).collect())
    }
}

/// `out = act @ w^T` for F32, F16 or BF16 weights and activations of the
/// same type (shapes checked by the caller).
pub(super) fn product(w: &QMatRef<'_>, act: &QuantizedRows, out: &mut [f32]) {
    match w.qtype() {
        QType::F32 => typed::<f32>(w, act, out),
        QType::F16 => typed::<f16>(w, act, out),
        QType::BF16 => typed::<bf16>(w, act, out),
        other => unreachable!("float_path called for {other}"),
    }
}

/// Weight bytes per tile of the batched order: a tile stays in L2 while
/// activation rows go past it.
const TILE_WEIGHT_BYTES: usize = 256 << 10;
/// Activation rows that a vec-order product widens to f32 up front
/// (`FloatDot::WIDEN_MATVEC_ACT`).
const MAX_WIDENED_ACT_ROWS: usize = 8;
/// Activation rows per tile (whole groups of six).
const TILE_ACT_ROWS: usize = 60;

fn typed<E: FloatDot>(w: &QMatRef<'_>, act: &QuantizedRows, out: &mut [f32]) {
    let (m, n, k) = (act.rows(), w.rows(), w.cols());
    let order = FloatOrder::choose(n, k, m, E::tiny_step());
    let wv = values::<E>(w.bytes());
    let av = values::<E>(act.bytes());
    let (wv, av) = (&wv[..], &av[..]);
    let wrow = |j: usize| &wv[j * k..(j + 1) * k];
    let arow = |i: usize| &av[i * k..(i + 1) * k];
    let out_ptr = OutPtr(out.as_mut_ptr());
    // Writes output (i, j). SAFETY (for every call): i < m and j < n, and
    // only the task that owns weight rows j (and, for tiles, activation
    // rows i) writes it; see `OutPtr`.
    let put = |i: usize, j: usize, v: f32| unsafe { out_ptr.write(i * n + j, v) };

    let row_bytes = k * std::mem::size_of::<E>();
    let threads = rayon::current_num_threads().max(1);
    if order == FloatOrder::VecDot {
        // Chunks of weight rows that each task streams once (per
        // activation row), four at a time where that is faster.
        let chunk = (n / (threads * 8)).clamp(4, 64).next_multiple_of(4);
        let widened: Vec<f32> = if E::WIDEN_MATVEC_ACT && m <= MAX_WIDENED_ACT_ROWS {
            av.iter().map(|v| v.to_f32()).collect()
        } else {
            Vec::new()
        };
        let chunks = n.div_ceil(chunk);
        let next = std::sync::atomic::AtomicUsize::new(0);
        (0..threads.min(chunks)).into_par_iter().for_each(|_| loop {
            let c = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            if c >= chunks {
                break;
            }
            let (j0, j1) = (c * chunk, ((c + 1) * chunk).min(n));
            for i in 0..m {
                let x = arow(i);
                let mut j = j0;
                if !widened.is_empty() {
                    let xf = &widened[i * k..(i + 1) * k];
                    for j in j0..j1 {
                        put(i, j, floatdot::dot_vec_rows_widened([wrow(j)], x, xf)[0]);
                    }
                    continue;
                }
                while E::FOUR_ROW_MATVEC && j + 4 <= j1 {
                    let r = E::rows4(order, [wrow(j), wrow(j + 1), wrow(j + 2), wrow(j + 3)], x);
                    for (d, v) in r.into_iter().enumerate() {
                        put(i, j + d, v);
                    }
                    j += 4;
                }
                for j in j..j1 {
                    put(i, j, E::rows1(order, wrow(j), x));
                }
            }
        });
        return;
    }

    // tinyBLAS order: n is a multiple of 4 (`FloatOrder::choose`).
    let jb = (TILE_WEIGHT_BYTES / row_bytes.max(1))
        .clamp(4, 64)
        .min(n.div_ceil(threads * 4))
        .next_multiple_of(4);
    let ib = m.min(TILE_ACT_ROWS);
    let (nj, ni) = (n.div_ceil(jb), m.div_ceil(ib));
    (0..nj * ni).into_par_iter().for_each(|t| {
        let (j0, i0) = ((t / ni) * jb, (t % ni) * ib);
        let (j1, i1) = ((j0 + jb).min(n), (i0 + ib).min(m));
        // Groups of six activation rows, then of four, then single rows:
        // the same order (tinyBLAS's), only the register tile differs.
        let i = tile_groups::<E, 6>(i0, i1, j0..j1, &wrow, &arow, &put);
        let i = tile_groups::<E, 4>(i, i1, j0..j1, &wrow, &arow, &put);
        tile_groups::<E, 1>(i, i1, j0..j1, &wrow, &arow, &put);
    });
}

/// Activation rows `i..i1` in groups of `C` (while whole groups remain)
/// against weight rows `js` four at a time (`js` holds whole fours), in
/// tinyBLAS's order; returns the first activation row left.
fn tile_groups<'a, E: FloatDot, const C: usize>(
    mut i: usize,
    i1: usize,
    js: std::ops::Range<usize>,
    wrow: &impl Fn(usize) -> &'a [E],
    arow: &impl Fn(usize) -> &'a [E],
    put: &impl Fn(usize, usize, f32),
) -> usize {
    while i + C <= i1 {
        let x: [&[E]; C] = std::array::from_fn(|c| arow(i + c));
        for j in js.clone().step_by(4) {
            let r = E::tiny_tile([wrow(j), wrow(j + 1), wrow(j + 2), wrow(j + 3)], x);
            for (dj, rj) in r.into_iter().enumerate() {
                for (di, v) in rj.into_iter().enumerate() {
                    put(i + di, j + dj, v);
                }
            }
        }
        i += C;
    }
    i
}
