// SPDX-License-Identifier: Apache-2.0
#include "core/error.h"

#include <cstdarg>
#include <cstdio>

namespace fd {

void fail(fd_status status, const char *format, ...) {
  char buffer[512];
  va_list args;
  va_start(args, format);
  std::vsnprintf(buffer, sizeof buffer, format, args);
  va_end(args);
  throw Error(status, buffer);
}

}  // namespace fd
