// SPDX-License-Identifier: Apache-2.0
// Built instead of the CUDA backend when the library is configured without
// CUDA (FLASHDECODE_CUDA=OFF or no nvcc): CUDA handles are refused clearly.
#include "backend/backend.h"
#include "core/error.h"

namespace fd {

bool cuda_backend_available(int) noexcept { return false; }

std::unique_ptr<Backend> make_cuda_backend(int device, bool) {
  fail(FD_ERROR_NO_DEVICE, "options: CUDA device %d requested, but this libflashdecode was built without CUDA", device);
}

}  // namespace fd
