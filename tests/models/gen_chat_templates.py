#!/usr/bin/env python3
"""Expected chat-template renderings, written by jinja2 the way transformers
renders a tokenizer's chat_template, for tests/unit/test_chat.c.

Each tests/models/chat-templates/<family>.jinja holds one model's template
(its first line is a Jinja comment naming the model; the text after it is the
template, without the file's final newline). For every family this writes
<out>/chat/<family>.txt, a line-based file of hex-encoded strings:

    template <hex>              the template text (comment line removed)
    bos <hex> | bos -           bos_token as the model defines it, or none
    eos <hex> | eos -
    case <name> <0|1>           a conversation; 1 = add_generation_prompt
    msg <role hex> <content hex>
    want <hex>                  what the template renders, or
    reject <hex>                the message of the exception it raises

Deterministic; each file written atomically and kept when already current.
"""
import argparse
import datetime
import json
import os
import sys

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

HERE = os.path.dirname(os.path.abspath(__file__))
TEMPLATES = os.path.join(HERE, "chat-templates")

# bos_token / eos_token as each model's tokenizer_config.json defines them
# (None: the model has no such token, so the variable is undefined).
SPECIAL = {
    "chatml": ("<s>", "<|im_end|>"),
    "smollm2": ("<|im_start|>", "<|im_end|>"),
    "qwen2": (None, "<|im_end|>"),
    "qwen2.5": (None, "<|im_end|>"),
    "qwen3": (None, "<|im_end|>"),
    "llama3": ("<|begin_of_text|>", "<|eot_id|>"),
    "llama2": ("<s>", "</s>"),
    "gemma2": ("<bos>", "<eos>"),
    "gemma3": ("<bos>", "<eos>"),
    "mistral-v1": ("<s>", "</s>"),
    "mistral-v1-system": ("<s>", "</s>"),
    "mistral-v3": ("<s>", "</s>"),
    "phi3": ("<s>", "<|endoftext|>"),
    "phi3-early": ("<s>", "<|endoftext|>"),
}

CONVERSATIONS = [
    ("user", [("user", "Hello!")]),
    ("system_user", [("system", "Be brief."), ("user", "Hi")]),
    ("multi", [("user", "What is 2+2?"), ("assistant", "4"), ("user", "  and 3+3? \n")]),
    ("system_multi_ends_assistant",
     [("system", "You are a math tutor.\n"), ("user", "What is 2+2?"),
      ("assistant", " It is 4. "), ("user", "And 3+3?"), ("assistant", "6")]),
    ("empty_content", [("user", "")]),
    ("empty_system", [("system", ""), ("user", "Hi"), ("assistant", "")]),
    ("unicode",
     [("system", "R\u00e9ponds en fran\u00e7ais \U0001f1eb\U0001f1f7"),
      ("user", "\u3000Gr\u00fc\u00dfe, \u4e16\u754c! \U0001f30d\u00a0"),
      ("assistant", "\n \u00c7a va ? \t"), ("user", "\u2003\u00bfY t\u00fa?\u2029")]),
    ("no_messages", []),
    ("system_only", [("system", "Be brief.")]),
    ("user_user", [("user", "a"), ("user", "b")]),
    ("assistant_first", [("assistant", "Hi"), ("user", "Hello")]),
    ("system_in_middle", [("user", "a"), ("system", "b"), ("user", "c")]),
    ("two_systems", [("system", "a"), ("system", "b"), ("user", "c")]),
    ("assistant_assistant", [("user", "q"), ("assistant", "a"), ("assistant", "b")]),
    ("think",
     [("user", "What is 2+2?"), ("assistant", "<think>\nadd them\n</think>\n\n4"),
      ("user", "And 3+3?"), ("assistant", "<think>add</think>6")]),
    ("think_in_history",
     [("user", "q1"), ("assistant", "\n<think>r1\n\n</think>\n\na1"), ("user", "q2")]),
    ("think_after_last_query",
     [("user", "q1"), ("assistant", "<think> r </think>a"), ("assistant", "b")]),
    ("tool_results",
     [("user", "Weather?"), ("assistant", "Calling."), ("tool", "sunny"), ("tool", "22C"),
      ("assistant", "Sunny, 22C.")]),
    ("tool_response_user",
     [("user", "q"), ("assistant", "a"), ("user", "<tool_response>x</tool_response>"),
      ("assistant", "<think>r</think>b")]),
    ("custom_role", [("user", "a"), ("critic", "b")]),
    ("template_text_in_content", [("user", "{{ bos_token }} <|im_end|> [INST] {% raw %}\\n")]),
]


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def strftime_now(fmt):
    return datetime.datetime.now().strftime(fmt)


def environment():
    # as transformers' chat template rendering sets it up
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = lambda x, indent=None, separators=None, sort_keys=False, \
        ensure_ascii=False: json.dumps(x, ensure_ascii=ensure_ascii, indent=indent,
                                       separators=separators, sort_keys=sort_keys)
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def load_template(family):
    with open(os.path.join(TEMPLATES, family + ".jinja"), encoding="utf-8") as f:
        text = f.read()
    first, _, body = text.partition("\n")
    if not (first.startswith("{#") and first.endswith("#}")):
        sys.exit(f"{family}.jinja: the first line must be a comment naming the model")
    if body.endswith("\n"):
        body = body[:-1]
    return body


def hexs(s):
    return s.encode("utf-8").hex()


def render_family(env, family):
    template = load_template(family)
    bos, eos = SPECIAL[family]
    compiled = env.from_string(template)
    lines = [f"template {hexs(template)}",
             f"bos {hexs(bos) if bos is not None else '-'}",
             f"eos {hexs(eos) if eos is not None else '-'}"]
    specials = {k: v for k, v in (("bos_token", bos), ("eos_token", eos)) if v is not None}
    for name, conv in CONVERSATIONS:
        for gen in (0, 1):
            lines.append(f"case {name} {gen}")
            for role, content in conv:
                lines.append(f"msg {hexs(role)} {hexs(content)}")
            messages = [{"role": r, "content": c} for r, c in conv]
            try:
                # tools and documents are None, as transformers passes them
                text = compiled.render(messages=messages, tools=None, documents=None,
                                       add_generation_prompt=bool(gen), **specials)
                lines.append(f"want {hexs(text)}")
            except Exception as e:  # what the template raises is the expected outcome
                lines.append(f"reject {hexs(type(e).__name__ + ': ' + str(e))}")
    return "\n".join(lines) + "\n"


def write_atomic(path, data):
    try:
        with open(path, encoding="utf-8") as f:
            if f.read() == data:
                return
    except FileNotFoundError:
        pass
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(data)
    os.replace(tmp, path)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="the test-models folder")
    args = ap.parse_args()
    families = sorted(f[:-len(".jinja")] for f in os.listdir(TEMPLATES) if f.endswith(".jinja"))
    missing = [f for f in families if f not in SPECIAL]
    if missing:
        sys.exit(f"no bos/eos tokens listed for {', '.join(missing)}")
    outdir = os.path.join(args.out, "chat")
    os.makedirs(outdir, exist_ok=True)
    env = environment()
    for family in families:
        write_atomic(os.path.join(outdir, family + ".txt"), render_family(env, family))


if __name__ == "__main__":
    main()
