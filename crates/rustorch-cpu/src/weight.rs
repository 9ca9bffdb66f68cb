//! Weights in the CPU's own layouts (`Backend::prepare_weight`): the
//! layouts llama.cpp's CPU buffers give a weight that is only multiplied,
//! so that products read it as fast and round as llama.cpp does.
//!
//! - interleaved: eight rows' blocks side by side (`qmatmul::interleave_rows`),
//!   where the matvec streams them faster (`interleave_pays`); the same
//!   bits as row after row;
//! - AMX-packed: the AMX order's tiles (`qmatmul::amx_pack`), as llama.cpp's
//!   AMX buffer holds them (`RUSTORCH_GGML_ORDER=amx` on CPUs with AMX).
//!
//! Either is a `PackedWeight`, which only the CPU's quantized products
//! read: they see it as the u8 tensor of the physical dims below, the form
//! the kernels in `quant` take.

use crate::qmatmul::{
    amx_pack, amx_packs, interleave_pays, interleave_rows, packed_block_bytes, INTERLEAVE_ROWS, PACKED_ROWS,
};
use rustorch_core::backend::{Buffer, DeviceBuffer, WeightSpec, WeightUsage};
use rustorch_core::device::Device;
use rustorch_core::dtype::DType;
use rustorch_core::error::BackendError;
use rustorch_core::layout::Layout;
use rustorch_core::shape::Shape;
use rustorch_core::storage::CpuStorage;
use std::any::Any;
use std::sync::Arc;

/// Which of the CPU's own layouts a weight is in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Packing {
    /// `[rows / 8, blocks, 8 * block bytes]`.
    Interleaved,
    /// `[rows / 16, blocks, 1, packed block bytes]`.
    Amx,
}

/// A weight's bytes in one of the CPU's own layouts.
#[derive(Debug)]
pub struct PackedWeight {
    bytes: CpuStorage,
    /// The physical dims of `bytes`, as the kernels in `quant` read them.
    layout: Layout,
    packing: Packing,
    /// Elements of the weight as the executor sees it: `rows * row_bytes`.
    logical_len: usize,
}

impl PackedWeight {
    /// The bytes and the physical layout the quantized products read.
    pub(crate) fn physical(&self) -> (&CpuStorage, &Layout) {
        (&self.bytes, &self.layout)
    }
}

impl DeviceBuffer for PackedWeight {
    fn device(&self) -> Device {
        Device::Cpu
    }
    fn dtype(&self) -> DType {
        DType::U8
    }
    fn len(&self) -> usize {
        self.logical_len
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
    fn private_layout(&self) -> Option<&'static str> {
        Some(match self.packing {
            Packing::Interleaved => "cpu: rows interleaved by 8",
            Packing::Amx => "cpu: AMX-packed tiles",
        })
    }
}

/// `Backend::prepare_weight` for the CPU: packed for the AMX order where
/// that order applies (`amx_packs`), interleaved where that pays
/// (`interleave_pays`), else the plain bytes.
pub(crate) fn prepare(spec: WeightSpec, mut bytes: Vec<u8>) -> Result<Buffer, BackendError> {
    let WeightSpec {
        qtype,
        rows,
        cols,
        usage,
    } = spec;
    let logical_len = bytes.len();
    let bad = |e: rustorch_core::quant::QuantError| BackendError::invalid("prepare_weight", e.to_string());
    if usage == WeightUsage::Lookup {
        return Ok(Arc::new(CpuStorage::U8(bytes)));
    }
    let (packing, packed, dims) = if amx_packs(qtype, rows, cols) {
        let packed = amx_pack(qtype, rows, cols, bytes).map_err(bad)?;
        let dims = vec![
            rows / PACKED_ROWS,
            cols / qtype.block_size(),
            1,
            packed_block_bytes(qtype),
        ];
        (Packing::Amx, packed, dims)
    } else if interleave_pays(qtype, rows) {
        interleave_rows(qtype, rows, cols, &mut bytes).map_err(bad)?;
        let dims = vec![
            rows / INTERLEAVE_ROWS,
            cols / qtype.block_size(),
            INTERLEAVE_ROWS * qtype.type_size(),
        ];
        (Packing::Interleaved, bytes, dims)
    } else {
        return Ok(Arc::new(CpuStorage::U8(bytes)));
    };
    Ok(Arc::new(PackedWeight {
        bytes: CpuStorage::U8(packed),
        layout: Layout::contiguous(Shape::from(dims)),
        packing,
        logical_len,
    }))
}
