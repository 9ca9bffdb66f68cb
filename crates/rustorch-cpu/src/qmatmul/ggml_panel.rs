//! K-quant batches in llama.cpp's tiled and repacked orders, with AVX-512
//! VNNI, sixteen weight rows at a time ("panels").
//!
//! The orders (`ggml_superblock::Order`, documented in `ggml_tiled` and
//! `ggml_repack`) fix the f32 operations of each output, once per 64, 128
//! or 256 values, but the integers they start from are exact sums that any
//! method may compute. Here each i32 lane of a 512-bit register is one
//! weight row, so the integers come out vertical and the f32 operations
//! run on sixteen outputs at once, with no horizontal reduction:
//!
//! - a panel super-block holds the sixteen rows' codes (unsigned, in the
//!   activations' order) interleaved by four: `codes[q]` is values
//!   `4q..4q + 4` of every row, so one `vpdpbusd` against four broadcast
//!   activation bytes adds four products to each row's lane;
//! - per scale group (16 or 32 values) the lanes are multiplied by the
//!   rows' group scales (`vpmulld`) and added to the chunk's sum;
//! - the terms that use the activation's 16-value sums `bsums` (the mins of
//!   Q2_K/Q4_K/Q5_K, and `-BIAS * scale` for the types whose codes are
//!   offset: Q3_K, Q6_K, IQ4_XS) are `vpdpwssd` of i16 pairs with pairs of
//!   broadcast `bsums`.
//!
//! Every sum is exact (codes below 256, activations in -127..=127, at most
//! 256 products per i32), so the bits equal llama.cpp's in each order.

// Group, quad, pair and lane indices address several arrays.
#![allow(clippy::needless_range_loop)]

use super::ggml_superblock::{Order, Unpack, Unpacked};
use super::{Isa, OutPtr, QMatRef, ThreadBuffer};
use rayon::prelude::*;
use rustorch_core::quant::blocks::{
    f16_to_f32, q3k_scales, Block, BlockIQ4XS, BlockQ2K, BlockQ3K, BlockQ4K, BlockQ5K, BlockQ6K, BlockQ8K,
    KVALUES_IQ4NL,
};
use rustorch_core::quant::QType;

/// Weight rows per panel: the i32 lanes of a 512-bit register.
pub(super) const LANES: usize = 16;

/// One weight row's super-block as the panel kernel reads it.
#[derive(Clone)]
#[repr(C)]
pub(super) struct SuperRow {
    /// Unsigned codes in activation order (value = code - bias).
    pub codes: [u8; 256],
    /// The scale of each group (16 groups of 16 or 8 of 32 values).
    pub scales: [i32; 16],
    /// Per 16 values: the min (types with mins), or `-bias * scale`.
    pub corr: [i16; 16],
    pub d: f32,
    pub dmin: f32,
}

impl SuperRow {
    pub(super) fn blank() -> SuperRow {
        SuperRow {
            codes: [0; 256],
            scales: [0; 16],
            corr: [0; 16],
            d: 0.0,
            dmin: 0.0,
        }
    }
}

/// Sixteen rows' super-block `b`, interleaved for the kernel.
#[repr(C, align(64))]
pub(super) struct PanelBlock {
    /// `codes[q][4r + e]` is value `4q + e` of row `r`.
    codes: [[u8; 64]; 64],
    /// `scales[g][r]`: group g's scale for row r.
    scales: [[i32; LANES]; 16],
    /// `corr[p][r]`: row r's `corr[2p]` in the low i16, `corr[2p + 1]` in
    /// the high one (`vpdpwssd` against `bsums[2p..2p + 2]`).
    corr: [[i32; LANES]; 8],
    d: [f32; LANES],
    dmin: [f32; LANES],
}

impl PanelBlock {
    fn zeroed() -> PanelBlock {
        PanelBlock {
            codes: [[0; 64]; 64],
            scales: [[0; LANES]; 16],
            corr: [[0; LANES]; 8],
            d: [0.0; LANES],
            dmin: [0.0; LANES],
        }
    }

    /// Everything of row `r` but its codes.
    fn put_meta(&mut self, r: usize, s: &SuperRow) {
        for g in 0..16 {
            self.scales[g][r] = s.scales[g];
        }
        self.put_corr(r, &s.corr);
        self.d[r] = s.d;
        self.dmin[r] = s.dmin;
    }

    fn put_codes(&mut self, r: usize, codes: &[u8; 256]) {
        for q in 0..64 {
            self.codes[q][4 * r..4 * r + 4].copy_from_slice(&codes[4 * q..4 * q + 4]);
        }
    }

    /// The codes of all sixteen rows (`rows[r]`), interleaved by four:
    /// `put_codes` of each row, as four 16 x 16 transposes of 4-byte
    /// quads where AVX-512 is present (a quarter of the instructions of
    /// 1024 four-byte moves, which were a tenth of a prompt's time).
    fn put_all_codes(&mut self, rows: &StagedCodes) {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx512f") {
            for c in 0..4 {
                // SAFETY: AVX-512 F is present (checked above).
                unsafe { transpose_quads(rows, c, &mut self.codes) };
            }
            return;
        }
        for (r, codes) in rows.0.iter().enumerate() {
            self.put_codes(r, codes);
        }
    }

    fn put_corr(&mut self, r: usize, corr: &[i16; 16]) {
        for p in 0..8 {
            let (lo, hi) = (corr[2 * p] as u16 as u32, corr[2 * p + 1] as u16 as u32);
            self.corr[p][r] = (lo | hi << 16) as i32;
        }
    }

    /// `put_meta` of `from_unpacked(u, group, bias)`, without the
    /// `SuperRow`.
    fn put_unpacked_meta(&mut self, r: usize, u: &Unpacked, group: usize, bias: i32) {
        let (scales, corr) = scales_and_corr(u, group, bias);
        for g in 0..16 {
            self.scales[g][r] = scales[g];
        }
        self.put_corr(r, &corr);
        self.d[r] = u.d;
        self.dmin[r] = u.dmin;
    }
}

/// Sixteen rows' codes of one super-block, row by row, before `put_all_codes`
/// interleaves them.
#[repr(C, align(64))]
pub(super) struct StagedCodes([[u8; 256]; LANES]);

/// Quads `16 c .. 16 c + 16` of the sixteen staged rows into
/// `codes[16 c + k][4 r .. 4 r + 4]` (a 16 x 16 transpose of u32 values).
///
/// # Safety
/// AVX-512 F must be available.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn transpose_quads(rows: &StagedCodes, c: usize, codes: &mut [[u8; 64]; 64]) {
    use std::arch::x86_64::*;
    // SAFETY (loads and stores): 64 bytes inside row r's 256 and inside
    // `codes[16 c + k]`.
    let r: [__m512i; 16] = std::array::from_fn(|i| unsafe { _mm512_loadu_si512(rows.0[i][64 * c..].as_ptr().cast()) });
    // Pairs of rows interleaved by u32, then groups of four by u64: u[4g + e]
    // holds, in 128-bit lane L, rows 4g..4g + 4 of quad 4L + e.
    let mut u = [_mm512_setzero_si512(); 16];
    for g in 0..4 {
        let t0 = _mm512_unpacklo_epi32(r[4 * g], r[4 * g + 1]);
        let t1 = _mm512_unpackhi_epi32(r[4 * g], r[4 * g + 1]);
        let t2 = _mm512_unpacklo_epi32(r[4 * g + 2], r[4 * g + 3]);
        let t3 = _mm512_unpackhi_epi32(r[4 * g + 2], r[4 * g + 3]);
        u[4 * g] = _mm512_unpacklo_epi64(t0, t2);
        u[4 * g + 1] = _mm512_unpackhi_epi64(t0, t2);
        u[4 * g + 2] = _mm512_unpacklo_epi64(t1, t3);
        u[4 * g + 3] = _mm512_unpackhi_epi64(t1, t3);
    }
    for e in 0..4 {
        let (a, b, cc, d) = (u[e], u[4 + e], u[8 + e], u[12 + e]);
        let ab_lo = _mm512_shuffle_i32x4::<0b01_00_01_00>(a, b);
        let ab_hi = _mm512_shuffle_i32x4::<0b11_10_11_10>(a, b);
        let cd_lo = _mm512_shuffle_i32x4::<0b01_00_01_00>(cc, d);
        let cd_hi = _mm512_shuffle_i32x4::<0b11_10_11_10>(cc, d);
        let out = [
            _mm512_shuffle_i32x4::<0b10_00_10_00>(ab_lo, cd_lo),
            _mm512_shuffle_i32x4::<0b11_01_11_01>(ab_lo, cd_lo),
            _mm512_shuffle_i32x4::<0b10_00_10_00>(ab_hi, cd_hi),
            _mm512_shuffle_i32x4::<0b11_01_11_01>(ab_hi, cd_hi),
        ];
        for (l, v) in out.into_iter().enumerate() {
            // SAFETY: see above.
            unsafe { _mm512_storeu_si512(codes[16 * c + 4 * l + e].as_mut_ptr().cast(), v) };
        }
    }
}

/// Whether `fill_from_x8` takes `w`'s panels: Q4_K weights in the x8
/// layout (`super::interleave_rows`), on a CPU with AVX-512 BW.
fn x8_fill_applies(w: &QMatRef<'_>) -> bool {
    #[cfg(target_arch = "x86_64")]
    let simd = std::arch::is_x86_feature_detected!("avx512bw");
    #[cfg(not(target_arch = "x86_64"))]
    let simd = false;
    w.interleaved && w.qtype() == QType::Q4K && simd
}

/// Panel block `b` of weight rows `j0..j0 + 16` straight from the weights,
/// where `x8_fill_applies(w)`: in the x8 layout the 32 bytes at
/// `X8_HEAD + 32 t` are quant quad `t` of eight rows, so the nibbles of two
/// groups' quads are a panel line each (`put_all_codes`' result) with no
/// unpacking of rows; the heads give the scales, mins and d per row.
fn fill_from_x8(w: &QMatRef<'_>, j0: usize, b: usize, block: &mut PanelBlock) {
    use super::INTERLEAVE_ROWS;
    use rustorch_core::quant::blocks::scale_min_k4;
    // Rows past the matrix (its last panel may hold one group only).
    let group_block = |g: usize| (g * INTERLEAVE_ROWS < w.rows()).then(|| w.x8_group_block(g, b));
    let g0 = j0 / INTERLEAVE_ROWS;
    let groups = [group_block(g0), group_block(g0 + 1)];
    #[cfg(target_arch = "x86_64")]
    // SAFETY: AVX-512 BW is present (checked above).
    unsafe {
        x8_codes(groups, &mut block.codes)
    };
    for (h, gb) in groups.iter().enumerate() {
        for r8 in 0..INTERLEAVE_ROWS {
            let r = h * INTERLEAVE_ROWS + r8;
            let Some(gb) = gb else {
                block.put_meta(r, &SuperRow::blank());
                continue;
            };
            let head = &gb[16 * r8..16 * r8 + 16];
            let scales: &[u8; 12] = head[4..16].try_into().expect("12 scale bytes");
            for g in 0..8 {
                let (sc, mn) = scale_min_k4(g, scales);
                block.scales[g][r] = sc as i32;
                // The mins of 16-value groups 2g and 2g + 1 (equal).
                block.corr[g][r] = (mn as u32 | (mn as u32) << 16) as i32;
            }
            block.scales[8..].iter_mut().for_each(|s| s[r] = 0);
            block.d[r] = f16_to_f32([head[0], head[1]]);
            block.dmin[r] = f16_to_f32([head[2], head[3]]);
        }
    }
}

/// The codes of `fill_from_x8`: quad `t` of both groups' rows (zero for an
/// absent group), low nibbles to panel line `16 (t / 8) + t % 8`, high
/// nibbles eight lines further (values 32 on in the chunk).
///
/// # Safety
/// AVX-512 F and BW must be available.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn x8_codes(groups: [Option<&[u8]>; 2], codes: &mut [[u8; 64]; 64]) {
    use super::X8_HEAD;
    use std::arch::x86_64::*;
    let m4 = _mm512_set1_epi8(0x0F);
    let half = |g: Option<&[u8]>, t: usize| match g {
        // SAFETY: 32 bytes inside the 1152-byte group block.
        Some(gb) => unsafe { _mm256_loadu_si256(gb[X8_HEAD + 32 * t..X8_HEAD + 32 * t + 32].as_ptr().cast()) },
        None => _mm256_setzero_si256(),
    };
    for t in 0..32 {
        let v = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(half(groups[0], t)), half(groups[1], t));
        let line = 16 * (t / 8) + t % 8;
        // SAFETY: 64-byte stores into lines `line` and `line + 8` (< 64).
        unsafe {
            _mm512_storeu_si512(codes[line].as_mut_ptr().cast(), _mm512_and_si512(v, m4));
            _mm512_storeu_si512(
                codes[line + 8].as_mut_ptr().cast(),
                _mm512_and_si512(_mm512_srli_epi16::<4>(v), m4),
            );
        }
    }
}

/// A weight type the panels take: how its super-blocks unpack and how the
/// kernel groups them.
pub(super) trait PanelType: Block + Sync {
    /// Values per scale group: 16 or 32.
    const GROUP: usize;
    /// Whether `corr` holds mins (summed apart and scaled by `dmin`) or
    /// bias terms (added to the products).
    const MINS: bool;
    /// The unpacking of one super-block, at the widest level this CPU runs
    /// at or below `isa`.
    fn unpack_row(isa: Isa) -> impl Fn(&Self) -> SuperRow + Sync;

    /// Writes one super-block as row `r` of a panel block, its codes in
    /// `codes` (for `put_all_codes`): `unpack_row`, by default (the
    /// K-quants skip the `SuperRow`).
    fn panel_filler(isa: Isa) -> impl Fn(&Self, &mut PanelBlock, &mut [u8; 256], usize) + Sync {
        let unpack = Self::unpack_row(isa);
        move |x, block, codes, r| {
            let s = unpack(x);
            *codes = s.codes;
            block.put_meta(r, &s);
        }
    }
}

/// From the shared unpacking (Q2_K, Q4_K, Q5_K, Q6_K); `bias` is Q6_K's 32.
fn from_unpacked(u: &Unpacked, group: usize, bias: i32) -> SuperRow {
    let (scales, corr) = scales_and_corr(u, group, bias);
    SuperRow {
        codes: u.codes,
        scales,
        corr,
        d: u.d,
        dmin: u.dmin,
    }
}

/// `SuperRow`'s group scales (zero past `256 / group`) and `corr` of an
/// unpacked super-block.
fn scales_and_corr(u: &Unpacked, group: usize, bias: i32) -> ([i32; 16], [i16; 16]) {
    let mut scales = [0; 16];
    for g in 0..256 / group {
        // Lane l scales codes 4l..4l + 4 (its low i16).
        scales[g] = u.lane_scales[g * group / 4] as i16 as i32;
    }
    let corr = std::array::from_fn(|k| {
        if bias == 0 {
            u.mins[k]
        } else {
            (-bias * u.bias_scales[k] as i32) as i16
        }
    });
    (scales, corr)
}

macro_rules! via_unpacked {
    ($t:ty, $group:expr, $mins:expr, $bias:expr) => {
        impl PanelType for $t {
            const GROUP: usize = $group;
            const MINS: bool = $mins;
            fn unpack_row(isa: Isa) -> impl Fn(&Self) -> SuperRow + Sync {
                let unpack = <$t as Unpack>::unpacker(isa);
                move |x| from_unpacked(&unpack(x), $group, $bias)
            }

            fn panel_filler(isa: Isa) -> impl Fn(&Self, &mut PanelBlock, &mut [u8; 256], usize) + Sync {
                let unpack = <$t as Unpack>::unpacker(isa);
                move |x, block, codes, r| {
                    let u = unpack(x);
                    *codes = u.codes;
                    block.put_unpacked_meta(r, &u, $group, $bias);
                }
            }
        }
    };
}

via_unpacked!(BlockQ4K, 32, true, 0);
via_unpacked!(BlockQ5K, 32, true, 0);
via_unpacked!(BlockQ2K, 16, true, 0);
via_unpacked!(BlockQ6K, 16, false, 32);

impl PanelType for BlockQ3K {
    const GROUP: usize = 16;
    const MINS: bool = false;
    fn unpack_row(_: Isa) -> impl Fn(&Self) -> SuperRow + Sync {
        |x: &Self| {
            // Value v = low2 - 4 * !hbit, so the code v + 4 = low2 | hbit << 2.
            let mut s = SuperRow::blank();
            for c in 0..8 {
                let (src, shift) = (32 * (c / 4), 2 * (c % 4));
                for e in 0..32 {
                    let lo = (x.qs[src + e] >> shift) & 3;
                    let hb = (x.hmask[e] >> c) & 1;
                    s.codes[32 * c + e] = lo | hb << 2;
                }
            }
            let sc = q3k_scales(&x.scales);
            for k in 0..16 {
                s.scales[k] = sc[k] as i32;
                s.corr[k] = -4 * sc[k] as i16;
            }
            s.d = f16_to_f32(x.d);
            s
        }
    }
}

impl PanelType for BlockIQ4XS {
    const GROUP: usize = 32;
    const MINS: bool = false;
    fn unpack_row(_: Isa) -> impl Fn(&Self) -> SuperRow + Sync {
        |x: &Self| {
            // Levels in -127..=113, as codes level + 128.
            let mut s = SuperRow::blank();
            let sh = u16::from_le_bytes(x.scales_h);
            for g in 0..8 {
                for e in 0..32 {
                    let q = (x.qs[16 * g + e % 16] >> (4 * (e / 16))) & 0xF;
                    s.codes[32 * g + e] = (KVALUES_IQ4NL[q as usize] as i16 + 128) as u8;
                }
                let lo = (x.scales_l[g / 2] >> (4 * (g % 2))) & 0xF;
                let ls = (lo | (((sh >> (2 * g)) & 3) as u8) << 4) as i32 - 32;
                s.scales[g] = ls;
                s.corr[2 * g] = (-128 * ls) as i16;
                s.corr[2 * g + 1] = (-128 * ls) as i16;
            }
            s.d = f16_to_f32(x.d);
            s
        }
    }
}

/// The order's code for the kernel's const parameter.
const fn order_code(o: Order) -> u8 {
    match o {
        Order::Tiled => 0,
        Order::RepackGemv => 1,
        Order::RepackGemm => 2,
        Order::RepackGemmHalves => 3,
        Order::Amx => 4,
    }
}
const TILED: u8 = order_code(Order::Tiled);
const GEMV: u8 = order_code(Order::RepackGemv);
const GEMM: u8 = order_code(Order::RepackGemm);
const HALVES: u8 = order_code(Order::RepackGemmHalves);
#[cfg(target_arch = "x86_64")]
const AMX: u8 = order_code(Order::Amx);

/// Whether this CPU runs the panel kernels at or below `isa`.
pub(super) fn available(isa: Isa) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        isa >= Isa::Avx512Vnni && Isa::Avx512Vnni.is_available()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = isa;
        false
    }
}

/// `out = acts @ w^T` (Q8_K rows), output row i in `order(i)`, which must be the same for
/// the rows of each aligned group of four below `m - m % 4` (llama.cpp's
/// gemm rows) and may differ only for the rest. The caller checked shapes
/// and types, `applies(w.qtype())` and `available(isa)`. With AMX (`isa`
/// at `Isa::Amx` and the CPU and OS allowing it) the integer sums come
/// from tile products (`ggml_panel_amx`), with the same bits, where that
/// is faster (`ggml_panel_amx::pays`).
pub(super) fn product(
    isa: Isa,
    w: &QMatRef<'_>,
    acts: &[&[BlockQ8K]],
    out: &mut [f32],
    order: &(dyn Fn(usize) -> Order + Sync),
) {
    if isa >= Isa::Amx && Isa::Amx.is_available() && super::ggml_panel_amx::pays(acts.len(), order) {
        super::ggml_panel_amx::product(isa, w, acts, out, order);
        return;
    }
    product_vnni(isa, w, acts, out, order);
}

/// `product` with AVX-512 VNNI alone.
pub(super) fn product_vnni(
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

/// Panels per task: about 256 KB of interleaved weights (it stays in L2
/// while every activation row goes past it).
fn panels_per_task(nb: usize, panels: usize) -> usize {
    let bytes = nb * std::mem::size_of::<PanelBlock>();
    let by_cache = ((256 << 10) / bytes.max(1)).max(1);
    let threads = rayon::current_num_threads().max(1);
    // Enough tasks for every thread to get several.
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
    let fill = W::panel_filler(isa);
    let from_x8 = x8_fill_applies(w);
    let out_ptr = OutPtr(out.as_mut_ptr());
    (0..panels.div_ceil(per_task)).into_par_iter().for_each(|t| {
        let first = t * per_task;
        let count = per_task.min(panels - first);
        // The panels of the last task on this thread, reused: every field
        // of every row is written below (rows past `n` blank), and a fresh
        // zeroed buffer per task cost a twentieth of a prompt's time.
        let mut buffer = ThreadBuffer::take(&PANEL_BUFFER);
        let blocks = buffer.slice(count * nb, PanelBlock::zeroed);
        // Block by block, sixteen rows each, so that the block being
        // written (5.6 KiB) and the rows' staged codes stay in L1.
        let mut staged = StagedCodes([[0; 256]; LANES]);
        for p in 0..count {
            for b in 0..nb {
                let block = &mut blocks[p * nb + b];
                if from_x8 {
                    fill_from_x8(w, (first + p) * LANES, b, block);
                    continue;
                }
                for (r, codes) in staged.0.iter_mut().enumerate() {
                    let j = (first + p) * LANES + r;
                    if j >= n {
                        let blank = SuperRow::blank();
                        *codes = blank.codes;
                        block.put_meta(r, &blank);
                    } else {
                        w.with_block::<W, _>(j, b, |x| fill(x, block, codes, r));
                    }
                }
                block.put_all_codes(&staged);
            }
        }
        for p in 0..count {
            let j0 = (first + p) * LANES;
            let valid = LANES.min(n - j0);
            let panel = &blocks[p * nb..(p + 1) * nb];
            let mut i = 0;
            while i < m {
                let four = i + 4 <= m && (0..4).all(|k| order(i + k) == order(i));
                let rows = if four { 4 } else { 1 };
                let mut res = [[0f32; LANES]; 4];
                // SAFETY: `available(isa)` was checked by the caller.
                #[cfg(target_arch = "x86_64")]
                unsafe {
                    if four {
                        let a = [acts[i], acts[i + 1], acts[i + 2], acts[i + 3]];
                        res = dispatch::<W, 4>(panel, a, order(i));
                    } else {
                        res[0] = dispatch::<W, 1>(panel, [acts[i]], order(i))[0];
                    }
                }
                for (k, r) in res.iter().enumerate().take(rows) {
                    for (l, &v) in r.iter().enumerate().take(valid) {
                        // SAFETY: this task owns weight rows j0..j0 + 16
                        // (column j0 + l of every output row); see `OutPtr`.
                        unsafe { out_ptr.write((i + k) * n + j0 + l, v) };
                    }
                }
                i += rows;
            }
        }
    });
}

thread_local! {
    /// Panel blocks kept between tasks (see `run`).
    static PANEL_BUFFER: std::cell::Cell<Vec<PanelBlock>> = const { std::cell::Cell::new(Vec::new()) };
}

/// The kernel for `W`'s grouping and the order.
///
/// # Safety
/// AVX-512 F/BW/VL/VNNI, AVX2 and FMA must be available.
#[cfg(target_arch = "x86_64")]
unsafe fn dispatch<W: PanelType, const A: usize>(
    panel: &[PanelBlock],
    acts: [&[BlockQ8K]; A],
    order: Order,
) -> [[f32; LANES]; 4] {
    macro_rules! go {
        ($g32:expr, $mins:expr) => {
            // SAFETY: forwarded from the caller.
            unsafe {
                match order {
                    Order::Tiled => vnni::outputs::<A, $g32, $mins, TILED>(panel, acts),
                    Order::RepackGemv => vnni::outputs::<A, $g32, $mins, GEMV>(panel, acts),
                    Order::RepackGemm => vnni::outputs::<A, $g32, $mins, GEMM>(panel, acts),
                    Order::RepackGemmHalves => vnni::outputs::<A, $g32, $mins, HALVES>(panel, acts),
                    Order::Amx => vnni::outputs::<A, $g32, $mins, AMX>(panel, acts),
                }
            }
        };
    }
    match (W::GROUP == 32, W::MINS) {
        (true, true) => go!(true, true),
        (true, false) => go!(true, false),
        (false, true) => go!(false, true),
        (false, false) => go!(false, false),
    }
}

#[cfg(target_arch = "x86_64")]
pub(super) mod vnni {
    use super::{PanelBlock, AMX, GEMM, GEMV, HALVES, LANES, TILED};
    use rustorch_core::quant::blocks::BlockQ8K;
    use std::arch::x86_64::*;

    /// Four activation bytes (values `4q..4q + 4` of `y`) in every lane.
    #[inline(always)]
    unsafe fn quad(y: &BlockQ8K, q: usize) -> __m512i {
        // SAFETY: q < 64, so the four bytes are inside `qs`.
        unsafe { _mm512_set1_epi32(std::ptr::read_unaligned(y.qs.as_ptr().add(4 * q).cast::<i32>())) }
    }

    /// `bsums[2p]` and `bsums[2p + 1]` as an i16 pair in every lane.
    #[inline(always)]
    pub(in crate::qmatmul) unsafe fn bsum_pair(y: &BlockQ8K, p: usize) -> __m512i {
        // SAFETY: p < 8, so the two i16 are inside `bsums`.
        unsafe { _mm512_set1_epi32(std::ptr::read_unaligned(y.bsums.as_ptr().add(2 * p).cast::<i32>())) }
    }

    /// Sixteen weight rows (`panel`, one entry per super-block) against `A`
    /// activation rows, summed in order `ORDER`; `G32`: scale groups of 32
    /// values (else 16); `MINS`: `corr` holds mins (else bias terms).
    ///
    /// # Safety
    /// AVX-512 F/BW/VL/VNNI, AVX2 and FMA must be available.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma")]
    pub(super) unsafe fn outputs<const A: usize, const G32: bool, const MINS: bool, const ORDER: u8>(
        panel: &[PanelBlock],
        acts: [&[BlockQ8K]; A],
    ) -> [[f32; LANES]; 4] {
        let zero_i = _mm512_setzero_si512();
        let mut acc = [_mm512_setzero_ps(); A];
        let mut acc_min = [_mm512_setzero_ps(); A];
        let (group, groups_per_chunk) = if G32 { (32, 2) } else { (16, 4) };
        let quads = group / 4;
        for (b, pb) in panel.iter().enumerate() {
            let ys: [&BlockQ8K; A] = std::array::from_fn(|k| &acts[k][b]);
            // SAFETY: the panel's arrays are 64-byte aligned and 16 lanes wide.
            let (d, dmin) = unsafe { (_mm512_load_ps(pb.d.as_ptr()), _mm512_load_ps(pb.dmin.as_ptr())) };
            let da: [__m512; A] = std::array::from_fn(|k| _mm512_set1_ps(ys[k].scale()));
            let mut s_block = [zero_i; A];
            let mut m_block = [zero_i; A];
            let mut s_half = [zero_i; A];
            let mut m_half = [zero_i; A];
            for c in 0..4 {
                let mut s = [zero_i; A];
                for gi in 0..groups_per_chunk {
                    let g = c * groups_per_chunk + gi;
                    let mut ga = [zero_i; A];
                    for qi in 0..quads {
                        let q = g * quads + qi;
                        // SAFETY: q < 64; aligned 64-byte row of the panel.
                        let wv = unsafe { _mm512_load_si512(pb.codes[q].as_ptr().cast()) };
                        for k in 0..A {
                            // SAFETY: q < 64.
                            ga[k] = _mm512_dpbusd_epi32(ga[k], wv, unsafe { quad(ys[k], q) });
                        }
                    }
                    // SAFETY: g < 16; aligned.
                    let sc = unsafe { _mm512_load_si512(pb.scales[g].as_ptr().cast()) };
                    for k in 0..A {
                        s[k] = _mm512_add_epi32(s[k], _mm512_mullo_epi32(ga[k], sc));
                    }
                }
                let mut mc = [zero_i; A];
                for p in 2 * c..2 * c + 2 {
                    // SAFETY: p < 8; aligned.
                    let cv = unsafe { _mm512_load_si512(pb.corr[p].as_ptr().cast()) };
                    for k in 0..A {
                        // SAFETY: p < 8.
                        let bs = unsafe { bsum_pair(ys[k], p) };
                        if MINS {
                            mc[k] = _mm512_dpwssd_epi32(mc[k], cv, bs);
                        } else {
                            s[k] = _mm512_dpwssd_epi32(s[k], cv, bs);
                        }
                    }
                }
                for k in 0..A {
                    match ORDER {
                        GEMM => {
                            let (dd, dm) = (_mm512_mul_ps(d, da[k]), _mm512_mul_ps(dmin, da[k]));
                            acc[k] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s[k]), dd, acc[k]);
                            acc_min[k] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(mc[k]), dm, acc_min[k]);
                        }
                        HALVES => {
                            s_half[k] = _mm512_add_epi32(s_half[k], s[k]);
                            m_half[k] = _mm512_add_epi32(m_half[k], mc[k]);
                            if c % 2 == 1 {
                                let (dd, dm) = (_mm512_mul_ps(d, da[k]), _mm512_mul_ps(dmin, da[k]));
                                acc[k] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s_half[k]), dd, acc[k]);
                                acc_min[k] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(m_half[k]), dm, acc_min[k]);
                                s_half[k] = zero_i;
                                m_half[k] = zero_i;
                            }
                        }
                        _ => {
                            s_block[k] = _mm512_add_epi32(s_block[k], s[k]);
                            m_block[k] = _mm512_add_epi32(m_block[k], mc[k]);
                        }
                    }
                }
            }
            for k in 0..A {
                match ORDER {
                    TILED => {
                        // r = f32(s1) * d; r = fma(-dmin, f32(mins), r);
                        // acc = fma(r, d_a, acc). (`fnmadd` rounds
                        // -(dmin * m) + r once, as fma(-dmin, m, r) does.)
                        let r = _mm512_mul_ps(_mm512_cvtepi32_ps(s_block[k]), d);
                        let r = _mm512_fnmadd_ps(dmin, _mm512_cvtepi32_ps(m_block[k]), r);
                        acc[k] = _mm512_fmadd_ps(r, da[k], acc[k]);
                    }
                    GEMV => {
                        let (dd, dm) = (_mm512_mul_ps(d, da[k]), _mm512_mul_ps(dmin, da[k]));
                        acc[k] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s_block[k]), dd, acc[k]);
                        acc_min[k] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(m_block[k]), dm, acc_min[k]);
                    }
                    AMX => {
                        // acc = fma(f32(s), d * d_a, acc); acc = fma(-f32(m),
                        // dmin * d_a, acc) (`fnmadd` rounds once, as that fma).
                        let (dd, dm) = (_mm512_mul_ps(d, da[k]), _mm512_mul_ps(dmin, da[k]));
                        acc[k] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s_block[k]), dd, acc[k]);
                        acc[k] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(m_block[k]), dm, acc[k]);
                    }
                    _ => {}
                }
            }
        }
        let mut res = [[0f32; LANES]; 4];
        for k in 0..A {
            let v = if ORDER == TILED || ORDER == AMX {
                acc[k]
            } else {
                _mm512_sub_ps(acc[k], acc_min[k])
            };
            // SAFETY: 16 f32 into a 16-element array.
            unsafe { _mm512_storeu_ps(res[k].as_mut_ptr(), v) };
        }
        res
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The transposed interleaving puts every code where `put_codes` does.
    #[test]
    fn all_codes_at_once_equal_row_by_row() {
        let mut staged = StagedCodes([[0; 256]; LANES]);
        for (r, row) in staged.0.iter_mut().enumerate() {
            for (i, c) in row.iter_mut().enumerate() {
                *c = (r * 131 + i * 7 + (i >> 3)) as u8;
            }
        }
        let (mut fast, mut slow) = (PanelBlock::zeroed(), PanelBlock::zeroed());
        fast.put_all_codes(&staged);
        for (r, row) in staged.0.iter().enumerate() {
            slow.put_codes(r, row);
        }
        assert_eq!(fast.codes, slow.codes);
    }
}
