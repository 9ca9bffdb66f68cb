//! Batched matrix multiplication on top of the `gemm` crate.
//!
//! `gemm` picks its SIMD kernels at run time and takes arbitrary row and
//! column strides, so transposed and narrowed views are multiplied in place
//! and broadcast batch dims are just repeated offsets: no operand is copied.
//! f16 and bf16 operands are widened to f32, multiplied, and rounded once.

use super::copy::PAR_THRESHOLD;
use super::{unsupported_dtype, CpuInput, CpuResult, CpuStorage, StorageElement};
use half::{bf16, f16};
use rayon::prelude::*;
use rustorch_core::dtype::{DType, WithDType, C64};
use rustorch_core::error::BackendError;
use rustorch_core::layout::Layout;
use rustorch_core::op::{Op, TensorMeta};

/// Below this many multiply-adds one product stays on one thread.
const GEMM_PAR_THRESHOLD: usize = 1 << 18;

/// Element types `gemm` has kernels for. Sealed to the types that cannot
/// make `gemm::gemm` panic.
pub(crate) trait GemmElem: WithDType {}
impl GemmElem for f32 {}
impl GemmElem for f64 {}
impl GemmElem for C64 {}

/// One strided matrix operand: element (i, j) is at `ptr + i * rs + j * cs`.
#[derive(Clone, Copy)]
pub(crate) struct MatRef<T> {
    pub ptr: *const T,
    pub rs: usize,
    pub cs: usize,
}

/// `dst[m, n] (+)= lhs[m, k] * rhs[k, n]`; `dst` is row-major with row
/// stride `dst_rs`. With `accumulate` the product is added to what `dst`
/// holds, otherwise `dst` is overwritten. `parallel` lets gemm use all
/// rayon threads when the product is large enough to pay for it.
///
/// # Safety
/// Every element the strides address must lie inside live allocations
/// (`dst` writable and not aliased by `lhs` or `rhs`).
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn gemm_raw<T: GemmElem>(
    m: usize,
    n: usize,
    k: usize,
    dst: *mut T,
    dst_rs: usize,
    accumulate: bool,
    lhs: MatRef<T>,
    rhs: MatRef<T>,
    parallel: bool,
) {
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        if !accumulate {
            for i in 0..m {
                // SAFETY: row i of dst holds n elements (caller's contract).
                unsafe { std::slice::from_raw_parts_mut(dst.add(i * dst_rs), n).fill(T::zero()) };
            }
        }
        return;
    }
    let threads = rayon::current_num_threads();
    let par = if parallel && threads > 1 && m * n * k >= GEMM_PAR_THRESHOLD {
        gemm::Parallelism::Rayon(threads)
    } else {
        gemm::Parallelism::None
    };
    // gemm computes dst = alpha * dst + beta * lhs * rhs; alpha only
    // matters when it reads dst.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst,
            1,
            dst_rs as isize,
            accumulate,
            lhs.ptr,
            lhs.cs as isize,
            lhs.rs as isize,
            rhs.ptr,
            rhs.cs as isize,
            rhs.rs as isize,
            T::one(),
            T::one(),
            false,
            false,
            false,
            par,
        )
    }
}

pub fn execute(op: &Op, inputs: &[CpuInput<'_>], outputs: &[TensorMeta]) -> CpuResult {
    let (Some(&a), Some(&b), Some(out)) = (inputs.first(), inputs.get(1), outputs.first()) else {
        return Err(BackendError::invalid(op.name(), "expects two inputs and one output"));
    };
    if b.dtype() != a.dtype() {
        return Err(BackendError::invalid(op.name(), "operands have different dtypes"));
    }
    match a.dtype() {
        DType::F32 => native::<f32>(op, a, b, out),
        DType::F64 => native::<f64>(op, a, b, out),
        DType::C64 => native::<C64>(op, a, b, out),
        DType::F16 => via_f32::<f16>(op, a, b, out),
        DType::BF16 => via_f32::<bf16>(op, a, b, out),
        d => Err(unsupported_dtype(op, d)),
    }
}

fn typed<'a, T: StorageElement>(op: &Op, i: CpuInput<'a>) -> Result<&'a [T], BackendError> {
    i.storage
        .as_slice::<T>()
        .ok_or_else(|| unsupported_dtype(op, i.dtype()))
}

fn native<T: GemmElem + StorageElement>(op: &Op, a: CpuInput<'_>, b: CpuInput<'_>, out: &TensorMeta) -> CpuResult {
    let (ad, bd) = (typed::<T>(op, a)?, typed::<T>(op, b)?);
    Ok(vec![CpuStorage::from_vec(matmul_strided(
        op, ad, a.layout, bd, b.layout, out,
    )?)])
}

/// f16/bf16: widen the storage range each operand touches to f32 (keeping
/// its strides, so views stay views), multiply in f32, round once.
fn via_f32<T: StorageElement>(op: &Op, a: CpuInput<'_>, b: CpuInput<'_>, out: &TensorMeta) -> CpuResult {
    let (ad, bd) = (typed::<T>(op, a)?, typed::<T>(op, b)?);
    let (aw, la) = widen(ad, a.layout)?;
    let (bw, lb) = widen(bd, b.layout)?;
    let r = matmul_strided(op, &aw, &la, &bw, &lb, out)?;
    Ok(vec![CpuStorage::from_vec(narrow_from_f32::<T>(&r))])
}

/// The elements `layout` can reach, converted to f32, and the same layout
/// rebased onto that buffer.
fn widen<T: WithDType>(data: &[T], layout: &Layout) -> Result<(Vec<f32>, Layout), BackendError> {
    let range = layout.offset()..layout.storage_extent().max(layout.offset());
    let src = data
        .get(range)
        .ok_or_else(|| BackendError::invalid("matmul", "layout reaches past the end of its storage"))?;
    let v = if src.len() >= PAR_THRESHOLD {
        src.par_iter().map(|x| x.to_f32()).collect()
    } else {
        src.iter().map(|x| x.to_f32()).collect()
    };
    let l = Layout::from_parts(layout.shape().clone(), layout.strides().to_vec(), 0)
        .map_err(|e| BackendError::invalid("matmul", e.to_string()))?;
    Ok((v, l))
}

/// Rounds f32 results to `T` (once, round-to-nearest-even).
pub(crate) fn narrow_from_f32<T: WithDType>(v: &[f32]) -> Vec<T> {
    if v.len() >= PAR_THRESHOLD {
        v.par_iter().map(|&x| T::from_f32(x)).collect()
    } else {
        v.iter().map(|&x| T::from_f32(x)).collect()
    }
}

/// How one operand's batch dims map onto the output's: per output batch
/// dim, the operand's stride (0 where it broadcasts).
fn batch_strides(layout: &Layout, out_batch: &[usize]) -> Vec<usize> {
    let r = layout.rank() - 2;
    let extra = out_batch.len() - r;
    (0..out_batch.len())
        .map(|i| {
            if i < extra || layout.dims()[i - extra] == 1 {
                0
            } else {
                layout.strides()[i - extra]
            }
        })
        .collect()
}

/// Storage offset of every output batch entry, in row-major order.
fn batch_offsets(base: usize, strides: &[usize], dims: &[usize]) -> Vec<usize> {
    let total: usize = dims.iter().product();
    let mut offs = Vec::with_capacity(total);
    let mut idx = vec![0usize; dims.len()];
    let mut off = base;
    for _ in 0..total {
        offs.push(off);
        for d in (0..dims.len()).rev() {
            idx[d] += 1;
            off += strides[d];
            if idx[d] < dims[d] {
                break;
            }
            off -= strides[d] * dims[d];
            idx[d] = 0;
        }
    }
    offs
}

/// When `b` is the same matrix for every batch entry and `a`'s batch and
/// row dims collapse into one strided dim, the whole product is one
/// (batch * m) x k x n gemm: the common `x @ W` of a linear layer.
/// Returns the row stride of the collapsed lhs.
fn folded_rows(a: &Layout, a_bs: &[usize], b_bs: &[usize], batch: &[usize]) -> Option<usize> {
    if b_bs.iter().zip(batch).any(|(&s, &d)| s != 0 && d > 1) {
        return None;
    }
    let r = a.rank();
    // (size, stride) of every dim that becomes part of the folded rows,
    // outermost first; size-1 dims do not constrain the fold.
    let mut chain: Vec<(usize, usize)> = a_bs
        .iter()
        .zip(batch)
        .filter(|(_, &d)| d > 1)
        .map(|(&s, &d)| (d, s))
        .collect();
    if a.dims()[r - 2] > 1 {
        chain.push((a.dims()[r - 2], a.strides()[r - 2]));
    }
    // Each dim must step exactly over the one inside it.
    if chain.windows(2).any(|w| w[0].1 != w[1].0 * w[1].1) {
        return None;
    }
    Some(chain.last().map_or(a.strides()[r - 2], |&(_, s)| s))
}

fn matmul_strided<T: GemmElem>(
    op: &Op,
    a: &[T],
    la: &Layout,
    b: &[T],
    lb: &Layout,
    out: &TensorMeta,
) -> Result<Vec<T>, BackendError> {
    let od = out.shape.dims();
    if la.rank() < 2 || lb.rank() < 2 || od.len() < 2 {
        return Err(BackendError::invalid(op.name(), "operands must have rank >= 2"));
    }
    let (ra, rb) = (la.rank(), lb.rank());
    let (m, k, n) = (la.dims()[ra - 2], la.dims()[ra - 1], lb.dims()[rb - 1]);
    let batch = &od[..od.len() - 2];
    let shapes_ok = lb.dims()[rb - 2] == k
        && od[od.len() - 2] == m
        && od[od.len() - 1] == n
        && batch.len() >= ra - 2
        && batch.len() >= rb - 2;
    if !shapes_ok {
        return Err(BackendError::invalid(
            op.name(),
            "operand shapes do not match the output",
        ));
    }
    let nb: usize = batch.iter().product();
    let mut dst = vec![T::zero(); out.shape.numel()];
    if dst.is_empty() || k == 0 {
        return Ok(dst);
    }
    // Every address the strides produce must be in bounds for gemm.
    if la.storage_extent() > a.len() || lb.storage_extent() > b.len() {
        return Err(BackendError::invalid(
            op.name(),
            "layout reaches past the end of its storage",
        ));
    }
    let lhs_at = |off: usize| MatRef {
        ptr: a[off..].as_ptr(),
        rs: la.strides()[ra - 2],
        cs: la.strides()[ra - 1],
    };
    let rhs_at = |off: usize| MatRef {
        ptr: b[off..].as_ptr(),
        rs: lb.strides()[rb - 2],
        cs: lb.strides()[rb - 1],
    };
    let a_bs = batch_strides(la, batch);
    let b_bs = batch_strides(lb, batch);

    if nb > 1 {
        if let Some(rs) = folded_rows(la, &a_bs, &b_bs, batch) {
            let lhs = MatRef {
                rs,
                ..lhs_at(la.offset())
            };
            // SAFETY: the fold addresses exactly the rows of `a`'s layout,
            // and dst holds nb * m rows of n.
            unsafe { gemm_raw(nb * m, n, k, dst.as_mut_ptr(), n, false, lhs, rhs_at(lb.offset()), true) };
            return Ok(dst);
        }
    }

    let a_off = batch_offsets(la.offset(), &a_bs, batch);
    let b_off = batch_offsets(lb.offset(), &b_bs, batch);
    let per = m * n * k;
    let threads = rayon::current_num_threads();
    let run = |i: usize, chunk: &mut [T], parallel: bool| {
        // SAFETY: the offsets walk in-bounds layouts; chunk is m x n.
        unsafe {
            gemm_raw(
                m,
                n,
                k,
                chunk.as_mut_ptr(),
                n,
                false,
                lhs_at(a_off[i]),
                rhs_at(b_off[i]),
                parallel,
            )
        }
    };
    // One thread per product avoids gemm's internal synchronization; it
    // pays off for small products, and for any size once the batch splits
    // evenly (or nearly so) over the threads.
    let even = nb.is_multiple_of(threads) || nb >= 4 * threads;
    if nb > 1 && threads > 1 && nb * per >= GEMM_PAR_THRESHOLD && (per < GEMM_PAR_THRESHOLD * 4 || even) {
        dst.par_chunks_mut(m * n)
            .enumerate()
            .for_each(|(i, c)| run(i, c, false));
    } else {
        dst.chunks_mut(m * n).enumerate().for_each(|(i, c)| run(i, c, true));
    }
    Ok(dst)
}
