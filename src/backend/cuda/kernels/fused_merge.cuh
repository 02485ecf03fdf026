// SPDX-License-Identifier: Apache-2.0
// The fused merge (FD_MERGE_FUSED): the split kernel's last CTA of a unit
// merges the unit's splits. Included by both split kernels.
#pragma once

#include <cstdint>

#include "backend/cuda/kernels/merge_kernel.cuh"
#include "backend/cuda/params.h"
#include "backend/cuda/prims/element.cuh"
#include "backend/cuda/prims/softmax.cuh"
#include "backend/cuda/prims/load.cuh"
#include "backend/cuda/prims/query_rows.cuh"
#include "backend/cuda/prims/schedule.cuh"

namespace fd {
namespace cuda {

// The fused merge: the split kernel's last CTA of a unit (one sequence, KV
// head and chunk of its query rows: the rows that CTA writes) merges
// the unit's splits itself, so no second grid waits for the whole split grid
// to drain. A unit's partials are one contiguous block of the workspace
// (core/plan.h numbers rows by KV head); the CTA copies all of it into its
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

// Merges the splits of the KV head's query rows [first_row, first_row +
// rows) of sequence b into out and lse with the CTA's kThreads threads, using `smem`
// (fused_merge_smem_bytes of it). Each thread takes one (row, float4 column)
// and one of `groups` split groups: group g sums splits g, g + groups, ...
// in increasing order, then group 0 adds the groups' sums in group order.
// groups depends only on rows, head_dim and num_splits: the result does not
// depend on timing.
template <class OutT, int kThreads>
__device__ void merge_unit_in_cta(const SplitParams &p, int64_t b, int kv_head, int first_row, int rows,
                                  unsigned char *smem) {
  const int splits = p.num_splits;
  const int states = rows * splits;
  const int vectors = p.head_dim / 4;
  const int64_t first_state = workspace_row(p, b, kv_head, first_row) * splits;
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
      for (int s = 0; s < splits; ++s) m_max = max_nan(m_max, row_m[s]);
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
      const QueryRow query = query_row(first_row + row, p.group_size, kv_head);
      const float merged[4] = {sum.x, sum.y, sum.z, sum.w};
      write_output<OutT>(p.output, b, query.token, query.q_head, column * 4, merged, m_max, l_sum, column == 0);
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
  const int first_row = chunk * p.heads_per_chunk;  // within the KV head's rows
  const int rows = min(p.heads_per_chunk, p.kv_rows - first_row);
  if (kFloatOut && p.out_f32) {
    merge_unit_in_cta<float, kThreads>(p, b, kv_head, first_row, rows, smem);
  } else {
    merge_unit_in_cta<T, kThreads>(p, b, kv_head, first_row, rows, smem);
  }
  return true;
}

// Pieces whose partial states a thread of the balanced merge loads at once,
// at most (16 bytes of shared memory a piece and thread), for kernels of
// kThreads threads and kSmemBytes of shared memory.
template <int kThreads, int kSmemBytes>
constexpr int kMergeLoadBatch = kSmemBytes / (kThreads * 16) < 8 ? kSmemBytes / (kThreads * 16) : 8;

// The balanced schedule's merge (prims/schedule.cuh): the last of a cut
// unit's pieces to finish merges their partial states, read from the
// workspace slots through L2, in run order, one (row, float4 column) per
// thread. With kBatch > 1 a thread's loads of kBatch pieces are all in
// flight before it uses any (m and l in registers, acc through its own
// shared-memory slots): one L2 round trip a piece left the merging CTA
// finishing long after the others. Kernels near their register limit take
// kBatch 1, which keeps their main loops from spilling (mma_split_kernel).
// Every thread of the CTA calls it; returns whether this CTA merged.
template <class T, int kThreads, bool kFloatOut, int kBatch>
__device__ bool merge_pieces_if_last(const SplitParams &p, const Piece &piece) {
  static_assert(kBatch >= 1, "the balanced merge loads at least a piece at a time");
  if (piece.slot < 0) return false;
  const int64_t unit = (piece.b * p.kv_heads + piece.kv_head) * p.head_chunks + piece.chunk;
  if (!last_of_unit(p.merge_counters + unit, piece.pieces)) return false;
  const int first_row = piece.chunk * p.heads_per_chunk;  // within the KV head's rows
  const int rows = min(p.heads_per_chunk, p.kv_rows - first_row);
  const int vectors = p.head_dim / 4;
  for (int item = threadIdx.x; item < rows * vectors; item += kThreads) {
    const int row = item / vectors;
    const int column = item % vectors;
    // The row's partial state of piece i.
    const auto index_of = [&](int i) {
      return static_cast<int64_t>(balanced_slot(p, piece.first_worker, i)) * p.heads_per_chunk + row;
    };
    float m_max = negative_infinity();
    float l_sum = 0.0f;
    float4 sum = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if constexpr (kBatch == 1) {
      for (int i = 0; i < piece.pieces; ++i) m_max = max_nan(m_max, __ldcg(p.m + index_of(i)));
      for (int i = 0; i < piece.pieces; ++i) {
        const int64_t index = index_of(i);
        const float w = merge_weight(__ldcg(p.m + index), m_max);  // 0 for an empty piece (and when all are)
        l_sum = fmaf(w, __ldcg(p.l + index), l_sum);
        add_weighted(sum, w, __ldcg(reinterpret_cast<const float4 *>(p.acc + index * p.head_dim) + column));
      }
    } else {
      for (int first = 0; first < piece.pieces; first += kBatch) {
        float m_part[kBatch];
#pragma unroll
        for (int j = 0; j < kBatch; ++j) {
          m_part[j] = first + j < piece.pieces ? __ldcg(p.m + index_of(first + j)) : negative_infinity();
        }
#pragma unroll
        for (int j = 0; j < kBatch; ++j) m_max = max_nan(m_max, m_part[j]);
      }
      // Slot j of this thread: acc_slots[j * kThreads + threadIdx.x] (no
      // bank conflicts), at the dynamic shared memory's start: a constant
      // address, where a pointer kept from the kernel's start spilled.
      extern __shared__ __align__(16) unsigned char merge_smem[];
      float4 *const acc_slots = reinterpret_cast<float4 *>(merge_smem);
      for (int first = 0; first < piece.pieces; first += kBatch) {
        float m_part[kBatch], l_part[kBatch];
#pragma unroll
        for (int j = 0; j < kBatch; ++j) {
          const bool real = first + j < piece.pieces;
          const int64_t index = index_of(real ? first + j : 0);
          cp_async_chunk(acc_slots + j * kThreads + threadIdx.x,
                         reinterpret_cast<const float4 *>(p.acc + index * p.head_dim) + column, real);
          m_part[j] = real ? __ldcg(p.m + index) : negative_infinity();
          l_part[j] = real ? __ldcg(p.l + index) : 0.0f;
        }
        cp_async_commit();
        cp_async_wait<0>();
#pragma unroll
        for (int j = 0; j < kBatch; ++j) {
          if (first + j < piece.pieces) {
            const float w = merge_weight(m_part[j], m_max);  // 0 for an empty piece (and when all are)
            l_sum = fmaf(w, l_part[j], l_sum);
            add_weighted(sum, w, acc_slots[j * kThreads + threadIdx.x]);
          }
        }
      }
    }
    const QueryRow query = query_row(first_row + row, p.group_size, piece.kv_head);
    const float merged[4] = {sum.x, sum.y, sum.z, sum.w};
    if (kFloatOut && p.out_f32) {
      write_output<float>(p.output, piece.b, query.token, query.q_head, column * 4, merged, m_max, l_sum, column == 0);
    } else {
      write_output<T>(p.output, piece.b, query.token, query.q_head, column * 4, merged, m_max, l_sum, column == 0);
    }
  }
  return true;
}

}  // namespace cuda
}  // namespace fd
