// SPDX-License-Identifier: Apache-2.0
// Element types: the one place that knows each fd_dtype's size and name.
#pragma once

#include <cstddef>

#include "flashdecode.h"

namespace fd {

// Whether the value a caller stored is an fd_dtype this library knows
// (read through raw_enum_value: a C caller may store any int).
bool is_known_dtype(const fd_dtype &dtype);

// Bytes of one element. Fails closed (FD_ERROR_INTERNAL) for a dtype without
// a size here: every caller has validated its dtype first.
size_t dtype_bytes(const fd_dtype &dtype);

// Whether dtype is a float dtype (f32, f16, bf16): q, out, merge states and
// 16- or 32-bit caches.
bool is_float_dtype(const fd_dtype &dtype);

// Whether dtype is an 8-bit cache dtype (e4m3, e5m2, i8), whose elements
// stand for stored value x scale.
bool is_quantized_dtype(const fd_dtype &dtype);

// "f16", "bf16", ...; "unknown" for any other value.
const char *dtype_name(const fd_dtype &dtype);

}  // namespace fd
