//! GGML block layouts as `#[repr(C)]` structs.
//!
//! Every field is a byte array (`u8`/`i8`), so each block has alignment 1,
//! no padding, and every bit pattern is a valid value: a byte slice of the
//! right length can be viewed as a slice of blocks without copying, whatever
//! its address (tensors in a memory-mapped GGUF file are not aligned to the
//! block's natural alignment). Multi-byte fields are little-endian, as in
//! GGUF files, and are read through accessors.

use super::QType;
use half::f16;

/// Elements in a K-quant super-block.
pub const QK_K: usize = 256;

/// A GGML block type.
///
/// # Safety
/// Implementors must be `#[repr(C)]` structs made only of `u8`/`i8` arrays
/// (alignment 1, no padding, any bit pattern valid) whose size is
/// `QTYPE.type_size()`. The `block!` macro below checks the size and the
/// alignment at compile time.
pub unsafe trait Block: Copy + Send + Sync + 'static {
    const QTYPE: QType;
}

/// Blocks that decode `QK` values.
pub trait Dequantize<const QK: usize>: Block {
    fn dequantize(&self, out: &mut [f32; QK]);
}

/// Blocks that can be made from `QK` values with llama.cpp's reference
/// algorithm (`quantize_row_*_ref`).
pub trait Quantize<const QK: usize>: Block {
    fn quantize(x: &[f32; QK]) -> Self;
}

/// Views `bytes` as blocks; `None` when the length is not a whole number
/// of blocks.
pub fn cast_blocks<B: Block>(bytes: &[u8]) -> Option<&[B]> {
    let size = std::mem::size_of::<B>();
    if !bytes.len().is_multiple_of(size) {
        return None;
    }
    // SAFETY: `B` has alignment 1 and no invalid bit patterns (trait
    // contract, checked at compile time by `block!`), and the slice covers
    // exactly `len / size` blocks of the borrowed bytes.
    Some(unsafe { std::slice::from_raw_parts(bytes.as_ptr().cast::<B>(), bytes.len() / size) })
}

/// Mutable version of [`cast_blocks`].
pub fn cast_blocks_mut<B: Block>(bytes: &mut [u8]) -> Option<&mut [B]> {
    let size = std::mem::size_of::<B>();
    if !bytes.len().is_multiple_of(size) {
        return None;
    }
    // SAFETY: as in `cast_blocks`; the exclusive borrow is carried over.
    Some(unsafe { std::slice::from_raw_parts_mut(bytes.as_mut_ptr().cast::<B>(), bytes.len() / size) })
}

/// The bytes of a slice of blocks.
pub fn blocks_as_bytes<B: Block>(blocks: &[B]) -> &[u8] {
    // SAFETY: `B` is plain bytes without padding (trait contract).
    unsafe { std::slice::from_raw_parts(blocks.as_ptr().cast::<u8>(), std::mem::size_of_val(blocks)) }
}

/// Exact f16 to f32, branch-free so that slices of it vectorize. NaN
/// payloads are kept as they are (as numpy does; `half` sets the quiet
/// bit).
#[inline]
pub fn f16_to_f32(b: [u8; 2]) -> f32 {
    f16_bits_to_f32(u16::from_le_bytes(b))
}

#[inline]
pub fn f16_bits_to_f32(h: u16) -> f32 {
    let h = h as u32;
    let sign = (h & 0x8000) << 16;
    let em = h & 0x7fff;
    // Exponent and mantissa moved into f32 position are the value times
    // 2^-112 (subnormal halves included); the product is exact.
    let finite = (f32::from_bits(em << 13) * f32::from_bits(0x7780_0000)).to_bits();
    let special = 0x7f80_0000 | ((em & 0x3ff) << 13);
    f32::from_bits(sign | if em >= 0x7c00 { special } else { finite })
}

/// Round to nearest even, as GGML_FP32_TO_FP16 and numpy's astype(float16).
#[inline]
pub fn f32_to_f16(x: f32) -> [u8; 2] {
    f16::from_f32(x).to_bits().to_le_bytes()
}

macro_rules! block {
    ($(#[$doc:meta])* $name:ident, $qtype:expr, { $($field:ident : $ty:ty),* $(,)? }) => {
        $(#[$doc])*
        #[repr(C)]
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub struct $name {
            $(pub $field: $ty),*
        }

        // SAFETY: byte-array fields only; size and alignment asserted below.
        unsafe impl Block for $name {
            const QTYPE: QType = $qtype;
        }

        const _: () = {
            assert!(std::mem::size_of::<$name>() == $qtype.type_size());
            assert!(std::mem::align_of::<$name>() == 1);
        };

        impl Default for $name {
            fn default() -> Self {
                // SAFETY: byte arrays only, so all-zero bytes are a valid
                // value (zero scales, zero quants).
                unsafe { std::mem::zeroed() }
            }
        }
    };
}

block!(
    /// 32 values: `d * (q - 8)`, q in 4 bits. Byte j holds elements j (low
    /// nibble) and j + 16 (high nibble).
    BlockQ4_0, QType::Q4_0, { d: [u8; 2], qs: [u8; 16] }
);
block!(
    /// 32 values: `d * q + m`, q in 4 bits.
    BlockQ4_1, QType::Q4_1, { d: [u8; 2], m: [u8; 2], qs: [u8; 16] }
);
block!(
    /// 32 values: `d * (q - 16)`, q in 5 bits; bit j of `qh` is the fifth
    /// bit of element j.
    BlockQ5_0, QType::Q5_0, { d: [u8; 2], qh: [u8; 4], qs: [u8; 16] }
);
block!(
    /// 32 values: `d * q + m`, q in 5 bits.
    BlockQ5_1, QType::Q5_1, { d: [u8; 2], m: [u8; 2], qh: [u8; 4], qs: [u8; 16] }
);
block!(
    /// 32 values: `d * q`, q in i8.
    BlockQ8_0, QType::Q8_0, { d: [u8; 2], qs: [i8; 32] }
);
block!(
    /// 32 values: `d * q`, with `s = d * sum(q)` kept for the dot products
    /// of the Q4_1/Q5_1 weight types (an activation type, never in files).
    BlockQ8_1, QType::Q8_1, { d: [u8; 2], s: [u8; 2], qs: [i8; 32] }
);
block!(
    /// 256 values in 16 groups of 16: `d * sc * q - dmin * m`, q in 2 bits,
    /// sc and m in 4 bits each (low and high nibble of `scales`).
    BlockQ2K, QType::Q2K, { scales: [u8; 16], qs: [u8; 64], d: [u8; 2], dmin: [u8; 2] }
);
block!(
    /// 256 values in 16 groups of 16: `d * (sc - 32) * (q - 4 * !hbit)`,
    /// q in 2 bits plus a high bit in `hmask`, sc in 6 bits packed in 12 bytes.
    BlockQ3K, QType::Q3K, { hmask: [u8; 32], qs: [u8; 64], scales: [u8; 12], d: [u8; 2] }
);
block!(
    /// 256 values in 8 groups of 32: `d * sc * q - dmin * m`, q in 4 bits,
    /// sc and m in 6 bits packed in 12 bytes.
    BlockQ4K, QType::Q4K, { d: [u8; 2], dmin: [u8; 2], scales: [u8; 12], qs: [u8; 128] }
);
block!(
    /// As Q4_K with a fifth bit per value in `qh`.
    BlockQ5K, QType::Q5K, { d: [u8; 2], dmin: [u8; 2], scales: [u8; 12], qh: [u8; 32], qs: [u8; 128] }
);
block!(
    /// 256 values in 16 groups of 16: `d * sc * (q - 32)`, q in 6 bits (4
    /// in `ql`, 2 in `qh`), sc in i8.
    BlockQ6K, QType::Q6K, { ql: [u8; 128], qh: [u8; 64], scales: [i8; 16], d: [u8; 2] }
);
block!(
    /// 256 values: `d * q` with an f32 `d`, plus the sums of each group of
    /// 16 quants (`bsums`, i16) that the K-quant dot products use for their
    /// min terms. An activation type, never in files.
    BlockQ8K, QType::Q8K, { d: [u8; 4], qs: [i8; 256], bsums: [[u8; 2]; 16] }
);
block!(
    /// 32 values: `d * KVALUES_IQ4NL[q]`, q in 4 bits.
    BlockIQ4NL, QType::IQ4NL, { d: [u8; 2], qs: [u8; 16] }
);
block!(
    /// 256 values in 8 groups of 32: `d * (ls - 32) * KVALUES_IQ4NL[q]`,
    /// ls in 6 bits (4 in `scales_l`, 2 in `scales_h`).
    BlockIQ4XS, QType::IQ4XS, { d: [u8; 2], scales_h: [u8; 2], scales_l: [u8; 4], qs: [u8; 128] }
);

/// The 16 non-linear levels of IQ4_NL and IQ4_XS.
pub const KVALUES_IQ4NL: [i8; 16] = [-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113];

impl BlockQ8K {
    #[inline]
    pub fn scale(&self) -> f32 {
        f32::from_le_bytes(self.d)
    }

    #[inline]
    pub fn bsum(&self, group: usize) -> i16 {
        i16::from_le_bytes(self.bsums[group])
    }
}

/// The 6-bit scale and min of group `j` (0..8) of a Q4_K/Q5_K block
/// (llama.cpp's `get_scale_min_k4`): groups 0..4 keep their low 6 bits in
/// bytes j and j + 4; groups 4..8 keep 4 bits in byte j + 4 and their top
/// two bits in the spare top bits of bytes j - 4 and j.
#[inline]
pub fn scale_min_k4(j: usize, q: &[u8; 12]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

/// The 16 signed 6-bit scales of a Q3_K block: low nibbles in bytes 0..8
/// (groups 0..8 low, 8..16 high nibble), top two bits in bytes 8..12.
#[inline]
pub fn q3k_scales(s: &[u8; 12]) -> [i8; 16] {
    let mut out = [0i8; 16];
    for (j, o) in out.iter_mut().enumerate() {
        let low = if j < 8 { s[j] & 0xF } else { s[j - 8] >> 4 };
        let high = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
        *o = (low | (high << 4)) as i8 - 32;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f16_conversion_is_exact_for_every_value() {
        for h in 0..=u16::MAX {
            let want = f16::from_bits(h).to_f32();
            let got = f16_bits_to_f32(h);
            if want.is_nan() {
                // Same sign and payload, without forcing the quiet bit.
                assert_eq!(
                    got.to_bits(),
                    ((h as u32 & 0x8000) << 16) | 0x7f80_0000 | ((h as u32 & 0x3ff) << 13)
                );
            } else {
                assert_eq!(got.to_bits(), want.to_bits(), "{h:#06x}");
            }
        }
    }

    #[test]
    fn casts_check_lengths() {
        let bytes = [0u8; 36];
        assert_eq!(cast_blocks::<BlockQ4_0>(&bytes).map(|b| b.len()), Some(2));
        assert!(cast_blocks::<BlockQ4_0>(&bytes[..35]).is_none());
        // Unaligned starts are fine: alignment is 1.
        assert_eq!(cast_blocks::<BlockQ4_0>(&bytes[..19][1..]).map(|b| b.len()), Some(1));
        let blocks = [BlockQ8_0::default(); 3];
        assert_eq!(blocks_as_bytes(&blocks).len(), 102);
    }

    #[test]
    fn scale_unpacking_matches_the_bit_layout() {
        // Group 5 of a Q4_K block: low 4 bits of sc/m in byte 9, top bits
        // in bytes 1 and 5.
        let mut q = [0u8; 12];
        q[9] = 0xA5;
        q[1] = 0b11 << 6;
        q[5] = 0b10 << 6;
        assert_eq!(scale_min_k4(5, &q), (0x5 | (3 << 4), 0xA | (2 << 4)));
        let mut s = [0u8; 12];
        s[3] = 0x70; // group 11 low nibble 7
        s[11] = 0b10 << 4; // group 11 = 8 + 3: byte 8 + 3, shift 2 * (11 / 4) = 4
        assert_eq!(q3k_scales(&s)[11], (7 | (2 << 4)) - 32);
    }
}
