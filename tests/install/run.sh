#!/usr/bin/env bash
# Install test: installs the library the way a packager would, then builds
# and runs a downstream program against the installed copy, found through
# pkg-config only.
#
#   tests/install/run.sh <BUILD dir> "<CC>" "<LDSAN flags>"
#
#  1. `make install PREFIX=<BUILD>/install-test/usr` (DESTDIR empty); checks
#     the installed files, the symlinks, the SONAME and the .pc file, and
#     that every installed tool (llm-run, llm-serve, llm-bench,
#     llm-quantize) runs without LD_LIBRARY_PATH and prints a man-style
#     --help (NAME, SYNOPSIS, OPTIONS, EXIT STATUS).
#  2. Builds tests/install/demo.c with `pkg-config --cflags --libs llminfer`
#     (plus the sanitizer flags, when given) and runs it with
#     LD_LIBRARY_PATH pointing at the installed lib/. With a model (the
#     LLM_TEST_MODEL environment variable, else the repository's model when
#     it has been fetched; LLM_TEST_MODEL= disables it) the demo also
#     generates 8 greedy tokens. The installed bin/llm-run runs too
#     (--help; a missing model exits 2).
#     It builds once more with the .pc file's rpath variable and runs
#     without LD_LIBRARY_PATH.
#  2a. The README's demo exactly as written ("Using the library from C":
#     its C program and its shell lines), run in a scratch folder with
#     HOME pointing at a scratch home, so `make install PREFIX=$HOME/.local`
#     installs there; `make` runs in the repository with this BUILD, and
#     `cc` is the build's compiler (with the sanitizer flags in a
#     sanitized build). The demo must run with no LD_LIBRARY_PATH and, with
#     a model, print generated text.
#  2b. The CUDA plug-in: when the build made it (LLM_CUDA_PLUGIN, set by
#     `make install-test`; else build/libllminfer-cuda.so exists), it is
#     installed beside the library, and tests/install/backends.c, linked
#     against the installed library, loads it from there: "cuda" shows its
#     probe's verdict, not a loader's message. Without it, "cuda" says the
#     plug-in is not installed and names the library's folder.
#  3. Links the demo statically through llminfer-static.pc (the archive by
#     name, plus the libraries llminfer.pc lists in Libs.private) and runs it;
#     backends.c too, which finds the plug-in through LD_LIBRARY_PATH.
#  4. Checks the public header compiles as C++ (when a C++ compiler exists).
#  5. `make install DESTDIR=<stage> PREFIX=/usr` (packager staging) puts
#     everything under the stage, and the demo builds from it with
#     PKG_CONFIG_SYSROOT_DIR.
#
# Prints "install-test: ok" as its last line, or fails with exit status 1.
set -euo pipefail

if [ "$#" -lt 1 ] || [ "$#" -gt 3 ]; then
    echo "usage: $0 <BUILD dir> [\"<CC>\"] [\"<LDSAN flags>\"]" >&2
    exit 2
fi

here=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)
root=$(cd -- "$here/../.." && pwd)
cd -- "$root"

build_arg=$1
read -r -a cc <<<"${2:-cc}"
[ "${#cc[@]}" -gt 0 ] || cc=(cc)
ldsan=()
read -r -a ldsan <<<"${3:-}"

mkdir -p -- "$build_arg"
build=$(cd -- "$build_arg" && pwd)
work=$build/install-test
prefix=$work/usr
stage=$work/stage
rm -rf -- "$work"
mkdir -p -- "$work"

die() {
    echo "install-test: FAILED: $*" >&2
    exit 1
}
show() { # log
    sed -e 's/^/    | /' "$1" >&2
}

soname=libllminfer.so.1
major=$(sed -n -E 's/^#define LLM_VERSION_MAJOR ([0-9]+).*/\1/p' include/llm.h)
minor=$(sed -n -E 's/^#define LLM_VERSION_MINOR ([0-9]+).*/\1/p' include/llm.h)
patch=$(sed -n -E 's/^#define LLM_VERSION_PATCH ([0-9]+).*/\1/p' include/llm.h)
version=$major.$minor.$patch
if [ -z "$major" ] || [ -z "$minor" ] || [ -z "$patch" ]; then
    die "could not read LLM_VERSION_* from include/llm.h"
fi
realname=libllminfer.so.$version

# --- 1. install into a scratch prefix -------------------------------------
if ! make --no-print-directory install BUILD="$build_arg" PREFIX="$prefix" DESTDIR= \
    >"$work/install.log" 2>&1; then
    show "$work/install.log"
    die "make install PREFIX=$prefix failed"
fi

libdir=$prefix/lib
tools=(llm-run llm-serve llm-bench llm-quantize)
for f in include/llm.h lib/$realname lib/libllminfer.a lib/pkgconfig/llminfer.pc \
    lib/pkgconfig/llminfer-static.pc "${tools[@]/#/bin/}"; do
    [ -f "$prefix/$f" ] || die "make install did not install $f (in $prefix)"
done
cmp -s include/llm.h "$prefix/include/llm.h" || die "the installed llm.h differs from include/llm.h"
# Each tool runs from the prefix with no LD_LIBRARY_PATH (its rpath is
# $ORIGIN/../lib) and documents itself the way a man page would.
for t in "${tools[@]}"; do
    [ -x "$prefix/bin/$t" ] || die "bin/$t is not executable"
    if ! env -u LD_LIBRARY_PATH "$prefix/bin/$t" --help >"$work/$t-help.log" 2>&1; then
        show "$work/$t-help.log"
        die "the installed bin/$t --help failed without LD_LIBRARY_PATH"
    fi
    for section in NAME SYNOPSIS OPTIONS "EXIT STATUS"; do
        grep -q "^$section\$" "$work/$t-help.log" || die "bin/$t --help has no $section section"
    done
    grep -q "^  $t - " "$work/$t-help.log" || die "bin/$t --help does not name itself under NAME"
done

check_link() { # link expected-target
    [ -L "$libdir/$1" ] || die "lib/$1 is not a symlink"
    local target
    target=$(readlink "$libdir/$1")
    [ "$target" = "$2" ] || die "lib/$1 points to '$target', expected '$2' (relative)"
    [ -f "$libdir/$1" ] || die "lib/$1 is a dangling symlink"
}
check_link "$soname" "$realname"
check_link libllminfer.so "$soname"

got_soname=$(readelf -d "$libdir/$realname" | sed -n -E 's/.*\(SONAME\).*\[(.*)\].*/\1/p')
[ "$got_soname" = "$soname" ] ||
    die "the installed $realname has SONAME '${got_soname:-<none>}', expected '$soname'"

# --- 2. a downstream program through pkg-config ----------------------------
command -v pkg-config >/dev/null 2>&1 || die "pkg-config is not installed"
pc() { PKG_CONFIG_LIBDIR=$libdir/pkgconfig PKG_CONFIG_PATH='' pkg-config "$@"; }
pc --exists llminfer || die "pkg-config cannot find llminfer in $libdir/pkgconfig"
if pkg-config --help 2>&1 | grep -q -e '--validate'; then
    pc --validate llminfer >"$work/validate.log" 2>&1 || {
        show "$work/validate.log"
        die "pkg-config --validate llminfer failed"
    }
fi
pc_version=$(pc --modversion llminfer)
[ "$pc_version" = "$version" ] || die "llminfer.pc says version $pc_version, llm.h says $version"
pc_prefix=$(pc --variable=prefix llminfer)
[ "$pc_prefix" = "$prefix" ] || die "llminfer.pc has prefix=$pc_prefix, expected $prefix"
read -r -a cflags <<<"$(pc --cflags llminfer)"
read -r -a libs <<<"$(pc --libs llminfer)"
read -r -a static_libs <<<"$(pc --libs --static llminfer)"

warn=(-std=c11 -Wall -Wextra -Wpedantic -Werror)
demo=$work/demo
if ! "${cc[@]}" "${warn[@]}" tests/install/demo.c "${cflags[@]}" "${libs[@]}" "${ldsan[@]}" \
    -o "$demo" >"$work/cc.log" 2>&1; then
    show "$work/cc.log"
    die "building demo.c with: ${cc[*]} ${warn[*]} demo.c ${cflags[*]} ${libs[*]} ${ldsan[*]}"
fi
readelf -d "$demo" | grep -q "(NEEDED).*\[$soname\]" ||
    die "demo does not link $soname (NEEDED: $(readelf -d "$demo" | grep NEEDED | tr -s ' '))"

# The model: LLM_TEST_MODEL when set (even to ""), else the fetched one.
model=${LLM_TEST_MODEL-}
if [ -z "${LLM_TEST_MODEL+set}" ] && [ -f "$root/models/SmolLM2-135M-Instruct.Q4_1.gguf" ]; then
    model=$root/models/SmolLM2-135M-Instruct.Q4_1.gguf
fi

run_demo() { # name binary [env...]
    local name=$1 bin=$2
    shift 2
    if ! env LLM_TEST_MODEL="$model" "$@" "$bin" >"$work/$name.log" 2>&1; then
        show "$work/$name.log"
        die "$name exited with an error"
    fi
}
run_demo demo "$demo" LD_LIBRARY_PATH="$libdir"
ldd_out=$(LD_LIBRARY_PATH=$libdir ldd "$demo")
grep -q "$soname => $libdir/$soname" <<<"$ldd_out" ||
    die "demo did not resolve $soname to the installed copy: $(grep llminfer <<<"$ldd_out")"
sed -e 's/^/    /' "$work/demo.log"

# The installed llm-run starts against the installed library: --help exits
# 0, a missing model is a runtime error (exit status 2).
if ! LD_LIBRARY_PATH=$libdir "$prefix/bin/llm-run" --help >"$work/llm-run.log" 2>&1; then
    show "$work/llm-run.log"
    die "the installed bin/llm-run --help failed"
fi
rc=0
LD_LIBRARY_PATH=$libdir "$prefix/bin/llm-run" -m /nonexistent/llminfer-install-test.gguf -n 1 \
    >"$work/llm-run.log" 2>&1 || rc=$?
if [ "$rc" -ne 2 ]; then
    show "$work/llm-run.log"
    die "the installed bin/llm-run with a missing model exited $rc, expected 2 (runtime error)"
fi

# The .pc file's rpath variable: the demo finds the installed library with
# no LD_LIBRARY_PATH.
read -r -a rpath <<<"$(pc --variable=rpath llminfer)"
[ "${#rpath[@]}" -gt 0 ] || die "llminfer.pc has no rpath variable"
if ! "${cc[@]}" "${warn[@]}" tests/install/demo.c "${cflags[@]}" "${libs[@]}" "${rpath[@]}" \
    "${ldsan[@]}" -o "$demo-rpath" >"$work/cc-rpath.log" 2>&1; then
    show "$work/cc-rpath.log"
    die "building demo.c with the rpath variable: ${rpath[*]}"
fi
run_demo demo-rpath "$demo-rpath" LD_LIBRARY_PATH= LLM_TEST_MODEL=
ldd_out=$(env -u LD_LIBRARY_PATH ldd "$demo-rpath")
grep -q "$soname => $libdir/$soname" <<<"$ldd_out" ||
    die "demo-rpath did not resolve $soname through its rpath: $(grep llminfer <<<"$ldd_out")"

# --- 2a. the README's demo, exactly as written ------------------------------
# readme_block LANG HEADING: the first ```LANG block after the line HEADING.
readme_block() {
    awk -v lang="$1" -v heading="$2" '
        $0 == heading { seen = 1; next }
        seen && !inside && $0 == "```" lang { inside = 1; next }
        inside && $0 == "```" { exit }
        inside { print }' README.md
}
readme=$work/readme
mkdir -p -- "$readme/home" "$readme/bin" "$readme/work"
readme_block c "## Using the library from C" >"$readme/work/demo.c"
readme_block sh "## Using the library from C" >"$readme/commands.sh"
[ -s "$readme/work/demo.c" ] || die "README.md has no C block under 'Using the library from C'"
grep -q 'make install PREFIX=\$HOME' "$readme/commands.sh" ||
    die "the README's demo commands do not install with make install PREFIX=\$HOME/...: $(cat "$readme/commands.sh")"
# `make` as the README runs it in the clone, with this build folder (its
# output in make.log); `cc` is the build's compiler.
printf '#!/bin/sh\nexec %q -C %q BUILD=%q "$@" >>%q 2>&1\n' "$(command -v make)" "$root" "$build" \
    "$readme/make.log" >"$readme/bin/make"
real_cc=$(command -v "${cc[0]}") || die "no compiler ${cc[0]}"
printf '#!/bin/sh\nexec %q %s "$@" %s\n' "$real_cc" "${cc[*]:1}" "${ldsan[*]:-}" >"$readme/bin/cc"
chmod +x "$readme/bin/make" "$readme/bin/cc"
demo_model=$(sed -n -E 's/.*llm_model_load\("([^"]*)".*/\1/p' "$readme/work/demo.c")
[ -d "$root/models" ] && ln -s "$root/models" "$readme/work/models"
# Without the model (LLM_TEST_MODEL=, or none fetched) the demo is built, not run.
run_readme_demo=0
if [ -n "$model" ] && [ -f "$readme/work/$demo_model" ]; then
    run_readme_demo=1
else
    sed -i -e '/^\.\/demo/d' "$readme/commands.sh"
fi
if ! (cd -- "$readme/work" && env -u LD_LIBRARY_PATH -u PKG_CONFIG_PATH -u PKG_CONFIG_LIBDIR \
    HOME="$readme/home" PATH="$readme/bin:$PATH" bash -e ../commands.sh) >"$readme/log" 2>&1; then
    [ -f "$readme/make.log" ] && show "$readme/make.log"
    show "$readme/log"
    die "the README's demo commands failed (README.md, 'Using the library from C')"
fi
[ -f "$readme/home/.local/lib/$soname" ] ||
    die "the README's make install did not install into \$HOME/.local"
readelf -d "$readme/work/demo" | grep -q "R.*PATH.*$readme/home/.local/lib" ||
    die "the README's demo has no rpath to \$HOME/.local/lib: $(readelf -d "$readme/work/demo" | grep PATH)"
if [ "$run_readme_demo" = 1 ]; then
    [ -n "$(tr -d '[:space:]' <"$readme/log")" ] || die "the README's demo printed no text"
    echo "    README demo: $(tr '\n' ' ' <"$readme/log")"
fi

# --- 2b. the CUDA plug-in ----------------------------------------------------
if [ -n "${LLM_CUDA_PLUGIN+set}" ]; then
    plugin=$LLM_CUDA_PLUGIN
elif [ -f "$build/libllminfer-cuda.so" ]; then
    plugin=$build/libllminfer-cuda.so
else
    plugin=
fi
if [ -n "$plugin" ]; then
    [ -f "$libdir/libllminfer-cuda.so" ] || die "make install did not install lib/libllminfer-cuda.so"
elif [ -e "$libdir/libllminfer-cuda.so" ]; then
    die "make install installed lib/libllminfer-cuda.so, which this build did not make"
fi
# The "cuda" line a backends program prints; LLM_PLUGIN_PATH (the test
# runner's) would point elsewhere.
cuda_line() { # name binary [env...]
    local name=$1 bin=$2
    shift 2
    if ! env -u LLM_PLUGIN_PATH "$@" "$bin" >"$work/$name.log" 2>&1; then
        show "$work/$name.log"
        die "$name exited with an error"
    fi
    sed -e "s/^/    $name: /" "$work/$name.log" >&2
    grep '^cuda: ' "$work/$name.log" || die "$name does not list 'cuda'"
}
expect_plugin_loaded() { # name line
    case $2 in
    "cuda: available"*) ;;
    *plug-in*) die "$1 did not load the installed CUDA plug-in: $2" ;;
    esac
}
if ! "${cc[@]}" "${warn[@]}" tests/install/backends.c "${cflags[@]}" "${libs[@]}" "${rpath[@]}" \
    "${ldsan[@]}" -o "$work/backends" >"$work/cc-backends.log" 2>&1; then
    show "$work/cc-backends.log"
    die "building backends.c with: ${cflags[*]} ${libs[*]} ${rpath[*]}"
fi
line=$(cuda_line backends "$work/backends" -u LD_LIBRARY_PATH)
if [ -n "$plugin" ]; then
    expect_plugin_loaded backends "$line"
else
    [[ $line == "cuda: the CUDA plug-in is not installed (looked for libllminfer-cuda.so in $libdir"* ]] ||
        die "backends says '$line', expected the CUDA plug-in not installed, looked for in $libdir"
fi

# --- 3. static linking ------------------------------------------------------
# `pkg-config --static --libs llminfer` keeps -lllminfer, which the linker
# resolves to the shared library when both are installed; llminfer-static.pc
# names the archive itself.
pc --exists llminfer-static || die "pkg-config cannot find llminfer-static"
[ "$(pc --modversion llminfer-static)" = "$version" ] || die "llminfer-static.pc version differs"
read -r -a static_args <<<"$(pc --cflags --libs llminfer-static)"
# Libs.private of llminfer.pc and the static file's libraries agree.
for a in "${static_libs[@]}"; do
    case $a in -L* | -lllminfer | -Wl,-rpath,*) continue ;; esac
    [[ " ${static_args[*]} " == *" $a "* ]] ||
        die "llminfer.pc links $a statically, llminfer-static.pc does not"
done
if ! "${cc[@]}" "${warn[@]}" tests/install/demo.c "${static_args[@]}" \
    "${ldsan[@]}" -o "$demo-static" >"$work/cc-static.log" 2>&1; then
    show "$work/cc-static.log"
    die "linking demo.c against libllminfer.a with: ${static_args[*]}"
fi
if readelf -d "$demo-static" | grep -q "(NEEDED).*libllminfer"; then
    die "demo-static still needs the shared libllminfer"
fi
run_demo demo-static "$demo-static"
if ! "${cc[@]}" "${warn[@]}" tests/install/backends.c "${static_args[@]}" \
    "${ldsan[@]}" -o "$work/backends-static" >"$work/cc-backends-static.log" 2>&1; then
    show "$work/cc-backends-static.log"
    die "linking backends.c against libllminfer.a with: ${static_args[*]}"
fi
line=$(cuda_line backends-static "$work/backends-static" LD_LIBRARY_PATH="$libdir")
[ -z "$plugin" ] || expect_plugin_loaded backends-static "$line"

# --- 4. the header from C++ ------------------------------------------------
if command -v c++ >/dev/null 2>&1; then
    printf '#include <llm.h>\nint main() { return llm_version_number() == 0; }\n' >"$work/cxx.cc"
    if ! c++ -std=c++11 -Wall -Wextra -Wpedantic -Werror -fsyntax-only "${cflags[@]}" \
        "$work/cxx.cc" >"$work/cxx.log" 2>&1; then
        show "$work/cxx.log"
        die "the installed llm.h does not compile as C++11"
    fi
fi

# --- 5. DESTDIR staging ----------------------------------------------------
if ! make --no-print-directory install BUILD="$build_arg" PREFIX=/usr DESTDIR="$stage" \
    >"$work/install-stage.log" 2>&1; then
    show "$work/install-stage.log"
    die "make install DESTDIR=$stage PREFIX=/usr failed"
fi
stage_files=(include/llm.h lib/$realname lib/$soname lib/libllminfer.so lib/pkgconfig/llminfer.pc)
[ -z "$plugin" ] || stage_files+=(lib/libllminfer-cuda.so)
for f in "${stage_files[@]}"; do
    [ -e "$stage/usr/$f" ] || die "make install DESTDIR=$stage PREFIX=/usr did not create usr/$f"
done
grep -q '^prefix=/usr$' "$stage/usr/lib/pkgconfig/llminfer.pc" ||
    die "with DESTDIR, llminfer.pc must say prefix=/usr (DESTDIR must not leak into it)"
if grep -r -l -F "$stage" "$stage/usr" >"$work/leak.log" 2>/dev/null; then
    show "$work/leak.log"
    die "installed files mention the DESTDIR path $stage"
fi
stage_pc() {
    PKG_CONFIG_SYSROOT_DIR=$stage PKG_CONFIG_LIBDIR=$stage/usr/lib/pkgconfig PKG_CONFIG_PATH='' \
        pkg-config "$@"
}
read -r -a stage_flags <<<"$(stage_pc --cflags --libs llminfer)"
if ! "${cc[@]}" "${warn[@]}" tests/install/demo.c "${stage_flags[@]}" "${ldsan[@]}" \
    -o "$work/demo-stage" >"$work/cc-stage.log" 2>&1; then
    show "$work/cc-stage.log"
    die "building demo.c against the DESTDIR stage with: ${stage_flags[*]}"
fi
run_demo demo-stage "$work/demo-stage" LD_LIBRARY_PATH="$stage/usr/lib" LLM_TEST_MODEL=

echo "install-test: ok"
