#!/usr/bin/env python3
"""Checks that modules under lib/ include only themselves and lower modules.

The order is read from the "Module order" section of docs/design.md (the
one place it is written down): the first line there of the form
    core < gguf < tokenizer < ...
lists the modules lowest first. A module may include its own headers and
those of any module before it in the list. Every `#include "<module>/..."`
in lib/ (any depth) against that order fails the check, named by file,
line and include, unless tests/deps/allowed.txt lists it as a known
violation ("lib/api/api.c -> sample/sample.h", one per line, # comments).

With --objects DIR (the build's object folder, holding lib/<module>/*.o)
it also checks calls: an object may use only symbols defined by its own
module or a lower one, which catches cycles that go through llm.h (a low
module calling an llm_* function that lib/api defines). Those violations
read "lib/sample/sample.c -> llm_sampling_params_init()".

Usage: tests/deps/check.py [--objects DIR] [repository root]
       (root default: two levels up from this file)
Exit status: 0 clean, 1 violations, 2 the order or allow-list is unreadable.
"""
import os
import re
import subprocess
import sys

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"/]+)/([^"]+)"')
# nm -A: "dir/x.o:0000000000000b60 T name" or "dir/x.o:                 U name"
NM_LINE = re.compile(r"^(.*\.o):\s*(?:[0-9a-fA-F]+\s+)?([A-Za-z])\s+(\S+)$")
ORDER_LINE = re.compile(r'^\s*[a-z_]+(\s*<\s*[a-z_]+)+\s*$')


def read_order(design):
    """Modules lowest first, from the Module order section of design.md."""
    in_section = False
    with open(design, encoding="utf-8") as f:
        for line in f:
            if line.startswith("#"):
                in_section = line.strip().lstrip("#").strip().lower() == "module order"
                continue
            if in_section and ORDER_LINE.match(line):
                return [m.strip() for m in line.split("<")]
    return None


def read_allowed(path):
    allowed = {}
    if not os.path.exists(path):
        return allowed
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            parts = [p.strip() for p in line.split("->")]
            if len(parts) != 2 or not all(parts):
                raise ValueError(f"{path}:{n}: expected 'file -> include', got {line!r}")
            allowed[(parts[0], parts[1])] = n
    return allowed


def symbol_uses(root, objdir, rank):
    """(source file, symbol, defining module) for each use of a symbol that a
    module above the user's defines. Objects whose source is gone (moved
    files, stale in the build folder) are skipped."""
    objs = []
    for dirpath, _, files in os.walk(os.path.join(objdir, "lib")):
        for f in sorted(files):
            o = os.path.join(dirpath, f)
            src = os.path.join(root, os.path.relpath(o, objdir))[:-2] + ".c"
            if f.endswith(".o") and os.path.exists(src):
                objs.append(o)
    if not objs:
        return []
    out = subprocess.run(["nm", "-A", "--defined-only"] + objs, capture_output=True, text=True,
                         check=True).stdout
    definer = {}
    for line in out.splitlines():
        m = NM_LINE.match(line)
        if m and m.group(2) in "TDBRVW":
            definer[m.group(3)] = os.path.relpath(m.group(1), objdir).split(os.sep)[1]
    out = subprocess.run(["nm", "-A", "--undefined-only"] + objs, capture_output=True, text=True,
                         check=True).stdout
    uses = []
    for line in out.splitlines():
        m = NM_LINE.match(line)
        if not m or m.group(3) not in definer:
            continue
        rel = os.path.relpath(m.group(1), objdir).replace(os.sep, "/")
        mod, target = rel.split("/")[1], definer[m.group(3)]
        if mod in rank and target in rank and rank[target] > rank[mod]:
            uses.append((rel[:-2] + ".c", m.group(3), target))
    return uses


def main():
    args = sys.argv[1:]
    objdir = None
    if len(args) >= 2 and args[0] == "--objects":
        objdir, args = args[1], args[2:]
    root = args[0] if args else os.path.join(os.path.dirname(__file__), "..", "..")
    root = os.path.normpath(root)
    design = os.path.join(root, "docs", "design.md")
    order = read_order(design)
    if not order:
        print(f"deps: no 'a < b < ...' line in the Module order section of {design}")
        return 2
    rank = {m: i for i, m in enumerate(order)}
    try:
        allowed = read_allowed(os.path.join(root, "tests", "deps", "allowed.txt"))
    except ValueError as e:
        print(f"deps: {e}")
        return 2

    lib = os.path.join(root, "lib")
    modules = sorted(d for d in os.listdir(lib) if os.path.isdir(os.path.join(lib, d)))
    errors, used = [], set()
    for m in modules:
        if m not in rank:
            errors.append(f"lib/{m}/: module missing from the order in docs/design.md")
    for dirpath, _, files in os.walk(lib):
        for name in sorted(files):
            if not name.endswith((".c", ".h")):
                continue
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, root).replace(os.sep, "/")
            mod = rel.split("/")[1]
            if mod not in rank:
                continue
            with open(path, encoding="utf-8", errors="replace") as f:
                for n, line in enumerate(f, 1):
                    mt = INCLUDE.match(line)
                    if not mt or not os.path.isdir(os.path.join(lib, mt.group(1))):
                        continue
                    target = mt.group(1)
                    inc = f"{target}/{mt.group(2)}"
                    if target in rank and rank[target] <= rank[mod]:
                        continue
                    if (rel, inc) in allowed:
                        used.add((rel, inc))
                        continue
                    why = ("is not in the module order" if target not in rank
                           else f"is above {mod}")
                    errors.append(f"{rel}:{n}: includes \"{inc}\": {target} {why}")
    if objdir:
        for rel, sym, target in symbol_uses(root, objdir, rank):
            key = (rel, sym + "()")
            if key in allowed:
                used.add(key)
                continue
            mod = rel.split("/")[1]
            errors.append(f"{rel}: calls {sym}(), which {target} defines: {target} is above {mod}")
    for (rel, inc), n in sorted(allowed.items(), key=lambda kv: kv[1]):
        if (rel, inc) not in used and (objdir or not inc.endswith("()")):
            print(f"deps: note: tests/deps/allowed.txt:{n}: '{rel} -> {inc}' no longer "
                  "occurs; remove it")
    for e in errors:
        print(f"deps: {e}")
    if errors:
        print(f"deps: {len(errors)} dependencies against the module order "
              f"({' < '.join(order)}); see docs/design.md")
        return 1
    print(f"deps: ok ({len(order)} modules, {len(used)} known violation(s) allowed)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
