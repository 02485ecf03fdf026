// SPDX-License-Identifier: Apache-2.0
// fd_merge_states: partial attention results of the same rows combined by
// their natural-log LSEs (flashdecode.h, fd_merge_args). One warp a row:
// every lane reads the row's LSEs, and its own head_dim elements of each
// non-empty state in state order; lane 0 writes the merged LSE once every
// lane has read (out and lse may be a state's, in place).
#pragma once

#include <cstdint>

#include "backend/cuda/params.h"
#include "backend/cuda/prims/element.cuh"
#include "backend/cuda/prims/softmax.cuh"

namespace fd {
namespace cuda {

constexpr int kMergeStatesThreads = 256;
constexpr int kMergeStatesPerLane = (kMaxHeadDim + 31) / 32;

// Element i of a state's output, whatever its float dtype.
__device__ __forceinline__ float load_state(const MergeStateView &state, int64_t offset) {
  switch (state.dtype) {
    case FD_DTYPE_F16: return Element<__half>::to_float(static_cast<const __half *>(state.out)[offset]);
    case FD_DTYPE_BF16: return Element<__nv_bfloat16>::to_float(static_cast<const __nv_bfloat16 *>(state.out)[offset]);
    default: return static_cast<const float *>(state.out)[offset];
  }
}

template <class OutT>
__global__ void __launch_bounds__(kMergeStatesThreads) merge_states_kernel(const MergeStatesParams p) {
  const int lane = threadIdx.x % 32;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (kMergeStatesThreads / 32);
  for (int64_t row = blockIdx.x * (kMergeStatesThreads / 32) + threadIdx.x / 32; row < p.rows; row += warps) {
    const int64_t h = row % p.heads;
    const int64_t t = (row / p.heads) % p.q_len;
    const int64_t b = row / (p.heads * p.q_len);
    float m = negative_infinity();
    for (int s = 0; s < p.num_states; ++s) {
      const MergeStateView &state = p.states[s];
      m = max_nan(m, state.lse[b * state.lse_strides[0] + t * state.lse_strides[1] + h * state.lse_strides[2]]);
    }
    float acc[kMergeStatesPerLane];
#pragma unroll
    for (int i = 0; i < kMergeStatesPerLane; ++i) acc[i] = 0.0f;
    float l = 0.0f;
    const bool finite = m != negative_infinity() && m == m && m != -negative_infinity();
    if (finite) {
      for (int s = 0; s < p.num_states; ++s) {
        const MergeStateView &state = p.states[s];
        const float lse = state.lse[b * state.lse_strides[0] + t * state.lse_strides[1] + h * state.lse_strides[2]];
        if (lse == negative_infinity()) continue;  // empty: its output is not read
        const float w = expf(lse - m);
        l += w;
        const int64_t base = b * state.out_strides[0] + t * state.out_strides[1] + h * state.out_strides[2];
#pragma unroll
        for (int i = 0; i < kMergeStatesPerLane; ++i) {
          const int d = lane + 32 * i;
          if (d < p.head_dim) acc[i] = fmaf(w, load_state(state, base + d), acc[i]);
        }
      }
    }
    __syncwarp();  // every lane has read the states before any output of this row is written
    const float nan = __int_as_float(0x7fffffff);
    const float inv_l = finite ? 1.0f / l : 0.0f;
    OutT *out = static_cast<OutT *>(p.out) + b * p.out_strides[0] + t * p.out_strides[1] + h * p.out_strides[2];
#pragma unroll
    for (int i = 0; i < kMergeStatesPerLane; ++i) {
      const int d = lane + 32 * i;
      if (d < p.head_dim) {
        const float value = finite ? acc[i] * inv_l : (m == negative_infinity() ? 0.0f : nan);
        out[d] = Element<OutT>::from_float(value);
      }
    }
    if (lane == 0 && p.lse != nullptr) {
      const float merged = finite ? m + logf(l) : (m == negative_infinity() ? m : nan);
      p.lse[b * p.lse_strides[0] + t * p.lse_strides[1] + h * p.lse_strides[2]] = merged;
    }
  }
}

}  // namespace cuda
}  // namespace fd
