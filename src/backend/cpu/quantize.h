// SPDX-License-Identifier: Apache-2.0
// The 8-bit cache formats (flashdecode.h, "Quantized caches" and
// fd_append_args) for the CPU backend: exact decoding to float, and the
// float -> 8-bit conversions of fd_append_kv. The CUDA backend must store the
// same bytes: its fp8 conversions are the hardware's cvt.rn.satfinite
// (__nv_cvt_float_to_fp8 with __NV_SATFINITE), which these reproduce bit for
// bit, and its int8 conversion must follow float_to_i8 below.
//
//   E4M3 (OCP float8_e4m3fn): s.eeee.mmm, bias 7. exponent 0 is subnormal
//        (m * 2^-9); no infinity; s.1111.111 (0x7F, 0xFF) is NaN; the largest
//        finite value is 1.75 * 2^8 = 448 (0x7E).
//   E5M2 (OCP float8_e5m2): s.eeeee.mm, bias 15, IEEE-like: exponent 0 is
//        subnormal (m * 2^-16), exponent 31 is infinity (m = 0) or NaN;
//        the largest finite value is 1.75 * 2^15 = 57344 (0x7B).
//   I8:  two's complement; the value is the integer.
//
// Float to fp8 (float_to_e4m3, float_to_e5m2), as cvt.rn.satfinite:
// round to nearest, ties to even, at the format's precision (subnormals
// included); a result beyond the largest finite value (infinities
// included) saturates to +-max; zero keeps its sign, and so does a value
// that rounds to zero; every NaN, of either sign and any payload, becomes
// 0x7F (the positive canonical NaN of both formats, as CUDA's
// __nv_cvt_float_to_fp8 gives for NaN; its software path turns any NaN into
// 0x7FFFFFFF first).
#pragma once

#include <cmath>
#include <cstdint>

#include "backend/cpu/convert.h"
#include "flashdecode.h"

namespace fd {

// Exact value of an fp8 byte with `mantissa_bits` mantissa bits and
// exponent bias `bias`; `ieee_specials` selects E5M2's infinities and NaNs
// (all-ones exponent) over E4M3's single NaN (all-ones exponent and mantissa).
inline float fp8_to_float(uint8_t byte, int mantissa_bits, int bias, bool ieee_specials) {
  const float sign = (byte & 0x80u) ? -1.0f : 1.0f;
  const int exponent = (byte & 0x7f) >> mantissa_bits;
  const int mantissa = byte & ((1 << mantissa_bits) - 1);
  const int max_exponent = ieee_specials ? 31 : 15;
  if (exponent == max_exponent) {
    if (ieee_specials) return mantissa == 0 ? sign * INFINITY : NAN;
    if (mantissa == (1 << mantissa_bits) - 1) return NAN;
  }
  if (exponent == 0) return sign * std::ldexp(static_cast<float>(mantissa), 1 - bias - mantissa_bits);
  return sign * std::ldexp(static_cast<float>((1 << mantissa_bits) | mantissa), exponent - bias - mantissa_bits);
}

inline float e4m3_to_float(uint8_t byte) { return fp8_to_float(byte, 3, 7, false); }
inline float e5m2_to_float(uint8_t byte) { return fp8_to_float(byte, 2, 15, true); }
inline float i8_to_float(uint8_t byte) { return static_cast<float>(static_cast<int8_t>(byte)); }

// Float to an fp8 format with `mantissa_bits` mantissa bits and bias `bias`
// whose largest finite byte (sign clear) is `max_byte`, by the rules above.
// Works on the float's bits: no dependence on the floating-point rounding mode.
inline uint8_t float_to_fp8(float x, int mantissa_bits, int bias, uint8_t max_byte) {
  const uint32_t bits = float_to_bits(x);
  const uint8_t sign = static_cast<uint8_t>((bits >> 24) & 0x80u);
  const uint32_t abs = bits & 0x7fffffffu;
  if (abs > 0x7f800000u) return 0x7f;              // NaN
  if (abs >= 0x7f800000u) return sign | max_byte;  // infinity saturates
  const int drop = 23 - mantissa_bits;             // float mantissa bits that go
  const int float_exponent = static_cast<int>(abs >> 23);
  // The smallest normal fp8 value is 2^(1 - bias), a float exponent field of 128 - bias.
  const int min_normal_field = 128 - bias;
  uint32_t code;
  if (float_exponent >= min_normal_field) {
    // Normal: keep the top mantissa bits, round the rest to nearest even (a
    // carry moves into the exponent), then rebias the exponent field.
    const uint32_t rounded = (abs + ((1u << (drop - 1)) - 1u) + ((abs >> drop) & 1u)) >> drop;
    code = rounded - (static_cast<uint32_t>(127 - bias) << mantissa_bits);
  } else {
    // Subnormal fp8 (or zero): the value in units of 2^(1 - bias - mantissa_bits),
    // from the 24-bit significand (with its implicit 1; float subnormals are
    // far below the fp8 range and round to zero).
    if (float_exponent == 0) return sign;
    const uint32_t significand = (abs & 0x7fffffu) | 0x800000u;
    // value = significand * 2^(float_exponent - 150) = n * 2^(1 - bias - mantissa_bits)
    const int shift = (1 - bias - mantissa_bits) - (float_exponent - 150);  // > drop
    if (shift > 24) return sign;                                            // below half the smallest subnormal
    const uint32_t kept = significand >> shift;
    const uint32_t rest = significand & ((1u << shift) - 1u);
    const uint32_t half = 1u << (shift - 1);
    code = kept + ((rest > half || (rest == half && (kept & 1u))) ? 1u : 0u);
  }
  if (code > max_byte) code = max_byte;  // beyond the largest finite value: saturate
  return static_cast<uint8_t>(sign | code);
}

inline uint8_t float_to_e4m3(float x) { return float_to_fp8(x, 3, 7, 0x7e); }
inline uint8_t float_to_e5m2(float x) { return float_to_fp8(x, 2, 15, 0x7b); }

// Float to int8: round to nearest, ties to even, clamp to [-127, 127]
// (-128 is never written, so the format stays symmetric); NaN stores 0.
// Infinities clamp. Clamped before rounding, so the rounding sees only
// |x| <= 127 and is done by integer arithmetic on an exact float.
inline uint8_t float_to_i8(float x) {
  if (std::isnan(x)) return 0;
  if (x >= 127.0f) return 127;
  if (x <= -127.0f) return static_cast<uint8_t>(-127);
  const float floor_x = std::floor(x);
  const float rest = x - floor_x;  // exact: |x| < 128
  int32_t n = static_cast<int32_t>(floor_x);
  if (rest > 0.5f || (rest == 0.5f && (n & 1))) ++n;
  return static_cast<uint8_t>(static_cast<int8_t>(n));
}

// Every value of an 8-bit cache dtype as a float, built once: a row loads by
// one lookup per element, like the fp16 HalfTable.
struct ByteTable {
  float values[256];
  explicit ByteTable(float (*decode)(uint8_t)) {
    for (int i = 0; i < 256; ++i) values[i] = decode(static_cast<uint8_t>(i));
  }
};

// The table of an 8-bit cache dtype (E4M3, E5M2, I8); nullptr for another.
inline const float *byte_table(fd_dtype dtype) {
  // Never destroyed: usable during exit.
  static const ByteTable *e4m3 = new ByteTable(e4m3_to_float);
  static const ByteTable *e5m2 = new ByteTable(e5m2_to_float);
  static const ByteTable *i8 = new ByteTable(i8_to_float);
  switch (dtype) {
    case FD_DTYPE_E4M3: return e4m3->values;
    case FD_DTYPE_E5M2: return e5m2->values;
    case FD_DTYPE_I8: return i8->values;
    default: return nullptr;
  }
}

// The byte fd_append_kv stores for x (already divided by its scale) in an
// 8-bit cache dtype; 0 for another dtype (never asked).
inline uint8_t quantize_byte(fd_dtype dtype, float x) {
  switch (dtype) {
    case FD_DTYPE_E4M3: return float_to_e4m3(x);
    case FD_DTYPE_E5M2: return float_to_e5m2(x);
    case FD_DTYPE_I8: return float_to_i8(x);
    default: return 0;
  }
}

}  // namespace fd
