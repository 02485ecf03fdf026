// SPDX-License-Identifier: Apache-2.0
// The rows families' (but the wide 64-row one's, dispatch_rows64_wide.cu)
// and the compact tiles' kernels and row functions
// (dispatch_families.cuh), in a translation unit of their own so that they
// compile in parallel with dispatch.cu, which declares them extern and puts
// them in its table.
#include "backend/cuda/dispatch_families.cuh"

namespace fd {
namespace cuda {
namespace dispatch {

FD_FAMILY_FUNCTIONS(template, TensorCoreRowsFamily<2>)
FD_FAMILY_FUNCTIONS(template, TensorCoreRowsFamily<4>)
FD_FAMILY_FUNCTIONS(template, TensorCoreFamily<MmaTiles::compact>)

}  // namespace dispatch
}  // namespace cuda
}  // namespace fd
