//! llama.cpp's AMX build's order for Q4_0, Q4_1 and Q8_0 weights
//! (`ggml-cpu/amx/mmq.cpp`): `rustorch-cli`'s default on CPUs with
//! AMX-INT8, chosen anywhere with `RUSTORCH_GGML_ORDER=amx` (`reference`
//! for the plain order, the library's default).
//!
//! llama.cpp built for a CPU with AMX (a native build on Sapphire Rapids or
//! later) keeps these weights in its AMX buffer and multiplies them there,
//! in another order than its plain CPU path, whose bits the rest of
//! `quant::matmul` reproduces: for each output `(m, n)` it sums every
//! 32-value block in integers (tile products for batches, `vpdpbusd` for
//! one row), then
//!
//! ```text
//! acc = fma(f32(isum_b), d_w[n][b] * d_a[m][b], acc)      every type
//! acc = fma(m_w[n][b], s_a[m][b], acc)                    Q4_1 only
//! ```
//!
//! from `acc = 0` over the blocks in order, where the plain path keeps
//! eight f32 lanes per output and adds them at the end. Integer sums are
//! exact, so any instructions may form them; the f32 steps are the ones
//! above, the same for one activation row and for many (the AMX build's
//! matvec and tile kernels agree). Activations are quantized as on the
//! plain path (Q8_0, Q8_1 for Q4_1).
//!
//! The order is cheaper than the plain one (one conversion and one or two
//! FMAs per block for sixteen outputs at once), which is most of why that
//! build processes prompts about twice as fast on legacy types. Output
//! then matches that build, not the plain one: a native build of llama.cpp
//! on a CPU with AMX is that build (`GgmlOrder::native`), so `rustorch-cli`
//! takes this order there (`set_default_ggml_order`). It applies
//! to the weights llama.cpp's loader puts in the AMX buffer: matrices only
//! multiplied (`QMatRef::with_repack(false)` marks the others, such as a
//! tied token embedding) whose row count is a multiple of 32
//! (`supports_op` in `ggml-cpu/amx/amx.cpp`). The K-quants' AMX order is
//! `amx_order_k`'s.
//!
//! Weights go in groups of sixteen rows. A group's panel holds, per block,
//! the rows' 32 values as signed bytes laid out for a tile product's second
//! operand (`codes[k][4 n + e]` = value `4 k + e` of row `n`), their f32
//! scales (and mins) and `128 * sum` of each row's values (the correction
//! for `vpdpbusd`, which multiplies unsigned by signed bytes: the
//! activations go in as `a + 128`). With AMX, sixteen activation rows of a
//! block are one tile (loaded in place from the Q8_0/Q8_1 rows) and one
//! `tdpbssd` gives the 16 x 16 block sums; elsewhere `vpdpbusd` forms them
//! a row at a time.
//!
//! The model loader stores such weights packed once (`pack`, as llama.cpp's
//! AMX buffer does): per block of sixteen rows the codes in the panel's
//! order (Q4 nibbles still packed; Q8_0 values plus 128, whose correction
//! comes from the activations' block sums), every type keeping its size.
//! A panel is then an unbiasing copy or a nibble split, and token
//! generation streams the packed groups directly (`simd::packed_rows`).
//! Matrices in GGUF's layout (the `qmatmul` API) are read as they are
//! (`simd::direct16`, `Panel::fill`).

// Row, lane and block indices address several arrays.
#![allow(clippy::needless_range_loop)]

use super::{Isa, OutPtr, QMatRef, QuantizedRows, ThreadBuffer};
use half::f16;
use rayon::prelude::*;
use rustorch_core::quant::QType;
use std::sync::OnceLock;

/// Which llama.cpp build's arithmetic the products reproduce.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GgmlOrder {
    /// The plain CPU backend (any build without AMX): the library's
    /// default, and `rustorch-cli`'s on CPUs without AMX.
    Reference,
    /// The AMX build, for the weights it multiplies in its AMX buffer:
    /// `rustorch-cli`'s default on CPUs with AMX-INT8 (`native`).
    Amx,
}

impl GgmlOrder {
    /// `RUSTORCH_GGML_ORDER`: `amx` or `reference` (an unknown value is an
    /// error to the caller).
    pub fn parse(s: &str) -> Option<GgmlOrder> {
        match s.to_ascii_lowercase().as_str() {
            "amx" => Some(GgmlOrder::Amx),
            "reference" | "ref" | "plain" => Some(GgmlOrder::Reference),
            _ => None,
        }
    }

    /// llama.cpp's order on this CPU when built natively: `-march=native`
    /// defines `__AMX_INT8__` where the CPU has it, and ggml then keeps the
    /// covered weights in its AMX buffer. Whether the OS grants the tile
    /// state does not matter: the order is the same with or without tiles.
    pub fn native() -> GgmlOrder {
        #[cfg(target_arch = "x86_64")]
        if super::amx::cpu_has_amx_int8() {
            return GgmlOrder::Amx;
        }
        GgmlOrder::Reference
    }
}

static ORDER: OnceLock<GgmlOrder> = OnceLock::new();

/// The order of this process's products, fixed at its first read:
/// `RUSTORCH_GGML_ORDER`, else what `set_default_ggml_order` chose, else
/// `Reference` (an unknown value reads as the default; `rustorch-cli`
/// rejects it first). The library's tests and fixtures assume the plain
/// build's order on every CPU unless the variable says otherwise.
pub fn ggml_order() -> GgmlOrder {
    *ORDER.get_or_init(|| env_order().unwrap_or(GgmlOrder::Reference))
}

fn env_order() -> Option<GgmlOrder> {
    std::env::var("RUSTORCH_GGML_ORDER")
        .ok()
        .and_then(|v| GgmlOrder::parse(&v))
}

/// Makes `order` this process's order where `RUSTORCH_GGML_ORDER` does not
/// name one (`rustorch-cli` passes `GgmlOrder::native()`). Call it before
/// any product: once the order has been read it no longer changes, and
/// this returns false.
pub fn set_default_ggml_order(order: GgmlOrder) -> bool {
    ORDER.set(env_order().unwrap_or(order)).is_ok()
}

/// The f16 (little-endian) at byte `at` of `b`, widened.
fn f16_at(b: &[u8], at: usize) -> f32 {
    f16::from_bits(u16::from_le_bytes([b[at], b[at + 1]])).to_f32()
}

/// Rows per group (one tile's sixteen output columns).
const GROUP: usize = 16;
/// Groups per parallel task: activation rows loaded once serve four.
const GROUPS_PER_TASK: usize = 4;
/// Values per block.
const QK: usize = 32;

/// Whether the AMX build multiplies `w` in its AMX buffer (the order of
/// this module): a legacy type it has kernels for, a matrix only
/// multiplied, rows a multiple of 32.
pub(super) fn covers(w: &QMatRef<'_>) -> bool {
    let (qtype, rows, cols) = (w.qtype(), w.rows(), w.cols());
    w.amx_packed
        || (w.extra_buffer
            && ((shape_covered(qtype, rows, cols) && !w.is_interleaved())
                || super::amx_order_k::shape_covered(qtype, rows, cols)))
}

/// A legacy type with AMX kernels in llama.cpp, rows a multiple of 32.
fn shape_covered(qtype: QType, rows: usize, cols: usize) -> bool {
    matches!(qtype, QType::Q4_0 | QType::Q4_1 | QType::Q8_0)
        && rows.is_multiple_of(2 * GROUP)
        && cols.is_multiple_of(QK)
}

/// Whether a matrix that is only multiplied is stored packed (`pack`) in
/// this process: the AMX order is on and covers its type and shape.
pub fn packs(qtype: QType, rows: usize, cols: usize) -> bool {
    ggml_order() == GgmlOrder::Amx && shape_covered(qtype, rows, cols)
}

/// Bytes of one packed block: sixteen rows' block `b` (`pack`).
pub fn packed_block_bytes(qtype: QType) -> usize {
    match qtype {
        QType::Q8_0 => 512 + 32,
        QType::Q4_1 => 256 + 32 + 32,
        _ => 256 + 32,
    }
}

/// Rows per packed group (`pack`).
pub const PACKED_ROWS: usize = GROUP;

/// `rows x cols` weights (GGUF blocks, row after row) in the packed layout
/// that the AMX order's kernels stream, as llama.cpp's AMX buffer holds
/// them: groups of sixteen rows, each group's blocks in order, each block
/// `packed_block_bytes` long:
///
/// - Q8_0: the values plus 128 as unsigned bytes (`vpdpbusd`'s unsigned
///   operand, against the signed activations), `codes[64 k + 4 n + e]` =
///   value `4 k + e` of row `n` (a tile operand once its bias is removed);
///   each row's `d` (f16);
/// - Q4_0, Q4_1: the packed nibbles, `nib[64 k + 4 n + e]` = byte `4 k + e`
///   of row `n`'s codes (low nibble value `4 k + e`, high `4 k + e + 16`);
///   each row's `d` (f16), then for Q4_1 each row's `m` (f16).
///
/// Every block keeps its size (544 bytes for sixteen Q8_0 rows, 256 or 288
/// for Q4): the bias of Q8_0's codes moves the correction that `vpdpbusd`
/// needs from the weights (each row's sum, 6% more bytes to stream) to the
/// activations (each block's sum, computed once per product).
pub fn pack(
    qtype: QType,
    rows: usize,
    cols: usize,
    mut bytes: Vec<u8>,
) -> Result<Vec<u8>, rustorch_core::quant::QuantError> {
    let ts = qtype.type_size();
    if !shape_covered(qtype, rows, cols) || bytes.len() != rows * cols / QK * ts {
        return Err(rustorch_core::quant::QuantError::Mismatch {
            op: "amx_order::pack",
            detail: format!(
                "{} bytes are not {rows} x {cols} {qtype} weights with rows a multiple of 32",
                bytes.len()
            ),
        });
    }
    let kb = cols / QK;
    let rb = kb * ts;
    let pb = packed_block_bytes(qtype);
    let group_bytes = GROUP * rb;
    debug_assert_eq!(group_bytes, kb * pb, "packing keeps every block's size");
    // In place, each group within its own bytes (copied aside first): no
    // second copy of the weights is ever made (a 1 GB model would need
    // twice the memory, and the kernel would clear twice the pages).
    let pack_group = |rows_of_group: &[u8], group: &mut [u8]| {
        for (b, dst) in group.chunks_exact_mut(pb).enumerate() {
            for n in 0..GROUP {
                let block = &rows_of_group[n * rb + b * ts..][..ts];
                match qtype {
                    QType::Q8_0 => {
                        for k in 0..8 {
                            for e in 0..4 {
                                dst[64 * k + 4 * n + e] = block[2 + 4 * k + e] ^ 0x80;
                            }
                        }
                        dst[512 + 2 * n..514 + 2 * n].copy_from_slice(&block[..2]);
                    }
                    _ => {
                        let qs = if qtype == QType::Q4_1 {
                            &block[4..20]
                        } else {
                            &block[2..18]
                        };
                        for k in 0..4 {
                            dst[64 * k + 4 * n..64 * k + 4 * n + 4].copy_from_slice(&qs[4 * k..4 * k + 4]);
                        }
                        dst[256 + 2 * n..258 + 2 * n].copy_from_slice(&block[..2]);
                        if qtype == QType::Q4_1 {
                            dst[288 + 2 * n..290 + 2 * n].copy_from_slice(&block[2..4]);
                        }
                    }
                }
            }
        }
    };
    bytes.par_chunks_exact_mut(group_bytes).for_each_init(
        || vec![0u8; group_bytes],
        |rows_of_group, group| {
            rows_of_group.copy_from_slice(group);
            pack_group(rows_of_group, group);
        },
    );
    Ok(bytes)
}

/// Whether products of `w` take this module's order in this process.
pub(super) fn applies(w: &QMatRef<'_>) -> bool {
    // Packed weights exist only in this order (`packs`).
    w.amx_packed || (ggml_order() == GgmlOrder::Amx && covers(w))
}

/// 512 bytes on a cache-line boundary: one block of a panel, or of sixteen
/// activation rows, as a tile load reads it. Unaligned, each of a tile
/// load's rows would straddle two cache lines (a `Vec` of plain byte
/// arrays starts 16 bytes past one).
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Block512([u8; 512]);

impl Block512 {
    const ZERO: Block512 = Block512([0; 512]);
}

impl std::ops::Deref for Block512 {
    type Target = [u8; 512];
    fn deref(&self) -> &[u8; 512] {
        &self.0
    }
}

impl std::ops::DerefMut for Block512 {
    fn deref_mut(&mut self) -> &mut [u8; 512] {
        &mut self.0
    }
}

/// The 2 x 2 tile kernel's results: `0[2 mi + ni]` holds rows `16 mi..`
/// of the pair against panel `ni`, on their own cache lines (the kernel
/// keeps its accumulators here).
#[repr(C, align(64))]
#[derive(Default)]
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
struct Quad([[[f32; GROUP]; GROUP]; 4]);

/// Sixteen weight rows in the form the kernels read (see the module doc).
#[derive(Default)]
struct Panel {
    /// Per block: `codes[64 k + 4 n + e]` = value `4 k + e` of row `n`
    /// (signed, as bytes).
    codes: Vec<Block512>,
    /// Per block: `128 * sum of row n's values`.
    comp: Vec<[i32; GROUP]>,
    /// Per block: row n's scale.
    d: Vec<[f32; GROUP]>,
    /// Per block: row n's min (Q4_1; zeros otherwise).
    m: Vec<[f32; GROUP]>,
}

impl Panel {
    /// Fills the panel from rows `n0..n0 + 16` of `w` (one of the covered
    /// types, checked by the caller).
    fn fill(&mut self, w: &QMatRef<'_>, n0: usize) {
        let qtype = w.qtype();
        let ts = qtype.type_size();
        let kb = w.cols() / QK;
        self.codes.resize(kb, Block512::ZERO);
        self.comp.resize(kb, [0; GROUP]);
        self.d.resize(kb, [0.0; GROUP]);
        self.m.resize(kb, [0.0; GROUP]);
        for n in 0..GROUP {
            let row = &w.bytes()[(n0 + n) * w.row_bytes..(n0 + n + 1) * w.row_bytes];
            for (b, block) in row.chunks_exact(ts).enumerate() {
                let mut v = [0i8; QK];
                match qtype {
                    QType::Q4_0 | QType::Q4_1 => {
                        let (qs, offset) = if qtype == QType::Q4_0 {
                            (&block[2..18], 8)
                        } else {
                            (&block[4..20], 0)
                        };
                        for j in 0..16 {
                            v[j] = (qs[j] & 0x0F) as i8 - offset;
                            v[j + 16] = (qs[j] >> 4) as i8 - offset;
                        }
                    }
                    _ => {
                        for j in 0..QK {
                            v[j] = block[2 + j] as i8;
                        }
                    }
                }
                let codes = &mut self.codes[b];
                for k in 0..8 {
                    for e in 0..4 {
                        codes[64 * k + 4 * n + e] = v[4 * k + e] as u8;
                    }
                }
                self.comp[b][n] = 128 * v.iter().map(|&x| x as i32).sum::<i32>();
                self.d[b][n] = f16_at(block, 0);
                self.m[b][n] = if qtype == QType::Q4_1 { f16_at(block, 2) } else { 0.0 };
            }
        }
    }
}

impl Panel {
    /// `fill` from packed weights (`pack`): group `g`.
    fn fill_packed(&mut self, w: &QMatRef<'_>, g: usize) {
        let qtype = w.qtype();
        let kb = w.cols() / QK;
        let pb = packed_block_bytes(qtype);
        self.codes.resize(kb, Block512::ZERO);
        self.comp.resize(kb, [0; GROUP]);
        self.d.resize(kb, [0.0; GROUP]);
        self.m.resize(kb, [0.0; GROUP]);
        for b in 0..kb {
            let src = &w.bytes()[(g * kb + b) * pb..][..pb];
            let codes = &mut self.codes[b];
            match qtype {
                QType::Q8_0 => {
                    let mut sums = [0i32; GROUP];
                    for (j, (c, &x)) in codes.iter_mut().zip(&src[..512]).enumerate() {
                        *c = x ^ 0x80;
                        sums[j % 64 / 4] += *c as i8 as i32;
                    }
                    for n in 0..GROUP {
                        self.comp[b][n] = 128 * sums[n];
                        self.d[b][n] = f16_at(src, 512 + 2 * n);
                        self.m[b][n] = 0.0;
                    }
                }
                _ => {
                    let offset = if qtype == QType::Q4_0 { 8 } else { 0 };
                    let mut sums = [0i32; GROUP];
                    for k in 0..4 {
                        for j in 0..64 {
                            let (lo, hi) = (
                                (src[64 * k + j] & 0x0F) as i8 - offset,
                                (src[64 * k + j] >> 4) as i8 - offset,
                            );
                            codes[64 * k + j] = lo as u8;
                            codes[64 * (k + 4) + j] = hi as u8;
                            sums[j / 4] += lo as i32 + hi as i32;
                        }
                    }
                    for n in 0..GROUP {
                        self.comp[b][n] = 128 * sums[n];
                        self.d[b][n] = f16_at(src, 256 + 2 * n);
                        self.m[b][n] = if qtype == QType::Q4_1 {
                            f16_at(src, 288 + 2 * n)
                        } else {
                            0.0
                        };
                    }
                }
            }
        }
    }
}

/// The activation rows as the kernels read them (some fields only by the
/// x86 kernels).
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
struct Acts<'a> {
    q: &'a QuantizedRows,
    /// Values of the Q8_0 / Q8_1 blocks, row after row.
    kb: usize,
    /// Each value plus 128, as an unsigned byte (`vpdpbusd`'s first operand).
    biased: Vec<u8>,
    /// Per row and block: scale `d`.
    d: Vec<f32>,
    /// Per row and block: `s` (Q8_1: `d * sum`; zeros for Q8_0).
    s: Vec<f32>,
    /// Per row and block: the sum of the block's values.
    sum: Vec<i32>,
    /// The tile rows' values as the tile loads read them: per group of
    /// sixteen rows and block, the rows' 32 values one after another
    /// (`tiles[g * kb + b]`), each block on its own cache lines. In place,
    /// a block's 32 values start anywhere in a cache line, and a third of
    /// a tile load's rows straddled two.
    tiles: Vec<Block512>,
    /// Byte offset of a block's values (2 for Q8_0, 4 for Q8_1).
    qs_at: usize,
}

/// Raw pointers to the arrays `Acts::new` fills, for tasks that each fill
/// their own rows.
struct ActsOut {
    biased: *mut u8,
    d: *mut f32,
    s: *mut f32,
    sum: *mut i32,
    tiles: *mut Block512,
}

// SAFETY: each task writes the elements of its own rows only.
unsafe impl Sync for ActsOut {}

impl<'a> Acts<'a> {
    /// The rows' scales; for rows `..tiled` (whole groups of sixteen) their
    /// values laid out for the AMX tiles, for the others their biased
    /// values and sums (rows of the other kind keep zeros there).
    fn new(q: &'a QuantizedRows, kb: usize, tiled: usize) -> Acts<'a> {
        let q8_1 = q.dot_type() == QType::Q8_1;
        let qs_at = if q8_1 { 4 } else { 2 };
        let rows = q.rows();
        let mut acts = Acts {
            q,
            kb,
            biased: vec![0u8; rows * kb * QK],
            d: vec![0f32; rows * kb],
            s: vec![0f32; rows * kb],
            sum: vec![0i32; rows * kb],
            tiles: vec![Block512::ZERO; tiled / GROUP * kb],
            qs_at,
        };
        let out = ActsOut {
            biased: acts.biased.as_mut_ptr(),
            d: acts.d.as_mut_ptr(),
            s: acts.s.as_mut_ptr(),
            sum: acts.sum.as_mut_ptr(),
            tiles: acts.tiles.as_mut_ptr(),
        };
        let fill = |g: usize| {
            for i in g * GROUP..((g + 1) * GROUP).min(rows) {
                // SAFETY: this task alone writes rows g * 16.. of each array,
                // which hold `rows` rows (and `tiled / 16` tile groups).
                unsafe { Self::fill_row(q, kb, qs_at, tiled, i, &out) };
            }
        };
        let groups = rows.div_ceil(GROUP);
        if rows * kb >= 1024 {
            // A batch (thousands of blocks): the groups in parallel.
            (0..groups).into_par_iter().for_each(fill);
        } else {
            (0..groups).for_each(fill);
        }
        acts
    }

    /// Row `i`'s entries.
    ///
    /// # Safety
    /// `out` points at the arrays of an `Acts` of `q` with `kb` blocks per
    /// row and `tiled` tile rows, and no other thread writes row `i`'s
    /// entries meanwhile.
    unsafe fn fill_row(q: &QuantizedRows, kb: usize, qs_at: usize, tiled: usize, i: usize, out: &ActsOut) {
        let ts = qs_at + QK;
        for (b, block) in q.row(i).chunks_exact(ts).enumerate() {
            let at = i * kb + b;
            let values = &block[qs_at..qs_at + QK];
            // SAFETY: `at` is row i's block b (the caller's contract), and
            // tile group i / 16 exists when i < tiled.
            unsafe {
                *out.d.add(at) = f16_at(block, 0);
                if qs_at == 4 {
                    *out.s.add(at) = f16_at(block, 2);
                }
                if i < tiled {
                    let tile = &mut *out.tiles.add(i / GROUP * kb + b);
                    tile[(i % GROUP) * QK..(i % GROUP + 1) * QK].copy_from_slice(values);
                    continue;
                }
                let biased = std::slice::from_raw_parts_mut(out.biased.add(at * QK), QK);
                for (o, &x) in biased.iter_mut().zip(values) {
                    *o = x ^ 0x80;
                }
                *out.sum.add(at) = values.iter().map(|&x| x as i8 as i32).sum();
            }
        }
    }
}

/// `out = act @ w^T` in the AMX build's order (`applies(w)` holds; shapes
/// checked by the caller; `act` is `w`'s dot type).
pub(super) fn product(isa: Isa, w: &QMatRef<'_>, act: &QuantizedRows, out: &mut [f32]) {
    if act.dot_type() == QType::Q8K {
        // The K-quants (`amx_order_k`).
        super::amx_order_k::product(isa, w, act, out);
        return;
    }
    let (m, n) = (act.rows(), w.rows());
    let kb = w.cols() / QK;
    let kernel = Kernel::at_most(isa);
    // The tiles read the Q8 rows as they are; the other rows go through
    // `vpdpbusd`, which needs the biased values.
    let acts = Acts::new(act, kb, kernel.tile_rows(m));
    let q4_1 = w.qtype() == QType::Q4_1;
    let out_ptr = OutPtr(out.as_mut_ptr());
    let groups = n / GROUP;
    #[cfg(target_arch = "x86_64")]
    if w.amx_packed && m < GROUP && !matches!(kernel, Kernel::Scalar) {
        // A few rows of packed weights: each packed group streamed once,
        // its codes met by every row as they are.
        // SAFETY: AVX-512 VNNI is available (`at_most`); each task alone
        // writes its group's outputs of the checked `m x n` product.
        crate::team::for_each(groups, |g| unsafe { packed_group(w, &acts, g, &out_ptr) });
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if m < GROUP && !matches!(kernel, Kernel::Scalar) {
        // A few rows (token generation): each group of weight rows read
        // once, straight from its blocks (a panel would cost more to build
        // than the products).
        crate::team::for_each(groups, |g| {
            for i in 0..m {
                let mut sums = [0f32; GROUP];
                // SAFETY: AVX-512 VNNI is available (`at_most`); row i and
                // weight rows g * 16.. exist.
                unsafe { simd::direct16(w, &acts, i, g * GROUP, &mut sums) };
                for (j, v) in sums.into_iter().enumerate() {
                    // SAFETY: this task alone writes group g's outputs.
                    unsafe { out_ptr.write(i * n + g * GROUP + j, v) };
                }
            }
        });
        return;
    }
    // Tasks claimed one at a time: they take tens of microseconds each, and
    // threads do not run them equally fast (on the AMX host, the thread
    // that owns the pass's team ran its tasks 75% slower than the other:
    // with halves fixed in advance, the other then idled for a third of
    // the product).
    crate::team::for_each_single(groups.div_ceil(GROUPS_PER_TASK), |t| {
        #[cfg(test)]
        let _timing = tests::TaskTiming::start();
        let g0 = t * GROUPS_PER_TASK;
        let g1 = (g0 + GROUPS_PER_TASK).min(groups);
        let mut buffer = ThreadBuffer::take(&PANELS);
        let panels = buffer.slice(g1 - g0, Panel::default);
        for (p, g) in panels.iter_mut().zip(g0..g1) {
            if w.amx_packed {
                kernel.fill_packed(p, w, g);
            } else {
                kernel.fill(p, w, g * GROUP);
            }
        }
        kernel.begin();
        let mut i = 0;
        let mut tile = [[0f32; GROUP]; GROUP];
        while i < m {
            #[cfg(target_arch = "x86_64")]
            if matches!(kernel, Kernel::Amx) && m - i >= 2 * GROUP {
                // Two groups of sixteen rows against the panels in pairs
                // (`simd::amx2x2`), an odd panel left at the end.
                let mut quad = Quad::default();
                let mut k = 0;
                while k + 2 <= panels.len() {
                    // SAFETY: AMX is usable and this thread's tile
                    // configuration is `simd::CONFIG` (`begin`); rows
                    // i..i + 32 exist and are tile rows (`tile_rows`).
                    unsafe { simd::amx2x2(&panels[k], &panels[k + 1], &acts, i, q4_1, &mut quad) };
                    for (t, sums) in quad.0.iter().enumerate() {
                        let (mi, ni) = (t / 2, t % 2);
                        for (r, row) in sums.iter().enumerate() {
                            // SAFETY: this task alone writes the outputs of
                            // groups g0..g1 (16 columns each), for every row.
                            unsafe { out_ptr.write16((i + GROUP * mi + r) * n + (g0 + k + ni) * GROUP, row) };
                        }
                    }
                    k += 2;
                }
                if k < panels.len() {
                    for i16 in [i, i + GROUP] {
                        kernel.run(&panels[k], &acts, i16, GROUP, q4_1, &mut tile);
                        for (r, sums) in tile.iter().enumerate() {
                            // SAFETY: as above.
                            unsafe { out_ptr.write16((i16 + r) * n + (g0 + k) * GROUP, sums) };
                        }
                    }
                }
                i += 2 * GROUP;
                continue;
            }
            let rows = kernel.rows_at(m - i);
            for (p, g) in panels.iter().zip(g0..g1) {
                kernel.run(p, &acts, i, rows, q4_1, &mut tile);
                for (r, sums) in tile[..rows].iter().enumerate() {
                    // SAFETY: this task alone writes the outputs of
                    // groups g0..g1 (16 columns each), for every row.
                    unsafe { out_ptr.write16((i + r) * n + g * GROUP, sums) };
                }
            }
            i += rows;
        }
        kernel.end();
    });
}

thread_local! {
    /// A thread's panels, kept between tasks and products (`product`, via
    /// `ThreadBuffer`).
    static PANELS: std::cell::Cell<Vec<Panel>> = const { std::cell::Cell::new(Vec::new()) };
}

/// Several products of packed weights with a few activation rows each (a
/// decode step's Q, K and V projections, or gate and up) as one parallel
/// loop over every product's groups, each output with the bits `product`
/// gives it. Returns false, doing nothing, unless every weight is packed,
/// every product has fewer than 16 rows and this CPU has AVX-512 VNNI.
pub(super) fn matvecs(isa: Isa, items: &mut [(QMatRef<'_>, &QuantizedRows, &mut [f32])]) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        if matches!(Kernel::at_most(isa), Kernel::Scalar)
            || !items.iter().all(|(w, act, _)| w.amx_packed && act.rows() < GROUP)
        {
            return false;
        }
        let acts: Vec<Acts<'_>> = items
            .iter()
            .map(|(w, act, _)| Acts::new(act, w.cols() / QK, 0))
            .collect();
        let outs: Vec<OutPtr> = items.iter_mut().map(|(_, _, out)| OutPtr(out.as_mut_ptr())).collect();
        let tasks: Vec<(usize, usize)> = items
            .iter()
            .enumerate()
            .flat_map(|(k, (w, _, _))| (0..w.rows() / GROUP).map(move |g| (k, g)))
            .collect();
        let items = &*items;
        crate::team::for_each(tasks.len(), |t| {
            let (k, g) = tasks[t];
            // SAFETY: AVX-512 VNNI is available (`at_most`); this task alone
            // writes group g's outputs of product k (checked shapes).
            unsafe { packed_group(&items[k].0, &acts[k], g, &outs[k]) };
        });
        true
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (isa, items);
        false
    }
}

/// Every activation row of `a` against packed group `g` of `w`, four rows
/// at a time, into `out` (`rows x w.rows()`).
///
/// # Safety
/// AVX-512 VNNI is available; `w` is packed, group `g` exists, `out` points
/// at the product's outputs and no other thread writes group `g`'s.
#[cfg(target_arch = "x86_64")]
unsafe fn packed_group(w: &QMatRef<'_>, a: &Acts<'_>, g: usize, out: &OutPtr) {
    let (m, n) = (a.q.rows(), w.rows());
    let mut tile = [[0f32; GROUP]; GROUP];
    let mut i = 0;
    while i < m {
        let rows = (m - i).min(4);
        // SAFETY: forwarded from the caller; rows i..i + rows exist.
        unsafe {
            match rows {
                1 => simd::packed_rows::<1>(w, a, i, g, &mut tile),
                2 => simd::packed_rows::<2>(w, a, i, g, &mut tile),
                3 => simd::packed_rows::<3>(w, a, i, g, &mut tile),
                _ => simd::packed_rows::<4>(w, a, i, g, &mut tile),
            }
        }
        for (r, sums) in tile[..rows].iter().enumerate() {
            // SAFETY: forwarded from the caller (group g's 16 columns).
            unsafe { out.write16((i + r) * n + g * GROUP, sums) };
        }
        i += rows;
    }
}

/// How the block sums are formed.
#[derive(Clone, Copy)]
enum Kernel {
    Scalar,
    #[cfg(target_arch = "x86_64")]
    Vnni,
    #[cfg(target_arch = "x86_64")]
    Amx,
}

impl Kernel {
    /// The widest kernel this CPU runs at or below `isa`.
    fn at_most(isa: Isa) -> Kernel {
        #[cfg(not(target_arch = "x86_64"))]
        let _ = isa;
        #[cfg(target_arch = "x86_64")]
        {
            if isa >= Isa::Amx && Isa::Amx.is_available() {
                return Kernel::Amx;
            }
            if isa >= Isa::Avx512Vnni && Isa::Avx512Vnni.is_available() {
                return Kernel::Vnni;
            }
        }
        Kernel::Scalar
    }

    /// Readies this thread for `run` (the tile configuration, for AMX).
    fn begin(self) {
        #[cfg(target_arch = "x86_64")]
        if let Kernel::Amx = self {
            // SAFETY: AMX is usable (`at_most`).
            unsafe { simd::CONFIG.load() };
        }
    }

    /// Gives back what `begin` took.
    fn end(self) {
        #[cfg(target_arch = "x86_64")]
        if let Kernel::Amx = self {
            // SAFETY: AMX is usable (`at_most`).
            unsafe { super::amx::release() };
        }
    }

    /// `p.fill(w, n0)`, vectorized where the kernel is.
    fn fill(self, p: &mut Panel, w: &QMatRef<'_>, n0: usize) {
        match self {
            Kernel::Scalar => p.fill(w, n0),
            #[cfg(target_arch = "x86_64")]
            // SAFETY: AVX-512 VNNI is available (`at_most`); rows n0..n0 + 16
            // of a covered type exist (the caller's groups).
            Kernel::Vnni | Kernel::Amx => unsafe { simd::fill16(p, w, n0) },
        }
    }

    /// `p.fill_packed(w, g)`, vectorized where the kernel is.
    fn fill_packed(self, p: &mut Panel, w: &QMatRef<'_>, g: usize) {
        match self {
            Kernel::Scalar => p.fill_packed(w, g),
            #[cfg(target_arch = "x86_64")]
            // SAFETY: AVX-512 VNNI is available (`at_most`); packed group g
            // exists (the caller's groups).
            Kernel::Vnni | Kernel::Amx => unsafe { simd::fill_packed16(p, w, g) },
        }
    }

    /// Of `m` activation rows, how many `product` runs through the tiles:
    /// whole groups of sixteen with AMX (fewer rows in all take the matvec
    /// paths), none otherwise.
    fn tile_rows(self, m: usize) -> usize {
        #[cfg(not(target_arch = "x86_64"))]
        let _ = m;
        match self {
            #[cfg(target_arch = "x86_64")]
            Kernel::Amx if m >= GROUP => m - m % GROUP,
            _ => 0,
        }
    }

    /// Activation rows the next call takes when `left` remain.
    fn rows_at(self, left: usize) -> usize {
        match self {
            #[cfg(target_arch = "x86_64")]
            Kernel::Amx if left >= GROUP => GROUP,
            _ => left.min(4),
        }
    }

    /// Rows `i..i + rows` against one panel into `tile[..rows]`.
    fn run(self, p: &Panel, a: &Acts<'_>, i: usize, rows: usize, q4_1: bool, tile: &mut [[f32; GROUP]; GROUP]) {
        match self {
            Kernel::Scalar => scalar(p, a, i, rows, q4_1, tile),
            #[cfg(target_arch = "x86_64")]
            Kernel::Vnni | Kernel::Amx if rows < GROUP => {
                // SAFETY: AVX-512 VNNI is available (`at_most`); rows <= 4.
                unsafe {
                    match rows {
                        1 => simd::vnni::<1>(p, a, i, q4_1, tile),
                        2 => simd::vnni::<2>(p, a, i, q4_1, tile),
                        3 => simd::vnni::<3>(p, a, i, q4_1, tile),
                        _ => simd::vnni::<4>(p, a, i, q4_1, tile),
                    }
                }
            }
            #[cfg(target_arch = "x86_64")]
            Kernel::Vnni | Kernel::Amx => {
                // SAFETY: AMX is usable and this thread's tile configuration
                // is `simd::CONFIG` (`at_most`, `begin`: only `Amx` asks for
                // 16 rows); rows i..i + 16 exist.
                unsafe { simd::amx16(p, a, i, q4_1, tile) }
            }
        }
    }
}

/// The order in plain Rust: the reference the SIMD kernels are tested
/// against, and the path of CPUs without AVX-512 VNNI.
fn scalar(p: &Panel, a: &Acts<'_>, i: usize, rows: usize, q4_1: bool, tile: &mut [[f32; GROUP]; GROUP]) {
    for r in 0..rows {
        let row = i + r;
        for n in 0..GROUP {
            let mut acc = 0f32;
            for b in 0..a.kb {
                let vals = &a.biased[(row * a.kb + b) * QK..(row * a.kb + b + 1) * QK];
                let mut isum = 0i32;
                for (j, &x) in vals.iter().enumerate() {
                    let w = p.codes[b][64 * (j / 4) + 4 * n + j % 4] as i8 as i32;
                    isum += (x ^ 0x80) as i8 as i32 * w;
                }
                acc = (isum as f32).mul_add(p.d[b][n] * a.d[row * a.kb + b], acc);
                if q4_1 {
                    acc = p.m[b][n].mul_add(a.s[row * a.kb + b], acc);
                }
            }
            tile[r][n] = acc;
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod simd {
    use super::super::amx::{tdpbssd, tile_load, tile_store, tile_zero, TileConfig};
    use super::{Acts, Block512, Panel, QMatRef, Quad, GROUP, QK};
    use rustorch_core::quant::QType;
    use std::arch::x86_64::*;

    /// `R` activation rows from `i` against a panel, `vpdpbusd` per block.
    ///
    /// # Safety
    /// AVX-512 F/BW and VNNI are available; rows `i..i + R` exist.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni,fma")]
    pub(super) unsafe fn vnni<const R: usize>(
        p: &Panel,
        a: &Acts<'_>,
        i: usize,
        q4_1: bool,
        tile: &mut [[f32; GROUP]; GROUP],
    ) {
        let mut acc = [_mm512_setzero_ps(); R];
        for b in 0..a.kb {
            // SAFETY (pointer reads): block b < kb of the panel's arrays,
            // and of rows i..i + R of the biased activations.
            unsafe {
                let cw: [__m512i; 8] =
                    std::array::from_fn(|k| _mm512_loadu_si512(p.codes[b].as_ptr().add(64 * k).cast()));
                let comp = _mm512_loadu_si512(p.comp[b].as_ptr().cast());
                let dw = _mm512_loadu_ps(p.d[b].as_ptr());
                let mw = _mm512_loadu_ps(p.m[b].as_ptr());
                for r in 0..R {
                    let at = (i + r) * a.kb + b;
                    let x = a.biased.as_ptr().add(at * QK).cast::<i32>();
                    let mut s = _mm512_setzero_si512();
                    for k in 0..8 {
                        s = _mm512_dpbusd_epi32(s, _mm512_set1_epi32(x.add(k).read_unaligned()), cw[k]);
                    }
                    s = _mm512_sub_epi32(s, comp);
                    let scale = _mm512_mul_ps(dw, _mm512_set1_ps(a.d[at]));
                    acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), scale, acc[r]);
                    if q4_1 {
                        acc[r] = _mm512_fmadd_ps(mw, _mm512_set1_ps(a.s[at]), acc[r]);
                    }
                }
            }
        }
        for r in 0..R {
            // SAFETY: a row of the tile holds 16 f32.
            unsafe { _mm512_storeu_ps(tile[r].as_mut_ptr(), acc[r]) };
        }
    }

    /// Activation row `i` against weight rows `n0..n0 + 16` read straight
    /// from their blocks: the weights as `vpdpbusd`'s unsigned operand (Q4
    /// codes as they are, Q8_0 values plus 128) against the signed
    /// activations, each zmm two rows' block (eight lanes each), reduced to
    /// one sum per row; then the offsets (`8 * sum(a)` for Q4_0, `128 *
    /// sum(a)` for Q8_0) come off and the f32 steps follow.
    ///
    /// # Safety
    /// AVX-512 F/BW/VL, VNNI, FMA and F16C are available; row `i` of the
    /// activations and rows `n0..n0 + 16` of `w` (a covered type) exist.
    /// How far ahead of the current block `direct16` prefetches each row.
    const PREFETCH_AHEAD: usize = 256;

    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,fma,f16c")]
    pub(super) unsafe fn direct16(w: &QMatRef<'_>, a: &Acts<'_>, i: usize, n0: usize, out: &mut [f32; GROUP]) {
        let qtype = w.qtype();
        let ts = qtype.type_size();
        let rb = w.row_bytes;
        let (q8, q4_1) = (qtype == QType::Q8_0, qtype == QType::Q4_1);
        let qoff = if q4_1 { 4 } else { 2 };
        let offset = match qtype {
            QType::Q8_0 => 128,
            QType::Q4_0 => 8,
            _ => 0,
        };
        let act_row = a.q.row(i).as_ptr();
        let ats = a.q.row(i).len() / a.kb;
        let rows = w.bytes().as_ptr().add(n0 * rb);
        let gather_idx = _mm512_mullo_epi32(
            _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
            _mm512_set1_epi32(rb as i32),
        );
        let nib_shift = _mm512_setr_epi64(
            0,
            0,
            0x0004_0004_0004_0004,
            0x0004_0004_0004_0004,
            0,
            0,
            0x0004_0004_0004_0004,
            0x0004_0004_0004_0004,
        );
        let dup = _mm512_setr_epi64(0, 1, 0, 1, 2, 3, 2, 3);
        let m4 = _mm512_set1_epi8(0x0F);
        let flip = _mm512_set1_epi8(-128);
        let order = _mm512_setr_epi32(0, 8, 1, 9, 2, 10, 3, 11, 16, 24, 17, 25, 18, 26, 19, 27);
        let pair = |x: __m512i, y: __m512i| _mm512_add_epi32(_mm512_unpacklo_epi32(x, y), _mm512_unpackhi_epi32(x, y));
        let quad = |x: __m512i, y: __m512i| _mm512_add_epi32(_mm512_unpacklo_epi64(x, y), _mm512_unpackhi_epi64(x, y));
        let halves = |z: __m512i| _mm512_add_epi32(z, _mm512_shuffle_i64x2::<0b10_11_00_01>(z, z));
        let mut acc = _mm512_setzero_ps();
        for b in 0..a.kb {
            // SAFETY (pointer reads): block b < kb of activation row i and of
            // the sixteen weight rows (the caller's contract).
            unsafe {
                let ab = act_row.add(b * ats);
                let av = _mm512_broadcast_i64x4(_mm256_loadu_si256(ab.add(a.qs_at).cast()));
                let blk = rows.add(b * ts);
                if b % 3 == 0 {
                    // Sixteen rows' streams at once: ask for each row's
                    // line a few blocks ahead (a block is at most 34 bytes).
                    for r in 0..GROUP {
                        _mm_prefetch::<_MM_HINT_T0>(blk.wrapping_add(r * rb + PREFETCH_AHEAD).cast());
                    }
                }
                let v: [__m512i; 8] = std::array::from_fn(|p| {
                    let (r0, r1) = (blk.add(2 * p * rb + qoff), blk.add((2 * p + 1) * rb + qoff));
                    let x = if q8 {
                        let x = _mm512_inserti64x4::<1>(
                            _mm512_castsi256_si512(_mm256_loadu_si256(r0.cast())),
                            _mm256_loadu_si256(r1.cast()),
                        );
                        _mm512_xor_si512(x, flip)
                    } else {
                        let y = _mm256_inserti128_si256::<1>(
                            _mm256_castsi128_si256(_mm_loadu_si128(r0.cast())),
                            _mm_loadu_si128(r1.cast()),
                        );
                        let x = _mm512_permutexvar_epi64(dup, _mm512_castsi256_si512(y));
                        _mm512_and_si512(_mm512_srlv_epi16(x, nib_shift), m4)
                    };
                    _mm512_dpbusd_epi32(_mm512_setzero_si512(), x, av)
                });
                let (x01, x23, x45, x67) = (pair(v[0], v[1]), pair(v[2], v[3]), pair(v[4], v[5]), pair(v[6], v[7]));
                let (t0, t1) = (halves(quad(x01, x23)), halves(quad(x45, x67)));
                let mut isum = _mm512_permutex2var_epi32(t0, order, t1);
                let at = i * a.kb + b;
                if offset != 0 {
                    isum = _mm512_sub_epi32(isum, _mm512_set1_epi32(offset * a.sum[at]));
                }
                // Dword at each row's block start: d (low half), Q4_1's m (high).
                let dm = _mm512_i32gather_epi32::<1>(gather_idx, blk.cast());
                let dw = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(dm));
                acc = _mm512_fmadd_ps(
                    _mm512_cvtepi32_ps(isum),
                    _mm512_mul_ps(dw, _mm512_set1_ps(a.d[at])),
                    acc,
                );
                if q4_1 {
                    let mw = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32::<16>(dm)));
                    acc = _mm512_fmadd_ps(mw, _mm512_set1_ps(a.s[at]), acc);
                }
            }
        }
        // SAFETY: `out` holds 16 f32.
        unsafe { _mm512_storeu_ps(out.as_mut_ptr(), acc) };
    }

    /// `Panel::fill` with gathers: dword `k` of sixteen rows' block is one
    /// `vpgatherdd` (Q8_0), or two for Q4 codes (one gather of packed
    /// nibbles gives dwords `k` and `k + 4`).
    ///
    /// # Safety
    /// AVX-512 F/BW and VNNI are available; rows `n0..n0 + 16` of `w` (a
    /// covered type) exist.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni,f16c")]
    pub(super) unsafe fn fill16(p: &mut Panel, w: &QMatRef<'_>, n0: usize) {
        let qtype = w.qtype();
        let ts = qtype.type_size();
        let rb = w.row_bytes;
        let kb = w.cols() / QK;
        p.codes.resize(kb, Block512::ZERO);
        p.comp.resize(kb, [0; GROUP]);
        p.d.resize(kb, [0.0; GROUP]);
        p.m.resize(kb, [0.0; GROUP]);
        let idx = _mm512_mullo_epi32(
            _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
            _mm512_set1_epi32(rb as i32),
        );
        let m4 = _mm512_set1_epi8(0x0F);
        let eight = _mm512_set1_epi8(8);
        let ones = _mm512_set1_epi8(1);
        let rows = w.bytes().as_ptr().add(n0 * rb);
        for b in 0..kb {
            // SAFETY: every gather reads 4 bytes within block b of one of
            // the sixteen rows (the caller's contract); the stores go to the
            // panel's arrays for block b (resized above).
            unsafe {
                let blk = rows.add(b * ts);
                let mut codes = [_mm512_setzero_si512(); 8];
                match qtype {
                    QType::Q8_0 => {
                        for k in 0..8 {
                            codes[k] = _mm512_i32gather_epi32::<1>(idx, blk.add(2 + 4 * k).cast());
                        }
                    }
                    _ => {
                        let qoff = if qtype == QType::Q4_1 { 4 } else { 2 };
                        for k in 0..4 {
                            let g = _mm512_i32gather_epi32::<1>(idx, blk.add(qoff + 4 * k).cast());
                            codes[k] = _mm512_and_si512(g, m4);
                            codes[k + 4] = _mm512_and_si512(_mm512_srli_epi16::<4>(g), m4);
                        }
                        if qtype == QType::Q4_0 {
                            for c in codes.iter_mut() {
                                *c = _mm512_sub_epi8(*c, eight);
                            }
                        }
                    }
                }
                let mut sum = _mm512_setzero_si512();
                for k in 0..8 {
                    _mm512_storeu_si512(p.codes[b].as_mut_ptr().add(64 * k).cast(), codes[k]);
                    sum = _mm512_dpbusd_epi32(sum, ones, codes[k]);
                }
                _mm512_storeu_si512(p.comp[b].as_mut_ptr().cast(), _mm512_slli_epi32::<7>(sum));
                let dm = _mm512_i32gather_epi32::<1>(idx, blk.cast());
                _mm512_storeu_ps(p.d[b].as_mut_ptr(), _mm512_cvtph_ps(_mm512_cvtepi32_epi16(dm)));
                let mins = if qtype == QType::Q4_1 {
                    _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32::<16>(dm)))
                } else {
                    _mm512_setzero_ps()
                };
                _mm512_storeu_ps(p.m[b].as_mut_ptr(), mins);
            }
        }
    }

    /// `Panel::fill_packed`: the codes unbiased (Q8_0) or split into
    /// nibbles (Q4), their sums formed and the scales widened.
    ///
    /// # Safety
    /// AVX-512 F/BW and VNNI are available; `w` is packed and group `g`
    /// exists.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni,f16c")]
    pub(super) unsafe fn fill_packed16(p: &mut Panel, w: &QMatRef<'_>, g: usize) {
        let qtype = w.qtype();
        let kb = w.cols() / QK;
        let pb = super::packed_block_bytes(qtype);
        p.codes.resize(kb, Block512::ZERO);
        p.comp.resize(kb, [0; GROUP]);
        p.d.resize(kb, [0.0; GROUP]);
        p.m.resize(kb, [0.0; GROUP]);
        let m4 = _mm512_set1_epi8(0x0F);
        let eight = _mm512_set1_epi8(8);
        let ones = _mm512_set1_epi8(1);
        let bias = _mm512_set1_epi8(i8::MIN);
        let base = w.bytes().as_ptr().add(g * kb * pb);
        for b in 0..kb {
            // SAFETY: packed block b of group g is `pb` bytes within the
            // weights (the caller's contract); the stores go to the panel's
            // arrays for block b (resized above).
            unsafe {
                let blk = base.add(b * pb);
                let dst = p.codes[b].as_mut_ptr();
                if qtype == QType::Q8_0 {
                    let mut sum = _mm512_setzero_si512();
                    for k in 0..8 {
                        let c = _mm512_xor_si512(_mm512_loadu_si512(blk.add(64 * k).cast()), bias);
                        _mm512_storeu_si512(dst.add(64 * k).cast(), c);
                        sum = _mm512_dpbusd_epi32(sum, ones, c);
                    }
                    _mm512_storeu_si512(p.comp[b].as_mut_ptr().cast(), _mm512_slli_epi32::<7>(sum));
                    _mm512_storeu_ps(
                        p.d[b].as_mut_ptr(),
                        _mm512_cvtph_ps(_mm256_loadu_si256(blk.add(512).cast())),
                    );
                    _mm512_storeu_ps(p.m[b].as_mut_ptr(), _mm512_setzero_ps());
                } else {
                    let mut sum = _mm512_setzero_si512();
                    for k in 0..4 {
                        let nib = _mm512_loadu_si512(blk.add(64 * k).cast());
                        let mut lo = _mm512_and_si512(nib, m4);
                        let mut hi = _mm512_and_si512(_mm512_srli_epi16::<4>(nib), m4);
                        if qtype == QType::Q4_0 {
                            lo = _mm512_sub_epi8(lo, eight);
                            hi = _mm512_sub_epi8(hi, eight);
                        }
                        _mm512_storeu_si512(dst.add(64 * k).cast(), lo);
                        _mm512_storeu_si512(dst.add(64 * (k + 4)).cast(), hi);
                        sum = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(sum, ones, lo), ones, hi);
                    }
                    _mm512_storeu_si512(p.comp[b].as_mut_ptr().cast(), _mm512_slli_epi32::<7>(sum));
                    _mm512_storeu_ps(
                        p.d[b].as_mut_ptr(),
                        _mm512_cvtph_ps(_mm256_loadu_si256(blk.add(256).cast())),
                    );
                    let mins = if qtype == QType::Q4_1 {
                        _mm512_cvtph_ps(_mm256_loadu_si256(blk.add(288).cast()))
                    } else {
                        _mm512_setzero_ps()
                    };
                    _mm512_storeu_ps(p.m[b].as_mut_ptr(), mins);
                }
            }
        }
    }

    /// How many packed blocks ahead `packed_rows` prefetches.
    const PREFETCH_BLOCKS: usize = 8;

    /// `R` activation rows from `i` against packed group `g`, straight from
    /// the packed blocks: the codes as the unsigned operand against the
    /// signed activations, less `128 * sum(a)` for Q8_0's biased codes and
    /// `8 * sum(a)` for Q4_0's nibbles.
    ///
    /// # Safety
    /// AVX-512 F/BW, VNNI, FMA and F16C are available; `w` is packed, group
    /// `g` and rows `i..i + R` exist.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni,fma,f16c")]
    pub(super) unsafe fn packed_rows<const R: usize>(
        w: &QMatRef<'_>,
        a: &Acts<'_>,
        i: usize,
        g: usize,
        tile: &mut [[f32; GROUP]; GROUP],
    ) {
        let qtype = w.qtype();
        let kb = a.kb;
        let pb = super::packed_block_bytes(qtype);
        let base = w.bytes().as_ptr().add(g * kb * pb);
        let m4 = _mm512_set1_epi8(0x0F);
        let ats = a.q.row(i).len() / kb;
        let mut acc = [_mm512_setzero_ps(); R];
        for b in 0..kb {
            // SAFETY (pointer reads): packed block b of group g, and block b
            // of rows i..i + R of the activations (the caller's contract).
            unsafe {
                let blk = base.add(b * pb);
                // Each line of the block PREFETCH_BLOCKS ahead: one stream
                // per task, but the hardware prefetcher alone kept it at
                // half the read bandwidth.
                let ahead = blk.wrapping_add(PREFETCH_BLOCKS * pb);
                for line in (0..pb).step_by(64) {
                    _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(line).cast());
                }
                if qtype == QType::Q8_0 {
                    let cw: [__m512i; 8] = std::array::from_fn(|k| _mm512_loadu_si512(blk.add(64 * k).cast()));
                    let dw = _mm512_cvtph_ps(_mm256_loadu_si256(blk.add(512).cast()));
                    for r in 0..R {
                        let at = (i + r) * kb + b;
                        let x = a.q.row(i + r).as_ptr().add(b * ats + a.qs_at).cast::<i32>();
                        // Two chains of four: a block's sums do not wait on
                        // eight dependent `vpdpbusd`s (integers: any order).
                        let (mut s0, mut s1) = (_mm512_setzero_si512(), _mm512_setzero_si512());
                        for k in (0..8).step_by(2) {
                            s0 = _mm512_dpbusd_epi32(s0, cw[k], _mm512_set1_epi32(x.add(k).read_unaligned()));
                            s1 = _mm512_dpbusd_epi32(s1, cw[k + 1], _mm512_set1_epi32(x.add(k + 1).read_unaligned()));
                        }
                        // The codes carry +128: less 128 times the
                        // activations' block sum.
                        let s = _mm512_sub_epi32(_mm512_add_epi32(s0, s1), _mm512_set1_epi32(128 * a.sum[at]));
                        let scale = _mm512_mul_ps(dw, _mm512_set1_ps(a.d[at]));
                        acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), scale, acc[r]);
                    }
                } else {
                    let mut cw = [_mm512_setzero_si512(); 8];
                    for k in 0..4 {
                        let nib = _mm512_loadu_si512(blk.add(64 * k).cast());
                        cw[k] = _mm512_and_si512(nib, m4);
                        cw[k + 4] = _mm512_and_si512(_mm512_srli_epi16::<4>(nib), m4);
                    }
                    let dw = _mm512_cvtph_ps(_mm256_loadu_si256(blk.add(256).cast()));
                    let q4_1 = qtype == QType::Q4_1;
                    let mw = if q4_1 {
                        _mm512_cvtph_ps(_mm256_loadu_si256(blk.add(288).cast()))
                    } else {
                        _mm512_setzero_ps()
                    };
                    for r in 0..R {
                        let at = (i + r) * kb + b;
                        let x = a.q.row(i + r).as_ptr().add(b * ats + a.qs_at).cast::<i32>();
                        let (mut s0, mut s1) = (_mm512_setzero_si512(), _mm512_setzero_si512());
                        for k in (0..8).step_by(2) {
                            s0 = _mm512_dpbusd_epi32(s0, cw[k], _mm512_set1_epi32(x.add(k).read_unaligned()));
                            s1 = _mm512_dpbusd_epi32(s1, cw[k + 1], _mm512_set1_epi32(x.add(k + 1).read_unaligned()));
                        }
                        let mut s = _mm512_add_epi32(s0, s1);
                        if !q4_1 {
                            s = _mm512_sub_epi32(s, _mm512_set1_epi32(8 * a.sum[at]));
                        }
                        let scale = _mm512_mul_ps(dw, _mm512_set1_ps(a.d[at]));
                        acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), scale, acc[r]);
                        if q4_1 {
                            acc[r] = _mm512_fmadd_ps(mw, _mm512_set1_ps(a.s[at]), acc[r]);
                        }
                    }
                }
            }
        }
        for r in 0..R {
            // SAFETY: a row of the tile holds 16 f32.
            unsafe { _mm512_storeu_ps(tile[r].as_mut_ptr(), acc[r]) };
        }
    }

    /// Tile shapes: tmm0 and tmm1 a panel's block (8 rows of 64 bytes),
    /// tmm2 and tmm3 sixteen activation rows of one block (32 bytes each),
    /// tmm4..tmm7 16 x 16 sums. `amx16` uses tmm0, tmm2, tmm4 and tmm5
    /// (alternate blocks, so that one block's tile product runs while the
    /// previous one's sums are scaled); `amx2x2` all eight.
    pub(super) const CONFIG: TileConfig = TileConfig::with_shapes([
        (8, 64),
        (8, 64),
        (16, 32),
        (16, 32),
        (16, 64),
        (16, 64),
        (16, 64),
        (16, 64),
    ]);

    /// Rows `i..i + 32` (two groups of sixteen) against panels `p0` and
    /// `p1` into `c` (`c.0[2 mi + ni]`: rows `i + 16 mi..` against panel
    /// `ni`), in the order of `amx16`: four tile products per block, as
    /// ggml's AMX kernel blocks them. With one product per block (`amx16`)
    /// each block waits for its product's latency, then for its sums'
    /// store, and the tile unit idles; four independent ones keep it busy
    /// and share each tile load between two products. Sixty-four
    /// accumulators do not fit the registers: they live in `c` (L1).
    ///
    /// # Safety
    /// AMX is usable (`amx::usable`), `CONFIG` is this thread's tile
    /// configuration, and AVX-512 VNNI is available; rows `i..i + 32` are
    /// tile rows of `a` (`i` a multiple of 16); both panels are filled for
    /// `a`'s blocks.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni,fma")]
    pub(super) unsafe fn amx2x2(p0: &Panel, p1: &Panel, a: &Acts<'_>, i: usize, q4_1: bool, c: &mut Quad) {
        #[repr(C, align(64))]
        struct Sums([[[i32; GROUP]; GROUP]; 4]);
        let mut sums = [Sums([[[0; GROUP]; GROUP]; 4]), Sums([[[0; GROUP]; GROUP]; 4])];
        let (g, kb) = (i / GROUP, a.kb);
        let rows0 = &a.tiles[g * kb..(g + 1) * kb];
        let rows1 = &a.tiles[(g + 1) * kb..(g + 2) * kb];
        let panels = [p0, p1];
        *c = Quad::default();
        // SAFETY: AMX is usable (the caller's contract); every tile load
        // reads 512 bytes (a packed block of sixteen activation rows, or a
        // panel's block b); every store writes one 1 KiB part of a `Sums`;
        // the vector loads and stores stay within `sums`, `c` and the
        // panels' and activations' per-block arrays.
        unsafe {
            // Block b's tile products are issued before block b - 1's sums
            // are read back (see `amx16`).
            for step in 0..=kb {
                if step < kb {
                    let b = step;
                    let s = &mut sums[b % 2].0;
                    tile_load!(2, rows0[b].as_ptr(), 32usize);
                    tile_load!(3, rows1[b].as_ptr(), 32usize);
                    tile_load!(0, p0.codes[b].as_ptr(), 64usize);
                    tile_load!(1, p1.codes[b].as_ptr(), 64usize);
                    tile_zero!(4);
                    tile_zero!(5);
                    tile_zero!(6);
                    tile_zero!(7);
                    tdpbssd!(4, 2, 0);
                    tdpbssd!(5, 2, 1);
                    tdpbssd!(6, 3, 0);
                    tdpbssd!(7, 3, 1);
                    tile_store!(4, s[0].as_mut_ptr(), 64usize);
                    tile_store!(5, s[1].as_mut_ptr(), 64usize);
                    tile_store!(6, s[2].as_mut_ptr(), 64usize);
                    tile_store!(7, s[3].as_mut_ptr(), 64usize);
                }
                if step == 0 {
                    continue;
                }
                let b = step - 1;
                let s = &sums[b % 2].0;
                for t in 0..4 {
                    let (mi, p) = (t / 2, panels[t % 2]);
                    let dw = _mm512_loadu_ps(p.d[b].as_ptr());
                    let mw = _mm512_loadu_ps(p.m[b].as_ptr());
                    for r in 0..GROUP {
                        let at = (i + GROUP * mi + r) * kb + b;
                        let v = _mm512_cvtepi32_ps(_mm512_load_si512(s[t][r].as_ptr().cast()));
                        let acc = c.0[t][r].as_mut_ptr();
                        let mut x = _mm512_load_ps(acc);
                        x = _mm512_fmadd_ps(v, _mm512_mul_ps(dw, _mm512_set1_ps(a.d[at])), x);
                        if q4_1 {
                            x = _mm512_fmadd_ps(mw, _mm512_set1_ps(a.s[at]), x);
                        }
                        _mm512_store_ps(acc, x);
                    }
                }
            }
        }
    }

    /// Sixteen activation rows from `i` against a panel, one tile product
    /// per block.
    ///
    /// # Safety
    /// AMX is usable (`amx::usable`), `CONFIG` is this thread's tile
    /// configuration, and AVX-512 VNNI is available; rows `i..i + 16`
    /// exist.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni,fma")]
    pub(super) unsafe fn amx16(p: &Panel, a: &Acts<'_>, i: usize, q4_1: bool, tile: &mut [[f32; GROUP]; GROUP]) {
        #[repr(C, align(64))]
        struct Sums([[i32; GROUP]; GROUP]);
        let mut sums = [Sums([[0; GROUP]; GROUP]), Sums([[0; GROUP]; GROUP])];
        let tiles = &a.tiles[i / GROUP * a.kb..(i / GROUP + 1) * a.kb];
        let mut acc = [_mm512_setzero_ps(); GROUP];
        // SAFETY: AMX is usable (the caller's contract); every tile load
        // reads 512 bytes: the packed block of rows i..i + 16, or the
        // panel's of block b; every store writes one `Sums`.
        unsafe {
            // Block b's tile product is issued before block b - 1's sums are
            // read back: vector loads of a tile store's lines right after it
            // stall until the store has drained to the cache.
            for step in 0..=a.kb {
                if step < a.kb {
                    let b = step;
                    tile_load!(2, tiles[b].as_ptr(), 32usize);
                    tile_load!(0, p.codes[b].as_ptr(), 64usize);
                    let s = &mut sums[b % 2];
                    if b % 2 == 0 {
                        tile_zero!(4);
                        tdpbssd!(4, 2, 0);
                        tile_store!(4, s.0.as_mut_ptr(), 64usize);
                    } else {
                        tile_zero!(5);
                        tdpbssd!(5, 2, 0);
                        tile_store!(5, s.0.as_mut_ptr(), 64usize);
                    }
                }
                if step == 0 {
                    continue;
                }
                let b = step - 1;
                let s = &sums[b % 2];
                let dw = _mm512_loadu_ps(p.d[b].as_ptr());
                let mw = _mm512_loadu_ps(p.m[b].as_ptr());
                for r in 0..GROUP {
                    let at = (i + r) * a.kb + b;
                    let v = _mm512_cvtepi32_ps(_mm512_load_si512(s.0[r].as_ptr().cast()));
                    acc[r] = _mm512_fmadd_ps(v, _mm512_mul_ps(dw, _mm512_set1_ps(a.d[at])), acc[r]);
                    if q4_1 {
                        acc[r] = _mm512_fmadd_ps(mw, _mm512_set1_ps(a.s[at]), acc[r]);
                    }
                }
            }
            for r in 0..GROUP {
                _mm512_storeu_ps(tile[r].as_mut_ptr(), acc[r]);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::qmatmul::vec_dot_type;
    use rustorch_core::quant::QTensor;
    use std::sync::Mutex;
    use std::time::Instant;

    /// Per-task timings of the tile path's loop, recorded while `Some`
    /// (`amx_task_timing`): (rayon thread, start, end).
    static TASKS: Mutex<Option<Vec<(usize, Instant, Instant)>>> = Mutex::new(None);

    /// Records one task's span when dropped, if recording is on.
    pub(super) struct TaskTiming(Instant);

    impl TaskTiming {
        pub(super) fn start() -> TaskTiming {
            TaskTiming(Instant::now())
        }
    }

    impl Drop for TaskTiming {
        fn drop(&mut self) {
            if let Some(v) = TASKS.lock().unwrap().as_mut() {
                v.push((
                    rayon::current_thread_index().unwrap_or(usize::MAX),
                    self.0,
                    Instant::now(),
                ));
            }
        }
    }

    /// Where a tile-path product's time goes on each thread (a probe for
    /// the AMX host: `rustorch_core_tests amx_task_timing --ignored
    /// --nocapture`, with RAYON_NUM_THREADS=1 and 2).
    #[test]
    #[ignore = "a timing probe, run by hand on an AMX host"]
    fn amx_task_timing() {
        // The tile kernel where the CPU has AMX, else the VNNI one.
        let isa = Isa::detected();
        let (rows, cols, m) = (1536, 576, 128);
        let wq = QTensor::quantize(QType::Q4_1, [rows, cols], &values(rows * cols, 3)).unwrap();
        let packed = pack(QType::Q4_1, rows, cols, wq.bytes().to_vec()).unwrap();
        let wp = QMatRef::amx_packed(QType::Q4_1, rows, cols, &packed).unwrap();
        let x = values(m * cols, 5);
        let act = QuantizedRows::quantize(QType::Q8_1, &x, cols).unwrap();
        let mut out = vec![0f32; m * rows];
        crate::team::run_team(|| {
            for _ in 0..50 {
                product(isa, &wp, &act, &mut out);
            }
            let t = Instant::now();
            for _ in 0..200 {
                product(isa, &wp, &act, &mut out);
            }
            eprintln!(
                "{isa:?}, threads {}: {:.1} us per product",
                rayon::current_num_threads(),
                t.elapsed().as_secs_f64() * 1e6 / 200.0
            );
            for _ in 0..3 {
                *TASKS.lock().unwrap() = Some(Vec::new());
                let t0 = Instant::now();
                let acts = Acts::new(&act, cols / QK, Kernel::at_most(isa).tile_rows(m));
                let t_acts = t0.elapsed();
                drop(acts);
                let t1 = Instant::now();
                product(isa, &wp, &act, &mut out);
                let t2 = Instant::now();
                let tasks = TASKS.lock().unwrap().take().unwrap();
                let us = |a: Instant, b: Instant| b.saturating_duration_since(a).as_secs_f64() * 1e6;
                let mut line = format!(
                    "product {:.1} us (acts alone {:.1} us):",
                    us(t1, t2),
                    t_acts.as_secs_f64() * 1e6
                );
                let mut threads: Vec<usize> = tasks.iter().map(|t| t.0).collect();
                threads.sort_unstable();
                threads.dedup();
                for th in threads {
                    let mine: Vec<_> = tasks.iter().filter(|t| t.0 == th).collect();
                    let busy: f64 = mine.iter().map(|t| us(t.1, t.2)).sum();
                    let first = mine.iter().map(|t| t.1).min().unwrap();
                    let last = mine.iter().map(|t| t.2).max().unwrap();
                    line += &format!(
                        " | thread {th}: {} tasks, busy {busy:.1}, from {:.1} to {:.1}",
                        mine.len(),
                        us(t1, first),
                        us(t1, last)
                    );
                }
                eprintln!("{line}");
            }
        });
    }

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

    /// The AMX build's order written out once more, from the GGUF blocks
    /// (independently of the panels): per block an exact integer sum, then
    /// `fma(f32(isum), d_w * d_a, acc)` (and `fma(m_w, s_a, acc)` for Q4_1).
    fn spelled_out(qtype: QType, w: &[u8], rows: usize, cols: usize, act: &QuantizedRows) -> Vec<f32> {
        let ts = qtype.type_size();
        let kb = cols / QK;
        let row_bytes = kb * ts;
        let half = |b: &[u8], at: usize| f16::from_bits(u16::from_le_bytes([b[at], b[at + 1]])).to_f32();
        let (ats, aqs) = if act.dot_type() == QType::Q8_1 {
            (36, 4)
        } else {
            (34, 2)
        };
        let mut out = vec![0f32; act.rows() * rows];
        for m in 0..act.rows() {
            for n in 0..rows {
                let mut acc = 0f32;
                for b in 0..kb {
                    let wb = &w[n * row_bytes + b * ts..][..ts];
                    let ab = &act.row(m)[b * ats..][..ats];
                    let wv: Vec<i32> = match qtype {
                        QType::Q8_0 => (0..QK).map(|j| wb[2 + j] as i8 as i32).collect(),
                        _ => {
                            let (qs, off) = if qtype == QType::Q4_0 {
                                (&wb[2..], 8)
                            } else {
                                (&wb[4..], 0)
                            };
                            (0..QK)
                                .map(|j| if j < 16 { qs[j] & 15 } else { qs[j - 16] >> 4 } as i32 - off)
                                .collect()
                        }
                    };
                    let isum: i32 = (0..QK).map(|j| wv[j] * ab[aqs + j] as i8 as i32).sum();
                    acc = (isum as f32).mul_add(half(wb, 0) * half(ab, 0), acc);
                    if qtype == QType::Q4_1 {
                        acc = half(wb, 2).mul_add(half(ab, 2), acc);
                    }
                }
                out[m * rows + n] = acc;
            }
        }
        out
    }

    /// Every kernel this CPU runs (and the portable one) gives the bits of
    /// the order spelled out, for one activation row (token generation),
    /// a few (the narrow kernels' tails) and many (the tile kernel).
    #[test]
    fn products_equal_the_order_spelled_out() {
        for qtype in [QType::Q4_0, QType::Q4_1, QType::Q8_0] {
            // Ten groups of sixteen weight rows: tasks of four panels and of
            // two (covered weights have a multiple of 32 rows, so tasks
            // hold whole pairs of panels for the tile kernel). Rows of 3,
            // 8 and 18 blocks (SmolLM2's 576 columns).
            for cols in [96, 256, 576] {
                let rows = 160;
                let wq = QTensor::quantize(qtype, [rows, cols], &values(rows * cols, 3)).unwrap();
                let w = QMatRef::new(qtype, rows, cols, wq.bytes()).unwrap();
                assert!(covers(&w), "{qtype}");
                for m in [1usize, 3, 16, 37, 80] {
                    let x = values(m * cols, 5 + m as u64);
                    let act = QuantizedRows::quantize(vec_dot_type(qtype).unwrap(), &x, cols).unwrap();
                    let want = spelled_out(qtype, wq.bytes(), rows, cols, &act);
                    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                    let packed = pack(qtype, rows, cols, wq.bytes().to_vec()).unwrap();
                    let wp = QMatRef::amx_packed(qtype, rows, cols, &packed).unwrap();
                    for isa in Isa::ALL.into_iter().filter(|i| i.is_available()) {
                        for (layout, w) in [("rows", &w), ("packed", &wp)] {
                            let mut got = vec![0f32; m * rows];
                            product(isa, w, &act, &mut got);
                            assert_eq!(bits(&got), bits(&want), "{qtype}, {m} x {cols}, {isa:?}, {layout}");
                        }
                    }
                    // The portable kernel, whatever this CPU has.
                    let acts = Acts::new(&act, cols / QK, 0);
                    let mut p = Panel::default();
                    p.fill(&w, 16);
                    let mut tile = [[0f32; GROUP]; GROUP];
                    let r = m.min(GROUP);
                    scalar(&p, &acts, 0, r, qtype == QType::Q4_1, &mut tile);
                    for i in 0..r {
                        for j in 0..GROUP {
                            assert_eq!(
                                tile[i][j].to_bits(),
                                want[i * rows + 16 + j].to_bits(),
                                "{qtype} scalar"
                            );
                        }
                    }
                }
            }
        }
    }

    /// Packing in place gives what packing each pair of groups on its own
    /// gives.
    #[test]
    fn packing_in_place_equals_packing_each_part() {
        for (qtype, rows) in [(QType::Q8_0, 16 * 130), (QType::Q4_1, 64)] {
            let cols = 4096;
            let q = QTensor::quantize(qtype, [rows, cols], &values(rows * cols, 9)).unwrap();
            let whole = pack(qtype, rows, cols, q.bytes().to_vec()).unwrap();
            let row_bytes = q.bytes().len() / rows;
            let mut parts = Vec::new();
            for pair in q.bytes().chunks(32 * row_bytes) {
                parts.extend(pack(qtype, 32, cols, pair.to_vec()).unwrap());
            }
            assert!(whole == parts, "{qtype}");
            assert_eq!(whole.len(), q.bytes().len(), "{qtype}: packing keeps the size");
        }
    }

    /// A tied embedding (marked `with_repack(false)`), a row count that is
    /// not a multiple of 32, K-quants with columns not a multiple of 256 and
    /// types without AMX kernels keep the plain order.
    #[test]
    fn only_the_amx_buffers_weights_are_covered() {
        let q = QTensor::quantize(QType::Q8_0, [48, 64], &values(48 * 64, 1)).unwrap();
        let w = QMatRef::new(QType::Q8_0, 48, 64, q.bytes()).unwrap();
        assert!(!covers(&w), "48 rows");
        let q = QTensor::quantize(QType::Q8_0, [64, 64], &values(64 * 64, 1)).unwrap();
        let w = QMatRef::new(QType::Q8_0, 64, 64, q.bytes()).unwrap();
        assert!(covers(&w));
        assert!(!covers(&w.with_repack(false)), "a tied embedding");
        for (qtype, rows, cols, covered) in [
            (QType::Q4K, 64, 256, true),
            (QType::Q6K, 64, 512, true),
            (QType::Q5K, 48, 256, false),
            (QType::IQ4XS, 64, 256, true),
            (QType::Q2K, 64, 256, false),
            (QType::Q5_0, 64, 256, false),
        ] {
            let q = QTensor::quantize(qtype, [rows, cols], &values(rows * cols, 1)).unwrap();
            let w = QMatRef::new(qtype, rows, cols, q.bytes()).unwrap();
            assert_eq!(covers(&w), covered, "{qtype} {rows} x {cols}");
            assert!(!covers(&w.with_repack(false)), "{qtype}: a tied embedding");
        }
        // K-quant columns: whole super-blocks (llama.cpp's QK_K alignment).
        assert!(super::super::amx_order_k::shape_covered(QType::Q4K, 32, 768));
        assert!(!super::super::amx_order_k::shape_covered(QType::Q4K, 32, 640));
    }
}
