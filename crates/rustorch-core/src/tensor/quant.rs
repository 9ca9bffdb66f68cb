//! GGML-typed weights as tensors: `QWeight` and the ops that use them.

use super::Tensor;
use crate::cpu::CpuStorage;
use crate::error::{Error, Result};
use crate::executor::Executor;
use crate::op::{GateActivation, Op};
use crate::quant::QType;
use std::sync::Arc;

/// A weight matrix of `rows` x `cols` values stored in a GGML type (any
/// type, float ones included), as raw blocks in a u8 tensor
/// `[rows, row_bytes]`, so that every backend can hold it and the executor
/// can move it like any other tensor.
#[derive(Clone, Debug)]
pub struct QWeight {
    data: Tensor,
    qtype: QType,
    rows: usize,
    cols: usize,
    /// Also looked up by row (`as_lookup_table`).
    lookup_table: bool,
}

impl QWeight {
    /// Wraps `bytes` holding `rows` rows of `cols` values of `qtype`.
    pub fn from_bytes(qtype: QType, rows: usize, cols: usize, bytes: Vec<u8>) -> Result<QWeight> {
        Self::from_bytes_in(&Executor::global(), qtype, rows, cols, bytes)
    }

    /// `from_bytes` with tensors tied to the given executor.
    pub fn from_bytes_in(
        exec: &Arc<Executor>,
        qtype: QType,
        rows: usize,
        cols: usize,
        bytes: Vec<u8>,
    ) -> Result<QWeight> {
        let row_bytes = qtype.bytes_for(cols).ok_or_else(|| {
            Error::invalid(
                "qweight",
                format!(
                    "rows of {cols} values are not whole {qtype} blocks of {}",
                    qtype.block_size()
                ),
            )
        })?;
        if rows.checked_mul(row_bytes) != Some(bytes.len()) {
            return Err(Error::invalid(
                "qweight",
                format!(
                    "{rows} x {cols} {qtype} values need {} bytes, got {}",
                    rows.saturating_mul(row_bytes),
                    bytes.len()
                ),
            ));
        }
        let data = Tensor::from_storage_in(exec, CpuStorage::U8(bytes), [rows, row_bytes])?;
        Ok(QWeight {
            data,
            qtype,
            rows,
            cols,
            lookup_table: false,
        })
    }

    /// `from_bytes_in` for a weight that is only ever multiplied (never
    /// looked up by row, as an embedding is): where it pays
    /// (`quant::matmul::interleave_pays`), the bytes are rearranged in
    /// place into the interleaved layout, which the matvec streams faster;
    /// products have the same bits either way. The data tensor is then
    /// `[rows / 8, blocks per row, 8 * block bytes]`.
    pub fn for_matmul_in(
        exec: &Arc<Executor>,
        qtype: QType,
        rows: usize,
        cols: usize,
        mut bytes: Vec<u8>,
    ) -> Result<QWeight> {
        use crate::quant::matmul::{amx_pack, amx_packs, interleave_pays, interleave_rows, INTERLEAVE_ROWS};
        if amx_packs(qtype, rows, cols) {
            // The AMX order (`RUSTORCH_GGML_ORDER=amx`): packed as its
            // kernels stream it, and as llama.cpp's AMX buffer holds it.
            let packed = amx_pack(qtype, rows, cols, bytes).map_err(|e| Error::invalid("qweight", e.to_string()))?;
            let block = crate::quant::matmul::packed_block_bytes(qtype);
            let dims = [
                rows / crate::quant::matmul::PACKED_ROWS,
                cols / qtype.block_size(),
                1,
                block,
            ];
            let data = Tensor::from_storage_in(exec, CpuStorage::U8(packed), dims)?;
            return Ok(QWeight {
                data,
                qtype,
                rows,
                cols,
                lookup_table: false,
            });
        }
        if !interleave_pays(qtype, rows) {
            return Self::from_bytes_in(exec, qtype, rows, cols, bytes);
        }
        interleave_rows(qtype, rows, cols, &mut bytes).map_err(|e| Error::invalid("qweight", e.to_string()))?;
        let (groups, blocks) = (rows / INTERLEAVE_ROWS, cols / qtype.block_size());
        let data = Tensor::from_storage_in(
            exec,
            CpuStorage::U8(bytes),
            [groups, blocks, INTERLEAVE_ROWS * qtype.type_size()],
        )?;
        Ok(QWeight {
            data,
            qtype,
            rows,
            cols,
            lookup_table: false,
        })
    }

    /// This weight marked as also looked up by row (a token embedding that
    /// a tied model multiplies too): llama.cpp keeps such a weight in its
    /// plain CPU buffer, so `qmatmul` with it takes the plain order, never
    /// a repacked or AMX one. An interleaved weight has no rows to look up
    /// and stays as it is.
    pub fn as_lookup_table(self) -> QWeight {
        let lookup_table = !self.is_rearranged();
        QWeight { lookup_table, ..self }
    }

    /// Whether the bytes are in the interleaved layout (`for_matmul_in`):
    /// such a weight can be multiplied but not looked up by row.
    pub fn is_interleaved(&self) -> bool {
        self.data.dims().len() == 3
    }

    /// Whether the bytes are in some layout other than row after row
    /// (interleaved, or packed for the AMX order): no row lookups then.
    pub fn is_rearranged(&self) -> bool {
        self.data.dims().len() != 2
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
    /// The raw blocks, a u8 tensor `[rows, row_bytes]` (or, interleaved,
    /// `[rows / 8, blocks per row, 8 * block bytes]`; see `for_matmul_in`).
    pub fn data(&self) -> &Tensor {
        &self.data
    }
    /// Bytes the weight occupies.
    pub fn n_bytes(&self) -> usize {
        self.data.numel()
    }

    /// Rows `ids` (any integer shape) dequantized to f32: `[ids.., cols]`.
    pub fn embedding(&self, ids: &Tensor) -> Result<Tensor> {
        if self.is_rearranged() {
            return Err(Error::invalid(
                "qembedding",
                "this weight is in a matmul layout (QWeight::for_matmul_in: interleaved or packed), which has no rows to look up",
            ));
        }
        self.data
            .run1(&Op::QEmbedding { qtype: self.qtype }, &[&self.data, ids])
    }

    /// The same weight on another device.
    pub fn to_device(&self, device: crate::device::Device) -> Result<QWeight> {
        Ok(QWeight {
            data: self.data.to_device(device)?,
            ..self.clone()
        })
    }
}

impl Tensor {
    /// `self @ w^T` for f32 activations `[.., w.cols()]`: `[.., w.rows()]`,
    /// computed as llama.cpp does (activations quantized to the weight
    /// type's dot type, integer dot products).
    pub fn qmatmul(&self, w: &QWeight) -> Result<Tensor> {
        let op = Op::QMatMul {
            qtype: w.qtype,
            lookup_table: w.lookup_table,
        };
        self.run1(&op, &[self, &w.data])
    }

    /// `self @ w^T` for each weight, the same values as one `qmatmul` per
    /// weight, with the activations quantized once per dot type rather
    /// than once per weight (for projections that share their input).
    pub fn qmatmul_many(&self, ws: &[&QWeight]) -> Result<Vec<Tensor>> {
        let op = Op::QMatMuls {
            qtypes: ws.iter().map(|w| w.qtype).collect(),
        };
        let mut inputs = vec![self];
        inputs.extend(ws.iter().map(|w| &w.data));
        self.run_op(&op, &inputs)
    }

    /// `act(self @ gate^T, self @ up^T)`, a gated feed-forward's first
    /// half: the values of `qmatmul_many(&[gate, up])` followed by
    /// `swiglu` or `geglu` (`act`), with the activation written over the
    /// gate product, so that only two `[.., n]` tensors exist at a time
    /// instead of three (at a long prompt's rows, the largest ones).
    pub fn qmatmul_gated(&self, gate: &QWeight, up: &QWeight, act: GateActivation) -> Result<Tensor> {
        let op = Op::QMatMulGated {
            qtypes: [gate.qtype, up.qtype],
            act,
        };
        self.run1(&op, &[self, &gate.data, &up.data])
    }
}
