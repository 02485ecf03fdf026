#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Builds flashdecode as a static library (FLASHDECODE_STATIC=ON, CPU only),
# installs it, and links it as users do: a C program through the CMake
# package (a C-only project, so the C++ runtime must come from the package),
# the same through pkg-config with the C compiler as linker, the installed
# flashdecode program, and a shared library (the archive is position
# independent). Each program must run without any libflashdecode.so. Also
# checks the archive's symbols: the header's fd_* functions are its only
# global definitions of default visibility (weak ones are std templates).
#   static_consumer.sh <source dir> <work dir> [generator]
set -euo pipefail
source_dir=$(realpath "$1")
work=$(realpath -m "$2")
generator=${3:-}
prefix=$work/prefix
fail() { echo "static_consumer: $*"; exit 1; }

rm -rf "$work/prefix" "$work/cmake" "$work/pkgconfig"
mkdir -p "$work/pkgconfig"
cmake -S "$source_dir" -B "$work/build" ${generator:+-G "$generator"} -DCMAKE_BUILD_TYPE=Release \
  -DFLASHDECODE_STATIC=ON -DFLASHDECODE_CUDA=OFF -DFLASHDECODE_TESTS=OFF -DCMAKE_INSTALL_PREFIX="$prefix" >/dev/null
cmake --build "$work/build"
cmake --install "$work/build" >/dev/null
archive=$prefix/lib/libflashdecode.a
[ -f "$archive" ] || fail "no $archive"
if ls "$prefix"/lib/libflashdecode.so* >/dev/null 2>&1; then fail "a static build installed a shared library"; fi

# Symbols: fd_* and nothing else is global with default visibility.
defined=$(readelf -sW "$archive" | awk '$7 != "UND" && ($5 == "GLOBAL" || $5 == "WEAK") && $6 == "DEFAULT" {print $5, $8}' | sort -u)
others=$(echo "$defined" | awk '$1 == "GLOBAL" && $2 !~ /^fd_/ || $1 == "WEAK" && $2 !~ /^_ZN?K?St/ {print $2}')
[ -z "$others" ] || fail "global symbols of default visibility besides fd_*: $others"
for fn in $(grep -o 'FD_API [^(]*(' "$source_dir/include/flashdecode.h" | grep -o 'fd_[a-z0-9_]*(' | tr -d '('); do
  # A here-string, not a pipe: grep -q exits at the first match, and under
  # pipefail the writer's SIGPIPE would fail the test now and then.
  grep -qx "GLOBAL $fn" <<<"$defined" || fail "$fn is not defined in $archive"
done
echo "archive: $archive defines the header's $(echo "$defined" | grep -c '^GLOBAL fd_') fd_* functions, nothing else visible"

# run <program>: runs it and checks it loads no libflashdecode.so.
run() {
  if grep -q 'NEEDED *libflashdecode' <<<"$(objdump -p "$1")"; then fail "$1 needs the shared library"; fi
  "$@"
}

# CMake: a C-only project; its link gets the C++ runtime and Threads from the package.
cmake -S "$source_dir/docs/examples/cmake_consumer" -B "$work/cmake" ${generator:+-G "$generator"} \
  -DCMAKE_BUILD_TYPE=Release -DCMAKE_C_FLAGS="-Wall -Wextra -Werror" -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
cmake --build "$work/cmake"
run "$work/cmake/quickstart"

# pkg-config, linked by the C compiler: flashdecode.pc's Libs carry the C++ runtime.
export PKG_CONFIG_PATH=$prefix/lib/pkgconfig
flags=$(pkg-config --cflags --libs flashdecode)
echo "pkg-config --cflags --libs flashdecode: $flags"
${CC:-cc} -std=c99 -Wall -Wextra -Werror -pedantic "$source_dir/docs/examples/quickstart.c" $flags \
  -o "$work/pkgconfig/quickstart"
run "$work/pkgconfig/quickstart"

# A shared library that links the archive in, and a program using it.
cat > "$work/pkgconfig/wrapper.c" <<'C'
#include <flashdecode.h>
const char *wrapped_version(void);
const char *wrapped_version(void) { return fd_version_string(); }
C
cat > "$work/pkgconfig/use_wrapper.c" <<'C'
#include <stdio.h>
#include <string.h>
const char *wrapped_version(void);
int main(void) {
  printf("through a shared library: flashdecode %s\n", wrapped_version());
  return strlen(wrapped_version()) > 0 ? 0 : 1;
}
C
${CC:-cc} -shared -fPIC -Wall -Werror "$work/pkgconfig/wrapper.c" $flags -o "$work/pkgconfig/libwrapper.so"
${CC:-cc} -Wall -Werror "$work/pkgconfig/use_wrapper.c" -L"$work/pkgconfig" -lwrapper \
  -Wl,-rpath,"$work/pkgconfig" -o "$work/pkgconfig/use_wrapper"
run "$work/pkgconfig/use_wrapper"

# The installed program, linked statically too.
run "$prefix/bin/flashdecode" --backend cpu --batch 1 --kv-len 256 --iters 1 | tee "$work/program.out"
grep -q '^check against float64 reference: ok' "$work/program.out" || fail "the installed program's decode failed"
echo "static_consumer: all passed"
