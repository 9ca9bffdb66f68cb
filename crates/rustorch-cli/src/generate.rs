//! The default command: `rustorch-cli -m MODEL -p PROMPT` streams a
//! continuation to stdout and prints a timing summary to stderr.

use crate::cli::GenerateArgs;
use crate::error::CliError;
use crate::loader;
use crate::stream::TokenStream;
use rustorch_llm::chat::Message;
use std::io::Write;
use std::time::Instant;

pub fn run(args: &GenerateArgs) -> Result<(), CliError> {
    let Some(prompt) = &args.prompt else {
        return Err(CliError::msg(
            "no prompt given: pass -p PROMPT (and -m MODEL.gguf, or nothing for the default model)",
        ));
    };
    let path = loader::prepare(&args.model)?;
    let (model, load_time) = loader::load(&path, &args.model)?;
    let exec = model.executor().clone();

    let tok = model.tokenizer();
    let text = if args.chat || args.chat_template.is_some() {
        loader::chat_template(&model, args.chat_template.as_deref())?
            .render_prompt(&[Message::user(prompt.as_str())], true)?
    } else {
        prompt.clone()
    };
    let tokens = tok.encode(&text, true, true);
    if tokens.is_empty() {
        return Err(CliError::msg("the prompt is empty after tokenization"));
    }
    let n_ctx = loader::context_size(&model, args.ctx_size)?;
    if tokens.len() >= n_ctx {
        return Err(CliError::msg(format!(
            "the prompt has {} tokens, which does not fit a context of {n_ctx} (raise -c)",
            tokens.len()
        )));
    }
    let mut sampler = loader::sampler(&args.sampling)?;
    let mut cache = loader::new_cache(&model, args.model.flash_attn, n_ctx)?;
    if args.verbose {
        exec.clear_trace();
    }
    exec.clear_profile();

    // The whole prompt and reply in one team: its workers spin between
    // the decode steps too, instead of being woken for each (see
    // `rustorch_llm::model::Model::run_pass`).
    let (prompt_time, generated, gen_time) = model.run_pass(|| {
        let t_prompt = Instant::now();
        let mut logits = model.forward_last(&mut cache, &tokens)?;
        let prompt_time = t_prompt.elapsed();

        let mut stream = TokenStream::new(&args.sampling.stop)?;
        let mut history = tokens.clone();
        let mut out = std::io::stdout().lock();
        let t_gen = Instant::now();
        let mut generated = 0usize;
        let budget = args.n_predict.min(n_ctx - tokens.len());
        let mut ended = false;
        while generated < budget {
            let next = sampler.sample(&logits, &history)?;
            generated += 1;
            if tok.is_eog(next) {
                ended = true;
                break;
            }
            history.push(next);
            let piece = stream.push(tok, next);
            write!(out, "{}", piece.text)
                .and_then(|_| out.flush())
                .map_err(|e| CliError::msg(e.to_string()))?;
            if piece.stopped {
                ended = true;
                break;
            }
            if generated == budget {
                break;
            }
            logits = model.forward_last(&mut cache, &[next])?;
        }
        writeln!(out, "{}", stream.finish()).map_err(|e| CliError::msg(e.to_string()))?;
        if !ended && budget < args.n_predict {
            // llama.cpp stops the same way without context shifting; say so
            // rather than end as if the reply were finished.
            eprintln!("\nstopped after {generated} tokens: the context of {n_ctx} tokens is full (raise -c)");
        }
        let gen_time = t_gen.elapsed();
        Ok::<_, CliError>((prompt_time, generated, gen_time))
    })?;

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
    if exec.profiling() {
        eprintln!(
            "\nprofile (RUSTORCH_PROFILE), prompt and generation:\n{}",
            exec.profile_table(Some(prompt_time + gen_time))
        );
    }
    Ok(())
}
