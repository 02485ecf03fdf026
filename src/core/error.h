// SPDX-License-Identifier: Apache-2.0
// Internal errors: how library code reports a failure that the C ABI turns
// into an fd_status plus a thread-local message. Only src/api catches these.
#pragma once

#include <exception>
#include <string>

#include "flashdecode.h"

namespace fd {

class Error : public std::exception {
 public:
  Error(fd_status status, std::string message) : status_(status), message_(std::move(message)) {}
  fd_status status() const noexcept { return status_; }
  const char *what() const noexcept override { return message_.c_str(); }

 private:
  fd_status status_;
  std::string message_;
};

// Throws fd::Error with a printf-style message, e.g.
// fail(FD_ERROR_INVALID_STRIDE, "k: stride of head_dim must be 1, got %lld", s).
[[noreturn]] void fail(fd_status status, const char *format, ...) __attribute__((format(printf, 2, 3)));

}  // namespace fd

namespace fd {

// The integer value of a C enum as the caller stored it. C callers may pass
// any int (an unknown dtype, say); reading that through the C++ enum type is
// undefined behaviour, so validation reads the bytes instead.
template <class Enum>
int raw_enum_value(const Enum &value) {
  static_assert(sizeof(Enum) == sizeof(int), "C enums are int-sized");
  int raw;
  __builtin_memcpy(&raw, &value, sizeof raw);
  return raw;
}

}  // namespace fd
