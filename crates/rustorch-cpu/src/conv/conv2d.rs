//! Forward convolution: im2col + gemm per image and group.

use super::{tile_rows, valid_range, ConvElem, Geom};
use crate::matmul::{gemm_raw, MatRef};
use rayon::prelude::*;

/// `out[n, o, oh, ow] = bias[o] + sum_{c, i, j} w[o, c, i, j] * x[n, g*cg + c, ...]`
/// over the groups' channels; x, w and bias are contiguous.
pub(super) fn conv2d<T: ConvElem>(g: &Geom, x: &[T], w: &[T], bias: Option<&[T]>) -> Vec<T> {
    let groups = g.p.groups;
    let (cg, og) = (g.c / groups, g.o / groups);
    let r = cg * g.kh * g.kw;
    let plane = g.oh * g.ow;
    let mut out = vec![T::zero(); g.n * g.o * plane];
    if out.is_empty() {
        return out;
    }
    // The bias goes in first and gemm accumulates onto it.
    if let Some(b) = bias {
        for (i, row) in out.chunks_mut(plane).enumerate() {
            row.fill(b[i % g.o]);
        }
    }
    let accumulate = bias.is_some();
    let p = &g.p;
    let pointwise = g.kh == 1 && g.kw == 1 && p.stride == [1, 1] && p.padding == [0, 0];
    let in_plane = g.h * g.w;
    let tasks = g.n * groups;
    let threads = rayon::current_num_threads();
    let work = tasks * og * plane * r;

    // One (image, group) task writes its own [og, oh, ow] block of `out`.
    let task = |t: usize, dst: &mut [T], col: &mut Vec<T>, parallel: bool| {
        let (ni, gi) = (t / groups, t % groups);
        let xg = &x[(ni * g.c + gi * cg) * in_plane..][..cg * in_plane];
        let lhs = MatRef {
            ptr: w[gi * og * r..].as_ptr(),
            rs: r,
            cs: 1,
        };
        if pointwise {
            // A 1x1 convolution needs no im2col: the image is the matrix.
            let rhs = MatRef {
                ptr: xg.as_ptr(),
                rs: in_plane,
                cs: 1,
            };
            // SAFETY: lhs is og x r inside w, rhs cg x plane inside xg, dst og x plane.
            unsafe { gemm_raw(og, plane, cg, dst.as_mut_ptr(), plane, accumulate, lhs, rhs, parallel) };
            return;
        }
        let rows = if parallel {
            g.oh
        } else {
            tile_rows(r, g.ow, g.oh, std::mem::size_of::<T>())
        };
        for oh0 in (0..g.oh).step_by(rows) {
            let oh1 = (oh0 + rows).min(g.oh);
            let cols = (oh1 - oh0) * g.ow;
            col.clear();
            col.resize(r * cols, T::zero());
            if parallel && r * cols >= crate::copy::PAR_THRESHOLD {
                col.par_chunks_mut(cols)
                    .enumerate()
                    .for_each(|(ri, row)| im2col_row(g, xg, ri, oh0, oh1, row));
            } else {
                col.chunks_mut(cols)
                    .enumerate()
                    .for_each(|(ri, row)| im2col_row(g, xg, ri, oh0, oh1, row));
            }
            let rhs = MatRef {
                ptr: col.as_ptr(),
                rs: cols,
                cs: 1,
            };
            // SAFETY: dst holds og rows of `plane`; this tile writes columns
            // oh0 * ow .. oh1 * ow of each.
            unsafe {
                gemm_raw(
                    og,
                    cols,
                    r,
                    dst[oh0 * g.ow..].as_mut_ptr(),
                    plane,
                    accumulate,
                    lhs,
                    rhs,
                    parallel,
                )
            };
        }
    };

    if tasks >= threads && threads > 1 && work >= 1 << 16 {
        out.par_chunks_mut(og * plane)
            .enumerate()
            .for_each_init(Vec::new, |col, (t, dst)| task(t, dst, col, false));
    } else {
        let mut col = Vec::new();
        for (t, dst) in out.chunks_mut(og * plane).enumerate() {
            task(t, dst, &mut col, work >= 1 << 16);
        }
    }
    out
}

/// Fills one im2col row: kernel tap `ri` = (channel, i, j) for output rows
/// `oh0..oh1`, zero where the tap falls into the padding.
fn im2col_row<T: ConvElem>(g: &Geom, xg: &[T], ri: usize, oh0: usize, oh1: usize, row: &mut [T]) {
    let k = g.kh * g.kw;
    let (ci, ki, kj) = (ri / k, (ri % k) / g.kw, ri % g.kw);
    let p = &g.p;
    let src_plane = &xg[ci * g.h * g.w..][..g.h * g.w];
    let off = (kj * p.dilation[1]) as isize - p.padding[1] as isize;
    let (lo, hi) = valid_range(off, p.stride[1], g.w, g.ow);
    for (t, oh) in (oh0..oh1).enumerate() {
        let dst = &mut row[t * g.ow..(t + 1) * g.ow];
        let ih = (oh * p.stride[0] + ki * p.dilation[0]) as isize - p.padding[0] as isize;
        if ih < 0 || ih >= g.h as isize {
            dst.fill(T::zero());
            continue;
        }
        let src = &src_plane[ih as usize * g.w..][..g.w];
        dst[..lo].fill(T::zero());
        dst[hi..].fill(T::zero());
        let s0 = (lo as isize * p.stride[1] as isize + off) as usize;
        if p.stride[1] == 1 {
            dst[lo..hi].copy_from_slice(&src[s0..s0 + (hi - lo)]);
        } else {
            for (d, s) in dst[lo..hi].iter_mut().zip(src[s0..].iter().step_by(p.stride[1])) {
                *d = *s;
            }
        }
    }
}
