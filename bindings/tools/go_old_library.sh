#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The Go package with an older library than the staged one (bindings/README.md,
# "Older libraries"). cgo compiles it against the header it finds, so:
#   1. built against the old install's header and library, it works without
#      the later features (its tests check that they fail with ErrUnsupported);
#   2. built against the staged (newer) install, a program does not start
#      on the old library: the dynamic loader lacks the newer version node.
#   go_old_library.sh <go package dir> <staged libdir> <old install prefix> <work dir>
# Runs with the environment of the go_* tests (GOCACHE, GOPATH, GOFLAGS...).
set -euo pipefail
package=$(realpath "$1")
staged_libdir=$(realpath "$2")
old=$(realpath "$3")
work=$(realpath -m "$4")
old_version=$(PKG_CONFIG_PATH=$old/lib/pkgconfig pkg-config --modversion flashdecode)
rm -rf "$work"
mkdir -p "$work"
cd "$package"

echo "=== built against flashdecode.h $old_version, run on libflashdecode $old_version"
# A cache of its own: the build cache keys on neither the header (outside the
# package) nor the flags pkg-config gives, so it would reuse the staged build.
GOCACHE=$work/cache PKG_CONFIG_PATH=$old/lib/pkgconfig LD_LIBRARY_PATH=$old/lib go vet ./...
GOCACHE=$work/cache PKG_CONFIG_PATH=$old/lib/pkgconfig LD_LIBRARY_PATH=$old/lib go test -count=1 -v ./... |
  tee "$work/test.log" | grep -E '^(--- |ok|FAIL|PASS)'
grep -q -- '--- PASS: TestWithoutThe03Header' "$work/test.log" || { echo "TestWithoutThe03Header did not pass"; exit 1; }

echo "=== built against the staged flashdecode.h, run on libflashdecode $old_version"
PKG_CONFIG_PATH=$staged_libdir/pkgconfig go test -c -o "$work/flashdecode.test" .
if LD_LIBRARY_PATH=$old/lib "$work/flashdecode.test" -test.run TestVersion >"$work/refused.log" 2>&1; then
  echo "a test binary built against the staged header ran on libflashdecode $old_version"
  exit 1
fi
cat "$work/refused.log"
grep -q "version \`FLASHDECODE_0\.[0-9]*' not found" "$work/refused.log" ||
  { echo "the refusal does not name the missing version node"; exit 1; }
echo "refused by the dynamic loader, naming the version node it needs"
