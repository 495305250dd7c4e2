#!/usr/bin/env python3
"""Expected renderings of chat templates by jinja2, set up the way
transformers renders a chat_template, for tests/unit/test_jinja.c.

Templates: every tests/models/jinja-corpus/*.jinja (small ones, one per
construct, and real models' templates typed in from their public
tokenizer_config.json), every tests/models/chat-templates/*.jinja (first
line a comment naming the model) and, when --gguf files are given, the
tokenizer.chat_template inside each. Each is rendered with every set of
variables in VARIABLES. Writes <out>/jinja/cases.txt, lines of hex-encoded
UTF-8:

    case <name>                 template name / variables name
    template <hex>
    vars <hex>                  the variables as a JSON object
    want <hex>                  what jinja2 renders, or
    reject <hex>                the exception it raises (type: message)

Deterministic (strftime_now is only ever measured, never printed); the file
is written atomically and kept when already current.
"""
import argparse
import datetime
import json
import os
import sys

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension
from jinja2.sandbox import ImmutableSandboxedEnvironment

HERE = os.path.dirname(os.path.abspath(__file__))
CORPUS = os.path.join(HERE, "jinja-corpus")
FAMILIES = os.path.join(HERE, "chat-templates")

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "City name"},
                           "unit": {"type": "string", "enum": ["c", "f"]}},
            "required": ["city"],
        },
    },
}
TIME_TOOL = {"type": "function",
             "function": {"name": "get_time", "description": "Time now",
                          "parameters": {"type": "object", "properties": {}}}}

SPECIALS = {"bos_token": "<s>", "eos_token": "</s>"}

VARIABLES = {
    "chat": dict(SPECIALS, add_generation_prompt=True, messages=[
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Hi there "},
        {"role": "assistant", "content": " Hello! "},
        {"role": "user", "content": "Tell me a joke\nplease"}]),
    "no_system": dict(SPECIALS, add_generation_prompt=False, messages=[
        {"role": "user", "content": "\u00bfQu\u00e9 tal? \U0001f600"},
        {"role": "assistant", "content": "Bien."}]),
    "empty": dict(SPECIALS, add_generation_prompt=True, messages=[]),
    "tools": dict(SPECIALS, add_generation_prompt=True, tools=[WEATHER_TOOL, TIME_TOOL], messages=[
        {"role": "system", "content": "Use tools."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}}]},
        {"role": "tool", "tool_call_id": "call_1", "name": "get_weather",
         "content": "{\"temp\": 21}"},
        {"role": "assistant", "content": "It is 21 degrees in Paris."},
        {"role": "user", "content": "And the time?"}]),
    "tool_string_args": dict(SPECIALS, add_generation_prompt=False, tools=[TIME_TOOL], messages=[
        {"role": "user", "content": "time?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c9", "type": "function",
             "function": {"name": "get_time", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c9", "content": "12:00"}]),
    "multipart": dict(SPECIALS, add_generation_prompt=True, messages=[
        {"role": "user", "content": [{"type": "text", "text": "Describe "},
                                     {"type": "image"},
                                     {"type": "text", "text": "this."}]},
        {"role": "assistant", "content": [{"type": "text", "text": "A cat."}]}]),
    "documents": dict(SPECIALS, add_generation_prompt=True,
                      documents=[{"title": "Doc A", "text": "alpha"}, {"text": "beta"}],
                      messages=[{"role": "user", "content": "Summarise"}]),
    "bad_role": dict(SPECIALS, add_generation_prompt=False, messages=[
        {"role": "user", "content": "a"}, {"role": "critic", "content": "b"}]),
    "reasoning": dict(SPECIALS, add_generation_prompt=True, enable_thinking=False, messages=[
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "<think>\nadd\n</think>\n\n4"},
        {"role": "user", "content": "3+3?"},
        {"role": "assistant", "content": "6", "reasoning_content": "add again"},
        {"role": "user", "content": "ok"}]),
}


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def strftime_now(fmt):
    return datetime.datetime.now().strftime(fmt)


class Generation(Extension):
    """transformers' {% generation %} tag (it marks the assistant's text for
    training masks and renders its body)"""
    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

    def _render(self, caller):
        return caller()


def environment():
    # as transformers' chat template rendering sets it up
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=["jinja2.ext.loopcontrols", Generation])
    env.filters["tojson"] = lambda x, indent=None, separators=None, sort_keys=False, \
        ensure_ascii=False: json.dumps(x, ensure_ascii=ensure_ascii, indent=indent,
                                       separators=separators, sort_keys=sort_keys)
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def hexs(s):
    return s.encode("utf-8").hex()


def gguf_chat_template(path):
    """tokenizer.chat_template of a GGUF file (v2/v3 header), or None."""
    import struct
    sizes = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
    with open(path, "rb") as f:
        magic, version, _, n_kv = struct.unpack("<4sIQQ", f.read(24))
        if magic != b"GGUF" or version < 2:
            return None

        def string():
            (n,) = struct.unpack("<Q", f.read(8))
            return f.read(n)

        def skip(vtype):
            if vtype == 8:
                string()
            elif vtype == 9:
                etype, count = struct.unpack("<IQ", f.read(12))
                for _ in range(count):
                    skip(etype)
            else:
                f.seek(sizes[vtype], 1)

        for _ in range(n_kv):
            key = string()
            (vtype,) = struct.unpack("<I", f.read(4))
            if key == b"tokenizer.chat_template" and vtype == 8:
                return string().decode("utf-8")
            skip(vtype)
    return None


def templates(gguf_files):
    out = []
    for name in sorted(os.listdir(CORPUS)):
        if name.endswith(".jinja"):
            with open(os.path.join(CORPUS, name), encoding="utf-8") as f:
                out.append((name[:-len(".jinja")], f.read()))
    for name in sorted(os.listdir(FAMILIES)):
        if name.endswith(".jinja"):
            with open(os.path.join(FAMILIES, name), encoding="utf-8") as f:
                first, _, body = f.read().partition("\n")
            out.append(("family-" + name[:-len(".jinja")], body[:-1] if body.endswith("\n") else body))
    for path in gguf_files:
        if not os.path.exists(path):
            continue
        text = gguf_chat_template(path)
        if text is not None:
            out.append(("gguf-" + os.path.basename(path), text))
    return out


def render_all(gguf_files):
    env = environment()
    lines = []
    for tname, text in templates(gguf_files):
        try:
            compiled = env.from_string(text)
        except Exception as e:
            compiled, error = None, f"{type(e).__name__}: {e}"
        for vname, variables in VARIABLES.items():
            lines.append(f"case {tname}/{vname}")
            lines.append(f"template {hexs(text)}")
            lines.append(f"vars {hexs(json.dumps(variables, ensure_ascii=False))}")
            if compiled is None:
                lines.append(f"reject {hexs(error)}")
                continue
            try:
                lines.append(f"want {hexs(compiled.render(**variables))}")
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
    ap.add_argument("--gguf", nargs="*", default=None,
                    help="model files whose templates to add (default: models/*.gguf)")
    args = ap.parse_args()
    gguf_files = args.gguf
    if gguf_files is None:
        models = os.path.join(HERE, "..", "..", "models")
        gguf_files = sorted(os.path.join(models, f) for f in os.listdir(models)
                            if f.endswith(".gguf")) if os.path.isdir(models) else []
    outdir = os.path.join(args.out, "jinja")
    os.makedirs(outdir, exist_ok=True)
    write_atomic(os.path.join(outdir, "cases.txt"), render_all(gguf_files))


if __name__ == "__main__":
    sys.exit(main())
