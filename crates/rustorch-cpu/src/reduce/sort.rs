//! Stable sort and top-k along one dimension, with i64 indices.
//!
//! Each value maps to an unsigned integer key whose order is PyTorch's
//! (NaN largest, -0 equal to +0), inverted for a descending order, and the
//! key is packed above the element's index. Sorting the packed integers
//! orders by (key, index): stable in either direction, and top-k is
//! deterministic (the earlier of equal values first). Plain integer sorts
//! are much faster than sorts with a comparison closure. Top-k selects its
//! k elements first (linear time) and sorts only those.

use super::{chunk_size, Geom, PAR_SORT};
use crate::copy::input_slice;
use crate::{unsupported_dtype, CpuInput, CpuResult, CpuStorage, StorageElement};
use half::{bf16, f16};
use rayon::prelude::*;
use rustorch_core::dtype::DType;
use rustorch_core::error::BackendError;
use rustorch_core::op::Op;
use std::collections::BinaryHeap;

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
    let s = Spec { g, k, descending };
    // Keys of at most 32 bits pack with a 32-bit index into a u64.
    let narrow = g.len <= u32::MAX as usize;
    match input.dtype() {
        DType::F32 if narrow => run::<f32, u64, _>(op, input, s, key_f32, KEY32),
        DType::F16 if narrow => run::<f16, u64, _>(op, input, s, |x| key_f32(x.to_f32()), KEY32),
        DType::BF16 if narrow => run::<bf16, u64, _>(op, input, s, |x| key_f32(x.to_f32()), KEY32),
        DType::I32 if narrow => run::<i32, u64, _>(op, input, s, |x| (x as u32 ^ 0x8000_0000) as u64, KEY32),
        DType::U8 if narrow => run::<u8, u64, _>(op, input, s, |x| x as u64, KEY32),
        DType::Bool if narrow => run::<bool, u64, _>(op, input, s, |x| x as u64, KEY32),
        DType::F32 => run::<f32, u128, _>(op, input, s, key_f32, KEY32),
        DType::F16 => run::<f16, u128, _>(op, input, s, |x| key_f32(x.to_f32()), KEY32),
        DType::BF16 => run::<bf16, u128, _>(op, input, s, |x| key_f32(x.to_f32()), KEY32),
        DType::I32 => run::<i32, u128, _>(op, input, s, |x| (x as u32 ^ 0x8000_0000) as u64, KEY32),
        DType::U8 => run::<u8, u128, _>(op, input, s, |x| x as u64, KEY32),
        DType::Bool => run::<bool, u128, _>(op, input, s, |x| x as u64, KEY32),
        DType::F64 => run::<f64, u128, _>(op, input, s, key_f64, u64::MAX),
        DType::I64 => run::<i64, u128, _>(op, input, s, |x| x as u64 ^ (1 << 63), u64::MAX),
        d => Err(unsupported_dtype(op, d)),
    }
}

const KEY32: u64 = u32::MAX as u64;

#[derive(Clone, Copy)]
struct Spec {
    g: Geom,
    k: usize,
    descending: bool,
}

/// An order-preserving integer for an f32: NaN (any payload) largest,
/// -0 and +0 equal, negative numbers below positive ones. Branch-free:
/// random signs would otherwise mispredict on every other element.
#[inline(always)]
fn key_f32(x: f32) -> u64 {
    // Adding +0 turns -0 into +0 and leaves everything else unchanged.
    let b = (x + 0.0).to_bits();
    // Negative: flip every bit; positive: set the sign bit.
    let flip = ((b as i32) >> 31) as u32 | 0x8000_0000;
    let k = if x.is_nan() { u32::MAX } else { b ^ flip };
    k as u64
}

#[inline(always)]
fn key_f64(x: f64) -> u64 {
    let b = (x + 0.0).to_bits();
    let flip = ((b as i64) >> 63) as u64 | (1 << 63);
    if x.is_nan() {
        u64::MAX
    } else {
        b ^ flip
    }
}

/// A key packed above an index: the integer order is (key, index).
trait Packed: Ord + Copy + Send {
    fn pack(key: u64, idx: usize) -> Self;
    fn index(self) -> usize;
}
impl Packed for u64 {
    #[inline(always)]
    fn pack(key: u64, idx: usize) -> u64 {
        (key << 32) | idx as u64
    }
    #[inline(always)]
    fn index(self) -> usize {
        (self & 0xffff_ffff) as usize
    }
}
impl Packed for u128 {
    #[inline(always)]
    fn pack(key: u64, idx: usize) -> u128 {
        ((key as u128) << 64) | idx as u128
    }
    #[inline(always)]
    fn index(self) -> usize {
        self as u64 as usize
    }
}

fn run<T, P, K>(op: &Op, input: CpuInput<'_>, s: Spec, key: K, key_max: u64) -> CpuResult
where
    T: StorageElement + Send + Sync,
    P: Packed,
    K: Fn(T) -> u64 + Sync,
{
    let Spec { g, k, descending } = s;
    let x = input_slice::<T>(op, input)?;
    let n_out = g.outer * k * g.inner;
    let mut vals = vec![T::default(); n_out];
    let mut idx = vec![0i64; n_out];
    if n_out == 0 {
        return Ok(vec![CpuStorage::from_vec(vals), CpuStorage::I64(idx)]);
    }
    let (block_in, block_out) = (g.len * g.inner, k * g.inner);
    let work = |((xs, vs), is): ((&[T], &mut [T]), &mut [i64])| {
        let mut keyed: Vec<P> = Vec::with_capacity(g.len);
        let mut heap: BinaryHeap<P> = BinaryHeap::with_capacity(k + 1);
        let blocks = xs
            .chunks_exact(block_in)
            .zip(vs.chunks_exact_mut(block_out))
            .zip(is.chunks_exact_mut(block_out));
        for ((xb, vb), ib) in blocks {
            for j in 0..g.inner {
                // Branch-free keys for the whole slice (this loop vectorizes).
                keyed.clear();
                keyed.extend((0..g.len).map(|i| {
                    let kk = key(xb[i * g.inner + j]);
                    P::pack(if descending { key_max - kk } else { kk }, i)
                }));
                if k <= g.len / HEAP_RATIO {
                    smallest_k(&mut keyed, k, &mut heap);
                } else {
                    select_sorted(&mut keyed, k);
                }
                for (r, p) in keyed[..k].iter().enumerate() {
                    let i = p.index();
                    vb[r * g.inner + j] = xb[i * g.inner + j];
                    ib[r * g.inner + j] = i as i64;
                }
            }
        }
    };
    if x.len() >= PAR_SORT && g.outer > 1 {
        let per = chunk_size(g.outer, (PAR_SORT / 8 / block_in).max(1));
        x.par_chunks(per * block_in)
            .zip(vals.par_chunks_mut(per * block_out))
            .zip(idx.par_chunks_mut(per * block_out))
            .for_each(work);
    } else {
        work(((&x[..], &mut vals[..]), &mut idx[..]));
    }
    Ok(vec![CpuStorage::from_vec(vals), CpuStorage::I64(idx)])
}

/// Top-k keeps a heap of the k best so far when k is at most this fraction
/// of the slice: one comparison per element, as few heap updates as there
/// are new leaders. Larger k selects in place.
const HEAP_RATIO: usize = 16;

/// Moves the `k` smallest keys to the front of `keyed`, sorted, through a
/// max-heap of the best so far. Most elements lose to the heap's top, so
/// the scan tests 16 at a time against it and touches the heap rarely.
fn smallest_k<P: Packed>(keyed: &mut [P], k: usize, heap: &mut BinaryHeap<P>) {
    heap.clear();
    if k == 0 {
        return;
    }
    heap.extend(keyed[..k].iter().copied());
    let Some(mut top) = heap.peek().copied() else { return };
    for chunk in keyed[k..].chunks(16) {
        let mut any = false;
        for &p in chunk {
            any |= p < top;
        }
        if !any {
            continue;
        }
        for &p in chunk {
            if p < top {
                if let Some(mut t) = heap.peek_mut() {
                    *t = p;
                }
                top = heap.peek().copied().unwrap_or(p);
            }
        }
    }
    for (dst, p) in keyed.iter_mut().zip(heap.drain()) {
        *dst = p;
    }
    keyed[..k].sort_unstable();
}

/// Puts the `k` smallest packed keys first, in order.
fn select_sorted<P: Packed>(keyed: &mut [P], k: usize) {
    if k == 0 {
        return;
    }
    if k < keyed.len() {
        keyed.select_nth_unstable(k - 1);
        keyed[..k].sort_unstable();
    } else {
        keyed.sort_unstable();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_follow_torch_order() {
        let xs = [
            f32::NEG_INFINITY,
            -3.5,
            -1e-40,
            -0.0,
            0.0,
            1e-40,
            2.0,
            f32::INFINITY,
            f32::NAN,
            -f32::NAN,
        ];
        let keys: Vec<u64> = xs.iter().map(|&x| key_f32(x)).collect();
        for w in keys.windows(2) {
            assert!(w[0] <= w[1], "{keys:?}");
        }
        assert_eq!(key_f32(-0.0), key_f32(0.0));
        assert_eq!(key_f32(f32::NAN), key_f32(-f32::NAN));
        assert!(key_f32(f32::INFINITY) < key_f32(f32::NAN));
        let ys = [f64::NEG_INFINITY, -1.0, -0.0, 0.0, 5e-324, 1.0, f64::INFINITY, f64::NAN];
        let keys: Vec<u64> = ys.iter().map(|&x| key_f64(x)).collect();
        for w in keys.windows(2) {
            assert!(w[0] <= w[1], "{keys:?}");
        }
        assert_eq!(key_f64(-0.0), key_f64(0.0));
    }
}
