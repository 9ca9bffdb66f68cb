//! The CPU backend: implements every op and is the reference for all others.
//!
//! Each op family lives in its own module with one `execute` entry point;
//! kernels pick SIMD paths at run time and split work over rayon threads.
//! GGML-typed products (`qmatmul`) follow llama.cpp's arithmetic for the
//! CPU at hand; `team` keeps the threads spinning through a decode step;
//! `block_cache` is an allocator for a decode step's many small buffers;
//! `membw` measures the memory bandwidth that bounds generation.

mod attention;
mod conv;
mod copy;
mod elementwise;
pub(crate) mod ggml;
mod index;
mod matmul;
mod norm;
mod quant;
mod reduce;
pub mod vecmath;
mod weight;
mod write;

pub mod block_cache;
pub mod host;
pub mod membw;
pub mod qmatmul;
pub mod team;

pub use ggml::half_arith::{ggml_half, set_default_ggml_half, GgmlHalf};
pub use rustorch_core::storage::{CpuStorage, StorageElement};
pub use weight::PackedWeight;

use rustorch_core::backend::{Backend, Buffer, DeviceBuffer, TensorRef, WeightSpec};
use rustorch_core::device::{self, Device, DeviceCapability};
use rustorch_core::dtype::DType;
use rustorch_core::error::BackendError;
use rustorch_core::layout::Layout;
use rustorch_core::op::{Op, OpClass, TensorMeta};
use rustorch_core::registry::{BackendProvider, BACKEND_PROVIDERS};
use rustorch_core::storage::HostSlice;
use std::borrow::Cow;
use std::sync::Arc;

/// An op input as CPU kernels see it.
#[derive(Clone, Copy)]
pub struct CpuInput<'a> {
    pub storage: &'a CpuStorage,
    pub layout: &'a Layout,
}

impl CpuInput<'_> {
    pub fn dtype(&self) -> DType {
        self.storage.dtype()
    }
    pub fn dims(&self) -> &[usize] {
        self.layout.dims()
    }
}

/// Result type of CPU kernels.
pub type CpuResult = Result<Vec<CpuStorage>, BackendError>;

#[derive(Debug, Default, Clone, Copy)]
pub struct CpuBackend;

impl CpuBackend {
    pub fn new() -> Self {
        CpuBackend
    }

    /// `Op::AddRmsNormThen` as its parts (here the norm has no launch to
    /// save): `AddRmsNorm`, then `then` on its normed output, the same bits.
    fn add_rms_norm_then(eps: f64, then: &Op, inputs: &[CpuInput<'_>], outputs: &[TensorMeta]) -> CpuResult {
        if inputs.len() < 3 || outputs.is_empty() {
            return Err(BackendError::invalid("add_rms_norm_then", "wrong number of inputs"));
        }
        let norm = Op::AddRmsNorm { eps };
        let mut sy = Self::run(&norm, &inputs[..3], &[outputs[0].clone(), outputs[0].clone()])?;
        let (Some(y), Some(s)) = (sy.pop(), sy.pop()) else {
            return Err(BackendError::invalid(
                "add_rms_norm_then",
                "the norm gave fewer than two outputs",
            ));
        };
        let y_layout = Layout::contiguous(outputs[0].shape.clone());
        let mut rest = vec![CpuInput {
            storage: &y,
            layout: &y_layout,
        }];
        rest.extend_from_slice(&inputs[3..]);
        let mut out = vec![s];
        out.extend(Self::run(then, &rest, &outputs[1..])?);
        Ok(out)
    }

    /// Runs an op on host storage. Used by the backend and by anything that
    /// needs CPU results without going through an executor.
    pub fn run(op: &Op, inputs: &[CpuInput<'_>], outputs: &[TensorMeta]) -> CpuResult {
        for i in inputs {
            // For an empty layout the extent is its offset, which must still
            // be inside the storage for the kernels' slicing.
            if i.layout.storage_extent() > i.storage.len() {
                return Err(BackendError::invalid(
                    op.name(),
                    "layout reaches past the end of its storage",
                ));
            }
        }
        match op {
            Op::Copy | Op::Cast { .. } | Op::Cat { .. } => copy::execute(op, inputs, outputs),
            Op::Unary(_) | Op::Clamp { .. } | Op::Binary(_) | Op::Compare(_) | Op::Where => {
                elementwise::execute(op, inputs, outputs)
            }
            Op::Reduce { .. }
            | Op::Softmax { .. }
            | Op::LogSoftmax { .. }
            | Op::Cumsum { .. }
            | Op::TopK { .. }
            | Op::Sort { .. } => reduce::execute(op, inputs, outputs),
            Op::MatMul => matmul::execute(op, inputs, outputs),
            Op::QMatMul { .. } | Op::QMatMuls { .. } | Op::QMatMulGated { .. } | Op::QEmbedding { .. } => {
                quant::execute(op, inputs)
            }
            Op::IndexSelect { .. } | Op::Gather { .. } | Op::ScatterAdd { .. } | Op::Embedding => {
                index::execute(op, inputs, outputs)
            }
            Op::LayerNorm { .. } | Op::RmsNorm { .. } | Op::AddRmsNorm { .. } | Op::BatchNorm { .. } => {
                norm::execute(op, inputs, outputs)
            }
            Op::Rope { .. } | Op::Sdpa { .. } => attention::execute(op, inputs, outputs),
            Op::CachedAttention { scale } => ggml::attention::cached_attention(op, inputs, *scale),
            Op::FlashAttention { scale, cpu } => ggml::flash_attn::flash_attention(
                op,
                inputs,
                ggml::flash_attn::FlashParams {
                    scale: *scale,
                    tiled_rows: cpu.tiled_rows as usize,
                    kv_len: cpu.kv_len as usize,
                    threads: cpu.threads as usize,
                },
            ),
            Op::AttentionAt { scale, window } => attention::attention_at(op, inputs, *scale, *window),
            Op::SwiGlu | Op::GeGlu => ggml::attention::gated(op, inputs),
            Op::Conv1d { .. }
            | Op::Conv2d { .. }
            | Op::ConvTranspose2d { .. }
            | Op::MaxPool2d { .. }
            | Op::AvgPool2d { .. } => conv::execute(op, inputs, outputs),
            Op::AddRmsNormThen { eps, then } => Self::add_rms_norm_then(*eps, then, inputs, outputs),
        }
    }
}

fn as_cpu<'a>(op: &Op, b: &'a dyn DeviceBuffer) -> Result<&'a CpuStorage, BackendError> {
    b.as_any()
        .downcast_ref::<CpuStorage>()
        .ok_or_else(|| BackendError::invalid(op.name(), format!("input lives on {}, not on the cpu", b.device())))
}

impl Backend for CpuBackend {
    fn device(&self) -> Device {
        Device::Cpu
    }

    fn capability(&self) -> DeviceCapability {
        let (total, free) = device::system_memory();
        let mut features = host::cpu_features();
        features.push(format!("threads={}", rayon::current_num_threads()));
        DeviceCapability {
            name: host::cpu_name(),
            dtypes: DType::ALL.to_vec(),
            op_classes: OpClass::ALL.to_vec(),
            total_memory: total,
            free_memory: free,
            api: None,
            features,
        }
    }

    fn supports(&self, op: &Op, _inputs: &[TensorMeta]) -> bool {
        // Every op, and the products of every GGML type with kernels here.
        match op {
            Op::QMatMul { qtype, .. } => qmatmul::can_matmul(*qtype),
            Op::QMatMuls { qtypes } => qtypes.iter().all(|q| qmatmul::can_matmul(*q)),
            Op::QMatMulGated { qtypes, .. } => qtypes.iter().all(|q| qmatmul::can_matmul(*q)),
            Op::AddRmsNormThen { then, .. } => self.supports(then, &[]),
            _ => true,
        }
    }

    fn upload(&self, host: HostSlice<'_>) -> Result<Buffer, BackendError> {
        Ok(Arc::new(host.to_storage()))
    }

    /// From `calloc`: pages never written (cache positions not reached
    /// yet) stay unbacked.
    fn alloc_zeroed(&self, dtype: DType, len: usize) -> Result<Buffer, BackendError> {
        Ok(Arc::new(CpuStorage::zeros(dtype, len)))
    }

    fn prepare_weight(&self, spec: WeightSpec, bytes: Cow<'_, [u8]>) -> Result<Buffer, BackendError> {
        weight::prepare(spec, bytes.into_owned())
    }

    fn download(&self, buffer: &dyn DeviceBuffer) -> Result<CpuStorage, BackendError> {
        Ok(as_cpu(&Op::Copy, buffer)?.clone())
    }

    fn execute(&self, op: &Op, inputs: &[TensorRef<'_>], outputs: &[TensorMeta]) -> Result<Vec<Buffer>, BackendError> {
        let takes_weights = matches!(
            op,
            Op::QMatMul { .. }
                | Op::QMatMuls { .. }
                | Op::QMatMulGated { .. }
                | Op::QEmbedding { .. }
                | Op::AddRmsNormThen { .. }
        );
        let cpu_inputs = inputs
            .iter()
            .map(|t| match t.buffer.as_any().downcast_ref::<PackedWeight>() {
                // The quantized products read a packed weight in its own
                // physical dims (`weight`); `QEmbedding` refuses those.
                Some(w) if takes_weights => {
                    let (storage, layout) = w.physical();
                    Ok(CpuInput { storage, layout })
                }
                Some(_) => Err(BackendError::invalid(
                    op.name(),
                    "a weight in the CPU's own layout is read only by quantized products",
                )),
                None => Ok(CpuInput {
                    storage: as_cpu(op, t.buffer)?,
                    layout: t.layout,
                }),
            })
            .collect::<Result<Vec<_>, BackendError>>()?;
        let out = Self::run(op, &cpu_inputs, outputs)?;
        Ok(out.into_iter().map(|s| Arc::new(s) as Buffer).collect())
    }

    /// The pass inside a spinning thread team (`team::run_team`). A decode
    /// step is hundreds of short ops, each split over the pool, with a few
    /// microseconds of one-thread work (norms, rope, cache writes) between
    /// them. A rayon worker that finds no work yields a few dozen times and
    /// then sleeps on a futex, and waking it for the next op costs tens of
    /// microseconds on a virtual machine: on the 2-core EPYC a sixth of a
    /// TinyLlama decode step went to the scheduler. llama.cpp's thread pool
    /// spins between the ops of a graph instead; so do the team's workers,
    /// for the length of the pass, taking each loop as soon as it is
    /// published (`team::for_each`) and running any rayon work meanwhile.
    /// `RUSTORCH_SPIN=0` turns the spinning off.
    fn run_pass(&self, pass: &mut (dyn FnMut() + Send)) {
        team::run_team(pass)
    }

    fn write_into(&self, dst: &mut dyn DeviceBuffer, region: &Layout, src: TensorRef<'_>) -> Result<(), BackendError> {
        let op = Op::Copy;
        let src_storage = as_cpu(&op, src.buffer)?;
        let dst = dst
            .as_any_mut()
            .and_then(|a| a.downcast_mut::<CpuStorage>())
            .ok_or_else(|| BackendError::invalid("write_into", "destination is not a cpu buffer"))?;
        write::write_into(dst, region, src_storage, src.layout)
    }

    fn write_into_at(
        &self,
        dst: &mut dyn DeviceBuffer,
        region: &Layout,
        step: usize,
        max_pos: usize,
        pos: TensorRef<'_>,
        src: TensorRef<'_>,
    ) -> Result<(), BackendError> {
        let op = Op::Copy;
        let src_storage = as_cpu(&op, src.buffer)?;
        let pos_storage = as_cpu(&op, pos.buffer)?;
        let dst = dst
            .as_any_mut()
            .and_then(|a| a.downcast_mut::<CpuStorage>())
            .ok_or_else(|| BackendError::invalid("write_into_at", "destination is not a cpu buffer"))?;
        write::write_into_at(
            dst,
            region,
            step,
            max_pos,
            (pos_storage, pos.layout),
            src_storage,
            src.layout,
        )
    }
}

/// Registers the CPU backend (`rustorch_core::registry`).
struct CpuProvider;

impl BackendProvider for CpuProvider {
    fn name(&self) -> &'static str {
        "cpu"
    }
    fn priority(&self) -> i32 {
        0
    }
    fn devices(&self) -> Result<Vec<Arc<dyn Backend>>, String> {
        Ok(vec![Arc::new(CpuBackend::new())])
    }
}

#[linkme::distributed_slice(BACKEND_PROVIDERS)]
static CPU_PROVIDER: &'static dyn BackendProvider = &CpuProvider;

/// The error a CPU kernel returns for a dtype it has no code for.
pub(crate) fn unsupported_dtype(op: &Op, dtype: DType) -> BackendError {
    BackendError::unsupported(Device::Cpu, op.name(), format!("no CPU kernel for dtype {dtype}"))
}
