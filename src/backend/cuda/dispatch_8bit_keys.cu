// SPDX-License-Identifier: Apache-2.0
// The keys-on-M 8-bit family's kernels and row functions
// (dispatch_families.cuh), in a translation unit of their own so that they
// compile in parallel with dispatch.cu and the other 8-bit families'.
#include "backend/cuda/dispatch_families.cuh"

namespace fd {
namespace cuda {
namespace dispatch {

FD_FAMILY_FUNCTIONS(template, TensorCoreQuantizedKeysFamily)

}  // namespace dispatch
}  // namespace cuda
}  // namespace fd
