//! The key/value cache: preallocated per layer, filled in place.

use super::config::ModelConfig;
use crate::error::{LlmError, Result};
use rustorch::{DType, Device, Executor, RopeLayout, Tensor};
use std::sync::Arc;

/// Keys and values of every layer for up to `n_ctx` positions, stored as
/// f16 like llama.cpp's default cache (`type_k = type_v = f16`), so that
/// attention sees the same rounded values. The cache also decides how
/// attention runs: with flash attention (`KvCache::new_flash`, llama.cpp's
/// default) values are stored as rows, as llama.cpp stores them then;
/// without it (`KvCache::new`) transposed, as llama.cpp stores them then,
/// so that each attention reads them in its own order.
///
/// Storage is allocated for `n_ctx` rounded up to 256 positions (llama.cpp
/// pads its context the same way), and attention reads the used positions
/// rounded up to 64 (`attn_len`): the padding positions are masked and add
/// exact zeros, so the sums keep llama.cpp's vector structure.
pub struct KvCache {
    /// Per layer: keys `[n_head_kv, n_alloc, head_dim_k]`.
    pub(crate) k: Vec<Tensor>,
    /// Per layer: values, transposed (`[n_head_kv, head_dim_v, n_alloc]`),
    /// or as rows with flash attention (`[n_head_kv, n_alloc, head_dim_v]`).
    pub(crate) vt: Vec<Tensor>,
    flash: bool,
    n_ctx: usize,
    n_alloc: usize,
    len: usize,
    /// Tells caches apart (a recorded decode step belongs to one).
    id: u64,
}

/// The next cache's `id`.
static NEXT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

/// llama.cpp's context padding (llama-context.cpp: `GGML_PAD(n_ctx, 256)`).
const ALLOC_PAD: usize = 256;
/// Attention length granularity: a multiple of GGML's 64-element f16 dot
/// step and 16-lane softmax blocks, so no sum has a scalar tail.
const ATTN_PAD: usize = 64;

pub const CACHE_DTYPE: DType = DType::F16;

/// llama.cpp's default micro-batch (`n_ubatch`): its prompt batches are cut
/// into runs of this many positions, and flash attention's path depends on
/// each run's size (see `forward`).
pub(crate) const LLAMA_UBATCH: usize = 512;

impl KvCache {
    /// A cache for attention without flash attention (llama.cpp's
    /// `-fa off`).
    pub fn new(cfg: &ModelConfig, exec: &Arc<Executor>, n_ctx: usize) -> Result<KvCache> {
        Self::with_attention(cfg, exec, &vec![Device::Cpu; cfg.n_layer], n_ctx, false)
    }

    /// A cache for flash attention (llama.cpp's default on the CPU: `-fa
    /// auto` or `on`).
    pub fn new_flash(cfg: &ModelConfig, exec: &Arc<Executor>, n_ctx: usize) -> Result<KvCache> {
        Self::with_attention(cfg, exec, &vec![Device::Cpu; cfg.n_layer], n_ctx, true)
    }

    /// A cache whose layer `il` lives on `devices[il]` (with its layer's
    /// weights: `Placement`), made there.
    pub fn on_devices(
        cfg: &ModelConfig,
        exec: &Arc<Executor>,
        devices: &[Device],
        n_ctx: usize,
        flash: bool,
    ) -> Result<KvCache> {
        Self::with_attention(cfg, exec, devices, n_ctx, flash)
    }

    fn with_attention(
        cfg: &ModelConfig,
        exec: &Arc<Executor>,
        devices: &[Device],
        n_ctx: usize,
        flash: bool,
    ) -> Result<KvCache> {
        if n_ctx == 0 {
            return Err(LlmError::InvalidArgument("the context size must be at least 1".into()));
        }
        if devices.len() != cfg.n_layer {
            return Err(LlmError::InvalidArgument(format!(
                "a cache for {} layers was asked for {} devices",
                cfg.n_layer,
                devices.len()
            )));
        }
        let n_alloc = n_ctx.div_ceil(ALLOC_PAD) * ALLOC_PAD;
        let mut k = Vec::with_capacity(cfg.n_layer);
        let mut vt = Vec::with_capacity(cfg.n_layer);
        for &device in devices {
            k.push(Tensor::zeros_in(
                exec,
                [cfg.n_head_kv, n_alloc, cfg.head_dim_k],
                CACHE_DTYPE,
                device,
            )?);
            let v_shape = if flash {
                [cfg.n_head_kv, n_alloc, cfg.head_dim_v]
            } else {
                [cfg.n_head_kv, cfg.head_dim_v, n_alloc]
            };
            vt.push(Tensor::zeros_in(exec, v_shape, CACHE_DTYPE, device)?);
        }
        Ok(KvCache {
            k,
            vt,
            flash,
            n_ctx,
            n_alloc,
            len: 0,
            id: NEXT_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
        })
    }

    /// The device holding layer `il`'s keys and values.
    pub fn layer_device(&self, il: usize) -> Option<Device> {
        self.k.get(il).map(|t| t.device())
    }

    /// Whether attention over this cache is flash attention.
    pub fn flash(&self) -> bool {
        self.flash
    }

    /// The cache length llama.cpp's attention reads when `used` positions
    /// are filled (`llama_kv_cache::get_n_kv`: `used` padded to 256, at
    /// least 256, within the cache's size). Sliding-window layers read the
    /// same length: llama.cpp's default context parameters keep a
    /// full-size cache for them too (`swa_full`, "using full-size SWA
    /// cache"), whose cells hold positions in order as this cache does.
    /// (A cache of the window plus a micro-batch, llama-cli's default,
    /// reuses cells past that size in another order, which is not
    /// reproduced; capping the length there dropped the newest keys.)
    pub(crate) fn llama_n_kv(&self, used: usize) -> usize {
        (used.div_ceil(ALLOC_PAD) * ALLOC_PAD).max(ALLOC_PAD).min(self.n_alloc)
    }

    /// Positions filled so far (the next token's position).
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn n_ctx(&self) -> usize {
        self.n_ctx
    }

    /// Forgets every position (the memory stays allocated).
    pub fn clear(&mut self) {
        self.len = 0;
    }

    /// Drops positions from `len` on, keeping the first `len`.
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }

    /// Errors unless `n` more positions fit.
    pub(crate) fn check_room(&self, n: usize) -> Result<()> {
        if self.len + n > self.n_ctx {
            return Err(LlmError::ContextFull {
                n_ctx: self.n_ctx,
                used: self.len,
                requested: n,
            });
        }
        Ok(())
    }

    /// Stores layer `il`'s new keys and values (`[n_head_kv, T, d]`, any
    /// float dtype) at the current position.
    pub(crate) fn write(&mut self, il: usize, k: &Tensor, v: &Tensor) -> Result<()> {
        let pos = self.len;
        // The writes convert to the cache's f16 on the way, as `to_dtype`
        // would (one op each instead of a cast and a write).
        self.k[il].write_slice(1, pos, k)?;
        if self.flash {
            self.vt[il].write_slice(1, pos, v)?;
        } else {
            self.vt[il].write_slice(2, pos, &v.transpose(1, 2)?)?;
        }
        Ok(())
    }

    /// How many positions attention reads when `used` are filled: `used`
    /// rounded up to 64, within the allocation.
    pub(crate) fn attn_len(&self, used: usize) -> usize {
        (used.div_ceil(ATTN_PAD) * ATTN_PAD).min(self.n_alloc)
    }

    /// Layer `il`'s keys `[n_head_kv, L, head_dim_k]` and values (transposed,
    /// `[n_head_kv, head_dim_v, L]`, or as rows `[n_head_kv, L, head_dim_v]`
    /// with flash attention) for the first `L = attn_len` positions, as
    /// views.
    pub(crate) fn view(&self, il: usize, attn_len: usize) -> Result<(Tensor, Tensor)> {
        let v_dim = if self.flash { 1 } else { 2 };
        Ok((
            self.k[il].narrow(1, 0, attn_len)?,
            self.vt[il].narrow(v_dim, 0, attn_len)?,
        ))
    }

    /// Stores layer `il`'s keys, rotated by RoPE (`cos`, `sin`, `layout`),
    /// and values for one or more tokens at the position held by `pos` (a
    /// one-element I64 tensor on the cache's device), read when the write
    /// runs, and returns the queries rotated alike: the write of a recorded
    /// decode step, in one launch on a GPU (`Tensor::rope_write_kv_at`).
    /// Needs values stored as rows (a flash-attention cache).
    pub(crate) fn rope_write_at(
        &mut self,
        il: usize,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        rope: (&Tensor, &Tensor, RopeLayout),
        pos: &Tensor,
    ) -> Result<Tensor> {
        if !self.flash {
            return Err(LlmError::Unsupported(
                "writing the cache at a device-held position needs values stored as rows (a flash-attention cache)"
                    .into(),
            ));
        }
        let (kc, vc) = (&mut self.k[il], &mut self.vt[il]);
        Ok(Tensor::rope_write_kv_at(q, k, v, rope, kc, vc, 1, pos)?)
    }

    /// `rope_write_at` then the attention of the rotated queries over the
    /// cache (`Tensor::attention_at` with `attention`'s scale and window),
    /// in one call where the cache's device fuses them
    /// (`Tensor::try_rope_attention_at`: the rotation's rows read from the
    /// whole tables `rope` at the position); `None`, with nothing written,
    /// where it does not.
    pub(crate) fn rope_attention_at(
        &mut self,
        il: usize,
        (q, k, v): (&Tensor, &Tensor, &Tensor),
        tables: (&Tensor, &Tensor, RopeLayout),
        pos: &Tensor,
        attention: (f32, Option<usize>),
    ) -> Result<Option<Tensor>> {
        if !self.flash {
            return Ok(None);
        }
        let (kc, vc) = (&mut self.k[il], &mut self.vt[il]);
        Ok(Tensor::try_rope_attention_at(
            q, k, v, tables, kc, vc, 1, pos, attention,
        )?)
    }

    /// Layer `il`'s whole key and value buffers (`[n_head_kv, n_alloc, d]`;
    /// values as rows only in a flash-attention cache).
    pub(crate) fn layer(&self, il: usize) -> (&Tensor, &Tensor) {
        (&self.k[il], &self.vt[il])
    }

    /// Positions the storage holds (`n_ctx` rounded up to 256).
    pub(crate) fn n_alloc(&self) -> usize {
        self.n_alloc
    }

    /// This cache's identity.
    pub(crate) fn id(&self) -> u64 {
        self.id
    }

    pub(crate) fn advance(&mut self, n: usize) {
        self.len += n;
    }

    /// Bytes the cache holds.
    pub fn n_bytes(&self) -> usize {
        self.k
            .iter()
            .chain(&self.vt)
            .map(|t| t.numel() * t.dtype().size_in_bytes())
            .sum()
    }
}
