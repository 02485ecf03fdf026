// SPDX-License-Identifier: Apache-2.0
// Programmatic dependent launch (sm_90 and later): how every kernel of the
// library orders itself against the kernel before it on the stream.
#pragma once

namespace fd {
namespace cuda {

// Programmatic dependent launch (sm_90 and later; no-ops in code built for
// older architectures, where the host never asks for it). Every kernel of
// this library is launched so that it may be scheduled while the previous
// kernel on the stream finishes, and waits here, before its first memory
// access, until that grid has finished and its writes are visible; each
// then lets the next kernel be scheduled. Without the launch attribute both
// return at once.
__device__ __forceinline__ void grid_dependency_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

__device__ __forceinline__ void grid_dependency_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

// The first statement of both split kernels. Launched programmatically
// after the previous kernel on the stream (sm_90+), a split kernel waits for
// it to finish, and its writes to be visible, before touching any memory (q
// may be its output; its merge may still read this workspace). Then the
// merge, or the next decode's split kernel, may be scheduled once every CTA
// of this grid has got here; they wait in turn for this grid to finish.
__device__ __forceinline__ void split_kernel_prologue() {
  grid_dependency_wait();
  grid_dependency_launch_dependents();
}

}  // namespace cuda
}  // namespace fd
