// SPDX-License-Identifier: Apache-2.0
// Hopper's warpgroup MMA (wgmma.mma_async, sm_90a only): the four warps of
// a warpgroup multiply a 64-row A by a B in shared memory, read through a
// matrix descriptor, with f32 accumulators in registers. Warp w of the
// warpgroup holds rows 16w .. 16w + 15 of the result in the layout of
// mma.sync m16n8k16's accumulators, one [4] per 8 columns, and A from
// registers takes that instruction's A fragments: code written for a warp's
// m16n8k16 tiles (the softmax, P's packing) works on wgmma's unchanged.
//
// Operands in shared memory use the 128-byte swizzle: 8-row atoms of
// 128-byte rows whose 16-byte chunk c of row r sits at chunk c ^ (r % 8),
// the atoms 1024-byte aligned (wgmma_swizzled_offset). A row of head_dim 128
// (256 bytes) is two such column blocks.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

// Device code for sm_90a, the only target with wgmma.
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define FD_HAS_WGMMA 1
#else
#define FD_HAS_WGMMA 0
#endif

namespace fd {
namespace cuda {

// Byte offset of 16-byte chunk `chunk` of row `row` in a tile of `rows`
// rows stored as 128-byte-swizzled column blocks of 64 16-bit elements.
template <int kRows>
__host__ __device__ constexpr int wgmma_swizzled_offset(int row, int chunk) {
  return (chunk >> 3) * (kRows * 128) + row * 128 + (((chunk & 7) ^ (row & 7)) << 4);
}

// Dynamic shared memory `smem` rounded up to a multiple of kAlignment bytes
// of the shared window (up to kAlignment - 16 bytes, which the kernel's
// size must include); 16 or less: as it is.
template <int kAlignment>
__device__ __forceinline__ unsigned char *align_shared(unsigned char *smem) {
  if constexpr (kAlignment <= 16) {
    return smem;
  } else {
    const uint32_t address = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
    return smem + ((kAlignment - (address & (kAlignment - 1))) & (kAlignment - 1));
  }
}

// A shared-memory matrix descriptor with the 128-byte swizzle: start
// address, the byte offsets between atoms along the leading and the
// strided dimension, the swizzle mode in bits 62-63.
__device__ __forceinline__ uint64_t wgmma_descriptor(const void *smem, uint32_t leading_bytes, uint32_t stride_bytes) {
  const uint32_t address = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  return static_cast<uint64_t>((address & 0x3FFFFu) >> 4) | (static_cast<uint64_t>(leading_bytes >> 4) << 16) |
         (static_cast<uint64_t>(stride_bytes >> 4) << 32) | (uint64_t{1} << 62);
}

// The same descriptor `bytes` further (a multiple of 16; the start address
// field does not overflow in shared memory).
__device__ __forceinline__ uint64_t wgmma_advance(uint64_t descriptor, uint32_t bytes) {
  return descriptor + (bytes >> 4);
}

// Orders this thread's generic-proxy shared-memory writes (cp.async,
// st.shared) before later reads by wgmma (the async proxy); then a barrier.
__device__ __forceinline__ void fence_async_shared() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

// Before a warpgroup's first wgmma on registers that other instructions wrote.
__device__ __forceinline__ void wgmma_fence() {
#if FD_HAS_WGMMA
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}

__device__ __forceinline__ void wgmma_commit() {
#if FD_HAS_WGMMA
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}

// Waits for all of the warpgroup's committed wgmma groups.
__device__ __forceinline__ void wgmma_wait_all() {
#if FD_HAS_WGMMA
  asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
#endif
}

// Keeps the compiler from moving accesses to accumulator registers across
// the asynchronous MMA's issue and wait.
template <int kTiles>
__device__ __forceinline__ void wgmma_fence_registers(float (&d)[kTiles][4]) {
#pragma unroll
  for (int t = 0; t < kTiles; ++t) {
#pragma unroll
    for (int e = 0; e < 4; ++e) asm volatile("" : "+f"(d[t][e])::"memory");
  }
}

// m64nNk16 with f32 accumulators for the 16-bit types (TYPE: "f16" or
// "bf16"), one asm text per shape. SS: A and B from shared memory, both
// K-major; with outputs "=f" and SCALE_D 0 it overwrites D (the first
// k-step), with "+f" and 1 it adds to it. RS: A
// from registers (m16n8k16's A fragments of the warp's 16 rows), B from
// shared memory MN-major (transposed: B's rows are K), D += A B.
#define FD_WGMMA_SS_N64(TYPE, OUT, SCALE_D)                                                                        \
  asm volatile(                                                                                                    \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"                                                                 \
      "wgmma.mma_async.sync.aligned.m64n64k16.f32." TYPE "." TYPE                                                  \
      " "                                                                                                          \
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, " \
      "%23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, 0, 0;\n}\n"                                \
      : OUT(d[0][0]), OUT(d[0][1]), OUT(d[0][2]), OUT(d[0][3]), OUT(d[1][0]), OUT(d[1][1]), OUT(d[1][2]),          \
        OUT(d[1][3]), OUT(d[2][0]), OUT(d[2][1]), OUT(d[2][2]), OUT(d[2][3]), OUT(d[3][0]), OUT(d[3][1]),          \
        OUT(d[3][2]), OUT(d[3][3]), OUT(d[4][0]), OUT(d[4][1]), OUT(d[4][2]), OUT(d[4][3]), OUT(d[5][0]),          \
        OUT(d[5][1]), OUT(d[5][2]), OUT(d[5][3]), OUT(d[6][0]), OUT(d[6][1]), OUT(d[6][2]), OUT(d[6][3]),          \
        OUT(d[7][0]), OUT(d[7][1]), OUT(d[7][2]), OUT(d[7][3])                                                     \
      : "l"(a), "l"(b), "r"(SCALE_D))
#define FD_WGMMA_RS(N, TYPE)                                                                                \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" FD_WGMMA_RS_SCALE_##N                                   \
               ", 0;\n"                                                                                     \
               "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." TYPE "." TYPE " " FD_WGMMA_RS_OPERANDS_##N \
               ", p, 1, 1, 1;\n}\n"                                                                         \
               : FD_WGMMA_RS_OUTPUTS_##N                                                                    \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1))
#define FD_WGMMA_RS_SCALE_64 "37"
#define FD_WGMMA_RS_OPERANDS_64                                                                                     \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, " \
  "%24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36"
#define FD_WGMMA_RS_OUTPUTS_64                                                                                 \
  "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]),     \
      "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), \
      "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), \
      "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), \
      "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])
#define FD_WGMMA_RS_SCALE_128 "69"
#define FD_WGMMA_RS_OPERANDS_128                                                                                      \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, "   \
  "%24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, "    \
  "%46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, " \
  "%68"
#define FD_WGMMA_RS_OUTPUTS_128                                                                                       \
  "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]),            \
      "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]),        \
      "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]),        \
      "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]),        \
      "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]), "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]),        \
      "+f"(d[8][3]), "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]), "+f"(d[10][0]), "+f"(d[10][1]),      \
      "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]), "+f"(d[12][0]), \
      "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]), "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]), \
      "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]), "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), \
      "+f"(d[15][3])

template <class T>
struct Wgmma {
  static_assert(std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>, "wgmma here takes fp16 or bf16");
  static constexpr bool kHalf = std::is_same_v<T, __half>;

  // The first k-step: D = A B (D's old values are not read).
  __device__ static void ss_n64_first(float (&d)[8][4], uint64_t a, uint64_t b) {
#if FD_HAS_WGMMA
    if constexpr (kHalf) {
      FD_WGMMA_SS_N64("f16", "=f", 0);
    } else {
      FD_WGMMA_SS_N64("bf16", "=f", 0);
    }
#else
    static_assert(sizeof(T) == 0, "wgmma only in sm_90a device code (FD_HAS_WGMMA)");
    (void)d, (void)a, (void)b;
#endif
  }
  // D += A B.
  __device__ static void ss_n64(float (&d)[8][4], uint64_t a, uint64_t b) {
#if FD_HAS_WGMMA
    if constexpr (kHalf) {
      FD_WGMMA_SS_N64("f16", "+f", 1);
    } else {
      FD_WGMMA_SS_N64("bf16", "+f", 1);
    }
#else
    static_assert(sizeof(T) == 0, "wgmma only in sm_90a device code (FD_HAS_WGMMA)");
    (void)d, (void)a, (void)b;
#endif
  }
  // D += A B, N = 8 kTiles (64 or 128).
  template <int kTiles>
  __device__ static void rs(float (&d)[kTiles][4], const uint32_t (&a)[4], uint64_t b) {
    static_assert(kTiles == 8 || kTiles == 16, "m64n64k16 or m64n128k16");
#if FD_HAS_WGMMA
    if constexpr (kTiles == 8 && kHalf) {
      FD_WGMMA_RS(64, "f16");
    } else if constexpr (kTiles == 8) {
      FD_WGMMA_RS(64, "bf16");
    } else if constexpr (kHalf) {
      FD_WGMMA_RS(128, "f16");
    } else {
      FD_WGMMA_RS(128, "bf16");
    }
#else
    static_assert(sizeof(T) == 0, "wgmma only in sm_90a device code (FD_HAS_WGMMA)");
    (void)d, (void)a, (void)b;
#endif
  }
};

}  // namespace cuda
}  // namespace fd

#undef FD_WGMMA_RS
#undef FD_WGMMA_RS_OPERANDS_128
#undef FD_WGMMA_RS_OPERANDS_64
#undef FD_WGMMA_RS_OUTPUTS_128
#undef FD_WGMMA_RS_OUTPUTS_64
#undef FD_WGMMA_RS_SCALE_128
#undef FD_WGMMA_RS_SCALE_64
#undef FD_WGMMA_SS_N64
