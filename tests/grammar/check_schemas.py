#!/usr/bin/env python3
"""Generations under every schema of tests/grammar/schemas/ validate with
Python's jsonschema (Draft 2020-12, formats checked).

For each schema: a random-weight test model (greedy and sampled runs, whose
random logits wander through every branch of the grammar) and, when
LLM_TEST_MODEL names a GGUF file (SmolLM2), the real model, greedy and
sampled. Every generation that the grammar ended (finish "stop" or "eos")
must parse as JSON and validate: 100%. A generation that ran out of tokens
(finish "length") cannot be judged and is counted apart; it must still be a
prefix the grammar allowed, which the engine's own tests check.

--real-every N runs the real model on every Nth schema only (the first,
the N+1th, ...): the short smoke that sanitized builds run, since a whole
SmolLM2 pass takes minutes under ASan.

Usage: check_schemas.py BUILD_DIR [--runs N] [--only NAME_SUBSTRING] [--real-every N]
Exit status 0 when every judged generation validates.
"""
import json
import os
import subprocess
import sys

import jsonschema

HERE = os.path.dirname(os.path.abspath(__file__))


def generate(tool, schema_path, model_args, temp, runs, max_new, ws="compact"):
    cmd = [tool, "gen", *model_args, "--schema", schema_path, "--runs", str(runs),
           "--temp", str(temp), "--seed", "7", "--max-new", str(max_new), "--ws", ws]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: {out.stderr.strip()}")
    return [json.loads(line) for line in out.stdout.split("\n") if line.strip()]


def main():
    args = sys.argv[1:]
    if not args:
        print(__doc__)
        return 2
    build = args[0]
    runs = int(args[args.index("--runs") + 1]) if "--runs" in args else 4
    only = args[args.index("--only") + 1] if "--only" in args else ""
    real_every = int(args[args.index("--real-every") + 1]) if "--real-every" in args else 1
    if real_every < 1:
        print("check_schemas: --real-every needs a positive count")
        return 2
    tool = os.path.join(build, "llm-grammar")
    schema_dir = os.path.join(HERE, "schemas")
    # (name, model arguments, max new tokens, (temperature, runs, whitespace)...)
    sampled = ((0.0, 1, "compact"), (1.0, runs, "compact"), (1.0, 1, "flexible"))
    models = [("tiny", ["--tiny", "3"], 1500, sampled)]
    real = os.environ.get("LLM_TEST_MODEL")
    if real and os.path.exists(real):  # slower: greedy and one sampled run
        models.append(("smollm2", ["--model", real], 200,
                       ((0.0, 1, "compact"), (1.0, 1, "flexible"))))
    checker = jsonschema.FormatChecker()
    judged = valid = unjudged = 0
    failures = []
    names = [n for n in sorted(os.listdir(schema_dir)) if n.endswith(".json") and only in n]
    for index, name in enumerate(names):
        path = os.path.join(schema_dir, name)
        with open(path, encoding="utf-8") as f:
            schema = json.load(f)
        jsonschema.Draft202012Validator.check_schema(schema)
        validator = jsonschema.Draft202012Validator(schema, format_checker=checker)
        for model, margs, max_new, configs in models:
            if model != "tiny" and index % real_every:
                continue
            for temp, n, ws in configs:
                for g in generate(tool, path, margs, temp, n, max_new, ws):
                    if g["finish"] == "length":
                        unjudged += 1
                        continue
                    judged += 1
                    try:
                        value = json.loads(g["text"])
                        validator.validate(value)
                        valid += 1
                    except (ValueError, jsonschema.ValidationError) as e:
                        failures.append(f"{name} [{model} T={temp} {ws}]: {g['text'][:200]!r}: "
                                        f"{str(e).splitlines()[0]}")
    for f in failures:
        print("FAIL", f)
    print(f"schemas: {judged} generations judged, {valid} valid "
          f"({100.0 * valid / max(judged, 1):.1f}%), {unjudged} ran out of tokens")
    return 0 if judged > 0 and valid == judged else 1


if __name__ == "__main__":
    sys.exit(main())
