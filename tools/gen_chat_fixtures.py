#!/usr/bin/env python3
"""Chat-template fixtures for crates/rustorch-llm/tests/chat_llamacpp.rs.

Renders conversations through two references and writes what they produced:

- llama.cpp's own C++ formatter, `llama_chat_apply_template` (low-level binding of
  llama-cpp-python 0.3.36). It is not a Jinja engine: it detects a known template family from
  the source text (chatml, gemma, llama3, llama2...) and formats by hand.
- Jinja2, through llama-cpp-python's `Jinja2ChatFormatter` (an ImmutableSandboxedEnvironment
  with trim_blocks, lstrip_blocks, loopcontrols and HF's json.dumps `tojson`, as Transformers'
  apply_chat_template), with `strftime_now` pinned to CLOCK so the output is reproducible.

Templates: SmolLM2's and the vocab texts of both models come from the cached GGUF files
(`eval "$(python3 tools/fetch_models.py --print-env)"`). The cached gemma-3-270m GGUF is the base
model and carries no tokenizer.chat_template, so Gemma 3's is the instruct models' published
template, given below as a string like the other common ones (Llama 3, Llama 3.2 from llama.cpp's
models/templates, Llama 2, Mistral v0.1, Qwen2, Qwen2.5 from models/templates, TinyLlama/Zephyr).

Usage: python3 tools/gen_chat_fixtures.py  (writes crates/rustorch-llm/tests/fixtures/chat/)
"""

import ctypes
import datetime
import json
import os
import sys
from pathlib import Path

import gguf
import llama_cpp

from cpu_record import cpu_record
from llama_cpp.llama_chat_format import Jinja2ChatFormatter

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "crates/rustorch-llm/tests/fixtures/chat"
LLAMACPP_TEMPLATES = Path("/root/.cache/rustorch/llamacpp-0.3.36/src/models/templates")
# 2024-07-26 13:05:09 UTC: what strftime_now reports in the fixtures.
CLOCK = 1_721_952_000 + 13 * 3600 + 5 * 60 + 9

GEMMA3_IT = (
    "{{ bos_token }}\n{%- if messages[0]['role'] == 'system' -%}\n    {%- if messages[0]['content'] is string -%}\n"
    "        {%- set first_user_prefix = messages[0]['content'] + '\\n\\n' -%}\n    {%- else -%}\n"
    "        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\\n\\n' -%}\n    {%- endif -%}\n"
    "    {%- set loop_messages = messages[1:] -%}\n{%- else -%}\n    {%- set first_user_prefix = \"\" -%}\n"
    "    {%- set loop_messages = messages -%}\n{%- endif -%}\n{%- for message in loop_messages -%}\n"
    "    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}\n"
    "        {{ raise_exception(\"Conversation roles must alternate user/assistant/user/assistant/...\") }}\n"
    "    {%- endif -%}\n    {%- if (message['role'] == 'assistant') -%}\n        {%- set role = \"model\" -%}\n"
    "    {%- else -%}\n        {%- set role = message['role'] -%}\n    {%- endif -%}\n"
    "    {{ '<start_of_turn>' + role + '\\n' + (first_user_prefix if loop.first else \"\") }}\n"
    "    {%- if message['content'] is string -%}\n        {{ message['content'] | trim }}\n"
    "    {%- elif message['content'] is iterable -%}\n        {%- for item in message['content'] -%}\n"
    "            {%- if item['type'] == 'image' -%}\n                {{ '<start_of_image>' }}\n"
    "            {%- elif item['type'] == 'text' -%}\n                {{ item['text'] | trim }}\n"
    "            {%- endif -%}\n        {%- endfor -%}\n    {%- else -%}\n"
    "        {{ raise_exception(\"Invalid content type\") }}\n    {%- endif -%}\n    {{ '<end_of_turn>\\n' }}\n"
    "{%- endfor -%}\n{%- if add_generation_prompt -%}\n    {{'<start_of_turn>model\\n'}}\n{%- endif -%}\n"
)

LLAMA3 = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}"
    "{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)

LLAMA2 = (
    "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}{% set system_message = messages[0]['content'] %}"
    "{% else %}{% set loop_messages = messages %}{% set system_message = false %}{% endif %}"
    "{% for message in loop_messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if loop.index0 == 0 and system_message != false %}"
    "{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}"
    "{% else %}{% set content = message['content'] %}{% endif %}"
    "{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}"
)

MISTRAL_V01 = (
    "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token}}"
    "{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}"
)

QWEN2 = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

ZEPHYR = (
    "{% for message in messages %}\n{% if message['role'] == 'user' %}\n{{ '<|user|>\n' + message['content'] + eos_token }}\n"
    "{% elif message['role'] == 'system' %}\n{{ '<|system|>\n' + message['content'] + eos_token }}\n"
    "{% elif message['role'] == 'assistant' %}\n{{ '<|assistant|>\n'  + message['content'] + eos_token }}\n"
    "{% endif %}\n{% if loop.last and add_generation_prompt %}\n{{ '<|assistant|>' }}\n{% endif %}\n{% endfor %}"
)

CONVERSATIONS = {
    "single_user": [{"role": "user", "content": "Hello!"}],
    "system_user": [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "What is the capital of France?"},
    ],
    "system_multi_turn": [
        {"role": "system", "content": "You are a concise math tutor."},
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "4."},
        {"role": "user", "content": "And 3+3?"},
    ],
    "history_no_system": [
        {"role": "user", "content": "Tell me a joke."},
        {"role": "assistant", "content": "Why did the chicken cross the road?"},
        {"role": "user", "content": "Why?"},
    ],
    "unicode_whitespace": [
        {"role": "system", "content": "Réponds en français 🙂"},
        {"role": "user", "content": "  Ça va? 日本語\tok \n"},
        {"role": "assistant", "content": "Oui — très bien!  "},
        {"role": "user", "content": "Ω≈ç√ 👍🏽 \"quotes\" {{ not jinja }}"},
    ],
}


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather in a city <with> 'quotes' & unicode: München",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string"},
                    "days": {"type": "integer", "minimum": 1, "maximum": 7.5},
                    "units": {"type": "string", "enum": ["C", "F"]},
                },
                "required": ["city"],
            },
        },
    }
]


def gguf_template_and_tokens(path):
    r = gguf.GGUFReader(path)

    def field(key):
        f = r.fields.get(key)
        if f is None:
            return None
        if f.types[0] == gguf.GGUFValueType.STRING:
            return bytes(f.parts[f.data[0]]).decode()
        return int(f.parts[f.data[0]][0])

    tokens = r.fields["tokenizer.ggml.tokens"]
    text = lambda i: bytes(tokens.parts[tokens.data[i]]).decode()
    return (
        field("tokenizer.chat_template"),
        text(field("tokenizer.ggml.bos_token_id")),
        text(field("tokenizer.ggml.eos_token_id")),
        bool(field("tokenizer.ggml.add_bos_token")),
    )


def llamacpp_apply(template, messages, add_ass):
    """llama_chat_apply_template, or None when llama.cpp does not recognize the template."""
    arr = (llama_cpp.llama_chat_message * len(messages))()
    keep = []
    for i, m in enumerate(messages):
        role, content = m["role"].encode(), m["content"].encode()
        keep += [role, content]
        arr[i].role, arr[i].content = role, content
    tmpl = template.encode()
    size = 4096
    while True:
        buf = ctypes.create_string_buffer(size)
        n = llama_cpp.llama_chat_apply_template(tmpl, arr, len(messages), add_ass, buf, size)
        if n < 0:
            return None
        if n <= size:
            return buf.raw[:n].decode()
        size = n


class PinnedClock(Jinja2ChatFormatter):
    @staticmethod
    def strftime_now(f):
        return datetime.datetime.fromtimestamp(CLOCK, datetime.timezone.utc).strftime(f)


def jinja2_apply(template, bos, eos, messages, add_gen, tools=None):
    try:
        fmt = PinnedClock(template=template, eos_token=eos, bos_token=bos, add_generation_prompt=add_gen)
        return fmt(messages=messages, tools=tools).prompt, None
    except Exception as e:  # raise_exception and template errors are part of the fixture
        return None, f"{type(e).__name__}: {e}"


def main():
    smol = os.environ.get("RUSTORCH_SMOLLM2_GGUF")
    gemma = os.environ.get("RUSTORCH_GEMMA3_GGUF")
    if not smol or not gemma:
        sys.exit('set the model paths first: eval "$(python3 tools/fetch_models.py --print-env)"')
    smol_tmpl, smol_bos, smol_eos, smol_add_bos = gguf_template_and_tokens(smol)
    gemma_tmpl, gemma_bos, gemma_eos, gemma_add_bos = gguf_template_and_tokens(gemma)
    assert smol_tmpl, "SmolLM2's GGUF should carry a chat template"
    assert gemma_tmpl is None, "the cached gemma-3-270m GGUF (base model) was expected to have no template"

    templates = [
        # (name, source, bos, eos, where it comes from)
        ("smollm2", smol_tmpl, smol_bos, smol_eos, "GGUF metadata of SmolLM2-135M-Instruct"),
        ("gemma3", GEMMA3_IT, gemma_bos, gemma_eos, "Gemma 3 instruct models' template; vocab texts of gemma-3-270m"),
        ("llama3", LLAMA3, "<|begin_of_text|>", "<|eot_id|>", "Meta-Llama-3-8B-Instruct"),
        ("llama3_2", (LLAMACPP_TEMPLATES / "meta-llama-Llama-3.2-3B-Instruct.jinja").read_text(),
         "<|begin_of_text|>", "<|eot_id|>", "llama.cpp models/templates/meta-llama-Llama-3.2-3B-Instruct.jinja"),
        ("llama2", LLAMA2, "<s>", "</s>", "Llama-2-7b-chat-hf"),
        ("mistral_v01", MISTRAL_V01, "<s>", "</s>", "Mistral-7B-Instruct-v0.1"),
        ("qwen2", QWEN2, "", "<|im_end|>", "Qwen2-7B-Instruct"),
        ("qwen2_5", (LLAMACPP_TEMPLATES / "Qwen-Qwen2.5-7B-Instruct.jinja").read_text(),
         "", "<|im_end|>", "llama.cpp models/templates/Qwen-Qwen2.5-7B-Instruct.jinja"),
        ("zephyr", ZEPHYR, "<s>", "</s>", "TinyLlama-1.1B-Chat-v1.0 (Zephyr format)"),
    ]
    renders = []
    for name, src, bos, eos, _ in templates:
        for conv, msgs in CONVERSATIONS.items():
            for add_gen in (True, False):
                jinja, err = jinja2_apply(src, bos, eos, msgs, add_gen)
                renders.append({
                    "template": name,
                    "conversation": conv,
                    "add_generation_prompt": add_gen,
                    "tools": None,
                    "jinja2": jinja,
                    "jinja2_error": err,
                    "llamacpp": llamacpp_apply(src, msgs, add_gen),
                })
        if "tojson" in src:
            # Tool descriptions go through tojson (Python's json.dumps); llama.cpp's formatter has no tools.
            jinja, err = jinja2_apply(src, bos, eos, CONVERSATIONS["system_user"], True, TOOLS)
            renders.append({
                "template": name,
                "conversation": "system_user",
                "add_generation_prompt": True,
                "tools": TOOLS,
                "jinja2": jinja,
                "jinja2_error": err,
                "llamacpp": None,
            })
    out = {
        "generator": "tools/gen_chat_fixtures.py",
        "llama_cpp_python": llama_cpp.__version__,
        # As every generator that runs llama.cpp (tools/cpu_record.py); templates render no
        # arithmetic that depends on the CPU.
        "cpu": cpu_record(),
        "clock_unix": CLOCK,
        "templates": [
            {"name": n, "source": s, "bos_token": b, "eos_token": e, "from": f,
             # tokenizer.ggml.add_bos_token of the real models (llama.cpp strips a rendered BOS then)
             "add_bos": {"smollm2": smol_add_bos, "gemma3": gemma_add_bos}.get(n)}
            for n, s, b, e, f in templates
        ],
        "conversations": CONVERSATIONS,
        "renders": renders,
    }
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / "renders.json"
    path.write_text(json.dumps(out, ensure_ascii=False, indent=1) + "\n")
    same = sum(r["jinja2"] is not None and r["jinja2"] == r["llamacpp"] for r in renders)
    print(f"wrote {path}: {len(renders)} renders, {same} where llama.cpp's formatter equals Jinja2")


if __name__ == "__main__":
    main()
