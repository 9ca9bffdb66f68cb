//! Quantized GGML block formats: their layouts (`blocks`), dequantization
//! to f32 and quantization from f32 with llama.cpp's reference algorithms,
//! and `QTensor`, a shaped tensor of GGML bytes.
//!
//! Supported: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1, Q2_K,
//! Q3_K, Q4_K, Q5_K, Q6_K, Q8_K, IQ4_NL, IQ4_XS. Dequantization is
//! bit-identical to the `gguf` Python package (and llama.cpp);
//! quantization is byte-identical to the package wherever it can quantize
//! (F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) and follows llama.cpp's
//! `quantize_row_*_ref` for the others.

pub mod blocks;
mod dequant;
mod qtype;
mod quantize;
mod tensor;

pub use dequant::{can_dequantize, dequantize_into};
pub use qtype::QType;
pub use quantize::{can_quantize, q8k_block, quantize_into, quantize_iq4_nl_searched, Q8kBlockFn};
pub use tensor::QTensor;

/// Errors of the quantization routines; each names the type and the sizes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantError {
    #[error("{qtype}: {elements} elements are not a whole number of {}-element blocks", .qtype.block_size())]
    NotWholeBlocks { qtype: QType, elements: usize },
    #[error("{qtype}: {elements} elements take {expected} bytes, got {actual}")]
    ByteLength {
        qtype: QType,
        elements: usize,
        expected: usize,
        actual: usize,
    },
    #[error("{qtype}: {what} is not supported for this type")]
    Unsupported { qtype: QType, what: &'static str },
    #[error("{op}: {detail}")]
    Mismatch { op: &'static str, detail: String },
    #[error("{qtype}: shape {shape:?} needs its last dimension to be a multiple of the block size {}", .qtype.block_size())]
    Shape { qtype: QType, shape: Vec<usize> },
}

impl From<QuantError> for crate::Error {
    fn from(e: QuantError) -> Self {
        let op = match &e {
            QuantError::Unsupported { what, .. } => *what,
            QuantError::Mismatch { op, .. } => *op,
            _ => "quant",
        };
        crate::Error::invalid(op, e.to_string())
    }
}

/// Decodes `n` elements of type `qtype` from `bytes`, whose length must be
/// exactly `qtype.bytes_for(n)`.
pub fn dequantize(qtype: QType, bytes: &[u8], n: usize) -> Result<Vec<f32>, QuantError> {
    // Validate before allocating: `n` may come from an untrusted file.
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
    if !can_dequantize(qtype) {
        return Err(QuantError::Unsupported {
            qtype,
            what: "dequantize",
        });
    }
    let mut out = vec![0f32; n];
    dequantize_into(qtype, bytes, &mut out)?;
    Ok(out)
}

/// Quantizes `data` to `qtype`; its length must be a whole number of
/// blocks.
pub fn quantize(qtype: QType, data: &[f32]) -> Result<Vec<u8>, QuantError> {
    let size = qtype.bytes_for(data.len()).ok_or(QuantError::NotWholeBlocks {
        qtype,
        elements: data.len(),
    })?;
    if !can_quantize(qtype) {
        return Err(QuantError::Unsupported {
            qtype,
            what: "quantize",
        });
    }
    let mut out = vec![0u8; size];
    quantize_into(qtype, data, &mut out)?;
    Ok(out)
}
