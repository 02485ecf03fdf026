// SPDX-License-Identifier: Apache-2.0
// Planning helpers that every backend uses as a library: the automatic split
// count from a cost model of the backend's kernel, and the workspace layout
// of the per-split partial results. A backend's plan() chooses its kernel,
// asks estimate_splits, and lays the plan out with layout_plan. Plans depend
// on shapes alone, never on tensor contents, so planning reads no device
// memory.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/problem.h"

namespace fd {

// How a backend's kernel spends time, for the automatic split count.
struct SplitCostModel {
  int64_t workers = 1;            // work units that run at once (CPU threads; CUDA SMs x blocks per SM)
  int64_t min_split_tokens = 1;   // automatic splits are at least this long (a partial has a fixed cost)
  int64_t split_granularity = 1;  // split lengths are multiples of this (a kernel's KV tile)
  // Non-zero: pick automatic splits with a wave model (workers units run at
  // once, each costing its split length plus this many tokens; a merge pass
  // costs merge_overhead_tokens). Zero: about two units per worker.
  int64_t split_overhead_tokens = 0;
  int64_t merge_overhead_tokens = 0;
  // Relative time one worker takes per token, in the units of the overhead
  // fields: makes the wave model's costs comparable between kernels.
  double time_per_token = 1.0;
};

// The automatic split count and, with the wave model, its estimated cost
// (time units of the model; 0 without the wave model or with per-sequence
// lengths). A backend may compare the estimates of several kernels.
struct SplitEstimate {
  int32_t splits = 1;
  double cost = 0.0;
};
SplitEstimate estimate_splits(const Problem &problem, const SplitCostModel &model);

// A planned decode. The workspace starts with the backend's header
// (header_bytes of layout_plan), then holds, for every query row and split
// s, the online-softmax state of that split in base 2. Rows are numbered by
// KV head, so that the rows of one KV head are consecutive:
// r = (b * kv_heads + g) * q_len * group_size + t * group_size + j for query
// token t and query head h = g * group_size + j (with q_len 1: b * q_heads + h).
//   m[r * num_splits + s]                 running max of log2-scaled scores (-inf: empty split)
//   l[r * num_splits + s]                 sum of exp2(score - m)
//   acc[(r * num_splits + s) * head_dim + d]   sum of exp2(score - m) * v[d], unnormalised
// All float32. Offsets are aligned to kWorkspaceAlignment bytes.
struct Plan {
  int32_t num_splits = 1;
  // Split s covers tokens [first + s * split_tokens, first + (s + 1) * split_tokens)
  // of a sequence whose queries see keys from `first` on (core/problem.h,
  // sequence_keys: 0 without a window).
  int64_t split_tokens = 0;
  int64_t rows = 0;  // batch * q_len * q_heads
  // The planning backend's kernel variant: an index into that backend's own
  // variant table, set by its plan() and read back only by it (checked).
  uint8_t kernel_variant = 0;
  size_t m_offset = 0;
  size_t l_offset = 0;
  size_t acc_offset = 0;
  // Backend scratch after the partials, scratch_bytes each from
  // scratch_offset (0 bytes: none): the CPU backend's per-thread buffers,
  // the CUDA backend's order of the sequences (one buffer).
  size_t scratch_offset = 0;
  size_t scratch_bytes = 0;
  size_t workspace_bytes = 0;
};

constexpr size_t kWorkspaceAlignment = 256;

// The largest workspace the library allocates, plans or accepts from a
// caller: no allocator returns more than PTRDIFF_MAX bytes (pointer
// differences must fit). A multiple of kWorkspaceAlignment, so that rounding
// an accepted size up to the alignment cannot wrap size_t: GCC's aligned
// operator new rounds so, and for a size within 255 of SIZE_MAX gets a tiny
// block that the handle would take for the whole size.
constexpr size_t kMaxWorkspaceBytes = static_cast<size_t>(PTRDIFF_MAX) / kWorkspaceAlignment * kWorkspaceAlignment;

// Throws FD_ERROR_OUT_OF_MEMORY, naming `what`, for a workspace size no
// allocator can satisfy (above kMaxWorkspaceBytes): every allocation path
// calls this before the allocator sees the size.
void require_allocatable_workspace(size_t bytes, const char *what);

// A plan with the caller's split length when it asked for one (rounded up
// to granularity: batch-invariant mode; FD_ERROR_INVALID_SPLITS when that
// makes more than FD_MAX_SPLITS splits), else the caller's split count when
// it asked for one (kept exactly: trailing splits may be empty), else
// automatic_splits (splits that rounding leaves empty are dropped); split
// lengths are multiples of granularity.
// header_bytes of backend state come first in the workspace: the same for
// every problem of a backend, so that no plan's partials overwrite it.
// Every offset is computed with overflow checks; throws FD_ERROR_INVALID_SHAPE
// when the workspace would exceed kMaxWorkspaceBytes.
// min_states: at least this many partial states (m, l, head_dim of acc),
// for a backend whose kernels may also lay them out another way (the CUDA
// backend's balanced schedule).
Plan layout_plan(const Problem &problem, int32_t automatic_splits, int64_t granularity, size_t header_bytes,
                 size_t min_states = 0);

// Appends `threads` aligned scratch buffers of bytes_per_thread to the
// plan's workspace (Plan::scratch_offset, scratch_bytes), with the same
// overflow checks as layout_plan.
void add_scratch(Plan &plan, size_t bytes_per_thread, int threads);

// Everything a plan depends on: problems with equal keys get equal plans
// (Backend::plan may read only these fields), so a handle reuses its last
// plan instead of searching again on every decode of the same shape.
struct PlanKey {
  fd_dtype q_dtype = FD_DTYPE_F32;
  fd_dtype kv_dtype = FD_DTYPE_F32;
  fd_dtype out_dtype = FD_DTYPE_F32;
  int64_t batch = 0, q_len = 0, q_heads = 0, kv_heads = 0, head_dim = 0, kv_capacity = 0, page_size = 0;
  bool paged = false;
  bool has_seq_lens = false;
  int32_t requested_splits = 0;
  int64_t requested_split_tokens = 0;
  int64_t window = 0;

  bool operator==(const PlanKey &o) const {
    return q_dtype == o.q_dtype && kv_dtype == o.kv_dtype && out_dtype == o.out_dtype && batch == o.batch &&
           q_len == o.q_len && q_heads == o.q_heads && kv_heads == o.kv_heads && head_dim == o.head_dim &&
           kv_capacity == o.kv_capacity && page_size == o.page_size && paged == o.paged &&
           has_seq_lens == o.has_seq_lens && requested_splits == o.requested_splits &&
           requested_split_tokens == o.requested_split_tokens && window == o.window;
  }
};

PlanKey plan_key(const Problem &problem);

}  // namespace fd
