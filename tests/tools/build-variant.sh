#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Builds one variant of the library for an A/B run on a GPU machine
# (tests/bench/ab_variants.py, or flashdecode --bench with LD_LIBRARY_PATH):
#
#   tests/tools/build-variant.sh NAME [GIT_REF] [FLAGS]
#
# checks GIT_REF (default HEAD; "." for the working tree as it is, with
# uncommitted edits) out into a scratch worktree, builds only the library
# for the CUDA architectures in FD_VARIANT_ARCHS (default 90a-real, the
# H200) with FLAGS added to the host and CUDA compilers (e.g.
# "-DFD_FUSED_MERGE_MAX_BYTES=0", which policy.cpp reads), and
# copies libflashdecode.so.0 to ab/NAME/ at the repository root. ab/ is
# not tracked: name it in the device run's carry. Each variant must have its
# own path (ab_variants.py refuses two libraries that share code).
#
# Example, on this machine, then on the GPU machine:
#   tests/tools/build-variant.sh base HEAD~1
#   tests/tools/build-variant.sh nofuse HEAD -DFD_FUSED_MERGE_MAX_BYTES=0
#   python3 tests/bench/ab_variants.py --lib base=ab/base/libflashdecode.so.0 \
#       --lib nofuse=ab/nofuse/libflashdecode.so.0 --shapes 1,5,7
set -euo pipefail

if [ $# -lt 1 ] || [ $# -gt 3 ]; then
  sed -n '2,19p' "$0" >&2
  exit 2
fi
name=$1
ref=${2:-HEAD}
flags=${3:-}
archs=${FD_VARIANT_ARCHS:-90a-real}
root=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
export PATH="$PATH:/usr/local/cuda/bin"

case "$name" in
  "" | */* | .*) echo "build-variant.sh: NAME must be a plain folder name, not '$name'" >&2; exit 2 ;;
esac

scratch=$(mktemp -d "${TMPDIR:-/tmp}/fd-variant-$name.XXXXXX")
cleanup() {
  git -C "$root" worktree remove --force "$scratch/src" >/dev/null 2>&1 || true
  rm -rf "$scratch"
}
trap cleanup EXIT

if [ "$ref" = "." ]; then
  # The working tree as it is: tracked files with their edits, and untracked
  # files git does not ignore.
  mkdir -p "$scratch/src"
  git -C "$root" ls-files -z --cached --others --exclude-standard |
    (cd "$root" && xargs -0 cp --parents -t "$scratch/src" 2>/dev/null || true)
else
  git -C "$root" worktree add --detach --quiet "$scratch/src" "$ref"
fi

generator=()
command -v ninja >/dev/null 2>&1 && generator=(-G Ninja)
# Quiet on success; on failure the build's last lines say why.
log=$scratch/build.log
if ! { cmake -S "$scratch/src" -B "$scratch/build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
         -DFLASHDECODE_CUDA_ARCHS="$archs" -DFLASHDECODE_TESTS=OFF -DCMAKE_CUDA_FLAGS="$flags" \
         -DCMAKE_CXX_FLAGS="$flags" &&
       cmake --build "$scratch/build" --target flashdecode --parallel; } >"$log" 2>&1; then
  tail -n 40 "$log" >&2
  echo "build-variant.sh: building $name failed" >&2
  exit 1
fi
mkdir -p "$root/ab/$name"
cp "$scratch/build/src/libflashdecode.so.0" "$root/ab/$name/"
if [ "$ref" = "." ]; then
  what="the working tree at $(git -C "$root" rev-parse --short HEAD)"
else
  what=$(git -C "$root" rev-parse --short "$ref")
fi
echo "ab/$name/libflashdecode.so.0: $what${flags:+, $flags}"
