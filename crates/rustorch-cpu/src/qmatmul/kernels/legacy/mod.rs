//! 32-value block types (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1, IQ4_NL)
//! against Q8_0 or Q8_1 activations.
//!
//! Q4_0, Q5_0, Q8_0, Q8_1 and IQ4_NL weights pair with Q8_0 activations;
//! Q4_1 and Q5_1 with Q8_1, whose `s = d * sum(q)` turns the weight's
//! offset `m` into one product per block (`m_w * s_a`). Q8_1 weights
//! (not a llama.cpp matmul type) ignore their own `s`.
//!
//! Every level computes, per block, an exact integer dot product of the
//! weight quants with the activation quants and scales it by
//! `d_w * d_a` in f32. Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 and IQ4_NL follow
//! llama.cpp's x86 float order at every level, bit for bit (`ggml_exact`,
//! `ggml_q8_0`, `ggml_iq4_nl`; with AVX-512 VNNI the four-output matvec
//! and batch kernels of `exact512` and the four-by-four batch kernel of
//! `tile512`). For Q8_1 (no llama.cpp matmul type), `scalar` follows the
//! generic `ggml_vec_dot_*` float operations; its SIMD levels keep the
//! integer parts exact but sum the scaled partial products in another
//! order. (Q4_0 and IQ4_NL weights that llama.cpp repacks take
//! `ggml_repack`'s order instead.)

use super::{DotColsFn, DotFn, DotRowsFn, Tiles};
use crate::qmatmul::Isa;
use rustorch_core::quant::QType;

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod exact512;
mod ggml_exact;
mod ggml_iq4_nl;
mod ggml_q8_0;
mod scalar;
#[cfg(test)]
mod tests;
#[cfg(target_arch = "x86_64")]
mod tile512;
#[cfg(target_arch = "x86_64")]
mod vnni;

pub(super) fn kernel(qtype: QType, isa: Isa) -> Option<DotFn> {
    use QType::*;
    let k: DotFn = match isa {
        Isa::Scalar => match qtype {
            Q4_0 => ggml_exact::dot_scalar::<W4_0>,
            Q4_1 => ggml_exact::dot_scalar::<W4_1>,
            Q5_0 => ggml_exact::dot_scalar::<W5_0>,
            Q5_1 => ggml_exact::dot_scalar::<W5_1>,
            Q8_0 => ggml_q8_0::dot_scalar,
            Q8_1 => scalar::dot_q8_1,
            IQ4NL => ggml_iq4_nl::dot_scalar,
            _ => return None,
        },
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => match qtype {
            Q4_0 => ggml_exact::dot_avx2::<W4_0>,
            Q4_1 => ggml_exact::dot_avx2::<W4_1>,
            Q5_0 => ggml_exact::dot_avx2::<W5_0>,
            Q5_1 => ggml_exact::dot_avx2::<W5_1>,
            Q8_0 => ggml_exact::dot_avx2::<W8_0>,
            Q8_1 => avx2::dot::<W8_1>,
            IQ4NL => ggml_iq4_nl::dot_avx2,
            _ => return None,
        },
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512Vnni => match qtype {
            Q4_0 => ggml_exact::dot_avx2::<W4_0>,
            Q4_1 => ggml_exact::dot_avx2::<W4_1>,
            Q5_0 => ggml_exact::dot_avx2::<W5_0>,
            Q5_1 => ggml_exact::dot_avx2::<W5_1>,
            Q8_0 => ggml_exact::dot_avx2::<W8_0>,
            Q8_1 => vnni::dot::<W8_1>,
            IQ4NL => ggml_iq4_nl::dot_avx2,
            _ => return None,
        },
        // AMX (and other architectures): `find` falls back a level.
        _ => return None,
    };
    Some(k)
}

/// The kernel at exactly `isa` for products of two or more activation
/// rows where llama.cpp computes those in another order than its
/// `vec_dot` (IQ4_NL: tinyBLAS sums every block into one accumulator, as
/// for Q4_0, where `ggml_vec_dot_iq4_nl_q8_0` alternates two); `None`
/// where `kernel` serves both.
pub(super) fn batch_kernel(qtype: QType, isa: Isa) -> Option<DotFn> {
    let k: DotFn = match (qtype, isa) {
        (QType::IQ4NL, Isa::Scalar) => ggml_exact::dot_scalar::<WIq4Nl>,
        #[cfg(target_arch = "x86_64")]
        (QType::IQ4NL, Isa::Avx2 | Isa::Avx512Vnni) => ggml_exact::dot_avx2::<WIq4Nl>,
        _ => return None,
    };
    Some(k)
}

/// The one-weight-row, four-activation-row kernel at exactly `isa`, if
/// any; its results equal four calls of `batch_kernel(qtype, isa)` (or
/// `kernel` where that is `None`) bit for bit.
pub(super) fn rows_kernel(qtype: QType, isa: Isa) -> Option<DotRowsFn> {
    use QType::*;
    let k: DotRowsFn = match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => match qtype {
            Q4_0 => ggml_exact::dot_rows_avx2::<W4_0>,
            Q4_1 => ggml_exact::dot_rows_avx2::<W4_1>,
            Q5_0 => ggml_exact::dot_rows_avx2::<W5_0>,
            Q5_1 => ggml_exact::dot_rows_avx2::<W5_1>,
            Q8_0 => ggml_exact::dot_rows_avx2::<W8_0>,
            Q8_1 => avx2::dot4::<W8_1>,
            IQ4NL => ggml_exact::dot_rows_avx2::<WIq4Nl>,
            _ => return None,
        },
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512Vnni => match qtype {
            Q4_0 => exact512::dot_rows::<W4_0>,
            Q4_1 => exact512::dot_rows::<W4_1>,
            Q5_0 => exact512::dot_rows::<W5_0>,
            Q5_1 => exact512::dot_rows::<W5_1>,
            Q8_0 => exact512::dot_rows::<W8_0>,
            Q8_1 => vnni::dot4::<W8_1>,
            IQ4NL => exact512::dot_rows::<WIq4Nl>,
            _ => return None,
        },
        _ => return None,
    };
    Some(k)
}

/// Four weight rows against one activation row at exactly `isa`, if
/// any: `out[r]` is the dot product of `w[r]` with `a`, equal bit for bit
/// to `kernel(qtype, isa)` on that pair.
pub(super) fn cols_kernel(qtype: QType, isa: Isa) -> Option<DotColsFn> {
    use QType::*;
    let k: DotColsFn = match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512Vnni => match qtype {
            Q4_0 => exact512::dot_cols::<W4_0>,
            Q4_1 => exact512::dot_cols::<W4_1>,
            Q5_0 => exact512::dot_cols::<W5_0>,
            Q5_1 => exact512::dot_cols::<W5_1>,
            Q8_0 => exact512::dot_cols::<W8_0>,
            _ => return None,
        },
        _ => return None,
    };
    Some(k)
}

/// The batch tiles at exactly `isa`, if any: four weight rows against
/// four (`DotTileFn`) and eight (`DotTile8Fn`) activation rows, where
/// `out[r][i]` equals `batch_kernel(qtype, isa)` (or `kernel`) on `w[r]`,
/// `a[i]` bit for bit, with the packer of their activation pairs.
pub(super) fn tile_kernels(qtype: QType, isa: Isa) -> Option<Tiles> {
    #[cfg(target_arch = "x86_64")]
    fn of<T: tile512::Broadcast>() -> Tiles {
        Tiles {
            tile4: tile512::dot_tile::<T>,
            tile8: tile512::dot_tile8::<T>,
            pack: tile512::pack_pair::<T>,
        }
    }
    use QType::*;
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512Vnni => match qtype {
            Q4_0 => Some(of::<W4_0>()),
            Q4_1 => Some(of::<W4_1>()),
            Q5_0 => Some(of::<W5_0>()),
            Q5_1 => Some(of::<W5_1>()),
            Q8_0 => Some(of::<W8_0>()),
            IQ4NL => Some(of::<WIq4Nl>()),
            _ => None,
        },
        _ => None,
    }
}

/// Two activation rows' block as the batch tiles read it (`tile512`):
/// both rows' quants (row `2p` in bytes 0..32, row `2p + 1` in 32..64),
/// the weight type's offset correction `-OFF * (sum of the lane's four
/// quants)` for each of the 16 lanes, and each row's scale as f32 over its
/// eight lanes.
#[repr(C, align(64))]
#[derive(Clone, Copy)]
pub(crate) struct ActPair {
    qs: [u8; 64],
    neg_corr: [i32; 16],
    d: [f32; 16],
}

impl ActPair {
    /// A placeholder that packing overwrites.
    pub(crate) const EMPTY: Self = Self {
        qs: [0; 64],
        neg_corr: [0; 16],
        d: [0.0; 16],
    };
}

/// Where a weight type keeps its fields, and which activation type it
/// meets; the SIMD drivers read blocks through raw pointers with these
/// offsets (the block structs in `blocks.rs` have the same layout).
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(super) trait Layout {
    /// Bytes per weight block.
    const W_BYTES: usize;
    /// Whether the weight has an offset `m` (at byte 2) and so meets Q8_1
    /// activations (34 + 2 bytes, `s` at byte 2, quants at byte 4);
    /// otherwise the activations are Q8_0 (quants at byte 2).
    const MIN: bool;
    const A_BYTES: usize = if Self::MIN { 36 } else { 34 };
    const A_QS: usize = if Self::MIN { 4 } else { 2 };
}

/// Marker types for the weight types, implemented by each SIMD level.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(super) struct W4_0;
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(super) struct W4_1;
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(super) struct W5_0;
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(super) struct W5_1;
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(super) struct W8_0;
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(super) struct W8_1;
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(super) struct WIq4Nl;

impl Layout for W4_0 {
    const W_BYTES: usize = 18;
    const MIN: bool = false;
}
impl Layout for W4_1 {
    const W_BYTES: usize = 20;
    const MIN: bool = true;
}
impl Layout for W5_0 {
    const W_BYTES: usize = 22;
    const MIN: bool = false;
}
impl Layout for W5_1 {
    const W_BYTES: usize = 24;
    const MIN: bool = true;
}
impl Layout for W8_0 {
    const W_BYTES: usize = 34;
    const MIN: bool = false;
}
impl Layout for W8_1 {
    const W_BYTES: usize = 36;
    const MIN: bool = false;
}
impl Layout for WIq4Nl {
    const W_BYTES: usize = 18;
    const MIN: bool = false;
}

// The offsets above must agree with the block structs.
const _: () = {
    use rustorch_core::quant::blocks::*;
    use std::mem::size_of;
    assert!(size_of::<BlockQ4_0>() == W4_0::W_BYTES);
    assert!(size_of::<BlockQ4_1>() == W4_1::W_BYTES);
    assert!(size_of::<BlockQ5_0>() == W5_0::W_BYTES);
    assert!(size_of::<BlockQ5_1>() == W5_1::W_BYTES);
    assert!(size_of::<BlockQ8_0>() == W8_0::W_BYTES);
    assert!(size_of::<BlockQ8_1>() == W8_1::W_BYTES);
    assert!(size_of::<BlockIQ4NL>() == WIq4Nl::W_BYTES);
    assert!(size_of::<BlockQ8_0>() == 34 && size_of::<BlockQ8_1>() == 36);
};

/// The number of blocks in a weight row if `a` is the matching activation
/// row; `None` otherwise (the driver never passes such rows, so kernels
/// answer NaN instead of reading out of bounds).
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
#[inline(always)]
fn blocks<T: Layout>(w: &[u8], a: &[u8]) -> Option<usize> {
    let nb = w.len() / T::W_BYTES;
    (w.len().is_multiple_of(T::W_BYTES) && a.len() == nb * T::A_BYTES).then_some(nb)
}

/// `blocks` for one weight row and four activation rows.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
#[inline(always)]
fn blocks4<T: Layout>(w: &[u8], a: &[&[u8]; 4]) -> Option<usize> {
    let nb = blocks::<T>(w, a[0])?;
    a[1..].iter().all(|r| r.len() == a[0].len()).then_some(nb)
}
