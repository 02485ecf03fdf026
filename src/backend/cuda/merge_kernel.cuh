// Phase 2: one warp per query row merges the row's per-split states into
// out and lse. The common max is the largest split max; every split is
// rescaled by exp2(m_split - m_max) and summed in split order, so the result
// does not depend on timing. Empty splits (m = -inf) weigh 0 and add nothing
// (their acc, zeros, may be read); a row whose splits are all empty gets
// zeros and LSE -inf.
#pragma once

#include <cstdint>

#include "backend/cuda/element.cuh"
#include "backend/cuda/launch.h"
#include "backend/cuda/state.cuh"

namespace fd {
namespace cuda {

constexpr int kMergeWarps = 4;
constexpr int kMergeThreads = 32 * kMergeWarps;

template <class OutT>
__global__ void __launch_bounds__(kMergeThreads) merge_kernel(const MergeParams p) {
  __shared__ float split_weights[kMergeWarps][kMaxMergeSplits];
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kMergeWarps + warp;
  if (row >= p.rows) return;  // whole warps only; nothing below synchronises the CTA
  const int splits = p.num_splits;
  const float *m = p.m + row * splits;
  const float *l = p.l + row * splits;
  const float *acc = p.acc + row * splits * p.head_dim;
  float *weights = split_weights[warp];

  float m_max = negative_infinity();
  for (int s = lane; s < splits; s += 32) m_max = fmaxf(m_max, m[s]);
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) m_max = fmaxf(m_max, __shfl_xor_sync(0xffffffffu, m_max, offset));

  // Fixed lane-strided partial sums and a fixed butterfly: a fixed order.
  float l_sum = 0.0f;
  for (int s = lane; s < splits; s += 32) {
    const float w = m_max == negative_infinity() ? 0.0f : merge_weight(m[s], m_max);
    weights[s] = w;
    l_sum = fmaf(w, l[s], l_sum);
  }
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) l_sum += __shfl_xor_sync(0xffffffffu, l_sum, offset);
  __syncwarp();

  const int64_t b = row / p.q_heads;
  const int64_t head = row % p.q_heads;
  OutT *out = static_cast<OutT *>(p.out) + b * p.out_batch_stride + head * p.out_head_stride;
  const float inv_l = l_sum > 0.0f ? 1.0f / l_sum : 0.0f;  // all splits empty: zeros
  for (int d = lane * 4; d < p.head_dim; d += 32 * 4) {
    float4 sum = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    // Eight splits' loads in flight at a time (a long row of splits is
    // latency-bound otherwise); the sum still runs in split order. An empty
    // split's acc is zeros (the split kernels write it), and weighs 0.
    int s = 0;
    for (; s + 8 <= splits; s += 8) {
      float4 a[8];
#pragma unroll
      for (int j = 0; j < 8; ++j) a[j] = *reinterpret_cast<const float4 *>(acc + static_cast<int64_t>(s + j) * p.head_dim + d);
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const float w = weights[s + j];
        if (w == 0.0f) continue;
        sum.x = fmaf(w, a[j].x, sum.x);
        sum.y = fmaf(w, a[j].y, sum.y);
        sum.z = fmaf(w, a[j].z, sum.z);
        sum.w = fmaf(w, a[j].w, sum.w);
      }
    }
    for (; s < splits; ++s) {
      const float w = weights[s];
      if (w == 0.0f) continue;
      const float4 a = *reinterpret_cast<const float4 *>(acc + static_cast<int64_t>(s) * p.head_dim + d);
      sum.x = fmaf(w, a.x, sum.x);
      sum.y = fmaf(w, a.y, sum.y);
      sum.z = fmaf(w, a.z, sum.z);
      sum.w = fmaf(w, a.w, sum.w);
    }
    out[d + 0] = Element<OutT>::from_float(sum.x * inv_l);
    out[d + 1] = Element<OutT>::from_float(sum.y * inv_l);
    out[d + 2] = Element<OutT>::from_float(sum.z * inv_l);
    out[d + 3] = Element<OutT>::from_float(sum.w * inv_l);
  }
  if (p.lse != nullptr && lane == 0) {
    p.lse[b * p.lse_batch_stride + head * p.lse_head_stride] = natural_lse(m_max, l_sum);
  }
}

}  // namespace cuda
}  // namespace fd
