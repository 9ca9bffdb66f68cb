//! `rustorch-cli greedy`: greedy continuations of many prompts, one JSON
//! line each, for differential checks against llama.cpp
//! (tools/llamacpp_diff.py runs this and tools/llamacpp_greedy.cpp, which
//! prints the same format, and compares them).
//!
//! Input: a JSON Lines file of `{"id": "...", "text": "..."}` objects (the
//! text final: any chat template already applied; BOS added as the model's
//! metadata says, special-token text parsed). Output, one line per prompt:
//!
//! ```text
//! {"id":"...","prompt_tokens":[...],"tokens":[...],"top":[[id1,logit1,id2,logit2],...]}
//! ```
//!
//! `top` holds each step's best and second-best token and their logits
//! (ties go to the lower id, as llama.cpp's greedy sampler), so a reader
//! can tell a divergence at a near-tie from a real one. Each prompt runs
//! from an empty cache as one batch, then one token per step, until an
//! end-of-generation token (kept) or `-n` tokens.

use crate::cli::GreedyArgs;
use crate::error::CliError;
use crate::loader;
use serde_json::{json, Value};
use std::io::{BufRead, Write};

pub fn run(args: &GreedyArgs) -> Result<(), CliError> {
    let file = std::fs::File::open(&args.file)
        .map_err(|e| CliError::msg(format!("cannot read {}: {e}", args.file.display())))?;
    let prompts = read_prompts(std::io::BufReader::new(file), &args.file.display().to_string())?;
    let path = loader::prepare(&args.model)?;
    let (model, _) = loader::load(&path, &args.model)?;
    let n_ctx = loader::context_size(&model, args.ctx_size)?;
    let tok = model.tokenizer();
    model.run_pass(|| {
        let mut out = std::io::stdout().lock();
        for (id, text) in &prompts {
            let prompt = tok.encode(text, true, true);
            if prompt.is_empty() {
                return Err(CliError::msg(format!("prompt {id:?} is empty after tokenization")));
            }
            if prompt.len() + args.n_predict > n_ctx {
                return Err(CliError::msg(format!(
                    "prompt {id:?} has {} tokens, which with -n {} does not fit a context of {n_ctx} (raise -c)",
                    prompt.len(),
                    args.n_predict
                )));
            }
            let mut cache = loader::new_cache(&model, args.model.flash_attn, n_ctx)?;
            let mut tokens = Vec::with_capacity(args.n_predict);
            let mut top = Vec::with_capacity(args.n_predict);
            let mut logits = model.forward_last(&mut cache, &prompt)?;
            for step in 0..args.n_predict {
                let (best, second) = top_two(&logits);
                tokens.push(best);
                top.push(json!([
                    best,
                    logits[best as usize],
                    second,
                    second.map(|s| logits[s as usize])
                ]));
                if tok.is_eog(best) || step + 1 == args.n_predict {
                    break;
                }
                logits = model.forward_last(&mut cache, &[best])?;
            }
            let line = json!({"id": id, "prompt_tokens": prompt, "tokens": tokens, "top": top});
            writeln!(out, "{line}")
                .and_then(|_| out.flush())
                .map_err(|e| CliError::msg(e.to_string()))?;
        }
        Ok(())
    })
}

/// The prompts of a JSON Lines file (blank lines skipped), as (id, text).
fn read_prompts(input: impl BufRead, name: &str) -> Result<Vec<(String, String)>, CliError> {
    let mut prompts = Vec::new();
    for (i, line) in input.lines().enumerate() {
        let line = line.map_err(|e| CliError::msg(format!("cannot read {name}: {e}")))?;
        if line.trim().is_empty() {
            continue;
        }
        let bad = |why: &str| CliError::msg(format!("{name}:{}: {why}", i + 1));
        let v: Value = serde_json::from_str(&line).map_err(|e| bad(&format!("not JSON: {e}")))?;
        let field = |k: &str| v.get(k).and_then(Value::as_str).map(str::to_string);
        let (Some(id), Some(text)) = (field("id"), field("text")) else {
            return Err(bad("expected an object with string fields \"id\" and \"text\""));
        };
        prompts.push((id, text));
    }
    if prompts.is_empty() {
        return Err(CliError::msg(format!("{name} holds no prompts")));
    }
    Ok(prompts)
}

/// The best and second-best token ids (the lower id first on ties, as an
/// argmax that keeps the first maximum).
fn top_two(logits: &[f32]) -> (u32, Option<u32>) {
    let mut best = 0usize;
    let mut second: Option<usize> = None;
    for (i, &x) in logits.iter().enumerate().skip(1) {
        if x > logits[best] {
            second = Some(best);
            best = i;
        } else if second.is_none_or(|s| x > logits[s]) {
            second = Some(i);
        }
    }
    (best as u32, second.map(|s| s as u32))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn top_two_keeps_the_lower_id_on_ties() {
        assert_eq!(top_two(&[1.0, 3.0, 3.0, 2.0]), (1, Some(2)));
        assert_eq!(top_two(&[5.0, 1.0, 4.0, 4.0]), (0, Some(2)));
        assert_eq!(top_two(&[0.0, 0.0]), (0, Some(1)));
        assert_eq!(top_two(&[7.0]), (0, None));
    }

    #[test]
    fn prompts_need_an_id_and_a_text() {
        let ok = read_prompts(
            "{\"id\":\"a\",\"text\":\"x\"}\n\n{\"id\":\"b\",\"text\":\"y\\nz\"}\n".as_bytes(),
            "p",
        );
        assert_eq!(ok.unwrap(), vec![("a".into(), "x".into()), ("b".into(), "y\nz".into())]);
        let err = read_prompts("{\"id\":\"a\"}\n".as_bytes(), "p")
            .unwrap_err()
            .to_string();
        assert!(err.contains("p:1"), "{err}");
        assert!(read_prompts("".as_bytes(), "p").is_err());
        assert!(read_prompts("nope\n".as_bytes(), "p").is_err());
    }
}
