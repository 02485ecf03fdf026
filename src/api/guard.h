// SPDX-License-Identifier: Apache-2.0
// The C ABI boundary: every exported function body runs inside guarded(),
// which turns fd::Error and any other C++ exception into an fd_status and
// the calling thread's detailed message. Nothing thrown crosses the ABI.
#pragma once

#include <exception>
#include <new>

#include "core/error.h"
#include "flashdecode.h"

namespace fd {

void set_last_error(fd_status status, const char *message) noexcept;

template <class Body>
fd_status guarded(Body &&body) noexcept {
  try {
    body();
    return FD_SUCCESS;
  } catch (const Error &e) {
    set_last_error(e.status(), e.what());
    return e.status();
  } catch (const std::bad_alloc &) {
    set_last_error(FD_ERROR_OUT_OF_MEMORY, "host memory allocation failed");
    return FD_ERROR_OUT_OF_MEMORY;
  } catch (const std::exception &e) {
    set_last_error(FD_ERROR_INTERNAL, e.what());
    return FD_ERROR_INTERNAL;
  } catch (...) {
    set_last_error(FD_ERROR_INTERNAL, "unknown internal exception");
    return FD_ERROR_INTERNAL;
  }
}

}  // namespace fd
