#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# Doxygen input filter for the Markdown pages (docs/Doxyfile.in). Doxygen
# names heading anchors otherwise than GitHub: a link to an anchor of the
# same file, [text](#anchor), would fail to resolve (a warning, so an
# error), and [text](page.md#anchor) would be left pointing at the .md file.
# Both become links to the page, [text](FILE) and [text](page.md), which
# Doxygen resolves. GitHub reads the files unfiltered, anchors and all.
#   md_links.sh <file.md>
exec sed -E -e "s@\]\(#[^)]+\)@](${1##*/})@g" -e 's@\]\(([^)#]+\.md)#[^)]+\)@](\1)@g' "$1"
