//! Launchers for kernels/index.cu: index_select, embedding and gather (one
//! thread per output element, every non-complex dtype moved by element
//! size) and scatter_add (floats, integers and bools), with i32, i64 or u8
//! indices.
//!
//! Index checks: the CPU backend rejects an index outside the indexed
//! dimension with `InvalidInput`. The kernel never reads through such an
//! index; it sets a 4-byte flag instead, which the launcher downloads
//! before returning. That download waits for the stream (one small
//! synchronous copy per op): checking on the host first would download the
//! whole index tensor, and returning without waiting would let a bad index
//! pass silently. Only when the flag is set is the index tensor itself
//! downloaded, to name the first bad index exactly as the CPU's message
//! does.

use crate::backend::CudaBackend;
use crate::buffer::CudaBuffer;
use crate::launch::{grid, Strided};
use rustorch_core::backend::{Backend, TensorRef};
use rustorch_core::{BackendError, DType, Layout, Op, TensorMeta};

/// The kernels' name for an index dtype this backend takes.
pub(super) fn index_suffix(d: DType) -> Option<&'static str> {
    match d {
        DType::I32 => Some("I32"),
        DType::I64 => Some("I64"),
        DType::U8 => Some("U8"),
        _ => None,
    }
}

/// What the kernel needs besides the pointers: the source over the output's
/// dims (indexed dim's stride 0), the indexed dim's stride and size, and
/// where each output element's index sits.
struct Plan {
    xs: Strided,
    sd: i64,
    size: usize,
    li: Strided,
    /// The dim the CPU's error message names.
    dim: usize,
}

/// The kernel's layouts for `op` (index_select, embedding or gather) with
/// source layout `sl`, index layout `il` and output dims `out_dims`; `None`
/// for another op or past `MAX_DIMS` dims.
fn plan(op: &Op, sl: &Layout, il: &Layout, out_dims: &[usize]) -> Option<Plan> {
    Some(match *op {
        Op::IndexSelect { dim } => {
            let mut xs = sl.strides().to_vec();
            xs[dim] = 0;
            let mut is = vec![0; out_dims.len()];
            is[dim] = il.strides()[0];
            Plan {
                xs: Strided::from_parts(out_dims, &xs, sl.offset())?,
                sd: sl.strides()[dim] as i64,
                size: sl.dims()[dim],
                li: Strided::from_parts(out_dims, &is, il.offset())?,
                dim,
            }
        }
        Op::Embedding => {
            // Output [ids.., D]: the ids' dims index rows of the table, the
            // last dim walks a row.
            let k = il.rank();
            let mut xs = vec![0; k];
            xs.push(sl.strides()[1]);
            let mut is = il.strides().to_vec();
            is.push(0);
            Plan {
                xs: Strided::from_parts(out_dims, &xs, sl.offset())?,
                sd: sl.strides()[0] as i64,
                size: sl.dims()[0],
                li: Strided::from_parts(out_dims, &is, il.offset())?,
                dim: 0,
            }
        }
        Op::Gather { dim } => {
            // The output has the index's shape; outside `dim` its
            // coordinates address the source directly (infer checked that
            // they fit).
            let mut xs = sl.strides().to_vec();
            xs[dim] = 0;
            Plan {
                xs: Strided::from_parts(out_dims, &xs, sl.offset())?,
                sd: sl.strides()[dim] as i64,
                size: sl.dims()[dim],
                li: Strided::from_parts(il.dims(), il.strides(), il.offset())?,
                dim,
            }
        }
        _ => return None,
    })
}

pub(super) fn run(
    b: &CudaBackend,
    op: &Op,
    inputs: &[TensorRef<'_>],
    out: &TensorMeta,
) -> Result<CudaBuffer, BackendError> {
    let name = op.name();
    let (src, idx) = (&inputs[0], &inputs[1]);
    let deep = || BackendError::unsupported(b.device, name.clone(), "more dims than the kernels take");
    let out_dims = out.shape.dims();
    let il = idx.layout;
    let plan = match plan(op, src.layout, idx.layout, out_dims) {
        Some(p) => p,
        None if matches!(op, Op::IndexSelect { .. } | Op::Gather { .. } | Op::Embedding) => return Err(deep()),
        None => return Err(BackendError::unsupported(b.device, name, "not an indexing op")),
    };
    let ity = index_suffix(idx.dtype())
        .ok_or_else(|| BackendError::unsupported(b.device, name.clone(), "indices must be i32, i64 or u8"))?;
    let n = out.shape.numel();
    let y = b.alloc(out.dtype, n)?;
    if n == 0 {
        // No element reads an index, but the CPU still checks every one
        // (an empty source dim, say, with a non-empty index).
        if il.shape().numel() > 0 {
            if let Some(msg) = first_bad(b, idx, plan.size, plan.dim)? {
                return Err(BackendError::invalid(name, msg));
            }
        }
        return Ok(y);
    }
    let bad = super::ErrorFlag::new(b)?;
    let kernel = format!("index_gather_b{}_{ity}", out.dtype.size_in_bytes());
    let f = b.function("index", &kernel)?;
    let (xp, ip, yp, bp) = (
        b.own(&name, src.buffer)?.ptr(),
        b.own(&name, idx.buffer)?.ptr(),
        y.ptr(),
        bad.ptr(),
    );
    let (n64, size64) = (n as i64, plan.size as i64);
    let mut args = crate::launch::Launch::new(b, &f);
    args.arg(&xp)
        .arg(&plan.xs)
        .arg(&plan.sd)
        .arg(&size64)
        .arg(&ip)
        .arg(&plan.li)
        .arg(&yp)
        .arg(&n64)
        .arg(&bp);
    // SAFETY: index_gather_bN_I(x, xs, sd, size, idx, li, y, n, bad): `xs`
    // plus `v * sd` with 0 <= v < size stays inside the source (its layout
    // was checked by the executor and the output's dims outside the
    // indexed one fit the source's); `li` addresses index elements only;
    // `y` holds `n` elements and `bad` one i32.
    unsafe { args.launch(grid(n, b.sm_count)) }.map_err(|e| b.launch_err(&kernel, e))?;
    if bad.is_set(b)? {
        let msg = first_bad(b, idx, plan.size, plan.dim)?.unwrap_or_else(|| {
            format!(
                "an index is out of range for dimension {} of size {}",
                plan.dim, plan.size
            )
        });
        return Err(BackendError::invalid(name, msg));
    }
    Ok(y)
}

/// The CPU backend's message for the first index (row-major) outside
/// `0..size`, read from a download of the index tensor; `None` when all
/// are in range. Only on the error path (or for empty outputs), so the
/// download's cost does not matter.
pub(super) fn first_bad(
    b: &CudaBackend,
    idx: &TensorRef<'_>,
    size: usize,
    dim: usize,
) -> Result<Option<String>, BackendError> {
    let host = b.download(idx.buffer)?;
    let values: Vec<i64> = match idx.dtype() {
        DType::I64 => {
            let s = host.as_slice::<i64>().unwrap_or(&[]);
            idx.layout.indices().filter_map(|k| s.get(k).copied()).collect()
        }
        DType::I32 => {
            let s = host.as_slice::<i32>().unwrap_or(&[]);
            idx.layout
                .indices()
                .filter_map(|k| s.get(k).map(|&v| v as i64))
                .collect()
        }
        DType::U8 => {
            let s = host.as_slice::<u8>().unwrap_or(&[]);
            idx.layout
                .indices()
                .filter_map(|k| s.get(k).map(|&v| v as i64))
                .collect()
        }
        _ => Vec::new(),
    };
    Ok(values
        .into_iter()
        .find(|&i| i < 0 || i as u64 >= size as u64)
        .map(|i| format!("index {i} is out of range for dimension {dim} of size {size}")))
}

/// scatter_add's layouts over the work shape `work` (contiguous output).
struct ScatterPlan {
    yw: Strided,
    iw: Strided,
    isd: i64,
    sw: Strided,
    ssd: i64,
    inner: usize,
}

/// `out_dims`: the destination's (the output's, contiguous) dims; `work`
/// differs from them only where the index is smaller.
fn scatter_plan(dim: usize, out_dims: &[usize], work: &[usize], il: &Layout, sl: &Layout) -> Option<ScatterPlan> {
    let contiguous = rustorch_core::Shape::from(out_dims).contiguous_strides();
    let zero_dim = |l: &Layout| {
        let mut s = l.strides().to_vec();
        s[dim] = 0;
        s
    };
    Some(ScatterPlan {
        yw: Strided::from_parts(work, &contiguous, 0)?,
        iw: Strided::from_parts(work, &zero_dim(il), il.offset())?,
        isd: il.strides()[dim] as i64,
        sw: Strided::from_parts(work, &zero_dim(sl), sl.offset())?,
        ssd: sl.strides()[dim] as i64,
        inner: work[dim + 1..].iter().product(),
    })
}

/// `Op::ScatterAdd`: the destination copied to the output, then one thread
/// per element of the work shape (the index's dims, the scattered dim
/// replaced by the destination's) summing its contributions in order; see
/// kernels/index.cu for why there are no atomics.
pub(super) fn scatter_add(
    b: &CudaBackend,
    dim: usize,
    inputs: &[TensorRef<'_>],
    out: &TensorMeta,
) -> Result<CudaBuffer, BackendError> {
    let name = "scatter_add";
    let (dst, idx, src) = (&inputs[0], &inputs[1], &inputs[2]);
    let deep = || BackendError::unsupported(b.device, name, "more dims than the kernels take");
    let ty = super::cast_suffix(dst.dtype())
        .ok_or_else(|| BackendError::unsupported(b.device, name, "no kernel for this dtype"))?;
    let ity = index_suffix(idx.dtype())
        .ok_or_else(|| BackendError::unsupported(b.device, name, "indices must be i32, i64 or u8"))?;
    let (dd, id) = (dst.layout.dims(), idx.layout.dims());
    if src.dtype() != dst.dtype()
        || id.len() != dd.len()
        || src.layout.rank() != id.len()
        || dim >= dd.len()
        || (0..id.len()).any(|d| (d != dim && id[d] > dd[d]) || id[d] > src.layout.dims()[d])
    {
        // infer rejects these; the kernel's addressing relies on it.
        return Err(BackendError::invalid(name, "index, source and destination do not fit"));
    }
    let n_out = out.shape.numel();
    let y = b.alloc(out.dtype, n_out)?;
    let mut work = id.to_vec();
    work[dim] = dd[dim];
    let n: usize = work.iter().product();
    let k = id[dim];
    if n == 0 || k == 0 {
        // No thread reads an index; the CPU still checks every one (all are
        // out of range when the destination's dim is empty).
        if idx.layout.shape().numel() > 0 {
            if let Some(msg) = first_bad(b, idx, dd[dim], dim)? {
                return Err(BackendError::invalid(name, msg));
            }
        }
    }
    if n_out > 0 {
        let copy = format!("copy_b{}", out.dtype.size_in_bytes());
        let f = b.function("elementwise", &copy)?;
        let lx = Strided::broadcast(dst.layout, &out.shape).ok_or_else(deep)?;
        let (xp, yp, n64) = (b.own(name, dst.buffer)?.ptr(), y.ptr(), n_out as i64);
        let mut args = crate::launch::Launch::new(b, &f);
        args.arg(&xp).arg(&lx).arg(&yp).arg(&n64);
        // SAFETY: copy_bN(x, lx, y, n): the destination's own layout, `y`
        // holds `n` elements of the same size.
        unsafe { args.launch(grid(n_out, b.sm_count)) }.map_err(|e| b.launch_err(&copy, e))?;
    }
    if n == 0 || k == 0 {
        return Ok(y);
    }
    let ScatterPlan {
        yw,
        iw,
        isd,
        sw,
        ssd,
        inner,
    } = scatter_plan(dim, out.shape.dims(), &work, idx.layout, src.layout).ok_or_else(deep)?;
    let bad = super::ErrorFlag::new(b)?;
    let kernel = format!("scatter_add_{ty}_{ity}");
    let f = b.function("index", &kernel)?;
    let (yp, ip, sp, bp) = (
        y.ptr(),
        b.own(name, idx.buffer)?.ptr(),
        b.own(name, src.buffer)?.ptr(),
        bad.ptr(),
    );
    let (n64, inner64, dsize64, k64) = (n as i64, inner as i64, dd[dim] as i64, k as i64);
    let mut args = crate::launch::Launch::new(b, &f);
    args.arg(&yp)
        .arg(&yw)
        .arg(&ip)
        .arg(&iw)
        .arg(&isd)
        .arg(&sp)
        .arg(&sw)
        .arg(&ssd)
        .arg(&n64)
        .arg(&inner64)
        .arg(&dsize64)
        .arg(&k64)
        .arg(&bp);
    // SAFETY: scatter_add_T_I(y, yw, idx, iw, isd, src, sw, ssd, n, inner,
    // dsize, k, bad): the work shape fits the output (index dims <= the
    // destination's outside `dim`, checked above), the index's and
    // source's layouts plus j * stride (j < k = the index's size along
    // `dim`) stay inside their tensors (checked by the executor); each
    // output element is written by one thread only.
    unsafe { args.launch(grid(n, b.sm_count)) }.map_err(|e| b.launch_err(&kernel, e))?;
    // One 4-byte synchronous download: see the module's comment.
    if bad.is_set(b)? {
        let msg = first_bad(b, idx, dd[dim], dim)?
            .unwrap_or_else(|| format!("an index is out of range for dimension {dim} of size {}", dd[dim]));
        return Err(BackendError::invalid(name, msg));
    }
    Ok(y)
}

#[cfg(test)]
mod tests {
    //! The launchers' layouts, checked on the host: the kernels' address
    //! arithmetic (`Strided::at` is `strided_at`) against the ops'
    //! definitions, over strided views of every input.
    use super::*;
    use rustorch_core::Shape;

    fn lay(dims: &[usize]) -> Layout {
        Layout::contiguous(Shape::from(dims))
    }

    /// Row-major coordinates of element `i` of `dims`.
    fn coords(mut i: usize, dims: &[usize]) -> Vec<usize> {
        let mut c = vec![0; dims.len()];
        for d in (0..dims.len()).rev() {
            c[d] = i % dims[d];
            i /= dims[d];
        }
        c
    }

    /// Storage offset of coordinates `c` in layout `l`.
    fn at(l: &Layout, c: &[usize]) -> usize {
        l.offset() + c.iter().zip(l.strides()).map(|(a, s)| a * s).sum::<usize>()
    }

    /// Storage offsets the index kernel reads, given the index values
    /// stored at `ibuf` (storage order).
    fn kernel_reads(p: &Plan, ibuf: &[i64], n: usize) -> Vec<usize> {
        (0..n as i64)
            .map(|i| {
                let v = ibuf[p.li.at(i) as usize];
                assert!(v >= 0 && (v as usize) < p.size);
                (p.xs.at(i) + v * p.sd) as usize
            })
            .collect()
    }

    #[test]
    fn index_select_reads_the_selected_slices() {
        // Source [3, 5, 4] (a transposed view), index of stride 2 from offset 1.
        let sl = lay(&[3, 4, 5]).transpose("t", 1, 2).unwrap();
        let il = Layout::from_parts(Shape::from([3]), vec![2], 1).unwrap();
        let ibuf = [9, 4, 9, 0, 9, 2, 9];
        for dim in 0..3 {
            let ibuf: Vec<i64> = ibuf.iter().map(|&v| v.min(sl.dims()[dim] as i64 - 1)).collect();
            let mut out = sl.dims().to_vec();
            out[dim] = 3;
            let p = plan(&Op::IndexSelect { dim }, &sl, &il, &out).unwrap();
            let n: usize = out.iter().product();
            let want: Vec<usize> = (0..n)
                .map(|i| {
                    let mut c = coords(i, &out);
                    c[dim] = ibuf[at(&il, &[c[dim]])] as usize;
                    at(&sl, &c)
                })
                .collect();
            assert_eq!(kernel_reads(&p, &ibuf, n), want, "dim {dim}");
        }
    }

    #[test]
    fn embedding_reads_rows_of_a_narrowed_table() {
        // Table [10, 4]: columns 1..5 of [10, 6]; ids [3, 2] transposed.
        let sl = lay(&[10, 6]).narrow("n", 1, 1, 4).unwrap();
        let il = lay(&[2, 3]).transpose("t", 0, 1).unwrap();
        let ibuf = [7, 0, 3, 9, 1, 5];
        let out = [3, 2, 4];
        let p = plan(&Op::Embedding, &sl, &il, &out).unwrap();
        let want: Vec<usize> = (0..24)
            .map(|i| {
                let c = coords(i, &out);
                at(&sl, &[ibuf[at(&il, &c[..2])] as usize, c[2]])
            })
            .collect();
        assert_eq!(kernel_reads(&p, &ibuf, 24), want);
    }

    #[test]
    fn gather_reads_through_the_index() {
        // Source [4, 5, 6] (permuted view), index [3, 2, 6] smaller outside dim.
        let sl = lay(&[6, 4, 5]).permute("p", &[1, 2, 0]).unwrap();
        for dim in 0..3 {
            let mut id = vec![3, 2, 6];
            id[dim] = 2;
            let il = lay(&[id[2], id[0], id[1]]).permute("p", &[1, 2, 0]).unwrap();
            let n: usize = id.iter().product();
            let ibuf: Vec<i64> = (0..n as i64).map(|v| (v * 7) % sl.dims()[dim] as i64).collect();
            let p = plan(&Op::Gather { dim }, &sl, &il, &id).unwrap();
            let want: Vec<usize> = (0..n)
                .map(|i| {
                    let mut c = coords(i, &id);
                    c[dim] = ibuf[at(&il, &c)] as usize;
                    at(&sl, &c)
                })
                .collect();
            assert_eq!(kernel_reads(&p, &ibuf, n), want, "dim {dim}");
        }
    }

    #[test]
    fn scatter_add_sums_what_the_cpu_sums() {
        // Destination [3, 6] (contiguous output), index [2, 4], source [2, 5]
        // transposed from [5, 2]; both dims scattered in turn.
        let dd = [3usize, 6];
        let id = [2usize, 4];
        let sl = lay(&[5, 2]).transpose("t", 0, 1).unwrap();
        let il = lay(&[4, 2]).transpose("t", 0, 1).unwrap();
        let sbuf: Vec<i64> = (0..10).map(|v| 1 << v).collect();
        for dim in 0..2 {
            let ibuf: Vec<i64> = (0..8).map(|v| (v * 5 + 1) % dd[dim] as i64).collect();
            let dst: Vec<i64> = (0..18).map(|v| v * 1000).collect();
            // The CPU's loop: every index element, row-major.
            let mut want = dst.clone();
            for q in 0..8 {
                let c = coords(q, &id);
                let mut t = c.clone();
                t[dim] = ibuf[at(&il, &c)] as usize;
                want[t[0] * dd[1] + t[1]] += sbuf[at(&sl, &c)];
            }
            // The kernel's threads.
            let mut work = id.to_vec();
            work[dim] = dd[dim];
            let sp = scatter_plan(dim, &dd, &work, &il, &sl).unwrap();
            let mut got = dst.clone();
            let n: i64 = work.iter().product::<usize>() as i64;
            for i in 0..n {
                let t = (i / sp.inner as i64) % dd[dim] as i64;
                let (yo, io, so) = (sp.yw.at(i) as usize, sp.iw.at(i), sp.sw.at(i));
                for j in 0..id[dim] as i64 {
                    if ibuf[(io + j * sp.isd) as usize] == t {
                        got[yo] += sbuf[(so + j * sp.ssd) as usize];
                    }
                }
            }
            assert_eq!(got, want, "dim {dim}");
        }
    }
}
