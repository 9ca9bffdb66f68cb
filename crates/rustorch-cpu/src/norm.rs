//! Normalization: layer norm, RMS norm and inference-mode batch norm.
//!
//! All three work row by row over a contiguous view of `x`: a row is what
//! one set of statistics covers (layer and RMS norm) or one (sample,
//! channel) plane (batch norm). Rows run in parallel above a size
//! threshold; each row is widened to the compute type (f32 for half types,
//! so statistics accumulate in f32 as in PyTorch), normalized with
//! vectorized primitives, and rounded once when stored.

pub(crate) mod float;
pub(crate) mod real;
pub(crate) mod rows;

use super::copy::{input_slice, PAR_THRESHOLD};
use super::{unsupported_dtype, CpuInput, CpuResult, CpuStorage};
use float::{acc_input, FloatElem, Real};
use half::{bf16, f16};
use rows::Split;
use rustorch_core::dtype::DType;
use rustorch_core::dtype::WithDType;
use rustorch_core::error::BackendError;
use rustorch_core::op::{Op, TensorMeta};

/// Smallest amount of work (elements) worth a rayon task.
const TASK_ELEMS: usize = 1 << 14;

pub fn execute(op: &Op, inputs: &[CpuInput<'_>], _outputs: &[TensorMeta]) -> CpuResult {
    if let Op::AddRmsNorm { eps } = *op {
        return add_rms_norm(op, inputs, eps);
    }
    match inputs[0].dtype() {
        DType::F32 => run::<f32>(op, inputs),
        DType::F64 => run::<f64>(op, inputs),
        DType::F16 => run::<f16>(op, inputs),
        DType::BF16 => run::<bf16>(op, inputs),
        d => Err(unsupported_dtype(op, d)),
    }
}

fn run<T: FloatElem>(op: &Op, inputs: &[CpuInput<'_>]) -> CpuResult {
    let out = match *op {
        Op::LayerNorm {
            eps,
            normalized_dims,
            has_weight,
            has_bias,
        } => layer_norm::<T>(op, inputs, eps, normalized_dims, has_weight, has_bias)?,
        Op::RmsNorm { eps, has_weight } => rms_norm::<T>(op, inputs, eps, has_weight)?,
        Op::BatchNorm {
            eps,
            has_weight,
            has_bias,
        } => batch_norm::<T>(op, inputs, eps, has_weight, has_bias)?,
        _ => return Err(BackendError::invalid(op.name(), "not a normalization op")),
    };
    Ok(vec![CpuStorage::from_vec(out)])
}

/// Optional parameter `i` (weight or bias) in the compute type.
fn param<'a, T: FloatElem>(
    op: &Op,
    inputs: &[CpuInput<'a>],
    present: bool,
    i: usize,
) -> Result<Option<std::borrow::Cow<'a, [T::Acc]>>, BackendError> {
    if !present {
        return Ok(None);
    }
    let p = inputs
        .get(i)
        .ok_or_else(|| BackendError::invalid(op.name(), "missing parameter input"))?;
    Ok(Some(acc_input::<T>(op, *p)?))
}

fn rms_norm<T: FloatElem>(
    op: &Op,
    inputs: &[CpuInput<'_>],
    eps: f64,
    has_weight: bool,
) -> Result<Vec<T>, BackendError> {
    let x = input_slice::<T>(op, inputs[0])?;
    let n = inputs[0].dims().last().copied().unwrap_or(1);
    let w = param::<T>(op, inputs, has_weight, 1)?;
    Ok(rms_rows::<T>(&x, n, w.as_deref(), eps))
}

/// Rows of `n` values of `x` RMS-normalized, times `w` where given.
fn rms_rows<T: FloatElem>(x: &[T], n: usize, w: Option<&[T::Acc]>, eps: f64) -> Vec<T> {
    let eps = T::Acc::from_f64(eps);
    map_rows::<T>(x, n, |_, xr, out| {
        let ms = T::Acc::mean_sq(xr);
        let inv_rms = T::Acc::ONE / (ms + eps).sqrt();
        T::Acc::affine(xr, out, (T::Acc::ZERO, T::Acc::ZERO), inv_rms, w, None);
    })
}

/// `Op::AddRmsNorm` (f32 only, as `op::infer` checks): the sum as
/// `Binary(Add)` makes it (one f32 add a value), then `rms_norm` of the
/// sum with the weight: the values of the two ops.
fn add_rms_norm(op: &Op, inputs: &[CpuInput<'_>], eps: f64) -> CpuResult {
    let x = input_slice::<f32>(op, inputs[0])?;
    let a = input_slice::<f32>(op, inputs[1])?;
    let n = inputs[0].dims().last().copied().unwrap_or(1);
    let w = param::<f32>(op, inputs, true, 2)?;
    let sum: Vec<f32> = x.iter().zip(a.iter()).map(|(p, q)| p + q).collect();
    let normed = rms_rows::<f32>(&sum, n, w.as_deref(), eps);
    Ok(vec![CpuStorage::from_vec(sum), CpuStorage::from_vec(normed)])
}

fn layer_norm<T: FloatElem>(
    op: &Op,
    inputs: &[CpuInput<'_>],
    eps: f64,
    normalized_dims: usize,
    has_weight: bool,
    has_bias: bool,
) -> Result<Vec<T>, BackendError> {
    let dims = inputs[0].dims();
    let k = normalized_dims.min(dims.len());
    let n: usize = dims[dims.len() - k..].iter().product();
    let x = input_slice::<T>(op, inputs[0])?;
    let w = param::<T>(op, inputs, has_weight, 1)?;
    let b = param::<T>(op, inputs, has_bias, 1 + has_weight as usize)?;
    let (w, b) = (w.as_deref(), b.as_deref());
    let eps = T::Acc::from_f64(eps);
    let inv_n = T::Acc::ONE / T::Acc::from_f64(n as f64);
    Ok(map_rows::<T>(&x, n, |_, xr, out| {
        // Work relative to the row's first element: the mean is
        // `shift + dev` with `dev` summed from exact differences, and never
        // rounded into one number, so a large common offset costs no
        // precision. The variance is a second pass over squared deviations
        // (no E[x^2] - E[x]^2 cancellation).
        let shift = xr[0];
        let dev = T::Acc::sum_shifted(xr, shift) * inv_n;
        let var = T::Acc::sum_sq_dev(xr, shift, dev) * inv_n;
        let rstd = T::Acc::ONE / (var + eps).sqrt();
        T::Acc::affine(xr, out, (shift, dev), rstd, w, b);
    }))
}

fn batch_norm<T: FloatElem>(
    op: &Op,
    inputs: &[CpuInput<'_>],
    eps: f64,
    has_weight: bool,
    has_bias: bool,
) -> Result<Vec<T>, BackendError> {
    let dims = inputs[0].dims();
    let c = dims.get(1).copied().unwrap_or(1);
    let inner: usize = dims.iter().skip(2).product();
    let x = input_slice::<T>(op, inputs[0])?;
    let mean = acc_input::<T>(op, inputs[1])?;
    let var = acc_input::<T>(op, inputs[2])?;
    let w = param::<T>(op, inputs, has_weight, 3)?;
    let b = param::<T>(op, inputs, has_bias, 3 + has_weight as usize)?;
    let eps = T::Acc::from_f64(eps);
    // Fold the statistics and affine parameters into one scale and shift
    // per channel, as PyTorch's inference kernel does.
    let mut scale = Vec::with_capacity(c);
    let mut shift = Vec::with_capacity(c);
    for ch in 0..c {
        let (m, v) = (mean.get(ch).copied(), var.get(ch).copied());
        let (m, v) = m
            .zip(v)
            .ok_or_else(|| BackendError::invalid(op.name(), "statistics shorter than C"))?;
        let g = w.as_ref().and_then(|w| w.get(ch).copied()).unwrap_or(T::Acc::ONE);
        let beta = b.as_ref().and_then(|b| b.get(ch).copied()).unwrap_or(T::Acc::ZERO);
        let a = g / (v + eps).sqrt();
        scale.push(a);
        shift.push(beta - m * a);
    }
    Ok(map_rows::<T>(&x, inner, |r, xr, out| {
        let ch = r % c;
        T::Acc::scale_shift(xr, out, scale[ch], shift[ch]);
    }))
}

/// Applies `f(row_index, x_row, out_row)` to every row of `n` elements of
/// `x` and returns the results. Rows are handed over in the compute type:
/// borrowed when the storage type is the compute type, otherwise widened
/// into a per-task scratch row, and the output rounded once when stored.
pub(super) fn map_rows<T: FloatElem>(x: &[T], n: usize, f: impl Fn(usize, &[T::Acc], &mut [T::Acc]) + Sync) -> Vec<T> {
    let scratch_len = if T::as_acc(&[]).is_some() { 0 } else { n };
    let split = Split::rows(x.len(), n, PAR_THRESHOLD, TASK_ELEMS);
    let new_state = || (vec![T::Acc::ZERO; scratch_len], vec![T::Acc::ZERO; scratch_len]);
    rows::build(
        x.len(),
        split,
        <T as WithDType>::zero(),
        new_state,
        |scratch, r, or: &mut [T]| {
            let (xs, os) = scratch;
            let xr = &x[r * n..(r + 1) * n];
            let xa = match T::as_acc(xr) {
                Some(a) => a,
                None => {
                    T::load_row(xr, xs);
                    &xs[..]
                }
            };
            match T::as_acc_mut(or) {
                Some(o) => f(r, xa, o),
                None => {
                    f(r, xa, os);
                    T::store_row(os, or);
                }
            }
        },
    )
}
