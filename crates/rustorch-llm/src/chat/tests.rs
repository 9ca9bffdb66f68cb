//! Behaviour of the environment itself; renderings of real templates are checked against
//! llama.cpp and Jinja2 in tests/chat_llamacpp.rs.

use super::*;
use rustorch::gguf::GgufWriter;
use std::time::{Duration, UNIX_EPOCH};

fn render(src: &str, msgs: &[Message], gen: bool) -> Result<String> {
    ChatTemplate::new(src, "<s>", "</s>")?.render(msgs, gen)
}

#[test]
fn chatml_fallback_matches_llamacpp_chatml() {
    // llama.cpp's heuristic chatml formatter (llm_chat_apply_template) writes exactly this.
    let t = ChatTemplate::chatml("", "");
    let msgs = [
        Message::system("S"),
        Message::user("hi"),
        Message::assistant("yo"),
        Message::user("ok?"),
    ];
    let mut want = String::new();
    for m in &msgs {
        want += &format!("<|im_start|>{}\n{}<|im_end|>\n", m.role, m.content);
    }
    assert_eq!(t.render(&msgs, false).unwrap(), want);
    assert_eq!(t.render(&msgs, true).unwrap(), want + "<|im_start|>assistant\n");
    assert!(t.is_fallback());
    assert!(ChatTemplate::new("chatml", "", "").unwrap().is_fallback());
}

#[test]
fn metadata_template_fallback_and_special_tokens() {
    let mut w = GgufWriter::new();
    w.add_metadata(
        "tokenizer.ggml.tokens",
        Array::String(vec!["<unk>".into(), "<s>".into(), "</s>".into()]),
    )
    .unwrap();
    w.add_metadata("tokenizer.ggml.bos_token_id", 1u32).unwrap();
    w.add_metadata("tokenizer.ggml.eos_token_id", 2u32).unwrap();
    w.add_metadata("tokenizer.ggml.add_bos_token", true).unwrap();
    let t = ChatTemplate::from_metadata(w.metadata(), None).unwrap();
    assert!(t.is_fallback());
    assert_eq!(
        t.origin().to_string(),
        "ChatML fallback (the model has no tokenizer.chat_template)"
    );
    assert_eq!((t.bos_token(), t.eos_token()), ("<s>", "</s>"));

    w.add_metadata(
        CHAT_TEMPLATE_KEY,
        "{{ bos_token }}[{{ messages[0].content }}]{{ eos_token }}".to_string(),
    )
    .unwrap();
    let t = ChatTemplate::from_metadata(w.metadata(), None).unwrap();
    assert_eq!(t.origin(), &TemplateOrigin::Gguf(CHAT_TEMPLATE_KEY.into()));
    let msgs = [Message::user("x")];
    assert_eq!(t.render(&msgs, false).unwrap(), "<s>[x]</s>");
    // The tokenizer adds BOS (add_bos_token) but not EOS: only the BOS text is stripped.
    assert_eq!(t.render_prompt(&msgs, false).unwrap(), "[x]</s>");
    let t = t.with_special_tokens_added(true, true);
    assert_eq!(t.render_prompt(&msgs, false).unwrap(), "[x]");

    let t = ChatTemplate::from_metadata(w.metadata(), Some("{{ messages | length }}")).unwrap();
    assert_eq!(t.origin(), &TemplateOrigin::Override);
    assert_eq!(t.render(&msgs, false).unwrap(), "1");

    let mut w = GgufWriter::new();
    w.add_metadata("tokenizer.ggml.tokens", Array::String(vec!["a".into()]))
        .unwrap();
    w.add_metadata("tokenizer.ggml.bos_token_id", 7u32).unwrap();
    let err = ChatTemplate::from_metadata(w.metadata(), None).unwrap_err().to_string();
    assert!(
        err.contains("tokenizer.ggml.bos_token_id") && err.contains("7"),
        "{err}"
    );
}

#[test]
fn parse_errors_name_origin_and_line() {
    let err = ChatTemplate::new("line1\n{% for m in messages %}{{ m.role }", "", "").unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.starts_with("chat template (user-supplied template): syntax error"),
        "{msg}"
    );
    assert!(msg.contains("chat_template:2"), "{msg}");
}

#[test]
fn raise_exception_fails_the_render_with_its_message() {
    let src = "{% if messages[0].role == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}ok";
    assert_eq!(render(src, &[Message::user("a")], false).unwrap(), "ok");
    let msg = render(src, &[Message::system("a")], false).unwrap_err().to_string();
    assert!(msg.contains("raise_exception: System role not supported"), "{msg}");
}

#[test]
fn python_string_methods_and_loop_controls() {
    let src = "{% for m in messages %}{% if m.content.startswith('skip') %}{% continue %}{% endif %}\
               {{ m.content.strip().split(',') | join('|') }};{{ m.role.upper() }};\
               {% if loop.index >= 2 %}{% break %}{% endif %}{% endfor %}";
    let msgs = [
        Message::user(" a,b "),
        Message::user("skip me"),
        Message::assistant("c,d"),
        Message::user("e"),
    ];
    // Expected: Jinja2 (trim_blocks, lstrip_blocks, loopcontrols) on the same input.
    assert_eq!(render(src, &msgs, false).unwrap(), "a|b;USER;c|d;ASSISTANT;");
    let src = "{% for m in messages %}{% if loop.index0 == 1 %}{% break %}{% endif %}{{ m.content }}{% endfor %}";
    assert_eq!(render(src, &msgs, false).unwrap(), " a,b ");
}

#[test]
fn trim_and_lstrip_blocks_as_hf() {
    // HF's environment has trim_blocks and lstrip_blocks: the newline after a block tag and the
    // indentation before one disappear; output statements keep theirs.
    let src =
        "{% for m in messages %}\n    {% if m.role == 'user' %}\n{{ m.content }}\n    {% endif %}\n{% endfor %}\n";
    assert_eq!(
        render(src, &[Message::user("a"), Message::user("b")], false).unwrap(),
        "a\nb\n"
    );
}

#[test]
fn tojson_is_python_json_dumps() {
    let t = ChatTemplate::new("{{ tools | tojson }}|{{ tools[0] | tojson(indent=2) }}", "", "").unwrap();
    let tools = serde_json::json!([{"name": "f", "args": {"x": 1.5, "y": [true, null]}, "d": "<é>"}]);
    let out = t
        .render_with(
            &[],
            &RenderOptions {
                tools: Some(tools),
                ..Default::default()
            },
        )
        .unwrap();
    // Python: json.dumps(tools, ensure_ascii=False) | json.dumps(tools[0], ensure_ascii=False, indent=2)
    assert_eq!(
        out,
        "[{\"name\": \"f\", \"args\": {\"x\": 1.5, \"y\": [true, null]}, \"d\": \"<é>\"}]|{\n  \"name\": \"f\",\n  \"args\": {\n    \"x\": 1.5,\n    \"y\": [\n      true,\n      null\n    ]\n  },\n  \"d\": \"<é>\"\n}"
    );
    // Booleans print as Python's do.
    assert_eq!(render("{{ tools is none }}", &[], false).unwrap(), "True");
}

#[test]
fn strftime_now_uses_the_clock() {
    let t = ChatTemplate::new("{{ strftime_now('%d %b %Y') }}", "", "")
        .unwrap()
        .with_clock(UNIX_EPOCH + Duration::from_secs(1_721_952_000));
    assert_eq!(t.render(&[], false).unwrap(), "26 Jul 2024");
    let live = ChatTemplate::new("{{ strftime_now('%Y') }}", "", "")
        .unwrap()
        .render(&[], false)
        .unwrap();
    assert!(live.len() == 4 && live.chars().all(|c| c.is_ascii_digit()), "{live}");
}

#[test]
fn extra_context_overrides_defaults() {
    let t = ChatTemplate::new("{{ bos_token }}{{ date_string | default('none') }}", "<s>", "").unwrap();
    let mut opts = RenderOptions::default();
    opts.extra_context.insert("date_string".into(), "1 Jan 2025".into());
    opts.extra_context.insert("bos_token".into(), "<B>".into());
    assert_eq!(t.render_with(&[], &opts).unwrap(), "<B>1 Jan 2025");
}

#[test]
fn sandbox_no_includes_and_bounded_work() {
    let msg = render("{% include 'secret.txt' %}", &[], false)
        .unwrap_err()
        .to_string();
    assert!(msg.contains("template not found"), "{msg}");
    let msg = render("{% include '/etc/passwd' %}", &[], false)
        .unwrap_err()
        .to_string();
    assert!(msg.contains("template not found"), "{msg}");
    // 10^10 iterations: fuel stops it.
    let msg = render(
        "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
        &[],
        false,
    )
    .unwrap_err()
    .to_string();
    assert!(msg.contains("fuel"), "{msg}");
    // Unbounded macro recursion: the recursion limit stops it.
    let msg = render("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", &[], false)
        .unwrap_err()
        .to_string();
    assert!(msg.contains("recursion"), "{msg}");
}
