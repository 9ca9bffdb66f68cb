//! Launchers for kernels/quant.cu: the ops on GGML-typed weights
//! (`QMatMul`, `QMatMuls`, `QMatMulGated`, `QEmbedding`).
//!
//! Weights are raw u8 blocks `[rows, row_bytes]`, decoded on the device by
//! one routine per type (bit-exact with `quant::dequantize`):
//!
//! - `QEmbedding` looks rows up by id and decodes them: bit-exact with the
//!   CPU. Ids outside the table set a device flag, reported as the CPU's
//!   `InvalidInput` (as the indexing ops do, see index.rs).
//! - `QMatMul` with at most `MMVQ_MAX_ROWS` activation rows (decode, small
//!   batches) of a weight type with an MMVQ kernel (`mmvq_layout`: every
//!   quantized type) quantizes the activations once, on the device, to the
//!   CPU's dot type (Q8_0/Q8_1 rules in 32-value blocks, Q8_K in 256-value
//!   blocks) bit for bit, then multiplies with integer dot products
//!   (`qmmvq_T_M*`, one warp per one or two output columns, up to eight
//!   activation rows per pass): the CPU's (llama.cpp's) arithmetic but for
//!   the order of the f32 scaling and summation.
//! - Other types (F32, F16, BF16) with at most `MATVEC_MAX_ROWS` rows take
//!   the f32 matvec (one warp per output column, the blocks decoded to
//!   f32); with more rows than these limits the weight is dequantized, a
//!   tile of rows at a time, and cuBLAS multiplies (`x @ W^T`): in f16 on
//!   the tensor cores with f32 accumulation (weight and activations
//!   rounded to f16, as llama.cpp's cuBLAS path does) for the quantized
//!   types and F16, in f32 for F32 and BF16. The CPU instead quantizes the
//!   activations to the type's dot type: results differ from the CPU's by
//!   that quantization's error (tests/quant_tol/mod.rs has the tolerances
//!   and where they come from).
//! - With `RUSTORCH_CUDA_MMQ=1`, products of more than 8 rows of the
//!   types mmq.rs has kernels for take them instead (llama.cpp CUDA's
//!   int8 MMQ arithmetic; off by default, mmq.rs says why).
//! - `QMatMuls` is one product per weight, each exactly the `QMatMul`
//!   of that weight (for one activation row, the weights of one MMVQ type
//!   share a launch, `qmmvq_multi_T`); `QMatMulGated` is the two products followed by the
//!   SwiGLU/GeGLU kernel of elementwise.cu written over the gate product,
//!   so its values are those of `QMatMuls` then `Op::SwiGlu`/`Op::GeGlu`
//!   here, bit for bit; for one activation row and gate and up of one
//!   MMVQ type, one kernel computes both sums and the activation
//!   (`qmmvq_gated_T`), with the same values.

use super::index::{first_bad, index_suffix};
use super::matmul::{gemm_f32_acc, GemmOperand};
use crate::backend::CudaBackend;
use crate::buffer::{CudaBuffer, RowActs};
use crate::launch::{grid, Strided};
use cudarc::cublas::sys::{cublasOperation_t, cudaDataType};
use cudarc::driver::LaunchConfig;
use rustorch_core::backend::TensorRef;
use rustorch_core::op::GateActivation;
use rustorch_core::quant::QType;
use rustorch_core::{BackendError, DType, Layout, Op, TensorMeta};

/// Activation rows up to which products take the matvec kernel
/// (`QMV_MAX_ROWS` in kernels/quant.cu): a decode step's one row, or a
/// few sequences'. Beyond it the weight would be decoded once per eight
/// rows; dequantizing it once for cuBLAS costs less.
const MATVEC_MAX_ROWS: usize = 8;
/// Warps (output columns) per block of the matvec (`QMV_WARPS`).
const MATVEC_WARPS: usize = 4;
/// Activation rows up to which products of the MMVQ types take the MMVQ
/// kernels, in passes of `MMVQ_PASS_ROWS`: each pass reads the quantized
/// weight once (a Q4_0 weight is 0.56 bytes a value), where the cuBLAS
/// path writes and reads it back as f32 (8 bytes a value) besides; up to
/// 64 rows the passes read less. The batched products of the conformance
/// suite (up to 33 rows) so take the CPU's arithmetic too. Where the
/// crossover really lies is for the GPU to tell (examples/cuda_bench.rs).
const MMVQ_MAX_ROWS: usize = 64;
/// Activation rows per MMVQ launch (`QMMVQ_MAX_ROWS`).
const MMVQ_PASS_ROWS: usize = 8;
/// Warps per block of the MMVQ kernels (`QMMVQ_WARPS`).
const MMVQ_WARPS: usize = 4;

/// How a weight type's MMVQ kernel wants its activations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum ActLayout {
    /// 32-value blocks as Q8_0 / Q8_1 (`QA_32`): the dot types Q8_0, Q8_1.
    Q32,
    /// 256-value blocks as Q8_K (`QA_K`).
    K,
}

/// The activation layout and the weight's load alignment (bytes) of the
/// MMVQ kernel for `q` (`QV<T>` in quant.cu); `None` for the types without
/// one (F32, F16, BF16, whose dot types are floats).
pub(super) fn mmvq_layout(q: QType) -> Option<(ActLayout, usize)> {
    use QType::*;
    let layout = match q {
        Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q8_0 | Q8_1 | IQ4NL => ActLayout::Q32,
        Q2K | Q3K | Q4K | Q5K | Q6K | Q8K | IQ4XS => ActLayout::K,
        _ => return None,
    };
    // Q4_K's one-row kernels read 16 bytes at a time (its 144-byte blocks
    // stay 16-aligned); otherwise 4-byte loads where every block starts
    // 4-aligned, else 2-byte ones.
    let align = if q == Q4K {
        16
    } else if q.type_size().is_multiple_of(4) {
        4
    } else {
        2
    };
    Some((layout, align))
}

/// Values of a one-row kernel's unit of work for `q` (`QRowUnit<T>` in
/// quant.cu): 64 for the types with a wide unit (`QWide<T>`: a quarter of
/// a Q4_K block, two Q6_K pieces that share their bytes, two Q8_0 or
/// Q4_0 blocks), else one 32-value piece.
fn mmvq_row_unit(q: QType) -> usize {
    if matches!(q, QType::Q4K | QType::Q6K | QType::Q8_0 | QType::Q4_0) {
        64
    } else {
        32
    }
}

/// The weight alignment the MMVQ kernels need for `q` with rows of `k`
/// values: `align` (`mmvq_layout`'s), or 4 for Q8_0 and Q4_0 rows of whole
/// 64-value units, which the one-row kernels read two blocks at a time in
/// 4-byte loads.
pub(super) fn mmvq_align(q: QType, align: usize, k: usize) -> usize {
    if matches!(q, QType::Q8_0 | QType::Q4_0) && k.is_multiple_of(64) {
        align.max(4)
    } else {
        align
    }
}

/// The kernel (its `M`, a power of two) for a pass of `rows` activation
/// rows, and the weight rows each of its warps takes (`QMMVQ_R(M)`).
fn mmvq_kernel_rows(rows: usize) -> (usize, usize) {
    let m = rows.next_power_of_two().clamp(1, MMVQ_PASS_ROWS);
    (m, if m >= 4 { 2 } else { 1 })
}

/// Warps that share one output column of a one-row MMVQ launch (`tw` in
/// quant.cu, 1, 2 or 4): enough that each lane takes one or two of the
/// row's units (`mmvq_row_unit` values each), so that a decode step's
/// product has its whole weight in flight at once instead of each warp
/// walking a long row (the H200 read a 5632-value row's product at 0.7
/// TB/s one warp a column). Several activation rows (`kernel_m > 1`) keep
/// one warp a column: their products already reuse each weight load. The
/// value depends only on the row length, the unit and the kernel, so that
/// every kernel summing one row (the plain, grouped and gated ones) gives
/// the same bits.
fn mmvq_team_warps(k: usize, unit: usize, kernel_m: usize) -> usize {
    let units = k / unit;
    match (kernel_m, units) {
        (1, 128..) => 4,
        (1, 48..) => 2,
        _ => 1,
    }
}

/// Bits of the one-row MMVQ kernels' `tw` argument that hold the team's
/// warps (QMMVQ_TW_BITS in kernels/quant.cu).
const QMMVQ_TW_BITS: u32 = 8;

/// The one-row MMVQ kernels' `tw` argument (kernels/quant.cu
/// `q_prefetch_wanted`): the team's warps in the low QMMVQ_TW_BITS, above
/// them how many of the launch's `blocks` (the first) prefetch their rows
/// into L2 before the wait: all of them where the weights are at most
/// `prefetch_max_bytes`, else those of the first `prefetch_part_bytes`.
fn mmvq_tw(b: &CudaBackend, tw: usize, weight_bytes: usize, blocks: usize) -> i32 {
    mmvq_tw_with(tw, weight_bytes, blocks, b.prefetch_max_bytes, b.prefetch_part_bytes)
}

/// `mmvq_tw` for the given limits (`max_bytes`, `part_bytes`).
fn mmvq_tw_with(tw: usize, weight_bytes: usize, blocks: usize, max_bytes: usize, part_bytes: usize) -> i32 {
    let prefetching = if weight_bytes <= max_bytes {
        blocks
    } else {
        // weight_bytes > max_bytes >= 0: no division by zero.
        let part = part_bytes.min(weight_bytes);
        (blocks as u128 * part as u128).div_ceil(weight_bytes as u128) as usize
    };
    let prefetching = prefetching.min((i32::MAX >> QMMVQ_TW_BITS) as usize) as i32;
    tw as i32 | (prefetching << QMMVQ_TW_BITS)
}

/// Output columns of one MMVQ block whose teams have `tw` warps.
fn mmvq_teams(tw: usize) -> usize {
    MMVQ_WARPS / tw
}

/// The float types with one-row kernels (`wrow_T`, `wrow_gated_T`,
/// `wrow_multi_T` in quant.cu), and their values per 16-byte chunk.
pub(super) fn wrow_chunk_values(q: QType) -> Option<usize> {
    match q {
        QType::F16 | QType::BF16 => Some(8),
        QType::F32 => Some(4),
        _ => None,
    }
}

/// Warps that share one output column of a one-row float product (`tw`):
/// enough that each lane loads at most `W_ROW_LOADS` of the row's 16-byte
/// chunks, all in flight at once.
fn wrow_team_warps(k: usize, chunk_values: usize) -> usize {
    const W_ROW_LOADS: usize = 8;
    match k / chunk_values {
        c if c <= 32 * W_ROW_LOADS => 1,
        c if c <= 64 * W_ROW_LOADS => 2,
        _ => 4,
    }
}

/// Whether one activation row and a float weight take the one-row kernels:
/// rows and activations 16-byte aligned, whole chunks per row.
fn wrow_fits(q: QType, w: &Weight, x: &Activations) -> bool {
    wrow_chunk_values(q).is_some_and(|v| {
        x.m == 1
            && w.ptr.is_multiple_of(16)
            && w.row_stride.rem_euclid(16) == 0
            && x.ptr.is_multiple_of(16)
            && x.k.is_multiple_of(v)
    })
}
/// Bytes of f32 weights dequantized at a time for cuBLAS: a whole layer's
/// weight in one go (4096 x 14336 is 235 MB), while an LM head of 128k
/// rows (2 GB in f32) goes in tiles rather than doubling its footprint.
const TILE_BYTES: usize = 256 << 20;

/// The kernels' name for a weight type with a decoder here (the suffix
/// is `QType::name()`); `None` for the types the CPU has no product for
/// either (IQ2/IQ3/IQ1, TQ, MXFP4 and the integer types).
pub(super) fn kernel_type(q: QType) -> Option<&'static str> {
    use QType::*;
    matches!(
        q,
        F32 | F16 | BF16 | Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q8_0 | Q8_1 | Q2K | Q3K | Q4K | Q5K | Q6K | Q8K | IQ4NL | IQ4XS
    )
    .then(|| q.name())
}

/// Values per chunk, the unit the kernels decode (`CH`).
fn chunk_len(q: QType) -> usize {
    if q.is_quantized() {
        32
    } else {
        1
    }
}

/// Whether the CUDA backend runs `op` (one of the quantized-weight ops).
pub(super) fn supports(op: &Op, inputs: &[TensorMeta]) -> bool {
    let first = inputs.first().map(|m| m.dtype);
    match op {
        Op::QMatMul { qtype, .. } => first == Some(DType::F32) && kernel_type(*qtype).is_some(),
        Op::QMatMuls { qtypes } => {
            first == Some(DType::F32) && !qtypes.is_empty() && qtypes.iter().all(|q| kernel_type(*q).is_some())
        }
        Op::QMatMulGated { qtypes, .. } => {
            first == Some(DType::F32) && qtypes.iter().all(|q| kernel_type(*q).is_some())
        }
        Op::QEmbedding { qtype } => {
            first == Some(DType::U8)
                && kernel_type(*qtype).is_some()
                && inputs.get(1).is_some_and(|m| index_suffix(m.dtype).is_some())
        }
        _ => false,
    }
}

pub(super) fn run(
    b: &CudaBackend,
    op: &Op,
    inputs: &[TensorRef<'_>],
    outputs: &[TensorMeta],
) -> Result<Vec<CudaBuffer>, BackendError> {
    let name = op.name();
    let arity = |n: usize| {
        if inputs.len() == n && !outputs.is_empty() {
            Ok(())
        } else {
            Err(BackendError::invalid(name.clone(), "wrong number of inputs"))
        }
    };
    match op {
        Op::QMatMul { qtype, .. } => {
            arity(2)?;
            let x = Activations::new(b, &name, &inputs[0])?;
            Ok(vec![product(b, &name, *qtype, &x, &inputs[1])?])
        }
        Op::QMatMuls { qtypes } => {
            arity(1 + qtypes.len())?;
            let x = Activations::new(b, &name, &inputs[0])?;
            if x.m == 1 {
                return products_of_one_row(b, &name, qtypes, &x, &inputs[1..]);
            }
            qtypes
                .iter()
                .zip(&inputs[1..])
                .map(|(&q, w)| product(b, &name, q, &x, w))
                .collect()
        }
        Op::QMatMulGated { qtypes, act } => {
            arity(3)?;
            let x = Activations::new(b, &name, &inputs[0])?;
            if let Some(y) = gated_mmvq(b, &name, *qtypes, *act, &x, &inputs[1], &inputs[2], &outputs[0])? {
                return Ok(vec![y]);
            }
            let gate = product(b, &name, qtypes[0], &x, &inputs[1])?;
            let up = product(b, &name, qtypes[1], &x, &inputs[2])?;
            if gate.len != up.len || gate.len != outputs[0].shape.numel() {
                // infer checked that both weights have one row count.
                return Err(BackendError::invalid(name, "the gate and up products differ in size"));
            }
            gated_in_place(b, *act, &gate, &up, &outputs[0])?;
            Ok(vec![gate])
        }
        Op::QEmbedding { qtype } => {
            arity(2)?;
            Ok(vec![embedding(b, &name, *qtype, &inputs[0], &inputs[1], &outputs[0])?])
        }
        _ => Err(BackendError::unsupported(b.device, name, "not a quantized-weight op")),
    }
}

/// The activations as a contiguous f32 matrix `[m, k]` on the device.
struct Activations<'a> {
    /// The op's input as it came (what the f16 copy is cast from).
    input: TensorRef<'a>,
    /// Address of element 0.
    ptr: u64,
    m: usize,
    k: usize,
    /// The contiguous copy when the input was a strided view (kept alive
    /// for the products queued after it).
    _copy: Option<CudaBuffer>,
    /// The activations quantized for the MMVQ kernels, per layout, made by
    /// the first product that needs them (the several products of
    /// `QMatMuls` and `QMatMulGated` share them).
    quantized: [std::cell::OnceCell<QuantActs>; 2],
    /// The activations quantized for the MMQ kernels, per layout
    /// (mmq.rs), made once.
    mmq: [std::cell::OnceCell<super::mmq::MmqActs>; 2],
    /// The activations in f16 for the tensor-core GEMM, made once.
    half: std::cell::OnceCell<CudaBuffer>,
    /// The input's row as the launch that wrote it quantized it (one
    /// whole-buffer row only).
    row_acts: Option<&'a RowActs>,
}

/// Activations quantized for the MMVQ kernels (kernels/quant.cu's
/// layouts): the addresses of the quants, scales, sums and (for `Q32`)
/// Q8_1's s, all in `_buf`, or in the input buffer's `RowActs` (which
/// outlives the op) when `_buf` is `None`.
struct QuantActs {
    q: u64,
    d: u64,
    sum: u64,
    s: u64,
    /// Scales and sums per activation row.
    d_per_row: usize,
    sum_per_row: usize,
    _buf: Option<CudaBuffer>,
}

/// Where the parts of `m` rows of `k` activations quantized to `layout`
/// sit in one buffer: quants, then scales and sums (and Q8_1's s) as
/// 4-byte values, each array starting 16-byte aligned (the quants are
/// m * k bytes, k a multiple of 32).
struct ActRegions {
    d_at: usize,
    sum_at: usize,
    s_at: usize,
    total: usize,
    d_per_row: usize,
    sum_per_row: usize,
}

impl ActRegions {
    fn new(m: usize, k: usize, layout: ActLayout) -> ActRegions {
        let (d_per_row, sum_per_row) = match layout {
            ActLayout::Q32 => (k / 32, k / 32),
            ActLayout::K => (k / 256, k / 16),
        };
        let pad = |v: usize| v.next_multiple_of(16);
        let d_at = pad(m * k);
        let sum_at = d_at + pad(4 * m * d_per_row);
        let s_at = sum_at + pad(4 * m * sum_per_row);
        let total = s_at + if layout == ActLayout::Q32 { 4 * m * (k / 32) } else { 0 };
        ActRegions {
            d_at,
            sum_at,
            s_at,
            total,
            d_per_row,
            sum_per_row,
        }
    }

    /// The `QuantActs` at `[q, d, sum, s]` (s only for `Q32`; the K
    /// kernels never read it), held by `buf` or, when `None`, by a
    /// `RowActs` that outlives the op.
    fn acts(&self, layout: ActLayout, [q, d, sum, s]: [u64; 4], buf: Option<CudaBuffer>) -> QuantActs {
        QuantActs {
            q,
            d,
            sum,
            s: if layout == ActLayout::Q32 { s } else { 0 },
            d_per_row: self.d_per_row,
            sum_per_row: self.sum_per_row,
            _buf: buf,
        }
    }

    /// The addresses of quants, scales, sums and s from `base`.
    fn at(&self, base: u64) -> [u64; 4] {
        [
            base,
            base + self.d_at as u64,
            base + self.sum_at as u64,
            base + self.s_at as u64,
        ]
    }
}

/// Values per block of an activation layout.
fn act_block(layout: ActLayout) -> usize {
    match layout {
        ActLayout::Q32 => 32,
        ActLayout::K => 256,
    }
}

impl<'a> Activations<'a> {
    /// The activations rounded to f16, contiguous `[m, k]` (computed once,
    /// by the cast op's kernel).
    fn half(&self, b: &CudaBackend) -> Result<u64, BackendError> {
        if let Some(h) = self.half.get() {
            return Ok(h.ptr());
        }
        let h = super::elementwise::run(
            b,
            &Op::Cast { to: DType::F16 },
            std::slice::from_ref(&self.input),
            &TensorMeta::new(self.input.layout.shape().clone(), DType::F16),
        )?;
        Ok(self.half.get_or_init(|| h).ptr())
    }

    /// The activations quantized for the MMQ kernels in `layout`
    /// (computed once).
    fn mmq_quantized(
        &self,
        b: &CudaBackend,
        layout: super::mmq::MmqLayout,
    ) -> Result<&super::mmq::MmqActs, BackendError> {
        let cell = &self.mmq[layout as usize];
        if let Some(q) = cell.get() {
            return Ok(q);
        }
        let q = super::mmq::quantize(b, self.ptr, self.m, self.k, layout)?;
        Ok(cell.get_or_init(|| q))
    }

    /// The activations quantized to `layout` (computed once).
    fn quantized(&self, b: &CudaBackend, layout: ActLayout) -> Result<&QuantActs, BackendError> {
        let cell = &self.quantized[layout as usize];
        if let Some(q) = cell.get() {
            return Ok(q);
        }
        if let Some(addrs) = self.row_acts.and_then(|r| r.layouts[layout as usize]) {
            let q = ActRegions::new(1, self.k, layout).acts(layout, addrs, None);
            return Ok(cell.get_or_init(|| q));
        }
        let q = quantize_activations(b, self, layout)?;
        Ok(cell.get_or_init(|| q))
    }

    fn new(b: &CudaBackend, name: &str, x: &TensorRef<'a>) -> Result<Activations<'a>, BackendError> {
        let dims = x.layout.dims();
        let Some((&k, lead)) = dims.split_last() else {
            return Err(BackendError::invalid(name, "activations need at least one dim"));
        };
        if x.dtype() != DType::F32 {
            return Err(BackendError::invalid(name, "activations must be f32"));
        }
        let m = lead.iter().product();
        if x.layout.is_contiguous() {
            let buf = b.own(name, x.buffer)?;
            // The quantized row rides on the buffer that holds exactly it.
            let row_acts = buf
                .row_acts
                .as_deref()
                .filter(|r| m == 1 && r.k == k && x.layout.offset() == 0 && buf.len == k);
            return Ok(Activations {
                input: *x,
                ptr: buf.ptr() + (x.layout.offset() * 4) as u64,
                m,
                k,
                _copy: None,
                quantized: Default::default(),
                mmq: Default::default(),
                half: Default::default(),
                row_acts,
            });
        }
        // Any other layout (transposed, stepped, broadcast rows): one
        // copy, the copy op's kernel.
        let copy = super::elementwise::run(
            b,
            &Op::Copy,
            std::slice::from_ref(x),
            &TensorMeta::new(x.layout.shape().clone(), DType::F32),
        )?;
        Ok(Activations {
            input: *x,
            ptr: copy.ptr(),
            m,
            k,
            _copy: Some(copy),
            quantized: Default::default(),
            mmq: Default::default(),
            half: Default::default(),
            row_acts: None,
        })
    }
}

/// A weight's rows on the device: row r at `ptr + r * row_stride` bytes.
pub(super) struct Weight {
    pub(super) ptr: u64,
    pub(super) row_stride: i64,
    pub(super) rows: usize,
    /// Values per row.
    pub(super) cols: usize,
    /// The contiguous copy of a weight whose bytes were not contiguous
    /// within rows.
    _copy: Option<CudaBuffer>,
}

impl Weight {
    /// The bytes a product reads of it.
    pub(super) fn bytes(&self) -> usize {
        self.rows * self.row_stride as usize
    }

    /// The weight's rows in place where its bytes are contiguous within
    /// rows and its address and row stride are multiples of `align`, else
    /// a contiguous (and aligned: a fresh allocation) copy.
    pub(super) fn new(
        b: &CudaBackend,
        name: &str,
        qtype: QType,
        w: &TensorRef<'_>,
        align: usize,
    ) -> Result<Weight, BackendError> {
        let (dims, strides) = (w.layout.dims(), w.layout.strides());
        if w.dtype() != DType::U8 || dims.len() != 2 || !dims[1].is_multiple_of(qtype.type_size()) {
            // infer rejects these.
            return Err(BackendError::invalid(
                name,
                format!("a {qtype} weight must be u8 blocks [rows, row_bytes]"),
            ));
        }
        let (rows, row_bytes) = (dims[0], dims[1]);
        let cols = row_bytes / qtype.type_size() * qtype.block_size();
        if row_bytes <= 1 || strides[1] == 1 {
            // Bytes contiguous within each row (the usual case: a QWeight's
            // data); rows may be anywhere (a narrowed table).
            let base = b.own(name, w.buffer)?.ptr();
            let (ptr, row_stride) = (
                base + w.layout.offset() as u64,
                if rows <= 1 { row_bytes as i64 } else { strides[0] as i64 },
            );
            let align = align.max(1);
            if ptr.is_multiple_of(align as u64) && row_stride.rem_euclid(align as i64) == 0 {
                return Ok(Weight {
                    ptr,
                    row_stride,
                    rows,
                    cols,
                    _copy: None,
                });
            }
        }
        let copy = super::elementwise::run(
            b,
            &Op::Copy,
            std::slice::from_ref(w),
            &TensorMeta::new(w.layout.shape().clone(), DType::U8),
        )?;
        // The product reads its weights before its wait.
        b.serialize_next_launch();
        Ok(Weight {
            ptr: copy.ptr(),
            row_stride: row_bytes as i64,
            rows,
            cols,
            _copy: Some(copy),
        })
    }
}

/// `x @ w^T`: f32 `[m, n]` for a `qtype` weight of n rows.
fn product(
    b: &CudaBackend,
    name: &str,
    qtype: QType,
    x: &Activations,
    w: &TensorRef<'_>,
) -> Result<CudaBuffer, BackendError> {
    let ty = kernel_type(qtype)
        .ok_or_else(|| BackendError::unsupported(b.device, name, format!("no CUDA kernel for {qtype} weights")))?;
    let n_rows = w.layout.dims().first().copied().unwrap_or(0);
    let mmq = super::mmq::plan(b, qtype, x.m, n_rows, x.k, x.ptr);
    let mmvq = mmvq_layout(qtype).filter(|_| mmq.is_none() && x.m <= MMVQ_MAX_ROWS);
    let align = match (mmq, mmvq) {
        (Some(_), _) => 2,
        (None, Some((_, align))) => mmvq_align(qtype, align, x.k),
        (None, None) => 1,
    };
    let w = Weight::new(b, name, qtype, w, align)?;
    if w.cols != x.k {
        return Err(BackendError::invalid(
            name,
            format!("activations of {} columns with a weight of {}", x.k, w.cols),
        ));
    }
    let (m, n, k) = (x.m, w.rows, x.k);
    let y = b.alloc(DType::F32, m * n)?;
    if m * n == 0 {
        return Ok(y);
    }
    if k == 0 {
        // Empty sums.
        y.zero(&b.stream)
            .map_err(|e| crate::error::driver(b.device, name, e, 0))?;
        return Ok(y);
    }
    if let Some((kernel, layout)) = mmq {
        super::mmq::product(b, kernel, &w, x.mmq_quantized(b, layout)?, m, k, &y)?;
    } else if let Some((layout, _)) = mmvq {
        mmvq_product(b, ty, qtype, layout, &w, x, &y)?;
    } else if m <= MATVEC_MAX_ROWS {
        matvec(b, ty, qtype, &w, x, &y)?;
    } else {
        dequant_gemm(b, name, qtype, ty, &w, x, &y)?;
    }
    Ok(y)
}

/// The decode path: `qmatvec_T`, one warp per output column.
fn matvec(
    b: &CudaBackend,
    ty: &str,
    qtype: QType,
    w: &Weight,
    x: &Activations,
    y: &CudaBuffer,
) -> Result<(), BackendError> {
    if wrow_fits(qtype, w, x) {
        return wrow_product(b, ty, qtype, w, x, y);
    }
    // Float weights with 16-byte aligned rows and activations take the
    // kernel with 16-byte loads (`wmatvec_T`); the rest decode per chunk.
    let wide = matches!(ty, "F16" | "BF16" | "F32")
        && w.ptr.is_multiple_of(16)
        && w.row_stride.rem_euclid(16) == 0
        && x.ptr.is_multiple_of(16)
        && x.k.is_multiple_of(8);
    let kernel = if wide {
        format!("wmatvec_{ty}")
    } else {
        format!("qmatvec_{ty}")
    };
    let f = b.function("quant", &kernel)?;
    let blocks = u32::try_from(w.rows.div_ceil(MATVEC_WARPS))
        .map_err(|_| BackendError::unsupported(b.device, kernel.clone(), "more weight rows than a grid holds"))?;
    let cfg = LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: ((32 * MATVEC_WARPS) as u32, 1, 1),
        shared_mem_bytes: 0,
    };
    let (n64, k64, m32, yp) = (w.rows as i64, x.k as i64, x.m as i32, y.ptr());
    let mut args = crate::launch::Launch::new(b, &f);
    args.arg(&w.ptr)
        .arg(&w.row_stride)
        .arg(&n64)
        .arg(&k64)
        .arg(&x.ptr)
        .arg(&m32)
        .arg(&yp);
    // SAFETY: qmatvec_T / wmatvec_T(w, row_stride, n, k, x, m, y): rows
    // 0..n of `row_stride` bytes hold k values each (the executor checked
    // the weight's layout against its buffer), x is contiguous [m, k] with
    // m <= QMV_MAX_ROWS, y holds m * n f32; for wmatvec_T the rows and x
    // start 16-byte aligned and k is a multiple of 8 (checked above).
    unsafe { args.launch(cfg) }.map_err(|e| b.launch_err(&kernel, e))?;
    Ok(())
}

/// One activation row through a float weight (`wrow_T`): a team of
/// `wrow_team_warps` warps a column.
fn wrow_product(
    b: &CudaBackend,
    ty: &str,
    q: QType,
    w: &Weight,
    x: &Activations,
    y: &CudaBuffer,
) -> Result<(), BackendError> {
    let tw = wrow_team_warps(x.k, wrow_chunk_values(q).unwrap_or(8));
    let kernel = format!("wrow_{ty}");
    let f = b.function("quant", &kernel)?;
    let cfg = mmvq_grid(b, &kernel, w.rows.div_ceil(mmvq_teams(tw)))?;
    let (n64, k64, tw32, yp) = (w.rows as i64, x.k as i64, tw as i32, y.ptr());
    let mut args = crate::launch::Launch::new(b, &f);
    args.arg(&w.ptr)
        .arg(&w.row_stride)
        .arg(&n64)
        .arg(&k64)
        .arg(&x.ptr)
        .arg(&tw32)
        .arg(&yp);
    // SAFETY: wrow_T(w, row_stride, n, k, x, tw, y): rows 0..n of
    // `row_stride` bytes hold k values each, rows and x 16-byte aligned and
    // k whole chunks (wrow_fits); x holds k f32, y n f32.
    unsafe { args.launch(cfg) }.map_err(|e| b.launch_err(&kernel, e))?;
    Ok(())
}

/// Columns a team of the one-row gated kernel takes (`cols`): one where
/// the launch then fills at most half a wave of the blocks the GPU holds
/// at once (SmolLM2's 1536 columns: about a third, which two a team left
/// mostly idle: tg128 1349 -> 1408 with one, H200), else two (TinyLlama's
/// 5632: more than a wave, where two a team measured faster: Q8_0 1027 ->
/// 1072). `RUSTORCH_CUDA_GATED_COLUMNS=1` or `2` forces it.
fn gated_columns(b: &CudaBackend, kernel: &str, f: &cudarc::driver::CudaFunction, n: usize, teams: usize) -> i32 {
    if let Some(cols) = b.gated_columns {
        return cols;
    }
    let per_sm = b.blocks_per_sm(kernel, f, (32 * MMVQ_WARPS) as u32);
    let wave = per_sm as usize * b.sm_count as usize;
    if wave > 0 && 2 * n.div_ceil(teams) <= wave {
        1
    } else {
        2
    }
}

/// A grid of `blocks` MMVQ-shaped blocks (`QMMVQ_WARPS` warps each).
fn mmvq_grid(b: &CudaBackend, kernel: &str, blocks: usize) -> Result<LaunchConfig, BackendError> {
    let blocks = u32::try_from(blocks)
        .map_err(|_| BackendError::unsupported(b.device, kernel, "more weight rows than a grid holds"))?;
    Ok(LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: ((32 * MMVQ_WARPS) as u32, 1, 1),
        shared_mem_bytes: 0,
    })
}

/// Where a one-row add + norm quantizes its output row for the products
/// after it (`add_rms_norm_q_lean_F32`, launched by `reduce::add_rms_norm`):
/// each layout `wanted` (all with `RUSTORCH_CUDA_NORM_ALL_LAYOUTS=1`) whose
/// blocks divide the row and the kernel's slices of `slice` values (one a
/// block), in one allocation. Returns the `RowActs` to set on the output
/// once the kernel is queued (the products that read
/// that buffer whole then take it, `Activations::quantized`, instead of
/// launching `qact_q8_*`) and the kernel's seven array arguments: Q8_1's
/// quants, scales, sums and s, then Q8_K's quants, scales and sums (zero
/// where the layout is absent).
pub(super) fn norm_row_acts(
    b: &CudaBackend,
    n: usize,
    slice: usize,
    wanted: [bool; 2],
) -> Result<(RowActs, [u64; 7]), BackendError> {
    let layouts = [ActLayout::Q32, ActLayout::K].map(|l| {
        let block = act_block(l);
        let want = wanted[l as usize] || b.norm_all_layouts;
        (want && n.is_multiple_of(block) && slice.is_multiple_of(block)).then(|| ActRegions::new(1, n, l))
    });
    let total: usize = layouts.iter().flatten().map(|r| r.total.next_multiple_of(16)).sum();
    let buf = b.alloc(DType::U8, total.max(1))?;
    let mut base = buf.ptr();
    let mut at = [None; 2];
    for (slot, r) in at.iter_mut().zip(&layouts) {
        if let Some(r) = r {
            *slot = Some(r.at(base));
            base += r.total.next_multiple_of(16) as u64;
        }
    }
    let [q32, d32, sum32, s32] = at[0].unwrap_or([0; 4]);
    let [qk, dk, bsumk, _] = at[1].unwrap_or([0; 4]);
    let acts = RowActs {
        k: n,
        layouts: at,
        _buf: buf,
    };
    Ok((acts, [q32, d32, sum32, s32, qk, dk, bsumk]))
}

/// The activation layouts (`[Q32, K]`, as `ActLayout` indexes them) that
/// the one-row products of `then` read: the layouts a norm feeding them
/// quantizes its row into. Any other op: both.
pub(super) fn layouts_read_by(then: &Op) -> [bool; 2] {
    let qtypes: &[QType] = match then {
        Op::QMatMuls { qtypes } => qtypes,
        Op::QMatMulGated { qtypes, .. } => qtypes,
        Op::QMatMul { qtype, .. } => std::slice::from_ref(qtype),
        _ => return [true, true],
    };
    let mut wanted = [false; 2];
    for (layout, _) in qtypes.iter().filter_map(|&q| mmvq_layout(q)) {
        wanted[layout as usize] = true;
    }
    wanted
}

/// `x` quantized for the MMVQ kernels (`qact_q8_32` / `qact_q8_k`, one
/// warp per block). `k` is a whole number of the layout's blocks: it is
/// the column count of a weight of a type with that layout.
fn quantize_activations(b: &CudaBackend, x: &Activations, layout: ActLayout) -> Result<QuantActs, BackendError> {
    let (m, k) = (x.m, x.k);
    let block = act_block(layout);
    if !k.is_multiple_of(block) {
        return Err(BackendError::invalid(
            "quantize_activations",
            format!("{k} columns are not whole {block}-value blocks"),
        ));
    }
    let blocks = m * k / block;
    let regions = ActRegions::new(m, k, layout);
    let buf = b.alloc(DType::U8, regions.total)?;
    let [q, d, sum, s] = regions.at(buf.ptr());
    let blocks64 = blocks as i64;
    const THREADS: usize = 256;
    let cfg = LaunchConfig {
        grid_dim: (
            u32::try_from(blocks.div_ceil(THREADS / 32))
                .map_err(|_| BackendError::unsupported(b.device, "qact", "more activation blocks than a grid holds"))?,
            1,
            1,
        ),
        block_dim: (THREADS as u32, 1, 1),
        shared_mem_bytes: 0,
    };
    let kernel = match layout {
        ActLayout::Q32 => "qact_q8_32",
        ActLayout::K => "qact_q8_k",
    };
    let f = b.function("quant", kernel)?;
    let mut args = crate::launch::Launch::new(b, &f);
    args.arg(&x.ptr).arg(&blocks64).arg(&q).arg(&d).arg(&sum);
    if layout == ActLayout::Q32 {
        args.arg(&s);
    }
    // SAFETY: qact_q8_32(x, blocks, q, d, sum, s) / qact_q8_k(x, blocks, q,
    // d, bsum): x holds blocks * block contiguous f32 (m rows of k); q holds
    // m * k bytes, d, sum and s their arrays of 4-byte values per block
    // (sum per 16 values for Q8_K), all inside `buf`.
    unsafe { args.launch(cfg) }.map_err(|e| b.launch_err(kernel, e))?;
    Ok(regions.acts(layout, [q, d, sum, s], Some(buf)))
}

/// The MMVQ path: the activations quantized once (shared with the other
/// products of the op), then passes of up to `MMVQ_PASS_ROWS` rows, each
/// with the smallest `qmmvq_T_M*` kernel that holds it.
fn mmvq_product(
    b: &CudaBackend,
    ty: &str,
    qtype: QType,
    layout: ActLayout,
    w: &Weight,
    x: &Activations,
    y: &CudaBuffer,
) -> Result<(), BackendError> {
    let qa = x.quantized(b, layout)?;
    let (n, k) = (w.rows, x.k);
    let (n64, k64) = (n as i64, k as i64);
    let mut r0 = 0;
    while r0 < x.m {
        let rows = (x.m - r0).min(MMVQ_PASS_ROWS);
        let (mk, per_warp) = mmvq_kernel_rows(rows);
        let tw = mmvq_team_warps(k, mmvq_row_unit(qtype), mk);
        let kernel = format!("qmmvq_{ty}_m{mk}");
        let f = b.function("quant", &kernel)?;
        let blocks = n.div_ceil(per_warp * mmvq_teams(tw));
        let cfg = mmvq_grid(b, &kernel, blocks)?;
        let tw32 = mmvq_tw(b, tw, w.bytes(), blocks);
        let aq = qa.q + (r0 * k) as u64;
        let ad = qa.d + (4 * r0 * qa.d_per_row) as u64;
        let asum = qa.sum + (4 * r0 * qa.sum_per_row) as u64;
        // Only the 32-value layout has s (the K kernels never read it).
        let as_ = if layout == ActLayout::Q32 {
            qa.s + (4 * r0 * (k / 32)) as u64
        } else {
            0
        };
        let yp = y.ptr() + (4 * r0 * n) as u64;
        let rows32 = rows as i32;
        let mut args = crate::launch::Launch::new(b, &f);
        args.arg(&w.ptr)
            .arg(&w.row_stride)
            .arg(&n64)
            .arg(&k64)
            .arg(&aq)
            .arg(&ad)
            .arg(&asum)
            .arg(&as_)
            .arg(&rows32)
            .arg(&tw32)
            .arg(&yp);
        // SAFETY: qmmvq_T_M(w, row_stride, n, k, aq, ad, asum, as, m, tw, y):
        // rows 0..n of `row_stride` bytes hold k values each, at addresses
        // and strides aligned for the type's loads (Weight::new); aq, ad,
        // asum, as point at activation row r0 of the quantized layout, of
        // which rows r0..r0 + rows exist (rows <= M); y + r0 * n holds
        // rows * n f32 of the output.
        unsafe { args.launch(cfg) }.map_err(|e| b.launch_err(&kernel, e))?;
        r0 += rows;
    }
    Ok(())
}

/// `QMulti` in kernels/quant.cu: up to three weights of one launch.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct QMulti {
    pub(super) w: [u64; 3],
    pub(super) stride: [i64; 3],
    pub(super) n: [i64; 3],
    pub(super) y: [u64; 3],
    pub(super) first_block: [i64; 3],
}

// SAFETY: plain data with the C layout the kernels declare.
unsafe impl cudarc::driver::DeviceRepr for QMulti {}

/// `QMatMuls` for one activation row (a decode step's query, key and value
/// projections): the weights of one MMVQ type, two or three at a time, in
/// one launch each (`multi_mmvq`), the others one by one; the outputs in
/// the weights' order, each as its own `QMatMul` computes it.
fn products_of_one_row(
    b: &CudaBackend,
    name: &str,
    qtypes: &[QType],
    x: &Activations,
    ws: &[TensorRef<'_>],
) -> Result<Vec<CudaBuffer>, BackendError> {
    // Two weights of one type and a third of another that shares their
    // activations (a Q4_K_M step's value projection in Q6_K next to Q4_K
    // query and key): one launch too, where a kernel takes that pair.
    if let [a, a2, c] = qtypes {
        if a == a2 && MIXED_MULTI.contains(&(*a, *c)) {
            let refs: Vec<&TensorRef<'_>> = ws.iter().collect();
            if let Some(ys) = multi_mmvq(b, name, qtypes, x, &refs)? {
                return Ok(ys);
            }
        }
    }
    let mut out: Vec<Option<CudaBuffer>> = (0..qtypes.len()).map(|_| None).collect();
    let mut done = vec![false; qtypes.len()];
    for i in 0..qtypes.len() {
        if done[i] || (mmvq_layout(qtypes[i]).is_none() && wrow_chunk_values(qtypes[i]).is_none()) {
            continue;
        }
        let group: Vec<usize> = (i..qtypes.len())
            .filter(|&j| !done[j] && qtypes[j] == qtypes[i])
            .take(3)
            .collect();
        if group.len() < 2 {
            continue;
        }
        let refs: Vec<&TensorRef<'_>> = group.iter().map(|&j| &ws[j]).collect();
        let types = vec![qtypes[i]; group.len()];
        if let Some(ys) = multi_mmvq(b, name, &types, x, &refs)? {
            for (&j, y) in group.iter().zip(ys) {
                out[j] = Some(y);
                done[j] = true;
            }
        }
    }
    out.into_iter()
        .enumerate()
        .map(|(j, y)| match y {
            Some(y) => Ok(y),
            None => product(b, name, qtypes[j], x, &ws[j]),
        })
        .collect()
}

/// The pairs of MMVQ types with a mixed multi kernel (`qmmvq_multi_A_B`):
/// weights of type A, then of type B (same activation layout and row unit).
const MIXED_MULTI: [(QType, QType); 2] = [(QType::Q4K, QType::Q6K), (QType::Q5K, QType::Q6K)];

/// Products of one activation row with two or three weights in one launch
/// (`qmmvq_multi_T`, or `qmmvq_multi_A_B` where the last weights are of a
/// second type, a pair of `MIXED_MULTI`), each column as `qmmvq_T_m1`
/// computes it. `None` where it does not apply.
fn multi_mmvq(
    b: &CudaBackend,
    name: &str,
    types: &[QType],
    x: &Activations,
    ws: &[&TensorRef<'_>],
) -> Result<Option<Vec<CudaBuffer>>, BackendError> {
    let q0 = types[0];
    // Where the second type starts (types.len() when there is one type).
    let first_b = types.iter().position(|&q| q != q0).unwrap_or(types.len());
    let mixed = first_b < types.len();
    if !mixed && wrow_chunk_values(q0).is_some() {
        return multi_wrow(b, name, q0, x, ws);
    }
    let q1 = types[types.len() - 1];
    if mixed && (types[first_b..].iter().any(|&q| q != q1) || !MIXED_MULTI.contains(&(q0, q1))) {
        return Ok(None);
    }
    let (Some((layout, _)), Some(ty)) = (mmvq_layout(q0), kernel_type(q0)) else {
        return Ok(None);
    };
    if x.m != 1 || x.k == 0 || !(2..=3).contains(&ws.len()) || types.len() != ws.len() {
        return Ok(None);
    }
    // One activation layout and one team size for every weight.
    if mixed && (mmvq_layout(q1).map(|l| l.0) != Some(layout) || mmvq_row_unit(q1) != mmvq_row_unit(q0)) {
        return Ok(None);
    }
    let weights = ws
        .iter()
        .zip(types)
        .map(|(w, &q)| {
            let align = mmvq_layout(q).map_or(1, |(_, a)| a);
            Weight::new(b, name, q, w, mmvq_align(q, align, x.k))
        })
        .collect::<Result<Vec<_>, _>>()?;
    if weights.iter().any(|w| w.cols != x.k || w.rows == 0) {
        return Ok(None);
    }
    let ys = weights
        .iter()
        .map(|w| b.alloc(DType::F32, w.rows))
        .collect::<Result<Vec<_>, _>>()?;
    let qa = x.quantized(b, layout)?;
    let tw = mmvq_team_warps(x.k, mmvq_row_unit(q0), 1);
    let mut p = QMulti::default();
    let mut blocks = 0usize;
    for (i, (w, y)) in weights.iter().zip(&ys).enumerate() {
        p.w[i] = w.ptr;
        p.stride[i] = w.row_stride;
        p.n[i] = w.rows as i64;
        p.y[i] = y.ptr();
        p.first_block[i] = blocks as i64;
        blocks += w.rows.div_ceil(mmvq_teams(tw));
    }
    let kernel = match kernel_type(q1).filter(|_| mixed) {
        Some(ty1) => format!("qmmvq_multi_{ty}_{ty1}"),
        None => format!("qmmvq_multi_{ty}"),
    };
    let f = b.function("quant", &kernel)?;
    let cfg = mmvq_grid(b, &kernel, blocks)?;
    let tw32 = mmvq_tw(b, tw, weights.iter().map(|w| w.bytes()).sum(), blocks);
    let count = weights.len() as i32;
    let first_b32 = first_b as i32;
    let as_ = if layout == ActLayout::Q32 { qa.s } else { 0 };
    let k64 = x.k as i64;
    let mut args = crate::launch::Launch::new(b, &f);
    args.arg(&p).arg(&count);
    if mixed {
        args.arg(&first_b32);
    }
    args.arg(&k64).arg(&qa.q).arg(&qa.d).arg(&qa.sum).arg(&as_).arg(&tw32);
    // SAFETY: qmmvq_multi_T(p, count, k, aq, ad, asum, as, tw), or
    // qmmvq_multi_A_B(p, count, first_b, k, ..) with weights first_b.. of
    // type B: for each of the `count` weights, n rows of k values of its
    // type at its row stride (aligned for the type's loads, Weight::new)
    // and an output of n f32; blocks first_block[i].. take weight i, as
    // many as its rows need; the quantized activations hold the one row
    // of k values in the layout both types read.
    unsafe { args.launch(cfg) }.map_err(|e| b.launch_err(&kernel, e))?;
    Ok(Some(ys))
}

/// A decode step's gated feed-forward in one launch (`qmmvq_gated_T`):
/// one activation row, gate and up of one MMVQ type. The values are those
/// of the two products and the activation's kernel (the same sums, the
/// same activation code). `None` where it does not apply.
#[allow(clippy::too_many_arguments)]
fn gated_mmvq(
    b: &CudaBackend,
    name: &str,
    qtypes: [QType; 2],
    act: GateActivation,
    x: &Activations,
    wg: &TensorRef<'_>,
    wu: &TensorRef<'_>,
    out: &TensorMeta,
) -> Result<Option<CudaBuffer>, BackendError> {
    if wrow_chunk_values(qtypes[0]).is_some() {
        return gated_wrow(b, name, qtypes, act, x, [wg, wu], out);
    }
    let (Some((layout, align)), Some(ty)) = (mmvq_layout(qtypes[0]), kernel_type(qtypes[0])) else {
        return Ok(None);
    };
    if x.m != 1 || qtypes[0] != qtypes[1] || x.k == 0 {
        return Ok(None);
    }
    let (g, u) = (
        Weight::new(b, name, qtypes[0], wg, mmvq_align(qtypes[0], align, x.k))?,
        Weight::new(b, name, qtypes[1], wu, mmvq_align(qtypes[1], align, x.k))?,
    );
    let n = g.rows;
    if u.rows != n || g.cols != x.k || u.cols != x.k || out.shape.numel() != n {
        return Ok(None);
    }
    let y = b.alloc(DType::F32, n)?;
    if n == 0 {
        return Ok(Some(y));
    }
    let qa = x.quantized(b, layout)?;
    let kernel = format!("qmmvq_gated_{ty}");
    let f = b.function("quant", &kernel)?;
    let tw = mmvq_team_warps(x.k, mmvq_row_unit(qtypes[0]), 1);
    let cols = gated_columns(b, &kernel, &f, n, mmvq_teams(tw));
    let blocks = n.div_ceil(cols as usize * mmvq_teams(tw));
    let cfg = mmvq_grid(b, &kernel, blocks)?;
    let tw32 = mmvq_tw(b, tw, g.bytes() + u.bytes(), blocks);
    let as_ = if layout == ActLayout::Q32 { qa.s } else { 0 };
    let (n64, k64, yp) = (n as i64, x.k as i64, y.ptr());
    let act32: i32 = match act {
        GateActivation::SwiGlu => 0,
        GateActivation::GeGlu => 1,
    };
    let mut args = crate::launch::Launch::new(b, &f);
    args.arg(&g.ptr)
        .arg(&g.row_stride)
        .arg(&u.ptr)
        .arg(&u.row_stride)
        .arg(&n64)
        .arg(&k64)
        .arg(&qa.q)
        .arg(&qa.d)
        .arg(&qa.sum)
        .arg(&as_)
        .arg(&act32)
        .arg(&cols)
        .arg(&tw32)
        .arg(&yp);
    // SAFETY: qmmvq_gated_T(wg, sg, wu, su, n, k, aq, ad, asum, as, act,
    // cols, tw, y): gate and up hold n rows of k values at their row strides, aligned
    // for the type's loads (Weight::new); the quantized activations hold
    // the one row of k values; y holds n f32.
    unsafe { args.launch(cfg) }.map_err(|e| b.launch_err(&kernel, e))?;
    Ok(Some(y))
}

/// `gated_mmvq` for float weights (`wrow_gated_T`): gate and up rows of
/// one column in one pass, act(gate) * up as the activation's kernel
/// computes it. `None` where it does not apply.
#[allow(clippy::too_many_arguments)]
fn gated_wrow(
    b: &CudaBackend,
    name: &str,
    qtypes: [QType; 2],
    act: GateActivation,
    x: &Activations,
    [wg, wu]: [&TensorRef<'_>; 2],
    out: &TensorMeta,
) -> Result<Option<CudaBuffer>, BackendError> {
    let (q, Some(ty)) = (qtypes[0], kernel_type(qtypes[0])) else {
        return Ok(None);
    };
    if x.m != 1 || qtypes[1] != q || x.k == 0 {
        return Ok(None);
    }
    let (g, u) = (Weight::new(b, name, q, wg, 16)?, Weight::new(b, name, q, wu, 16)?);
    let n = g.rows;
    if u.rows != n
        || g.cols != x.k
        || u.cols != x.k
        || out.shape.numel() != n
        || n == 0
        || !wrow_fits(q, &g, x)
        || !wrow_fits(q, &u, x)
    {
        return Ok(None);
    }
    let y = b.alloc(DType::F32, n)?;
    let kernel = format!("wrow_gated_{ty}");
    let f = b.function("quant", &kernel)?;
    let tw = wrow_team_warps(x.k, wrow_chunk_values(q).unwrap_or(8));
    let cfg = mmvq_grid(b, &kernel, n.div_ceil(mmvq_teams(tw)))?;
    let (n64, k64, tw32, yp) = (n as i64, x.k as i64, tw as i32, y.ptr());
    let act32: i32 = match act {
        GateActivation::SwiGlu => 0,
        GateActivation::GeGlu => 1,
    };
    let mut args = crate::launch::Launch::new(b, &f);
    args.arg(&g.ptr)
        .arg(&g.row_stride)
        .arg(&u.ptr)
        .arg(&u.row_stride)
        .arg(&n64)
        .arg(&k64)
        .arg(&x.ptr)
        .arg(&act32)
        .arg(&tw32)
        .arg(&yp);
    // SAFETY: wrow_gated_T(wg, sg, wu, su, n, k, x, act, tw, y): gate and
    // up hold n rows of k values at their strides, rows and x 16-byte
    // aligned and k whole chunks (wrow_fits); x holds k f32, y n f32.
    unsafe { args.launch(cfg) }.map_err(|e| b.launch_err(&kernel, e))?;
    Ok(Some(y))
}

/// `multi_mmvq` for float weights (`wrow_multi_T`). `None` where it does
/// not apply.
fn multi_wrow(
    b: &CudaBackend,
    name: &str,
    q0: QType,
    x: &Activations,
    ws: &[&TensorRef<'_>],
) -> Result<Option<Vec<CudaBuffer>>, BackendError> {
    let (Some(ty), Some(chunk)) = (kernel_type(q0), wrow_chunk_values(q0)) else {
        return Ok(None);
    };
    if x.m != 1 || x.k == 0 || !(2..=3).contains(&ws.len()) {
        return Ok(None);
    }
    let weights = ws
        .iter()
        .map(|w| Weight::new(b, name, q0, w, 16))
        .collect::<Result<Vec<_>, _>>()?;
    if weights
        .iter()
        .any(|w| w.cols != x.k || w.rows == 0 || !wrow_fits(q0, w, x))
    {
        return Ok(None);
    }
    let ys = weights
        .iter()
        .map(|w| b.alloc(DType::F32, w.rows))
        .collect::<Result<Vec<_>, _>>()?;
    let tw = wrow_team_warps(x.k, chunk);
    let mut p = QMulti::default();
    let mut blocks = 0usize;
    for (i, (w, y)) in weights.iter().zip(&ys).enumerate() {
        p.w[i] = w.ptr;
        p.stride[i] = w.row_stride;
        p.n[i] = w.rows as i64;
        p.y[i] = y.ptr();
        p.first_block[i] = blocks as i64;
        blocks += w.rows.div_ceil(mmvq_teams(tw));
    }
    let kernel = format!("wrow_multi_{ty}");
    let f = b.function("quant", &kernel)?;
    let cfg = mmvq_grid(b, &kernel, blocks)?;
    let (count, k64, tw32) = (weights.len() as i32, x.k as i64, tw as i32);
    let mut args = crate::launch::Launch::new(b, &f);
    args.arg(&p).arg(&count).arg(&k64).arg(&x.ptr).arg(&tw32);
    // SAFETY: wrow_multi_T(p, count, k, x, tw): for each of the `count`
    // weights, n rows of k values at its stride (rows and x 16-byte aligned,
    // k whole chunks: wrow_fits) and an output of n f32; blocks
    // first_block[i].. take weight i; x holds k f32.
    unsafe { args.launch(cfg) }.map_err(|e| b.launch_err(&kernel, e))?;
    Ok(Some(ys))
}

/// The batched path: tiles of weight rows dequantized to f32
/// (`qdequant_T`), each multiplied by cuBLAS into its columns of y (F16
/// weights multiplied where they are).
fn dequant_gemm(
    b: &CudaBackend,
    name: &str,
    qtype: QType,
    ty: &str,
    w: &Weight,
    x: &Activations,
    y: &CudaBuffer,
) -> Result<(), BackendError> {
    let (m, n, k) = (x.m, w.rows, x.k);
    let too_big = |v: usize| i32::try_from(v).is_err();
    if too_big(m) || too_big(n) || too_big(k) {
        return Err(BackendError::unsupported(b.device, name, "a dimension past 2^31"));
    }
    // Quantized and f16 weights go through f16 tensor cores (the weight
    // dequantized to f16, the activations rounded to f16 once, f32
    // accumulation); f32 and bf16 weights stay in f32, which their values
    // need (bf16's range is f32's).
    let half = !matches!(qtype, QType::F32 | QType::BF16);
    let (elem, tile_dtype, data_type) = if half {
        (2, DType::F16, cudaDataType::CUDA_R_16F)
    } else {
        (4, DType::F32, cudaDataType::CUDA_R_32F)
    };
    let xp = if half { x.half(b)? } else { x.ptr };
    // F16 weights are already what the tensor cores take: cuBLAS reads
    // them in place (a dequantized copy would hold the same values), the
    // rows `row_stride` bytes apart.
    if qtype == QType::F16 && w.row_stride > 0 && w.row_stride % 2 == 0 && w.row_stride / 2 >= k as i64 {
        let ld = i32::try_from(w.row_stride / 2)
            .map_err(|_| BackendError::unsupported(b.device, name, "a row stride past 2^31"))?;
        // SAFETY: w holds n rows of k f16 values, row_stride bytes apart
        // (lda = row_stride / 2 >= k); x's f16 copy m rows of k (ldb k); y
        // m rows of n f32 (ldc n).
        return unsafe {
            gemm_f32_acc(
                b,
                name,
                (cublasOperation_t::CUBLAS_OP_T, cublasOperation_t::CUBLAS_OP_N),
                (n as i32, m as i32, k as i32),
                GemmOperand {
                    ptr: w.ptr,
                    ld,
                    batch_stride: 0,
                    dtype: data_type,
                },
                GemmOperand {
                    ptr: xp,
                    ld: k as i32,
                    batch_stride: (m * k) as i64,
                    dtype: data_type,
                },
                GemmOperand {
                    ptr: y.ptr(),
                    ld: n as i32,
                    batch_stride: (m * n) as i64,
                    dtype: cudaDataType::CUDA_R_32F,
                },
                1,
            )
        };
    }
    // At least one row (n >= 1 and k >= 1 here), at most all of them.
    let tile_rows = (TILE_BYTES / (elem * k)).max(1).min(n);
    let tile = b.alloc(tile_dtype, tile_rows * k)?;
    let kernel = if half {
        format!("qdequant_h_{ty}")
    } else {
        format!("qdequant_{ty}")
    };
    let f = b.function("quant", &kernel)?;
    let cpr = (k / chunk_len(qtype)) as i64;
    let mut j0 = 0;
    while j0 < n {
        let tn = tile_rows.min(n - j0);
        let (wp, rows64, tp) = (w.ptr + (j0 as i64 * w.row_stride) as u64, tn as i64, tile.ptr());
        let mut args = crate::launch::Launch::new(b, &f);
        args.arg(&wp).arg(&w.row_stride).arg(&rows64).arg(&cpr).arg(&tp);
        // SAFETY: qdequant_T / qdequant_h_T(w, row_stride, rows, cpr, y):
        // rows j0..j0 + tn of the weight (inside it), each of cpr chunks,
        // into the tile of tile_rows * k >= tn * k f32 (f16).
        unsafe { args.launch(grid(tn * cpr as usize, b.sm_count)) }.map_err(|e| b.launch_err(&kernel, e))?;
        // Row-major Y[m, n] = X[m, k] W[n, k]^T is column-major
        // Y^T (n x m, ld n) = W (k x n col-major, transposed) X^T (k x m,
        // ld k): for the tile, rows j0.. of Y^T, i.e. y + j0 with ld n.
        // SAFETY: the tile holds tn rows of k values (lda k), x (or its f16
        // copy) m rows of k (ldb k), both of `data_type`; y's columns
        // j0..j0 + tn of m rows of n f32 (ldc n) lie inside y; the GEMM
        // runs after the dequantization and before the next tile's.
        unsafe {
            gemm_f32_acc(
                b,
                name,
                (cublasOperation_t::CUBLAS_OP_T, cublasOperation_t::CUBLAS_OP_N),
                (tn as i32, m as i32, k as i32),
                GemmOperand {
                    ptr: tp,
                    ld: k as i32,
                    batch_stride: (tn * k) as i64,
                    dtype: data_type,
                },
                GemmOperand {
                    ptr: xp,
                    ld: k as i32,
                    batch_stride: (m * k) as i64,
                    dtype: data_type,
                },
                GemmOperand {
                    ptr: y.ptr() + (j0 * 4) as u64,
                    ld: n as i32,
                    batch_stride: (m * n) as i64,
                    dtype: cudaDataType::CUDA_R_32F,
                },
                1,
            )
        }?;
        j0 += tn;
    }
    // The tile is freed in stream order (cudarc frees asynchronously on
    // the stream), after the last GEMM that reads it.
    drop(tile);
    Ok(())
}

/// `act(gate, up)` written over `gate`: the kernel of `Op::SwiGlu` /
/// `Op::GeGlu` (elementwise.cu), each thread reading and writing its own
/// element only, so in place is safe.
fn gated_in_place(
    b: &CudaBackend,
    act: GateActivation,
    gate: &CudaBuffer,
    up: &CudaBuffer,
    out: &TensorMeta,
) -> Result<(), BackendError> {
    let n = out.shape.numel();
    if n == 0 {
        return Ok(());
    }
    let kernel = match act {
        GateActivation::SwiGlu => "swiglu_F32",
        GateActivation::GeGlu => "geglu_F32",
    };
    let whole = Layout::contiguous(out.shape.clone());
    let l = Strided::broadcast(&whole, &out.shape)
        .ok_or_else(|| BackendError::unsupported(b.device, kernel, "more dims than the kernels take"))?;
    let f = b.function("elementwise", kernel)?;
    let (gp, up_p, n64) = (gate.ptr(), up.ptr(), n as i64);
    let mut args = crate::launch::Launch::new(b, &f);
    args.arg(&gp).arg(&l).arg(&up_p).arg(&l).arg(&gp).arg(&n64);
    // SAFETY: swiglu_F32 / geglu_F32(x, lx, g, lg, y, n): gate and up hold
    // n contiguous f32 each; y is x, which each thread reads at its own
    // index before writing it.
    unsafe { args.launch(grid(n, b.sm_count)) }.map_err(|e| b.launch_err(kernel, e))?;
    Ok(())
}

/// `QEmbedding`: rows `ids` of the table, dequantized: `[ids.., cols]`.
fn embedding(
    b: &CudaBackend,
    name: &str,
    qtype: QType,
    w: &TensorRef<'_>,
    ids: &TensorRef<'_>,
    out: &TensorMeta,
) -> Result<CudaBuffer, BackendError> {
    let ty = kernel_type(qtype)
        .ok_or_else(|| BackendError::unsupported(b.device, name, format!("no CUDA kernel for {qtype} weights")))?;
    let ity = index_suffix(ids.dtype())
        .ok_or_else(|| BackendError::unsupported(b.device, name, "ids must be i32, i64 or u8"))?;
    let table = Weight::new(b, name, qtype, w, 1)?;
    let n_ids = ids.layout.shape().numel();
    let total = out.shape.numel();
    if total != n_ids * table.cols {
        return Err(BackendError::invalid(
            name,
            "the output does not match the ids and the table",
        ));
    }
    let y = b.alloc(DType::F32, total)?;
    if total == 0 {
        // No element reads an id, but the CPU still checks every one (rows
        // of zero columns, say).
        if n_ids > 0 {
            if let Some(msg) = first_bad(b, ids, table.rows, 0)? {
                return Err(BackendError::invalid(name, msg));
            }
        }
        return Ok(y);
    }
    let il = ids.layout;
    let li = Strided::from_parts(il.dims(), il.strides(), il.offset())
        .ok_or_else(|| BackendError::unsupported(b.device, name, "more dims than the kernels take"))?;
    let bad = super::ErrorFlag::new(b)?;
    let kernel = format!("qembed_{ty}_{ity}");
    let f = b.function("quant", &kernel)?;
    let cpr = table.cols / chunk_len(qtype);
    let (ip, yp, bp) = (b.own(name, ids.buffer)?.ptr(), y.ptr(), bad.ptr());
    let (vocab64, n64, cpr64) = (table.rows as i64, n_ids as i64, cpr as i64);
    let mut args = crate::launch::Launch::new(b, &f);
    args.arg(&table.ptr)
        .arg(&table.row_stride)
        .arg(&vocab64)
        .arg(&ip)
        .arg(&li)
        .arg(&n64)
        .arg(&cpr64)
        .arg(&yp)
        .arg(&bp);
    // SAFETY: qembed_T_I(w, row_stride, vocab, ids, li, n_ids, cpr, y, bad):
    // rows 0..vocab of the table lie inside its buffer and an id outside
    // them is never read through; `li` addresses the ids' elements only
    // (layout checked by the executor); y holds n_ids * cpr chunks, bad
    // one i32.
    unsafe { args.launch(grid(n_ids * cpr, b.sm_count)) }.map_err(|e| b.launch_err(&kernel, e))?;
    // One 4-byte synchronous download, as the indexing ops do (index.rs).
    if bad.is_set(b)? {
        let msg = first_bad(b, ids, table.rows, 0)?
            .unwrap_or_else(|| format!("an index is out of range for dimension 0 of size {}", table.rows));
        return Err(BackendError::invalid(name, msg));
    }
    Ok(y)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_prefetching_blocks_cover_the_first_part_of_a_large_product() {
        const MIB: usize = 1 << 20;
        let split = |v: i32| ((v & ((1 << QMMVQ_TW_BITS) - 1)) as usize, (v >> QMMVQ_TW_BITS) as usize);
        // At most max_bytes: every block, the team's warps kept.
        assert_eq!(split(mmvq_tw_with(2, 6 * MIB, 704, 6 * MIB, 4 * MIB)), (2, 704));
        // Larger: the blocks of the first part_bytes, rounded up.
        assert_eq!(split(mmvq_tw_with(1, 24 * MIB, 704, 6 * MIB, 4 * MIB)), (1, 118));
        assert_eq!(split(mmvq_tw_with(4, 24 * MIB, 704, 6 * MIB, 0)), (4, 0));
        assert_eq!(split(mmvq_tw_with(1, 24 * MIB, 704, 6 * MIB, 100 * MIB)), (1, 704));
        // A grid too large for the bits left: capped, tw intact.
        let (tw, blocks) = split(mmvq_tw_with(4, MIB, usize::MAX, 6 * MIB, 0));
        assert_eq!((tw, blocks), (4, (i32::MAX >> QMMVQ_TW_BITS) as usize));
    }

    /// Every type the CPU multiplies (and so looks up) has a decoder here,
    /// and nothing else claims one.
    #[test]
    fn the_kernel_types_are_the_cpus() {
        for q in QType::ALL {
            let cpu = rustorch_cpu::qmatmul::can_matmul(q);
            assert_eq!(kernel_type(q).is_some(), cpu, "{q}");
            if cpu {
                assert!(rustorch_core::quant::can_dequantize(q), "{q}");
            }
        }
    }

    /// The MMVQ types are quant.cu's `Q_MMVQ_TYPES` with the layouts and
    /// alignments of its `QV<T>`, and the rows per warp are `QMMVQ_R`.
    #[test]
    fn the_mmvq_types_are_the_sources() {
        let src = crate::KERNEL_SOURCES
            .iter()
            .find(|(n, _)| *n == "quant")
            .map(|(_, s)| *s)
            .unwrap();
        for q in QType::ALL {
            let Some(ty) = kernel_type(q) else {
                assert!(mmvq_layout(q).is_none(), "{q}");
                continue;
            };
            match mmvq_layout(q) {
                Some((layout, align)) => {
                    assert!(src.contains(&format!("X({ty}, Q{ty})")), "{q}");
                    let act = match layout {
                        ActLayout::Q32 => "QA_32",
                        ActLayout::K => "QA_K",
                    };
                    let want = format!("struct QV<Q{ty}> {{ enum {{ ACT = {act}, AL = {align} }}; }};");
                    assert!(src.contains(&want), "{q}: {want}");
                }
                None => assert!(!src.contains(&format!("struct QV<Q{ty}>")), "{q}"),
            }
        }
        assert!(src.contains("#define QMMVQ_R(M) ((M) >= 4 ? 2 : 1)"));
        assert!(src.contains(&format!("#define QMMVQ_MAX_ROWS {MMVQ_PASS_ROWS}")));
        assert!(src.contains(&format!("#define QMMVQ_WARPS {MMVQ_WARPS}")));
        for rows in 1..=MMVQ_PASS_ROWS {
            let (m, r) = mmvq_kernel_rows(rows);
            assert!(m >= rows && [1, 2, 4, 8].contains(&m), "{rows}");
            assert_eq!(r, if m >= 4 { 2 } else { 1 });
        }
    }

    /// Each type the launchers name is in quant.cu's type list (its
    /// kernels are `qmatvec_T`, `qdequant_T`, `qembed_T_I`), with the
    /// chunk length the launchers assume.
    #[test]
    fn every_kernel_type_is_in_the_source() {
        let src = crate::KERNEL_SOURCES
            .iter()
            .find(|(n, _)| *n == "quant")
            .map(|(_, s)| *s)
            .unwrap();
        for q in QType::ALL {
            if let Some(ty) = kernel_type(q) {
                assert!(src.contains(&format!("X({ty}, Q{ty})")), "{q}: not in Q_TYPES");
                let at = src.find(&format!("struct Q{ty} ")).unwrap();
                let line = &src[at..at + src[at..].find('\n').unwrap()];
                assert!(line.contains(&format!("CH = {}", chunk_len(q))), "{q}: {line}");
            }
        }
    }
}
