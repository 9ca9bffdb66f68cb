//! The `Backend` trait every device implements, and the buffers it owns.
//!
//! A backend is small on purpose: it says what it can run (`supports`), moves
//! data to and from the host, and executes one validated op at a time. The
//! executor does routing, fallback and tracing, so adding a device never
//! means editing a match elsewhere.

use crate::device::{Device, DeviceCapability};
use crate::dtype::DType;
use crate::error::BackendError;
use crate::layout::Layout;
use crate::op::{Op, RopeLayout, TensorMeta};
use crate::quant::QType;
use crate::storage::{CpuStorage, HostSlice};
use std::any::Any;
use std::borrow::Cow;
use std::fmt::Debug;
use std::sync::Arc;

/// Memory owned by one backend. Backends downcast through `as_any` to their
/// own buffer type.
pub trait DeviceBuffer: Send + Sync + Debug + Any {
    fn device(&self) -> Device;
    fn dtype(&self) -> DType;
    /// Number of elements.
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    fn as_any(&self) -> &dyn Any;
    /// For bytes a backend keeps in an arrangement of its own (a weight
    /// packed for its kernels by `Backend::prepare_weight`), a name for it:
    /// such a buffer is read only by that backend's ops that take weights,
    /// never downloaded, viewed or moved. `None` (the default): elements in
    /// order, as the buffer's layouts say.
    fn private_layout(&self) -> Option<&'static str> {
        None
    }
    /// Mutable access for in-place writes (`Backend::write_into`); buffers
    /// that cannot be written in place keep the default `None`.
    fn as_any_mut(&mut self) -> Option<&mut dyn Any> {
        None
    }
}

/// A shared, immutable device buffer. Tensors and views share these.
pub type Buffer = Arc<dyn DeviceBuffer>;

/// An op input: a buffer and the layout to read it with.
#[derive(Clone, Copy)]
pub struct TensorRef<'a> {
    pub buffer: &'a dyn DeviceBuffer,
    pub layout: &'a Layout,
}

impl TensorRef<'_> {
    pub fn meta(&self) -> TensorMeta {
        TensorMeta::new(self.layout.shape().clone(), self.buffer.dtype())
    }
    pub fn dtype(&self) -> DType {
        self.buffer.dtype()
    }
}

/// How a GGML-typed weight will be used, which decides the layouts a
/// backend may give it (`Backend::prepare_weight`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WeightUsage {
    /// Only multiplied (`QMatMul` and its kin): any layout the backend's
    /// products read.
    Matmul,
    /// Also looked up by row (`QEmbedding`; a tied embedding that is
    /// multiplied too): rows must stay whole and in order.
    Lookup,
}

/// A GGML-typed weight matrix: `rows` rows of `cols` values of `qtype`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WeightSpec {
    pub qtype: QType,
    pub rows: usize,
    pub cols: usize,
    pub usage: WeightUsage,
}

pub trait Backend: Send + Sync {
    fn device(&self) -> Device;

    fn capability(&self) -> DeviceCapability;

    /// Whether this backend can run `op` on inputs like these. A `true`
    /// may still end in an error (out of memory, a device fault), which the
    /// executor answers by falling back.
    fn supports(&self, op: &Op, inputs: &[TensorMeta]) -> bool;

    /// Copies host data into a new buffer on this device. The data is
    /// borrowed from wherever it lives (a tensor's host storage, a memory
    /// map), so nothing is copied before the device's own copy.
    fn upload(&self, host: HostSlice<'_>) -> Result<Buffer, BackendError>;

    /// A new buffer of `len` zeros of `dtype` on this device, made there
    /// (a KV cache, an accumulator) rather than uploaded from the host.
    /// The default uploads host zeros.
    fn alloc_zeroed(&self, dtype: DType, len: usize) -> Result<Buffer, BackendError> {
        self.upload(CpuStorage::zeros(dtype, len).as_host())
    }

    /// A buffer of `len` values of `dtype` that this device's kernels write
    /// and the host reads without a copy through the device's DMA (on a GPU:
    /// page-locked host memory mapped into the device's address space), for
    /// small results read back often (a decode step's logits: a download
    /// of 128 KB is tens of microseconds of fixed costs). Its contents are
    /// unspecified until written. `None` (the default): the device has no
    /// such memory; use `alloc_zeroed`.
    fn alloc_host_readable(&self, dtype: DType, len: usize) -> Result<Option<Buffer>, BackendError> {
        let _ = (dtype, len);
        Ok(None)
    }

    /// Writes host values into the contiguous `region` of `dst` in place
    /// when `dst` is memory the host can write (a buffer of
    /// `alloc_host_readable`), after the device's queued work (which may
    /// read it) is done: a decode step's inputs, written between replays
    /// without an upload or a copy launch. `bytes` are the region's values
    /// in `dst`'s dtype, in memory order. `false` (the default, and for any
    /// other buffer): nothing written; the caller uploads and copies.
    fn write_host_readable(&self, dst: &dyn DeviceBuffer, region: &Layout, bytes: &[u8]) -> Result<bool, BackendError> {
        let _ = (dst, region, bytes);
        Ok(false)
    }

    /// A weight on this device from its plain bytes (`spec.rows` rows of
    /// `spec.qtype` blocks, row after row; the caller has checked the
    /// length): a u8 buffer of `rows * row_bytes` elements as the executor
    /// sees it. The bytes are borrowed (from a memory-mapped file) or owned
    /// (a host backend may keep them without a copy). A backend may keep
    /// the weight in a layout its kernels read faster, named by
    /// `DeviceBuffer::private_layout`; the default keeps it as it is
    /// (`upload`).
    fn prepare_weight(&self, spec: WeightSpec, bytes: Cow<'_, [u8]>) -> Result<Buffer, BackendError> {
        let _ = spec;
        self.upload(HostSlice::U8(&bytes))
    }

    /// Copies a whole buffer back to the host.
    fn download(&self, buffer: &dyn DeviceBuffer) -> Result<CpuStorage, BackendError>;

    /// Runs a validated op. `outputs` are the shapes and dtypes
    /// `op::infer_outputs` computed; the backend returns one contiguous
    /// buffer per output, in order.
    fn execute(&self, op: &Op, inputs: &[TensorRef<'_>], outputs: &[TensorMeta]) -> Result<Vec<Buffer>, BackendError>;

    /// Copies `src` (shape of `region`) into the elements of `dst` that
    /// `region` selects, in place; a source of another dtype is converted
    /// as `Op::Cast` converts (or the backend reports it unsupported). The executor calls this only
    /// with a buffer no tensor shares, so no view sees the change unasked;
    /// it is how a KV cache is filled without copying the whole cache.
    fn write_into(&self, dst: &mut dyn DeviceBuffer, region: &Layout, src: TensorRef<'_>) -> Result<(), BackendError> {
        let _ = (dst, region, src);
        Err(BackendError::unsupported(
            self.device(),
            "write_into",
            "this backend cannot write into a buffer in place",
        ))
    }

    /// `write_into` at a position read when the write runs: `region` is
    /// the region for position 0, and the write goes `pos * step` elements
    /// further, where `pos` is a one-element I32 or I64 tensor (shape `[1]`
    /// or `[]`) on this device. A GPU reads `pos` in the kernel, on the
    /// device, with no host synchronization: a captured graph replays its
    /// launches with fixed arguments, so a KV-cache write whose token
    /// position changes every decode step must take the position from
    /// device memory, not from an argument.
    ///
    /// The caller guarantees (the executor checks, `check_write_at`) that
    /// the region moved by any position in `0..=max_pos` lies inside
    /// `dst`. A position outside that range must never write out of
    /// bounds: it writes nothing and is `InvalidInput`. The default says
    /// unsupported; the executor then reads `pos` on the host and calls
    /// `write_into` with the moved region.
    fn write_into_at(
        &self,
        dst: &mut dyn DeviceBuffer,
        region: &Layout,
        step: usize,
        max_pos: usize,
        pos: TensorRef<'_>,
        src: TensorRef<'_>,
    ) -> Result<(), BackendError> {
        let _ = (dst, region, step, max_pos, pos, src);
        Err(BackendError::unsupported(
            self.device(),
            "write_into_at",
            "this backend cannot write at a position read from a tensor",
        ))
    }

    /// A decode step's attention inputs in one call: `q` and `k` rotated
    /// as `Op::Rope { layout }` rotates them with `cos` and `sin`, the
    /// rotated keys written into `kc` and `v` into `vc` as `write_into_at`
    /// writes a source (`at` holds both regions; `check_write_at` accepted
    /// each); returns the rotated queries, contiguous, of q's shape and
    /// dtype. The values must be those of the ops one by one. The default
    /// says unsupported; the caller then runs those ops (`Tensor::
    /// rope_write_kv_at`), so a backend implements only the cases it
    /// fuses (the CUDA backend: one launch instead of four).
    fn rope_write_kv_at(
        &self,
        kc: &mut dyn DeviceBuffer,
        vc: &mut dyn DeviceBuffer,
        at: &KvWriteAt<'_>,
        layout: RopeLayout,
        qkv: [TensorRef<'_>; 3],
        cos_sin: [TensorRef<'_>; 2],
    ) -> Result<Buffer, BackendError> {
        let _ = (kc, vc, at, layout, qkv, cos_sin);
        Err(BackendError::unsupported(
            self.device(),
            "rope_write_kv_at",
            "this backend has no fused RoPE and cache write",
        ))
    }

    /// A decode step's attention with its inputs' RoPE and cache write in
    /// the same call: `rope_write_kv_at` (`at`, `layout`, `qkv`) with the
    /// rotation's cos and sin the rows of `tables` (`[rows, R/2]` each) at
    /// the position `at.pos` holds, then `Op::AttentionAt { scale, window }`
    /// of the rotated queries over the whole caches (`caches`: kc's and
    /// vc's layouts as the attention reads them, `[Hkv, N, D]` and
    /// `[Hkv, N, Dv]`). Returns the attention's output (`[H, T, Dv]`, f32).
    /// The values must be those of the ops one by one. The default says
    /// unsupported; the caller then runs those ops
    /// (`Tensor::try_rope_attention_at`).
    #[allow(clippy::too_many_arguments)]
    fn rope_attention_at(
        &self,
        kc: &mut dyn DeviceBuffer,
        vc: &mut dyn DeviceBuffer,
        at: &KvWriteAt<'_>,
        caches: [&Layout; 2],
        layout: RopeLayout,
        qkv: [TensorRef<'_>; 3],
        tables: [TensorRef<'_>; 2],
        (scale, window): (f32, Option<usize>),
    ) -> Result<Buffer, BackendError> {
        let _ = (kc, vc, at, caches, layout, qkv, tables, scale, window);
        Err(BackendError::unsupported(
            self.device(),
            "rope_attention_at",
            "this backend has no attention with a fused RoPE and cache write",
        ))
    }

    /// Runs `pass`, many ops in a row (a model's forward pass, a whole
    /// generation loop), with whatever this backend holds for such runs:
    /// the CPU keeps its worker threads spinning between the ops, a GPU
    /// backend may batch or capture their launches. It must call `pass`
    /// exactly once, on any thread; a pass nested in another runs as it
    /// is. The default just calls it.
    fn run_pass(&self, pass: &mut (dyn FnMut() + Send)) {
        pass()
    }

    /// Waits for queued work to finish. A fault in that work surfaces here
    /// (or in any later call) as `BackendError::DeviceLost`.
    fn synchronize(&self) -> Result<(), BackendError> {
        Ok(())
    }

    /// Prepares now what the device would otherwise prepare as ops first
    /// need it (the CUDA backend compiles and loads its kernels, on several
    /// threads), so that a long first-use cost happens once, where a caller
    /// can show progress. The default has nothing to prepare.
    fn warm_up(&self) -> Result<(), BackendError> {
        Ok(())
    }

    /// Records the device work that `pass` queues on this backend, without
    /// running it, as one piece of work to run again and again
    /// (`Replay::replay`): a decode step of hundreds of small kernels then
    /// costs the host one launch instead of hundreds. Every buffer this
    /// backend makes while `pass` runs comes from `arena_bytes` of memory
    /// owned by the recording, at addresses that stay fixed for its life,
    /// so each replay reads and writes the same buffers: inputs that change
    /// between replays are written into buffers made before the recording,
    /// and outputs made inside it are read after each replay. Host copies
    /// and waits fail inside `pass` (they cannot be recorded), as does an
    /// arena that runs out. `pass` returns whether it succeeded; on `false`
    /// or any error nothing is kept. The default records nothing: the
    /// caller runs its ops one by one instead.
    fn capture(
        &self,
        arena_bytes: usize,
        pass: &mut (dyn FnMut() -> bool + Send),
    ) -> Result<Box<dyn Replay>, BackendError> {
        let _ = (arena_bytes, pass);
        Err(BackendError::unsupported(
            self.device(),
            "capture",
            "this backend cannot record work for replay",
        ))
    }

    /// Bytes of device memory this backend has handed out for buffers since
    /// it was made, counting reuse (what a `capture` arena must hold is
    /// what one uncaptured run of the pass adds to it); `None` where not
    /// counted.
    fn bytes_allocated(&self) -> Option<u64> {
        None
    }

    /// A clock for the work this backend runs from now on, read by
    /// `OpTimer::elapsed` after an op: what tracing and profiling report.
    /// A device that queues work times it with its own events (reading
    /// one waits for the op); the default, for backends that finish an op
    /// before `execute` returns, is the host's clock.
    fn timer(&self) -> Box<dyn OpTimer> {
        Box::new(HostTimer(std::time::Instant::now()))
    }
}

/// Device work recorded by `Backend::capture`.
pub trait Replay: Send + Sync {
    /// Queues the recorded work again, reading what its input buffers hold
    /// now. Like an op, it returns once queued.
    fn replay(&self) -> Result<(), BackendError>;
}

/// Where `Backend::rope_write_kv_at` writes: the key and value caches'
/// regions for position 0, each moved `pos * step` elements (`pos` as
/// `write_into_at` reads it), for positions up to `max_pos`.
#[derive(Clone, Copy)]
pub struct KvWriteAt<'a> {
    pub k_region: &'a Layout,
    pub k_step: usize,
    pub v_region: &'a Layout,
    pub v_step: usize,
    pub max_pos: usize,
    pub pos: TensorRef<'a>,
}

/// What every `write_into_at` must hold before it writes (the executor
/// checks it for the caller; a backend that launches raw pointers checks it
/// again rather than trust its caller): `pos` is one I32 or I64 element
/// inside its buffer, and `region` moved by up to `max_pos * step` elements
/// stays inside a destination of `dst_len` elements. `Err` names the first
/// problem.
pub fn check_write_at(
    dst_len: usize,
    region: &Layout,
    step: usize,
    max_pos: usize,
    pos: TensorRef<'_>,
) -> Result<(), String> {
    if !matches!(pos.dtype(), DType::I32 | DType::I64) {
        return Err(format!("the position must be i32 or i64, not {}", pos.dtype()));
    }
    if pos.layout.numel() != 1 || pos.layout.rank() > 1 {
        return Err(format!(
            "the position must be one element (shape [1] or []), not shape {:?}",
            pos.layout.dims()
        ));
    }
    if pos.layout.storage_extent() > pos.buffer.len() {
        return Err("the position's layout reaches past the end of its storage".into());
    }
    // An empty region writes nothing wherever it is moved (`Layout::shifted`).
    let reach = if region.numel() == 0 {
        Some(region.storage_extent())
    } else {
        max_pos
            .checked_mul(step)
            .and_then(|furthest| region.storage_extent().checked_add(furthest))
    };
    match reach {
        Some(end) if end <= dst_len => Ok(()),
        _ => Err(format!(
            "the region {:?} moved by up to {max_pos} steps of {step} elements reaches past the destination's {dst_len} elements",
            region.dims()
        )),
    }
}

/// The position of a `write_into_at` read from host memory (`pos`'s one
/// element under `layout`, which `check_write_at` has accepted), checked to
/// lie in `0..=max_pos`.
pub fn write_pos_on_host(pos: &CpuStorage, layout: &Layout, max_pos: usize) -> Result<usize, String> {
    let at = layout.offset();
    let value = match pos {
        CpuStorage::I32(v) => v.get(at).map(|&p| i64::from(p)),
        CpuStorage::I64(v) => v.get(at).copied(),
        other => return Err(format!("the position must be i32 or i64, not {}", other.dtype())),
    }
    .ok_or("the position's layout reaches past the end of its storage")?;
    usize::try_from(value)
        .ok()
        .filter(|&p| p <= max_pos)
        .ok_or_else(|| format!("write position {value} is outside 0..={max_pos}"))
}

/// Measures one op on its device (`Backend::timer`).
pub trait OpTimer: Send {
    /// Time from the timer's creation to the end of the work queued since.
    fn elapsed(self: Box<Self>) -> Result<std::time::Duration, BackendError>;
}

/// Wall-clock time on the host: right for backends that run ops to the end
/// inside `execute`.
pub struct HostTimer(pub std::time::Instant);

impl OpTimer for HostTimer {
    fn elapsed(self: Box<Self>) -> Result<std::time::Duration, BackendError> {
        Ok(self.0.elapsed())
    }
}
