// SPDX-License-Identifier: Apache-2.0
// The kernels' parameter structs: what the backend (cuda_backend.cu) fills
// from a Problem and a Plan and the kernels read. Plain data, no CUDA types,
// so host code of any compiler can fill them.
#pragma once

#include <cstddef>
#include <cstdint>

#include "flashdecode.h"

namespace fd {
namespace cuda {

// Where final results go: out [batch, q_len, q_heads, head_dim] and the
// optional natural-log LSE [batch, q_len, q_heads]. Every kernel that writes
// results writes them through prims/softmax.cuh's write_output, the one
// epilogue, which also adds the attention sinks (they join only the final
// softmax denominator).
struct OutputParams {
  void *out = nullptr;
  int64_t out_batch_stride = 0, out_token_stride = 0, out_head_stride = 0;
  float *lse = nullptr;  // null: no LSE
  int64_t lse_batch_stride = 0, lse_token_stride = 0, lse_head_stride = 0;
  const float *sinks = nullptr;  // [q_heads] natural-log sink logits; null: none
  int64_t sinks_stride = 0;
};

// Phase 1, per (sequence, KV head, split, chunk of the KV head's query
// rows): the online softmax of the chunk's rows over the split's tokens. The
// rows of a KV head are its q_len tokens x GQA group of query heads,
// token-major (prims/query_rows.cuh). With one split it writes out/lse
// directly; otherwise the partial state (base-2 m, l, unnormalised acc) in
// the workspace layout of core/plan.h.
struct SplitParams {
  // q: [batch, q_len, q_heads, head_dim].
  const void *q = nullptr;
  int64_t q_batch_stride = 0, q_token_stride = 0, q_head_stride = 0;
  // k, v: dense [batch, token, kv_head] strides, or paged [page, slot, kv_head].
  const void *k = nullptr;
  const void *v = nullptr;
  int64_t k_strides[3] = {0, 0, 0};
  int64_t v_strides[3] = {0, 0, 0};
  bool kv_aligned = false;  // every K/V row starts on 16 bytes: cp.async path; else plain loads
  // 8-bit caches (the kernels built with kQuantized read these): the format
  // (FD_DTYPE_E4M3, FD_DTYPE_E5M2 or FD_DTYPE_I8) and each cache's scales,
  // by [batch or page, token or slot, kv_head] strides (null: 1). A scale
  // that does not vary along a sequence's tokens (no token stride, and no
  // page stride for a paged cache) is read once per sequence and KV head;
  // otherwise every token's scale is copied with its row (*_per_token).
  int32_t kv_format = 0;
  const float *k_scale = nullptr;
  const float *v_scale = nullptr;
  int64_t k_scale_strides[3] = {0, 0, 0};
  int64_t v_scale_strides[3] = {0, 0, 0};
  bool k_scale_per_token = false;
  bool v_scale_per_token = false;

  const int32_t *seq_lens = nullptr;  // null: every sequence is kv_capacity long
  int64_t seq_lens_stride = 0;
  const int32_t *block_table = nullptr;  // null: dense cache
  int64_t block_table_strides[2] = {0, 0};
  int32_t page_size = 1;
  int32_t page_shift = -1;  // log2(page_size) when it is a power of two, else -1
  int32_t last_page = 0;    // paged: the pool's last page; entries are clamped to [0, last_page]

  int64_t batch = 0;
  int32_t kv_capacity = 0;
  int32_t head_dim = 0;
  int32_t q_heads = 0;
  int32_t kv_heads = 0;
  int32_t group_size = 0;  // q_heads / kv_heads
  int32_t q_len = 1;       // query tokens per sequence (with q_lens: the most)
  int32_t kv_rows = 0;     // query rows per KV head: q_len * group_size
  // Ragged query lengths: sequence b's tokens, clamped to [0, q_len]
  // (query_rows.cuh, sequence_q_len); the kernels run with variant_scores.
  const int32_t *q_lens = nullptr;  // null: q_len for every sequence
  int64_t q_lens_stride = 0;
  int32_t head_chunks = 1;      // a KV head's rows are processed in this many chunks (CTAs)
  int32_t heads_per_chunk = 1;  // real rows per chunk (the last one may have fewer)
  int32_t heads_per_cta = 1;    // row slots per CTA: heads_per_chunk rounded up to a power of two
  float q_scale = 0.0f;         // softmax_scale * log2(e), folded into q

  // Attention variants (flashdecode.h, "Attention variants"): with
  // variant_scores the kernels built with kVariants run and read them
  // (policy.cpp, needs_variant_scores); sinks are in OutputParams.
  bool variant_scores = false;
  bool causal = true;
  int32_t window = 0;                   // window_left; 0: none
  float softcap = 0.0f;                 // logit_softcap * log2(e) (base-2 scores); 0: none
  const float *alibi_slopes = nullptr;  // [q_heads] natural-log slopes; null: none
  int64_t alibi_stride = 0;

  int32_t num_splits = 1;
  int64_t split_tokens = 0;
  // > 0: the fixed schedule fits the split length to the real lengths (read
  // at the start of every CTA) instead of the capacity (prims/schedule.cuh,
  // start_fixed_walk): whole tiles, at least this many tokens, long enough
  // that num_splits cover the longest sequence and that the batch's keys
  // make at most a target count of pieces: fitted_tokens_per_total
  // is (units a sequence) / (that count) (policy.cpp, choose_launch).
  // 0: split_tokens.
  int32_t fitted_split_floor = 0;
  float fitted_tokens_per_total = 0.0f;
  // Fitted (with the merge kernel to follow): the splits past the longest
  // span's last are skipped, and CTA (0, 0) stores how many are in use here
  // (the workspace's header, kUsedSplitsOffset) for the merge kernel, which
  // merges only those. Null otherwise: every split writes its state.
  int32_t *used_splits = nullptr;
  // > 0 (fitted): the grid is this many CTAs, one wave; the cut makes at
  // most this many pieces with keys, and CTA g attends piece g of them, the
  // empty states of the splits in use being shared out after them
  // (prims/schedule.cuh, next_fitted_pieces). 0: a CTA a (unit, split).
  int32_t fitted_ctas = 0;
  // The fixed schedule's grid (not fitted, not clustered): the sequences
  // in the order its rows take them, longest first (batch entries in the
  // workspace, written by the order kernel ahead of the split kernel:
  // kernels/sequence_order.cuh). Null: in index order.
  int32_t *sequence_order = nullptr;
  // > 0: the balanced schedule (prims/schedule.cuh): the grid is this many
  // workers, each taking an equal run of the batch's units laid end to end,
  // a unit costing its tiles plus piece_overhead_tiles; partial states live
  // in 2 slots of heads_per_chunk rows per worker, and cut units merge in
  // the split kernel (merge_counters). num_splits and split_tokens are unused.
  int32_t balanced_workers = 0;
  // Workers take runs in groups of this many, member j attending unit j of
  // each set of this many neighbouring units of a sequence; divides both
  // balanced_workers (which may leave a few resident slots idle for it) and
  // kv_heads * head_chunks.
  int32_t balanced_group = 1;
  int32_t piece_overhead_tiles = 1;

  // Partial results (num_splits > 1).
  float *m = nullptr;
  float *l = nullptr;
  float *acc = nullptr;

  // Not null: the merge is fused into this kernel (kernels/fused_merge.cuh):
  // one counter per (sequence, KV head, chunk), zero before the launch and
  // zero again after it; the last CTA of a unit to finish merges the unit's
  // query rows. Null with num_splits > 1: the merge kernel follows.
  unsigned *merge_counters = nullptr;

  // num_splits == 1: the split kernel writes out and lse itself.
  bool write_output = false;
  // num_splits > 1: the splits of a (sequence, KV head, chunk) are one
  // thread-block cluster (sm_90+, tensor-core kernel, num_splits <=
  // kMaxClusterSplits) and merge through distributed shared memory
  // (kernels/cluster_merge.cuh); m, l, acc and merge_counters are unused.
  bool cluster_merge = false;
  bool out_f32 = false;  // out is float; else the storage type of q
  OutputParams output;
};

// Phase 2, per query row: the partial states of all splits merged in split
// order into out and lse.
struct MergeParams {
  const float *m = nullptr;
  const float *l = nullptr;
  const float *acc = nullptr;
  int64_t rows = 0;  // batch * q_len * q_heads, numbered as the workspace (core/plan.h)
  int32_t num_splits = 1;
  int32_t head_dim = 0;
  int32_t q_heads = 0;
  int32_t group_size = 1;
  int32_t kv_rows = 1;  // q_len * group_size
  // Set at launch (kernels/merge_kernel.cuh, merge_layout): split groups and
  // float4 columns a CTA, CTAs a row.
  int32_t groups = 1;
  int32_t columns = 1;
  int32_t column_slices = 1;
  // Batch invariant: the merge sums in the order that does not change with
  // trailing empty splits (merge_groups over whole rows).
  bool invariant_order = false;
  // Not null: each row's first *used_splits splits hold its keys, the
  // others were skipped (SplitParams::used_splits); null: all num_splits.
  const int32_t *used_splits = nullptr;
  OutputParams output;
};

// FD_CHECK_CONTENTS: the first bad q_lens, seq_lens or block_table entry that the
// check kernel (kernels/check_contents.cuh) found, in host memory mapped
// into the device, so that the host reads it without synchronising. The
// kernel writes the fields, then `found` (after a system-wide fence); the
// host reads `found` first and clears it after reporting.
struct ContentReport {
  int32_t found;  // 0: nothing; kFoundLength, kFoundPage or kFoundQueryLength
  int32_t unused;
  int64_t sequence;  // b
  int64_t column;    // block-table column (kFoundPage)
  int64_t value;     // the bad length or entry
  int64_t bound;     // kv_capacity, num_pages or q_len
};
constexpr int32_t kFoundLength = 1;
constexpr int32_t kFoundPage = 2;
constexpr int32_t kFoundQueryLength = 3;

// What the check kernel reads: the lengths and used block-table entries of
// every sequence, and where it reports.
struct CheckParams {
  const int32_t *seq_lens = nullptr;  // null: every sequence is kv_capacity long
  int64_t seq_lens_stride = 0;
  const int32_t *q_lens = nullptr;  // null: every sequence has q_len query tokens
  int64_t q_lens_stride = 0;
  int64_t q_len = 1;
  const int32_t *block_table = nullptr;  // null: dense cache, nothing else to check
  int64_t block_table_strides[2] = {0, 0};
  int64_t batch = 0;
  int64_t kv_capacity = 0;
  int64_t page_size = 1;
  int64_t num_pages = 0;
  int64_t max_pages = 0;
  ContentReport *report = nullptr;  // device address of the mapped report
};

// fd_merge_states: one row is (b, t, h) of [batch, q_len, heads]; each
// state's output and LSE by their own strides and dtype. Passed by value
// (about 4.7 KiB for FD_MAX_MERGE_STATES states: CUDA 12.1+ kernels take up
// to 32 KiB of parameters).
struct MergeStateView {
  const void *out = nullptr;
  const float *lse = nullptr;
  int64_t out_strides[3] = {0, 0, 0};  // batch, q_len, heads (head_dim is contiguous)
  int64_t lse_strides[3] = {0, 0, 0};
  int32_t dtype = 0;  // fd_dtype of out
};

// kStates: the capacity of `states`; the backend fills the full-size
// struct and the dispatch launches with the smallest that holds num_states
// (fewer parameter bytes per launch: MergeStatesParamsFor).
template <int kStates>
struct MergeStatesParamsFor {
  int32_t num_states = 0;
  int32_t head_dim = 0;
  int64_t q_len = 1, heads = 1, rows = 0;
  void *out = nullptr;
  int64_t out_strides[3] = {0, 0, 0};
  float *lse = nullptr;  // null: not written
  int64_t lse_strides[3] = {0, 0, 0};
  MergeStateView states[kStates];
};
using MergeStatesParams = MergeStatesParamsFor<FD_MAX_MERGE_STATES>;

// fd_append_kv: new rows (b, i, h) of k_new/v_new [batch, new_len,
// kv_heads, head_dim] go to position len_b - new_len + i of the cache
// (kernels/append_kv.cuh). Dtypes are fd_dtype values.
struct AppendParams {
  const void *k_new = nullptr;
  const void *v_new = nullptr;
  int32_t new_dtype = 0;                 // of k_new and v_new
  int64_t k_new_strides[3] = {0, 0, 0};  // batch, new token, kv_head (head_dim is contiguous)
  int64_t v_new_strides[3] = {0, 0, 0};
  void *k = nullptr;
  void *v = nullptr;
  int32_t cache_dtype = 0;
  int64_t k_strides[3] = {0, 0, 0};  // dense [batch, token, kv_head] or paged [page, slot, kv_head]
  int64_t v_strides[3] = {0, 0, 0};
  const float *k_scale = nullptr;  // null: 1
  const float *v_scale = nullptr;
  int64_t k_scale_strides[3] = {0, 0, 0};
  int64_t v_scale_strides[3] = {0, 0, 0};
  const int32_t *seq_lens = nullptr;  // null: every sequence is kv_capacity long
  int64_t seq_lens_stride = 0;
  const int32_t *block_table = nullptr;  // null: dense cache
  int64_t block_table_strides[2] = {0, 0};
  int64_t page_size = 1;
  int64_t num_pages = 0;
  int64_t batch = 0;
  int64_t new_len = 0;
  int64_t kv_capacity = 0;
  int32_t kv_heads = 0;
  int32_t head_dim = 0;
  // head_dim a multiple of 8, new rows on 16 bytes and cache rows on 8:
  // 8 elements move with one load and one store (kernels/append_kv.cuh).
  bool vector = false;
};

constexpr int kAppendVectorElements = 8;  // AppendParams::vector moves this many elements at once

constexpr int kMinHeadDim = 16;
constexpr int kMaxHeadDim = 256;
constexpr int kHeadDimMultiple = 8;
constexpr int kMaxMergeSplits = FD_MAX_SPLITS;
// The largest cluster the cluster merge uses (the portable cluster size).
constexpr int kMaxClusterSplits = 8;

// Query-head slots of one CTA of the tensor-core split kernel: the MMA's M.
constexpr int kMmaHeads = 16;

// The fused merge's counters, at the start of every CUDA workspace (the
// header of core/plan.h): problems with more (sequence, KV head, chunk)
// units than this use another merge.
constexpr int kMergeCounterSlots = 16384;
constexpr size_t kMergeCounterBytes = kMergeCounterSlots * sizeof(unsigned);
// After them, the word where a split kernel fitted to the lengths publishes
// how many splits it used (SplitParams::used_splits), padded to 128 bytes:
// the whole header.
constexpr size_t kUsedSplitsOffset = kMergeCounterBytes;
constexpr size_t kWorkspaceHeaderBytes = kMergeCounterBytes + 128;

// The most sequences the order kernel sorts (SplitParams::sequence_order):
// it keeps each one's class in a byte of shared memory.
constexpr int64_t kMaxOrderedSequences = 4096;

// Callable from host and device code; plain inline for the host compiler.
#ifdef __CUDACC__
#define FD_HOST_DEVICE __host__ __device__
#else
#define FD_HOST_DEVICE
#endif

// Shared memory of the fused merge of `states` (rows x splits) partial
// states: acc [states][head_dim], m and l [states], then one
// FusedMergePartial (32 bytes) per thread, 16-byte aligned.
FD_HOST_DEVICE inline int64_t fused_merge_partials_offset(int64_t states, int64_t head_dim) {
  return (states * (head_dim + 2) * 4 + 15) / 16 * 16;
}
FD_HOST_DEVICE inline int64_t fused_merge_smem_bytes(int64_t states, int64_t head_dim, int threads) {
  return fused_merge_partials_offset(states, head_dim) + threads * 32;
}

}  // namespace cuda
}  // namespace fd
