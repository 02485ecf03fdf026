// SPDX-License-Identifier: Apache-2.0
// fd_append_kv: this step's new K and V rows into the cache, converted to
// its dtype (flashdecode.h, fd_append_args), K's and V's alike. A thread
// takes 8 consecutive elements of one new row (sequence, new token, KV
// head): blockIdx.y the new token, x the (head, 8 elements). It reads the
// sequence's length, the page its position falls in and the position's
// scales, all on the device, so a captured graph replays with their current
// values. A position before the cache's start or on a page outside the pool
// is not written. kVector: every row starts on 16 bytes and head_dim is a
// multiple of 8 (AppendParams::vector): one load and one store per 8
// elements, else one per element.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "backend/cuda/params.h"
#include "backend/cuda/prims/element.cuh"
#include "backend/cuda/prims/grid_dependency.cuh"
#include "backend/cuda/prims/quantized.cuh"

namespace fd {
namespace cuda {

constexpr int kAppendThreads = 128;
constexpr int kAppendElements = kAppendVectorElements;

// A cache element type: its storage and the conversion of x / scale into it.
template <int kCacheDtype>
struct CacheElement {
  using type = uint8_t;  // the 8-bit formats
  __device__ static type from(float x, float scale, bool scaled) {
    return quantize(scaled ? __fdiv_rn(x, scale) : x, kCacheDtype);
  }
};
template <>
struct CacheElement<FD_DTYPE_F32> {
  using type = float;
  __device__ static type from(float x, float, bool) { return x; }
};
template <>
struct CacheElement<FD_DTYPE_F16> {
  using type = __half;
  __device__ static type from(float x, float, bool) { return __float2half_rn(x); }
};
template <>
struct CacheElement<FD_DTYPE_BF16> {
  using type = __nv_bfloat16;
  __device__ static type from(float x, float, bool) { return __float2bfloat16_rn(x); }
};

// Up to eight consecutive new values of one row (count; all eight with
// kVector) as floats.
template <class NewT, bool kVector>
__device__ __forceinline__ void load_new_chunk(const NewT *src, int first, int count, float (&x)[kAppendElements]) {
  if constexpr (kVector) {
    if constexpr (sizeof(NewT) == 4) {
      const float4 a = reinterpret_cast<const float4 *>(src + first)[0];
      const float4 b = reinterpret_cast<const float4 *>(src + first)[1];
      x[0] = a.x, x[1] = a.y, x[2] = a.z, x[3] = a.w, x[4] = b.x, x[5] = b.y, x[6] = b.z, x[7] = b.w;
    } else {
      Element<NewT>::to_float8(src + first, x);
    }
  } else {
#pragma unroll
    for (int e = 0; e < kAppendElements; ++e) x[e] = e < count ? Element<NewT>::to_float(src[first + e]) : 0.0f;
  }
}

// The chunk load_new_chunk read, converted into the cache's row.
template <int kCacheDtype, bool kVector>
__device__ __forceinline__ void store_chunk(const float (&x)[kAppendElements], void *dst_row, int first, int count,
                                            float scale, bool scaled) {
  using C = typename CacheElement<kCacheDtype>::type;
  C *dst = static_cast<C *>(dst_row) + first;
  if constexpr (kVector) {
    C out[kAppendElements];
#pragma unroll
    for (int e = 0; e < kAppendElements; ++e) out[e] = CacheElement<kCacheDtype>::from(x[e], scale, scaled);
    constexpr int kWords = sizeof(out) / 8;  // 8-byte stores: 1, 2 or 4
#pragma unroll
    for (int w = 0; w < kWords; ++w) reinterpret_cast<uint2 *>(dst)[w] = reinterpret_cast<const uint2 *>(out)[w];
  } else {
#pragma unroll
    for (int e = 0; e < kAppendElements; ++e) {
      if (e < count) dst[e] = CacheElement<kCacheDtype>::from(x[e], scale, scaled);
    }
  }
}

// A scale tensor's value at (outer, slot, head h). Scales that do not vary
// by position (strides 0 on the first two dimensions: per tensor, per
// head) are read before the length and the page are known: the kernel is
// a chain of dependent loads, and each link it drops is a round trip.
struct AppendScale {
  float value = 1.0f;
  __device__ AppendScale(const float *scale, const int64_t (&strides)[3], int h) {
    if (scale != nullptr && strides[0] == 0 && strides[1] == 0) value = scale[h * strides[2]];
  }
  __device__ float at(const float *scale, const int64_t (&strides)[3], int64_t outer, int64_t slot, int h) const {
    if (scale == nullptr || (strides[0] == 0 && strides[1] == 0)) return value;
    return scale[outer * strides[0] + slot * strides[1] + h * strides[2]];
  }
};

template <class NewT, int kCacheDtype, bool kVector>
__global__ void __launch_bounds__(kAppendThreads) append_kv_kernel(const AppendParams p) {
  // Launched programmatically (sm_90+), it waits for the kernel before it
  // (which may write k_new) and lets the decode after it be scheduled; the
  // decode waits for this grid to finish before it reads the cache.
  split_kernel_prologue();
  const int groups = (p.head_dim + kAppendElements - 1) / kAppendElements;
  const int item = static_cast<int>(blockIdx.x) * kAppendThreads + static_cast<int>(threadIdx.x);
  if (item >= p.kv_heads * groups) return;
  const int h = item / groups;
  const int first = (item - h * groups) * kAppendElements;
  const int count = min(kAppendElements, p.head_dim - first);
  // Only the last `landing` new tokens can have a position in the cache.
  const int64_t landing = min(p.new_len, p.kv_capacity);
  const AppendScale k_scale_early(p.k_scale, p.k_scale_strides, h);
  const AppendScale v_scale_early(p.v_scale, p.v_scale_strides, h);
  for (int64_t token = blockIdx.y; token < p.batch * landing; token += gridDim.y) {
    const int64_t b = token / landing;
    const int64_t i = p.new_len - landing + (token - b * landing);
    // The new values first: their loads overlap the length's and the page's.
    const NewT *k_new =
        static_cast<const NewT *>(p.k_new) + b * p.k_new_strides[0] + i * p.k_new_strides[1] + h * p.k_new_strides[2];
    const NewT *v_new =
        static_cast<const NewT *>(p.v_new) + b * p.v_new_strides[0] + i * p.v_new_strides[1] + h * p.v_new_strides[2];
    float k_values[kAppendElements], v_values[kAppendElements];
    load_new_chunk<NewT, kVector>(k_new, first, count, k_values);
    load_new_chunk<NewT, kVector>(v_new, first, count, v_values);
    int64_t len = p.kv_capacity;
    if (p.seq_lens != nullptr) len = min(max(static_cast<int64_t>(p.seq_lens[b * p.seq_lens_stride]), int64_t{0}), len);
    const int64_t pos = len - p.new_len + i;
    if (pos < 0) continue;
    int64_t outer = b, slot = pos;
    if (p.block_table != nullptr) {
      const int64_t column = pos / p.page_size;
      outer = p.block_table[b * p.block_table_strides[0] + column * p.block_table_strides[1]];
      if (outer < 0 || outer >= p.num_pages) continue;  // never outside the pool
      slot = pos - column * p.page_size;
    }
    const float k_scale = k_scale_early.at(p.k_scale, p.k_scale_strides, outer, slot, h);
    const float v_scale = v_scale_early.at(p.v_scale, p.v_scale_strides, outer, slot, h);
    using C = typename CacheElement<kCacheDtype>::type;
    C *k_row = static_cast<C *>(p.k) + outer * p.k_strides[0] + slot * p.k_strides[1] + h * p.k_strides[2];
    C *v_row = static_cast<C *>(p.v) + outer * p.v_strides[0] + slot * p.v_strides[1] + h * p.v_strides[2];
    store_chunk<kCacheDtype, kVector>(k_values, k_row, first, count, k_scale, p.k_scale != nullptr);
    store_chunk<kCacheDtype, kVector>(v_values, v_row, first, count, v_scale, p.v_scale != nullptr);
  }
}

}  // namespace cuda
}  // namespace fd
