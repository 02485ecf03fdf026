// SPDX-License-Identifier: Apache-2.0
// The wide 64-row kernels (tensor_core_rows64_wide) and their row functions
// (dispatch_families.cuh), in a translation unit of their own so that they
// compile in parallel with the other rows kernels; dispatch.cu declares them
// extern and puts them in its table.
#include "backend/cuda/dispatch_families.cuh"

namespace fd {
namespace cuda {
namespace dispatch {

FD_FAMILY_FUNCTIONS(template, TensorCoreRows64WideFamily)

}  // namespace dispatch
}  // namespace cuda
}  // namespace fd
