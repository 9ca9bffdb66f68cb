//! Activation rows quantized to a weight type's dot type, the way
//! llama.cpp's x86 CPU backend does it (Q8_0/Q8_1 with its AVX variant,
//! the others with the reference quantizer), so that integer dot products
//! see the same operands as llama.cpp's and results can match it closely.

use super::super::blocks::{self, BlockQ8_0, BlockQ8_1};
use super::super::{quantize_into, QType, QuantError};
use rayon::prelude::*;

/// `rows` activation rows of `cols` values each, encoded in `dot_type`.
#[derive(Clone, Debug, PartialEq)]
pub struct QuantizedRows {
    dot_type: QType,
    rows: usize,
    cols: usize,
    row_bytes: usize,
    bytes: Vec<u8>,
}

impl QuantizedRows {
    /// Encodes `x` (row-major, `x.len() / cols` rows) in `dot_type`, which
    /// must be one of F32, F16, BF16, Q8_0, Q8_1 or Q8_K.
    pub fn quantize(dot_type: QType, x: &[f32], cols: usize) -> Result<Self, QuantError> {
        let bad_cols = || QuantError::NotWholeBlocks {
            qtype: dot_type,
            elements: cols,
        };
        if cols == 0 || !x.len().is_multiple_of(cols) {
            return Err(QuantError::Mismatch {
                op: "quantize_activations",
                detail: format!("{} values are not whole rows of {cols}", x.len()),
            });
        }
        let row_bytes = dot_type.bytes_for(cols).ok_or_else(bad_cols)?;
        let rows = x.len() / cols;
        let mut bytes = vec![0u8; rows * row_bytes];
        // Only Q8_0 and Q8_1 are encoded differently from the reference
        // quantizer (llama.cpp's x86 activation path); every row is a
        // whole number of blocks, so the others quantize `x` in one call.
        let encode: fn(&[f32], &mut [u8]) = match dot_type {
            QType::F32 | QType::F16 | QType::BF16 | QType::Q8K => {
                quantize_into(dot_type, x, &mut bytes)?;
                return Ok(QuantizedRows {
                    dot_type,
                    rows,
                    cols,
                    row_bytes,
                    bytes,
                });
            }
            QType::Q8_0 => encode_q8_0,
            QType::Q8_1 => encode_q8_1,
            _ => {
                return Err(QuantError::Unsupported {
                    qtype: dot_type,
                    what: "activation dot type",
                })
            }
        };
        if rows > 1 {
            bytes
                .par_chunks_mut(row_bytes)
                .zip(x.par_chunks(cols))
                .for_each(|(o, r)| encode(r, o));
        } else {
            encode(x, &mut bytes);
        }
        Ok(QuantizedRows {
            dot_type,
            rows,
            cols,
            row_bytes,
            bytes,
        })
    }

    pub fn dot_type(&self) -> QType {
        self.dot_type
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    /// The encoded bytes of row `i`.
    pub fn row(&self, i: usize) -> &[u8] {
        &self.bytes[i * self.row_bytes..(i + 1) * self.row_bytes]
    }

    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }
}

/// llama.cpp's AVX `quantize_row_q8_0`: d = amax / 127, and the values are
/// scaled by 127 / amax (not 1 / d, as the reference does) and rounded half
/// to even (`_mm256_round_ps`, not `roundf`). Returns the f32 scale (before
/// rounding to f16), the quants and their sum.
fn q8_0_block(x: &[f32]) -> (f32, [i8; 32], i32) {
    let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
    let d = amax / 127.0;
    let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
    let mut qs = [0i8; 32];
    let mut sum = 0i32;
    for (q, v) in qs.iter_mut().zip(x) {
        let r = (v * id).round_ties_even() as i32;
        *q = r as i8;
        sum += r;
    }
    (d, qs, sum)
}

fn encode_q8_0(x: &[f32], out: &mut [u8]) {
    let out = blocks::cast_blocks_mut::<BlockQ8_0>(out).expect("whole Q8_0 blocks");
    for (b, xs) in out.iter_mut().zip(x.chunks_exact(32)) {
        let (d, qs, _) = q8_0_block(xs);
        *b = BlockQ8_0 {
            d: blocks::f32_to_f16(d),
            qs,
        };
    }
}

/// As Q8_0, plus s = d * sum(q) with the f32 d (llama.cpp's AVX
/// `quantize_row_q8_1`).
fn encode_q8_1(x: &[f32], out: &mut [u8]) {
    let out = blocks::cast_blocks_mut::<BlockQ8_1>(out).expect("whole Q8_1 blocks");
    for (b, xs) in out.iter_mut().zip(x.chunks_exact(32)) {
        let (d, qs, sum) = q8_0_block(xs);
        *b = BlockQ8_1 {
            d: blocks::f32_to_f16(d),
            s: blocks::f32_to_f16(d * sum as f32),
            qs,
        };
    }
}
