// SPDX-License-Identifier: Apache-2.0
// Moving K/V from global to shared memory. A pipeline stage holds one tile of
// consecutive tokens of one sequence and KV head, K rows then V rows, each
// row padded to the head-dim bucket. Loaders work in 16-byte chunks of raw
// storage bytes and know of the element type only its size.
//
// Two loaders, one per way of addressing rows: load_kv_tile finds every
// row's address on its own with 64-bit arithmetic (any stride, any page
// size, unaligned rows: the CUDA-core kernel, which runs every problem), and
// TileLoader steps 32-bit page and slot offsets from row to row into a
// swizzled stage (the tensor-core kernel, for caches whose offsets fit).
//
// Chunks past the head dim or past the sequence's end are zero-filled without
// touching global memory: data beyond a sequence's length is never read, and
// the compute side may multiply by what is in shared memory without masking.
#pragma once

#include <cstdint>
#include <type_traits>

#include "backend/cuda/params.h"
#include "backend/cuda/prims/element.cuh"
#include "backend/cuda/prims/query_rows.cuh"

namespace fd {
namespace cuda {

constexpr int kChunkBytes = 16;

// Asynchronous 16-byte copy, global -> shared, bypassing L1 (.cg). With
// valid false it writes 16 zero bytes and reads nothing (src-size 0).
__device__ inline void cp_async_chunk(void *smem, const void *gmem, bool valid) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  const int src_bytes = valid ? kChunkBytes : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem), "r"(src_bytes) : "memory");
}

// The K/V stream is read once per call: with FD_KV_EVICT_FIRST the
// tensor-core kernel's copies carry an L2 evict-first policy, so they leave
// alone the lines that are reused (block table, partials, q;
// tests/bench/policy.md, "L2 evict-first"). On by default from CUDA 13.4;
// -DFD_KV_EVICT_FIRST=0 or 1 overrides (1 only with a ptxas of 13.4.59 or
// newer). Older ptxas drop the createpolicy and keep the copies that read
// its register: an illegal instruction at run time (triton-lang/triton#11660
// and #11848 met the same). tests/tools/check_sass_descriptors.py finds such
// kernels in a built library (CTest sass_descriptors).
#ifndef FD_KV_EVICT_FIRST
#if defined(__CUDACC_VER_MAJOR__) && \
    (__CUDACC_VER_MAJOR__ > 13 || (__CUDACC_VER_MAJOR__ == 13 && __CUDACC_VER_MINOR__ >= 4))
#define FD_KV_EVICT_FIRST 1
#else
#define FD_KV_EVICT_FIRST 0
#endif
#endif

// The L2 policy for K/V copies (unused when FD_KV_EVICT_FIRST is 0).
__device__ inline uint64_t kv_stream_policy() {
  uint64_t policy = 0;
#if FD_KV_EVICT_FIRST
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));
#endif
  return policy;
}

// cp_async_chunk for K/V rows, under kv_stream_policy().
__device__ inline void cp_async_kv_chunk(void *smem, const void *gmem, bool valid, uint64_t policy) {
#if FD_KV_EVICT_FIRST
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  const int src_bytes = valid ? kChunkBytes : 0;
  asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2, %3;\n" ::"r"(dst), "l"(gmem),
               "r"(src_bytes), "l"(policy)
               : "memory");
#else
  (void)policy;
  cp_async_chunk(smem, gmem, valid);
#endif
}

// Asynchronous 4-byte copy (a per-token scale), global -> shared; with
// valid false it writes 0 and reads nothing.
__device__ inline void cp_async_scale(float *smem, const float *gmem, bool valid) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  const int src_bytes = valid ? 4 : 0;
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(gmem), "r"(src_bytes) : "memory");
}

__device__ inline void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }

// Synchronises the `threads` threads (whole warps) that name barrier `id`
// (1-15: 0 is __syncthreads's): one load group of a CTA.
__device__ inline void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// Waits until at most `pending` of this thread's committed groups are in flight.
template <int pending>
__device__ inline void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(pending) : "memory");
}

// The same copy for rows that are not 16-byte aligned (an odd slice of a
// bigger cache): element-sized loads, then one 16-byte shared store. Slower,
// but it keeps any stride the API accepts working.
template <int kElementBytes>
__device__ inline void copy_chunk_unaligned(void *smem, const void *gmem, bool valid) {
  using Word = typename RawElement<kElementBytes>::type;
  constexpr int kWords = kChunkBytes / kElementBytes;
  Word words[kWords];
#pragma unroll
  for (int i = 0; i < kWords; ++i) words[i] = valid ? __ldg(static_cast<const Word *>(gmem) + i) : Word(0);
  *static_cast<uint4 *>(smem) = *reinterpret_cast<const uint4 *>(words);
}

// The first `count` bytes of a chunk, zeros after: the last chunk of an
// 8-bit row whose head_dim is not a multiple of 16 (what follows it belongs
// to another row, or to no allocation at all).
__device__ inline void copy_chunk_partial(void *smem, const void *gmem, int count) {
  uint8_t bytes[kChunkBytes];
#pragma unroll
  for (int i = 0; i < kChunkBytes; ++i) bytes[i] = i < count ? __ldg(static_cast<const uint8_t *>(gmem) + i) : 0;
  *static_cast<uint4 *>(smem) = *reinterpret_cast<const uint4 *>(bytes);
}

// Element offsets of one token's K and V rows.
struct KvRowOffsets {
  int64_t k;
  int64_t v;
};

// The page of a sequence that holds `token`, in the one way both loaders
// look pages up: a shift when the page size is a power of two, else a
// division. Tokens are below INT32_MAX (validation).
__device__ __forceinline__ int32_t page_in_sequence(const SplitParams &p, int32_t token) {
  return p.page_shift >= 0 ? token >> p.page_shift : token / p.page_size;
}

// A block-table entry as used: clamped into the pool, so that a bad entry
// reads a page of the pool, never memory outside it (one contract with the
// CPU backend: flashdecode.h, "Lengths and block tables").
__device__ __forceinline__ int32_t pool_page(const SplitParams &p, int32_t entry) {
  return max(0, min(entry, p.last_page));
}

// Where token `token` of sequence b, KV head h lives: a dense cache is
// [batch, token, head] strides; a paged one looks the page up in the block
// table and uses [page, slot, head] strides. 64-bit throughout: offsets pass
// 2^31 elements in large caches.
struct KvRowLocation {
  int64_t outer;  // sequence (dense) or pool page (paged)
  int64_t slot;   // token (dense) or slot in the page
};
__device__ inline KvRowLocation kv_row_location(const SplitParams &p, int64_t b, int64_t token) {
  int64_t outer, slot;
  if (p.block_table == nullptr) {
    outer = b;
    slot = token;
  } else {
    const int32_t token32 = static_cast<int32_t>(token);  // tokens < kv_capacity <= INT32_MAX
    const int32_t page = page_in_sequence(p, token32);
    outer = pool_page(p, __ldg(p.block_table + b * p.block_table_strides[0] + page * p.block_table_strides[1]));
    slot = token32 - page * p.page_size;
  }
  return {outer, slot};
}

__device__ inline KvRowOffsets kv_row_offsets(const KvRowLocation &at, const int64_t (&k_strides)[3],
                                              const int64_t (&v_strides)[3], int kv_head) {
  return {at.outer * k_strides[0] + at.slot * k_strides[1] + kv_head * k_strides[2],
          at.outer * v_strides[0] + at.slot * v_strides[1] + kv_head * v_strides[2]};
}

// Issues the copies of one tile: tokens [tile_begin, tile_begin + kTileTokens)
// of sequence b, KV head kv_head, into `stage` (K rows, then V rows, then
// with Traits::kScales each token's K and V scales where they vary by
// token). Tokens at or past `end` are zero-filled. Every thread of the CTA
// takes part; with the cp.async path the copies complete at a later
// cp_async_wait.
template <class T, class Traits>
__device__ void load_kv_tile(const SplitParams &p, unsigned char *stage, int64_t b, int kv_head, int64_t tile_begin,
                             int64_t end) {
  constexpr int kThreads = Traits::kThreads;
  constexpr int kTileTokens = Traits::kTileTokens;
  constexpr int kRowBytes = Traits::kRowBytes;
  constexpr int kChunksPerRow = kRowBytes / kChunkBytes;
  static_assert(kThreads % kChunksPerRow == 0, "a thread keeps one chunk column");
  constexpr int kRowsPerPass = kThreads / kChunksPerRow;
  static_assert(kTileTokens % kRowsPerPass == 0, "the tile is loaded in whole passes");

  const int column = threadIdx.x % kChunksPerRow;
  const int first_row = threadIdx.x / kChunksPerRow;
  const int row_bytes = p.head_dim * static_cast<int>(sizeof(T));
  const bool column_valid = column * kChunkBytes < row_bytes;
  const int column_bytes = min(kChunkBytes, row_bytes - column * kChunkBytes);  // < 16: 8-bit rows only
  const unsigned char *k_base = static_cast<const unsigned char *>(p.k) + column * kChunkBytes;
  const unsigned char *v_base = static_cast<const unsigned char *>(p.v) + column * kChunkBytes;
  unsigned char *k_stage = stage + column * kChunkBytes;
  unsigned char *v_stage = stage + kTileTokens * kRowBytes + column * kChunkBytes;

#pragma unroll
  for (int row = first_row; row < kTileTokens; row += kRowsPerPass) {
    const int64_t token = tile_begin + row;
    const bool valid = column_valid && token < end;
    // A zero-filled chunk still names an address: the tensor's first byte,
    // which exists, though nothing is read from it.
    const void *k_src = p.k;
    const void *v_src = p.v;
    const bool in_sequence = token < end;
    KvRowLocation at = {0, 0};
    if (valid || (Traits::kScales && column == 0 && in_sequence)) at = kv_row_location(p, b, token);
    if (valid) {
      const KvRowOffsets offsets = kv_row_offsets(at, p.k_strides, p.v_strides, kv_head);
      k_src = k_base + offsets.k * static_cast<int64_t>(sizeof(T));
      v_src = v_base + offsets.v * static_cast<int64_t>(sizeof(T));
    }
    if constexpr (Traits::kScales) {
      float *scales = reinterpret_cast<float *>(stage + Traits::kScaleOffset);
      if (column == 0 && p.k_scale_per_token) {
        const int64_t offset = kv_row_offsets(at, p.k_scale_strides, p.k_scale_strides, kv_head).k;
        cp_async_scale(scales + row, in_sequence ? p.k_scale + offset : p.k_scale, in_sequence);
      }
      if (column == 0 && p.v_scale_per_token) {
        const int64_t offset = kv_row_offsets(at, p.v_scale_strides, p.v_scale_strides, kv_head).v;
        cp_async_scale(scales + kTileTokens + row, in_sequence ? p.v_scale + offset : p.v_scale, in_sequence);
      }
    }
    if (valid && column_bytes < kChunkBytes) {
      copy_chunk_partial(k_stage + row * kRowBytes, k_src, column_bytes);
      copy_chunk_partial(v_stage + row * kRowBytes, v_src, column_bytes);
    } else if (p.kv_aligned) {
      cp_async_chunk(k_stage + row * kRowBytes, k_src, valid);
      cp_async_chunk(v_stage + row * kRowBytes, v_src, valid);
    } else {
      copy_chunk_unaligned<sizeof(T)>(k_stage + row * kRowBytes, k_src, valid);
      copy_chunk_unaligned<sizeof(T)>(v_stage + row * kRowBytes, v_src, valid);
    }
  }
}

// Byte offset of 16-byte chunk `chunk` of row `row` in a swizzled tile.
template <int kRowBytes>
__device__ __forceinline__ int swizzled(int row, int chunk) {
  return row * kRowBytes + ((chunk ^ (row & 7)) << 4);
}

// A lane's ldmatrix addresses in a swizzled tile: chunk first_chunk + 2 pair
// of row row_base + lane_row, for rows row_base that are multiples of 8. The
// swizzle only permutes chunks within a row's groups of 8, so 8 rows or 8
// chunks further is a constant further: with kPrecomputed, four offsets a
// lane are set once and each address is one of them plus a constant after
// unrolling (the generic swizzled() costs two integer instructions an
// ldmatrix).
template <int kRowBytes, bool kPrecomputed = true>
struct SwizzledLane {
  int lane_row, first_chunk;
  int offset[4];
  __device__ __forceinline__ SwizzledLane(int row, int chunk) : lane_row(row), first_chunk(chunk) {
#pragma unroll
    for (int i = 0; i < 4; ++i) offset[i] = swizzled<kRowBytes>(lane_row, first_chunk + 2 * i);
  }
  __device__ __forceinline__ int operator()(int row_base, int pair) const {
    if constexpr (kPrecomputed) {
      return row_base * kRowBytes + (pair >> 2) * 128 + offset[pair & 3];
    } else {
      return swizzled<kRowBytes>(row_base + lane_row, first_chunk + 2 * pair);
    }
  }
};

// The block-table ring of TileLoader (fetch_table), which the traits place
// in shared memory: `slots` slots of `groups` load groups' entries, a
// group's rows spanning at most group_tokens + 1 pages.
constexpr int table_ring_entries(int group_tokens) { return group_tokens + 4; }
constexpr int table_ring_bytes(int slots, int groups, int group_tokens) {
  return slots * groups * table_ring_entries(group_tokens) * 4;
}

// The tensor-core kernel's loader. Issues the copies of one tile (tokens
// [tile_begin, tile_begin + kTileTokens) of one sequence and KV head) into a
// swizzled stage: K rows, then V rows; row bytes come from the storage type
// (Traits::kElementBytes).
// Each thread keeps one 16-byte chunk column and takes every kRowsPerPass-th
// row of its load group's (Traits::kLoadGroups: the CTA, or each warp its
// own rows, whose stage it may then reuse after a warp's synchronisation
// only). A dense cache advances a pointer by a fixed stride. A paged one
// finds its first row's page and slot once per tile (a shift when the page
// size is a power of two, else one division) and steps both from pass to
// pass without dividing; with pages of up to 8 tokens it reads the block
// table entries from a shared-memory ring that the copies of the tile
// kStages loads before filled (fetch_table). Byte offsets within the pool are 32-bit products
// widened once (the host routes caches whose page or slot strides do not fit
// in 31 bits to the CUDA-core kernel: paged_fits_32bit in policy.cpp).
template <class Traits>
struct TileLoader {
  const SplitParams &p;
  const unsigned char *k_base;  // dense: this sequence and head; paged: this head; + this thread's column
  const unsigned char *v_base;
  const int32_t *table_row;  // paged: this sequence's block table row
  int32_t *table_ring;       // paged, small pages: Traits::kTableSlots slots in shared memory
  int first_row;
  int column;
  bool column_valid;
  // Paged: byte strides of a page and a slot, the block table's column
  // stride, and a pass's step (kRowsPerPass tokens) in whole pages and slots.
  int32_t k_page_bytes, v_page_bytes, k_slot_bytes, v_slot_bytes, table_stride;
  int32_t pass_pages, pass_slots;
  uint64_t l2_policy;  // kv_stream_policy()
  // Per-token scales (Traits::kScales, SplitParams::*_scale_per_token),
  // copied into the stage's scale area (Traits::kScaleOffset: K's, then
  // V's). Spread (kSpreadScales): a thread row's 2 x kPasses scales (each
  // pass's K and V) over the row's columns, copy j (pass j / 2, V if odd)
  // by column j % kChunksPerRow, so that each thread makes one or two copies
  // a tile and no warp issues eight: less code, which the instruction-fetch
  // bound head_dim 256 kernel gained most from. At head_dim 128, whose
  // kernels sit at their 128-register cap, the spread made ptxas spill and
  // the kernel slower (history, run 37): there column 0's threads copy all
  // of their rows' scales. The traits say which (Traits::kSpreadScales).
  int64_t k_scale_base, v_scale_base;  // dense: this sequence and head; paged: this head
  static constexpr bool kSpreadScales = Traits::kSpreadScales;
  // A load group's threads, the rows of its tile one pass covers, and its passes.
  static constexpr int kGroupThreads = Traits::kThreads / Traits::kLoadGroups;
  static constexpr int kRowsPerPass = kGroupThreads / Traits::kChunksPerRow;
  static constexpr int kPasses = Traits::kLoadGroupTokens / kRowsPerPass;
  static constexpr int kScaleCopies = (2 * kPasses + Traits::kChunksPerRow - 1) / Traits::kChunksPerRow;
  static constexpr int kTableSlotEntries = table_ring_entries(Traits::kLoadGroupTokens);
  static_assert(Traits::kThreads % Traits::kLoadGroups == 0 && kGroupThreads % Traits::kChunksPerRow == 0 &&
                    Traits::kLoadGroups * Traits::kLoadGroupTokens == Traits::kTileTokens &&
                    kPasses * kRowsPerPass == Traits::kLoadGroupTokens,
                "load groups of whole rows cover the tile");

  __device__ TileLoader(const SplitParams &params, int64_t b, int kv_head, int32_t *ring) : p(params) {
    column = threadIdx.x % Traits::kChunksPerRow;
    if constexpr (Traits::kLoadGroups == 1) {
      first_row = threadIdx.x / Traits::kChunksPerRow;
    } else {
      first_row = group_first_row() + threadIdx.x % kGroupThreads / Traits::kChunksPerRow;
    }
    column_valid = column * (kChunkBytes / Traits::kElementBytes) < p.head_dim;
    l2_policy = kv_stream_policy();
    int64_t k_offset = kv_head * p.k_strides[2];
    int64_t v_offset = kv_head * p.v_strides[2];
    table_row = nullptr;
    table_ring = p.block_table != nullptr && p.page_size <= kRingMaxPageSize ? ring : nullptr;
    if (p.block_table == nullptr) {
      k_offset += b * p.k_strides[0];
      v_offset += b * p.v_strides[0];
    } else {
      table_row = p.block_table + b * p.block_table_strides[0];
      k_page_bytes = static_cast<int32_t>(p.k_strides[0] * Traits::kElementBytes);
      v_page_bytes = static_cast<int32_t>(p.v_strides[0] * Traits::kElementBytes);
      k_slot_bytes = static_cast<int32_t>(p.k_strides[1] * Traits::kElementBytes);
      v_slot_bytes = static_cast<int32_t>(p.v_strides[1] * Traits::kElementBytes);
      table_stride = static_cast<int32_t>(p.block_table_strides[1]);
      pass_pages = kRowsPerPass / p.page_size;
      pass_slots = kRowsPerPass - pass_pages * p.page_size;
    }
    k_base = static_cast<const unsigned char *>(p.k) + k_offset * Traits::kElementBytes + column * kChunkBytes;
    v_base = static_cast<const unsigned char *>(p.v) + v_offset * Traits::kElementBytes + column * kChunkBytes;
    k_scale_base = kv_head * p.k_scale_strides[2] + (p.block_table == nullptr ? b * p.k_scale_strides[0] : 0);
    v_scale_base = kv_head * p.v_scale_strides[2] + (p.block_table == nullptr ? b * p.v_scale_strides[0] : 0);
  }

  // Whether tiles carry per-token scales: the copies of a tile's scales
  // are a loop of their own behind this one test (a test a row became
  // predicated copies, issued for per-tensor scales too).
  __device__ __forceinline__ bool copies_scales() const {
    return Traits::kScales && (p.k_scale_per_token || p.v_scale_per_token);
  }

  // This thread's copies of a tile's per-token scales: the scale of pass
  // `pass`'s row (K's, or V's if `value`) is at offset(pass, value)
  // elements of its tensor; rows at or past `remaining` (see load) are
  // zero-filled.
  template <class Offset>
  __device__ __forceinline__ void copy_scales(unsigned char *stage, int64_t remaining, Offset offset) const {
    if constexpr (Traits::kScales && !kSpreadScales) {
      float *scales = reinterpret_cast<float *>(stage + Traits::kScaleOffset);
      // Offsets for every thread, copies predicated: a branch around
      // column 0's loop measured slower.
#pragma unroll
      for (int pass = 0; pass < kPasses; ++pass) {
        const int64_t k_at = offset(pass, false);
        const int64_t v_at = offset(pass, true);
        const bool valid = pass * kRowsPerPass < remaining;
        const int row = first_row + pass * kRowsPerPass;
        if (column == 0 && p.k_scale_per_token)
          cp_async_scale(scales + row, valid ? p.k_scale + k_at : p.k_scale, valid);
        if (column == 0 && p.v_scale_per_token) {
          cp_async_scale(scales + Traits::kTileTokens + row, valid ? p.v_scale + v_at : p.v_scale, valid);
        }
      }
    } else if constexpr (Traits::kScales) {
      float *scales = reinterpret_cast<float *>(stage + Traits::kScaleOffset);
#pragma unroll
      for (int n = 0; n < kScaleCopies; ++n) {
        const int copy = column + n * Traits::kChunksPerRow;
        if (copy >= 2 * kPasses) break;
        const int pass = copy >> 1;
        const bool value = (copy & 1) != 0;
        if (!(value ? p.v_scale_per_token : p.k_scale_per_token)) continue;
        const float *tensor = value ? p.v_scale : p.k_scale;
        const bool valid = pass * kRowsPerPass < remaining;
        const int row = first_row + pass * kRowsPerPass;
        cp_async_scale(scales + (value ? Traits::kTileTokens : 0) + row, valid ? tensor + offset(pass, value) : tensor,
                       valid);
      }
    }
  }

  // Tile `tile` of a split that starts at token `begin`.
  __device__ __forceinline__ void load(unsigned char *stage, int64_t begin, int64_t tile, int64_t end) const {
    const int64_t tile_begin = begin + tile * Traits::kTileTokens;
    unsigned char *v_stage = stage + Traits::kTileTokens * Traits::kRowStride;
    const int64_t first_token = tile_begin + first_row;
    const int64_t remaining = end - first_token;  // rows i * kRowsPerPass < remaining are in the sequence
    if (p.block_table == nullptr) {
      const int64_t k_step = kRowsPerPass * p.k_strides[1] * Traits::kElementBytes;
      const int64_t v_step = kRowsPerPass * p.v_strides[1] * Traits::kElementBytes;
      const unsigned char *k_src = k_base + first_token * p.k_strides[1] * Traits::kElementBytes;
      const unsigned char *v_src = v_base + first_token * p.v_strides[1] * Traits::kElementBytes;
      // Every tile but a split's last has all its rows: there the copies
      // need no per-row test and no zero-fill address (instruction-bound
      // kernels, the rows and 8-bit ones, pay for each).
      const auto copy_rows = [&](auto whole_tile) {
#pragma unroll
        for (int i = 0; i < kPasses; ++i) {
          const bool in_sequence = decltype(whole_tile)::value || i * kRowsPerPass < remaining;
          const bool valid = decltype(whole_tile)::value || (column_valid && in_sequence);
          const int row = first_row + i * kRowsPerPass;
          const int offset = Traits::stage_offset(row, column);
          // A zero-filled chunk names the tensor's first byte, which exists; nothing is read.
          cp_async_kv_chunk(stage + offset, valid ? static_cast<const void *>(k_src) : p.k, valid, l2_policy);
          cp_async_kv_chunk(v_stage + offset, valid ? static_cast<const void *>(v_src) : p.v, valid, l2_policy);
          k_src += k_step;
          v_src += v_step;
        }
        if (copies_scales()) {
          // A whole tile's rows are all in the sequence: the tests fold away.
          const int64_t rows_in = decltype(whole_tile)::value ? int64_t{Traits::kTileTokens} : remaining;
          copy_scales(stage, rows_in, [&](int pass, bool value) {
            const int64_t token = first_token + pass * kRowsPerPass;
            return value ? v_scale_base + token * p.v_scale_strides[1] : k_scale_base + token * p.k_scale_strides[1];
          });
        }
      };
      if (column_valid && (kPasses - 1) * kRowsPerPass < remaining) {
        copy_rows(std::true_type{});
      } else {
        copy_rows(std::false_type{});
      }
    } else {
      // Every row's page number first, all loads in flight together, then the
      // copies back to back: a copy must not wait on its own table load
      // (the copies' memory clobber keeps the compiler from hoisting loads
      // past them). Tokens are below INT32_MAX (validation).
      const int32_t token = static_cast<int32_t>(first_token);
      int32_t page = page_in_sequence(p, token);
      int32_t slot = token - page * p.page_size;
      // The tiles before kStages read the table; later ones the ring slot
      // that this load group's copies of tile - kStages filled (complete
      // and visible: the main loop waited for that group and synchronised
      // the load group since).
      const int32_t *ring_slot = nullptr;
      int32_t ring_first_page = 0;
      if (table_ring != nullptr && tile >= Traits::kStages) {
        ring_slot = ring_slot_of(tile);
        ring_first_page = page_in_sequence(p, static_cast<int32_t>(tile_begin + group_first_row()));
      }
      int32_t pages[kPasses];
      int32_t slots[kPasses];
      if (ring_slot != nullptr) {
        step_rows(page, slot, pages, slots, remaining, [&](int32_t pg) { return ring_slot[pg - ring_first_page]; });
      } else {
        step_rows(page, slot, pages, slots, remaining,
                  [&](int32_t pg) { return __ldg(table_row + pg * table_stride); });
      }
#pragma unroll
      for (int i = 0; i < kPasses; ++i) {
        const bool valid = column_valid && i * kRowsPerPass < remaining;
        const int row = first_row + i * kRowsPerPass;
        const int offset = Traits::stage_offset(row, column);
        const void *k_src = p.k;
        const void *v_src = p.v;
        if (valid) {
          k_src = k_base + static_cast<int64_t>(pages[i]) * k_page_bytes + slots[i] * k_slot_bytes;
          v_src = v_base + static_cast<int64_t>(pages[i]) * v_page_bytes + slots[i] * v_slot_bytes;
        }
        cp_async_kv_chunk(stage + offset, k_src, valid, l2_policy);
        cp_async_kv_chunk(v_stage + offset, v_src, valid, l2_policy);
      }
      if (copies_scales()) {
        copy_scales(stage, remaining, [&](int pass, bool value) {
          // The pass's page and slot by unrolled selection: a runtime index
          // would put the arrays in local memory.
          int32_t page = pages[0], slot = slots[0];
#pragma unroll
          for (int i = 1; i < kPasses; ++i) {
            if (pass == i) {
              page = pages[i];
              slot = slots[i];
            }
          }
          return value ? v_scale_base + page * p.v_scale_strides[0] + slot * p.v_scale_strides[1]
                       : k_scale_base + page * p.k_scale_strides[0] + slot * p.k_scale_strides[1];
        });
      }
      if (table_ring != nullptr) fetch_table(begin, tile + Traits::kStages, end);
    }
  }

  // A piece's first kStages - 1 tiles of [begin, end) into stages 0, 1, ...,
  // a commit group each (empty ones too: the main loop's waits count
  // groups). Returns the piece's tiles (0 when it is empty).
  __device__ __forceinline__ int64_t start(unsigned char *stages, int64_t begin, int64_t end) const {
    const int64_t tiles = (end - begin + Traits::kTileTokens - 1) / Traits::kTileTokens;
#pragma unroll
    for (int s = 0; s < Traits::kStages - 1; ++s) {
      if (s < tiles) load(stages + s * Traits::kStageBytes, begin, s, end);
      cp_async_commit();
    }
    return tiles;
  }

  // This thread's rows of a tile, from the first one's page and slot: each
  // row's slot, and its page through `lookup` (a block table entry), the
  // lookups of all rows before any copy. One loop a lookup kind, so the
  // table loads are not split by a branch.
  template <class Lookup>
  __device__ __forceinline__ void step_rows(int32_t page, int32_t slot, int32_t (&pages)[kPasses],
                                            int32_t (&slots)[kPasses], int64_t remaining, Lookup lookup) const {
#pragma unroll
    for (int i = 0; i < kPasses; ++i) {
      // Columns past head_dim look their pages up too where they make
      // scale copies (kSpreadScales).
      const bool valid = (column_valid || (kSpreadScales && copies_scales())) && i * kRowsPerPass < remaining;
      slots[i] = slot;
      pages[i] = valid ? pool_page(p, lookup(page)) : 0;
      page += pass_pages;
      slot += pass_slots;
      if (slot >= p.page_size) {
        slot -= p.page_size;
        ++page;
      }
    }
  }

  // Copies into ring slot tile % kTableSlots the block table entries of
  // this load group's rows of tile `tile` (kStages loads ahead), one entry
  // a thread, in this load's commit group. With small pages a tile's entries are new cache lines, and
  // a lookup from global memory in front of its copies stalls the pipeline;
  // from the ring it is a shared-memory read. Larger pages lose a little to
  // the ring's code (tests/bench/policy.md, "Block-table ring").
  static constexpr int kRingMaxPageSize = 8;

  // This thread's load group, its first tile row, and the thread's place in it.
  __device__ static __forceinline__ int group() {
    return Traits::kLoadGroups == 1 ? 0 : static_cast<int>(threadIdx.x / kGroupThreads);
  }
  __device__ static __forceinline__ int group_first_row() { return group() * Traits::kLoadGroupTokens; }
  __device__ static __forceinline__ int group_thread() {
    return Traits::kLoadGroups == 1 ? static_cast<int>(threadIdx.x) : static_cast<int>(threadIdx.x % kGroupThreads);
  }

  // A load group's slot for tile `tile`: each group reads only the entries
  // its own threads fetched.
  __device__ __forceinline__ int32_t *ring_slot_of(int64_t tile) const {
    return table_ring + ((tile % Traits::kTableSlots) * Traits::kLoadGroups + group()) * kTableSlotEntries;
  }

  __device__ __forceinline__ void fetch_table(int64_t begin, int64_t tile, int64_t end) const {
    const int64_t group_begin = begin + tile * Traits::kTileTokens + group_first_row();
    if (group_begin >= end) return;
    const int32_t first_page = page_in_sequence(p, static_cast<int32_t>(group_begin));
    const int32_t last_page =
        page_in_sequence(p, static_cast<int32_t>(min(group_begin + Traits::kLoadGroupTokens, end) - 1));
    int32_t *slot = ring_slot_of(tile);
    for (int i = group_thread(); i <= last_page - first_page; i += kGroupThreads) {
      const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(slot + i));
      const int32_t *src = table_row + static_cast<int64_t>(first_page + i) * table_stride;
      asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(dst), "l"(src) : "memory");
    }
  }
};

// A piece's query rows [first_row, first_row + kRows) of KV head kv_head's
// rows into a staging tile, 16 bytes a thread at a time, `offset(row,
// chunk)` bytes into `stage`; zeros past the chunk's real rows
// (heads_here), sequence b's query tokens (q_len_b) and head_dim.
template <class T, int kRows, int kRowBytes, int kThreads, class Offset>
__device__ __forceinline__ void stage_query_rows(const SplitParams &p, int64_t b, int kv_head, int first_row,
                                                 int heads_here, int q_len_b, unsigned char *stage, Offset offset) {
  constexpr int kQueryChunks = kRowBytes / kChunkBytes;
  using Word = typename RawElement<sizeof(T)>::type;
  constexpr int kWords = kChunkBytes / sizeof(T);
  for (int i = threadIdx.x; i < kRows * kQueryChunks; i += kThreads) {
    const int row = i / kQueryChunks;
    const int column = i % kQueryChunks;
    Word words[kWords] = {};
    const QueryRow query = query_row(first_row + row, p.group_size, kv_head);
    if (row < heads_here && query.token < q_len_b && column * kWords < p.head_dim) {
      const Word *src = static_cast<const Word *>(p.q) + b * p.q_batch_stride + query.token * p.q_token_stride +
                        static_cast<int64_t>(query.q_head) * p.q_head_stride + column * kWords;
#pragma unroll
      for (int e = 0; e < kWords; ++e) words[e] = src[e];  // q may be unaligned: element loads, once a piece
    }
    *reinterpret_cast<uint4 *>(stage + offset(row, column)) = *reinterpret_cast<const uint4 *>(words);
  }
}

}  // namespace cuda
}  // namespace fd
