//! Activation rows quantized to a weight type's dot type, the way
//! llama.cpp's x86 CPU backend does it (Q8_0/Q8_1 with its AVX variant,
//! the others with the reference quantizer), so that integer dot products
//! see the same operands as llama.cpp's and results can match it closely.

use rayon::prelude::*;
use rustorch_core::quant::blocks::{self, BlockQ8K, BlockQ8_0, BlockQ8_1, QK_K};
use rustorch_core::quant::{quantize_into, QType, QuantError};

crate::simd_dispatch! {
    /// `rustorch_core::quant::q8k_block` compiled for the widest SIMD level.
    fn q8k_block_simd(x: &[f32; QK_K], qs: &mut [i8; QK_K], bsums: &mut [i16; 16]) -> Option<f32> {
        rustorch_core::quant::q8k_block(x, qs, bsums)
    }
}

/// One row as Q8_K: the reference quantizer's blocks (`BlockQ8K`), their
/// quants computed at the CPU's SIMD width.
fn encode_q8k(x: &[f32], out: &mut [u8]) {
    let blocks: &mut [BlockQ8K] = blocks::cast_blocks_mut(out).unwrap_or(&mut []);
    for (b, x) in blocks.iter_mut().zip(x.as_chunks::<QK_K>().0) {
        *b = BlockQ8K::quantize_with(x, q8k_block_simd);
    }
}

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
            QType::F32 | QType::F16 | QType::BF16 => {
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
            QType::Q8K => encode_q8k,
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

    /// Rows given as their encoded bytes, for tests that feed kernels
    /// quants no quantizer produces together (extremes, random scales).
    #[cfg(test)]
    pub(crate) fn from_bytes(dot_type: QType, rows: usize, cols: usize, bytes: Vec<u8>) -> Option<Self> {
        let row_bytes = dot_type.bytes_for(cols)?;
        (bytes.len() == rows * row_bytes).then_some(QuantizedRows {
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

/// Intel's `maxps`: `a` if `a > b`, else `b` (so `b` when either is NaN).
#[inline(always)]
fn xmax(a: f32, b: f32) -> f32 {
    if a > b {
        a
    } else {
        b
    }
}

/// `cvtps2dq` of an already integral value: out-of-range values and NaN
/// give the "integer indefinite" `i32::MIN`.
#[inline(always)]
fn cvt_i32(f: f32) -> i32 {
    if (-2147483648.0..2147483648.0).contains(&f) {
        f as i32
    } else {
        i32::MIN
    }
}

/// llama.cpp's AVX `quantize_row_q8_0` on one block, operation for
/// operation: amax through its `maxps` tree (which decides which NaN, if
/// any, survives), d = amax / 127, the values scaled by 127 / amax (not
/// 1 / d, as the reference quantizer does), rounded half to even
/// (`_mm256_round_ps`), converted by `cvtps2dq` and saturated to i8 by
/// the two `packs`. Returns the f32 scale (before rounding to f16), the
/// quants and the wrapping sum of the converted i32 values (what
/// `quantize_row_q8_1` multiplies by d). The SIMD version below must give
/// the same bits for every input, NaN and infinities included.
fn q8_0_block(x: &[f32]) -> (f32, [i8; 32], i32) {
    let m: [f32; 8] =
        std::array::from_fn(|l| xmax(xmax(xmax(x[l].abs(), x[8 + l].abs()), x[16 + l].abs()), x[24 + l].abs()));
    let r: [f32; 4] = std::array::from_fn(|l| xmax(m[4 + l], m[l]));
    let amax = xmax(xmax(r[0], r[2]), xmax(r[1], r[3]));
    let d = amax / 127.0;
    let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
    let mut qs = [0i8; 32];
    let mut sum = 0i32;
    for (q, v) in qs.iter_mut().zip(x) {
        let r = cvt_i32((v * id).round_ties_even());
        *q = r.clamp(-128, 127) as i8;
        sum = sum.wrapping_add(r);
    }
    (d, qs, sum)
}

fn encode_q8_0(x: &[f32], out: &mut [u8]) {
    encode::<false>(x, out)
}

/// As Q8_0, plus s = d * sum(q) with the f32 d (llama.cpp's AVX
/// `quantize_row_q8_1`).
fn encode_q8_1(x: &[f32], out: &mut [u8]) {
    encode::<true>(x, out)
}

/// Q8_1 (`WITH_SUM`) or Q8_0 blocks of `x` into `out`, with AVX2 where
/// this CPU has it (the same bits either way).
fn encode<const WITH_SUM: bool>(x: &[f32], out: &mut [u8]) {
    #[cfg(target_arch = "x86_64")]
    if super::Isa::Avx2.is_available() {
        // SAFETY: AVX2, FMA and F16C are available (checked just above);
        // `encode` bounds its writes by `out.len()`.
        unsafe { simd::encode::<WITH_SUM>(x, out) };
        return;
    }
    encode_scalar::<WITH_SUM>(x, out)
}

fn encode_scalar<const WITH_SUM: bool>(x: &[f32], out: &mut [u8]) {
    if WITH_SUM {
        let out = blocks::cast_blocks_mut::<BlockQ8_1>(out).expect("whole Q8_1 blocks");
        for (b, xs) in out.iter_mut().zip(x.chunks_exact(32)) {
            let (d, qs, sum) = q8_0_block(xs);
            *b = BlockQ8_1 {
                d: blocks::f32_to_f16(d),
                s: blocks::f32_to_f16(d * sum as f32),
                qs,
            };
        }
    } else {
        let out = blocks::cast_blocks_mut::<BlockQ8_0>(out).expect("whole Q8_0 blocks");
        for (b, xs) in out.iter_mut().zip(x.chunks_exact(32)) {
            let (d, qs, _) = q8_0_block(xs);
            *b = BlockQ8_0 {
                d: blocks::f32_to_f16(d),
                qs,
            };
        }
    }
}

/// llama.cpp's AVX2 `quantize_row_q8_0` / `quantize_row_q8_1`, with the
/// same intrinsics in the same order (so the same bits as `q8_0_block`,
/// without its libm `rintf` calls).
#[cfg(target_arch = "x86_64")]
mod simd {
    use std::arch::x86_64::*;

    /// The f16 bits of `v`, rounded to nearest even (F16C; the same IEEE
    /// conversion as `blocks::f32_to_f16`).
    #[inline(always)]
    fn f16_bits(v: f32) -> [u8; 2] {
        // SAFETY: only called from `encode`, which enables F16C.
        let h = unsafe { _mm_cvtsi128_si32(_mm_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm_set_ss(v))) };
        (h as u16).to_le_bytes()
    }

    /// Encodes `x` as Q8_1 blocks (`WITH_SUM`) or Q8_0 blocks into `out`.
    ///
    /// # Safety
    /// AVX2, FMA and F16C must be available.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn encode<const WITH_SUM: bool>(x: &[f32], out: &mut [u8]) {
        let bb = if WITH_SUM { 36 } else { 34 };
        let qs_at = if WITH_SUM { 4 } else { 2 };
        let nb = (x.len() / 32).min(out.len() / bb);
        let sign = _mm256_set1_ps(-0.0);
        let perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
        for i in 0..nb {
            // SAFETY: block i < nb: 32 values of `x` from 32 i and `bb`
            // bytes of `out` from bb i.
            unsafe {
                let xp = x.as_ptr().add(32 * i);
                let v0 = _mm256_loadu_ps(xp);
                let v1 = _mm256_loadu_ps(xp.add(8));
                let v2 = _mm256_loadu_ps(xp.add(16));
                let v3 = _mm256_loadu_ps(xp.add(24));
                let mut m = _mm256_andnot_ps(sign, v0);
                m = _mm256_max_ps(m, _mm256_andnot_ps(sign, v1));
                m = _mm256_max_ps(m, _mm256_andnot_ps(sign, v2));
                m = _mm256_max_ps(m, _mm256_andnot_ps(sign, v3));
                let mut m4 = _mm_max_ps(_mm256_extractf128_ps::<1>(m), _mm256_castps256_ps128(m));
                m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
                m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
                let amax = _mm_cvtss_f32(m4);
                let d = amax / 127.0;
                let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
                let mul = _mm256_set1_ps(id);
                let round =
                    |v: __m256| _mm256_cvtps_epi32(_mm256_round_ps::<_MM_FROUND_TO_NEAREST_INT>(_mm256_mul_ps(v, mul)));
                let (i0, i1, i2, i3) = (round(v0), round(v1), round(v2), round(v3));
                let ob = out.as_mut_ptr().add(bb * i);
                ob.cast::<[u8; 2]>().write_unaligned(f16_bits(d));
                if WITH_SUM {
                    let s = _mm256_add_epi32(_mm256_add_epi32(i0, i1), _mm256_add_epi32(i2, i3));
                    let s = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256::<1>(s));
                    let s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
                    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01>(s));
                    let sum = _mm_cvtsi128_si32(s);
                    ob.add(2).cast::<[u8; 2]>().write_unaligned(f16_bits(d * sum as f32));
                }
                let p = _mm256_packs_epi16(_mm256_packs_epi32(i0, i1), _mm256_packs_epi32(i2, i3));
                _mm256_storeu_si256(ob.add(qs_at).cast(), _mm256_permutevar8x32_epi32(p, perm));
            }
        }
    }
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;

    /// Blocks of random values, with special values mixed in (NaN,
    /// infinities, zeros, subnormals, huge and tiny blocks) where the
    /// rounding, saturation and NaN rules of the two versions could part.
    fn cases() -> Vec<f32> {
        let mut s = 0x9e3779b97f4a7c15u64;
        let mut next = || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s
        };
        let specials = [
            f32::NAN,
            -f32::NAN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            0.0,
            -0.0,
            1e-40,
            -3e-39,
            f32::MAX,
            f32::MIN_POSITIVE,
            0.5,
            -2.5,
        ];
        let mut x = Vec::new();
        for block in 0..400 {
            let scale = [1.0f32, 1e-38, 1e-30, 1e30, 3.0][block % 5];
            for _ in 0..32 {
                let r = next();
                let v = if block % 3 == 0 && r % 7 == 0 {
                    specials[(r >> 8) as usize % specials.len()]
                } else {
                    ((r >> 40) as f32 / (1u64 << 23) as f32 - 1.0) * scale
                };
                x.push(v);
            }
        }
        // Values that sit exactly on .5 after scaling (ties to even).
        x.extend((0..32).map(|i| (i as f32 - 16.0) * 0.5 + if i == 0 { 127.0 } else { 0.0 }));
        x
    }

    #[test]
    fn simd_encoding_matches_scalar_bit_for_bit() {
        if !crate::qmatmul::Isa::Avx2.is_available() {
            return;
        }
        let x = cases();
        let nb = x.len() / 32;
        for with_sum in [false, true] {
            let bb = if with_sum { 36 } else { 34 };
            let (mut a, mut b) = (vec![0u8; nb * bb], vec![0u8; nb * bb]);
            if with_sum {
                encode_scalar::<true>(&x, &mut a);
                // SAFETY: AVX2, FMA and F16C checked above; `b` holds nb blocks.
                unsafe { simd::encode::<true>(&x, &mut b) };
            } else {
                encode_scalar::<false>(&x, &mut a);
                // SAFETY: as above.
                unsafe { simd::encode::<false>(&x, &mut b) };
            }
            for (i, (pa, pb)) in a.chunks(bb).zip(b.chunks(bb)).enumerate() {
                assert_eq!(pa, pb, "block {i} (q8_1: {with_sum}): {:?}", &x[32 * i..32 * i + 32]);
            }
        }
    }
}
