#!/usr/bin/env python3
"""A small random-weight GGUF model with Llama 3's real 128,256-token vocabulary.

    make-llama3-vocab.py OUT.gguf [--cache DIR] [--wheel FILE] [--merges all|last]

The vocabulary comes from Meta's PyPI package llama-models 0.3.0, whose
wheel carries llama_models/llama3/tokenizer.model: tiktoken's BPE format,
one "base64(token bytes) rank" line per token, ranks 0..127999. The wheel is
fetched with `pip download --no-deps` into DIR (default: OUT's folder) unless
--wheel names a copy; both it and the tokenizer.model inside it must have the
SHA-256 pinned below. Nothing is installed.

What the file holds, as llama.cpp's converter writes a Llama 3 GGUF:
  - tokenizer.ggml.model "gpt2", tokenizer.ggml.pre "llama-bpe";
  - tokens 0..127999: the BPE ranks, as GPT-2 byte-level unicode strings;
  - merges derived from the ranks: every split of a token into two tokens,
    at the token's rank (all_merges below; --merges last writes one merge
    per token instead, see last_merges);
  - tokens 128000..128255: the 256 special tokens, numbered as the package's
    llama3/tokenizer.py numbers them (<|begin_of_text|> 128000,
    <|end_of_text|> 128001, <|start_header_id|> 128006, <|eot_id|> 128009,
    the rest <|reserved_special_token_N|> and friends), token type control;
  - bos 128000, eos and eot 128009 (<|eot_id|>, as in Llama 3 Instruct files).
The weights are a tiny Llama (2 layers, n_embd 64, the shape of the tests'
random models, lib/model/testmodel.h) with tied F16 embeddings of 128,256
rows, drawn from numpy with a fixed seed: the model generates garbage fast,
which is what the grammar benchmark needs (mask time against a forward pass).

The same inputs always give the same bytes; a file that is already
byte-identical is kept (only its mtime is refreshed, so make sees it as up
to date). Exit status: 0 ok, 1 a failed check (a hash, the rank file's
format), 2 usage, 3 the wheel could not be fetched (no network).
"""

import argparse
import base64
import hashlib
import io
import os
import subprocess
import sys
import zipfile

import numpy as np
import gguf

WHEEL_NAME = "llama_models-0.3.0-py3-none-any.whl"
WHEEL_REQUIREMENT = "llama-models==0.3.0"
WHEEL_SHA256 = "7f77f78ff13fca09f70d76a376aff6414cd901623fb9d57e69c2f8367a73032f"
TOKENIZER_MEMBER = "llama_models/llama3/tokenizer.model"
TOKENIZER_SHA256 = "82e9d31979e92ab929cd544440f129d9ecd797b69e327f80f17e1c50d5551b55"

N_BASE = 128000
# The first special tokens in llama_models/llama3/tokenizer.py's order; the
# remaining ones are <|reserved_special_token_2|> upwards.
NAMED_SPECIALS = [
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|reserved_special_token_0|>",
    "<|reserved_special_token_1|>",
    "<|finetune_right_pad_id|>",
    "<|step_id|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eom_id|>",
    "<|eot_id|>",
    "<|python_tag|>",
    "<|image|>",
]
N_SPECIAL = 256
BOS_ID = N_BASE + NAMED_SPECIALS.index("<|begin_of_text|>")
EOT_ID = N_BASE + NAMED_SPECIALS.index("<|eot_id|>")
EOM_ID = N_BASE + NAMED_SPECIALS.index("<|eom_id|>")

# Model shape: lib/model/testmodel.h's defaults (what `llm-grammar gen --tiny`
# runs), a context long enough for the benchmark's generations, one seed.
SHAPE = {"n_layer": 2, "n_embd": 64, "n_head": 4, "n_head_kv": 2, "n_ff": 128,
         "context": 4096, "rope_base": 500000.0, "eps": 1e-5}
SEED = 128256

TOKEN_NORMAL = 1
TOKEN_CONTROL = 3


class FetchError(Exception):
    pass


def sha256(data):
    return hashlib.sha256(data).hexdigest()


def special_tokens():
    reserved = ["<|reserved_special_token_%d|>" % (2 + i)
                for i in range(N_SPECIAL - len(NAMED_SPECIALS))]
    return NAMED_SPECIALS + reserved


def fetch_wheel(cache):
    """The pinned wheel's bytes: from cache if there, else pip download."""
    path = os.path.join(cache, WHEEL_NAME)
    if not os.path.exists(path):
        os.makedirs(cache, exist_ok=True)
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
               "-q", WHEEL_REQUIREMENT, "-d", cache]
        try:
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise FetchError("pip download %s failed: %s" % (WHEEL_REQUIREMENT, exc))
        if out.returncode != 0 or not os.path.exists(path):
            raise FetchError("pip download %s failed: %s" % (WHEEL_REQUIREMENT,
                                                             out.stderr.strip()[-500:]))
    return read_wheel(path)


def read_wheel(path):
    with open(path, "rb") as f:
        data = f.read()
    if sha256(data) != WHEEL_SHA256:
        raise ValueError("%s: SHA-256 %s, expected %s" % (path, sha256(data), WHEEL_SHA256))
    return data


def tokenizer_model(wheel):
    """tokenizer.model's bytes out of the wheel, checked."""
    with zipfile.ZipFile(io.BytesIO(wheel)) as z:
        data = z.read(TOKENIZER_MEMBER)
    if sha256(data) != TOKENIZER_SHA256:
        raise ValueError("%s: SHA-256 %s, expected %s" % (TOKENIZER_MEMBER, sha256(data),
                                                          TOKENIZER_SHA256))
    return data


def parse_ranks(data):
    """Token bytes by rank; the ranks must be exactly 0..N_BASE-1."""
    tokens = [None] * N_BASE
    for line in data.decode("ascii").splitlines():
        if not line.strip():
            continue
        text, rank = line.split()
        rank = int(rank)
        if not 0 <= rank < N_BASE or tokens[rank] is not None:
            raise ValueError("tokenizer.model: rank %d out of range or repeated" % rank)
        tokens[rank] = base64.b64decode(text)
    if any(t is None for t in tokens):
        raise ValueError("tokenizer.model: ranks are not 0..%d" % (N_BASE - 1))
    present = set(tokens)
    for b in range(256):
        if bytes([b]) not in present:
            raise ValueError("tokenizer.model: byte %d has no token" % b)
    return tokens


def last_merges(tokens):
    """One merge per multi-byte token that has one, in rank order: BPE over
    the token's bytes with only the merges of lower rank (always joining the
    adjacent pair whose join ranks lowest) and the two parts it ends in. 678
    tokens end in three or more parts and get no line; tiktoken still makes
    some of them inside longer pieces, by joining a pair this list lacks
    (check_llama3_vocab.py finds about 60 such strings), so this list alone
    does not tokenize as Llama 3 does. Kept for comparison (--merges last)."""
    rank = {t: r for r, t in enumerate(tokens)}
    merges = []
    for r, token in enumerate(tokens):
        if len(token) < 2:
            continue
        parts = [token[i:i + 1] for i in range(len(token))]
        while len(parts) > 2:
            best, best_rank = -1, r
            for i in range(len(parts) - 1):
                j = rank.get(parts[i] + parts[i + 1], r)
                if j < best_rank:
                    best, best_rank = i, j
            if best < 0:
                break
            parts[best:best + 2] = [parts[best] + parts[best + 1]]
        if len(parts) == 2:
            merges.append((parts[0], parts[1]))
    return merges


def all_merges(tokens):
    """Every split of every multi-byte token into two tokens, ordered by the
    joined token's rank (then the parts' ranks). tiktoken joins whichever
    adjacent pair of parts forms the lowest-ranked token, whatever the split;
    a merge list with every such pair at that token's position makes a
    merge-list BPE do the same, so it tokenizes exactly as tiktoken does
    (the Hugging Face conversion of Llama 3 writes this list too)."""
    rank = {t: r for r, t in enumerate(tokens)}
    merges = []
    for r, token in enumerate(tokens):
        splits = [(rank[token[:i]], rank[token[i:]], token[:i], token[i:])
                  for i in range(1, len(token)) if token[:i] in rank and token[i:] in rank]
        merges += [(a, b) for _, _, a, b in sorted(splits)]
    return merges


def byte_to_unicode():
    """GPT-2's bytes_to_unicode: printable bytes stand for themselves, the
    other 68 map to U+0100 upwards in byte order."""
    printable = (list(range(0x21, 0x7F)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100)))
    table, extra = {}, 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def build_vocab(model_bytes, merge_rule="all"):
    tokens = parse_ranks(model_bytes)
    merges = all_merges(tokens) if merge_rule == "all" else last_merges(tokens)
    b2u = byte_to_unicode()

    def text(b):
        return "".join(b2u[x] for x in b)

    texts = [text(t) for t in tokens] + special_tokens()
    types = [TOKEN_NORMAL] * N_BASE + [TOKEN_CONTROL] * N_SPECIAL
    merge_lines = ["%s %s" % (text(a), text(b)) for a, b in merges]
    return texts, types, merge_lines


def write_model(path, texts, types, merges):
    s = SHAPE
    n_vocab = len(texts)
    w = gguf.GGUFWriter(path, "llama")
    w.add_name("llminfer random llama3-vocab")
    w.add_block_count(s["n_layer"])
    w.add_context_length(s["context"])
    w.add_embedding_length(s["n_embd"])
    w.add_feed_forward_length(s["n_ff"])
    w.add_head_count(s["n_head"])
    w.add_head_count_kv(s["n_head_kv"])
    w.add_layer_norm_rms_eps(s["eps"])
    w.add_rope_freq_base(s["rope_base"])
    w.add_rope_dimension_count(s["n_embd"] // s["n_head"])
    w.add_vocab_size(n_vocab)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("llama-bpe")
    w.add_token_list(texts)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(BOS_ID)
    w.add_eos_token_id(EOT_ID)
    w.add_eot_token_id(EOT_ID)
    w.add_eom_token_id(EOM_ID)
    w.add_add_bos_token(True)

    rng = np.random.default_rng(SEED)
    embd, ff, head = s["n_embd"], s["n_ff"], s["n_embd"] // s["n_head"]
    kv = s["n_head_kv"] * head

    def matrix(rows, cols, scale):
        return (scale * rng.standard_normal((rows, cols))).astype(np.float32)

    def norm():
        return (1.0 + 0.1 * rng.standard_normal(embd)).astype(np.float32)

    # numpy shapes are (rows, cols) = (outputs, inputs); GGUF stores them
    # with ne[0] = inputs, as llama.cpp expects.
    w.add_tensor("token_embd.weight", matrix(n_vocab, embd, 0.3).astype(np.float16))
    w.add_tensor("output_norm.weight", norm())
    for i in range(s["n_layer"]):
        blk = "blk.%d." % i
        w.add_tensor(blk + "attn_norm.weight", norm())
        w.add_tensor(blk + "attn_q.weight", matrix(embd, embd, 0.8 / np.sqrt(embd)))
        w.add_tensor(blk + "attn_k.weight", matrix(kv, embd, 0.8 / np.sqrt(embd)))
        w.add_tensor(blk + "attn_v.weight", matrix(kv, embd, 0.8 / np.sqrt(embd)))
        w.add_tensor(blk + "attn_output.weight", matrix(embd, embd, 0.8 / np.sqrt(embd)))
        w.add_tensor(blk + "ffn_norm.weight", norm())
        w.add_tensor(blk + "ffn_gate.weight", matrix(ff, embd, 0.8 / np.sqrt(embd)))
        w.add_tensor(blk + "ffn_up.weight", matrix(ff, embd, 0.8 / np.sqrt(embd)))
        w.add_tensor(blk + "ffn_down.weight", matrix(embd, ff, 0.8 / np.sqrt(ff)))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def same_file(a, b):
    if os.path.getsize(a) != os.path.getsize(b):
        return False
    with open(a, "rb") as fa, open(b, "rb") as fb:
        while True:
            x, y = fa.read(1 << 20), fb.read(1 << 20)
            if x != y:
                return False
            if not x:
                return True


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out", help="the GGUF file to write")
    ap.add_argument("--cache", help="folder for the downloaded wheel (default: OUT's folder)")
    ap.add_argument("--wheel", help="a local copy of %s (skips the download)" % WHEEL_NAME)
    ap.add_argument("--merges", choices=("all", "last"), default="all",
                    help="merge list: every split (default; tokenizes as tiktoken) or only "
                         "each token's last BPE merge")
    args = ap.parse_args()
    out = os.path.abspath(args.out)
    try:
        wheel = read_wheel(args.wheel) if args.wheel else fetch_wheel(
            args.cache or os.path.dirname(out))
    except FetchError as exc:
        print("make-llama3-vocab: cannot fetch the vocabulary: %s" % exc, file=sys.stderr)
        return 3
    try:
        texts, types, merges = build_vocab(tokenizer_model(wheel), args.merges)
    except (ValueError, KeyError, zipfile.BadZipFile) as exc:
        print("make-llama3-vocab: %s" % exc, file=sys.stderr)
        return 1
    os.makedirs(os.path.dirname(out), exist_ok=True)
    tmp = out + ".tmp"
    write_model(tmp, texts, types, merges)
    if os.path.exists(out) and same_file(tmp, out):
        os.remove(tmp)
        os.utime(out)
        print("%s: up to date" % out)
    else:
        os.replace(tmp, out)
        print("%s: %d tokens, %d merges" % (out, len(texts), len(merges)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
