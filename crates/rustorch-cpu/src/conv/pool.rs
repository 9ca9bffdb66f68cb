//! 2-D max and average pooling over each channel plane.

use super::{valid_range, ConvElem, PoolGeom};
use crate::copy::PAR_THRESHOLD;
use rayon::prelude::*;

/// Runs `f(input_plane, output_plane)` over all planes, in parallel when large.
fn per_plane<T: ConvElem>(g: &PoolGeom, x: &[T], f: impl Fn(&[T], &mut [T]) + Sync) -> Vec<T> {
    let (ip, op) = (g.h * g.w, g.oh * g.ow);
    let mut out = vec![T::zero(); g.planes * op];
    if out.is_empty() {
        return out;
    }
    let job = |(i, o): (usize, &mut [T])| f(&x[i * ip..][..ip], o);
    if g.planes > 1 && g.planes * g.oh * g.ow * g.p.kernel[0] * g.p.kernel[1] >= PAR_THRESHOLD {
        out.par_chunks_mut(op).enumerate().for_each(job);
    } else {
        out.chunks_mut(op).enumerate().for_each(job);
    }
    out
}

/// Visits every in-bounds kernel tap of output row `oh`: calls
/// `f(dst_range, input_row, first_input_column)` for the output columns
/// `lo..hi` whose tap lands inside the input.
#[inline]
fn for_each_tap<T>(g: &PoolGeom, src: &[T], oh: usize, mut f: impl FnMut(usize, usize, &[T], usize)) {
    let p = &g.p;
    for ki in 0..p.kernel[0] {
        let ih = (oh * p.stride[0] + ki) as isize - p.padding[0] as isize;
        if ih < 0 || ih >= g.h as isize {
            continue;
        }
        let row = &src[ih as usize * g.w..][..g.w];
        for kj in 0..p.kernel[1] {
            let off = kj as isize - p.padding[1] as isize;
            let (lo, hi) = valid_range(off, p.stride[1], g.w, g.ow);
            if lo < hi {
                f(lo, hi, row, (lo as isize * p.stride[1] as isize + off) as usize);
            }
        }
    }
}

/// `f(acc, [row[s0], row[s0 + stride], ...])`: strided inputs are first
/// gathered into a small buffer so `f` always runs its vectorized,
/// branch-free loop (a compare-and-branch per element mispredicts on
/// random data and costs several times more).
#[inline]
fn apply_strided<T: ConvElem>(acc: &mut [T], row: &[T], s0: usize, stride: usize, f: fn(&mut [T], &[T])) {
    if stride == 1 {
        f(acc, &row[s0..s0 + acc.len()]);
        return;
    }
    const CHUNK: usize = 64;
    let mut buf = [T::zero(); CHUNK];
    for (i, a) in acc.chunks_mut(CHUNK).enumerate() {
        let base = s0 + i * CHUNK * stride;
        for (j, b) in buf[..a.len()].iter_mut().enumerate() {
            *b = row[base + j * stride];
        }
        f(a, &buf[..a.len()]);
    }
}

pub(super) fn max_pool2d<T: ConvElem>(g: &PoolGeom, x: &[T]) -> Vec<T> {
    let sw = g.p.stride[1];
    per_plane(g, x, |src, dst| {
        for oh in 0..g.oh {
            let acc = &mut dst[oh * g.ow..(oh + 1) * g.ow];
            acc.fill(T::NEG_INFINITY);
            for_each_tap(g, src, oh, |lo, hi, row, s0| {
                apply_strided(&mut acc[lo..hi], row, s0, sw, T::max_assign_slice);
            });
        }
    })
}

/// Window extents along one axis, as PyTorch counts them: with padding
/// included the window is clipped only at the far edge of the padded
/// input; without, it is clipped to the input itself.
fn divisors(len: usize, k: usize, stride: usize, pad: usize, out: usize, count_pad: bool) -> Vec<usize> {
    (0..out)
        .map(|o| {
            let start = (o * stride) as isize - pad as isize;
            let end = (start + k as isize).min((len + pad) as isize);
            if count_pad {
                (end - start) as usize
            } else {
                (end.min(len as isize) - start.max(0)) as usize
            }
        })
        .collect()
}

pub(super) fn avg_pool2d<T: ConvElem>(g: &PoolGeom, x: &[T], count_pad: bool) -> Vec<T> {
    let p = &g.p;
    let sw = p.stride[1];
    let dh = divisors(g.h, p.kernel[0], p.stride[0], p.padding[0], g.oh, count_pad);
    let dw: Vec<T> = divisors(g.w, p.kernel[1], sw, p.padding[1], g.ow, count_pad)
        .into_iter()
        .map(|d| T::from_f64(d as f64))
        .collect();
    per_plane(g, x, |src, dst| {
        for oh in 0..g.oh {
            let acc = &mut dst[oh * g.ow..(oh + 1) * g.ow];
            for_each_tap(g, src, oh, |lo, hi, row, s0| {
                apply_strided(&mut acc[lo..hi], row, s0, sw, T::add_assign_slice);
            });
            let rows = T::from_f64(dh[oh] as f64);
            for (a, &cols) in acc.iter_mut().zip(&dw) {
                *a = *a / (rows * cols);
            }
        }
    })
}
