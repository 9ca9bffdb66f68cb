//! Convolution and pooling.
//!
//! Convolutions lower to gemm through im2col (and col2im for the
//! transposed convolution), one image and group at a time; pooling runs
//! directly over each channel plane. Work splits over images and groups on
//! rayon threads, or, when there are too few of those, inside each step.
//! f32 and f64 compute natively; f16 and bf16 are widened to f32 and the
//! result is rounded once.

mod conv2d;
mod pool;
mod transpose;

use super::copy::{input_slice, PAR_THRESHOLD};
use super::matmul::{narrow_from_f32, GemmElem};
use super::{unsupported_dtype, CpuInput, CpuResult, CpuStorage, StorageElement};
use crate::simd_dispatch;
use half::{bf16, f16};
use rayon::prelude::*;
use rustorch_core::dtype::DType;
use rustorch_core::error::BackendError;
use rustorch_core::op::{Conv2dParams, Op, Pool2dParams, TensorMeta};
use std::borrow::Cow;
use std::ops::{Add, AddAssign, Div, Mul};

pub fn execute(op: &Op, inputs: &[CpuInput<'_>], outputs: &[TensorMeta]) -> CpuResult {
    let out = outputs
        .first()
        .ok_or_else(|| BackendError::invalid(op.name(), "missing output metadata"))?;
    let kernel = match op {
        Op::Conv1d {
            stride,
            padding,
            dilation,
            groups,
            has_bias,
        } => {
            // A 1-D convolution is a 2-D one over a height-1 image.
            let p = Conv2dParams {
                stride: [1, *stride],
                padding: [0, *padding],
                dilation: [1, *dilation],
                groups: *groups,
            };
            let [n, c, l] = dims::<3>(op, inputs, 0)?;
            let [o, _, k] = dims::<3>(op, inputs, 1)?;
            Kernel::Conv(Geom::conv(op, [n, c, 1, l], [o, 1, k], p, out, *has_bias)?)
        }
        Op::Conv2d { params, has_bias } => {
            let x = dims::<4>(op, inputs, 0)?;
            let [o, _, kh, kw] = dims::<4>(op, inputs, 1)?;
            Kernel::Conv(Geom::conv(op, x, [o, kh, kw], *params, out, *has_bias)?)
        }
        Op::ConvTranspose2d { params, has_bias, .. } => {
            let x = dims::<4>(op, inputs, 0)?;
            let [_, og, kh, kw] = dims::<4>(op, inputs, 1)?;
            let o = og * params.groups;
            Kernel::Transpose(Geom::conv(op, x, [o, kh, kw], *params, out, *has_bias)?)
        }
        Op::MaxPool2d { params } => Kernel::MaxPool(PoolGeom::new(op, dims::<4>(op, inputs, 0)?, *params, out)?),
        Op::AvgPool2d {
            params,
            count_include_pad,
        } => Kernel::AvgPool(
            PoolGeom::new(op, dims::<4>(op, inputs, 0)?, *params, out)?,
            *count_include_pad,
        ),
        _ => return Err(BackendError::invalid(op.name(), "not a convolution or pooling op")),
    };
    let dtype = inputs[0].dtype();
    if inputs.iter().any(|i| i.dtype() != dtype) {
        return Err(BackendError::invalid(op.name(), "inputs have different dtypes"));
    }
    Ok(vec![match dtype {
        DType::F32 => CpuStorage::from_vec(run_native::<f32>(op, inputs, &kernel)?),
        DType::F64 => CpuStorage::from_vec(run_native::<f64>(op, inputs, &kernel)?),
        DType::F16 => CpuStorage::from_vec(run_widened::<f16>(op, inputs, &kernel)?),
        DType::BF16 => CpuStorage::from_vec(run_widened::<bf16>(op, inputs, &kernel)?),
        d => return Err(unsupported_dtype(op, d)),
    }])
}

fn dims<const R: usize>(op: &Op, inputs: &[CpuInput<'_>], i: usize) -> Result<[usize; R], BackendError> {
    inputs
        .get(i)
        .and_then(|x| <[usize; R]>::try_from(x.dims()).ok())
        .ok_or_else(|| BackendError::invalid(op.name(), format!("input {i} must have rank {R}")))
}

/// Sizes of a convolution (or its transpose): input [n, c, h, w], output
/// [n, o, oh, ow], kernel [kh, kw].
#[derive(Clone, Copy, Debug)]
pub(super) struct Geom {
    pub n: usize,
    pub c: usize,
    pub h: usize,
    pub w: usize,
    pub o: usize,
    pub kh: usize,
    pub kw: usize,
    pub oh: usize,
    pub ow: usize,
    pub p: Conv2dParams,
    pub has_bias: bool,
}

impl Geom {
    fn conv(
        op: &Op,
        [n, c, h, w]: [usize; 4],
        [o, kh, kw]: [usize; 3],
        p: Conv2dParams,
        out: &TensorMeta,
        has_bias: bool,
    ) -> Result<Geom, BackendError> {
        let [on, oo, oh, ow] = <[usize; 4]>::try_from(out.shape.dims())
            .ok()
            .or_else(|| match out.shape.dims() {
                // Conv1d's output [n, o, l] is [n, o, 1, l] here.
                &[a, b, l] => Some([a, b, 1, l]),
                _ => None,
            })
            .ok_or_else(|| BackendError::invalid(op.name(), "output must be [N, C, H, W]"))?;
        let g = p.groups;
        if on != n
            || oo != o
            || g == 0
            || !c.is_multiple_of(g)
            || !o.is_multiple_of(g)
            || p.stride.contains(&0)
            || p.dilation.contains(&0)
        {
            return Err(BackendError::invalid(op.name(), "inconsistent convolution sizes"));
        }
        Ok(Geom {
            n,
            c,
            h,
            w,
            o,
            kh,
            kw,
            oh,
            ow,
            p,
            has_bias,
        })
    }
}

/// Sizes of a pooling: input and output [n, c, h, w] and [n, c, oh, ow].
#[derive(Clone, Copy, Debug)]
pub(super) struct PoolGeom {
    pub planes: usize,
    pub h: usize,
    pub w: usize,
    pub oh: usize,
    pub ow: usize,
    pub p: Pool2dParams,
}

impl PoolGeom {
    fn new(op: &Op, [n, c, h, w]: [usize; 4], p: Pool2dParams, out: &TensorMeta) -> Result<PoolGeom, BackendError> {
        let [on, oc, oh, ow] = <[usize; 4]>::try_from(out.shape.dims())
            .map_err(|_| BackendError::invalid(op.name(), "output must be [N, C, H, W]"))?;
        // Every window must hold at least one input element; inference
        // guarantees it with padding <= kernel / 2 and a floor output size.
        let ok = on == n
            && oc == c
            && p.stride.iter().chain(&p.kernel).all(|&s| s > 0)
            && (0..2).all(|i| p.padding[i] * 2 <= p.kernel[i])
            && (oh == 0 || (oh - 1) * p.stride[0] < h + p.padding[0])
            && (ow == 0 || (ow - 1) * p.stride[1] < w + p.padding[1]);
        if !ok {
            return Err(BackendError::invalid(op.name(), "inconsistent pooling sizes"));
        }
        Ok(PoolGeom {
            planes: n * c,
            h,
            w,
            oh,
            ow,
            p,
        })
    }
}

enum Kernel {
    Conv(Geom),
    Transpose(Geom),
    MaxPool(PoolGeom),
    AvgPool(PoolGeom, bool),
}

impl Kernel {
    fn run<T: ConvElem>(&self, ins: &[Cow<'_, [T]>]) -> Vec<T> {
        let bias = ins.get(2).map(|b| &b[..]);
        match self {
            Kernel::Conv(g) => conv2d::conv2d(g, &ins[0], &ins[1], bias),
            Kernel::Transpose(g) => transpose::conv_transpose2d(g, &ins[0], &ins[1], bias),
            Kernel::MaxPool(g) => pool::max_pool2d(g, &ins[0]),
            Kernel::AvgPool(g, count_pad) => pool::avg_pool2d(g, &ins[0], *count_pad),
        }
    }

    fn expected_inputs(&self) -> usize {
        match self {
            Kernel::Conv(g) | Kernel::Transpose(g) => 2 + g.has_bias as usize,
            Kernel::MaxPool(_) | Kernel::AvgPool(..) => 1,
        }
    }
}

fn run_native<T: ConvElem + StorageElement>(
    op: &Op,
    inputs: &[CpuInput<'_>],
    k: &Kernel,
) -> Result<Vec<T>, BackendError> {
    if inputs.len() != k.expected_inputs() {
        return Err(BackendError::invalid(op.name(), "wrong number of inputs"));
    }
    let ins = inputs
        .iter()
        .map(|i| input_slice::<T>(op, *i))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(k.run(&ins))
}

/// f16/bf16: widen every input to f32, compute, round the result once.
fn run_widened<S: StorageElement>(op: &Op, inputs: &[CpuInput<'_>], k: &Kernel) -> Result<Vec<S>, BackendError> {
    if inputs.len() != k.expected_inputs() {
        return Err(BackendError::invalid(op.name(), "wrong number of inputs"));
    }
    let ins = inputs
        .iter()
        .map(|i| {
            let s = input_slice::<S>(op, *i)?;
            let v: Vec<f32> = if s.len() >= PAR_THRESHOLD {
                s.par_iter().map(|x| x.to_f32()).collect()
            } else {
                s.iter().map(|x| x.to_f32()).collect()
            };
            Ok(Cow::Owned(v))
        })
        .collect::<Result<Vec<_>, BackendError>>()?;
    Ok(narrow_from_f32(&k.run::<f32>(&ins)))
}

/// The compute types of this module (f32, f64).
pub(super) trait ConvElem:
    GemmElem + Add<Output = Self> + Mul<Output = Self> + Div<Output = Self> + AddAssign + PartialOrd
{
    const NEG_INFINITY: Self;
    /// dst[i] += src[i]
    fn add_assign_slice(dst: &mut [Self], src: &[Self]);
    /// dst[i] = max(dst[i], src[i]), NaN winning.
    fn max_assign_slice(dst: &mut [Self], src: &[Self]);
}

macro_rules! conv_elem {
    ($t:ty, $add:ident, $max:ident) => {
        simd_dispatch! {
            fn $add(dst: &mut [$t], src: &[$t]) {
                for (d, &s) in dst.iter_mut().zip(src) {
                    *d += s;
                }
            }
        }
        simd_dispatch! {
            fn $max(dst: &mut [$t], src: &[$t]) {
                for (d, &s) in dst.iter_mut().zip(src) {
                    // PyTorch keeps a NaN once it has seen one.
                    *d = if s > *d || s.is_nan() { s } else { *d };
                }
            }
        }
        impl ConvElem for $t {
            const NEG_INFINITY: Self = <$t>::NEG_INFINITY;
            fn add_assign_slice(dst: &mut [Self], src: &[Self]) {
                $add(dst, src)
            }
            fn max_assign_slice(dst: &mut [Self], src: &[Self]) {
                $max(dst, src)
            }
        }
    };
}
conv_elem!(f32, add_assign_f32, max_assign_f32);
conv_elem!(f64, add_assign_f64, max_assign_f64);

/// The index range `lo..hi` of `j < count` for which `j * stride + off`
/// falls inside `0..len`.
#[inline]
pub(super) fn valid_range(off: isize, stride: usize, len: usize, count: usize) -> (usize, usize) {
    let s = stride as isize;
    let lo = if off >= 0 { 0 } else { ((-off + s - 1) / s) as usize };
    let hi = if off >= len as isize {
        0
    } else {
        ((len as isize - off + s - 1) / s) as usize
    };
    let hi = hi.min(count);
    (lo.min(hi), hi)
}

/// How many output rows one im2col tile holds: enough columns to keep
/// gemm efficient, few enough that the tile stays in L2 between im2col
/// writing it and gemm reading it.
pub(super) fn tile_rows(col_rows: usize, row_len: usize, total_rows: usize, elem_size: usize) -> usize {
    const TILE_BYTES: usize = 512 << 10;
    let per_row = (col_rows * row_len * elem_size).max(1);
    (TILE_BYTES / per_row).clamp(1, total_rows.max(1))
}
