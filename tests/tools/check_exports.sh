#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Fails if the shared library exports any dynamic symbol other than fd_*,
# if a function the header declares (FD_API) is not exported under a
# FLASHDECODE_<major>* version node (src/flashdecode.map), or if its SONAME
# is not libflashdecode.so.<major>.
set -euo pipefail
lib=$1
major=$2
header=${3:-}
bad=$(nm -D --defined-only "$lib" | awk '$2 ~ /[TtDdBbRrVvWw]/ && $3 !~ /^fd_/ && $3 !~ /^FLASHDECODE_/ {print $3}')
if [ -n "$bad" ]; then
  echo "exported symbols outside fd_*:"; echo "$bad"; exit 1
fi
count=$(nm -D --defined-only "$lib" | awk '$3 ~ /^fd_/' | wc -l)
[ "$count" -gt 0 ] || { echo "no fd_* symbols exported"; exit 1; }
if [ -n "$header" ]; then
  # Default versions only: objdump shows a non-default one, kept for
  # programs linked against an older build, in parentheses.
  exported=$(objdump -T "$lib" | awk '$NF ~ /^fd_/ && $(NF-1) !~ /^\(/ {print $(NF-1), $NF}')
  for fn in $(grep -o 'FD_API [^(]*(' "$header" | grep -o 'fd_[a-z0-9_]*(' | tr -d '('); do
    version=$(echo "$exported" | awk -v fn="$fn" '$2 == fn {print $1}')
    case "$version" in
      FLASHDECODE_"$major"|FLASHDECODE_"$major".*) ;;
      "") echo "$fn is declared in $header but not exported (add it to src/flashdecode.map)"; exit 1 ;;
      *) echo "$fn is exported under version '$version', expected FLASHDECODE_$major or FLASHDECODE_$major.<minor>"; exit 1 ;;
    esac
  done
fi
soname=$(objdump -p "$lib" | awk '$1 == "SONAME" {print $2}')
[ "$soname" = "libflashdecode.so.$major" ] || { echo "SONAME is '$soname', expected libflashdecode.so.$major"; exit 1; }
echo "ok: $count fd_* symbols exported, SONAME $soname"
