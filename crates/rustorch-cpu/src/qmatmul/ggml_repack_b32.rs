//! Q4_0 and IQ4_NL weights that llama.cpp repacks, multiplied in its
//! repacked order.
//!
//! On AVX2 CPUs llama.cpp's loader puts every 2-D Q4_0 and IQ4_NL weight
//! with a multiple of 8 rows into its CPU_REPACK buffer (`block_q4_0x8`,
//! `block_iq4_nlx8`: eight rows interleaved), except the inputs
//! (`token_embd`). Products then run `ggml_gemm_*_8x8_q8_0` for the first
//! `m - m % 4` activation rows and `ggml_gemv_*_8x8_q8_0` for the rest
//! (arch/x86/repack.cpp, `gemm_q4_b32_8x8_q8_0_lut_avx` and
//! `gemv_q4_b32_8x8_q8_0_lut_avx`; the two types differ only in the
//! nibble lookup table). Both give every output one f32 lane and, block
//! after block, `acc = fma(f32(sumi), d_w * d_a, acc)` with `sumi` the
//! block's whole integer dot product: one order for gemm and gemv alike.
//! The gemm's activations come from `ggml_quantize_mat_q8_0_4x8`, whose
//! arithmetic is `quantize_row_q8_0`'s (same `d`, same rounding), so
//! plain Q8_0 rows serve both.
//!
//! The weights stay in GGUF's layout (only the order matters for the
//! bits): kernels take sixteen weight rows at a time and up to four
//! activation rows, and every level (`portable` here, AVX2 and AVX-512
//! VNNI in `ggml_repack_b32_x86`) computes the same sums in the same
//! order.

use super::{Isa, OutPtr, QMatRef, QuantizedRows};
use rayon::prelude::*;
use rustorch_core::quant::blocks::{f16_to_f32, KVALUES_IQ4NL};
use rustorch_core::quant::QType;

/// Bytes per weight block (Q4_0 and IQ4_NL: f16 `d`, 16 nibble bytes) and
/// per Q8_0 activation block.
pub(super) const W_BYTES: usize = 18;
pub(super) const A_BYTES: usize = 34;

/// Weight rows per kernel call, and activation rows at most.
pub(super) const ROWS: usize = 16;
pub(super) const ACTS: usize = 4;

/// One Q8_0 activation row with what the kernels need per block: its
/// scale as f32 and the sum of its quants (for the unsigned-code trick of
/// the AVX-512 kernel: `sum(a * (u - off)) = sum(a * u) - off * sum(a)`).
pub(super) struct Act<'a> {
    pub bytes: &'a [u8],
    pub d: Vec<f32>,
    pub sums: Vec<i32>,
}

impl<'a> Act<'a> {
    fn new(bytes: &'a [u8]) -> Self {
        let blocks = bytes.chunks_exact(A_BYTES);
        let d = blocks.clone().map(|b| f16_to_f32([b[0], b[1]])).collect();
        let sums = blocks.map(|b| b[2..].iter().map(|&q| q as i8 as i32).sum()).collect();
        Act { bytes, d, sums }
    }

    /// Whether this row has `nb` whole blocks.
    pub(super) fn fits(&self, nb: usize) -> bool {
        self.bytes.len() == nb * A_BYTES && self.d.len() == nb && self.sums.len() == nb
    }
}

/// Sixteen weight rows against `acts` (at most `ACTS` rows): `out[a][r]`
/// is row `w[r]` against `acts[a]`; NaN where rows do not fit.
///
/// # Safety
/// The level the kernel was chosen for must be available.
pub(super) type Kernel = unsafe fn(w: &[&[u8]; ROWS], acts: &[Act<'_>], out: &mut [[f32; ROWS]; ACTS]);

/// The signed value of each nibble of a weight type.
pub(super) fn levels(iq4nl: bool) -> [i8; 16] {
    if iq4nl {
        KVALUES_IQ4NL
    } else {
        std::array::from_fn(|q| q as i8 - 8)
    }
}

/// The number of blocks of the weight rows if they and `acts` all fit.
pub(super) fn blocks(w: &[&[u8]; ROWS], acts: &[Act<'_>]) -> Option<usize> {
    let nb = w[0].len() / W_BYTES;
    let ok = w[0].len().is_multiple_of(W_BYTES)
        && w.iter().all(|r| r.len() == w[0].len())
        && acts.len() <= ACTS
        && acts.iter().all(|a| a.fits(nb));
    ok.then_some(nb)
}

/// The portable kernel: the order itself.
///
/// # Safety
/// None (it is `unsafe` only to share `Kernel`'s type).
unsafe fn portable<const IQ: bool>(w: &[&[u8]; ROWS], acts: &[Act<'_>], out: &mut [[f32; ROWS]; ACTS]) {
    let Some(nb) = blocks(w, acts) else {
        *out = [[f32::NAN; ROWS]; ACTS];
        return;
    };
    let lv = levels(IQ);
    for (a, o) in acts.iter().zip(out.iter_mut()) {
        for (r, v) in w.iter().zip(o.iter_mut()) {
            let mut acc = 0f32;
            for b in 0..nb {
                let x = &r[b * W_BYTES..(b + 1) * W_BYTES];
                let y = &a.bytes[b * A_BYTES + 2..(b + 1) * A_BYTES];
                let mut sumi = 0i32;
                for j in 0..16 {
                    sumi += lv[(x[2 + j] & 0x0F) as usize] as i32 * y[j] as i8 as i32;
                    sumi += lv[(x[2 + j] >> 4) as usize] as i32 * y[16 + j] as i8 as i32;
                }
                let d = f16_to_f32([x[0], x[1]]) * a.d[b];
                acc = (sumi as f32).mul_add(d, acc);
            }
            *v = acc;
        }
    }
}

/// The widest kernel at or below `isa` for Q4_0 (`iq4nl` false) or IQ4_NL.
fn kernel(isa: Isa, iq4nl: bool) -> Kernel {
    #[cfg(target_arch = "x86_64")]
    {
        use super::ggml_repack_b32_x86 as x86;
        if isa >= Isa::Avx512Vnni && Isa::Avx512Vnni.is_available() {
            return if iq4nl {
                x86::tile512::<true>
            } else {
                x86::tile512::<false>
            };
        }
        if isa >= Isa::Avx2 && Isa::Avx2.is_available() {
            return if iq4nl {
                x86::tile_avx2::<true>
            } else {
                x86::tile_avx2::<false>
            };
        }
    }
    let _ = isa;
    if iq4nl {
        portable::<true>
    } else {
        portable::<false>
    }
}

/// `out = act @ w^T` in the repacked order (shapes and types checked by the
/// caller; `w` is Q4_0 or IQ4_NL with rows % 8 == 0, `act` Q8_0).
pub(super) fn product(isa: Isa, w: &QMatRef<'_>, act: &QuantizedRows, out: &mut [f32]) {
    let (m, n) = (act.rows(), w.rows());
    let acts: Vec<Act<'_>> = (0..m).map(|i| Act::new(act.row(i))).collect();
    let kernel = kernel(isa, w.qtype() == QType::IQ4NL);
    let threads = rayon::current_num_threads().max(1);
    // Matvecs: a few chunks per thread, of at most 128 rows so that idle
    // threads can take over a busy one's work. Batches: weight rows that
    // stay in L2 (about 256 KiB) while the activation rows go past them
    // four at a time (four rows stay in L1), but at least two chunks per
    // thread.
    let chunk = if m < ACTS {
        (n / (threads * 4)).min(128)
    } else {
        ((256 << 10) / (w.row_bytes.max(1))).min(n / (threads * 2))
    };
    let chunk = chunk.clamp(ROWS, 1024).next_multiple_of(ROWS);
    let out_ptr = OutPtr(out.as_mut_ptr());
    (0..n.div_ceil(chunk)).into_par_iter().for_each(|c| {
        let (j0, j1) = (c * chunk, ((c + 1) * chunk).min(n));
        for (g, group) in acts.chunks(ACTS).enumerate() {
            let mut j = j0;
            while j < j1 {
                // Sixteen rows, or the last eight twice (rows % 8 == 0).
                let count = (j1 - j).min(ROWS);
                let rows: [&[u8]; ROWS] = std::array::from_fn(|k| w.row(j + k % count));
                let mut r = [[0f32; ROWS]; ACTS];
                // SAFETY: `kernel` gave a kernel for a level this CPU runs.
                unsafe { kernel(&rows, group, &mut r) };
                for (a, ra) in r.iter().enumerate().take(group.len()) {
                    for (k, &v) in ra.iter().enumerate().take(count) {
                        // SAFETY: this task owns weight rows j0..j1 (columns
                        // of every output row); see `OutPtr`.
                        unsafe { out_ptr.write((g * ACTS + a) * n + j + k, v) };
                    }
                }
                j += count;
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustorch_core::quant::blocks::f32_to_f16;

    /// Random weight and activation blocks: every code, scales from tiny
    /// to f16's largest (so some products overflow to infinity), and
    /// activation quants at the extremes -127 and 127 in some blocks.
    fn bytes(n: usize, block: usize, seed: u64) -> Vec<u8> {
        let mut s = seed | 1;
        let mut next = move || {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (s >> 33) as u32
        };
        let mut v = vec![0u8; n * block];
        for (b, blk) in v.chunks_exact_mut(block).enumerate() {
            for x in blk.iter_mut() {
                *x = next() as u8;
            }
            if block == A_BYTES {
                for x in blk[2..].iter_mut() {
                    // Q8_0 quants are in -127..=127.
                    *x = match b % 5 {
                        0 => {
                            if next() % 2 == 0 {
                                127
                            } else {
                                (-127i8) as u8
                            }
                        }
                        _ => ((next() % 255) as i32 - 127) as i8 as u8,
                    };
                }
            }
            let d = [1e-3f32, 0.37, 3.0, 65504.0][(next() % 4) as usize] * if next() % 2 == 0 { 1.0 } else { -1.0 };
            blk[..2].copy_from_slice(&f32_to_f16(d));
        }
        v
    }

    fn same(x: f32, y: f32) -> bool {
        x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan())
    }

    /// Every level gives the portable order's bits, through `product`
    /// (chunks, the eight-row tail, groups of activation rows), for
    /// several shapes: rows a multiple of 8 but not of 16, odd block
    /// counts, m = 1..9.
    #[test]
    fn levels_agree_bit_for_bit() {
        for qtype in [QType::Q4_0, QType::IQ4NL] {
            for (rows, nb) in [(8, 1), (24, 3), (40, 8), (64, 7), (136, 48)] {
                let cols = 32 * nb;
                let wb = bytes(rows * nb, W_BYTES, rows as u64 + nb as u64);
                let w = QMatRef::new(qtype, rows, cols, &wb).expect("whole rows");
                assert!(w.repacked());
                for m in 1..=9 {
                    let ab = bytes(m * nb, A_BYTES, 7 * m as u64);
                    let act = QuantizedRows::from_bytes(QType::Q8_0, m, cols, ab).expect("Q8_0 rows");
                    let mut want = vec![0f32; m * rows];
                    product(Isa::Scalar, &w, &act, &mut want);
                    for isa in Isa::ALL.into_iter().filter(|i| *i != Isa::Scalar && i.is_available()) {
                        let mut got = vec![0f32; m * rows];
                        product(isa, &w, &act, &mut got);
                        for (k, (g, e)) in got.iter().zip(&want).enumerate() {
                            assert!(
                                same(*g, *e),
                                "{qtype} {isa} {rows}x{cols} m={m} #{k}: {g} vs portable {e}"
                            );
                        }
                    }
                }
            }
        }
    }

    /// The portable kernel is the order: one f32 FMA per block, checked
    /// against a plain f64-free recomputation on a small case.
    #[test]
    fn portable_is_one_fma_per_block() {
        let nb = 3;
        let wb = bytes(ROWS * nb, W_BYTES, 5);
        let ab = bytes(nb, A_BYTES, 6);
        let act = Act::new(&ab);
        let rows: [&[u8]; ROWS] = std::array::from_fn(|r| &wb[r * nb * W_BYTES..(r + 1) * nb * W_BYTES]);
        let mut out = [[0f32; ROWS]; ACTS];
        // SAFETY: the portable kernel has no requirements.
        unsafe { portable::<false>(&rows, std::slice::from_ref(&act), &mut out) };
        for (r, row) in rows.iter().enumerate() {
            let mut acc = 0f32;
            for b in 0..nb {
                let x = &row[b * W_BYTES..];
                let y = &ab[b * A_BYTES..];
                let sumi: i32 = (0..32)
                    .map(|e| {
                        let q = if e < 16 { x[2 + e] & 0xF } else { x[2 + e - 16] >> 4 };
                        (q as i32 - 8) * y[2 + e] as i8 as i32
                    })
                    .sum();
                let d = f16_to_f32([x[0], x[1]]) * f16_to_f32([y[0], y[1]]);
                acc = (sumi as f32).mul_add(d, acc);
            }
            assert!(same(out[0][r], acc), "row {r}");
        }
    }
}
