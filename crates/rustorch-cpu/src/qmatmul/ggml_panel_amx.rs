//! K-quant batches in llama.cpp's tiled and repacked orders with AMX tiles:
//! sixteen weight rows by thirty-two activation rows per step (two tile
//! products for each half), the f32 steps of `ggml_panel` (same orders,
//! same bits) on the tiles' integers.
//!
//! `ggml_panel` spends most of its time on the integer dot products: one
//! `vpdpbusd` per four values, one `vpmulld` per scale group for the weight
//! rows' group scales, and `vpdpwssd`s for the terms that use the
//! activations' 16-value sums (mins, code offsets). Here all of that goes
//! into the weights before the product. Each value becomes
//! `x = code * scale + corr` (`corr` the offset term `-bias * scale` of the
//! types without mins, zero otherwise; at most 14 bits with its sign),
//! split into its low byte (unsigned) and high byte (signed), so that per
//! activation row and weight row
//!
//! ```text
//! sum_v x_v * a_v = sum_v lo_v * a_v + 256 * sum_v hi_v * a_v
//! ```
//!
//! and both sums are tile products (`tdpbsud`, `tdpbssd`, the activations
//! as the signed operand) that add up a 64-value chunk, or a whole
//! super-block, in one accumulator tile. The sums are exact (at most 256
//! products of 255 * 127 per i32), so they equal `ggml_panel`'s; the mins'
//! terms (`vpdpwssd` against `bsums`) and the f32 operations that follow
//! are its own. Two activation tiles per step give four independent
//! accumulators (the eight tile registers: two activation tiles, the
//! `lo` and `hi` weight tiles, four results), so that tile products do not
//! wait on each other's latency.
//!
//! A weight panel holds the bytes of sixteen rows interleaved by four
//! (`lo[q][4r + e]` is value `4q + e` of row `r`): the layout of a tile
//! product's second operand, 16 tile rows of 64 bytes per 64-value chunk.
//! Panels are built per product (a copy of the whole model in this form
//! would be 3.5 times its size) with AVX-512, a few instructions per 64
//! values, against about a thousand multiply-adds per value in a 512-row
//! batch. Activation rows are copied in groups of sixteen, 256 bytes per
//! super-block, so that a chunk of sixteen rows is one tile load with a
//! 256-byte stride.

// Lane, row and chunk indices address several arrays.
#![allow(clippy::needless_range_loop)]

use super::ggml_panel::{PanelType, SuperRow, LANES};
use super::ggml_superblock::Order;
use super::{Isa, OutPtr, QMatRef, ThreadBuffer};
use rustorch_core::quant::blocks::{BlockIQ4XS, BlockQ2K, BlockQ3K, BlockQ4K, BlockQ5K, BlockQ6K, BlockQ8K};
use rustorch_core::quant::QType;

/// Activation rows per step: two tiles of sixteen.
const ROWS: usize = 32;

/// Sixteen weight rows' super-block, as the tile products read it.
#[repr(C, align(64))]
struct AmxBlock {
    /// Low bytes of `x`, `lo[q][4r + e]` for value `4q + e` of row `r`;
    /// chunk `c` is `lo[16c..16c + 16]`.
    lo: [[u8; 64]; 64],
    /// High bytes of `x` (signed), laid out as `lo`.
    hi: [[u8; 64]; 64],
    /// Types with mins: row r's mins of 16-value groups `2p` and `2p + 1`
    /// as an i16 pair in lane r (`vpdpwssd` against `bsums[2p..2p + 2]`).
    mins: [[i32; LANES]; 8],
    d: [f32; LANES],
    dmin: [f32; LANES],
}

impl AmxBlock {
    fn zeroed() -> AmxBlock {
        AmxBlock {
            lo: [[0; 64]; 64],
            hi: [[0; 64]; 64],
            mins: [[0; LANES]; 8],
            d: [0.0; LANES],
            dmin: [0.0; LANES],
        }
    }
}

/// One 64-byte line of copied activations.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([u8; 64]);

/// The activations' quants in groups of `ROWS` rows: group `t`,
/// super-block `b`, row `k` is 256 bytes (four lines) at line
/// `((t * nb + b) * ROWS + k) * 4`. Rows past `m` are zero.
fn copy_activations(acts: &[&[BlockQ8K]], nb: usize) -> Vec<Line> {
    let groups = acts.len().div_ceil(ROWS);
    let mut lines = vec![Line([0; 64]); groups * nb * ROWS * 4];
    for (i, row) in acts.iter().enumerate() {
        let (t, k) = (i / ROWS, i % ROWS);
        for (b, y) in row.iter().enumerate() {
            let at = ((t * nb + b) * ROWS + k) * 4;
            for c in 0..4 {
                for e in 0..64 {
                    lines[at + c].0[e] = y.qs[64 * c + e] as u8;
                }
            }
        }
    }
    lines
}

/// `out = acts @ w^T` as `ggml_panel::product` computes it (the same
/// arguments and requirements), with AMX tiles; the caller checked
/// `Isa::Amx.is_available()`.
pub(super) fn product(
    isa: Isa,
    w: &QMatRef<'_>,
    acts: &[&[BlockQ8K]],
    out: &mut [f32],
    order: &(dyn Fn(usize) -> Order + Sync),
) {
    match w.qtype() {
        QType::Q4K => run::<BlockQ4K>(isa, w, acts, out, order),
        QType::Q5K => run::<BlockQ5K>(isa, w, acts, out, order),
        QType::Q6K => run::<BlockQ6K>(isa, w, acts, out, order),
        QType::Q2K => run::<BlockQ2K>(isa, w, acts, out, order),
        QType::Q3K => run::<BlockQ3K>(isa, w, acts, out, order),
        QType::IQ4XS => run::<BlockIQ4XS>(isa, w, acts, out, order),
        other => unreachable!("the panels have no {other} kernel (`applies` said so)"),
    }
}

/// Whether the tile products are faster than `ggml_panel`'s AVX-512 ones
/// for these rows' orders: yes where every row sums whole super-blocks
/// (llama.cpp's tiled order, the repacked gemv) or halves of one (the
/// repacked Q2_K gemm), no where some rows take an f32 step per 64 values
/// (the repacked Q4_K gemm: each chunk's result tiles are stored and read
/// back, and its folded values need a second byte plane). Measured on the
/// device host (Xeon with AMX, 2 pinned threads, 4096x4096 weights x 512
/// rows, `bench/device_amx.sh`): Q6_K 37-48 against 65-74 ms, Q2_K 49-64
/// against 61-75, Q4_K 67-70 against 53-73; TinyLlama-shaped Q4_K_M pp512
/// with the Q4_K gemm on tiles 78-79 against 94-98 t/s; after the
/// chunked path's gemm rows stopped carrying sums over, four rounds of
/// VNNI / AMX as chosen here / AMX for the Q4_K gemm too: 91.4 / 95.0 /
/// 91.8 t/s on average (docs/BENCHMARKS.md, "AMX kernels on the device host").
pub(super) fn pays(m: usize, order: &(dyn Fn(usize) -> Order + Sync)) -> bool {
    (0..m).all(|i| order(i) != Order::RepackGemm)
}

/// Panels per task: about 512 KB of weights (with 2 MB of L2 per core on
/// the AMX CPUs there are, they stay there while the activations go past),
/// and enough tasks for every thread to get several.
fn panels_per_task(nb: usize, panels: usize) -> usize {
    let bytes = nb * std::mem::size_of::<AmxBlock>();
    let by_cache = ((512 << 10) / bytes.max(1)).max(1);
    let threads = rayon::current_num_threads().max(1);
    by_cache.min(panels.div_ceil(threads * 4)).max(1)
}

fn run<W: PanelType>(
    isa: Isa,
    w: &QMatRef<'_>,
    acts: &[&[BlockQ8K]],
    out: &mut [f32],
    order: &(dyn Fn(usize) -> Order + Sync),
) {
    let (m, n) = (acts.len(), w.rows());
    let nb = w.cols() / 256;
    let panels = n.div_ceil(LANES);
    let per_task = panels_per_task(nb, panels);
    let unpack = W::unpack_row(isa);
    let lines = copy_activations(acts, nb);
    let orders: Vec<Order> = (0..m).map(order).collect();
    let out_ptr = OutPtr(out.as_mut_ptr());
    // Tasks claimed one at a time: on the device host, whose cores run at
    // uneven speeds, rayon's fixed halves left the faster thread idle at
    // the end (TinyLlama-shape Q4_K_M pp512, 4 alternations: 268-286
    // against 220-270 t/s). The VNNI panels (`ggml_panel`) keep rayon's
    // loop: single claims were slower there on the 2-core EPYC.
    crate::team::for_each_single(panels.div_ceil(per_task), |task| {
        let first = task * per_task;
        let count = per_task.min(panels - first);
        // The blocks of the last task on this thread, reused (`build`
        // writes every field the kernels read): a fresh zeroed buffer per
        // task costs page faults and a memset of every panel.
        let mut buffer = ThreadBuffer::take(&AMX_BUFFER);
        let blocks = buffer.slice(count * nb, AmxBlock::zeroed);
        let mut has_hi = vec![false; count];
        let mut rows: [SuperRow; LANES] = std::array::from_fn(|_| SuperRow::blank());
        for p in 0..count {
            for b in 0..nb {
                for (r, row) in rows.iter_mut().enumerate() {
                    let j = (first + p) * LANES + r;
                    // Rows past `n` are blank: zero weights.
                    *row = if j < n {
                        w.with_block::<W, _>(j, b, &unpack)
                    } else {
                        SuperRow::blank()
                    };
                }
                // SAFETY: the caller checked AMX, which includes AVX-512.
                #[cfg(target_arch = "x86_64")]
                unsafe {
                    has_hi[p] |= tile::build(&rows, W::GROUP, W::MINS, &mut blocks[p * nb + b]);
                }
            }
        }
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the caller checked `Isa::Amx.is_available()`, which
        // includes AVX-512 VNNI and the OS's grant of the tile state.
        unsafe {
            super::amx::TileConfig::FULL.load();
        }
        for p in 0..count {
            let j0 = (first + p) * LANES;
            let valid = LANES.min(n - j0);
            let panel = &blocks[p * nb..(p + 1) * nb];
            for t in 0..m.div_ceil(ROWS) {
                let rows = ROWS.min(m - t * ROWS);
                let group = &lines[t * nb * ROWS * 4..(t + 1) * nb * ROWS * 4];
                let ys = &acts[t * ROWS..t * ROWS + rows];
                let ords = &orders[t * ROWS..t * ROWS + rows];
                let per_chunk = ords.iter().any(|o| o.sums_per_chunk());
                let mut res = [[0f32; LANES]; ROWS];
                #[cfg(target_arch = "x86_64")]
                // SAFETY: as above; the tile configuration is loaded.
                unsafe {
                    match (W::MINS, per_chunk) {
                        (true, false) => tile::outputs::<true>(panel, has_hi[p], group, ys, ords, &mut res),
                        (false, false) => tile::outputs::<false>(panel, has_hi[p], group, ys, ords, &mut res),
                        (true, true) => tile::outputs_chunked::<true>(panel, has_hi[p], group, ys, ords, &mut res),
                        (false, true) => tile::outputs_chunked::<false>(panel, has_hi[p], group, ys, ords, &mut res),
                    }
                };
                for (k, r) in res.iter().enumerate().take(rows) {
                    for (l, &v) in r.iter().enumerate().take(valid) {
                        // SAFETY: this task owns weight rows j0..j0 + 16
                        // (column j0 + l of every output row); see `OutPtr`.
                        unsafe { out_ptr.write((t * ROWS + k) * n + j0 + l, v) };
                    }
                }
            }
        }
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above.
        unsafe {
            super::amx::release();
        }
    });
}

thread_local! {
    /// Panel blocks kept between tasks (see `run`).
    static AMX_BUFFER: std::cell::Cell<Vec<AmxBlock>> = const { std::cell::Cell::new(Vec::new()) };
}

#[cfg(target_arch = "x86_64")]
mod tile {
    use super::super::amx::{tdpbssd, tdpbsud, tile_load, tile_store, tile_zero};
    use super::super::ggml_panel::vnni::bsum_pair;
    use super::{AmxBlock, Line, SuperRow, LANES, ROWS};
    use crate::qmatmul::ggml_superblock::Order;
    use rustorch_core::quant::blocks::BlockQ8K;
    use std::arch::x86_64::*;

    /// Lane r: `f(rows[r])` (a 16-bit value) in both i16 halves of the lane.
    #[inline(always)]
    unsafe fn pairs(rows: &[SuperRow; LANES], f: impl Fn(&SuperRow) -> i32) -> __m512i {
        let v: [i32; LANES] = std::array::from_fn(|r| {
            let x = f(&rows[r]) as u16 as u32;
            (x | x << 16) as i32
        });
        // SAFETY: 16 i32.
        unsafe { _mm512_loadu_si512(v.as_ptr().cast()) }
    }

    /// Interleaves sixteen rows' super-block into `out`; returns whether
    /// any high byte is non-zero.
    ///
    /// # Safety
    /// AVX-512 F/BW must be available.
    #[target_feature(enable = "avx512f,avx512bw")]
    pub(super) unsafe fn build(rows: &[SuperRow; LANES], group: usize, mins: bool, out: &mut AmxBlock) -> bool {
        let stride = std::mem::size_of::<SuperRow>() as i32;
        let offsets = _mm512_mullo_epi32(
            _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
            _mm512_set1_epi32(stride),
        );
        let low = _mm512_set1_epi16(0x00FF);
        let high = _mm512_set1_epi16(0xFF00u16 as i16);
        let mut any_hi = _mm512_setzero_si512();
        let (mut scale, mut corr) = (_mm512_setzero_si512(), _mm512_setzero_si512());
        for q in 0..64 {
            let (g, k) = (4 * q / group, q / 4);
            if (4 * q) % group == 0 {
                // SAFETY: AVX-512 (the caller).
                scale = unsafe { pairs(rows, |s| s.scales[g]) };
            }
            if q % 4 == 0 && !mins {
                // The offset term `-bias * scale` of each value's group.
                // SAFETY: as above.
                corr = unsafe { pairs(rows, |s| s.corr[k] as i32) };
            }
            // SAFETY: lane r reads the four codes 4q..4q + 4 of rows[r]
            // (`codes` is the first field of the `repr(C)` struct).
            let codes = unsafe { _mm512_i32gather_epi32::<1>(offsets, rows.as_ptr().cast::<u8>().add(4 * q).cast()) };
            // 16-bit lanes: the even and odd bytes, scaled and offset
            // (|x| < 2^15, so the low 16 bits of the products are exact).
            let even = _mm512_and_si512(codes, low);
            let odd = _mm512_srli_epi16::<8>(codes);
            let xe = _mm512_add_epi16(_mm512_mullo_epi16(even, scale), corr);
            let xo = _mm512_add_epi16(_mm512_mullo_epi16(odd, scale), corr);
            let lo = _mm512_or_si512(_mm512_and_si512(xe, low), _mm512_slli_epi16::<8>(xo));
            let hi = _mm512_or_si512(_mm512_srli_epi16::<8>(xe), _mm512_and_si512(xo, high));
            any_hi = _mm512_or_si512(any_hi, hi);
            // SAFETY: 64-byte aligned rows of the block.
            unsafe {
                _mm512_store_si512(out.lo[q].as_mut_ptr().cast(), lo);
                _mm512_store_si512(out.hi[q].as_mut_ptr().cast(), hi);
            }
        }
        for r in 0..LANES {
            if mins {
                for p in 0..8 {
                    let (a, b) = (rows[r].corr[2 * p] as u16 as u32, rows[r].corr[2 * p + 1] as u16 as u32);
                    out.mins[p][r] = (a | b << 16) as i32;
                }
            }
            out.d[r] = rows[r].d;
            out.dmin[r] = rows[r].dmin;
        }
        _mm512_test_epi32_mask(any_hi, any_hi) != 0
    }

    /// One chunk's (or block's) result tiles: `ROWS` activation rows of
    /// 16 weight-row lanes.
    #[repr(C, align(64))]
    struct Results([[i32; 16]; ROWS]);

    impl Results {
        fn blank() -> Results {
            Results([[0; 16]; ROWS])
        }
    }

    /// Sixteen weight rows (`panel`, one block per super-block) against up
    /// to `ROWS` activation rows (`ys`, copied into `lines`), each summing
    /// whole super-blocks (`Order::Tiled`, `Order::RepackGemv`, `Order::Amx`); results
    /// into `res[k]`. `MINS`: the type has mins (the blocks' `mins` are
    /// filled).
    ///
    /// # Safety
    /// AMX with the full tile configuration loaded on this thread, AVX-512
    /// F/BW/VL/VNNI, AVX2 and FMA.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma")]
    pub(super) unsafe fn outputs<const MINS: bool>(
        panel: &[AmxBlock],
        has_hi: bool,
        lines: &[Line],
        ys: &[&[BlockQ8K]],
        orders: &[Order],
        res: &mut [[f32; LANES]; ROWS],
    ) {
        let rows = ys.len();
        let mut acc = [_mm512_setzero_ps(); ROWS];
        let mut acc_min = [_mm512_setzero_ps(); ROWS];
        // Two sets of result buffers: block b's tile products are issued
        // before block b - 1's results are read back, so the tile stores
        // have drained to the cache when the vector loads reach them (reading
        // a tile store's lines at once stalls on it).
        let mut sets = [
            (Results::blank(), Results::blank()),
            (Results::blank(), Results::blank()),
        ];
        for step in 0..=panel.len() {
            if step < panel.len() {
                let (lo, hi) = &mut sets[step % 2];
                let a0 = lines[step * ROWS * 4..].as_ptr().cast::<u8>();
                // SAFETY: as `chunk_products`; the tile configuration is
                // loaded (the caller).
                unsafe {
                    tile_zero!(4);
                    tile_zero!(5);
                    tile_zero!(6);
                    tile_zero!(7);
                    for c in 0..4 {
                        chunk_products(&panel[step], has_hi, a0, c);
                    }
                    store_results(has_hi, lo, hi);
                }
            }
            if step == 0 {
                continue;
            }
            let (b, pb) = (step - 1, &panel[step - 1]);
            let (lo, hi) = &sets[b % 2];
            // SAFETY: the panel's arrays are 64-byte aligned, 16 lanes wide.
            let (d, dmin) = unsafe { (_mm512_load_ps(pb.d.as_ptr()), _mm512_load_ps(pb.dmin.as_ptr())) };
            // SAFETY: aligned (AVX-512, the caller).
            let pairs = unsafe { min_pairs::<MINS, 8>(pb, 0) };
            for k in 0..rows {
                let y = &ys[k][b];
                // SAFETY: k < ROWS (AVX-512, the caller).
                let (s, m) = unsafe { (chunk_sum(has_hi, lo, hi, k), mins_term::<MINS>(&pairs, 0, y)) };
                let da = _mm512_set1_ps(y.scale());
                let (dd, dm) = match orders[k] {
                    Order::Tiled => (d, dmin), // not used
                    _ => (_mm512_mul_ps(d, da), _mm512_mul_ps(dmin, da)),
                };
                // SAFETY: AVX-512 F (the caller).
                unsafe { block_step(orders[k], (s, m), (d, dmin, da), (dd, dm), &mut acc[k], &mut acc_min[k]) };
            }
        }
        // SAFETY: AVX-512 F (the caller).
        unsafe { write_results(orders, &acc, &acc_min, res) };
    }

    /// As `outputs`, for a batch where some rows sum per 64 or 128 values
    /// (`Order::sums_per_chunk`: the repacked gemm orders). The tile
    /// products run one 64-value chunk at a time, and each chunk's results
    /// are read back while the next chunk's products run (two small result
    /// buffers, 8 KiB, instead of four chunks' worth per block, which with
    /// the panel and the activations overflowed L1). The rows' f32 steps are
    /// the same as `ggml_panel`'s, so are the bits.
    ///
    /// # Safety
    /// As `outputs`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma")]
    pub(super) unsafe fn outputs_chunked<const MINS: bool>(
        panel: &[AmxBlock],
        has_hi: bool,
        lines: &[Line],
        ys: &[&[BlockQ8K]],
        orders: &[Order],
        res: &mut [[f32; LANES]; ROWS],
    ) {
        let rows = ys.len();
        let zero_i = _mm512_setzero_si512();
        let mut acc = [_mm512_setzero_ps(); ROWS];
        let mut acc_min = [_mm512_setzero_ps(); ROWS];
        // The block's (or half's) integers so far, for rows that take an
        // f32 step per block or per two chunks.
        let mut part = [zero_i; ROWS];
        let mut part_min = [zero_i; ROWS];
        // Each row's `d_w * d_a` and `dmin_w * d_a` for the current block.
        let mut dd = [_mm512_setzero_ps(); ROWS];
        let mut dm = [_mm512_setzero_ps(); ROWS];
        let mut sets = [
            (Results::blank(), Results::blank()),
            (Results::blank(), Results::blank()),
        ];
        let steps = 4 * panel.len();
        for step in 0..=steps {
            if step < steps {
                let (b, c) = (step / 4, step % 4);
                let (lo, hi) = &mut sets[step % 2];
                let a0 = lines[b * ROWS * 4..].as_ptr().cast::<u8>();
                // SAFETY: as in `outputs`.
                unsafe {
                    tile_zero!(4);
                    tile_zero!(5);
                    tile_zero!(6);
                    tile_zero!(7);
                    chunk_products(&panel[b], has_hi, a0, c);
                    store_results(has_hi, lo, hi);
                }
            }
            if step == 0 {
                continue;
            }
            let (b, c) = ((step - 1) / 4, (step - 1) % 4);
            let pb = &panel[b];
            let (lo, hi) = &sets[(step - 1) % 2];
            // SAFETY: the panel's arrays are 64-byte aligned, 16 lanes wide.
            let (d, dmin) = unsafe { (_mm512_load_ps(pb.d.as_ptr()), _mm512_load_ps(pb.dmin.as_ptr())) };
            // SAFETY: 2c + 2 <= 8; aligned (AVX-512, the caller).
            let pairs = unsafe { min_pairs::<MINS, 2>(pb, 2 * c) };
            for k in 0..rows {
                let y = &ys[k][b];
                if c == 0 {
                    let da = _mm512_set1_ps(y.scale());
                    dd[k] = _mm512_mul_ps(d, da);
                    dm[k] = _mm512_mul_ps(dmin, da);
                }
                // SAFETY: k < ROWS; 2c + 2 <= 8 (AVX-512, the caller).
                let (s, m) = unsafe { (chunk_sum(has_hi, lo, hi, k), mins_term::<MINS>(&pairs, 2 * c, y)) };
                if orders[k] == Order::RepackGemm {
                    // An f32 step per chunk: nothing is carried over.
                    acc[k] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), dd[k], acc[k]);
                    acc_min[k] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(m), dm[k], acc_min[k]);
                    continue;
                }
                let last = match orders[k] {
                    Order::RepackGemmHalves => c % 2 == 1,
                    _ => c == 3,
                };
                let (s, m) = (_mm512_add_epi32(part[k], s), _mm512_add_epi32(part_min[k], m));
                if !last {
                    (part[k], part_min[k]) = (s, m);
                    continue;
                }
                (part[k], part_min[k]) = (zero_i, zero_i);
                let da = _mm512_set1_ps(y.scale());
                // SAFETY: AVX-512 F (the caller).
                unsafe {
                    block_step(
                        orders[k],
                        (s, m),
                        (d, dmin, da),
                        (dd[k], dm[k]),
                        &mut acc[k],
                        &mut acc_min[k],
                    )
                };
            }
        }
        // SAFETY: AVX-512 F (the caller).
        unsafe { write_results(orders, &acc, &acc_min, res) };
    }

    /// Row `k`'s f32 step for integers `(s, m)` that end a block (or half):
    /// the tiled order's `r = f32(s) * d; r = fma(-dmin, f32(m), r);
    /// acc = fma(r, d_a, acc)` (as `ggml_panel`), the AMX build's
    /// `acc = fma(f32(s), d * d_a, acc); acc = fma(-f32(m), dmin * d_a,
    /// acc)`, or the repacked orders'
    /// `acc = fma(f32(s), d * d_a, acc)` and `acc_min = fma(f32(m), dmin *
    /// d_a, acc_min)`.
    ///
    /// # Safety
    /// AVX-512 F must be available.
    #[inline(always)]
    unsafe fn block_step(
        order: Order,
        (s, m): (__m512i, __m512i),
        (d, dmin, da): (__m512, __m512, __m512),
        (dd, dm): (__m512, __m512),
        acc: &mut __m512,
        acc_min: &mut __m512,
    ) {
        // SAFETY: AVX-512 F (the caller).
        unsafe {
            if order == Order::Tiled {
                let v = _mm512_mul_ps(_mm512_cvtepi32_ps(s), d);
                let v = _mm512_fnmadd_ps(dmin, _mm512_cvtepi32_ps(m), v);
                *acc = _mm512_fmadd_ps(v, da, *acc);
            } else if order == Order::Amx {
                // `fnmadd` rounds -(m * dm) + acc once, as fma(-m, dm, acc).
                *acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), dd, *acc);
                *acc = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(m), dm, *acc);
            } else {
                *acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), dd, *acc);
                *acc_min = _mm512_fmadd_ps(_mm512_cvtepi32_ps(m), dm, *acc_min);
            }
        }
    }

    /// Each row's result: `acc` (tiled and AMX orders) or `acc - acc_min`.
    ///
    /// # Safety
    /// AVX-512 F must be available.
    #[inline(always)]
    unsafe fn write_results(
        orders: &[Order],
        acc: &[__m512; ROWS],
        acc_min: &[__m512; ROWS],
        res: &mut [[f32; LANES]; ROWS],
    ) {
        for (k, &order) in orders.iter().enumerate() {
            // SAFETY: AVX-512 F (the caller); 16 f32 into a 16-element array.
            unsafe {
                let v = if matches!(order, Order::Tiled | Order::Amx) {
                    acc[k]
                } else {
                    _mm512_sub_ps(acc[k], acc_min[k])
                };
                _mm512_storeu_ps(res[k].as_mut_ptr(), v);
            }
        }
    }

    /// Chunk `c`'s tile products of one panel block against the two
    /// activation tiles at `a0` (this block's group of activation rows),
    /// added to result tiles 4, 6 (low bytes) and 5, 7 (high bytes).
    ///
    /// # Safety
    /// AMX with the full tile configuration loaded; `a0` points at the
    /// block's `ROWS * 256` bytes of activations; c < 4.
    #[inline(always)]
    unsafe fn chunk_products(pb: &AmxBlock, has_hi: bool, a0: *const u8, c: usize) {
        // SAFETY: tiles 0 and 1 read 16 rows of 64 bytes 256 bytes apart
        // from the block's activations, tiles 2 and 3 16 rows of the
        // block's 64-row arrays.
        unsafe {
            let a1 = a0.add(16 * 256);
            tile_load!(2, pb.lo[16 * c..].as_ptr(), 64usize);
            tile_load!(0, a0.add(64 * c), 256usize);
            tile_load!(1, a1.add(64 * c), 256usize);
            tdpbsud!(4, 0, 2);
            tdpbsud!(6, 1, 2);
            if has_hi {
                tile_load!(3, pb.hi[16 * c..].as_ptr(), 64usize);
                tdpbssd!(5, 0, 3);
                tdpbssd!(7, 1, 3);
            }
        }
    }

    /// Result tiles 4, 6 into `lo` and (with `has_hi`) 5, 7 into `hi`.
    ///
    /// # Safety
    /// AMX with the full tile configuration loaded.
    #[inline(always)]
    unsafe fn store_results(has_hi: bool, lo: &mut Results, hi: &mut Results) {
        // SAFETY: 16 rows of 64 bytes into the 64-byte aligned `Results`.
        unsafe {
            tile_store!(4, lo.0.as_mut_ptr(), 64usize);
            tile_store!(6, lo.0[16..].as_mut_ptr(), 64usize);
            if has_hi {
                tile_store!(5, hi.0.as_mut_ptr(), 64usize);
                tile_store!(7, hi.0[16..].as_mut_ptr(), 64usize);
            }
        }
    }

    /// Activation row k's integer sums from stored result tiles:
    /// `lo + 256 hi`.
    ///
    /// # Safety
    /// AVX-512 F; k < ROWS.
    #[inline(always)]
    unsafe fn chunk_sum(has_hi: bool, lo: &Results, hi: &Results, k: usize) -> __m512i {
        // SAFETY: k < ROWS; 16 aligned i32.
        unsafe {
            let s = _mm512_load_si512(lo.0[k].as_ptr().cast());
            if has_hi {
                let h = _mm512_load_si512(hi.0[k].as_ptr().cast());
                _mm512_add_epi32(s, _mm512_slli_epi32::<8>(h))
            } else {
                s
            }
        }
    }

    /// Weight mins pairs `first..first + N` of a block (zero without
    /// mins: not read), loaded once for every activation row.
    ///
    /// # Safety
    /// AVX-512 F; `first + N <= 8`.
    #[inline(always)]
    unsafe fn min_pairs<const MINS: bool, const N: usize>(pb: &AmxBlock, first: usize) -> [__m512i; N] {
        // SAFETY: first + p < 8 (the caller); 64-byte aligned rows.
        std::array::from_fn(|p| unsafe {
            if MINS {
                _mm512_load_si512(pb.mins[first + p].as_ptr().cast())
            } else {
                _mm512_setzero_si512()
            }
        })
    }

    /// The mins' term of activation row `y` over the 16-value group pairs
    /// `first..first + pairs.len()` whose weight mins are `pairs` (zero for
    /// types without mins).
    ///
    /// # Safety
    /// AVX-512 F/BW/VNNI; `first + pairs.len() <= 8`.
    #[inline(always)]
    unsafe fn mins_term<const MINS: bool>(pairs: &[__m512i], first: usize, y: &BlockQ8K) -> __m512i {
        let mut m = _mm512_setzero_si512();
        if MINS {
            for (p, &mp) in pairs.iter().enumerate() {
                // SAFETY: first + p < 8 (the caller).
                m = _mm512_dpwssd_epi32(m, mp, unsafe { bsum_pair(y, first + p) });
            }
        }
        m
    }
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::super::ggml_superblock::{q8k_rows, Order};
    use super::super::{Isa, QuantizedRows};
    use rustorch_core::quant::{QTensor, QType};

    fn values(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed | 1;
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                (s >> 40) as f32 / (1u64 << 23) as f32 - 1.0
            })
            .collect()
    }

    /// The AMX products equal the AVX-512 VNNI panels' bit for bit, for
    /// every type, order mix and ragged shape.
    #[test]
    fn amx_panels_equal_vnni_panels() {
        if !Isa::Amx.is_available() {
            eprintln!("skipped: AMX is not available on this CPU (or not granted by the OS)");
            return;
        }
        let cols = 768;
        for qtype in [QType::Q2K, QType::Q3K, QType::Q4K, QType::Q5K, QType::Q6K, QType::IQ4XS] {
            for rows in [16, 40] {
                let mut wv = values(rows * cols, 7 + rows as u64);
                // Some large outliers: extreme scales and codes.
                for v in wv.iter_mut().step_by(97) {
                    *v *= 40.0;
                }
                let w = QTensor::quantize(qtype, [rows, cols], &wv).unwrap();
                let mat = crate::qmatmul::QMatRef::of_tensor(&w).unwrap();
                for m in [1, 5, 16, 21, 35] {
                    let act = QuantizedRows::quantize(QType::Q8K, &values(m * cols, 90 + m as u64), cols).unwrap();
                    let acts = q8k_rows(&act);
                    let gemm_rows = m - m % 4;
                    let orders: [(&str, &(dyn Fn(usize) -> Order + Sync)); 4] = [
                        ("tiled", &|_| Order::Tiled),
                        ("gemm", &|i| {
                            if i < gemm_rows {
                                Order::RepackGemm
                            } else {
                                Order::RepackGemv
                            }
                        }),
                        ("halves", &|i| {
                            if i < gemm_rows {
                                Order::RepackGemmHalves
                            } else {
                                Order::RepackGemv
                            }
                        }),
                        ("gemv", &|_| Order::RepackGemv),
                    ];
                    for (name, order) in orders {
                        let mut want = vec![f32::NAN; m * rows];
                        let mut got = vec![f32::NAN; m * rows];
                        super::super::ggml_panel::product_vnni(Isa::Avx512Vnni, &mat, &acts, &mut want, order);
                        super::product(Isa::Amx, &mat, &acts, &mut got, order);
                        for (i, (g, e)) in got.iter().zip(&want).enumerate() {
                            assert_eq!(
                                g.to_bits(),
                                e.to_bits(),
                                "{qtype} rows={rows} m={m} {name}: output ({}, {}) {g} vs {e}",
                                i / rows,
                                i % rows
                            );
                        }
                    }
                }
            }
        }
    }
}
