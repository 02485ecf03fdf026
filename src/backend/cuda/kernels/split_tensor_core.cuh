// SPDX-License-Identifier: Apache-2.0
// Phase 1 on tensor cores, for 16-bit K/V with a 16-bit output: one CTA per
// (chunk of up to 16 query rows of a KV head, or 32 or 64 for the rows
// kernels, KV head, split, sequence).
//
// The query rows (query tokens x GQA group, prims/query_rows.cuh) are the M
// dimension of mma.sync m16n8k16 (16 row slots; slots past the chunk hold
// zero queries), so all of a KV head's rows up to 16 share every K/V element
// it reads from shared memory:
//   S[head, token] = Q[head, :] . K[token, :]   (A = Q from registers, B = K via ldmatrix)
//   O[head, :]    += P[head, token] V[token, :] (A = P, the S accumulators
//                                                 rounded to 16 bits; B = V via ldmatrix.trans)
// with float accumulators and the online softmax in base 2 on the S
// fragments (a row's max is reduced across the 4 lanes that hold it).
//
// The warps form kTokenGroups x kDSplits: a token group takes its own
// kWarpTokens tokens of every tile and keeps its own softmax state; its
// kDSplits warps each compute the same S (bitwise: same instructions, same
// data) and accumulate their share of head_dim, which halves the accumulator
// registers and doubles the warps that hide latency. At the end the token
// groups' states are merged in group order in shared memory (deterministic),
// and the result goes to out/lse (one split) or to the workspace as a partial
// state, exactly as split_cuda_core.cuh does; with a fused merge, the last CTA of a
// (sequence, KV head, chunk) merges its splits, and with the cluster merge
// (the cluster schedule) the unit's splits merge from each other's shared memory
// (fused_merge.cuh, cluster_merge.cuh).
//
// K/V tiles move with 16-byte cp.async (.cg: past L1; TileLoader in
// prims/load.cuh) into a two-stage pipeline. A stage is refilled right after
// the CTA is done with it (a second barrier per tile), so both stages are
// loading while the CTA waits (tests/bench/policy.md, "Tensor-core pipeline").
// Rows are XOR-swizzled in 16-byte chunks so that ldmatrix reads 8 rows
// without bank conflicts. Tokens at or past the sequence's end are
// zero-filled without a read and masked to -inf.
#pragma once

#include <cstdint>
#include <type_traits>

#include "backend/cuda/kernels/cluster_merge.cuh"
#include "backend/cuda/kernels/fused_merge.cuh"
#include "backend/cuda/params.h"
#include "backend/cuda/prims/element.cuh"
#include "backend/cuda/prims/grid_dependency.cuh"
#include "backend/cuda/prims/load.cuh"
#include "backend/cuda/prims/mma.cuh"
#include "backend/cuda/prims/quantized.cuh"
#include "backend/cuda/prims/query_rows.cuh"
#include "backend/cuda/prims/schedule.cuh"
#include "backend/cuda/prims/softmax.cuh"
#include "backend/cuda/prims/timeline.cuh"
#include "backend/cuda/prims/wgmma.cuh"

namespace fd {
namespace cuda {

// Stages of the 16-bit tiles' pipeline; overridable at build time for A/B
// measurements.
#ifndef FD_MMA_STAGES
#define FD_MMA_STAGES 2
#endif
// Whole-tile rows kernels on wgmma where the device code is sm_90a's (0:
// mma.sync everywhere, for A/B measurements).
#ifndef FD_ROWS_WGMMA
#define FD_ROWS_WGMMA 1
#endif
// Whole tiles in two token groups: each warpgroup copies its own half of
// every tile and waits only for it, so that neither waits for the other's
// copies (0: the CTA copies whole tiles, for A/B measurements).
#ifndef FD_ROWS_GROUP_LOADS
#define FD_ROWS_GROUP_LOADS 1
#endif
// Floats past each accumulator row of the token groups' combine area
// (TokenGroupParts): a warp's fragment stores write 8 consecutive rows at the
// same columns, which unpadded rows of 64-256 floats put on the same banks.
// Overridable at build time for A/B measurements.
#ifndef FD_PARTS_ROW_PAD
#define FD_PARTS_ROW_PAD 8
#endif
constexpr int kPartsRowPad = FD_PARTS_ROW_PAD;

// Bytes of the token groups' combine area (TokenGroupParts): each group's m
// and l and padded accumulator row per row slot, then each row's merged max
// and l. Both tensor-core kernels' traits size it here.
constexpr int token_group_parts_bytes(int token_groups, int rows, int bucket) {
  return (token_groups * (2 + bucket + kPartsRowPad) + 2) * rows * 4;
}

// Three tile shapes (MmaTiles). Standard: 8 warps (4 for head_dim 256),
// 32 KiB stages (for 16-bit elements), two stages, two CTAs per
// multiprocessor (by registers); runs everywhere. Wide (on GPUs with 200+
// KiB of shared memory per block): 8 warps, 64 KiB stages (256, 128 or 64
// tokens for head_dim buckets 64, 128, 256), one CTA per multiprocessor: it
// streams long splits faster and loses where the grid cannot be sized to the
// multiprocessors (tests/bench/policy.md, "Wide tensor-core tiles"). Compact
// (head_dim up to 128): 4 warps, 16 KiB stages (32 or 64 tokens for buckets
// 128 and 64), three stages, four CTAs per multiprocessor: one CTA's
// pipeline fill and epilogue hide behind three others', which serving
// batches of many short units pay once a unit ("Compact tensor-core
// tiles"). policy.cpp picks.
//
// Quantized: K/V are an 8-bit cache (T is q's 16-bit type, which the tensor
// cores compute in). Its tiles travel as raw bytes, four stages deep (half
// the bytes per tile), rows padded by 16 bytes so that the 8 rows of an
// ldmatrix fall on different banks; fragments are dequantized in registers
// (quant_key_fragments, quant_value_fragments). The stage ends with the
// tile's per-token scales, K's then V's.
//
// Rows (MTiles > 1): a KV head's query rows past 16 (several query tokens x
// the GQA group) on MTiles m-tiles of 16 rows in one CTA, so that up to
// 16 x MTiles rows share every K/V tile the CTA reads; the standard tiles'
// chunks of 16 rows would each stream the keys again. Each warp takes all
// of head_dim (a d split's warps would each compute the same S and
// softmax), and a warp whose m-tile holds no real row skips the tiles. Two
// layouts (tests/bench/policy.md, "Rows kernels"):
// - two m-tiles (up to 32 rows): four warps along each m-tile's tokens, 16
//   a warp (32 at head_dim 64), which keeps all 8 warps busy;
// - four m-tiles (up to 64 rows, kWholeTiles): a warp per m-tile over the
//   whole 64-token tile, which needs no token groups to merge and issues
//   fewer instructions per MMA: at 64 rows the kernel is bound by them.
// Above head_dim 64 (and always with whole tiles) the query is read from
// shared memory at each k-step, which leaves the registers to the
// accumulators. Whole tiles compiled for sm_90a (kAsyncMma) compute S and
// P V with wgmma (prims/wgmma.cuh): the CTA's four warps are one warpgroup
// whose 64 rows are wgmma's M, B read from the stages by descriptor, where
// mma.sync needed an ldmatrix and four times the MMA instructions: the
// kernel is bound by instruction issue. Its stages and query tile then use
// wgmma's 128-byte swizzle, 1024-byte aligned.
constexpr int kDStepsOf(int bucket) { return bucket / 16; }

enum class MmaTiles { standard, wide, compact };

template <class T, int Bucket, MmaTiles Tiles = MmaTiles::standard, bool Quantized = false, int MTiles = 1,
          int WholeTileGroups = 1, bool TokenWarps = (Quantized && Bucket <= 128)>
struct MmaTraits {
  static constexpr int kElementBytes = Quantized ? 1 : static_cast<int>(sizeof(T));  // of K/V
  static constexpr int kBucket = Bucket;
  static constexpr bool kWide = Tiles == MmaTiles::wide;
  static constexpr bool kCompact = Tiles == MmaTiles::compact;
  static constexpr bool kQuantized = Quantized;
  static constexpr int kHeads = kMmaHeads;       // head slots of an m-tile: the MMA's M
  static constexpr int kMTiles = MTiles;         // m-tiles of a CTA, each its own warps
  static constexpr int kRows = kHeads * MTiles;  // head slots of a CTA (SplitKernelShape::rows)
  // 8-bit caches up to head_dim 128 (and the keys kernel's at 256): every
  // warp takes its own tokens (no d split, whose warps would each
  // dequantize and score the same keys: these kernels are bound by
  // instructions, not bytes); 4 warps at head_dim 256, 8 below.
  static constexpr bool kTokenWarps = TokenWarps;
  static constexpr bool kWholeTiles = MTiles >= 4;
  // Device code only (FD_HAS_WGMMA): nothing the host sizes depends on it.
  static constexpr bool kAsyncMma = kWholeTiles && FD_HAS_WGMMA && FD_ROWS_WGMMA;
  // Warps along head_dim for P V (S is computed by each); rows: none.
  static constexpr int kDSplits = kTokenWarps || MTiles > 1 ? 1 : 2;
  static constexpr bool kQueryFromSmem = MTiles > 1 && (kWholeTiles || Bucket > 64);
  static constexpr int kTokenGroups =  // warps along a tile's tokens
      kTokenWarps   ? (Bucket == 256 ? 4 : 8)
      : kWholeTiles ? WholeTileGroups
                    : (kWide || (Bucket != 256 && !kCompact) ? 8 : 4) / (MTiles * kDSplits);
  static constexpr int kWarps = MTiles * kTokenGroups * kDSplits;
  static constexpr int kThreads = 32 * kWarps;  // 256, 256, 128 (wide: 256; compact: 128; rows: 256, whole tiles 128)
  // Tokens per warp per tile.
  static constexpr int kWarpTokens = kWholeTiles ? 64
                                     : kWide     ? (Bucket == 64    ? 64
                                                    : Bucket == 128 ? 32
                                                                    : 16)
                                                 : (Bucket == 64 ? 32 : 16);
  // 128, 64, 32 (wide: 256, 128, 64; compact: 64, 32; rows: 128, 64)
  static constexpr int kTileTokens = kTokenGroups * kWarpTokens;
  static constexpr int kRowBytes = Bucket * kElementBytes;                   // K/V bytes of a row
  static constexpr int kRowStride = Quantized ? kRowBytes + 16 : kRowBytes;  // a stage row's bytes
  static constexpr int kQueryRowBytes = Bucket * static_cast<int>(sizeof(T));
  static constexpr int kChunksPerRow = kRowBytes / kChunkBytes;  // 8, 16, 32 for 16-bit elements
  static constexpr bool kScales = Quantized;                     // per-token scales after K and V (TileLoader)
  // TileLoader's scale copies spread over a row's threads: not at head_dim
  // 128, where the 16-row 8-bit kernels sit at their register cap.
  static constexpr bool kSpreadScales = Bucket != 128;
  static constexpr int kScaleOffset = 2 * kTileTokens * kRowStride;
  // 32 KiB (wide: 64 KiB, compact: 16 KiB) for 16-bit elements; about 17-21 KiB for 8-bit ones.
  static constexpr int kStageBytes = kScaleOffset + (Quantized ? 2 * kTileTokens * 4 : 0);
  // Rows: a 64 KiB pipeline, which leaves room for two CTAs a multiprocessor;
  // whole tiles in two token groups (warpgroups): three 64 KiB stages at one
  // CTA a multiprocessor, twice the bytes in flight (the rows kernels are
  // bound by their copies: tests/bench/policy.md, "Rows kernels").
  static constexpr int kStages = Quantized    ? (kTokenWarps ? 2 : 4)
                                 : kWide      ? 2
                                 : kCompact   ? 3
                                 : MTiles > 1 ? (kWholeTiles &&WholeTileGroups > 1 ? 192 : 64) * 1024 / kStageBytes
                                              : FD_MMA_STAGES;
  static constexpr int kPipelineBytes = kStages * kStageBytes;
  // TileLoader's load groups: the threads that copy a tile's rows and the
  // rows each group copies. One, the CTA, and the whole tile: a tile's
  // stage is complete once the CTA has synchronised; whole tiles in token
  // groups (FD_ROWS_GROUP_LOADS): each warpgroup its own tokens, synchronised
  // on a named barrier of its own, so neither waits for the other's tile.
  static constexpr int kLoadGroups = kWholeTiles && WholeTileGroups > 1 && FD_ROWS_GROUP_LOADS ? WholeTileGroups : 1;
  static constexpr int kLoadGroupTokens = kTileTokens / kLoadGroups;
  // Paged caches with small pages: the block table entries of the tiles
  // kStages loads ahead, in kTableSlots slots of TileLoader's ring, after
  // the pipeline.
  static constexpr int kTableSlots = Quantized || MTiles > 1 ? 8 : 4;
  static constexpr int kTableBytes = table_ring_bytes(kTableSlots, kLoadGroups, kLoadGroupTokens);
  static constexpr int kCombineBytes = token_group_parts_bytes(kTokenGroups, kRows, Bucket);
  // The cluster merge's state (ClusterPartial) follows the combine area.
  static constexpr int kClusterPartialOffset = (kCombineBytes + 15) / 16 * 16;
  static constexpr int kClusterPartialBytes = ClusterPartial<kRows, Bucket>::kFloats * 4;
  // 8-bit caches: the query's MMA fragments wait in shared memory, in lane
  // order (one 16-byte load per lane and k-step), not in 4 x kDSteps
  // registers: the dequantization needs them.
  // Whole tiles: 1024-byte aligned for wgmma's swizzle (on every target, so
  // that the host's sizes are one).
  static constexpr int kQueryFragmentOffset =
      kWholeTiles ? (kPipelineBytes + kTableBytes + 1023) / 1024 * 1024 : kPipelineBytes + kTableBytes;
  // Rows with kQueryFromSmem: the query tile [kRows, Bucket] (swizzled) there.
  static constexpr int kQueryFragmentBytes = Quantized        ? kDStepsOf(Bucket) * 32 * 16
                                             : kQueryFromSmem ? kRows * kQueryRowBytes
                                                              : 0;
  static constexpr int kLoopBytes = kQueryFragmentOffset + kQueryFragmentBytes;
  // Whole tiles: room to align the dynamic shared memory to 1024 bytes
  // (mma_split_kernel aligns its pointer), which follows the static
  // schedule batch. kSmemSlack is launched but not usable: the host's
  // checks of what fits (the fused merge) see kSmemBytes - kSmemSlack.
  static constexpr int kSmemAlignment = kWholeTiles ? 1024 : 16;
  static constexpr int kSmemSlack = kSmemAlignment > 16 ? kSmemAlignment : 0;
  static constexpr int kSmemBytes = (kLoopBytes > kCombineBytes ? kLoopBytes : kCombineBytes) + kSmemSlack;
  static constexpr int kSTiles = kWarpTokens / 8;  // n-tiles of S per warp
  static constexpr int kDSteps = Bucket / 16;      // k-steps of S
  // Accumulator chains of S (attend_tile_mma): two where a warp's few
  // n-tiles would leave each k-step's MMAs waiting on the last.
  static constexpr int kChains = kDSteps >= 8 && MTiles == 1 ? 2 : 1;
  static constexpr int kDWidth = Bucket / kDSplits;  // output columns per warp
  static constexpr int kOTiles = kDWidth / 8;        // n-tiles of O per warp
  static constexpr int kPSteps = kWarpTokens / 16;   // k-steps of P V
  // Standard: two CTAs per SM, 128 registers a thread at 256 threads (the
  // 128 bucket is near that limit: read -Xptxas -v after each edit for
  // spills); compact: four of 128 threads, the same 128 registers;
  // whole-tile rows: two of 128 threads, about 230 registers.
  static constexpr int kMinBlocks = kWide || WholeTileGroups > 1 ? 1 : kCompact ? 4 : 2;
  // P = exp2(score - max) is scaled by 2^kProbabilityShift before it is
  // rounded to 16 bits for P V: fp16 keeps full precision only down to 2^-14,
  // so the small weights of a long context dominated by one token would be
  // subnormal. The factor cancels in acc / l; the stored max is lowered by
  // it, so the LSE and every merge see the true state. P stays below 2^15.
  static constexpr float kProbabilityShift = 15.0f;
  static_assert(kSmemBytes <= (kWide                 ? 200
                               : kCompact            ? 54
                               : WholeTileGroups > 1 ? 220
                                                     : 110) *
                                  1024,
                "mma kernel shared memory budget");
  static_assert(WholeTileGroups == 1 || (kWholeTiles && WholeTileGroups == 2), "token groups of whole tiles: 1 or 2");
  static_assert(MTiles > 1 || Quantized || kClusterPartialOffset + kClusterPartialBytes <= kSmemBytes,
                "the cluster merge's state fits");
  static_assert(MTiles == 1 || (Tiles == MmaTiles::standard && !Quantized && Bucket <= 128 && kTokenGroups >= 1),
                "rows: standard 16-bit tiles up to head_dim 128");
  static_assert(!kCompact || (MTiles == 1 && !Quantized && Bucket <= 128), "compact: 16-bit tiles up to head_dim 128");
  static_assert(Quantized || kChunksPerRow >= 8, "the swizzle needs 8 chunks per row");
  static_assert(kRows * kQueryRowBytes <= kStageBytes, "the query tile is staged in one pipeline stage");
  static_assert(kOTiles % 2 == 0 && kSTiles % 2 == 0, "x4 ldmatrix covers two n-tiles");
  static_assert(kTableSlots > kStages, "a slot is refilled only after its tile's copies were issued");
  static_assert(sizeof(T) == 2, "the MMA (prims/mma.cuh) takes 16-bit Q, K, V and P");
  static_assert(!Quantized || (kOTiles % 4 == 0 && kDSteps % 4 == 0), "8-bit fragments come in fours");
  // A 16-byte chunk of a stage row (TileLoader): swizzled for 16-bit rows
  // (ldmatrix reads 8 rows of a column; wgmma its 128-byte swizzle), padded
  // rows for 8-bit ones.
  __device__ static int stage_offset(int row, int chunk) {
    if constexpr (kAsyncMma) return wgmma_swizzled_offset<kTileTokens>(row, chunk);
    return Quantized ? row * kRowStride + chunk * kChunkBytes : swizzled<kRowBytes>(row, chunk);
  }
  // A 16-byte chunk of the query tile.
  __device__ static int query_offset(int row, int chunk) {
    if constexpr (kAsyncMma) return wgmma_swizzled_offset<kRows>(row, chunk);
    return swizzled<kQueryRowBytes>(row, chunk);
  }
};

// S for an 8-bit K: the fragments of n-tile n (8 tokens from stage row
// `row`) for k-steps 4*j4 .. 4*j4 + 3, from one ldmatrix. Its matrix m is
// the 8 rows' bytes [16 (4 j4 + m), +16), and lane (g, q) receives token g's
// bytes 4q .. 4q + 3: the B operand of a k-step whose k indices 2q, 2q + 1,
// 2q + 8, 2q + 9 are those four d. The query fragments follow the same order
// of d (quant_query_fragments); a dot product does not depend on it.
template <class T, class Traits, int kFormat>
__device__ __forceinline__ void quant_key_fragments(const unsigned char *k_tile, int row, int j4, uint32_t (&b)[4][2]) {
  const int lane = threadIdx.x % 32;
  uint32_t raw[4];
  ldmatrix_x4(raw, k_tile + (row + (lane & 7)) * Traits::kRowStride + (4 * j4 + (lane >> 3)) * kChunkBytes);
#pragma unroll
  for (int s = 0; s < 4; ++s) {
    b[s][0] = dequantize_pair_as<T, kFormat>(raw[s], 0);
    b[s][1] = dequantize_pair_as<T, kFormat>(raw[s], 1);
  }
}

// P V for an 8-bit V: the B fragments of four n-tiles of O (32 columns from
// byte column d0) for the k-step of 16 tokens at stage row `row`, from one
// transposing ldmatrix. Its matrix m covers tokens 8 (m & 1) .. +8 and bytes
// d0 + 16 (m >> 1) .. +16; lane (g, q) receives, as b16 elements, tokens 2q
// and 2q + 1 of byte columns 2g and 2g + 1. Their even bytes form the
// fragment of an n-tile whose column g is d 2g, the odd bytes that of d
// 2g + 1: so n-tile 2h + e (h: which 16 bytes, e: even or odd) holds columns
// d0 + 16 h + 2 n + e, and accumulator pair (c0, c1) of lane q the columns
// 4q + e and 4q + 2 + e (write_quant_columns undoes this). kScaled: per-token
// scales (value_scales, the tile's), each value scaled in float and rounded
// once. A template parameter, not a test of value_scales: the compiler
// turned that test into predicated code, so per-tensor scales issued the
// scaled path's conversions and products too (29% of the kernel's
// instructions, all predicated off, in Nsight Compute on shape 2).
template <class T, class Traits, int kFormat, bool kScaled>
__device__ __forceinline__ void quant_value_fragments(const unsigned char *v_tile, int row, int d0,
                                                      const float *value_scales, uint32_t (&b)[4][2]) {
  const int lane = threadIdx.x % 32;
  uint32_t raw[4];
  ldmatrix_x4_trans(
      raw, v_tile + (row + ((lane >> 3) & 1) * 8 + (lane & 7)) * Traits::kRowStride + d0 + (lane >> 4) * kChunkBytes);
  float2 scale[2] = {make_float2(1.0f, 1.0f), make_float2(1.0f, 1.0f)};
  if constexpr (kScaled) {
    const int q2 = (lane & 3) * 2;
    scale[0] = *reinterpret_cast<const float2 *>(value_scales + row + q2);
    scale[1] = *reinterpret_cast<const float2 *>(value_scales + row + 8 + q2);
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
#pragma unroll
    for (int t = 0; t < 2; ++t) {  // tokens 2q, 2q + 1 (matrix 2h), then 8 + 2q, 8 + 2q + 1 (matrix 2h + 1)
      const uint32_t by_column = __byte_perm(raw[2 * h + t], 0u, 0x3120u);  // even columns low, odd high
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        if constexpr (kScaled) {
          b[2 * h + e][t] = dequantize_pair_scaled<T, kFormat>(by_column, e, scale[t]);
        } else {
          b[2 * h + e][t] = dequantize_pair_as<T, kFormat>(by_column, e);
        }
      }
    }
  }
}

// This lane's ldmatrix offsets in the 16-bit stages and the query tile
// (SwizzledLane): K rows (S's B operand), V rows of the warp's d part (P V's,
// transposed), query rows (kQueryFromSmem). Not for the wide tiles, whose
// short splits measured slower with them (tests/bench/policy.md, "Swizzled
// lane offsets").
template <class Traits>
struct MmaLanes {
  SwizzledLane<Traits::kRowBytes, !Traits::kWide> key, value, query;
  __device__ __forceinline__ MmaLanes(int lane, int d_part)
      : key((lane >> 4) * 8 + (lane & 7), (lane >> 3) & 1),
        value(((lane >> 3) & 1) * 8 + (lane & 7), d_part * (Traits::kDWidth / 8) + (lane >> 4)),
        query(((lane >> 3) & 1) * 8 + (lane & 7), lane >> 4) {}
};

// wgmma's descriptor of a V tile (B of P V, MN-major, the 128-byte swizzle's
// canonical layout): the byte offsets between its 64-column blocks along N
// (leading) and its 8-token groups along K (stride).
template <class Traits>
constexpr uint32_t kValueLeadingBytes = Traits::kTileTokens * 128;
constexpr uint32_t kValueStrideBytes = 1024;

// One warp's kWarpTokens tokens of a tile, starting at stage row row0 (global
// token warp_begin): S on tensor cores, online softmax, O += P V.
// With kVariants the thread's two rows score their keys (RowScoring; warp_key
// is warp_begin relative to the split) instead of the plain end mask.
// 8-bit caches (Traits::kQuantized): fragments are dequantized from the raw
// stage (kFormat: the kernel's 8-bit format); with per-token scales,
// key_scales and value_scales point at the stage's.
// kUpperRows: the m-tile has a real row in slots 8-15. Without one (q_len 1
// and a group of up to 8) the thread's second row is skipped from the
// scores to the rescale and its P is zero: half the score transforms and
// exponentials, which bound a softcapped tile. A template parameter: a
// runtime branch between the two rows' code kept the compiler from
// interleaving them, and tiles with both rows real lost time.
template <class T, class Traits, bool kVariants, int kFormat, bool kUpperRows>
__device__ __forceinline__ void attend_tile_mma(const unsigned char *stage, int row0, int d_part, int64_t warp_begin,
                                                int64_t end, const uint32_t (&qf)[Traits::kDSteps][4],
                                                float (&o)[Traits::kOTiles][4], float (&m)[2], float (&l)[2],
                                                float q_scale, int warp_key, const RowScoring (&scoring)[2],
                                                const uint4 *query_fragments, const unsigned char *query_tile,
                                                int m_row, const MmaLanes<Traits> &lanes, const float *key_scales,
                                                const float *value_scales) {
  const unsigned char *k_tile = stage;
  const unsigned char *v_tile = stage + Traits::kTileTokens * Traits::kRowStride;
  const int lane = threadIdx.x % 32;
  const int quad_lane = lane & 3;

  // S = Q K^T over every k-step of the bucket, without a branch on head_dim:
  // chunks past it are zeros in shared memory and in q, and straight-line
  // code lets the compiler overlap the ldmatrix loads with the MMAs. With 8
  // or more k-steps each n-tile has two accumulators (even and odd k-steps),
  // two chains of dependent MMAs instead of one (a branch per k-step and one
  // chain left the kernel issue-bound).
  constexpr int kChains = Traits::kChains;
  float s_chain[kChains][Traits::kSTiles][4];
  constexpr int kZeroedChains = Traits::kAsyncMma ? 0 : kChains;  // wgmma's first k-step writes S
#pragma unroll
  for (int c = 0; c < kZeroedChains; ++c) {
#pragma unroll
    for (int n = 0; n < Traits::kSTiles; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) s_chain[c][n][e] = 0.0f;
    }
  }
  if constexpr (Traits::kQuantized) {
#pragma unroll
    for (int j4 = 0; j4 < Traits::kDSteps / 4; ++j4) {
#pragma unroll
      for (int n = 0; n < Traits::kSTiles; ++n) {
        uint32_t kb[4][2];
        quant_key_fragments<T, Traits, kFormat>(k_tile, row0 + n * 8, j4, kb);
#pragma unroll
        for (int s = 0; s < 4; ++s) {
          const uint4 f = query_fragments[(4 * j4 + s) * 32 + lane];
          const uint32_t a[4] = {f.x, f.y, f.z, f.w};
          Mma<T>::run(s_chain[(4 * j4 + s) % kChains][n], a, kb[s][0], kb[s][1]);
        }
      }
    }
  } else if constexpr (Traits::kAsyncMma) {
    // The warpgroup's 64 row slots at once, A the query tile, B the K rows;
    // a k-step is 32 bytes further in a 128-byte column block.
    static_assert(Traits::kSTiles == 8 && Traits::kRows == 64 && Traits::kThreads == 128 * Traits::kTokenGroups &&
                      Traits::kQueryFromSmem,
                  "wgmma: a warpgroup a token group, its 64 rows, 64 keys, the query tile in shared memory");
    const uint64_t query_descriptor = wgmma_descriptor(query_tile, 16, 1024);
    const uint64_t key_descriptor = wgmma_descriptor(k_tile + row0 * 128, 16, 1024);  // the warp's keys
    const auto k_step_bytes = [](int kk, int rows) { return (kk / 4) * rows * 128 + (kk % 4) * 32; };
    wgmma_fence();
    Wgmma<T>::ss_n64_first(s_chain[0], query_descriptor, key_descriptor);
#pragma unroll
    for (int kk = 1; kk < Traits::kDSteps; ++kk) {
      Wgmma<T>::ss_n64(s_chain[0], wgmma_advance(query_descriptor, k_step_bytes(kk, Traits::kRows)),
                       wgmma_advance(key_descriptor, k_step_bytes(kk, Traits::kTileTokens)));
    }
    wgmma_commit();
    wgmma_wait_all();
    wgmma_fence_registers(s_chain[0]);
  } else {
#pragma unroll
    for (int kk = 0; kk < Traits::kDSteps; ++kk) {
      uint32_t a[4];
      if constexpr (Traits::kQueryFromSmem) {
        ldmatrix_x4(a, query_tile + lanes.query(m_row, kk));
      } else {
#pragma unroll
        for (int e = 0; e < 4; ++e) a[e] = qf[kk][e];
      }
#pragma unroll
      for (int j = 0; j < Traits::kSTiles / 2; ++j) {
        uint32_t kb[4];
        ldmatrix_x4(kb, k_tile + lanes.key(row0 + j * 16, kk));
        Mma<T>::run(s_chain[kk % kChains][2 * j], a, kb[0], kb[1]);
        Mma<T>::run(s_chain[kk % kChains][2 * j + 1], a, kb[2], kb[3]);
      }
    }
  }
  auto &s = s_chain[0];  // float[kSTiles][4]
#pragma unroll
  for (int c = 1; c < kChains; ++c) {
#pragma unroll
    for (int n = 0; n < Traits::kSTiles; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) s[n][e] += s_chain[c][n][e];
    }
  }
  // 8-bit caches with per-token key scales: q . (k x scale) = (q . k) x scale.
  if (key_scales != nullptr) {
#pragma unroll
    for (int n = 0; n < Traits::kSTiles; ++n) {
      const float2 scale = *reinterpret_cast<const float2 *>(key_scales + row0 + n * 8 + quad_lane * 2);
      s[n][0] *= scale.x;
      s[n][1] *= scale.y;
      s[n][2] *= scale.x;
      s[n][3] *= scale.y;
    }
  }

  // Scale, mask (scale_and_mask_scores), and the new running max of this
  // thread's two rows.
  constexpr int kRowsHere = kUpperRows ? 2 : 1;
  float block_max[2] = {negative_infinity(), negative_infinity()};
  const auto for_each_score = [&](auto &&score_of) {
#pragma unroll
    for (int n = 0; n < Traits::kSTiles; ++n) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
#pragma unroll
        for (int r = 0; r < kRowsHere; ++r) s[n][2 * r + e] = score_of(s[n][2 * r + e], r, n * 8 + quad_lane * 2 + e);
      }
    }
  };
  scale_and_mask_scores<kVariants, Traits::kWarpTokens>(for_each_score, scoring, q_scale, warp_key, end - warp_begin);
#pragma unroll
  for (int n = 0; n < Traits::kSTiles; ++n) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
#pragma unroll
      for (int r = 0; r < kRowsHere; ++r) block_max[r] = max_nan(block_max[r], s[n][2 * r + e]);
    }
  }
  float p_base[2], alpha[2];
#pragma unroll
  for (int r = 0; r < kRowsHere; ++r) {
    block_max[r] = max_nan(block_max[r], __shfl_xor_sync(0xffffffffu, block_max[r], 1));
    block_max[r] = max_nan(block_max[r], __shfl_xor_sync(0xffffffffu, block_max[r], 2));
    const float m_new = max_nan(m[r], block_max[r]);
    const float base = m_new == negative_infinity() ? 0.0f : m_new;  // nothing seen yet: all weights 0
    alpha[r] = exp2_ftz(m[r] - base);                                // 0 when m was -inf
    p_base[r] = base - Traits::kProbabilityShift;
    m[r] = m_new;
    l[r] *= alpha[r];
  }
  // The kernels bound by instructions (rows, 8-bit): once the running
  // maxima settle, most tiles leave every alpha of the warp at exactly 1 and
  // skip the rescale of the accumulators (a product by 1 is exact: same
  // results). An 8-bit warp tile has 16 tokens against 64 products.
  constexpr bool kVoteRescale = Traits::kMTiles > 1 || Traits::kQuantized;
  const bool rescale = !kVoteRescale || !__all_sync(0xffffffffu, alpha[0] == 1.0f && alpha[kRowsHere - 1] == 1.0f);
  if (rescale) {
#pragma unroll
    for (int t = 0; t < Traits::kOTiles; ++t) {
#pragma unroll
      for (int r = 0; r < kRowsHere; ++r) {
        o[t][2 * r] *= alpha[r];
        o[t][2 * r + 1] *= alpha[r];
      }
    }
  }
#pragma unroll
  for (int n = 0; n < Traits::kSTiles; ++n) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
#pragma unroll
      for (int r = 0; r < kRowsHere; ++r) s[n][2 * r + e] = exp2_ftz(s[n][2 * r + e] - p_base[r]);
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      if (r < kRowsHere) {
        l[r] += s[n][2 * r] + s[n][2 * r + 1];
      } else {
        s[n][2 * r] = s[n][2 * r + 1] = 0.0f;  // no real row: P is zero
      }
    }
  }

  // P V; 8-bit caches: one loop with per-token value scales and one
  // without, chosen once a tile (warp-uniform). Without them the stored
  // values are multiplied in fp16 whatever q's type: every one is exact in
  // it (the scale comes after, in float), P is finer than in bf16 (at most
  // 2^15: kProbabilityShift), and a bf16 q's values skip two conversions a
  // pair.
  const auto accumulate_values = [&](auto scaled_values) {
    using PvType = std::conditional_t<Traits::kQuantized && !decltype(scaled_values)::value, __half, T>;
    const auto p_fragments = [&](int ks, uint32_t(&a)[4]) {
      a[0] = Mma<PvType>::pack(s[2 * ks][0], s[2 * ks][1]);
      a[1] = Mma<PvType>::pack(s[2 * ks][2], s[2 * ks][3]);
      a[2] = Mma<PvType>::pack(s[2 * ks + 1][0], s[2 * ks + 1][1]);
      a[3] = Mma<PvType>::pack(s[2 * ks + 1][2], s[2 * ks + 1][3]);
    };
    if constexpr (Traits::kAsyncMma) {
      // Every k-step's P before the fence (a register that an instruction
      // after it writes makes ptxas insert another). V's rows are P V's k
      // (B MN-major): its 8-row groups and 64-column blocks at
      // kValueStrideBytes and kValueLeadingBytes; 16 tokens a k-step.
      uint32_t a[Traits::kPSteps][4];
#pragma unroll
      for (int ks = 0; ks < Traits::kPSteps; ++ks) p_fragments(ks, a[ks]);
      const uint64_t value_descriptor =
          wgmma_descriptor(v_tile + row0 * 128, kValueLeadingBytes<Traits>, kValueStrideBytes);
      wgmma_fence_registers(o);
      wgmma_fence();
#pragma unroll
      for (int ks = 0; ks < Traits::kPSteps; ++ks) {
        const uint64_t values = wgmma_advance(value_descriptor, ks * 16 * 128);
        Wgmma<T>::rs(o, a[ks], values);
      }
      wgmma_commit();
      wgmma_wait_all();  // o is read next, and the stage is refilled after the next barrier
      wgmma_fence_registers(o);
    } else {
#pragma unroll
      for (int ks = 0; ks < Traits::kPSteps; ++ks) {
        uint32_t a[4];
        p_fragments(ks, a);
        if constexpr (Traits::kQuantized) {
#pragma unroll
          for (int c = 0; c < Traits::kOTiles / 4; ++c) {  // no branch on head_dim: V past it is zeros
            uint32_t vb[4][2];
            quant_value_fragments<PvType, Traits, kFormat, decltype(scaled_values)::value>(
                v_tile, row0 + ks * 16, d_part * Traits::kDWidth + c * 32, value_scales, vb);
#pragma unroll
            for (int t = 0; t < 4; ++t) Mma<PvType>::run(o[4 * c + t], a, vb[t][0], vb[t][1]);
          }
        } else {
#pragma unroll
          for (int c = 0; c < Traits::kOTiles / 2; ++c) {  // no branch on head_dim: V past it is zeros
            uint32_t vb[4];
            ldmatrix_x4_trans(vb, v_tile + lanes.value(row0 + ks * 16, c));
            Mma<T>::run(o[2 * c], a, vb[0], vb[1]);
            Mma<T>::run(o[2 * c + 1], a, vb[2], vb[3]);
          }
        }
      }
    }
  };
  if constexpr (Traits::kQuantized) {
    if (value_scales != nullptr) {
      accumulate_values(std::true_type{});
    } else {
      accumulate_values(std::false_type{});
    }
  } else {
    accumulate_values(std::false_type{});
  }
}

// The token groups' partial states of a piece in shared memory (the
// combine area at its start): each group's m and l per row slot (m then
// its weight), each row's merged max and l, and each group's accumulator
// rows [kTokenGroups * kRows][kBucket], kRowFloats apart. A kernel writes
// m, l and o, then write_token_groups merges them.
template <class Traits>
struct TokenGroupParts {
  static constexpr int kRowFloats = Traits::kBucket + kPartsRowPad;
  float *m, *l, *row_l, *row_max, *o;
  __device__ explicit TokenGroupParts(unsigned char *smem)
      : m(reinterpret_cast<float *>(smem)),
        l(m + Traits::kTokenGroups * Traits::kRows),
        row_l(l + Traits::kTokenGroups * Traits::kRows),
        row_max(row_l + Traits::kRows),
        o(row_max + Traits::kRows) {}
  // Accumulator row `slot` (token group x kRows + row slot).
  __device__ float *o_row(int slot) const { return o + slot * kRowFloats; }
  static_assert((2 * Traits::kTokenGroups + 2) * Traits::kRows * 4 % 16 == 0 && kRowFloats % 4 == 0,
                "o holds float4 stores");
  // The layout above, counted from its own pointers, against the traits' sizing.
  static_assert(Traits::kCombineBytes >= ((2 * Traits::kTokenGroups + 2) * Traits::kRows +
                                          Traits::kTokenGroups * Traits::kRows * kRowFloats) *
                                             4,
                "the combine area holds the parts");
};

// Merges the token groups' states (TokenGroupParts, written and synced) in
// group order and writes the piece's real rows: to out and lse where the
// piece writes the output, else as the piece's partial state (in the
// cluster's shared memory with the cluster schedule, else the workspace).
template <class T, class Traits, SplitSchedule kSchedule>
__device__ __forceinline__ void write_token_groups(const SplitParams &p, const Piece &piece, int64_t b, int kv_head,
                                                   const TokenGroupParts<Traits> &parts, unsigned char *smem,
                                                   int first_row, int heads_here) {
  constexpr int kBucket = Traits::kBucket;
  // The token groups' weights exp2(m_group - m_max) and the merged l, once
  // per head slot, in group order.
  static_assert(Traits::kRows <= Traits::kThreads, "a thread per head slot");
  if (threadIdx.x < Traits::kRows) {
    const int row = threadIdx.x;
    float m_max = negative_infinity();
#pragma unroll
    for (int g = 0; g < Traits::kTokenGroups; ++g) m_max = max_nan(m_max, parts.m[g * Traits::kRows + row]);
    float l_sum = 0.0f;
#pragma unroll
    for (int g = 0; g < Traits::kTokenGroups; ++g) {
      const float weight = merge_weight(parts.m[g * Traits::kRows + row], m_max);
      l_sum = fmaf(weight, parts.l[g * Traits::kRows + row], l_sum);
      parts.m[g * Traits::kRows + row] = weight;
    }
    parts.row_max[row] = m_max - Traits::kProbabilityShift;  // l and acc carry 2^kProbabilityShift
    parts.row_l[row] = l_sum;
  }
  __syncthreads();

  // Merge the token groups' accumulators in group order, four columns of a
  // real head per thread: the row's weights, output address and 1 / l once
  // for the four (the epilogue of many rows is bound by its instructions).
  // head_dim is a multiple of 8 on the tensor cores (16-byte rows).
  static_assert(kHeadDimMultiple % 4 == 0, "whole float4 columns");
  constexpr int kVectors = kBucket / 4;
  float *cluster_partial = reinterpret_cast<float *>(smem + Traits::kClusterPartialOffset);
  for (int i = threadIdx.x; i < heads_here * kVectors; i += Traits::kThreads) {
    const int row = i / kVectors;
    const int d = i % kVectors * 4;
    if (d >= p.head_dim) continue;
    float4 sum = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
    for (int g = 0; g < Traits::kTokenGroups; ++g) {
      add_weighted(sum, parts.m[g * Traits::kRows + row],
                   *reinterpret_cast<const float4 *>(parts.o_row(g * Traits::kRows + row) + d));
    }
    const float acc[4] = {sum.x, sum.y, sum.z, sum.w};
    const float m_max = parts.row_max[row];
    const float l_sum = parts.row_l[row];
    if (piece_writes_output<kSchedule>(p, piece)) {
      const QueryRow query = query_row(first_row + row, p.group_size, kv_head);
      if (p.out_f32) {
        write_output<float>(p.output, b, query.token, query.q_head, d, acc, m_max, l_sum, d == 0);
      } else {
        write_output<T>(p.output, b, query.token, query.q_head, d, acc, m_max, l_sum, d == 0);
      }
    } else if (kSchedule == SplitSchedule::cluster) {
      using Partial = ClusterPartial<Traits::kRows, kBucket>;
#pragma unroll
      for (int e = 0; e < 4; ++e) Partial::acc(cluster_partial, row, d + e) = acc[e];
      if (d == 0) {
        Partial::m(cluster_partial, row) = m_max;
        Partial::l(cluster_partial, row) = l_sum;
      }
    } else {
      const int64_t index = partial_state_index<kSchedule>(p, piece, row);
      *reinterpret_cast<float4 *>(p.acc + index * p.head_dim + d) = sum;  // rows of head_dim floats, 16-byte aligned
      if (d == 0) {
        p.m[index] = m_max;
        p.l[index] = l_sum;
      }
    }
  }
}

// After write_token_groups: the unit's splits merged by the cluster (the
// cluster schedule), the balanced schedule's last piece of a unit
// (kMergeBatch pieces' loads at a time: merge_pieces_if_last), or the fused
// merge's last CTA of it. Returns whether this CTA merged.
template <class T, class Traits, SplitSchedule kSchedule, int kMergeBatch = 1>
__device__ __forceinline__ bool merge_piece(const SplitParams &p, const Piece &piece, int64_t b, int kv_head, int chunk,
                                            unsigned char *smem, int first_row, int heads_here) {
  if constexpr (kSchedule == SplitSchedule::cluster) {
    float *cluster_partial = reinterpret_cast<float *>(smem + Traits::kClusterPartialOffset);
    merge_in_cluster<T, Traits::kThreads, Traits::kRows, Traits::kBucket>(p, b, kv_head, first_row, heads_here,
                                                                          cluster_partial);
    return false;
  } else if constexpr (kSchedule == SplitSchedule::planned) {
    return fused_merge_if_last<T, Traits::kThreads, false>(p, b, kv_head, chunk, smem);
  } else {
    return p.balanced_workers > 0 ? merge_pieces_if_last<T, Traits::kThreads, false, kMergeBatch>(p, piece)
                                  : fused_merge_if_last<T, Traits::kThreads, false>(p, b, kv_head, chunk, smem);
  }
}

// kSchedule: the pieces it takes (prims/schedule.cuh); the cluster schedule
// is launched in clusters of a unit's splits, which merge through
// distributed shared memory (SplitParams::cluster_merge, merge_in_cluster).
// Template parameters rather than runtime flags, whose branches cost the
// other launches time (tests/bench/policy.md, "Kernel variants as template
// parameters"). kVariants: scores go through the attention variants.
// kQuantized: K/V are an 8-bit cache (MmaTraits' Quantized; T is q's type)
// of format kFormat (an 8-bit fd_dtype; SplitParams::kv_format must match):
// a kernel per format, so that each carries only its own dequantization.
// kMTiles: m-tiles of query rows (MmaTraits' MTiles); kWholeTileGroups:
// token groups of whole tiles (MmaTraits' WholeTileGroups).
template <class T, int kBucket, MmaTiles kTiles, SplitSchedule kSchedule, bool kVariants, bool kQuantized = false,
          int kMTiles = 1, int kFormat = 0, int kWholeTileGroups = 1>
__global__ void __launch_bounds__(MmaTraits<T, kBucket, kTiles, kQuantized, kMTiles, kWholeTileGroups>::kThreads,
                                  MmaTraits<T, kBucket, kTiles, kQuantized, kMTiles, kWholeTileGroups>::kMinBlocks)
    mma_split_kernel(const SplitParams p) {
  using Traits = MmaTraits<T, kBucket, kTiles, kQuantized, kMTiles, kWholeTileGroups>;
  constexpr bool kCluster = kSchedule == SplitSchedule::cluster;
  static_assert(!kQuantized || !kCluster, "8-bit caches: no cluster merge");
  static_assert(kQuantized == (kFormat == FD_DTYPE_E4M3 || kFormat == FD_DTYPE_E5M2 || kFormat == FD_DTYPE_I8),
                "8-bit kernels have one 8-bit format, the others none");
  extern __shared__ __align__(16) unsigned char dynamic_smem[];
  unsigned char *const smem = align_shared<Traits::kSmemAlignment>(dynamic_smem);
  FD_TIMELINE_BEGIN(timeline);
  split_kernel_prologue();
  FD_TIMELINE_MARK(timeline, 1);

  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  // Whole tiles: a warpgroup (4 consecutive warps, wgmma's unit) a token group.
  constexpr bool kWarpgroupTokens = Traits::kWholeTiles && Traits::kTokenGroups > 1;
  const int token_group = kWarpgroupTokens ? warp / Traits::kMTiles : warp % Traits::kTokenGroups;
  const int d_part = warp / Traits::kTokenGroups % Traits::kDSplits;
  const int m_row = (kWarpgroupTokens ? warp % Traits::kMTiles : warp / (Traits::kTokenGroups * Traits::kDSplits)) *
                    Traits::kHeads;  // the warp's first row slot
  const int group_row = lane >> 2;   // this thread's rows of the fragments: group_row and group_row + 8
  const int quad_lane = lane & 3;
  const MmaLanes<Traits> lanes(lane, d_part);

  // The query tile's staging area: the last pipeline stage, or its own
  // place where it stays for the whole loop (kQueryFromSmem).
  unsigned char *q_stage =
      Traits::kQueryFromSmem ? smem + Traits::kQueryFragmentOffset : smem + (Traits::kStages - 1) * Traits::kStageBytes;

  // The CTA's pieces of work (prims/schedule.cuh).
  for_each_piece<Traits::kTileTokens, kSchedule>(p, [&](const Piece &piece) {
    const int64_t b = piece.b;
    const int kv_head = piece.kv_head;
    const int chunk = piece.chunk;
    const int first_row = chunk * p.heads_per_chunk;  // within the KV head's rows
    const int heads_here = min(p.heads_per_chunk, p.kv_rows - first_row);
    const TokenRange range = piece.range;
    const int64_t begin = range.begin;
    const int64_t end = range.end;
    const TileLoader<Traits> loader(p, b, kv_head, reinterpret_cast<int32_t *>(smem + Traits::kPipelineBytes));

    // Start the first tiles before anything else: the query is small.
    const int64_t tiles = loader.start(smem, begin, end);

    const int q_len_b = sequence_q_len<kVariants>(p, b);
    RowScoring scoring[2] = {};
    if constexpr (kVariants) {
      for (int r = 0; r < 2; ++r) {
        const int row = m_row + group_row + 8 * r;
        scoring[r] =
            row_scoring(p, range, q_len_b, query_row(first_row + row, p.group_size, kv_head), row < heads_here);
      }
    }

    // The query tile [kRows row slots, bucket] goes through the last pipeline
    // stage (first written by the main loop, after a barrier) into registers.
    stage_query_rows<T, Traits::kRows, Traits::kQueryRowBytes, Traits::kThreads>(
        p, b, kv_head, first_row, heads_here, q_len_b, q_stage,
        [](int row, int column) { return Traits::query_offset(row, column); });
    if constexpr (Traits::kAsyncMma) fence_async_shared();  // wgmma reads the query tile
    __syncthreads();
    // 16-bit caches: the query fragments in registers. 8-bit: in shared
    // memory (Traits::kQueryFragmentOffset), written by warp 0, where the
    // k indices 2q, 2q + 1, 2q + 8, 2q + 9 of a k-step are its d 4q .. 4q + 3
    // (as in quant_key_fragments).
    uint32_t qf[Traits::kDSteps][4];  // unused by 8-bit caches
    uint4 *const query_fragments = reinterpret_cast<uint4 *>(smem + Traits::kQueryFragmentOffset);
    if constexpr (kQuantized) {
      if (warp == 0) {
#pragma unroll
        for (int kk = 0; kk < Traits::kDSteps; ++kk) {
          const int d = kk * 16 + quad_lane * 4;
          uint32_t f[4];
#pragma unroll
          for (int r = 0; r < 2; ++r) {
            const uint2 pairs = *reinterpret_cast<const uint2 *>(
                q_stage + swizzled<Traits::kQueryRowBytes>(group_row + 8 * r, d / 8) + (d % 8) * 2);
            f[r] = pairs.x;
            f[2 + r] = pairs.y;
          }
          query_fragments[kk * 32 + lane] = make_uint4(f[0], f[1], f[2], f[3]);
        }
      }
    } else if constexpr (!Traits::kQueryFromSmem) {
#pragma unroll
      for (int kk = 0; kk < Traits::kDSteps; ++kk) {
        ldmatrix_x4(qf[kk], q_stage + lanes.query(m_row, kk));
      }
    }
    __syncthreads();  // every warp has its query fragments: the last stage takes a tile
    if (Traits::kStages - 1 < tiles) {
      const int last = Traits::kStages - 1;
      loader.load(smem + last * Traits::kStageBytes, begin, last, end);
    }
    cp_async_commit();

    float o[Traits::kOTiles][4];
#pragma unroll
    for (int t = 0; t < Traits::kOTiles; ++t) o[t][0] = o[t][1] = o[t][2] = o[t][3] = 0.0f;
    float m[2] = {negative_infinity(), negative_infinity()};
    float l[2] = {0.0f, 0.0f};

    // 8-bit caches: scales that do not vary by token fold into q's scale
    // (K) and the accumulator (V); per-token ones come with each tile.
    float q_scale = p.q_scale;
    [[maybe_unused]] float value_scale = 1.0f;
    if constexpr (kQuantized) {
      const bool paged = p.block_table != nullptr;
      q_scale *= sequence_scale(p.k_scale, p.k_scale_strides, p.k_scale_per_token, paged, b, kv_head);
      value_scale = sequence_scale(p.v_scale, p.v_scale_strides, p.v_scale_per_token, paged, b, kv_head);
    }

    // The threads that share a stage's rows: the CTA, or a load group (its
    // rows are its token group's, TileLoader).
    const auto stage_barrier = [&] {
      if constexpr (Traits::kLoadGroups > 1) {
        named_barrier_sync(1 + token_group, Traits::kThreads / Traits::kLoadGroups);
      } else {
        __syncthreads();
      }
    };
    static_assert(Traits::kLoadGroups == 1 || (kWarpgroupTokens && Traits::kLoadGroups == Traits::kTokenGroups),
                  "a load group is a token group");
    int stage = 0;
    for (int64_t tile = 0; tile < tiles; ++tile) {
      cp_async_wait<Traits::kStages - 1>();  // this thread's copies of `tile` have landed
      if constexpr (Traits::kAsyncMma) fence_async_shared();
      stage_barrier();  // everyone's have
      FD_TIMELINE_MARK_IF(timeline, 2, tile == 0);
      const int64_t warp_begin = begin + tile * Traits::kTileTokens + token_group * Traits::kWarpTokens;
      // Warp-uniform; wgmma: CTA-uniform (the warpgroup computes every row slot).
      if (warp_begin < end && (Traits::kAsyncMma || m_row < heads_here)) {
        const unsigned char *loaded = smem + stage * Traits::kStageBytes;
        const float *tile_scales = reinterpret_cast<const float *>(loaded + Traits::kScaleOffset);
        const float *key_scales = kQuantized && p.k_scale_per_token ? tile_scales : nullptr;
        const float *value_scales = kQuantized && p.v_scale_per_token ? tile_scales + Traits::kTileTokens : nullptr;
        const auto attend_rows = [&](auto format, auto upper_rows) {
          attend_tile_mma<T, Traits, kVariants, decltype(format)::value, decltype(upper_rows)::value>(
              loaded, token_group * Traits::kWarpTokens, d_part, warp_begin, end, qf, o, m, l, q_scale,
              static_cast<int>(warp_begin - begin), scoring, query_fragments, q_stage, m_row, lanes, key_scales,
              value_scales);
        };
        // One body for the rows kernel (only its last m-tile can lack upper
        // rows) and the 8-bit variant kernels (two bodies spilled there).
        // Plain 8-bit kernels take both: their softmax costs about as many
        // instructions as the dequantization (Nsight Compute, history run 29).
        const auto attend = [&](auto format) {
          if constexpr (Traits::kMTiles > 1 || (kQuantized && kVariants)) {
            attend_rows(format, std::true_type{});
          } else if (m_row + 8 < heads_here) {
            attend_rows(format, std::true_type{});
          } else {
            attend_rows(format, std::false_type{});
          }
        };
        attend(std::integral_constant<int, kFormat>{});
      }
      stage_barrier();  // everyone is done with this stage: it takes tile + kStages
      if (tile + Traits::kStages < tiles) {
        loader.load(smem + stage * Traits::kStageBytes, begin, tile + Traits::kStages, end);
      }
      cp_async_commit();
      stage = stage + 1 == Traits::kStages ? 0 : stage + 1;
    }
    cp_async_wait<0>();
    __syncthreads();  // the pipeline memory is free for the combine below
    FD_TIMELINE_MARK(timeline, 3);

    // Each thread holds partial sums of l over its columns: add the quad's.
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
      l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
    }
    // Per token group: m and l (the d_part warps of a group hold the same
    // ones), and the accumulator, each d_part warp its columns; only the
    // chunk's real heads (the other slots hold zero queries).
    const TokenGroupParts<Traits> parts(smem);
    const int slot = token_group * Traits::kRows + m_row + group_row;  // this thread's first row in the parts
    const bool row_real[2] = {m_row + group_row < heads_here, m_row + group_row + 8 < heads_here};
    if (quad_lane == 0 && d_part == 0) {
      parts.m[slot] = m[0];
      parts.m[slot + 8] = m[1];
      parts.l[slot] = l[0];
      parts.l[slot + 8] = l[1];
    }
    if constexpr (kQuantized) {
      // The n-tiles' columns as quant_value_fragments ordered them: of each
      // 16, tiles 2h and 2h + 1 hold this lane's 4q .. 4q + 3.
#pragma unroll
      for (int t = 0; t < Traits::kOTiles; t += 2) {
        const int d = d_part * Traits::kDWidth + t * 8 + quad_lane * 4;
        if (row_real[0]) {
          *reinterpret_cast<float4 *>(parts.o_row(slot) + d) = make_float4(
              o[t][0] * value_scale, o[t + 1][0] * value_scale, o[t][1] * value_scale, o[t + 1][1] * value_scale);
        }
        if (row_real[1]) {
          *reinterpret_cast<float4 *>(parts.o_row(slot + 8) + d) = make_float4(
              o[t][2] * value_scale, o[t + 1][2] * value_scale, o[t][3] * value_scale, o[t + 1][3] * value_scale);
        }
      }
    } else {
#pragma unroll
      for (int t = 0; t < Traits::kOTiles; ++t) {
        const int d = d_part * Traits::kDWidth + t * 8 + quad_lane * 2;
        if (row_real[0]) {
          *reinterpret_cast<float2 *>(parts.o_row(slot) + d) = make_float2(o[t][0], o[t][1]);
        }
        if (row_real[1]) {
          *reinterpret_cast<float2 *>(parts.o_row(slot + 8) + d) = make_float2(o[t][2], o[t][3]);
        }
      }
    }
    __syncthreads();
    write_token_groups<T, Traits, kSchedule>(p, piece, b, kv_head, parts, smem, first_row, heads_here);
    FD_TIMELINE_MARK(timeline, 4);
    // Batched merge loads where a unit's pieces are many (few units) and the
    // kernel's registers leave room; the compact tiles (two units a
    // multiprocessor or more: a few pieces a unit) and the variants keep one
    // load a piece, with which their main loops do not spill.
    constexpr int kMergeBatch = kVariants || kQuantized || Traits::kCompact
                                    ? 1
                                    : kMergeLoadBatch<Traits::kThreads, Traits::kSmemBytes - Traits::kSmemSlack>;
    if (merge_piece<T, Traits, kSchedule, kMergeBatch>(p, piece, b, kv_head, chunk, smem, first_row, heads_here)) {
      FD_TIMELINE_MERGED(timeline);
    }
    __syncthreads();  // shared memory is reused by the next piece
  });
  FD_TIMELINE_END(timeline, "mma", p.q);
}

}  // namespace cuda
}  // namespace fd
