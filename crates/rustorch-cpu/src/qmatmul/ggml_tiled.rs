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

// Sub-block, chunk and value indices address several arrays.
#![allow(clippy::needless_range_loop)]

use super::ggml_superblock::{q8k_rows, run_tiles, Order, Unpack};
use super::{Isa, OutPtr, QMatRef, QuantizedRows};
use rayon::prelude::*;
use rustorch_core::quant::blocks::{
    cast_blocks, f16_to_f32, q3k_scales, Block, BlockIQ4XS, BlockQ2K, BlockQ3K, BlockQ4K, BlockQ5K, BlockQ6K, BlockQ8K,
    KVALUES_IQ4NL,
};
use rustorch_core::quant::QType;

/// The fewest activation rows for which llama.cpp takes the tiled path.
pub(super) const MIN_ROWS: usize = 8;

/// Whether llama.cpp's tiled path multiplies (unrepacked) weights of this
/// type, from `MIN_ROWS` activation rows on.
pub(super) fn applies(qtype: QType) -> bool {
    matches!(
        qtype,
        QType::Q2K | QType::Q3K | QType::Q4K | QType::Q5K | QType::Q6K | QType::IQ4XS
    )
}

/// One super-block's share of an output: `f32(s1) * d_w`, minus
/// `dmin_w * f32(s2)` by one FMA where the type has mins.
trait Tiled: Block {
    fn block_term(x: &Self, y: &BlockQ8K) -> f32;
}

impl Tiled for BlockQ3K {
    fn block_term(x: &Self, y: &BlockQ8K) -> f32 {
        let sc = q3k_scales(&x.scales);
        let mut s1 = 0i32;
        for s in 0..16 {
            let (c, half) = (s / 2, s % 2);
            let raw: i32 = (16 * half..16 * half + 16)
                .map(|e| {
                    let lo = ((x.qs[32 * (c / 4) + e] >> (2 * (c % 4))) & 3) as i32;
                    let v = lo - if (x.hmask[e] >> c) & 1 == 0 { 4 } else { 0 };
                    v * y.qs[32 * c + e] as i32
                })
                .sum();
            s1 += sc[s] as i32 * raw;
        }
        s1 as f32 * f16_to_f32(x.d)
    }
}

impl Tiled for BlockIQ4XS {
    fn block_term(x: &Self, y: &BlockQ8K) -> f32 {
        iq4xs_sum(x, y) as f32 * f16_to_f32(x.d)
    }
}

/// An IQ4_XS super-block's exact sum `sum_g (ls_g - 32) * (levels_g . q8_g)`
/// against one activation block (also the AMX order's, `amx_order_k`).
pub(super) fn iq4xs_sum(x: &BlockIQ4XS, y: &BlockQ8K) -> i32 {
    let sh = u16::from_le_bytes(x.scales_h);
    let mut s1 = 0i32;
    for g in 0..8 {
        let lo = (x.scales_l[g / 2] >> (4 * (g % 2))) & 0xF;
        let ls = (lo | (((sh >> (2 * g)) & 3) as u8) << 4) as i32 - 32;
        let raw: i32 = (0..32)
            .map(|e| {
                let q = (x.qs[16 * g + e % 16] >> (4 * (e / 16))) & 0xF;
                KVALUES_IQ4NL[q as usize] as i32 * y.qs[32 * g + e] as i32
            })
            .sum();
        s1 += ls * raw;
    }
    s1
}

fn dot<W: Tiled>(w: &[W], a: &[BlockQ8K]) -> f32 {
    w.iter()
        .zip(a)
        .fold(0f32, |acc, (x, y)| W::block_term(x, y).mul_add(y.scale(), acc))
}

fn run<W: Tiled>(w: &QMatRef<'_>, act: &QuantizedRows, out: &mut [f32]) {
    let n = w.rows();
    let acts = q8k_rows(act);
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

/// Activation rows up to which Q6_K weights take `small_batch_q6k`
/// rather than the panels, whose unpacking of every weight pays only over
/// many rows.
#[cfg(target_arch = "x86_64")]
pub(super) const SMALL_BATCH_ROWS: usize = 64;

/// A small batch of Q6_K products (`act.rows()` from `MIN_ROWS` to
/// `SMALL_BATCH_ROWS`; rows a multiple of four; AVX-512 VNNI checked by
/// the caller): four weight rows at a time against every activation row
/// (`tiled_cols_q6k`, four activation rows per call), the weight rows read
/// from memory once and then from L1.
#[cfg(target_arch = "x86_64")]
fn small_batch_q6k(w: &QMatRef<'_>, act: &QuantizedRows, out: &mut [f32]) {
    use super::kernels::kquants::cols512::tiled_cols_q6k;
    let n = w.rows();
    let out_ptr = OutPtr(out.as_mut_ptr());
    // Sixteen weight rows per task: a few tasks per thread at any size.
    const JB: usize = 16;
    (0..n.div_ceil(JB)).into_par_iter().for_each(|jb| {
        for j in (jb * JB..((jb + 1) * JB).min(n)).step_by(4) {
            let ws = [w.row(j), w.row(j + 1), w.row(j + 2), w.row(j + 3)];
            let write = |i: usize, r: [f32; 4]| {
                for (k, v) in r.into_iter().enumerate() {
                    // SAFETY: each task writes the outputs of its own weight
                    // rows (columns of every output row); see `OutPtr`.
                    unsafe { out_ptr.write(i * n + j + k, v) };
                }
            };
            let m = act.rows();
            let mut i = 0;
            while i + 4 <= m {
                let mut r = [[0f32; 4]; 4];
                let a = [act.row(i), act.row(i + 1), act.row(i + 2), act.row(i + 3)];
                // SAFETY: AVX-512 VNNI is available (the caller checked);
                // the kernel checks the row lengths.
                unsafe { tiled_cols_q6k(a, ws, &mut r) };
                for (k, rk) in r.into_iter().enumerate() {
                    write(i + k, rk);
                }
                i += 4;
            }
            for i in i..m {
                let mut r = [[0f32; 4]; 1];
                // SAFETY: as above.
                unsafe { tiled_cols_q6k([act.row(i)], ws, &mut r) };
                write(i, r[0]);
            }
        }
    });
}

/// Q4_K, Q5_K and Q6_K through `ggml_superblock`: each weight row's
/// super-blocks unpacked once, then the exact sums with every activation
/// row (`BIAS` = 32 for Q6_K, whose `bias_scales` are its scales; the
/// others have none, and no mins for Q6_K: `fma(-0, 0, r) = r`).
fn run_unpacked<W: Unpack + Block>(isa: Isa, w: &QMatRef<'_>, act: &QuantizedRows, out: &mut [f32]) {
    let acts = q8k_rows(act);
    run_tiles::<W>(isa, w, &acts, &|_| Order::Tiled, out);
}

/// `out = act @ w^T` in the tiled order (shapes and types checked by the
/// caller; `applies(w.qtype())`).
pub(super) fn product(isa: Isa, w: &QMatRef<'_>, act: &QuantizedRows, out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if w.qtype() == QType::Q6K
        && act.rows() <= SMALL_BATCH_ROWS
        && w.rows().is_multiple_of(4)
        && isa >= Isa::Avx512Vnni
        && Isa::Avx512Vnni.is_available()
    {
        small_batch_q6k(w, act, out);
        return;
    }
    if super::ggml_panel::available(isa) {
        super::ggml_panel::product(isa, w, &q8k_rows(act), out, &|_| Order::Tiled);
        return;
    }
    match w.qtype() {
        QType::Q4K => run_unpacked::<BlockQ4K>(isa, w, act, out),
        QType::Q5K => run_unpacked::<BlockQ5K>(isa, w, act, out),
        QType::Q6K => run_unpacked::<BlockQ6K>(isa, w, act, out),
        QType::Q2K => run_unpacked::<BlockQ2K>(isa, w, act, out),
        QType::Q3K => run::<BlockQ3K>(w, act, out),
        QType::IQ4XS => run::<BlockIQ4XS>(w, act, out),
        other => unreachable!("the tiled path has no {other} kernel (`applies` said so)"),
    }
}
