//! Launcher for kernels/rope.cu: rotary position embeddings, NeoX and
//! interleaved, for the float dtypes; one thread per output element.

use super::float_suffix;
use crate::backend::CudaBackend;
use crate::buffer::CudaBuffer;
use crate::launch::{grid, Strided};
use rustorch_core::backend::TensorRef;
use rustorch_core::op::RopeLayout;
use rustorch_core::{BackendError, TensorMeta};

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
