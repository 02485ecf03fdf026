// SPDX-License-Identifier: Apache-2.0
#include "core/plan.h"

#include <algorithm>

#include "core/error.h"

namespace fd {
namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The end of `bytes` placed at `offset`, rounded up to kWorkspaceAlignment;
// false if the sum overflows or passes kMaxWorkspaceBytes (which is aligned,
// so the rounding cannot wrap).
bool place(size_t offset, size_t bytes, size_t *end) {
  size_t sum = 0;
  if (__builtin_add_overflow(offset, bytes, &sum) || sum > kMaxWorkspaceBytes) return false;
  *end = (sum + kWorkspaceAlignment - 1) / kWorkspaceAlignment * kWorkspaceAlignment;
  return true;
}

}  // namespace

void require_allocatable_workspace(size_t bytes, const char *what) {
  if (bytes > kMaxWorkspaceBytes) {
    fail(FD_ERROR_OUT_OF_MEMORY, "%s: %zu bytes is more than any allocator can provide (at most %zu)", what, bytes,
         kMaxWorkspaceBytes);
  }
}

// Enough splits that every worker has about two units of work, but none
// shorter than min_split_tokens: a GQA group of one sequence is one unit
// before splitting.
SplitEstimate estimate_splits(const Problem &p, const SplitCostModel &model) {
  const int64_t units = std::max<int64_t>(1, p.batch * p.kv_heads);
  const int64_t most_useful =
      std::max<int64_t>(1, ceil_div(planned_kv_span(p), std::max<int64_t>(1, model.min_split_tokens)));
  const int64_t workers = std::max<int64_t>(1, model.workers);
  SplitEstimate estimate;
  if (model.split_overhead_tokens <= 0) {
    const int64_t wanted = ceil_div(2 * workers, units);
    estimate.splits = static_cast<int32_t>(std::clamp<int64_t>(std::min(wanted, most_useful), 1, FD_MAX_SPLITS));
    return estimate;
  }
  const int64_t limit = std::min<int64_t>(most_useful, FD_MAX_SPLITS);
  if (p.has_seq_lens) {
    // Lengths are unknown here: about four waves of splits, so that the
    // hardware scheduler can balance long sequences against short ones.
    estimate.splits = static_cast<int32_t>(std::clamp<int64_t>(ceil_div(4 * workers, units), 1, limit));
    return estimate;
  }
  // Every split has the same length: minimise waves x (split length + fixed
  // cost) x the time a worker takes per token, plus the merge pass when there
  // is more than one split.
  const int64_t granularity = std::max<int64_t>(1, model.split_granularity);
  const int64_t capacity = std::max<int64_t>(1, planned_kv_span(p));
  for (int64_t s = 1; s <= limit; ++s) {
    const int64_t split_tokens = ceil_div(ceil_div(capacity, s), granularity) * granularity;
    const int64_t splits = ceil_div(capacity, split_tokens);
    const double waves = static_cast<double>(ceil_div(units * splits, workers));
    const double cost = waves * static_cast<double>(split_tokens + model.split_overhead_tokens) * model.time_per_token +
                        (splits > 1 ? static_cast<double>(model.merge_overhead_tokens) : 0.0);
    if (s == 1 || cost < estimate.cost) {
      estimate.splits = static_cast<int32_t>(splits);
      estimate.cost = cost;
    }
  }
  return estimate;
}

PlanKey plan_key(const Problem &p) {
  PlanKey key;
  key.q_dtype = p.q_dtype;
  key.kv_dtype = p.kv_dtype;
  key.out_dtype = p.out_dtype;
  key.batch = p.batch;
  key.q_len = p.q_len;
  key.q_heads = p.q_heads;
  key.kv_heads = p.kv_heads;
  key.head_dim = p.head_dim;
  key.kv_capacity = p.kv_capacity;
  key.page_size = p.page_size;
  key.paged = p.paged;
  key.has_seq_lens = p.has_seq_lens;
  key.requested_splits = p.requested_splits;
  key.requested_split_tokens = p.requested_split_tokens;
  key.window = p.window;
  return key;
}

Plan layout_plan(const Problem &p, int32_t automatic_splits, int64_t granularity, size_t header_bytes,
                 size_t min_states) {
  Plan plan;
  granularity = std::max<int64_t>(1, granularity);
  const int64_t span = planned_kv_span(p);
  if (p.batch_invariant()) {
    // Cut at fixed token positions, whatever the batch: a sequence's splits
    // depend on its own length alone. Validation bounds the request by
    // FD_MAX_KV_LEN, so the rounding cannot overflow.
    plan.split_tokens = ceil_div(p.requested_split_tokens, granularity) * granularity;
    const int64_t splits = std::max<int64_t>(1, ceil_div(span, plan.split_tokens));
    if (splits > FD_MAX_SPLITS) {
      fail(FD_ERROR_INVALID_SPLITS,
           "split_tokens: %lld (%lld after rounding up to this backend's %lld-token tile) cuts %lld keys into "
           "%lld splits, more than %d: use at least %lld",
           static_cast<long long>(p.requested_split_tokens), static_cast<long long>(plan.split_tokens),
           static_cast<long long>(granularity), static_cast<long long>(span), static_cast<long long>(splits),
           FD_MAX_SPLITS, static_cast<long long>(ceil_div(span, FD_MAX_SPLITS)));
    }
    plan.num_splits = static_cast<int32_t>(splits);
  } else {
    const int32_t splits =
        p.requested_splits > 0 ? p.requested_splits : std::clamp<int32_t>(automatic_splits, 1, FD_MAX_SPLITS);
    plan.split_tokens = ceil_div(ceil_div(std::max<int64_t>(1, span), splits), granularity) * granularity;
    // A manual count is kept exactly (trailing splits may be empty); an
    // automatic one drops splits that rounding left empty.
    plan.num_splits =
        p.requested_splits > 0 ? splits : static_cast<int32_t>(std::max<int64_t>(1, ceil_div(span, plan.split_tokens)));
  }

  // Every product and offset is checked: they come from the caller's
  // shapes, and a wrapped size would be a small workspace that the decode
  // writes past.
  size_t states = 0;
  size_t state_bytes = 0;
  size_t acc_bytes = 0;
  const bool fits =
      !__builtin_mul_overflow(p.batch, p.q_len, &plan.rows) &&
      !__builtin_mul_overflow(plan.rows, p.q_heads, &plan.rows) && plan.rows >= 0 &&
      !__builtin_mul_overflow(static_cast<size_t>(plan.rows), static_cast<size_t>(plan.num_splits), &states) &&
      !__builtin_mul_overflow(std::max(states, min_states), sizeof(float), &state_bytes) &&
      !__builtin_mul_overflow(state_bytes, static_cast<size_t>(p.head_dim), &acc_bytes) &&
      place(0, header_bytes, &plan.m_offset) && place(plan.m_offset, state_bytes, &plan.l_offset) &&
      place(plan.l_offset, state_bytes, &plan.acc_offset) && place(plan.acc_offset, acc_bytes, &plan.workspace_bytes);
  if (!fits) {
    fail(FD_ERROR_INVALID_SHAPE,
         "q: batch %lld x q_heads %lld x %d splits x head_dim %lld needs a workspace beyond the address space (more "
         "than %zu bytes)",
         static_cast<long long>(p.batch), static_cast<long long>(p.q_heads), static_cast<int>(plan.num_splits),
         static_cast<long long>(p.head_dim), kMaxWorkspaceBytes);
  }
  return plan;
}

void add_scratch(Plan &plan, size_t bytes_per_thread, int threads) {
  size_t per_thread = 0, total = 0;
  const bool fits = place(0, bytes_per_thread, &per_thread) &&
                    !__builtin_mul_overflow(per_thread, static_cast<size_t>(threads), &total) &&
                    place(plan.workspace_bytes, total, &plan.workspace_bytes);
  if (!fits) {
    fail(FD_ERROR_INVALID_SHAPE,
         "q: %d threads' scratch of %zu bytes each after %zu bytes of partials is beyond the address space (more "
         "than %zu bytes)",
         threads, bytes_per_thread, plan.workspace_bytes, kMaxWorkspaceBytes);
  }
  plan.scratch_offset = plan.workspace_bytes - total;
  plan.scratch_bytes = per_thread;
}

}  // namespace fd
