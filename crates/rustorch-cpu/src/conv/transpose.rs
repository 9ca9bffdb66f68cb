//! Transposed convolution: gemm into columns, then col2im scatter-adds
//! each kernel tap into the output (the adjoint of the forward im2col).

use super::{tile_rows, valid_range, ConvElem, Geom};
use crate::matmul::{gemm_raw, MatRef};
use rayon::prelude::*;

/// x [n, c, h, w], w [c, o/groups, kh, kw], bias [o] -> [n, o, oh, ow],
/// all contiguous.
pub(super) fn conv_transpose2d<T: ConvElem>(g: &Geom, x: &[T], w: &[T], bias: Option<&[T]>) -> Vec<T> {
    let groups = g.p.groups;
    let (cg, og) = (g.c / groups, g.o / groups);
    let k = g.kh * g.kw;
    let m = og * k;
    let (in_plane, plane) = (g.h * g.w, g.oh * g.ow);
    let mut out = vec![T::zero(); g.n * g.o * plane];
    if out.is_empty() {
        return out;
    }
    if let Some(b) = bias {
        for (i, row) in out.chunks_mut(plane).enumerate() {
            row.fill(b[i % g.o]);
        }
    }
    let tasks = g.n * groups;
    let threads = rayon::current_num_threads();
    let work = tasks * m * cg * in_plane;

    let task = |t: usize, dst: &mut [T], col: &mut Vec<T>, parallel: bool| {
        let (ni, gi) = (t / groups, t % groups);
        let xg = &x[(ni * g.c + gi * cg) * in_plane..][..cg * in_plane];
        // The group's weights are [cg, m]; gemm reads them transposed.
        let lhs = MatRef {
            ptr: w[gi * cg * m..].as_ptr(),
            rs: 1,
            cs: m,
        };
        let rows = if parallel {
            g.h
        } else {
            tile_rows(m, g.w, g.h, std::mem::size_of::<T>())
        };
        for ih0 in (0..g.h).step_by(rows.max(1)) {
            let ih1 = (ih0 + rows).min(g.h);
            let cols = (ih1 - ih0) * g.w;
            col.clear();
            col.resize(m * cols, T::zero());
            let rhs = MatRef {
                ptr: xg[ih0 * g.w..].as_ptr(),
                rs: in_plane,
                cs: 1,
            };
            // SAFETY: lhs is m x cg inside the group's weights, rhs is
            // cg x cols inside xg, col is m x cols.
            unsafe { gemm_raw(m, cols, cg, col.as_mut_ptr(), cols, false, lhs, rhs, parallel) };
            let scatter = |(oi, plane_out): (usize, &mut [T])| {
                for ri in oi * k..(oi + 1) * k {
                    col2im_row(g, &col[ri * cols..(ri + 1) * cols], ri % k, ih0, ih1, plane_out);
                }
            };
            if parallel && m * cols >= crate::copy::PAR_THRESHOLD {
                dst.par_chunks_mut(plane).enumerate().for_each(scatter);
            } else {
                dst.chunks_mut(plane).enumerate().for_each(scatter);
            }
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

/// Adds one column row (kernel tap `tap` = (i, j) of one output channel,
/// input rows `ih0..ih1`) into that channel's output plane.
fn col2im_row<T: ConvElem>(g: &Geom, src: &[T], tap: usize, ih0: usize, ih1: usize, plane_out: &mut [T]) {
    let p = &g.p;
    let (ki, kj) = (tap / g.kw, tap % g.kw);
    let off = (kj * p.dilation[1]) as isize - p.padding[1] as isize;
    let (lo, hi) = valid_range(off, p.stride[1], g.ow, g.w);
    if lo >= hi {
        return;
    }
    for (t, ih) in (ih0..ih1).enumerate() {
        let oh = (ih * p.stride[0] + ki * p.dilation[0]) as isize - p.padding[0] as isize;
        if oh < 0 || oh >= g.oh as isize {
            continue;
        }
        let dst = &mut plane_out[oh as usize * g.ow..][..g.ow];
        let s = &src[t * g.w..][lo..hi];
        let d0 = (lo as isize * p.stride[1] as isize + off) as usize;
        if p.stride[1] == 1 {
            T::add_assign_slice(&mut dst[d0..d0 + (hi - lo)], s);
        } else {
            for (d, &v) in dst[d0..].iter_mut().step_by(p.stride[1]).zip(s) {
                *d += v;
            }
        }
    }
}
