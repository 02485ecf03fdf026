// SPDX-License-Identifier: Apache-2.0
// The 8-bit CUDA-core family's kernels and row functions
// (dispatch_families.cuh), in a translation unit of their own so that they
// compile in parallel with dispatch.cu, which declares them extern and puts
// them in its table, and with the 8-bit tensor-core ones (dispatch_8bit.cu).
#include "backend/cuda/dispatch_families.cuh"

namespace fd {
namespace cuda {
namespace dispatch {

FD_FAMILY_FUNCTIONS(template, CudaCoreQuantizedFamily)

}  // namespace dispatch
}  // namespace cuda
}  // namespace fd
