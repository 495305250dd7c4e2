#!/usr/bin/env python3
"""Chat with a model, streaming its answers as they are generated.

    python chat.py -m model.gguf "What is the capital of Germany?"
    python chat.py -m model.gguf          # interactive: one message per line

The prompt goes through the model's own chat template. Ctrl-C stops the
answer being written (the request is cancelled) and, at the prompt, exits.
"""

import argparse
import os
import sys
from typing import List, Tuple

import llminfer


def answer(session: llminfer.Session, history: List[Tuple[str, str]], max_tokens: int,
           temperature: float, seed: int) -> str:
    prompt = session.model.apply_chat_template(history, add_generation_prompt=True)
    sampling = llminfer.SamplingParams(temperature=temperature, seed=seed)
    pieces = []
    try:
        for piece in session.stream(prompt, max_new_tokens=max_tokens, sampling=sampling):
            pieces.append(piece)
            sys.stdout.write(piece)
            sys.stdout.flush()
    except KeyboardInterrupt:
        sys.stdout.write(" [stopped]")
    sys.stdout.write("\n")
    return "".join(pieces)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-m", "--model", default=os.environ.get("LLMINFER_TEST_MODEL"),
                        help="GGUF model with a chat template (default: $LLMINFER_TEST_MODEL)")
    parser.add_argument("-n", "--max-tokens", type=int, default=256)
    parser.add_argument("--temp", type=float, default=0.0, help="0 = greedy (default)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("-t", "--threads", type=int, default=0, help="0 = one per CPU")
    parser.add_argument("--system", help="system message")
    parser.add_argument("prompt", nargs="?", help="one message; without it, read lines")
    args = parser.parse_args()
    if not args.model:
        parser.error("no model: pass -m PATH or set LLMINFER_TEST_MODEL")

    try:
        model = llminfer.Model(args.model)
    except llminfer.LlmError as error:
        print(f"chat: {error}", file=sys.stderr)
        return 1
    with model, llminfer.Session(model, n_threads=args.threads) as session:
        history: List[Tuple[str, str]] = []
        if args.system:
            history.append(("system", args.system))
        if args.prompt is not None:
            history.append(("user", args.prompt))
            answer(session, history, args.max_tokens, args.temp, args.seed)
            return 0
        while True:
            try:
                line = input("> ")
            except (EOFError, KeyboardInterrupt):
                print()
                return 0
            if not line.strip():
                continue
            history.append(("user", line))
            history.append(("assistant",
                            answer(session, history, args.max_tokens, args.temp, args.seed)))


if __name__ == "__main__":
    sys.exit(main())
