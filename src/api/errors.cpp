// SPDX-License-Identifier: Apache-2.0
// Status strings and the thread-local detailed message.
#include <cstring>
#include <string>

#include "api/guard.h"

namespace fd {
namespace {
thread_local std::string last_error_message;
}

void set_last_error(fd_status status, const char *message) noexcept {
  try {
    last_error_message = std::string(fd_status_string(status)) + ": " + message;
  } catch (...) {
    last_error_message.clear();  // out of memory while reporting: keep the status
  }
}

}  // namespace fd

extern "C" {

FD_API const char *fd_status_string(fd_status status) {
  switch (fd::raw_enum_value(status)) {
    case FD_SUCCESS: return "success";
    case FD_ERROR_NULL_POINTER: return "null pointer";
    case FD_ERROR_INVALID_ARGUMENT: return "invalid argument";
    case FD_ERROR_INVALID_DTYPE: return "invalid dtype";
    case FD_ERROR_INVALID_HEAD_DIM: return "invalid head_dim";
    case FD_ERROR_INVALID_HEAD_COUNT: return "invalid head count";
    case FD_ERROR_INVALID_SHAPE: return "invalid shape";
    case FD_ERROR_INVALID_STRIDE: return "invalid stride";
    case FD_ERROR_INVALID_LENGTH: return "invalid length";
    case FD_ERROR_INVALID_BLOCK_TABLE: return "invalid block table";
    case FD_ERROR_INVALID_SPLITS: return "invalid split count";
    case FD_ERROR_WORKSPACE_TOO_SMALL: return "workspace too small";
    case FD_ERROR_INVALID_HANDLE: return "invalid handle";
    case FD_ERROR_UNSUPPORTED: return "unsupported";
    case FD_ERROR_NO_DEVICE: return "no device";
    case FD_ERROR_OUT_OF_MEMORY: return "out of memory";
    case FD_ERROR_CUDA: return "CUDA error";
    case FD_ERROR_INTERNAL: return "internal error";
  }
  return "unknown status";
}

FD_API size_t fd_last_error_message(char *buffer, size_t buffer_size) {
  const std::string &message = fd::last_error_message;
  if (buffer != nullptr && buffer_size > 0) {
    const size_t n = message.size() < buffer_size - 1 ? message.size() : buffer_size - 1;
    std::memcpy(buffer, message.data(), n);
    buffer[n] = '\0';
  }
  return message.size();
}

}  // extern "C"
