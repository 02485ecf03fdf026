// SPDX-License-Identifier: Apache-2.0
// Query rows and the attention variants' arithmetic on them. The rows of a
// KV head are its sequence's q_len query tokens x the GQA group of query
// heads, token-major: row r is token r / group_size of query head
// kv_head * group_size + r % group_size. A split kernel runs a chunk of
// them together, so every row of a chunk shares each K/V byte it reads;
// the workspace numbers them KV-head-major (core/plan.h), so that a chunk's
// partial states are consecutive. The key ranges and transforms follow
// core/problem.h (query_keys) and flashdecode.h ("Attention variants").
#pragma once

#include <cstdint>

#include "backend/cuda/params.h"
#include "backend/cuda/prims/softmax.cuh"

namespace fd {
namespace cuda {

struct QueryRow {
  int token;   // 0 .. q_len - 1
  int q_head;  // 0 .. q_heads - 1
};

__device__ __forceinline__ QueryRow query_row(int row, int group_size, int kv_head) {
  return {row / group_size, kv_head * group_size + row % group_size};
}

// A row's index in the workspace (core/plan.h) and in MergeParams::rows.
__device__ __forceinline__ int64_t workspace_row(const SplitParams &p, int64_t b, int kv_head, int row) {
  return (b * p.kv_heads + kv_head) * p.kv_rows + row;
}

// The row of a workspace row index: sequence b and the row's token and head.
struct WorkspaceRow {
  int64_t b;
  QueryRow row;
};

__device__ __forceinline__ WorkspaceRow from_workspace_row(int64_t index, int q_heads, int group_size, int kv_rows) {
  const int64_t per_sequence = static_cast<int64_t>(q_heads / group_size) * kv_rows;
  const int64_t b = index / per_sequence;
  const int rest = static_cast<int>(index - b * per_sequence);
  return {b, query_row(rest % kv_rows, group_size, rest / kv_rows)};
}

// A sequence's length as the kernels read it: clamped to [0, kv_capacity].
__device__ __forceinline__ int64_t sequence_length(const SplitParams &p, int64_t b) {
  int64_t len = p.kv_capacity;
  if (p.seq_lens != nullptr) {
    len = min(max(static_cast<int64_t>(__ldg(p.seq_lens + b * p.seq_lens_stride)), int64_t{0}), len);
  }
  return len;
}

// Sequence b's query tokens: q_lens[b] clamped to [0, q_len] (as the
// lengths are), or q_len. Tokens past it are padding: never read, no keys.
// kQueryLens false: a kernel without the variants' scoring, which every
// call with q_lens runs (launch_family checks it): q_len, no load.
template <bool kQueryLens = true>
__device__ __forceinline__ int sequence_q_len(const SplitParams &p, int64_t b) {
  if (!kQueryLens || p.q_lens == nullptr) return p.q_len;
  return min(max(__ldg(p.q_lens + b * p.q_lens_stride), 0), p.q_len);
}

// The position of query token `token` of a sequence of length len with
// q_len_b query tokens.
__device__ __forceinline__ int64_t query_position(int64_t len, int q_len_b, int token) { return len - q_len_b + token; }

// The first key any query token of the sequence sees: where its splits
// start (the window's start for the earliest token; 0 without a window;
// len without query tokens, which read nothing).
__device__ __forceinline__ int64_t first_key(const SplitParams &p, int64_t len, int q_len_b) {
  if (q_len_b == 0) return len;
  return p.window > 0 ? max(query_position(len, q_len_b, 0) - p.window + 1, int64_t{0}) : 0;
}

// A piece of work's tokens [begin, end) of a sequence of length `length`
// (clamped to [0, kv_capacity]). The sequence's query tokens are read again
// where a kernel needs them (sequence_q_len): carrying them in the piece
// made the 64-row kernel's code 6% longer.
struct TokenRange {
  int64_t begin;
  int64_t end;
  int64_t length;
};

// The tokens split `split` of sequence b reads: its share of split_tokens
// of the keys the sequence's queries see (from first_key: the window's
// start, else 0), cut at the sequence's length; empty when the sequence
// ends before it. kQueryLens: as sequence_q_len's.
template <bool kQueryLens = true>
__device__ __forceinline__ TokenRange split_range(const SplitParams &p, int64_t b, int split, int64_t split_tokens) {
  const int64_t len = sequence_length(p, b);
  const int q_len_b = sequence_q_len<kQueryLens>(p, b);
  const int64_t begin = min(len, first_key(p, len, q_len_b) + split * split_tokens);
  return {begin, min(len, begin + split_tokens), len};
}

// Keys [begin, end) of a sequence.
struct RowKeys {
  int64_t begin;
  int64_t end;
};

// The keys query token `token` of a sequence of length len with q_len_b
// query tokens sees (causal mask and window), as core/problem.h's
// query_keys: empty for a padding token (token >= q_len_b).
__device__ __forceinline__ RowKeys row_keys(const SplitParams &p, int64_t len, int q_len_b, int token) {
  if (token >= q_len_b) return {len, len};
  const int64_t pos_q = query_position(len, q_len_b, token);
  int64_t end = p.causal ? min(pos_q + 1, len) : len;
  end = max(end, int64_t{0});
  const int64_t begin = p.window > 0 ? max(pos_q - p.window + 1, int64_t{0}) : 0;
  return {min(begin, end), end};
}

// The softcap in base 2 (softcap2 = c * log2(e) for scores s2 = s * log2(e)):
// log2(e) * c * tanh(s / c) = c2 * tanh(s2 / c2), with
// tanh(y) = 1 - 2 / (exp(2y) + 1), exp(2y) = exp2(s2 * softcap_exp), softcap_exp = 2 log2(e) / c2.
// Its absolute error is a few float ulps of c2 (tanhf costs several times more).
__device__ __forceinline__ float softcapped(float s2, float softcap2, float softcap_exp) {
  return fmaf(-2.0f * softcap2, __fdividef(1.0f, exp2_ftz(s2 * softcap_exp) + 1.0f), softcap2);
}

// How one row scores the keys of one split under the variants (kernels
// built with kVariants): keys are numbered from the split's first token, in
// 32 bits (a split is shorter than 2^31 tokens, and so is any distance
// between positions).
struct RowScoring {
  int begin;          // first key the row sees, relative to the split (>= 0)
  int end;            // one past its last key, relative to the split (<= the split's length)
  int position;       // the row's query position, relative to the split
  float slope2;       // ALiBi slope * log2(e); 0 without ALiBi
  float softcap2;     // logit_softcap * log2(e); 0 without a softcap
  float softcap_exp;  // 2 * log2(e) / softcap2 (softcapped)

  // A base-2 score (softmax_scale * log2(e) * q.k) of key `key` after the
  // softcap and the ALiBi bias, unmasked.
  __device__ __forceinline__ float transform(float s2, int key) const {
    if (softcap2 > 0.0f) s2 = softcapped(s2, softcap2, softcap_exp);
    return slope2 != 0.0f ? fmaf(slope2, static_cast<float>(key - position), s2) : s2;
  }
  // Neither a softcap nor ALiBi: transform() only returns its score.
  __device__ __forceinline__ bool plain() const { return softcap2 <= 0.0f && slope2 == 0.0f; }
  __device__ __forceinline__ bool sees(int key) const { return key >= begin && key < end; }
  // transform() of a key the row sees, else -inf (masked).
  __device__ __forceinline__ float score(float s2, int key) const {
    return sees(key) ? transform(s2, key) : __int_as_float(0xff800000);
  }
};

// Scales and masks a warp's tile of scores: keys warp_key .. warp_key +
// kWarpTokens - 1 of the split, of which `remaining` (> 0) are in it.
// for_each_score(f) sets each of the warp's scores to f(score, r, column)
// (r: the thread's row, 0 or 1; column: the key - warp_key), one loop a kind
// of tile, so that each is straight-line code: a branch per score pair cost
// the rows kernels more than the scoring itself. With the variants a tile
// whose keys both rows see (all but the tiles at a mask's or window's edge)
// skips the per-key tests, and with neither a softcap nor ALiBi (a causal
// speculative step) is only scaled. Without them the keys past the split's
// end are masked: one loop for every tile, compared in 32 bits (a branch to
// an unmasked loop for whole tiles measured slower on short splits;
// tests/bench/policy.md, "Swizzled lane offsets").
template <bool kVariants, int kWarpTokens, class ForEachScore>
__device__ __forceinline__ void scale_and_mask_scores(const ForEachScore &for_each_score,
                                                      const RowScoring (&scoring)[2], float q_scale, int warp_key,
                                                      int64_t remaining) {
  if constexpr (kVariants) {
    const bool inside = warp_key >= max(scoring[0].begin, scoring[1].begin) &&
                        warp_key + kWarpTokens <= min(scoring[0].end, scoring[1].end);
    if (inside && scoring[0].plain() && scoring[1].plain()) {
      for_each_score([&](float score, int, int) { return score * q_scale; });
    } else if (inside) {
      for_each_score(
          [&](float score, int r, int column) { return scoring[r].transform(score * q_scale, warp_key + column); });
    } else {
      for_each_score(
          [&](float score, int r, int column) { return scoring[r].score(score * q_scale, warp_key + column); });
    }
  } else {
    const int keys_here = static_cast<int>(min(remaining, static_cast<int64_t>(kWarpTokens)));
    for_each_score(
        [&](float score, int, int column) { return column < keys_here ? score * q_scale : negative_infinity(); });
  }
}

// Row (token, q_head) of a sequence with q_len_b query tokens over the
// tokens of `range`. A padding token (row.token >= q_len_b) sees no key. A
// slot that holds no row of the problem (`real` false: an m-tile's slots
// past the chunk's rows) sees every key: its scores are never written, and
// a mask on it would keep the real rows sharing its warp tiles from the
// unmasked path.
__device__ __forceinline__ RowScoring row_scoring(const SplitParams &p, const TokenRange &range, int q_len_b,
                                                  QueryRow row, bool real = true) {
  constexpr float kLog2e = 1.4426950408889634f;
  const RowKeys keys = real ? row_keys(p, range.length, q_len_b, row.token) : RowKeys{range.begin, range.end};
  const int64_t split_tokens = range.end - range.begin;
  RowScoring r;
  r.begin = static_cast<int>(min(max(keys.begin - range.begin, int64_t{0}), split_tokens));
  r.end = static_cast<int>(min(max(keys.end - range.begin, int64_t{0}), split_tokens));
  r.position = static_cast<int>(query_position(range.length, q_len_b, row.token) - range.begin);
  r.slope2 = p.alibi_slopes != nullptr ? __ldg(p.alibi_slopes + row.q_head * p.alibi_stride) * kLog2e : 0.0f;
  r.softcap2 = p.softcap;
  r.softcap_exp = p.softcap > 0.0f ? 2.0f * kLog2e / p.softcap : 0.0f;
  return r;
}

}  // namespace cuda
}  // namespace fd
