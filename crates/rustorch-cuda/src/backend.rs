//! `CudaBackend`: one GPU, one stream, its compiled kernels and cuBLAS.

use crate::buffer::{CudaBuffer, MemoryUse};
use crate::error;
use crate::transfer::{Direction, Method};
use cudarc::cublas::CudaBlas;
use cudarc::driver::sys::CUdevice_attribute;
use cudarc::driver::{CudaContext, CudaFunction, CudaModule, CudaStream};
use rustorch_core::backend::{Backend, Buffer, DeviceBuffer, OpTimer, Replay, TensorRef};
use rustorch_core::device::DeviceCapability;
use rustorch_core::{BackendError, CpuStorage, DType, Device, HostSlice, Layout, Op, OpClass, TensorMeta};
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

pub struct CudaBackend {
    pub(crate) device: Device,
    pub(crate) ctx: Arc<CudaContext>,
    pub(crate) stream: Arc<CudaStream>,
    pub(crate) blas: CudaBlas,
    /// `compute_XY`, what kernels are compiled for.
    pub(crate) arch: String,
    pub(crate) sm_count: u32,
    modules: Mutex<HashMap<&'static str, Arc<CudaModule>>>,
    functions: Mutex<HashMap<String, CudaFunction>>,
    /// Blocks of a kernel an SM holds at once, by block size and kernel
    /// (`blocks_per_sm`): the driver's occupancy answer, asked once.
    occupancy: Mutex<HashMap<u32, HashMap<String, u32>>>,
    pub(crate) usage: Arc<MemoryUse>,
    /// `RUSTORCH_CUDA_MEM_LIMIT`: bytes this backend may hold (tests of the
    /// out-of-memory path); `None`: whatever the GPU has.
    mem_limit: Option<usize>,
    /// The device's default memory pool, which stream-ordered allocations
    /// (`cuMemAllocAsync`) come from; `None` where the driver has none
    /// (then allocations are synchronous `cuMemAlloc`s).
    pool: Option<Pool>,
    /// Pinned buffers for large host copies (`transfer`).
    pub(crate) staging: crate::transfer::Staging,
    /// `RUSTORCH_CUDA_TRANSFER`: one copy method for every size.
    transfer_forced: Option<crate::transfer::Method>,
    /// Whether launches let a kernel start while the one before it ends
    /// (`launch::Launch`): compute capability 9.0 on, unless
    /// `RUSTORCH_CUDA_PDL=0`.
    pub(crate) overlap_launches: bool,
    /// Set after work that writes memory a kernel may read before its
    /// wait (weights: uploads, copies of weights; `serialize_next_launch`):
    /// the next launch then runs after it in plain stream order, not
    /// overlapped (`launch::Launch::new` takes the flag).
    pub(crate) no_overlap_next: std::sync::atomic::AtomicBool,
    /// Whether `rope_write_kv_at` is one launch (unless
    /// `RUSTORCH_CUDA_FUSED_ROPE=0`, which runs the ops one by one: an A/B
    /// switch for the benchmarks).
    pub(crate) fused_rope: bool,
    /// Whether a decode step's attention does its RoPE and cache write
    /// itself (`Backend::rope_attention_at`, `attention_rope_at_joined_F16_pl*`):
    /// on unless `RUSTORCH_CUDA_ROPE_ATTENTION=0` (measured on an H200:
    /// tg128 +5-10% on TinyLlama Q4_K_M, Q8_0 and F16, at 0 and 1024 positions).
    pub(crate) rope_attention: bool,
    /// Whether a one-row add + norm also quantizes its row for the
    /// products after it (ops/reduce.rs `add_rms_norm`, `add_rms_norm_q_lean_F32`;
    /// off with `RUSTORCH_CUDA_NORM_QUANT=0`: the A/B switch).
    pub(crate) norm_quant: bool,
    /// Whether products of more than 8 activation rows of the MMQ types
    /// take the int8 tensor-core kernels in llama.cpp CUDA's arithmetic
    /// (ops/mmq.rs): on with `RUSTORCH_CUDA_MMQ=1` or `set_mmq_products`;
    /// off by default (MMVQ up to 64 rows, then dequantization and cuBLAS,
    /// which measured both faster and closer to llama.cpp's logits).
    pub(crate) mmq: std::sync::atomic::AtomicBool,
    /// Whether that add + norm quantizes its row in every layout whose
    /// blocks it holds whole (`RUSTORCH_CUDA_NORM_ALL_LAYOUTS=1`), not only
    /// in those its products read (the A/B switch).
    pub(crate) norm_all_layouts: bool,
    /// Columns a team of the one-row gated MMVQ kernel takes, one after
    /// another, where `RUSTORCH_CUDA_GATED_COLUMNS` forces 1 or 2; `None`:
    /// chosen by the launch's size (ops/quant.rs `gated_columns`).
    pub(crate) gated_columns: Option<i32>,
    /// The most weight bytes a one-row MMVQ launch prefetches whole into
    /// L2 before its wait (`RUSTORCH_CUDA_PREFETCH_MAX_MB`, in MiB); a
    /// larger product prefetches only its first `prefetch_part_bytes`
    /// (`RUSTORCH_CUDA_PREFETCH_PART_MB`; ops/quant.rs `mmvq_tw`).
    pub(crate) prefetch_max_bytes: usize,
    pub(crate) prefetch_part_bytes: usize,
    /// The fewest keys a block of the one-launch `attention_at` takes
    /// (`RUSTORCH_CUDA_AT_MIN_SHARE`, default 256): a row with fewer visible
    /// keys is one block's, written without a merge. On the H200 (session
    /// 36, TinyLlama Q4_K_M tg128 after 1024 positions): 64, 827 t/s; 128,
    /// 938; 256, 989 (fewer partials to merge); the same at depth 0.
    pub(crate) attention_min_share: u32,
    /// Whether `attention_at`'s warps fetch the key and value rows of their
    /// next chunk into L2 while using one (`RUSTORCH_CUDA_AT_PREFETCH=0`:
    /// not; the A/B switch).
    pub(crate) attention_prefetch: bool,
    /// Whether a decode step's attention with its RoPE prefetches its
    /// position's table rows and its share of the cache into L2 before its
    /// wait (`at_prefetch_early`; `RUSTORCH_CUDA_AT_PREFETCH_EARLY=0`: not).
    pub(crate) attention_prefetch_early: bool,
    /// Whether a prompt's flash attention runs as one tensor-core kernel
    /// (`flash_attention_mma_D`, compute capability 8.0 on) rather than
    /// cuBLAS products around a softmax kernel (`RUSTORCH_CUDA_FLASH_MMA=0`:
    /// the A/B switch).
    pub(crate) flash_mma: bool,
    /// Per-row counters of `attention_at`'s one-launch form, zeroed once
    /// and left zeroed by every launch (ops/attention.rs); made at the
    /// first use outside a recording.
    pub(crate) attention_counters: std::sync::OnceLock<CudaBuffer>,
    /// `RUSTORCH_CUDA_GAP_KERNELS=N`: N empty kernels (`rt_gap`) after every
    /// launch, a diagnostic of what one dependency between kernels costs
    /// (0, the default: none).
    pub(crate) gap_kernels: u32,
    /// `rt_gap`, loaded at the first launch that needs it.
    pub(crate) gap_function: std::sync::OnceLock<Option<CudaFunction>>,
    /// Blocks an SM of the fused norm + products launches
    /// (`Op::AddRmsNormThen`, ops/norm_products.rs):
    /// `RUSTORCH_CUDA_NORM_PRODUCTS`, default 2; 0 runs the op as its parts
    /// (the A/B switch).
    pub(crate) norm_products: u32,
    /// Whether the fused launches also take the quantized types
    /// (`RUSTORCH_CUDA_NORM_PRODUCTS_QUANT=1`; off by default: slower there,
    /// see ops/norm_products.rs).
    pub(crate) norm_products_quant: bool,
    /// Whether the fused float kernels copy half of each row into shared
    /// memory by cp.async (`_cp`, ops/norm_products.rs; on from compute
    /// capability 8.0 unless `RUSTORCH_CUDA_QN_COPY=0`).
    pub(crate) qn_copy: bool,
}

/// The driver's default memory pool of one device, kept as a cache: freed
/// buffers stay mapped for the next allocation instead of going back to
/// the driver at each synchronization (the pool's default), and are given
/// back only when an allocation runs out of memory.
struct Pool(cudarc::driver::sys::CUmemoryPool);

impl Pool {
    /// The default pool of `ctx`'s device, set to keep what it holds.
    fn caching(ctx: &CudaContext) -> Option<Pool> {
        use cudarc::driver::sys;
        if !ctx.has_async_alloc() {
            return None;
        }
        let mut pool = std::ptr::null_mut();
        // SAFETY: plain driver calls on a live device; `keep` outlives the
        // call that reads it.
        unsafe {
            sys::cuDeviceGetDefaultMemPool(&mut pool, ctx.cu_device())
                .result()
                .ok()?;
            let mut keep: u64 = u64::MAX;
            sys::cuMemPoolSetAttribute(
                pool,
                sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                (&mut keep as *mut u64).cast(),
            )
            .result()
            .ok()?;
        }
        Some(Pool(pool))
    }

    /// Gives every unused byte back to the driver.
    fn trim(&self) {
        // SAFETY: the pool belongs to a device whose context is alive.
        unsafe {
            let _ = cudarc::driver::sys::cuMemPoolTrimTo(self.0, 0);
        }
    }
}

/// Whether `RUSTORCH_CUDA_SKIP_KERNELS` (comma-separated name prefixes)
/// names `kernel`: a timing diagnostic that launches the empty kernel in
/// its place (so what remains of its cost is one dependency between
/// kernels); every result is then wrong.
fn skipped_kernel(kernel: &str) -> bool {
    static SKIP: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();
    SKIP.get_or_init(|| {
        std::env::var("RUSTORCH_CUDA_SKIP_KERNELS")
            .map(|v| v.split(',').filter(|p| !p.is_empty()).map(str::to_string).collect())
            .unwrap_or_default()
    })
    .iter()
    .any(|p| kernel.starts_with(p.as_str()))
}

/// Whether environment variable `name` is set to `value` (the A/B
/// switches of the backend's launch choices).
fn env_is(name: &str, value: &str) -> bool {
    std::env::var(name).is_ok_and(|v| v == value)
}

/// The number environment variable `name` holds, or `default` where it is
/// unset or not a number (the backend's tuning settings).
fn env_number<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

// SAFETY: cuBLAS handles are used from any thread with the context bound
// (cudarc binds it per call); every launch goes to one stream.
unsafe impl Send for CudaBackend {}
unsafe impl Sync for CudaBackend {}

impl CudaBackend {
    /// Turns the MMQ products (ops/mmq.rs) on or off: the conformance
    /// suite checks the CPU-arithmetic kernels with them off, and
    /// tests/mmq.rs checks them on their own.
    pub fn set_mmq_products(&self, on: bool) {
        self.mmq.store(on, std::sync::atomic::Ordering::Relaxed);
    }

    /// Devices the driver sees.
    pub fn device_count() -> Result<usize, String> {
        CudaContext::device_count()
            .map(|n| n.max(0) as usize)
            .map_err(|e| format!("{e:?}"))
    }

    /// A backend for GPU `ordinal`, holding at most
    /// `RUSTORCH_CUDA_MEM_LIMIT` bytes where that is set.
    pub fn new(ordinal: usize) -> Result<CudaBackend, String> {
        let mem_limit = match std::env::var("RUSTORCH_CUDA_MEM_LIMIT") {
            Ok(v) => Some(
                v.trim()
                    .parse::<usize>()
                    .map_err(|_| format!("RUSTORCH_CUDA_MEM_LIMIT={v}: expected a number of bytes"))?,
            ),
            Err(_) => None,
        };
        CudaBackend::with_memory_limit(ordinal, mem_limit)
    }

    /// A backend for GPU `ordinal` that holds at most `mem_limit` bytes
    /// (`None`: whatever the GPU has): past it, allocations fail as the
    /// GPU's own out-of-memory does (tests of that path).
    pub fn with_memory_limit(ordinal: usize, mem_limit: Option<usize>) -> Result<CudaBackend, String> {
        let ctx = CudaContext::new(ordinal).map_err(|e| format!("{e:?}"))?;
        // One stream per device: no cross-stream events needed per buffer.
        // SAFETY: every buffer and launch of this backend uses `stream`.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.new_stream().map_err(|e| format!("{e:?}"))?;
        let blas = CudaBlas::new(stream.clone()).map_err(|e| format!("cuBLAS: {e:?}"))?;
        let (major, minor) = ctx.compute_capability().map_err(|e| format!("{e:?}"))?;
        let sm_count = ctx
            .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .unwrap_or(1) as u32;
        let pool = Pool::caching(&ctx);
        let transfer_forced = crate::transfer::Method::forced()?;
        Ok(CudaBackend {
            device: Device::Cuda(ordinal),
            ctx,
            stream,
            blas,
            arch: format!("compute_{major}{minor}"),
            sm_count,
            modules: Mutex::new(HashMap::new()),
            functions: Mutex::new(HashMap::new()),
            occupancy: Mutex::new(HashMap::new()),
            usage: Arc::new(MemoryUse::default()),
            mem_limit,
            pool,
            staging: Default::default(),
            transfer_forced,
            overlap_launches: major >= 9 && !env_is("RUSTORCH_CUDA_PDL", "0"),
            no_overlap_next: std::sync::atomic::AtomicBool::new(false),
            fused_rope: !env_is("RUSTORCH_CUDA_FUSED_ROPE", "0"),
            rope_attention: !env_is("RUSTORCH_CUDA_ROPE_ATTENTION", "0"),
            norm_quant: !env_is("RUSTORCH_CUDA_NORM_QUANT", "0"),
            mmq: std::sync::atomic::AtomicBool::new(env_is("RUSTORCH_CUDA_MMQ", "1")),
            norm_all_layouts: env_is("RUSTORCH_CUDA_NORM_ALL_LAYOUTS", "1"),
            attention_min_share: match env_number("RUSTORCH_CUDA_AT_MIN_SHARE", 256u32) {
                0 => 256,
                v => v,
            },
            attention_prefetch: !env_is("RUSTORCH_CUDA_AT_PREFETCH", "0"),
            attention_prefetch_early: !env_is("RUSTORCH_CUDA_AT_PREFETCH_EARLY", "0"),
            prefetch_max_bytes: env_number("RUSTORCH_CUDA_PREFETCH_MAX_MB", 6usize).saturating_mul(1 << 20),
            prefetch_part_bytes: env_number("RUSTORCH_CUDA_PREFETCH_PART_MB", 4usize).saturating_mul(1 << 20),
            gated_columns: match std::env::var("RUSTORCH_CUDA_GATED_COLUMNS").as_deref() {
                Ok("1") => Some(1),
                Ok("2") => Some(2),
                _ => None,
            },
            flash_mma: major >= 8 && !env_is("RUSTORCH_CUDA_FLASH_MMA", "0"),
            attention_counters: std::sync::OnceLock::new(),
            gap_kernels: env_number("RUSTORCH_CUDA_GAP_KERNELS", 0),
            gap_function: std::sync::OnceLock::new(),
            norm_products: env_number("RUSTORCH_CUDA_NORM_PRODUCTS", 2),
            norm_products_quant: env_is("RUSTORCH_CUDA_NORM_PRODUCTS_QUANT", "1"),
            qn_copy: major >= 8 && !env_is("RUSTORCH_CUDA_QN_COPY", "0"),
        })
    }

    pub(crate) fn err(&self, what: &str, e: cudarc::driver::DriverError, bytes: usize) -> BackendError {
        error::driver(self.device, what, e, bytes)
    }

    /// Blocks of `threads` threads (no dynamic shared memory) of kernel
    /// `name` (`f`) an SM holds at once, 0 where the driver does not say:
    /// asked once per kernel and size (a launch in an op-by-op decode step
    /// would otherwise ask at each layer).
    pub(crate) fn blocks_per_sm(&self, name: &str, f: &CudaFunction, threads: u32) -> u32 {
        let mut known = self.occupancy.lock().unwrap_or_else(|e| e.into_inner());
        let by_kernel = known.entry(threads).or_default();
        // Looked up by &str: no allocation once the kernel is known.
        if let Some(&blocks) = by_kernel.get(name) {
            return blocks;
        }
        let blocks = f
            .occupancy_max_active_blocks_per_multiprocessor(threads, 0, None)
            .unwrap_or(0);
        by_kernel.insert(name.to_string(), blocks);
        blocks
    }

    /// The kernel `name` of module `module`, compiled on first use.
    pub(crate) fn function(&self, module: &'static str, name: &str) -> Result<CudaFunction, BackendError> {
        if name != "rt_gap" && skipped_kernel(name) {
            return self.function("elementwise", "rt_gap");
        }
        if let Some(f) = self.functions.lock().map_err(|_| self.poisoned())?.get(name) {
            return Ok(f.clone());
        }
        let m = {
            let mut modules = self.modules.lock().map_err(|_| self.poisoned())?;
            match modules.get(module) {
                Some(m) => m.clone(),
                None => {
                    let m = self.load_module(module)?;
                    modules.insert(module, m.clone());
                    m
                }
            }
        };
        let f = m
            .load_function(name)
            .map_err(|_| BackendError::unsupported(self.device, name, "no kernel for this dtype"))?;
        self.functions
            .lock()
            .map_err(|_| self.poisoned())?
            .insert(name.to_string(), f.clone());
        Ok(f)
    }

    /// Kernel module `module` compiled (or read from the disk cache) and
    /// loaded into the context.
    fn load_module(&self, module: &'static str) -> Result<Arc<CudaModule>, BackendError> {
        let src = crate::KERNEL_SOURCES
            .iter()
            .find(|(n, _)| *n == module)
            .map(|(_, s)| *s)
            .ok_or_else(|| BackendError::unsupported(self.device, module, "no such kernel module"))?;
        // Machine code for this GPU first; PTX (translated by the driver)
        // where NVRTC cannot make it or the driver does not take it.
        let sm = self.arch.replace("compute_", "sm_");
        if let Ok(cubin) = crate::compile::compile_cubin(module, src, &sm) {
            if let Ok(m) = self.ctx.load_module(cudarc::nvrtc::Ptx::from_binary(cubin)) {
                return self.set_module_switches(m);
            }
        }
        let ptx = crate::compile::compile(module, src, &self.arch).map_err(|message| BackendError::Device {
            device: self.device,
            message,
        })?;
        let m = self
            .ctx
            .load_module(ptx)
            .map_err(|e| self.err("loading kernels", e, 0))?;
        self.set_module_switches(m)
    }

    /// The module's switches in constant memory (kernels/common.cuh), each
    /// set to 1 where its variable is `0`: `rt_weight_prefetch_off`
    /// (`RUSTORCH_CUDA_WEIGHT_PREFETCH=0`).
    fn set_module_switches(&self, m: Arc<CudaModule>) -> Result<Arc<CudaModule>, BackendError> {
        const SWITCHES: [(&str, &str); 1] = [("RUSTORCH_CUDA_WEIGHT_PREFETCH", "rt_weight_prefetch_off")];
        for (var, symbol) in SWITCHES {
            if !env_is(var, "0") {
                continue;
            }
            // A module the compiler left without the symbol has nothing to switch.
            if let Ok(mut flag) = m.get_global(symbol, &self.stream) {
                self.stream
                    .memcpy_htod(&1i32.to_le_bytes(), &mut flag)
                    .and_then(|()| self.stream.synchronize())
                    .map_err(|e| self.err("setting a kernel switch", e, 4))?;
            }
        }
        Ok(m)
    }

    /// Compiles (or reads from the disk cache) and loads every kernel
    /// module not loaded yet, on several threads at once: a first start
    /// otherwise compiles module by module as ops first need them, which
    /// on a fresh cache takes about a minute and a half on one thread.
    pub fn load_all_kernels(&self) -> Result<(), BackendError> {
        let missing: Vec<&'static str> = {
            let modules = self.modules.lock().map_err(|_| self.poisoned())?;
            crate::KERNEL_SOURCES
                .iter()
                .map(|(n, _)| *n)
                .filter(|n| !modules.contains_key(n))
                .collect()
        };
        let loaded: Vec<(&'static str, Result<Arc<CudaModule>, BackendError>)> = std::thread::scope(|scope| {
            let jobs: Vec<_> = missing
                .iter()
                .map(|&m| {
                    (
                        m,
                        std::thread::Builder::new().spawn_scoped(scope, move || self.load_module(m)),
                    )
                })
                .collect();
            jobs.into_iter()
                .map(|(m, job)| {
                    // Where no thread could be started, or one panicked,
                    // the module is loaded here.
                    let r = match job {
                        Ok(handle) => handle.join().unwrap_or_else(|_| self.load_module(m)),
                        Err(_) => self.load_module(m),
                    };
                    (m, r)
                })
                .collect()
        });
        let mut modules = self.modules.lock().map_err(|_| self.poisoned())?;
        for (m, r) in loaded {
            modules.entry(m).or_insert(r?);
        }
        Ok(())
    }

    pub(crate) fn poisoned(&self) -> BackendError {
        BackendError::Device {
            device: self.device,
            message: "a thread panicked while holding the kernel cache".into(),
        }
    }

    /// `len` elements of `dtype`, uninitialized (every kernel writes all of
    /// its output). Counts against `RUSTORCH_CUDA_MEM_LIMIT`.
    pub(crate) fn alloc(&self, dtype: DType, len: usize) -> Result<CudaBuffer, BackendError> {
        if self.usage.capturing() {
            return self.alloc_recorded(dtype, len);
        }
        let bytes = len * dtype.size_in_bytes();
        let before = self.usage.bytes.fetch_add(bytes, Ordering::Relaxed);
        if self.mem_limit.is_some_and(|cap| before + bytes > cap) {
            self.usage.bytes.fetch_sub(bytes, Ordering::Relaxed);
            return Err(BackendError::OutOfMemory {
                device: self.device,
                requested_bytes: bytes,
            });
        }
        // SAFETY: u8 has no invalid bit patterns; callers write before reading.
        let mut result = unsafe { self.stream.alloc::<u8>(bytes.max(1)) };
        if let (Err(e), Some(pool)) = (&result, &self.pool) {
            if e.0 == cudarc::driver::sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY {
                // The pool's cache may hold the memory: wait for the frees
                // queued on the stream, give it all back, and retry once.
                self.stream.synchronize().map_err(|e| self.err("alloc", e, bytes))?;
                pool.trim();
                // SAFETY: as above.
                result = unsafe { self.stream.alloc::<u8>(bytes.max(1)) };
            }
        }
        match result {
            Ok(data) => {
                self.usage.handed_out.fetch_add(bytes as u64, Ordering::Relaxed);
                Ok(CudaBuffer {
                    device: self.device,
                    dtype,
                    len,
                    mem: crate::buffer::Memory::Owned(std::mem::ManuallyDrop::new(data)),
                    usage: self.usage.clone(),
                    row_acts: None,
                })
            }
            Err(e) => {
                self.usage.bytes.fetch_sub(bytes, Ordering::Relaxed);
                Err(self.err("alloc", e, bytes))
            }
        }
    }

    /// This backend's buffer, or an error naming where `b` lives instead.
    pub(crate) fn own<'a>(&self, op: &str, b: &'a dyn DeviceBuffer) -> Result<&'a CudaBuffer, BackendError> {
        match b.as_any().downcast_ref::<CudaBuffer>() {
            Some(c) if c.device == self.device => Ok(c),
            _ => Err(BackendError::invalid(
                op,
                format!("an input lives on {}, not on {}", b.device(), self.device),
            )),
        }
    }

    /// Makes the next launch wait for everything queued before it, not
    /// overlap the kernel before it: to be called after queuing work that
    /// writes memory a kernel may read before its wait (the products'
    /// weights, the norm's weight: kernels/common.cuh, rt_kernel_entry).
    /// Once that launch has started, so has nothing that could still be
    /// writing, so every later launch may overlap again.
    pub(crate) fn serialize_next_launch(&self) {
        self.no_overlap_next.store(true, std::sync::atomic::Ordering::Relaxed);
    }

    pub(crate) fn launch_err(&self, name: &str, e: cudarc::driver::DriverError) -> BackendError {
        self.err(&format!("launching {name}"), e, 0)
    }

    /// How a copy of `bytes` in `dir` goes: `RUSTORCH_CUDA_TRANSFER` where
    /// set, else the measured choice.
    fn transfer_method(&self, dir: Direction, bytes: usize) -> Method {
        self.transfer_forced.unwrap_or_else(|| Method::for_size(dir, bytes))
    }

    /// Makes the device fault as a broken kernel would: a kernel writes to
    /// an address outside every allocation. The fault is found by the next
    /// call that waits for the GPU, which reports `DeviceLost`, and the
    /// CUDA context stays unusable for the rest of the process. For tests of
    /// the lost-device path only.
    #[doc(hidden)]
    pub fn provoke_fault_for_tests(&self) -> Result<(), BackendError> {
        let f = self.function("elementwise", "provoke_fault")?;
        let address: u64 = 8;
        let mut args = crate::launch::Launch::new(self, &f);
        args.arg(&address);
        // SAFETY: not safe for the context, on purpose (see above); the
        // host's memory is untouched.
        unsafe { args.launch(cudarc::driver::LaunchConfig::for_num_elems(1)) }
            .map_err(|e| self.launch_err("provoke_fault", e))?;
        Ok(())
    }

    /// Bytes this backend holds now.
    pub fn bytes_in_use(&self) -> usize {
        self.usage.bytes.load(Ordering::Relaxed)
    }
}

impl Backend for CudaBackend {
    fn device(&self) -> Device {
        self.device
    }

    fn capability(&self) -> DeviceCapability {
        let name = self.ctx.name().unwrap_or_else(|_| "NVIDIA GPU".into());
        let (free, total) = match self.ctx.mem_get_info() {
            Ok((f, t)) => (Some(f as u64), Some(t as u64)),
            Err(_) => (None, None),
        };
        let (major, minor) = self.ctx.compute_capability().unwrap_or((0, 0));
        let mut v = 0;
        // SAFETY: one out-parameter; the driver is loaded (this backend exists).
        let driver = if unsafe { cudarc::driver::sys::cuDriverGetVersion(&mut v) }
            == cudarc::driver::sys::CUresult::CUDA_SUCCESS
        {
            format!("{}.{}", v / 1000, (v % 1000) / 10)
        } else {
            "?".into()
        };
        let nvrtc = crate::compile::nvrtc_version()
            .map(|(a, b)| format!("{a}.{b}"))
            .unwrap_or_else(|_| "missing".into());
        let cache = crate::compile::cache_dir()
            .map(|d| d.display().to_string())
            .unwrap_or_else(|| "none".into());
        DeviceCapability {
            name,
            // Dtypes and op classes with at least one kernel here; `supports`
            // decides per op and dtype.
            dtypes: vec![
                DType::Bool,
                DType::U8,
                DType::I32,
                DType::I64,
                DType::F16,
                DType::BF16,
                DType::F32,
                DType::F64,
            ],
            op_classes: vec![
                OpClass::DataMovement,
                OpClass::Elementwise,
                OpClass::Activation,
                OpClass::Reduction,
                OpClass::LinearAlgebra,
                OpClass::Normalization,
                OpClass::Indexing,
                OpClass::Attention,
                OpClass::Convolution,
            ],
            total_memory: total,
            free_memory: free,
            api: Some("CUDA".into()),
            // One item each, without spaces: listings join features with spaces.
            features: vec![
                format!("sm_{major}{minor}"),
                format!("sms={}", self.sm_count),
                format!("driver=cuda-{driver}"),
                format!("nvrtc={nvrtc}"),
                format!("kernel-cache={}", cache.replace(' ', "_")),
            ],
        }
    }

    fn supports(&self, op: &Op, inputs: &[TensorMeta]) -> bool {
        crate::ops::supports(op, inputs)
    }

    fn warm_up(&self) -> Result<(), BackendError> {
        self.load_all_kernels()
    }

    fn upload(&self, host: HostSlice<'_>) -> Result<Buffer, BackendError> {
        self.not_recording("upload")?;
        let bytes = host.as_bytes();
        let buf = self.alloc(host.dtype(), host.len())?;
        let method = self.transfer_method(Direction::Upload, bytes.len());
        self.copy_to_device(method, bytes, buf.ptr())?;
        Ok(Arc::new(buf))
    }

    fn alloc_zeroed(&self, dtype: DType, len: usize) -> Result<Buffer, BackendError> {
        let buf = self.alloc(dtype, len)?;
        buf.zero(&self.stream).map_err(|e| self.err("alloc_zeroed", e, 0))?;
        Ok(Arc::new(buf))
    }

    fn alloc_host_readable(&self, dtype: DType, len: usize) -> Result<Option<Buffer>, BackendError> {
        self.not_recording("alloc_host_readable")?;
        // RUSTORCH_CUDA_MAPPED_RESULTS=0: device memory, downloaded (the A/B switch).
        if env_is("RUSTORCH_CUDA_MAPPED_RESULTS", "0") {
            return Ok(None);
        }
        let bytes = len * dtype.size_in_bytes();
        let mapped = crate::buffer::MappedHost::new(&self.ctx, bytes, false)
            .map_err(|e| self.err("alloc_host_readable", e, bytes))?;
        Ok(Some(Arc::new(CudaBuffer {
            device: self.device,
            dtype,
            len,
            mem: crate::buffer::Memory::Mapped(mapped),
            usage: self.usage.clone(),
            row_acts: None,
        })))
    }

    fn write_host_readable(&self, dst: &dyn DeviceBuffer, region: &Layout, bytes: &[u8]) -> Result<bool, BackendError> {
        let b = self.own("write_host_readable", dst)?;
        let crate::buffer::Memory::Mapped(m) = &b.mem else {
            return Ok(false);
        };
        let offset = region.offset() * b.dtype.size_in_bytes();
        if !region.is_contiguous() || offset + bytes.len() > m.bytes {
            return Ok(false);
        }
        // The work queued before may still read it (the last step's kernels).
        self.stream
            .synchronize()
            .map_err(|e| self.err("write_host_readable", e, bytes.len()))?;
        m.write(offset, bytes);
        Ok(true)
    }

    fn download(&self, buffer: &dyn DeviceBuffer) -> Result<CpuStorage, BackendError> {
        self.not_recording("download")?;
        let b = self.own("download", buffer)?;
        if let crate::buffer::Memory::Mapped(m) = &b.mem {
            // Read in place once the work queued before has written it.
            self.stream
                .synchronize()
                .map_err(|e| self.err("download", e, m.bytes))?;
            return CpuStorage::from_bytes(b.dtype, m.bytes()).map_err(|message| BackendError::Device {
                device: self.device,
                message,
            });
        }
        let n = b.len * b.dtype.size_in_bytes();
        let mut host = vec![0u8; n];
        let method = self.transfer_method(Direction::Download, n);
        self.copy_to_host(method, b.ptr(), &mut host)?;
        CpuStorage::from_bytes(b.dtype, &host).map_err(|message| BackendError::Device {
            device: self.device,
            message,
        })
    }

    fn execute(&self, op: &Op, inputs: &[TensorRef<'_>], outputs: &[TensorMeta]) -> Result<Vec<Buffer>, BackendError> {
        crate::ops::execute(self, op, inputs, outputs)
    }

    fn write_into(
        &self,
        dst: &mut dyn rustorch_core::backend::DeviceBuffer,
        region: &rustorch_core::Layout,
        src: TensorRef<'_>,
    ) -> Result<(), BackendError> {
        crate::ops::write_into(self, dst, region, src)
    }

    fn write_into_at(
        &self,
        dst: &mut dyn rustorch_core::backend::DeviceBuffer,
        region: &rustorch_core::Layout,
        step: usize,
        max_pos: usize,
        pos: TensorRef<'_>,
        src: TensorRef<'_>,
    ) -> Result<(), BackendError> {
        crate::ops::write_into_at(self, dst, region, step, max_pos, pos, src)
    }

    fn rope_write_kv_at(
        &self,
        kc: &mut dyn rustorch_core::backend::DeviceBuffer,
        vc: &mut dyn rustorch_core::backend::DeviceBuffer,
        at: &rustorch_core::backend::KvWriteAt<'_>,
        layout: rustorch_core::op::RopeLayout,
        qkv: [TensorRef<'_>; 3],
        cos_sin: [TensorRef<'_>; 2],
    ) -> Result<rustorch_core::backend::Buffer, BackendError> {
        crate::ops::rope_write_kv_at(self, kc, vc, at, layout, qkv, cos_sin)
    }

    fn rope_attention_at(
        &self,
        kc: &mut dyn rustorch_core::backend::DeviceBuffer,
        vc: &mut dyn rustorch_core::backend::DeviceBuffer,
        at: &rustorch_core::backend::KvWriteAt<'_>,
        caches: [&Layout; 2],
        layout: rustorch_core::op::RopeLayout,
        qkv: [TensorRef<'_>; 3],
        tables: [TensorRef<'_>; 2],
        attention: (f32, Option<usize>),
    ) -> Result<rustorch_core::backend::Buffer, BackendError> {
        crate::ops::attention::rope_attention_at(self, (kc, vc), at, caches, layout, qkv, tables, attention)
    }

    fn synchronize(&self) -> Result<(), BackendError> {
        self.not_recording("synchronize")?;
        self.stream.synchronize().map_err(|e| self.err("synchronize", e, 0))
    }

    fn capture(
        &self,
        arena_bytes: usize,
        pass: &mut (dyn FnMut() -> bool + Send),
    ) -> Result<Box<dyn Replay>, BackendError> {
        self.record(arena_bytes, pass)
    }

    fn bytes_allocated(&self) -> Option<u64> {
        Some(self.usage.handed_out.load(Ordering::Relaxed))
    }

    fn timer(&self) -> Box<dyn OpTimer> {
        Box::new(EventTimer::start(self))
    }
}

/// Times queued work with two CUDA events (reading waits for the second).
struct EventTimer {
    device: Device,
    stream: Arc<CudaStream>,
    start: Option<cudarc::driver::CudaEvent>,
    host: std::time::Instant,
}

// SAFETY: events are used with their context bound by cudarc.
unsafe impl Send for EventTimer {}

impl EventTimer {
    fn start(b: &CudaBackend) -> EventTimer {
        let start = b
            .ctx
            .new_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT))
            .ok()
            .filter(|e| e.record(&b.stream).is_ok());
        EventTimer {
            device: b.device,
            stream: b.stream.clone(),
            start,
            host: std::time::Instant::now(),
        }
    }
}

impl OpTimer for EventTimer {
    fn elapsed(self: Box<Self>) -> Result<std::time::Duration, BackendError> {
        let Some(start) = self.start else {
            // No event could be made: the host's time, after the work ends.
            self.stream
                .synchronize()
                .map_err(|e| error::driver(self.device, "timing", e, 0))?;
            return Ok(self.host.elapsed());
        };
        let end = self
            .stream
            .context()
            .new_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(|e| error::driver(self.device, "timing", e, 0))?;
        end.record(&self.stream)
            .map_err(|e| error::driver(self.device, "timing", e, 0))?;
        end.synchronize()
            .map_err(|e| error::driver(self.device, "timing", e, 0))?;
        let ms = start
            .elapsed_ms(&end)
            .map_err(|e| error::driver(self.device, "timing", e, 0))?;
        Ok(std::time::Duration::from_secs_f64(ms as f64 / 1000.0))
    }
}
