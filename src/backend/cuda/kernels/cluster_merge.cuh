// SPDX-License-Identifier: Apache-2.0
// The cluster merge (FD_MERGE_CLUSTER, sm_90+). Included by the tensor-core
// split kernel.
#pragma once

#include <cooperative_groups.h>

#include <cstdint>

#include "backend/cuda/params.h"
#include "backend/cuda/prims/element.cuh"
#include "backend/cuda/prims/query_rows.cuh"
#include "backend/cuda/prims/softmax.cuh"

namespace fd {
namespace cuda {

// The cluster merge (sm_90+, SplitParams::cluster_merge): the splits of a
// unit are one thread-block cluster, cluster rank = split. Each CTA leaves
// its merged state in its own shared memory, the cluster synchronises, and
// every CTA merges a share of the unit's (row, element) outputs, reading
// each split's state from that split's CTA (distributed shared memory) in
// split order. Nothing goes through the workspace: no fence, no counter, no
// L2 round trip between the last split and the output.

// A CTA's state for the cluster merge, `partial` in its shared memory:
// acc [kRows][kBucket], then m [kRows] and l [kRows].
template <int kRows, int kBucket>
struct ClusterPartial {
  static constexpr int kFloats = kRows * (kBucket + 2);
  __device__ static float &acc(float *partial, int row, int d) { return partial[row * kBucket + d]; }
  __device__ static float &m(float *partial, int row) { return partial[kRows * kBucket + row]; }
  __device__ static float &l(float *partial, int row) { return partial[kRows * kBucket + kRows + row]; }
};

// Merges the KV head's query rows [first_row, first_row + rows) of
// sequence b (prims/query_rows.cuh) from the states every CTA of the cluster left in `partial` (the same
// shared-memory offset in each). Every thread of the cluster calls it.
// Element i of the unit is merged by CTA i / kThreads % splits in a fixed
// order (split 0 first), so the result does not depend on timing.
template <class OutT, int kThreads, int kRows, int kBucket>
__device__ void merge_in_cluster(const SplitParams &p, int64_t b, int kv_head, int first_row, int rows,
                                 float *partial) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  using Partial = ClusterPartial<kRows, kBucket>;
  namespace cg = cooperative_groups;
  cg::cluster_group cluster = cg::this_cluster();
  cluster.sync();  // every split's state is in its CTA's shared memory
  const int splits = p.num_splits;
  const int items = rows * p.head_dim;
  for (int i = static_cast<int>(cluster.block_rank()) * kThreads + threadIdx.x; i < items; i += splits * kThreads) {
    const int row = i / p.head_dim;
    const int d = i % p.head_dim;
    float *remote[kMaxClusterSplits] = {};
    float m_split[kMaxClusterSplits] = {};
    float m_max = negative_infinity();
#pragma unroll
    for (int s = 0; s < kMaxClusterSplits; ++s) {
      if (s < splits) {
        remote[s] = cluster.map_shared_rank(partial, s);
        m_split[s] = Partial::m(remote[s], row);
        m_max = max_nan(m_max, m_split[s]);
      }
    }
    float l_sum = 0.0f;
    float sum = 0.0f;
#pragma unroll
    for (int s = 0; s < kMaxClusterSplits; ++s) {
      if (s < splits) {
        const float w = merge_weight(m_split[s], m_max);  // 0 for an empty split (and when all are)
        l_sum = fmaf(w, Partial::l(remote[s], row), l_sum);
        sum = fmaf(w, Partial::acc(remote[s], row, d), sum);
      }
    }
    const QueryRow query = query_row(first_row + row, p.group_size, kv_head);
    const float merged[1] = {sum};
    write_output<OutT>(p.output, b, query.token, query.q_head, d, merged, m_max, l_sum, d == 0);
  }
  cluster.sync();  // no CTA leaves, or reuses its shared memory, while another reads it
#else
  // Never launched (prepare_clusters): code for sm_80 has no clusters.
  (void)p, (void)b, (void)kv_head, (void)first_row, (void)rows, (void)partial;
  __trap();
#endif
}

}  // namespace cuda
}  // namespace fd
