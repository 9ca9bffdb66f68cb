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
    mut progress: impl FnMut(usize, usize, f64),
) -> Result<PerplexityReport> {
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
        let run = llama_run(n_ctx, n_chunks, i);
        let logits = model
            .forward_in_runs(&mut cache, &input, Logits::All, run)?
            .to_vec::<f32>()?;
        for pos in first..n_ctx - 1 {
            let row = &logits[pos * n_vocab..(pos + 1) * n_vocab];
            let v = -log_softmax_at(row, chunk[pos + 1] as usize);
            nll += v;
            nll2 += v * v;
        }
        count += scored;
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

/// llama-perplexity's defaults: batches of 2048 positions, micro-batches of
/// 512.
const LLAMA_BATCH: usize = 2048;
const LLAMA_UBATCH: usize = 512;

/// How many consecutive positions of chunk `i` llama-perplexity decodes at a
/// time (which decides flash attention's path). A chunk longer than a batch
/// goes in batches, each in micro-batches of 512. Shorter chunks go
/// `LLAMA_BATCH / n_ctx` at a time as parallel sequences, each micro-batch
/// taking an equal share of every sequence's positions (`split_equal`): 512
/// over the sequences of the chunk's group.
fn llama_run(n_ctx: usize, n_chunks: usize, i: usize) -> usize {
    let n_seq = (LLAMA_BATCH / n_ctx).max(1);
    if n_seq == 1 {
        return LLAMA_UBATCH;
    }
    let group = i / n_seq;
    let seqs = n_seq.min(n_chunks - group * n_seq);
    (LLAMA_UBATCH / seqs).max(1)
}

/// `log_softmax(logits)[tok]` as llama-perplexity computes it: the sum of
/// `expf(l - max)` in f64.
fn log_softmax_at(logits: &[f32], tok: usize) -> f64 {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = logits.iter().map(|&l| (l - max).exp() as f64).sum();
    (logits[tok] - max) as f64 - sum.ln()
}
