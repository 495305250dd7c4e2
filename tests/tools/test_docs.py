#!/usr/bin/env python3
"""Runs the commands and programs that README.md and docs/ show, so the
documentation cannot drift from the code (docs/reliability.md, "Docs that
run").

    tests/tools/test_docs.py [--build DIR] [--list] [FILE.md...]

Every fenced block tagged sh, bash, console, c, python, go or rust is run,
in the order of the file, in one scratch directory that holds a link to each
top-level entry of the repository and `build` linked to DIR (default build).
HOME is a fresh folder inside it, so `make install PREFIX=$HOME/.local`
installs into a scratch prefix. Go's, cargo's and pip's caches stay where
they were.

  sh, bash    run by `bash -e`; variables exported by one block are seen by
              the blocks after it in the same file (as in one terminal)
  console     the lines that start with "$ " are the commands
  c           a program with main() is compiled against the build and run;
              a fragment (no main) has each llm_/LLM_ name it uses checked
              against include/llm.h
  python      run by the python first on PATH (a scratch venv)
  go, rust    run by `go run` / `cargo run` in a scratch module

A block a reader cannot run as is here carries an HTML comment on the line
before its fence (blank lines between are allowed), which this script reads:

  <!-- docs-test: skip (why) -->      not run; listed with the reason
  <!-- docs-test: save NAME -->       written to NAME in the scratch folder
                                      (for a later block to build)
  <!-- docs-test: background PORT -->  started in the background (a server);
                                      the script waits until PORT accepts
                                      connections, then runs the next blocks
                                      with PORT replaced by a free port, and
                                      stops it at the end of the file
  <!-- docs-test: exit N -->          the commands must exit with status N

Before the pages, the runner checks itself on a page with known outcomes
(--self-test runs only that).

A command must exit 0 (or as annotated). Outputs shown in the docs are not
compared. The last line is the summary:

    docs-test: N run, K skipped, F failed
"""

import argparse
import contextlib
import io
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
RUN_LANGS = {"sh", "bash", "console", "c", "python", "go", "rust"}
FENCE_OPEN = re.compile(r"^(\s*)```([A-Za-z0-9_+-]+)?\s*$")
ANNOTATION = re.compile(r"^\s*<!--\s*docs-test:\s*(.*?)\s*-->\s*$")
BLOCK_TIMEOUT_S = 300


class Block:
    def __init__(self, path, line, lang, text, note):
        self.path, self.line, self.lang, self.text, self.note = path, line, lang, text, note

    def where(self):
        return "%s:%d (%s)" % (os.path.relpath(self.path, ROOT), self.line, self.lang)

    def kind(self):
        return self.note.split(None, 1)[0] if self.note else ""

    def arg(self):
        parts = self.note.split(None, 1)
        return parts[1] if len(parts) > 1 else ""


def parse(path):
    """The fenced blocks of a Markdown file, each with the annotation that
    precedes it (or "")."""
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    blocks, note, i = [], "", 0
    while i < len(lines):
        line = lines[i]
        m_note = ANNOTATION.match(line)
        m_fence = FENCE_OPEN.match(line)
        if m_note:
            note = m_note.group(1)
        elif m_fence:
            indent, lang = m_fence.group(1), (m_fence.group(2) or "")
            body, j = [], i + 1
            while j < len(lines) and lines[j].strip() != "```":
                body.append(lines[j][len(indent):] if lines[j].startswith(indent) else lines[j])
                j += 1
            if lang in RUN_LANGS:
                blocks.append(Block(path, i + 1, lang, "\n".join(body) + "\n", note))
            elif note:
                raise SystemExit("%s:%d: a docs-test annotation on a %r block, which is never run"
                                 % (path, i + 1, lang))
            note, i = "", j
        elif line.strip():
            note = ""
        i += 1
    return blocks


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_port(port, proc, timeout_s=120):
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if proc.poll() is not None:
            return "exited with status %d before listening" % proc.returncode
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return None
        except OSError:
            time.sleep(0.3)
    return "did not listen on port %d within %ds" % (port, timeout_s)


class Runner:
    def __init__(self, build, scratch, venv=True):
        self.build, self.scratch = build, scratch
        self.home = os.path.join(scratch, "home")
        os.makedirs(self.home)
        for name in sorted(os.listdir(ROOT)):
            if name in ("build", ".git") or name.startswith("build-"):
                continue
            if name == "bindings":
                # pip and cargo write beside the sources: a copy keeps the
                # clone clean.
                shutil.copytree(os.path.join(ROOT, name), os.path.join(scratch, name),
                                ignore=shutil.ignore_patterns("target", "__pycache__", "build"))
            else:
                os.symlink(os.path.join(ROOT, name), os.path.join(scratch, name))
        os.symlink(build, os.path.join(scratch, "build"))
        self.base_env = self.make_env()
        if venv:
            subprocess.run([sys.executable, "-m", "venv", os.path.join(scratch, "venv")],
                           check=True)
        self.ran, self.skipped, self.failed = [], [], []

    def make_env(self):
        env = dict(os.environ)
        # The docs' make commands must not inherit this make's variables
        # (BUILD, SAN, ...): they run as a reader runs them.
        for var in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES", "BUILD"):
            env.pop(var, None)
        for tool, var in (("go", "GOCACHE"), ("go", "GOMODCACHE"), ("go", "GOPATH")):
            if var not in env and shutil.which(tool):
                out = subprocess.run([tool, "env", var], capture_output=True, text=True)
                if out.returncode == 0 and out.stdout.strip():
                    env[var] = out.stdout.strip()
        real_home = os.path.expanduser("~")
        env.setdefault("CARGO_HOME", os.path.join(real_home, ".cargo"))
        env.setdefault("RUSTUP_HOME", os.path.join(real_home, ".rustup"))
        env.setdefault("PIP_CACHE_DIR", os.path.join(real_home, ".cache", "pip"))
        env["CARGO_TARGET_DIR"] = os.path.join(self.scratch, "cargo-target")
        env["HOME"] = self.home
        venv = os.path.join(self.scratch, "venv")
        env["PATH"] = os.path.join(venv, "bin") + os.pathsep + env["PATH"]
        env["VIRTUAL_ENV"] = venv
        env["LLM_DOCS_TEST"] = "1"
        return env

    def shell(self, script, env_file, timeout_s, background=False):
        """Runs a bash script in the scratch folder with the file's exported
        variables; saves them again afterwards."""
        full = ("[ -f %s ] && . %s\nset -e\n%s\nexport -p > %s\n"
                % (env_file, env_file, script, env_file))
        if background:
            return subprocess.Popen(["bash", "-c", full], cwd=self.scratch, env=self.base_env,
                                    stdin=subprocess.DEVNULL, stdout=self.bg_log,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        try:
            p = subprocess.run(["bash", "-c", full], cwd=self.scratch, env=self.base_env,
                               stdin=subprocess.DEVNULL, capture_output=True, text=True,
                               timeout=timeout_s)
        except subprocess.TimeoutExpired as e:
            out = e.stdout or ""
            if isinstance(out, bytes):
                out = out.decode(errors="replace")
            return 124, out + "\n(timed out after %ds)" % timeout_s
        return p.returncode, p.stdout + p.stderr

    def c_names(self, block):
        with open(os.path.join(ROOT, "include", "llm.h"), encoding="utf-8") as f:
            header = set(re.findall(r"\b(?:llm|LLM)_[A-Za-z0-9_]+\b", f.read()))
        used = set(re.findall(r"\b(?:llm|LLM)_[A-Za-z0-9_]+\b", block.text))
        # The *_params_init functions are inline wrappers of *_params_init_sized.
        missing = sorted(n for n in used - header if n + "_sized" not in header)
        if missing:
            return 1, "not in include/llm.h: " + ", ".join(missing)
        return 0, ""

    def c_program(self, block, env_file, timeout_s):
        src = os.path.join(self.scratch, "docs_block_%d.c" % block.line)
        with open(src, "w", encoding="utf-8") as f:
            f.write(block.text)
        exe = src[:-2]
        script = ("cc -std=c11 -Iinclude %s -o %s -Lbuild -lllminfer -Wl,-rpath,%s\n%s\n"
                  % (src, exe, self.build, exe))
        return self.shell(script, env_file, timeout_s)

    def run_file(self, path):
        blocks = parse(path)
        if not blocks:
            return
        env_file = os.path.join(self.scratch, "env-%s" % os.path.basename(path))
        if os.path.exists(env_file):
            os.remove(env_file)
        background, port_map = [], {}
        self.bg_log = open(os.path.join(self.scratch, "background.log"), "a")
        try:
            for block in blocks:
                self.run_block(block, env_file, background, port_map)
        finally:
            for proc in background:
                if proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGTERM)
                    try:
                        proc.wait(timeout=20)
                    except subprocess.TimeoutExpired:
                        os.killpg(proc.pid, signal.SIGKILL)
                        proc.wait()
            self.bg_log.close()

    def run_block(self, block, env_file, background, port_map):
        kind, arg = block.kind(), block.arg()
        if kind == "skip":
            self.skipped.append((block, arg.strip("() ") or "no reason given"))
            print("SKIP  %s: %s" % (block.where(), self.skipped[-1][1]), flush=True)
            return
        if kind and kind not in ("save", "background", "exit"):
            self.fail(block, "unknown docs-test annotation %r" % block.note, "")
            return
        text = block.text
        for old, new in port_map.items():
            text = re.sub(r"\b%d\b" % old, str(new), text)
        want = int(arg.split()[0]) if kind == "exit" else 0
        start = time.time()
        if kind == "save":
            name = arg.split()[0]
            with open(os.path.join(self.scratch, name), "w", encoding="utf-8") as f:
                f.write(text)
            rc, out = 0, ""
        elif kind == "background":
            port = int(arg.split()[0])
            port_map[port] = free_port()
            text = re.sub(r"\b%d\b" % port, str(port_map[port]), text)
            proc = self.shell(text, env_file, 0, background=True)
            background.append(proc)
            why = wait_for_port(port_map[port], proc)
            rc, out = (0, "") if why is None else (1, why + " (its output: %s)" % self.bg_log.name)
        elif block.lang in ("sh", "bash"):
            rc, out = self.shell(text, env_file, BLOCK_TIMEOUT_S)
        elif block.lang == "console":
            cmds = [l[2:] for l in text.split("\n") if l.startswith("$ ")]
            rc, out = self.shell("\n".join(cmds), env_file, BLOCK_TIMEOUT_S)
        elif block.lang == "c":
            if re.search(r"\bint\s+main\s*\(", text):
                rc, out = self.c_program(block, env_file, BLOCK_TIMEOUT_S)
            else:
                rc, out = self.c_names(block)
                kind = "names"
        elif block.lang == "python":
            src = os.path.join(self.scratch, "docs_block_%d.py" % block.line)
            with open(src, "w", encoding="utf-8") as f:
                f.write(text)
            rc, out = self.shell("python %s" % src, env_file, BLOCK_TIMEOUT_S)
        else:
            rc, out = self.toolchain_program(block, text, env_file)
        secs = time.time() - start
        if rc != want:
            self.fail(block, "exit status %d, expected %d" % (rc, want), out)
        else:
            self.ran.append(block)
            what = {"names": "names checked", "save": "saved", "background": "started"}
            print("PASS  %s %s(%.1fs)" % (block.where(),
                                          what[kind] + " " if kind in what else "", secs),
                  flush=True)

    def toolchain_program(self, block, text, env_file):
        tool = "go" if block.lang == "go" else "cargo"
        if not shutil.which(tool, path=self.base_env["PATH"]):
            return 1, "%s not found (install the toolchain: scripts/install-deps.sh)" % tool
        work = os.path.join(self.scratch, "%s_block_%d" % (block.lang, block.line))
        os.makedirs(work)
        if block.lang == "go":
            with open(os.path.join(work, "main.go"), "w", encoding="utf-8") as f:
                f.write(text)
            script = ("cd %s\ngo mod init docsblock >/dev/null 2>&1\n"
                      "go mod edit -require=github.com/libllminfer/llminfer-go@v0.0.0 "
                      "-replace=github.com/libllminfer/llminfer-go=%s/bindings/go\n"
                      "go build -o prog . && cd %s && %s/prog"
                      % (work, self.scratch, self.scratch, work))
        else:
            os.makedirs(os.path.join(work, "src"))
            with open(os.path.join(work, "src", "main.rs"), "w", encoding="utf-8") as f:
                f.write(text)
            with open(os.path.join(work, "Cargo.toml"), "w", encoding="utf-8") as f:
                f.write('[package]\nname = "docsblock"\nversion = "0.0.0"\nedition = "2021"\n'
                        '[dependencies]\nllminfer = { path = "%s/bindings/rust/llminfer" }\n'
                        % self.scratch)
            script = "cargo run -q --offline --manifest-path %s/Cargo.toml" % work
        return self.shell(script, env_file, BLOCK_TIMEOUT_S)

    def fail(self, block, why, out):
        self.failed.append((block, why))
        print("FAIL  %s: %s" % (block.where(), why), flush=True)
        for line in out.rstrip().split("\n")[-40:]:
            if line:
                print("    | " + line)


def doc_files():
    files = [os.path.join(ROOT, "README.md")]
    for sub in ("docs", os.path.join("docs", "bindings")):
        d = os.path.join(ROOT, sub)
        files += [os.path.join(d, n) for n in sorted(os.listdir(d)) if n.endswith(".md")]
    return files


SELF_TEST_DOC = """# A page

```sh
export GREETING=hello
```

<!-- docs-test: skip (shows a placeholder) -->
```sh
cat <file>
```

```sh
test "$GREETING" = hello   # set by the block above
```

<!-- docs-test: exit 3 -->
```console
$ sh -c 'exit 3'
output that is not run
```

```sh
false
```

```c
llm_model_no_such_function(model);
```

```text
not a command
```
"""


def self_test(build):
    """The runner on a page with known outcomes: 3 pass, 1 skip, 2 fail."""
    scratch = tempfile.mkdtemp(prefix="llminfer-docs-self-")
    try:
        page = os.path.join(scratch, "page.md")
        with open(page, "w", encoding="utf-8") as f:
            f.write(SELF_TEST_DOC)
        runner = Runner(build, os.path.join(scratch, "run"), venv=False)
        with contextlib.redirect_stdout(io.StringIO()):  # its FAIL lines are expected
            runner.run_file(page)
        got = ([b.line for b in runner.ran], [b.line for b, _ in runner.skipped],
               [b.line for b, _ in runner.failed])
        want = ([3, 12, 17], [8], [22, 26])
        print("docs-test self-test: %s" % ("ok" if got == want else "got %r, want %r" % (got, want)))
        return 0 if got == want else 1
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--list", action="store_true", help="list the blocks and their annotations")
    ap.add_argument("--keep", action="store_true", help="keep the scratch folder")
    ap.add_argument("--self-test", action="store_true",
                    help="only check the runner on a page with known outcomes")
    ap.add_argument("files", nargs="*")
    args = ap.parse_args()
    files = [os.path.abspath(f) for f in args.files] or doc_files()
    if args.list:
        for path in files:
            for b in parse(path):
                print("%s %s" % (b.where(), b.note or "run"))
        return 0
    build = os.path.abspath(args.build)
    if not os.path.exists(os.path.join(build, "libllminfer.so")):
        print("docs-test: no library in %s (make all)" % build, file=sys.stderr)
        return 1
    status = self_test(build)
    if status or args.self_test:
        return status
    scratch = tempfile.mkdtemp(prefix="llminfer-docs-")
    runner = Runner(build, scratch)
    start = time.time()
    try:
        for path in files:
            runner.run_file(path)
    finally:
        if args.keep or runner.failed:
            print("docs-test: scratch folder kept: %s" % scratch)
        else:
            shutil.rmtree(scratch, ignore_errors=True)
    if runner.skipped:
        print("\nskipped blocks (marked in the Markdown):")
        for block, why in runner.skipped:
            print("    %s: %s" % (block.where(), why))
    if runner.failed:
        print("\nfailed blocks:")
        for block, why in runner.failed:
            print("    %s: %s" % (block.where(), why))
    print("docs-test: %d run, %d skipped, %d failed (%.0fs)"
          % (len(runner.ran), len(runner.skipped), len(runner.failed), time.time() - start))
    return 1 if runner.failed else 0


if __name__ == "__main__":
    sys.exit(main())
