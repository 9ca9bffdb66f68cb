//! What kernels take: `Strided` (a layout, mirroring `struct Strided` in
//! kernels/common.cuh) and launch sizes.

use cudarc::driver::{DeviceRepr, LaunchConfig};
use rustorch_core::{Layout, Shape};

pub(crate) const MAX_DIMS: usize = 8;

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(crate) struct Strided {
    shape: [i64; MAX_DIMS],
    stride: [i64; MAX_DIMS],
    offset: i64,
    ndim: i32,
    pad: i32,
}

// SAFETY: plain data with the C layout the kernels declare.
unsafe impl DeviceRepr for Strided {}

impl Strided {
    /// `layout` read as a tensor of `out` (its shape broadcast to `out`:
    /// leading dims added and size-1 dims repeated with stride 0), or
    /// `None` past `MAX_DIMS` dims.
    pub(crate) fn broadcast(layout: &Layout, out: &Shape) -> Option<Strided> {
        let dims = out.dims();
        let n = dims.len();
        if n > MAX_DIMS || layout.shape().rank() > n {
            return None;
        }
        let mut s = Strided {
            shape: [1; MAX_DIMS],
            stride: [0; MAX_DIMS],
            offset: layout.offset() as i64,
            ndim: n.max(1) as i32,
            pad: 0,
        };
        let in_dims = layout.shape().dims();
        let lead = n - in_dims.len();
        for (d, &size) in dims.iter().enumerate() {
            s.shape[d] = size as i64;
            if d >= lead {
                let k = d - lead;
                s.stride[d] = if in_dims[k] == 1 && size != 1 {
                    0
                } else {
                    layout.strides()[k] as i64
                };
            }
        }
        Some(s)
    }
}

impl Strided {
    /// Dims `dims` of a layout with `strides` (in elements) from `offset`,
    /// or `None` past `MAX_DIMS` dims.
    pub(crate) fn from_parts(dims: &[usize], strides: &[usize], offset: usize) -> Option<Strided> {
        if dims.len() > MAX_DIMS {
            return None;
        }
        let mut s = Strided {
            shape: [1; MAX_DIMS],
            stride: [0; MAX_DIMS],
            offset: offset as i64,
            ndim: dims.len().max(1) as i32,
            pad: 0,
        };
        for (d, (&n, &st)) in dims.iter().zip(strides).enumerate() {
            s.shape[d] = n as i64;
            s.stride[d] = st as i64;
        }
        Some(s)
    }
}

/// One block of 256 threads per row, `rows` rows.
pub(crate) fn per_row(rows: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (rows as u32, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// A grid-stride launch over `n` elements.
pub(crate) fn grid(n: usize, sm_count: u32) -> LaunchConfig {
    const BLOCK: u32 = 256;
    let blocks = n.div_ceil(BLOCK as usize).max(1);
    let cap = (sm_count.max(1) as usize) * 32;
    LaunchConfig {
        grid_dim: (blocks.min(cap) as u32, 1, 1),
        block_dim: (BLOCK, 1, 1),
        shared_mem_bytes: 0,
    }
}
