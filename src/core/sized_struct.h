// SPDX-License-Identifier: Apache-2.0
// Reading a caller's versioned input struct (fd_options, fd_decode_args):
// it starts with its own struct_size, so callers compiled against older or
// newer headers than this library's share one ABI. The rule is that of
// Linux's copy_struct_from_user:
// - a smaller (older) struct: the fields it lacks keep their defaults;
// - a larger (newer) struct: the bytes past this library's sizeof are fields
//   it does not know. All zero means none of them is used (zero is the
//   default of every later field), so the call proceeds; any non-zero byte
//   asks for something this library cannot do, which is refused rather than
//   silently ignored.
#pragma once

#include <cstddef>
#include <cstring>

#include "core/error.h"

namespace fd {

// Largest accepted struct_size: a garbage one (an uninitialised struct)
// would otherwise send the tail scan through arbitrary memory.
constexpr size_t kMaxStructSize = 4096;

// Returns the caller's struct as this library knows it. `required` is the
// smallest struct_size accepted; `arg` names the argument and `type` the
// struct (and its init function) in messages. Throws
// FD_ERROR_INVALID_ARGUMENT for a struct_size out of range and
// FD_ERROR_UNSUPPORTED, naming the offset, for a non-zero unknown byte.
template <class Struct>
Struct read_sized_struct(const Struct &caller, const Struct &defaults, size_t required, const char *arg,
                         const char *type) {
  const size_t size = caller.struct_size;
  if (size < required) {
    fail(FD_ERROR_INVALID_ARGUMENT, "%s: struct_size is %zu, expected at least %zu (initialise it with %s_init)", arg,
         size, required, type);
  }
  if (size > kMaxStructSize) {
    fail(FD_ERROR_INVALID_ARGUMENT, "%s: struct_size is %zu, expected at most %zu (initialise it with %s_init)", arg,
         size, kMaxStructSize, type);
  }
  const auto *bytes = static_cast<const unsigned char *>(static_cast<const void *>(&caller));
  for (size_t offset = sizeof(Struct); offset < size; ++offset) {
    if (bytes[offset] != 0) {
      fail(FD_ERROR_UNSUPPORTED,
           "%s: %s has a non-zero byte at offset %zu, past the %zu bytes this library knows (struct_size %zu): a "
           "field of a newer flashdecode that this version (%s) cannot honour; leave it zero or use a newer library",
           arg, type, offset, sizeof(Struct), size, fd_version_string());
    }
  }
  Struct copy = defaults;
  std::memcpy(static_cast<void *>(&copy), &caller, size < sizeof copy ? size : sizeof copy);
  return copy;
}

}  // namespace fd
