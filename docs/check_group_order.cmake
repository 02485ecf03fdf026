# SPDX-License-Identifier: Apache-2.0
# Run by the docs target after Doxygen: the rendered list of groups (the
# Modules page; Topics in newer Doxygen) must follow the order in which the
# header defines them (@defgroup), which is its reading order.
#   cmake -DHEADER=<flashdecode.h> -DHTML=<html dir> -P check_group_order.cmake
file(STRINGS "${HEADER}" defgroups REGEX "@defgroup [a-z_]+ ")
set(expected "")
foreach(line IN LISTS defgroups)
  string(REGEX REPLACE ".*@defgroup ([a-z_]+) .*" "\\1" label "${line}")
  string(REPLACE "_" "__" label "${label}")  # Doxygen doubles underscores in file names
  list(APPEND expected "${label}")
endforeach()
if(EXISTS "${HTML}/topics.html")
  set(index "${HTML}/topics.html")
else()
  set(index "${HTML}/modules.html")
endif()
file(READ "${index}" page)
string(REGEX MATCHALL "href=\"group__[a-z_]+\\.html\"" links "${page}")
set(rendered "")
foreach(link IN LISTS links)
  string(REGEX REPLACE "href=\"group__([a-z_]+)\\.html\"" "\\1" label "${link}")
  list(APPEND rendered "${label}")
endforeach()
if(NOT expected OR NOT rendered STREQUAL expected)
  message(FATAL_ERROR "docs: ${index} lists the groups as '${rendered}', the header defines '${expected}'")
endif()
list(JOIN rendered ", " text)
message(STATUS "docs: groups in reading order: ${text}")
