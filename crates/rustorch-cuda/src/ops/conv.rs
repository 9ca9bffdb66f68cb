//! Launchers for kernels/conv.cu: inference batch norm, conv1d/conv2d,
//! conv_transpose2d, max and average pooling; one thread per output
//! element, float dtypes.

use super::attention::Str4;
use super::float_suffix;
use crate::backend::CudaBackend;
use crate::buffer::CudaBuffer;
use crate::launch::{grid, Strided};
use cudarc::driver::DeviceRepr;
use rustorch_core::backend::TensorRef;
use rustorch_core::{BackendError, Layout, Op, TensorMeta};

/// Mirrors `struct ConvGeom` in kernels/conv.cu (for pooling, `o` is
/// unused and `c` the channel count).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct ConvGeom {
    c: i64,
    h: i64,
    w: i64,
    o: i64,
    kh: i64,
    kw: i64,
    oh: i64,
    ow: i64,
    groups: i64,
    sh: i64,
    sw: i64,
    ph: i64,
    pw: i64,
    dh: i64,
    dw: i64,
}

// SAFETY: plain data with the C layout the kernels declare.
unsafe impl DeviceRepr for ConvGeom {}

/// A 3-D operand [A, B, L] as the 4-D [A, B, 1, L] (conv1d as conv2d).
fn as_2d(l: &Layout) -> Option<Str4> {
    let (s, off) = (l.strides(), l.offset() as i64);
    if s.len() != 3 {
        return None;
    }
    Str4::of(
        &Layout::from_parts(
            rustorch_core::Shape::from([l.dims()[0], l.dims()[1], 1, l.dims()[2]]),
            vec![s[0], s[1], 0, s[2]],
            off as usize,
        )
        .ok()?,
    )
}

/// A 1-D parameter (`[C]`): its stride in s[3].
fn param(
    b: &CudaBackend,
    name: &str,
    inputs: &[TensorRef<'_>],
    present: bool,
    i: usize,
) -> Result<(u64, Str4), BackendError> {
    let none = Str4::of(&Layout::contiguous(rustorch_core::Shape::from([1usize]))).expect("1-D");
    if !present {
        return Ok((0, none));
    }
    let t = inputs
        .get(i)
        .ok_or_else(|| BackendError::invalid(name, format!("input {i} is missing")))?;
    if t.layout.rank() != 1 {
        return Err(BackendError::invalid(name, "parameters must be 1-D"));
    }
    let l = Str4::of(t.layout).ok_or_else(|| BackendError::invalid(name, "parameters must be 1-D"))?;
    Ok((b.own(name, t.buffer)?.ptr(), l))
}

pub(super) fn batch_norm(
    b: &CudaBackend,
    op: &Op,
    inputs: &[TensorRef<'_>],
    out: &TensorMeta,
) -> Result<CudaBuffer, BackendError> {
    let Op::BatchNorm {
        eps,
        has_weight,
        has_bias,
    } = *op
    else {
        return Err(BackendError::invalid(op.name(), "not a batch norm"));
    };
    let name = "batch_norm";
    let x = &inputs[0];
    let ty = float_suffix(x.dtype()).ok_or_else(|| BackendError::unsupported(b.device, name, "float dtypes only"))?;
    let dims = x.layout.dims();
    if dims.len() < 2 || inputs.iter().any(|t| t.dtype() != x.dtype()) {
        return Err(BackendError::invalid(
            name,
            "needs x [N, C, ...] and parameters of its dtype",
        ));
    }
    let c = dims[1];
    if inputs[1..].iter().any(|p| p.layout.dims() != [c]) {
        return Err(BackendError::invalid(
            name,
            "statistics and affine parameters must be [C]",
        ));
    }
    let inner: usize = dims[2..].iter().product();
    let n = out.shape.numel();
    let y = b.alloc(out.dtype, n)?;
    if n == 0 {
        return Ok(y);
    }
    let lx = Strided::broadcast(x.layout, &out.shape)
        .ok_or_else(|| BackendError::unsupported(b.device, name, "more dims than the kernels take"))?;
    let (mp, lm) = param(b, name, inputs, true, 1)?;
    let (vp, lv) = param(b, name, inputs, true, 2)?;
    let (wp, lw) = param(b, name, inputs, has_weight, 3)?;
    let (bp, lb) = param(b, name, inputs, has_bias, 3 + has_weight as usize)?;
    let kernel = format!("batch_norm_{ty}");
    let f = b.function("conv", &kernel)?;
    let (xp, yp, n64, c64, inner64) = (b.own(name, x.buffer)?.ptr(), y.ptr(), n as i64, c as i64, inner as i64);
    let mut args = crate::launch::Launch::new(b, &f);
    args.arg(&xp)
        .arg(&lx)
        .arg(&mp)
        .arg(&lm)
        .arg(&vp)
        .arg(&lv)
        .arg(&wp)
        .arg(&lw)
        .arg(&bp)
        .arg(&lb)
        .arg(&yp)
        .arg(&n64)
        .arg(&c64)
        .arg(&inner64)
        .arg(&eps);
    // SAFETY: batch_norm_*(x, lx, mean, lm, var, lv, w or null, lw, b or
    // null, lb, y, n, c, inner, eps): x's own layout; each parameter holds
    // C elements through its stride (checked above); `y` holds n.
    unsafe { args.launch(grid(n, b.sm_count)) }.map_err(|e| b.launch_err(&kernel, e))?;
    Ok(y)
}

/// Conv1d, Conv2d and ConvTranspose2d.
pub(super) fn conv(
    b: &CudaBackend,
    op: &Op,
    inputs: &[TensorRef<'_>],
    out: &TensorMeta,
) -> Result<CudaBuffer, BackendError> {
    let name = op.name();
    let (x, w) = (&inputs[0], &inputs[1]);
    let ty = float_suffix(x.dtype())
        .ok_or_else(|| BackendError::unsupported(b.device, name.clone(), "float dtypes only"))?;
    if inputs.iter().any(|t| t.dtype() != x.dtype()) {
        return Err(BackendError::invalid(name, "inputs have different dtypes"));
    }
    let bad = || BackendError::invalid(op.name(), "inconsistent convolution sizes");
    let od = out.shape.dims();
    let (lx, lw, g, has_bias, transposed) = match *op {
        Op::Conv1d {
            stride,
            padding,
            dilation,
            groups,
            has_bias,
        } => {
            let (xd, wd) = (x.layout.dims(), w.layout.dims());
            if xd.len() != 3 || wd.len() != 3 || od.len() != 3 {
                return Err(bad());
            }
            let g = ConvGeom {
                c: xd[1] as i64,
                h: 1,
                w: xd[2] as i64,
                o: wd[0] as i64,
                kh: 1,
                kw: wd[2] as i64,
                oh: 1,
                ow: od[2] as i64,
                groups: groups as i64,
                sh: 1,
                sw: stride as i64,
                ph: 0,
                pw: padding as i64,
                dh: 1,
                dw: dilation as i64,
            };
            (
                as_2d(x.layout).ok_or_else(bad)?,
                as_2d(w.layout).ok_or_else(bad)?,
                g,
                has_bias,
                false,
            )
        }
        Op::Conv2d { params: p, has_bias }
        | Op::ConvTranspose2d {
            params: p, has_bias, ..
        } => {
            let (xd, wd) = (x.layout.dims(), w.layout.dims());
            if xd.len() != 4 || wd.len() != 4 || od.len() != 4 {
                return Err(bad());
            }
            let transposed = matches!(op, Op::ConvTranspose2d { .. });
            let o = if transposed { wd[1] * p.groups } else { wd[0] };
            let g = ConvGeom {
                c: xd[1] as i64,
                h: xd[2] as i64,
                w: xd[3] as i64,
                o: o as i64,
                kh: wd[2] as i64,
                kw: wd[3] as i64,
                oh: od[2] as i64,
                ow: od[3] as i64,
                groups: p.groups as i64,
                sh: p.stride[0] as i64,
                sw: p.stride[1] as i64,
                ph: p.padding[0] as i64,
                pw: p.padding[1] as i64,
                dh: p.dilation[0] as i64,
                dw: p.dilation[1] as i64,
            };
            (
                Str4::of(x.layout).ok_or_else(bad)?,
                Str4::of(w.layout).ok_or_else(bad)?,
                g,
                has_bias,
                transposed,
            )
        }
        _ => return Err(BackendError::invalid(name, "not a convolution")),
    };
    // The kernels divide by these and index the groups' channels with
    // them; infer checked them, this keeps a bad op from faulting.
    if g.groups <= 0
        || g.c % g.groups != 0
        || g.o % g.groups != 0
        || g.sh <= 0
        || g.sw <= 0
        || g.dh <= 0
        || g.dw <= 0
        || od[1] as i64 != g.o
        || od[0] != x.layout.dims()[0]
        || (!transposed && w.layout.dims()[1] as i64 * g.groups != g.c)
        || (transposed && w.layout.dims()[0] as i64 != g.c)
    {
        return Err(bad());
    }
    let n = out.shape.numel();
    let y = b.alloc(out.dtype, n)?;
    if n == 0 {
        return Ok(y);
    }
    let (bp, lb) = param(b, &name, inputs, has_bias, 2)?;
    if has_bias && inputs[2].layout.dims() != [g.o as usize] {
        return Err(bad());
    }
    let kernel = if transposed {
        format!("conv_transpose2d_{ty}")
    } else {
        format!("conv2d_{ty}")
    };
    let f = b.function("conv", &kernel)?;
    let (xp, wp, yp, n64) = (
        b.own(&name, x.buffer)?.ptr(),
        b.own(&name, w.buffer)?.ptr(),
        y.ptr(),
        n as i64,
    );
    let mut args = crate::launch::Launch::new(b, &f);
    args.arg(&xp)
        .arg(&lx)
        .arg(&wp)
        .arg(&lw)
        .arg(&bp)
        .arg(&lb)
        .arg(&yp)
        .arg(&n64)
        .arg(&g);
    // SAFETY: conv2d_* / conv_transpose2d_*(x, lx, w, lw, bias or null, lb,
    // y, total, geom): every tap read is bounds-checked against the input's
    // H and W, channels stay below C (groups divide it, checked above), the
    // weight's dims are the geometry's; `y` holds `total` = N*O*OH*OW.
    unsafe { args.launch(grid(n, b.sm_count)) }.map_err(|e| b.launch_err(&kernel, e))?;
    Ok(y)
}

pub(super) fn pool(b: &CudaBackend, op: &Op, x: &TensorRef<'_>, out: &TensorMeta) -> Result<CudaBuffer, BackendError> {
    let name = op.name();
    let ty = float_suffix(x.dtype())
        .ok_or_else(|| BackendError::unsupported(b.device, name.clone(), "float dtypes only"))?;
    let (p, count_pad, max) = match *op {
        Op::MaxPool2d { params } => (params, false, true),
        Op::AvgPool2d {
            params,
            count_include_pad,
        } => (params, count_include_pad, false),
        _ => return Err(BackendError::invalid(name, "not a pooling op")),
    };
    let (xd, od) = (x.layout.dims(), out.shape.dims());
    if xd.len() != 4 || od.len() != 4 || p.stride.contains(&0) || p.kernel.contains(&0) {
        return Err(BackendError::invalid(name, "inconsistent pooling sizes"));
    }
    let g = ConvGeom {
        c: xd[1] as i64,
        h: xd[2] as i64,
        w: xd[3] as i64,
        kh: p.kernel[0] as i64,
        kw: p.kernel[1] as i64,
        oh: od[2] as i64,
        ow: od[3] as i64,
        sh: p.stride[0] as i64,
        sw: p.stride[1] as i64,
        ph: p.padding[0] as i64,
        pw: p.padding[1] as i64,
        ..ConvGeom::default()
    };
    let n = out.shape.numel();
    let y = b.alloc(out.dtype, n)?;
    if n == 0 {
        return Ok(y);
    }
    let lx = Str4::of(x.layout).ok_or_else(|| BackendError::invalid(name.clone(), "input must be 4-D"))?;
    let kernel = if max {
        format!("max_pool2d_{ty}")
    } else {
        format!("avg_pool2d_{ty}")
    };
    let f = b.function("conv", &kernel)?;
    let (xp, yp, n64, cp) = (b.own(&name, x.buffer)?.ptr(), y.ptr(), n as i64, count_pad as i32);
    let mut args = crate::launch::Launch::new(b, &f);
    args.arg(&xp).arg(&lx).arg(&yp).arg(&n64).arg(&g);
    if !max {
        args.arg(&cp);
    }
    // SAFETY: max_pool2d_* / avg_pool2d_*(x, lx, y, total, geom[,
    // count_pad]): taps are bounds-checked against H and W, `y` holds
    // N*C*OH*OW elements.
    unsafe { args.launch(grid(n, b.sm_count)) }.map_err(|e| b.launch_err(&kernel, e))?;
    Ok(y)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustorch_core::Shape;

    #[test]
    fn conv1d_operands_gain_a_unit_height() {
        let l = Layout::contiguous(Shape::from([2, 3, 9]));
        let s = as_2d(&l).unwrap();
        assert_eq!(
            s,
            Str4::of(&Layout::from_parts(Shape::from([2, 3, 1, 9]), vec![27, 9, 0, 1], 0).unwrap()).unwrap()
        );
    }
}
