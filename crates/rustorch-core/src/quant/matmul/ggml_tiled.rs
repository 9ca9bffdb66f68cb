//! K-quant products of eight or more activation rows, in the order of
//! llama.cpp's tiled matmul (ggml-cpu/tiled/, taken by
//! `ggml_compute_forward_mul_mat` before `vec_dot` when `src1` has at
//! least 8 rows and the weights are not repacked; its AVX-512 VNNI
//! microkernel `tiled_run_micro_vnni_8x16` is what a native build runs).
//!
//! Per output and per super-block it sums exact integers over the whole
//! super-block, `s1 = sum_s scale_s * (codes_s . q8_s - BIAS * bsum_s)` and
//! (types with mins) `s2 = sum_s min_s * bsum_s`, then
//!
//! ```text
//! r   = f32(s1) * d_w
//! r   = fma(-dmin_w, f32(s2), r)        (types with mins)
//! acc = acc + r * d_a                   (once per super-block, in order)
//! ```
//!
//! where the codes are the weight's unsigned quants and BIAS the offset
//! that makes them so (32 for Q6_K). The integer sums equal the
//! mathematical ones, so any exact method gives llama.cpp's bits.

use super::{OutPtr, QMatRef, QuantizedRows};
use crate::quant::blocks::{cast_blocks, f16_to_f32, scale_min_k4, Block, BlockQ4K, BlockQ5K, BlockQ6K, BlockQ8K};
use crate::quant::QType;
use rayon::prelude::*;

/// The fewest activation rows for which llama.cpp takes the tiled path.
pub(super) const MIN_ROWS: usize = 8;

/// Whether llama.cpp's tiled path multiplies (unrepacked) weights of this
/// type, from `MIN_ROWS` activation rows on.
pub(super) fn applies(qtype: QType) -> bool {
    matches!(qtype, QType::Q4K | QType::Q5K | QType::Q6K)
}

/// One super-block's share of an output: `f32(s1) * d_w`, minus
/// `dmin_w * f32(s2)` by one FMA where the type has mins.
trait Tiled: Block {
    fn block_term(x: &Self, y: &BlockQ8K) -> f32;
}

/// The sums of the activation's eight 32-value groups.
#[inline(always)]
fn group_sums(y: &BlockQ8K) -> [i32; 8] {
    std::array::from_fn(|g| y.bsum(2 * g) as i32 + y.bsum(2 * g + 1) as i32)
}

/// `s1` and `s2` of a Q4_K/Q5_K block whose unsigned quant `e` (0..32) of
/// group `g` is `q(g, e)`.
#[inline(always)]
fn k4_sums(scales: &[u8; 12], y: &BlockQ8K, q: impl Fn(usize, usize) -> i32) -> (i32, i32) {
    let q8s = group_sums(y);
    let (mut s1, mut s2) = (0i32, 0i32);
    for g in 0..8 {
        let (sc, mn) = scale_min_k4(g, scales);
        let a = &y.qs[32 * g..32 * g + 32];
        let raw: i32 = (0..32).map(|e| q(g, e) * a[e] as i32).sum();
        s1 += sc as i32 * raw;
        s2 += mn as i32 * q8s[g];
    }
    (s1, s2)
}

#[inline(always)]
fn with_mins(s1: i32, s2: i32, d: [u8; 2], dmin: [u8; 2]) -> f32 {
    let r = s1 as f32 * f16_to_f32(d);
    (-f16_to_f32(dmin)).mul_add(s2 as f32, r)
}

impl Tiled for BlockQ4K {
    fn block_term(x: &Self, y: &BlockQ8K) -> f32 {
        let (s1, s2) = k4_sums(&x.scales, y, |g, e| ((x.qs[32 * (g / 2) + e] >> (4 * (g % 2))) & 0xF) as i32);
        with_mins(s1, s2, x.d, x.dmin)
    }
}

impl Tiled for BlockQ5K {
    fn block_term(x: &Self, y: &BlockQ8K) -> f32 {
        let (s1, s2) = k4_sums(&x.scales, y, |g, e| {
            let lo = (x.qs[32 * (g / 2) + e] >> (4 * (g % 2))) & 0xF;
            (lo | ((x.qh[e] >> g) & 1) << 4) as i32
        });
        with_mins(s1, s2, x.d, x.dmin)
    }
}

impl Tiled for BlockQ6K {
    fn block_term(x: &Self, y: &BlockQ8K) -> f32 {
        let mut s1 = 0i32;
        for c in 0..8 {
            let (h, k) = (c / 4, c % 4);
            for half in 0..2 {
                let mut raw = 0i32;
                for e in 16 * half..16 * half + 16 {
                    let lo = (x.ql[64 * h + 32 * (k % 2) + e] >> (4 * (k / 2))) & 0xF;
                    let hi = (x.qh[32 * h + e] >> (2 * k)) & 3;
                    raw += (lo | hi << 4) as i32 * y.qs[32 * c + e] as i32;
                }
                let s = 2 * c + half;
                s1 += x.scales[s] as i32 * (raw - 32 * y.bsum(s) as i32);
            }
        }
        s1 as f32 * f16_to_f32(x.d)
    }
}

fn dot<W: Tiled>(w: &[W], a: &[BlockQ8K]) -> f32 {
    w.iter()
        .zip(a)
        .fold(0f32, |acc, (x, y)| W::block_term(x, y).mul_add(y.scale(), acc))
}

fn run<W: Tiled>(w: &QMatRef<'_>, act: &QuantizedRows, out: &mut [f32]) {
    let (m, n) = (act.rows(), w.rows());
    let acts: Vec<&[BlockQ8K]> = (0..m)
        .map(|i| cast_blocks(act.row(i)).expect("Q8_K activation rows are whole blocks"))
        .collect();
    let out_ptr = OutPtr(out.as_mut_ptr());
    const JB: usize = 8;
    (0..n.div_ceil(JB)).into_par_iter().for_each(|jb| {
        for j in jb * JB..((jb + 1) * JB).min(n) {
            let wr: &[W] = cast_blocks(w.row(j)).expect("weight rows are whole blocks");
            for (i, a) in acts.iter().enumerate() {
                // SAFETY: each task writes the outputs of its own weight
                // rows j (column j of every output row); see `OutPtr`.
                unsafe { out_ptr.write(i * n + j, dot(wr, a)) };
            }
        }
    });
}

/// `out = act @ w^T` in the tiled order (shapes and types checked by the
/// caller; `applies(w.qtype())`).
pub(super) fn product(w: &QMatRef<'_>, act: &QuantizedRows, out: &mut [f32]) {
    match w.qtype() {
        QType::Q4K => run::<BlockQ4K>(w, act, out),
        QType::Q5K => run::<BlockQ5K>(w, act, out),
        QType::Q6K => run::<BlockQ6K>(w, act, out),
        other => unreachable!("the tiled path has no {other} kernel (`applies` said so)"),
    }
}
