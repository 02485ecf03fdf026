// SPDX-License-Identifier: Apache-2.0
/* Compiled with -std=c99 -pedantic-errors: the public header is plain C99. */
#include "flashdecode.h"

int fd_header_c99_check(void);
int fd_header_c99_check(void) {
  return FD_VERSION_NUMBER + (int)sizeof(fd_decode_args) + (int)sizeof FD_VERSION_STRING;
}
