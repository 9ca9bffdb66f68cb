//! Data movement: strided copies, dtype casts, concatenation, and the
//! helpers other kernels use to read inputs of any layout.

use super::{unsupported_dtype, CpuInput, CpuResult, CpuStorage, StorageElement};
use half::{bf16, f16};
use rayon::prelude::*;
use rustorch_core::dtype::{DType, WithDType, C64};
use rustorch_core::error::BackendError;
use rustorch_core::layout::{Layout, StridedBlocks};
use rustorch_core::op::{Op, TensorMeta};
use rustorch_core::{with_cpu_storage, with_dtype};
use std::borrow::Cow;

/// Below this many elements, work stays on the calling thread.
pub(crate) const PAR_THRESHOLD: usize = 1 << 15;

pub fn execute(op: &Op, inputs: &[CpuInput<'_>], outputs: &[TensorMeta]) -> CpuResult {
    match op {
        Op::Copy => {
            let i = inputs[0];
            Ok(vec![
                with_cpu_storage!(i.storage, v, T => CpuStorage::from_vec(gather(v, i.layout))),
            ])
        }
        Op::Cast { to } => Ok(vec![cast(inputs[0], *to)]),
        Op::Cat { dim } => cat(op, inputs, *dim, &outputs[0]),
        _ => Err(BackendError::invalid(op.name(), "not a data-movement op")),
    }
}

/// The elements of a layout, in row-major order, borrowed when they are
/// already contiguous.
pub(crate) fn contiguous<'a, T: Copy + Send + Sync>(data: &'a [T], layout: &Layout) -> Cow<'a, [T]> {
    match layout.contiguous_range() {
        Some(r) => Cow::Borrowed(&data[r]),
        None => Cow::Owned(gather(data, layout)),
    }
}

/// Typed, contiguous view of a CPU input; errors when the dtype differs.
pub(crate) fn input_slice<'a, T: StorageElement + Send + Sync>(
    op: &Op,
    input: CpuInput<'a>,
) -> Result<Cow<'a, [T]>, BackendError> {
    let s = input
        .storage
        .as_slice::<T>()
        .ok_or_else(|| unsupported_dtype(op, input.dtype()))?;
    Ok(contiguous(s, input.layout))
}

/// Copies the elements of a layout into a new contiguous vector.
pub(crate) fn gather<T: Copy + Send + Sync>(data: &[T], layout: &Layout) -> Vec<T> {
    let n = layout.numel();
    match layout.blocks() {
        StridedBlocks::Single { start, len } => data[start..start + len].to_vec(),
        StridedBlocks::Multiple { starts, run_len } => {
            let mut out = Vec::with_capacity(n);
            if run_len == 1 {
                out.extend(starts.map(|i| data[i]));
            } else {
                for s in starts {
                    out.extend_from_slice(&data[s..s + run_len]);
                }
            }
            out
        }
    }
}

/// Converts every element to another dtype, as PyTorch's `.to(dtype)`.
pub(super) fn cast(input: CpuInput<'_>, to: DType) -> CpuStorage {
    if let (CpuStorage::F32(v), DType::F16) = (input.storage, to) {
        return CpuStorage::F16(f32_to_f16(&contiguous(v, input.layout)));
    }
    with_cpu_storage!(input.storage, v, S => {
        let src = contiguous(v, input.layout);
        cast_slice::<S>(&src, to)
    })
}

/// f32 to f16 a slice at a time (`half`'s slice conversion, F16C where the
/// CPU has it, eight values per instruction): the same rounding (to
/// nearest, ties to even) as one value at a time, at a tenth of the cost.
/// Key and value caches take every projected key and value through it.
fn f32_to_f16(src: &[f32]) -> Vec<f16> {
    use half::slice::HalfFloatSliceExt;
    const CHUNK: usize = 1 << 13;
    let mut out = vec![f16::ZERO; src.len()];
    if src.len() >= PAR_THRESHOLD {
        out.par_chunks_mut(CHUNK)
            .zip(src.par_chunks(CHUNK))
            .for_each(|(o, s)| o.convert_from_f32_slice(s));
    } else {
        out.convert_from_f32_slice(src);
    }
    out
}

fn cast_slice<S: CastFrom>(src: &[S], to: DType) -> CpuStorage {
    fn map<S: Copy + Sync, D: Send>(src: &[S], f: impl Fn(S) -> D + Sync + Send) -> Vec<D> {
        if src.len() >= PAR_THRESHOLD {
            src.par_iter().map(|&x| f(x)).collect()
        } else {
            src.iter().map(|&x| f(x)).collect()
        }
    }
    match to {
        DType::Bool => CpuStorage::Bool(map(src, |x| x.to_bool())),
        DType::U8 => CpuStorage::U8(map(src, |x| x.to_i64_wrapping() as u8)),
        DType::I32 => CpuStorage::I32(map(src, |x| x.to_i64_wrapping() as i32)),
        DType::I64 => CpuStorage::I64(map(src, |x| x.to_i64_wrapping())),
        DType::F16 => CpuStorage::F16(map(src, |x| x.to_f16())),
        DType::BF16 => CpuStorage::BF16(map(src, |x| x.to_bf16())),
        DType::F32 => CpuStorage::F32(map(src, |x| x.to_f32_value())),
        DType::F64 => CpuStorage::F64(map(src, |x| x.to_f64_value())),
        DType::C64 => CpuStorage::C64(map(src, |x| x.to_c64())),
    }
}

/// Conversions with PyTorch's semantics: floats truncate toward zero into
/// integers, integers wrap, anything nonzero is true, complex drops its
/// imaginary part when cast to a real type.
trait CastFrom: WithDType {
    fn to_bool(self) -> bool;
    fn to_i64_wrapping(self) -> i64;
    fn to_f64_value(self) -> f64 {
        self.to_f64()
    }
    fn to_f32_value(self) -> f32 {
        self.to_f32()
    }
    /// Through f32, as PyTorch converts every type to half precision.
    fn to_f16(self) -> f16 {
        f16::from_f32(self.to_f32_value())
    }
    fn to_bf16(self) -> bf16 {
        bf16::from_f32(self.to_f32_value())
    }
    fn to_c64(self) -> C64 {
        C64::new(self.to_f32_value(), 0.0)
    }
}

impl CastFrom for bool {
    fn to_bool(self) -> bool {
        self
    }
    fn to_i64_wrapping(self) -> i64 {
        self as i64
    }
}
macro_rules! cast_int {
    ($t:ty) => {
        impl CastFrom for $t {
            fn to_bool(self) -> bool {
                self != 0
            }
            fn to_i64_wrapping(self) -> i64 {
                self as i64
            }
        }
    };
}
cast_int!(u8);
cast_int!(i32);
cast_int!(i64);
macro_rules! cast_float {
    ($t:ty) => {
        impl CastFrom for $t {
            fn to_bool(self) -> bool {
                self.to_f64() != 0.0
            }
            fn to_i64_wrapping(self) -> i64 {
                // `as` saturates and maps NaN to 0, where C (and PyTorch) are
                // undefined; saturating is the sane choice.
                self.to_f64() as i64
            }
        }
    };
}
cast_float!(f64);
cast_float!(f16);
cast_float!(bf16);
impl CastFrom for f32 {
    fn to_bool(self) -> bool {
        self != 0.0
    }
    fn to_i64_wrapping(self) -> i64 {
        self as i64
    }
    fn to_f16(self) -> f16 {
        f16::from_f32(self)
    }
    fn to_bf16(self) -> bf16 {
        bf16::from_f32(self)
    }
}
impl CastFrom for C64 {
    fn to_bool(self) -> bool {
        self.re != 0.0 || self.im != 0.0
    }
    fn to_i64_wrapping(self) -> i64 {
        self.re as i64
    }
    fn to_f32_value(self) -> f32 {
        self.re
    }
    fn to_f64_value(self) -> f64 {
        self.re as f64
    }
    fn to_c64(self) -> C64 {
        self
    }
}

fn cat(op: &Op, inputs: &[CpuInput<'_>], dim: usize, out: &TensorMeta) -> CpuResult {
    let dtype = out.dtype;
    with_dtype!(dtype, T => {
        let parts = inputs
            .iter()
            .map(|i| input_slice::<T>(op, *i))
            .collect::<Result<Vec<_>, _>>()?;
        let outer: usize = out.shape.dims()[..dim].iter().product();
        let inner: usize = out.shape.dims()[dim + 1..].iter().product();
        let mut result: Vec<T> = Vec::with_capacity(out.shape.numel());
        for o in 0..outer {
            for (p, i) in parts.iter().zip(inputs) {
                let chunk = i.dims()[dim] * inner;
                result.extend_from_slice(&p[o * chunk..(o + 1) * chunk]);
            }
        }
        Ok(vec![CpuStorage::from_vec(result)])
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The slice conversion gives every value the bits of the one-value
    /// conversion: ties, subnormals, overflow to infinity, signed zeros,
    /// infinities (NaNs stay NaNs), in a short slice and a parallel one.
    #[test]
    fn f32_to_f16_slices_round_as_single_values() {
        let mut v: Vec<f32> = vec![
            0.0,
            -0.0,
            1.0,
            -2.5,
            65504.0,
            65520.0,
            1e9,
            -1e9,
            f32::INFINITY,
            f32::NEG_INFINITY,
            5.960_464_5e-8,
            2.980_232_2e-8,
            1e-10,
            1.000_488_3,
            1.000_976_6,
            f32::NAN,
        ];
        let mut s = 0x1234_5678u32;
        while v.len() < 3 * PAR_THRESHOLD + 17 {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            v.push(f32::from_bits(s));
        }
        for n in [16, v.len()] {
            let got = f32_to_f16(&v[..n]);
            for (x, y) in v[..n].iter().zip(&got) {
                let want = f16::from_f32(*x);
                if want.is_nan() {
                    assert!(y.is_nan(), "{x:e}");
                } else {
                    assert_eq!(y.to_bits(), want.to_bits(), "{x:e}");
                }
            }
        }
    }
}
