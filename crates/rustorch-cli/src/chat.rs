//! `chat`: an interactive conversation. Each user line is added to the
//! history, the whole history is rendered with the chat template and the
//! reply streams out. The KV cache keeps the tokens of the previous turn:
//! a new prompt that starts with them (the usual case: the template only
//! appends) is computed from where they end; otherwise the cache is cut
//! back to the longest shared prefix and the rest is prefilled.
//!
//! Commands: /help, /clear, /system TEXT, /save FILE, /load FILE (the
//! messages as a JSON array of {"role", "content"}), /exit. Ctrl-C stops a
//! reply (see [`crate::interrupt`]); Ctrl-D (end of input) exits.

use crate::cli::ChatArgs;
use crate::error::CliError;
use crate::interrupt;
use crate::loader;
use crate::stream::TokenStream;
use rustorch_llm::chat::{ChatTemplate, Message};
use rustorch_llm::model::KvCache;
use rustorch_llm::{Model, Sampler};
use std::io::{BufRead, Write};
use std::path::Path;
use std::time::Instant;

const HELP: &str = "\
commands:
  /help          this list
  /clear         forget the conversation (the system prompt stays)
  /system TEXT   set the system prompt
  /save FILE     write the conversation as JSON
  /load FILE     read a conversation written by /save
  /exit          leave (so does Ctrl-D)
Ctrl-C stops a reply; at the prompt, press it twice to leave.";

struct Session<'m> {
    model: &'m Model,
    template: ChatTemplate,
    sampler: Sampler,
    cache: KvCache,
    /// The tokens the cache holds, in order.
    cached: Vec<u32>,
    messages: Vec<Message>,
    args: &'m ChatArgs,
}

pub fn run(args: &ChatArgs) -> Result<(), CliError> {
    let path = loader::prepare(&args.model)?;
    let (model, _) = loader::load(&path, &args.model)?;
    let template = loader::chat_template(&model, args.chat_template.as_deref())?;
    let n_ctx = loader::context_size(&model, args.ctx_size)?;
    let mut s = Session {
        template,
        sampler: loader::sampler(&args.sampling)?,
        cache: loader::new_cache(&model, args.model.flash_attn, n_ctx)?,
        cached: Vec::new(),
        messages: args.system.iter().map(|t| Message::system(t.as_str())).collect(),
        model: &model,
        args,
    };
    // Checked before the first prompt: a template that cannot render fails at once.
    s.template.render_prompt(&[Message::user("hi")], true)?;
    interrupt::install();
    eprintln!(
        "chat with {} ({n_ctx} tokens of context); /help lists the commands",
        path.display()
    );

    let stdin = std::io::stdin();
    let mut input = stdin.lock();
    let mut line = String::new();
    loop {
        print_flush("> ")?;
        line.clear();
        let n = input
            .read_line(&mut line)
            .map_err(|e| CliError::msg(format!("cannot read the input: {e}")))?;
        interrupt::line_read();
        if n == 0 {
            print_flush("\n")?;
            return Ok(());
        }
        let text = line.trim_end_matches(['\n', '\r']);
        if text.trim().is_empty() {
            continue;
        }
        if let Some(cmd) = text.strip_prefix('/') {
            match s.command(cmd) {
                Ok(true) => continue,
                Ok(false) => return Ok(()),
                Err(e) => {
                    eprintln!("error: {e}");
                    continue;
                }
            }
        }
        s.messages.push(Message::user(text));
        match s.reply() {
            Ok(reply) => s.messages.push(Message::assistant(reply)),
            Err(e) => {
                // The turn did not happen: drop the message so that the history stays valid.
                s.messages.pop();
                eprintln!("error: {e}");
            }
        }
    }
}

fn print_flush(text: &str) -> Result<(), CliError> {
    let mut out = std::io::stdout().lock();
    write!(out, "{text}")
        .and_then(|_| out.flush())
        .map_err(|e| CliError::msg(format!("cannot write the output: {e}")))
}

impl Session<'_> {
    /// Runs a slash command; false means leave.
    fn command(&mut self, cmd: &str) -> Result<bool, CliError> {
        let (name, arg) = match cmd.split_once(char::is_whitespace) {
            Some((n, a)) => (n, a.trim()),
            None => (cmd, ""),
        };
        match name {
            "help" => println!("{HELP}"),
            "exit" | "quit" => return Ok(false),
            "clear" => {
                self.messages.retain(|m| m.role == "system");
                self.reset_cache();
                println!("(conversation cleared)");
            }
            "system" => {
                if arg.is_empty() {
                    return Err(CliError::msg("/system needs the prompt text: /system TEXT"));
                }
                self.messages.retain(|m| m.role != "system");
                self.messages.insert(0, Message::system(arg));
                println!("(system prompt set)");
            }
            "save" => {
                if arg.is_empty() {
                    return Err(CliError::msg("/save needs a file name: /save FILE"));
                }
                save(Path::new(arg), &self.messages)?;
                println!("(saved {} messages to {arg})", self.messages.len());
            }
            "load" => {
                if arg.is_empty() {
                    return Err(CliError::msg("/load needs a file name: /load FILE"));
                }
                self.messages = load(Path::new(arg))?;
                // Checked now rather than at the next reply.
                self.template.render_prompt(&self.messages, true)?;
                println!("(loaded {} messages from {arg})", self.messages.len());
            }
            other => {
                return Err(CliError::msg(format!(
                    "unknown command /{other}; /help lists the commands"
                )))
            }
        }
        Ok(true)
    }

    fn reset_cache(&mut self) {
        self.cache.clear();
        self.cached.clear();
    }

    /// Renders the history, brings the cache up to date and streams the
    /// reply; returns its text.
    fn reply(&mut self) -> Result<String, CliError> {
        let tok = self.model.tokenizer();
        let text = self.template.render_prompt(&self.messages, true)?;
        let tokens = tok.encode(&text, true, true);
        let n_ctx = self.cache.n_ctx();
        if tokens.len() >= n_ctx {
            return Err(CliError::msg(format!(
                "the conversation has {} tokens, which does not fit a context of {n_ctx}; /clear it or raise -c",
                tokens.len()
            )));
        }
        // Reuse the longest shared prefix; at least one token must run to give logits.
        let mut keep = self.cached.iter().zip(&tokens).take_while(|(a, b)| a == b).count();
        keep = keep.min(tokens.len() - 1);
        self.cache.truncate(keep);
        self.cached.truncate(keep);

        interrupt::begin_reply();
        // One team for the whole reply: its workers spin between the decode
        // steps instead of being woken for each (`Model::run_pass`).
        let model = self.model;
        let result = model.run_pass(|| self.stream_reply(&tokens, keep));
        interrupt::end_reply();
        result
    }

    fn stream_reply(&mut self, tokens: &[u32], keep: usize) -> Result<String, CliError> {
        let tok = self.model.tokenizer();
        let t_prompt = Instant::now();
        let mut logits = self.model.forward_last(&mut self.cache, &tokens[keep..])?;
        self.cached.extend_from_slice(&tokens[keep..]);
        let prompt_time = t_prompt.elapsed();

        let mut stream = TokenStream::new(&self.args.sampling.stop)?;
        let room = self.cache.n_ctx() - tokens.len();
        let budget = self.args.n_predict.map_or(room, |n| n.min(room));
        let mut reply = String::new();
        let mut out = std::io::stdout().lock();
        let write = |out: &mut std::io::StdoutLock, s: &str| {
            write!(out, "{s}")
                .and_then(|_| out.flush())
                .map_err(|e| CliError::msg(format!("cannot write the output: {e}")))
        };
        let t_gen = Instant::now();
        let mut generated = 0;
        let mut interrupted = false;
        let mut ended = false;
        while generated < budget {
            if interrupt::stop_requested() {
                interrupted = true;
                break;
            }
            let next = self.sampler.sample(&logits, &self.cached)?;
            generated += 1;
            if tok.is_eog(next) {
                ended = true;
                break;
            }
            let piece = stream.push(tok, next);
            write(&mut out, &piece.text)?;
            reply.push_str(&piece.text);
            if piece.stopped {
                ended = true;
                break;
            }
            if generated == budget {
                break;
            }
            logits = self.model.forward_last(&mut self.cache, &[next])?;
            self.cached.push(next);
        }
        let rest = stream.finish();
        write(&mut out, &rest)?;
        reply.push_str(&rest);
        let context_full = !interrupted && !ended && budget == room;
        write(
            &mut out,
            if interrupted {
                "\n(reply stopped)\n"
            } else if context_full {
                "\n(reply stopped: the context is full; /clear it or raise -c)\n"
            } else {
                "\n"
            },
        )?;
        if self.args.verbose {
            let per_s = |n: usize, d: std::time::Duration| n as f64 / d.as_secs_f64().max(1e-9);
            eprintln!(
                "(prompt {} tokens: {keep} reused from the cache, {} computed at {:.1} tokens/s | reply {generated} tokens, {:.1} tokens/s)",
                tokens.len(),
                tokens.len() - keep,
                per_s(tokens.len() - keep, prompt_time),
                per_s(generated, t_gen.elapsed())
            );
        }
        Ok(reply)
    }
}

fn save(path: &Path, messages: &[Message]) -> Result<(), CliError> {
    let list: Vec<serde_json::Value> = messages
        .iter()
        .map(|m| serde_json::json!({"role": m.role, "content": m.content}))
        .collect();
    let text = serde_json::to_string_pretty(&list).expect("JSON values always serialize");
    std::fs::write(path, text + "\n").map_err(|e| CliError::msg(format!("{}: {e}", path.display())))
}

fn load(path: &Path) -> Result<Vec<Message>, CliError> {
    let text = std::fs::read_to_string(path).map_err(|e| CliError::msg(format!("{}: {e}", path.display())))?;
    let bad = |why: String| CliError::msg(format!("{}: {why}", path.display()));
    let value: serde_json::Value = serde_json::from_str(&text).map_err(|e| bad(format!("not JSON ({e})")))?;
    let list = value
        .as_array()
        .ok_or_else(|| bad("expected a JSON array of {\"role\", \"content\"} objects".into()))?;
    list.iter()
        .enumerate()
        .map(|(i, m)| {
            let field = |k: &str| {
                m.get(k)
                    .and_then(|v| v.as_str())
                    .ok_or_else(|| bad(format!("message {i} has no string \"{k}\"")))
            };
            Ok(Message::new(field("role")?, field("content")?))
        })
        .collect()
}
