#!/usr/bin/env python3
"""The Llama-3-vocabulary model file (scripts/make-llama3-vocab.py) against
Meta's own tokenizer: our library, loading the GGUF's vocabulary through the
Python binding, must give tiktoken's token ids on every string.

The reference is tiktoken over the same tokenizer.model (taken from the
pinned llama-models wheel, tiktoken.load.load_tiktoken_bpe) with Llama 3's
split pattern; the wheel's own llama3/tokenizer.py (imported from the
unpacked wheel, not installed) supplies the special tokens' names and ids
and must agree with that pattern. Strings: hand-written English, code, JSON
and Unicode; seeded random JSON documents; seeded Unicode soup; seeded
concatenations of random vocabulary tokens; and every vocabulary token that
the merge list cannot build (reachable only as a whole piece), alone and
inside longer text, where a merge list derived wrongly would show. Each
string is also decoded back (detokenize must return it).

Usage: check_llama3_vocab.py BUILD_DIR
Writes BUILD_DIR/bench/models/llama3-vocab.gguf (kept when up to date).
Skips, exit 0 with a SKIP line, when the wheel cannot be fetched.
"""
import json
import os
import pathlib
import random
import shutil
import subprocess
import sys
import tempfile
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
SCRIPT = os.path.join(ROOT, "scripts", "make-llama3-vocab.py")
WHEEL = "llama_models-0.3.0-py3-none-any.whl"
TOKENIZER_MODEL = "llama_models/llama3/tokenizer.model"

PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
           r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

HANDWRITTEN = [
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.",
    "I'm sure they'll say it's fine, but we've seen what you'd do.",
    "I'M SURE THEY'LL SAY IT'S FINE; WE'VE SEEN WHAT YOU'D DO. DON'T!",
    "She'S, he'Ll, they'Re, it'D: mixed-case contractions",
    "rock 'n' roll, 'quoted', ''double'', '''triple'''",
    "In 1969, 12345678 people watched; pi is 3.14159265358979; 1,000,000.00 $",
    "e-mail: first.last+tag@example.co.uk, https://example.org/a/b?c=d&e=f#g",
    "   leading spaces", "trailing spaces   ", "tabs\tand\t\ttabs", "a  b   c    d",
    "\n", "\n\n", "\n\n\n\n", " \n", "\n ", "line one\nline two\r\nline three\r\n\r\n",
    "   \n\n   x", "x\n\n\n   \n  y", "  ", "\t", " \t \n \t ",
    "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n",
    "int main(void) {\n\tprintf(\"%d\\n\", 42);\n\treturn 0;\n}\n",
    "const xs = [1, 2, 3].map((x) => x ** 2).filter(x => x !== 4);",
    "fn main() { let v: Vec<u32> = (0..10).collect(); println!(\"{:?}\", v); }",
    "SELECT id, name FROM users WHERE age >= 18 ORDER BY name DESC LIMIT 10;",
    "<div class=\"x\"><p>Hi &amp; bye</p></div>",
    "if (a&&b||!c) { x+=1; y-=2; z*=3; w/=4; } // comment /* block */",
    "#include <stdio.h>\n#define MAX(a, b) ((a) > (b) ? (a) : (b))\n",
    "    indented\n        more\n    back\n",
    '{"name": "Ada", "age": 36, "langs": ["en", "fr"], "ok": true, "x": null}',
    '{"a":{"b":{"c":[1,2,{"d":-0.5e-10}]}}}',
    '[\n  {\n    "id": 1,\n    "tags": []\n  }\n]',
    '{"emoji": "\\ud83d\\ude00", "path": "C:\\\\temp\\\\x", "q": "\\"quoted\\""}',
    "Ünïcödé wörds: café, naïve, façade, Straße, Ærø, øre",
    "日本語のテキストと漢字、ひらがな、カタカナ。",
    "中文文本，包括标点符号！还有数字123。",
    "한국어 문장입니다. 띄어쓰기도 있어요.",
    "Русский текст, с пунктуацией и цифрами 2024 года.",
    "Ελληνικά: αβγδε ΑΒΓΔΕ",
    "العربية: مرحبا بالعالم ١٢٣",
    "עברית: שלום עולם",
    "हिन्दी: नमस्ते दुनिया",
    "ไทย: สวัสดีชาวโลก",
    "Emoji: 🙂😀👍🏽 👨‍👩‍👧‍👦 🇫🇷 ❤️ ✨",
    "Math: ∀x∈ℝ, x²≥0; ∑ᵢ aᵢ ≈ ∫ f(x) dx ≠ ∞",
    "combining: e\u0301 a\u0308 n\u0303 and precomposed: é ä ñ",
    "no\u00a0break\u00a0space and\u3000ideographic\u3000space and\u2009thin",
    "zero\u200bwidth\u200djoiner\ufeffbom",
    "control \x01\x02\x7f chars",
    "1 12 123 1234 12345 123456 1234567",
    "٣٤٥ ௧௨௩ ①②③ ⅣⅤ",
    "x" * 50, " " * 40, "!" * 30, "ab" * 25, "\n" * 20,
    "<|begin_of_text|> as plain text", "<|eot_id|><|reserved_special_token_5|>",
]


def skip(message):
    print("SKIP: check_llama3_vocab: " + message)
    sys.exit(0)


def json_value(rng, depth):
    kind = rng.randrange(7 if depth < 3 else 4)
    if kind == 0:
        return rng.choice([None, True, False])
    if kind == 1:
        return rng.choice([rng.randrange(-10 ** 9, 10 ** 9), round(rng.uniform(-1e4, 1e4), 4)])
    if kind in (2, 3):
        alphabet = "abcdefghij XYZ_-./:é中🙂\n\t\"\\"
        return "".join(rng.choice(alphabet) for _ in range(rng.randrange(12)))
    if kind in (4, 5):
        keys = ["k%d_%s" % (i, rng.choice(["id", "name", "value", "Items"]))
                for i in range(rng.randrange(4))]
        return {k: json_value(rng, depth + 1) for k in keys}
    return [json_value(rng, depth + 1) for _ in range(rng.randrange(4))]


def random_json(rng, n):
    out = []
    for i in range(n):
        v = json_value(rng, 0)
        indent = [None, 2, 4][i % 3]
        out.append(json.dumps(v, indent=indent, ensure_ascii=bool(i % 2)))
    return out


def unicode_soup(rng, n):
    ranges = [(0x20, 0x7e), (0x09, 0x0d), (0xa0, 0x17f), (0x370, 0x3ff), (0x400, 0x4ff),
              (0x600, 0x6ff), (0x900, 0x97f), (0x3040, 0x30ff), (0x4e00, 0x4fff),
              (0xac00, 0xacff), (0x1f300, 0x1f64f), (0x2000, 0x206f), (0x300, 0x36f)]
    out = []
    for _ in range(n):
        chars = []
        for _ in range(rng.randrange(1, 40)):
            lo, hi = rng.choice(ranges)
            chars.append(chr(rng.randint(lo, hi)))
        out.append("".join(chars))
    return out


def token_concatenations(rng, ranks_by_id, n):
    out = []
    while len(out) < n:
        data = b"".join(ranks_by_id[rng.randrange(len(ranks_by_id))]
                        for _ in range(rng.randrange(2, 9)))
        try:
            out.append(data.decode("utf-8"))
        except UnicodeDecodeError:
            continue
    return out


def unmergeable(ranks_by_id):
    """Tokens that BPE over their bytes, with only lower-ranked merges, does
    not reduce to two parts: the merge list has no line for them, so they
    must come from a whole piece (what tiktoken does too)."""
    rank = {t: r for r, t in enumerate(ranks_by_id)}
    out = []
    for r, token in enumerate(ranks_by_id):
        parts = [token[i:i + 1] for i in range(len(token))]
        while len(parts) > 2:
            pairs = [(rank.get(parts[i] + parts[i + 1], r), i) for i in range(len(parts) - 1)]
            best, i = min(pairs)
            if best >= r:
                break
            parts[i:i + 2] = [parts[i] + parts[i + 1]]
        if len(parts) > 2:
            out.append(token)
    return out


def around(tokens):
    out = []
    for t in tokens:
        try:
            s = t.decode("utf-8")
        except UnicodeDecodeError:
            continue
        out += [s, "a" + s, s + s[:1], " " + s + " x", s + s, "(" + s + ")\n"]
    return out


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        return 1
    build = os.path.abspath(sys.argv[1])
    model_path = os.path.join(build, "bench", "models", "llama3-vocab.gguf")
    made = subprocess.run([sys.executable, SCRIPT, model_path], capture_output=True, text=True)
    if made.returncode == 3:
        skip(made.stderr.strip())
    if made.returncode != 0:
        print("FAIL make-llama3-vocab.py: " + made.stderr.strip())
        return 1

    tmp = tempfile.mkdtemp(prefix="llama3-vocab-")
    try:
        return compare(build, model_path, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def compare(build, model_path, tmp):
    import tiktoken
    from tiktoken.load import load_tiktoken_bpe

    with zipfile.ZipFile(os.path.join(os.path.dirname(model_path), WHEEL)) as z:
        z.extractall(tmp, [n for n in z.namelist() if n.startswith("llama_models/")])
    sys.path.insert(0, tmp)
    from llama_models.llama3.tokenizer import Tokenizer as MetaTokenizer

    ranks = load_tiktoken_bpe(os.path.join(tmp, TOKENIZER_MODEL))
    meta = MetaTokenizer(pathlib.Path(tmp, TOKENIZER_MODEL))
    failures = []
    if meta.pat_str != PATTERN:
        failures.append("the wheel's split pattern differs from the one this test uses")
    enc = tiktoken.Encoding(name="llama3", pat_str=PATTERN, mergeable_ranks=ranks,
                            special_tokens=meta.special_tokens)
    ranks_by_id = sorted(ranks, key=ranks.get)

    os.environ["LLMINFER_LIBRARY"] = os.path.join(build, "libllminfer.so.1")
    sys.path.insert(0, os.path.join(ROOT, "bindings", "python"))
    import llminfer

    rng = random.Random(128256)
    cases = [("handwritten", HANDWRITTEN), ("json", random_json(rng, 120)),
             ("unicode", unicode_soup(rng, 120)),
             ("token-concat", token_concatenations(rng, ranks_by_id, 200)),
             ("whole-piece tokens", around(unmergeable(ranks_by_id)))]
    total = agree = 0
    with llminfer.Model(model_path) as model:
        info = model.info
        if info.n_vocab != enc.n_vocab or info.bos != meta.bos_id or info.eot != meta.eot_id:
            failures.append("n_vocab/bos/eot %d/%s/%s, expected %d/%d/%d" % (
                info.n_vocab, info.bos, info.eot, enc.n_vocab, meta.bos_id, meta.eot_id))
        for text, want in meta.special_tokens.items():
            got = model.tokenize(text, add_special=False, parse_special=True)
            if got != [want]:
                failures.append("special %s: %s, expected [%d]" % (text, got, want))
        chat = ("<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi there"
                "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n")
        got = model.tokenize(chat, add_special=False, parse_special=True)
        if got != enc.encode(chat, allowed_special="all"):
            failures.append("chat prompt with special tokens: %s" % got)
        for name, strings in cases:
            bad = 0
            for s in strings:
                total += 1
                want = enc.encode(s, disallowed_special=())
                got = model.tokenize(s, add_special=False)
                back = model.detokenize(got)
                ok = got == want and back == s and \
                    model.tokenize(s, add_special=True) == [meta.bos_id] + want
                if ok:
                    agree += 1
                    continue
                bad += 1
                if bad <= 5:
                    failures.append("%s %r: ours %s, tiktoken %s%s" % (
                        name, s[:60], got[:20], want[:20],
                        "" if back == s else ", decodes to %r" % back[:60]))
            print("  %-18s %4d strings, %d disagree" % (name, len(strings), bad))
    for f in failures:
        print("FAIL", f)
    print("llama3 vocab: %d strings, %d agree with tiktoken, %d checks failed"
          % (total, agree, len(failures)))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
