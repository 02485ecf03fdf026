// SPDX-License-Identifier: Apache-2.0
// The 16-row 8-bit tensor-core family's kernels and row functions
// (dispatch_families.cuh), in a translation unit of their own so that they
// compile in parallel with dispatch.cu, which declares them extern and puts
// them in its table (the CUDA-core 8-bit family's are in
// dispatch_8bit_cuda_core.cu, the keys kernel's in dispatch_8bit_keys.cu).
#include "backend/cuda/dispatch_families.cuh"

namespace fd {
namespace cuda {
namespace dispatch {

FD_FAMILY_FUNCTIONS(template, TensorCoreQuantizedFamily)

}  // namespace dispatch
}  // namespace cuda
}  // namespace fd
