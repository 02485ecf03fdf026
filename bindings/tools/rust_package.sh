#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Packages the Rust crate as a release would (offline, no registry): cargo
# must not warn (missing metadata and the like), the crate must hold its
# sources, tests, example, README and license, and the license must be the
# repository's.
#   rust_package.sh <cargo> <crate dir> <repository root>
set -euo pipefail
cargo=$1
crate=$2
root=$3
fail() { echo "rust_package: $*"; exit 1; }
cd "$crate"
cmp -s LICENSE "$root/LICENSE" || fail "$crate/LICENSE differs from the repository's LICENSE (copy it)"
list=$("$cargo" package --offline --allow-dirty --list)
for file in Cargo.toml Cargo.lock README.md LICENSE src/lib.rs tests/cpu.rs tests/common/mod.rs examples/decode.rs; do
  grep -qx "$file" <<< "$list" || fail "the crate lacks $file"
done
output=$("$cargo" package --offline --no-verify --allow-dirty 2>&1) || { echo "$output"; fail "cargo package failed"; }
echo "$output"
if grep -qi 'warning' <<< "$output"; then fail "cargo package warned"; fi
echo "rust_package: $(grep -c . <<< "$list") files, no warnings"
