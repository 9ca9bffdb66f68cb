//! Launchers for kernels/sort.cu: `Op::Sort` and `Op::TopK` (a full sort
//! of each row, then its first k), exact: the kernels sort the CPU's
//! (key, index) pairs, which are all distinct, so the order is the CPU's
//! to the element. Rows of up to `SHARED_MAX` elements are sorted by one
//! block in shared memory; longer ones in global scratch (12 bytes per
//! element, padded to a power of two), one launch per network step.

use super::reduce::split;
use crate::backend::CudaBackend;
use crate::buffer::CudaBuffer;
use crate::launch::grid;
use cudarc::driver::LaunchConfig;
use rustorch_core::backend::{Buffer, TensorRef};
use rustorch_core::{BackendError, DType, Layout, TensorMeta};
use std::sync::Arc;

/// Longest row sorted in shared memory: 12 bytes per element within the
/// 48 KiB a block may use without opting in to more.
const SHARED_MAX: usize = 4096;

/// The kernels' name for a dtype `supports` takes (every non-complex one).
pub(super) fn sort_suffix(d: DType) -> Option<&'static str> {
    match d {
        DType::F32 => Some("F32"),
        DType::F16 => Some("F16"),
        DType::BF16 => Some("BF16"),
        DType::F64 => Some("F64"),
        DType::I32 => Some("I32"),
        DType::I64 => Some("I64"),
        DType::U8 => Some("U8"),
        DType::Bool => Some("BOOL"),
        DType::C64 => None,
    }
}

/// Whether rows of `len` elements can be sorted: indices travel as u32,
/// with u32::MAX reserved for padding.
pub(super) fn row_fits(len: usize) -> bool {
    len < u32::MAX as usize
}

/// Sorts along `dim` and keeps the first `k` of each row (`k` = the dim's
/// size for `Op::Sort`); `descending` puts the largest first.
pub(super) fn sort(
    b: &CudaBackend,
    name: &str,
    x: &TensorRef<'_>,
    dim: usize,
    k: usize,
    descending: bool,
    outputs: &[TensorMeta],
) -> Result<Vec<Buffer>, BackendError> {
    let ty =
        sort_suffix(x.dtype()).ok_or_else(|| BackendError::unsupported(b.device, name, "no kernel for this dtype"))?;
    let rank = x.layout.rank();
    if dim >= rank {
        return Err(BackendError::invalid(
            name,
            format!("no dim {dim} in a rank {rank} tensor"),
        ));
    }
    let len = x.layout.dims()[dim];
    if k > len {
        return Err(BackendError::invalid(
            name,
            format!("k = {k} is larger than dimension {dim} ({len})"),
        ));
    }
    if !row_fits(len) {
        return Err(BackendError::unsupported(
            b.device,
            name,
            "rows of 2^32 elements or more",
        ));
    }
    let (vals_meta, idx_meta) = match outputs {
        [v, i] => (v, i),
        _ => return Err(BackendError::invalid(name, "expects two outputs")),
    };
    let n_out = vals_meta.shape.numel();
    let y = b.alloc(x.dtype(), n_out)?;
    let yi = b.alloc(DType::I64, idx_meta.shape.numel())?;
    let done = |y: CudaBuffer, yi: CudaBuffer| -> Vec<Buffer> { vec![Arc::new(y), Arc::new(yi)] };
    if n_out == 0 {
        return Ok(done(y, yi));
    }
    let (lo, li, rows, _) = split(b, x.layout, &[dim])?;
    let (yo, yl, _, _) = split(b, &Layout::contiguous(vals_meta.shape.clone()), &[dim])?;
    let p = len.next_power_of_two();
    let xp = b.own(name, x.buffer)?.ptr();
    let (yp, ip) = (y.ptr(), yi.ptr());
    let (len64, p64, k64, desc) = (len as i64, p as i64, k as i64, descending as i32);
    if p <= SHARED_MAX {
        if rows > i32::MAX as usize {
            return Err(BackendError::unsupported(b.device, name, "more than 2^31 rows"));
        }
        let kernel = format!("sort_rows_{ty}");
        let f = b.function("sort", &kernel)?;
        let mut args = crate::launch::Launch::new(b, &f);
        args.arg(&xp)
            .arg(&lo)
            .arg(&li)
            .arg(&len64)
            .arg(&p64)
            .arg(&k64)
            .arg(&desc)
            .arg(&yp)
            .arg(&ip)
            .arg(&yo)
            .arg(&yl);
        let cfg = LaunchConfig {
            grid_dim: (rows as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: (p * 12) as u32,
        };
        // SAFETY: sort_rows_*(x, lo, li, len, p, k, descending, y, yidx, yo,
        // yi): `lo`/`li` address the input's elements (split of its own
        // layout), `yo`/`yi` the contiguous outputs of k per row; the shared
        // memory holds p keys and p indices.
        unsafe { args.launch(cfg) }.map_err(|e| b.launch_err(&kernel, e))?;
        return Ok(done(y, yi));
    }
    let total = rows
        .checked_mul(p)
        .ok_or_else(|| BackendError::unsupported(b.device, name, "too many elements to sort"))?;
    let keys = b.alloc(DType::I64, total)?;
    let idx = b.alloc(DType::I32, total)?;
    let (kp, xi, total64) = (keys.ptr(), idx.ptr(), total as i64);
    let fill = format!("sort_keys_{ty}");
    let f = b.function("sort", &fill)?;
    let mut args = crate::launch::Launch::new(b, &f);
    args.arg(&xp)
        .arg(&lo)
        .arg(&li)
        .arg(&len64)
        .arg(&p64)
        .arg(&desc)
        .arg(&kp)
        .arg(&xi)
        .arg(&total64);
    // SAFETY: sort_keys_*(x, lo, li, len, p, descending, keys, idx, total):
    // reads elements r < len of each row, writes `total` = rows * p pairs.
    unsafe { args.launch(grid(total, b.sm_count)) }.map_err(|e| b.launch_err(&fill, e))?;
    let stage = b.function("sort", "sort_stage")?;
    let mut kk = 2usize;
    while kk <= p {
        let mut j = kk / 2;
        while j > 0 {
            let (kk64, j64) = (kk as i64, j as i64);
            let mut args = crate::launch::Launch::new(b, &stage);
            args.arg(&kp).arg(&xi).arg(&total64).arg(&p64).arg(&kk64).arg(&j64);
            // SAFETY: sort_stage(keys, idx, total, p, kk, j): positions e and
            // e ^ j (j < p, p a power of two) stay inside each row of p pairs.
            unsafe { args.launch(grid(total, b.sm_count)) }.map_err(|e| b.launch_err("sort_stage", e))?;
            j /= 2;
        }
        kk *= 2;
    }
    let take = format!("sort_take_{ty}");
    let f = b.function("sort", &take)?;
    let n64 = n_out as i64;
    let mut args = crate::launch::Launch::new(b, &f);
    args.arg(&xp)
        .arg(&lo)
        .arg(&li)
        .arg(&xi)
        .arg(&p64)
        .arg(&k64)
        .arg(&yp)
        .arg(&ip)
        .arg(&yo)
        .arg(&yl)
        .arg(&n64);
    // SAFETY: sort_take_*(x, lo, li, idx, p, k, y, yidx, yo, yi, total):
    // the first k (<= len) pairs of each row hold indices below len;
    // `total` = rows * k output elements.
    unsafe { args.launch(grid(n_out, b.sm_count)) }.map_err(|e| b.launch_err(&take, e))?;
    Ok(done(y, yi))
}
