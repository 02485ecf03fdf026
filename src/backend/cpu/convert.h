// SPDX-License-Identifier: Apache-2.0
// Software fp16 / bf16 <-> float conversion for the CPU backend, so it needs
// no compiler half-precision support. Rounding is to nearest, ties to even,
// as the GPU's conversion instructions do.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#endif

#include "flashdecode.h"

namespace fd {

inline float bits_to_float(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

inline uint32_t float_to_bits(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  return bits;
}

inline float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu;
  uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0x1f) return bits_to_float(sign | 0x7f800000u | (mantissa << 13));  // inf / NaN
  if (exponent != 0) return bits_to_float(sign | ((exponent + 112) << 23) | (mantissa << 13));
  if (mantissa == 0) return bits_to_float(sign);  // signed zero
  // Subnormal: normalise the mantissa.
  int shift = 0;
  while ((mantissa & 0x400u) == 0) {
    mantissa <<= 1;
    ++shift;
  }
  return bits_to_float(sign | static_cast<uint32_t>(113 - shift) << 23 | ((mantissa & 0x3ffu) << 13));
}

inline uint16_t float_to_half(float f) {
  const uint32_t bits = float_to_bits(f);
  const uint32_t sign = (bits >> 16) & 0x8000u;
  const uint32_t abs = bits & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);   // NaN
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to inf
  // A normal half.
  if (abs >= 0x38800000u) {
    const uint32_t rounded = abs + 0xfffu + ((abs >> 13) & 1u);
    return static_cast<uint16_t>(sign | ((rounded - 0x38000000u) >> 13));
  }
  if (abs < 0x33000000u) return static_cast<uint16_t>(sign);  // rounds to zero
  // Subnormal half: shift the implicit-one mantissa into place, ties to even.
  const uint32_t exponent = abs >> 23;
  const uint32_t mantissa = (abs & 0x7fffffu) | 0x800000u;
  const uint32_t shift = 126 - exponent;  // 14..24
  const uint32_t half_mantissa = mantissa >> shift;
  const uint32_t remainder = mantissa & ((1u << shift) - 1);
  const uint32_t halfway = 1u << (shift - 1);
  const uint32_t round_up = remainder > halfway || (remainder == halfway && (half_mantissa & 1u));
  return static_cast<uint16_t>(sign | (half_mantissa + round_up));
}

inline float bf16_to_float(uint16_t b) { return bits_to_float(static_cast<uint32_t>(b) << 16); }

inline uint16_t float_to_bf16(float f) {
  const uint32_t bits = float_to_bits(f);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40u);  // quiet NaN
  return static_cast<uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

// Element access by storage type, for kernels templated on fd_dtype.
template <fd_dtype D>
struct Storage;
template <>
struct Storage<FD_DTYPE_F32> {
  using type = float;
  static float load(const float *p) { return *p; }
  static void load_row(const float *src, float *dst, int64_t n) { std::memcpy(dst, src, n * sizeof(float)); }
  static void store(float *p, float x) { *p = x; }
};
#if defined(__x86_64__)
// fp16 rows through F16C's conversion (x86-64 CPUs since 2012), exact like
// the table, eight values an instruction instead of a lookup each.
__attribute__((target("avx,f16c"))) inline void half_row_f16c(const uint16_t *src, float *dst, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i *>(src + i))));
  }
  for (; i < n; ++i) dst[i] = _cvtsh_ss(src[i]);
}
#endif

// Every fp16 value as float, built once: a load is then one table lookup;
// and whether this CPU converts rows itself.
struct HalfTable {
  float values[1 << 16];
  bool f16c = false;
  HalfTable() {
    for (uint32_t h = 0; h < (1u << 16); ++h) values[h] = half_to_float(static_cast<uint16_t>(h));
#if defined(__x86_64__)
    // CPUID leaf 1, ECX bit 29 (some compilers' __builtin_cpu_supports has
    // no "f16c"); AVX's check includes the OS's saving of its registers.
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    f16c = __builtin_cpu_supports("avx") && __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & (1u << 29)) != 0;
#endif
  }
};
inline const HalfTable &half_table() {
  static const HalfTable *table = new HalfTable;  // never destroyed: usable during exit
  return *table;
}

template <>
struct Storage<FD_DTYPE_F16> {
  using type = uint16_t;
  static float load(const uint16_t *p) { return half_table().values[*p]; }
  static void load_row(const uint16_t *src, float *dst, int64_t n) {
    const HalfTable &table = half_table();
#if defined(__x86_64__)
    if (table.f16c) return half_row_f16c(src, dst, n);
#endif
    for (int64_t i = 0; i < n; ++i) dst[i] = table.values[src[i]];
  }
  static void store(uint16_t *p, float x) { *p = float_to_half(x); }
};
template <>
struct Storage<FD_DTYPE_BF16> {
  using type = uint16_t;
  static float load(const uint16_t *p) { return bf16_to_float(*p); }
  static void load_row(const uint16_t *src, float *dst, int64_t n) {
    for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_float(src[i]);
  }
  static void store(uint16_t *p, float x) { *p = float_to_bf16(x); }
};

// Element `offset` of float storage of a dtype known at run time (the
// states of a merge may differ in dtype); 0 for a dtype that is not one
// (validation admits none).
inline float load_element(fd_dtype dtype, const void *data, int64_t offset) {
  switch (dtype) {
    case FD_DTYPE_F32: return Storage<FD_DTYPE_F32>::load(static_cast<const float *>(data) + offset);
    case FD_DTYPE_F16: return Storage<FD_DTYPE_F16>::load(static_cast<const uint16_t *>(data) + offset);
    case FD_DTYPE_BF16: return Storage<FD_DTYPE_BF16>::load(static_cast<const uint16_t *>(data) + offset);
    default: return 0.0f;
  }
}

}  // namespace fd
