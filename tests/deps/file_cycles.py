#!/usr/bin/env python3
"""Finds circles between the source files of each lib/ module.

tests/deps/check.py keeps the modules in order; inside a module, files may
still lean on each other both ways (a.c calls b.c, which calls a.c back),
which makes neither readable, testable or movable alone. A module's files
mostly share the module's one header, so #include lines cannot show who
depends on whom: the symbols can. This reads the build's objects with nm:
file A depends on file B when A.o uses a symbol B.o defines. Each strongly
connected group of two or more files of one module is a circle, printed as

    lib/gguf/gguf.c <-> lib/gguf/gguf_build.c

(files sorted), with the symbols that close it. A circle not listed in
tests/deps/file_cycles.txt fails the check; the list only shrinks: an entry
that no longer occurs is reported, to be removed. Break a circle by moving
what both files use into a lower file with its own header, one direction
only, not by merging the files.

Usage: tests/deps/file_cycles.py --objects DIR [repository root]
Exit status: 0 no new circle, 1 new circles, 2 bad usage or list.
"""
import os
import re
import subprocess
import sys

NM_LINE = re.compile(r"^(.*\.o):\s*(?:[0-9a-fA-F]+\s+)?([A-Za-z])\s+(\S+)$")


def nm(objs, flag):
    out = subprocess.run(["nm", "-A", flag] + objs, capture_output=True, text=True,
                         check=True).stdout
    for line in out.splitlines():
        m = NM_LINE.match(line)
        if m:
            yield m.group(1), m.group(2), m.group(3)


def file_graph(root, objdir):
    """{source: {source it uses: [symbols]}} within each module."""
    objs, src_of = [], {}
    for dirpath, _, files in os.walk(os.path.join(objdir, "lib")):
        for f in sorted(files):
            o = os.path.join(dirpath, f)
            rel = os.path.relpath(o, objdir).replace(os.sep, "/")[:-2] + ".c"
            if f.endswith(".o") and os.path.exists(os.path.join(root, rel)):
                objs.append(o)
                src_of[o] = rel
    definer = {}
    for o, kind, sym in nm(objs, "--defined-only"):
        if kind in "TDBRVW":
            definer[sym] = src_of[o]
    graph = {src: {} for src in src_of.values()}
    for o, _, sym in nm(objs, "--undefined-only"):
        user, target = src_of[o], definer.get(sym)
        if target and target != user and module(target) == module(user):
            graph[user].setdefault(target, []).append(sym)
    return graph


def module(rel):
    return rel.split("/")[1]


def circles(graph):
    """Strongly connected groups of two or more files (Tarjan)."""
    index, low, stack, on_stack, groups = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(groups)


def read_known(path):
    known = {}
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            files = [p.strip() for p in line.split("<->")]
            if len(files) < 2 or not all(files):
                raise ValueError(f"{path}:{n}: expected 'a.c <-> b.c [<-> ...]', got {line!r}")
            known[" <-> ".join(sorted(files))] = n
    return known


def main():
    args = sys.argv[1:]
    if len(args) < 2 or args[0] != "--objects":
        print(__doc__)
        return 2
    objdir = args[1]
    root = os.path.normpath(args[2] if len(args) > 2 else
                            os.path.join(os.path.dirname(__file__), "..", ".."))
    known_path = os.path.join(root, "tests", "deps", "file_cycles.txt")
    try:
        known = read_known(known_path)
    except (OSError, ValueError) as e:
        print(f"file-cycles: {e}")
        return 2
    graph = file_graph(root, objdir)
    if not graph:
        print(f"file-cycles: no objects of lib/ under {objdir}")
        return 2
    found, new = set(), 0
    for group in circles(graph):
        key = " <-> ".join(group)
        found.add(key)
        if key in known:
            continue
        new += 1
        print(f"file-cycles: new circle: {key}")
        for a in group:
            for b, syms in sorted(graph[a].items()):
                if b in group:
                    print(f"    {a} uses {b}: {', '.join(sorted(set(syms))[:6])}")
    for key, n in sorted(known.items(), key=lambda kv: kv[1]):
        if key not in found:
            print(f"file-cycles: note: {os.path.relpath(known_path, root)}:{n}: '{key}' "
                  "no longer occurs; remove it")
    if new:
        print(f"file-cycles: {new} new circle(s) between files of one module; move what "
              "both sides use into a lower file (tests/deps/file_cycles.py)")
        return 1
    print(f"file-cycles: ok ({len(graph)} files, {len(found)} known circle(s))")
    return 0


if __name__ == "__main__":
    sys.exit(main())
