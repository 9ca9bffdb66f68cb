//! Floating storage types as the normalization and attention kernels see
//! them.
//!
//! Each storage type names the type it computes in (`FloatElem::Acc`): f32
//! for f16, bf16 and f32, f64 for f64. Kernels convert a row at a time into
//! the compute type, work there with the primitives of `Real`, and round
//! once when storing, which is what PyTorch's CPU kernels do for half
//! types. For f32 and f64 the conversion is the identity and `as_acc` lets
//! kernels skip the copy.

use crate::copy::input_slice;
use crate::{CpuInput, StorageElement};
use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};
use rustorch_core::error::BackendError;
use rustorch_core::op::Op;
use std::borrow::Cow;

pub(crate) use super::real::Real;

/// A floating storage type and the type it computes in.
pub(crate) trait FloatElem: StorageElement + Send + Sync {
    type Acc: Real;
    /// The row itself when the storage type is the compute type.
    fn as_acc(xs: &[Self]) -> Option<&[Self::Acc]>;
    fn as_acc_mut(xs: &mut [Self]) -> Option<&mut [Self::Acc]>;
    /// Widens a row into `dst` (same length).
    fn load_row(src: &[Self], dst: &mut [Self::Acc]);
    /// Rounds a row into `dst` (same length), once per element.
    fn store_row(src: &[Self::Acc], dst: &mut [Self]);
    fn vec_to_acc(v: Vec<Self>) -> Vec<Self::Acc>;
}

impl FloatElem for f32 {
    type Acc = f32;
    fn as_acc(xs: &[f32]) -> Option<&[f32]> {
        Some(xs)
    }
    fn as_acc_mut(xs: &mut [f32]) -> Option<&mut [f32]> {
        Some(xs)
    }
    fn load_row(src: &[f32], dst: &mut [f32]) {
        dst.copy_from_slice(src)
    }
    fn store_row(src: &[f32], dst: &mut [f32]) {
        dst.copy_from_slice(src)
    }
    fn vec_to_acc(v: Vec<f32>) -> Vec<f32> {
        v
    }
}

impl FloatElem for f64 {
    type Acc = f64;
    fn as_acc(xs: &[f64]) -> Option<&[f64]> {
        Some(xs)
    }
    fn as_acc_mut(xs: &mut [f64]) -> Option<&mut [f64]> {
        Some(xs)
    }
    fn load_row(src: &[f64], dst: &mut [f64]) {
        dst.copy_from_slice(src)
    }
    fn store_row(src: &[f64], dst: &mut [f64]) {
        dst.copy_from_slice(src)
    }
    fn vec_to_acc(v: Vec<f64>) -> Vec<f64> {
        v
    }
}

impl FloatElem for f16 {
    type Acc = f32;
    fn as_acc(_: &[f16]) -> Option<&[f32]> {
        None
    }
    fn as_acc_mut(_: &mut [f16]) -> Option<&mut [f32]> {
        None
    }
    fn load_row(src: &[f16], dst: &mut [f32]) {
        // `half` converts 8 lanes at a time with F16C when the CPU has it.
        src.convert_to_f32_slice(dst)
    }
    fn store_row(src: &[f32], dst: &mut [f16]) {
        dst.convert_from_f32_slice(src)
    }
    fn vec_to_acc(v: Vec<f16>) -> Vec<f32> {
        v.to_f32_vec()
    }
}

crate::simd_dispatch! {
    fn bf16_to_f32_row(src: &[bf16], dst: &mut [f32]) {
        for (d, s) in dst.iter_mut().zip(src) {
            *d = f32::from_bits((s.to_bits() as u32) << 16);
        }
    }
}

crate::simd_dispatch! {
    /// Round to nearest even, NaN kept quiet: the same bits as
    /// `bf16::from_f32`, written without branches so it vectorizes.
    fn f32_to_bf16_row(src: &[f32], dst: &mut [bf16]) {
        for (d, s) in dst.iter_mut().zip(src) {
            let x = s.to_bits();
            let rounded = (x.wrapping_add(0x7fff + ((x >> 16) & 1)) >> 16) as u16;
            let nan = ((x >> 16) | 0x0040) as u16;
            *d = bf16::from_bits(if (x & 0x7fff_ffff) > 0x7f80_0000 { nan } else { rounded });
        }
    }
}

impl FloatElem for bf16 {
    type Acc = f32;
    fn as_acc(_: &[bf16]) -> Option<&[f32]> {
        None
    }
    fn as_acc_mut(_: &mut [bf16]) -> Option<&mut [f32]> {
        None
    }
    fn load_row(src: &[bf16], dst: &mut [f32]) {
        bf16_to_f32_row(src, dst)
    }
    fn store_row(src: &[f32], dst: &mut [bf16]) {
        f32_to_bf16_row(src, dst)
    }
    fn vec_to_acc(v: Vec<bf16>) -> Vec<f32> {
        let mut out = vec![0f32; v.len()];
        bf16_to_f32_row(&v, &mut out);
        out
    }
}

/// An input's elements, contiguous, in the compute type of `T` (borrowed
/// when no conversion or gather is needed).
pub(crate) fn acc_input<'a, T: FloatElem>(op: &Op, input: CpuInput<'a>) -> Result<Cow<'a, [T::Acc]>, BackendError> {
    Ok(match input_slice::<T>(op, input)? {
        Cow::Borrowed(s) => match T::as_acc(s) {
            Some(a) => Cow::Borrowed(a),
            None => {
                let mut v = vec![T::Acc::ZERO; s.len()];
                T::load_row(s, &mut v);
                Cow::Owned(v)
            }
        },
        Cow::Owned(v) => Cow::Owned(T::vec_to_acc(v)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bf16_rounding_matches_half() {
        let vals = [
            0.0f32,
            -0.0,
            1.0,
            1.003_906_3,
            1.011_718_8,
            std::f32::consts::PI,
            -2.7182817,
            1e-40,
            f32::MAX,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            65504.0,
            1.0 + f32::EPSILON,
        ];
        let mut out = vec![bf16::ZERO; vals.len()];
        f32_to_bf16_row(&vals, &mut out);
        for (v, o) in vals.iter().zip(&out) {
            assert_eq!(o.to_bits(), bf16::from_f32(*v).to_bits(), "{v}");
        }
        let mut back = vec![0f32; vals.len()];
        bf16_to_f32_row(&out, &mut back);
        for (o, b) in out.iter().zip(&back) {
            assert_eq!(o.to_f32().to_bits(), b.to_bits());
        }
    }
}
