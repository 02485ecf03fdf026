// SPDX-License-Identifier: Apache-2.0
// Phase 1 on tensor cores for 8-bit caches with up to 8 query rows a KV
// head (q_len x group: one token of a GQA group up to 8, MHA, short
// speculative steps): the keys on the MMA's M dimension and the query
// rows on its N (8), transposed against
// split_tensor_core.cuh:
//   S^T[token, row] = K[token, :] . Q[row, :]   (A = K dequantized from ldmatrix, B = Q^T from registers)
//   O^T[d, row]    += V^T[d, token] P^T[token, row]
//                                      (A = V^T dequantized from ldmatrix.trans,
//                                       B = P^T: the S^T accumulators rounded to
//                                       16 bits and transposed by movmatrix)
// A row slot is an N column of 8, not an M row of 16, so a group of up to
// 8 fills the MMA where the 16-bit layout leaves half of it (or more)
// empty: half the MMAs a tile, half the accumulator registers (O^T holds
// head_dim x 8 floats a warp), and the query's fragments stay in registers
// for the whole split: a shorter chain of dependent steps a warp tile,
// which bounds the 16-row 8-bit kernel (tests/bench/policy.md, "Keys on M
// for 8-bit caches").
//
// Shared with that kernel (MmaTraits with Quantized and token warps):
// TileLoader, warps each on its own tokens of a tile (8; 4 at head_dim 256), the per-sequence scales folded into
// q's scale and the accumulator, per-token scales copied with each tile,
// the token groups' combine and the merges (write_token_groups,
// merge_piece). Its stages are its own (KeysTraits), and so are its
// load groups: each warp copies the rows it reads, and the loop
// synchronises a warp with itself only.
//
// The k index of S^T's k-steps follows d as quant_key_fragments orders it:
// lane (g, q) gets key g's bytes 4q .. 4q + 3 of a 16-byte chunk, the k
// indices 2q, 2q + 1, 2q + 8, 2q + 9; the query's B fragments take Q's
// d in the same order. O^T's M rows follow d as quant_value_fragments
// orders V's columns: of each 16, row g is d 2g and row g + 8 is d 2g + 1.
#pragma once

#include <cstdint>
#include <type_traits>

#include "backend/cuda/kernels/split_tensor_core.cuh"

namespace fd {
namespace cuda {

// The 8-bit traits with token warps (loader; 8 warps, 4 at head_dim 256,
// whose accumulators take twice the registers) and 8 row slots, a
// CTA taking one chunk of up to 8 rows of a KV head, and stages of their
// own: rows unpadded, their 16-byte chunks XOR-swizzled (swizzle_key) so
// that an ldmatrix's 8 rows still fall on different banks: faster than
// the 16-row kernel's rows padded by 16 bytes; three stages instead of
// two measured no faster, three CTAs a multiprocessor (80 registers,
// spilling) slower (tests/bench/policy.md, "8-bit caches: what a call
// costs besides its bytes"). Its shared memory is the
// pipeline and the table ring, or the token groups' combine: the query
// waits in the last stage, then in registers.
template <class T, int Bucket, int Stages = 2>
struct KeysTraits : MmaTraits<T, Bucket, MmaTiles::standard, true, 1, 1, true> {
  using Base = MmaTraits<T, Bucket, MmaTiles::standard, true, 1, 1, true>;
  static constexpr int kHeads = 8;  // row slots: the MMA's N
  static constexpr int kRows = kHeads;
  static constexpr int kKeyTiles = Base::kWarpTokens / 16;  // m-tiles of S^T (and k-steps of P V) a warp
  static constexpr int kValueTiles = Bucket / 16;           // m-tiles of O^T
  static constexpr int kRowStride = Base::kRowBytes;        // unpadded
  static constexpr int kScaleOffset = 2 * Base::kTileTokens * kRowStride;
  static constexpr int kStageBytes = kScaleOffset + 2 * Base::kTileTokens * 4;
  static constexpr int kStages = Stages;
  static constexpr int kPipelineBytes = kStages * kStageBytes;
  static constexpr bool kSpreadScales = true;  // the registers allow it at head_dim 128 too
  // Each warp copies the rows it reads (its kWarpTokens of every tile), so
  // a warp waits for its own copies and refills a stage once it is done
  // with it, not for the CTA's slowest warp (TileLoader's load groups).
  static constexpr int kLoadGroups = Base::kTokenGroups;
  static constexpr int kLoadGroupTokens = Base::kWarpTokens;
  static constexpr int kTableBytes = table_ring_bytes(Base::kTableSlots, kLoadGroups, kLoadGroupTokens);
  static constexpr int kCombineBytes = token_group_parts_bytes(Base::kTokenGroups, kRows, Bucket);
  static constexpr int kLoopBytes = kPipelineBytes + kTableBytes;
  static constexpr int kSmemBytes = kLoopBytes > kCombineBytes ? kLoopBytes : kCombineBytes;
  // The XOR of a row's chunks: 8 rows of 128 or 256 bytes, or 4 pairs of
  // 64-byte rows, cover all banks once for every chunk column.
  __device__ static int swizzle_key(int row) { return Base::kChunksPerRow >= 8 ? row & 7 : (row >> 1) & 3; }
  __device__ static int stage_offset(int row, int chunk) {
    return row * kRowStride + (chunk ^ swizzle_key(row)) * kChunkBytes;
  }
  static_assert(Base::kTokenWarps && Base::kDSplits == 1 && Base::kTokenGroups * 32 == Base::kThreads,
                "every warp its own tokens and all of head_dim");
  static_assert(Base::kWarpTokens % 16 == 0 && kValueTiles % 2 == 0 && Base::kDSteps % 2 == 0,
                "x4 ldmatrix covers 16 tokens x two k-steps, or two m-tiles of O^T");
  static_assert(Base::kChunksPerRow % 8 == 0 || Base::kChunksPerRow == 4, "the swizzle takes 64-byte rows and wider");
  static_assert(kRows * Base::kQueryRowBytes <= kStageBytes, "the query tile is staged in one pipeline stage");
  static_assert(Base::kTableSlots > kStages, "a table slot is refilled only after its tile's copies were issued");
  static_assert(kSmemBytes * Base::kMinBlocks <= 226 * 1024, "the CTAs a multiprocessor fit its shared memory");
};

// movmatrix: the 8x8 16-bit matrix whose fragment (row lane / 4, columns
// 2 (lane % 4) and + 1) is x, transposed, as the same fragment.
__device__ __forceinline__ uint32_t transpose_8x8(uint32_t x) {
  uint32_t y;
  asm("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(y) : "r"(x));
  return y;
}

// One warp's kWarpTokens tokens of a tile, starting at stage row row0
// (global token warp_begin): S^T on tensor cores, online softmax of this
// lane's two rows (2q and 2q + 1: accumulator elements 0, 2 and 1, 3),
// O^T += V^T P^T. kVariants, key_scales, value_scales as attend_tile_mma.
// value_unit: per-token value scales fold into P, kept in units of
// value_unit, the largest |scale| the warp has seen (O^T holds the sum
// over value_unit; multiplying each value by its scale in float measured
// slower, history run 42).
template <class T, class Traits, bool kVariants, int kFormat>
__device__ __forceinline__ void attend_keys_tile(const unsigned char *stage, int row0, int64_t warp_begin, int64_t end,
                                                 const uint32_t (&qf)[Traits::kDSteps][2],
                                                 float (&o)[Traits::kValueTiles][4], float (&m)[2], float (&l)[2],
                                                 float q_scale, int warp_key, const RowScoring (&scoring)[2],
                                                 const float *key_scales, const float *value_scales,
                                                 float &value_unit) {
  const unsigned char *k_tile = stage;
  const unsigned char *v_tile = stage + Traits::kTileTokens * Traits::kRowStride;
  const int lane = threadIdx.x % 32;
  const int g = lane >> 2;
  // ldmatrix x4: lanes 0-7 address matrix 0 (tokens 0-7 of 16, first
  // chunk), 8-15 matrix 1 (tokens 8-15), 16-23 and 24-31 the next chunk.
  const int lane_row = ((lane >> 3) & 1) * 8 + (lane & 7);
  const int lane_chunk = lane >> 4;
  // Stage rows start every 16 tokens at a multiple of 16: a lane's rows
  // keep its swizzle key, and chunk c of them is at (c ^ key) x 16.
  const int key = Traits::swizzle_key(lane_row);
  const auto chunk_at = [&](int c) { return ((c + lane_chunk) ^ key) * kChunkBytes; };

  // S^T over every k-step of the bucket (chunks past head_dim are zeros in
  // the stage and in q), in two chains of dependent MMAs where there are 8
  // k-steps.
  constexpr int kChains = Traits::kDSteps >= 8 ? 2 : 1;
  float s[Traits::kKeyTiles][4];
#pragma unroll
  for (int kt = 0; kt < Traits::kKeyTiles; ++kt) {
    float chain[kChains][4] = {};
    const unsigned char *rows = k_tile + (row0 + kt * 16 + lane_row) * Traits::kRowStride;
#pragma unroll
    for (int j2 = 0; j2 < Traits::kDSteps / 2; ++j2) {
      uint32_t raw[4];  // tokens 0-7 and 8-15 of k-step 2 j2, then of 2 j2 + 1
      ldmatrix_x4(raw, rows + chunk_at(2 * j2));
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const uint32_t a[4] = {
            dequantize_pair_as<T, kFormat>(raw[2 * h], 0), dequantize_pair_as<T, kFormat>(raw[2 * h + 1], 0),
            dequantize_pair_as<T, kFormat>(raw[2 * h], 1), dequantize_pair_as<T, kFormat>(raw[2 * h + 1], 1)};
        const int kk = 2 * j2 + h;
        Mma<T>::run(chain[kk % kChains], a, qf[kk][0], qf[kk][1]);
      }
    }
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      float sum = chain[0][e];
#pragma unroll
      for (int c = 1; c < kChains; ++c) sum += chain[c][e];
      s[kt][e] = sum;
    }
  }
  // Per-token key scales: q . (k x scale) = (q . k) x scale; elements 0, 1
  // are key g of the m-tile, 2, 3 key g + 8.
  if (key_scales != nullptr) {
#pragma unroll
    for (int kt = 0; kt < Traits::kKeyTiles; ++kt) {
      const float low = key_scales[row0 + kt * 16 + g];
      const float high = key_scales[row0 + kt * 16 + g + 8];
      s[kt][0] *= low;
      s[kt][1] *= low;
      s[kt][2] *= high;
      s[kt][3] *= high;
    }
  }

  // Scale and mask (scale_and_mask_scores; element e: row e & 1 of the
  // lane's two, key 8 (e >> 1) + g of the m-tile).
  const auto for_each_score = [&](auto &&score_of) {
#pragma unroll
    for (int kt = 0; kt < Traits::kKeyTiles; ++kt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) s[kt][e] = score_of(s[kt][e], e & 1, kt * 16 + (e >> 1) * 8 + g);
    }
  };
  scale_and_mask_scores<kVariants, Traits::kWarpTokens>(for_each_score, scoring, q_scale, warp_key, end - warp_begin);

  // A row's keys are spread over the 8 lanes of its q: their maximum by
  // three shuffles.
  float block_max[2] = {negative_infinity(), negative_infinity()};
#pragma unroll
  for (int kt = 0; kt < Traits::kKeyTiles; ++kt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) block_max[e & 1] = max_nan(block_max[e & 1], s[kt][e]);
  }
  float p_base[2], alpha[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
#pragma unroll
    for (int offset = 4; offset < 32; offset *= 2) {
      block_max[r] = max_nan(block_max[r], __shfl_xor_sync(0xffffffffu, block_max[r], offset));
    }
    const float m_new = max_nan(m[r], block_max[r]);
    const float base = m_new == negative_infinity() ? 0.0f : m_new;  // nothing seen yet: all weights 0
    alpha[r] = exp2_ftz(m[r] - base);                                // 0 when m was -inf
    p_base[r] = base - Traits::kProbabilityShift;
    m[r] = m_new;
    l[r] *= alpha[r];
  }
  // Most tiles of a long split leave every alpha at exactly 1 (as attend_tile_mma).
  if (!__all_sync(0xffffffffu, alpha[0] == 1.0f && alpha[1] == 1.0f)) {
#pragma unroll
    for (int t = 0; t < Traits::kValueTiles; ++t) {
      o[t][0] *= alpha[0];
      o[t][1] *= alpha[1];
      o[t][2] *= alpha[0];
      o[t][3] *= alpha[1];
    }
  }
#pragma unroll
  for (int kt = 0; kt < Traits::kKeyTiles; ++kt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      s[kt][e] = exp2_ftz(s[kt][e] - p_base[e & 1]);
      l[e & 1] += s[kt][e];
    }
  }

  // O^T += V^T P^T, a k-step per m-tile of S^T. P^T's B fragment (keys 2q,
  // 2q + 1 and 2q + 8, 2q + 9 of row g) is S^T's (key g and g + 8 of rows
  // 2q, 2q + 1) transposed. The stored values are multiplied in fp16
  // whatever q's type (as attend_tile_mma): scales come after, or in P.
  const auto accumulate_values = [&]() {
    using PvType = __half;
#pragma unroll
    for (int kt = 0; kt < Traits::kKeyTiles; ++kt) {
      const uint32_t b0 = transpose_8x8(Mma<PvType>::pack(s[kt][0], s[kt][1]));
      const uint32_t b1 = transpose_8x8(Mma<PvType>::pack(s[kt][2], s[kt][3]));
      const int key0 = row0 + kt * 16;
      const unsigned char *rows = v_tile + (key0 + lane_row) * Traits::kRowStride;
#pragma unroll
      for (int c = 0; c < Traits::kValueTiles / 2; ++c) {  // no branch on head_dim: V past it is zeros
        uint32_t raw[4];  // transposed: keys 2q, 2q + 1 of byte columns 2g, 2g + 1; matrices as for K
        ldmatrix_x4_trans(raw, rows + chunk_at(2 * c));
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          uint32_t a[4];
#pragma unroll
          for (int t = 0; t < 2; ++t) {  // keys 2q, 2q + 1, then 8 + 2q, 8 + 2q + 1
            const uint32_t by_column = __byte_perm(raw[2 * h + t], 0u, 0x3120u);  // column 2g low, 2g + 1 high
#pragma unroll
            for (int e = 0; e < 2; ++e) {  // M row g + 8 e: d 2g + e
              a[2 * t + e] = dequantize_pair_as<PvType, kFormat>(by_column, e);
            }
          }
          Mma<PvType>::run(o[2 * c + h], a, b0, b1);
        }
      }
    }
  };
  if (value_scales == nullptr) {
    accumulate_values();
  } else {
    // P x scale / value_unit (at most P) keys g and g + 8 of each m-tile
    // hold, and value_unit raised to the tile's largest |scale| first
    // (O^T shrunk to match), so P stays within fp16 and the stored values
    // multiply unscaled.
    float scale[Traits::kKeyTiles][2];
    float largest = 0.0f;
#pragma unroll
    for (int kt = 0; kt < Traits::kKeyTiles; ++kt) {
      scale[kt][0] = value_scales[row0 + kt * 16 + g];
      scale[kt][1] = value_scales[row0 + kt * 16 + g + 8];
      largest = fmaxf(largest, fmaxf(fabsf(scale[kt][0]), fabsf(scale[kt][1])));
    }
#pragma unroll
    for (int offset = 4; offset < 32; offset *= 2) {
      largest = fmaxf(largest, __shfl_xor_sync(0xffffffffu, largest, offset));
    }
    if (largest > value_unit) {  // warp-uniform; rare once the first tiles are in
      const float shrink = value_unit / largest;
#pragma unroll
      for (int t = 0; t < Traits::kValueTiles; ++t) {
#pragma unroll
        for (int e = 0; e < 4; ++e) o[t][e] *= shrink;
      }
      value_unit = largest;
    }
    const float inverse = value_unit > 0.0f ? 1.0f / value_unit : 0.0f;
#pragma unroll
    for (int kt = 0; kt < Traits::kKeyTiles; ++kt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) s[kt][e] *= scale[kt][e >> 1] * inverse;
    }
    accumulate_values();
  }
}

// kSchedule: the pieces it takes (prims/schedule.cuh; walked or planned,
// no cluster merge). kVariants: scores go through the attention variants.
// kFormat: the cache's 8-bit fd_dtype (a kernel per format, as
// mma_split_kernel's). Traits: KeysTraits of the tile shape the family builds.
template <class T, int kBucket, SplitSchedule kSchedule, bool kVariants, int kFormat, class Traits>
__global__ void __launch_bounds__(Traits::kThreads, Traits::kMinBlocks) mma_keys_split_kernel(const SplitParams p) {
  static_assert(Traits::kBucket == kBucket, "the traits' bucket");
  static_assert(kFormat == FD_DTYPE_E4M3 || kFormat == FD_DTYPE_E5M2 || kFormat == FD_DTYPE_I8, "an 8-bit format");
  static_assert(kSchedule != SplitSchedule::cluster, "no cluster merge for the 8-bit keys kernel");
  extern __shared__ __align__(16) unsigned char smem[];
  FD_TIMELINE_BEGIN(timeline);
  split_kernel_prologue();
  FD_TIMELINE_MARK(timeline, 1);

  const int warp = threadIdx.x / 32;  // its token group
  const int lane = threadIdx.x % 32;
  const int g = lane >> 2;  // the query row of this lane's B fragments
  const int q = lane & 3;   // this lane's accumulator rows: 2q and 2q + 1
  // The query tile's staging area: the last pipeline stage.
  unsigned char *q_stage = smem + (Traits::kStages - 1) * Traits::kStageBytes;

  for_each_piece<Traits::kTileTokens, kSchedule>(p, [&](const Piece &piece) {
    const int64_t b = piece.b;
    const int kv_head = piece.kv_head;
    const int first_row = piece.chunk * p.heads_per_chunk;  // within the KV head's rows
    const int heads_here = min(p.heads_per_chunk, p.kv_rows - first_row);
    const TokenRange range = piece.range;
    const int64_t begin = range.begin;
    const int64_t end = range.end;
    const TileLoader<Traits> loader(p, b, kv_head, reinterpret_cast<int32_t *>(smem + Traits::kPipelineBytes));

    const int64_t tiles = loader.start(smem, begin, end);

    const int q_len_b = sequence_q_len<kVariants>(p, b);
    RowScoring scoring[2] = {};
    if constexpr (kVariants) {
      for (int r = 0; r < 2; ++r) {
        const int row = 2 * q + r;
        scoring[r] =
            row_scoring(p, range, q_len_b, query_row(first_row + row, p.group_size, kv_head), row < heads_here);
      }
    }

    // The query tile [8 row slots, bucket], rows in order, zeros past the
    // chunk's rows, the padding tokens and head_dim; then each lane's B
    // fragments of Q^T: row g's d 16 kk + 4q .. + 3.
    stage_query_rows<T, Traits::kRows, Traits::kQueryRowBytes, Traits::kThreads>(
        p, b, kv_head, first_row, heads_here, q_len_b, q_stage,
        [](int row, int column) { return row * Traits::kQueryRowBytes + column * kChunkBytes; });
    __syncthreads();
    uint32_t qf[Traits::kDSteps][2];
#pragma unroll
    for (int kk = 0; kk < Traits::kDSteps; ++kk) {
      const uint2 pairs = *reinterpret_cast<const uint2 *>(q_stage + g * Traits::kQueryRowBytes +
                                                           (kk * 16 + 4 * q) * static_cast<int>(sizeof(T)));
      qf[kk][0] = pairs.x;
      qf[kk][1] = pairs.y;
    }
    __syncthreads();  // every warp has its query fragments: the last stage takes a tile
    if (Traits::kStages - 1 < tiles) {
      const int last = Traits::kStages - 1;
      loader.load(smem + last * Traits::kStageBytes, begin, last, end);
    }
    cp_async_commit();

    float o[Traits::kValueTiles][4];
#pragma unroll
    for (int t = 0; t < Traits::kValueTiles; ++t) o[t][0] = o[t][1] = o[t][2] = o[t][3] = 0.0f;
    float m[2] = {negative_infinity(), negative_infinity()};
    float l[2] = {0.0f, 0.0f};

    // Scales that do not vary by token fold into q's scale (K) and the
    // accumulator (V); per-token ones come with each tile.
    const bool paged = p.block_table != nullptr;
    const float q_scale =
        p.q_scale * sequence_scale(p.k_scale, p.k_scale_strides, p.k_scale_per_token, paged, b, kv_head);
    const float value_scale = sequence_scale(p.v_scale, p.v_scale_strides, p.v_scale_per_token, paged, b, kv_head);
    float value_unit = p.v_scale_per_token ? 0.0f : 1.0f;  // attend_keys_tile

    int stage = 0;
    for (int64_t tile = 0; tile < tiles; ++tile) {
      cp_async_wait<Traits::kStages - 1>();  // this thread's copies of `tile` have landed
      __syncwarp();                          // the warp's have: its rows are its own (kLoadGroups)
      FD_TIMELINE_MARK_IF(timeline, 2, tile == 0);
      const int64_t warp_begin = begin + tile * Traits::kTileTokens + warp * Traits::kWarpTokens;
      if (warp_begin < end) {  // warp-uniform
        const unsigned char *loaded = smem + stage * Traits::kStageBytes;
        const float *tile_scales = reinterpret_cast<const float *>(loaded + Traits::kScaleOffset);
        attend_keys_tile<T, Traits, kVariants, kFormat>(
            loaded, warp * Traits::kWarpTokens, warp_begin, end, qf, o, m, l, q_scale,
            static_cast<int>(warp_begin - begin), scoring, p.k_scale_per_token ? tile_scales : nullptr,
            p.v_scale_per_token ? tile_scales + Traits::kTileTokens : nullptr, value_unit);
      }
      __syncwarp();  // the warp is done with its rows of this stage: they take tile + kStages
      if (tile + Traits::kStages < tiles) {
        loader.load(smem + stage * Traits::kStageBytes, begin, tile + Traits::kStages, end);
      }
      cp_async_commit();
      stage = stage + 1 == Traits::kStages ? 0 : stage + 1;
    }
    cp_async_wait<0>();
    __syncthreads();  // the pipeline memory is free for the combine below
    FD_TIMELINE_MARK(timeline, 3);

    // A row's l is spread over the 8 lanes of its q.
#pragma unroll
    for (int r = 0; r < 2; ++r) {
#pragma unroll
      for (int offset = 4; offset < 32; offset *= 2) l[r] += __shfl_xor_sync(0xffffffffu, l[r], offset);
    }
    const TokenGroupParts<Traits> parts(smem);
    const int slot = warp * Traits::kRows + 2 * q;  // this lane's first row in the parts
    if (g == 0) {
      parts.m[slot] = m[0];
      parts.m[slot + 1] = m[1];
      parts.l[slot] = l[0];
      parts.l[slot + 1] = l[1];
    }
    // O^T's element pairs (0, 2) and (1, 3) are d 2g and 2g + 1 of rows 2q and 2q + 1.
    const float output_scale = value_scale * value_unit;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      if (2 * q + r < heads_here) {
#pragma unroll
        for (int t = 0; t < Traits::kValueTiles; ++t) {
          *reinterpret_cast<float2 *>(parts.o_row(slot + r) + t * 16 + 2 * g) =
              make_float2(o[t][r] * output_scale, o[t][2 + r] * output_scale);
        }
      }
    }
    __syncthreads();
    write_token_groups<T, Traits, kSchedule>(p, piece, b, kv_head, parts, smem, first_row, heads_here);
    FD_TIMELINE_MARK(timeline, 4);
    if (merge_piece<T, Traits, kSchedule>(p, piece, b, kv_head, piece.chunk, smem, first_row, heads_here)) {
      FD_TIMELINE_MERGED(timeline);
    }
    __syncthreads();  // shared memory is reused by the next piece
  });
  FD_TIMELINE_END(timeline, "mma-keys", p.q);
}

}  // namespace cuda
}  // namespace fd
