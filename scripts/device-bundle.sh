#!/usr/bin/env bash
# make device-bundle: everything `make device-check` runs, built here ahead
# of time for a GPU machine that cannot build the library (no -dev packages
# for PCRE2, cJSON or cmocka, no network): release binaries, the CUDA
# plug-in and benchmarks for one GPU architecture, the test binaries, and
# the shared libraries they need beyond the C and CUDA runtimes, stripped
# of debug information, in one folder laid out as build/ is.
#
#   scripts/device-bundle.sh [ARCH]    ARCH: compute capability, default 90
#
# The folder is also packed into build/device-bundle.tar.xz (at most 40 MB:
# it travels beside a part of a model). On the GPU machine, from a checkout
# holding the folder, or the archive unpacked with `tar -C build -xJf`:
#   DEVICE_CHECK_PREBUILT=1 BUILD=build/device-bundle make device-check
# scripts/device-carry.sh plans the transfers of the archive and the models.
# Binaries built against this machine's C library run on one with the same
# or a newer glibc.
set -euo pipefail
cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.."

arch=${1:-90}
case "$arch" in '' | *[!0-9]*) echo "device-bundle: ARCH must be a number like 90" >&2; exit 2 ;; esac
src=build/device-build
dst=build/device-bundle

mapfile -t targets < <(DEVICE_CHECK_PRINT_TARGETS=1 BUILD=$src bash scripts/device-check.sh)
make -j"$(nproc)" --no-print-directory BUILD=$src \
    "CUDA_GENCODE=-gencode arch=compute_$arch,code=sm_$arch" all "${targets[@]}"

rm -rf "$dst"
mkdir -p "$dst/lib"
for t in "${targets[@]}" $src/libllminfer.so*; do
    rel=${t#$src/}
    mkdir -p "$dst/$(dirname "$rel")"
    cp -P "$t" "$dst/$rel"
    [ -L "$dst/$rel" ] || strip --strip-debug "$dst/$rel"
done
# The libraries a CUDA image may lack (libc, libstdc++ and CUDA's own are
# the machine's).
for lib in libpcre2-8.so.0 libcjson.so.1 libcmocka.so.0 libz.so.1 libmicrohttpd.so.12; do
    path=$(ldconfig -p | awk -v l="$lib" '$1 == l && /x86-64/ { print $NF; exit }')
    [ -n "$path" ] && cp -L "$path" "$dst/lib/$lib"
done
# One archive to carry: xz with a 64 MiB window finds the kernels' fat
# binary and the static CUDA runtime repeated in every test binary, which
# gzip's 32 KiB window cannot.
archive=build/device-bundle.tar.xz
tar -C build -cf - device-bundle | xz -T0 -9e --lzma2=preset=9e,dict=64MiB >"$archive.tmp"
mv "$archive.tmp" "$archive"
size=$(stat -c %s "$archive")
echo "device-bundle: $dst for sm_$arch, $(du -sh "$dst" | cut -f1); $archive $((size / 1000000)) MB"
limit=$((40 * 1000 * 1000))
if [ "$size" -gt "$limit" ]; then
    echo "device-bundle: $archive is over 40 MB, too big to travel beside a model part" >&2
    exit 1
fi
