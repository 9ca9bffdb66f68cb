//! Launchers for kernels/mmq.cuh: products of GGML-typed weights with more
//! than `MMQ_MIN_ROWS` activation rows (prompts), on the int8 tensor cores
//! in llama.cpp CUDA's MMQ arithmetic: the activations quantized to q8_1
//! blocks of 32 as its `quantize_mmq_q8_1` does, each 32-value piece's
//! exact integer sum scaled by its f32 steps for the weight type.
//!
//! Off by default (`RUSTORCH_CUDA_MMQ=1` turns it on): it was built to
//! find out whether llama.cpp's own arithmetic brings a prompt's logits
//! closer to llama.cpp CUDA's than the default path (MMVQ up to 64 rows,
//! then the weights dequantized to f16 and cuBLAS, activations in f16).
//! It does not (H200, SmolLM2-135M, `KLD_NGLS=mmq bash
//! bench/device_cuda_llm.sh kld`): mean KL divergence from llama.cpp
//! CUDA's logits 0.0231 / 0.0039 / 0.0053 / 0.0218 / 0.0038 (Q4_1, Q8_0,
//! Q4_K_M, Q5_K_M, Q6_K) against the default path's 0.0143 / 0.0031 /
//! 0.0039 / 0.0145 / 0.0031, the same as llama.cpp CUDA against itself
//! with micro-batches of 256 instead of 512 (0.0215 / 0.0037 / 0.0053 /
//! 0.0222 / 0.0038). Every layer requantizes its activations to 8 bits, so
//! any f32 rounding difference upstream flips quants by a whole step; two
//! such paths differ by twice the quantization noise, where f16
//! activations carry none of their own. It is also slower: pp512 0.63x
//! (TinyLlama Q4_K_M) to 0.87x (Q4_0) of llama.cpp, against 1.14x-1.72x.
//! tests/mmq.rs checks it against the exact product.

use super::quant::Weight;
use crate::backend::CudaBackend;
use crate::buffer::CudaBuffer;
use cudarc::driver::LaunchConfig;
use rustorch_core::quant::QType;
use rustorch_core::{BackendError, DType};

/// Activation rows from which products take this path (llama.cpp's
/// `MMVQ_MAX_BATCH_SIZE`: up to it, the one-row style kernels).
pub(super) const MMQ_MIN_ROWS: usize = 8;
/// Tile of the kernel: weight rows by activation rows (`MMQ_BM`, `MMQ_BN`).
const TILE_ROWS: usize = 128;
const TILE_ACTS: usize = 64;
const THREADS: u32 = 256;

/// The activation layout a weight type's kernel reads: whether the scale
/// is rounded to f16 and the block's sum kept (llama.cpp's DS4) or the
/// scale kept in f32 (D4).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum MmqLayout {
    D4 = 0,
    Ds4 = 1,
}

/// The kernel for `q` and the layout it reads; `None` for types without
/// one here (they keep the cuBLAS path).
fn kernel(q: QType) -> Option<(&'static str, MmqLayout)> {
    use MmqLayout::*;
    Some(match q {
        QType::Q4_0 => ("mmq_Q4_0", Ds4),
        QType::Q4_1 => ("mmq_Q4_1", Ds4),
        QType::Q5_0 => ("mmq_Q5_0", D4),
        QType::Q5_1 => ("mmq_Q5_1", Ds4),
        QType::Q8_0 => ("mmq_Q8_0", D4),
        QType::Q4K => ("mmq_Q4_K", Ds4),
        QType::Q5K => ("mmq_Q5_K", Ds4),
        QType::Q6K => ("mmq_Q6_K", D4),
        _ => return None,
    })
}

/// The kernel and activation layout for a product of `m` rows of `k`
/// activations at `x_ptr` with `n` rows of a `q` weight, when it takes
/// this path: the path on, a type with a kernel, whole blocks, rows the
/// quantizer reads as float4 and sizes its int indices hold.
pub(super) fn plan(
    b: &CudaBackend,
    q: QType,
    m: usize,
    n: usize,
    k: usize,
    x_ptr: u64,
) -> Option<(&'static str, MmqLayout)> {
    let fits = b.mmq.load(std::sync::atomic::Ordering::Relaxed)
        && m > MMQ_MIN_ROWS
        && k.is_multiple_of(q.block_size().max(32))
        && x_ptr.is_multiple_of(16)
        && i32::try_from(m.max(n).max(k)).is_ok()
        && i32::try_from(m * k / 32).is_ok();
    fits.then(|| kernel(q)).flatten()
}

/// Activations quantized for the kernels: int8 values `[m, k]`, then per
/// 32-value block the scale and (DS4) the sum, as f32.
pub(super) struct MmqActs {
    q: u64,
    d: u64,
    s: u64,
    _buf: CudaBuffer,
}

/// `m` rows of `k` contiguous f32 at `x` (16-byte aligned) in `layout`.
pub(super) fn quantize(
    b: &CudaBackend,
    x: u64,
    m: usize,
    k: usize,
    layout: MmqLayout,
) -> Result<MmqActs, BackendError> {
    let blocks = m * k / 32;
    let q_bytes = (m * k).next_multiple_of(16);
    let buf = b.alloc(DType::U8, q_bytes + 8 * blocks)?;
    let (q, d) = (buf.ptr(), buf.ptr() + q_bytes as u64);
    let s = d + 4 * blocks as u64;
    let n4 = (m * k / 4) as i64;
    let groups = (m * k / 4).div_ceil(THREADS as usize);
    let cfg = LaunchConfig {
        grid_dim: (
            u32::try_from(groups)
                .map_err(|_| BackendError::unsupported(b.device, "mmq_quantize", "more blocks than a grid holds"))?,
            1,
            1,
        ),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    let name = match layout {
        MmqLayout::D4 => "mmq_quantize_d4",
        MmqLayout::Ds4 => "mmq_quantize_ds4",
    };
    let f = b.function("quant", name)?;
    let mut args = crate::launch::Launch::new(b, &f);
    args.arg(&x).arg(&n4).arg(&q).arg(&d).arg(&s);
    // SAFETY: mmq_quantize_*(x, n4, q, d, s): x holds n4 float4 (m rows of
    // k f32, 16-byte aligned, k a multiple of 32); q n4 ints, d and s one
    // f32 per 32 values, all inside `buf`.
    unsafe { args.launch(cfg) }.map_err(|e| b.launch_err(name, e))?;
    Ok(MmqActs { q, d, s, _buf: buf })
}

/// `y [m, n] = x [m, k] w^T` with `kernel` (`plan`'s), `x` quantized in
/// its layout.
pub(super) fn product(
    b: &CudaBackend,
    kernel: &str,
    w: &Weight,
    x: &MmqActs,
    m: usize,
    k: usize,
    y: &CudaBuffer,
) -> Result<(), BackendError> {
    let n = w.rows;
    let grid = (
        u32::try_from(n.div_ceil(TILE_ROWS))
            .map_err(|_| BackendError::unsupported(b.device, kernel, "too many rows"))?,
        u32::try_from(m.div_ceil(TILE_ACTS))
            .ok()
            .filter(|&g| g < 65536)
            .ok_or_else(|| BackendError::unsupported(b.device, kernel, "too many activation rows"))?,
        1,
    );
    let cfg = LaunchConfig {
        grid_dim: grid,
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    let f = b.function("quant", kernel)?;
    let (n32, m32, k32) = (n as i32, m as i32, k as i32);
    let yp = y.ptr();
    let mut args = crate::launch::Launch::new(b, &f);
    args.arg(&w.ptr)
        .arg(&w.row_stride)
        .arg(&n32)
        .arg(&x.q)
        .arg(&x.d)
        .arg(&x.s)
        .arg(&m32)
        .arg(&k32)
        .arg(&yp);
    // SAFETY: mmq_T(w, row_stride, n, xq, xd, xs, m, k, y): w holds n rows
    // of k values of the kernel's type, row_stride bytes apart, 2-byte
    // aligned (Weight::new with align 2); x m rows of k quantized values
    // in the kernel's layout (`quantize`); y m * n f32. `plan` checked
    // that n, m and k fit an i32 and k is whole blocks.
    unsafe { args.launch(cfg) }.map_err(|e| b.launch_err(kernel, e))
}
