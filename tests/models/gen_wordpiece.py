#!/usr/bin/env python3
"""Write WordPiece (BERT) tokenizer folders for tests/unit/test_hf_tokenizer.c,
with the reference token ids that the `tokenizers` package gives for a
varied text set (ASCII, accents, CJK, Hangul, punctuation of many scripts,
long words, emoji, control and format characters, odd whitespace).

    OUT/tok/minilm/    all-MiniLM-L6-v2's own tokenizer.json and
                       tokenizer_config.json (from models/all-MiniLM-L6-v2,
                       `make model-minilm`; skipped with a note when absent)
    OUT/tok/tiny-wpm/  a small hand-made vocabulary with the other switches
                       of BertNormalizer (cased, accents kept, no CJK
                       spacing, max_input_chars_per_word 12) and BertProcessing
    each with ids.txt in gen_tokenizers.py's format:
        <add_special 0|1> <hex of the UTF-8 text> <hex of tokenizers' decode> : <id> ...

Usage: gen_wordpiece.py --out DIR [--models MODELS_DIR]
Deterministic; every file is written to a temporary name and renamed.
"""

import argparse
import json
import os
import shutil

import tokenizers
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors

from gen_tokenizers import EXTRA_TEXTS, golden_texts, hexs, write_atomic

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

WORDPIECE_TEXTS = [
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.",
    "A man is eating food.",
    "unbelievably antidisestablishmentarianism",
    "Crème brûlée, naïve café, Ångström, Øresund, façade",
    "ÀÉÎÕÜ àéîõü ÇÑ çñ ß ẞ ĳ Ǆ ǅ ǆ",
    "İstanbul ışık IĞDIR",
    "Ελληνικά ΣΟΦΙΑ σοφία ς",
    "Русский текст, ЁЖИК",
    "中文分词测试。你好，世界！",
    "日本語のテキスト、カタカナとひらがな。",
    "한국어 텍스트입니다",
    "混合 mixed 文本 text",
    "emoji 😀🎉👍🏽 and 👨‍👩‍👧 family 🥰",
    "tabs\tand\nnewlines\r\nhere",
    "nbsp\u00a0thin\u2009ideographic\u3000space",
    "zero\u200bwidth\u200djoiner\ufeffbom",
    "control\u0001chars\u0007bell\u007fdel\u0085nel",
    "replacement \ufffd char",
    "private \ue000 use \U000f0000",
    "unassigned \u0378 \U0001fbff code points",
    "combining e\u0301 a\u0308 n\u0303 marks",
    "a" * 99 + " " + "b" * 100 + " " + "c" * 101,
    "x" * 200,
    "punctuation: ¡¿«»„“”‘’—–…·•†‡§¶",
    "ascii symbols $5 + 3 = 8 ^ ` | ~ < > @ # % & * _",
    "don't can't won't it's I'm you're",
    "numbers 3.14159 1,000,000 42nd 2026-12-04",
    "email test@example.com url https://example.org/path?q=1&r=2",
    "[CLS] special [SEP] tokens [MASK] in [UNK] text [PAD]",
    "[cls] lowercase [sep] brackets",
    "Ⅻ ① ＡＢＣ ｆｕｌｌｗｉｄｔｈ ﬁ ligature",
    "Tibetan ཀྵ Devanagari क़ Bengali ো",
    "   leading and trailing spaces   ",
    "",
    " ",
    "x",
    "##hash ##prefix",
    "mathematical 𝐀𝐁𝐂 𝔸𝔹ℂ",
    "arabic العربية hebrew עברית",
    "thai ภาษาไทย",
]

TINY_VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "un", "##believ", "##able", "##ly",
              "the", "The", "fox", "##es", "café", "cafe", "##é", "é", "a", "##a", "b", "##b",
              "中", "文", ",", ".", "!", "?", "'", "s", "##s", "hello", "Hello", "world", "x",
              "##x", "xx", "##xx", "İ", "i", "ı", "ß", "naïve", "jumps", "##ing"]

TINY_TEXTS = ["The fox unbelievably", "the foxes jumping", "Hello, world!", "café cafe CAFÉ",
              "naïve naive", "中文 中文字", "aaaa bbbb ab", "xxxxx xxxxxx xxxxxxxxxxxxx",
              "İ i ı ß", "hello\u0001world\u200b!", "unable??", "", "[CLS] the [SEP]"]


def build_tiny():
    tok = Tokenizer(models.WordPiece({t: i for i, t in enumerate(TINY_VOCAB)},
                                     unk_token="[UNK]", max_input_chars_per_word=12))
    tok.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=False,
                                                strip_accents=False, lowercase=False)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.BertProcessing(("[SEP]", 3), ("[CLS]", 2))
    tok.add_special_tokens(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"])
    config = {"unk_token": "[UNK]", "sep_token": "[SEP]", "pad_token": "[PAD]",
              "cls_token": "[CLS]", "mask_token": "[MASK]", "do_lower_case": False}
    return tok, json.dumps(config, indent=2) + "\n"


def write_folder(out, name, tok, config_text, texts, inputs):
    folder = os.path.join(out, "tok", name)
    stamp = os.path.join(folder, "ids.txt")
    newest = max(os.path.getmtime(p) for p in inputs)
    if os.path.exists(stamp) and os.path.getmtime(stamp) >= newest:
        return
    os.makedirs(folder, exist_ok=True)
    write_atomic(os.path.join(folder, "tokenizer.json"), tok.to_str())
    write_atomic(os.path.join(folder, "tokenizer_config.json"), config_text)
    lines = [f"# {name}: ids from tokenizers {tokenizers.__version__}"]
    for i, text in enumerate(texts):
        for add_special in (0, 1) if i % 4 == 1 or len(texts) < 20 else (0,):
            ids = tok.encode(text, add_special_tokens=bool(add_special)).ids
            dec = tok.decode(ids, skip_special_tokens=False)
            lines.append(f"{add_special} {hexs(text)} {hexs(dec)} : " + " ".join(map(str, ids)))
    write_atomic(stamp, "\n".join(lines) + "\n")
    print(f"gen_wordpiece: wrote {folder}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--models", default=os.path.join(ROOT, "models"))
    a = ap.parse_args()
    src = os.path.join(a.models, "all-MiniLM-L6-v2")
    if os.path.exists(os.path.join(src, "tokenizer.json")):
        tok = Tokenizer.from_file(os.path.join(src, "tokenizer.json"))
        tok.no_truncation()
        tok.no_padding()
        with open(os.path.join(src, "tokenizer_config.json"), encoding="utf-8") as f:
            config = f.read()
        texts = WORDPIECE_TEXTS + golden_texts() + EXTRA_TEXTS
        write_folder(a.out, "minilm", tok, config, texts,
                     [__file__, os.path.join(src, "tokenizer.json"),
                      os.path.join(HERE, "gen_tokenizers.py"),
                      os.path.join(ROOT, "tests", "golden", "make_golden.py")])
    else:
        print(f"gen_wordpiece: {src} absent; minilm skipped")
    tok, config = build_tiny()
    write_folder(a.out, "tiny-wpm", tok, config, TINY_TEXTS, [__file__])


if __name__ == "__main__":
    main()
