//! The default command: `rustorch-cli -m MODEL -p PROMPT` streams a
//! continuation to stdout and prints a timing summary to stderr.

use crate::cli::GenerateArgs;
use crate::error::CliError;
use indicatif::{ProgressBar, ProgressStyle};
use rustorch_core::Executor;
use rustorch_llm::chat::{ChatTemplate, Message};
use rustorch_llm::{Model, Sampler, SamplerConfig, StopMatcher};
use std::io::Write;
use std::time::Instant;

/// Context used when `-c` is not given (capped by the model's own).
const DEFAULT_CTX: usize = 4096;

pub fn run(args: &GenerateArgs) -> Result<(), CliError> {
    let Some(path) = &args.model else {
        return Err(CliError::msg(
            "no model given: pass -m MODEL.gguf (for the default SmolLM2 model run \
             `python3 tools/fetch_models.py --print-env` and use $RUSTORCH_SMOLLM2_GGUF)",
        ));
    };
    let Some(prompt) = &args.prompt else {
        return Err(CliError::msg("no prompt given: pass -p PROMPT"));
    };
    match args.backend.as_str() {
        "cpu" | "auto" => {}
        b @ ("cuda" | "metal" | "vulkan" | "opencl") => {
            return Err(CliError::msg(format!(
                "backend '{b}' is not compiled into this build of rustorch-cli (compiled in: cpu)"
            )))
        }
        other => {
            return Err(CliError::msg(format!(
                "unknown backend '{other}'; choose cpu, cuda, metal, vulkan, opencl or auto"
            )))
        }
    }
    if !path.exists() {
        return Err(CliError::msg(format!("{}: no such file", path.display())));
    }
    if let Some(t) = args.threads {
        // Fails only if the global pool already exists, which it does not here.
        rayon::ThreadPoolBuilder::new()
            .num_threads(t.max(1))
            .build_global()
            .map_err(|e| CliError::msg(format!("cannot set {t} threads: {e}")))?;
    }

    let start = Instant::now();
    let bar = ProgressBar::new(1);
    bar.set_style(
        ProgressStyle::with_template("loading {bar:30} {pos}/{len} layers {elapsed}")
            .expect("the template is a valid indicatif template"),
    );
    let exec = Executor::global();
    let model = Model::load_with(path, &exec, |done, total| {
        bar.set_length(total as u64);
        bar.set_position(done as u64);
    })
    .map_err(|e| CliError::msg(format!("{}: {e}", path.display())))?;
    bar.finish_and_clear();
    let load_time = start.elapsed();
    if args.backend == "auto" {
        eprintln!("backend: auto picked cpu (no GPU backend is compiled in)");
    }

    let tok = model.tokenizer();
    let text = if args.chat || args.chat_template.is_some() {
        let source = args
            .chat_template
            .as_deref()
            .or(model.chat_template())
            .unwrap_or("chatml");
        let piece = |id: Option<u32>| id.and_then(|i| tok.token_text(i)).unwrap_or("").to_string();
        let template = ChatTemplate::new(source, &piece(tok.bos()), &piece(tok.eos()))?
            .with_special_tokens_added(tok.add_bos(), tok.add_eos());
        template.render_prompt(&[Message::user(prompt.as_str())], true)?
    } else {
        prompt.clone()
    };
    let tokens = tok.encode(&text, true, true);
    if tokens.is_empty() {
        return Err(CliError::msg("the prompt is empty after tokenization"));
    }
    let n_ctx = args
        .ctx_size
        .unwrap_or_else(|| DEFAULT_CTX.min(model.config().n_ctx_train.max(1)));
    if tokens.len() >= n_ctx {
        return Err(CliError::msg(format!(
            "the prompt has {} tokens, which does not fit a context of {n_ctx} (raise -c)",
            tokens.len()
        )));
    }
    let mut sampler = Sampler::new(SamplerConfig {
        temperature: args.temp,
        top_k: args.top_k,
        top_p: args.top_p,
        min_p: args.min_p,
        repeat_penalty: args.repeat_penalty,
        seed: args.seed,
        ..SamplerConfig::default()
    })?;
    let mut cache = model.new_cache(n_ctx)?;
    if args.verbose {
        exec.clear_trace();
    }

    let t_prompt = Instant::now();
    let mut logits = model.forward_last(&mut cache, &tokens)?;
    let prompt_time = t_prompt.elapsed();

    let mut stops = StopMatcher::new(&args.stop)?;
    let mut history = tokens.clone();
    let mut out = std::io::stdout().lock();
    let mut pending: Vec<u8> = Vec::new();
    let t_gen = Instant::now();
    let mut generated = 0usize;
    let budget = args.n_predict.min(n_ctx - tokens.len());
    while generated < budget {
        let next = sampler.sample(&logits, &history)?;
        generated += 1;
        if tok.is_eog(next) {
            break;
        }
        history.push(next);
        pending.extend_from_slice(tok.token_to_piece(next));
        // Print whole UTF-8 characters only; a character may span tokens.
        let valid = match std::str::from_utf8(&pending) {
            Ok(s) => s.len(),
            Err(e) => e.valid_up_to(),
        };
        let piece: String = String::from_utf8_lossy(&pending[..valid]).into_owned();
        pending.drain(..valid);
        let o = stops.push(&piece);
        write!(out, "{}", o.text)
            .and_then(|_| out.flush())
            .map_err(|e| CliError::msg(e.to_string()))?;
        if o.stopped || generated == budget {
            break;
        }
        logits = model.forward_last(&mut cache, &[next])?;
    }
    let rest = stops.finish();
    writeln!(out, "{rest}").map_err(|e| CliError::msg(e.to_string()))?;
    let gen_time = t_gen.elapsed();

    let per_s = |n: usize, d: std::time::Duration| n as f64 / d.as_secs_f64().max(1e-9);
    eprintln!(
        "\nload {:.2} s | prompt {} tokens, {:.1} tokens/s | generation {} tokens, {:.1} tokens/s | seed {}",
        load_time.as_secs_f64(),
        tokens.len(),
        per_s(tokens.len(), prompt_time),
        generated,
        per_s(generated, gen_time),
        sampler.seed()
    );
    if args.verbose {
        eprintln!("{}", exec.trace_table());
    }
    Ok(())
}
