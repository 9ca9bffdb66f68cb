//! `Op::AddRmsNormThen` (a decode step's residual add, the RMS norm after
//! it and the products of the normed row): for one activation row, every
//! block of the products' launch computes the norm into its shared memory
//! (kernels/norm_products.cuh, `qnorm_multi_T` / `qnorm_gated_T`), so the
//! products start without waiting for a norm launch and the quantization
//! launch after it. Anything else runs as the parts: `add_rms_norm`, then
//! the products of its output.
//!
//! Measured on the H200 (bench/device_cuda_profile.sh ab, tg128 of
//! TinyLlama-shaped files, session 35): F16 712 -> 780 t/s with two blocks
//! an SM; the quantized types lost (Q4_K_M 1053 -> 1023, Q8_0 896 -> 764):
//! their products' own kernels keep every column's loads in flight at once,
//! these loop over columns on a grid the GPU holds, and each block's norm
//! reads the row again (24 KB at 2048 values). So the quantized types run
//! as the parts (whose norm quantizes the row for the products,
//! `add_rms_norm_q_lean_F32`) unless `RUSTORCH_CUDA_NORM_PRODUCTS_QUANT=1`.
//!
//! The values are those of the parts up to the norm's rounding: the fused
//! kernel sums the squares in another order than the norm kernel, so a
//! normed value can differ in its last bit and, near a rounding boundary,
//! quantize to the next integer (as between the CPU's products and the
//! GPU's anyway).

use super::quant::{kernel_type, mmvq_align, mmvq_layout, wrow_chunk_values, ActLayout, QMulti, Weight};
use crate::backend::CudaBackend;
use crate::buffer::CudaBuffer;
use cudarc::driver::LaunchConfig;
use rustorch_core::backend::TensorRef;
use rustorch_core::op::GateActivation;
use rustorch_core::quant::QType;
use rustorch_core::{BackendError, DType, Layout, Op, TensorMeta};

/// Warps of a block (`QN_WARPS`) and values a thread holds (`QN_PER`).
const QN_WARPS: usize = 8;
const QN_PER: usize = 16;
/// The longest row the fused kernels norm (a block's registers hold it).
const MAX_ROW: usize = 32 * QN_WARPS * QN_PER;

/// `QNormIn` in kernels/norm_products.cuh.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct QNormIn {
    x: u64,
    a: u64,
    w: u64,
    /// Where s = x + a goes (0: another launch of the op writes it).
    s: u64,
    k: i64,
    eps: f64,
}

// SAFETY: plain data with the C layout the kernels declare.
unsafe impl cudarc::driver::DeviceRepr for QNormIn {}

pub(super) fn run(
    b: &CudaBackend,
    op: &Op,
    inputs: &[TensorRef<'_>],
    outputs: &[TensorMeta],
) -> Result<Vec<CudaBuffer>, BackendError> {
    let Op::AddRmsNormThen { eps, then } = op else {
        return Err(BackendError::unsupported(b.device, op.name(), "not add_rms_norm_then"));
    };
    if inputs.len() < 3 || outputs.len() < 2 {
        return Err(BackendError::invalid(op.name(), "wrong number of inputs or outputs"));
    }
    if b.norm_products > 0 {
        if let Some(out) = fused(b, &op.name(), *eps, then, inputs, outputs)? {
            return Ok(out);
        }
    }
    // The parts: the norm (its output a buffer of this op's), then the products.
    let norm = Op::AddRmsNorm { eps: *eps };
    let wanted = super::quant::layouts_read_by(then);
    let mut sy = super::reduce::add_rms_norm(
        b,
        &norm,
        *eps,
        &inputs[..3],
        &[outputs[0].clone(), outputs[0].clone()],
        wanted,
    )?;
    let y = sy
        .pop()
        .ok_or_else(|| BackendError::invalid(op.name(), "the norm gave no output"))?;
    let s = sy
        .pop()
        .ok_or_else(|| BackendError::invalid(op.name(), "the norm gave no sum"))?;
    let y_layout = Layout::contiguous(outputs[0].shape.clone());
    let mut then_inputs = vec![TensorRef {
        buffer: &y,
        layout: &y_layout,
    }];
    then_inputs.extend_from_slice(&inputs[3..]);
    let products = super::quant::run(b, then, &then_inputs, &outputs[1..])?;
    let mut out = vec![s];
    out.extend(products);
    Ok(out)
}

/// The address of a contiguous f32 operand of `len` values, or `None`.
fn plain_f32(b: &CudaBackend, name: &str, t: &TensorRef<'_>, len: usize) -> Result<Option<u64>, BackendError> {
    if t.dtype() != DType::F32 || !t.layout.is_contiguous() || t.layout.shape().numel() != len {
        return Ok(None);
    }
    Ok(Some(b.own(name, t.buffer)?.ptr() + 4 * t.layout.offset() as u64))
}

/// The fused launches, or `None` where they do not apply (then the parts run).
fn fused(
    b: &CudaBackend,
    name: &str,
    eps: f64,
    then: &Op,
    inputs: &[TensorRef<'_>],
    outputs: &[TensorMeta],
) -> Result<Option<Vec<CudaBuffer>>, BackendError> {
    let k = *inputs[0].layout.dims().last().unwrap_or(&0);
    if k == 0 || k > MAX_ROW || !k.is_multiple_of(32) || outputs[0].shape.numel() != k {
        return Ok(None);
    }
    let (Some(x), Some(a), Some(w)) = (
        plain_f32(b, name, &inputs[0], k)?,
        plain_f32(b, name, &inputs[1], k)?,
        plain_f32(b, name, &inputs[2], k)?,
    ) else {
        return Ok(None);
    };
    let weights = &inputs[3..];
    let s = b.alloc(DType::F32, k)?;
    let mut norm = QNormIn {
        x,
        a,
        w,
        s: s.ptr(),
        k: k as i64,
        eps,
    };
    match then {
        Op::QMatMuls { qtypes } => {
            let Some(plan) = plan_groups(b, name, qtypes, weights, k)? else {
                return Ok(None);
            };
            let ys = plan
                .iter()
                .flat_map(|(_, ws)| ws.iter().map(|(_, w)| b.alloc(DType::F32, w.rows)))
                .collect::<Result<Vec<_>, _>>()?;
            let mut ys = ys.into_iter();
            let mut out: Vec<Option<CudaBuffer>> = (0..qtypes.len()).map(|_| None).collect();
            for (q, ws) in &plan {
                let mut p = QMulti::default();
                for (i, (j, w)) in ws.iter().enumerate() {
                    let y = ys.next().expect("one output per weight");
                    p.w[i] = w.ptr;
                    p.stride[i] = w.row_stride;
                    p.n[i] = w.rows as i64;
                    p.y[i] = y.ptr();
                    out[*j] = Some(y);
                }
                let columns: usize = ws.iter().map(|(_, w)| w.rows).sum();
                launch_multi(b, *q, &norm, &p, ws.len(), columns)?;
                // One launch writes the sum.
                norm.s = 0;
            }
            let mut all = vec![s];
            all.extend(out.into_iter().map(|y| y.expect("every weight is in a group")));
            Ok(Some(all))
        }
        Op::QMatMulGated { qtypes, act } => {
            let q = qtypes[0];
            if qtypes[1] != q || weights.len() != 2 || !has_kernel(b, q, k) {
                return Ok(None);
            }
            let (Some(g), Some(u)) = (weight(b, name, q, &weights[0], k)?, weight(b, name, q, &weights[1], k)?) else {
                return Ok(None);
            };
            if g.rows != u.rows || g.rows == 0 || outputs[1].shape.numel() != g.rows {
                return Ok(None);
            }
            let y = b.alloc(DType::F32, g.rows)?;
            launch_gated(b, q, &norm, &g, &u, *act, &y)?;
            Ok(Some(vec![s, y]))
        }
        _ => Ok(None),
    }
}

/// Whether the fused kernels take weights of `q` with rows of `k` values
/// (the quantized types only where `norm_products_quant` asks for them).
fn has_kernel(b: &CudaBackend, q: QType, k: usize) -> bool {
    if mmvq_layout(q).is_some() && !b.norm_products_quant {
        return false;
    }
    match mmvq_layout(q) {
        Some((ActLayout::K, _)) => k.is_multiple_of(256),
        Some((ActLayout::Q32, _)) => true,
        None => wrow_chunk_values(q).is_some_and(|v| k.is_multiple_of(v)),
    }
}

/// `w` as the fused kernels read it (rows aligned for the type's loads, of
/// `k` values), or `None`.
fn weight(b: &CudaBackend, name: &str, q: QType, w: &TensorRef<'_>, k: usize) -> Result<Option<Weight>, BackendError> {
    let align = match mmvq_layout(q) {
        Some((_, align)) => mmvq_align(q, align, k),
        None => 16,
    };
    let w = Weight::new(b, name, q, w, align)?;
    let ok = w.cols == k && w.rows > 0 && (mmvq_layout(q).is_some() || w.row_stride.rem_euclid(16) == 0);
    Ok(ok.then_some(w))
}

/// Type groups of a `QMatMuls`: the weights of each type (up to three, the
/// kernel's `QMulti`), each with its index among the op's weights; `None`
/// where a weight is not one the fused kernels take.
type Groups = Vec<(QType, Vec<(usize, Weight)>)>;
fn plan_groups(
    b: &CudaBackend,
    name: &str,
    qtypes: &[QType],
    weights: &[TensorRef<'_>],
    k: usize,
) -> Result<Option<Groups>, BackendError> {
    if qtypes.is_empty() || qtypes.len() != weights.len() {
        return Ok(None);
    }
    let mut groups: Groups = Vec::new();
    for (j, (&q, w)) in qtypes.iter().zip(weights).enumerate() {
        if !has_kernel(b, q, k) {
            return Ok(None);
        }
        let Some(w) = weight(b, name, q, w, k)? else {
            return Ok(None);
        };
        match groups.iter_mut().find(|(g, ws)| *g == q && ws.len() < 3) {
            Some((_, ws)) => ws.push((j, w)),
            None => groups.push((q, vec![(j, w)])),
        }
    }
    Ok(Some(groups))
}

/// Shared memory of a block: the normed row in f32, then (for the
/// quantized types) its quants, scales, sums and Q8_1's s, each array
/// 16-byte aligned (`qn_norm_quantized`).
fn smem_bytes(q: QType, k: usize) -> usize {
    let pad = |v: usize| v.next_multiple_of(16);
    match mmvq_layout(q) {
        Some((ActLayout::Q32, _)) => 5 * k + 2 * pad(4 * (k / 32)) + 4 * (k / 32),
        Some((ActLayout::K, _)) => 5 * k + pad(4 * (k / 256)) + pad(4 * (k / 16)),
        None => 4 * k,
    }
}

/// Blocks of a launch over `columns` output columns: the GPU's SMs times
/// `norm_products` (each block norms the row once), fewer where there are
/// fewer columns than warps.
fn launch_config(b: &CudaBackend, q: QType, k: usize, columns: usize) -> LaunchConfig {
    let most = (b.sm_count as usize * b.norm_products as usize).max(1);
    LaunchConfig {
        grid_dim: (columns.div_ceil(QN_WARPS).clamp(1, most) as u32, 1, 1),
        block_dim: ((32 * QN_WARPS) as u32, 1, 1),
        shared_mem_bytes: smem_bytes(q, k) as u32,
    }
}

/// The entry suffix of a float weight's fused kernels and the shared
/// memory it needs beyond `smem_bytes`: `_cp` (half of each row copied
/// into two slots a warp by cp.async, kernels/norm_products.cuh) for rows of
/// exactly 256 16-byte chunks (2048 F16 or BF16 values, 1024 F32) where the
/// GPU has cp.async (`qn_copy`), else the plain entries.
fn copy_variant(b: &CudaBackend, q: QType, k: usize) -> (&'static str, usize) {
    match wrow_chunk_values(q) {
        Some(v) if b.qn_copy && mmvq_layout(q).is_none() && k == 256 * v => ("_cp", COPY_SLOTS_BYTES),
        _ => ("", 0),
    }
}
/// The `_cp` kernels' slots: 8 warps x 2 slots x 4 KiB.
const COPY_SLOTS_BYTES: usize = QN_WARPS * 2 * 4096;

/// `cfg` with `extra` bytes of shared memory beyond `smem_bytes`, the
/// function's limit raised where that passes the default 48 KiB.
fn config_with(
    b: &CudaBackend,
    f: &cudarc::driver::CudaFunction,
    name: &str,
    mut cfg: LaunchConfig,
    extra: usize,
) -> Result<LaunchConfig, BackendError> {
    if extra > 0 {
        cfg.shared_mem_bytes += extra as u32;
        f.set_attribute(
            cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            cfg.shared_mem_bytes as i32,
        )
        .map_err(|e| b.launch_err(name, e))?;
    }
    Ok(cfg)
}

fn launch_multi(
    b: &CudaBackend,
    q: QType,
    norm: &QNormIn,
    p: &QMulti,
    count: usize,
    columns: usize,
) -> Result<(), BackendError> {
    let ty = kernel_type(q).ok_or_else(|| BackendError::unsupported(b.device, "qnorm_multi", "no kernel"))?;
    let (suffix, extra) = copy_variant(b, q, norm.k as usize);
    let kernel = format!("qnorm_multi_{ty}{suffix}");
    let f = b.function("quant", &kernel)?;
    let k = norm.k as usize;
    let row_bytes = q.bytes_for(k).unwrap_or(0) as i64;
    let count32 = count as i32;
    let mut args = crate::launch::Launch::new(b, &f);
    args.arg(norm).arg(p).arg(&count32).arg(&row_bytes);
    // SAFETY: qnorm_multi_T(in, p, count, row_bytes): x, a and w hold k
    // contiguous f32 (s, where not null, room for k); each of the `count`
    // weights of p has n rows of k values of the type at its stride,
    // aligned for the type's loads (Weight::new), and an output of n f32;
    // the shared memory holds what qn_norm_quantized puts there (smem_bytes).
    let cfg = config_with(b, &f, &kernel, launch_config(b, q, k, columns), extra)?;
    unsafe { args.launch(cfg) }.map_err(|e| b.launch_err(&kernel, e))
}

fn launch_gated(
    b: &CudaBackend,
    q: QType,
    norm: &QNormIn,
    g: &Weight,
    u: &Weight,
    act: GateActivation,
    y: &CudaBuffer,
) -> Result<(), BackendError> {
    let ty = kernel_type(q).ok_or_else(|| BackendError::unsupported(b.device, "qnorm_gated", "no kernel"))?;
    let (suffix, extra) = copy_variant(b, q, norm.k as usize);
    let kernel = format!("qnorm_gated_{ty}{suffix}");
    let f = b.function("quant", &kernel)?;
    let k = norm.k as usize;
    let row_bytes = q.bytes_for(k).unwrap_or(0) as i64;
    let n = g.rows as i64;
    let act32: i32 = match act {
        GateActivation::SwiGlu => 0,
        GateActivation::GeGlu => 1,
    };
    let yp = y.ptr();
    let mut args = crate::launch::Launch::new(b, &f);
    args.arg(norm)
        .arg(&g.ptr)
        .arg(&g.row_stride)
        .arg(&u.ptr)
        .arg(&u.row_stride)
        .arg(&n)
        .arg(&row_bytes)
        .arg(&act32)
        .arg(&yp);
    // SAFETY: qnorm_gated_T(in, wg, sg, wu, su, n, row_bytes, act, y): as
    // qnorm_multi_T's norm; gate and up hold n rows of k values at their
    // strides, aligned for the type's loads; y holds n f32.
    let cfg = config_with(b, &f, &kernel, launch_config(b, q, k, g.rows), extra)?;
    unsafe { args.launch(cfg) }.map_err(|e| b.launch_err(&kernel, e))
}
