// SPDX-License-Identifier: Apache-2.0
// The CPU backend's inner loops: the scores' dot products and the
// weighted sums of V rows, on GCC/Clang vector extensions. Every lane is
// plain elementwise IEEE arithmetic in a fixed order, so a score or an
// accumulator element has one value whatever instructions the compiler
// picks for it. Vectors stay local to these functions: passed or returned
// by value, their calling convention would depend on the compile target.
#pragma once

#include <cstdint>
#include <cstring>

namespace fd {
namespace lanes {

// Four lanes: the width every x86-64 and AArch64 CPU has registers for, so
// compilers keep these in registers; a wider compile target still runs them.
typedef float f32x4 __attribute__((vector_size(16)));

// A dot product sums in eight lanes (two of these vectors).
constexpr int kWidth = 8;

inline void load(f32x4 &v, const float *p) { std::memcpy(&v, p, sizeof v); }

// out[i] = a . b_i for the kCount rows b_i = b + i * stride, each summed in
// eight lanes over the multiples of 8, the lanes pairwise, then the rest in
// order: the same value for a row whether it is computed alone (kCount 1)
// or beside others, whose independent sums keep the adders busy.
template <int kCount>
inline void dots(const float *a, const float *b, int64_t stride, int64_t n, float *out) {
  f32x4 low[kCount] = {}, high[kCount] = {};
  int64_t d = 0;
  for (; d + kWidth <= n; d += kWidth) {
    f32x4 x_low, x_high;
    load(x_low, a + d);
    load(x_high, a + d + 4);
    for (int i = 0; i < kCount; ++i) {
      f32x4 y_low, y_high;
      load(y_low, b + i * stride + d);
      load(y_high, b + i * stride + d + 4);
      low[i] += x_low * y_low;
      high[i] += x_high * y_high;
    }
  }
  for (int i = 0; i < kCount; ++i) {
    const f32x4 &l = low[i], &h = high[i];
    float total = ((l[0] + l[1]) + (l[2] + l[3])) + ((h[0] + h[1]) + (h[2] + h[3]));
    for (int64_t e = d; e < n; ++e) total += a[e] * b[i * stride + e];
    out[i] = total;
  }
}

// acc[d] += weight[t] * v[t * n + d] for t = 0 .. tokens - 1 in order, for
// every d < n: each element's sum in token order, 16 of them held in
// registers over all the tokens.
inline void accumulate(float *acc, const float *weight, const float *v, int64_t tokens, int64_t n) {
  int64_t d = 0;
  for (; d + 16 <= n; d += 16) {
    f32x4 a[4];
    std::memcpy(a, acc + d, sizeof a);
    for (int64_t t = 0; t < tokens; ++t) {
      f32x4 row[4];
      std::memcpy(row, v + t * n + d, sizeof row);
      for (int i = 0; i < 4; ++i) a[i] += weight[t] * row[i];
    }
    std::memcpy(acc + d, a, sizeof a);
  }
  for (; d + 4 <= n; d += 4) {
    f32x4 a;
    load(a, acc + d);
    for (int64_t t = 0; t < tokens; ++t) {
      f32x4 row;
      load(row, v + t * n + d);
      a += weight[t] * row;
    }
    std::memcpy(acc + d, &a, sizeof a);
  }
  for (; d < n; ++d) {
    for (int64_t t = 0; t < tokens; ++t) acc[d] += weight[t] * v[t * n + d];
  }
}

}  // namespace lanes
}  // namespace fd
