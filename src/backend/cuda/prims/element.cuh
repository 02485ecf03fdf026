// SPDX-License-Identifier: Apache-2.0
// Storage element types and their conversion to and from float. The
// CUDA-core kernel works on 8 consecutive elements of a row per thread (one
// "vector"). A new storage type is an Element specialisation and a StorageOf
// entry here, then a case in dispatch.cu's dtype switch.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "flashdecode.h"

namespace fd {
namespace cuda {

constexpr int kVector = 8;  // elements per thread vector

template <class T>
struct Element;

template <>
struct Element<float> {
  __device__ static float to_float(float x) { return x; }
  __device__ static float from_float(float x) { return x; }
  // Eight floats from 16-byte aligned shared memory.
  __device__ static void to_float8(const float *src, float (&dst)[kVector]) {
    const float4 a = reinterpret_cast<const float4 *>(src)[0];
    const float4 b = reinterpret_cast<const float4 *>(src)[1];
    dst[0] = a.x, dst[1] = a.y, dst[2] = a.z, dst[3] = a.w;
    dst[4] = b.x, dst[5] = b.y, dst[6] = b.z, dst[7] = b.w;
  }
  // Eight floats to 16-byte aligned memory.
  __device__ static void from_float8(const float (&src)[kVector], float *dst) {
    reinterpret_cast<float4 *>(dst)[0] = make_float4(src[0], src[1], src[2], src[3]);
    reinterpret_cast<float4 *>(dst)[1] = make_float4(src[4], src[5], src[6], src[7]);
  }
};

template <>
struct Element<__half> {
  __device__ static float to_float(__half x) { return __half2float(x); }
  __device__ static __half from_float(float x) { return __float2half_rn(x); }
  __device__ static void to_float8(const __half *src, float (&dst)[kVector]) {
    const uint4 raw = *reinterpret_cast<const uint4 *>(src);
    const __half2 *pairs = reinterpret_cast<const __half2 *>(&raw);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 f = __half22float2(pairs[i]);
      dst[2 * i] = f.x;
      dst[2 * i + 1] = f.y;
    }
  }
  __device__ static void from_float8(const float (&src)[kVector], __half *dst) {
    uint32_t words[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const __half2 pair = __floats2half2_rn(src[2 * i], src[2 * i + 1]);
      words[i] = *reinterpret_cast<const uint32_t *>(&pair);
    }
    *reinterpret_cast<uint4 *>(dst) = make_uint4(words[0], words[1], words[2], words[3]);
  }
};

template <>
struct Element<__nv_bfloat16> {
  __device__ static float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
  __device__ static __nv_bfloat16 from_float(float x) { return __float2bfloat16_rn(x); }
  __device__ static void to_float8(const __nv_bfloat16 *src, float (&dst)[kVector]) {
    const uint4 raw = *reinterpret_cast<const uint4 *>(src);
    const __nv_bfloat162 *pairs = reinterpret_cast<const __nv_bfloat162 *>(&raw);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 f = __bfloat1622float2(pairs[i]);
      dst[2 * i] = f.x;
      dst[2 * i + 1] = f.y;
    }
  }
  __device__ static void from_float8(const float (&src)[kVector], __nv_bfloat16 *dst) {
    uint32_t words[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const __nv_bfloat162 pair = __floats2bfloat162_rn(src[2 * i], src[2 * i + 1]);
      words[i] = *reinterpret_cast<const uint32_t *>(&pair);
    }
    *reinterpret_cast<uint4 *>(dst) = make_uint4(words[0], words[1], words[2], words[3]);
  }
};

// The unsigned integer of an element's size, for moving elements as raw bits.
template <int kBytes>
struct RawElement;
template <>
struct RawElement<1> {
  using type = uint8_t;
};
template <>
struct RawElement<2> {
  using type = uint16_t;
};
template <>
struct RawElement<4> {
  using type = uint32_t;
};

// The storage type of an fd_dtype, for the dispatch switch.
template <fd_dtype D>
struct StorageOf;
template <>
struct StorageOf<FD_DTYPE_F32> {
  using type = float;
};
template <>
struct StorageOf<FD_DTYPE_F16> {
  using type = __half;
};
template <>
struct StorageOf<FD_DTYPE_BF16> {
  using type = __nv_bfloat16;
};

}  // namespace cuda
}  // namespace fd
