#!/usr/bin/env python3
"""Records OCP FP8 E4M3 ("fn") conversions for tests/unit/test_fp8.c.

The reference is the PyPI package `ml_dtypes` (its float8_e4m3fn type, the
one JAX and TensorFlow use), independent of our core/fp8.h:

  * `dec` lines: every one of the 256 codes and the f32 it decodes to;
  * `enc` lines: f32 inputs and the code ml_dtypes rounds them to (round to
    nearest, ties to even). The default set is the committed golden file:
    every midpoint between neighbouring codes and the floats just beside
    it (both signs), the saturation edge (448, 464, 480 and up), infinities,
    NaNs, zeros, f32 subnormals, and 2,048 random floats. `--random N`
    writes N random inputs instead (half random f32 bit patterns, half
    random signs and magnitudes log-uniform over E4M3's range and beyond):
    tests/golden/check_fp8.py feeds a million of them to the C test.

ml_dtypes converts a finite float beyond the largest finite value, and an
infinity, to NaN; the KV cache saturates to +-448 instead. The file records
ml_dtypes' code as it is: the C test applies the documented difference.

Output (stdout, or --out FILE), after `#` comment lines:

    dec <code hex> <f32 bits hex>
    enc <f32 bits hex> <code hex>

Usage: make_fp8_table.py [--out tests/golden/fp8-e4m3fn.txt]
       make_fp8_table.py --random N [--seed S] --out FILE
Needs ml_dtypes and numpy (tests/requirements.txt pins them).
"""
import argparse
import sys

import ml_dtypes
import numpy as np

FP8 = ml_dtypes.float8_e4m3fn


def codes_of(x: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore", over="ignore"):  # NaN, out of range: NaN codes
        return x.astype(np.float32).astype(FP8).view(np.uint8)


def edge_inputs(rng: np.random.Generator) -> np.ndarray:
    values = np.arange(256, dtype=np.uint8).view(FP8).astype(np.float32)
    finite = np.sort(values[np.isfinite(values) & (values >= 0)])
    mids = (finite[:-1].astype(np.float64) + finite[1:]) / 2  # exact in f32
    mids = mids.astype(np.float32)
    near = [mids, finite]
    for x in (mids, finite):
        near.append(np.nextafter(x, np.float32(np.inf)))
        near.append(np.nextafter(x, np.float32(0)))
    special = np.array(
        [448, 456, 463.99997, 464, 464.00003, 470, 480, 500, 1e4, 3.0e38, np.inf, np.nan,
         2.0**-9, 2.0**-10, 2.0**-11, 2.0**-6, 1e-30, 1e-45, 1.17549435e-38, 0.0],
        dtype=np.float32)
    rand_bits = rng.integers(0, 2**32, 1024, dtype=np.uint64).astype(np.uint32).view(np.float32)
    rand_mag = np.exp2(rng.uniform(-12, 10, 1024)).astype(np.float32)
    pos = np.concatenate(near + [special, np.abs(rand_bits[~np.isnan(rand_bits)]), rand_mag])
    return np.concatenate([pos, -pos, rand_bits[np.isnan(rand_bits)]]).astype(np.float32)


def random_inputs(rng: np.random.Generator, n: int) -> np.ndarray:
    half = n // 2
    bits = rng.integers(0, 2**32, half, dtype=np.uint64).astype(np.uint32).view(np.float32)
    mag = np.exp2(rng.uniform(-14, 11, n - half)).astype(np.float32)
    sign = np.where(rng.integers(0, 2, n - half) == 1, -1, 1).astype(np.float32)
    return np.concatenate([bits, mag * sign]).astype(np.float32)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--random", type=int, default=0)
    ap.add_argument("--seed", type=int, default=3261)
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    x = random_inputs(rng, args.random) if args.random else edge_inputs(rng)
    out = open(args.out, "w") if args.out else sys.stdout
    out.write("# OCP FP8 E4M3 (fn) conversions, recorded by tests/golden/make_fp8_table.py\n")
    out.write(f"# ml_dtypes {ml_dtypes.__version__}, numpy {np.__version__}, seed {args.seed}\n")
    out.write("# dec <code> <f32 bits> / enc <f32 bits> <code> (ml_dtypes.float8_e4m3fn)\n")
    codes = np.arange(256, dtype=np.uint8)
    for c, f in zip(codes, codes.view(FP8).astype(np.float32).view(np.uint32)):
        out.write(f"dec {c:02x} {f:08x}\n")
    for f, c in zip(x.view(np.uint32), codes_of(x)):
        out.write(f"enc {f:08x} {c:02x}\n")
    if out is not sys.stdout:
        out.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
