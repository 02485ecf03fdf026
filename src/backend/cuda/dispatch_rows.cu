// SPDX-License-Identifier: Apache-2.0
// The rows family's kernels and row functions (dispatch_families.cuh), in a
// translation unit of their own so that they compile in parallel with
// dispatch.cu, which declares them extern and puts them in its table.
#include "backend/cuda/dispatch_families.cuh"

namespace fd {
namespace cuda {
namespace dispatch {

#define FD_INSTANTIATE_FAMILY(Family)                                                     \
  template bool family_takes<Family>(fd_dtype);                                           \
  template SplitKernelShape family_shape<Family>(fd_dtype, int);                          \
  template cudaError_t prepare_family<Family>(fd_dtype, int, const DeviceLimits &, int &, \
                                              int(&)[kMaxClusterSplits + 1]);             \
  template cudaError_t launch_family<Family>(fd_dtype, fd_dtype, int, const SplitParams &, bool, cudaStream_t);
FD_INSTANTIATE_FAMILY(TensorCoreRowsFamily)
#undef FD_INSTANTIATE_FAMILY

}  // namespace dispatch
}  // namespace cuda
}  // namespace fd
