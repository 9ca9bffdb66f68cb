//! Chat templates: a conversation rendered to the prompt text a model was trained on.
//!
//! A [`ChatTemplate`] is the Jinja2 template a GGUF file carries in `tokenizer.chat_template`
//! (or one the user gives), rendered with minijinja in an environment set up as Hugging Face's
//! `apply_chat_template` and llama.cpp's Jinja path set theirs up:
//!
//! - variables `messages` (maps with `role` and `content`), `add_generation_prompt`,
//!   `bos_token`, `eos_token`, `tools` (`none` unless given) and any extra context;
//! - functions `raise_exception(msg)` (the render fails with `msg`) and `strftime_now(fmt)`
//!   (UTC, see [`ChatTemplate::with_clock`] for a fixed time);
//! - `trim_blocks` and `lstrip_blocks` on, as in HF's environment, and `{% break %}`/`{% continue %}`;
//! - Python's string, dict and list methods (`strip`, `startswith`, `split`, `items`, ...) from
//!   minijinja-contrib's pycompat, and `tojson` as HF defines it (Python's `json.dumps`, see
//!   `pyjson`).
//!
//! The environment is sandboxed: it has no loader, so `{% include %}`/`{% import %}` of anything
//! but the template itself fails, and a template's work is bounded by fuel and a recursion limit.
//!
//! A model with no template gets llama.cpp's ChatML fallback ([`TemplateOrigin::FallbackChatml`]),
//! which callers can report.
//!
//! [`ChatTemplate::render`] is the template's own output (what Jinja2 gives, checked against it
//! in tests/chat_llamacpp.rs); [`ChatTemplate::render_prompt`] is the text llama.cpp tokenizes,
//! without a leading BOS text when the tokenizer adds BOS itself.
//!
//! Known differences from Python's Jinja2: `trim`/`strip` use Unicode White_Space, which lacks
//! the separators U+001C..U+001F that Python's `str.strip` also removes; `strftime_now` formats
//! UTC where Python uses the local zone; llama-cpp-python also passes `functions`,
//! `function_call` and `tool_choice` (as `None`), which are undefined here unless given as
//! extra context.
//!
//! ```
//! use rustorch_llm::chat::{ChatTemplate, Message};
//!
//! let tmpl = ChatTemplate::new(
//!     "{% for m in messages %}<|{{ m.role }}|>{{ m.content | trim }}\n{% endfor %}\
//!      {% if add_generation_prompt %}<|assistant|>{% endif %}",
//!     "<s>",
//!     "</s>",
//! )?;
//! let prompt = tmpl.render(&[Message::system("Be brief."), Message::user(" Hi ")], true)?;
//! assert_eq!(prompt, "<|system|>Be brief.\n<|user|>Hi\n<|assistant|>");
//! # Ok::<(), rustorch_llm::LlmError>(())
//! ```

mod pyjson;
mod strftime;

pub use pyjson::py_float_repr;

use crate::error::{LlmError, Result};
use minijinja::value::Value;
use minijinja::{Environment, Error as JinjaError, ErrorKind};
use rustorch::gguf::{Array, Gguf, Metadata, Value as GgufValue};
use std::fmt;
use std::time::SystemTime;

/// llama.cpp's fallback for models without a template (`CHATML_TEMPLATE_SRC` in common/chat.cpp).
pub const CHATML_TEMPLATE: &str = "{%- for message in messages -%}\n  {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' -}}\n{%- endfor -%}\n{%- if add_generation_prompt -%}\n  {{- '<|im_start|>assistant\n' -}}\n{%- endif -%}";

/// The metadata key of a GGUF model's default chat template.
pub const CHAT_TEMPLATE_KEY: &str = "tokenizer.chat_template";

/// Instructions a template may execute per render. Real templates use a few thousand per
/// message; this bounds a hostile one (`range(10**5)` nested) to well under a second.
const FUEL: u64 = 20_000_000;
/// Nesting depth of macro calls and includes. Real templates nest a handful of levels.
const RECURSION_LIMIT: usize = 64;
/// The name templates are registered under; it appears in error locations.
const TEMPLATE_NAME: &str = "chat_template";

/// One turn of a conversation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Message {
    /// `system`, `user`, `assistant`, `tool`... (templates decide which they accept).
    pub role: String,
    pub content: String,
}

impl Message {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Message {
        Message {
            role: role.into(),
            content: content.into(),
        }
    }
    pub fn system(content: impl Into<String>) -> Message {
        Message::new("system", content)
    }
    pub fn user(content: impl Into<String>) -> Message {
        Message::new("user", content)
    }
    pub fn assistant(content: impl Into<String>) -> Message {
        Message::new("assistant", content)
    }
}

/// Where a [`ChatTemplate`]'s source came from (named in errors).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TemplateOrigin {
    /// A GGUF metadata key (`tokenizer.chat_template`, or `tokenizer.chat_template.tool_use`
    /// when only that one exists, as llama.cpp falls back to it).
    Gguf(String),
    /// A template string the user gave.
    Override,
    /// The model has no template: llama.cpp's ChatML fallback.
    FallbackChatml,
}

impl fmt::Display for TemplateOrigin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TemplateOrigin::Gguf(key) => write!(f, "GGUF metadata {key}"),
            TemplateOrigin::Override => f.write_str("user-supplied template"),
            TemplateOrigin::FallbackChatml => f.write_str("ChatML fallback (the model has no tokenizer.chat_template)"),
        }
    }
}

/// Options of [`ChatTemplate::render_with`].
#[derive(Clone, Debug, Default)]
pub struct RenderOptions {
    /// End with the header of an assistant turn, for the model to complete.
    pub add_generation_prompt: bool,
    /// Tool descriptions (a JSON array), passed as `tools`; `none` when absent.
    pub tools: Option<serde_json::Value>,
    /// More template variables (`date_string`, `enable_thinking`...); they replace defaults.
    pub extra_context: serde_json::Map<String, serde_json::Value>,
}

/// A compiled chat template with the special-token texts it refers to.
pub struct ChatTemplate {
    source: String,
    origin: TemplateOrigin,
    bos_token: String,
    eos_token: String,
    add_bos: bool,
    add_eos: bool,
    env: Environment<'static>,
}

impl fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("origin", &self.origin)
            .field("bos_token", &self.bos_token)
            .field("eos_token", &self.eos_token)
            .field("add_bos", &self.add_bos)
            .field("add_eos", &self.add_eos)
            .field("source_len", &self.source.len())
            .finish()
    }
}

fn template_error(origin: &TemplateOrigin, e: &JinjaError) -> LlmError {
    // minijinja's Display names the kind, the detail and the location ("(in chat_template:3)");
    // its source chain (a filter's underlying error) is appended when present.
    let mut message = e.to_string();
    let mut src = std::error::Error::source(e);
    while let Some(s) = src {
        message.push_str(": ");
        message.push_str(&s.to_string());
        src = s.source();
    }
    LlmError::ChatTemplate {
        origin: origin.to_string(),
        message,
    }
}

fn build_env(source: &str, clock: Option<SystemTime>) -> std::result::Result<Environment<'static>, JinjaError> {
    // Environment::new has the builtin filters and tests and no loader: nothing outside the
    // template can be read.
    let mut env = Environment::new();
    env.set_syntax(
        minijinja::syntax::SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()?,
    );
    env.set_fuel(Some(FUEL));
    env.set_recursion_limit(RECURSION_LIMIT);
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.add_function(
        "raise_exception",
        |msg: String| -> std::result::Result<Value, JinjaError> {
            Err(JinjaError::new(
                ErrorKind::InvalidOperation,
                format!("raise_exception: {msg}"),
            ))
        },
    );
    env.add_function(
        "strftime_now",
        move |format: String| -> std::result::Result<String, JinjaError> {
            strftime::strftime(&format, clock.unwrap_or_else(SystemTime::now))
                .map_err(|e| JinjaError::new(ErrorKind::InvalidOperation, format!("strftime_now: {e}")))
        },
    );
    env.add_filter("tojson", pyjson::tojson);
    env.add_template_owned(TEMPLATE_NAME, source.to_string())?;
    Ok(env)
}

/// The text of token `key`'s id (`tokenizer.ggml.bos_token_id`...), `""` when absent, as
/// llama.cpp passes an empty string for a missing special token.
fn special_token_text(md: &Metadata, key: &str) -> Result<String> {
    let Ok(id) = md.get(key) else {
        return Ok(String::new());
    };
    let id = id.as_u64_lossless().ok_or_else(|| LlmError::BadMetadata {
        key: key.into(),
        reason: format!("expected an integer token id, found {}", id.type_desc()),
    })?;
    let Ok(GgufValue::Array(Array::String(tokens))) = md.get("tokenizer.ggml.tokens") else {
        return Ok(String::new());
    };
    usize::try_from(id)
        .ok()
        .and_then(|i| tokens.get(i))
        .cloned()
        .ok_or_else(|| LlmError::BadMetadata {
            key: key.into(),
            reason: format!("token id {id} is outside the vocabulary of {} tokens", tokens.len()),
        })
}

fn metadata_bool(md: &Metadata, key: &str, default: bool) -> bool {
    match md.get(key) {
        Ok(GgufValue::Bool(b)) => *b,
        _ => default,
    }
}

fn json_to_value(v: &serde_json::Value) -> Value {
    match v {
        serde_json::Value::Null => Value::from(()),
        serde_json::Value::Bool(b) => Value::from(*b),
        serde_json::Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                Value::from(i)
            } else if let Some(u) = n.as_u64() {
                Value::from(u)
            } else {
                Value::from(n.as_f64().unwrap_or(f64::NAN))
            }
        }
        serde_json::Value::String(s) => Value::from(s.as_str()),
        serde_json::Value::Array(a) => a.iter().map(json_to_value).collect(),
        serde_json::Value::Object(o) => {
            Value::from_pairs(o.iter().map(|(k, v)| (Value::from(k.as_str()), json_to_value(v))))
        }
    }
}

impl ChatTemplate {
    /// A template from source text, with the BOS/EOS texts it may print.
    /// `"chatml"` selects llama.cpp's ChatML template, as llama.cpp's `--chat-template chatml`.
    pub fn new(source: &str, bos_token: &str, eos_token: &str) -> Result<ChatTemplate> {
        let (source, origin) = if source == "chatml" {
            (CHATML_TEMPLATE, TemplateOrigin::FallbackChatml)
        } else {
            (source, TemplateOrigin::Override)
        };
        ChatTemplate::with_origin(source, origin, bos_token, eos_token)
    }

    /// llama.cpp's ChatML fallback.
    pub fn chatml(bos_token: &str, eos_token: &str) -> ChatTemplate {
        ChatTemplate::with_origin(CHATML_TEMPLATE, TemplateOrigin::FallbackChatml, bos_token, eos_token)
            .expect("the built-in ChatML template compiles (tested)")
    }

    fn with_origin(source: &str, origin: TemplateOrigin, bos_token: &str, eos_token: &str) -> Result<ChatTemplate> {
        let env = build_env(source, None).map_err(|e| template_error(&origin, &e))?;
        Ok(ChatTemplate {
            source: source.to_string(),
            origin,
            bos_token: bos_token.to_string(),
            eos_token: eos_token.to_string(),
            add_bos: false,
            add_eos: false,
            env,
        })
    }

    /// The template of a GGUF model (see [`ChatTemplate::from_metadata`]).
    pub fn from_gguf(gguf: &Gguf, override_source: Option<&str>) -> Result<ChatTemplate> {
        ChatTemplate::from_metadata(gguf.metadata(), override_source)
    }

    /// The template for a model: `override_source` if given, else `tokenizer.chat_template`,
    /// else `tokenizer.chat_template.tool_use`, else ChatML ([`TemplateOrigin::FallbackChatml`]),
    /// as llama.cpp's `common_chat_templates_init` chooses. `bos_token`/`eos_token` are the
    /// texts of the vocabulary's BOS/EOS tokens, and `tokenizer.ggml.add_bos_token` /
    /// `add_eos_token` decide what [`ChatTemplate::render_prompt`] strips.
    pub fn from_metadata(md: &Metadata, override_source: Option<&str>) -> Result<ChatTemplate> {
        let bos = special_token_text(md, "tokenizer.ggml.bos_token_id")?;
        let eos = special_token_text(md, "tokenizer.ggml.eos_token_id")?;
        let mut tmpl = match override_source {
            Some(src) => ChatTemplate::new(src, &bos, &eos)?,
            None => {
                let tool_use_key = format!("{CHAT_TEMPLATE_KEY}.tool_use");
                let found = [CHAT_TEMPLATE_KEY, tool_use_key.as_str()]
                    .into_iter()
                    .find_map(|key| match md.get(key) {
                        Ok(GgufValue::String(s)) if !s.is_empty() => Some(Ok((key, s))),
                        Ok(GgufValue::String(_)) | Err(_) => None,
                        Ok(other) => Some(Err(LlmError::BadMetadata {
                            key: key.into(),
                            reason: format!("expected a string, found {}", other.type_desc()),
                        })),
                    });
                match found.transpose()? {
                    // llama.cpp treats the name "chatml" in metadata as the built-in template.
                    Some((_, s)) if s == "chatml" => ChatTemplate::chatml(&bos, &eos),
                    Some((key, s)) => ChatTemplate::with_origin(s, TemplateOrigin::Gguf(key.into()), &bos, &eos)?,
                    None => ChatTemplate::chatml(&bos, &eos),
                }
            }
        };
        tmpl.add_bos = metadata_bool(md, "tokenizer.ggml.add_bos_token", false);
        tmpl.add_eos = metadata_bool(md, "tokenizer.ggml.add_eos_token", false);
        Ok(tmpl)
    }

    /// Whether the tokenizer adds BOS/EOS itself, so [`ChatTemplate::render_prompt`] strips a
    /// template-printed leading BOS / trailing EOS text (set from metadata by `from_metadata`).
    pub fn with_special_tokens_added(mut self, add_bos: bool, add_eos: bool) -> ChatTemplate {
        self.add_bos = add_bos;
        self.add_eos = add_eos;
        self
    }

    /// Fixes the time `strftime_now` reports (reproducible prompts, tests).
    pub fn with_clock(mut self, now: SystemTime) -> ChatTemplate {
        self.env = build_env(&self.source, Some(now)).expect("the template compiled before with the same source");
        self
    }

    pub fn source(&self) -> &str {
        &self.source
    }
    pub fn origin(&self) -> &TemplateOrigin {
        &self.origin
    }
    /// Whether this is the ChatML fallback of a model without a template.
    pub fn is_fallback(&self) -> bool {
        self.origin == TemplateOrigin::FallbackChatml
    }
    pub fn bos_token(&self) -> &str {
        &self.bos_token
    }
    pub fn eos_token(&self) -> &str {
        &self.eos_token
    }

    /// The template's output for `messages`, exactly as Jinja2 renders it (HF's
    /// `apply_chat_template(..., tokenize=False)`).
    pub fn render(&self, messages: &[Message], add_generation_prompt: bool) -> Result<String> {
        self.render_with(
            messages,
            &RenderOptions {
                add_generation_prompt,
                ..RenderOptions::default()
            },
        )
    }

    /// [`ChatTemplate::render`] with tools and extra variables.
    pub fn render_with(&self, messages: &[Message], opts: &RenderOptions) -> Result<String> {
        let msgs: Value = messages
            .iter()
            .map(|m| {
                Value::from_pairs([
                    ("role", Value::from(m.role.as_str())),
                    ("content", Value::from(m.content.as_str())),
                ])
            })
            .collect();
        let mut ctx: Vec<(String, Value)> = vec![
            ("messages".into(), msgs),
            ("add_generation_prompt".into(), Value::from(opts.add_generation_prompt)),
            ("bos_token".into(), Value::from(self.bos_token.as_str())),
            ("eos_token".into(), Value::from(self.eos_token.as_str())),
            (
                "tools".into(),
                opts.tools.as_ref().map_or(Value::from(()), json_to_value),
            ),
        ];
        for (k, v) in &opts.extra_context {
            match ctx.iter_mut().find(|(name, _)| name == k) {
                Some(slot) => slot.1 = json_to_value(v),
                None => ctx.push((k.clone(), json_to_value(v))),
            }
        }
        let tmpl = self
            .env
            .get_template(TEMPLATE_NAME)
            .map_err(|e| template_error(&self.origin, &e))?;
        tmpl.render(Value::from_pairs(ctx))
            .map_err(|e| template_error(&self.origin, &e))
    }

    /// The prompt text to tokenize, as llama.cpp's `common_chat_templates_apply` gives it:
    /// [`ChatTemplate::render`], less a leading BOS text when the tokenizer adds BOS itself and a
    /// trailing EOS text when it adds EOS (so neither is doubled).
    pub fn render_prompt(&self, messages: &[Message], add_generation_prompt: bool) -> Result<String> {
        let mut text = self.render(messages, add_generation_prompt)?;
        if self.add_bos && !self.bos_token.is_empty() && text.starts_with(&self.bos_token) {
            text.drain(..self.bos_token.len());
        }
        if self.add_eos && !self.eos_token.is_empty() && text.ends_with(&self.eos_token) {
            text.truncate(text.len() - self.eos_token.len());
        }
        Ok(text)
    }
}

#[cfg(test)]
mod tests;
