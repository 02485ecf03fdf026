#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Builds the Python package as a wheel that bundles the library, installs it
# into a fresh virtual environment (NumPy and pytest come from the system's
# site-packages: nothing is downloaded), and checks from outside the source
# tree, with no library path set, that the bundled copy is the one loaded.
#   python_wheel.sh <python> <libflashdecode.so.N to bundle> <source dir> <work dir>
# The environment stays in <work dir>/venv for the README quickstart test.
set -euo pipefail
python=$1
library=$2
source_dir=$3
work=$4
export PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1

rm -rf "$work"
"$python" -m venv --system-site-packages "$work/venv"
FLASHDECODE_BUNDLE_LIBRARY=$library "$work/venv/bin/python" -m pip wheel --quiet --no-index --no-deps \
  --wheel-dir "$work/dist" "$source_dir/bindings/python"
wheel=$(ls "$work"/dist/flashdecode-*.whl)
echo "built $(basename "$wheel")"
"$work/venv/bin/python" -m pip install --quiet --no-index "$wheel"

cd "$work"
env -u FLASHDECODE_LIBRARY -u LD_LIBRARY_PATH -u PYTHONPATH "$work/venv/bin/python" - "$work/venv" <<'PYTHON'
import sys
import numpy as np
import flashdecode

info = flashdecode.load_library()
print(f"loaded {info.path} ({info.source}), version {info.version}")
assert info.source == "bundled" and info.path.startswith(sys.argv[1]), info
q = np.ones((1, 2, 1, 16), np.float32)
kv = np.ones((1, 2, 8, 16), np.float32)
assert np.allclose(flashdecode.flash_decode(q, kv, kv), 1.0)
PYTHON
