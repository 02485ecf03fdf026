// SPDX-License-Identifier: Apache-2.0
// The 8-bit families' kernels and row functions (dispatch_families.cuh), in a
// translation unit of their own so that they compile in parallel with
// dispatch.cu, which declares them extern and puts them in its table.
#include "backend/cuda/dispatch_families.cuh"

namespace fd {
namespace cuda {
namespace dispatch {

FD_FAMILY_FUNCTIONS(template, CudaCoreQuantizedFamily)
FD_FAMILY_FUNCTIONS(template, TensorCoreQuantizedFamily)

}  // namespace dispatch
}  // namespace cuda
}  // namespace fd
