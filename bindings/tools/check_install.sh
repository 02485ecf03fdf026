#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Checks what `cmake --install` laid out: the header; the versioned library,
# its SONAME and symlinks; flashdecode.pc resolving to the install dirs; the
# CMake package, found for requests of its major version only; and, given a
# bindir, the flashdecode program, which must run from there against the
# installed library with no environment set.
#   check_install.sh <includedir> <libdir> <version> <work dir> [<bindir>]
set -euo pipefail
includedir=$(realpath "$1")
libdir=$(realpath "$2")
version=$3
work=$(realpath -m "$4")
bindir=${5:+$(realpath "$5")}
major=${version%%.*}
minor=$(echo "$version" | cut -d. -f2)
fail() { echo "check_install: $*"; exit 1; }

[ -f "$includedir/flashdecode.h" ] || fail "no $includedir/flashdecode.h"
library=$libdir/libflashdecode.so.$version
[ -f "$library" ] && [ ! -L "$library" ] || fail "no library file $library"
[ "$(readlink "$libdir/libflashdecode.so.$major")" = "libflashdecode.so.$version" ] || fail "libflashdecode.so.$major is not a link to libflashdecode.so.$version"
[ "$(readlink "$libdir/libflashdecode.so")" = "libflashdecode.so.$major" ] || fail "libflashdecode.so is not a link to libflashdecode.so.$major"
soname=$(objdump -p "$library" | awk '$1 == "SONAME" {print $2}')
[ "$soname" = "libflashdecode.so.$major" ] || fail "SONAME is '$soname'"
echo "library: $library, SONAME $soname, with both links"

export PKG_CONFIG_PATH=$libdir/pkgconfig
[ "$(pkg-config --modversion flashdecode)" = "$version" ] || fail "pkg-config version is not $version"
for variable in libdir includedir; do
  resolved=$(realpath -m "$(pkg-config --variable=$variable flashdecode)")
  expected=$(realpath -m "$(eval echo "\$$variable")")
  [ "$resolved" = "$expected" ] || fail "flashdecode.pc $variable is $resolved, expected $expected"
done
echo "pkg-config: $(pkg-config --cflags --libs flashdecode)"

# The CMake package accepts 0.0 up to its own version within its major, and refuses the next major.
for request in "$major.0:found" "$major.$minor:found" "$((major + 1)).0:missing"; do
  wanted=${request%%:*}
  project=$work/find-$wanted
  rm -rf "$project"
  mkdir -p "$project"
  cat > "$project/CMakeLists.txt" <<EOF
cmake_minimum_required(VERSION 3.16)
project(find_flashdecode LANGUAGES NONE)
find_package(flashdecode $wanted CONFIG QUIET PATHS "$libdir/cmake/flashdecode" NO_DEFAULT_PATH)
if(flashdecode_FOUND)
  get_target_property(includes flashdecode::flashdecode INTERFACE_INCLUDE_DIRECTORIES)
  message(STATUS "result: found \${flashdecode_VERSION} includes=\${includes}")
else()
  message(STATUS "result: missing")
endif()
EOF
  result=$(cmake -S "$project" -B "$project/build" | sed -n 's/^-- result: //p')
  case ${request##*:} in
    found) [ "${result%% *}" = found ] && [[ $result == *" $version "* ]] || fail "find_package(flashdecode $wanted): $result" ;;
    missing) [ "$result" = missing ] || fail "find_package(flashdecode $wanted) should fail: $result" ;;
  esac
  case $result in
    found*) [[ $result == *" includes=$includedir" ]] || fail "the imported target's includes are not (only) $includedir: $result" ;;
  esac
  echo "find_package(flashdecode $wanted): $result"
done

if [ -n "$bindir" ]; then
  program=$bindir/flashdecode
  [ -f "$program" ] && [ -x "$program" ] || fail "no program $program"
  # It finds the installed library by itself (its RUNPATH), not the build tree's.
  loaded=$(env -u LD_LIBRARY_PATH ldd "$program" | awk '$1 ~ /^libflashdecode\.so/ {print $3}')
  [ "$(realpath -m "$loaded")" = "$(realpath "$library")" ] || fail "$program loads '$loaded', not $library"
  grep -q '^usage: ' <<<"$(env -u LD_LIBRARY_PATH "$program" --help)" || fail "$program --help printed no usage"
  env -u LD_LIBRARY_PATH "$program" --backend cpu --batch 1 --kv-len 64 --iters 1 > "$work/program.out" ||
    fail "$program failed a CPU decode: $(cat "$work/program.out")"
  grep -q '^check against float64 reference: ok' "$work/program.out" || fail "$program: $(cat "$work/program.out")"
  echo "program: $program, loads $loaded, decodes on the CPU"
fi
