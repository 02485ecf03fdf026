#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Installs what building and testing flashdecode needs and is missing:
# Debian/Ubuntu packages when run as root, else prints the apt command.
# With --build only what configuring and building need (`make demo`): CMake,
# Ninja, a C/C++ compiler, pkg-config and CMocka (the tests are configured
# by default; -DFLASHDECODE_TESTS=OFF builds without it).
# clang-format is for `make format-check` (Debian 12's is the reference);
# abigail-tools (abidiff, abidw) for the ABI check against tests/abi/.
# The CUDA toolkit is not installed here: with nvcc on PATH (or in
# /usr/local/cuda/bin) the CUDA backend is built, without it the CPU one only.
# The bindings' tests (FD_DEPS_BINDINGS=0 skips them) need Go, cargo, and a
# python3 with venv, NumPy and pytest: a distribution's Python (PEP 668,
# EXTERNALLY-MANAGED) gets NumPy and pytest from apt, any other from pip.
# The Python wheel's test also needs auditwheel, which Debian does not
# package: pip installs it into any other python3; beside a distribution's
# Python, pipx installs it into an environment of its own, with the command
# in /usr/local/bin.
set -euo pipefail

need=()
have_cmd() { command -v "$1" >/dev/null 2>&1; }
have_cmd cmake || need+=(cmake)
have_cmd ninja || need+=(ninja-build)
have_cmd cc || need+=(gcc)
have_cmd c++ || need+=(g++)
have_cmd pkg-config || need+=(pkg-config)
[ -f /usr/include/cmocka.h ] || need+=(libcmocka-dev)
pip_need=()
pipx_need=()
build_only=0
[ "${1:-}" = --build ] && build_only=1
if [ $build_only = 0 ]; then
  have_cmd doxygen || need+=(doxygen)
  have_cmd clang-format || need+=(clang-format)
  have_cmd nm || need+=(binutils)
  have_cmd abidiff || need+=(abigail-tools)
  # `make fuzz`: clang, and libFuzzer with the sanitizer runtimes (only recommended by clang).
  have_cmd clang || need+=(clang)
  ls "$(clang -print-runtime-dir 2>/dev/null)"/libclang_rt.fuzzer-*.a >/dev/null 2>&1 || need+=(libclang-rt-dev)
  if [ "${FD_DEPS_BINDINGS:-1}" = 1 ]; then
    have_cmd go || need+=(golang-go)
    have_cmd cargo || [ -x "$HOME/.cargo/bin/cargo" ] || need+=(cargo)
    have_cmd python3 || need+=(python3)
    python3 -c 'import venv, ensurepip' >/dev/null 2>&1 || need+=(python3-venv)
    for module in numpy pytest; do
      python3 -c "import $module" >/dev/null 2>&1 || pip_need+=("$module")
    done
    python3 -c 'import auditwheel' >/dev/null 2>&1 || have_cmd auditwheel || pip_need+=(auditwheel)
    # No python3 yet means apt's, which is externally managed.
    if [ ${#pip_need[@]} -gt 0 ] && { ! have_cmd python3 || python3 -c 'import os, sys, sysconfig
sys.exit(not os.path.exists(os.path.join(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED")))'; }; then
      for module in "${pip_need[@]}"; do
        if [ "$module" = auditwheel ]; then
          pipx_need+=(auditwheel)
          have_cmd pipx || need+=(pipx)
        else
          need+=("python3-$module")
        fi
      done
      pip_need=()
    fi
  fi
fi

if [ ${#need[@]} -eq 0 ] && [ ${#pip_need[@]} -eq 0 ] && [ ${#pipx_need[@]} -eq 0 ]; then
  echo "install-deps: nothing missing"
  exit 0
fi
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "install-deps: missing packages; run: sudo apt-get install -y ${need[*]}" >&2
    exit 1
  fi
  echo "install-deps: apt-get install ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
if [ ${#pip_need[@]} -gt 0 ]; then
  echo "install-deps: python3 -m pip install ${pip_need[*]}"
  python3 -m pip install --quiet --disable-pip-version-check "${pip_need[@]}" || {
    echo "install-deps: could not pip-install ${pip_need[*]} for $(command -v python3)" >&2
    exit 1
  }
fi
if [ ${#pipx_need[@]} -gt 0 ]; then
  pipx_env=(PIPX_HOME=/opt/pipx PIPX_BIN_DIR=/usr/local/bin)
  if [ "$(id -u)" -ne 0 ]; then
    echo "install-deps: missing ${pipx_need[*]}; run: sudo env ${pipx_env[*]} pipx install ${pipx_need[*]}" >&2
    exit 1
  fi
  for app in "${pipx_need[@]}"; do
    echo "install-deps: pipx install $app (command in /usr/local/bin)"
    log=$(env "${pipx_env[@]}" pipx install "$app" 2>&1) || {
      echo "$log" >&2
      echo "install-deps: could not pipx-install $app" >&2
      exit 1
    }
  done
fi
