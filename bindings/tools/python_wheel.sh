#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The Python package's release files, made and checked by python_dist.sh
# (the sdist, and the wheel bundling the library with its manylinux tag from
# auditwheel); the wheel is installed into a fresh virtual environment (NumPy
# comes from the system's site-packages: nothing is downloaded) and checked
# from outside the source tree, with no library path set, by
# python_installed.py: the bundled library loads, the metadata is complete, a
# decode matches float64, the package README's quickstart runs.
#   python_wheel.sh <python> <libflashdecode.so.N to bundle> <source dir> <work dir>
# The environment stays in <work dir>/venv for the README quickstart test, the
# files in <work dir>/dist for the sdist test.
set -euo pipefail
python=$1
library=$2
source_dir=$3
work=$4
export PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1

rm -rf "$work"
mkdir -p "$work"
"$source_dir/bindings/tools/python_dist.sh" "$python" "$library" "$work/dist"
"$python" -m venv --system-site-packages "$work/venv"
# pip refuses a wheel whose platform tag this machine does not support.
"$work/venv/bin/python" -m pip install --quiet --no-index "$work"/dist/flashdecode-*.whl

cd "$work"
env -u FLASHDECODE_LIBRARY -u LD_LIBRARY_PATH -u PYTHONPATH "$work/venv/bin/python" \
  "$source_dir/bindings/tools/python_installed.py" "$work/venv" "$source_dir/bindings/python/README.md"
