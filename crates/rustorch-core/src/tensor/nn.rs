//! Neural-network ops: normalization, rotary embeddings and attention.

use super::Tensor;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::op::{AttnMask, Op, RopeLayout};
use crate::storage::CpuStorage;

impl Tensor {
    /// Layer normalization over the last `normalized_dims` dims, as
    /// `torch.nn.functional.layer_norm(x, x.shape[-normalized_dims:], ...)`:
    /// `(x - mean) / sqrt(var + eps) * weight + bias`, with the biased
    /// variance. `weight` and `bias` have the normalized shape.
    pub fn layer_norm(
        &self,
        normalized_dims: usize,
        weight: Option<&Tensor>,
        bias: Option<&Tensor>,
        eps: f64,
    ) -> Result<Tensor> {
        let op = Op::LayerNorm {
            eps,
            normalized_dims,
            has_weight: weight.is_some(),
            has_bias: bias.is_some(),
        };
        let mut inputs = vec![self];
        inputs.extend(weight);
        inputs.extend(bias);
        self.run1(&op, &inputs)
    }

    /// RMS normalization over the last dim, as
    /// `torch.nn.functional.rms_norm(x, x.shape[-1:], weight, eps)`:
    /// `x / sqrt(mean(x^2) + eps) * weight`.
    pub fn rms_norm(&self, weight: Option<&Tensor>, eps: f64) -> Result<Tensor> {
        let op = Op::RmsNorm {
            eps,
            has_weight: weight.is_some(),
        };
        let mut inputs = vec![self];
        inputs.extend(weight);
        self.run1(&op, &inputs)
    }

    /// `(self + a, rms_norm(self + a, weight, eps))` in one op (f32): a
    /// residual add and the norm that follows it, the same values as
    /// `add` then `rms_norm` (one GPU launch instead of two).
    pub fn add_rms_norm(&self, a: &Tensor, weight: &Tensor, eps: f64) -> Result<(Tensor, Tensor)> {
        let mut out = self.run_op(&Op::AddRmsNorm { eps }, &[self, a, weight])?.into_iter();
        match (out.next(), out.next()) {
            (Some(s), Some(n)) => Ok((s, n)),
            _ => Err(Error::invalid("add_rms_norm", "the op gave fewer than two outputs")),
        }
    }

    /// Inference-mode batch normalization over dim 1 of an [N, C, ...]
    /// tensor, with running statistics, as
    /// `torch.nn.functional.batch_norm(x, mean, var, weight, bias, training=False, eps=eps)`.
    pub fn batch_norm(
        &self,
        running_mean: &Tensor,
        running_var: &Tensor,
        weight: Option<&Tensor>,
        bias: Option<&Tensor>,
        eps: f64,
    ) -> Result<Tensor> {
        let op = Op::BatchNorm {
            eps,
            has_weight: weight.is_some(),
            has_bias: bias.is_some(),
        };
        let mut inputs = vec![self, running_mean, running_var];
        inputs.extend(weight);
        inputs.extend(bias);
        self.run1(&op, &inputs)
    }

    /// Rotary position embedding of `x` [.., T, D] with tables `cos` and
    /// `sin` [T, R/2] (from `rope_cos_sin`): the first R features are
    /// rotated pairwise, the rest pass through. `RopeLayout::NeoX` pairs
    /// feature i with i + R/2 (Hugging Face Llama's `rotate_half`);
    /// `RopeLayout::Interleaved` pairs 2i with 2i + 1 (Meta's Llama, GGML's
    /// normal mode).
    pub fn rope(&self, cos: &Tensor, sin: &Tensor, layout: RopeLayout) -> Result<Tensor> {
        self.run1(&Op::Rope { layout }, &[self, cos, sin])
    }

    /// Cos and sin tables [positions.len(), rot_dims / 2] for `rope`: entry
    /// (t, i) is the cos / sin of `positions[t] * theta^(-2i / rot_dims)`.
    /// Frequencies, angles and their cos / sin are computed in f64 and
    /// rounded once to `dtype`, so tables stay exact to the last bit of
    /// `dtype` at large positions (Hugging Face computes the angles in f32,
    /// which drifts by about position * 2^-24 radians).
    pub fn rope_cos_sin(positions: &[usize], rot_dims: usize, theta: f64, dtype: DType) -> Result<(Tensor, Tensor)> {
        if rot_dims == 0 || !rot_dims.is_multiple_of(2) {
            return Err(Error::invalid(
                "rope_cos_sin",
                format!("rot_dims must be even and positive, got {rot_dims}"),
            ));
        }
        if !(theta.is_finite() && theta > 0.0) {
            return Err(Error::invalid(
                "rope_cos_sin",
                format!("theta must be positive and finite, got {theta}"),
            ));
        }
        if !dtype.is_float() {
            return Err(Error::dtype("rope_cos_sin", "tables need a floating dtype", &[dtype]));
        }
        let half = rot_dims / 2;
        let freqs: Vec<f64> = (0..half)
            .map(|i| theta.powf(-((2 * i) as f64) / rot_dims as f64))
            .collect();
        let angles = || positions.iter().flat_map(|&p| freqs.iter().map(move |f| p as f64 * f));
        let shape = [positions.len(), half];
        let cos = CpuStorage::from_f64_iter(dtype, angles().map(f64::cos));
        let sin = CpuStorage::from_f64_iter(dtype, angles().map(f64::sin));
        Ok((Tensor::from_storage(cos, shape)?, Tensor::from_storage(sin, shape)?))
    }

    /// `rope_cos_sin` for positions `0..seq_len`.
    pub fn rope_cos_sin_seq(seq_len: usize, rot_dims: usize, theta: f64, dtype: DType) -> Result<(Tensor, Tensor)> {
        let positions: Vec<usize> = (0..seq_len).collect();
        Tensor::rope_cos_sin(&positions, rot_dims, theta, dtype)
    }

    /// `softmax(q k^T * scale + mask) v`, as
    /// `torch.nn.functional.scaled_dot_product_attention`, for q
    /// [B, Hq, Tq, D], k [B, Hkv, Tk, D], v [B, Hkv, Tk, Dv]. Hq may be a
    /// multiple of Hkv (grouped-query attention, torch's `enable_gqa=True`):
    /// query head h uses key/value head h / (Hq / Hkv). `scale` defaults to
    /// 1 / sqrt(D).
    ///
    /// Masks: `AttnMask::Causal` is torch's `is_causal=True` (query i sees
    /// keys 0..=i); `AttnMask::CausalFromEnd` aligns the causal mask to the
    /// last key (query i sees keys 0..=i + Tk - Tq), as decoding with a KV
    /// cache needs; `AttnMask::Explicit` takes `explicit_mask`, a bool
    /// keep-mask or an additive float mask of q's dtype, broadcastable to
    /// [B, Hq, Tq, Tk]. A query row that sees no key gives zeros, as
    /// PyTorch does on the CPU.
    pub fn scaled_dot_product_attention(
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        mask: AttnMask,
        explicit_mask: Option<&Tensor>,
        scale: Option<f64>,
    ) -> Result<Tensor> {
        let op = Op::Sdpa { mask, scale };
        match (mask, explicit_mask) {
            (AttnMask::Explicit, Some(m)) => q.run1(&op, &[q, k, v, m]),
            (AttnMask::Explicit, None) => Err(Error::invalid(
                "sdpa",
                "AttnMask::Explicit needs an explicit_mask tensor",
            )),
            (_, Some(_)) => Err(Error::invalid(
                "sdpa",
                format!("an explicit_mask tensor was given with mask mode {mask:?}; use AttnMask::Explicit"),
            )),
            (_, None) => q.run1(&op, &[q, k, v]),
        }
    }

    /// Attention over an f16 key/value cache with llama.cpp's CPU rounding
    /// (`Op::CachedAttention`): `softmax(q k^T * scale + mask) v` where the
    /// queries and the probabilities are rounded to f16 and every sum runs
    /// in GGML's order, so that a model matches llama.cpp bit for bit.
    ///
    /// q f32 `[Hq, T, D]`, k f16 `[Hkv, L, D]`, vt f16 `[Hkv, Dv, L]` (the
    /// values transposed, as llama.cpp's cache stores them without flash
    /// attention), mask f32 `[T, L]` (0 keeps, -inf hides); Hq a multiple
    /// of Hkv. Returns f32 `[Hq, T, Dv]`.
    pub fn cached_attention(q: &Tensor, k: &Tensor, vt: &Tensor, mask: &Tensor, scale: f32) -> Result<Tensor> {
        q.run1(&Op::CachedAttention { scale }, &[q, k, vt, mask])
    }

    /// Attention over an f16 key/value cache with llama.cpp's CPU flash
    /// attention (`Op::FlashAttention`, llama.cpp's default): the same
    /// softmax attention, summed tile by tile with an online softmax, so
    /// that a model matches llama.cpp run with flash attention bit for bit.
    ///
    /// q f32 `[Hq, T, D]`, k f16 `[Hkv, L, D]`, v f16 `[Hkv, L, Dv]` (values
    /// as rows, as llama.cpp's cache stores them with flash attention), mask
    /// f32 `[T, L]` (0 keeps, -inf hides); Hq a multiple of Hkv. `llama`
    /// says which of GGML's paths llama.cpp would take. Returns f32
    /// `[Hq, T, Dv]`.
    pub fn flash_attention(
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        mask: &Tensor,
        scale: f32,
        llama: FlashPaths,
    ) -> Result<Tensor> {
        let op = Op::FlashAttention {
            scale,
            cpu: crate::op::CpuHints {
                tiled_rows: u32::try_from(llama.tiled_rows).unwrap_or(u32::MAX),
                kv_len: u32::try_from(llama.kv_len).unwrap_or(u32::MAX),
                threads: u32::try_from(llama.threads).unwrap_or(u32::MAX),
                ..Default::default()
            },
        };
        q.run1(&op, &[q, k, v, mask])
    }

    /// Causal attention of queries at a position held in a tensor
    /// (`Op::AttentionAt`), over a key/value cache at its full capacity:
    /// the step's position lives on the device, so the same op (the same
    /// kernel arguments, as a CUDA graph replays them) serves every step.
    ///
    /// q `[H, T, D]` (f32, f16 or bf16), k `[Hkv, N, D]` and v
    /// `[Hkv, N, Dv]` (the cache, values as rows; f32, f16 or bf16, both
    /// the same), `pos` one i32 or i64 element (shape `[1]` or `[]`); H a
    /// multiple of Hkv (query head h reads key/value head h / (H / Hkv)).
    /// Query row i is at position p = pos + i and attends the keys j with
    /// j <= p and, with `window: Some(w)`, p - j < w (a sliding window as
    /// Gemma 3's and llama.cpp's). The weights are
    /// `softmax(scale * q . k_j)` over those keys, computed in f32 with the
    /// maximum subtracted; keys at or past pos + T are never read. Returns
    /// f32 `[H, T, Dv]`, as `cached_attention` does.
    ///
    /// Errors: shapes or dtypes that do not fit, and `Some(0)` as the
    /// window, when the op is built; pos < 0 or pos + T > N when it runs
    /// (the backend's `InvalidInput`; an empty output reads no position).
    pub fn attention_at(
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        pos: &Tensor,
        scale: f32,
        window: Option<usize>,
    ) -> Result<Tensor> {
        q.run1(&Op::AttentionAt { scale, window }, &[q, k, v, pos])
    }

    /// `silu(self) * g` for f32 tensors of one shape, with llama.cpp's
    /// arithmetic (`ggml_swiglu`): the gated feed-forward activation of
    /// Llama-family models.
    pub fn swiglu(&self, g: &Tensor) -> Result<Tensor> {
        self.run1(&Op::SwiGlu, &[self, g])
    }

    /// `gelu(self) * g` (tanh form) for f32 tensors of one shape, with
    /// llama.cpp's arithmetic (`ggml_geglu`: GELU from an f16 table): the
    /// gated feed-forward activation of Gemma models.
    pub fn geglu(&self, g: &Tensor) -> Result<Tensor> {
        self.run1(&Op::GeGlu, &[self, g])
    }
}

/// Which of GGML's flash-attention paths llama.cpp takes for a batch of
/// query positions (`Tensor::flash_attention`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FlashPaths {
    /// The batch's first `tiled_rows` positions belong to a llama.cpp
    /// micro-batch of at least 64 positions (its tiled path); the others
    /// take the one-row path.
    pub tiled_rows: usize,
    /// The cache length llama.cpp attends over (`n_kv`: the used positions
    /// padded to 256, within the cache's size).
    pub kv_len: usize,
    /// llama.cpp's thread count (the split-keys path of one position over
    /// at least 512 cache positions has one chunk per thread).
    pub threads: usize,
}

impl FlashPaths {
    /// The fewest positions of a llama.cpp micro-batch that take the tiled
    /// path (`GGML_FA_TILE_Q`).
    pub const TILE_ROWS: usize = 64;
}
