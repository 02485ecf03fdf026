#!/usr/bin/env bash
# Fails if the shared library exports any dynamic symbol other than fd_*,
# or if its SONAME is not libflashdecode.so.<major>.
set -euo pipefail
lib=$1
major=$2
bad=$(nm -D --defined-only "$lib" | awk '$2 ~ /[TtDdBbRrVvWw]/ && $3 !~ /^fd_/ && $3 !~ /^FLASHDECODE_/ {print $3}')
if [ -n "$bad" ]; then
  echo "exported symbols outside fd_*:"; echo "$bad"; exit 1
fi
count=$(nm -D --defined-only "$lib" | awk '$3 ~ /^fd_/' | wc -l)
[ "$count" -gt 0 ] || { echo "no fd_* symbols exported"; exit 1; }
soname=$(objdump -p "$lib" | awk '$1 == "SONAME" {print $2}')
[ "$soname" = "libflashdecode.so.$major" ] || { echo "SONAME is '$soname', expected libflashdecode.so.$major"; exit 1; }
echo "ok: $count fd_* symbols exported, SONAME $soname"
