//! `perplexity -m MODEL -f TEXT_FILE -c N_CTX`: llama-perplexity's protocol
//! (see `rustorch_llm::perplexity`) and its output: the running estimate
//! after each chunk as `[1]12.3456,[2]...` on stdout while it runs, then
//! `Final estimate: PPL = X +/- Y`. Progress notes go to stderr.

use crate::cli::PerplexityArgs;
use crate::error::CliError;
use crate::loader;
use rustorch_llm::kld::{BaseReader, BaseWriter, KlDivergence};
use rustorch_llm::perplexity::{perplexity_observed, Batching};
use std::io::Write;
use std::time::Instant;

pub fn run(args: &PerplexityArgs) -> Result<(), CliError> {
    if args.kl_divergence {
        return kl_divergence(args);
    }
    let file = args
        .file
        .as_ref()
        .ok_or_else(|| CliError::msg("no text given: pass -f TEXT_FILE (or --kl-divergence with a base file)"))?;
    let bytes = std::fs::read(file).map_err(|e| CliError::msg(format!("{}: {e}", file.display())))?;
    // llama.cpp reads the file as bytes into a std::string; invalid UTF-8 would tokenize as
    // byte tokens there. Our tokenizer takes &str, so such a file is refused rather than altered.
    let text =
        String::from_utf8(bytes).map_err(|e| CliError::msg(format!("{}: not UTF-8 text ({e})", file.display())))?;
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
            file.display(),
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
    // --kl-divergence-base without --kl-divergence: write the base file.
    let mut base = match &args.kl_divergence_base {
        Some(p) => {
            let f = std::fs::File::create(p).map_err(|e| CliError::msg(format!("{}: {e}", p.display())))?;
            eprintln!("perplexity: saving all logits to {}", p.display());
            Some(BaseWriter::new(
                std::io::BufWriter::new(f),
                n_ctx,
                model.config().n_vocab,
                n_chunk,
                &tokens,
            )?)
        }
        None => None,
    };
    let report = perplexity_observed(
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
        |_, logits| base.as_mut().map_or(Ok(()), |w| w.chunk(logits)),
    )?;
    if let Some(w) = base {
        w.finish()?;
    }
    if let Some(e) = write_err {
        return Err(CliError::msg(format!("cannot write the result: {e}")));
    }
    writeln!(out)
        .and_then(|_| writeln!(out, "Final estimate: PPL = {:.4} +/- {:.5}", report.ppl, report.ppl_err))
        .map_err(|e| CliError::msg(format!("cannot write the result: {e}")))
}

/// `--kl-divergence`: the base file's text (its tokens) through this model,
/// each scored position's probabilities compared with the base's, printed
/// as llama-perplexity prints them.
fn kl_divergence(args: &PerplexityArgs) -> Result<(), CliError> {
    let base_path = args
        .kl_divergence_base
        .as_ref()
        .ok_or_else(|| CliError::msg("--kl-divergence needs --kl-divergence-base FILE"))?;
    let f = std::fs::File::open(base_path).map_err(|e| CliError::msg(format!("{}: {e}", base_path.display())))?;
    let mut base = BaseReader::new(std::io::BufReader::new(f))
        .map_err(|e| CliError::msg(format!("{}: {e}", base_path.display())))?;
    let batching = Batching {
        n_batch: args.batch_size,
        n_ubatch: args.ubatch_size,
    };
    let path = loader::prepare(&args.model)?;
    let (model, load_time) = loader::load(&path, &args.model)?;
    eprintln!("kl-divergence: model loaded in {:.2} s", load_time.as_secs_f64());
    let n_vocab = model.config().n_vocab;
    if base.n_vocab != n_vocab {
        return Err(CliError::msg(format!(
            "{}: inconsistent vocabulary ({} in the file, {n_vocab} in the model)",
            base_path.display(),
            base.n_vocab
        )));
    }
    let (n_ctx, n_chunk) = (base.n_ctx, base.n_chunk);
    eprintln!("kl-divergence: computing over {n_chunk} chunks, n_ctx={n_ctx}");
    let tokens = base.tokens.clone();
    let first = n_ctx / 2;
    let scored = n_ctx - 1 - first;
    let record = rustorch_llm::kld::record_len(n_vocab);
    let flash = args.model.flash_attn != crate::cli::FlashAttn::Off;
    let mut kld = KlDivergence::default();
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "chunk             PPL               ln(PPL(Q)/PPL(base))          KL Divergence              Δp RMS            Same top p"
    )
    .map_err(|e| CliError::msg(format!("cannot write the result: {e}")))?;
    let mut write_err = None;
    perplexity_observed(
        &model,
        &tokens,
        n_ctx,
        Some(n_chunk),
        flash,
        batching,
        |_, _, _| {},
        |i, logits| {
            let records = base.next_chunk(scored)?;
            let chunk = &tokens[i * n_ctx..(i + 1) * n_ctx];
            for (p, row) in logits.chunks_exact(n_vocab).enumerate() {
                kld.add(
                    row,
                    &records[p * record..(p + 1) * record],
                    chunk[first + p + 1] as usize,
                );
            }
            if let Err(e) = writeln!(out, "{}", kld.chunk_line(i + 1)).and_then(|_| out.flush()) {
                write_err.get_or_insert(e);
            }
            Ok(())
        },
    )
    .map_err(|e| CliError::msg(format!("{}: {e}", base_path.display())))?;
    if let Some(e) = write_err {
        return Err(CliError::msg(format!("cannot write the result: {e}")));
    }
    writeln!(out)
        .and_then(|_| write!(out, "{}", kld.summary()))
        .map_err(|e| CliError::msg(format!("cannot write the result: {e}")))
}
