//! The key/value cache: preallocated per layer, filled in place.

use super::config::ModelConfig;
use crate::error::{LlmError, Result};
use rustorch_core::{DType, Executor, Tensor};
use std::sync::Arc;

/// Keys and values of every layer for up to `n_ctx` positions, stored as
/// f16 like llama.cpp's default cache (`type_k = type_v = f16`), so that
/// attention sees the same rounded values. Values are stored transposed,
/// as llama.cpp stores them without flash attention, so that attention
/// reads them in the same order.
///
/// Storage is allocated for `n_ctx` rounded up to 256 positions (llama.cpp
/// pads its context the same way), and attention reads the used positions
/// rounded up to 64 (`attn_len`): the padding positions are masked and add
/// exact zeros, so the sums keep llama.cpp's vector structure.
pub struct KvCache {
    /// Per layer: keys `[n_head_kv, n_alloc, head_dim_k]`.
    pub(crate) k: Vec<Tensor>,
    /// Per layer: values, transposed: `[n_head_kv, head_dim_v, n_alloc]`.
    pub(crate) vt: Vec<Tensor>,
    n_ctx: usize,
    n_alloc: usize,
    len: usize,
}

/// llama.cpp's context padding (llama-context.cpp: `GGML_PAD(n_ctx, 256)`).
const ALLOC_PAD: usize = 256;
/// Attention length granularity: a multiple of GGML's 64-element f16 dot
/// step and 16-lane softmax blocks, so no sum has a scalar tail.
const ATTN_PAD: usize = 64;

pub const CACHE_DTYPE: DType = DType::F16;

impl KvCache {
    pub fn new(cfg: &ModelConfig, exec: &Arc<Executor>, n_ctx: usize) -> Result<KvCache> {
        if n_ctx == 0 {
            return Err(LlmError::InvalidArgument("the context size must be at least 1".into()));
        }
        let n_alloc = n_ctx.div_ceil(ALLOC_PAD) * ALLOC_PAD;
        let mut k = Vec::with_capacity(cfg.n_layer);
        let mut vt = Vec::with_capacity(cfg.n_layer);
        for _ in 0..cfg.n_layer {
            k.push(Tensor::zeros([cfg.n_head_kv, n_alloc, cfg.head_dim_k], CACHE_DTYPE)?.with_executor(exec)?);
            vt.push(Tensor::zeros([cfg.n_head_kv, cfg.head_dim_v, n_alloc], CACHE_DTYPE)?.with_executor(exec)?);
        }
        Ok(KvCache {
            k,
            vt,
            n_ctx,
            n_alloc,
            len: 0,
        })
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
        self.k[il].write_slice(1, pos, &k.to_dtype(CACHE_DTYPE)?)?;
        self.vt[il].write_slice(2, pos, &v.transpose(1, 2)?.to_dtype(CACHE_DTYPE)?)?;
        Ok(())
    }

    /// How many positions attention reads when `used` are filled: `used`
    /// rounded up to 64, within the allocation.
    pub(crate) fn attn_len(&self, used: usize) -> usize {
        (used.div_ceil(ATTN_PAD) * ATTN_PAD).min(self.n_alloc)
    }

    /// Layer `il`'s keys `[n_head_kv, L, head_dim_k]` and transposed values
    /// `[n_head_kv, head_dim_v, L]` for the first `L = attn_len` positions,
    /// as views.
    pub(crate) fn view(&self, il: usize, attn_len: usize) -> Result<(Tensor, Tensor)> {
        Ok((self.k[il].narrow(1, 0, attn_len)?, self.vt[il].narrow(2, 0, attn_len)?))
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
