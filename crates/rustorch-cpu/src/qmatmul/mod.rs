//! Quantized matrix products, as llama.cpp's CPU backend computes them.
//!
//! Weights stay in their GGML type. Each activation row is quantized once
//! to the weight type's *dot type* (`vec_dot_type`: Q8_0, Q8_1 or Q8_K for
//! the quantized types; F32, F16 or BF16 for the float ones), and every
//! output is an integer dot product of a weight row with an activation row,
//! scaled per block. Kernels exist per weight type and instruction-set
//! level (`Isa`: scalar, AVX2, AVX-512 VNNI), chosen at run time; work is
//! split over weight rows with rayon.
//!
//! Layout: weights are `rows x cols` (GGML `ne[0] = cols`, as a `Linear`
//! layer's `[out_features, in_features]`), activations `m x cols`, and the
//! result `m x rows`: `out[i][j] = sum_k x[i][k] * w[j][k]`.

mod activations;
#[cfg(target_arch = "x86_64")]
mod amx;
mod amx_order;
mod amx_order_k;
#[cfg(target_arch = "x86_64")]
#[doc(hidden)]
pub mod amx_probe;
mod float_path;
mod ggml_panel;
mod ggml_panel_amx;
#[cfg(test)]
mod ggml_paths_tests;
mod ggml_repack;
mod ggml_repack_b32;
#[cfg(target_arch = "x86_64")]
mod ggml_repack_b32_x86;
mod ggml_repack_gemv;
mod ggml_superblock;
#[cfg(target_arch = "x86_64")]
mod ggml_superblock_avx2;
mod ggml_tiled;
mod isa;
mod kernels;
#[cfg(test)]
mod tests;

pub use activations::QuantizedRows;
pub use amx_order::{
    ggml_order, pack as amx_pack, packed_block_bytes, packs as amx_packs, set_default_ggml_order, GgmlOrder,
    PACKED_ROWS,
};
pub use ggml_repack::llama_repacks;
pub use isa::Isa;

use rayon::prelude::*;
use rustorch_core::quant::{QTensor, QType, QuantError};
use std::cell::Cell;
use std::thread::LocalKey;

/// The type activations are quantized to for a product with weights of
/// type `w` (llama.cpp's `vec_dot_type`); `None` for types without a
/// matmul kernel. Q8_1 and Q8_K weights, which llama.cpp's CPU backend
/// cannot multiply, pair with Q8_0 and Q8_K.
pub fn vec_dot_type(w: QType) -> Option<QType> {
    use QType::*;
    Some(match w {
        F32 => F32,
        F16 => F16,
        BF16 => BF16,
        Q4_0 | Q5_0 | Q8_0 | Q8_1 | IQ4NL => Q8_0,
        Q4_1 | Q5_1 => Q8_1,
        Q2K | Q3K | Q4K | Q5K | Q6K | Q8K | IQ4XS => Q8K,
        _ => return None,
    })
}

/// Whether `qmatmul` has a kernel for weights of this type.
pub fn can_matmul(w: QType) -> bool {
    is_float(w) || (vec_dot_type(w).is_some() && kernels::find(w, Isa::Scalar).is_some())
}

/// F32, F16 and BF16, which `float_path` multiplies.
fn is_float(w: QType) -> bool {
    matches!(w, QType::F32 | QType::F16 | QType::BF16)
}

/// The instruction-set level `qmatmul` would use for weights of type `w`
/// on this CPU (below `Isa::detected()` where no wider kernel exists).
pub fn kernel_isa(w: QType) -> Option<Isa> {
    if is_float(w) {
        // `float_path` runs AVX-512 code where the CPU has it, else
        // portable code (same bits either way).
        #[cfg(target_arch = "x86_64")]
        if crate::ggml::has_avx512() {
            return Some(Isa::detected());
        }
        return Some(Isa::Scalar);
    }
    kernels::find(w, Isa::detected()).map(|(isa, _)| isa)
}

/// A borrowed `rows x cols` weight matrix in a GGML type (for instance a
/// tensor inside a memory-mapped GGUF file).
#[derive(Clone, Copy, Debug)]
pub struct QMatRef<'a> {
    qtype: QType,
    rows: usize,
    cols: usize,
    row_bytes: usize,
    bytes: &'a [u8],
    /// Whether products take llama.cpp's order for the weights it
    /// repacks (`ggml_repack`); `llama_repacks` decides by default.
    repacked: bool,
    /// Whether the bytes are in the interleaved layout (`interleave_rows`)
    /// rather than row after row.
    interleaved: bool,
    /// Whether llama.cpp's loader would put the weight in an extra buffer
    /// (repacked, AMX) rather than its plain one: every weight except those
    /// also looked up by row (`with_repack(false)`).
    extra_buffer: bool,
    /// Whether the bytes are in the AMX order's packed layout
    /// (`amx_order::pack`).
    amx_packed: bool,
}

/// Rows per group of the interleaved layout (`interleave_rows`).
pub const INTERLEAVE_ROWS: usize = 8;

/// Whether `interleave_rows` applies to a weight of this type and row
/// count, and pays on this CPU: Q4_K weights that llama.cpp repacks
/// (`llama_repacks`), where the AVX-512 VNNI matvec reads them
/// (`ggml_repack_gemv`). That matvec reads eight rows block by block; from
/// row-after-row bytes those are eight streams 1 KB or more apart, while
/// interleaved they are one sequential stream, and each row's sums stay in
/// lanes of their own (`interleave_rows`).
pub fn interleave_pays(qtype: QType, rows: usize) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        qtype == QType::Q4K && llama_repacks(qtype, rows) && x8_gemv_available()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (qtype, rows);
        false
    }
}

/// Whether this CPU runs the x8 matvec (`interleave_rows`): AVX-512 VNNI
/// and VBMI (its scale shuffles are byte permutes across two registers).
#[cfg(target_arch = "x86_64")]
pub(crate) fn x8_gemv_available() -> bool {
    Isa::Avx512Vnni.is_available() && is_x86_feature_detected!("avx512vbmi")
}

/// Rearranges `rows x cols` Q4_K weights (row after row) into the
/// interleaved ("x8") layout, in place. Rows go in groups of
/// `INTERLEAVE_ROWS`; a group holds its super-blocks in order, each 1152
/// bytes for the eight rows, arranged as llama.cpp's `block_q4_Kx8` is for
/// the same purpose (its byte order differs):
///
/// - bytes `0..128` (`X8_HEAD`): each row's first 16 block bytes (`d`,
///   `dmin`, the 12 packed scale bytes), row after row;
/// - then the 128 quant bytes of the eight rows in 4-byte quads: quant
///   byte `qb` of row `r` at `x8_quant_at(r, qb)`, so that each 64-byte
///   vector holds the same two quads of all eight rows.
///
/// A row's values and scales are unchanged (only moved), so products have
/// the same bits; the matvec then reads one sequential stream and keeps
/// each row's sums in lanes of their own (`ggml_repack_gemv`). Needs whole
/// groups.
pub fn interleave_rows(qtype: QType, rows: usize, cols: usize, bytes: &mut [u8]) -> Result<(), QuantError> {
    let row_bytes = qtype
        .bytes_for(cols)
        .ok_or(QuantError::NotWholeBlocks { qtype, elements: cols })?;
    if !rows.is_multiple_of(INTERLEAVE_ROWS) || Some(bytes.len()) != rows.checked_mul(row_bytes) {
        return Err(QuantError::Mismatch {
            op: "interleave_rows",
            detail: format!(
                "{} bytes are not {rows} rows of {cols} {qtype} values in groups of {INTERLEAVE_ROWS}",
                bytes.len()
            ),
        });
    }
    if qtype != QType::Q4K {
        return Err(QuantError::Unsupported {
            qtype,
            what: "the interleaved layout",
        });
    }
    let ts = qtype.type_size();
    let nb = row_bytes / ts;
    let mut group = vec![0u8; INTERLEAVE_ROWS * row_bytes];
    for chunk in bytes.chunks_exact_mut(INTERLEAVE_ROWS * row_bytes) {
        group.copy_from_slice(chunk);
        for r in 0..INTERLEAVE_ROWS {
            for b in 0..nb {
                let block = &group[r * row_bytes + b * ts..r * row_bytes + (b + 1) * ts];
                x8_put(
                    &mut chunk[b * INTERLEAVE_ROWS * ts..(b + 1) * INTERLEAVE_ROWS * ts],
                    r,
                    block,
                );
            }
        }
    }
    Ok(())
}

/// Bytes of the eight rows' heads (`d`, `dmin`, scales) at the start of an
/// x8 group block (`interleave_rows`).
pub(crate) const X8_HEAD: usize = INTERLEAVE_ROWS * 16;

/// Where quant byte `qb` (0..128) of row `r` lies in an x8 group block:
/// quant bytes `32 k .. 32 k + 32` of every row (chunk `k`: 64 values)
/// form four 64-byte vectors `m`, each quad `2 m` of rows 0..8 then quad
/// `2 m + 1` of rows 0..8.
pub(crate) const fn x8_quant_at(r: usize, qb: usize) -> usize {
    let (k, q, byte) = (qb / 32, (qb % 32) / 4, qb % 4);
    X8_HEAD + (4 * k + q / 2) * 64 + (q % 2) * 32 + 4 * r + byte
}

/// Row `r`'s Q4_K block (GGUF bytes) into its places in an x8 group block,
/// a 4-byte quad at a time (`x8_quant_at` keeps quads together).
fn x8_put(group_block: &mut [u8], r: usize, block: &[u8]) {
    group_block[16 * r..16 * r + 16].copy_from_slice(&block[..16]);
    for qb in (0..128).step_by(4) {
        let at = x8_quant_at(r, qb);
        group_block[at..at + 4].copy_from_slice(&block[16 + qb..20 + qb]);
    }
}

/// Row `r`'s Q4_K block (GGUF bytes) gathered from an x8 group block, a
/// 4-byte quad at a time (the batch kernels read blocks this way, once per
/// product).
fn x8_get(group_block: &[u8], r: usize) -> [u8; 144] {
    // Quad t of row r lies at `x8_quant_at(r, 4 t)` = X8_HEAD + 4 r + 32 t:
    // one slice with a fixed stride, which the loop reads without a bounds
    // check per quad.
    const _: () = assert!(x8_quant_at(3, 4 * 5) == X8_HEAD + 4 * 3 + 32 * 5);
    let mut block = [0u8; 144];
    block[..16].copy_from_slice(&group_block[16 * r..16 * r + 16]);
    let quads = &group_block[X8_HEAD + 4 * r..][..32 * 31 + 4];
    for (t, quad) in block[16..].chunks_exact_mut(4).enumerate() {
        quad.copy_from_slice(&quads[32 * t..32 * t + 4]);
    }
    block
}

impl<'a> QMatRef<'a> {
    /// Checks that `bytes` is exactly `rows` rows of `cols` values in `qtype`.
    pub fn new(qtype: QType, rows: usize, cols: usize, bytes: &'a [u8]) -> Result<Self, QuantError> {
        let row_bytes = qtype
            .bytes_for(cols)
            .ok_or(QuantError::NotWholeBlocks { qtype, elements: cols })?;
        let expected = row_bytes.checked_mul(rows).ok_or_else(|| QuantError::Mismatch {
            op: "qmatmul",
            detail: format!("{rows} x {cols} {qtype} weights overflow the address space"),
        })?;
        if bytes.len() != expected {
            return Err(QuantError::ByteLength {
                qtype,
                elements: rows * cols,
                expected,
                actual: bytes.len(),
            });
        }
        Ok(QMatRef {
            qtype,
            rows,
            cols,
            row_bytes,
            bytes,
            repacked: llama_repacks(qtype, rows),
            interleaved: false,
            extra_buffer: true,
            amx_packed: false,
        })
    }

    /// `bytes` in the interleaved layout (`interleave_rows`): Q4_K weights
    /// that llama.cpp repacks, multiplied in its repacked order.
    pub fn interleaved(qtype: QType, rows: usize, cols: usize, bytes: &'a [u8]) -> Result<Self, QuantError> {
        let m = Self::new(qtype, rows, cols, bytes)?;
        if qtype != QType::Q4K || !m.repacked || !rows.is_multiple_of(INTERLEAVE_ROWS) {
            return Err(QuantError::Mismatch {
                op: "qmatmul",
                detail: format!(
                    "{rows} x {cols} {qtype} weights have no interleaved layout (Q4_K, rows a multiple of 8)"
                ),
            });
        }
        Ok(QMatRef { interleaved: true, ..m })
    }

    /// `bytes` in the AMX order's packed layout (`amx_order::pack`) of
    /// `rows x cols` weights of `qtype`: multiplied in that order only.
    pub fn amx_packed(qtype: QType, rows: usize, cols: usize, bytes: &'a [u8]) -> Result<Self, QuantError> {
        let ok = matches!(qtype, QType::Q4_0 | QType::Q4_1 | QType::Q8_0)
            && rows.is_multiple_of(32)
            && cols.is_multiple_of(32)
            && bytes.len() == rows / amx_order::PACKED_ROWS * (cols / 32) * amx_order::packed_block_bytes(qtype);
        if !ok {
            return Err(QuantError::Mismatch {
                op: "qmatmul",
                detail: format!("{} bytes are not {rows} x {cols} packed {qtype} weights", bytes.len()),
            });
        }
        Ok(QMatRef {
            qtype,
            rows,
            cols,
            row_bytes: qtype.type_size() * cols / 32,
            bytes,
            repacked: false,
            interleaved: false,
            extra_buffer: true,
            amx_packed: true,
        })
    }

    /// Whether the bytes are in the interleaved layout.
    pub fn is_interleaved(&self) -> bool {
        self.interleaved
    }

    /// This matrix multiplied in llama.cpp's order for repacked weights
    /// (`on`, possible only where `llama_repacks` holds) or in its plain
    /// `vec_dot` order. llama.cpp repacks a weight unless its loader keeps
    /// it in the input buffer (`token_embd`, also the output matrix of
    /// models with tied embeddings): such weights need `with_repack(false)`.
    /// Interleaved weights always take the repacked order (only its paths
    /// read that layout).
    pub fn with_repack(mut self, on: bool) -> Self {
        self.repacked = (on && llama_repacks(self.qtype, self.rows)) || self.interleaved;
        self.extra_buffer = on || self.interleaved;
        self
    }

    /// Whether products use llama.cpp's repacked order (see `with_repack`).
    pub fn repacked(&self) -> bool {
        self.repacked
    }

    pub fn qtype(&self) -> QType {
        self.qtype
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    pub fn bytes(&self) -> &'a [u8] {
        self.bytes
    }

    /// Row `j`'s bytes, for row-after-row weights (the paths that read
    /// interleaved weights use `block_of`).
    fn row(&self, j: usize) -> &'a [u8] {
        debug_assert!(!self.interleaved, "an interleaved matrix has no contiguous rows");
        &self.bytes[j * self.row_bytes..(j + 1) * self.row_bytes]
    }

    /// Block `b` of row `j` as `W` (the matrix's block type), in either
    /// layout (gathered from its pieces in the interleaved one).
    fn block_of<W: rustorch_core::quant::blocks::Block>(&self, j: usize, b: usize) -> W {
        self.with_block(j, b, |x: &W| *x)
    }

    /// `f(&block)` for block `b` of row `j` as `W` (the matrix's block
    /// type), in either layout, without copying a block of row-after-row
    /// weights.
    fn with_block<W: rustorch_core::quant::blocks::Block, R>(&self, j: usize, b: usize, f: impl FnOnce(&W) -> R) -> R {
        use rustorch_core::quant::blocks::cast_blocks;
        let ts = self.qtype.type_size();
        if self.interleaved {
            let block = x8_get(self.x8_group_block(j / INTERLEAVE_ROWS, b), j % INTERLEAVE_ROWS);
            f(&cast_blocks::<W>(&block[..ts]).expect("one whole Q4_K block")[0])
        } else {
            let at = j * self.row_bytes + b * ts;
            f(&cast_blocks::<W>(&self.bytes[at..at + ts]).expect("one whole block")[0])
        }
    }

    /// Block `b` of the eight rows of group `g` of an interleaved matrix
    /// (`interleave_rows`): their heads, then their quant quads.
    fn x8_group_block(&self, g: usize, b: usize) -> &'a [u8] {
        let ts = self.qtype.type_size();
        let at = g * INTERLEAVE_ROWS * self.row_bytes + b * INTERLEAVE_ROWS * ts;
        &self.bytes[at..at + INTERLEAVE_ROWS * ts]
    }

    /// Row `j`'s blocks as `W` (the matrix's block type), in either layout.
    fn row_blocks<W: rustorch_core::quant::blocks::Block>(&self, j: usize) -> impl Iterator<Item = W> + '_ {
        let nb = self.row_bytes / self.qtype.type_size();
        (0..nb).map(move |b| self.block_of::<W>(j, b))
    }
}

impl<'a> QMatRef<'a> {
    /// A tensor as a matrix: the last dimension is `cols`, all the others
    /// are flattened into `rows`.
    pub fn of_tensor(t: &'a QTensor) -> Result<QMatRef<'a>, QuantError> {
        let dims = t.shape().dims();
        let cols = dims.last().copied().unwrap_or(1);
        let rows = dims[..dims.len().saturating_sub(1)].iter().product();
        QMatRef::new(t.qtype(), rows, cols, t.bytes())
    }
}

/// `x @ w^T` for `m = x.len() / w.cols()` activation rows, with the widest
/// kernels this CPU supports. Returns the `m x w.rows()` result.
pub fn qmatmul(w: &QMatRef<'_>, x: &[f32]) -> Result<Vec<f32>, QuantError> {
    qmatmul_isa(Isa::detected(), w, x)
}

/// `qmatmul` with kernels no wider than `isa` (which this CPU must
/// support); for tests and benchmarks that compare levels.
pub fn qmatmul_isa(isa: Isa, w: &QMatRef<'_>, x: &[f32]) -> Result<Vec<f32>, QuantError> {
    let dot = vec_dot_type(w.qtype).ok_or(QuantError::Unsupported {
        qtype: w.qtype,
        what: "matmul",
    })?;
    let act = QuantizedRows::quantize(dot, x, w.cols)?;
    let mut out = vec![0f32; act.rows() * w.rows];
    qmatmul_quantized_into(isa, w, &act, &mut out)?;
    Ok(out)
}

/// The product with activations quantized beforehand (one activation can
/// feed several weight matrices, as the Q, K and V projections do), into
/// `out` (`act.rows() x w.rows()`, row-major).
pub fn qmatmul_quantized_into(
    isa: Isa,
    w: &QMatRef<'_>,
    act: &QuantizedRows,
    out: &mut [f32],
) -> Result<(), QuantError> {
    let (m, n) = check_product(isa, w, act, out.len())?;
    if m == 0 || n == 0 {
        return Ok(());
    }
    if is_float(w.qtype) {
        // llama.cpp's two float orders, chosen by shape (see `float_path`);
        // the widest code this CPU runs, whatever `isa`: the orders, not
        // the instructions, decide the bits.
        float_path::product(w, act, out);
        return Ok(());
    }
    if amx_order::applies(w) {
        // The AMX build's order (`rustorch-cli`'s default on CPUs with
        // AMX), for one row or many.
        amx_order::product(isa, w, act, out);
        return Ok(());
    }
    if let Some(split) = Matvec::plan(isa, w, act) {
        // Matvec: weight rows split into chunks that each task streams once.
        let out_ptr = OutPtr(out.as_mut_ptr());
        crate::team::for_each(n.div_ceil(split.chunk), |c| {
            let rows = c * split.chunk..((c + 1) * split.chunk).min(n);
            // SAFETY: this task alone writes the outputs of these rows.
            unsafe { split.run(w, act, rows, &out_ptr) };
        });
        return Ok(());
    }
    product_whole(isa, w, act, out)
}

/// Several matvecs (one activation row each, such as a decode step's Q, K
/// and V projections) as one parallel loop over all their weight-row
/// chunks: one split and one join for all of them, and no thread waits at
/// the end of one product while the others finish it. Each output gets the
/// bits `qmatmul_quantized_into` gives it. Products that do not split by
/// weight rows (float weights, the repacked Q4_0 and IQ4_NL, batches) run
/// one after another.
pub fn qmatvecs_quantized_into(
    isa: Isa,
    items: &mut [(QMatRef<'_>, &QuantizedRows, &mut [f32])],
) -> Result<(), QuantError> {
    for (w, act, out) in items.iter() {
        check_product(isa, w, act, out.len())?;
    }
    if amx_order::matvecs(isa, items) {
        return Ok(());
    }
    let mut plans = Vec::with_capacity(items.len());
    for (w, act, out) in items.iter() {
        let (m, n) = check_product(isa, w, act, out.len())?;
        plans.push(
            (m == 1 && n > 0 && !is_float(w.qtype))
                .then(|| Matvec::plan(isa, w, act))
                .flatten(),
        );
    }
    if plans.iter().any(|p| p.is_none()) {
        for (w, act, out) in items.iter_mut() {
            qmatmul_quantized_into(isa, w, act, out)?;
        }
        return Ok(());
    }
    // (item, first row, rows) for every chunk of every product.
    let mut tasks: Vec<(usize, std::ops::Range<usize>)> = Vec::new();
    for (k, (plan, (w, _, _))) in plans.iter().zip(items.iter()).enumerate() {
        let chunk = plan.as_ref().map_or(1, |p| p.chunk);
        let n = w.rows;
        tasks.extend((0..n.div_ceil(chunk)).map(|c| (k, c * chunk..((c + 1) * chunk).min(n))));
    }
    let outs: Vec<OutPtr> = items.iter_mut().map(|(_, _, out)| OutPtr(out.as_mut_ptr())).collect();
    crate::team::for_each(tasks.len(), |t| {
        let (k, rows) = tasks[t].clone();
        let (w, act, _) = &items[k];
        let plan = plans[k].as_ref().expect("every product has a plan (checked above)");
        // SAFETY: this task alone writes these rows' outputs of product k.
        unsafe { plan.run(w, act, rows, &outs[k]) };
    });
    Ok(())
}

/// The checks of a product's operands; its `(m, n)`.
fn check_product(isa: Isa, w: &QMatRef<'_>, act: &QuantizedRows, out_len: usize) -> Result<(usize, usize), QuantError> {
    let mismatch = |detail: String| QuantError::Mismatch { op: "qmatmul", detail };
    if !isa.is_available() {
        return Err(mismatch(format!("this CPU cannot run {isa} kernels")));
    }
    let want = vec_dot_type(w.qtype);
    if want != Some(act.dot_type()) {
        return Err(mismatch(format!(
            "{} weights need {} activations, got {}",
            w.qtype,
            want.map_or("no".into(), |t| t.to_string()),
            act.dot_type()
        )));
    }
    if act.cols() != w.cols {
        return Err(mismatch(format!(
            "activations have {} columns, weights {}",
            act.cols(),
            w.cols
        )));
    }
    let (m, n) = (act.rows(), w.rows);
    if out_len != m * n {
        return Err(mismatch(format!("output holds {out_len} values, needs {m} x {n}")));
    }
    if !is_float(w.qtype) && kernels::find(w.qtype, isa).is_none() {
        return Err(QuantError::Unsupported {
            qtype: w.qtype,
            what: "matmul",
        });
    }
    Ok((m, n))
}

/// How a matvec splits by weight rows: tasks of `chunk` rows, each run by
/// `run` on one thread.
struct Matvec {
    chunk: usize,
    kind: MatvecKind,
}

enum MatvecKind {
    /// llama.cpp's repacked gemv order (`ggml_repack_gemv`).
    #[cfg(target_arch = "x86_64")]
    RepackGemv,
    /// The weight type's dot product, four weight rows at a time where a
    /// kernel for that exists.
    Rows {
        dot: kernels::DotFn,
        cols: Option<kernels::DotColsFn>,
    },
}

impl Matvec {
    /// The split of a checked product with one activation row, `None` for
    /// any other product and for the paths that run as a whole.
    fn plan(isa: Isa, w: &QMatRef<'_>, act: &QuantizedRows) -> Option<Matvec> {
        if act.rows() != 1 || is_float(w.qtype) || amx_order::applies(w) {
            return None;
        }
        let n = w.rows;
        if w.repacked {
            #[cfg(target_arch = "x86_64")]
            if ggml_repack::gemv_applies(isa, w, act) {
                return Some(Matvec {
                    chunk: ggml_repack_gemv::chunk_rows(n),
                    kind: MatvecKind::RepackGemv,
                });
            }
            return None;
        }
        let (level, dot) = kernels::find(w.qtype, isa)?;
        let cols = kernels::exact_cols(w.qtype, level);
        let threads = rayon::current_num_threads().max(1);
        let mut chunk = (n / (threads * 8)).clamp(1, 64);
        if cols.is_some() {
            // Chunks hold a multiple of four rows.
            chunk = chunk.next_multiple_of(4);
        }
        Some(Matvec {
            chunk,
            kind: MatvecKind::Rows { dot, cols },
        })
    }

    /// The outputs of weight rows `rows`.
    ///
    /// # Safety
    /// `out` points at `w.rows()` outputs, of which no other thread writes
    /// those of `rows` meanwhile; `self` is `plan(isa, w, act)` for an
    /// `isa` this CPU supports, and `rows` starts at a multiple of `chunk`.
    unsafe fn run(&self, w: &QMatRef<'_>, act: &QuantizedRows, rows: std::ops::Range<usize>, out: &OutPtr) {
        match self.kind {
            #[cfg(target_arch = "x86_64")]
            MatvecKind::RepackGemv => {
                // SAFETY: forwarded from the caller (`plan` checked AVX-512
                // VNNI; chunks start at multiples of eight); the one
                // activation row is whole Q8_K blocks (`check_product`).
                unsafe { ggml_repack_gemv::gemv_rows::<false>(w, &[act.row(0)], rows, out) };
            }
            MatvecKind::Rows { dot, cols } => {
                let a = act.row(0);
                let mut j = rows.start;
                if let Some(cols) = cols {
                    while j + 4 <= rows.end {
                        let ws = [w.row(j), w.row(j + 1), w.row(j + 2), w.row(j + 3)];
                        let mut r = [0f32; 4];
                        // SAFETY: `exact_cols` gave a kernel at a level this
                        // CPU supports, for four weight rows that each match
                        // the activation row (checked by `check_product`).
                        unsafe { cols(a, ws, &mut r) };
                        for (k, v) in r.into_iter().enumerate() {
                            // SAFETY: forwarded from the caller.
                            unsafe { out.write(j + k, v) };
                        }
                        j += 4;
                    }
                }
                for j in j..rows.end {
                    // SAFETY: as for `cols`, one row at a time; the output
                    // as above.
                    unsafe { out.write(j, dot(w.row(j), a)) };
                }
            }
        }
    }
}

/// `qmatmul_quantized_into` for the products that do not split as a
/// matvec: batches, float weights aside.
fn product_whole(isa: Isa, w: &QMatRef<'_>, act: &QuantizedRows, out: &mut [f32]) -> Result<(), QuantError> {
    let (m, n) = (act.rows(), w.rows);
    let (level, dot) = kernels::find(w.qtype, isa).ok_or(QuantError::Unsupported {
        qtype: w.qtype,
        what: "matmul",
    })?;
    // llama.cpp's batched path (tinyBLAS, m >= 2) sums IQ4_NL in another
    // order than its matvec; the four-row kernels follow the batched one.
    let dot = match kernels::batch(w.qtype, level) {
        Some(batch) if m > 1 => batch,
        _ => dot,
    };
    if w.repacked {
        ggml_repack::product(isa, w, act, out);
        return Ok(());
    }
    if m >= ggml_tiled::MIN_ROWS && ggml_tiled::applies(w.qtype) {
        // llama.cpp's tiled K-quant path (see `ggml_tiled`).
        ggml_tiled::product(isa, w, act, out);
        return Ok(());
    }
    let call = |j: usize, i: usize| {
        // SAFETY: `isa` is available on this CPU (checked above, and `find`
        // only returns kernels at or below it), and the rows match: both
        // cover `cols` values, in the weight type and its dot type.
        unsafe { dot(w.row(j), act.row(i)) }
    };

    let threads = rayon::current_num_threads().max(1);
    // Batched: tiles of `jb` weight rows x `ib` activation rows. A tile's
    // weight rows (about TILE_WEIGHT_BYTES) stay in L2 while its
    // activation rows go past them four at a time; four activation rows
    // (17 KB for 4096 Q8_0 columns) stay in L1 while the tile's weight
    // rows go past them. Tasks run weight blocks outermost, so rayon's
    // contiguous splits give each thread its own weight rows.
    const TILE_WEIGHT_BYTES: usize = 48 << 10;
    let ib = m.min(64);
    let tiles = kernels::exact_tiles(w.qtype, level).filter(|_| m >= 4);
    let (tile, tile8) = (tiles.map(|t| t.tile4), tiles.map(|t| t.tile8));
    let mut jb = (TILE_WEIGHT_BYTES / w.row_bytes.max(1))
        .clamp(4, 64)
        .min(n.div_ceil(threads * 4))
        .max(1);
    // Activation rows outside groups of four (all of them for types
    // without a four-row kernel, such as the K-quants) still stream four
    // weight rows at once where a kernel for that exists.
    let cols = kernels::exact_cols(w.qtype, level);
    if (tile.is_some() || cols.is_some()) && jb > 4 {
        // Whole groups of four weight rows for the four-by-four and the
        // four-weight-row kernels.
        jb -= jb % 4;
    }
    let rows = kernels::exact_rows(w.qtype, level);
    let out_ptr = OutPtr(out.as_mut_ptr());
    // The tiles read the activation rows packed in pairs (`ActPair`, 96
    // bytes per row and block), made once per chunk of rows for all of
    // the weight rows. A chunk's pairs take at most as much memory as the
    // weights (256 KiB at least): where the weights are small enough for
    // that to split the rows, they stay in cache between the chunks, and
    // a small model's memory does not grow by several times a matrix.
    let nb = w.cols / 32;
    let chunk_rows = match tiles {
        Some(_) => {
            let per_row = (nb * std::mem::size_of::<kernels::ActPair>() / 2).max(1);
            let bound = w.bytes.len().max(256 << 10);
            (bound / per_row / ib).max(1) * ib
        }
        None => m,
    };
    let mut pair_buf = ThreadBuffer::take(&PAIR_BUFFER);
    for c0 in (0..m).step_by(chunk_rows.max(1)) {
        let c1 = (c0 + chunk_rows).min(m);
        let pairs: &[kernels::ActPair] = match tiles {
            Some(t) => {
                let buf = pair_buf.slice(((c1 - c0) / 2) * nb, || kernels::ActPair::EMPTY);
                buf.par_chunks_mut(nb).enumerate().for_each(|(p, chunk)| {
                    // SAFETY: the tiles' level is available (`find` checked
                    // `isa`); the two rows have the same length.
                    unsafe { (t.pack)(act.row(c0 + 2 * p), act.row(c0 + 2 * p + 1), chunk) }
                });
                buf
            }
            None => &[],
        };
        // Rows `c0 + 2p` and `c0 + 2p + 1`.
        let pair = |p: usize| &pairs[p * nb..(p + 1) * nb];
        let (nj, ni) = (n.div_ceil(jb), (c1 - c0).div_ceil(ib));
        (0..nj * ni).into_par_iter().for_each(|t| {
            let (j0, i0) = ((t / ni) * jb, c0 + (t % ni) * ib);
            let (j1, i1) = ((j0 + jb).min(n), (i0 + ib).min(c1));
            let mut i = i0;
            if let (Some(rows), Some(tile8)) = (rows, tile8) {
                // Eight activation rows at a time where a four-by-eight kernel
                // exists: each weight block is decoded once for 32 products.
                // (Tasks start at multiples of `ib`, so `i` is even here and
                // rows i.. are whole pairs.)
                while i + 8 <= i1 {
                    let a: [&[u8]; 8] = std::array::from_fn(|k| act.row(i + k));
                    let p8: [&[kernels::ActPair]; 4] = std::array::from_fn(|k| pair((i - c0) / 2 + k));
                    let mut j = j0;
                    while j + 4 <= j1 {
                        let mut r = [[0f32; 8]; 4];
                        // SAFETY: as for `rows` below, for four weight rows
                        // and eight activation rows.
                        unsafe { tile8([w.row(j), w.row(j + 1), w.row(j + 2), w.row(j + 3)], a, p8, &mut r) };
                        for (dj, rj) in r.into_iter().enumerate() {
                            for (k, v) in rj.into_iter().enumerate() {
                                // SAFETY: (i + k, j + dj) lies in this tile; see `OutPtr`.
                                unsafe { out_ptr.write((i + k) * n + j + dj, v) };
                            }
                        }
                        j += 4;
                    }
                    for j in j..j1 {
                        for half in 0..2 {
                            let a4 = [a[4 * half], a[4 * half + 1], a[4 * half + 2], a[4 * half + 3]];
                            let mut r = [0f32; 4];
                            // SAFETY: as for `rows` below.
                            unsafe { rows(w.row(j), a4, &mut r) };
                            for (k, v) in r.into_iter().enumerate() {
                                // SAFETY: (i + 4 half + k, j) lies in this tile; see `OutPtr`.
                                unsafe { out_ptr.write((i + 4 * half + k) * n + j, v) };
                            }
                        }
                    }
                    i += 8;
                }
            }
            if let Some(rows) = rows {
                while i + 4 <= i1 {
                    let a = [act.row(i), act.row(i + 1), act.row(i + 2), act.row(i + 3)];
                    let mut j = j0;
                    while let Some(tile) = tile.filter(|_| j + 4 <= j1 && i % 2 == 0) {
                        let p4 = [pair((i - c0) / 2), pair((i - c0) / 2 + 1)];
                        let mut r = [[0f32; 4]; 4];
                        // SAFETY: as for `rows` below, for four weight rows.
                        unsafe { tile([w.row(j), w.row(j + 1), w.row(j + 2), w.row(j + 3)], a, p4, &mut r) };
                        for (dj, rj) in r.into_iter().enumerate() {
                            for (k, v) in rj.into_iter().enumerate() {
                                // SAFETY: (i + k, j + dj) lies in this tile; see `OutPtr`.
                                unsafe { out_ptr.write((i + k) * n + j + dj, v) };
                            }
                        }
                        j += 4;
                    }
                    for j in j..j1 {
                        let mut r = [0f32; 4];
                        // SAFETY: as for `call`; `exact_rows` gave a kernel at
                        // `level`, which this CPU supports, for four rows
                        // that each match the weight row.
                        unsafe { rows(w.row(j), a, &mut r) };
                        for (k, v) in r.into_iter().enumerate() {
                            // SAFETY: (i + k, j) lies in this tile (i + k < i1
                            // <= m, j < j1 <= n); see `OutPtr`.
                            unsafe { out_ptr.write((i + k) * n + j, v) };
                        }
                    }
                    i += 4;
                }
            }
            for i in i..i1 {
                let mut j = j0;
                while let Some(cols) = cols.filter(|_| j + 4 <= j1) {
                    let mut r = [0f32; 4];
                    // SAFETY: as for `call`; `exact_cols` gave a kernel at
                    // `level`, which this CPU supports, for four weight rows
                    // that each match the activation row.
                    unsafe { cols(act.row(i), [w.row(j), w.row(j + 1), w.row(j + 2), w.row(j + 3)], &mut r) };
                    for (dj, v) in r.into_iter().enumerate() {
                        // SAFETY: (i, j + dj) lies in this tile; see `OutPtr`.
                        unsafe { out_ptr.write(i * n + j + dj, v) };
                    }
                    j += 4;
                }
                for j in j..j1 {
                    // SAFETY: (i, j) lies in this tile; see `OutPtr`.
                    unsafe { out_ptr.write(i * n + j, call(j, i)) };
                }
            }
        });
    }
    Ok(())
}

thread_local! {
    /// The packed activation pairs of the last batched product on this
    /// thread (see `ThreadBuffer`).
    static PAIR_BUFFER: Cell<Vec<kernels::ActPair>> = const { Cell::new(Vec::new()) };
}

/// A buffer kept on this thread between products (in `cache`), so that the
/// next product reuses its pages: a prompt's products need megabytes, and
/// fresh pages fault and are zeroed. Taken out while in use (a product
/// nested in another's rayon tasks on the same thread makes its own), put
/// back when dropped.
pub(super) struct ThreadBuffer<T: 'static> {
    cache: &'static LocalKey<Cell<Vec<T>>>,
    buf: Vec<T>,
}

impl<T: 'static> ThreadBuffer<T> {
    pub(super) fn take(cache: &'static LocalKey<Cell<Vec<T>>>) -> Self {
        ThreadBuffer {
            cache,
            buf: cache.with(Cell::take),
        }
    }

    /// The first `len` values: new ones from `fill`, the others as the
    /// last user left them (users write every value they read).
    pub(super) fn slice(&mut self, len: usize, fill: impl FnMut() -> T) -> &mut [T] {
        if self.buf.len() < len {
            self.buf.resize_with(len, fill);
        }
        &mut self.buf[..len]
    }
}

impl<T: 'static> Drop for ThreadBuffer<T> {
    fn drop(&mut self) {
        let buf = std::mem::take(&mut self.buf);
        self.cache.with(|c| c.replace(buf));
    }
}

/// The output of a batched product, written by tasks that each own one
/// tile: the tiles (weight rows `j0..j1` x activation rows `i0..i1`)
/// partition `m x n`, so no two tasks write the same element and nobody
/// reads the output until every task has finished (rayon's `for_each`
/// returns after all of them). The pointer comes from a `&mut [f32]` of
/// `m * n` values that outlives the parallel loop.
struct OutPtr(*mut f32);

// SAFETY: see the type's comment: writes through the pointer go to
// disjoint elements from different threads, within the borrowed slice.
unsafe impl Sync for OutPtr {}
unsafe impl Send for OutPtr {}

impl OutPtr {
    /// # Safety
    /// `at < m * n`, and only the task owning that element's tile writes it.
    #[inline(always)]
    unsafe fn write(&self, at: usize, v: f32) {
        // SAFETY: forwarded from the caller.
        unsafe { self.0.add(at).write(v) }
    }

    /// `write` of `v[j]` at `at + j` for j in 0..16.
    ///
    /// # Safety
    /// As `write`, for each of the sixteen elements.
    #[inline(always)]
    unsafe fn write16(&self, at: usize, v: &[f32; 16]) {
        // SAFETY: forwarded from the caller; `v` is a separate array.
        unsafe { std::ptr::copy_nonoverlapping(v.as_ptr(), self.0.add(at), 16) }
    }
}
