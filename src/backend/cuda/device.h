// SPDX-License-Identifier: Apache-2.0
// CUDA device plumbing: turning runtime errors into fd::Error, making a
// handle's device current for a scope (and putting back exactly what the
// caller had), and what a device says about itself before any kernel runs.
#pragma once

#include <cuda.h>  // the driver's context type; its calls come through the runtime (device.cu)
#include <cuda_runtime_api.h>

#include <cstddef>
#include <new>

namespace fd {
namespace cuda {

// Throws fd::Error(FD_ERROR_CUDA) naming `what`, clearing the runtime's
// pending error first. In the shared library the CUDA runtime is linked
// statically and hidden, so its "last error" state is the library's own; a
// program linking the static library shares it, so no launch learns its
// status from cudaGetLastError (dispatch.cu, launch_on).
[[noreturn]] void fail_cuda(const char *what, cudaError_t err);
void check_cuda(cudaError_t err, const char *what);

// Errors that say this build's kernels cannot run on the device.
bool is_kernel_image_error(cudaError_t err);

// Whether `device` exists and has compute capability 8.0 or more; otherwise
// false with the reason in `why`. Never throws.
bool probe_device(int device, char *why, size_t why_size);

// The calling thread's current driver context (null when there is none or
// the driver's calls are unavailable).
CUcontext current_context();

// Makes the handle's device current for a scope and then puts back the
// context the calling thread had (none, a primary context, or one of its
// own). cudaSetDevice(previous) could not: it makes the previous device's
// primary context current, creating it when the caller never used that
// device, and replaces a context of the caller's own. `primary` is the
// device's primary context once known: when it is already current, nothing
// changes hands, which is the common case and costs one driver call.
class DeviceGuard {
 public:
  DeviceGuard(int device, CUcontext primary);
  // For paths that must not throw (freeing): on failure the caller's context
  // stays current.
  DeviceGuard(int device, CUcontext primary, std::nothrow_t) noexcept;
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard &) = delete;
  DeviceGuard &operator=(const DeviceGuard &) = delete;

 private:
  cudaError_t enter(int device, CUcontext primary) noexcept;

  int previous_device_ = 0;
  CUcontext previous_context_ = nullptr;
  bool restore_context_ = false;
  bool switched_ = false;
};

}  // namespace cuda
}  // namespace fd
