#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Configures, builds and runs docs/examples/cmake_consumer against an
# installed flashdecode, as a user's CMake project would.
#   cmake_consumer.sh <install prefix, or the package dir itself> <source dir> <work dir> [generator]
# A prefix is searched the way users do (CMAKE_PREFIX_PATH); the package dir
# is for installs whose libdir lies outside the prefix.
set -euo pipefail
location=$1
source_dir=$2
work=$3
generator=${4:-}

if [ -f "$location/flashdecodeConfig.cmake" ]; then
  search=-Dflashdecode_DIR="$location"
else
  search=-DCMAKE_PREFIX_PATH="$location"
fi
rm -rf "$work"
cmake -S "$source_dir/docs/examples/cmake_consumer" -B "$work" ${generator:+-G "$generator"} \
  -DCMAKE_BUILD_TYPE=Release -DCMAKE_C_FLAGS="-Wall -Wextra -Werror" "$search"
cmake --build "$work"
"$work/quickstart"
