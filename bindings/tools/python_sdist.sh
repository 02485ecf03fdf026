#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Installs the Python package's sdist as a user would, with pip into a fresh
# virtual environment: pip runs the build backend in its isolated
# environment, offline (--no-index: the backend needs nothing from an index
# when CMake is on PATH), which builds libflashdecode from the C sources in
# the sdist with CMake — CPU-only (FLASHDECODE_CUDA=OFF), to stay fast — and
# installs a wheel carrying it. python_installed.py then checks the installed
# package from outside the source tree, and that the library has no CUDA.
#   python_sdist.sh <python> <folder holding flashdecode-*.tar.gz> <source dir> <work dir>
set -euo pipefail
python=$1
dist=$2
source_dir=$3
work=$4
export PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1

sdist=$(ls "$dist"/flashdecode-*.tar.gz)
rm -rf "$work"
mkdir -p "$work"
"$python" -m venv --system-site-packages "$work/venv"
cd "$work"
env -u CMAKE_ARGS -u FLASHDECODE_BUNDLE_LIBRARY FLASHDECODE_CUDA=OFF \
  "$work/venv/bin/python" -m pip install --quiet --no-index "$sdist"
env -u FLASHDECODE_LIBRARY -u LD_LIBRARY_PATH -u PYTHONPATH "$work/venv/bin/python" \
  "$source_dir/bindings/tools/python_installed.py" "$work/venv" "$source_dir/bindings/python/README.md" \
  --built-without-cuda
