#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Holds a guide's code blocks to the programs the test suite builds and runs
# (docs/integration.md and docs/examples/integration_*.c). Every fenced
# block must follow, on the line before its fence, a marker that GitHub and
# Doxygen do not show:
#   <!-- excerpt: FILE -->  a ```c block whose lines are lines of
#                           <examples dir>/FILE, in order and consecutive;
#                           a line that is only `/* ... */` (indented or not)
#                           stands for lines left out
#   <!-- output: PROGRAM --> a ```text block equal to the standard output of
#                           <bin dir>/PROGRAM, run without arguments
# and every <examples dir>/integration_*.c must be excerpted, or its program's
# output shown, at least once.
#   guide_code_blocks.sh <guide.md> <examples dir> <bin dir>
set -euo pipefail
guide=$1
examples=$2
bin=$3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# Splits the guide into block files: $work/N.block (the lines between the
# fences) and $work/N.meta ("kind name language line").
awk -v work="$work" '
  function fail(msg) { print FILENAME ":" NR ": " msg > "/dev/stderr"; failed = 1; exit 1 }
  /^```/ {
    if (!inside) {
      language = substr($0, 4)
      if (!match(previous, /^<!-- (excerpt|output): [^ ]+ -->$/)) fail("code block without an <!-- excerpt: FILE --> or <!-- output: PROGRAM --> marker on the line before")
      split(previous, parts, " ")
      kind = parts[2]; sub(/:$/, "", kind)
      ++count
      printf "%s %s %s %d\n", kind, parts[3], language, NR > (work "/" count ".meta")
      printf "" > (work "/" count ".block")
      inside = 1
    } else if ($0 == "```") {
      inside = 0
    } else {
      fail("a fence inside a code block")
    }
    previous = $0
    next
  }
  inside { print > (work "/" count ".block") }
  { previous = $0 }
  END { if (!failed && inside) fail("unterminated code block") }
' "$guide"

status=0
blocks=0
excerpted=" "
for meta in "$work"/*.meta; do
  [ -e "$meta" ] || break
  blocks=$((blocks + 1))
  read -r kind name language line < "$meta"
  block=${meta%.meta}.block
  case $kind in
    excerpt)
      if [ "$language" != c ]; then echo "$guide:$line: an excerpt must be a \`\`\`c block"; status=1; continue; fi
      if [ ! -f "$examples/$name" ]; then echo "$guide:$line: no $examples/$name"; status=1; continue; fi
      excerpted="$excerpted$name "
      # The block's runs of lines between elisions, each found in the file
      # after the previous one.
      if ! awk -v block="$block" '
        BEGIN {
          while ((getline l < block) > 0) b[++m] = l
          segments = 0; start = 1
          for (i = 1; i <= m + 1; ++i) {
            if (i > m || b[i] ~ /^[ \t]*\/\* \.\.\. \*\/$/) {
              if (i > start) { ++segments; first[segments] = start; last[segments] = i - 1 }
              start = i + 1
            }
          }
        }
        { f[++n] = $0 }
        END {
          pos = 1
          for (s = 1; s <= segments; ++s) {
            len = last[s] - first[s] + 1; found = 0
            for (i = pos; i + len - 1 <= n && !found; ++i) {
              ok = 1
              for (j = 0; j < len && ok; ++j) ok = f[i + j] == b[first[s] + j]
              if (ok) { found = 1; pos = i + len }
            }
            if (!found) { print "not in the file, in this order: " b[first[s]]; exit 1 }
          }
        }' "$examples/$name"; then
        echo "$guide:$line: the excerpt of $name does not match $examples/$name"
        status=1
      fi
      ;;
    output)
      if [ "$language" != text ]; then echo "$guide:$line: an output must be a \`\`\`text block"; status=1; continue; fi
      excerpted="$excerpted$name.c "
      if ! "$bin/$name" > "$work/actual" 2> "$work/stderr"; then
        echo "$guide:$line: $bin/$name failed:"
        cat "$work/stderr"
        status=1
      elif ! diff -u "$block" "$work/actual"; then
        echo "$guide:$line: the block above is not the output of $name (- the guide, + the program)"
        status=1
      fi
      ;;
  esac
done
[ "$blocks" -gt 0 ] || { echo "$guide: no code blocks"; exit 1; }
for source in "$examples"/integration_*.c; do
  name=$(basename "$source")
  case $excerpted in
    *" $name "*) ;;
    *) echo "$guide: never shows $name"; status=1 ;;
  esac
done
[ "$status" -eq 0 ] && echo "$guide: $blocks code blocks match the examples they come from"
exit "$status"
