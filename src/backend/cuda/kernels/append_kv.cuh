// SPDX-License-Identifier: Apache-2.0
// fd_append_kv: this step's new K and V rows into the cache, converted to
// its dtype (flashdecode.h, fd_append_args). One thread per kAppendElements
// consecutive elements of one new row (sequence, new token, KV head), K's
// and V's alike; it reads the sequence's length, the page its position
// falls in and the position's scales, all on the device, so a captured
// graph replays with their current values. A position before the cache's
// start or on a page outside the pool is not written.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "backend/cuda/params.h"
#include "backend/cuda/prims/element.cuh"
#include "backend/cuda/prims/quantized.cuh"

namespace fd {
namespace cuda {

constexpr int kAppendThreads = 256;
constexpr int kAppendElements = 4;

// Element `index` of a float tensor of a runtime dtype (f32, f16, bf16).
__device__ __forceinline__ float load_float(const void *data, int32_t dtype, int64_t index) {
  switch (dtype) {
    case FD_DTYPE_F16: return __half2float(static_cast<const __half *>(data)[index]);
    case FD_DTYPE_BF16: return __bfloat162float(static_cast<const __nv_bfloat16 *>(data)[index]);
    default: return static_cast<const float *>(data)[index];
  }
}

// x into element `index` of a cache of a runtime dtype: 16- and 32-bit
// types round to nearest even; 8-bit ones quantize x / scale.
__device__ __forceinline__ void store_cache(void *data, int32_t dtype, int64_t index, float x, float scale,
                                            bool scaled) {
  switch (dtype) {
    case FD_DTYPE_F32: static_cast<float *>(data)[index] = x; return;
    case FD_DTYPE_F16: static_cast<__half *>(data)[index] = __float2half_rn(x); return;
    case FD_DTYPE_BF16: static_cast<__nv_bfloat16 *>(data)[index] = __float2bfloat16_rn(x); return;
    default: static_cast<uint8_t *>(data)[index] = quantize(scaled ? __fdiv_rn(x, scale) : x, dtype); return;
  }
}

__global__ void __launch_bounds__(kAppendThreads) append_kv_kernel(const AppendParams p) {
  // Only the last `landing` new tokens can have a position in the cache.
  const int64_t landing = min(p.new_len, p.kv_capacity);
  const int64_t groups_per_row = (p.head_dim + kAppendElements - 1) / kAppendElements;
  const int64_t total = p.batch * landing * p.kv_heads * groups_per_row;
  for (int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; t < total;
       t += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t group = t % groups_per_row;
    int64_t rest = t / groups_per_row;
    const int h = static_cast<int>(rest % p.kv_heads);
    rest /= p.kv_heads;
    const int64_t i = p.new_len - landing + rest % landing;
    const int64_t b = rest / landing;

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
    const float k_scale =
        p.k_scale != nullptr
            ? p.k_scale[outer * p.k_scale_strides[0] + slot * p.k_scale_strides[1] + h * p.k_scale_strides[2]]
            : 1.0f;
    const float v_scale =
        p.v_scale != nullptr
            ? p.v_scale[outer * p.v_scale_strides[0] + slot * p.v_scale_strides[1] + h * p.v_scale_strides[2]]
            : 1.0f;
    const int64_t k_row = outer * p.k_strides[0] + slot * p.k_strides[1] + h * p.k_strides[2];
    const int64_t v_row = outer * p.v_strides[0] + slot * p.v_strides[1] + h * p.v_strides[2];
    const int64_t k_new_row = b * p.k_new_strides[0] + i * p.k_new_strides[1] + h * p.k_new_strides[2];
    const int64_t v_new_row = b * p.v_new_strides[0] + i * p.v_new_strides[1] + h * p.v_new_strides[2];
    const int first = static_cast<int>(group) * kAppendElements;
    const int last = min(first + kAppendElements, p.head_dim);
    for (int d = first; d < last; ++d) {
      store_cache(p.k, p.cache_dtype, k_row + d, load_float(p.k_new, p.k_new_dtype, k_new_row + d), k_scale,
                  p.k_scale != nullptr);
      store_cache(p.v, p.cache_dtype, v_row + d, load_float(p.v_new, p.v_new_dtype, v_new_row + d), v_scale,
                  p.v_scale != nullptr);
    }
  }
}

}  // namespace cuda
}  // namespace fd
