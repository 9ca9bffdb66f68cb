//! The forward pass, written with tensor ops so that it runs through the
//! executor on whatever device can take each op.
//!
//! It follows llama.cpp's graphs (src/models/llama.cpp and gemma3.cpp) op
//! for op where the order changes the rounding: activations quantized per
//! weight type by `qmatmul`, keys and values rounded to f16 in the cache,
//! attention as GGML computes it without flash attention
//! (`Tensor::cached_attention`), SwiGLU with GGML's exponential
//! (`Tensor::swiglu`) and GeGLU with GGML's f16 GELU table
//! (`Tensor::geglu`).

use super::config::{Arch, RopeParams};
use super::kv_cache::KvCache;
use super::rope;
use super::Model;
use crate::error::{LlmError, Result};
use rustorch::op::GateActivation;
use rustorch::{Device, FlashPaths, Tensor};

/// Where a micro-batch lies in its `forward` call's tokens: llama.cpp
/// decodes a call's tokens in runs of `run` positions from its first
/// (`LLAMA_UBATCH` unless the caller says otherwise), and flash attention
/// takes its tiled path for the positions of a run of at least 64, its
/// one-row path for the others.
#[derive(Clone, Copy, Debug)]
struct Batch {
    /// The micro-batch's first token, as an index into the call's tokens.
    start: usize,
    /// The call's token count.
    call_len: usize,
    /// llama.cpp's run length for this call.
    run: usize,
}

impl Batch {
    /// How many of the micro-batch's `t` positions (a prefix) llama.cpp
    /// runs through flash attention's tiled path.
    fn tiled_rows(self, t: usize) -> usize {
        let run = self.run.max(1);
        if run < FlashPaths::TILE_ROWS {
            return 0;
        }
        // Every run but the last is full; the last is tiled when it has at
        // least 64 positions.
        let last_run = (self.call_len - 1) / run * run;
        let tiled_end = if self.call_len - last_run >= FlashPaths::TILE_ROWS {
            self.call_len
        } else {
            last_run
        };
        tiled_end.saturating_sub(self.start).min(t)
    }
}

/// Which positions' logits a forward pass returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Logits {
    /// Only the last position's: `[1, n_vocab]` (prompt processing before
    /// generation, and every generation step).
    Last,
    /// Every position's: `[T, n_vocab]` (perplexity).
    All,
}

/// RoPE tables shared by the layers that use the same settings and run on
/// the same device.
struct RopeTables {
    params: RopeParams,
    device: Device,
    cos: Tensor,
    sin: Tensor,
}

impl Model {
    /// Runs `tokens` at positions `cache.len()..`, stores their keys and
    /// values in `cache`, and returns the requested logits (f32).
    ///
    /// A long prompt goes through in micro-batches of about `UBATCH_ROWS`
    /// positions, each attending to the ones before it in the cache: the
    /// same bits as one batch (tests/batching.rs), for half or less of its
    /// activation memory.
    pub fn forward(&self, cache: &mut KvCache, tokens: &[u32], which: Logits) -> Result<Tensor> {
        self.forward_in_runs(cache, tokens, which, super::kv_cache::LLAMA_UBATCH)
    }

    /// `forward` for tokens that llama.cpp would decode in runs of `run`
    /// positions (its micro-batch: `n_ubatch`, or fewer rows per sequence
    /// when it decodes several sequences in one batch, as llama-perplexity
    /// does), which decides flash attention's path for each position. The
    /// same as `forward` without flash attention.
    pub fn forward_in_runs(&self, cache: &mut KvCache, tokens: &[u32], which: Logits, run: usize) -> Result<Tensor> {
        // Checked for the whole prompt first, so that a bad token or a full
        // cache fails before any micro-batch fills the cache.
        self.check_tokens(cache, tokens)?;
        if let ([token], Logits::Last) = (tokens, which) {
            // A decode step: replayed from a recording where the model runs
            // on one GPU (`recorded`). Checked first, so that other steps
            // (every CPU one) do not enter a pass for nothing.
            if self.recording_device(cache).is_some() {
                if let Some(logits) = self.run_pass(|| self.recorded_step(cache, *token))? {
                    return Ok(logits);
                }
            }
        }
        let batches = row_chunks(tokens.len(), self.ubatch_rows());
        let start = cache.len();
        let mut logits = Vec::with_capacity(batches.len());
        for (i, r) in batches.iter().enumerate() {
            let want = match which {
                Logits::All => Some(Logits::All),
                Logits::Last => (i + 1 == batches.len()).then_some(Logits::Last),
            };
            match self.forward_on_pool(
                cache,
                &tokens[r.clone()],
                Batch {
                    start: r.start,
                    call_len: tokens.len(),
                    run,
                },
                want,
                ffn_chunk_override().unwrap_or_else(|| self.ffn_chunk_rows()),
                &mut |_, _, _| Ok(()),
            ) {
                Ok(out) => logits.extend(out),
                Err(e) => {
                    // A failed pass leaves the cache as it found it.
                    cache.truncate(start);
                    return Err(e);
                }
            }
        }
        match logits.len() {
            1 => Ok(logits.pop().expect("one element")),
            _ => Ok(Tensor::cat(&logits.iter().collect::<Vec<_>>(), 0)?),
        }
    }

    /// `forward`, calling `inspect(name, layer, tensor)` on intermediate
    /// results named as llama.cpp's graph callbacks name them (`attn_norm`,
    /// `Qcur`, `Kcur`, `Vcur` as `[T, heads, head_dim]` after rope, `kqv_out`,
    /// `attn_out`, `ffn_inp`, `ffn_norm`, `ffn_out`, `l_out`, and
    /// `result_norm` / `result_output` with layer `usize::MAX`): a way to
    /// find where a model's numbers part from a reference.
    pub fn forward_inspect(
        &self,
        cache: &mut KvCache,
        tokens: &[u32],
        which: Logits,
        inspect: &mut (dyn FnMut(&str, usize, &Tensor) -> Result<()> + Send),
    ) -> Result<Tensor> {
        // One batch, and the whole feed-forward block at once: `inspect`
        // sees every row.
        let whole = Batch {
            start: 0,
            call_len: tokens.len(),
            run: super::kv_cache::LLAMA_UBATCH,
        };
        let out = self.forward_on_pool(cache, tokens, whole, Some(which), usize::MAX, inspect)?;
        Ok(out.expect("logits were asked for"))
    }

    /// The errors a pass must give before it changes the cache: no tokens,
    /// a token outside the vocabulary, no room left in the cache.
    pub(super) fn check_tokens(&self, cache: &KvCache, tokens: &[u32]) -> Result<()> {
        let n_vocab = self.config.n_vocab;
        if tokens.is_empty() {
            return Err(LlmError::InvalidArgument("forward needs at least one token".into()));
        }
        if let Some(&bad) = tokens.iter().find(|&&id| id as usize >= n_vocab) {
            return Err(LlmError::InvalidArgument(format!(
                "token id {bad} is outside the vocabulary of {n_vocab} tokens"
            )));
        }
        cache.check_room(tokens.len())
    }

    fn forward_on_pool(
        &self,
        cache: &mut KvCache,
        tokens: &[u32],
        batch: Batch,
        which: Option<Logits>,
        ffn_chunk: usize,
        inspect: &mut (dyn FnMut(&str, usize, &Tensor) -> Result<()> + Send),
    ) -> Result<Option<Tensor>> {
        // Run the whole pass on a worker of rayon's pool: ops then split
        // their work from inside the pool (the worker takes part, idle
        // workers steal) instead of each op waking the pool from outside
        // and sleeping until it finishes, a round trip of two futex waits
        // that cost a quarter of a decode step's time.
        // One pass of the executor (the CPU's workers spin for all of it).
        self.run_pass(|| self.forward_in_pool(cache, tokens, batch, which, ffn_chunk, inspect))
    }

    /// One batch through the model; `which: None` fills the cache and
    /// computes no logits (a prompt's micro-batches before the last).
    fn forward_in_pool(
        &self,
        cache: &mut KvCache,
        tokens: &[u32],
        batch: Batch,
        which: Option<Logits>,
        ffn_chunk: usize,
        inspect: &mut (dyn FnMut(&str, usize, &Tensor) -> Result<()> + Send),
    ) -> Result<Option<Tensor>> {
        let cfg = &self.config;
        let t = tokens.len();
        self.check_tokens(cache, tokens)?;
        let pos0 = cache.len();
        let total = pos0 + t;
        let exec = &self.exec;

        let ids: Vec<i64> = tokens.iter().map(|&id| id as i64).collect();
        let ids = Tensor::from_vec(ids, [t])?.with_executor(exec)?;
        let mut x = self.weights.tok_embd.embedding(&ids)?;
        if cfg.arch == Arch::Gemma3 {
            // ggml_scale by sqrtf(n_embd), an f32.
            x = x.mul_scalar((cfg.n_embd as f32).sqrt() as f64)?;
        }

        // The pass's shared inputs (RoPE tables, small masks) are built on
        // the host once and copied to each device that runs layers once:
        // left on the host, every op reading them on a GPU would upload its
        // own copy (four table uploads and a mask per layer and token).
        let layer_device = |il: usize| self.placement.layers.get(il).copied().unwrap_or(Device::Cpu);
        let mut ropes: Vec<RopeTables> = Vec::new();
        for il in 0..cfg.n_layer {
            let (p, device) = (cfg.rope_for_layer(il), layer_device(il));
            if ropes.iter().any(|r| r.params == p && r.device == device) {
                continue;
            }
            let (cos, sin) = match ropes.iter().find(|r| r.params == p) {
                Some(r) => (r.cos.clone(), r.sin.clone()),
                None => rope::tables(exec, &p, self.weights.rope_freqs.as_deref(), pos0..total)?,
            };
            ropes.push(RopeTables {
                params: p,
                device,
                cos: cos.to_device(device)?,
                sin: sin.to_device(device)?,
            });
        }
        let attn_len = cache.attn_len(total);
        // The mask is built once per window setting and device for the
        // whole pass where it is small (decode steps, short prompts) or its
        // layers run on a GPU: there a mask per layer would be built on the
        // host and uploaded by every layer (a 512-token prompt's is 1 MiB:
        // sharing it made TinyLlama Q4_K_M's pp512 on an H200 48300 instead
        // of 34700 t/s). A large mask for CPU layers is built per layer, so
        // that only one is alive at a time.
        let shared_mask = |device: Device| t * attn_len <= SHARED_MASK_ELEMENTS || device != Device::Cpu;
        let mut masks: Vec<(Option<usize>, Device, Tensor)> = Vec::new();
        for il in 0..cfg.n_layer {
            let (window, device) = (cfg.window_for_layer(il), layer_device(il));
            if !shared_mask(device) || masks.iter().any(|(w, d, _)| *w == window && *d == device) {
                continue;
            }
            let mask = match masks.iter().find(|(w, _, _)| *w == window) {
                Some((_, _, m)) => m.clone(),
                None => self.mask(pos0, t, attn_len, window)?,
            };
            masks.push((window, device, mask.to_device(device)?));
        }

        for il in 0..cfg.n_layer {
            let lw = &self.weights.layers[il];
            let rt = ropes
                .iter()
                .find(|r| r.params == cfg.rope_for_layer(il) && r.device == layer_device(il))
                .expect("a table was built for every layer's rope settings and device above");
            let last_layer = il + 1 == cfg.n_layer;

            // Attention. Blocks scope the intermediate tensors, so that
            // each is freed as soon as it is used (a batch's activations
            // are most of the memory above the weights and the cache).
            let attn = {
                let h = x.rms_norm(Some(&lw.attn_norm), cfg.rms_eps as f64)?;
                inspect("attn_norm", il, &h)?;
                let (q, k, v) = self.qkv_heads(il, h)?;
                // [T, H, D] -> [H, T, D]: heads outermost, as attention wants.
                // (Shadowing would keep the unroped q and k alive to the end
                // of the block; each is dropped as its roped copy is made.)
                let mut q = {
                    let q = q;
                    q.transpose(0, 1)?.rope(&rt.cos, &rt.sin, rt.params.layout)?
                };
                let k = {
                    let k = k;
                    k.transpose(0, 1)?.rope(&rt.cos, &rt.sin, rt.params.layout)?
                };
                inspect("Qcur", il, &q.transpose(0, 1)?)?;
                inspect("Kcur", il, &k.transpose(0, 1)?)?;
                inspect("Vcur", il, &v)?;
                let v = v.transpose(0, 1)?;
                let sdpa_scale = if cfg.arch == Arch::Gemma3 {
                    // Gemma scales the queries (f32) before attention, then
                    // attends with scale 1.
                    q = q.mul_scalar(cfg.attn_scale as f64)?;
                    1.0
                } else {
                    cfg.attn_scale as f64
                };
                cache.write(il, &k, &v)?;
                drop((k, v));
                if last_layer && which.is_none() {
                    // The cache is full for these positions; nothing reads
                    // the last block's output.
                    break;
                }
                let heads_first = {
                    let (kc, vc) = cache.view(il, attn_len)?;
                    let window = cfg.window_for_layer(il);
                    let mask = match masks.iter().find(|(w, d, _)| *w == window && *d == layer_device(il)) {
                        Some((_, _, m)) => m.clone(),
                        None => self.mask(pos0, t, attn_len, window)?,
                    };
                    if cache.flash() {
                        let paths = FlashPaths {
                            tiled_rows: batch.tiled_rows(t),
                            kv_len: cache.llama_n_kv(total),
                            threads: rayon::current_num_threads(),
                        };
                        Tensor::flash_attention(&q, &kc, &vc, &mask, sdpa_scale as f32, paths)?
                    } else {
                        Tensor::cached_attention(&q, &kc, &vc, &mask, sdpa_scale as f32)?
                    }
                };
                // q goes before the [H, T, D] -> [T, H * D] copy is made.
                drop(q);
                heads_first.transpose(0, 1)?.reshape([t, cfg.n_head * cfg.head_dim_v])?
            };
            inspect("kqv_out", il, &attn)?;
            let mut a = attn.qmatmul(&lw.wo)?;
            drop(attn);
            inspect("attn_out", il, &a)?;
            if last_layer && which == Some(Logits::Last) && t > 1 {
                // Only the last row feeds the logits (llama.cpp's
                // inp_out_ids): skip the rest of the last block for the others.
                a = a.narrow(0, t - 1, 1)?;
                x = x.narrow(0, t - 1, 1)?;
            }
            if let Some(n) = &lw.post_attn_norm {
                a = a.rms_norm(Some(n), cfg.rms_eps as f64)?;
            }
            x = x.add(&a)?;
            drop(a);
            inspect("ffn_inp", il, &x)?;
            x = self.feed_forward_rows(il, x, ffn_chunk, inspect)?;
            inspect("l_out", il, &x)?;
        }
        cache.advance(t);
        if which.is_none() {
            return Ok(None);
        }

        Ok(Some(self.output_logits(&x, inspect)?))
    }

    /// Layer `il`'s queries, keys and values `[T, heads, d]` from its
    /// normed input rows `h` (`attn_norm`), after Gemma's per-head norms.
    /// One quantization of `h` serves the three products; `h` is taken so
    /// that it is freed before the heads are used, and each product is
    /// consumed by its reshape (a shadowed binding would hold its storage
    /// through attention: at a 512-token prompt, more than the hidden
    /// state).
    pub(super) fn qkv_heads(&self, il: usize, h: Tensor) -> Result<(Tensor, Tensor, Tensor)> {
        let lw = &self.weights.layers[il];
        let t = h.dims()[0];
        let qkv = h.qmatmul_many(&[&lw.wq, &lw.wk, &lw.wv])?;
        drop(h);
        self.heads_of_products(il, t, qkv)
    }

    /// The query, key and value heads `[t, heads, head_dim]` of layer `il`
    /// from its three projections of `t` rows (`qkv_heads`' products),
    /// with Gemma's query and key norms.
    pub(super) fn heads_of_products(&self, il: usize, t: usize, qkv: Vec<Tensor>) -> Result<(Tensor, Tensor, Tensor)> {
        let cfg = &self.config;
        let lw = &self.weights.layers[il];
        let mut qkv = qkv.into_iter();
        let mut heads = |n: usize, d: usize| -> Result<Tensor> {
            let p = qkv.next().expect("qmatmul_many returns one product per weight");
            Ok(p.reshape([t, n, d])?)
        };
        let q = heads(cfg.n_head, cfg.head_dim_k)?;
        let k = heads(cfg.n_head_kv, cfg.head_dim_k)?;
        let v = heads(cfg.n_head_kv, cfg.head_dim_v)?;
        let (q, k) = match (&lw.q_norm, &lw.k_norm) {
            (Some(qn), Some(kn)) => (
                q.rms_norm(Some(qn), cfg.rms_eps as f64)?,
                k.rms_norm(Some(kn), cfg.rms_eps as f64)?,
            ),
            _ => (q, k),
        };
        Ok((q, k, v))
    }

    /// The logits of the last block's output rows `x`: the output norm, the
    /// output product and Gemma's final soft cap.
    pub(super) fn output_logits(
        &self,
        x: &Tensor,
        inspect: &mut (dyn FnMut(&str, usize, &Tensor) -> Result<()> + Send),
    ) -> Result<Tensor> {
        let h = x.rms_norm(Some(&self.weights.output_norm), self.config.rms_eps as f64)?;
        inspect("result_norm", usize::MAX, &h)?;
        self.logits_of_normed(&h, inspect)
    }

    /// The logits of the last block's output rows already through the
    /// output norm (`result_norm`): the output product and Gemma's final
    /// soft cap.
    pub(super) fn logits_of_normed(
        &self,
        h: &Tensor,
        inspect: &mut (dyn FnMut(&str, usize, &Tensor) -> Result<()> + Send),
    ) -> Result<Tensor> {
        let cfg = &self.config;
        let mut logits = h.qmatmul(&self.weights.output)?;
        inspect("result_output", usize::MAX, &logits)?;
        if let Some(cap) = cfg.final_logit_softcap {
            logits = logits.mul_scalar(1.0 / cap as f64)?.tanh()?.mul_scalar(cap as f64)?;
        }
        Ok(logits)
    }

    /// `x + feed_forward(x)` (`l_out`) for the block's input rows `x`
    /// (`ffn_inp`): row by row, so a long prompt's rows go through it in
    /// chunks (see `FFN_CHUNK_ROWS`). Takes `x` so that it is freed before
    /// the chunks' sums are joined.
    fn feed_forward_rows(
        &self,
        il: usize,
        x: Tensor,
        ffn_chunk: usize,
        inspect: &mut (dyn FnMut(&str, usize, &Tensor) -> Result<()> + Send),
    ) -> Result<Tensor> {
        let rows = x.dims()[0];
        if rows <= ffn_chunk {
            let d = self.feed_forward(il, &x, inspect)?;
            return Ok(x.add(&d)?);
        }
        let mut outs = Vec::new();
        for r in row_chunks(rows, ffn_chunk) {
            let xc = x.narrow(0, r.start, r.len())?;
            let d = self.feed_forward(il, &xc, &mut |_, _, _| Ok(()))?;
            outs.push(xc.add(&d)?);
        }
        drop(x);
        Ok(Tensor::cat(&outs.iter().collect::<Vec<_>>(), 0)?)
    }

    /// One block's feed-forward output for the rows `x` (`ffn_inp`).
    pub(super) fn feed_forward(
        &self,
        il: usize,
        x: &Tensor,
        inspect: &mut (dyn FnMut(&str, usize, &Tensor) -> Result<()> + Send),
    ) -> Result<Tensor> {
        let h = x.rms_norm(Some(&self.weights.layers[il].ffn_norm), self.config.rms_eps as f64)?;
        inspect("ffn_norm", il, &h)?;
        self.feed_forward_normed(il, h, inspect)
    }

    /// One block's feed-forward output for its input rows already through
    /// the feed-forward norm (`ffn_norm`), which is freed once the gated
    /// product has read it.
    pub(super) fn feed_forward_normed(
        &self,
        il: usize,
        h: Tensor,
        inspect: &mut (dyn FnMut(&str, usize, &Tensor) -> Result<()> + Send),
    ) -> Result<Tensor> {
        let lw = &self.weights.layers[il];
        let act = h.qmatmul_gated(&lw.ffn_gate, &lw.ffn_up, self.gate_activation())?;
        drop(h);
        self.feed_forward_down(il, act, inspect)
    }

    /// The activation of the feed-forward's gate.
    pub(super) fn gate_activation(&self) -> GateActivation {
        match self.config.arch {
            Arch::Llama => GateActivation::SwiGlu,
            Arch::Gemma3 => GateActivation::GeGlu,
        }
    }

    /// The feed-forward's output from its gated activations `act`: the
    /// down product and Gemma's post-feed-forward norm.
    pub(super) fn feed_forward_down(
        &self,
        il: usize,
        act: Tensor,
        inspect: &mut (dyn FnMut(&str, usize, &Tensor) -> Result<()> + Send),
    ) -> Result<Tensor> {
        let cfg = &self.config;
        let lw = &self.weights.layers[il];
        let mut d = act.qmatmul(&lw.ffn_down)?;
        drop(act);
        if let Some(n) = &lw.post_ffn_norm {
            d = d.rms_norm(Some(n), cfg.rms_eps as f64)?;
        }
        inspect("ffn_out", il, &d)?;
        Ok(d)
    }

    /// The additive mask `[T, attn_len]` (0 keeps, -inf hides) of one
    /// layer's attention: causal, and within `window` positions when the
    /// layer has a sliding window; positions from `pos0 + T` on (cache
    /// padding) are hidden. For CPU layers a large one is built for each
    /// layer rather than once per pass: at a 512-token prompt it is as
    /// large as the hidden state, and held through the projections it would
    /// raise the pass's peak memory (see `forward_in_pool`).
    fn mask(&self, pos0: usize, t: usize, attn_len: usize, window: Option<usize>) -> Result<Tensor> {
        let m = mask_values(pos0, t, attn_len, window);
        Ok(Tensor::from_vec(m, [t, attn_len])?.with_executor(&self.exec)?)
    }
}

/// `Model::mask`'s values, row by row: -inf, with each row's visible keys
/// (llama_hparams::is_masked_swa, standard: a key at p0 is hidden from a
/// query at p1 when p0 > p1, or when p1 - p0 >= window) filled with 0 as
/// one run: a 512 x 4096 mask in 3.2 ms instead of 7.5 element by element
/// (one EPYC core, measured once).
fn mask_values(pos0: usize, t: usize, attn_len: usize, window: Option<usize>) -> Vec<f32> {
    let mut m = vec![f32::NEG_INFINITY; t * attn_len];
    if attn_len == 0 {
        return m;
    }
    for (i, row) in m.chunks_exact_mut(attn_len).enumerate() {
        let p1 = pos0 + i;
        let first = window.map_or(0, |w| (p1 + 1).saturating_sub(w));
        let end = (p1 + 1).min(attn_len);
        if first < end {
            row[first..end].fill(0.0);
        }
    }
    m
}

/// Mask elements (f32) up to which one mask per window setting serves
/// every CPU layer of a pass (64 KiB); larger masks for CPU layers are
/// built per layer (GPU layers always share theirs), see `Model::mask`.
const SHARED_MASK_ELEMENTS: usize = 16 * 1024;

/// Prompt rows that `Model::forward` sends through a feed-forward block at
/// a time when a whole micro-batch's would not fit (below). Its two
/// `[rows, n_ff]` intermediates (the gate product, which the activation
/// then overwrites, and the up product: `Tensor::qmatmul_gated`) are the
/// largest tensors of a prompt batch; chunks of 128 rows cut them, for more
/// passes over the block's weights (from cache or memory: a few percent of
/// a prompt's time, which is compute-bound). The bits are the same: every
/// op of the block works row by row, and every chunk has at least 8 rows,
/// so each product takes the batched path it takes for the whole prompt (a
/// lone row would take the matvec path, whose order differs for some
/// weight types).
const FFN_CHUNK_ROWS: usize = 128;

/// The share of the weights' bytes that a feed-forward chunk's two
/// intermediates may take (1/24) before chunks shrink to `FFN_CHUNK_ROWS`:
/// a whole micro-batch in one chunk reads the block's weights once instead
/// of twice, which on the AMX host made TinyLlama's pp512 215 instead of
/// 164 t/s (its intermediates: 11.5 MB against 637 MB of weights), and
/// SmolLM2-shape's 998 instead of 929 t/s (five alternated rounds; 3.1 MB
/// against 97 MB), within its memory budget now that the activation
/// overwrites the gate product (peak RSS of pp512 + tg128 on the 2-core
/// machine 127,444 KiB against a budget of 130,330; a separate activation
/// tensor made it 130,192).
const FFN_SHARE_OF_WEIGHTS: usize = 24;

impl Model {
    /// Rows per feed-forward chunk: a whole micro-batch when its
    /// intermediates take at most 1/24 of the weights, else `FFN_CHUNK_ROWS`.
    fn ffn_chunk_rows(&self) -> usize {
        if self.layers_on_gpus() {
            // A GPU's memory holds a whole micro-batch's intermediates.
            return self.ubatch_rows();
        }
        let per_row = 2 * self.config.n_ff * std::mem::size_of::<f32>();
        let rows = self.weights.n_bytes() / FFN_SHARE_OF_WEIGHTS / per_row.max(1);
        if rows >= UBATCH_ROWS {
            UBATCH_ROWS
        } else {
            FFN_CHUNK_ROWS
        }
    }
}

/// Prompt positions that `Model::forward` sends through the model at a
/// time (llama.cpp's micro-batch, `n_ubatch`, whose default is 512). At
/// 256, a 512-token prompt's activations (hidden states, queries, masks,
/// attention outputs) are half as large, for one more pass over the
/// weights. A multiple of 4 keeps the rows that the repacked kernels leave
/// to their one-row path (llama.cpp's `m % 4` tail) the same as in one
/// batch, and every micro-batch has at least 8 rows (`row_chunks`), so
/// each product takes the batched path.
const UBATCH_ROWS: usize = 256;

/// Prompt positions per micro-batch where every layer is on a GPU:
/// llama.cpp's default `n_ubatch`. A GPU's products run one cuBLAS GEMM a
/// weight per micro-batch and its ops cost a launch each, so halving the
/// batch (the CPU's choice) doubled a 512-token prompt's launches and
/// host work (H200: pp512 at about half of llama.cpp's).
const GPU_UBATCH_ROWS: usize = 512;

/// `RUSTORCH_UBATCH`, the micro-batch's override (for measuring other
/// sizes; the CPU's bits do not depend on it). Read once per process: the
/// forward pass asks on every decode step.
fn ubatch_override() -> Option<usize> {
    static ROWS: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();
    *ROWS.get_or_init(|| env_size("RUSTORCH_UBATCH"))
}

impl Model {
    /// Prompt positions per micro-batch: the override, else
    /// `GPU_UBATCH_ROWS` where every layer is on a GPU, else `UBATCH_ROWS`.
    fn ubatch_rows(&self) -> usize {
        ubatch_override().unwrap_or(if self.layers_on_gpus() {
            GPU_UBATCH_ROWS
        } else {
            UBATCH_ROWS
        })
    }

    /// Whether every layer runs on a GPU (none on the CPU).
    fn layers_on_gpus(&self) -> bool {
        !self.placement.layers.is_empty() && self.placement.layers.iter().all(|d| !d.is_cpu())
    }
}

/// `RUSTORCH_FFN_CHUNK`, the feed-forward chunk's override (as
/// `ubatch_rows`).
fn ffn_chunk_override() -> Option<usize> {
    static ROWS: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();
    *ROWS.get_or_init(|| env_size("RUSTORCH_FFN_CHUNK"))
}

fn env_size(name: &str) -> Option<usize> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

/// Ranges of about `chunk` rows covering `0..rows`; a last range shorter
/// than 8 rows joins the one before it.
fn row_chunks(rows: usize, chunk: usize) -> Vec<std::ops::Range<usize>> {
    const MIN_ROWS: usize = 8;
    let mut out: Vec<std::ops::Range<usize>> = (0..rows)
        .step_by(chunk.max(1))
        .map(|s| s..(s + chunk).min(rows))
        .collect();
    if out.len() > 1 && out.last().is_some_and(|r| r.len() < MIN_ROWS) {
        let last = out.pop().expect("checked above");
        if let Some(prev) = out.last_mut() {
            prev.end = last.end;
        }
    }
    out
}

#[cfg(test)]
mod chunk_tests {
    use super::row_chunks;

    #[test]
    fn row_chunks_cover_every_row_once_and_never_leave_a_short_tail() {
        assert_eq!(row_chunks(512, 256), vec![0..256, 256..512]);
        assert_eq!(row_chunks(513, 256), vec![0..256, 256..513]);
        assert_eq!(row_chunks(520, 256), vec![0..256, 256..512, 512..520]);
        assert_eq!(row_chunks(100, 256), vec![0..100]);
        for rows in 1..700 {
            let c = row_chunks(rows, 256);
            assert_eq!(c.first().map(|r| r.start), Some(0));
            assert_eq!(c.last().map(|r| r.end), Some(rows));
            assert!(c.windows(2).all(|w| w[0].end == w[1].start));
            assert!(c.len() == 1 || c.iter().all(|r| r.len() >= 8));
        }
    }
}

#[cfg(test)]
mod mask_tests {
    use super::mask_values;

    /// The mask's definition, element by element.
    fn reference(pos0: usize, t: usize, attn_len: usize, window: Option<usize>) -> Vec<f32> {
        let mut m = Vec::new();
        for i in 0..t {
            let p1 = pos0 + i;
            m.extend((0..attn_len).map(|p0| {
                if p0 <= p1 && window.is_none_or(|w| p1 - p0 < w) {
                    0.0
                } else {
                    f32::NEG_INFINITY
                }
            }));
        }
        m
    }

    #[test]
    fn runs_of_visible_keys_are_the_definition() {
        for (pos0, t, attn_len) in [
            (0, 1, 1),
            (0, 5, 8),
            (3, 4, 8),
            (0, 9, 9),
            (7, 3, 16),
            (0, 3, 0),
            (20, 2, 8),
        ] {
            for window in [None, Some(1), Some(2), Some(4), Some(100)] {
                assert_eq!(
                    mask_values(pos0, t, attn_len, window),
                    reference(pos0, t, attn_len, window),
                    "pos0 {pos0} t {t} attn_len {attn_len} window {window:?}"
                );
            }
        }
    }
}
