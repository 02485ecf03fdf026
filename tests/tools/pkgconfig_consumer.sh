#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Builds C programs against an installed flashdecode through pkg-config only,
# as a user would, and runs each: docs/examples/quickstart.c and the C
# quickstart of the README, extracted verbatim.
set -euo pipefail
prefix=$1    # install prefix (e.g. the build's staging dir)
source_dir=$2
workdir=$3
export PKG_CONFIG_PATH=$(dirname "$(find "$prefix" -name flashdecode.pc | head -n 1)")
flags=$(pkg-config --cflags --libs flashdecode)
libdir=$(pkg-config --variable=libdir flashdecode)
echo "pkg-config --cflags --libs flashdecode: $flags"
mkdir -p "$workdir"
awk '/^```c$/ {inside = 1; next} /^```$/ {inside = 0} inside' "$source_dir/README.md" > "$workdir/readme_quickstart.c"
[ -s "$workdir/readme_quickstart.c" ] || { echo "no C block in README.md"; exit 1; }
for src in "$source_dir/docs/examples/quickstart.c" "$workdir/readme_quickstart.c"; do
  exe="$workdir/$(basename "$src" .c)"
  ${CC:-cc} -std=c99 -Wall -Wextra -Werror -pedantic "$src" $flags -Wl,-rpath,"$libdir" -o "$exe"
  echo "--- $(basename "$src")"
  "$exe"
done
