//! Perplexity with llama.cpp's protocol (tools/perplexity/perplexity.cpp),
//! so that `PPL = ...` figures can be compared with llama-perplexity's.
//!
//! The text is tokenized once (BOS first when the model adds one); chunk i
//! is tokens `[i * n_ctx, (i + 1) * n_ctx)`, evaluated from an empty cache
//! as one batch, with its first token replaced by BOS when the model adds
//! BOS. Positions `n_ctx / 2 ..= n_ctx - 2` are scored, each predicting the
//! next token: `-log_softmax(logits)[next]`, with the softmax sum taken in
//! f64 over `expf(logit - max)`. After each chunk the running value
//! `exp(nll / count)` is recorded; the final one is the result.

use crate::error::{LlmError, Result};
use crate::model::{Logits, Model};

/// llama-perplexity's figures.
#[derive(Clone, Debug, PartialEq)]
pub struct PerplexityReport {
    pub ppl: f64,
    /// llama-perplexity's "+/-" uncertainty.
    pub ppl_err: f64,
    /// `exp(nll / count)` after each chunk.
    pub running: Vec<f64>,
    pub n_chunks: usize,
    /// Tokens scored per chunk.
    pub scored_per_chunk: usize,
}

/// Runs up to `max_chunks` chunks (all whole chunks when `None`) of
/// `tokens` (the whole text, tokenized with the model's add-BOS setting).
/// `progress(done, total)` is called after each chunk.
pub fn perplexity(
    model: &Model,
    tokens: &[u32],
    n_ctx: usize,
    max_chunks: Option<usize>,
    mut progress: impl FnMut(usize, usize),
) -> Result<PerplexityReport> {
    perplexity_with(model, tokens, n_ctx, max_chunks, false, |done, total, _| {
        progress(done, total)
    })
}

/// [`perplexity`] whose `progress(done, total, running)` also gets the running
/// estimate after each chunk (what llama-perplexity prints as `[done]running,`),
/// with flash attention when `flash` (llama-perplexity's default, `-fa auto`,
/// with its default batch sizes: each chunk is one batch, in micro-batches of
/// 512 positions) or without (`-fa off`; [`perplexity`]).
pub fn perplexity_with(
    model: &Model,
    tokens: &[u32],
    n_ctx: usize,
    max_chunks: Option<usize>,
    flash: bool,
    progress: impl FnMut(usize, usize, f64),
) -> Result<PerplexityReport> {
    perplexity_batched(model, tokens, n_ctx, max_chunks, flash, Batching::default(), progress)
}

/// llama-perplexity's batch sizes: `-b` (`n_batch`, positions per decode
/// call) and `-ub` (`n_ubatch`, positions per graph). They decide which
/// positions go through one pass together, and so flash attention's path
/// for each (the scores are otherwise the same).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Batching {
    pub n_batch: usize,
    pub n_ubatch: usize,
}

impl Default for Batching {
    /// llama-perplexity's defaults: 2048 and 512.
    fn default() -> Self {
        Self {
            n_batch: 2048,
            n_ubatch: 512,
        }
    }
}

impl Batching {
    /// What llama-perplexity makes of the sizes for chunks of `n_ctx`:
    /// `max(1, n_batch / n_ctx)` chunks decoded together as parallel
    /// sequences, the batch cut to what they hold, the micro-batch to the
    /// batch. Returns (sequences, batch, micro-batch).
    pub fn effective(self, n_ctx: usize) -> (usize, usize, usize) {
        let n_seq = (self.n_batch / n_ctx).max(1);
        let n_batch = self.n_batch.min(n_seq * n_ctx);
        (n_seq, n_batch, self.n_ubatch.min(n_batch))
    }

    /// The calls chunk `i` of `n_chunks` is decoded in: (positions, run),
    /// where run is how many consecutive positions of the chunk go through
    /// one micro-batch. A chunk longer than a batch goes in batches, each in
    /// micro-batches (the last one of a batch shorter when the sizes do not
    /// divide). Shorter chunks go several at a time as parallel sequences,
    /// each micro-batch taking an equal share of every sequence's positions
    /// (llama.cpp's `split_equal`).
    fn calls(self, n_ctx: usize, n_chunks: usize, i: usize) -> Vec<(std::ops::Range<usize>, usize)> {
        let (n_seq, n_batch, n_ubatch) = self.effective(n_ctx);
        if n_seq == 1 {
            return (0..n_ctx)
                .step_by(n_batch)
                .map(|s| (s..(s + n_batch).min(n_ctx), n_ubatch))
                .collect();
        }
        let group = i / n_seq;
        let seqs = n_seq.min(n_chunks - group * n_seq);
        vec![(0..n_ctx, (n_ubatch / seqs).max(1))]
    }
}

/// [`perplexity_with`] with llama-perplexity's `-b` and `-ub`.
pub fn perplexity_batched(
    model: &Model,
    tokens: &[u32],
    n_ctx: usize,
    max_chunks: Option<usize>,
    flash: bool,
    batching: Batching,
    progress: impl FnMut(usize, usize, f64),
) -> Result<PerplexityReport> {
    perplexity_observed(model, tokens, n_ctx, max_chunks, flash, batching, progress, |_, _| {
        Ok(())
    })
}

/// [`perplexity_batched`] that also hands each chunk's scored rows of
/// logits to `observe(chunk, logits)` (positions `n_ctx / 2 ..= n_ctx - 2`,
/// `n_vocab` values each), before `progress` for that chunk: what
/// `--kl-divergence-base` writes and `--kl-divergence` compares (`kld`).
#[allow(clippy::too_many_arguments)] // llama-perplexity's knobs, each its own
pub fn perplexity_observed(
    model: &Model,
    tokens: &[u32],
    n_ctx: usize,
    max_chunks: Option<usize>,
    flash: bool,
    batching: Batching,
    mut progress: impl FnMut(usize, usize, f64),
    mut observe: impl FnMut(usize, &[f32]) -> Result<()>,
) -> Result<PerplexityReport> {
    if batching.n_batch == 0 || batching.n_ubatch == 0 {
        return Err(LlmError::InvalidArgument(format!(
            "batch sizes must be at least 1, got n_batch {} and n_ubatch {}",
            batching.n_batch, batching.n_ubatch
        )));
    }
    if n_ctx < 4 {
        return Err(LlmError::InvalidArgument(format!(
            "perplexity needs a context of at least 4 tokens, got {n_ctx}"
        )));
    }
    let whole = tokens.len() / n_ctx;
    let n_chunks = max_chunks.map_or(whole, |m| m.min(whole));
    if n_chunks == 0 {
        return Err(LlmError::InvalidArgument(format!(
            "the text has {} tokens, fewer than one chunk of {n_ctx}",
            tokens.len()
        )));
    }
    let bos = if model.tokenizer().add_bos() {
        model.tokenizer().bos()
    } else {
        None
    };
    let first = n_ctx / 2;
    let scored = n_ctx - 1 - first;
    let n_vocab = model.config().n_vocab;
    let mut cache = if flash {
        model.new_flash_cache(n_ctx)?
    } else {
        model.new_cache(n_ctx)?
    };
    let (mut nll, mut nll2, mut count) = (0f64, 0f64, 0usize);
    let mut running = Vec::with_capacity(n_chunks);
    for i in 0..n_chunks {
        let chunk = &tokens[i * n_ctx..(i + 1) * n_ctx];
        let mut input = chunk.to_vec();
        if let Some(b) = bos {
            input[0] = b;
        }
        cache.clear();
        // One call's logits are taken as they are; later calls' append.
        let mut logits: Vec<f32> = Vec::new();
        for (positions, run) in batching.calls(n_ctx, n_chunks, i) {
            let part = model
                .forward_in_runs(&mut cache, &input[positions], Logits::All, run)?
                .to_vec::<f32>()?;
            if logits.is_empty() {
                logits = part;
            } else {
                logits.extend(part);
            }
        }
        for pos in first..n_ctx - 1 {
            let row = &logits[pos * n_vocab..(pos + 1) * n_vocab];
            let v = -log_softmax_at(row, chunk[pos + 1] as usize);
            nll += v;
            nll2 += v * v;
        }
        count += scored;
        observe(i, &logits[first * n_vocab..(n_ctx - 1) * n_vocab])?;
        let now = (nll / count as f64).exp();
        running.push(now);
        progress(i + 1, n_chunks, now);
    }
    let mean = nll / count as f64;
    let ppl = mean.exp();
    let var = nll2 / count as f64 - mean * mean;
    let ppl_err = if count > 1 && var > 0.0 {
        (var / (count - 1) as f64).sqrt() * ppl
    } else {
        0.0
    };
    Ok(PerplexityReport {
        ppl,
        ppl_err,
        running,
        n_chunks,
        scored_per_chunk: scored,
    })
}

/// `log_softmax(logits)[tok]` as llama-perplexity computes it: the sum of
/// `expf(l - max)` in f64.
fn log_softmax_at(logits: &[f32], tok: usize) -> f64 {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = logits.iter().map(|&l| (l - max).exp() as f64).sum();
    (logits[tok] - max) as f64 - sum.ln()
}

#[cfg(test)]
mod tests {
    use super::Batching;

    fn calls(n_batch: usize, n_ubatch: usize, n_ctx: usize, n_chunks: usize, i: usize) -> Vec<(usize, usize, usize)> {
        Batching { n_batch, n_ubatch }
            .calls(n_ctx, n_chunks, i)
            .into_iter()
            .map(|(r, run)| (r.start, r.end, run))
            .collect()
    }

    #[test]
    fn chunks_longer_than_a_batch_go_in_batches_of_micro_batches() {
        // -c 512 -b 256 -ub 96: two calls of 256, micro-batches 96, 96, 64 within each.
        assert_eq!(calls(256, 96, 512, 3, 1), vec![(0, 256, 96), (256, 512, 96)]);
        // -c 1000 -b 384: the last batch is what is left.
        assert_eq!(
            calls(384, 512, 1000, 1, 0),
            vec![(0, 384, 384), (384, 768, 384), (768, 1000, 384)]
        );
        // A batch as long as the chunk: one call.
        assert_eq!(calls(512, 512, 512, 2, 0), vec![(0, 512, 512)]);
    }

    #[test]
    fn short_chunks_share_micro_batches_as_parallel_sequences() {
        // The defaults at -c 128: groups of 16 chunks, 32 positions of each per micro-batch;
        // 20 chunks leave a last group of 4 (128 each).
        assert_eq!(calls(2048, 512, 128, 20, 3), vec![(0, 128, 32)]);
        assert_eq!(calls(2048, 512, 128, 20, 17), vec![(0, 128, 128)]);
        // -b 512 -ub 64 -c 128: groups of 4, 16 positions each.
        assert_eq!(calls(512, 64, 128, 6, 0), vec![(0, 128, 16)]);
        assert_eq!(calls(512, 64, 128, 6, 5), vec![(0, 128, 32)]);
        // -b 300 -c 128: two sequences, the batch cut to 256, the micro-batch to it.
        assert_eq!(calls(300, 512, 128, 4, 0), vec![(0, 128, 128)]);
    }
}
