//! Stable sort and top-k along one dimension, with i64 indices.
//!
//! Both order each slice by (value, original index), which makes the sort
//! stable and top-k deterministic: among equal values the earlier element
//! comes first, in either direction. NaN sorts as the largest value, as in
//! PyTorch. Top-k selects its k elements first (linear time) and sorts
//! only those.

use super::{chunk_size, Geom};
use crate::cpu::copy::{input_slice, PAR_THRESHOLD};
use crate::cpu::{unsupported_dtype, CpuInput, CpuResult, CpuStorage, StorageElement};
use crate::dtype::DType;
use crate::error::BackendError;
use crate::op::Op;
use half::{bf16, f16};
use rayon::prelude::*;
use std::cmp::Ordering;

/// Sorts each slice along `dim` and keeps its first `k` elements
/// (`k` = the dimension's size for a full sort); `descending` puts the
/// largest first.
pub(super) fn sort(op: &Op, input: CpuInput<'_>, dim: usize, k: usize, descending: bool) -> CpuResult {
    let g = Geom::around(op, input.dims(), dim)?;
    if k > g.len {
        return Err(BackendError::invalid(
            op.name(),
            format!("k = {k} is larger than dimension {dim} ({})", g.len),
        ));
    }
    match input.dtype() {
        DType::F32 => run::<f32, f32>(op, input, g, k, descending, |x| x),
        DType::F64 => run::<f64, f64>(op, input, g, k, descending, |x| x),
        DType::F16 => run::<f16, f32>(op, input, g, k, descending, f16::to_f32),
        DType::BF16 => run::<bf16, f32>(op, input, g, k, descending, bf16::to_f32),
        DType::I64 => run::<i64, i64>(op, input, g, k, descending, |x| x),
        DType::I32 => run::<i32, i64>(op, input, g, k, descending, |x| x as i64),
        DType::U8 => run::<u8, i64>(op, input, g, k, descending, |x| x as i64),
        DType::Bool => run::<bool, i64>(op, input, g, k, descending, |x| x as i64),
        d => Err(unsupported_dtype(op, d)),
    }
}

/// Sort keys: a total order in which NaN is the largest value.
trait Key: Copy + Send + Sync {
    fn order(a: Self, b: Self) -> Ordering;
}
impl Key for i64 {
    fn order(a: i64, b: i64) -> Ordering {
        a.cmp(&b)
    }
}
macro_rules! float_key {
    ($t:ty) => {
        impl Key for $t {
            #[inline]
            fn order(a: $t, b: $t) -> Ordering {
                match (a.is_nan(), b.is_nan()) {
                    (false, false) => a.partial_cmp(&b).unwrap_or(Ordering::Equal),
                    (a_nan, b_nan) => a_nan.cmp(&b_nan),
                }
            }
        }
    };
}
float_key!(f32);
float_key!(f64);

fn run<T, K>(op: &Op, input: CpuInput<'_>, g: Geom, k: usize, descending: bool, key: fn(T) -> K) -> CpuResult
where
    T: StorageElement + Send + Sync,
    K: Key,
{
    let x = input_slice::<T>(op, input)?;
    let n_out = g.outer * k * g.inner;
    let mut vals = vec![T::default(); n_out];
    let mut idx = vec![0i64; n_out];
    if n_out == 0 {
        return Ok(vec![CpuStorage::from_vec(vals), CpuStorage::I64(idx)]);
    }
    let (block_in, block_out) = (g.len * g.inner, k * g.inner);
    let work = |((xs, vs), is): ((&[T], &mut [T]), &mut [i64])| {
        let mut keyed: Vec<(K, usize)> = Vec::with_capacity(g.len);
        let blocks = xs
            .chunks_exact(block_in)
            .zip(vs.chunks_exact_mut(block_out))
            .zip(is.chunks_exact_mut(block_out));
        for ((xb, vb), ib) in blocks {
            for j in 0..g.inner {
                keyed.clear();
                keyed.extend((0..g.len).map(|i| (key(xb[i * g.inner + j]), i)));
                select_sorted(&mut keyed, k, descending);
                for (r, &(_, i)) in keyed[..k].iter().enumerate() {
                    vb[r * g.inner + j] = xb[i * g.inner + j];
                    ib[r * g.inner + j] = i as i64;
                }
            }
        }
    };
    if x.len() >= PAR_THRESHOLD && g.outer > 1 {
        let per = chunk_size(g.outer, (PAR_THRESHOLD / 8 / block_in).max(1));
        x.par_chunks(per * block_in)
            .zip(vals.par_chunks_mut(per * block_out))
            .zip(idx.par_chunks_mut(per * block_out))
            .for_each(work);
    } else {
        work(((&x[..], &mut vals[..]), &mut idx[..]));
    }
    Ok(vec![CpuStorage::from_vec(vals), CpuStorage::I64(idx)])
}

/// Puts the first `k` elements of the (value, index) order in place, sorted.
fn select_sorted<K: Key>(keyed: &mut [(K, usize)], k: usize, descending: bool) {
    let cmp = |a: &(K, usize), b: &(K, usize)| {
        let o = K::order(a.0, b.0);
        (if descending { o.reverse() } else { o }).then(a.1.cmp(&b.1))
    };
    if k == 0 {
        return;
    }
    // Indices make the order total, so an unstable sort gives the stable result.
    if k < keyed.len() {
        keyed.select_nth_unstable_by(k - 1, cmp);
        keyed[..k].sort_unstable_by(cmp);
    } else {
        keyed.sort_unstable_by(cmp);
    }
}
