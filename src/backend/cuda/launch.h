// The boundary between the CUDA backend's host code (cuda_backend.cu, no
// templates) and its kernels (dispatch.cu and the *.cuh headers): plain
// parameter structs, the shape facts the planner needs, and one launch call.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "flashdecode.h"

namespace fd {
namespace cuda {

// Phase 1, per (sequence, KV head, split, chunk of the GQA group): the
// online softmax of the chunk's query heads over the split's tokens. With one
// split it writes out/lse directly; otherwise the partial state (base-2 m, l,
// unnormalised acc) in the workspace layout of core/plan.h.
struct SplitParams {
  // q: [batch, q_heads, head_dim] (q_len is 1).
  const void *q = nullptr;
  int64_t q_batch_stride = 0, q_head_stride = 0;
  // k, v: dense [batch, token, kv_head] strides, or paged [page, slot, kv_head].
  const void *k = nullptr;
  const void *v = nullptr;
  int64_t k_strides[3] = {0, 0, 0};
  int64_t v_strides[3] = {0, 0, 0};
  bool kv_aligned = false;  // every K/V row starts on 16 bytes: cp.async path; else plain loads

  const int32_t *seq_lens = nullptr;  // null: every sequence is kv_capacity long
  int64_t seq_lens_stride = 0;
  const int32_t *block_table = nullptr;  // null: dense cache
  int64_t block_table_strides[2] = {0, 0};
  int32_t page_size = 1;
  int32_t page_shift = -1;  // log2(page_size) when it is a power of two, else -1

  int64_t batch = 0;
  int32_t kv_capacity = 0;
  int32_t head_dim = 0;
  int32_t q_heads = 0;
  int32_t kv_heads = 0;
  int32_t group_size = 0;       // q_heads / kv_heads
  int32_t head_chunks = 1;      // a group is processed in this many chunks (CTAs)
  int32_t heads_per_chunk = 1;  // real query heads per chunk (the last one may have fewer)
  int32_t heads_per_cta = 1;    // head slots per CTA: heads_per_chunk rounded up to a power of two
  float q_scale = 0.0f;         // softmax_scale * log2(e), folded into q

  int32_t num_splits = 1;
  int64_t split_tokens = 0;

  // Partial results (num_splits > 1).
  float *m = nullptr;
  float *l = nullptr;
  float *acc = nullptr;

  // Not null: the merge is fused into this kernel (merge_kernel.cuh,
  // merge_unit_in_cta): one counter per (sequence, KV head, chunk), zero
  // before the launch and zero again after it; the last CTA of a unit to
  // finish merges the unit's query rows. Null with num_splits > 1: the merge
  // kernel follows.
  unsigned *merge_counters = nullptr;

  // Final results (num_splits == 1): out [batch, q_heads, head_dim] in the
  // storage type of q, or float when out_f32; lse optional.
  bool write_output = false;
  // With num_splits > 1: the splits of a (sequence, KV head, chunk) are one
  // thread-block cluster (sm_90+, tensor-core kernel, num_splits <=
  // kMaxClusterSplits) and merge through distributed shared memory
  // (merge_kernel.cuh, merge_in_cluster); m, l, acc and merge_counters are
  // unused. Here, in the padding before out: the struct keeps its size and
  // the other kernels their parameter offsets.
  bool cluster_merge = false;
  void *out = nullptr;
  int64_t out_batch_stride = 0, out_head_stride = 0;
  bool out_f32 = false;
  float *lse = nullptr;
  int64_t lse_batch_stride = 0, lse_head_stride = 0;
};

// Phase 2, per query row: the partial states of all splits merged in split
// order into out and lse.
struct MergeParams {
  const float *m = nullptr;
  const float *l = nullptr;
  const float *acc = nullptr;
  int64_t rows = 0;  // batch * q_heads
  int32_t num_splits = 1;
  int32_t head_dim = 0;
  int32_t q_heads = 0;
  int32_t groups = 1;  // set by launch_decode: split groups per row (merge_kernel.cuh)
  void *out = nullptr;
  int64_t out_batch_stride = 0, out_head_stride = 0;
  float *lse = nullptr;
  int64_t lse_batch_stride = 0, lse_head_stride = 0;
};

// What the host needs to know about the split kernel chosen for a problem.
struct SplitKernelShape {
  int head_dim_bucket = 0;  // 64, 128 or 256: head_dim rounded up
  int threads = 0;
  int rows = 0;             // thread rows of head_dim_bucket / 8 lanes; each is one (head, token group)
  int tile_tokens = 0;      // tokens per pipeline stage
  int stages = 0;           // tiles in flight
  int smem_bytes = 0;
};

constexpr int kMinHeadDim = 16;
constexpr int kMaxHeadDim = 256;
constexpr int kHeadDimMultiple = 8;
constexpr int kMaxMergeSplits = FD_MAX_SPLITS;
// The largest cluster the cluster merge uses (the portable cluster size).
constexpr int kMaxClusterSplits = 8;

// Query-head slots of one CTA of the tensor-core split kernel (mma_kernel.cuh).
constexpr int kMmaHeads = 16;

// The fused merge's counters, at the start of every CUDA workspace (the
// header of core/plan.h): problems with more (sequence, KV head, chunk)
// units than this use the merge kernel.
constexpr int kMergeCounterSlots = 16384;
constexpr size_t kMergeCounterBytes = kMergeCounterSlots * sizeof(unsigned);

// Shared memory of the fused merge of `states` (rows x splits) partial
// states: acc [states][head_dim], m and l [states], then one
// FusedMergePartial (32 bytes) per thread, 16-byte aligned.
#ifdef __CUDACC__
__host__ __device__
#endif
inline int64_t fused_merge_partials_offset(int64_t states, int64_t head_dim) {
  return (states * (head_dim + 2) * 4 + 15) / 16 * 16;
}
#ifdef __CUDACC__
__host__ __device__
#endif
inline int64_t fused_merge_smem_bytes(int64_t states, int64_t head_dim, int threads) {
  return fused_merge_partials_offset(states, head_dim) + threads * 32;
}

// head_dim must be supported (see kMinHeadDim..kMaxHeadDim).
SplitKernelShape split_kernel_shape(fd_dtype dtype, int64_t head_dim);
// The same for the tensor-core split kernel (16-bit K/V; rows is kMmaHeads)
// with standard or wide tiles (mma_kernel.cuh).
SplitKernelShape mma_kernel_shape(int64_t head_dim, bool wide);

// Which split kernel runs a problem (cuda_backend.cu decides).
struct SplitKernelChoice {
  bool mma = false;   // tensor cores (f16/bf16 K/V, 16-byte aligned rows); else CUDA cores
  bool wide = false;  // tensor cores with wide tiles
};

// CTAs of each split kernel one multiprocessor holds on the current device:
// CUDA-core [dtype][bucket index 0..2], tensor-core [dtype - 1 (f16, bf16)]
// [bucket index], and wide tensor-core tiles likewise (0: not available).
// mma_clusters / wide_clusters: clusters of n CTAs ([n], 2..kMaxClusterSplits)
// the device holds at once (0: no cluster launch, e.g. before sm_90).
struct KernelOccupancy {
  int cuda_core[3][3] = {};
  int mma[2][3] = {};
  int wide[2][3] = {};
  int mma_clusters[2][3][kMaxClusterSplits + 1] = {};
  int wide_clusters[2][3][kMaxClusterSplits + 1] = {};
};

// On the current device: loads every kernel, raises the shared-memory limit
// of every split kernel and reports their occupancy.
cudaError_t prepare_kernels(KernelOccupancy *occupancy);
int bucket_index(int head_dim_bucket);

// Checks that this binary has code the current device can run.
cudaError_t probe_kernel_image();

// Whether the merge kernels loaded for the current device wait on their
// grid dependency (griddepcontrol: compiled for sm_90 or later), so that they
// may be launched with programmatic stream serialization.
cudaError_t merge_supports_programmatic_launch(bool *supported);

// Enqueues the split kernel `kernel` (the caller decides, see
// choose_split_kernel in cuda_backend.cu) and, when merge is not null, the
// merge kernel; with programmatic set (see
// merge_supports_programmatic_launch), each may be scheduled while the
// kernel before it on the stream finishes (it waits for it before touching
// memory). Returns the first launch error.
cudaError_t launch_decode(fd_dtype dtype, fd_dtype out_dtype, const SplitParams &split, const MergeParams *merge,
                          SplitKernelChoice kernel, bool programmatic, cudaStream_t stream);

}  // namespace cuda
}  // namespace fd
