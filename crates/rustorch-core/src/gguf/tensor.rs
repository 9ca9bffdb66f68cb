//! Tensor infos and conversions between GGUF tensor bytes and `Tensor`s.

use super::error::{GgufError, Result};
use crate::dtype::DType;
use crate::quant::QType;
use crate::storage::CpuStorage;
use crate::tensor::Tensor;
use half::{bf16, f16};

/// Most dimensions a GGML tensor has.
pub const MAX_DIMS: usize = 4;

/// One entry of the tensor table.
///
/// `dims()` are in GGUF order: `dims()[0]` is `ne[0]`, the fastest-varying
/// dimension (the row length). `shape()` is the same reversed, the row-major
/// order that `Tensor` and PyTorch use.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorInfo {
    pub(crate) name: String,
    pub(crate) dims: Vec<u64>,
    pub(crate) qtype: QType,
    pub(crate) offset: u64,
    pub(crate) n_bytes: usize,
    pub(crate) info_offset: u64,
}

impl TensorInfo {
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Dimensions in GGUF order (`ne[0]` first).
    pub fn dims(&self) -> &[u64] {
        &self.dims
    }

    /// Dimensions in row-major order (outermost first), as `Tensor` uses.
    /// The reader checked that the element count fits a `usize`, so every
    /// dimension does too.
    pub fn shape(&self) -> Vec<usize> {
        self.dims.iter().rev().map(|&d| d as usize).collect()
    }

    pub fn qtype(&self) -> QType {
        self.qtype
    }

    /// Offset of the data from the start of the data section.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// Size of the data in bytes.
    pub fn n_bytes(&self) -> usize {
        self.n_bytes
    }

    pub fn numel(&self) -> usize {
        self.dims.iter().map(|&d| d as usize).product()
    }

    /// Where this tensor's info starts in the file (for messages).
    pub fn info_offset(&self) -> u64 {
        self.info_offset
    }
}

/// A tensor read from a file: dense types become a `Tensor`; quantized and
/// other types with no RusTorch dtype come back as their bytes.
#[derive(Debug)]
pub enum LoadedTensor<'a> {
    Dense(Tensor),
    Raw { info: &'a TensorInfo, bytes: &'a [u8] },
}

/// The dtype a GGML type becomes, if `Tensor` has it.
pub fn dense_dtype(q: QType) -> Option<DType> {
    match q {
        QType::F32 => Some(DType::F32),
        QType::F16 => Some(DType::F16),
        QType::BF16 => Some(DType::BF16),
        QType::F64 => Some(DType::F64),
        QType::I32 => Some(DType::I32),
        QType::I64 => Some(DType::I64),
        _ => None,
    }
}

/// The GGML type for a dtype, if GGUF has one.
pub fn qtype_for_dtype(d: DType) -> Option<QType> {
    match d {
        DType::F32 => Some(QType::F32),
        DType::F16 => Some(QType::F16),
        DType::BF16 => Some(QType::BF16),
        DType::F64 => Some(QType::F64),
        DType::I32 => Some(QType::I32),
        DType::I64 => Some(QType::I64),
        _ => None,
    }
}

/// Decodes little-endian elements; `None` when `q` has no dense dtype.
/// `bytes` must hold whole elements (the reader guarantees it).
pub(crate) fn decode_dense(q: QType, bytes: &[u8]) -> Option<CpuStorage> {
    fn conv<const N: usize, T>(bytes: &[u8], f: impl Fn([u8; N]) -> T) -> Vec<T> {
        let (chunks, _) = bytes.as_chunks::<N>();
        chunks.iter().map(|c| f(*c)).collect()
    }
    Some(match q {
        QType::F32 => CpuStorage::F32(conv(bytes, f32::from_le_bytes)),
        QType::F16 => CpuStorage::F16(conv(bytes, |b| f16::from_bits(u16::from_le_bytes(b)))),
        QType::BF16 => CpuStorage::BF16(conv(bytes, |b| bf16::from_bits(u16::from_le_bytes(b)))),
        QType::F64 => CpuStorage::F64(conv(bytes, f64::from_le_bytes)),
        QType::I32 => CpuStorage::I32(conv(bytes, i32::from_le_bytes)),
        QType::I64 => CpuStorage::I64(conv(bytes, i64::from_le_bytes)),
        _ => return None,
    })
}

/// The little-endian bytes of host storage and their GGML type.
pub(crate) fn encode_dense(name: &str, s: &CpuStorage) -> Result<(QType, Vec<u8>)> {
    fn bytes<T, const N: usize>(v: &[T], f: impl Fn(&T) -> [u8; N]) -> Vec<u8> {
        let mut out = Vec::with_capacity(v.len() * N);
        for x in v {
            out.extend_from_slice(&f(x));
        }
        out
    }
    Ok(match s {
        CpuStorage::F32(v) => (QType::F32, bytes(v, |x| x.to_le_bytes())),
        CpuStorage::F16(v) => (QType::F16, bytes(v, |x| x.to_bits().to_le_bytes())),
        CpuStorage::BF16(v) => (QType::BF16, bytes(v, |x| x.to_bits().to_le_bytes())),
        CpuStorage::F64(v) => (QType::F64, bytes(v, |x| x.to_le_bytes())),
        CpuStorage::I32(v) => (QType::I32, bytes(v, |x| x.to_le_bytes())),
        CpuStorage::I64(v) => (QType::I64, bytes(v, |x| x.to_le_bytes())),
        other => {
            return Err(GgufError::InvalidTensor {
                name: name.to_string(),
                message: format!(
                    "dtype {} has no GGML type (GGUF stores f32, f16, bf16, f64, i32, i64)",
                    other.dtype()
                ),
            })
        }
    })
}

/// Builds a `Tensor` from a dense tensor's bytes.
pub(crate) fn to_tensor(info: &TensorInfo, bytes: &[u8]) -> Result<Tensor> {
    let storage = decode_dense(info.qtype, bytes).ok_or_else(|| GgufError::NotDense {
        name: info.name.clone(),
        qtype: info.qtype,
    })?;
    Ok(Tensor::from_storage(storage, info.shape())?)
}
