// SPDX-License-Identifier: Apache-2.0
#include "core/dtype.h"

#include "core/error.h"

namespace fd {

bool is_known_dtype(const fd_dtype &dtype) {
  switch (raw_enum_value(dtype)) {
    case FD_DTYPE_F32:
    case FD_DTYPE_F16:
    case FD_DTYPE_BF16:
    case FD_DTYPE_I32:
    case FD_DTYPE_E4M3:
    case FD_DTYPE_E5M2:
    case FD_DTYPE_I8: return true;
    default: return false;
  }
}

size_t dtype_bytes(const fd_dtype &dtype) {
  switch (raw_enum_value(dtype)) {
    case FD_DTYPE_E4M3:
    case FD_DTYPE_E5M2:
    case FD_DTYPE_I8: return 1;
    case FD_DTYPE_F16:
    case FD_DTYPE_BF16: return 2;
    case FD_DTYPE_F32:
    case FD_DTYPE_I32: return 4;
    default: break;
  }
  fail(FD_ERROR_INTERNAL, "no element size for dtype %d", raw_enum_value(dtype));
}

bool is_float_dtype(const fd_dtype &dtype) {
  switch (raw_enum_value(dtype)) {
    case FD_DTYPE_F32:
    case FD_DTYPE_F16:
    case FD_DTYPE_BF16: return true;
    default: return false;
  }
}

bool is_quantized_dtype(const fd_dtype &dtype) {
  switch (raw_enum_value(dtype)) {
    case FD_DTYPE_E4M3:
    case FD_DTYPE_E5M2:
    case FD_DTYPE_I8: return true;
    default: return false;
  }
}

const char *dtype_name(const fd_dtype &dtype) {
  switch (raw_enum_value(dtype)) {
    case FD_DTYPE_F32: return "f32";
    case FD_DTYPE_F16: return "f16";
    case FD_DTYPE_BF16: return "bf16";
    case FD_DTYPE_I32: return "i32";
    case FD_DTYPE_E4M3: return "e4m3";
    case FD_DTYPE_E5M2: return "e5m2";
    case FD_DTYPE_I8: return "i8";
    default: return "unknown";
  }
}

}  // namespace fd
