#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The ABI of the library against the last release's, recorded in tests/abi/
# (the rules, and why the check is built this way: docs/abi.md).
#
#   check_abi.sh check LIBRARY BASELINE SUPPRESSIONS SOURCE_DIR WORK_DIR [CMAKE_ARG...]
#     Fails if abidiff reports a change from BASELINE, in LIBRARY's symbols
#     or in the public types, that SUPPRESSIONS does not allow (it allows
#     added functions), or if a function new since BASELINE is not in the
#     version node of a later minor release. Fields appended to a struct that
#     starts with struct_size are allowed by cutting the struct back to its
#     baseline size before the comparison.
#   check_abi.sh dump SOURCE_DIR WORK_DIR OUT [CMAKE_ARG...]
#     Writes the ABI of SOURCE_DIR's library to OUT: a release's baseline.
#
# abidiff compares types only where the library has DWARF; without it, it
# silently compares ELF symbols (names and versions) alone. The release build
# has none, so unless LIBRARY has .debug_info the types are taken from a
# CPU-only Debug build of SOURCE_DIR made under WORK_DIR (the CMAKE_ARGs
# choose generator and compilers). That build stands for every build: the
# types come from the public header, the symbols from the version script,
# and the CUDA backend adds neither.
set -euo pipefail

die() { echo "check_abi: $*" >&2; exit 1; }
command -v abidiff >/dev/null 2>&1 && command -v abidw >/dev/null 2>&1 ||
  die "abidiff and abidw not found: install abigail-tools (tests/tools/install-deps.sh does)"
# The baseline records x86-64's layout; on another architecture abidiff would
# report the architecture itself as a change.
if [ "$(uname -m)" != x86_64 ]; then
  echo "SKIPPED: the baseline in tests/abi/ is x86-64's, this is $(uname -m)"
  exit 77
fi

# A CPU-only library with debug info from SOURCE_DIR, built under WORK_DIR.
debug_build() {
  local source=$1 work=$2
  shift 2
  mkdir -p "$work"
  rm -f "$work"/src/libflashdecode.so*  # no stale library of another version
  cmake -S "$source" -B "$work" -DCMAKE_BUILD_TYPE=Debug -DFLASHDECODE_CUDA=OFF -DFLASHDECODE_TESTS=OFF \
    -DFLASHDECODE_PROGRAM=OFF -DFLASHDECODE_SANITIZE=OFF -DFLASHDECODE_STATIC=OFF "$@" >"$work.log" 2>&1 ||
    { cat "$work.log"; die "configuring $work failed"; }
  cmake --build "$work" --target flashdecode >>"$work.log" 2>&1 || { cat "$work.log"; die "building $work failed"; }
  debug_library=$(find "$work/src" -maxdepth 1 -type f -name 'libflashdecode.so.*' | head -n 1)
  [ -n "$debug_library" ] || die "no libflashdecode.so.* under $work/src"
}

# Public types only (from the headers in SOURCE_DIR/include), no paths.
ABIDW_FLAGS=(--exported-interfaces-only --drop-private-types --no-corpus-path --no-comp-dir-path --no-show-locs
  --short-locs --no-elf-needed --type-id-style hash)

mode=${1:-}
case "$mode" in
  dump)
    [ $# -ge 4 ] || die "usage: check_abi.sh dump SOURCE_DIR WORK_DIR OUT [CMAKE_ARG...]"
    source=$2 work=$3 out=$4
    shift 4
    debug_build "$source" "$work" "$@"
    abidw "${ABIDW_FLAGS[@]}" --headers-dir "$source/include" --out-file "$out" "$debug_library"
    echo "check_abi: wrote the ABI of $debug_library to $out"
    exit 0
    ;;
  check) ;;
  *) die "usage: check_abi.sh check|dump ... (see the comment at its top)" ;;
esac

[ $# -ge 6 ] || die "usage: check_abi.sh check LIBRARY BASELINE SUPPRESSIONS SOURCE_DIR WORK_DIR [CMAKE_ARG...]"
library=$2 baseline=$3 suppressions=$4 source=$5 work=$6
shift 6

failed=0
# No --headers-dir2: it tells public types by their source locations, which
# the baseline does not record, and would filter every change out. The only
# non-public type the exported functions reach is fd_handle, opaque
# (declaration-only) in the baseline, and so never reported.
# abidiff's exit status is a bit set: 1 error, 2 usage error, 4 ABI change,
# 8 incompatible ABI change. After the suppressions, any bit fails.
compare() {
  local what=$1 status=0
  shift
  echo "== abidiff $(basename "$baseline") $what"
  abidiff --suppressions "$suppressions" "$@" || status=$?
  if [ "$status" -eq 0 ]; then
    echo "ok: no change beyond those docs/abi.md allows"
    return
  fi
  failed=1
  local meaning=""
  [ $((status & 1)) -eq 0 ] || meaning+=", abidiff failed"
  [ $((status & 2)) -eq 0 ] || meaning+=", usage error"
  [ $((status & 4)) -eq 0 ] || meaning+=", ABI change"
  [ $((status & 8)) -eq 0 ] || meaning+=", incompatible ABI change"
  echo "FAILED: abidiff exit status $status (${meaning#, }): see docs/abi.md"
}

mkdir -p "$work"

# Symbols (names and versions) of the library under test, its debug info
# stripped so that abidiff compares nothing else. Every added symbol is then
# "not referenced by debug info", which the suppressions cannot name; added
# functions are checked below.
objcopy --strip-debug "$library" "$work/symbols.so"
compare "$library (symbols)" --no-unreferenced-symbols "$baseline" "$work/symbols.so"

# Types: the library's own debug info, else a CPU-only Debug build's.
sections=$(readelf -S --wide "$library")
if grep -q '\.debug_info' <<<"$sections"; then
  types_library=$library
else
  debug_build "$source" "$work/debug" "$@"
  types_library=$debug_library
fi
abidw "${ABIDW_FLAGS[@]}" --headers-dir "$source/include" --out-file "$work/current.abi" "$types_library"
grep -q "<function-decl name='fd_decode'" "$work/current.abi" || die "no debug info for fd_decode in $types_library"
# Fields appended behind struct_size are allowed: each struct whose first
# member is struct_size is cut back to its baseline size before the
# comparison, so that any other change to it (a field changed, removed,
# inserted before the end, or placed in the old tail padding, which callers
# need not zero) is still reported. One exception: a field in the old tail
# padding named reserved* (docs/abi.md: the library never reads it) is
# dropped too. The structs, their sizes and last member offsets in bits:
struct_sizes=$(awk '
  function attr(line, key) {
    if (!match(line, key "=\047[^\047]*\047")) return ""
    return substr(line, RSTART + length(key) + 2, RLENGTH - length(key) - 3)
  }
  function flush() { if (keep) print name, size, last; keep = 0 }
  /<class-decl / { flush(); name = attr($0, "name"); size = attr($0, "size-in-bits"); first = (size != ""); next }
  /<data-member / { offset = attr($0, "layout-offset-in-bits") }
  first && /<var-decl / { keep = (attr($0, "name") == "struct_size"); first = 0 }
  keep && /<data-member / { last = offset }
  /<\/class-decl>/ { flush() }
  END { flush() }
' "$baseline")
awk '
  function attr(line, key) {
    if (!match(line, key "=\047[^\047]*\047")) return ""
    return substr(line, RSTART + length(key) + 2, RLENGTH - length(key) - 3)
  }
  FNR == NR { limit[$1] = $2; last[$1] = $3; next }
  /<class-decl / {
    name = attr($0, "name"); size = attr($0, "size-in-bits"); cut = ""
    if (size != "" && (name in limit) && size + 0 >= limit[name] + 0) {
      cut = limit[name]
      sub("size-in-bits=\047[0-9]*\047", "size-in-bits=\047" cut "\047")
    }
  }
  /<\/class-decl>/ { cut = "" }
  skip { if (/<\/data-member>/) skip = 0; next }
  cut != "" && /<data-member / {
    offset = attr($0, "layout-offset-in-bits") + 0
    if (offset >= cut + 0) { skip = 1; next }
    if (offset > last[name] + 0) {  # in the old tail padding
      member = $0
      if ((getline) > 0 && attr($0, "name") ~ /^reserved/) { skip = 1; next }
      print member
    }
  }
  { print }
' <(echo "$struct_sizes") "$work/current.abi" >"$work/current-cut.abi"
compare "$types_library (types; struct_size structs cut to their baseline sizes)" \
  "$baseline" "$work/current-cut.abi"

# A function new since the baseline goes into the version node of a later
# minor release, FLASHDECODE_<major>.<minor> (one node per minor), so that a
# program using it fails at load time, naming the version, on a library
# that lacks it. (Existing functions keep their baseline versions: abidiff
# reports one that lost its version as removed.)
echo "== version nodes of functions new since $(basename "$baseline")"
release=$(basename "$baseline" | sed -n 's/^libflashdecode-\([0-9]*\)\.\([0-9]*\)\.[0-9]*\.abi$/\1 \2/p')
[ -n "$release" ] || die "$(basename "$baseline") is not named libflashdecode-<major>.<minor>.<patch>.abi"
read -r release_major release_minor <<<"$release"
baseline_names=$(sed -n "s/.*<elf-symbol name='\(fd_[^']*\)'.*/\1/p" "$baseline" | sort -u)
# Default versions: objdump shows a non-default one in parentheses.
library_functions=$(objdump -T "$library" | awk '$NF ~ /^fd_/ && $(NF-1) !~ /^\(/ {print $NF, $(NF-1)}' | sort -u)
nodes_ok=1
while read -r name node; do
  [ -n "$name" ] || continue
  if grep -qx -- "$name" <<<"$baseline_names"; then continue; fi
  minor=$(echo "$node" | sed -n "s/^FLASHDECODE_${release_major}\.\([0-9]*\)$/\1/p")
  if [ -n "$minor" ] && [ "$minor" -gt "$release_minor" ]; then
    echo "new: $name in $node"
  else
    echo "FAILED: $name is new since $release_major.$release_minor but exported in $node: give it the node of" \
      "the next minor version, FLASHDECODE_$release_major.<minor above $release_minor>, in src/flashdecode.map"
    nodes_ok=0
    failed=1
  fi
done <<<"$library_functions"
[ "$nodes_ok" -eq 0 ] || echo "ok: every new function is in the node of a later minor version"

[ "$failed" -eq 0 ] || exit 1
echo "check_abi: compatible with $(basename "$baseline")"
