//! GGML-typed weights as tensors: `QWeight` and the ops that use them.

use super::Tensor;
use crate::backend::{WeightSpec, WeightUsage};
use crate::device::Device;
use crate::error::{Error, Result};
use crate::executor::Executor;
use crate::layout::Layout;
use crate::op::{GateActivation, Op};
use crate::quant::QType;
use crate::storage::CpuStorage;
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
        let row_bytes = check_bytes(qtype, rows, cols, bytes.len())?;
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
    /// looked up by row, as an embedding is), prepared for the host device
    /// (`for_matmul_on`).
    pub fn for_matmul_in(
        exec: &Arc<Executor>,
        qtype: QType,
        rows: usize,
        cols: usize,
        bytes: Vec<u8>,
    ) -> Result<QWeight> {
        Self::for_matmul_on(exec, Device::Cpu, qtype, rows, cols, bytes)
    }

    /// A weight that is only ever multiplied, on `device`, in the layout its
    /// backend's products read best (`Backend::prepare_weight`; the CPU
    /// interleaves rows or packs them for AMX as llama.cpp's CPU buffers
    /// do, which gives the same bits as the plain layout). Such a weight
    /// can be multiplied on that device only: it has no rows to look up
    /// and no plain bytes to move.
    /// The bytes may be borrowed (from a memory-mapped file: a device
    /// copies them from there) or owned (the CPU keeps them).
    pub fn for_matmul_on<'a>(
        exec: &Arc<Executor>,
        device: Device,
        qtype: QType,
        rows: usize,
        cols: usize,
        bytes: impl Into<std::borrow::Cow<'a, [u8]>>,
    ) -> Result<QWeight> {
        let bytes = bytes.into();
        let row_bytes = check_bytes(qtype, rows, cols, bytes.len())?;
        let spec = WeightSpec {
            qtype,
            rows,
            cols,
            usage: WeightUsage::Matmul,
        };
        let buffer = exec.prepare_weight(device, spec, bytes)?;
        let data = Tensor::from_parts(
            buffer,
            Layout::contiguous(crate::shape::Shape::from([rows, row_bytes])),
            exec.clone(),
        );
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
    /// a repacked or AMX one. A weight in a backend's own layout has no rows
    /// to look up and stays as it is.
    pub fn as_lookup_table(self) -> QWeight {
        let lookup_table = !self.is_rearranged();
        QWeight { lookup_table, ..self }
    }

    /// Whether the bytes are in a backend's own layout (`for_matmul_on`:
    /// interleaved, or packed for the AMX order): no row lookups then.
    pub fn is_rearranged(&self) -> bool {
        self.data.buffer().private_layout().is_some()
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
    /// The raw blocks, a u8 tensor `[rows, row_bytes]` (whose buffer may be
    /// in its backend's own layout: see `for_matmul_on`).
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
                "this weight is in a matmul layout (QWeight::for_matmul_on: interleaved or packed), which has no rows to look up",
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
            cpu: crate::op::CpuHints {
                plain_weight_order: w.lookup_table,
                ..Default::default()
            },
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

    /// `(s, products)` with `s = self + a` and the products of
    /// `qmatmul_many(ws)` on `rms_norm(s, weight, eps)`: a decode step's
    /// residual add, the norm after it and the projections of the normed
    /// row in one op (a GPU computes the norm inside the products' launch).
    pub fn add_rms_norm_qmatmul_many(
        &self,
        a: &Tensor,
        weight: &Tensor,
        eps: f64,
        ws: &[&QWeight],
    ) -> Result<(Tensor, Vec<Tensor>)> {
        let then = Op::QMatMuls {
            qtypes: ws.iter().map(|w| w.qtype).collect(),
        };
        let mut inputs = vec![self, a, weight];
        inputs.extend(ws.iter().map(|w| &w.data));
        self.add_rms_norm_then(eps, then, &inputs)
    }

    /// `(s, act)` with `s = self + a` and `act` the `qmatmul_gated` of
    /// `rms_norm(s, weight, eps)`, in one op (see `add_rms_norm_qmatmul_many`).
    pub fn add_rms_norm_qmatmul_gated(
        &self,
        a: &Tensor,
        weight: &Tensor,
        eps: f64,
        gate: &QWeight,
        up: &QWeight,
        act: GateActivation,
    ) -> Result<(Tensor, Tensor)> {
        let then = Op::QMatMulGated {
            qtypes: [gate.qtype, up.qtype],
            act,
        };
        let (s, mut out) = self.add_rms_norm_then(eps, then, &[self, a, weight, &gate.data, &up.data])?;
        match out.pop() {
            Some(g) if out.is_empty() => Ok((s, g)),
            _ => Err(Error::invalid(
                "add_rms_norm_qmatmul_gated",
                "the op gave other than two outputs",
            )),
        }
    }

    fn add_rms_norm_then(&self, eps: f64, then: Op, inputs: &[&Tensor]) -> Result<(Tensor, Vec<Tensor>)> {
        let op = Op::AddRmsNormThen {
            eps,
            then: Box::new(then),
        };
        let mut out = self.run_op(&op, inputs)?.into_iter();
        let s = out
            .next()
            .ok_or_else(|| Error::invalid("add_rms_norm_then", "the op gave no outputs"))?;
        Ok((s, out.collect()))
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

/// The bytes of a row of `cols` values of `qtype`, after checking that
/// `rows` such rows take `len` bytes.
fn check_bytes(qtype: QType, rows: usize, cols: usize, len: usize) -> Result<usize> {
    let row_bytes = qtype.bytes_for(cols).ok_or_else(|| {
        Error::invalid(
            "qweight",
            format!(
                "rows of {cols} values are not whole {qtype} blocks of {}",
                qtype.block_size()
            ),
        )
    })?;
    if rows.checked_mul(row_bytes) != Some(len) {
        return Err(Error::invalid(
            "qweight",
            format!(
                "{rows} x {cols} {qtype} values need {} bytes, got {len}",
                rows.saturating_mul(row_bytes),
            ),
        ));
    }
    Ok(row_bytes)
}
