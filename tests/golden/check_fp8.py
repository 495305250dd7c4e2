#!/usr/bin/env python3
"""The FP8 E4M3 codec against ml_dtypes on a million random floats.

Writes a table of random inputs with make_fp8_table.py (ml_dtypes'
float8_e4m3fn codes) into BUILD/tmp and runs BUILD/tests/unit/test_fp8 on it
(LLM_TEST_FP8_TABLE), which also checks the committed golden table.

Usage: check_fp8.py BUILD [--count N] [--seed S]   (`make test-fp8`)
"""
import argparse
import os
import subprocess
import sys


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("--count", type=int, default=1_000_000)
    ap.add_argument("--seed", type=int, default=1890)
    args = ap.parse_args()
    here = os.path.dirname(os.path.abspath(__file__))
    os.makedirs(os.path.join(args.build, "tmp"), exist_ok=True)
    table = os.path.join(args.build, "tmp", "fp8-random.txt")
    subprocess.run([sys.executable, os.path.join(here, "make_fp8_table.py"), "--random",
                    str(args.count), "--seed", str(args.seed), "--out", table], check=True)
    env = dict(os.environ, LLM_TEST_FP8_TABLE=table, LLM_TEST_FILTER="test_against_ml_dtypes")
    done = subprocess.run([os.path.join(args.build, "tests", "unit", "test_fp8")], env=env)
    if done.returncode == 0:
        os.remove(table)
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())
