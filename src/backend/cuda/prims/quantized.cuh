// SPDX-License-Identifier: Apache-2.0
// 8-bit cache elements (e4m3, e5m2, int8): decoding to 16-bit and float
// values, and quantizing for fd_append_kv. The format is a template
// parameter where the kernel is bound by instructions (the tensor-core 8-bit
// kernels: one per format), else a runtime value (SplitParams::kv_format, an
// fd_dtype, warp-uniform: one CUDA-core kernel serves all three).
//
// Every value of the three formats is exact in fp16 (e4m3: up to 448, down
// to 2^-9; e5m2 is fp16 with a 2-bit mantissa; int8 is an integer below
// 2^11), so fp16 is the one intermediate: bf16 and float are exact from it.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>
#include <type_traits>

#include "flashdecode.h"

namespace fd {
namespace cuda {

// Two elements (bytes 2*half and 2*half+1 of raw) as fp16, exactly.
// kFormat: an 8-bit fd_dtype known at compile time (the hot loops), or 0
// to read `format` at run time.
template <int kFormat = 0>
__device__ __forceinline__ __half2 dequantize_pair(uint32_t raw, int half, int format = kFormat) {
  if (kFormat != 0) format = kFormat;
  if (format == FD_DTYPE_E5M2) {  // the byte is the fp16's upper byte
    const uint32_t bits = __byte_perm(raw, 0u, half ? 0x3424u : 0x1404u);
    return *reinterpret_cast<const __half2 *>(&bits);
  }
  if (format == FD_DTYPE_I8) {
    // 0x6400 | (b ^ 0x80) is the fp16 1024 + (b + 128); subtracting 1152
    // leaves b (every step exact).
    const uint32_t bits = __byte_perm(raw ^ 0x80808080u, 0x64646464u, half ? 0x5352u : 0x5150u);
    return __hsub2(*reinterpret_cast<const __half2 *>(&bits), __half2half2(__ushort_as_half(0x6480)));
  }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  // The instruction of __nv_cvt_fp8x2_to_halfraw2, on the register's half
  // itself: ptxas reads the upper one in place, where a 16-bit argument
  // cost a shift for every second pair.
  uint32_t bits;
  if (half) {
    asm("{\n .reg .b16 lo, hi;\n mov.b32 {lo, hi}, %1;\n cvt.rn.f16x2.e4m3x2 %0, hi;\n}" : "=r"(bits) : "r"(raw));
  } else {
    asm("{\n .reg .b16 lo, hi;\n mov.b32 {lo, hi}, %1;\n cvt.rn.f16x2.e4m3x2 %0, lo;\n}" : "=r"(bits) : "r"(raw));
  }
  return *reinterpret_cast<const __half2 *>(&bits);
#else
  const __half2_raw pair = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(raw >> (16 * half)), __NV_E4M3);
  return *reinterpret_cast<const __half2 *>(&pair);
#endif
}

// A pair of 16-bit values of type T as one 32-bit word.
template <class T>
__device__ __forceinline__ uint32_t pack_pair(float a, float b);
template <>
__device__ __forceinline__ uint32_t pack_pair<__half>(float a, float b) {
  const __half2 h = __floats2half2_rn(a, b);
  return *reinterpret_cast<const uint32_t *>(&h);
}
template <>
__device__ __forceinline__ uint32_t pack_pair<__nv_bfloat16>(float a, float b) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
  return *reinterpret_cast<const uint32_t *>(&h);
}

// dequantize_pair as a pair of T (f16 or bf16), exactly.
template <class T, int kFormat>
__device__ __forceinline__ uint32_t dequantize_pair_as(uint32_t raw, int half) {
  const __half2 pair = dequantize_pair<kFormat>(raw, half);
  if constexpr (std::is_same_v<T, __half>) {
    return *reinterpret_cast<const uint32_t *>(&pair);
  } else {
    const float2 f = __half22float2(pair);
    return pack_pair<T>(f.x, f.y);
  }
}

// dequantize_pair times per-element scales, in float, rounded once to T.
template <class T, int kFormat>
__device__ __forceinline__ uint32_t dequantize_pair_scaled(uint32_t raw, int half, float2 scale) {
  const float2 f = __half22float2(dequantize_pair<kFormat>(raw, half));
  return pack_pair<T>(f.x * scale.x, f.y * scale.y);
}

// Eight elements (8 bytes, 8-byte aligned) as floats, exactly.
template <int kFormat>
__device__ __forceinline__ void dequantize8(const unsigned char *src, float (&dst)[8]) {
  const uint2 raw = *reinterpret_cast<const uint2 *>(src);
  const uint32_t words[2] = {raw.x, raw.y};
#pragma unroll
  for (int w = 0; w < 2; ++w) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float2 f = __half22float2(dequantize_pair<kFormat>(words[w], h));
      dst[4 * w + 2 * h] = f.x;
      dst[4 * w + 2 * h + 1] = f.y;
    }
  }
}

// x rounded to nearest even into an 8-bit format: fp8 saturates to its
// largest finite value and keeps NaN (cvt.rn.satfinite, or CUDA's software
// path before sm_89); int8 clamps to [-127, 127] and stores 0 for NaN
// (flashdecode.h, fd_append_args).
__device__ __forceinline__ uint8_t quantize(float x, int format) {
  if (format == FD_DTYPE_I8) {
    if (x != x) return 0;
    const float r = fminf(fmaxf(rintf(x), -127.0f), 127.0f);
    return static_cast<uint8_t>(static_cast<int8_t>(r));
  }
  return __nv_cvt_float_to_fp8(x, __NV_SATFINITE, format == FD_DTYPE_E5M2 ? __NV_E5M2 : __NV_E4M3);
}

// A scale that is the same for every token of sequence b's KV head (per
// tensor, per KV head, per sequence): read once. 1 without scales; unused
// (1) when it varies by token (then the stages carry it).
__device__ __forceinline__ float sequence_scale(const float *scale, const int64_t (&strides)[3], bool per_token,
                                                bool paged, int64_t b, int kv_head) {
  if (scale == nullptr || per_token) return 1.0f;
  return __ldg(scale + kv_head * strides[2] + (paged ? 0 : b * strides[0]));
}

}  // namespace cuda
}  // namespace fd
