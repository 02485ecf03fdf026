// SPDX-License-Identifier: Apache-2.0
#include "core/dtype.h"

#include "core/error.h"

namespace fd {

bool is_known_dtype(const fd_dtype &dtype) {
  switch (raw_enum_value(dtype)) {
    case FD_DTYPE_F32:
    case FD_DTYPE_F16:
    case FD_DTYPE_BF16:
    case FD_DTYPE_I32: return true;
    default: return false;
  }
}

size_t dtype_bytes(const fd_dtype &dtype) {
  switch (raw_enum_value(dtype)) {
    case FD_DTYPE_F16:
    case FD_DTYPE_BF16: return 2;
    case FD_DTYPE_F32:
    case FD_DTYPE_I32: return 4;
    default: break;
  }
  fail(FD_ERROR_INTERNAL, "no element size for dtype %d", raw_enum_value(dtype));
}

const char *dtype_name(const fd_dtype &dtype) {
  switch (raw_enum_value(dtype)) {
    case FD_DTYPE_F32: return "f32";
    case FD_DTYPE_F16: return "f16";
    case FD_DTYPE_BF16: return "bf16";
    case FD_DTYPE_I32: return "i32";
    default: return "unknown";
  }
}

}  // namespace fd
