// SPDX-License-Identifier: Apache-2.0
// Phase 1: one CTA per (chunk of a GQA group, KV head, split, sequence) runs
// the online softmax of the chunk's query heads over the split's tokens.
//
// Thread layout. A "row" of kLanes = bucket / 8 threads covers one query
// row's head_dim (a query token of a query head: prims/query_rows.cuh), 8
// elements per thread. The CTA's kRows rows are heads_per_cta row slots
// times token_groups groups of tokens: all row slots read the same K/V tile
// from shared memory, so each K/V byte leaves global memory once per KV head
// (or per chunk of its rows when it has more than kRows); the token groups
// split a tile's tokens when the rows are few (MHA with one query token).
//
// Per tile of kTileTokens tokens (cp.async, kStages deep), each row takes
// kTokensPerStep tokens at a time: kLanes-wide dot products reduce-scattered
// over the row's lanes (ScatteredDots: each lane scores one token), one
// rescale of the running state per step, then the value accumulation. At
// the end the token groups of a head are merged in a fixed order
// (deterministic), and the result goes either straight to out/lse (one
// split) or to the workspace as a partial state for the merge (fused: the
// last CTA of a unit merges it; see fused_merge.cuh).
#pragma once

#include <cstdint>
#include <type_traits>

#include "backend/cuda/kernels/fused_merge.cuh"
#include "backend/cuda/params.h"
#include "backend/cuda/prims/element.cuh"
#include "backend/cuda/prims/grid_dependency.cuh"
#include "backend/cuda/prims/load.cuh"
#include "backend/cuda/prims/quantized.cuh"
#include "backend/cuda/prims/query_rows.cuh"
#include "backend/cuda/prims/schedule.cuh"
#include "backend/cuda/prims/softmax.cuh"
#include "backend/cuda/prims/timeline.cuh"

namespace fd {
namespace cuda {

// T: the K/V storage type (uint8_t for 8-bit caches, whose stages end with
// the tile's per-token scales: K's, then V's).
template <class T, int Bucket>
struct SplitTraits {
  static constexpr int kBucket = Bucket;
  static constexpr int kLanes = kBucket / kVector;  // 8, 16, 32
  static constexpr int kThreads = kBucket == 256 ? 256 : 128;
  static constexpr int kRows = kThreads / kLanes;  // 16, 8, 8
  // Two tokens per step keep a float, head_dim-256 stage at 32 KiB.
  static constexpr int kTokensPerStep = (sizeof(T) == 4 && kBucket == 256) ? 2 : 4;
  static constexpr int kTileTokens = kRows * kTokensPerStep;
  static constexpr int kRowBytes = kBucket * static_cast<int>(sizeof(T));
  static constexpr bool kScales = sizeof(T) == 1;
  static constexpr int kScaleOffset = 2 * kTileTokens * kRowBytes;
  static constexpr int kStageBytes = kScaleOffset + (kScales ? 2 * kTileTokens * 4 : 0);
  static constexpr int kStages = 3;
  static constexpr int kPipelineBytes = kStages * kStageBytes;
  // After the pipeline drains, the same memory holds every row's state for
  // the merge of token groups.
  static constexpr int kCombineBytes = (2 * kRows + kRows * kBucket) * static_cast<int>(sizeof(float));
  static constexpr int kSmemBytes = kPipelineBytes > kCombineBytes ? kPipelineBytes : kCombineBytes;
  static constexpr int kSmemSlack = 0;  // of kSmemBytes, none spent on alignment
  // CTAs a multiprocessor holds (by shared memory: 4 x 48 KiB at 128
  // threads): stated so that ptxas budgets registers for that many and no
  // more (without it, it spilled).
  static constexpr int kMinBlocks = kThreads == 256 ? 2 : 4;
  // 96 KiB at most: fits one CTA on every targeted GPU (99 KiB on sm_86/89/120).
  static_assert(kSmemBytes <= 96 * 1024, "split kernel shared memory budget");
  static_assert(kLanes <= 32 && 32 % kLanes == 0, "a row lies within one warp");
};

// This thread's 8 query elements, times softmax_scale * log2(e); zeros for
// padding lanes and head slots beyond the group, so they add nothing.
template <class T>
__device__ void load_query(const SplitParams &p, int64_t b, QueryRow row, int lane, bool real, float (&q)[kVector]) {
#pragma unroll
  for (int i = 0; i < kVector; ++i) q[i] = 0.0f;
  if (!real) return;
  const T *src = static_cast<const T *>(p.q) + b * p.q_batch_stride + row.token * p.q_token_stride +
                 row.q_head * p.q_head_stride + lane * kVector;
#pragma unroll
  for (int i = 0; i < kVector; ++i) q[i] = Element<T>::to_float(src[i]) * p.q_scale;
}

// How a row's lanes share a step's kTokens dot products. Each lane starts
// with its partial sum of every token's; a reduce-scatter (each level keeps
// half the tokens and sends the other half to the partner lane kLanes / 2,
// kLanes / 4, ... away) and then a butterfly over the lanes left give each
// lane the whole dot of one token. The score's transform (softcap, ALiBi,
// masking) and its exponential then run once a token, not once a lane, and
// take fewer shuffles than an all-reduce of every token.
template <int kLanes, int kTokens>
struct ScatteredDots {
  static_assert(kTokens >= 1 && (kTokens & (kTokens - 1)) == 0 && kTokens <= kLanes, "tokens per step");

  // The token whose dot `lane` ends with.
  __device__ static int token_of(int lane) {
    int token = 0;
#pragma unroll
    for (int half = kTokens / 2, offset = kLanes / 2; half > 0; half /= 2, offset /= 2) {
      if (lane & offset) token += half;
    }
    return token;
  }

  // A lane (within the row) that ends with token `token`'s dot.
  __device__ static constexpr int owner(int token) {
    int lane = 0;
    for (int half = kTokens / 2, offset = kLanes / 2; half > 0; half /= 2, offset /= 2) {
      if (token & half) lane += offset;
    }
    return lane;
  }

  // dots: this lane's partial sums (overwritten); returns the whole dot of
  // token_of(lane), the same in every lane that holds that token.
  __device__ static float reduce(float (&dots)[kTokens], int lane) {
#pragma unroll
    for (int count = kTokens, offset = kLanes / 2; count > 1; count /= 2, offset /= 2) {
      const bool upper = (lane & offset) != 0;
#pragma unroll
      for (int j = 0; j < count / 2; ++j) {
        const float keep = upper ? dots[j + count / 2] : dots[j];
        const float send = upper ? dots[j] : dots[j + count / 2];
        dots[j] = keep + __shfl_xor_sync(0xffffffffu, send, offset, kLanes);
      }
    }
    float dot = dots[0];
#pragma unroll
    for (int offset = kLanes / (2 * kTokens); offset > 0; offset /= 2) {
      dot += __shfl_xor_sync(0xffffffffu, dot, offset, kLanes);
    }
    return dot;
  }

  // The largest of the kTokens values the row's lanes hold (NaN wins).
  __device__ static float max(float value) {
#pragma unroll
    for (int offset = kLanes / 2; offset >= kLanes / kTokens; offset /= 2) {
      value = max_nan(value, __shfl_xor_sync(0xffffffffu, value, offset, kLanes));
    }
    return value;
  }
};

// One row's part of a tile: `steps` steps of kTokensPerStep tokens starting
// at tile row first_token. Every lane of a warp runs the same number of steps
// (the shuffles need the whole warp); tokens at or past `end` are masked, and
// with kVariants the row's scoring decides (tile_key: the tile's first token
// relative to the split).
// 8-bit caches (T = uint8_t, kv_format): per-token scales come from the
// stage (with_*_scales), others were folded into q and are applied to the
// result by the caller.
template <class T, class Traits, bool kVariants, int kFormat>
__device__ void attend_tile(const unsigned char *stage, const float (&q)[kVector], SoftmaxState &state, int lane,
                            int first_token, int steps, int64_t tile_begin, int64_t end, int tile_key,
                            const RowScoring &scoring, bool with_k_scales, bool with_v_scales) {
  using Dots = ScatteredDots<Traits::kLanes, Traits::kTokensPerStep>;
  const T *k_rows = reinterpret_cast<const T *>(stage);
  const T *v_rows = reinterpret_cast<const T *>(stage + Traits::kTileTokens * Traits::kRowBytes);
  [[maybe_unused]] const float *k_scales = reinterpret_cast<const float *>(stage + Traits::kScaleOffset);
  [[maybe_unused]] const float *v_scales = k_scales + Traits::kTileTokens;
  const int my_token = Dots::token_of(lane);
  for (int step = 0; step < steps; ++step) {
    const int t0 = first_token + step * Traits::kTokensPerStep;
    float dots[Traits::kTokensPerStep];
#pragma unroll
    for (int i = 0; i < Traits::kTokensPerStep; ++i) {
      float k[kVector];
      if constexpr (Traits::kScales) {
        dequantize8<kFormat>(k_rows + (t0 + i) * Traits::kBucket + lane * kVector, k);
      } else {
        Element<T>::to_float8(k_rows + (t0 + i) * Traits::kBucket + lane * kVector, k);
      }
      dots[i] = 0.0f;
#pragma unroll
      for (int j = 0; j < kVector; ++j) dots[i] = fmaf(q[j], k[j], dots[i]);
    }
    const int t = t0 + my_token;
    float dot = Dots::reduce(dots, lane);
    if constexpr (Traits::kScales) {
      if (with_k_scales) dot *= k_scales[t];
    }
    float score;
    if constexpr (kVariants) {
      score = scoring.score(dot, tile_key + t);
    } else {
      score = tile_begin + t < end ? dot : negative_infinity();
    }
    const bool live = state.rescale(Dots::max(score));
    // Every lane shuffles (the row's lanes agree on live, the warp's rows
    // need not); without a finite max the weights are unused.
    const float mine = state.weight(score);
    float weight[Traits::kTokensPerStep];
#pragma unroll
    for (int i = 0; i < Traits::kTokensPerStep; ++i) {
      weight[i] = __shfl_sync(0xffffffffu, mine, Dots::owner(i), Traits::kLanes);
    }
    if (!live) continue;
#pragma unroll
    for (int i = 0; i < Traits::kTokensPerStep; ++i) {
      float v[kVector];
      if constexpr (Traits::kScales) {
        dequantize8<kFormat>(v_rows + (t0 + i) * Traits::kBucket + lane * kVector, v);
        state.add_scaled(weight[i], with_v_scales ? weight[i] * v_scales[t0 + i] : weight[i], v);
      } else {
        Element<T>::to_float8(v_rows + (t0 + i) * Traits::kBucket + lane * kVector, v);
        state.add(weight[i], v);  // masked tokens: weight 0, and their V is zero-filled
      }
    }
  }
}

// kVariants: scores go through the attention variants (RowScoring); a
// template parameter so that plain decode keeps its code. kQuantized: K/V
// are an 8-bit cache (T is q's type).
template <class T, int kBucket, bool kVariants, bool kQuantized = false>
__global__ void __launch_bounds__(SplitTraits<std::conditional_t<kQuantized, uint8_t, T>, kBucket>::kThreads,
                                  SplitTraits<std::conditional_t<kQuantized, uint8_t, T>, kBucket>::kMinBlocks)
    split_kernel(const SplitParams p) {
  using KV = std::conditional_t<kQuantized, uint8_t, T>;
  using Traits = SplitTraits<KV, kBucket>;
  extern __shared__ __align__(16) unsigned char smem[];
  FD_TIMELINE_BEGIN(timeline);
  split_kernel_prologue();
  FD_TIMELINE_MARK(timeline, 1);

  const int lane = threadIdx.x % Traits::kLanes;
  const int row = threadIdx.x / Traits::kLanes;
  const int heads_per_cta = p.heads_per_cta;  // a power of two <= kRows
  const int head_slot = row % heads_per_cta;
  const int token_group = row / heads_per_cta;
  const int token_groups = Traits::kRows / heads_per_cta;
  const int tokens_per_group = Traits::kTileTokens / token_groups;

  const bool lane_real = lane * kVector < p.head_dim;

  // The CTA's pieces of work (prims/schedule.cuh).
  for_each_piece<Traits::kTileTokens>(p, [&](const Piece &piece) {
    const int64_t b = piece.b;
    const int kv_head = piece.kv_head;
    const int chunk = piece.chunk;
    const int row_in_kv_head = chunk * p.heads_per_chunk + head_slot;
    const bool head_real = head_slot < p.heads_per_chunk && row_in_kv_head < p.kv_rows;
    const QueryRow query = query_row(row_in_kv_head, p.group_size, kv_head);
    const TokenRange range = piece.range;
    const int64_t begin = range.begin;
    const int64_t end = range.end;

    const int q_len_b = sequence_q_len<kVariants>(p, b);
    RowScoring scoring{};
    if constexpr (kVariants) scoring = row_scoring(p, range, q_len_b, query, head_real);
    float q[kVector];
    load_query<T>(p, b, query, lane, head_real && lane_real && query.token < q_len_b, q);
    SoftmaxState state;
    state.reset();
    // 8-bit caches: scales that do not vary by token fold into q (K) and
    // the result (V).
    float value_scale = 1.0f;
    if constexpr (kQuantized) {
      const bool paged = p.block_table != nullptr;
      const float key_scale = sequence_scale(p.k_scale, p.k_scale_strides, p.k_scale_per_token, paged, b, kv_head);
#pragma unroll
      for (int i = 0; i < kVector; ++i) q[i] *= key_scale;
      value_scale = sequence_scale(p.v_scale, p.v_scale_strides, p.v_scale_per_token, paged, b, kv_head);
    }

    if (begin < end) {  // the same for the whole CTA
      const int64_t tiles = (end - begin + Traits::kTileTokens - 1) / Traits::kTileTokens;
      auto load = [&](int64_t tile) {
        load_kv_tile<KV, Traits>(p, smem + (tile % Traits::kStages) * Traits::kStageBytes, b, kv_head,
                                 begin + tile * Traits::kTileTokens, end);
      };
#pragma unroll
      for (int s = 0; s < Traits::kStages - 1; ++s) {
        if (s < tiles) load(s);
        cp_async_commit();  // empty groups too: the wait below counts groups
      }
      for (int64_t tile = 0; tile < tiles; ++tile) {
        cp_async_wait<Traits::kStages - 2>();  // this thread's copies of `tile` have landed
        __syncthreads();                       // everyone's have; and everyone is done with tile - 1
        FD_TIMELINE_MARK_IF(timeline, 2, tile == 0);
        if (tile + Traits::kStages - 1 < tiles) load(tile + Traits::kStages - 1);  // into tile - 1's stage
        cp_async_commit();
        const auto attend = [&](auto format) {
          attend_tile<KV, Traits, kVariants, decltype(format)::value>(
              smem + (tile % Traits::kStages) * Traits::kStageBytes, q, state, lane, token_group * tokens_per_group,
              heads_per_cta, begin + tile * Traits::kTileTokens, end, static_cast<int>(tile * Traits::kTileTokens),
              scoring, p.k_scale_per_token, p.v_scale_per_token);
        };
        // 8-bit caches: the format is chosen once a tile, not once an element.
        if constexpr (kQuantized) {
          if (p.kv_format == FD_DTYPE_E5M2) {
            attend(std::integral_constant<int, FD_DTYPE_E5M2>{});
          } else if (p.kv_format == FD_DTYPE_I8) {
            attend(std::integral_constant<int, FD_DTYPE_I8>{});
          } else {
            attend(std::integral_constant<int, FD_DTYPE_E4M3>{});
          }
        } else {
          attend(std::integral_constant<int, 0>{});
        }
      }
      cp_async_wait<0>();
      __syncthreads();  // the pipeline memory is free for the combine below
      FD_TIMELINE_MARK(timeline, 3);
    }

    if constexpr (kQuantized) {
#pragma unroll
      for (int i = 0; i < kVector; ++i) state.acc[i] *= value_scale;
    }

    // Merge the token groups of each head slot, in group order.
    if (token_groups > 1) {
      float *part_m = reinterpret_cast<float *>(smem);
      float *part_l = part_m + Traits::kRows;
      float *part_acc = part_l + Traits::kRows;
      if (lane == 0) {
        part_m[row] = state.m;
        part_l[row] = state.l;
      }
      float4 *mine = reinterpret_cast<float4 *>(part_acc + row * kBucket + lane * kVector);
      mine[0] = make_float4(state.acc[0], state.acc[1], state.acc[2], state.acc[3]);
      mine[1] = make_float4(state.acc[4], state.acc[5], state.acc[6], state.acc[7]);
      __syncthreads();
      if (token_group == 0) {
        float m_max = negative_infinity();
        for (int g = 0; g < token_groups; ++g) m_max = max_nan(m_max, part_m[g * heads_per_cta + head_slot]);
        state.reset();
        if (m_max != negative_infinity()) {
          state.m = m_max;
          for (int g = 0; g < token_groups; ++g) {
            const int r = g * heads_per_cta + head_slot;
            const float w = merge_weight(part_m[r], m_max);
            state.l = fmaf(w, part_l[r], state.l);
            const float *acc = part_acc + r * kBucket + lane * kVector;
#pragma unroll
            for (int i = 0; i < kVector; ++i) state.acc[i] = fmaf(w, acc[i], state.acc[i]);
          }
        }
      }
    }

    if (token_group == 0 && head_real && lane_real) {
      if (piece_writes_output(p, piece)) {
        if (p.out_f32) {
          write_output<float>(p.output, b, query.token, query.q_head, lane * kVector, state.acc, state.m, state.l,
                              lane == 0);
        } else {
          write_output<T>(p.output, b, query.token, query.q_head, lane * kVector, state.acc, state.m, state.l,
                          lane == 0);
        }
      } else {
        const int64_t index = partial_state_index(p, piece, row_in_kv_head - chunk * p.heads_per_chunk);
        if (lane == 0) {
          p.m[index] = state.m;
          p.l[index] = state.l;
        }
        float4 *acc = reinterpret_cast<float4 *>(p.acc + index * p.head_dim + lane * kVector);
        acc[0] = make_float4(state.acc[0], state.acc[1], state.acc[2], state.acc[3]);
        acc[1] = make_float4(state.acc[4], state.acc[5], state.acc[6], state.acc[7]);
      }
    }
    FD_TIMELINE_MARK(timeline, 4);
    if (p.balanced_workers > 0 ? merge_pieces_if_last<T, Traits::kThreads, true, 1>(p, piece)
                               : fused_merge_if_last<T, Traits::kThreads, true>(p, b, kv_head, chunk, smem)) {
      FD_TIMELINE_MERGED(timeline);
    }
    __syncthreads();  // shared memory is reused by the next piece
  });
  FD_TIMELINE_END(timeline, "cuda-core", p.q);
}

}  // namespace cuda
}  // namespace fd
