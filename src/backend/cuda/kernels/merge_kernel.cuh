// SPDX-License-Identifier: Apache-2.0
// The merge kernel (FD_MERGE_SEPARATE), phase 2 after a split kernel: CTAs per query row merge the row's per-split
// states into out and lse. The common max is the largest split max; every split is rescaled by exp2(m_split - m_max).
// A CTA's threads form `groups` x `columns` float4 columns of the row (merge_layout: all head_dim / 4 of them, or a
// slice of them when a row takes several CTAs): group g sums splits g, g + groups, g + 2 groups, ... in increasing
// order, then the groups' sums are added in group order. The layout depends only on num_splits, head_dim and whether
// the plan is batch invariant, so the result does not depend on timing. For batch-invariant plans it does not depend
// on trailing empty splits either, which they add as the capacity grows (flashdecode.h, "Batch invariance"): groups
// is min(num_splits, G) with G set by head_dim, so a row's n non-empty splits fall into the same groups in the same
// order for any num_splits >= n (split s alone in group s while n <= G, in group s % G otherwise); empty splits weigh
// 0 and are skipped, and adding an empty group's +0 leaves a sum unchanged. Spreading the splits over groups keeps a
// long row of splits (128 in shape 2x8/1x262144) from being a chain of dependent loads; other plans take enough
// groups that a thread's splits are one batch of loads, slicing a row's columns over CTAs where those groups of whole
// rows would pass kMergeMaxThreads. Empty splits (m = -inf) weigh 0 and add nothing (their acc, zeros, may be read);
// a row whose splits are all empty gets zeros and LSE -inf.
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

// Plans that are not batch invariant: up to this many groups, one batch of
// loads a thread for rows of up to kMergeWideGroups * kMergeBatch splits.
constexpr int kMergeWideGroups = 64;

// How the merge's CTAs cover a row: `groups` split groups x `columns` float4
// columns a CTA, `slices` CTAs a row (the last slice may have fewer columns).
struct MergeLayout {
  int groups = 1;
  int columns = 1;
  int slices = 1;
  int threads() const { return (groups * columns + 31) / 32 * 32; }
};

// Batch-invariant plans keep merge_groups over whole rows (their order of
// sums must not change with the batch or capacity). Others take enough
// groups that each thread's splits are one batch of loads: a row of many
// splits (splits fitted to a few sequences' lengths: up to a wave's worth)
// is then one round trip to L2 instead of a chain of them, spread over a
// slice of its columns a CTA where the groups of a whole row pass
// kMergeMaxThreads.
inline MergeLayout merge_layout(int num_splits, int head_dim, bool invariant_order) {
  const int vectors = head_dim / 4;
  MergeLayout layout;
  layout.groups = merge_groups(num_splits, head_dim);
  layout.columns = vectors;
  if (invariant_order) return layout;
  int wanted = (num_splits + kMergeBatch - 1) / kMergeBatch;
  if (wanted > kMergeWideGroups) wanted = kMergeWideGroups;
  if (wanted <= layout.groups) return layout;
  layout.groups = wanted;
  while (layout.columns > 1 && layout.groups * layout.columns > kMergeMaxThreads)
    layout.columns = (layout.columns + 1) / 2;
  if (layout.groups * layout.columns > kMergeMaxThreads) layout.groups = kMergeMaxThreads / layout.columns;
  layout.slices = (vectors + layout.columns - 1) / layout.columns;
  return layout;
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
  if (p.used_splits != nullptr && used == 1) return;  // the split kernel wrote out and lse (piece_writes_output)
  const int vectors = p.head_dim / 4;
  const int groups = p.groups;
  const int columns = p.columns;
  const int slices = p.column_slices;
  const int group = threadIdx.x / columns;
  const int column = static_cast<int>(blockIdx.x % slices) * columns + static_cast<int>(threadIdx.x % columns);
  const bool active = group < groups && column < vectors;
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int warps = blockDim.x / 32;
  const int stride = kMergeBatch * groups;  // splits one thread's batch of loads covers

  for (int64_t row = blockIdx.x / slices; row < p.rows; row += gridDim.x / slices) {
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

    if (threadIdx.x < columns && column < vectors) {  // group 0's threads: the groups' sums in group order
#pragma unroll 4
      for (int g = 1; g < groups; ++g) {
        const float4 other = group_sums[g * columns + threadIdx.x];
        sum.x += other.x;
        sum.y += other.y;
        sum.z += other.z;
        sum.w += other.w;
      }
      const float l_sum = row_l;
      const WorkspaceRow where = from_workspace_row(row, p.q_heads, p.group_size, p.kv_rows);
      const float merged[4] = {sum.x, sum.y, sum.z, sum.w};
      write_output<OutT>(p.output, where.b, where.row.token, where.row.q_head, column * 4, merged, m_max, l_sum,
                         column == 0);
    }
    __syncthreads();  // shared memory is reused by the next row
  }
  FD_TIMELINE_END(timeline, "merge", p.output.out);
}

}  // namespace cuda
}  // namespace fd
