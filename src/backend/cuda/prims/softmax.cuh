// SPDX-License-Identifier: Apache-2.0
// The online-softmax state, the arithmetic that merges states, and the one
// output epilogue. All in base 2: scores arrive already multiplied by
// softmax_scale * log2(e) (folded into q), so exp2 replaces exp. A state with
// m = -inf is empty: it has seen no key and contributes nothing to a merge.
#pragma once

#include <cstdint>

#include "backend/cuda/params.h"
#include "backend/cuda/prims/element.cuh"

namespace fd {
namespace cuda {

constexpr float kLn2 = 0.6931471805599453f;

__device__ inline float negative_infinity() { return __int_as_float(0xff800000); }

// The larger of a and b, NaN if either is NaN (fmaxf drops a NaN). Every
// running and merged max goes through this: a NaN score reaches m, so that
// its row comes out NaN instead of looking masked or empty.
__device__ __forceinline__ float max_nan(float a, float b) {
  float r;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}

// exp2 of the hot loops: the MUFU's ex2 with results below 2^-126 flushed
// to zero. exp2f adds three instructions a call to keep those subnormal
// results, and a weight that small cannot change a softmax sum that holds a
// weight of at least 1 (the running max's own); the kernels that run out of
// instruction issue, not bandwidth, pay for every one.
__device__ __forceinline__ float exp2_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// One thread's share of one query head's online softmax: the running max m,
// the running sum l of exp2(score - m), and kVector elements of the
// unnormalised accumulator sum exp2(score - m) * v.
struct SoftmaxState {
  float m;
  float l;
  float acc[kVector];

  __device__ void reset() {
    m = negative_infinity();
    l = 0.0f;
#pragma unroll
    for (int i = 0; i < kVector; ++i) acc[i] = 0.0f;
  }

  // Makes room for a block of scores whose largest is block_max: rescales l
  // and acc to the new running max. Returns false while nothing finite has
  // been seen (then there is nothing to add).
  __device__ bool rescale(float block_max) {
    const float m_new = max_nan(m, block_max);
    if (m_new == negative_infinity()) return false;
    const float alpha = exp2_ftz(m - m_new);  // 0 when m was -inf
    l *= alpha;
#pragma unroll
    for (int i = 0; i < kVector; ++i) acc[i] *= alpha;
    m = m_new;
    return true;
  }

  // exp2(score - m): 0 for a masked (-inf) score.
  __device__ float weight(float score) const { return exp2_ftz(score - m); }

  // add for an 8-bit cache's per-token value scale: the weight p joins l,
  // p x scale multiplies v.
  __device__ void add_scaled(float p, float p_scaled, const float (&v)[kVector]) {
    l += p;
#pragma unroll
    for (int i = 0; i < kVector; ++i) acc[i] = fmaf(p_scaled, v[i], acc[i]);
  }

  __device__ void add(float p, const float (&v)[kVector]) {
    l += p;
#pragma unroll
    for (int i = 0; i < kVector; ++i) acc[i] = fmaf(p, v[i], acc[i]);
  }
};

// Weight of a partial state with max m_part when states are merged to the
// common max m_max (>= m_part): 0 for an empty state.
__device__ inline float merge_weight(float m_part, float m_max) {
  return m_part == negative_infinity() ? 0.0f : exp2f(m_part - m_max);
}

// sum += w * a, element by element (merges of float4 accumulator columns).
__device__ __forceinline__ void add_weighted(float4 &sum, float w, const float4 &a) {
  sum.x = fmaf(w, a.x, sum.x);
  sum.y = fmaf(w, a.y, sum.y);
  sum.z = fmaf(w, a.z, sum.z);
  sum.w = fmaf(w, a.w, sum.w);
}

// Natural-log log-sum-exp of a merged state; -inf when it is empty.
__device__ inline float natural_lse(float m, float l) {
  return m == negative_infinity() ? negative_infinity() : (m + log2f(l)) * kLn2;
}

// The output epilogue, shared by every kernel that finishes a query row:
// elements [first_d, first_d + N) of row (b, token, q_head) become acc / l
// in OutT, and with_lse, where the caller asks for the LSE, the natural-log
// LSE. An empty state (l = 0, acc = 0) gives zeros and LSE -inf. With
// sinks, exp(sink) joins the denominator here, once per row: the state is
// moved to the common max of m and the sink (an empty row then gives zeros
// and LSE = sink).
template <class OutT, int N>
__device__ __forceinline__ void write_output(const OutputParams &o, int64_t b, int token, int q_head, int first_d,
                                             const float (&acc)[N], float m, float l, bool with_lse) {
  float scale = 1.0f;     // of acc, when a sink moves the max
  float sink_lse = 0.0f;  // the LSE of a row that saw no key: exactly the sink
  bool sink_only = false;
  if (o.sinks != nullptr) {
    constexpr float kLog2e = 1.4426950408889634f;
    const float sink_logit = __ldg(o.sinks + q_head * o.sinks_stride);
    const float sink = sink_logit * kLog2e;
    if (sink != negative_infinity()) {
      sink_only = m == negative_infinity();
      sink_lse = sink_logit;
      const float m_new = max_nan(m, sink);
      scale = merge_weight(m, m_new);
      l = fmaf(l, scale, exp2f(sink - m_new));
      m = m_new;
    }
  }
  const float inv_l = l > 0.0f ? scale / l : 0.0f;
  OutT *out = static_cast<OutT *>(o.out) + b * o.out_batch_stride + token * o.out_token_stride +
              q_head * o.out_head_stride + first_d;
#pragma unroll
  for (int i = 0; i < N; ++i) out[i] = Element<OutT>::from_float(acc[i] * inv_l);
  if (with_lse && o.lse != nullptr) {
    o.lse[b * o.lse_batch_stride + token * o.lse_token_stride + q_head * o.lse_head_stride] =
        sink_only ? sink_lse : natural_lse(m, l);
  }
}

}  // namespace cuda
}  // namespace fd
