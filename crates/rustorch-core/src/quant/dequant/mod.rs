//! Dequantization: GGML bytes to f32, a block at a time, over rayon tasks
//! for large tensors.

mod iq;
mod kquants;
mod legacy;

use super::blocks::{cast_blocks, Dequantize};
use super::{QType, QuantError};
use rayon::prelude::*;

/// Outputs at least this long are split over rayon tasks.
const PAR_MIN_ELEMS: usize = 1 << 16;
/// Elements per rayon task.
const TASK_ELEMS: usize = 1 << 14;

/// Decodes `bytes` of type `qtype` into `out`; `out.len()` is the element
/// count and must match the byte length exactly.
pub fn dequantize_into(qtype: QType, bytes: &[u8], out: &mut [f32]) -> Result<(), QuantError> {
    let expected = qtype.bytes_for(out.len()).ok_or(QuantError::NotWholeBlocks {
        qtype,
        elements: out.len(),
    })?;
    if bytes.len() != expected {
        return Err(QuantError::ByteLength {
            qtype,
            elements: out.len(),
            expected,
            actual: bytes.len(),
        });
    }
    use super::blocks::*;
    match qtype {
        QType::F32 => plain(bytes, out, |b: [u8; 4]| f32::from_le_bytes(b)),
        QType::F16 => plain(bytes, out, f16_to_f32),
        // bf16 is the top half of an f32.
        QType::BF16 => plain(bytes, out, |b: [u8; 2]| {
            f32::from_bits((u16::from_le_bytes(b) as u32) << 16)
        }),
        QType::Q4_0 => blocks::<32, BlockQ4_0>(bytes, out),
        QType::Q4_1 => blocks::<32, BlockQ4_1>(bytes, out),
        QType::Q5_0 => blocks::<32, BlockQ5_0>(bytes, out),
        QType::Q5_1 => blocks::<32, BlockQ5_1>(bytes, out),
        QType::Q8_0 => blocks::<32, BlockQ8_0>(bytes, out),
        QType::Q8_1 => blocks::<32, BlockQ8_1>(bytes, out),
        QType::Q2K => blocks::<QK_K, BlockQ2K>(bytes, out),
        QType::Q3K => blocks::<QK_K, BlockQ3K>(bytes, out),
        QType::Q4K => blocks::<QK_K, BlockQ4K>(bytes, out),
        QType::Q5K => blocks::<QK_K, BlockQ5K>(bytes, out),
        QType::Q6K => blocks::<QK_K, BlockQ6K>(bytes, out),
        QType::Q8K => blocks::<QK_K, BlockQ8K>(bytes, out),
        QType::IQ4NL => blocks::<32, BlockIQ4NL>(bytes, out),
        QType::IQ4XS => blocks::<QK_K, BlockIQ4XS>(bytes, out),
        _ => {
            return Err(QuantError::Unsupported {
                qtype,
                what: "dequantize",
            })
        }
    }
    Ok(())
}

/// Whether [`dequantize_into`] handles `qtype`.
pub fn can_dequantize(qtype: QType) -> bool {
    use QType::*;
    matches!(
        qtype,
        F32 | F16 | BF16 | Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q8_0 | Q8_1 | Q2K | Q3K | Q4K | Q5K | Q6K | Q8K | IQ4NL | IQ4XS
    )
}

/// One block type; lengths were checked by the caller.
fn blocks<const QK: usize, B: Dequantize<QK>>(bytes: &[u8], out: &mut [f32]) {
    let blocks: &[B] = cast_blocks(bytes).unwrap_or(&[]);
    let (chunks, _) = out.as_chunks_mut::<QK>();
    debug_assert_eq!(blocks.len(), chunks.len(), "{}", B::QTYPE);
    let run = |chunks: &mut [[f32; QK]], blocks: &[B]| {
        for (o, b) in chunks.iter_mut().zip(blocks) {
            b.dequantize(o);
        }
    };
    if out_len(chunks.len(), QK) >= PAR_MIN_ELEMS {
        let per_task = (TASK_ELEMS / QK).max(1);
        chunks
            .par_chunks_mut(per_task)
            .zip(blocks.par_chunks(per_task))
            .for_each(|(o, b)| run(o, b));
    } else {
        run(chunks, blocks);
    }
}

fn out_len(n_blocks: usize, qk: usize) -> usize {
    n_blocks.saturating_mul(qk)
}

/// Plain element types: one value per `N` bytes.
fn plain<const N: usize>(bytes: &[u8], out: &mut [f32], f: impl Fn([u8; N]) -> f32 + Sync) {
    let (src, _) = bytes.as_chunks::<N>();
    let run = |o: &mut [f32], s: &[[u8; N]]| {
        for (o, &s) in o.iter_mut().zip(s) {
            *o = f(s);
        }
    };
    if out.len() >= PAR_MIN_ELEMS {
        out.par_chunks_mut(TASK_ELEMS)
            .zip(src.par_chunks(TASK_ELEMS))
            .for_each(|(o, s)| run(o, s));
    } else {
        run(out, src);
    }
}
