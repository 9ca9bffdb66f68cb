//! `perplexity -m MODEL -f TEXT_FILE -c N_CTX`: llama-perplexity's protocol
//! (see `rustorch_llm::perplexity`) and its output: the running estimate
//! after each chunk as `[1]12.3456,[2]...` on stdout while it runs, then
//! `Final estimate: PPL = X +/- Y`. Progress notes go to stderr.

use crate::cli::PerplexityArgs;
use crate::error::CliError;
use crate::loader;
use rustorch_llm::perplexity::{perplexity_batched, Batching};
use std::io::Write;
use std::time::Instant;

pub fn run(args: &PerplexityArgs) -> Result<(), CliError> {
    let bytes = std::fs::read(&args.file).map_err(|e| CliError::msg(format!("{}: {e}", args.file.display())))?;
    // llama.cpp reads the file as bytes into a std::string; invalid UTF-8 would tokenize as
    // byte tokens there. Our tokenizer takes &str, so such a file is refused rather than altered.
    let text = String::from_utf8(bytes)
        .map_err(|e| CliError::msg(format!("{}: not UTF-8 text ({e})", args.file.display())))?;
    let n_ctx = args.ctx_size;
    if n_ctx < 4 {
        return Err(CliError::msg(format!("--ctx-size must be at least 4, got {n_ctx}")));
    }
    if args.chunks == Some(0) {
        return Err(CliError::msg("--chunks must be at least 1"));
    }
    if args.batch_size == 0 || args.ubatch_size == 0 {
        return Err(CliError::msg("--batch-size and --ubatch-size must be at least 1"));
    }
    let batching = Batching {
        n_batch: args.batch_size,
        n_ubatch: args.ubatch_size,
    };
    let path = loader::prepare(&args.model)?;
    let (model, load_time) = loader::load(&path, &args.model)?;
    eprintln!("perplexity: model loaded in {:.2} s", load_time.as_secs_f64());

    let t = Instant::now();
    // common_tokenize(ctx, text, add_special = true): BOS where the model adds it.
    let tokens = model.tokenizer().encode(&text, true, true);
    eprintln!(
        "perplexity: tokenization took {:.3} ms",
        t.elapsed().as_secs_f64() * 1e3
    );
    if tokens.len() < 2 * n_ctx {
        return Err(CliError::msg(format!(
            "you need at least {} tokens to evaluate perplexity with a context of {n_ctx}; {} tokenizes to only {}",
            2 * n_ctx,
            args.file.display(),
            tokens.len()
        )));
    }
    let whole = tokens.len() / n_ctx;
    let n_chunk = args.chunks.map_or(whole, |c| c.min(whole));
    let (n_seq, n_batch, _) = batching.effective(n_ctx);
    eprintln!(
        "perplexity: calculating perplexity over {n_chunk} chunks, n_ctx={n_ctx}, batch_size={n_batch}, n_seq={n_seq}"
    );

    let mut out = std::io::stdout().lock();
    let start = Instant::now();
    let mut write_err = None;
    // As llama-perplexity: flash attention unless -fa off.
    let flash = args.model.flash_attn != crate::cli::FlashAttn::Off;
    let report = perplexity_batched(
        &model,
        &tokens,
        n_ctx,
        Some(n_chunk),
        flash,
        batching,
        |done, _, running| {
            if done == 1 {
                let per_pass = start.elapsed().as_secs_f64();
                eprintln!(
                    "perplexity: {per_pass:.2} seconds per pass - ETA {:.2} minutes",
                    per_pass * n_chunk as f64 / 60.0
                );
            }
            if let Err(e) = write!(out, "[{done}]{running:.4},").and_then(|_| out.flush()) {
                write_err.get_or_insert(e);
            }
        },
    )?;
    if let Some(e) = write_err {
        return Err(CliError::msg(format!("cannot write the result: {e}")));
    }
    writeln!(out)
        .and_then(|_| writeln!(out, "Final estimate: PPL = {:.4} +/- {:.5}", report.ppl, report.ppl_err))
        .map_err(|e| CliError::msg(format!("cannot write the result: {e}")))
}
