//! sum, mean, max, min, prod, argmax, argmin, var and std over any set of
//! dimensions.
//!
//! `plan` lays the input out as `[outer, len, inner]` with `len` the
//! reduced elements; `rows` reduces contiguous rows (`inner == 1`) and
//! `outer` reduces over an outer dimension (`inner > 1`). Mean divides a
//! sum; var and std take the sums' means, then a squared-deviation pass
//! (two-pass variance, as accurate as Welford's and vectorizable).

use super::acc::{Acc, Elem};
use super::plan::{arrange, physical, to_logical};
use super::{outer, rows, Geom};
use crate::copy::input_slice;
use crate::{unsupported_dtype, CpuInput, CpuResult, CpuStorage};
use half::{bf16, f16};
use rustorch_core::dtype::{DType, C64};
use rustorch_core::error::BackendError;
use rustorch_core::op::{Op, ReduceOp, TensorMeta};

pub(super) fn reduce(op: &Op, r: ReduceOp, dims: &[usize], input: CpuInput<'_>, out: &TensorMeta) -> CpuResult {
    match input.dtype() {
        DType::F32 => reduce_typed::<f32>(op, r, dims, input, out),
        DType::F64 => reduce_typed::<f64>(op, r, dims, input, out),
        DType::F16 => reduce_typed::<f16>(op, r, dims, input, out),
        DType::BF16 => reduce_typed::<bf16>(op, r, dims, input, out),
        DType::I64 => reduce_typed::<i64>(op, r, dims, input, out),
        DType::I32 => reduce_typed::<i32>(op, r, dims, input, out),
        DType::U8 => reduce_typed::<u8>(op, r, dims, input, out),
        DType::Bool => reduce_typed::<bool>(op, r, dims, input, out),
        DType::C64 => reduce_complex(op, r, dims, input, out),
    }
}

/// What one pass computes. Mean is a sum pass; var and std are a sum pass
/// for the means, then a squared-deviation pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Kind {
    Sum,
    Prod,
    Max,
    Min,
    SqDev,
    ArgMax,
    ArgMin,
}

/// Per-output results of a pass: values, and for arg kinds the indices.
pub(super) struct Part<A> {
    pub vals: Vec<A>,
    pub idx: Vec<usize>,
}

fn reduce_typed<T: Elem>(op: &Op, r: ReduceOp, dims: &[usize], input: CpuInput<'_>, out: &TensorMeta) -> CpuResult {
    if input.layout.numel() == 0 {
        return empty_reduction(op, r, out);
    }
    let src = physical::<T>(op, input, dims)?;
    let (data, g) = arrange(op, src.data, &src.shape, &src.dims)?;
    let n = g.len;
    let kept = &src.kept;
    let store = |v: Vec<T::A>| {
        let v = to_logical(op, v, kept, input.dims())?;
        T::A::into_storage(v, out.dtype)
            .map(|s| vec![s])
            .ok_or_else(|| unsupported_dtype(op, out.dtype))
    };
    let means = |sums: Vec<T::A>| sums.into_iter().map(|s| T::A::div_count(s, n)).collect::<Vec<_>>();
    match r {
        ReduceOp::Sum => store(pass::<T>(Kind::Sum, &data, g, &[]).vals),
        ReduceOp::Prod => store(pass::<T>(Kind::Prod, &data, g, &[]).vals),
        ReduceOp::Max => store(pass::<T>(Kind::Max, &data, g, &[]).vals),
        ReduceOp::Min => store(pass::<T>(Kind::Min, &data, g, &[]).vals),
        ReduceOp::Mean => store(means(pass::<T>(Kind::Sum, &data, g, &[]).vals)),
        ReduceOp::ArgMax | ReduceOp::ArgMin => {
            let kind = if r == ReduceOp::ArgMax {
                Kind::ArgMax
            } else {
                Kind::ArgMin
            };
            let p = pass::<T>(kind, &data, g, &[]);
            let idx = p.idx.into_iter().map(|i| i as i64).collect();
            Ok(vec![CpuStorage::I64(to_logical(op, idx, kept, input.dims())?)])
        }
        ReduceOp::Var { correction } | ReduceOp::Std { correction } => {
            let mu = means(pass::<T>(Kind::Sum, &data, g, &[]).vals);
            let m2 = pass::<T>(Kind::SqDev, &data, g, &mu).vals;
            let is_std = matches!(r, ReduceOp::Std { .. });
            store(
                m2.into_iter()
                    .map(|m| {
                        let v = T::A::variance(m, n, correction);
                        if is_std {
                            v.sqrt()
                        } else {
                            v
                        }
                    })
                    .collect(),
            )
        }
    }
}

/// Reductions of zero elements: PyTorch's identities (0 for sum, 1 for
/// prod, NaN for mean, var and std).
fn empty_reduction(op: &Op, r: ReduceOp, out: &TensorMeta) -> CpuResult {
    let n = out.shape.numel();
    let fill = match r {
        _ if n == 0 => 0.0,
        ReduceOp::Sum => 0.0,
        ReduceOp::Prod => 1.0,
        ReduceOp::Mean | ReduceOp::Var { .. } | ReduceOp::Std { .. } => f64::NAN,
        ReduceOp::Max | ReduceOp::Min | ReduceOp::ArgMax | ReduceOp::ArgMin => {
            return Err(BackendError::invalid(op.name(), "cannot reduce an empty dimension"))
        }
    };
    Ok(vec![CpuStorage::from_f64_iter(out.dtype, std::iter::repeat_n(fill, n))])
}

/// One pass over `[outer, len, inner]` data: one result per
/// `(outer, inner)` pair. `means` (for `SqDev`) has one value per result.
fn pass<T: Elem>(kind: Kind, data: &[T], g: Geom, means: &[T::A]) -> Part<T::A> {
    if g.inner == 1 {
        rows::rows_pass::<T>(kind, data, g.len, means)
    } else {
        outer::outer_pass::<T>(kind, data, g, means)
    }
}

// ------------------------------------------------------------- complex

/// Sum and product of complex numbers (the only reductions PyTorch defines
/// for them besides mean, which needs a real dtype here). Scalar code:
/// complex reductions are rare and memory-bound.
fn reduce_complex(op: &Op, r: ReduceOp, dims: &[usize], input: CpuInput<'_>, out: &TensorMeta) -> CpuResult {
    let src = input_slice::<C64>(op, input)?;
    let (identity, f): (C64, fn(C64, C64) -> C64) = match r {
        ReduceOp::Sum => (C64::new(0.0, 0.0), |a, b| a + b),
        ReduceOp::Prod => (C64::new(1.0, 0.0), |a, b| a * b),
        _ => return Err(unsupported_dtype(op, DType::C64)),
    };
    if src.is_empty() {
        return Ok(vec![CpuStorage::C64(vec![identity; out.shape.numel()])]);
    }
    let (data, g) = arrange(op, src, input.dims(), dims)?;
    let mut res = vec![identity; g.outer * g.inner];
    for b in 0..g.outer {
        for i in 0..g.len {
            let row = &data[(b * g.len + i) * g.inner..(b * g.len + i + 1) * g.inner];
            for (a, &x) in res[b * g.inner..(b + 1) * g.inner].iter_mut().zip(row) {
                *a = f(*a, x);
            }
        }
    }
    Ok(vec![CpuStorage::from_vec(res)])
}
