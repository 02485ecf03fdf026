#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Installs flashdecode with other install directories than the test suite's
# staged install (prefix/lib): an absolute CMAKE_INSTALL_LIBDIR outside the
# prefix, and a relative multiarch one (lib/x86_64-linux-gnu). Each install
# is checked (the flashdecode program too) and used by the pkg-config and
# CMake consumers.
#   install_dirs.sh <source dir> <work dir> [generator]
# The CPU-only library is built once; reconfiguring only the install dirs
# relinks only the program (its RUNPATH follows the libdir).
set -euo pipefail
source_dir=$(realpath "$1")
work=$(realpath -m "$2")
generator=${3:-}
here=$(dirname "$(realpath "$0")")
version=$(awk '/^#define FD_VERSION_(MAJOR|MINOR|PATCH) / {v = v (v == "" ? "" : ".") $3} END {print v}' \
  "$source_dir/include/flashdecode.h")

mkdir -p "$work"
for layout in absolute multiarch; do
  prefix=$work/$layout/prefix
  if [ $layout = absolute ]; then libdir=$work/$layout/libraries; else libdir=lib/x86_64-linux-gnu; fi
  echo "=== CMAKE_INSTALL_LIBDIR=$libdir, prefix $prefix"
  rm -rf "$work/$layout"
  cmake -S "$source_dir" -B "$work/build" ${generator:+-G "$generator"} -DCMAKE_BUILD_TYPE=Release \
    -DFLASHDECODE_CUDA=OFF -DFLASHDECODE_TESTS=OFF \
    -DCMAKE_INSTALL_PREFIX="$prefix" -DCMAKE_INSTALL_LIBDIR="$libdir" >/dev/null
  cmake --build "$work/build"
  cmake --install "$work/build" >/dev/null
  case $libdir in /*) full_libdir=$libdir ;; *) full_libdir=$prefix/$libdir ;; esac
  "$here/check_install.sh" "$prefix/include" "$full_libdir" "$version" "$work/$layout/check" "$prefix/bin"
  "$source_dir/tests/tools/pkgconfig_consumer.sh" "$full_libdir" "$source_dir" "$work/$layout/pkgconfig"
  "$here/cmake_consumer.sh" "$full_libdir/cmake/flashdecode" "$source_dir" "$work/$layout/cmake" "$generator"
done
