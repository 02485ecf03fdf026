#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Builds and installs an older release of the library, for the tests of what
# the bindings do with a library older than their header (bindings/README.md,
# "Older libraries"): a CPU-only build of the commit REF, taken from the
# source directory's git history, installed under WORK/stage (include/,
# lib/libflashdecode.so.0, lib/pkgconfig/).
#   old_library.sh <source dir> <ref> <work dir> [generator]
# Exits 77 (CTest: skipped) when the history does not have REF (a shallow
# clone, an unpacked archive); the tests that use the stage then skip too.
set -euo pipefail
source_dir=$(realpath "$1")
ref=$2
work=$(realpath -m "$3")
generator=${4:-}

rm -rf "$work"
if ! command -v git >/dev/null 2>&1 || ! git -C "$source_dir" cat-file -e "$ref^{commit}" 2>/dev/null; then
  echo "SKIPPED: $source_dir has no git history with commit $ref (a shallow clone or an archive)"
  exit 77
fi
mkdir -p "$work/source"
git -C "$source_dir" archive "$ref" | tar -x -C "$work/source"
cmake -S "$work/source" -B "$work/build" ${generator:+-G "$generator"} -DCMAKE_BUILD_TYPE=Release \
  -DFLASHDECODE_CUDA=OFF -DFLASHDECODE_TESTS=OFF -DFLASHDECODE_PROGRAM=OFF \
  -DCMAKE_INSTALL_PREFIX="$work/stage" -DCMAKE_INSTALL_LIBDIR=lib >"$work/build.log" 2>&1 ||
  { cat "$work/build.log"; exit 1; }
cmake --build "$work/build" >>"$work/build.log" 2>&1 || { cat "$work/build.log"; exit 1; }
cmake --install "$work/build" >>"$work/build.log" 2>&1 || { cat "$work/build.log"; exit 1; }
version=$(awk '/^#define FD_VERSION_(MAJOR|MINOR|PATCH) / {v = v (v == "" ? "" : ".") $3} END {print v}' \
  "$work/stage/include/flashdecode.h")
echo "libflashdecode $version (commit $ref) installed in $work/stage"
