//! The key/value cache: preallocated per layer, filled in place.

use super::config::ModelConfig;
use crate::error::{LlmError, Result};
use rustorch_core::{DType, Executor, Tensor};
use std::sync::Arc;

/// Keys and values of every layer for up to `n_ctx` positions, stored as
/// f16 like llama.cpp's default cache (`type_k = type_v = f16`), so that
/// attention sees the same rounded values.
pub struct KvCache {
    /// Per layer: keys `[n_head_kv, n_ctx, head_dim_k]`.
    pub(crate) k: Vec<Tensor>,
    /// Per layer: values `[n_head_kv, n_ctx, head_dim_v]`.
    pub(crate) v: Vec<Tensor>,
    n_ctx: usize,
    len: usize,
}

pub const CACHE_DTYPE: DType = DType::F16;

impl KvCache {
    pub fn new(cfg: &ModelConfig, exec: &Arc<Executor>, n_ctx: usize) -> Result<KvCache> {
        if n_ctx == 0 {
            return Err(LlmError::InvalidArgument("the context size must be at least 1".into()));
        }
        let mut k = Vec::with_capacity(cfg.n_layer);
        let mut v = Vec::with_capacity(cfg.n_layer);
        for _ in 0..cfg.n_layer {
            k.push(Tensor::zeros([cfg.n_head_kv, n_ctx, cfg.head_dim_k], CACHE_DTYPE)?.with_executor(exec)?);
            v.push(Tensor::zeros([cfg.n_head_kv, n_ctx, cfg.head_dim_v], CACHE_DTYPE)?.with_executor(exec)?);
        }
        Ok(KvCache { k, v, n_ctx, len: 0 })
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
        self.v[il].write_slice(1, pos, &v.to_dtype(CACHE_DTYPE)?)?;
        Ok(())
    }

    /// Layer `il`'s keys and values for positions `0..len`, as views.
    pub(crate) fn view(&self, il: usize, len: usize) -> Result<(Tensor, Tensor)> {
        Ok((self.k[il].narrow(1, 0, len)?, self.v[il].narrow(1, 0, len)?))
    }

    pub(crate) fn advance(&mut self, n: usize) {
        self.len += n;
    }

    /// Bytes the cache holds.
    pub fn n_bytes(&self) -> usize {
        self.k
            .iter()
            .chain(&self.v)
            .map(|t| t.numel() * t.dtype().size_in_bytes())
            .sum()
    }
}
