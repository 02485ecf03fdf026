// SPDX-License-Identifier: Apache-2.0
// The public header compiles as C++ too (extern "C", no C-only constructs).
#include "flashdecode.h"

int fd_header_cxx_check();
int fd_header_cxx_check() {
  return FD_VERSION_NUMBER + static_cast<int>(sizeof(fd_decode_args)) + static_cast<int>(sizeof FD_VERSION_STRING);
}
