// SPDX-License-Identifier: Apache-2.0
// fd_merge_states: partial attention results of the same rows combined by
// their natural-log LSEs (flashdecode.h, fd_merge_args). Two kernels: for
// up to 8 states of one dtype with 16-byte aligned rows (the common case,
// merge_aligned_states_kernel), a row's lanes each take 8 elements with
// vector loads; for anything else (more states, mixed dtypes, odd
// alignment), one warp a row. Either way every lane reads the row's LSEs
// and its own elements of each state in state order, and one lane writes
// the merged LSE once every lane has read (out and lse may be a state's,
// in place).
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "backend/cuda/params.h"
#include "backend/cuda/prims/element.cuh"
#include "backend/cuda/prims/grid_dependency.cuh"
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

// A row's (sequence, query token, head), rows being [batch, q_len, heads]
// in order, and its element offset in a tensor of those three strides.
// Three divisions: a form with two made the vector kernel's per-state path
// spill on 16-bit states, at their 64-register bound.
struct MergeRow {
  int64_t b, t, h;
  __device__ __forceinline__ MergeRow(int64_t row, int64_t heads, int64_t q_len) {
    h = row % heads;
    t = (row / heads) % q_len;
    b = row / (heads * q_len);
  }
  __device__ __forceinline__ int64_t offset(const int64_t (&strides)[3]) const {
    return b * strides[0] + t * strides[1] + h * strides[2];
  }
};

__device__ __forceinline__ float state_lse(const MergeStateView &state, const MergeRow &at) {
  return state.lse[at.offset(state.lse_strides)];
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
  // Launched programmatically (sm_90+): scheduled while the kernel before it
  // (the decodes of the parts) finishes, it waits for it before any access.
  grid_dependency_wait();
  grid_dependency_launch_dependents();
  const int lane = threadIdx.x % 32;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (kMergeStatesThreads / 32);
  // blockIdx.x widened first: past 2^32 rows a 32-bit product wraps.
  const int64_t first_row = static_cast<int64_t>(blockIdx.x) * (kMergeStatesThreads / 32) + threadIdx.x / 32;
  for (int64_t row = first_row; row < p.rows; row += warps) {
    const MergeRow at(row, p.heads, p.q_len);
    float m = negative_infinity();
    for (int first = 0; first < p.num_states; first += kMergeStatesBatch) {
      float lse[kMergeStatesBatch];
#pragma unroll
      for (int j = 0; j < kMergeStatesBatch; ++j) {
        lse[j] = first + j < p.num_states ? state_lse(p.states[first + j], at) : negative_infinity();
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
          const float lse = state_lse(state, at);
          if (lse == negative_infinity()) continue;  // empty: its output is not read
          w[j] = expf(lse - m);
          const int64_t base = at.offset(state.out_strides);
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
    OutT *out = static_cast<OutT *>(p.out) + at.offset(p.out_strides);
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
      p.lse[at.offset(p.lse_strides)] = merged;
    }
  }
}

// The common case: up to kMergeStatesBatch states of one dtype whose rows
// are 16-byte aligned and head_dim a multiple of kVector. A lane takes
// kVector elements of a row (one 16-byte load of a 16-bit state, two of
// f32), a row 2^row_lanes_log2 lanes (head_dim / kVector rounded up), a warp
// 32 >> row_lanes_log2 rows. Each lane issues every state's raw loads before
// converting any: the general kernel converts inside the branch that loads
// (its per-state dtype switch), so it waits for each state's load in turn.
// vector_out: out's rows are 16-byte aligned too.
// Unlike the general kernel, it reads an empty state's elements (within
// the state's tensor) and discards them: waiting for the LSEs before the
// loads cost a second round trip to memory.
// Resident blocks asked of the register allocator: 4 for 16-bit states
// (64 registers, which their loads fit), 2 for f32 (twice the raw words).
// kOneLayout: every state has state 0's out strides and LSE strides (states
// cut from one tensor, or alike tensors), so a row's two offsets serve all
// of them: the per-state 64-bit offset arithmetic was most of the
// instructions a thread issued before its loads.
template <class OutT, class StateT, bool kOneLayout>
__global__ void __launch_bounds__(kMergeStatesThreads, sizeof(StateT) == 2 ? 4 : 2)
    merge_aligned_states_kernel(const __grid_constant__ MergeStatesParamsFor<kMergeStatesBatch> p, int row_lanes_log2,
                                bool vector_out) {
  grid_dependency_wait();  // as in merge_states_kernel
  grid_dependency_launch_dependents();
  constexpr int kLoads = kVector * static_cast<int>(sizeof(StateT)) / 16;
  static_assert(kLoads >= 1, "a lane's elements are whole 16-byte loads");
  const int lane = threadIdx.x % 32;
  const int rows_per_warp = 32 >> row_lanes_log2;
  const int d0 = (lane & ((1 << row_lanes_log2) - 1)) * kVector;
  const bool has_elements = d0 < p.head_dim;
  const int64_t warp = (static_cast<int64_t>(blockIdx.x) * kMergeStatesThreads + threadIdx.x) / 32;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (kMergeStatesThreads / 32);
  for (int64_t first_row = warp * rows_per_warp; first_row < p.rows; first_row += warps * rows_per_warp) {
    const int64_t row = first_row + (lane >> row_lanes_log2);  // the loop is warp-uniform: __syncwarp below
    const bool active = row < p.rows;
    const MergeRow at(row, p.heads, p.q_len);
    // The LSEs and the states' elements load together, one round trip: an
    // empty state's elements are read but never used (selected away below,
    // so neither its NaN nor its infinity reaches the result).
    float lse[kMergeStatesBatch];
    uint4 raw[kMergeStatesBatch][kLoads];
    int64_t shared_out_offset = 0, shared_lse_offset = 0;
    if constexpr (kOneLayout) {
      const MergeStateView &first = p.states[0];
      shared_out_offset = at.offset(first.out_strides) + d0;
      shared_lse_offset = at.offset(first.lse_strides);
    }
#pragma unroll
    for (int s = 0; s < kMergeStatesBatch; ++s) {
      const MergeStateView &state = p.states[s];
      const bool present = active && s < p.num_states;
      int64_t out_offset = shared_out_offset, lse_offset = shared_lse_offset;
      if constexpr (!kOneLayout) {
        out_offset = at.offset(state.out_strides) + d0;
        lse_offset = at.offset(state.lse_strides);
      }
      lse[s] = present ? state.lse[lse_offset] : negative_infinity();
      const uint4 *src = reinterpret_cast<const uint4 *>(static_cast<const StateT *>(state.out) + out_offset);
#pragma unroll
      for (int k = 0; k < kLoads; ++k) raw[s][k] = present && has_elements ? src[k] : make_uint4(0, 0, 0, 0);
    }
    float m = negative_infinity();
#pragma unroll
    for (int s = 0; s < kMergeStatesBatch; ++s) m = max_nan(m, lse[s]);
    const bool finite = m != negative_infinity() && m == m && m != -negative_infinity();
    float acc[kVector];
#pragma unroll
    for (int i = 0; i < kVector; ++i) acc[i] = 0.0f;
    float l = 0.0f;
#pragma unroll
    for (int s = 0; s < kMergeStatesBatch; ++s) {  // in state order
      const bool used = finite && lse[s] != negative_infinity();
      const float w = used ? expf(lse[s] - m) : 0.0f;
      float x[kVector];
      Element<StateT>::to_float8(reinterpret_cast<const StateT *>(raw[s]), x);
      l += w;
#pragma unroll
      for (int i = 0; i < kVector; ++i) acc[i] = used ? fmaf(w, x[i], acc[i]) : acc[i];
    }
    __syncwarp();  // every lane of a row has read its LSEs before one lane writes the merged LSE
    if (!active) continue;
    const float nan = __int_as_float(0x7fffffff);
    const float inv_l = finite ? 1.0f / l : 0.0f;
    const float fill = m == negative_infinity() ? 0.0f : nan;
    if (has_elements) {
      OutT *out = static_cast<OutT *>(p.out) + at.offset(p.out_strides) + d0;
      float values[kVector];
#pragma unroll
      for (int i = 0; i < kVector; ++i) values[i] = finite ? acc[i] * inv_l : fill;
      if (vector_out) {
        Element<OutT>::from_float8(values, out);
      } else {
#pragma unroll
        for (int i = 0; i < kVector; ++i) out[i] = Element<OutT>::from_float(values[i]);
      }
    }
    if (d0 == 0 && p.lse != nullptr) {
      const float merged = finite ? m + logf(l) : (m == negative_infinity() ? m : nan);
      p.lse[at.offset(p.lse_strides)] = merged;
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
