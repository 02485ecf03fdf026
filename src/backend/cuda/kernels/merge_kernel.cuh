// SPDX-License-Identifier: Apache-2.0
// The merge kernel (FD_MERGE_SEPARATE), phase 2 after a split kernel: one CTA per query row merges the row's per-split
// states into out and lse. The common max is the largest split max; every split is rescaled by exp2(m_split - m_max).
// The CTA's threads form `groups` x (head_dim / 4) float4 columns: group g sums splits g, g + groups, g + 2 groups, ...
// in increasing order, then the groups' sums are added in group order. groups depends only on num_splits and head_dim
// (merge_groups), so the result does not depend on timing. Nor does it depend on trailing empty splits, which
// batch-invariant plans add as the capacity grows (flashdecode.h, "Batch invariance"): groups is min(num_splits, G)
// with G set by head_dim, so a row's n non-empty splits fall into the same groups in the same order for any
// num_splits >= n (split s alone in group s while n <= G, in group s % G otherwise); empty splits weigh 0 and are
// skipped, and adding an empty group's +0 leaves a sum unchanged. Spreading the splits over groups keeps a long row of
// splits (128 in shape 2x8/1x262144) from being a chain of dependent loads. Empty splits (m = -inf) weigh 0 and add
// nothing (their acc, zeros, may be read); a row whose splits are all empty gets zeros and LSE -inf.
#pragma once

#include <cstdint>

#include "backend/cuda/params.h"
#include "backend/cuda/prims/element.cuh"
#include "backend/cuda/prims/grid_dependency.cuh"
#include "backend/cuda/prims/query_rows.cuh"
#include "backend/cuda/prims/softmax.cuh"
#include "backend/cuda/prims/timeline.cuh"

namespace fd {
namespace cuda {

constexpr int kMergeMaxThreads = 256;
constexpr int kMergeMaxGroups = 16;
constexpr int kMergeBatch = 8;  // one thread's acc loads in flight at a time

// Split groups of a row: as many as the splits and kMergeMaxThreads threads
// of head_dim / 4 columns allow, at most kMergeMaxGroups.
inline int merge_groups(int num_splits, int head_dim) {
  const int vectors = head_dim / 4;
  int groups = kMergeMaxThreads / vectors;
  if (groups > kMergeMaxGroups) groups = kMergeMaxGroups;
  if (groups > num_splits) groups = num_splits;
  return groups < 1 ? 1 : groups;
}

inline int merge_threads(int num_splits, int head_dim) {
  const int used = merge_groups(num_splits, head_dim) * (head_dim / 4);
  return (used + 31) / 32 * 32;
}

template <class OutT>
__global__ void __launch_bounds__(kMergeMaxThreads) merge_kernel(const MergeParams p) {
  __shared__ float weights[kMaxMergeSplits];
  __shared__ float weighted_l[kMaxMergeSplits];
  __shared__ float4 group_sums[kMergeMaxThreads];
  __shared__ float warp_max[kMergeMaxThreads / 32];
  __shared__ float row_l;

  FD_TIMELINE_BEGIN(timeline);
  grid_dependency_wait();  // the split kernel's partial states are complete and visible
  FD_TIMELINE_MARK(timeline, 1);

  const int splits = p.num_splits;
  // The splits in use: those a split kernel fitted to the lengths ran (the
  // later ones are empty and were not written: read as empty), else all.
  // Only the loads test it; the loops keep the launch's uniform bound.
  const int used = p.used_splits != nullptr ? __ldcg(p.used_splits) : splits;
  const int vectors = p.head_dim / 4;
  const int groups = p.groups;
  const int group = threadIdx.x / vectors;
  const int column = threadIdx.x % vectors;
  const bool active = group < groups;
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int warps = blockDim.x / 32;
  const int stride = kMergeBatch * groups;  // splits one thread's batch of loads covers

  for (int64_t row = blockIdx.x; row < p.rows; row += gridDim.x) {
    const float *m = p.m + row * splits;
    const float *l = p.l + row * splits;
    const float *acc = p.acc + row * splits * p.head_dim + column * 4;

    // This thread's first batch of acc loads goes out before the weights are
    // known: it is independent of them. L2 reads (.cg): the partials were
    // written by another grid.
    float4 a[kMergeBatch];
#pragma unroll
    for (int j = 0; j < kMergeBatch; ++j) {
      const int s = group + j * groups;
      a[j] = active && s < used ? __ldcg(reinterpret_cast<const float4 *>(acc + static_cast<int64_t>(s) * p.head_dim))
                                : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }

    // The common max (order does not matter for a max). Each split's m and l
    // are read from L2 once, into the shared arrays that then take their
    // weights: the same thread handles split s in both loops below, so no
    // barrier sits between them, and no second L2 round trip either.
    float m_max = negative_infinity();
    for (int s = threadIdx.x; s < splits; s += blockDim.x) {
      const float m_split = s < used ? __ldcg(m + s) : negative_infinity();
      weights[s] = m_split;
      weighted_l[s] = s < used ? __ldcg(l + s) : 0.0f;
      m_max = max_nan(m_max, m_split);
    }
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) m_max = max_nan(m_max, __shfl_xor_sync(0xffffffffu, m_max, offset));
    if (lane == 0) warp_max[warp] = m_max;
    __syncthreads();
    m_max = warp_max[0];
    for (int w = 1; w < warps; ++w) m_max = max_nan(m_max, warp_max[w]);

    for (int s = threadIdx.x; s < splits; s += blockDim.x) {
      const float w = m_max == negative_infinity() ? 0.0f : merge_weight(weights[s], m_max);
      weights[s] = w;
      weighted_l[s] = w * weighted_l[s];
    }
    __syncthreads();

    // l: fixed lane-strided partial sums and a fixed butterfly in warp 0.
    if (warp == 0) {
      float l_sum = 0.0f;
      for (int s = lane; s < splits; s += 32) l_sum += weighted_l[s];
#pragma unroll
      for (int offset = 16; offset > 0; offset /= 2) l_sum += __shfl_xor_sync(0xffffffffu, l_sum, offset);
      if (lane == 0) row_l = l_sum;
    }

    float4 sum = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (active) {
#pragma unroll
      for (int j = 0; j < kMergeBatch; ++j) {
        const int s = group + j * groups;
        if (s < splits) {
          const float w = weights[s];
          if (w != 0.0f) add_weighted(sum, w, a[j]);
        }
      }
      for (int first = group + stride; first < splits; first += stride) {
#pragma unroll
        for (int j = 0; j < kMergeBatch; ++j) {
          const int s = first + j * groups;
          if (s < used) a[j] = __ldcg(reinterpret_cast<const float4 *>(acc + static_cast<int64_t>(s) * p.head_dim));
        }
#pragma unroll
        for (int j = 0; j < kMergeBatch; ++j) {
          const int s = first + j * groups;
          if (s < splits) {
            const float w = weights[s];
            if (w != 0.0f) add_weighted(sum, w, a[j]);
          }
        }
      }
      group_sums[threadIdx.x] = sum;
    }
    __syncthreads();

    if (threadIdx.x < vectors) {  // group 0's threads: the groups' sums in group order
      for (int g = 1; g < groups; ++g) {
        const float4 other = group_sums[g * vectors + column];
        sum.x += other.x;
        sum.y += other.y;
        sum.z += other.z;
        sum.w += other.w;
      }
      const float l_sum = row_l;
      const WorkspaceRow where = from_workspace_row(row, p.q_heads, p.group_size, p.kv_rows);
      const float merged[4] = {sum.x, sum.y, sum.z, sum.w};
      write_output<OutT>(p.output, where.b, where.row.token, where.row.q_head, column * 4, merged, m_max, l_sum,
                         threadIdx.x == 0);
    }
    __syncthreads();  // shared memory is reused by the next row
  }
  FD_TIMELINE_END(timeline, "merge", p.output.out);
}

}  // namespace cuda
}  // namespace fd
