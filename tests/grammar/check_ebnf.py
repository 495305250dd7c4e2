#!/usr/bin/env python3
"""The grammar engine against independent recognizers: Python's `lark`
(Earley) for the EBNF grammars of tests/grammar/ebnf/ (each NAME.gbnf has
the same language written for lark in NAME.lark), and `re.fullmatch`
(ASCII classes, as the engine's \\d \\w \\s) for tests/grammar/regexes.txt.

For each grammar: strings generated under it by a random-weight model
(llm-grammar gen: every token drawn from the engine's mask) must all be
accepted by the reference; then those strings and mutations of them
(characters deleted, inserted, swapped, the end cut off) get the engine's
verdict (llm-grammar accept) and the reference's, which must agree on
every one: the engine rejects exactly what the reference rejects.

Usage: check_ebnf.py BUILD_DIR [--runs N]
"""
import json
import os
import random
import re
import subprocess
import sys
import tempfile

import lark

HERE = os.path.dirname(os.path.abspath(__file__))


def run_tool(build, args, stdin=None):
    out = subprocess.run([os.path.join(build, "llm-grammar"), *args], input=stdin,
                         capture_output=True, text=True, timeout=900)
    if out.returncode != 0:
        raise RuntimeError(f"llm-grammar {' '.join(args)}: {out.stderr.strip()}")
    return out.stdout


def generate(build, flag, path, runs):
    text = run_tool(build, ["gen", "--tiny", "5", flag, path, "--runs", str(runs), "--temp",
                            "1", "--seed", "11", "--max-new", "200"])
    gens = [json.loads(line) for line in text.split("\n") if line.strip()]
    return [g["text"] for g in gens if g["finish"] != "length"]


def mutations(s, alphabet, rng):
    out = []
    for _ in range(6):
        if not s:
            out.append(rng.choice(alphabet))
            continue
        i = rng.randrange(len(s))
        kind = rng.randrange(4)
        if kind == 0:
            out.append(s[:i] + s[i + 1:])
        elif kind == 1:
            out.append(s[:i] + rng.choice(alphabet) + s[i:])
        elif kind == 2 and len(s) > 1:
            j = min(i + 1, len(s) - 1)
            out.append(s[:i] + s[j] + s[i] + s[j + 1:] if i != j else s[:-1])
        else:
            out.append(s[:i])
    return out


def engine_verdicts(build, flag, path, strings):
    lines = "".join(json.dumps(s) + "\n" for s in strings)
    out = run_tool(build, ["accept", flag, path], stdin=lines)
    return [v == "1" for v in out.split()]


def check(name, build, flag, path, accepts, runs, rng):
    gens = generate(build, flag, path, runs)
    bad = [s for s in gens if not accepts(s)]
    alphabet = sorted(set("".join(gens)) | set("()[]{}\",.!-+* axé€α0"))
    cases = list(gens)
    for s in gens:
        cases += mutations(s, alphabet, rng)
    engine = engine_verdicts(build, flag, path, cases)
    disagree = [(s, e) for s, e in zip(cases, engine) if e != accepts(s)]
    for s in bad[:5]:
        print(f"FAIL {name}: generated {s!r} is rejected by the reference")
    for s, e in disagree[:5]:
        print(f"FAIL {name}: {s!r}: engine {'accepts' if e else 'rejects'}, reference does not")
    n_rej = sum(1 for e in engine if not e)
    print(f"{name}: {len(gens)} generated, {len(cases)} verdicts ({n_rej} rejections), "
          f"{len(bad)} generated rejected, {len(disagree)} disagreements")
    return len(gens) > 0 and not bad and not disagree


def main():
    if len(sys.argv) < 2:
        print(__doc__)
        return 2
    build = sys.argv[1]
    runs = int(sys.argv[sys.argv.index("--runs") + 1]) if "--runs" in sys.argv else 25
    rng = random.Random(1234)
    ok = True
    ebnf_dir = os.path.join(HERE, "ebnf")
    for name in sorted(os.listdir(ebnf_dir)):
        if not name.endswith(".gbnf"):
            continue
        with open(os.path.join(ebnf_dir, name[:-5] + ".lark"), encoding="utf-8") as f:
            parser = lark.Lark(f.read(), parser="earley", lexer="dynamic_complete")

        def accepts(s, parser=parser):
            try:
                parser.parse(s)
                return True
            except lark.exceptions.LarkError:
                return False

        ok &= check(name, build, "--ebnf", os.path.join(ebnf_dir, name), accepts, runs, rng)
    with open(os.path.join(HERE, "regexes.txt"), encoding="utf-8") as f:
        regexes = [line.rstrip("\n") for line in f if line.strip()]
    for i, rx in enumerate(regexes):
        with tempfile.NamedTemporaryFile("w", suffix=".re", delete=False, encoding="utf-8") as t:
            t.write(rx + "\n")
        pattern = re.compile(rx, re.ASCII)
        try:
            ok &= check(f"regex {rx}", build, "--regex", t.name,
                        lambda s: pattern.fullmatch(s) is not None, runs, rng)
        finally:
            os.unlink(t.name)
    print("ebnf/regex: all agree" if ok else "ebnf/regex: FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
