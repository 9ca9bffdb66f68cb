//! cumsum over one dimension.
//!
//! Accumulators follow PyTorch's CPU kernel (`acc_type`): f32 and f64 sum
//! in f64, f16 and bf16 in f32, complex64 in complex128, and integers and
//! bools in wrapping i64 (their output is i64).

use super::{chunk_size, Geom, PAR_SCAN};
use crate::copy::input_slice;
use crate::{unsupported_dtype, CpuInput, CpuResult, CpuStorage, StorageElement};
use half::{bf16, f16};
use num_complex::Complex64;
use rayon::prelude::*;
use rustorch_core::dtype::{DType, C64};
use rustorch_core::op::{Op, TensorMeta};

pub(super) fn cumsum(op: &Op, input: CpuInput<'_>, dim: usize, out: &TensorMeta) -> CpuResult {
    let g = Geom::around(op, input.dims(), dim)?;
    let res = match (input.dtype(), out.dtype) {
        (DType::F32, DType::F32) => scan::<f32, f64, f32>(op, input, g, |x| x as f64, |a, b| a + b, |a| a as f32)?,
        (DType::F64, DType::F64) => scan::<f64, f64, f64>(op, input, g, |x| x, |a, b| a + b, |a| a)?,
        (DType::F16, DType::F16) => scan::<f16, f32, f16>(op, input, g, f16::to_f32, |a, b| a + b, f16::from_f32)?,
        (DType::BF16, DType::BF16) => {
            scan::<bf16, f32, bf16>(op, input, g, bf16::to_f32, |a, b| a + b, bf16::from_f32)?
        }
        (DType::I64, DType::I64) => scan::<i64, i64, i64>(op, input, g, |x| x, i64::wrapping_add, |a| a)?,
        (DType::I32, DType::I64) => scan::<i32, i64, i64>(op, input, g, |x| x as i64, i64::wrapping_add, |a| a)?,
        (DType::U8, DType::I64) => scan::<u8, i64, i64>(op, input, g, |x| x as i64, i64::wrapping_add, |a| a)?,
        (DType::Bool, DType::I64) => scan::<bool, i64, i64>(op, input, g, |x| x as i64, i64::wrapping_add, |a| a)?,
        (DType::C64, DType::C64) => scan::<C64, Complex64, C64>(
            op,
            input,
            g,
            |x| Complex64::new(x.re as f64, x.im as f64),
            |a, b| a + b,
            |a| C64::new(a.re as f32, a.im as f32),
        )?,
        (d, _) => return Err(unsupported_dtype(op, d)),
    };
    Ok(vec![res])
}

/// Running sums along the middle dimension of `[outer, len, inner]`:
/// sequential per row when `inner == 1`, else a running row of `inner`
/// accumulators (vectorizes across columns). Outer blocks run in parallel.
fn scan<T, A, O>(
    op: &Op,
    input: CpuInput<'_>,
    g: Geom,
    widen: impl Fn(T) -> A + Sync,
    add: impl Fn(A, A) -> A + Sync,
    narrow: impl Fn(A) -> O + Sync,
) -> Result<CpuStorage, rustorch_core::error::BackendError>
where
    T: StorageElement + Send + Sync,
    A: Copy + Send + Sync + Default,
    O: StorageElement + Send + Sync,
{
    let x = input_slice::<T>(op, input)?;
    let mut out = vec![O::default(); x.len()];
    let block = g.len * g.inner;
    if block == 0 {
        return Ok(CpuStorage::from_vec(out));
    }
    let work = |(xs, os): (&[T], &mut [O])| {
        if g.inner == 1 {
            for (xb, ob) in xs.chunks_exact(block).zip(os.chunks_exact_mut(block)) {
                let mut a = A::default();
                for (&v, o) in xb.iter().zip(ob.iter_mut()) {
                    a = add(a, widen(v));
                    *o = narrow(a);
                }
            }
            return;
        }
        let mut acc = vec![A::default(); g.inner];
        for (xb, ob) in xs.chunks_exact(block).zip(os.chunks_exact_mut(block)) {
            acc.iter_mut().for_each(|a| *a = A::default());
            for (xr, or) in xb.chunks_exact(g.inner).zip(ob.chunks_exact_mut(g.inner)) {
                for ((a, &v), o) in acc.iter_mut().zip(xr).zip(or.iter_mut()) {
                    *a = add(*a, widen(v));
                    *o = narrow(*a);
                }
            }
        }
    };
    if x.len() >= PAR_SCAN && g.outer > 1 {
        let chunk = chunk_size(g.outer, (PAR_SCAN / 4 / block).max(1)) * block;
        x.par_chunks(chunk).zip(out.par_chunks_mut(chunk)).for_each(work);
    } else {
        work((&x[..], &mut out[..]));
    }
    Ok(CpuStorage::from_vec(out))
}
