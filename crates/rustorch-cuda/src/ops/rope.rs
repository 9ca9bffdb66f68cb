//! Launcher for kernels/rope.cu: rotary position embeddings, NeoX and
//! interleaved, for the float dtypes; one thread per output element.

use super::float_suffix;
use crate::backend::CudaBackend;
use crate::buffer::CudaBuffer;
use crate::launch::{grid, Strided, WriteAt};
use rustorch_core::backend::{Buffer, DeviceBuffer, KvWriteAt, TensorRef};
use rustorch_core::op::RopeLayout;
use rustorch_core::{BackendError, DType, TensorMeta};
use std::sync::Arc;

pub(super) fn rope(
    b: &CudaBackend,
    layout: RopeLayout,
    inputs: &[TensorRef<'_>],
    out: &TensorMeta,
) -> Result<CudaBuffer, BackendError> {
    let name = match layout {
        RopeLayout::NeoX => "rope_neox",
        RopeLayout::Interleaved => "rope_interleaved",
    };
    let (x, cos, sin) = (&inputs[0], &inputs[1], &inputs[2]);
    let ty = float_suffix(x.dtype()).ok_or_else(|| BackendError::unsupported(b.device, name, "float dtypes only"))?;
    let dims = x.layout.dims();
    let rank = dims.len();
    let (t, d) = (dims[rank - 2], dims[rank - 1]);
    let half = cos.layout.dims()[1];
    // infer checked these; the kernel relies on them to stay in bounds.
    if cos.layout.dims() != [t, half] || sin.layout.dims() != [t, half] || 2 * half > d {
        return Err(BackendError::invalid(name, "cos and sin must be [T, R/2] with R <= D"));
    }
    let n = out.shape.numel();
    let y = b.alloc(out.dtype, n)?;
    if n == 0 {
        return Ok(y);
    }
    let deep = || BackendError::unsupported(b.device, name, "more dims than the kernels take");
    let view = |r: &TensorRef<'_>| Strided::from_parts(r.layout.dims(), r.layout.strides(), r.layout.offset());
    let (lx, lc, ls) = (
        view(x).ok_or_else(deep)?,
        view(cos).ok_or_else(deep)?,
        view(sin).ok_or_else(deep)?,
    );
    let kernel = format!("rope_{ty}");
    let f = b.function("rope", &kernel)?;
    let (xp, cp, sp, yp) = (
        b.own(name, x.buffer)?.ptr(),
        b.own(name, cos.buffer)?.ptr(),
        b.own(name, sin.buffer)?.ptr(),
        y.ptr(),
    );
    let (n64, t64, d64, h64) = (n as i64, t as i64, d as i64, half as i64);
    let interleaved = matches!(layout, RopeLayout::Interleaved) as i32;
    let mut args = crate::launch::Launch::new(b, &f);
    args.arg(&xp)
        .arg(&lx)
        .arg(&cp)
        .arg(&lc)
        .arg(&sp)
        .arg(&ls)
        .arg(&yp)
        .arg(&n64)
        .arg(&t64)
        .arg(&d64)
        .arg(&h64)
        .arg(&interleaved);
    // SAFETY: rope_*(x, lx, cos, lc, sin, ls, y, n, t, d, half, interleaved):
    // every layout is its input's own (checked by the executor); rows have
    // `d` features, position indices stay below t * half, and `y` holds `n`.
    unsafe { args.launch(grid(n, b.sm_count)) }.map_err(|e| b.launch_err(&kernel, e))?;
    Ok(y)
}

/// The one case the fused decode kernels take: every input contiguous f32,
/// both caches f16.
pub(crate) fn f32_inputs_f16_caches(inputs: &[&TensorRef<'_>], kc: &dyn DeviceBuffer, vc: &dyn DeviceBuffer) -> bool {
    inputs
        .iter()
        .all(|t| t.dtype() == DType::F32 && t.layout.is_contiguous())
        && kc.dtype() == DType::F16
        && vc.dtype() == DType::F16
}

/// The device address of a cache the fused decode kernels write.
pub(crate) fn cache_ptr(b: &CudaBackend, op: &str, c: &dyn DeviceBuffer) -> Result<u64, BackendError> {
    c.as_any()
        .downcast_ref::<CudaBuffer>()
        .filter(|c| c.device == b.device)
        .map(|c| c.ptr())
        .ok_or_else(|| BackendError::invalid(op, format!("a cache is not on {}", b.device)))
}

/// `Backend::rope_write_kv_at` in one launch (`rope_kv_at_F32_F16`): one
/// position (q `[.., 1, D]`, k and v `[.., 1, D]`, cos and sin `[1, R/2]`),
/// contiguous f32 inputs and f16 caches; anything else is unsupported
/// (the caller then runs the ops one by one). The values are rope_F32's
/// and cast_into_F32_F16's.
pub(crate) fn rope_write_kv_at(
    b: &CudaBackend,
    kc: &mut dyn DeviceBuffer,
    vc: &mut dyn DeviceBuffer,
    at: &KvWriteAt<'_>,
    layout: RopeLayout,
    [q, k, v]: [TensorRef<'_>; 3],
    [cos, sin]: [TensorRef<'_>; 2],
) -> Result<Buffer, BackendError> {
    const OP: &str = "rope_write_kv_at";
    crate::buffer::forget_row_acts(kc);
    crate::buffer::forget_row_acts(vc);
    let unsupported = |why: &str| Err(BackendError::unsupported(b.device, OP, why.to_string()));
    if !b.fused_rope {
        return unsupported("RUSTORCH_CUDA_FUSED_ROPE=0");
    }
    if !f32_inputs_f16_caches(&[&q, &k, &v, &cos, &sin], kc, vc) {
        return unsupported("contiguous f32 inputs and f16 caches only");
    }
    let (qd, kd) = (q.layout.dims(), k.layout.dims());
    let (Some(&d), Some(&half)) = (qd.last(), cos.layout.dims().get(1)) else {
        return unsupported("queries of one position");
    };
    let one_position = |dims: &[usize]| dims.len() >= 2 && dims[dims.len() - 2] == 1 && dims.last() == Some(&d);
    if !one_position(qd)
        || !one_position(kd)
        || v.layout.numel() != k.layout.numel()
        || cos.layout.dims() != [1, half]
        || sin.layout.dims() != [1, half]
        || 2 * half > d
        || d == 0
    {
        return unsupported("queries and keys of one position, cos and sin [1, R/2]");
    }
    // The kernel moves raw addresses: the regions are checked here too.
    for (dst, region, step) in [(&*kc, at.k_region, at.k_step), (&*vc, at.v_region, at.v_step)] {
        rustorch_core::backend::check_write_at(dst.len(), region, step, at.max_pos, at.pos)
            .map_err(|m| BackendError::invalid(OP, m))?;
    }
    if at.k_region.numel() != k.layout.numel() || at.v_region.numel() != v.layout.numel() {
        return Err(BackendError::invalid(
            OP,
            "the cache regions differ from the keys and values",
        ));
    }
    let (kcp, vcp) = (cache_ptr(b, OP, kc)?, cache_ptr(b, OP, vc)?);
    let (nq, nk) = (q.layout.numel(), k.layout.numel());
    if i32::try_from(nq + 2 * nk).is_err() {
        // The kernel indexes in 32 bits.
        return unsupported("more than 2^31 - 1 elements");
    }
    let qo = b.alloc(DType::F32, nq)?;
    let deep = || BackendError::unsupported(b.device, OP, "more dims than the kernels take");
    let lk = Strided::broadcast(at.k_region, at.k_region.shape()).ok_or_else(deep)?;
    let lv = Strided::broadcast(at.v_region, at.v_region.shape()).ok_or_else(deep)?;
    let ptr = |t: &TensorRef<'_>| -> Result<u64, BackendError> {
        Ok(b.own(OP, t.buffer)?.ptr() + (t.layout.offset() * t.dtype().size_in_bytes()) as u64)
    };
    let (qp, kp, vp, cp, sp) = (ptr(&q)?, ptr(&k)?, ptr(&v)?, ptr(&cos)?, ptr(&sin)?);
    let bad = super::ErrorFlag::new(b)?;
    let wide = at.pos.dtype() == DType::I64;
    let pos_ptr = ptr(&at.pos)?;
    let atk = WriteAt::at(pos_ptr, wide, at.k_step, at.max_pos, bad.ptr());
    let atv = WriteAt::at(pos_ptr, wide, at.v_step, at.max_pos, bad.ptr());
    let kernel = "rope_kv_at_F32_F16";
    let f = b.function("rope", kernel)?;
    let (nq64, nk64, d64, h64, qop) = (nq as i64, nk as i64, d as i64, half as i64, qo.ptr());
    let interleaved = matches!(layout, RopeLayout::Interleaved) as i32;
    let mut args = crate::launch::Launch::new(b, &f);
    args.arg(&qp)
        .arg(&kp)
        .arg(&vp)
        .arg(&cp)
        .arg(&sp)
        .arg(&qop)
        .arg(&kcp)
        .arg(&lk)
        .arg(&vcp)
        .arg(&lv)
        .arg(&nq64)
        .arg(&nk64)
        .arg(&d64)
        .arg(&h64)
        .arg(&interleaved)
        .arg(&atk)
        .arg(&atv);
    // SAFETY: rope_kv_at_F32_F16(q, k, v, cos, sin, qo, kc, lk, vc, lv, nq,
    // nk, d, half, interleaved, atk, atv): q holds nq and k, v nk contiguous
    // f32 (rows of d), cos and sin `half` f32 with 2 half <= d, qo nq f32;
    // the regions lk, lv moved by any position atk, atv accept stay inside
    // the caches (check_write_at above).
    unsafe { args.launch(grid(nq + 2 * nk, b.sm_count)) }.map_err(|e| b.launch_err(kernel, e))?;
    if bad.is_set(b)? {
        let host = rustorch_core::Backend::download(b, at.pos.buffer)?;
        let msg = rustorch_core::backend::write_pos_on_host(&host, at.pos.layout, at.max_pos)
            .err()
            .unwrap_or_else(|| format!("the write position is outside 0..={}", at.max_pos));
        return Err(BackendError::invalid(OP, msg));
    }
    Ok(Arc::new(qo))
}
