#!/usr/bin/env python3
"""Write tokenizer.json folders for the tokenizer.json reader's tests
(tests/unit/test_hf_tokenizer.c), with the reference token ids that the
`tokenizers` package gives for a varied text set.

For each vocabulary (SmolLM2: byte-level BPE; Gemma 3: SentencePiece-style
BPE with byte fallback) the GGUF file's tokenizer.ggml.* keys, read with the
`gguf` package, are rebuilt as a `tokenizers` Tokenizer the way Hugging Face
publishes such models, and written as

    OUT/tok/<name>/tokenizer.json
    OUT/tok/<name>/tokenizer_config.json
    OUT/tok/<name>/vocab.gguf   the GGUF file's tokenizer.* keys alone (copied
                                with `gguf`, so the C test reads them without
                                needing the file's tensor types)
    OUT/tok/<name>/ids.txt   one line per text:
        <add_special 0|1> <hex of the UTF-8 text> <hex of tokenizers' decode> : <id> ...
        (an empty string is written as "-")

The Gemma 3 GGUF has scores but no merges; the merges are derived from the
scores as transformers' SentencePieceExtractor derives them from a
tokenizer.model: every split of a token into two vocabulary tokens, ordered
by the score of the merged token (higher first), ties in vocabulary order.

A third folder, tiny-spm, is a hand-made SentencePiece-style vocabulary in
the Llama 2 layout (normalizer Prepend + Replace) whose merge ranks disagree
with vocabulary order, so a tokenizer that merged in any other order than by
rank would give different ids.

Usage: gen_tokenizers.py --out DIR [--models MODELS_DIR]
A model whose GGUF file is absent is skipped with a note. Deterministic;
every file is written to a temporary name and renamed.
"""

import argparse
import ast
import json
import os
import sys

import gguf
from tokenizers import (AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers,
                        processors)

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

TYPE_NORMAL, TYPE_CONTROL, TYPE_USER_DEFINED, TYPE_BYTE = 1, 3, 4, 6


def golden_texts():
    """TOKENIZE_TEXTS of tests/golden/make_golden.py, read without importing
    it (it needs llama-cpp-python)."""
    path = os.path.join(ROOT, "tests", "golden", "make_golden.py")
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    for node in tree.body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "TOKENIZE_TEXTS":
            return eval(compile(ast.Expression(node.value), path, "eval"), {"__builtins__": {}})
    sys.exit(f"{path}: TOKENIZE_TEXTS not found")


EXTRA_TEXTS = [
    "<start_of_turn>user\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\n",
    "<bos>text<eos>",
    "two  spaces, three   spaces,\n\nand a blank line",
    "a\u2581literal lower one-eighth block",
    "<unused0> and <mask>",
]


def read_gguf(path):
    r = gguf.GGUFReader(path)

    def arr(key, conv):
        f = r.fields.get(key)
        if f is None:
            return None
        return [conv(f.parts[i]) for i in f.data]

    def scalar(key):
        f = r.fields.get(key)
        if f is None:
            return None
        v = f.parts[f.data[0]]
        return bytes(v).decode("utf-8") if f.types[0] == gguf.GGUFValueType.STRING else v[0].item()

    return {
        "tokens": arr("tokenizer.ggml.tokens", lambda p: bytes(p).decode("utf-8")),
        "types": arr("tokenizer.ggml.token_type", lambda p: int(p[0])),
        "scores": arr("tokenizer.ggml.scores", lambda p: float(p[0])),
        "merges": arr("tokenizer.ggml.merges", lambda p: bytes(p).decode("utf-8")),
        "bos": scalar("tokenizer.ggml.bos_token_id"),
        "eos": scalar("tokenizer.ggml.eos_token_id"),
        "unk": scalar("tokenizer.ggml.unknown_token_id"),
        "pad": scalar("tokenizer.ggml.padding_token_id"),
        "add_bos": scalar("tokenizer.ggml.add_bos_token"),
        "template": scalar("tokenizer.chat_template"),
    }


def extract_merges(tokens, scores):
    vocab = {t: i for i, t in enumerate(tokens)}
    merges = []
    for i, piece in enumerate(tokens):
        local = []
        for k in range(1, len(piece)):
            left, right = piece[:k], piece[k:]
            if left in vocab and right in vocab:
                local.append((vocab[left], vocab[right], left, right))
        local.sort()
        merges.extend((scores[i], left, right) for _, _, left, right in local)
    merges.sort(key=lambda m: m[0], reverse=True)  # stable: ties keep vocabulary order
    return [(left, right) for _, left, right in merges]


def add_special_tokens(tok, g, sentencepiece):
    specials, user = [], []
    for i, (text, ttype) in enumerate(zip(g["tokens"], g["types"])):
        if ttype == TYPE_CONTROL:
            specials.append(AddedToken(text, special=True, normalized=False))
        elif ttype == TYPE_USER_DEFINED:
            user.append(AddedToken(text, special=False, normalized=False))
    tok.add_special_tokens(specials)
    tok.add_tokens(user)


def build_smollm2(g):
    vocab = {t: i for i, t in enumerate(g["tokens"])}
    merges = [tuple(m.split(" ", 1)) for m in g["merges"]]
    tok = Tokenizer(models.BPE(vocab, merges, unk_token=None, ignore_merges=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tok.decoder = decoders.ByteLevel()
    add_special_tokens(tok, g, False)
    t = g["tokens"]
    config = {
        "add_bos_token": False,
        "bos_token": t[g["bos"]],
        "eos_token": {"content": t[g["eos"]], "lstrip": False, "normalized": False,
                      "rstrip": False, "single_word": False, "special": True},
        "unk_token": t[g["unk"]],
        "pad_token": t[g["pad"]],
        "chat_template": g["template"],
        "tokenizer_class": "GPT2Tokenizer",
    }
    return tok, config


def build_gemma3(g):
    tokens = g["tokens"]
    vocab = {t: i for i, t in enumerate(tokens)}
    merges = extract_merges(tokens, g["scores"])
    tok = Tokenizer(models.BPE(vocab, merges, unk_token=tokens[g["unk"]], byte_fallback=True,
                               fuse_unk=True, ignore_merges=False))
    tok.normalizer = normalizers.Replace(" ", "\u2581")
    tok.pre_tokenizer = pre_tokenizers.Split(" ", "merged_with_previous")  # as transformers writes
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(),
                                     decoders.Fuse()])
    add_special_tokens(tok, g, True)
    bos = tokens[g["bos"]]
    tok.post_processor = processors.TemplateProcessing(single=f"{bos} $A",
                                                       pair=f"{bos} $A {bos} $B",
                                                       special_tokens=[(bos, g["bos"])])
    config = {
        "add_bos_token": bool(g["add_bos"]),
        "add_eos_token": False,
        "bos_token": bos,
        "eos_token": tokens[g["eos"]],
        "unk_token": tokens[g["unk"]],
        "pad_token": tokens[g["pad"]],
        "chat_template": [{"name": "default", "template": "{{ bos_token }}{{ messages }}"},
                          {"name": "tool_use", "template": "{{ tools }}"}],
        "tokenizer_class": "GemmaTokenizer",
    }
    return tok, config


TINY_PIECES = ["\u2581", "a", "b", "c", "d", "ab", "bc", "cd", "\u2581a", "\u2581ab", "abc",
               "bcd", "\u2581b", "\u2581bc", "\u2581c", "\u2581\u2581", "dd", "ddd"]
# Rank order deliberately unlike vocabulary order: "b c" before "a b".
TINY_MERGES = [("b", "c"), ("c", "d"), ("\u2581", "a"), ("a", "b"), ("\u2581a", "b"),
               ("b", "cd"), ("\u2581", "b"), ("\u2581", "bc"), ("\u2581", "c"), ("\u2581", "\u2581"),
               ("d", "d"), ("dd", "d")]
TINY_TEXTS = ["abc", " abc", "abcd", "bcd abcd", "ab cab", "  a  b", "dddd ddddd", "abc</s>abc",
              "<s>a b c", "\u00e9t\u00e9 \u4e2d", "\U0001F600 a", "", " ", "a\u2581b"]


def build_tiny_spm(_):
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + TINY_PIECES
    vocab = {t: i for i, t in enumerate(tokens)}
    tok = Tokenizer(models.BPE(vocab, TINY_MERGES, unk_token="<unk>", byte_fallback=True,
                               fuse_unk=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"),
                                           normalizers.Replace(" ", "\u2581")])
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(),
                                     decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t in ("<unk>", "<s>", "</s>")])
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                       special_tokens=[("<s>", 1)])
    config = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
              "add_bos_token": True, "add_eos_token": False}
    return tok, config


def write_vocab_gguf(src, dst):
    r = gguf.GGUFReader(src)
    arch = bytes(r.fields["general.architecture"].parts[-1]).decode("utf-8")
    w = gguf.GGUFWriter(dst + ".tmp", arch)
    for key, field in r.fields.items():
        if not key.startswith("tokenizer."):
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(key, field.contents(), vtype, sub_type=sub)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    os.replace(dst + ".tmp", dst)


def write_atomic(path, text):
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8", newline="\n") as f:
        f.write(text)
    os.replace(tmp, path)


def hexs(s):
    return s.encode("utf-8").hex() or "-"


def write_folder(out, name, gguf_path, build, texts):
    if gguf_path and not os.path.exists(gguf_path):
        print(f"gen_tokenizers: {gguf_path} absent; {name} skipped")
        return
    folder = os.path.join(out, "tok", name)
    stamp = os.path.join(folder, "ids.txt")
    inputs = [__file__, os.path.join(ROOT, "tests", "golden", "make_golden.py")]
    newest_input = max(os.path.getmtime(p) for p in inputs + ([gguf_path] if gguf_path else []))
    if os.path.exists(stamp) and os.path.getmtime(stamp) >= newest_input:
        return
    os.makedirs(folder, exist_ok=True)
    tok, config = build(read_gguf(gguf_path) if gguf_path else None)
    if gguf_path:
        write_vocab_gguf(gguf_path, os.path.join(folder, "vocab.gguf"))
    write_atomic(os.path.join(folder, "tokenizer.json"), tok.to_str())
    write_atomic(os.path.join(folder, "tokenizer_config.json"),
                 json.dumps(config, indent=2, ensure_ascii=False) + "\n")
    lines = [f"# {name}: ids from tokenizers {__import__('tokenizers').__version__}"]
    for i, text in enumerate(texts):
        for add_special in (0, 1) if i % 8 == 1 or len(texts) < 20 else (0,):
            ids = tok.encode(text, add_special_tokens=bool(add_special)).ids
            dec = tok.decode(ids, skip_special_tokens=False)
            lines.append(f"{add_special} {hexs(text)} {hexs(dec)} : " + " ".join(map(str, ids)))
    write_atomic(stamp, "\n".join(lines) + "\n")
    print(f"gen_tokenizers: wrote {folder}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--models", default=os.path.join(ROOT, "models"))
    a = ap.parse_args()
    texts = golden_texts() + EXTRA_TEXTS
    write_folder(a.out, "smollm2", os.path.join(a.models, "SmolLM2-135M-Instruct.Q4_1.gguf"),
                 build_smollm2, texts)
    write_folder(a.out, "gemma3", os.path.join(a.models, "gemma-3-270m-q4_k_m.gguf"),
                 build_gemma3, texts)
    write_folder(a.out, "tiny-spm", None, build_tiny_spm, TINY_TEXTS)


if __name__ == "__main__":
    main()
