//! Launchers for kernels/attention.cu: `Op::Sdpa`, `Op::CachedAttention`
//! and `Op::FlashAttention`, one block per query row with an online
//! softmax over key tiles (any number of keys). Shared memory holds the
//! query row, the output accumulator and two key tiles, so the head dims
//! are limited (`fits`); `supports` declines larger ones.
//! `Op::AttentionAt` is flash decoding: each row's keys split over S
//! blocks, S fixed by the cache's capacity, the position read on the
//! device, the partials merged by a second kernel (`attention_at`).

use super::float_suffix;
use crate::backend::CudaBackend;
use crate::buffer::CudaBuffer;
use cudarc::driver::{DeviceRepr, LaunchConfig};
use rustorch_core::backend::{Buffer, DeviceBuffer, KvWriteAt, TensorRef};
use rustorch_core::op::AttnMask;
use rustorch_core::op::RopeLayout;
use rustorch_core::{BackendError, DType, Layout, Op, TensorMeta};
use std::sync::Arc;

/// Threads per block and keys per tile (`ATT_THREADS`, `ATT_TILE`).
const THREADS: u32 = 128;
const TILE: usize = 64;
/// `Op::AttentionAt`: threads per block (`AT_THREADS`), the largest head
/// dim (`AT_MAX_DIM`), keys per split of the cache's capacity and the most
/// splits (`AT_MAX_SPLITS`).
const AT_THREADS: u32 = 128;
const AT_MAX_DIM: usize = 256;
const AT_KEYS_PER_SPLIT: usize = 64;
const AT_MAX_SPLITS: usize = 64;
/// Rows the one-launch form of `attention_at` keeps counters for (more
/// rows take the two launches).
const AT_COUNTER_ROWS: usize = 1 << 14;

/// The counters of `attention_at_joined_*` (AT_COUNTER_ROWS u32, zero
/// between launches), or `None` inside a recording that would have to make
/// them (they must outlive it; the step run before a recording makes them).
fn attention_counters(b: &CudaBackend) -> Result<Option<u64>, BackendError> {
    if let Some(c) = b.attention_counters.get() {
        return Ok(Some(c.ptr()));
    }
    if b.usage.capturing() {
        return Ok(None);
    }
    let c = b.alloc(DType::I32, AT_COUNTER_ROWS)?;
    c.zero(&b.stream).map_err(|e| b.launch_err("attention counters", e))?;
    Ok(Some(b.attention_counters.get_or_init(|| c).ptr()))
}

/// The register shape of the one-launch decode attention's kernel for
/// value rows of `dv` features (`_pl2`, `_pl4`, `_pl8`: the features a lane
/// owns; the same rule as attention_at_pl's pick for the two-launch form).
fn register_shape(dv: usize) -> usize {
    match dv {
        ..=64 => 2,
        65..=128 => 4,
        _ => 8,
    }
}

/// Shared memory a block may use without opting in to more.
const SHARED_LIMIT: usize = 48 * 1024;

/// An operand of at most 4 dims, right-aligned (leading strides 0); mirrors
/// `struct Str4` in kernels/attention.cu.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Str4 {
    s: [i64; 4],
    off: i64,
}

// SAFETY: plain data with the C layout the kernels declare.
unsafe impl DeviceRepr for Str4 {}

impl Str4 {
    /// `l`'s strides right-aligned into 4 dims, or `None` past 4 dims.
    pub(crate) fn of(l: &Layout) -> Option<Str4> {
        let r = l.rank();
        if r > 4 {
            return None;
        }
        let mut s = [0i64; 4];
        for (d, &st) in l.strides().iter().enumerate() {
            s[4 - r + d] = st as i64;
        }
        Some(Str4 {
            s,
            off: l.offset() as i64,
        })
    }

    /// `l` (dims broadcastable to `target`, 4 dims) read as a tensor of
    /// `target`: missing and size-1 dims repeat with stride 0.
    fn broadcast(l: &Layout, target: &[usize; 4]) -> Option<Str4> {
        let r = l.rank();
        if r > 4 {
            return None;
        }
        let mut s = [0i64; 4];
        for (d, (&n, &st)) in l.dims().iter().zip(l.strides()).enumerate() {
            let t = 4 - r + d;
            s[t] = if n == 1 && target[t] != 1 { 0 } else { st as i64 };
        }
        Some(Str4 {
            s,
            off: l.offset() as i64,
        })
    }
}

/// Dynamic shared memory of a block: the query row (`d`), the accumulator
/// (`dv`) and two tiles, in elements of `elem` bytes.
fn shared_bytes(d: usize, dv: usize, elem: usize) -> usize {
    (d + dv + 2 * TILE) * elem
}

/// Whether head dims `d` and `dv` fit one block's shared memory.
pub(super) fn fits(d: usize, dv: usize, elem: usize) -> bool {
    d.checked_add(dv)
        .and_then(|n| n.checked_add(2 * TILE))
        .and_then(|n| n.checked_mul(elem))
        .is_some_and(|b| b <= SHARED_LIMIT)
}

/// Whether `supports` takes this attention op (dtypes and head dims; the
/// shapes were checked by infer).
pub(super) fn supported(op: &Op, inputs: &[TensorMeta]) -> bool {
    let dims = |i: usize| inputs.get(i).map(|m| m.shape.dims());
    match op {
        Op::Sdpa { .. } => {
            let (Some(q), Some(v)) = (dims(0), dims(2)) else {
                return false;
            };
            let elem = if inputs[0].dtype == DType::F64 { 8 } else { 4 };
            float_suffix(inputs[0].dtype).is_some()
                && q.len() == 4
                && v.len() == 4
                && inputs.get(3).is_none_or(|m| m.shape.rank() <= 4)
                && fits(q[3], v[3], elem)
        }
        Op::CachedAttention { .. } | Op::FlashAttention { .. } => {
            let (Some(q), Some(v)) = (dims(0), dims(2)) else {
                return false;
            };
            let dv = match op {
                Op::CachedAttention { .. } => v.get(1),
                _ => v.get(2),
            };
            inputs[0].dtype == DType::F32 && q.len() == 3 && dv.is_some_and(|&dv| fits(q[2], dv, 4))
        }
        Op::AttentionAt { .. } => {
            let [q, k, v, pos] = inputs else {
                return false;
            };
            let float = |d: DType| matches!(d, DType::F32 | DType::F16 | DType::BF16);
            float(q.dtype)
                && float(k.dtype)
                && v.dtype == k.dtype
                && matches!(pos.dtype, DType::I32 | DType::I64)
                && q.shape.rank() == 3
                && v.shape.rank() == 3
                && at_head_dims(q.shape.dims()[2], v.shape.dims()[2])
        }
        _ => false,
    }
}

/// Head dims the `attention_at_*` kernels take: multiples of 32 up to
/// `AT_MAX_DIM` (each lane of a warp holds every 32nd feature in registers).
fn at_head_dims(d: usize, dv: usize) -> bool {
    let ok = |x: usize| (32..=AT_MAX_DIM).contains(&x) && x.is_multiple_of(32);
    ok(d) && ok(dv)
}

fn config(rows: usize, shared: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (rows as u32, 1, 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: shared as u32,
    }
}

fn check_rows(b: &CudaBackend, name: &str, rows: usize) -> Result<(), BackendError> {
    if rows > i32::MAX as usize {
        return Err(BackendError::unsupported(b.device, name, "more than 2^31 query rows"));
    }
    Ok(())
}

pub(super) fn sdpa(
    b: &CudaBackend,
    mask: AttnMask,
    scale: Option<f64>,
    inputs: &[TensorRef<'_>],
    out: &TensorMeta,
) -> Result<CudaBuffer, BackendError> {
    let name = "sdpa";
    let (q, k, v) = (&inputs[0], &inputs[1], &inputs[2]);
    let ty = float_suffix(q.dtype()).ok_or_else(|| BackendError::unsupported(b.device, name, "float dtypes only"))?;
    let (qd, kd, vd) = (q.layout.dims(), k.layout.dims(), v.layout.dims());
    if qd.len() != 4 || kd.len() != 4 || vd.len() != 4 || kd[1] == 0 || !qd[1].is_multiple_of(kd[1]) {
        return Err(BackendError::invalid(
            name,
            "query heads must be a multiple of key/value heads",
        ));
    }
    let (bsz, hq, tq, d) = (qd[0], qd[1], qd[2], qd[3]);
    let (tk, dv) = (kd[2], vd[3]);
    let group = hq / kd[1];
    let y = b.alloc(out.dtype, out.shape.numel())?;
    let rows = bsz * hq * tq;
    if rows * dv == 0 {
        return Ok(y);
    }
    check_rows(b, name, rows)?;
    let elem = if q.dtype() == DType::F64 { 8 } else { 4 };
    if !fits(d, dv, elem) {
        return Err(BackendError::unsupported(
            b.device,
            name,
            "head dims too large for one block",
        ));
    }
    let deep = || BackendError::unsupported(b.device, name, "q, k and v must be 4-D");
    let (lq, lk, lv) = (
        Str4::of(q.layout).ok_or_else(deep)?,
        Str4::of(k.layout).ok_or_else(deep)?,
        Str4::of(v.layout).ok_or_else(deep)?,
    );
    let (mask_kind, mask_ptr, lm): (i32, u64, Str4) = match (mask, inputs.get(3)) {
        (AttnMask::Explicit, Some(m)) => {
            let lm = Str4::broadcast(m.layout, &[bsz, hq, tq, tk])
                .ok_or_else(|| BackendError::invalid(name, "the mask must broadcast to [B, Hq, Tq, Tk]"))?;
            let kind = if m.dtype() == DType::Bool {
                1
            } else if m.dtype() == q.dtype() {
                2
            } else {
                return Err(BackendError::invalid(name, "mask must be bool or the query's dtype"));
            };
            (kind, b.own(name, m.buffer)?.ptr(), lm)
        }
        (AttnMask::Explicit, None) => return Err(BackendError::invalid(name, "explicit mask input missing")),
        _ => (0, 0, Str4 { s: [0; 4], off: 0 }),
    };
    let causal: i32 = match mask {
        AttnMask::Causal => 1,
        AttnMask::CausalFromEnd => 2,
        AttnMask::None | AttnMask::Explicit => 0,
    };
    let scale = scale.unwrap_or(1.0 / (d as f64).sqrt());
    let kernel = format!("sdpa_{ty}");
    let f = b.function("attention", &kernel)?;
    let (qp, kp, vp, yp) = (
        b.own(name, q.buffer)?.ptr(),
        b.own(name, k.buffer)?.ptr(),
        b.own(name, v.buffer)?.ptr(),
        y.ptr(),
    );
    let (hq64, tq64, tk64, d64, dv64, g64) = (hq as i64, tq as i64, tk as i64, d as i64, dv as i64, group as i64);
    let mut args = crate::launch::Launch::new(b, &f);
    args.arg(&qp)
        .arg(&lq)
        .arg(&kp)
        .arg(&lk)
        .arg(&vp)
        .arg(&lv)
        .arg(&mask_ptr)
        .arg(&lm)
        .arg(&mask_kind)
        .arg(&causal)
        .arg(&yp)
        .arg(&hq64)
        .arg(&tq64)
        .arg(&tk64)
        .arg(&d64)
        .arg(&dv64)
        .arg(&g64)
        .arg(&scale);
    // SAFETY: sdpa_*(q, lq, k, lk, v, lv, mask, lm, mask_kind, causal, y,
    // hq, tq, tk, d, dv, group, scale): every layout is its input's own
    // (checked by the executor; the mask's broadcast to [B, Hq, Tq, Tk]
    // with zero strides, infer checked it broadcasts); key/value head
    // h / group < Hkv; `y` holds rows * dv elements; the shared memory
    // holds d + dv + 2 tiles.
    unsafe { args.launch(config(rows, shared_bytes(d, dv, elem))) }.map_err(|e| b.launch_err(&kernel, e))?;
    Ok(y)
}

/// The CPU's check of a cache operand (`ggml::attention::Rows`): rows must
/// be contiguous, and the CPU rejects other layouts with this message.
fn contiguous_rows(op: &str, t: &TensorRef<'_>, what: &str) -> Result<(), BackendError> {
    let (dims, strides) = (t.layout.dims(), t.layout.strides());
    if dims.len() == 3 && dims[2] > 1 && strides[2] != 1 {
        return Err(BackendError::invalid(
            op,
            format!("{what} needs contiguous rows (its last stride is {})", strides[2]),
        ));
    }
    Ok(())
}

/// `Op::CachedAttention` and `Op::FlashAttention`: q f32 [Hq, T, D], k f16
/// [Hkv, L, D], values f16 ([Hkv, Dv, L] transposed, or [Hkv, L, Dv]), mask
/// f32 [T, L].
pub(super) fn cached(
    b: &CudaBackend,
    op: &Op,
    inputs: &[TensorRef<'_>],
    out: &TensorMeta,
) -> Result<CudaBuffer, BackendError> {
    let (name, flash, scale, tiled_rows) = match op {
        Op::CachedAttention { scale } => ("cached_attention", false, *scale, 0i64),
        Op::FlashAttention { scale, cpu } => ("flash_attention", true, *scale, cpu.tiled_rows as i64),
        _ => return Err(BackendError::invalid(op.name(), "not a cache attention op")),
    };
    let (q, k, v, m) = (&inputs[0], &inputs[1], &inputs[2], &inputs[3]);
    if q.dtype() != DType::F32 || k.dtype() != DType::F16 || v.dtype() != DType::F16 || m.dtype() != DType::F32 {
        return Err(BackendError::invalid(
            name,
            "expects q f32, k f16, values f16, mask f32",
        ));
    }
    let (qd, kd, vd) = (q.layout.dims(), k.layout.dims(), v.layout.dims());
    if qd.len() != 3 || kd.len() != 3 || vd.len() != 3 || m.layout.rank() != 2 {
        return Err(BackendError::invalid(
            name,
            "q, k and the values must be 3-D, the mask 2-D",
        ));
    }
    let (hq, t, d) = (qd[0], qd[1], qd[2]);
    let (hkv, l) = (kd[0], kd[1]);
    let dv = if flash { vd[2] } else { vd[1] };
    if hkv == 0 || !hq.is_multiple_of(hkv) {
        return Err(BackendError::invalid(
            name,
            "query heads must be a multiple of key/value heads",
        ));
    }
    contiguous_rows(name, k, "keys")?;
    contiguous_rows(name, v, if flash { "values" } else { "transposed values" })?;
    let y = b.alloc(DType::F32, out.shape.numel())?;
    let rows = hq * t;
    if rows * dv == 0 {
        return Ok(y);
    }
    check_rows(b, name, rows)?;
    if !fits(d, dv, 4) {
        return Err(BackendError::unsupported(
            b.device,
            name,
            "head dims too large for one block",
        ));
    }
    let deep = || BackendError::invalid(name, "operands of at most 4 dims");
    let (lq, lk, lv, lm) = (
        Str4::of(q.layout).ok_or_else(deep)?,
        Str4::of(k.layout).ok_or_else(deep)?,
        Str4::of(v.layout).ok_or_else(deep)?,
        Str4::of(m.layout).ok_or_else(deep)?,
    );
    if flash && t >= GEMM_MIN_ROWS {
        let dims = GemmDims { hq, hkv, t, l, d, dv };
        if flash_mma(b, dims, scale, [q, k, v, m], [&lq, &lk, &lv, &lm], &y)? {
            return Ok(y);
        }
        if flash_gemm(b, dims, scale, [q, k, v, m], [&lk, &lv, &lm], &y)? {
            return Ok(y);
        }
    }
    let f = b.function("attention", name)?;
    let (qp, kp, vp, mp, yp) = (
        b.own(name, q.buffer)?.ptr(),
        b.own(name, k.buffer)?.ptr(),
        b.own(name, v.buffer)?.ptr(),
        b.own(name, m.buffer)?.ptr(),
        y.ptr(),
    );
    let (t64, l64, d64, dv64, g64) = (t as i64, l as i64, d as i64, dv as i64, (hq / hkv) as i64);
    let mut args = crate::launch::Launch::new(b, &f);
    args.arg(&qp)
        .arg(&lq)
        .arg(&kp)
        .arg(&lk)
        .arg(&vp)
        .arg(&lv)
        .arg(&mp)
        .arg(&lm)
        .arg(&yp)
        .arg(&t64)
        .arg(&l64)
        .arg(&d64)
        .arg(&dv64)
        .arg(&g64)
        .arg(&scale);
    if flash {
        args.arg(&tiled_rows);
    }
    // SAFETY: cached_attention / flash_attention(q, lq, k, lk, values, lv,
    // mask, lm, y, t, l, d, dv, group, scale[, tiled_rows]): each layout is
    // its input's own (right-aligned into 4 dims, checked by the executor;
    // infer checked the shapes agree), key/value head h / group < Hkv, `y`
    // holds Hq * T * Dv elements, the shared memory d + dv + 2 tiles.
    unsafe { args.launch(config(rows, shared_bytes(d, dv, 4))) }.map_err(|e| b.launch_err(name, e))?;
    Ok(y)
}

/// Query rows from which `Op::FlashAttention` multiplies with cuBLAS on
/// the tensor cores (`flash_gemm`) rather than one block per row, which
/// reads the keys and values once per row: a prompt's batch, not a decode
/// step or the conformance suite's small cases.
const GEMM_MIN_ROWS: usize = 64;
/// Scratch for the scores (f32) and probabilities (f16) of `flash_gemm`:
/// key/value heads go in batches that fit it.
const GEMM_SCRATCH_BYTES: usize = 768 << 20;

#[derive(Clone, Copy)]
struct GemmDims {
    hq: usize,
    hkv: usize,
    t: usize,
    l: usize,
    d: usize,
    dv: usize,
}

/// Head dims of `flash_attention_mma_D` (a query row's fragments and its
/// accumulator live in registers: 166 and 168 of them), and the query rows
/// a block takes (`FA_ROWS`, two threads a row).
const MMA_HEAD_DIMS: [usize; 2] = [64, 128];
const MMA_ROWS: usize = 64;

/// `Op::FlashAttention` in one launch of `flash_attention_mma_D`
/// (kernels/attention.cu: tensor cores, online softmax). `Ok(false)` where
/// it does not apply (switched off, before compute capability 8.0, other
/// head dims, key or value rows not contiguous and 16-byte aligned): the
/// cuBLAS path or the per-row kernel runs then.
fn flash_mma(
    b: &CudaBackend,
    g: GemmDims,
    scale: f32,
    [q, k, v, m]: [&TensorRef<'_>; 4],
    [lq, lk, lv, lm]: [&Str4; 4],
    y: &CudaBuffer,
) -> Result<bool, BackendError> {
    let name = "flash_attention";
    let (kp, vp) = (b.own(name, k.buffer)?.ptr(), b.own(name, v.buffer)?.ptr());
    // Key and value rows are read 8 halves at a time.
    let aligned = |base: u64, l: &Str4| {
        base.is_multiple_of(16) && l.s[3] == 1 && [l.off, l.s[1], l.s[2]].iter().all(|x| x % 8 == 0)
    };
    if !b.flash_mma
        || g.d != g.dv
        || !MMA_HEAD_DIMS.contains(&g.d)
        || !aligned(kp, lk)
        || !aligned(vp, lv)
        || g.hq > 65535
        || u32::try_from(g.t.div_ceil(MMA_ROWS)).is_err()
    {
        return Ok(false);
    }
    let kernel = format!("flash_attention_mma_{}", g.d);
    let f = b.function("attention", &kernel)?;
    let (qp, mp, yp) = (b.own(name, q.buffer)?.ptr(), b.own(name, m.buffer)?.ptr(), y.ptr());
    let (t64, l64, g64) = (g.t as i64, g.l as i64, (g.hq / g.hkv) as i64);
    let mut args = crate::launch::Launch::new(b, &f);
    args.arg(&qp)
        .arg(lq)
        .arg(&kp)
        .arg(lk)
        .arg(&vp)
        .arg(lv)
        .arg(&mp)
        .arg(lm)
        .arg(&yp)
        .arg(&t64)
        .arg(&l64)
        .arg(&g64)
        .arg(&scale);
    let cfg = LaunchConfig {
        grid_dim: (g.t.div_ceil(MMA_ROWS) as u32, g.hq as u32, 1),
        block_dim: (2 * MMA_ROWS as u32, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: flash_attention_mma_D(q, lq, k, lk, v, lv, mask, lm, y, t, l,
    // group, scale): each layout is its input's own (checked by the
    // executor; infer checked the shapes agree: q [Hq, T, D], k and v
    // [Hkv, L, D], mask [T, L]); key and value rows contiguous from
    // 16-byte aligned addresses (checked above); key/value head
    // h / group < Hkv; y holds Hq * T * D f32, contiguous.
    unsafe { args.launch(cfg) }.map_err(|e| b.launch_err(&kernel, e))?;
    Ok(true)
}

/// `Op::FlashAttention` as S = Q K^T (cuBLAS, f16 operands, f32
/// accumulation), P = softmax(S * scale + mask) rounded to f16
/// (`att_softmax_rows`), O = P V (cuBLAS), per key/value head with the
/// query heads that share it as one matrix of group * T rows. `Ok(false)`
/// where the operands do not suit it (the per-row kernel then runs): rows
/// of the cache not contiguous, or one head's scores past the scratch.
fn flash_gemm(
    b: &CudaBackend,
    g: GemmDims,
    scale: f32,
    [q, k, v, m]: [&TensorRef<'_>; 4],
    [lk, lv, lm]: [&Str4; 3],
    y: &CudaBuffer,
) -> Result<bool, BackendError> {
    use super::matmul::{gemm_f32_acc, GemmOperand};
    use cudarc::cublas::sys::{cublasOperation_t, cudaDataType};
    let name = "flash_attention";
    let group = g.hq / g.hkv;
    let rows = group * g.t; // per key/value head
    let per_head = rows * g.l * (4 + 2);
    let fits_i32 = |x: usize| i32::try_from(x).is_ok();
    if lk.s[3] != 1
        || lv.s[3] != 1
        || (lk.s[2] as usize) < g.d
        || (lv.s[2] as usize) < g.dv
        || per_head > GEMM_SCRATCH_BYTES
        || ![rows, g.l, g.d, g.dv, lk.s[2] as usize, lv.s[2] as usize]
            .into_iter()
            .all(fits_i32)
    {
        return Ok(false);
    }
    let heads_per_batch = (GEMM_SCRATCH_BYTES / per_head).clamp(1, g.hkv);
    // Q in f16, [Hq, T, D] contiguous (the cast op's kernel).
    let q16 = super::elementwise::run(
        b,
        &Op::Cast { to: DType::F16 },
        std::slice::from_ref(q),
        &TensorMeta::new(q.layout.shape().clone(), DType::F16),
    )?;
    let q16p = q16.ptr();
    let t64 = g.t as i64;
    let scores = b.alloc(DType::F32, heads_per_batch * rows * g.l)?;
    let probs = b.alloc(DType::F16, heads_per_batch * rows * g.l)?;
    let (kp, vp, mp) = (
        b.own(name, k.buffer)?.ptr() + (lk.off * 2) as u64,
        b.own(name, v.buffer)?.ptr() + (lv.off * 2) as u64,
        b.own(name, m.buffer)?.ptr(),
    );
    let softmax = b.function("attention", "att_softmax_rows")?;
    let mut h0 = 0;
    while h0 < g.hkv {
        let nh = heads_per_batch.min(g.hkv - h0);
        let (kh, vh) = (
            kp + (h0 as i64 * lk.s[1] * 2) as u64,
            vp + (h0 as i64 * lv.s[1] * 2) as u64,
        );
        let qh = q16p + (h0 * rows * g.d * 2) as u64;
        let yh = y.ptr() + (h0 * rows * g.dv * 4) as u64;
        // S[rows, L] = Q'[rows, D] K[L, D]^T: column-major S^T (L x rows,
        // ld L) = K^T (op T of K as D x L, ld = its row stride) Q'^T.
        // SAFETY: per head of this batch, K holds L rows of D f16 at its
        // row stride (>= D) from kh + h * its head stride, Q' rows x D
        // contiguous f16 from qh + h * rows * D, S rows x L f32.
        unsafe {
            gemm_f32_acc(
                b,
                "flash_attention (scores)",
                (cublasOperation_t::CUBLAS_OP_T, cublasOperation_t::CUBLAS_OP_N),
                (g.l as i32, rows as i32, g.d as i32),
                GemmOperand {
                    ptr: kh,
                    ld: lk.s[2] as i32,
                    batch_stride: lk.s[1],
                    dtype: cudaDataType::CUDA_R_16F,
                },
                GemmOperand {
                    ptr: qh,
                    ld: g.d as i32,
                    batch_stride: (rows * g.d) as i64,
                    dtype: cudaDataType::CUDA_R_16F,
                },
                GemmOperand {
                    ptr: scores.ptr(),
                    ld: g.l as i32,
                    batch_stride: (rows * g.l) as i64,
                    dtype: cudaDataType::CUDA_R_32F,
                },
                nh as i32,
            )
        }?;
        let (sp, pp, l64) = (scores.ptr(), probs.ptr(), g.l as i64);
        let mut args = crate::launch::Launch::new(b, &softmax);
        args.arg(&sp).arg(&l64).arg(&t64).arg(&mp).arg(lm).arg(&scale).arg(&pp);
        let cfg = LaunchConfig {
            grid_dim: ((nh * rows) as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: att_softmax_rows(s, l, t, mask, lm, scale, p): nh * rows
        // rows of L f32 scores in, as many f16 out; row r's mask row is
        // r % T of the [T, L] mask through its own layout.
        unsafe { args.launch(cfg) }.map_err(|e| b.launch_err("att_softmax_rows", e))?;
        // O[rows, Dv] = P[rows, L] V[L, Dv]: column-major O^T (Dv x rows,
        // ld Dv) = V^T (Dv x L: V's rows, ld = its row stride) P^T (L x
        // rows, ld L).
        // SAFETY: V holds L rows of Dv f16 at its row stride (>= Dv) per
        // head, P rows x L f16, O rows x Dv f32 inside y ([Hq, T, Dv] is
        // [Hkv, rows, Dv]).
        unsafe {
            gemm_f32_acc(
                b,
                "flash_attention (values)",
                (cublasOperation_t::CUBLAS_OP_N, cublasOperation_t::CUBLAS_OP_N),
                (g.dv as i32, rows as i32, g.l as i32),
                GemmOperand {
                    ptr: vh,
                    ld: lv.s[2] as i32,
                    batch_stride: lv.s[1],
                    dtype: cudaDataType::CUDA_R_16F,
                },
                GemmOperand {
                    ptr: pp,
                    ld: g.l as i32,
                    batch_stride: (rows * g.l) as i64,
                    dtype: cudaDataType::CUDA_R_16F,
                },
                GemmOperand {
                    ptr: yh,
                    ld: g.dv as i32,
                    batch_stride: (rows * g.dv) as i64,
                    dtype: cudaDataType::CUDA_R_32F,
                },
                nh as i32,
            )
        }?;
        h0 += nh;
    }
    // Scratch freed in stream order, after the GEMMs that read it.
    drop((q16, scores, probs));
    Ok(true)
}

/// How many blocks share a row's keys for a cache of `capacity`
/// positions when each takes at least `min_share` keys (the kernels'
/// argument): one per max(64, min_share) positions, at most 64. A block
/// takes max(ceil(seen / S), min_share) of the `seen` keys, which is
/// min_share for every S >= ceil(capacity / min_share): more splits than
/// that only add blocks that never get a key (at 194 registers two blocks
/// an SM, so they came in rounds after the working ones: 1024 blocks of
/// which 32 worked in a decode step of a 2048-position cache), and fewer
/// than that are never needed. The same keys go to the same blocks either
/// way (the same bits). It depends on the capacity only, never on the
/// position, so the launch is the same for every step (a CUDA graph
/// replays it).
pub(super) fn at_splits(capacity: usize, min_share: usize) -> usize {
    capacity
        .div_ceil(AT_KEYS_PER_SPLIT.max(min_share))
        .clamp(1, AT_MAX_SPLITS)
}

/// Whether the decode attention reads a cache's rows (layout `l` over
/// the buffer at `p`) as vectors of 8 elements: contiguous features, and
/// every row starting on a multiple of 8 elements (32 bytes at most) from
/// an address aligned to that.
fn rows_in_eighths(l: &Str4, p: u64) -> bool {
    l.s[3] == 1 && [l.off, l.s[1], l.s[2]].iter().all(|x| x % 8 == 0) && p.is_multiple_of(32)
}

/// `Op::AttentionAt`: q [H, T, D] (f32, f16 or bf16), k [Hkv, N, D] and v
/// [Hkv, N, Dv] (f32, f16 or bf16), pos one i32 or i64 element. One launch
/// (`attention_at_joined_<KV>_pl*`: the last block of each row merges the row's
/// partials) or, past the counters, two (`attention_at_<KV>`
/// writes partial softmax states to scratch from `alloc`,
/// `attention_at_combine` merges them), and the error flag's read-back,
/// nothing else on the host.
pub(super) fn attention_at(
    b: &CudaBackend,
    scale: f32,
    window: Option<usize>,
    inputs: &[TensorRef<'_>],
    out: &TensorMeta,
) -> Result<CudaBuffer, BackendError> {
    let name = "attention_at";
    let [q, k, v, pos] = inputs else {
        return Err(BackendError::invalid(name, "expects q, k, v and pos"));
    };
    let suffix = |d: DType| match d {
        DType::F32 | DType::F16 | DType::BF16 => float_suffix(d),
        _ => None,
    };
    let (Some(_), Some(kty)) = (suffix(q.dtype()), suffix(k.dtype())) else {
        return Err(BackendError::invalid(name, "q, k and v must be f32, f16 or bf16"));
    };
    let pos64: i32 = match pos.dtype() {
        DType::I64 => 1,
        DType::I32 => 0,
        _ => return Err(BackendError::invalid(name, "pos must be i32 or i64")),
    };
    let (qd, kd, vd) = (q.layout.dims(), k.layout.dims(), v.layout.dims());
    if v.dtype() != k.dtype() || qd.len() != 3 || kd.len() != 3 || vd.len() != 3 || pos.layout.shape().numel() != 1 {
        return Err(BackendError::invalid(
            name,
            "expects q, k, v of rank 3 (k and v of one dtype) and one position",
        ));
    }
    let (h, t, d) = (qd[0], qd[1], qd[2]);
    let (hkv, n, dv) = (kd[0], kd[1], vd[2]);
    if hkv == 0 || !h.is_multiple_of(hkv) || vd[0] != hkv || vd[1] != n || kd[2] != d {
        return Err(BackendError::invalid(
            name,
            "expects q [H, T, D], k [Hkv, N, D], v [Hkv, N, Dv] with H a multiple of Hkv",
        ));
    }
    if window == Some(0) {
        return Err(BackendError::invalid(name, "a window must hold at least one position"));
    }
    if i32::try_from(n).is_err() {
        // The kernels index positions in 32 bits.
        return Err(BackendError::unsupported(
            b.device,
            name,
            "caches of more than 2^31 - 1 positions",
        ));
    }
    let y = b.alloc(DType::F32, out.shape.numel())?;
    let rows = h * t;
    if rows * dv == 0 {
        // As on the CPU: nothing to compute, the position is not read.
        return Ok(y);
    }
    check_rows(b, name, rows)?;
    if !at_head_dims(d, dv) {
        return Err(BackendError::unsupported(
            b.device,
            name,
            "head dims must be multiples of 32 up to 256",
        ));
    }
    let deep = || BackendError::invalid(name, "operands of at most 4 dims");
    let (lq, lk, lv) = (
        Str4::of(q.layout).ok_or_else(deep)?,
        Str4::of(k.layout).ok_or_else(deep)?,
        Str4::of(v.layout).ok_or_else(deep)?,
    );
    // One launch where the counters are there: the last block of each row
    // merges it.
    let counters = if rows <= AT_COUNTER_ROWS {
        attention_counters(b)?
    } else {
        None
    };
    // The two-launch form's blocks take at least AT_KEYS_PER_SPLIT keys.
    let min_share = match counters {
        Some(_) => b.attention_min_share as i64,
        None => AT_KEYS_PER_SPLIT as i64,
    };
    let splits = at_splits(n, min_share as usize);
    // m and l per (row, split), then the accumulators [rows, S, Dv].
    let part = b.alloc(DType::F32, rows * splits * (dv + 2))?;
    let bad = super::ErrorFlag::new(b)?;
    let kernel = match counters {
        Some(_) => format!("attention_at_joined_{kty}_pl{}", register_shape(dv)),
        None => format!("attention_at_{kty}"),
    };
    let f = b.function("attention", &kernel)?;
    let (qp, kp, vp, pp, partp, yp, badp) = (
        b.own(name, q.buffer)?.ptr(),
        b.own(name, k.buffer)?.ptr(),
        b.own(name, v.buffer)?.ptr(),
        b.own(name, pos.buffer)?.ptr(),
        part.ptr(),
        y.ptr(),
        bad.ptr(),
    );
    let qtype: i32 = match q.dtype() {
        DType::F32 => 0,
        DType::F16 => 1,
        _ => 2,
    };
    let vec = i32::from(rows_in_eighths(&lk, kp) && rows_in_eighths(&lv, vp));
    let pos_off = pos.layout.offset() as i64;
    let (t64, n64, d64, dv64) = (t as i64, n as i64, d as i64, dv as i64);
    let g64 = (h / hkv) as i64;
    let window64 = window.map_or(0, |w| i64::try_from(w).unwrap_or(i64::MAX));
    let prefetch = i32::from(b.attention_prefetch);
    let mut args = crate::launch::Launch::new(b, &f);
    args.arg(&qp)
        .arg(&qtype)
        .arg(&lq)
        .arg(&kp)
        .arg(&lk)
        .arg(&vp)
        .arg(&lv)
        .arg(&pp)
        .arg(&pos_off)
        .arg(&pos64)
        .arg(&partp)
        .arg(&t64)
        .arg(&n64)
        .arg(&d64)
        .arg(&dv64)
        .arg(&g64)
        .arg(&window64)
        .arg(&scale)
        .arg(&badp)
        .arg(&min_share)
        .arg(&vec)
        .arg(&prefetch);
    let counters_p = counters.unwrap_or(0);
    if counters.is_some() {
        args.arg(&yp).arg(&counters_p);
    }
    let cfg = LaunchConfig {
        grid_dim: (rows as u32, splits as u32, 1),
        block_dim: (AT_THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: attention_at_<KV>(q, qtype, lq, k, lk, v, lv, pos, pos_off,
    // pos64, part, t, n, d, dv, group, window, scale, bad, min_share, vec,
    // prefetch [, y, counters]): each layout is its input's own (checked by
    // the executor), qtype names q's dtype, pos_off addresses pos's one
    // element of the type pos64 names; a block reads keys and values only
    // at positions below pos + T <= N, after checking that bound on the
    // device; key/value head h / group < Hkv; d and dv are multiples of 32
    // up to AT_MAX_DIM (the shared arrays); `part` holds rows * S * (dv + 2)
    // floats for the grid's rows x S blocks, `bad` one i32; vec only where
    // the rows are contiguous and aligned to 8 elements (the vector loads);
    // the joined form's y holds rows * dv floats and its counters
    // rows <= AT_COUNTER_ROWS u32, zero (each row's last block zeroes its
    // own again; launches on the one stream never overlap on them);
    // min_share >= 1.
    unsafe { args.launch(cfg) }.map_err(|e| b.launch_err(&kernel, e))?;
    if counters.is_some() {
        return finish_attention_at(b, &bad, name, t, n, y);
    }
    let combine = "attention_at_combine";
    let f = b.function("attention", combine)?;
    let s64 = splits as i64;
    let mut args = crate::launch::Launch::new(b, &f);
    args.arg(&partp).arg(&yp).arg(&s64).arg(&dv64);
    let cfg = LaunchConfig {
        grid_dim: (rows as u32, 1, 1),
        block_dim: (AT_THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: attention_at_combine(part, y, splits, dv): `part` as written
    // above for gridDim.x = rows (every block wrote its m and l; an
    // accumulator is read only where m is not -inf, i.e. was written);
    // splits <= AT_MAX_SPLITS (its shared weights); `y` holds rows * dv
    // floats.
    unsafe { args.launch(cfg) }.map_err(|e| b.launch_err(combine, e))?;
    finish_attention_at(b, &bad, name, t, n, y)
}

/// `Backend::rope_attention_at` in one launch (`attention_rope_at_joined_F16_pl*`,
/// unless `RUSTORCH_CUDA_ROPE_ATTENTION=0`): one query row a head (q
/// `[H, 1, D]`), raw keys `[Hkv, 1, D]` and values `[Hkv, 1, Dv]`, f32 and
/// contiguous, f16 caches whose write regions are their rows at the
/// position (`[Hkv, 1, D]` of `[Hkv, N, D]`), f32 contiguous tables with a
/// row for every cache position, and the counters of the one-launch
/// attention; anything else is unsupported (the caller then runs the ops).
/// The values are rope_kv_at_F32_F16's and attention_at_joined_F16's.
#[allow(clippy::too_many_arguments)]
pub(crate) fn rope_attention_at(
    b: &CudaBackend,
    (kc, vc): (&mut dyn DeviceBuffer, &mut dyn DeviceBuffer),
    at: &KvWriteAt<'_>,
    [lk_all, lv_all]: [&Layout; 2],
    layout: RopeLayout,
    [q, k, v]: [TensorRef<'_>; 3],
    [cos, sin]: [TensorRef<'_>; 2],
    (scale, window): (f32, Option<usize>),
) -> Result<Buffer, BackendError> {
    const OP: &str = "rope_attention_at";
    let unsupported = |why: &str| Err(BackendError::unsupported(b.device, OP, why.to_string()));
    if !b.rope_attention {
        return unsupported("off (RUSTORCH_CUDA_ROPE_ATTENTION=0)");
    }
    if !super::rope::f32_inputs_f16_caches(&[&q, &k, &v, &cos, &sin], &*kc, &*vc) {
        return unsupported("contiguous f32 inputs and f16 caches only");
    }
    let (qd, kd, vd) = (q.layout.dims(), k.layout.dims(), v.layout.dims());
    let (cd, kcd, vcd) = (cos.layout.dims(), lk_all.dims(), lv_all.dims());
    if qd.len() != 3 || kd.len() != 3 || vd.len() != 3 || kcd.len() != 3 || vcd.len() != 3 || cd.len() != 2 {
        return unsupported("q, k, v and the caches of rank 3, tables of rank 2");
    }
    let (h, d, hkv, n, dv, half) = (qd[0], qd[2], kcd[0], kcd[1], vcd[2], cd[1]);
    if qd[1] != 1
        || kd != [hkv, 1, d]
        || vd != [hkv, 1, dv]
        || vcd[..2] != [hkv, n]
        || kcd[2] != d
        || hkv == 0
        || !h.is_multiple_of(hkv)
        || sin.layout.dims() != cd
        || cd[0] < n
        || 2 * half > d
        || !at_head_dims(d, dv)
        || window == Some(0)
        || h > AT_COUNTER_ROWS
        || i32::try_from(n).is_err()
    {
        return unsupported("one query row a head over f16 caches, tables with a row for every position");
    }
    // The kernel writes each head's row at the position through the
    // caches' own layouts: the write regions must be exactly those rows.
    let (lk, lv) = match (Str4::of(lk_all), Str4::of(lv_all)) {
        (Some(lk), Some(lv)) => (lk, lv),
        _ => return unsupported("caches of at most 4 dims"),
    };
    let row_of = |region: &Layout, all: &Layout, step: usize| {
        region.offset() == all.offset() && region.strides() == all.strides() && step == all.strides()[1]
    };
    if !row_of(at.k_region, lk_all, at.k_step) || !row_of(at.v_region, lv_all, at.v_step) || at.max_pos + 1 != n {
        return unsupported("write regions other than the caches' rows at the position");
    }
    for (dst, region, step) in [(&*kc, at.k_region, at.k_step), (&*vc, at.v_region, at.v_step)] {
        rustorch_core::backend::check_write_at(dst.len(), region, step, at.max_pos, at.pos)
            .map_err(|m| BackendError::invalid(OP, m))?;
    }
    let pos64: i32 = match at.pos.dtype() {
        DType::I64 => 1,
        _ => 0,
    };
    let Some(counters) = attention_counters(b)? else {
        return unsupported("no counters for the one-launch attention");
    };
    crate::buffer::forget_row_acts(kc);
    crate::buffer::forget_row_acts(vc);
    let (kp, vp) = (super::rope::cache_ptr(b, OP, kc)?, super::rope::cache_ptr(b, OP, vc)?);
    let ptr = |t: &TensorRef<'_>| -> Result<u64, BackendError> {
        Ok(b.own(OP, t.buffer)?.ptr() + (t.layout.offset() * t.dtype().size_in_bytes()) as u64)
    };
    let (qp, knp, vnp, cp, sp) = (ptr(&q)?, ptr(&k)?, ptr(&v)?, ptr(&cos)?, ptr(&sin)?);
    let pp = b.own(OP, at.pos.buffer)?.ptr();
    let pos_off = at.pos.layout.offset() as i64;
    // q as the attention reads it: [H, 1, D] from its start (the pointer
    // already holds the offset).
    let lq = Str4 {
        s: [0, d as i64, d as i64, 1],
        off: 0,
    };
    let y = b.alloc(DType::F32, h * dv)?;
    let min_share = b.attention_min_share as i64;
    let splits = at_splits(n, min_share as usize);
    let part = b.alloc(DType::F32, h * splits * (dv + 2))?;
    let bad = super::ErrorFlag::new(b)?;
    let vec = i32::from(rows_in_eighths(&lk, kp) && rows_in_eighths(&lv, vp));
    let (n64, d64, dv64, half64) = (n as i64, d as i64, dv as i64, half as i64);
    let g64 = (h / hkv) as i64;
    let window64 = window.map_or(0, |w| i64::try_from(w).unwrap_or(i64::MAX));
    // Bit 1: the in-loop prefetch; bit 2: the early one (at_prefetch_early).
    let prefetch = i32::from(b.attention_prefetch) | (i32::from(b.attention_prefetch_early) << 1);
    let interleaved = matches!(layout, RopeLayout::Interleaved) as i32;
    let kernel = format!("attention_rope_at_joined_F16_pl{}", register_shape(dv));
    let f = b.function("attention", &kernel)?;
    let (partp, yp, badp) = (part.ptr(), y.ptr(), bad.ptr());
    let mut args = crate::launch::Launch::new(b, &f);
    args.arg(&qp)
        .arg(&lq)
        .arg(&kp)
        .arg(&lk)
        .arg(&vp)
        .arg(&lv)
        .arg(&pp)
        .arg(&pos_off)
        .arg(&pos64)
        .arg(&partp)
        .arg(&n64)
        .arg(&d64)
        .arg(&dv64)
        .arg(&g64)
        .arg(&window64)
        .arg(&scale)
        .arg(&badp)
        .arg(&min_share)
        .arg(&vec)
        .arg(&prefetch)
        .arg(&yp)
        .arg(&counters)
        .arg(&knp)
        .arg(&vnp)
        .arg(&cp)
        .arg(&sp)
        .arg(&half64)
        .arg(&interleaved);
    let cfg = LaunchConfig {
        grid_dim: (h as u32, splits as u32, 1),
        block_dim: (AT_THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: attention_rope_at_joined_F16_pl*(q, lq, k, lk, v, lv, pos, pos_off,
    // pos64, part, n, d, dv, group, window, scale, bad, min_share, vec,
    // prefetch, y, counters, k_new, v_new, cs, sn, half, interleaved): q
    // holds H rows of d f32 (lq), the caches' layouts are their own (Hkv x
    // N rows of d and dv f16), a block writes and reads cache rows only at
    // positions below pos + 1 <= N after checking that bound on the device
    // (the rows at pos are inside the caches: check_write_at above);
    // k_new / v_new hold Hkv rows of d / dv f32, the tables at least N rows
    // of `half` f32 with 2 half <= d; d and dv are multiples of 32 up to
    // AT_MAX_DIM; part holds H * S * (dv + 2) floats, y H * dv, bad one i32,
    // the counters H <= AT_COUNTER_ROWS zeroed u32 (as attention_at's
    // joined form); vec only where the cache rows are contiguous and
    // aligned to 8 elements; min_share >= 1.
    unsafe { args.launch(cfg) }.map_err(|e| b.launch_err(&kernel, e))?;
    Ok(Arc::new(finish_attention_at(b, &bad, OP, 1, n, y)?))
}

/// `attention_at`'s output, or the error its kernels flagged.
fn finish_attention_at(
    b: &CudaBackend,
    bad: &super::ErrorFlag,
    name: &str,
    t: usize,
    n: usize,
    y: CudaBuffer,
) -> Result<CudaBuffer, BackendError> {
    if bad.is_set(b)? {
        return Err(BackendError::invalid(
            name,
            format!("the position with {t} query rows does not fit a cache of {n} positions (pos < 0 or pos + T > N)"),
        ));
    }
    Ok(y)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustorch_core::Shape;

    #[test]
    fn operands_right_align_and_broadcast() {
        let l = Layout::contiguous(Shape::from([3, 5])).transpose("t", 0, 1).unwrap();
        assert_eq!(Str4::of(&l).unwrap().s, [0, 0, 1, 5]);
        // A [Tq, Tk] mask broadcast over batch and heads; a [1, 1, Tq, 1]
        // one over keys too.
        let m = Layout::contiguous(Shape::from([3, 5]));
        assert_eq!(Str4::broadcast(&m, &[2, 4, 3, 5]).unwrap().s, [0, 0, 5, 1]);
        let m = Layout::contiguous(Shape::from([1, 1, 3, 1]));
        assert_eq!(Str4::broadcast(&m, &[2, 4, 3, 5]).unwrap().s, [0, 0, 1, 0]);
        let m = Layout::contiguous_with_offset(Shape::from([2, 1, 3, 5]), 7);
        let s = Str4::broadcast(&m, &[2, 4, 3, 5]).unwrap();
        assert_eq!((s.s, s.off), ([15, 0, 5, 1], 7));
    }

    #[test]
    fn attention_at_splits_follow_the_capacity() {
        assert_eq!(at_splits(1, 64), 1);
        assert_eq!(at_splits(64, 64), 1);
        assert_eq!(at_splits(65, 64), 2);
        assert_eq!(at_splits(768, 64), 12);
        assert_eq!(at_splits(768, 256), 3);
        assert_eq!(at_splits(768, 1), 12);
        assert_eq!(at_splits(1 << 20, 256), AT_MAX_SPLITS);
        assert!(at_head_dims(64, 64) && at_head_dims(256, 128) && at_head_dims(32, 256));
        assert!(!at_head_dims(48, 64) && !at_head_dims(64, 288) && !at_head_dims(0, 64));
        let src = crate::KERNEL_SOURCES
            .iter()
            .find(|(n, _)| *n == "attention")
            .map(|(_, s)| *s)
            .unwrap();
        for (name, v) in [
            ("AT_KEYS_PER_SPLIT", AT_KEYS_PER_SPLIT),
            ("AT_MAX_SPLITS", AT_MAX_SPLITS),
        ] {
            assert!(src.contains(&format!("#define {name} {v}\n")), "{name}");
        }
        assert!(src.contains(&format!("#define FA_ROWS {MMA_ROWS}\n")));
        for d in MMA_HEAD_DIMS {
            assert!(src.contains(&format!("FLASH_MMA({d}, ")), "flash_attention_mma_{d}");
        }
    }

    #[test]
    fn head_dims_fit_shared_memory() {
        assert!(fits(128, 128, 4));
        assert!(fits(576, 512, 4));
        assert!(fits(128, 128, 8));
        assert!(!fits(8192, 8192, 4));
        assert!(!fits(usize::MAX, 1, 4));
    }

    /// The keys of each block as attention_at_block splits them (`lo..hi`
    /// of block `y` of `splits`), for a row that sees `seen` keys from 0.
    fn shares(seen: usize, splits: usize, min_share: usize) -> Vec<(usize, usize)> {
        let share = seen.div_ceil(splits).max(min_share);
        (0..splits)
            .map(|y| {
                let lo = y * share;
                (lo, (lo + share).min(seen))
            })
            .filter(|(lo, hi)| lo < hi)
            .collect()
    }

    #[test]
    fn fewer_splits_give_every_key_to_the_same_block() {
        for min_share in [64, 128, 256, 512] {
            for capacity in [1usize, 63, 64, 65, 640, 768, 2048, 4096, 8192, 1 << 15, 1 << 20] {
                let (old, new) = (
                    capacity.div_ceil(AT_KEYS_PER_SPLIT).clamp(1, AT_MAX_SPLITS),
                    at_splits(capacity, min_share),
                );
                assert!(new <= old);
                for seen in [1, 2, 63, 64, 65, 255, 256, 257, 639, 640, capacity / 2 + 1, capacity] {
                    if seen == 0 || seen > capacity {
                        continue;
                    }
                    assert_eq!(
                        shares(seen, new, min_share),
                        shares(seen, old, min_share),
                        "{capacity} {seen} {min_share}"
                    );
                }
            }
        }
    }
}
