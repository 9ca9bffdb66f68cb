//! Launchers for kernels/reduce.cu: reductions over any dims, softmax and
//! log-softmax over one, RMS and layer norm over the last dims (one block
//! per output row), and cumsum (one thread per row).

use super::float_suffix;
use crate::backend::CudaBackend;
use crate::buffer::CudaBuffer;
use crate::launch::{grid, per_row, Strided};
use cudarc::driver::LaunchConfig;
use rustorch_core::backend::TensorRef;
use rustorch_core::op::ReduceOp;
use rustorch_core::{BackendError, DType, Layout, Op, TensorMeta};

/// The input's kept dims (`outer`) and the `reduced` ones, as layouts.
pub(super) fn split(
    b: &CudaBackend,
    l: &Layout,
    reduced: &[usize],
) -> Result<(Strided, Strided, usize, usize), BackendError> {
    let (dims, strides) = (l.dims(), l.strides());
    let keep: Vec<usize> = (0..dims.len()).filter(|d| !reduced.contains(d)).collect();
    let pick = |which: &[usize]| -> (Vec<usize>, Vec<usize>) {
        (
            which.iter().map(|&d| dims[d]).collect(),
            which.iter().map(|&d| strides[d]).collect(),
        )
    };
    let (od, os) = pick(&keep);
    let (id, is) = pick(reduced);
    let deep = || BackendError::unsupported(b.device, "reduce", "more dims than the kernels take");
    let lo = Strided::from_parts(&od, &os, l.offset()).ok_or_else(deep)?;
    let li = Strided::from_parts(&id, &is, 0).ok_or_else(deep)?;
    Ok((lo, li, od.iter().product(), id.iter().product()))
}

fn too_many_rows(b: &CudaBackend, rows: usize) -> Result<(), BackendError> {
    if rows > i32::MAX as usize {
        return Err(BackendError::unsupported(b.device, "reduce", "more than 2^31 rows"));
    }
    Ok(())
}

pub(super) fn reduce(
    b: &CudaBackend,
    r: ReduceOp,
    dims: &[usize],
    x: &TensorRef<'_>,
    out: &TensorMeta,
) -> Result<CudaBuffer, BackendError> {
    let Some(ty) = float_suffix(x.dtype()) else {
        return reduce_int(b, r, dims, x, out);
    };
    let (lo, li, rows, n_inner) = split(b, x.layout, dims)?;
    too_many_rows(b, rows)?;
    let y = b.alloc(out.dtype, out.shape.numel())?;
    if rows == 0 {
        return Ok(y);
    }
    let xp = b.own(r.name(), x.buffer)?.ptr();
    let yp = y.ptr();
    let n64 = n_inner as i64;
    let best = matches!(r, ReduceOp::Max | ReduceOp::Min | ReduceOp::ArgMax | ReduceOp::ArgMin);
    if best && n_inner == 0 {
        return Err(BackendError::invalid(r.name(), "cannot reduce an empty dimension"));
    }
    let (kind, correction): (i32, i32) = match r {
        ReduceOp::Sum => (0, 0),
        ReduceOp::Mean => (1, 0),
        ReduceOp::Prod => (2, 0),
        ReduceOp::Var { correction } => (3, correction.min(i32::MAX as u32) as i32),
        ReduceOp::Std { correction } => (4, correction.min(i32::MAX as u32) as i32),
        _ => (0, 0),
    };
    let is_max: i32 = matches!(r, ReduceOp::Max | ReduceOp::ArgMax) as i32;
    let (vals, idx): (u64, u64) = if matches!(r, ReduceOp::ArgMax | ReduceOp::ArgMin) {
        (0, yp)
    } else {
        (yp, 0)
    };
    // Products stay in order on one thread (their rounding depends on it).
    if let Some((chunk, chunks)) = split_rows(b, rows, n_inner).filter(|_| r != ReduceOp::Prod) {
        let which = if best { "best" } else { "moments" };
        let part_name = format!("reduce_{which}_part_{ty}");
        let join_name = format!("reduce_{which}_join_{ty}");
        let (part, join) = (b.function("reduce", &part_name)?, b.function("reduce", &join_name)?);
        let (chunk64, chunks64, rows64) = (chunk as i64, chunks as i64, rows as i64);
        let parts = rows * chunks;
        let pv = b.alloc(DType::F64, parts * if best { 1 } else { 3 })?;
        let pi = b.alloc(DType::I64, if best { parts } else { 0 })?;
        let (pvp, pip) = (pv.ptr(), pi.ptr());
        let cfg = LaunchConfig {
            grid_dim: (chunks as u32, rows as u32, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut args = crate::launch::Launch::new(b, &part);
        args.arg(&xp).arg(&lo).arg(&li);
        let need_m2 = (kind >= 3) as i32;
        if best {
            args.arg(&pvp).arg(&pip).arg(&n64).arg(&chunk64).arg(&is_max);
        } else {
            args.arg(&pvp).arg(&n64).arg(&chunk64).arg(&need_m2);
        }
        // SAFETY: reduce_*_part_*(x, lo, li, partials, n, chunk, flag): the
        // grid is chunks x rows, each block writing its own partial.
        unsafe { args.launch(cfg) }.map_err(|e| b.launch_err(&part_name, e))?;
        let mut args = crate::launch::Launch::new(b, &join);
        if best {
            args.arg(&pvp)
                .arg(&pip)
                .arg(&vals)
                .arg(&idx)
                .arg(&rows64)
                .arg(&chunks64)
                .arg(&is_max);
        } else {
            args.arg(&pvp)
                .arg(&yp)
                .arg(&rows64)
                .arg(&chunks64)
                .arg(&kind)
                .arg(&correction);
        }
        // Moments join with one warp per row, bests with one thread per row.
        let cfg = if best {
            grid(rows, b.sm_count)
        } else {
            LaunchConfig {
                grid_dim: (rows as u32, 1, 1),
                block_dim: (32, 1, 1),
                shared_mem_bytes: 0,
            }
        };
        // SAFETY: reduce_*_join_*(partials, outputs, rows, chunks, ...): each
        // row's thread or warp reads that row's `chunks` partials.
        unsafe { args.launch(cfg) }.map_err(|e| b.launch_err(&join_name, e))?;
        return Ok(y);
    }
    let name = if best {
        format!("reduce_best_{ty}")
    } else {
        format!("reduce_moments_{ty}")
    };
    let f = b.function("reduce", &name)?;
    let mut args = crate::launch::Launch::new(b, &f);
    args.arg(&xp).arg(&lo).arg(&li);
    if best {
        args.arg(&vals).arg(&idx).arg(&n64).arg(&is_max);
    } else {
        args.arg(&yp).arg(&n64).arg(&kind).arg(&correction);
    }
    // SAFETY: the argument lists match reduce_best_* / reduce_moments_*;
    // `lo` and `li` address elements of `x` only (the executor checked its
    // layout); `y` holds one element per row.
    unsafe { args.launch(per_row(rows)) }.map_err(|e| b.launch_err(&name, e))?;
    Ok(y)
}

/// Reductions of integers and bools (kernels/reduce.cu, `REDUCE_INT`):
/// exact wrapping sums and products into i64, max/min in the input's
/// dtype, arg indices as i64 (infer's output dtypes, checked here since the
/// kernels write them). Mean, var and std take floats only, as infer says.
/// Few long rows split over blocks as the float reductions do, products
/// included: wrapping integer products do not depend on the order.
fn reduce_int(
    b: &CudaBackend,
    r: ReduceOp,
    dims: &[usize],
    x: &TensorRef<'_>,
    out: &TensorMeta,
) -> Result<CudaBuffer, BackendError> {
    let ty = match x.dtype() {
        DType::I32 => "I32",
        DType::I64 => "I64",
        DType::U8 => "U8",
        DType::Bool => "BOOL",
        _ => {
            return Err(BackendError::unsupported(
                b.device,
                r.name(),
                "no kernel for this dtype",
            ))
        }
    };
    let (best, arg, prod) = match r {
        ReduceOp::Sum => (false, false, false),
        ReduceOp::Prod => (false, false, true),
        ReduceOp::Max | ReduceOp::Min => (true, false, false),
        ReduceOp::ArgMax | ReduceOp::ArgMin => (true, true, false),
        ReduceOp::Mean | ReduceOp::Var { .. } | ReduceOp::Std { .. } => {
            return Err(BackendError::unsupported(
                b.device,
                r.name(),
                "needs a floating-point input",
            ))
        }
    };
    let want = if best && !arg { x.dtype() } else { DType::I64 };
    if out.dtype != want {
        return Err(BackendError::invalid(
            r.name(),
            format!("output dtype {:?}, expected {want:?}", out.dtype),
        ));
    }
    let (lo, li, rows, n_inner) = split(b, x.layout, dims)?;
    too_many_rows(b, rows)?;
    if out.shape.numel() != rows {
        return Err(BackendError::invalid(
            r.name(),
            "output size differs from the kept dims",
        ));
    }
    if best && n_inner == 0 && rows > 0 {
        return Err(BackendError::invalid(r.name(), "cannot reduce an empty dimension"));
    }
    let y = b.alloc(out.dtype, rows)?;
    if rows == 0 {
        return Ok(y);
    }
    let xp = b.own(r.name(), x.buffer)?.ptr();
    let yp = y.ptr();
    let n64 = n_inner as i64;
    // prod for the folds, is_max for max/min.
    let flag: i32 = if best {
        matches!(r, ReduceOp::Max | ReduceOp::ArgMax) as i32
    } else {
        prod as i32
    };
    let (vals, idx): (u64, u64) = if arg { (0, yp) } else { (yp, 0) };
    if let Some((chunk, chunks)) = split_rows(b, rows, n_inner) {
        let which = if best { "best" } else { "fold" };
        let part_name = format!("reduce_{which}_part_{ty}");
        let join_name = if best {
            format!("reduce_best_join_{ty}")
        } else {
            "reduce_fold_join".to_string()
        };
        let (part, join) = (b.function("reduce", &part_name)?, b.function("reduce", &join_name)?);
        let (chunk64, chunks64, rows64) = (chunk as i64, chunks as i64, rows as i64);
        let parts = rows * chunks;
        // Partial values (u64 folds or i64 best values), and for max/min
        // their indices.
        let pv = b.alloc(DType::I64, parts)?;
        let pi = b.alloc(DType::I64, if best { parts } else { 0 })?;
        let (pvp, pip) = (pv.ptr(), pi.ptr());
        let cfg = LaunchConfig {
            grid_dim: (chunks as u32, rows as u32, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut args = crate::launch::Launch::new(b, &part);
        args.arg(&xp).arg(&lo).arg(&li).arg(&pvp);
        if best {
            args.arg(&pip);
        }
        args.arg(&n64).arg(&chunk64).arg(&flag);
        // SAFETY: reduce_fold_part_*(x, lo, li, part, n, chunk, prod) and
        // reduce_best_part_*(x, lo, li, pv, pi, n, chunk, is_max): the grid
        // is chunks x rows, each block writing its own partial of `parts`.
        unsafe { args.launch(cfg) }.map_err(|e| b.launch_err(&part_name, e))?;
        let mut args = crate::launch::Launch::new(b, &join);
        args.arg(&pvp);
        if best {
            args.arg(&pip).arg(&vals).arg(&idx);
        } else {
            args.arg(&yp);
        }
        args.arg(&rows64).arg(&chunks64).arg(&flag);
        // SAFETY: reduce_fold_join(part, y, rows, chunks, prod) and
        // reduce_best_join_*(pv, pi, y or null, yi or null, rows, chunks,
        // is_max): one thread per row reads its row's `chunks` partials and
        // writes one output of `rows`.
        unsafe { args.launch(grid(rows, b.sm_count)) }.map_err(|e| b.launch_err(&join_name, e))?;
        return Ok(y);
    }
    let name = if best {
        format!("reduce_best_{ty}")
    } else {
        format!("reduce_fold_{ty}")
    };
    let f = b.function("reduce", &name)?;
    let mut args = crate::launch::Launch::new(b, &f);
    args.arg(&xp).arg(&lo).arg(&li);
    if best {
        args.arg(&vals).arg(&idx);
    } else {
        args.arg(&yp);
    }
    args.arg(&n64).arg(&flag);
    // SAFETY: reduce_fold_*(x, lo, li, y, n, prod) and reduce_best_*(x, lo,
    // li, y or null, yi or null, n, is_max); `lo` and `li` address elements
    // of `x` only (the executor checked its layout); `y` holds one element
    // per row.
    unsafe { args.launch(per_row(rows)) }.map_err(|e| b.launch_err(&name, e))?;
    Ok(y)
}

/// `(chunk, chunks)` where `rows` rows of `n` elements are too few to fill
/// the GPU with one block per row: each row cut into `chunks` pieces of
/// `chunk` elements (at least 4096 each), about eight blocks per SM in all.
fn split_rows(b: &CudaBackend, rows: usize, n: usize) -> Option<(usize, usize)> {
    const MIN_CHUNK: usize = 4096;
    let target_blocks = 8 * b.sm_count.max(1) as usize;
    if rows >= target_blocks / 2 || rows > u16::MAX as usize {
        return None;
    }
    let want = target_blocks.div_ceil(rows).min(n / MIN_CHUNK);
    if want < 2 {
        return None;
    }
    let chunk = n.div_ceil(want);
    Some((chunk, n.div_ceil(chunk)))
}

/// `Op::AddRmsNorm` (f32): s = x + a and the RMS norm of s times the
/// weight in one launch (`add_rms_norm_{warp,block}_F32`, the plain norm's
/// code with the add before it), for rows that fit in registers (`supports`
/// declines longer ones: they run as the add and the norm, the op's
/// decomposition); strided inputs are copied first. A one-row norm also
/// quantizes its row for the products after it, in the activation layouts
/// `wanted` (`[Q32, K]`, quant.rs `layouts_read_by`).
pub(super) fn add_rms_norm(
    b: &CudaBackend,
    op: &Op,
    eps: f64,
    inputs: &[TensorRef<'_>],
    out: &[TensorMeta],
    wanted: [bool; 2],
) -> Result<Vec<CudaBuffer>, BackendError> {
    let (x, a, w) = (&inputs[0], &inputs[1], &inputs[2]);
    let n = x.layout.dims().last().copied().unwrap_or(1);
    let rows = x.layout.shape().numel().checked_div(n).unwrap_or(0);
    let Some((mode, cfg)) = rows_in_registers("F32", true, rows, n) else {
        return Err(BackendError::unsupported(
            b.device,
            op.name(),
            "strided inputs or rows longer than a block holds",
        ));
    };
    too_many_rows(b, rows)?;
    let s = b.alloc(out[0].dtype, out[0].shape.numel())?;
    let y = b.alloc(out[1].dtype, out[1].shape.numel())?;
    if rows == 0 || n == 0 {
        return Ok(vec![s, y]);
    }
    // Each input's first element, from a contiguous copy where it is strided.
    let mut copies = Vec::new();
    let mut at = |t: &TensorRef<'_>| -> Result<u64, BackendError> {
        if t.layout.is_contiguous() {
            return Ok(b.own(&op.name(), t.buffer)?.ptr() + 4 * t.layout.offset() as u64);
        }
        let c = super::matmul::contiguous(b, t, t.layout.shape())?;
        let p = c.ptr();
        copies.push(c);
        Ok(p)
    };
    let (xp, ap, wp) = (at(x)?, at(a)?, at(w)?);
    if !w.layout.is_contiguous() {
        // The one-row norm reads its weight before its wait; here that is
        // a copy just queued (the conformance suite's strided weights: it
        // read zeros in some runs on the H200).
        b.serialize_next_launch();
    }
    let threads = cfg.block_dim.0 as usize;
    // A decode step's norm (one row, in registers): add_rms_norm_q_lean_F32,
    // which also quantizes the row for the products after it where they
    // read a quantized row (`wanted`).
    let one_row = rows == 1 && mode == "block" && b.norm_quant && n.is_multiple_of(32);
    let quantized = if one_row && wanted.contains(&true) {
        Some(super::quant::norm_row_acts(b, n, threads, wanted)?)
    } else {
        None
    };
    let (module, kernel, cfg) = if one_row {
        (
            "quant",
            "add_rms_norm_q_lean_F32".to_string(),
            LaunchConfig {
                grid_dim: (n.div_ceil(threads) as u32, 1, 1),
                ..cfg
            },
        )
    } else {
        ("reduce", format!("add_rms_norm_{mode}_F32"), cfg)
    };
    let lo = Strided::from_parts(&[rows], &[n], 0).expect("one dim");
    let lw = Strided::from_parts(&[n], &[1], 0).expect("one dim");
    let (sp, yp, n64, rows64) = (s.ptr(), y.ptr(), n as i64, rows as i64);
    let f = b.function(module, &kernel)?;
    let n32 = n as i32;
    // The quantizing kernel's seven layout arrays (null where not wanted).
    let arrays = quantized.as_ref().map_or([0u64; 7], |(_, arrays)| *arrays);
    let mut args = crate::launch::Launch::new(b, &f);
    if one_row {
        args.arg(&xp).arg(&ap).arg(&wp).arg(&sp).arg(&yp).arg(&n32).arg(&eps);
        arrays.iter().for_each(|p| {
            args.arg(p);
        });
    } else {
        args.arg(&xp)
            .arg(&lo)
            .arg(&ap)
            .arg(&wp)
            .arg(&lw)
            .arg(&sp)
            .arg(&yp)
            .arg(&n64)
            .arg(&eps)
            .arg(&rows64);
    }
    // SAFETY: add_rms_norm_{warp,block}_F32(x, lo, a, w, lw, s, y, n, eps,
    // rows): x, a and w contiguous f32 from their offsets (checked above),
    // rows * n values each (n for w); s and y hold rows * n.
    // add_rms_norm_q_lean_F32(x, a, w, s, y, n, eps, q32, d32, sum32, s32,
    // qk, dk, bsumk): the same for one row (n <= REGISTER_ROW_MAX, the block
    // mode's bound, so n fits an i32), and each layout's arrays (null where
    // absent) in the allocation norm_row_acts made for them.
    unsafe { args.launch(cfg) }.map_err(|e| b.launch_err(&kernel, e))?;
    let mut y = y;
    if let Some((acts, _)) = quantized {
        y.row_acts = Some(Box::new(acts));
    }
    Ok(vec![s, y])
}

/// Values a thread holds in registers (`ROW_PER` in kernels/rows.cuh).
pub(super) const ROW_PER: usize = 8;
/// The longest row the register kernels hold (a block of 1024 threads).
pub(super) const REGISTER_ROW_MAX: usize = 1024 * ROW_PER;

/// The kernels that hold a row in registers (kernels/reduce.cu, `ROW_PER`
/// values per thread): one warp per row up to 32 * ROW_PER elements, else
/// one block per row, sized to the row, up to 1024 * ROW_PER; `None` (the
/// general kernels) for f64, for rows that are not contiguous, and for
/// longer rows.
fn rows_in_registers(ty: &str, contiguous_rows: bool, rows: usize, n: usize) -> Option<(&'static str, LaunchConfig)> {
    if ty == "F64" || !contiguous_rows {
        return None;
    }
    if n <= 32 * ROW_PER {
        const ROWS_PER_BLOCK: usize = 8;
        Some((
            "warp",
            LaunchConfig {
                grid_dim: (rows.div_ceil(ROWS_PER_BLOCK) as u32, 1, 1),
                block_dim: (32 * ROWS_PER_BLOCK as u32, 1, 1),
                shared_mem_bytes: 0,
            },
        ))
    } else if n <= REGISTER_ROW_MAX {
        let threads = n.div_ceil(ROW_PER).next_multiple_of(32);
        Some((
            "block",
            LaunchConfig {
                grid_dim: (rows as u32, 1, 1),
                block_dim: (threads as u32, 1, 1),
                shared_mem_bytes: 0,
            },
        ))
    } else {
        None
    }
}

pub(super) fn softmax(
    b: &CudaBackend,
    dim: usize,
    log: bool,
    x: &TensorRef<'_>,
    out: &TensorMeta,
) -> Result<CudaBuffer, BackendError> {
    let name = if log { "log_softmax" } else { "softmax" };
    let ty = float_suffix(x.dtype()).ok_or_else(|| BackendError::unsupported(b.device, name, "float dtypes only"))?;
    let (lo, li, rows, n_inner) = split(b, x.layout, &[dim])?;
    too_many_rows(b, rows)?;
    let y = b.alloc(out.dtype, out.shape.numel())?;
    if rows == 0 || n_inner == 0 {
        return Ok(y);
    }
    let contiguous = Layout::contiguous(out.shape.clone());
    let (yo, yi, _, _) = split(b, &contiguous, &[dim])?;
    let (xp, yp, n64, log_out) = (b.own(name, x.buffer)?.ptr(), y.ptr(), n_inner as i64, log as i32);
    let contiguous_rows = li.single_stride() == Some(1) && yi.single_stride() == Some(1);
    if let Some((mode, cfg)) = rows_in_registers(ty, contiguous_rows, rows, n_inner) {
        let kernel = format!("softmax_{mode}_{ty}");
        let f = b.function("reduce", &kernel)?;
        let rows64 = rows as i64;
        let mut args = crate::launch::Launch::new(b, &f);
        args.arg(&xp)
            .arg(&lo)
            .arg(&yp)
            .arg(&yo)
            .arg(&n64)
            .arg(&log_out)
            .arg(&rows64);
        // SAFETY: softmax_{warp,block}_*(x, lo, y, yo, n, log, rows): rows
        // contiguous in input and output (checked above), `cfg` covers
        // `rows` rows of at most the kernel's row length.
        unsafe { args.launch(cfg) }.map_err(|e| b.launch_err(&kernel, e))?;
        return Ok(y);
    }
    let kernel = format!("softmax_{ty}");
    let f = b.function("reduce", &kernel)?;
    let mut args = crate::launch::Launch::new(b, &f);
    args.arg(&xp)
        .arg(&lo)
        .arg(&li)
        .arg(&yp)
        .arg(&yo)
        .arg(&yi)
        .arg(&n64)
        .arg(&log_out);
    // SAFETY: softmax_*(x, lo, li, y, yo, yi, n, log): input split as in
    // `reduce`, output split the same way over its contiguous layout.
    unsafe { args.launch(per_row(rows)) }.map_err(|e| b.launch_err(&kernel, e))?;
    Ok(y)
}

pub(super) fn rms_norm(
    b: &CudaBackend,
    op: &Op,
    eps: f64,
    inputs: &[TensorRef<'_>],
    out: &TensorMeta,
) -> Result<CudaBuffer, BackendError> {
    let x = &inputs[0];
    let ty =
        float_suffix(x.dtype()).ok_or_else(|| BackendError::unsupported(b.device, op.name(), "float dtypes only"))?;
    let last = x.layout.rank().saturating_sub(1);
    let (lo, li, rows, n_inner) = if x.layout.rank() == 0 {
        let s = Strided::from_parts(&[], &[], x.layout.offset()).expect("no dims");
        (s, Strided::from_parts(&[], &[], 0).expect("no dims"), 1, 1)
    } else {
        split(b, x.layout, &[last])?
    };
    too_many_rows(b, rows)?;
    let y = b.alloc(out.dtype, out.shape.numel())?;
    if rows == 0 || n_inner == 0 {
        return Ok(y);
    }
    let (wp, lw) = match inputs.get(1) {
        Some(w) => (
            b.own(&op.name(), w.buffer)?.ptr(),
            Strided::broadcast(w.layout, &rustorch_core::Shape::from([n_inner]))
                .ok_or_else(|| BackendError::unsupported(b.device, op.name(), "weight layout"))?,
        ),
        None => (0u64, Strided::from_parts(&[n_inner], &[0], 0).expect("one dim")),
    };
    let (xp, yp, n64) = (b.own(&op.name(), x.buffer)?.ptr(), y.ptr(), n_inner as i64);
    let contiguous = li.single_stride() == Some(1) && (wp == 0 || lw.single_stride() == Some(1));
    if let Some((mode, cfg)) = rows_in_registers(ty, contiguous, rows, n_inner) {
        let kernel = format!("rms_norm_{mode}_{ty}");
        let f = b.function("reduce", &kernel)?;
        let rows64 = rows as i64;
        let mut args = crate::launch::Launch::new(b, &f);
        args.arg(&xp)
            .arg(&lo)
            .arg(&wp)
            .arg(&lw)
            .arg(&yp)
            .arg(&n64)
            .arg(&eps)
            .arg(&rows64);
        // SAFETY: rms_norm_{warp,block}_*(x, lo, w or null, lw, y, n, eps,
        // rows): input rows and weight contiguous (checked above), `y`
        // rows * n.
        unsafe { args.launch(cfg) }.map_err(|e| b.launch_err(&kernel, e))?;
        return Ok(y);
    }
    let kernel = format!("rms_norm_{ty}");
    let f = b.function("reduce", &kernel)?;
    let mut args = crate::launch::Launch::new(b, &f);
    args.arg(&xp)
        .arg(&lo)
        .arg(&li)
        .arg(&wp)
        .arg(&lw)
        .arg(&yp)
        .arg(&n64)
        .arg(&eps);
    // SAFETY: rms_norm_*(x, lo, li, w or null, lw, y, n, eps); the weight
    // has `n` elements (infer checked it), `y` rows * n.
    unsafe { args.launch(per_row(rows)) }.map_err(|e| b.launch_err(&kernel, e))?;
    Ok(y)
}

/// `Op::LayerNorm` over the last `normalized_dims` dims; inputs x, then
/// weight and bias when present (each of the normalized shape, read
/// through its own layout).
pub(super) fn layer_norm(
    b: &CudaBackend,
    op: &Op,
    inputs: &[TensorRef<'_>],
    out: &TensorMeta,
) -> Result<CudaBuffer, BackendError> {
    let Op::LayerNorm {
        eps,
        normalized_dims,
        has_weight,
        has_bias,
    } = *op
    else {
        return Err(BackendError::invalid(op.name(), "not a layer norm"));
    };
    let x = &inputs[0];
    let ty =
        float_suffix(x.dtype()).ok_or_else(|| BackendError::unsupported(b.device, op.name(), "float dtypes only"))?;
    let rank = x.layout.rank();
    let k = normalized_dims.min(rank);
    let reduced: Vec<usize> = (rank - k..rank).collect();
    let (lo, li, rows, n_inner) = split(b, x.layout, &reduced)?;
    too_many_rows(b, rows)?;
    let y = b.alloc(out.dtype, out.shape.numel())?;
    if rows == 0 || n_inner == 0 {
        return Ok(y);
    }
    let param = |present: bool, i: usize| -> Result<(u64, Strided), BackendError> {
        if !present {
            return Ok((0, Strided::from_parts(&[n_inner], &[0], 0).expect("one dim")));
        }
        let p = &inputs[i];
        if p.layout.shape().numel() != n_inner {
            return Err(BackendError::invalid(
                op.name(),
                "weight and bias must have the normalized shape",
            ));
        }
        let l = Strided::from_parts(p.layout.dims(), p.layout.strides(), p.layout.offset())
            .ok_or_else(|| BackendError::unsupported(b.device, op.name(), "more dims than the kernels take"))?;
        Ok((b.own(&op.name(), p.buffer)?.ptr(), l))
    };
    let (wp, lw) = param(has_weight, 1)?;
    let (bp, lb) = param(has_bias, 1 + has_weight as usize)?;
    let kernel = format!("layer_norm_{ty}");
    let f = b.function("reduce", &kernel)?;
    let (xp, yp, n64) = (b.own(&op.name(), x.buffer)?.ptr(), y.ptr(), n_inner as i64);
    let mut args = crate::launch::Launch::new(b, &f);
    args.arg(&xp)
        .arg(&lo)
        .arg(&li)
        .arg(&wp)
        .arg(&lw)
        .arg(&bp)
        .arg(&lb)
        .arg(&yp)
        .arg(&n64)
        .arg(&eps);
    // SAFETY: layer_norm_*(x, lo, li, w or null, lw, b or null, lb, y, n,
    // eps); weight and bias hold `n` elements each (checked above), `y`
    // rows * n.
    unsafe { args.launch(per_row(rows)) }.map_err(|e| b.launch_err(&kernel, e))?;
    Ok(y)
}

/// `Op::Cumsum` along `dim`: floats keep their dtype, integers and bools
/// give i64 (infer's output dtype).
pub(super) fn cumsum(
    b: &CudaBackend,
    dim: usize,
    x: &TensorRef<'_>,
    out: &TensorMeta,
) -> Result<CudaBuffer, BackendError> {
    let ty = super::cast_suffix(x.dtype())
        .ok_or_else(|| BackendError::unsupported(b.device, "cumsum", "no kernel for this dtype"))?;
    if dim >= x.layout.rank() {
        return Err(BackendError::invalid(
            "cumsum",
            format!("no dim {dim} in a rank {} tensor", x.layout.rank()),
        ));
    }
    let (lo, li, rows, len) = split(b, x.layout, &[dim])?;
    let y = b.alloc(out.dtype, out.shape.numel())?;
    if rows == 0 || len == 0 {
        return Ok(y);
    }
    let contiguous = Layout::contiguous(out.shape.clone());
    let (yo, yi, _, _) = split(b, &contiguous, &[dim])?;
    let kernel = format!("cumsum_{ty}");
    let f = b.function("reduce", &kernel)?;
    let (xp, yp, rows64, len64) = (b.own("cumsum", x.buffer)?.ptr(), y.ptr(), rows as i64, len as i64);
    let mut args = crate::launch::Launch::new(b, &f);
    args.arg(&xp)
        .arg(&lo)
        .arg(&li)
        .arg(&yp)
        .arg(&yo)
        .arg(&yi)
        .arg(&rows64)
        .arg(&len64);
    // SAFETY: cumsum_*(x, lo, li, y, yo, yi, rows, len): input split as in
    // `reduce`, output the same split of its contiguous layout; one thread
    // per row (grid-stride), `len` elements each.
    unsafe { args.launch(grid(rows, b.sm_count)) }.map_err(|e| b.launch_err(&kernel, e))?;
    Ok(y)
}
