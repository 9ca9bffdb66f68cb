//! `QTensor`: GGML-encoded bytes with a type and a shape.

use super::{dequantize, quantize, QType, QuantError};
use crate::error::Result;
use crate::shape::Shape;
use crate::tensor::Tensor;

/// A tensor stored in a GGML type. Rows (the last dimension, GGML's
/// `ne[0]`) are encoded independently, so the last dimension must be a
/// whole number of blocks; `bytes` is row after row.
#[derive(Clone, Debug, PartialEq)]
pub struct QTensor {
    qtype: QType,
    shape: Shape,
    bytes: Vec<u8>,
}

impl QTensor {
    /// Checks that `bytes` is exactly the encoding of `shape` in `qtype`.
    pub fn new(qtype: QType, shape: impl Into<Shape>, bytes: Vec<u8>) -> std::result::Result<Self, QuantError> {
        let shape = shape.into();
        let n = Self::check_shape(qtype, &shape)?;
        let expected = qtype
            .bytes_for(n)
            .ok_or(QuantError::NotWholeBlocks { qtype, elements: n })?;
        if bytes.len() != expected {
            return Err(QuantError::ByteLength {
                qtype,
                elements: n,
                expected,
                actual: bytes.len(),
            });
        }
        Ok(QTensor { qtype, shape, bytes })
    }

    /// Quantizes f32 values laid out in `shape`.
    pub fn quantize(qtype: QType, shape: impl Into<Shape>, data: &[f32]) -> std::result::Result<Self, QuantError> {
        let shape = shape.into();
        let n = Self::check_shape(qtype, &shape)?;
        if data.len() != n {
            return Err(QuantError::ByteLength {
                qtype: QType::F32,
                elements: n,
                expected: n * 4,
                actual: data.len() * 4,
            });
        }
        let bytes = quantize(qtype, data)?;
        Ok(QTensor { qtype, shape, bytes })
    }

    /// Quantizes an f32 tensor (any layout; it is read in logical order).
    pub fn from_tensor(t: &Tensor, qtype: QType) -> Result<Self> {
        let data = t.to_vec::<f32>()?;
        Ok(Self::quantize(qtype, t.shape().clone(), &data)?)
    }

    pub fn qtype(&self) -> QType {
        self.qtype
    }

    pub fn shape(&self) -> &Shape {
        &self.shape
    }

    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    pub fn into_bytes(self) -> Vec<u8> {
        self.bytes
    }

    pub fn numel(&self) -> usize {
        self.shape.numel()
    }

    /// The values as f32, row-major.
    pub fn dequantize_vec(&self) -> std::result::Result<Vec<f32>, QuantError> {
        dequantize(self.qtype, &self.bytes, self.numel())
    }

    /// The values as an f32 tensor of the same shape.
    pub fn dequantize(&self) -> Result<Tensor> {
        Tensor::from_vec(self.dequantize_vec()?, self.shape.clone())
    }

    /// The element count, after checking that rows are whole blocks.
    fn check_shape(qtype: QType, shape: &Shape) -> std::result::Result<usize, QuantError> {
        let last = shape.dims().last().copied().unwrap_or(1);
        let n = shape.checked_numel();
        match n {
            Some(n) if last.is_multiple_of(qtype.block_size()) => Ok(n),
            _ => Err(QuantError::Shape {
                qtype,
                shape: shape.dims().to_vec(),
            }),
        }
    }
}
