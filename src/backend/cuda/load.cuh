// Moving K/V from global to shared memory. A pipeline stage holds one tile of
// consecutive tokens of one sequence and KV head, K rows then V rows, each
// row padded to the head-dim bucket. The loader works in 16-byte chunks of
// raw storage bytes and knows nothing of the element type beyond its size, so
// a quantised (fp8) cache only changes how many elements a chunk holds and
// how the compute side converts them.
//
// Chunks past the head dim or past the sequence's end are zero-filled without
// touching global memory: data beyond a sequence's length is never read, and
// the compute side may multiply by what is in shared memory without masking.
#pragma once

#include <cstdint>
#include <type_traits>

#include "backend/cuda/launch.h"

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
// alone the lines that are reused (block table, partials, q). On by default
// from CUDA 13.4; -DFD_KV_EVICT_FIRST=0 or 1 overrides (1 only with a ptxas
// of 13.4.59 or newer). Older ptxas drop the createpolicy and keep the
// copies that read its register: an illegal instruction at run time (on
// flashdecode's head_dim-64 kernels with 13.0 and 13.3.73; Triton met the
// same, triton-lang/triton#11660 and #11848). Passing the policy in as a
// kernel parameter did not avoid it. tests/tools/check_sass_descriptors.py
// finds such kernels in a built library (CTest sass_descriptors).
#ifndef FD_KV_EVICT_FIRST
#if defined(__CUDACC_VER_MAJOR__) && (__CUDACC_VER_MAJOR__ > 13 || (__CUDACC_VER_MAJOR__ == 13 && __CUDACC_VER_MINOR__ >= 4))
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

__device__ inline void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }

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
  using Word = typename std::conditional<kElementBytes == 4, uint32_t, uint16_t>::type;
  constexpr int kWords = kChunkBytes / kElementBytes;
  Word words[kWords];
#pragma unroll
  for (int i = 0; i < kWords; ++i) words[i] = valid ? __ldg(static_cast<const Word *>(gmem) + i) : Word(0);
  *static_cast<uint4 *>(smem) = *reinterpret_cast<const uint4 *>(words);
}

// Element offsets of one token's K and V rows.
struct KvRowOffsets {
  int64_t k;
  int64_t v;
};

// Where token `token` of sequence b, KV head h lives: a dense cache is
// [batch, token, head] strides; a paged one looks the page up in the block
// table and uses [page, slot, head] strides. 64-bit throughout: offsets pass
// 2^31 elements in large caches.
__device__ inline KvRowOffsets kv_row_offsets(const SplitParams &p, int64_t b, int64_t token, int kv_head) {
  int64_t outer, slot;
  if (p.block_table == nullptr) {
    outer = b;
    slot = token;
  } else {
    const int32_t token32 = static_cast<int32_t>(token);  // tokens < kv_capacity <= INT32_MAX
    const int32_t page_in_sequence = token32 / p.page_size;
    outer = __ldg(p.block_table + b * p.block_table_strides[0] + page_in_sequence * p.block_table_strides[1]);
    slot = token32 - page_in_sequence * p.page_size;
  }
  return {outer * p.k_strides[0] + slot * p.k_strides[1] + kv_head * p.k_strides[2],
          outer * p.v_strides[0] + slot * p.v_strides[1] + kv_head * p.v_strides[2]};
}

// Issues the copies of one tile: tokens [tile_begin, tile_begin + kTileTokens)
// of sequence b, KV head kv_head, into `stage` (K rows, then V rows). Tokens
// at or past `end` are zero-filled. Every thread of the CTA takes part; with
// the cp.async path the copies complete at a later cp_async_wait.
template <class T, int kThreads, int kTileTokens, int kRowBytes>
__device__ void load_kv_tile(const SplitParams &p, unsigned char *stage, int64_t b, int kv_head, int64_t tile_begin,
                             int64_t end) {
  constexpr int kChunksPerRow = kRowBytes / kChunkBytes;
  static_assert(kThreads % kChunksPerRow == 0, "a thread keeps one chunk column");
  constexpr int kRowsPerPass = kThreads / kChunksPerRow;
  static_assert(kTileTokens % kRowsPerPass == 0, "the tile is loaded in whole passes");

  const int column = threadIdx.x % kChunksPerRow;
  const int first_row = threadIdx.x / kChunksPerRow;
  const bool column_valid = column * kChunkBytes < p.head_dim * static_cast<int>(sizeof(T));
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
    if (valid) {
      const KvRowOffsets offsets = kv_row_offsets(p, b, token, kv_head);
      k_src = k_base + offsets.k * static_cast<int64_t>(sizeof(T));
      v_src = v_base + offsets.v * static_cast<int64_t>(sizeof(T));
    }
    if (p.kv_aligned) {
      cp_async_chunk(k_stage + row * kRowBytes, k_src, valid);
      cp_async_chunk(v_stage + row * kRowBytes, v_src, valid);
    } else {
      copy_chunk_unaligned<sizeof(T)>(k_stage + row * kRowBytes, k_src, valid);
      copy_chunk_unaligned<sizeof(T)>(v_stage + row * kRowBytes, v_src, valid);
    }
  }
}

}  // namespace cuda
}  // namespace fd
