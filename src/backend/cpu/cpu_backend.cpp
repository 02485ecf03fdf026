// SPDX-License-Identifier: Apache-2.0
// The CPU backend: the same two-phase split-K algorithm as the GPU (per split
// an online softmax in base 2 into the workspace, then a merge in split
// order), on a pool of threads. It is the reference the CUDA backend is
// tested against and a fallback for hosts without a GPU: plain loops in a
// fixed order of operations, vectorised where that order allows
// (backend/cpu/lanes.h); every task writes only its own outputs, so results
// do not depend on thread timing.
#include <algorithm>
#include <cmath>
#include <limits>
#include <new>
#include <thread>

#include "backend/backend.h"
#include "backend/cpu/convert.h"
#include "backend/cpu/lanes.h"
#include "backend/cpu/quantize.h"
#include "backend/cpu/thread_pool.h"
#include "core/dtype.h"
#include "core/error.h"

namespace fd {
namespace {

constexpr float kLog2e = 1.4426950408889634f;
constexpr double kLog2eDouble = 1.4426950408889634;
constexpr float kLn2 = 0.6931471805599453f;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Lengths and page indices are clamped as on the CUDA backend (one contract:
// flashdecode.h, "Lengths and block tables"); FD_CHECK_CONTENTS refuses
// bad ones before this runs.
int64_t sequence_length(const Problem &p, int64_t b) {
  if (!p.has_seq_lens) return p.kv_capacity;
  return clamp_length(static_cast<const int32_t *>(p.seq_lens.data)[b * p.seq_lens.strides[0]], p.kv_capacity);
}

// Where token `token` of sequence b lives: (b, token) in a dense cache,
// (page, slot) in a paged one. The k/v views and their scale views index
// their first two dimensions alike.
struct CacheSlot {
  int64_t outer;  // sequence (dense) or page (paged)
  int64_t inner;  // token (dense) or slot in the page (paged)
  int64_t offset(const StridedView &view, int64_t h) const {
    return outer * view.strides[0] + inner * view.strides[1] + h * view.strides[2];
  }
};

CacheSlot cache_slot(const Problem &p, int64_t b, int64_t token) {
  if (!p.paged) return {b, token};
  const auto *table = static_cast<const int32_t *>(p.block_table.data);
  const int64_t page =
      clamp_page(table[b * p.block_table.strides[0] + (token / p.page_size) * p.block_table.strides[1]], p.num_pages);
  return {page, token % p.page_size};
}

// Requests the cache lines of a row (n elements of `bytes` each) a block
// before it is loaded: one KV head's rows lie a token's width apart, too
// sparse for the hardware's stream prefetchers, and without this the
// loads wait on memory with the core idle.
inline void prefetch_row(const void *row, int64_t n, int64_t bytes) {
  constexpr int64_t kLine = 64;
  const char *first = static_cast<const char *>(row);
  for (int64_t offset = 0; offset < n * bytes; offset += kLine) __builtin_prefetch(first + offset);
}

// Loads K/V rows into float, one policy per kind of cache; split_partials is
// instantiated per policy so the 16-bit path stays as it was.
// A cache of q's dtype D: the storage's own conversion.
template <fd_dtype D>
struct NativeRows {
  void load(const StridedView &cache, const StridedView &, bool, CacheSlot slot, int64_t h, float *dst,
            int64_t n) const {
    using T = typename Storage<D>::type;
    Storage<D>::load_row(static_cast<const T *>(cache.data) + slot.offset(cache, h), dst, n);
  }
  void prefetch(const StridedView &cache, CacheSlot slot, int64_t h, int64_t n) const {
    using T = typename Storage<D>::type;
    prefetch_row(static_cast<const T *>(cache.data) + slot.offset(cache, h), n, sizeof(T));
  }
};
// An 8-bit cache (e4m3, e5m2, i8): a 256-entry table gives each byte's
// exact value, times the row's scale (1 when absent) in float, as
// flashdecode.h defines the element (stored value x scale). Only the scales
// of the rows loaded (tokens a query sees) are read.
struct QuantizedRows {
  const float *table;  // byte_table(kv_dtype)
  void load(const StridedView &cache, const StridedView &scale, bool has_scale, CacheSlot slot, int64_t h, float *dst,
            int64_t n) const {
    const uint8_t *src = static_cast<const uint8_t *>(cache.data) + slot.offset(cache, h);
    if (!has_scale) {
      for (int64_t i = 0; i < n; ++i) dst[i] = table[src[i]];
      return;
    }
    const float s = static_cast<const float *>(scale.data)[slot.offset(scale, h)];
    for (int64_t i = 0; i < n; ++i) dst[i] = table[src[i]] * s;
  }
  void prefetch(const StridedView &cache, CacheSlot slot, int64_t h, int64_t n) const {
    prefetch_row(static_cast<const uint8_t *>(cache.data) + slot.offset(cache, h), n, 1);
  }
};

struct Partials {
  float *m;
  float *l;
  float *acc;
};

Partials partials_of(const Plan &plan, void *workspace) {
  auto *base = static_cast<char *>(workspace);
  return {reinterpret_cast<float *>(base + plan.m_offset), reinterpret_cast<float *>(base + plan.l_offset),
          reinterpret_cast<float *>(base + plan.acc_offset)};
}

// The larger of a and b, NaN if either is NaN (std::max drops a NaN in its
// second argument). Every running and merged max goes through this, as on
// the CUDA backend: a NaN score reaches m and its row comes out NaN.
inline float max_nan(float a, float b) {
  if (std::isnan(a)) return a;
  if (std::isnan(b)) return b;
  return a < b ? b : a;
}

// Tokens converted and scored together: one rescale of acc per block
// instead of per token, and K/V rows converted once for every query row of
// the KV head (the GQA group times the query tokens).
constexpr int64_t kTokenBlock = 32;

// A query head's entry of an optional [q_heads] f32 tensor (alibi_slopes, sinks).
inline float per_head(const StridedView &view, int64_t head) {
  return static_cast<const float *>(view.data)[head * view.strides[0]];
}

// split_partials' scratch: every query row of a KV head, and a block of K,
// V and scores.
size_t split_scratch_floats(const Problem &p) {
  return static_cast<size_t>((p.rows_per_kv_head() + 2 * kTokenBlock) * p.head_dim + kTokenBlock);
}

// Phase 1 for one (sequence, KV head, split): every query row of the KV head
// (q_len tokens x the GQA group, in workspace order) runs an online softmax
// over the split's tokens, block by block, each row over the keys its token
// sees. Scores are in log2 units: softmax_scale * log2(e) is folded into q,
// and the softcap and ALiBi slope are scaled by log2(e) to match, which
// computes the header's natural-unit formulas exactly
// (c * tanh(s / c) * log2e = c2 * tanh(s2 / c2) with c2 = c * log2e).
// D is q's dtype; Rows loads the K/V rows (NativeRows<D> or QuantizedRows).
template <fd_dtype D, class Rows>
void split_partials(const Problem &p, const Plan &plan, const Rows &kv_rows, const Partials &out, int64_t b,
                    int64_t kv_head, int32_t split, float *scratch) {
  using T = typename Storage<D>::type;
  const int64_t dim = p.head_dim;
  const int64_t group = p.group_size;
  const int64_t rows = p.rows_per_kv_head();
  const int64_t len = sequence_length(p, b);
  const int64_t q_len_b = sequence_q_len(p, b);
  // Splits cut the keys any query token sees, from the first of them on.
  const KeyRange keys = sequence_keys(p, len, q_len_b);
  const int64_t begin = std::min<int64_t>(keys.end, keys.begin + split * plan.split_tokens);
  const int64_t end = std::min<int64_t>(keys.end, begin + plan.split_tokens);

  float *q = scratch;               // [rows][dim], pre-scaled into log2 units
  float *k_block = q + rows * dim;  // [kTokenBlock][dim]
  float *v_block = k_block + kTokenBlock * dim;
  float *scores = v_block + kTokenBlock * dim;  // [kTokenBlock]
  const float q_scale = p.softmax_scale * kLog2e;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t token = r / group;
    const int64_t head = kv_head * group + r % group;
    if (token >= q_len_b) {  // padding (q_lens): never read, and it sees no key
      std::fill(q + r * dim, q + (r + 1) * dim, 0.0f);
      continue;
    }
    const T *src =
        static_cast<const T *>(p.q.data) + b * p.q.strides[0] + token * p.q.strides[1] + head * p.q.strides[2];
    for (int64_t d = 0; d < dim; ++d) q[r * dim + d] = Storage<D>::load(src + d) * q_scale;
  }

  const size_t first_state = static_cast<size_t>((b * p.kv_heads + kv_head) * rows) * plan.num_splits + split;
  for (int64_t r = 0; r < rows; ++r) {  // the rows of one KV head are consecutive
    const size_t state = first_state + static_cast<size_t>(r) * plan.num_splits;
    std::fill(out.acc + state * dim, out.acc + (state + 1) * dim, 0.0f);
    out.m[state] = kNegInf;
    out.l[state] = 0.0f;
  }

  // The cap and slopes in log2 units, in double: scaled by log2(e), a cap or
  // slope near the float maximum would overflow to inf (and inf * 0 is NaN).
  const double softcap = static_cast<double>(p.softcap) * kLog2eDouble;  // 0: none
  for (int64_t block = begin; block < end; block += kTokenBlock) {
    const int64_t count = std::min(kTokenBlock, end - block);
    for (int64_t t = 0; t < count; ++t) {
      if (block + kTokenBlock + t < end) {  // the next block's rows
        const CacheSlot ahead = cache_slot(p, b, block + kTokenBlock + t);
        kv_rows.prefetch(p.k, ahead, kv_head, dim);
        kv_rows.prefetch(p.v, ahead, kv_head, dim);
      }
      const CacheSlot slot = cache_slot(p, b, block + t);
      kv_rows.load(p.k, p.k_scale, p.has_k_scale, slot, kv_head, k_block + t * dim, dim);
      kv_rows.load(p.v, p.v_scale, p.has_v_scale, slot, kv_head, v_block + t * dim, dim);
    }
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t token = r / group;
      // Only the block's keys this row's token sees take part: keys outside
      // its mask or window are skipped, not scored -inf, so that a NaN in
      // their v cannot reach the row. Plain decode sees the whole block.
      const KeyRange seen = query_keys(p, len, q_len_b, token);
      const int64_t lo = std::max(seen.begin, block) - block;
      const int64_t hi = std::min(seen.end, block + count) - block;
      if (lo >= hi) continue;
      const size_t state = first_state + static_cast<size_t>(r) * plan.num_splits;
      const int64_t pos_q = len - q_len_b + token;
      const double slope = p.has_alibi ? per_head(p.alibi_slopes, kv_head * group + r % group) * kLog2eDouble : 0.0;
      const float *q_row = q + r * dim;
      int64_t t = lo;
      for (; t + 4 <= hi; t += 4) lanes::dots<4>(q_row, k_block + t * dim, dim, dim, scores + t);
      for (; t < hi; ++t) lanes::dots<1>(q_row, k_block + t * dim, dim, dim, scores + t);
      float block_max = kNegInf;
      for (t = lo; t < hi; ++t) {
        float s = scores[t];
        if (softcap > 0.0) s = static_cast<float>(softcap * std::tanh(s / softcap));
        if (p.has_alibi) s += static_cast<float>(slope * static_cast<double>(block + t - pos_q));
        scores[t] = s;
        block_max = max_nan(block_max, s);
      }
      float *acc = out.acc + state * dim;
      const float m_old = out.m[state];
      const float m_new = max_nan(m_old, block_max);
      if (m_new == kNegInf) continue;                // every score so far masked (-inf): nothing to add
      const float alpha = std::exp2(m_old - m_new);  // 0 while m_old is -inf
      float l = out.l[state] * alpha;
      if (alpha != 1.0f) {
        for (int64_t d = 0; d < dim; ++d) acc[d] *= alpha;
      }
      for (t = lo; t < hi; ++t) {  // the scores become the weights
        scores[t] = std::exp2(scores[t] - m_new);
        l += scores[t];
      }
      lanes::accumulate(acc, scores + lo, v_block + lo * dim, hi - lo, dim);
      out.m[state] = m_new;
      out.l[state] = l;
    }
  }
}

// Phase 2 for one query row (workspace order, core/plan.h): rescale every
// split to the common max and sum in split order. A sink joins only the
// denominator, as 2^(sink * log2e) rescaled to that max, which then covers
// the sink too so that neither term overflows. A row whose splits are all
// empty (its token sees no key) gets zeros and LSE -inf, or the sink.
template <fd_dtype OutD>
void merge_row(const Problem &p, const Plan &plan, const Partials &in, int64_t row) {
  using T = typename Storage<OutD>::type;
  const int64_t dim = p.head_dim;
  const int64_t rows_per_kv_head = p.rows_per_kv_head();
  const int64_t sequence_head = row / rows_per_kv_head;  // b * kv_heads + KV head
  const int64_t in_head = row % rows_per_kv_head;        // token * group_size + j
  const int64_t b = sequence_head / p.kv_heads;
  const int64_t token = in_head / p.group_size;
  const int64_t head = (sequence_head % p.kv_heads) * p.group_size + in_head % p.group_size;
  const size_t first = static_cast<size_t>(row) * plan.num_splits;

  float m_max = kNegInf;
  for (int32_t s = 0; s < plan.num_splits; ++s) m_max = max_nan(m_max, in.m[first + s]);

  T *out = static_cast<T *>(p.out.data) + b * p.out.strides[0] + token * p.out.strides[1] + head * p.out.strides[2];
  float lse = kNegInf;
  if (m_max == kNegInf) {
    for (int64_t d = 0; d < dim; ++d) Storage<OutD>::store(out + d, 0.0f);
    if (p.has_sinks) lse = per_head(p.sinks, head);  // log(0 + exp(sink)), exactly
  } else {
    float m = m_max;
    float sink = kNegInf;  // in log2 units
    if (p.has_sinks) {
      sink = per_head(p.sinks, head) * kLog2e;
      m = max_nan(m_max, sink);
    }
    float l_sum = 0.0f;
    for (int32_t s = 0; s < plan.num_splits; ++s) l_sum += in.l[first + s] * std::exp2(in.m[first + s] - m);
    if (p.has_sinks) l_sum += std::exp2(sink - m);
    const float inv_l = 1.0f / l_sum;
    for (int64_t d = 0; d < dim; ++d) {
      float sum = 0.0f;
      for (int32_t s = 0; s < plan.num_splits; ++s) {
        sum += in.acc[(first + s) * dim + d] * std::exp2(in.m[first + s] - m);
      }
      Storage<OutD>::store(out + d, sum * inv_l);
    }
    lse = (m + std::log2(l_sum)) * kLn2;
  }
  if (p.has_lse) {
    static_cast<float *>(p.lse.data)[b * p.lse.strides[0] + token * p.lse.strides[1] + head * p.lse.strides[2]] = lse;
  }
}

// fd_merge_states for one row: the states weighed by exp(lse_s - max) in
// state order; empty states (LSE -inf) are not read.
template <fd_dtype OutD>
void merge_states_row(const MergeProblem &p, int64_t row) {
  const int64_t h = row % p.heads;
  const int64_t t = (row / p.heads) % p.q_len;
  const int64_t b = row / (p.heads * p.q_len);
  float lse[FD_MAX_MERGE_STATES];
  float m = kNegInf;
  for (int s = 0; s < p.num_states; ++s) {
    const StridedView &v = p.states_lse[s];
    lse[s] = static_cast<const float *>(v.data)[b * v.strides[0] + t * v.strides[1] + h * v.strides[2]];
    m = max_nan(m, lse[s]);
  }
  using T = typename Storage<OutD>::type;
  T *out = static_cast<T *>(p.out.data) + b * p.out.strides[0] + t * p.out.strides[1] + h * p.out.strides[2];
  float merged_lse = m;
  if (m == kNegInf) {
    for (int64_t d = 0; d < p.head_dim; ++d) Storage<OutD>::store(out + d, 0.0f);
  } else if (std::isnan(m) || m == std::numeric_limits<float>::infinity()) {
    merged_lse = std::numeric_limits<float>::quiet_NaN();
    for (int64_t d = 0; d < p.head_dim; ++d) Storage<OutD>::store(out + d, merged_lse);
  } else {
    float weight[FD_MAX_MERGE_STATES];
    float l = 0.0f;
    for (int s = 0; s < p.num_states; ++s) {
      weight[s] = lse[s] == kNegInf ? 0.0f : std::exp(lse[s] - m);
      l += weight[s];
    }
    // Accumulated over the row first: out may be a state (in place).
    float acc[FD_MAX_HEAD_DIM] = {};
    for (int s = 0; s < p.num_states; ++s) {
      if (weight[s] == 0.0f) continue;
      const StridedView &v = p.states_out[s];
      const int64_t base = b * v.strides[0] + t * v.strides[1] + h * v.strides[2];
      for (int64_t d = 0; d < p.head_dim; ++d) acc[d] += weight[s] * load_element(p.states_dtype[s], v.data, base + d);
    }
    const float inv_l = 1.0f / l;
    for (int64_t d = 0; d < p.head_dim; ++d) Storage<OutD>::store(out + d, acc[d] * inv_l);
    merged_lse = m + std::log(l);
  }
  if (p.has_lse)
    static_cast<float *>(p.lse.data)[b * p.lse.strides[0] + t * p.lse.strides[1] + h * p.lse.strides[2]] = merged_lse;
}

// fd_append_kv's conversion of one element: x = new / scale in float32 (x =
// new without a scale), then the cache dtype's rounding: F32, F16, BF16 to
// nearest even (IEEE overflow to infinity), the 8-bit formats as in
// backend/cpu/quantize.h.
void store_cache_element(fd_dtype dtype, void *cache, int64_t offset, float x) {
  switch (dtype) {
    case FD_DTYPE_F32: Storage<FD_DTYPE_F32>::store(static_cast<float *>(cache) + offset, x); break;
    case FD_DTYPE_F16: Storage<FD_DTYPE_F16>::store(static_cast<uint16_t *>(cache) + offset, x); break;
    case FD_DTYPE_BF16: Storage<FD_DTYPE_BF16>::store(static_cast<uint16_t *>(cache) + offset, x); break;
    default: static_cast<uint8_t *>(cache)[offset] = quantize_byte(dtype, x); break;
  }
}

// Writes the rows of new token i of sequence b into one cache (k or v).
void append_rows(const AppendProblem &p, const StridedView &src, fd_dtype src_dtype, const StridedView &cache,
                 const StridedView &scale, bool has_scale, int64_t b, int64_t i, CacheSlot slot) {
  for (int64_t h = 0; h < p.kv_heads; ++h) {
    const int64_t from = b * src.strides[0] + i * src.strides[1] + h * src.strides[2];
    const int64_t to = slot.offset(cache, h);
    const float s = has_scale ? static_cast<const float *>(scale.data)[slot.offset(scale, h)] : 1.0f;
    for (int64_t d = 0; d < p.head_dim; ++d) {
      float x = load_element(src_dtype, src.data, from + d);
      if (has_scale) x = x / s;
      store_cache_element(p.kv_dtype, cache.data, to + d, x);
    }
  }
}

// New token i of sequence b goes to position L - new_len + i; a negative
// position, or (paged) a block-table entry outside the pool, is not written.
void append_token(const AppendProblem &p, int64_t b, int64_t i) {
  int64_t len = p.kv_capacity;
  if (p.has_seq_lens) {
    len = clamp_length(static_cast<const int32_t *>(p.seq_lens.data)[b * p.seq_lens.strides[0]], p.kv_capacity);
  }
  const int64_t pos = len - p.new_len + i;
  if (pos < 0) return;
  CacheSlot slot{b, pos};
  if (p.paged) {
    const auto *table = static_cast<const int32_t *>(p.block_table.data);
    const int64_t page = table[b * p.block_table.strides[0] + (pos / p.page_size) * p.block_table.strides[1]];
    if (page < 0 || page >= p.num_pages) return;  // no clamping for writes
    slot = {page, pos % p.page_size};
  }
  append_rows(p, p.k_new, p.new_dtype, p.k, p.k_scale, p.has_k_scale, b, i, slot);
  append_rows(p, p.v_new, p.new_dtype, p.v, p.v_scale, p.has_v_scale, b, i, slot);
}

class CpuBackend final : public Backend {
 public:
  CpuBackend(int num_threads, bool check_contents) : pool_(num_threads), check_contents_(check_contents) {}

  fd_backend kind() const override { return FD_BACKEND_CPU; }
  void check_supported(const Problem &) const override {}
  bool checks_contents() const override { return check_contents_; }
  // Host memory: the contents are read where they are used, and reported
  // before anything is written.
  void check_contents(const Problem &problem) override { validate_host_contents(problem); }
  void wait_and_check_contents(fd_cuda_stream) override {}

  // One kernel; about two tasks per thread, none shorter than 256 tokens.
  // Each thread's scratch (split_partials) is in the workspace, so that a
  // reserved or caller-owned workspace keeps fd_decode free of allocation.
  Plan plan(const Problem &p) const override {
    SplitCostModel model;
    model.workers = pool_.size();
    model.min_split_tokens = 256;
    Plan plan = layout_plan(p, estimate_splits(p, model).splits, model.split_granularity, 0);
    add_scratch(plan, split_scratch_floats(p) * sizeof(float), pool_.size());
    return plan;
  }

  // The size is checked first: the aligned operator new rounds it up to the
  // alignment, which for sizes within 255 of SIZE_MAX wraps to a tiny block.
  void *allocate_workspace(size_t bytes) override {
    require_allocatable_workspace(bytes, "workspace");
    void *memory = ::operator new(bytes, std::align_val_t(kWorkspaceAlignment), std::nothrow);
    if (memory == nullptr) fail(FD_ERROR_OUT_OF_MEMORY, "workspace: allocating %zu bytes of host memory failed", bytes);
    return memory;
  }
  void free_workspace(void *workspace) noexcept override {
    ::operator delete(workspace, std::align_val_t(kWorkspaceAlignment));
  }

  void decode(const Problem &p, const Plan &plan, void *workspace, fd_cuda_stream) override {
    if (p.kv_quantized) {
      const QuantizedRows rows{byte_table(p.kv_dtype)};
      if (rows.table == nullptr) fail(FD_ERROR_INTERNAL, "cpu backend: no table for dtype %s", dtype_name(p.kv_dtype));
      switch (p.q_dtype) {
        case FD_DTYPE_F32: run<FD_DTYPE_F32>(p, plan, rows, workspace); break;
        case FD_DTYPE_F16: run<FD_DTYPE_F16>(p, plan, rows, workspace); break;
        case FD_DTYPE_BF16: run<FD_DTYPE_BF16>(p, plan, rows, workspace); break;
        default: fail(FD_ERROR_INTERNAL, "cpu backend: no kernel for q of dtype %s", dtype_name(p.q_dtype));
      }
      return;
    }
    if (p.q_dtype != p.kv_dtype) {
      fail(FD_ERROR_INTERNAL, "cpu backend: q of %s with a cache of %s", dtype_name(p.q_dtype), dtype_name(p.kv_dtype));
    }
    switch (p.kv_dtype) {
      case FD_DTYPE_F32: run<FD_DTYPE_F32>(p, plan, NativeRows<FD_DTYPE_F32>{}, workspace); break;
      case FD_DTYPE_F16: run<FD_DTYPE_F16>(p, plan, NativeRows<FD_DTYPE_F16>{}, workspace); break;
      case FD_DTYPE_BF16: run<FD_DTYPE_BF16>(p, plan, NativeRows<FD_DTYPE_BF16>{}, workspace); break;
      default: fail(FD_ERROR_INTERNAL, "cpu backend: no kernel for dtype %s", dtype_name(p.kv_dtype));
    }
  }

  // fd_append_kv: a task per (sequence, new token that can land); each
  // writes only its own position's rows (flashdecode.h, fd_append_args).
  // Only the last kv_capacity new tokens can have a position in the cache:
  // the work follows the cache, not new_len (a broadcast k_new may be long).
  void append_kv(const AppendProblem &p, fd_cuda_stream) override {
    // The per-element conversions below have no error path: every dtype they
    // meet is checked here once, so that none of them turns into zeros.
    if (!is_float_dtype(p.new_dtype)) {
      fail(FD_ERROR_INTERNAL, "cpu backend: no append from new tokens of dtype %s", dtype_name(p.new_dtype));
    }
    if (!is_float_dtype(p.kv_dtype) && byte_table(p.kv_dtype) == nullptr) {
      fail(FD_ERROR_INTERNAL, "cpu backend: no append into a cache of dtype %s", dtype_name(p.kv_dtype));
    }
    const int64_t landing = std::min(p.new_len, p.kv_capacity);
    const int64_t skipped = p.new_len - landing;
    pool_.parallel_for(p.batch * landing,
                       [&](int64_t unit) { append_token(p, unit / landing, skipped + unit % landing); });
  }

  template <fd_dtype OutD>
  void merge_rows(const MergeProblem &p, int64_t rows) {
    pool_.parallel_for(rows, [&](int64_t row) { merge_states_row<OutD>(p, row); });
  }

  void merge_states(const MergeProblem &p, fd_cuda_stream) override {
    // load_element has no error path: the states' dtypes are checked here once.
    for (int s = 0; s < p.num_states; ++s) {
      if (!is_float_dtype(p.states_dtype[s])) {
        fail(FD_ERROR_INTERNAL, "cpu backend: no merge of states of dtype %s", dtype_name(p.states_dtype[s]));
      }
    }
    const int64_t rows = p.batch * p.q_len * p.heads;
    switch (p.out_dtype) {
      case FD_DTYPE_F32: return merge_rows<FD_DTYPE_F32>(p, rows);
      case FD_DTYPE_F16: return merge_rows<FD_DTYPE_F16>(p, rows);
      case FD_DTYPE_BF16: return merge_rows<FD_DTYPE_BF16>(p, rows);
      default: fail(FD_ERROR_INTERNAL, "cpu backend: no merge into dtype %s", dtype_name(p.out_dtype));
    }
  }

  // run's two passes: a task per (sequence, KV head, split), then the merge.
  LaunchSummary describe(const Problem &p, const Plan &plan) const override {
    LaunchSummary summary;
    summary.kernel = "cpu";
    summary.merge = FD_MERGE_SEPARATE;
    summary.blocks = p.batch * p.kv_heads * plan.num_splits;
    return summary;
  }

 private:
  template <fd_dtype D, class Rows>
  void run(const Problem &p, const Plan &plan, const Rows &rows, void *workspace) {
    const Partials partials = partials_of(plan, workspace);
    const int64_t splits = plan.num_splits;
    const int64_t units = p.batch * p.kv_heads * splits;
    char *scratch = static_cast<char *>(workspace) + plan.scratch_offset;
    pool_.parallel_for(units, [&](int64_t unit, int thread) {
      const int64_t split = unit % splits;
      const int64_t kv_head = (unit / splits) % p.kv_heads;
      const int64_t b = unit / (splits * p.kv_heads);
      float *own = reinterpret_cast<float *>(scratch + static_cast<size_t>(thread) * plan.scratch_bytes);
      split_partials<D>(p, plan, rows, partials, b, kv_head, static_cast<int32_t>(split), own);
    });
    const bool out_f32 = p.out_dtype == FD_DTYPE_F32;
    pool_.parallel_for(plan.rows, [&](int64_t row) {
      if (out_f32) {
        merge_row<FD_DTYPE_F32>(p, plan, partials, row);
      } else {
        merge_row<D>(p, plan, partials, row);
      }
    });
  }

  ThreadPool pool_;
  bool check_contents_;
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(int num_threads, bool check_contents) {
  // The conversion tables are built on first use: here, at fd_create, so
  // that no fd_decode allocates them.
  (void)half_table();
  (void)byte_table(FD_DTYPE_E4M3);
  if (num_threads <= 0) {
    num_threads =
        static_cast<int>(std::min<unsigned>(FD_MAX_THREADS, std::max(1u, std::thread::hardware_concurrency())));
  }
  return std::make_unique<CpuBackend>(num_threads, check_contents);
}

}  // namespace fd
