//! Ops on GGML-typed weights: quantized matmul and embedding lookup.
//!
//! The weights arrive as raw u8 blocks `[rows, row_bytes]`; the kernels are
//! `quant::matmul` (llama.cpp's CPU arithmetic) and `quant::dequantize_into`
//! (bit-exact with the `gguf` package).

use super::copy::input_slice;
use super::{CpuInput, CpuResult, CpuStorage};
use crate::qmatmul::{
    qmatmul, qmatvecs_quantized_into, vec_dot_type, Isa, QMatRef, QuantizedRows, INTERLEAVE_ROWS, PACKED_ROWS,
};
use rayon::prelude::*;
use rustorch_core::error::BackendError;
use rustorch_core::op::{GateActivation, Op};
use rustorch_core::quant::{dequantize_into, QType};

pub fn execute(op: &Op, inputs: &[CpuInput<'_>]) -> CpuResult {
    match op {
        Op::QMatMul { qtype, cpu } => matmul(op, *qtype, cpu.plain_weight_order, inputs[0], inputs[1]),
        Op::QMatMuls { qtypes } => {
            let outs = products(op, qtypes, inputs[0], &inputs[1..])?;
            Ok(outs.into_iter().map(CpuStorage::F32).collect())
        }
        Op::QMatMulGated { qtypes, act } => gated(op, qtypes, *act, inputs[0], &inputs[1..]),
        Op::QEmbedding { qtype } => embedding(op, *qtype, inputs[0], inputs[1]),
        _ => Err(BackendError::invalid(op.name(), "not a quantized-weight op")),
    }
}

fn quant_err(op: &Op, e: rustorch_core::quant::QuantError) -> BackendError {
    BackendError::invalid(op.name(), e.to_string())
}

/// The weight as a matrix of `qtype` rows (shape validated by `infer`):
/// `[rows, row_bytes]` row after row, or `[rows / 8, blocks, 8 * block
/// bytes]` in the interleaved layout (`QWeight`'s matmul layout); the
/// flag says which.
type WeightBytes<'a> = (std::borrow::Cow<'a, [u8]>, usize, usize, Layout);

/// How a weight's bytes are laid out (told by the data tensor's rank).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Layout {
    /// `[rows, row_bytes]`: GGUF's blocks row after row.
    Rows,
    /// `[rows / 8, blocks, 8 * block bytes]` (`interleave_rows`).
    Interleaved,
    /// `[rows / 16, blocks, 1, packed block bytes]` (`amx_order::pack`).
    AmxPacked,
}

fn weight<'a>(op: &Op, qtype: QType, w: CpuInput<'a>) -> Result<WeightBytes<'a>, BackendError> {
    let (rows, cols, layout) = weight_shape(qtype, w.dims());
    Ok((input_slice::<u8>(op, w)?, rows, cols, layout))
}

/// A weight's rows, columns and layout, from its data tensor's dims.
fn weight_shape(qtype: QType, dims: &[usize]) -> (usize, usize, Layout) {
    match dims.len() {
        3 => (
            dims[0] * INTERLEAVE_ROWS,
            dims[1] * qtype.block_size(),
            Layout::Interleaved,
        ),
        4 => (dims[0] * PACKED_ROWS, dims[1] * qtype.block_size(), Layout::AmxPacked),
        _ => (dims[0], dims[1] / qtype.type_size() * qtype.block_size(), Layout::Rows),
    }
}

/// The weight bytes as a matrix in their layout.
fn matrix<'a>(
    op: &Op,
    qtype: QType,
    bytes: &'a [u8],
    rows: usize,
    cols: usize,
    layout: Layout,
) -> Result<QMatRef<'a>, BackendError> {
    let m = match layout {
        Layout::Interleaved => QMatRef::interleaved(qtype, rows, cols, bytes),
        Layout::AmxPacked => QMatRef::amx_packed(qtype, rows, cols, bytes),
        Layout::Rows => QMatRef::new(qtype, rows, cols, bytes),
    };
    m.map_err(|e| quant_err(op, e))
}

fn matmul(op: &Op, qtype: QType, plain_order: bool, x: CpuInput<'_>, w: CpuInput<'_>) -> CpuResult {
    let (bytes, rows, cols, layout) = weight(op, qtype, w)?;
    let mut m = matrix(op, qtype, &bytes, rows, cols, layout)?;
    if plain_order {
        // In llama.cpp's plain buffer: no repacked or AMX order.
        m = m.with_repack(false);
    }
    let xs = input_slice::<f32>(op, x)?;
    let out = qmatmul(&m, &xs).map_err(|e| quant_err(op, e))?;
    Ok(vec![CpuStorage::F32(out)])
}

/// `x @ w^T` for each weight (`QMatMuls`' values), quantizing `x` once per
/// dot type.
fn products(op: &Op, qtypes: &[QType], x: CpuInput<'_>, ws: &[CpuInput<'_>]) -> Result<Vec<Vec<f32>>, BackendError> {
    let xs = input_slice::<f32>(op, x)?;
    let mut quantized: Vec<QuantizedRows> = Vec::new();
    // Each weight's bytes and shape, and which quantized activations it takes.
    let mut weights = Vec::with_capacity(ws.len());
    for (&qtype, &w) in qtypes.iter().zip(ws) {
        let (bytes, rows, cols, layout) = weight(op, qtype, w)?;
        let dot =
            vec_dot_type(qtype).ok_or_else(|| BackendError::invalid(op.name(), format!("no matmul for {qtype}")))?;
        let at = match quantized.iter().position(|q| q.dot_type() == dot) {
            Some(i) => i,
            None => {
                quantized.push(QuantizedRows::quantize(dot, &xs, cols).map_err(|e| quant_err(op, e))?);
                quantized.len() - 1
            }
        };
        weights.push((qtype, bytes, rows, cols, layout, at));
    }
    let mut outs: Vec<Vec<f32>> = weights
        .iter()
        .map(|&(_, _, rows, _, _, at)| vec![0f32; quantized[at].rows() * rows])
        .collect();
    let mut items = Vec::with_capacity(weights.len());
    for ((qtype, bytes, rows, cols, layout, at), out) in weights.iter().zip(outs.iter_mut()) {
        let m = matrix(op, *qtype, bytes, *rows, *cols, *layout)?;
        items.push((m, &quantized[*at], &mut out[..]));
    }
    // One parallel loop for all the products where they are matvecs.
    qmatvecs_quantized_into(Isa::detected(), &mut items).map_err(|e| quant_err(op, e))?;
    drop(items);
    Ok(outs)
}

/// `act(x @ gate^T, x @ up^T)`, written over the gate product: the values
/// of `products` then `Op::SwiGlu` / `Op::GeGlu` (`ggml::attention::gated_rows_in_place`).
fn gated(op: &Op, qtypes: &[QType; 2], act: GateActivation, x: CpuInput<'_>, ws: &[CpuInput<'_>]) -> CpuResult {
    let mut outs = products(op, qtypes, x, ws)?;
    let up = outs.pop().expect("two products");
    let mut gate = outs.pop().expect("two products");
    // Output columns: the weights' row count (`infer` checked both agree).
    let (n, _, _) = weight_shape(qtypes[0], ws[0].dims());
    super::ggml::attention::gated_rows_in_place(act, &mut gate, &up, n);
    drop(up);
    Ok(vec![CpuStorage::F32(gate)])
}

/// Lookups of at most this many rows run on the calling thread.
const SERIAL_LOOKUP_ROWS: usize = 4;

fn embedding(op: &Op, qtype: QType, w: CpuInput<'_>, ids: CpuInput<'_>) -> CpuResult {
    let (bytes, rows, cols, layout) = weight(op, qtype, w)?;
    if layout != Layout::Rows {
        // `infer` admits only row-after-row weights here.
        return Err(BackendError::invalid(
            op.name(),
            "interleaved or packed weights have no rows to look up",
        ));
    }
    let row_bytes = bytes.len() / rows.max(1);
    // The same checked reading as every other indexing op.
    let ids = super::index::indices(op, ids, rows, 0)?;
    let mut out = vec![0f32; ids.len() * cols];
    let row = |(o, &r): (&mut [f32], &usize)| dequantize_into(qtype, &bytes[r * row_bytes..(r + 1) * row_bytes], o);
    // A decode step's one row on the calling thread: handing it to the
    // thread pool and waiting for it cost more than the row (the GPU's
    // replayed steps wait for this lookup between tokens).
    if ids.len() <= SERIAL_LOOKUP_ROWS {
        out.chunks_mut(cols.max(1)).zip(ids.iter()).try_for_each(row)
    } else {
        out.par_chunks_mut(cols.max(1)).zip(ids.par_iter()).try_for_each(row)
    }
    .map_err(|e| quant_err(op, e))?;
    Ok(vec![CpuStorage::F32(out)])
}
