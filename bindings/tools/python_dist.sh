#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Makes the Python package's files for PyPI and checks the wheel with auditwheel:
#   python_dist.sh <python> <libflashdecode.so.0 to bundle> <out dir>
# <out dir> gets
#   flashdecode-<version>.tar.gz      the sdist: the package, its tests, the C sources
#   flashdecode-<version>-py3-none-manylinux_<glibc>_<arch>.whl
# auditwheel decides the tag: `auditwheel show` reads the library's symbol
# versions and dependencies in a first wheel (tagged linux_<arch>) and names
# the most compatible manylinux tag they allow; the wheel is made again with
# that tag (the backend's platform-tag), and `auditwheel show` must report the
# same tag for it. The library must need nothing outside the manylinux policy
# (the CUDA runtime is linked in statically): its NEEDED entries must be
# glibc's, libstdc++ and libgcc_s.
# auditwheel: $AUDITWHEEL (a command), else <python> -m auditwheel, else
# auditwheel on PATH. (Not `auditwheel repair`: with nothing to graft it only
# retags, and it wants a newer patchelf than Debian 12 has.)
set -euo pipefail
python=$1
library=$2
out=$3
backend_dir=$(cd "$(dirname "$0")/../python/build_backend" && pwd)
missing="run tests/tools/install-deps.sh as root"

if [ -n "${AUDITWHEEL:-}" ]; then
  read -ra auditwheel <<< "$AUDITWHEEL"
elif "$python" -c 'import auditwheel' 2>/dev/null; then
  auditwheel=("$python" -m auditwheel)
elif command -v auditwheel >/dev/null; then
  auditwheel=(auditwheel)
else
  echo "auditwheel not found (neither a module of $python nor on PATH): $missing"; exit 1
fi
command -v readelf >/dev/null || { echo "readelf not found: $missing"; exit 1; }
[ -f "$library" ] || { echo "$library: no library to bundle"; exit 1; }

# The tag `auditwheel show` reports for a wheel, and the one in its file name.
shown_tag() {
  # show's sentences are wrapped at 70 columns: join its lines first.
  "${auditwheel[@]}" show "$1" 2>&1 | tr -s ' \n' '  ' | grep -o 'following platform tag: "[^"]*"' | cut -d'"' -f2
}
file_tag() {
  local tag=${1##*-py3-none-}
  echo "${tag%.whl}"
}
# backend <hook> <out dir> [VAR=value...]: a PEP 517 hook of the build backend,
# called as pip calls it (the backend is standard library only); prints the file's name.
backend() {
  local hook=$1 dir=$2
  shift 2
  env -u CMAKE_ARGS -u FLASHDECODE_PLATFORM_TAG FLASHDECODE_BUNDLE_LIBRARY="$library" "$@" "$python" -c '
import sys
sys.path.insert(0, sys.argv[1])
import flashdecode_build
print(getattr(flashdecode_build, sys.argv[2])(sys.argv[3]))' "$backend_dir" "$hook" "$dir"
}

rm -rf "$out"
mkdir -p "$out/linux"
sdist=$(backend build_sdist "$out")
linux_wheel=$out/linux/$(backend build_wheel "$out/linux")
tag=$(shown_tag "$linux_wheel") || { "${auditwheel[@]}" show "$linux_wheel"; exit 1; }
[[ $tag == manylinux_* ]] || { "${auditwheel[@]}" show "$linux_wheel"; echo "auditwheel allows no manylinux tag"; exit 1; }

wheel=$out/$(backend build_wheel "$out" FLASHDECODE_PLATFORM_TAG="$tag")
[ "$(file_tag "$wheel")" = "$tag" ] || { echo "$wheel: not tagged $tag"; exit 1; }
reported=$(shown_tag "$wheel") || true
[ "$reported" = "$tag" ] || { "${auditwheel[@]}" show "$wheel"; echo "auditwheel show: '$reported', not $tag"; exit 1; }

needed=$(readelf -d "$library" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | sort | paste -sd' ')
for soname in $needed; do
  case $soname in
    libc.so.6 | libm.so.6 | libpthread.so.0 | libdl.so.2 | librt.so.1 | ld-linux*.so.* | libstdc++.so.6 | libgcc_s.so.1) ;;
    *) echo "the library needs $soname (all it needs: $needed)"; exit 1 ;;
  esac
done
echo "python_dist: $(basename "$wheel") (auditwheel show: $reported; the library needs $needed) and $sdist"
