#!/usr/bin/env bash
# Installs what building and testing flashdecode needs and is missing:
# Debian/Ubuntu packages when run as root, else prints the apt command.
# The CUDA toolkit is not installed here: with nvcc on PATH (or in
# /usr/local/cuda/bin) the CUDA backend is built, without it the CPU one only.
set -euo pipefail

need=()
have_cmd() { command -v "$1" >/dev/null 2>&1; }
have_cmd cmake || need+=(cmake)
have_cmd ninja || need+=(ninja-build)
have_cmd cc || need+=(gcc)
have_cmd c++ || need+=(g++)
have_cmd pkg-config || need+=(pkg-config)
have_cmd doxygen || need+=(doxygen)
have_cmd nm || need+=(binutils)
[ -f /usr/include/cmocka.h ] || need+=(libcmocka-dev)
if [ "${FD_DEPS_BINDINGS:-1}" = 1 ]; then
  have_cmd go || need+=(golang-go)
  have_cmd python3 || need+=(python3)
  python3 -c 'import venv, ensurepip' >/dev/null 2>&1 || need+=(python3-venv)
fi

if [ ${#need[@]} -eq 0 ]; then
  echo "install-deps: nothing missing"
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "install-deps: missing packages; run: sudo apt-get install -y ${need[*]}" >&2
  exit 1
fi
echo "install-deps: apt-get install ${need[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
