// SPDX-License-Identifier: Apache-2.0
// fd_merge_states: partial attention results of the same rows combined by
// their natural-log LSEs (flashdecode.h, fd_merge_args). One warp a row:
// every lane reads the row's LSEs, and its own head_dim elements of each
// non-empty state in state order; lane 0 writes the merged LSE once every
// lane has read (out and lse may be a state's, in place).
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "backend/cuda/params.h"
#include "backend/cuda/prims/element.cuh"
#include "backend/cuda/prims/softmax.cuh"

namespace fd {
namespace cuda {

constexpr int kMergeStatesThreads = 256;
constexpr int kMergeStatesBatch = 8;  // states whose loads are in flight together

// A lane's kPerLane consecutive elements of a state's output from element
// `offset` (count of them inside head_dim), whatever its float dtype: one
// vector load when they are all there and aligned to their size, else
// element loads. The dtype is decided once per state, not per element.
template <class T, int kPerLane>
__device__ __forceinline__ void load_lane(const void *data, int64_t offset, int count, float (&x)[kPerLane]) {
  const T *src = static_cast<const T *>(data) + offset;
  constexpr int kBytes = kPerLane * static_cast<int>(sizeof(T));
  if constexpr (kBytes >= 4 && kBytes <= 16) {
    if (count == kPerLane && reinterpret_cast<uintptr_t>(src) % kBytes == 0) {
      using Vector = typename std::conditional<kBytes == 16, uint4,
                                               typename std::conditional<kBytes == 8, uint2, uint32_t>::type>::type;
      const Vector v = *reinterpret_cast<const Vector *>(src);
      T elements[kPerLane];
      memcpy(elements, &v, kBytes);
#pragma unroll
      for (int i = 0; i < kPerLane; ++i) x[i] = Element<T>::to_float(elements[i]);
      return;
    }
  }
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    if (i < count) x[i] = Element<T>::to_float(src[i]);
  }
}

template <int kPerLane>
__device__ __forceinline__ void load_state(const MergeStateView &state, int64_t offset, int count,
                                           float (&x)[kPerLane]) {
  switch (state.dtype) {
    case FD_DTYPE_F16: load_lane<__half>(state.out, offset, count, x); break;
    case FD_DTYPE_BF16: load_lane<__nv_bfloat16>(state.out, offset, count, x); break;
    default: load_lane<float>(state.out, offset, count, x); break;
  }
}

__device__ __forceinline__ float state_lse(const MergeStateView &state, int64_t b, int64_t t, int64_t h) {
  return state.lse[b * state.lse_strides[0] + t * state.lse_strides[1] + h * state.lse_strides[2]];
}

// kPerLane: a lane's consecutive elements of a row (head_dim / 32 rounded
// up to 1, 2, 4 or 8: merge_states_per_lane), so that registers hold what
// head_dim needs and no more. __grid_constant__: p.states[s] with a runtime
// s reads the parameter bank in place (a by-value parameter would be copied
// to local memory first). The loads of kMergeStatesBatch states go out
// before any is used, which is what keeps the merge streaming: a row's
// LSEs, then its states' elements, are two round trips to memory.
template <class OutT, int kPerLane, int kStates>
__global__ void __launch_bounds__(kMergeStatesThreads)
    merge_states_kernel(const __grid_constant__ MergeStatesParamsFor<kStates> p) {
  const int lane = threadIdx.x % 32;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (kMergeStatesThreads / 32);
  for (int64_t row = blockIdx.x * (kMergeStatesThreads / 32) + threadIdx.x / 32; row < p.rows; row += warps) {
    const int64_t h = row % p.heads;
    const int64_t t = (row / p.heads) % p.q_len;
    const int64_t b = row / (p.heads * p.q_len);
    float m = negative_infinity();
    for (int first = 0; first < p.num_states; first += kMergeStatesBatch) {
      float lse[kMergeStatesBatch];
#pragma unroll
      for (int j = 0; j < kMergeStatesBatch; ++j) {
        lse[j] = first + j < p.num_states ? state_lse(p.states[first + j], b, t, h) : negative_infinity();
      }
#pragma unroll
      for (int j = 0; j < kMergeStatesBatch; ++j) m = max_nan(m, lse[j]);
    }
    float acc[kPerLane];
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) acc[i] = 0.0f;
    float l = 0.0f;
    const bool finite = m != negative_infinity() && m == m && m != -negative_infinity();
    if (finite) {
      for (int first = 0; first < p.num_states; first += kMergeStatesBatch) {
        float w[kMergeStatesBatch];
        float x[kMergeStatesBatch][kPerLane];
#pragma unroll
        for (int j = 0; j < kMergeStatesBatch; ++j) {
          w[j] = 0.0f;
#pragma unroll
          for (int i = 0; i < kPerLane; ++i) x[j][i] = 0.0f;
          if (first + j >= p.num_states) continue;
          const MergeStateView &state = p.states[first + j];
          const float lse = state_lse(state, b, t, h);
          if (lse == negative_infinity()) continue;  // empty: its output is not read
          w[j] = expf(lse - m);
          const int64_t base = b * state.out_strides[0] + t * state.out_strides[1] + h * state.out_strides[2];
          load_state(state, base + lane * kPerLane, p.head_dim - lane * kPerLane, x[j]);
        }
#pragma unroll
        for (int j = 0; j < kMergeStatesBatch; ++j) {  // in state order; an empty state's 0 changes no sum
          l += w[j];
#pragma unroll
          for (int i = 0; i < kPerLane; ++i) acc[i] = fmaf(w[j], x[j][i], acc[i]);
        }
      }
    }
    __syncwarp();  // every lane has read the states before any output of this row is written
    const float nan = __int_as_float(0x7fffffff);
    const float inv_l = finite ? 1.0f / l : 0.0f;
    OutT *out = static_cast<OutT *>(p.out) + b * p.out_strides[0] + t * p.out_strides[1] + h * p.out_strides[2];
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const int d = lane * kPerLane + i;
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

// Elements a lane takes for a head_dim: 1, 2, 4 or 8 (head_dim <= 256).
inline int merge_states_per_lane(int head_dim) {
  const int needed = (head_dim + 31) / 32;
  return needed <= 1 ? 1 : needed <= 2 ? 2 : needed <= 4 ? 4 : 8;
}

}  // namespace cuda
}  // namespace fd
