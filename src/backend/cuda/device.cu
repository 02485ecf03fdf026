// SPDX-License-Identifier: Apache-2.0
#include "backend/cuda/device.h"

#include <cudaTypedefs.h>

#include <cstdio>

#include "core/error.h"

namespace fd {
namespace cuda {
namespace {

// The driver's current-context calls, reached through the runtime (the
// library does not link libcuda).
struct ContextCalls {
  PFN_cuCtxGetCurrent_v4000 get_current = nullptr;
  PFN_cuCtxSetCurrent_v4000 set_current = nullptr;
};

const ContextCalls &context_calls() {
  static const ContextCalls calls = [] {
    ContextCalls found;
    void *get = nullptr;
    void *set = nullptr;
    cudaDriverEntryPointQueryResult get_status = cudaDriverEntryPointSymbolNotFound;
    cudaDriverEntryPointQueryResult set_status = cudaDriverEntryPointSymbolNotFound;
    if (cudaGetDriverEntryPointByVersion("cuCtxGetCurrent", &get, 4000, cudaEnableDefault, &get_status) ==
            cudaSuccess &&
        cudaGetDriverEntryPointByVersion("cuCtxSetCurrent", &set, 4000, cudaEnableDefault, &set_status) ==
            cudaSuccess &&
        get_status == cudaDriverEntryPointSuccess && set_status == cudaDriverEntryPointSuccess) {
      found.get_current = reinterpret_cast<PFN_cuCtxGetCurrent_v4000>(get);
      found.set_current = reinterpret_cast<PFN_cuCtxSetCurrent_v4000>(set);
    }
    cudaGetLastError();  // without them the guard falls back to cudaSetDevice
    return found;
  }();
  return calls;
}

}  // namespace

void fail_cuda(const char *what, cudaError_t err) {
  cudaGetLastError();  // the error is reported here; do not leave it pending
  fail(FD_ERROR_CUDA, "%s: %s", what, cudaGetErrorString(err));
}

void check_cuda(cudaError_t err, const char *what) {
  if (err != cudaSuccess) fail_cuda(what, err);
}

bool is_kernel_image_error(cudaError_t err) {
  switch (err) {
    case cudaErrorNoKernelImageForDevice:
    case cudaErrorInvalidKernelImage:
    case cudaErrorInvalidPtx:
    case cudaErrorUnsupportedPtxVersion:
    case cudaErrorJitCompilerNotFound:
    case cudaErrorJitCompilationDisabled:
    case cudaErrorInvalidDeviceFunction:
    case cudaErrorSharedObjectInitFailed: return true;
    default: return false;
  }
}

bool probe_device(int device, char *why, size_t why_size) {
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    cudaGetLastError();
    snprintf(why, why_size, "no CUDA device is usable (%s)", cudaGetErrorString(err));
    return false;
  }
  if (device < 0 || device >= count) {
    snprintf(why, why_size, "%d CUDA device(s) found", count);
    return false;
  }
  int major = 0;
  err = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  if (err != cudaSuccess) {
    cudaGetLastError();
    snprintf(why, why_size, "%s", cudaGetErrorString(err));
    return false;
  }
  if (major < 8) {
    snprintf(why, why_size, "compute capability %d.x is below the 8.0 the kernels need", major);
    return false;
  }
  return true;
}

CUcontext current_context() {
  CUcontext context = nullptr;
  if (context_calls().get_current != nullptr && context_calls().get_current(&context) != CUDA_SUCCESS) {
    context = nullptr;
  }
  return context;
}

DeviceGuard::DeviceGuard(int device, CUcontext primary) {
  check_cuda(enter(device, primary), "making the handle's CUDA device current");
}

DeviceGuard::DeviceGuard(int device, CUcontext primary, std::nothrow_t) noexcept {
  if (enter(device, primary) != cudaSuccess) cudaGetLastError();
}

DeviceGuard::~DeviceGuard() {
  if (!switched_) return;
  if (restore_context_) {
    context_calls().set_current(previous_context_);
  } else {
    cudaSetDevice(previous_device_);
  }
  cudaGetLastError();  // nothing to report from a destructor
}

cudaError_t DeviceGuard::enter(int device, CUcontext primary) noexcept {
  const ContextCalls &driver = context_calls();
  if (driver.get_current != nullptr && driver.get_current(&previous_context_) == CUDA_SUCCESS) {
    if (previous_context_ != nullptr && previous_context_ == primary) return cudaSuccess;
    restore_context_ = true;
  } else {
    // Without the driver's calls: compare and restore devices.
    cudaError_t err = cudaGetDevice(&previous_device_);
    if (err != cudaSuccess || previous_device_ == device) return err;
  }
  const cudaError_t err = cudaSetDevice(device);
  switched_ = err == cudaSuccess;
  return err;
}

}  // namespace cuda
}  // namespace fd
