#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Builds flashdecode as a subproject of another CMake project
# (docs/examples/subproject_consumer: add_subdirectory, CPU only), as
# FetchContent users do: the parent needs no CMocka and gets the library
# only. Runs the C quickstart it links, and checks that the README's
# snippet is the example's.
#   subproject_consumer.sh <source dir> <work dir> [generator]
set -euo pipefail
source_dir=$(realpath "$1")
work=$(realpath -m "$2")
generator=${3:-}
example=$source_dir/docs/examples/subproject_consumer/CMakeLists.txt

# The README's snippet ("Building and installing": the cmake block) is in the example, line for line.
block=$(awk '/^## / { section = $0 }
  section == "## Building and installing" && $0 == "```cmake" { inside = 1; next }
  inside && /^```$/ { exit }
  inside' "$source_dir/README.md")
[ -n "$block" ] || { echo "README.md: no \`\`\`cmake block in 'Building and installing'"; exit 1; }
while IFS= read -r line; do
  [ -z "$line" ] || grep -qxF -- "$line" "$example" || { echo "README snippet line not in $example: $line"; exit 1; }
done <<< "$block"

rm -rf "$work"
cmake -S "$(dirname "$example")" -B "$work" ${generator:+-G "$generator"} -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_C_FLAGS="-Wall -Wextra -Werror" -DFLASHDECODE_SOURCE_DIR="$source_dir"
grep -q '^FLASHDECODE_TESTS:BOOL=OFF$' "$work/CMakeCache.txt" || { echo "FLASHDECODE_TESTS is not OFF in a subproject"; exit 1; }
grep -q '^FLASHDECODE_PROGRAM:BOOL=OFF$' "$work/CMakeCache.txt" || { echo "FLASHDECODE_PROGRAM is not OFF in a subproject"; exit 1; }
cmake --build "$work"
"$work/quickstart"
