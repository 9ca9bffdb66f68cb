//! Indexing: index_select, gather, scatter_add and embedding, for every
//! data dtype, with i64, i32 or u8 indices.
//!
//! Indices are read once, checked against the indexed dimension (negative
//! or too large is `InvalidInput` naming the index and the size, as
//! PyTorch's error does) and converted to `usize`; kernels then index
//! without further checks. The data input is read through its strides, so
//! a transposed or narrowed source (an embedding table that is a slice of
//! a larger one, say) is never copied first.

use super::copy::{input_slice, PAR_THRESHOLD};
use super::norm::rows::{self, Split};
use super::{unsupported_dtype, CpuInput, CpuResult, CpuStorage};
use half::{bf16, f16};
use rayon::prelude::*;
use rustorch_core::dtype::{DType, C64};
use rustorch_core::error::BackendError;
use rustorch_core::layout::{Layout, StridedBlocks};
use rustorch_core::op::{Op, TensorMeta};
use rustorch_core::shape::Shape;
use rustorch_core::with_cpu_storage;

pub fn execute(op: &Op, inputs: &[CpuInput<'_>], _outputs: &[TensorMeta]) -> CpuResult {
    match *op {
        Op::IndexSelect { dim } => {
            let src = inputs[0];
            let idx = indices(op, inputs[1], src.dims()[dim], dim)?;
            Ok(vec![
                with_cpu_storage!(src.storage, v, T => CpuStorage::from_vec(index_select(v, src.layout, dim, &idx))),
            ])
        }
        Op::Embedding => {
            // An embedding lookup is index_select over the rows of the table.
            let w = inputs[0];
            let idx = indices(op, inputs[1], w.dims()[0], 0)?;
            Ok(vec![
                with_cpu_storage!(w.storage, v, T => CpuStorage::from_vec(index_select(v, w.layout, 0, &idx))),
            ])
        }
        Op::Gather { dim } => {
            let src = inputs[0];
            let idx = indices(op, inputs[1], src.dims()[dim], dim)?;
            let id = inputs[1].dims();
            Ok(vec![
                with_cpu_storage!(src.storage, v, T => CpuStorage::from_vec(gather(v, src.layout, dim, &idx, id))),
            ])
        }
        Op::ScatterAdd { dim } => {
            let (dst, src) = (inputs[0], inputs[2]);
            let idx = indices(op, inputs[1], dst.dims()[dim], dim)?;
            let id = inputs[1].dims();
            with_cpu_storage!(dst.storage, _v, T => {
                let d = input_slice::<T>(op, dst)?;
                let s = src.storage.as_slice::<T>().ok_or_else(|| unsupported_dtype(op, src.dtype()))?;
                let out = scatter_add(&d, dst.dims(), s, src.layout, dim, &idx, id);
                Ok(vec![CpuStorage::from_vec(out)])
            })
        }
        _ => Err(BackendError::invalid(op.name(), "not an indexing op")),
    }
}

/// Reads an index tensor (row-major) as `usize` values, each checked to be
/// in `0..size`.
pub(super) fn indices(op: &Op, input: CpuInput<'_>, size: usize, dim: usize) -> Result<Vec<usize>, BackendError> {
    fn check<I: Copy + Into<i64>>(op: &Op, v: &[I], size: usize, dim: usize) -> Result<Vec<usize>, BackendError> {
        let mut out = Vec::with_capacity(v.len());
        for &i in v {
            let i: i64 = i.into();
            if i < 0 || i as u64 >= size as u64 {
                return Err(BackendError::invalid(
                    op.name(),
                    format!("index {i} is out of range for dimension {dim} of size {size}"),
                ));
            }
            out.push(i as usize);
        }
        Ok(out)
    }
    match input.dtype() {
        DType::I64 => check(op, &input_slice::<i64>(op, input)?, size, dim),
        DType::I32 => check(op, &input_slice::<i32>(op, input)?, size, dim),
        DType::U8 => check(op, &input_slice::<u8>(op, input)?, size, dim),
        d => Err(BackendError::invalid(
            op.name(),
            format!("index must be i64, i32 or u8, not {d}"),
        )),
    }
}

/// `out[o, j, i] = src[o, idx[j], i]`, where `o` runs over the dims before
/// `dim` and `i` over those after it.
fn index_select<T: Copy + Default + Send + Sync>(src: &[T], layout: &Layout, dim: usize, idx: &[usize]) -> Vec<T> {
    let (dims, strides) = (layout.dims(), layout.strides());
    let sub = |r: std::ops::Range<usize>, off: usize| {
        Layout::from_parts(Shape::from(&dims[r.clone()]), strides[r].to_vec(), off)
    };
    let (Ok(outer), Ok(inner)) = (sub(0..dim, layout.offset()), sub(dim + 1..dims.len(), 0)) else {
        return Vec::new(); // unreachable: the parts always have matching ranks
    };
    let inner_n = inner.numel();
    let total = outer.numel() * idx.len() * inner_n;
    if total == 0 {
        return Vec::new();
    }
    // Storage offsets of every outer position, and the inner rows as runs
    // of contiguous elements (one run when the inner dims are contiguous).
    let outer_offs: Vec<usize> = outer.indices().collect();
    let (runs, run_len): (Vec<usize>, usize) = match inner.blocks() {
        StridedBlocks::Single { start, len } => (vec![start], len),
        StridedBlocks::Multiple { starts, run_len } => (starts.collect(), run_len),
    };
    let sd = strides[dim];
    let n = idx.len();
    let split = Split::rows(total, inner_n, PAR_THRESHOLD, PAR_THRESHOLD);
    rows::build(
        total,
        split,
        T::default(),
        || (),
        |_, k, chunk| {
            let base = outer_offs[k / n] + idx[k % n] * sd;
            for (o, &s) in chunk.chunks_exact_mut(run_len).zip(&runs) {
                o.copy_from_slice(&src[base + s..base + s + run_len]);
            }
        },
    )
}

/// Storage offset (through `strides`) of the start of row `k` of a tensor
/// of dims `dims`, rows being its last dim; `skip` is a dim left out of the
/// sum (its coordinate comes from an index instead).
fn row_offset(mut k: usize, dims: &[usize], strides: &[usize], skip: usize) -> usize {
    let mut off = 0;
    for d in (0..dims.len().saturating_sub(1)).rev() {
        let c = k % dims[d];
        k /= dims[d];
        if d != skip {
            off += c * strides[d];
        }
    }
    off
}

/// `out[.., j, ..] = src[.., idx[.., j, ..], ..]` along `dim`; the output has
/// the index's shape `id`.
fn gather<T: Copy + Default + Send + Sync>(
    src: &[T],
    layout: &Layout,
    dim: usize,
    idx: &[usize],
    id: &[usize],
) -> Vec<T> {
    let total = idx.len();
    let last = id.len() - 1;
    let row_len = id[last];
    if total == 0 || row_len == 0 {
        return Vec::new();
    }
    let s = layout.strides();
    let sd = s[dim];
    // Along the last dim the source moves by its stride, unless the last
    // dim is the gathered one (then the index alone places each element).
    let step = if dim == last { 0 } else { s[last] };
    let off = layout.offset();
    let split = Split::rows(total, row_len, PAR_THRESHOLD, PAR_THRESHOLD);
    rows::build(
        total,
        split,
        T::default(),
        || (),
        |_, k, row| {
            let base = off + row_offset(k, id, s, dim);
            let ids = &idx[k * row_len..(k + 1) * row_len];
            for (t, (o, &i)) in row.iter_mut().zip(ids).enumerate() {
                *o = src[base + i * sd + t * step];
            }
        },
    )
}

/// Element types scatter_add can sum, and the type they sum in: f32 for
/// half types (rounded once at the end, so repeated indices do not round
/// at every addition), wrapping for integers, logical or for bools.
trait ScatterElem: Copy + Send + Sync {
    type Acc: Copy + Send + Sync;
    fn to_acc(self) -> Self::Acc;
    fn from_acc(a: Self::Acc) -> Self;
    fn add(a: Self::Acc, x: Self) -> Self::Acc;
}

macro_rules! scatter_plain {
    ($($t:ty),*) => {$(
        impl ScatterElem for $t {
            type Acc = $t;
            fn to_acc(self) -> $t { self }
            fn from_acc(a: $t) -> $t { a }
            #[inline(always)]
            fn add(a: $t, x: $t) -> $t { a + x }
        }
    )*};
}
scatter_plain!(f32, f64, C64);

macro_rules! scatter_int {
    ($($t:ty),*) => {$(
        impl ScatterElem for $t {
            type Acc = $t;
            fn to_acc(self) -> $t { self }
            fn from_acc(a: $t) -> $t { a }
            #[inline(always)]
            fn add(a: $t, x: $t) -> $t { a.wrapping_add(x) }
        }
    )*};
}
scatter_int!(u8, i32, i64);

impl ScatterElem for bool {
    type Acc = bool;
    fn to_acc(self) -> bool {
        self
    }
    fn from_acc(a: bool) -> bool {
        a
    }
    fn add(a: bool, x: bool) -> bool {
        a | x
    }
}

macro_rules! scatter_half {
    ($($t:ty),*) => {$(
        impl ScatterElem for $t {
            type Acc = f32;
            fn to_acc(self) -> f32 { self.to_f32() }
            fn from_acc(a: f32) -> $t { <$t>::from_f32(a) }
            #[inline(always)]
            fn add(a: f32, x: $t) -> f32 { a + x.to_f32() }
        }
    )*};
}
scatter_half!(f16, bf16);

/// The destination (contiguous, dims `dd`) plus every source element added
/// at its indexed position along `dim`. Additions happen in the index's
/// row-major order, so results are deterministic.
fn scatter_add<T: ScatterElem>(
    dst: &[T],
    dd: &[usize],
    src: &[T],
    src_layout: &Layout,
    dim: usize,
    idx: &[usize],
    id: &[usize],
) -> Vec<T> {
    let mut acc: Vec<T::Acc> = dst.iter().map(|x| x.to_acc()).collect();
    let last = id.len() - 1;
    let row_len = id[last];
    if idx.is_empty() || row_len == 0 {
        return acc.into_iter().map(T::from_acc).collect();
    }
    let ds = Shape::from(dd).contiguous_strides();
    let (ss, soff) = (src_layout.strides(), src_layout.offset());
    let dst_step = if dim == last { 0 } else { ds[last] };
    // Destination positions that differ in a dim before `dim` are disjoint
    // slabs, so slabs can be filled in parallel without races.
    let slab_len: usize = dd[dim..].iter().product();
    let rows_per_outer: usize = id[dim..last].iter().product();
    let add_slab = |si: usize, slab: &mut [T::Acc]| {
        // The slab's coordinates in the dims before `dim`; the index may be
        // smaller there than the destination, leaving this slab untouched.
        let (mut rest, mut io, mut scale) = (si, 0, 1);
        for d in (0..dim).rev() {
            let c = rest % dd[d];
            rest /= dd[d];
            if c >= id[d] {
                return;
            }
            io += c * scale;
            scale *= id[d];
        }
        let slab_start = si * slab_len;
        for k in io * rows_per_outer..(io + 1) * rows_per_outer {
            let dbase = row_offset(k, id, &ds, dim) - slab_start;
            let sbase = soff + row_offset(k, id, ss, usize::MAX);
            let ids = &idx[k * row_len..(k + 1) * row_len];
            for (t, &i) in ids.iter().enumerate() {
                let p = dbase + i * ds[dim] + t * dst_step;
                slab[p] = T::add(slab[p], src[sbase + t * ss[last]]);
            }
        }
    };
    if idx.len() >= PAR_THRESHOLD && dim > 0 {
        acc.par_chunks_mut(slab_len)
            .enumerate()
            .for_each(|(si, s)| add_slab(si, s));
    } else {
        acc.chunks_mut(slab_len).enumerate().for_each(|(si, s)| add_slab(si, s));
    }
    acc.into_iter().map(T::from_acc).collect()
}
