#!/usr/bin/env python3
"""Generate llama.cpp reference ("golden") data for the libllminfer C tests.

Runs llama.cpp through the PyPI package llama-cpp-python on one model (a
preset: --preset smollm2, the default, or gemma3) and writes line-based text
files that the C tests parse with fgets/strtol:

    smollm2-tokenize.txt   tokenizer output for ~40 varied texts
    smollm2-logits.txt     argmax + top-5 logits at every position of 6 prompts
    smollm2-greedy.txt     32-token greedy continuations of 5 prompts

    gemma3-tokenize.txt    the same texts plus Gemma's special tokens and
                           byte-fallback characters
    gemma3-logits.txt      3 prompts, each starting with <bos>
    gemma3-greedy.txt      16-token greedy continuations of 4 prompts, one
                           longer than the 512-position sliding window

How to run (from the repository root; pin the version recorded in the headers
of the existing data files if you want to reproduce them exactly):

    python3 -m venv /tmp/venv
    /tmp/venv/bin/pip install llama-cpp-python==0.3.36 numpy
    /tmp/venv/bin/python tests/golden/make_golden.py \
        [--preset smollm2|gemma3] [model path] [tests/golden]

pip builds llama.cpp from source (a few minutes; needs a C/C++ compiler and
cmake). The run itself takes well under a minute on a CPU.

Determinism: CPU only, a fixed thread count (N_THREADS), a fixed seed, greedy
argmax done here in Python (no llama.cpp sampler involved), f32 KV cache,
flash attention off, llama.cpp's AMX/repack weight layouts off (see
_no_extra_bufts). Running the script twice gives identical files.
"""

import argparse
import hashlib
import os
import sys
import time

import numpy as np

import llama_cpp
import llama_cpp.llama_cpp as llama_cpp_lib
from llama_cpp import Llama


def _no_extra_bufts():
    """Make Llama() load weights without llama.cpp's "extra buffer types"
    (AMX and CPU repack). With them, the weights of this model go to the AMX
    backend on CPUs that report AMX, which (a) crashed in decode on the machine
    these files were made on and (b) would make the numbers depend on the CPU.
    Without them every matmul takes the plain ggml-cpu path (vec_dot with
    8-bit-quantized activations, or llamafile sgemm for batched q8_0), which
    is the same on any x86-64 or ARM CPU up to float summation order.
    llama-cpp-python exposes no constructor option for this, so patch the
    default model params it starts from."""
    orig = llama_cpp_lib.llama_model_default_params

    def patched():
        p = orig()
        if hasattr(p, "use_extra_bufts"):
            p.use_extra_bufts = False
        return p

    llama_cpp_lib.llama_model_default_params = patched


_no_extra_bufts()

N_THREADS = 1
SEED = 1234
N_CTX = 512
N_BATCH = 512
TOPK = 5
GREEDY_TOKENS = 32

# --------------------------------------------------------------------------
# Inputs
# --------------------------------------------------------------------------

TOKENIZE_TEXTS = [
    "",
    "Hello",
    "Hello world",
    " Hello world",
    "The quick brown fox jumps over the lazy dog.",
    "It was the best of times, it was the worst of times; it was the age of wisdom.",
    "café naïve résumé coöperate",
    "Über den Wolken muss die Freiheit wohl grenzenlos sein. Straße, Mädchen, schön!",
    "Où est la bibliothèque ? C'est à côté de l'hôtel, près du château.",
    "中文分词测试：我们今天去公园散步。",
    "日本語のテキスト、ひらがなとカタカナ、漢字。",
    "한국어 텍스트 토큰화 테스트입니다.",
    "Mixed: English, 中文,日本語, 한국어 and français.",
    "Emoji: 😀 😂 👍🏽 ❤️",
    "Family 👨\u200d👩\u200d👧\u200d👦 and technologist 👩🏾\u200d💻",
    "Flags 🇺🇸🇫🇷🇯🇵 and 🏳️\u200d🌈",
    "#include <stdio.h>\nint main(void) {\n    printf(\"hi\\n\");\n    return 0;\n}\n",
    "def f(x):\n    if x > 0:\n        return x * 2\n    return -x\n",
    "\tindented\twith\ttabs\n\t\tdouble tab",
    "   ",
    " ",
    "\n",
    "\n\n\n",
    " \t \n x  ",
    "trailing spaces   ",
    "  leading and   multiple    spaces",
    "1234567890 3.14159 1,000,000",
    "0 00 007 12345 123456789012345",
    "don't I'LL we've they're she'd it's",
    "https://huggingface.co/HuggingFaceTB/SmolLM2-135M-Instruct?x=1&y=2#frag",
    "email: someone@example.com, path: /usr/local/bin/python3",
    "<|im_start|>user\nHello<|im_end|>\n",
    "<|endoftext|>",
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n<|im_start|>assistant\n",
    "text<|im_end|>more<|endoftext|>end",
    "<|im_start|> leading space special",
    "<repo_name>foo<file_sep>bar.py",
    "Punctuation!!! ??? ... --- ((())) [[x]] {{y}} <<<>>>",
    "a=b+c*d/e-f%g^h&i|j~k",
    "ALL CAPS SENTENCE WITH NUMBERS 42 AND 3RD PLACE",
    "x" * 64,
    "Ünïcödé ∑∫√∞ ≠ ≤ ≥ → ← ½ ¼ © ® ™ ° ± µ",
]

# (text, parse_special) rows that additionally get an add_bos=1 row.
ADD_BOS_TEXTS = [
    "Hello world",
    "<|im_start|>user\nHello<|im_end|>\n",
]

CHATML_SYSTEM = (
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, "
    "trained by Hugging Face<|im_end|>\n"
)


def chatml(user):
    return (CHATML_SYSTEM + "<|im_start|>user\n" + user + "<|im_end|>\n"
            "<|im_start|>assistant\n")


# Teacher-forced prompts for the logits file (40..100 tokens each).
LOGITS_PROMPTS = [
    # prose
    "The old lighthouse stood at the edge of the cliff, its white paint peeling "
    "after decades of salt and wind. Every evening the keeper climbed the "
    "spiral stairs, lit the great lamp, and watched the ships pass safely "
    "through the narrow channel below.",
    # chat formatted
    chatml("Can you explain in two sentences why the sky is blue?")
    + "The sky appears blue because",
    # code
    "def fibonacci(n):\n"
    "    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"
    "    a, b = 0, 1\n"
    "    for _ in range(n):\n"
    "        a, b = b, a + b\n"
    "    return a\n\n"
    "print(fibonacci(10))\n",
    # a list
    "Shopping list:\n1. Eggs\n2. Milk\n3. Bread\n4. Butter\n5. Apples\n"
    "6. Cheese\n7. Coffee\n8. Rice\n9. Tomatoes\n10. Olive oil\n11.",
    # a question
    "Question: I am planning a trip to Europe next spring. What is the "
    "capital of France, and what river flows through it? Please also name "
    "one famous museum located there.\nAnswer: The capital of France is",
    # repetitive text
    "one two three four five, " * 9 + "one two three",
]

# Gemma 3: the generic texts (ChatML strings are plain text there) plus its
# own special tokens and characters its 262k vocabulary spells with <0xNN>
# byte tokens.
GEMMA3_TOKENIZE_EXTRA = [
    "<start_of_turn>user\nHello<end_of_turn>\n<start_of_turn>model\n",
    "<bos><start_of_turn>user\nWho are you?<end_of_turn>\n",
    "<eos><pad><unk><mask>",
    "text<end_of_turn>more<eos>end",
    "<start_of_turn> leading space special",
    "<start_of_image> <end_of_image> <unused0>",
    "control \x01\x02\x1b bytes \x7f",
    "private use \ue000\uf8ff, rare \U0001d518\U0001d52b and \U00013000",
    "four    spaces\u00a0nbsp\u2009thin \u3000ideographic",
]

GEMMA3_ADD_BOS_TEXTS = [
    "Hello world",
    "<start_of_turn>user\nHello<end_of_turn>\n",
    "",
]

GEMMA3_LOGITS_PROMPTS = [LOGITS_PROMPTS[0], LOGITS_PROMPTS[2], LOGITS_PROMPTS[4]]

# Picked, as for SmolLM2, for margins: this small pretrained model is on a
# near-tie (top-1/top-2 gap under 0.1) within 16 steps for most natural
# prompts ("The capital of Germany is", "import numpy as np\n", ...).
# The last one is 629 tokens, longer than Gemma 3's 512-position window, so
# the windowed layers drop its start while the global ones still see it.
GEMMA3_GREEDY_PROMPTS = [
    "A, B, C, D, E,",
    "1, 2, 3, 4, 5,",
    "The sun rises in the east and sets in the",
    ("\n\n".join(LOGITS_PROMPTS[i] for i in (0, 2, 3, 4)) + "\n\n") * 3
    + LOGITS_PROMPTS[0][:60],
]

# Prompts for greedy continuation. Chosen so that the greedy path is not on a
# knife edge: an independent float64 NumPy forward pass of the same GGUF
# weights (dequantized, f64 activations) reproduced each continuation
# exactly. Several more natural prompts ("What is the capital of France?",
# "Once upon a time, ...") were rejected because llama.cpp's 8-bit activation
# rounding flips a near-tie (margin < 0.06) within the first few steps.
GREEDY_PROMPTS = [
    chatml("What is 2 + 2?"),
    chatml("Explain what a CPU does in one sentence."),
    "def add(a, b):\n",
    "The capital of Germany is",
    "1, 2, 3, 4, 5,",
]

# --------------------------------------------------------------------------


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def load(model_path, logits_all):
    return Llama(
        model_path=model_path,
        n_gpu_layers=0,
        n_ctx=PRESET.n_ctx,
        n_batch=N_BATCH,
        n_ubatch=N_BATCH,
        n_threads=N_THREADS,
        n_threads_batch=N_THREADS,
        seed=SEED,
        logits_all=logits_all,
        flash_attn=False,
        type_k=llama_cpp.GGML_TYPE_F32,
        type_v=llama_cpp.GGML_TYPE_F32,
        use_mmap=False,
        verbose=False,
    )


def common_header(model_path, sha, what):
    sysinfo = llama_cpp.llama_print_system_info().decode(errors="replace").strip()
    return [
        "# " + what,
        "# generated by tests/golden/make_golden.py (see tests/golden/README.md)",
        "# llama-cpp-python %s (bundled llama.cpp), CPU only" % llama_cpp.__version__,
        "# model %s sha256 %s" % (os.path.basename(model_path), sha),
        "# n_threads %d  n_threads_batch %d  seed %d  n_ctx %d  n_batch %d  n_ubatch %d"
        % (N_THREADS, N_THREADS, SEED, PRESET.n_ctx, N_BATCH, N_BATCH),
        "# kv cache f32 (type_k = type_v = f32), flash_attn off, use_mmap off,",
        "# extra buffer types off (no AMX / repacked weights: plain ggml-cpu kernels)",
        "# llama.cpp system info: " + sysinfo,
    ]


NUMERICS_NOTE = [
    "# NOTE: llama.cpp's CPU path quantizes the activations to 8 bits (q8_1 for",
    "# Q4_1 weights, q8_0 for Q8_0/Q4_0 weights) before every quantized matmul and",
    "# computes integer dot products, so these logits differ by rounding from an",
    "# implementation that dequantizes the weights and keeps f32 activations.",
    "# Compare with a tolerance, and expect argmax flips where top-1 and top-2 are close.",
]


def numerics_note():
    if PRESET.prefix == "smollm2":
        return NUMERICS_NOTE
    return [
        "# NOTE: llama.cpp's CPU path quantizes the activations to 8 bits (q8_0 for",
        "# Q5_0/Q8_0 weights, q8_K for Q4_K/Q6_K weights) before every quantized matmul and",
    ] + NUMERICS_NOTE[2:]


def write_lines(path, lines):
    with open(path, "w", encoding="ascii", newline="\n") as f:
        for ln in lines:
            f.write(ln + "\n")


def ids_str(ids):
    return " ".join(str(int(t)) for t in ids)


def topk_of(row, k):
    # descending logit, ties broken by the lower token id (stable sort)
    order = np.argsort(-row, kind="stable")[:k]
    return [(int(i), float(row[i])) for i in order]


# --------------------------------------------------------------------------


class Preset:
    def __init__(self, prefix, title, model, texts, add_bos_texts, logits_prompts,
                 greedy_prompts, greedy_tokens, add_bos, min_logits_tokens, n_ctx):
        self.prefix = prefix
        self.title = title
        self.model = model
        self.texts = texts
        self.add_bos_texts = add_bos_texts
        self.logits_prompts = logits_prompts
        self.greedy_prompts = greedy_prompts
        self.greedy_tokens = greedy_tokens
        self.add_bos = add_bos  # prompts start with BOS (the model's add_bos_token)
        self.min_logits_tokens = min_logits_tokens
        self.n_ctx = n_ctx


PRESETS = {
    "smollm2": Preset("smollm2", "SmolLM2", "models/SmolLM2-135M-Instruct.Q4_1.gguf",
                      TOKENIZE_TEXTS, ADD_BOS_TEXTS, LOGITS_PROMPTS, GREEDY_PROMPTS,
                      GREEDY_TOKENS, False, 40, N_CTX),
    "gemma3": Preset("gemma3", "Gemma 3", "models/gemma-3-270m-q4_k_m.gguf",
                     TOKENIZE_TEXTS + GEMMA3_TOKENIZE_EXTRA, GEMMA3_ADD_BOS_TEXTS,
                     GEMMA3_LOGITS_PROMPTS, GEMMA3_GREEDY_PROMPTS, 16, True, 30, 1024),
}

PRESET = PRESETS["smollm2"]


def gen_tokenize(llm, model_path, sha, out_path):
    md = llm.metadata
    lines = common_header(model_path, sha,
                          "%s tokenizer reference (llama.cpp llama_tokenize)" % PRESET.title)
    add_bos = md.get("tokenizer.ggml.add_bos_token")
    lines += [
        "# tokenizer.ggml.model %s  tokenizer.ggml.pre %s  add_bos_token %s  bos %d  eos %d"
        % (md.get("tokenizer.ggml.model"), md.get("tokenizer.ggml.pre"),
           add_bos, llm.token_bos(), llm.token_eos()),
    ]
    if add_bos == "true":
        lines += ["# (add_bos_token is true: add_bos=1 rows start with BOS.)"]
    else:
        lines += [
            "# (add_bos_token is false in this GGUF, so add_bos=1 rows equal add_bos=0 rows:",
            "#  llama_tokenize's add_special only adds BOS when the vocab asks for it.)",
        ]
    lines += [
        "#",
        "# format, one row per line:",
        "#   tok <parse_special 0|1> <add_bos 0|1> <hex of the UTF-8 text bytes> : <id> <id> ...",
        "# parse_special=1: special-token strings such as <|im_start|> become their ids;",
        "# parse_special=0: they are tokenized as plain text.",
        "# An empty text has hex '-'; an empty token list leaves nothing after ':'.",
    ]
    nrows = 0
    for text in PRESET.texts:
        b = text.encode("utf-8")
        hx = b.hex() if b else "-"
        for special in (0, 1):
            ids = llm.tokenize(b, add_bos=False, special=bool(special))
            lines.append(("tok %d 0 %s : %s" % (special, hx, ids_str(ids))).rstrip())
            nrows += 1
    for text in PRESET.add_bos_texts:
        b = text.encode("utf-8")
        for special in (0, 1):
            ids = llm.tokenize(b, add_bos=True, special=bool(special))
            lines.append(("tok %d 1 %s : %s" % (special, b.hex() if b else "-",
                                                 ids_str(ids))).rstrip())
            nrows += 1
    write_lines(out_path, lines)
    return nrows


def log_softmax(row):
    m = np.max(row)
    return row - (m + np.log(np.sum(np.exp(row.astype(np.float64) - m))))


def gen_logits(model_path, sha, out_path):
    llm = load(model_path, logits_all=True)
    lines = common_header(model_path, sha,
                          "%s teacher-forced logits reference (llama.cpp)" % PRESET.title)
    lines += numerics_note()
    lines += [
        "# Each prompt is tokenized with parse_special=1, add_bos=%d, and evaluated"
        % PRESET.add_bos,
        "# from an empty KV cache in ONE batch with logits for every position.",
        "#",
        "# format:",
        "#   prompt <index> <n_tokens> : <ids...>",
        "#   pos <prompt index> <position> <top1 id> : <id>:<logit> x5",
        "#       top-5 of the logits predicting the token after <position>, by",
        "#       descending logit (ties: lower id first), logits as %.6f",
        "#   ppl <prompt index> <n_predicted> <mean nll>",
        "#       mean negative log-likelihood (natural log, %.6f) of tokens 1..n-1",
        "#       given their prefixes, from full-vocab log-softmax",
    ]
    nrows = 0
    for pi, text in enumerate(PRESET.logits_prompts):
        ids = llm.tokenize(text.encode("utf-8"), add_bos=PRESET.add_bos, special=True)
        if not PRESET.min_logits_tokens <= len(ids) <= 100:
            sys.exit("logits prompt %d has %d tokens (want %d..100)"
                     % (pi, len(ids), PRESET.min_logits_tokens))
        llm.reset()
        llm.eval(ids)
        scores = np.array(llm.scores[: len(ids), :], dtype=np.float32)
        lines.append("prompt %d %d : %s" % (pi, len(ids), ids_str(ids)))
        nll = 0.0
        for p in range(len(ids)):
            row = scores[p]
            top = topk_of(row, TOPK)
            lines.append("pos %d %d %d : %s" % (
                pi, p, top[0][0], " ".join("%d:%.6f" % (t, v) for t, v in top)))
            nrows += 1
            if p + 1 < len(ids):
                nll -= float(log_softmax(row)[ids[p + 1]])
        lines.append("ppl %d %d %.6f" % (pi, len(ids) - 1, nll / (len(ids) - 1)))
    write_lines(out_path, lines)
    del llm
    return nrows


def gen_greedy(model_path, sha, out_path):
    llm = load(model_path, logits_all=False)
    n_vocab = llm.n_vocab()
    eos = llm.token_eos()
    lines = common_header(model_path, sha,
                          "%s greedy continuation reference (llama.cpp)" % PRESET.title)
    lines += numerics_note()
    lines += [
        "# Prompt tokenized with parse_special=1, add_bos=%d and evaluated in one"
        % PRESET.add_bos,
        "# batch from an empty KV cache; then %d steps of: argmax of the last"
        % PRESET.greedy_tokens,
        "# logits (ties: lower id), append, evaluate that single token. Generation",
        "# stops early only when the argmax is the EOS token (id %d); the EOS id is" % eos,
        "# then the last continuation id (so fewer than %d ids means EOS)."
        % PRESET.greedy_tokens,
    ]
    if PRESET.prefix == "smollm2":
        lines += ["# Chat prompts are ChatML rendered by hand from the GGUF chat template."]
    lines += [
        "#",
        "# format:",
        "#   greedy <index> <n_prompt> : <prompt ids> | <continuation ids>",
        "#   margin <index> : <top1 - top2 logit at each continuation step, %.4f>",
        "#       (small margins mark steps where an implementation with different",
        "#        rounding may legitimately pick the other token)",
        "#   text <index> <hex of the UTF-8 continuation text>",
    ]
    nrows = 0
    for gi, text in enumerate(PRESET.greedy_prompts):
        ids = llm.tokenize(text.encode("utf-8"), add_bos=PRESET.add_bos, special=True)
        llm.reset()
        llm.eval(ids)
        cont, margins = [], []
        for _ in range(PRESET.greedy_tokens):
            # logits_all=False: the only output row is the last token's
            row = np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(n_vocab,)).copy()
            top = topk_of(row, 2)
            tok = top[0][0]
            cont.append(tok)
            margins.append(top[0][1] - top[1][1])
            if tok == eos:
                break
            llm.eval([tok])
        lines.append("greedy %d %d : %s | %s" % (gi, len(ids), ids_str(ids), ids_str(cont)))
        lines.append("margin %d : %s" % (gi, " ".join("%.4f" % m for m in margins)))
        out = llm.detokenize(cont, special=True)
        lines.append("text %d %s" % (gi, out.hex() if out else "-"))
        nrows += 1
    write_lines(out_path, lines)
    del llm
    return nrows


def main():
    global PRESET
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", choices=sorted(PRESETS), default="smollm2")
    ap.add_argument("model", nargs="?", help="the preset's file under models/ by default")
    ap.add_argument("outdir", nargs="?", default="tests/golden")
    args = ap.parse_args()
    PRESET = PRESETS[args.preset]
    if args.model is None:
        args.model = PRESET.model

    if not os.path.isfile(args.model):
        sys.exit("model not found: %s" % args.model)
    os.makedirs(args.outdir, exist_ok=True)
    t0 = time.time()
    sha = sha256_file(args.model)

    def out(kind):
        name = "%s-%s.txt" % (PRESET.prefix, kind)
        return name, os.path.join(args.outdir, name)

    tok_llm = load(args.model, logits_all=False)
    name, path = out("tokenize")
    n = gen_tokenize(tok_llm, args.model, sha, path)
    del tok_llm
    print("%s: %d rows" % (name, n))
    name, path = out("logits")
    n = gen_logits(args.model, sha, path)
    print("%s: %d positions" % (name, n))
    name, path = out("greedy")
    n = gen_greedy(args.model, sha, path)
    print("%s: %d prompts" % (name, n))
    print("llama-cpp-python %s, %.1f s" % (llama_cpp.__version__, time.time() - t0))


if __name__ == "__main__":
    main()
