// Phase 2: one CTA per query row merges the row's per-split states into out
// and lse. The common max is the largest split max; every split is rescaled
// by exp2(m_split - m_max). The CTA's threads form `groups` x (head_dim / 4)
// float4 columns: group g sums splits g, g + groups, g + 2 groups, ... in
// increasing order, then the groups' sums are added in group order. groups
// depends only on num_splits and head_dim (merge_groups), so the result does
// not depend on timing. Spreading the splits over groups keeps a long row of
// splits (128 in shape 2x8/1x262144) from being a chain of dependent loads.
// Empty splits (m = -inf) weigh 0 and add nothing (their acc, zeros, may be
// read); a row whose splits are all empty gets zeros and LSE -inf.
#pragma once

#include <cooperative_groups.h>

#include <cstdint>

#include "backend/cuda/element.cuh"
#include "backend/cuda/launch.h"
#include "backend/cuda/load.cuh"
#include "backend/cuda/state.cuh"
#include "backend/cuda/timeline.cuh"

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

__device__ __forceinline__ void add_weighted(float4 &sum, float w, const float4 &a) {
  sum.x = fmaf(w, a.x, sum.x);
  sum.y = fmaf(w, a.y, sum.y);
  sum.z = fmaf(w, a.z, sum.z);
  sum.w = fmaf(w, a.w, sum.w);
}

// ---------------------------------------------------------------------------
// The fused merge: the split kernel's last CTA of a unit (one sequence, KV
// head and chunk of its GQA group: the query rows that CTA writes) merges
// the unit's splits itself, so no second grid waits for the whole split grid
// to drain. A unit's partials are one contiguous block of the workspace
// (rows are consecutive query heads); the CTA copies all of it into its
// shared memory at once with cp.async (one L2 round trip, no registers held)
// and merges from there. Used when the block fits (fused_merge_smem_bytes).

// One thread's share of a row during the fused merge: 4 columns.
struct FusedMergePartial {
  float4 acc;
  float l;
};

// Whether this CTA is the last of its unit to finish: every thread's partial
// writes are made visible device-wide, then one thread counts the CTA in.
// The last one resets the counter for the next launch (no other CTA of this
// launch touches it again) and reads the partials through L2 (cp.async.cg,
// ld.global.cg). All threads of the CTA must call this.
__device__ inline bool last_of_unit(unsigned *counter, int num_splits) {
  __threadfence();
  __syncthreads();
  bool last = false;
  if (threadIdx.x == 0) {
    last = atomicAdd(counter, 1u) + 1u == static_cast<unsigned>(num_splits);
    if (last) atomicExch(counter, 0u);
  }
  last = __syncthreads_or(last) != 0;  // thread 0's answer, to every thread (no shared variable)
  if (last) __threadfence();
  return last;
}

// Merges the splits of query heads [first_q_head, first_q_head + rows) of
// sequence b into out and lse with the CTA's kThreads threads, using `smem`
// (fused_merge_smem_bytes of it). Each thread takes one (row, float4 column)
// and one of `groups` split groups: group g sums splits g, g + groups, ...
// in increasing order, then group 0 adds the groups' sums in group order.
// groups depends only on rows, head_dim and num_splits: the result does not
// depend on timing.
template <class OutT, int kThreads>
__device__ void merge_unit_in_cta(const SplitParams &p, int64_t b, int first_q_head, int rows, unsigned char *smem) {
  const int splits = p.num_splits;
  const int states = rows * splits;
  const int vectors = p.head_dim / 4;
  const int64_t first_state = (b * p.q_heads + first_q_head) * splits;
  float4 *acc = reinterpret_cast<float4 *>(smem);  // [rows][splits][vectors]
  float *m = reinterpret_cast<float *>(acc + states * vectors);
  float *l = m + states;
  auto *partials = reinterpret_cast<FusedMergePartial *>(smem + fused_merge_partials_offset(states, p.head_dim));

  const float4 *acc_src = reinterpret_cast<const float4 *>(p.acc + first_state * p.head_dim);
  for (int i = threadIdx.x; i < states * vectors; i += kThreads) cp_async_chunk(acc + i, acc_src + i, true);
  cp_async_commit();
  for (int i = threadIdx.x; i < states; i += kThreads) {
    m[i] = __ldcg(p.m + first_state + i);
    l[i] = __ldcg(p.l + first_state + i);
  }
  cp_async_wait<0>();
  __syncthreads();

  const int items = rows * vectors;
  const int groups = max(1, min(kThreads / items, min(splits, kMergeMaxGroups)));
  const int per_pass = kThreads / groups;  // items merged at once (all of them when groups > 1)
  const int group = threadIdx.x / per_pass;
  for (int first = 0; first < items; first += per_pass) {
    const int item = first + threadIdx.x % per_pass;
    const bool active = group < groups && item < items;
    const int row = item / vectors;
    const int column = item % vectors;
    float m_max = negative_infinity();
    float l_sum = 0.0f;
    float4 sum = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (active) {
      const float *row_m = m + row * splits;
      for (int s = 0; s < splits; ++s) m_max = fmaxf(m_max, row_m[s]);
      for (int s = group; s < splits; s += groups) {
        const float w = merge_weight(row_m[s], m_max);  // 0 for an empty split (and when all are)
        l_sum = fmaf(w, l[row * splits + s], l_sum);
        add_weighted(sum, w, acc[(row * splits + s) * vectors + column]);
      }
    }
    if (groups > 1) {
      if (active) partials[threadIdx.x] = FusedMergePartial{sum, l_sum};
      __syncthreads();
      if (active && group == 0) {
        for (int g = 1; g < groups; ++g) {
          const FusedMergePartial other = partials[g * per_pass + threadIdx.x];
          l_sum += other.l;
          sum.x += other.acc.x;
          sum.y += other.acc.y;
          sum.z += other.acc.z;
          sum.w += other.acc.w;
        }
      }
    }
    if (active && group == 0) {
      const int q_head = first_q_head + row;
      const float inv_l = l_sum > 0.0f ? 1.0f / l_sum : 0.0f;  // all splits empty: zeros
      OutT *out = static_cast<OutT *>(p.out) + b * p.out_batch_stride + q_head * p.out_head_stride + column * 4;
      out[0] = Element<OutT>::from_float(sum.x * inv_l);
      out[1] = Element<OutT>::from_float(sum.y * inv_l);
      out[2] = Element<OutT>::from_float(sum.z * inv_l);
      out[3] = Element<OutT>::from_float(sum.w * inv_l);
      if (p.lse != nullptr && column == 0) {
        p.lse[b * p.lse_batch_stride + q_head * p.lse_head_stride] = natural_lse(m_max, l_sum);
      }
    }
    __syncthreads();  // partials are reused by the next pass
  }
}

// The end of a split CTA's sequence with a fused merge (merge_counters set):
// counts the CTA in to its unit (sequence b, KV head, chunk of the group)
// and, if it is the last, merges the unit's splits into out and lse. Every
// thread of the CTA calls it; returns whether this CTA merged. kFloatOut:
// whether the kernel may write float outputs (p.out_f32); else OutT = T.
template <class T, int kThreads, bool kFloatOut>
__device__ bool fused_merge_if_last(const SplitParams &p, int64_t b, int kv_head, int chunk, unsigned char *smem) {
  if (p.write_output || p.merge_counters == nullptr) return false;
  const int64_t unit = (b * p.kv_heads + kv_head) * p.head_chunks + chunk;
  if (!last_of_unit(p.merge_counters + unit, p.num_splits)) return false;
  const int first_head = chunk * p.heads_per_chunk;  // within the group
  const int rows = min(p.heads_per_chunk, p.group_size - first_head);
  const int first_q_head = kv_head * p.group_size + first_head;
  if (kFloatOut && p.out_f32) {
    merge_unit_in_cta<float, kThreads>(p, b, first_q_head, rows, smem);
  } else {
    merge_unit_in_cta<T, kThreads>(p, b, first_q_head, rows, smem);
  }
  return true;
}

// ---------------------------------------------------------------------------
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

// Merges query heads [first_q_head, first_q_head + rows) of sequence b
// from the states every CTA of the cluster left in `partial` (the same
// shared-memory offset in each). Every thread of the cluster calls it.
// Element i of the unit is merged by CTA i / kThreads % splits in a fixed
// order (split 0 first), so the result does not depend on timing.
template <class OutT, int kThreads, int kRows, int kBucket>
__device__ void merge_in_cluster(const SplitParams &p, int64_t b, int first_q_head, int rows, float *partial) {
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
        m_max = fmaxf(m_max, m_split[s]);
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
    const int q_head = first_q_head + row;
    const float inv_l = l_sum > 0.0f ? 1.0f / l_sum : 0.0f;  // all splits empty: zeros
    static_cast<OutT *>(p.out)[b * p.out_batch_stride + q_head * p.out_head_stride + d] =
        Element<OutT>::from_float(sum * inv_l);
    if (p.lse != nullptr && d == 0) {
      p.lse[b * p.lse_batch_stride + q_head * p.lse_head_stride] = natural_lse(m_max, l_sum);
    }
  }
  cluster.sync();  // no CTA leaves, or reuses its shared memory, while another reads it
#else
  // Never launched (prepare_clusters): code for sm_80 has no clusters.
  (void)p, (void)b, (void)first_q_head, (void)rows, (void)partial;
  __trap();
#endif
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
      a[j] = active && s < splits ? __ldcg(reinterpret_cast<const float4 *>(acc + static_cast<int64_t>(s) * p.head_dim))
                                  : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }

    // The common max (order does not matter for a max). Each split's m and l
    // are read from L2 once, into the shared arrays that then take their
    // weights: the same thread handles split s in both loops below, so no
    // barrier sits between them, and no second L2 round trip either.
    float m_max = negative_infinity();
    for (int s = threadIdx.x; s < splits; s += blockDim.x) {
      const float m_split = __ldcg(m + s);
      weights[s] = m_split;
      weighted_l[s] = __ldcg(l + s);
      m_max = fmaxf(m_max, m_split);
    }
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) m_max = fmaxf(m_max, __shfl_xor_sync(0xffffffffu, m_max, offset));
    if (lane == 0) warp_max[warp] = m_max;
    __syncthreads();
    m_max = warp_max[0];
    for (int w = 1; w < warps; ++w) m_max = fmaxf(m_max, warp_max[w]);

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
          if (s < splits) a[j] = __ldcg(reinterpret_cast<const float4 *>(acc + static_cast<int64_t>(s) * p.head_dim));
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
      const int64_t b = row / p.q_heads;
      const int64_t head = row % p.q_heads;
      OutT *out = static_cast<OutT *>(p.out) + b * p.out_batch_stride + head * p.out_head_stride + column * 4;
      const float inv_l = l_sum > 0.0f ? 1.0f / l_sum : 0.0f;  // all splits empty: zeros
      out[0] = Element<OutT>::from_float(sum.x * inv_l);
      out[1] = Element<OutT>::from_float(sum.y * inv_l);
      out[2] = Element<OutT>::from_float(sum.z * inv_l);
      out[3] = Element<OutT>::from_float(sum.w * inv_l);
      if (p.lse != nullptr && threadIdx.x == 0) {
        p.lse[b * p.lse_batch_stride + head * p.lse_head_stride] = natural_lse(m_max, l_sum);
      }
    }
    __syncthreads();  // shared memory is reused by the next row
  }
  FD_TIMELINE_END(timeline, "merge", p.out);
}

}  // namespace cuda
}  // namespace fd
