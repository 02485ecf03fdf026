// SPDX-License-Identifier: Apache-2.0
// A decode call after validation: every shape resolved, every pointer checked,
// in the form backends consume. Backends never see fd_decode_args.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/dtype.h"
#include "flashdecode.h"

namespace fd {

// A validated strided view. Dimension meaning depends on the role; the last
// dimension (head_dim) is contiguous for every 4-d tensor.
struct StridedView {
  void *data = nullptr;
  int64_t shape[FD_MAX_DIMS] = {0, 0, 0, 0};
  int64_t strides[FD_MAX_DIMS] = {0, 0, 0, 0};
};

struct Problem {
  // Per tensor role. k and v share q's dtype or one 8-bit dtype (then
  // kv_quantized), and out is q's dtype or f32 (validate_decode_args);
  // backends check what they take.
  fd_dtype q_dtype = FD_DTYPE_F32;
  fd_dtype kv_dtype = FD_DTYPE_F32;  // of k and v
  bool kv_quantized = false;         // e4m3, e5m2 or i8: elements are stored value x scale
  fd_dtype out_dtype = FD_DTYPE_F32;

  int64_t batch = 0;
  int64_t q_len = 0;  // query tokens per sequence: the newest q_len positions
  int64_t q_heads = 0;
  int64_t kv_heads = 0;
  int64_t group_size = 0;  // q_heads / kv_heads
  int64_t head_dim = 0;

  // Tokens a sequence may hold: kv_capacity for a dense cache, or
  // max_pages * page_size for a paged one. Also the length of every sequence
  // when seq_lens is absent.
  int64_t kv_capacity = 0;

  bool paged = false;
  int64_t page_size = 0;  // paged only: tokens per page
  int64_t num_pages = 0;  // paged only: pages in the pool
  int64_t max_pages = 0;  // paged only: block table columns

  // Roles as in fd_decode_args. Dense k/v: [batch, capacity, kv_heads, dim];
  // paged k/v: [num_pages, page_size, kv_heads, dim]; q/out: [batch, q_len,
  // q_heads, dim]; lse: [batch, q_len, q_heads]; seq_lens: [batch];
  // block_table: [batch, max_pages].
  StridedView q, k, v, out, lse, seq_lens, block_table;
  bool has_lse = false;
  bool has_seq_lens = false;
  // Ragged query lengths: q_lens [batch] i32, each clamped to [0, q_len]
  // (flashdecode.h, "Ragged query lengths"); absent: q_len for every sequence.
  StridedView q_lens;
  bool has_q_lens = false;

  float softmax_scale = 0.0f;    // resolved: never 0
  int32_t requested_splits = 0;  // 0 = automatic
  // > 0: batch-invariant mode, splits cut at fixed multiples of this many
  // tokens (rounded up to the backend's tile); requested_splits is then 0.
  int64_t requested_split_tokens = 0;

  // Attention variants (flashdecode.h, "Attention variants"); the defaults
  // are plain causal attention.
  bool causal = true;
  int64_t window = 0;               // window_left: a key is seen if pos_q - pos_k < window; 0: no window
  float softcap = 0.0f;             // > 0: scores become softcap * tanh(score / softcap)
  StridedView alibi_slopes, sinks;  // [q_heads] f32
  bool has_alibi = false;
  bool has_sinks = false;

  // Dequantization scales of an 8-bit cache, f32, the cache's shape without
  // head_dim (dense [batch, capacity, kv_heads], paged [page, slot,
  // kv_heads]); strides of 0 broadcast. Absent: 1.
  StridedView k_scale, v_scale;
  bool has_k_scale = false;
  bool has_v_scale = false;

  bool batch_invariant() const { return requested_split_tokens > 0; }
  // Query rows that share one KV head: q_len tokens x the GQA group.
  int64_t rows_per_kv_head() const { return q_len * group_size; }
};

// Keys [begin, end) of a sequence.
struct KeyRange {
  int64_t begin = 0;
  int64_t end = 0;
};

// The keys query token t of a sequence of length len with q_len_b query
// tokens sees (causal mask and window), at position len - q_len_b + t;
// empty when it sees none, and for the padding tokens t >= q_len_b.
inline KeyRange query_keys(const Problem &p, int64_t len, int64_t q_len_b, int64_t t) {
  if (t >= q_len_b) return {len, len};
  const int64_t pos_q = len - q_len_b + t;
  KeyRange r;
  r.end = p.causal ? (pos_q + 1 < len ? pos_q + 1 : len) : len;
  if (r.end < 0) r.end = 0;
  r.begin = p.window > 0 && pos_q - p.window + 1 > 0 ? pos_q - p.window + 1 : 0;
  if (r.begin > r.end) r.begin = r.end;
  return r;
}

// The keys any query token of the sequence sees: all that a backend reads
// (none without query tokens).
inline KeyRange sequence_keys(const Problem &p, int64_t len, int64_t q_len_b) {
  KeyRange r = query_keys(p, len, q_len_b, 0);
  r.end = len;
  return r;
}

// The most keys one sequence's queries can see: kv_capacity, or the window
// and the query tokens when that is shorter. Plans cut this many tokens.
inline int64_t planned_kv_span(const Problem &p) {
  if (p.window <= 0) return p.kv_capacity;
  const int64_t span = p.window + p.q_len - 1;
  return span < p.kv_capacity ? span : p.kv_capacity;
}

// Checks every argument (shapes, dtypes, strides, ranges; not tensor
// contents) and fills a Problem. Throws fd::Error naming the argument.
Problem validate_decode_args(const fd_decode_args *args);

// A merge of partial attention results after validation (fd_merge_states):
// state s is out [batch, q_len, heads, head_dim] of states_dtype[s] with its
// f32 lse [batch, q_len, heads]; out and lse as in Problem.
struct MergeProblem {
  int32_t num_states = 0;
  int64_t batch = 0, q_len = 0, heads = 0, head_dim = 0;
  StridedView states_out[FD_MAX_MERGE_STATES];
  fd_dtype states_dtype[FD_MAX_MERGE_STATES] = {};
  StridedView states_lse[FD_MAX_MERGE_STATES];
  StridedView out, lse;
  fd_dtype out_dtype = FD_DTYPE_F32;
  bool has_lse = false;
};

// Checks fd_merge_args as validate_decode_args checks fd_decode_args.
MergeProblem validate_merge_args(const fd_merge_args *args);

// fd_append_kv after validation: k_new/v_new [batch, new_len, kv_heads,
// head_dim] go into the cache k/v (as in Problem, of any cache dtype) at
// positions len - new_len + i (flashdecode.h, fd_append_args).
struct AppendProblem {
  fd_dtype new_dtype = FD_DTYPE_F32;  // of k_new and v_new
  fd_dtype kv_dtype = FD_DTYPE_F32;   // of the cache k and v
  bool kv_quantized = false;
  int64_t batch = 0, new_len = 0, kv_heads = 0, head_dim = 0;
  int64_t kv_capacity = 0;
  bool paged = false;
  int64_t page_size = 0, num_pages = 0, max_pages = 0;
  StridedView k_new, v_new, k, v, k_scale, v_scale, seq_lens, block_table;
  bool has_k_scale = false, has_v_scale = false, has_seq_lens = false;
};

// Checks fd_append_args as validate_decode_args checks fd_decode_args.
AppendProblem validate_append_args(const fd_append_args *args);

// Checks seq_lens and block_table values (FD_CHECK_CONTENTS), for backends
// whose tensors live in host memory. Throws fd::Error naming the element at
// fault.
void validate_host_contents(const Problem &problem);

// The errors of a bad length or used block-table entry, in one wording for
// every backend; found_by is appended (e.g. where the check ran), "" for none.
[[noreturn]] void fail_bad_length(int64_t sequence, int64_t length, int64_t kv_capacity, const char *found_by);
[[noreturn]] void fail_bad_page(int64_t sequence, int64_t column, int64_t page, int64_t num_pages,
                                const char *found_by);
[[noreturn]] void fail_bad_query_length(int64_t sequence, int64_t q_len_b, int64_t q_len, const char *found_by);

// A sequence's length as the kernels read it: clamped to [0, kv_capacity]
// (flashdecode.h, "Lengths and block tables").
inline int64_t clamp_length(int64_t length, int64_t kv_capacity) {
  return length < 0 ? 0 : length > kv_capacity ? kv_capacity : length;
}

// Sequence b's query tokens on the host (CPU backend): q_lens[b] clamped
// to [0, q_len] (clamp_length's rule), or q_len.
inline int64_t sequence_q_len(const Problem &p, int64_t b) {
  if (!p.has_q_lens) return p.q_len;
  return clamp_length(static_cast<const int32_t *>(p.q_lens.data)[b * p.q_lens.strides[0]], p.q_len);
}

// A block-table entry as the kernels use it: clamped into [0, num_pages),
// so that a bad entry reads some page of the pool, never memory outside it.
inline int64_t clamp_page(int64_t page, int64_t num_pages) {
  return page < 0 ? 0 : page >= num_pages ? num_pages - 1 : page;
}

}  // namespace fd
