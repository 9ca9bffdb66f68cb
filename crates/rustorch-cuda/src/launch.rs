//! What kernels take: `Strided` (a layout, mirroring `struct Strided` in
//! kernels/common.cuh) and launch sizes.

use cudarc::driver::sys;
use cudarc::driver::{CudaFunction, DeviceRepr, DriverError, LaunchConfig};
use rustorch_core::{Layout, Shape};
use std::ffi::c_void;

/// A kernel launch on the backend's stream, built as cudarc's
/// `launch_builder` is (one `arg` per kernel parameter, by reference), but
/// sent with `cuLaunchKernelEx` so that it can carry programmatic
/// dependent launch (Hopper on): the kernel may be scheduled while the one
/// before it in the stream still runs, and waits for that one's results at
/// `rt_kernel_entry` (kernels/common.cuh), which every kernel runs first.
/// What it overlaps is the gap between two kernels (the launch, the
/// scheduling of blocks, a product's weight prefetch): a decode step is
/// a chain of a few hundred small kernels.
pub(crate) struct Launch<'a> {
    func: &'a CudaFunction,
    stream: sys::CUstream,
    ctx: &'a cudarc::driver::CudaContext,
    overlap: bool,
    args: Vec<*mut c_void>,
    /// The diagnostic empty kernels launched after this one, and how many
    /// (`CudaBackend::gap_kernels`).
    gap: Option<(&'a CudaFunction, u32)>,
}

impl<'a> Launch<'a> {
    pub(crate) fn new(b: &'a crate::CudaBackend, func: &'a CudaFunction) -> Launch<'a> {
        Launch {
            func,
            stream: b.stream.cu_stream(),
            ctx: &b.ctx,
            // Not right after a write of memory this kernel may read before
            // its wait (`CudaBackend::serialize_next_launch`: uploads,
            // copies of weights).
            overlap: b.overlap_launches && !b.no_overlap_next.swap(false, std::sync::atomic::Ordering::Relaxed),
            args: Vec::with_capacity(16),
            gap: match b.gap_kernels {
                0 => None,
                n => b
                    .gap_function
                    .get_or_init(|| b.function("elementwise", "rt_gap").ok())
                    .as_ref()
                    .map(|f| (f, n)),
            },
        }
    }

    /// The next kernel parameter, read by the driver at `launch`.
    pub(crate) fn arg<T: DeviceRepr>(&mut self, v: &'a T) -> &mut Self {
        self.args.push(v as *const T as *mut c_void);
        self
    }

    /// Queues the kernel.
    ///
    /// # Safety
    /// The arguments must match the kernel's parameters in number, order
    /// and type, and every address among them must be valid for what the
    /// kernel does with it.
    pub(crate) unsafe fn launch(&mut self, cfg: LaunchConfig) -> Result<(), DriverError> {
        self.ctx.bind_to_thread()?;
        // SAFETY: as the caller vouches.
        unsafe { self.launch_one(self.func, cfg, true) }?;
        if let Some((gap, n)) = self.gap {
            for _ in 0..n {
                // SAFETY: rt_gap takes no parameters.
                unsafe { self.launch_one(gap, LaunchConfig::for_num_elems(1), false) }?;
            }
        }
        Ok(())
    }

    /// `func` on the stream with `cfg`, with this launch's parameters
    /// (`with_args`) or none.
    unsafe fn launch_one(
        &mut self,
        func: &CudaFunction,
        cfg: LaunchConfig,
        with_args: bool,
    ) -> Result<(), DriverError> {
        // SAFETY: zero is a valid bit pattern for the attribute (a plain C struct and union).
        let mut attr: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
        attr.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
        attr.value.programmaticStreamSerializationAllowed = 1;
        let config = sys::CUlaunchConfig {
            gridDimX: cfg.grid_dim.0,
            gridDimY: cfg.grid_dim.1,
            gridDimZ: cfg.grid_dim.2,
            blockDimX: cfg.block_dim.0,
            blockDimY: cfg.block_dim.1,
            blockDimZ: cfg.block_dim.2,
            sharedMemBytes: cfg.shared_mem_bytes,
            hStream: self.stream,
            attrs: &mut attr,
            numAttrs: u32::from(self.overlap),
        };
        // SAFETY: the caller vouches for the parameters; `config`, `attr`
        // and the values behind `args` outlive the call, which copies them.
        unsafe {
            sys::cuLaunchKernelEx(
                &config,
                func.cu_function(),
                if with_args {
                    self.args.as_mut_ptr()
                } else {
                    std::ptr::null_mut()
                },
                std::ptr::null_mut(),
            )
        }
        .result()
    }
}

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

/// Where a `*_into` kernel's write lands (mirrors `struct WriteAt` in
/// kernels/common.cuh): the region moved by `pos * step` elements, `pos`
/// read by the kernel from device memory, so that a replayed graph writes
/// where the tensor says at each replay; a position outside `0..=max_pos`
/// writes nothing and sets the `i32` flag at `bad`. `NONE` (a null `pos`)
/// is the plain write at the region.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(crate) struct WriteAt {
    pos: u64,
    step: i64,
    max_pos: i64,
    bad: u64,
    wide: i32,
    pad: i32,
}

// SAFETY: plain data with the C layout the kernels declare.
unsafe impl DeviceRepr for WriteAt {}

impl WriteAt {
    pub(crate) const NONE: WriteAt = WriteAt {
        pos: 0,
        step: 0,
        max_pos: 0,
        bad: 0,
        wide: 0,
        pad: 0,
    };

    /// A position read at `pos` (the device address of its one element, an
    /// i64 where `wide`, else an i32), with the flag at `bad`.
    pub(crate) fn at(pos: u64, wide: bool, step: usize, max_pos: usize, bad: u64) -> WriteAt {
        WriteAt {
            pos,
            step: step as i64,
            max_pos: max_pos as i64,
            bad,
            wide: i32::from(wide),
            pad: 0,
        }
    }
}

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
        Some(s.compressed())
    }

    /// The same addresses with fewer dims: size-1 dims dropped, and a dim
    /// merged into the one after it where it steps over it exactly
    /// (`stride[d] == stride[d+1] * shape[d+1]`). The element index splits
    /// row-major either way, so each operand compresses on its own; a
    /// contiguous one becomes one dim of stride 1, which the kernels
    /// address without divisions.
    fn compressed(self) -> Strided {
        let n = self.ndim as usize;
        let mut out = Strided {
            shape: [1; MAX_DIMS],
            stride: [0; MAX_DIMS],
            offset: self.offset,
            ndim: 0,
            pad: 0,
        };
        let mut k = 0usize;
        for d in 0..n {
            let (size, stride) = (self.shape[d], self.stride[d]);
            if size == 1 {
                continue;
            }
            if k > 0 && out.stride[k - 1] == stride * size {
                out.shape[k - 1] *= size;
                out.stride[k - 1] = stride;
            } else {
                out.shape[k] = size;
                out.stride[k] = stride;
                k += 1;
            }
        }
        if k == 0 {
            // One element (or a shape of ones): index 0 only.
            out.shape[0] = 1;
            out.stride[0] = 1;
            k = 1;
        }
        out.ndim = k as i32;
        out
    }
}

impl Strided {
    /// The one stride that steps through every element, where the layout
    /// compressed to one dim (`None` where it did not).
    pub(crate) fn single_stride(&self) -> Option<usize> {
        (self.ndim == 1).then(|| usize::try_from(self.stride[0]).ok()).flatten()
    }

    /// Where the first element lies, in bytes from the buffer's start.
    pub(crate) fn offset_bytes(&self, elem_size: usize) -> u64 {
        self.offset as u64 * elem_size as u64
    }

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
        Some(s.compressed())
    }
}

#[cfg(test)]
impl Strided {
    /// `strided_at` (kernels/common.cuh) on the host, for tests of the
    /// launchers' layouts.
    pub(crate) fn at(&self, mut i: i64) -> i64 {
        if self.ndim == 1 {
            return self.offset + i * self.stride[0];
        }
        let mut off = self.offset;
        for d in (0..self.ndim as usize).rev() {
            let q = i / self.shape[d];
            off += (i - q * self.shape[d]) * self.stride[d];
            i = q;
        }
        off
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Element offsets of a `Strided`, as the kernels compute them.
    fn offsets(s: &Strided, n: usize) -> Vec<i64> {
        (0..n as i64)
            .map(|mut i| {
                if s.ndim == 1 {
                    return s.offset + i * s.stride[0];
                }
                let mut off = s.offset;
                for d in (0..s.ndim as usize).rev() {
                    let q = i / s.shape[d];
                    off += (i - q * s.shape[d]) * s.stride[d];
                    i = q;
                }
                off
            })
            .collect()
    }

    #[test]
    fn compressing_keeps_every_address() {
        let base = Layout::contiguous(Shape::from([2, 3, 4, 5]));
        let views = [
            base.clone(),
            base.transpose("t", 1, 2).unwrap(),
            base.narrow("n", 3, 1, 3).unwrap(),
            base.narrow("n", 0, 1, 1).unwrap(),
            Layout::contiguous(Shape::from([3, 1, 5]))
                .broadcast_as("b", &Shape::from([2, 3, 4, 5]))
                .unwrap(),
        ];
        for l in &views {
            let raw = Strided::from_parts(l.dims(), l.strides(), l.offset()).unwrap();
            let mut full = raw;
            // The uncompressed addresses, straight from the layout.
            full.ndim = l.rank() as i32;
            for (d, (&n, &st)) in l.dims().iter().zip(l.strides()).enumerate() {
                full.shape[d] = n as i64;
                full.stride[d] = st as i64;
            }
            full.offset = l.offset() as i64;
            let n = l.shape().numel();
            assert_eq!(offsets(&raw, n), offsets(&full, n), "{l:?}");
        }
        let c = Strided::from_parts(&[2, 3, 4], &[12, 4, 1], 7).unwrap();
        assert_eq!((c.ndim, c.shape[0], c.stride[0], c.offset), (1, 24, 1, 7));
    }

    /// The structs passed by value match the kernels' declarations in
    /// size and alignment, read from the PTX NVRTC makes of the `*_into`
    /// kernels (a mismatch would shift every argument after it, with no
    /// error at launch). Needs NVRTC, not a GPU; without it the test says
    /// so, and fails where `CI` or `RUSTORCH_REQUIRE_NVRTC` is set.
    #[test]
    fn by_value_structs_match_the_kernel_parameters() {
        if let Err(why) = crate::compile::nvrtc_version() {
            let required = std::env::var_os("CI").is_some_and(|v| v == "true" || v == "1")
                || std::env::var_os("RUSTORCH_REQUIRE_NVRTC").is_some();
            assert!(!required, "NVRTC is required here: {why}");
            eprintln!("by_value_structs_match_the_kernel_parameters: skipped: {why}");
            return;
        }
        let strided = format!(".align 8 .b8 {{}}[{}]", std::mem::size_of::<Strided>());
        let write_at = format!(".align 8 .b8 {{}}[{}]", std::mem::size_of::<WriteAt>());
        for (module, kernel) in [("elementwise", "copy_into_b2"), ("cast", "cast_into_F32_F16")] {
            let src = crate::KERNEL_SOURCES.iter().find(|(n, _)| *n == module).unwrap().1;
            let ptx = crate::compile::compile_uncached(module, &crate::compile::full_source(src), "compute_80")
                .unwrap()
                .to_src();
            let head = ptx
                .split(".entry ")
                .find(|e| e.starts_with(&format!("{kernel}(")))
                .unwrap_or_else(|| panic!("no entry {kernel} in {module}"));
            let params: Vec<String> = head[..head.find(')').unwrap()]
                .split(',')
                .map(|p| p.split_whitespace().collect::<Vec<_>>().join(" "))
                .collect();
            // (x, lx, y, ly, n, at)
            assert_eq!(params.len(), 6, "{kernel}: {params:?}");
            for (k, want) in [(1, &strided), (3, &strided), (5, &write_at)] {
                let want = want.replace("{}", &format!("{kernel}_param_{k}"));
                assert!(
                    params[k].ends_with(&want),
                    "{kernel} parameter {k}: {} is not {want}",
                    params[k]
                );
            }
        }
    }
}
