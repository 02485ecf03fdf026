// The CUDA backend. Its kernels are issue #3; until they exist, a CUDA handle
// is refused with FD_ERROR_UNSUPPORTED rather than returning fake results,
// and FD_BACKEND_AUTO falls back to the CPU.
#include <cuda_runtime.h>

#include "backend/backend.h"
#include "core/error.h"

namespace fd {

bool cuda_backend_available(int) noexcept { return false; }

std::unique_ptr<Backend> make_cuda_backend(int device) {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess || device >= count) {
    fail(FD_ERROR_NO_DEVICE, "options: CUDA device %d is not available (%d device(s) found: %s)", device,
         status == cudaSuccess ? count : 0, status == cudaSuccess ? "ok" : cudaGetErrorString(status));
  }
  fail(FD_ERROR_UNSUPPORTED, "options: the CUDA backend has no kernels in this build yet; use FD_BACKEND_CPU");
}

}  // namespace fd
