#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Runs a quickstart of README.md's "Bindings" section verbatim: the first
# code block of the given language is extracted and run as a user would.
#   readme_quickstart.sh python|rust|go|cmake <source dir> <work dir>
# python: runs it with $FD_PYTHON (an interpreter where flashdecode is installed).
# rust:   builds it as a binary crate depending on bindings/rust by path (cargo, offline).
# go:     builds it as a main package whose go.mod points at bindings/go (cgo, pkg-config).
# cmake:  checks that each of its lines is in docs/examples/cmake_consumer/CMakeLists.txt,
#         which the consumer_cmake test builds.
set -euo pipefail
language=$1
source_dir=$2
work=$3

block=$(awk -v fence='```'"$language" '
  /^## / { section = $0 }
  section == "## Bindings" && $0 == fence { inside = 1; next }
  inside && /^```$/ { exit }
  inside' "$source_dir/README.md")
[ -n "$block" ] || { echo "README.md: no \`\`\`$language block in the Bindings section"; exit 1; }

rm -rf "$work"
mkdir -p "$work"
cd "$work"
case $language in
  python)
    printf '%s\n' "$block" > quickstart.py
    "${FD_PYTHON:-python3}" quickstart.py
    ;;
  rust)
    mkdir src
    printf '%s\n' "$block" > src/main.rs
    cat > Cargo.toml <<EOF
[package]
name = "readme-quickstart"
version = "0.0.0"
edition = "2021"

[dependencies]
flashdecode = { path = "$source_dir/bindings/rust" }
EOF
    cargo run --offline --quiet
    ;;
  go)
    printf '%s\n' "$block" > main.go
    cat > go.mod <<EOF
module readmequickstart

go 1.19

require github.com/flashdecode/flashdecode/bindings/go v0.0.0

replace github.com/flashdecode/flashdecode/bindings/go => $source_dir/bindings/go
EOF
    go vet . && go run .
    ;;
  cmake)
    consumer=$source_dir/docs/examples/cmake_consumer/CMakeLists.txt
    while IFS= read -r line; do
      [ -z "$line" ] || grep -qxF -- "$line" "$consumer" || { echo "not in $consumer: $line"; exit 1; }
    done <<< "$block"
    echo "every line of the README's CMake snippet is in $consumer"
    ;;
  *)
    echo "unknown language $language"; exit 1
    ;;
esac
