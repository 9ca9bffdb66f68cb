//! Quantization: f32 to GGML bytes with llama.cpp's reference algorithms,
//! a block at a time, over rayon tasks for large inputs.

mod iq;
mod kquants;
pub use kquants::{q8k_block, Q8kBlockFn};
mod legacy;
mod search;

use super::blocks::{cast_blocks_mut, Quantize};
use super::{QType, QuantError};
use rayon::prelude::*;

/// Elements per rayon task: quantizing costs far more per element than
/// dequantizing (the K-quants search up to 21 candidate scales per group).
const TASK_ELEMS: usize = 1 << 12;

/// Quantizes `data` into `out`, which must hold exactly
/// `qtype.bytes_for(data.len())` bytes.
pub fn quantize_into(qtype: QType, data: &[f32], out: &mut [u8]) -> Result<(), QuantError> {
    let expected = qtype.bytes_for(data.len()).ok_or(QuantError::NotWholeBlocks {
        qtype,
        elements: data.len(),
    })?;
    if out.len() != expected {
        return Err(QuantError::ByteLength {
            qtype,
            elements: data.len(),
            expected,
            actual: out.len(),
        });
    }
    use super::blocks::*;
    match qtype {
        QType::F32 => plain(data, out, |x: f32| x.to_le_bytes()),
        QType::F16 => plain(data, out, f32_to_f16),
        QType::BF16 => plain(data, out, f32_to_bf16),
        QType::Q4_0 => blocks::<32, BlockQ4_0>(data, out),
        QType::Q4_1 => blocks::<32, BlockQ4_1>(data, out),
        QType::Q5_0 => blocks::<32, BlockQ5_0>(data, out),
        QType::Q5_1 => blocks::<32, BlockQ5_1>(data, out),
        QType::Q8_0 => blocks::<32, BlockQ8_0>(data, out),
        QType::Q8_1 => blocks::<32, BlockQ8_1>(data, out),
        QType::Q2K => blocks::<QK_K, BlockQ2K>(data, out),
        QType::Q3K => blocks::<QK_K, BlockQ3K>(data, out),
        QType::Q4K => blocks::<QK_K, BlockQ4K>(data, out),
        QType::Q5K => blocks::<QK_K, BlockQ5K>(data, out),
        QType::Q6K => blocks::<QK_K, BlockQ6K>(data, out),
        QType::Q8K => blocks::<QK_K, BlockQ8K>(data, out),
        QType::IQ4NL => blocks::<32, BlockIQ4NL>(data, out),
        QType::IQ4XS => blocks::<QK_K, BlockIQ4XS>(data, out),
        _ => {
            return Err(QuantError::Unsupported {
                qtype,
                what: "quantize",
            })
        }
    }
    Ok(())
}

/// IQ4_NL the way `llama-quantize` makes it (llama.cpp's `quantize_iq4_nl`:
/// a scale search the reference quantizer skips); `out` must hold
/// `QType::IQ4NL.bytes_for(data.len())` bytes.
pub fn quantize_iq4_nl_searched(data: &[f32], out: &mut [u8]) -> Result<(), QuantError> {
    let qtype = QType::IQ4NL;
    let expected = qtype.bytes_for(data.len()).ok_or(QuantError::NotWholeBlocks {
        qtype,
        elements: data.len(),
    })?;
    if out.len() != expected {
        return Err(QuantError::ByteLength {
            qtype,
            elements: data.len(),
            expected,
            actual: out.len(),
        });
    }
    let blocks: &mut [super::blocks::BlockIQ4NL] = super::blocks::cast_blocks_mut(out).unwrap_or(&mut []);
    let (chunks, _) = data.as_chunks::<32>();
    blocks
        .par_chunks_mut(TASK_ELEMS / 32)
        .zip(chunks.par_chunks(TASK_ELEMS / 32))
        .for_each(|(b, x)| {
            for (b, x) in b.iter_mut().zip(x) {
                *b = iq::iq4nl_searched(x);
            }
        });
    Ok(())
}

/// Whether [`quantize_into`] handles `qtype`.
pub fn can_quantize(qtype: QType) -> bool {
    super::dequant::can_dequantize(qtype)
}

/// f32 to bf16 as ggml's `ggml_compute_fp32_to_bf16` (and the `gguf`
/// package): NaNs are made quiet, everything else rounds to nearest even.
#[inline]
pub fn f32_to_bf16(x: f32) -> [u8; 2] {
    let n = x.to_bits();
    let h = if (n & 0x7fff_ffff) > 0x7f80_0000 {
        ((n >> 16) | 64) as u16
    } else {
        ((n as u64 + 0x7fff + ((n >> 16) & 1) as u64) >> 16) as u16
    };
    h.to_le_bytes()
}

fn blocks<const QK: usize, B: Quantize<QK>>(data: &[f32], out: &mut [u8]) {
    let blocks: &mut [B] = cast_blocks_mut(out).unwrap_or(&mut []);
    let (chunks, _) = data.as_chunks::<QK>();
    debug_assert_eq!(blocks.len(), chunks.len(), "{}", B::QTYPE);
    let run = |blocks: &mut [B], chunks: &[[f32; QK]]| {
        for (b, x) in blocks.iter_mut().zip(chunks) {
            *b = B::quantize(x);
        }
    };
    let per_task = (TASK_ELEMS / QK).max(1);
    if chunks.len() >= 2 * per_task {
        blocks
            .par_chunks_mut(per_task)
            .zip(chunks.par_chunks(per_task))
            .for_each(|(b, x)| run(b, x));
    } else {
        run(blocks, chunks);
    }
}

fn plain<const N: usize>(data: &[f32], out: &mut [u8], f: impl Fn(f32) -> [u8; N] + Sync) {
    let (dst, _) = out.as_chunks_mut::<N>();
    let run = |d: &mut [[u8; N]], s: &[f32]| {
        for (d, &s) in d.iter_mut().zip(s) {
            *d = f(s);
        }
    };
    const TASK: usize = 1 << 14;
    if data.len() >= 4 * TASK {
        dst.par_chunks_mut(TASK)
            .zip(data.par_chunks(TASK))
            .for_each(|(d, s)| run(d, s));
    } else {
        run(dst, data);
    }
}
