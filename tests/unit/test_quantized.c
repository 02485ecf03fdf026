// SPDX-License-Identifier: Apache-2.0
/* Quantized KV caches on the CPU backend (flashdecode.h, "Quantized caches"
 * and fd_append_args): decode over e4m3, e5m2 and int8 caches with every
 * scale mode (none, per tensor, per KV head, per token and head), q dtype,
 * dense and paged layout, ragged lengths and a few variants, against the
 * float64 reference over stored value x scale, with padding that holds NaN
 * and saturating bytes and NaN or huge scales (a read shows); scales with
 * zeros and a wide range, with q of every float dtype; scale x code
 * products of large magnitude; every byte code of each format inside a
 * sequence, as a value (bit-exact) and as a key, against a float64 decoder
 * of this file's own (NaN codes, E5M2 infinities, the largest finite codes,
 * int8 -128, products that overflow float32 or fall into its subnormals,
 * and the non-finite rules on the scores they make); fd_append_kv's
 * rounding of every format against fdt_quantize (ties, subnormals,
 * saturation, NaN, infinities, -0), into dense caches and page pools (page
 * boundaries, pages shared by two sequences, negative positions, entries
 * outside the pool, per-token scales), with only the new tokens' elements
 * written; append then decode; and the validation errors of both calls,
 * each naming its argument, with nothing written. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fdt.h"
#include "flashdecode.h"

static const char *last_message(void) {
  static char buffer[512];
  fd_last_error_message(buffer, sizeof buffer);
  return buffer;
}

static const fd_dtype kCacheDtypes[] = {FD_DTYPE_E4M3, FD_DTYPE_E5M2, FD_DTYPE_I8};
static const fd_dtype kFloatDtypes[] = {FD_DTYPE_F32, FD_DTYPE_F16, FD_DTYPE_BF16};

/* Decodes p on h and checks it against the reference; nonzero (after
 * printing why) on a mismatch. */
static int decode_and_check(fd_handle *h, fdt_problem *p, const char *what) {
  char description[384], report[256];
  fdt_case_describe(&p->c, description, sizeof description);
  const fd_status status = fd_decode(h, &p->args, NULL);
  if (status != FD_SUCCESS) {
    print_message("%s: %s: fd_decode failed: %s\n", what, description, last_message());
    return 1;
  }
  const int bad = fdt_check(p, report, sizeof report, NULL, NULL);
  if (bad) print_message("%s: %s: %s\n", what, description, report);
  return bad;
}

static int check_case(fd_handle *h, const fdt_case *c, const char *what) {
  fdt_problem p;
  assert_int_equal(fdt_problem_make(&p, c), 0);
  const int bad = decode_and_check(h, &p, what);
  fdt_problem_free(&p);
  return bad;
}

static fdt_case base_case(fd_dtype kv_dtype, fd_dtype q_dtype, fdt_scale_mode mode, fdt_layout layout) {
  fdt_case c = {0};
  c.batch = 5;
  c.q_heads = 8;
  c.kv_heads = 2;
  c.head_dim = 64;
  c.kv_len = 100;
  c.page_size = 16;
  c.dtype = q_dtype;
  c.out_dtype = q_dtype;
  c.kv_dtype = kv_dtype;
  c.scale_mode = mode;
  c.layout = layout;
  c.ragged = 1;
  c.with_lse = 1;
  return c;
}

/* ---- the test data itself ---------------------------------------------------------- */
/* fdt's float64 conversions against a few known bytes (every byte is
 * decoded by the library inside a sequence, against a decoder of this
 * file's own, in test_decode_every_value_code and test_decode_every_key_code
 * below), and a generated problem's cache: 8-bit storage, padding bytes and
 * scales where expected. */
static void test_fdt_formats(void **state) {
  (void)state;
  assert_int_equal(fdt_quantize(FD_DTYPE_E4M3, 448.0), 0x7e);
  assert_int_equal(fdt_quantize(FD_DTYPE_E4M3, 464.0), 0x7e); /* tie: 448 is even, and 480 is NaN */
  assert_int_equal(fdt_quantize(FD_DTYPE_E4M3, 1e9), 0x7e);
  assert_int_equal(fdt_quantize(FD_DTYPE_E4M3, -INFINITY), 0xfe);
  assert_int_equal(fdt_quantize(FD_DTYPE_E4M3, NAN), 0x7f);
  assert_int_equal(fdt_quantize(FD_DTYPE_E4M3, -NAN), 0x7f);
  assert_int_equal(fdt_quantize(FD_DTYPE_E4M3, -0.0), 0x80);
  assert_int_equal(fdt_quantize(FD_DTYPE_E4M3, ldexp(1.0, -9)), 0x01);  /* smallest subnormal */
  assert_int_equal(fdt_quantize(FD_DTYPE_E4M3, ldexp(1.0, -10)), 0x00); /* half of it: ties to even 0 */
  assert_int_equal(fdt_quantize(FD_DTYPE_E4M3, ldexp(3.0, -10)), 0x02); /* 1.5 units: even 2 */
  assert_int_equal(fdt_quantize(FD_DTYPE_E4M3, 1.0625), 0x38);          /* 1 + 1/16: tie to 1.0 */
  assert_int_equal(fdt_quantize(FD_DTYPE_E4M3, 1.1875), 0x3a);          /* 1 + 3/16: tie to 1.25 */
  assert_int_equal(fdt_quantize(FD_DTYPE_E5M2, 57344.0), 0x7b);
  assert_int_equal(fdt_quantize(FD_DTYPE_E5M2, 61440.0), 0x7b); /* the tie with infinity saturates */
  assert_int_equal(fdt_quantize(FD_DTYPE_E5M2, INFINITY), 0x7b);
  assert_int_equal(fdt_quantize(FD_DTYPE_E5M2, -INFINITY), 0xfb);
  assert_int_equal(fdt_quantize(FD_DTYPE_E5M2, NAN), 0x7f);
  assert_int_equal(fdt_quantize(FD_DTYPE_E5M2, ldexp(1.0, -16)), 0x01);
  assert_int_equal(fdt_quantize(FD_DTYPE_E5M2, -1.0), 0xbc);
  assert_int_equal(fdt_quantize(FD_DTYPE_I8, 2.5), 2);
  assert_int_equal(fdt_quantize(FD_DTYPE_I8, -3.5), (uint8_t)-4);
  assert_int_equal(fdt_quantize(FD_DTYPE_I8, 300.0), 127);
  assert_int_equal(fdt_quantize(FD_DTYPE_I8, -300.0), (uint8_t)-127);
  assert_int_equal(fdt_quantize(FD_DTYPE_I8, NAN), 0);
  assert_true(isnan(fdt_fp8_value(FD_DTYPE_E4M3, 0xff)));
  assert_true(fdt_fp8_value(FD_DTYPE_E4M3, 0x7e) == 448.0);
  assert_true(fdt_fp8_value(FD_DTYPE_E5M2, 0x7c) == INFINITY);
  assert_true(isnan(fdt_fp8_value(FD_DTYPE_E5M2, 0x7d)));
  assert_true(fdt_fp8_value(FD_DTYPE_E5M2, 0x03) == 3.0 * ldexp(1.0, -16));
  assert_true(fdt_fp8_value(FD_DTYPE_I8, 0x80) == -128.0);
  /* Every finite byte round-trips. */
  for (int d = 0; d < 3; ++d) {
    for (int b = 0; b < 256; ++b) {
      const double x = fdt_fp8_value(kCacheDtypes[d], (uint8_t)b);
      if (isnan(x) || isinf(x) || (kCacheDtypes[d] == FD_DTYPE_I8 && b == 0x80)) continue;
      assert_int_equal(fdt_quantize(kCacheDtypes[d], x), b);
    }
  }

  fdt_case c = base_case(FD_DTYPE_E4M3, FD_DTYPE_F16, FDT_SCALE_TOKEN, FDT_BNHD);
  c.batch = 2;
  c.seed = 3;
  fdt_problem p;
  assert_int_equal(fdt_problem_make(&p, &c), 0);
  assert_int_equal(p.args.k.dtype, FD_DTYPE_E4M3);
  assert_int_equal(p.kv_bytes, (size_t)(2 * 100 * 2 * 64));
  assert_non_null(p.args.k_scale.data);
  /* Sequence 0 is empty (ragged edge lengths): its first row is padding. */
  assert_int_equal(p.lens[0], 0);
  assert_int_equal(((uint8_t *)p.k)[0], fdt_pad_byte(FD_DTYPE_E4M3, 0));
  const float s = p.k_scale[0];
  assert_true(isnan(s) || s == 1e30f);
  fdt_problem_free(&p);
}

/* ---- decode: every cache dtype x q dtype x scale mode x dense / paged ---------------- */
static void test_decode_matrix(void **state) {
  (void)state;
  fd_handle *h = fdt_cpu_handle(2, FD_CHECK_NONE);
  assert_non_null(h);
  int failures = 0, cases = 0;
  for (int kd = 0; kd < 3; ++kd) {
    for (int qd = 0; qd < 3; ++qd) {
      for (int mode = 0; mode < 4; ++mode) {
        for (int paged = 0; paged < 2; ++paged) {
          static const fdt_layout dense[] = {FDT_BNHD, FDT_BHND, FDT_BNHD_PADDED};
          static const fdt_layout pools[] = {FDT_PAGED_NHD, FDT_PAGED_HND};
          const int turn = kd + qd + mode;
          const fdt_layout layout = paged ? pools[turn % 2] : dense[turn % 3];
          fdt_case c = base_case(kCacheDtypes[kd], kFloatDtypes[qd], (fdt_scale_mode)mode, layout);
          c.out_dtype = (mode + paged) % 3 == 0 ? FD_DTYPE_F32 : c.dtype;
          c.num_splits = (int32_t)((kd + mode) % 3) * 2; /* 0 (automatic), 2, 4 */
          c.page_size = paged ? 7 : 16;
          c.seed = (uint64_t)(1000 + ((kd * 3 + qd) * 4 + mode) * 2 + paged);
          failures += check_case(h, &c, "matrix");
          ++cases;
        }
      }
    }
  }
  assert_int_equal(fd_destroy(h), FD_SUCCESS);
  print_message("%d decode cases\n", cases);
  assert_int_equal(failures, 0);
}

/* ---- decode with variants ------------------------------------------------------------- */
static void test_decode_variants(void **state) {
  (void)state;
  typedef struct variant {
    const char *name;
    int64_t q_len, window, q_heads, kv_heads;
    int sinks, alibi;
    double softcap;
  } variant;
  static const variant variants[] = {
      {"q_len 4", 4, 0, 8, 2, 0, 0, 0.0},
      {"MQA", 1, 0, 8, 1, 0, 0, 0.0},
      {"MHA", 1, 0, 4, 4, 0, 0, 0.0},
      {"window 9", 1, 9, 8, 2, 0, 0, 0.0},
      {"q_len 3 window 5", 3, 5, 6, 3, 0, 0, 0.0},
      {"sinks", 1, 0, 8, 2, 1, 0, 0.0},
      {"alibi softcap", 2, 0, 8, 2, 0, 1, 5.0},
      {"everything", 5, 20, 12, 4, 1, 2, 30.0},
  };
  fd_handle *h = fdt_cpu_handle(3, FD_CHECK_NONE);
  assert_non_null(h);
  int failures = 0;
  for (size_t v = 0; v < sizeof variants / sizeof variants[0]; ++v) {
    for (int kd = 0; kd < 3; ++kd) {
      for (int paged = 0; paged < 2; ++paged) {
        const int qd = (int)(v + (size_t)kd) % 3;
        fdt_case c = base_case(kCacheDtypes[kd], kFloatDtypes[qd], (fdt_scale_mode)((v + (size_t)paged) % 4),
                               paged ? FDT_PAGED_HND : FDT_BHND);
        c.q_len = variants[v].q_len;
        c.window = variants[v].window;
        c.q_heads = variants[v].q_heads;
        c.kv_heads = variants[v].kv_heads;
        c.sinks = variants[v].sinks;
        c.alibi = variants[v].alibi;
        c.softcap = variants[v].softcap;
        c.page_size = 5;
        c.num_splits = paged ? 3 : 0;
        c.seed = 2000 + v * 16 + (uint64_t)(kd * 2 + paged);
        failures += check_case(h, &c, variants[v].name);
      }
    }
  }
  assert_int_equal(fd_destroy(h), FD_SUCCESS);
  assert_int_equal(failures, 0);
}

/* ---- scales: zeros and a wide range ------------------------------------------------------ */
/* Scales 2^[-12, 12] times the base, one in eight zero, with q (and out) of
 * every float dtype; then every scale zero. */
static void test_decode_wide_scales(void **state) {
  (void)state;
  fd_handle *h = fdt_cpu_handle(2, FD_CHECK_NONE);
  assert_non_null(h);
  int failures = 0;
  for (int qd = 0; qd < 3; ++qd) { /* q (and out) f32, f16 and bf16, within their bounds */
    for (int kd = 0; kd < 3; ++kd) {
      for (int mode = 1; mode < 4; ++mode) {
        for (int paged = 0; paged < 2; ++paged) {
          fdt_case c =
              base_case(kCacheDtypes[kd], kFloatDtypes[qd], (fdt_scale_mode)mode, paged ? FDT_PAGED_NHD : FDT_BNHD);
          c.kv_heads = 4; /* more heads: some per-head scales come out 0 */
          c.wide_scales = 1;
          c.seed = 3000 + (uint64_t)(((qd * 3 + kd) * 4 + mode) * 2 + paged);
          failures += check_case(h, &c, "wide scales");
        }
      }
    }
  }
  /* Every scale zero: every score 0 and every value 0. */
  fdt_case c = base_case(FD_DTYPE_E5M2, FD_DTYPE_BF16, FDT_SCALE_TENSOR, FDT_BNHD);
  c.seed = 3100;
  fdt_problem p;
  assert_int_equal(fdt_problem_make(&p, &c), 0);
  p.k_scale[0] = 0.0f;
  p.v_scale[0] = 0.0f;
  for (int64_t i = 0; i < c.batch * c.kv_len * c.kv_heads * c.head_dim; ++i) p.ref_k[i] = p.ref_v[i] = 0.0;
  fdt_reference(&p);
  failures += decode_and_check(h, &p, "zero scales");
  fdt_problem_free(&p);
  assert_int_equal(fd_destroy(h), FD_SUCCESS);
  assert_int_equal(failures, 0);
}

/* ---- scale x code products of large magnitude ------------------------------------------------ */
/* Generated problems whose dequantized keys and values are huge: every k
 * scale times 2^100 with softmax_scale divided by 2^100 (keys near 2^100,
 * the same scores), and every v scale times 2^100, or times the largest
 * power of two that keeps every value of a sequence below FLT_MAX / (4 x
 * kv_len), so that float32 sums of weighted values cannot overflow. The
 * float64 reference is scaled alike. out is f32 for an f16 q (the values
 * are far beyond f16's range; flashdecode.h bounds only the CUDA backend's
 * f16 tensor-core path), else q's dtype. */
static void scale_floats(float *x, size_t count, int exponent) {
  for (size_t i = 0; i < count; ++i) x[i] = ldexpf(x[i], exponent); /* NaN stays NaN, 1e30 padding may become inf */
}

static void test_decode_large_scales(void **state) {
  (void)state;
  fd_handle *h = fdt_cpu_handle(2, FD_CHECK_NONE);
  assert_non_null(h);
  int failures = 0;
  for (int kd = 0; kd < 3; ++kd) {
    for (int qd = 0; qd < 3; ++qd) {
      for (int mode = 1; mode < 4; ++mode) {
        for (int near_max = 0; near_max < 2; ++near_max) {
          fdt_case c = base_case(kCacheDtypes[kd], kFloatDtypes[qd], (fdt_scale_mode)mode,
                                 (mode + near_max) % 2 ? FDT_PAGED_HND : FDT_BNHD);
          c.out_dtype = kFloatDtypes[qd] == FD_DTYPE_F16 ? FD_DTYPE_F32 : kFloatDtypes[qd];
          c.seed = 3500 + (uint64_t)(((kd * 3 + qd) * 4 + mode) * 2 + near_max);
          fdt_problem p;
          assert_int_equal(fdt_problem_make(&p, &c), 0);
          const int64_t N = p.c.kv_len, H = c.kv_heads, D = c.head_dim; /* paged: whole pages */
          double v_max = 0.0;
          for (int64_t b = 0; b < c.batch; ++b) {
            for (int64_t i = 0; i < p.lens[b] * H * D; ++i) v_max = fmax(v_max, fabs(p.ref_v[b * N * H * D + i]));
          }
          assert_true(v_max > 0.0);
          const int k_exponent = 100;
          const int v_exponent = near_max ? (int)floor(log2((double)FLT_MAX / (4.0 * v_max * (double)N))) : 100;
          assert_true(v_exponent >= 100);
          scale_floats(p.k_scale, p.k_scale_bytes / sizeof(float), k_exponent);
          scale_floats(p.v_scale, p.v_scale_bytes / sizeof(float), v_exponent);
          for (int64_t i = 0; i < c.batch * N * H * D; ++i) {
            p.ref_k[i] = ldexp(p.ref_k[i], k_exponent);
            p.ref_v[i] = ldexp(p.ref_v[i], v_exponent);
          }
          p.c.softmax_scale = ldexp(1.0 / sqrt((double)D), -k_exponent);
          p.args.softmax_scale = p.c.softmax_scale;
          fdt_reference(&p);
          failures += decode_and_check(h, &p, near_max ? "values near FLT_MAX" : "scales x 2^100");
          fdt_problem_free(&p);
        }
      }
    }
  }
  assert_int_equal(fd_destroy(h), FD_SUCCESS);
  assert_int_equal(failures, 0);
}

/* ---- every byte code inside a sequence ----------------------------------------------------------- */
/* The value of an 8-bit code from the formats' definitions (flashdecode.h,
 * fd_dtype; OCP fp8), written here apart from the library's tables and from
 * fdt_fp8_value: sign, exponent field (bias 7 or 15; 0 is subnormal) and
 * mantissa field. E4M3 has no infinity and one NaN (S.1111.111); E5M2's
 * all-ones exponent is infinity (mantissa 0) or NaN; int8 is the integer. */
static double code_value(fd_dtype dtype, unsigned code) {
  if (dtype == FD_DTYPE_I8) return code < 128 ? (double)code : (double)code - 256.0;
  const unsigned mantissa_bits = dtype == FD_DTYPE_E4M3 ? 3 : 2, exponent_bits = 7 - mantissa_bits;
  const unsigned all_ones = (1u << exponent_bits) - 1, bias = (1u << (exponent_bits - 1)) - 1;
  const unsigned e = (code >> mantissa_bits) & all_ones, m = code & ((1u << mantissa_bits) - 1);
  const double sign = (code & 0x80u) ? -1.0 : 1.0;
  if (e == all_ones && dtype == FD_DTYPE_E5M2) return m == 0 ? sign * INFINITY : NAN;
  if (e == all_ones && m == (1u << mantissa_bits) - 1) return NAN;
  double magnitude = (double)m / (double)(1u << mantissa_bits) + (e == 0 ? 0.0 : 1.0);
  for (int exponent = (e == 0 ? 1 : (int)e) - (int)bias; exponent != 0; exponent += exponent > 0 ? -1 : 1) {
    magnitude = exponent > 0 ? magnitude * 2.0 : magnitude / 2.0;
  }
  return sign * magnitude;
}

/* value x scale as flashdecode.h computes it, in float32: the product is
 * exact in float64 (a code has at most 8 significant bits, a float 24), then
 * rounded once to float, to infinity from FLT_MAX's rounding boundary
 * 2^128 - 2^103 on (ties go to the even 2^128). */
static double f32_product(double value, float scale) {
  const double x = value * (double)scale;
  if (isnan(x) || isinf(x)) return x;
  if (fabs(x) >= ldexp(1.0, 128) - ldexp(1.0, 103)) return copysign(INFINITY, x);
  return (double)(float)x;
}

/* Whether element i of a buffer of dtype still holds fdt_poison_outputs'
 * all-ones bytes. */
static int still_poisoned(const void *base, fd_dtype dtype, int64_t i) {
  const size_t size = fdt_dtype_size(dtype);
  for (size_t j = 0; j < size; ++j) {
    if (((const unsigned char *)base)[(size_t)i * size + j] != 0xff) return 0;
  }
  return 1;
}

/* code_value against the formats' landmarks, and against fdt_fp8_value. */
static void check_code_values(void) {
  static const struct {
    fd_dtype dtype;
    unsigned code;
    double value;
  } known[] = {
      {FD_DTYPE_E4M3, 0x00, 0.0},         {FD_DTYPE_E4M3, 0x01, 0x1p-9},   {FD_DTYPE_E4M3, 0x07, 7 * 0x1p-9},
      {FD_DTYPE_E4M3, 0x08, 0x1p-6},      {FD_DTYPE_E4M3, 0x38, 1.0},      {FD_DTYPE_E4M3, 0x3f, 1.875},
      {FD_DTYPE_E4M3, 0x77, 240.0},       {FD_DTYPE_E4M3, 0x78, 256.0},    {FD_DTYPE_E4M3, 0x7e, 448.0},
      {FD_DTYPE_E4M3, 0xfe, -448.0},      {FD_DTYPE_E4M3, 0xb8, -1.0},     {FD_DTYPE_E5M2, 0x01, 0x1p-16},
      {FD_DTYPE_E5M2, 0x03, 3 * 0x1p-16}, {FD_DTYPE_E5M2, 0x04, 0x1p-14},  {FD_DTYPE_E5M2, 0x3c, 1.0},
      {FD_DTYPE_E5M2, 0x70, 8192.0},      {FD_DTYPE_E5M2, 0x71, 10240.0},  {FD_DTYPE_E5M2, 0x7a, 49152.0},
      {FD_DTYPE_E5M2, 0x7b, 57344.0},     {FD_DTYPE_E5M2, 0xfb, -57344.0}, {FD_DTYPE_E5M2, 0x7c, INFINITY},
      {FD_DTYPE_E5M2, 0xfc, -INFINITY},   {FD_DTYPE_I8, 0x7f, 127.0},      {FD_DTYPE_I8, 0x80, -128.0},
      {FD_DTYPE_I8, 0xff, -1.0},          {FD_DTYPE_I8, 0x00, 0.0},
  };
  for (size_t i = 0; i < sizeof known / sizeof known[0]; ++i) {
    const double x = code_value(known[i].dtype, known[i].code);
    if (x != known[i].value) {
      fail_msg("%s 0x%02x: decoded %g, want %g", fdt_dtype_name(known[i].dtype), known[i].code, x, known[i].value);
    }
  }
  static const unsigned e4m3_nan[] = {0x7f, 0xff}, e5m2_nan[] = {0x7d, 0x7e, 0x7f, 0xfd, 0xfe, 0xff};
  for (size_t i = 0; i < 2; ++i) assert_true(isnan(code_value(FD_DTYPE_E4M3, e4m3_nan[i])));
  for (size_t i = 0; i < 6; ++i) assert_true(isnan(code_value(FD_DTYPE_E5M2, e5m2_nan[i])));
  assert_true(signbit(code_value(FD_DTYPE_E4M3, 0x80)) && signbit(code_value(FD_DTYPE_E5M2, 0x80)));
  for (int kd = 0; kd < 3; ++kd) {
    for (unsigned code = 0; code < 256; ++code) {
      const double x = code_value(kCacheDtypes[kd], code), y = fdt_fp8_value(kCacheDtypes[kd], (uint8_t)code);
      if (!(x == y || (isnan(x) && isnan(y)))) {
        fail_msg("%s 0x%02x: %g here, %g in fdt", fdt_dtype_name(kCacheDtypes[kd]), code, x, y);
      }
    }
  }
}

/* Every byte of each 8-bit format as a value inside a sequence, decoded
 * exactly (flashdecode.h, "Quantized caches": the formats are decoded
 * exactly, stored value x scale computed in float32, and the non-finite
 * rules apply to the dequantized values). Each sequence has one token, so
 * its softmax weight is exactly 1 and out is v x scale rounded once to float
 * (then to out's dtype); its keys are 0, so every LSE is exactly 0. Each
 * (sequence, KV head) row of v holds all 256 codes, rotated so that codes
 * meet many positions: the NaN codes give NaN (in their element alone),
 * E5M2's infinities infinities, its 0x71-0x7B up to 57344, int8's -128
 * itself. Scales: none; one per tensor (1e30: 448 x 1e30 is finite;
 * FLT_MAX: codes above 1 overflow to infinity, 1 gives FLT_MAX; 2^-140:
 * subnormal products); and per token and head, among them 1, -1, 0.1,
 * +-1e30, +-FLT_MAX, 2.5e37 (codes above 8 overflow), 1e-38 and 2^-140
 * (subnormal), 0 and -0 (NaN and infinite codes x 0 are NaN). Padding: a
 * second token past each length holds NaN and saturating bytes, with NaN
 * scales: never read. */
static void test_decode_every_value_code(void **state) {
  (void)state;
  enum { kB = 8, kCap = 2, kHkv = 2, kHq = 4, kD = 256, kGroup = kHq / kHkv };
  static const float kTokenScales[kB * kHkv] = {1.0f,   -1.0f,     0.1f, 1e30f, -1e30f,  FLT_MAX, -FLT_MAX, 2.5e37f,
                                                1e-38f, 0x1p-140f, 0.0f, -0.0f, 3.0e-5f, 7.0f,    0x1p100f, -0.75f};
  static const float kTensorScales[] = {1e30f, FLT_MAX, 0x1p-140f};
  check_code_values();
  fd_handle *h = fdt_cpu_handle(2, FD_CHECK_NONE);
  assert_non_null(h);
  static uint8_t k[kB * kCap * kHkv * kD], v[kB * kCap * kHkv * kD];
  static float q[kB * kHq * kD], out[kB * kHq * kD], lse[kB * kHq], token_scales[kB * kCap * kHkv];
  int32_t lens[kB];
  for (int b = 0; b < kB; ++b) lens[b] = 1;
  const int64_t q_shape[4] = {kB, 1, kHq, kD}, q_strides[4] = {kHq * kD, kHq * kD, kD, 1};
  const int64_t kv_shape[4] = {kB, kCap, kHkv, kD}, kv_strides[4] = {kCap * kHkv * kD, kHkv * kD, kD, 1};
  const int64_t scale_shape[3] = {kB, kCap, kHkv}, scale_strides[3] = {kCap * kHkv, kHkv, 1}, broadcast[3] = {0};
  const int64_t lse_shape[3] = {kB, 1, kHq}, lse_strides[3] = {kHq, kHq, 1};
  const int64_t lens_shape[1] = {kB}, lens_strides[1] = {1};
  int failures = 0, runs = 0;
  for (int kd = 0; kd < 3; ++kd) {
    const fd_dtype dtype = kCacheDtypes[kd];
    for (int b = 0; b < kB; ++b) {
      for (int j = 0; j < kCap; ++j) {
        for (int g = 0; g < kHkv; ++g) {
          const int64_t row = (b * kCap + j) * kHkv + g;
          token_scales[row] = j == 0 ? kTokenScales[b * kHkv + g] : NAN;
          for (int d = 0; d < kD; ++d) {
            v[row * kD + d] = j == 0 ? (uint8_t)(d + 37 * b + 101 * g) : fdt_pad_byte(dtype, d);
            k[row * kD + d] = j == 0 ? 0x00 : fdt_pad_byte(dtype, d + 1); /* 0x00 is 0 in every format */
          }
        }
      }
    }
    for (int qd = 0; qd < 3; ++qd) {
      const fd_dtype q_dtype = kFloatDtypes[qd];
      fdt_rng rng = {8000 + (uint64_t)(kd * 3 + qd)};
      for (int64_t i = 0; i < kB * kHq * kD; ++i) fdt_store(q_dtype, q, i, fdt_uniform(&rng, -2.0, 2.0));
      /* Scales: none, per tensor (three), per token and head. */
      for (int form = 0; form < 5; ++form) {
        for (int out_f32 = 1; out_f32 >= (q_dtype == FD_DTYPE_F32 ? 1 : 0); --out_f32) {
          const fd_dtype out_dtype = out_f32 ? FD_DTYPE_F32 : q_dtype;
          fd_decode_args a;
          fd_decode_args_init(&a, sizeof a);
          a.q = fdt_tensor(q, q_dtype, 4, q_shape, q_strides);
          a.k = fdt_tensor(k, dtype, 4, kv_shape, kv_strides);
          a.v = fdt_tensor(v, dtype, 4, kv_shape, kv_strides);
          a.out = fdt_tensor(out, out_dtype, 4, q_shape, q_strides);
          a.lse = fdt_tensor(lse, FD_DTYPE_F32, 3, lse_shape, lse_strides);
          a.seq_lens = fdt_tensor(lens, FD_DTYPE_I32, 1, lens_shape, lens_strides);
          if (form >= 1 && form <= 3) {
            a.v_scale = fdt_tensor((void *)&kTensorScales[form - 1], FD_DTYPE_F32, 3, scale_shape, broadcast);
          } else if (form == 4) {
            a.v_scale = fdt_tensor(token_scales, FD_DTYPE_F32, 3, scale_shape, scale_strides);
          }
          a.k_scale = a.v_scale; /* the keys are 0 whatever their scale */
          memset(out, 0xff, sizeof out);
          memset(lse, 0xff, sizeof lse);
          if (fd_decode(h, &a, NULL) != FD_SUCCESS) fail_msg("fd_decode: %s", last_message());
          ++runs;
          int bad = 0;
          for (int b = 0; b < kB; ++b) {
            for (int hd = 0; hd < kHq; ++hd) {
              const int64_t row = b * kHq + hd, g = hd / kGroup, kv_row = (b * kCap + 0) * kHkv + g;
              const float scale = form == 0 ? 1.0f : form == 4 ? token_scales[kv_row] : kTensorScales[form - 1];
              if (still_poisoned(lse, FD_DTYPE_F32, row) || lse[row] != 0.0f) {
                if (bad++ < 4) print_message("lse[%d][%d] = %g, want 0\n", b, hd, (double)lse[row]);
              }
              for (int d = 0; d < kD; ++d) {
                const unsigned code = v[kv_row * kD + d];
                const double value = f32_product(code_value(dtype, code), scale);
                const double want = out_f32 ? value : fdt_round_to(out_dtype, value);
                const double got = fdt_load(out_dtype, out, row * kD + d);
                if (!still_poisoned(out, out_dtype, row * kD + d) && (got == want || (isnan(got) && isnan(want))))
                  continue;
                if (bad++ < 4) {
                  print_message(
                      "%s cache, q %s, out %s, scales form %d: sequence %d head %d element %d: code 0x%02x "
                      "x scale %g: got %g, want %g%s\n",
                      fdt_dtype_name(dtype), fdt_dtype_name(q_dtype), fdt_dtype_name(out_dtype), form, b, hd, d, code,
                      (double)scale, got, want, still_poisoned(out, out_dtype, row * kD + d) ? " (not written)" : "");
                }
              }
            }
          }
          failures += bad != 0;
        }
      }
    }
  }
  assert_int_equal(fd_destroy(h), FD_SUCCESS);
  print_message("%d decodes\n", runs);
  assert_int_equal(failures, 0);
}

/* Every byte of each 8-bit format as a key inside a sequence (flashdecode.h,
 * "Non-finite values", applied to the dequantized keys). Sequence b holds
 * two tokens: one whose key is (code b, 0, ..., 0) and a neutral key of
 * zeros, in either order. Query head 0 is (1, 0, ..., 0) and head 1 its
 * negation, so the code's score is +-softmax_scale x (code x scale) and the
 * neutral key's is 0. A NaN score, or +inf, makes the row NaN (out and LSE);
 * -inf masks the key: out is the neutral token's v exactly and the LSE
 * exactly 0; a finite score s gives the two-key softmax in float64 (LSE
 * log(e^s + 1)). Scores within 1% of the float32 overflow threshold are
 * left out (either side is right there). Configurations: no scales with
 * softmax_scale 16 (neighbouring codes, down to E5M2's smallest subnormal,
 * differ in LSE by far more than float rounding); scales 1 and -0.5;
 * 1e30 (keys up to 5.7e34, moderate scores); FLT_MAX (codes above 1
 * overflow to an infinite key, so that +-inf scores mask or make NaN);
 * FLT_MAX with softmax_scale 4 (finite keys whose scores overflow); and 0
 * (finite codes give 0, NaN and infinite ones NaN). */
static void test_decode_every_key_code(void **state) {
  (void)state;
  enum { kB = 256, kCap = 2, kHq = 2, kD = 8 };
  static const struct {
    int scaled;
    float scale;
    double softmax_scale;
  } configs[] = {{0, 1.0f, 16.0},     {1, 1.0f, 0.125},  {1, -0.5f, 16.0}, {1, 1e30f, 1e-30},
                 {1, FLT_MAX, 2e-38}, {1, FLT_MAX, 4.0}, {1, 0.0f, 16.0}};
  fd_handle *h = fdt_cpu_handle(2, FD_CHECK_NONE);
  assert_non_null(h);
  static uint8_t k[kB * kCap * kD], v[kB * kCap * kD];
  static float q[kB * kHq * kD], out[kB * kHq * kD], lse[kB * kHq];
  const int64_t q_shape[4] = {kB, 1, kHq, kD}, q_strides[4] = {kHq * kD, kHq * kD, kD, 1};
  const int64_t kv_shape[4] = {kB, kCap, 1, kD}, kv_strides[4] = {kCap * kD, kD, kD, 1};
  const int64_t scale_shape[3] = {kB, kCap, 1}, broadcast[3] = {0};
  const int64_t lse_shape[3] = {kB, 1, kHq}, lse_strides[3] = {kHq, kHq, 1};
  const double log2e = 1.4426950408889634;
  int failures = 0, checked = 0, skipped = 0, nan_rows = 0, masked_rows = 0;
  for (int kd = 0; kd < 3; ++kd) {
    const fd_dtype dtype = kCacheDtypes[kd];
    for (int b = 0; b < kB; ++b) {
      const int coded = b & 1; /* the token whose key holds the code */
      for (int j = 0; j < kCap; ++j) {
        for (int d = 0; d < kD; ++d) {
          k[(b * kCap + j) * kD + d] = j == coded && d == 0 ? (uint8_t)b : 0x00;
          v[(b * kCap + j) * kD + d] = fdt_quantize(dtype, j == coded ? d - 4.0 : d % 3 - 1.0);
        }
      }
    }
    for (int qd = 0; qd < 3; ++qd) {
      const fd_dtype q_dtype = kFloatDtypes[qd];
      for (int b = 0; b < kB; ++b) {
        for (int hd = 0; hd < kHq; ++hd) {
          for (int d = 0; d < kD; ++d) fdt_store(q_dtype, q, (b * kHq + hd) * kD + d, d ? 0.0 : hd ? -1.0 : 1.0);
        }
      }
      for (size_t ci = 0; ci < sizeof configs / sizeof configs[0]; ++ci) {
        fd_decode_args a;
        fd_decode_args_init(&a, sizeof a);
        a.q = fdt_tensor(q, q_dtype, 4, q_shape, q_strides);
        a.k = fdt_tensor(k, dtype, 4, kv_shape, kv_strides);
        a.v = fdt_tensor(v, dtype, 4, kv_shape, kv_strides);
        a.out = fdt_tensor(out, FD_DTYPE_F32, 4, q_shape, q_strides);
        a.lse = fdt_tensor(lse, FD_DTYPE_F32, 3, lse_shape, lse_strides);
        if (configs[ci].scaled) {
          a.k_scale = fdt_tensor((void *)&configs[ci].scale, FD_DTYPE_F32, 3, scale_shape, broadcast);
        }
        a.softmax_scale = configs[ci].softmax_scale;
        memset(out, 0xff, sizeof out);
        memset(lse, 0xff, sizeof lse);
        if (fd_decode(h, &a, NULL) != FD_SUCCESS) fail_msg("fd_decode: %s", last_message());
        int bad = 0;
        for (int b = 0; b < kB; ++b) {
          const int coded = b & 1;
          const double key = configs[ci].scaled ? f32_product(code_value(dtype, (unsigned)b), configs[ci].scale)
                                                : code_value(dtype, (unsigned)b);
          for (int hd = 0; hd < kHq; ++hd) {
            const int64_t row = b * kHq + hd;
            const double s = (hd ? -1.0 : 1.0) * (double)(float)configs[ci].softmax_scale * key;
            const double s2 = s * log2e; /* the score as the library holds it, in log2 units */
            /* What the row must be: NaN, the neutral token alone (masked), or the two-key softmax. */
            enum { kNanRow, kMasked, kFinite } want_kind;
            if (isnan(s) || s2 > 1.01 * FLT_MAX) {
              want_kind = kNanRow;
              ++nan_rows;
            } else if (s2 < -1.01 * FLT_MAX) {
              want_kind = kMasked;
              ++masked_rows;
            } else if (fabs(s2) > 0.99 * FLT_MAX) {
              ++skipped;
              continue;
            } else {
              want_kind = kFinite;
            }
            ++checked;
            const double m = s > 0.0 ? s : 0.0, w_code = exp(s - m), w_zero = exp(-m);
            const double want_lse = want_kind == kNanRow ? NAN : want_kind == kMasked ? 0.0 : m + log(w_code + w_zero);
            const double got_lse = lse[row];
            int ok = !still_poisoned(lse, FD_DTYPE_F32, row);
            if (want_kind == kFinite) {
              ok = ok && fabs(got_lse - want_lse) <= 1e-6 * (1.0 + fabs(want_lse));
            } else {
              ok = ok && (got_lse == want_lse || (isnan(got_lse) && isnan(want_lse)));
            }
            for (int d = 0; d < kD; ++d) {
              const double v_code = code_value(dtype, v[(b * kCap + coded) * kD + d]);
              const double v_zero = code_value(dtype, v[(b * kCap + 1 - coded) * kD + d]);
              const double got = out[row * kD + d];
              if (still_poisoned(out, FD_DTYPE_F32, row * kD + d)) ok = 0;
              if (want_kind == kNanRow) ok = ok && isnan(got);
              if (want_kind == kMasked) ok = ok && got == v_zero;
              if (want_kind == kFinite)
                ok = ok && fabs(got - (w_code * v_code + w_zero * v_zero) / (w_code + w_zero)) <= 1e-5;
            }
            if (!ok && bad++ < 4) {
              print_message(
                  "%s key 0x%02x x scale %s%g, q %s, softmax_scale %g, head %d: score %g: got lse %g, out[0] "
                  "%g; want lse %g\n",
                  fdt_dtype_name(dtype), b, configs[ci].scaled ? "" : "(none) ", (double)configs[ci].scale,
                  fdt_dtype_name(q_dtype), configs[ci].softmax_scale, hd, s, got_lse, (double)out[row * kD], want_lse);
            }
          }
        }
        failures += bad != 0;
      }
    }
  }
  assert_int_equal(fd_destroy(h), FD_SUCCESS);
  print_message("%d rows checked (%d NaN, %d masked), %d at the overflow threshold left out\n", checked, nan_rows,
                masked_rows, skipped);
  assert_true(nan_rows > 0 && masked_rows > 0);
  assert_int_equal(failures, 0);
}

/* ---- batch invariance: a sequence alone gives the same bits ---------------------------- */
static void test_batch_invariant(void **state) {
  (void)state;
  fd_handle *h = fdt_cpu_handle(3, FD_CHECK_NONE);
  assert_non_null(h);
  for (int kd = 0; kd < 3; ++kd) {
    fdt_case c = base_case(kCacheDtypes[kd], FD_DTYPE_F16, FDT_SCALE_TOKEN, kd == 1 ? FDT_PAGED_NHD : FDT_BNHD);
    c.kv_len = 300;
    c.out_dtype = FD_DTYPE_F32;
    c.seed = 4000 + (uint64_t)kd;
    fdt_problem p;
    assert_int_equal(fdt_problem_make(&p, &c), 0);
    p.args.split_tokens = 64;
    assert_int_equal(fd_decode(h, &p.args, NULL), FD_SUCCESS);
    assert_int_equal(fdt_check(&p, NULL, 0, NULL, NULL), 0);
    const size_t row = (size_t)(c.q_heads * c.head_dim) * sizeof(float);
    for (int64_t b = 0; b < c.batch; ++b) {
      float solo[8 * 64], solo_lse[8];
      fd_decode_args a = fdt_solo_args(&p.args, b, p.lens[b], 1);
      const int64_t out_shape[4] = {1, 1, c.q_heads, c.head_dim};
      const int64_t out_strides[4] = {c.q_heads * c.head_dim, c.q_heads * c.head_dim, c.head_dim, 1};
      a.out = fdt_tensor(solo, FD_DTYPE_F32, 4, out_shape, out_strides);
      const int64_t lse_shape[3] = {1, 1, c.q_heads}, lse_strides[3] = {c.q_heads, c.q_heads, 1};
      a.lse = fdt_tensor(solo_lse, FD_DTYPE_F32, 3, lse_shape, lse_strides);
      if (p.lens[b] == 0 && a.block_table.data == NULL) continue; /* a dense cache of capacity 0 */
      assert_int_equal(fd_decode(h, &a, NULL), FD_SUCCESS);
      assert_memory_equal(solo, (char *)p.out + (size_t)b * row, row);
      assert_memory_equal(solo_lse, (float *)p.lse + b * c.q_heads, sizeof solo_lse);
    }
    fdt_problem_free(&p);
  }
  assert_int_equal(fd_destroy(h), FD_SUCCESS);
}

/* ---- decode validation -------------------------------------------------------------------- */
/* The call fails with `status`, its message holds `needle` (the argument at
 * fault as validate.cpp prints it, after ": " or "input ", with what is
 * wrong: a bare "k" would match any "invalid ..."), and out and lse keep
 * their poison. */
static void expect_decode_error(fd_handle *h, fdt_problem *p, const fd_decode_args *a, fd_status status,
                                const char *needle) {
  fdt_poison_outputs(p);
  assert_non_null(p->lse);
  assert_int_equal(fd_decode(h, a, NULL), status);
  if (strstr(last_message(), needle) == NULL) fail_msg("message \"%s\" lacks \"%s\"", last_message(), needle);
  const unsigned char *out = p->out, *lse = p->lse;
  for (size_t i = 0; i < p->out_bytes; ++i) assert_int_equal(out[i], 0xff);
  for (size_t i = 0; i < p->lse_bytes; ++i) assert_int_equal(lse[i], 0xff);
}

static void test_decode_validation(void **state) {
  (void)state;
  fd_handle *h = fdt_cpu_handle(2, FD_CHECK_NONE);
  assert_non_null(h);
  fdt_case c = base_case(FD_DTYPE_E4M3, FD_DTYPE_F16, FDT_SCALE_TOKEN, FDT_BNHD);
  c.seed = 5;
  fdt_problem p;
  assert_int_equal(fdt_problem_make(&p, &c), 0);
  fd_decode_args a = p.args;
  assert_int_equal(fd_decode(h, &a, NULL), FD_SUCCESS);
  assert_int_equal(fdt_check(&p, NULL, 0, NULL, NULL), 0);

  /* k and v of different 8-bit dtypes, or an 8-bit k with a float v. */
  a = p.args;
  a.v.dtype = FD_DTYPE_E5M2;
  expect_decode_error(h, &p, &a, FD_ERROR_INVALID_DTYPE, ": v: dtype must be e4m3, got e5m2");
  a = p.args;
  a.v.dtype = FD_DTYPE_I8;
  expect_decode_error(h, &p, &a, FD_ERROR_INVALID_DTYPE, ": v: dtype must be e4m3, got i8");
  /* Scales of the wrong dtype, rank and shape. */
  a = p.args;
  a.k_scale.dtype = FD_DTYPE_F16;
  expect_decode_error(h, &p, &a, FD_ERROR_INVALID_DTYPE, ": k_scale: dtype must be f32, got f16");
  a = p.args;
  a.v_scale.ndim = 2;
  expect_decode_error(h, &p, &a, FD_ERROR_INVALID_SHAPE, ": v_scale: ndim must be 3, got 2");
  a = p.args;
  a.k_scale.ndim = 4;
  a.k_scale.shape[3] = c.head_dim;
  a.k_scale.strides[3] = 1;
  expect_decode_error(h, &p, &a, FD_ERROR_INVALID_SHAPE, ": k_scale: ndim must be 3, got 4");
  static const char *const extents[3] = {": k_scale: batch must be 5 (from k), got 6",
                                         ": k_scale: kv_capacity must be 100 (from k), got 101",
                                         ": k_scale: kv_heads must be 2 (from k), got 3"};
  for (int d = 0; d < 3; ++d) {
    a = p.args;
    a.k_scale.shape[d] += 1;
    expect_decode_error(h, &p, &a, FD_ERROR_INVALID_SHAPE, extents[d]);
  }
  a = p.args;
  a.v_scale.strides[1] = -1;
  expect_decode_error(h, &p, &a, FD_ERROR_INVALID_STRIDE, ": v_scale: stride of kv_capacity must not be negative");
  /* A scale overlapping out. */
  a = p.args;
  a.k_scale.data = p.out;
  a.k_scale.strides[0] = a.k_scale.strides[1] = a.k_scale.strides[2] = 0;
  expect_decode_error(h, &p, &a, FD_ERROR_INVALID_ARGUMENT, ": out: its bytes");
  assert_non_null(strstr(last_message(), "overlap those of input k_scale ("));
  fdt_problem_free(&p);

  /* Scales on a 16-bit cache. */
  c = base_case(FD_DTYPE_E4M3, FD_DTYPE_F16, FDT_SCALE_TENSOR, FDT_BNHD);
  c.seed = 6;
  assert_int_equal(fdt_problem_make(&p, &c), 0);
  fdt_case c16 = c;
  c16.kv_dtype = 0;
  c16.scale_mode = FDT_SCALE_NONE;
  fdt_problem p16;
  assert_int_equal(fdt_problem_make(&p16, &c16), 0);
  a = p16.args;
  a.k_scale = p.args.k_scale;
  expect_decode_error(h, &p16, &a, FD_ERROR_INVALID_DTYPE,
                      ": k_scale: scales apply to 8-bit caches only, and k and v are f16");
  a = p16.args;
  a.v_scale = p.args.v_scale;
  expect_decode_error(h, &p16, &a, FD_ERROR_INVALID_DTYPE,
                      ": v_scale: scales apply to 8-bit caches only, and k and v are f16");
  /* A 16-bit cache of another dtype than q. */
  a = p16.args;
  a.k.dtype = a.v.dtype = FD_DTYPE_BF16;
  expect_decode_error(h, &p16, &a, FD_ERROR_INVALID_DTYPE,
                      ": k: dtype must be f16 (that of q) or an 8-bit cache dtype (e4m3, e5m2, i8), got bf16");
  fdt_problem_free(&p16);
  fdt_problem_free(&p);
  assert_int_equal(fd_destroy(h), FD_SUCCESS);
}

/* ---- append: one dense cache, values chosen for the formats' edges ------------------------- */
/* Values around every representable value of a cache dtype (each value,
 * the midpoints between neighbours and the floats next to them), specials,
 * and random values over many magnitudes. Returns the count written. */
static int64_t edge_values(fd_dtype dtype, fdt_rng *rng, double *out, int64_t capacity) {
  int64_t n = 0;
#define PUT(x)                        \
  do {                                \
    if (n < capacity) out[n++] = (x); \
  } while (0)
  static const double specials[] = {0.0,    -0.0,   INFINITY, -INFINITY, NAN,     -NAN,    448.0,   464.0,
                                    465.0,  -464.0, 480.0,    57344.0,   61440.0, 61439.0, 65504.0, 65520.0,
                                    1e30,   -1e30,  1e-30,    -1e-30,    127.0,   127.5,   -127.5,  128.0,
                                    -128.0, -129.0, 0.5,      -0.5,      1.5,     2.5,     -2.5,    3.4e38,
                                    1e-40,  -1e-45, 6e-8,     3e-8,      1.0 / 3, 65536.0, 1e5,     -1e5};
  for (size_t i = 0; i < sizeof specials / sizeof specials[0]; ++i) PUT(specials[i]);
  if (fdt_is_quantized(dtype)) {
    for (int b = 0; b < 128; ++b) {
      const double x = fdt_fp8_value(dtype, (uint8_t)b), y = fdt_fp8_value(dtype, (uint8_t)(b + 1));
      if (isnan(x) || isinf(x)) continue;
      for (int sign = 0; sign < 2; ++sign) {
        const double s = sign ? -1.0 : 1.0;
        PUT(s * x);
        if (isnan(y) || isinf(y) || b == 127) continue;
        const float mid = (float)((x + y) / 2);
        PUT(s * mid);
        PUT(s * nextafterf(mid, 0.0f));
        PUT(s * nextafterf(mid, INFINITY));
      }
    }
  }
  while (n < capacity) {
    const double magnitude = pow(2.0, fdt_uniform(rng, -30.0, 20.0));
    PUT(fdt_uniform(rng, -1.0, 1.0) * magnitude);
  }
#undef PUT
  return n;
}

typedef struct append_fixture {
  fd_dtype cache_dtype, new_dtype;
  int64_t tokens, heads, dim; /* dense cache [1, tokens + 2, heads, dim]; new tokens go to 1..tokens */
  int scaled;                 /* per-token scales */
} append_fixture;

/* Appends edge values of the cache dtype and checks every byte of both
 * caches: positions 1..tokens hold fdt_append_store's bytes (NaN-ness only
 * for a 16-bit NaN), 0 and tokens + 1 their poison. */
static int check_append_rounding(fd_handle *h, const append_fixture *f, uint64_t seed) {
  fdt_rng rng = {seed};
  const int64_t T = f->tokens, H = f->heads, D = f->dim, cap = T + 2;
  const int64_t count = T * H * D;
  const size_t es = fdt_dtype_size(f->cache_dtype), new_es = fdt_dtype_size(f->new_dtype);
  double *values = malloc((size_t)count * sizeof(double));
  void *k_new = malloc((size_t)count * new_es), *v_new = malloc((size_t)count * new_es);
  unsigned char *k = malloc((size_t)(cap * H * D) * es), *v = malloc((size_t)(cap * H * D) * es);
  unsigned char *k_want = malloc((size_t)(cap * H * D) * es), *v_want = malloc((size_t)(cap * H * D) * es);
  float *k_scale = malloc((size_t)(cap * H) * sizeof(float)), *v_scale = malloc((size_t)(cap * H) * sizeof(float));
  assert_true(values && k_new && v_new && k && v && k_want && v_want && k_scale && v_scale);
  edge_values(f->cache_dtype, &rng, values, count);
  for (int64_t i = 0; i < count; ++i) { /* shuffle, so that edges meet every position */
    const int64_t j = fdt_int(&rng, 0, i);
    const double t = values[i];
    values[i] = values[j];
    values[j] = t;
  }
  for (int64_t i = 0; i < cap * H; ++i) {
    /* Scales over many magnitudes, and tiny and huge ones (saturation, underflow). */
    k_scale[i] = i % 4 == 1 ? 1e-6f : i % 4 == 3 ? 1e6f : (float)pow(2.0, fdt_uniform(&rng, -8.0, 8.0)) * 1.37f;
    v_scale[i] = (float)fdt_uniform(&rng, 0.001, 3.0);
  }
  k_scale[1 * H] = 0.0f; /* a zero scale: x = +-inf or NaN */
  for (int64_t i = 0; i < count; ++i) {
    fdt_store(f->new_dtype, k_new, i, values[i]);
    fdt_store(f->new_dtype, v_new, i, -values[count - 1 - i]);
  }
  memset(k, 0xa5, (size_t)(cap * H * D) * es);
  memset(v, 0x5a, (size_t)(cap * H * D) * es);
  memcpy(k_want, k, (size_t)(cap * H * D) * es);
  memcpy(v_want, v, (size_t)(cap * H * D) * es);
  for (int64_t i = 0; i < T; ++i) {
    for (int64_t g = 0; g < H; ++g) {
      const int64_t row = (1 + i) * H + g;
      for (int64_t d = 0; d < D; ++d) {
        const int64_t src = (i * H + g) * D + d;
        fdt_append_store(f->cache_dtype, k_want, row * D + d, fdt_load(f->new_dtype, k_new, src),
                         f->scaled ? &k_scale[row] : NULL);
        fdt_append_store(f->cache_dtype, v_want, row * D + d, fdt_load(f->new_dtype, v_new, src),
                         f->scaled ? &v_scale[row] : NULL);
      }
    }
  }
  fd_append_args a;
  fd_append_args_init(&a, sizeof a);
  const int64_t new_shape[4] = {1, T, H, D}, new_strides[4] = {T * H * D, H * D, D, 1};
  const int64_t cache_shape[4] = {1, cap, H, D}, cache_strides[4] = {cap * H * D, H * D, D, 1};
  const int64_t scale_shape[3] = {1, cap, H}, scale_strides[3] = {cap * H, H, 1};
  a.k_new = fdt_tensor(k_new, f->new_dtype, 4, new_shape, new_strides);
  a.v_new = fdt_tensor(v_new, f->new_dtype, 4, new_shape, new_strides);
  a.k = fdt_tensor(k, f->cache_dtype, 4, cache_shape, cache_strides);
  a.v = fdt_tensor(v, f->cache_dtype, 4, cache_shape, cache_strides);
  if (f->scaled) {
    a.k_scale = fdt_tensor(k_scale, FD_DTYPE_F32, 3, scale_shape, scale_strides);
    a.v_scale = fdt_tensor(v_scale, FD_DTYPE_F32, 3, scale_shape, scale_strides);
  }
  int32_t len = (int32_t)(T + 1);
  const int64_t one[1] = {1}, unit[1] = {1};
  a.seq_lens = fdt_tensor(&len, FD_DTYPE_I32, 1, one, unit);
  int bad = 0;
  if (fd_append_kv(h, &a, NULL) != FD_SUCCESS) {
    print_message("fd_append_kv failed: %s\n", last_message());
    bad = 1;
  }
  for (int pass = 0; pass < 2 && !bad; ++pass) {
    const unsigned char *got = pass ? v : k, *want = pass ? v_want : k_want;
    for (int64_t i = 0; i < cap * H * D; ++i) {
      if (memcmp(got + i * (int64_t)es, want + i * (int64_t)es, es) == 0) continue;
      const double x = fdt_load(f->cache_dtype, got, i), y = fdt_load(f->cache_dtype, want, i);
      if (!fdt_is_quantized(f->cache_dtype) && isnan(x) && isnan(y)) continue;
      const int64_t row = i / D;
      const float *scale = f->scaled ? (pass ? &v_scale[row] : &k_scale[row]) : NULL;
      print_message("%s cache %s <- %s%s: element %lld (token %lld): got %g, want %g (new %.9g, scale %g)\n",
                    pass ? "v" : "k", fdt_dtype_name(f->cache_dtype), fdt_dtype_name(f->new_dtype),
                    f->scaled ? " scaled" : "", (long long)i, (long long)(row / H), x, y,
                    row / H >= 1 && row / H <= T
                        ? fdt_load(f->new_dtype, pass ? v_new : k_new, ((row / H - 1) * H + row % H) * D + i % D)
                        : 0.0,
                    scale ? (double)*scale : 1.0);
      bad = 1;
      break;
    }
  }
  free(values);
  free(k_new);
  free(v_new);
  free(k);
  free(v);
  free(k_want);
  free(v_want);
  free(k_scale);
  free(v_scale);
  return bad;
}

static void test_append_rounding(void **state) {
  (void)state;
  static const fd_dtype caches[] = {FD_DTYPE_E4M3, FD_DTYPE_E5M2, FD_DTYPE_I8,
                                    FD_DTYPE_F32,  FD_DTYPE_F16,  FD_DTYPE_BF16};
  fd_handle *h = fdt_cpu_handle(2, FD_CHECK_NONE);
  assert_non_null(h);
  int failures = 0;
  for (int cd = 0; cd < 6; ++cd) {
    for (int nd = 0; nd < 3; ++nd) {
      for (int scaled = 0; scaled < 2; ++scaled) {
        if (scaled && !fdt_is_quantized(caches[cd])) continue;
        const append_fixture f = {caches[cd], kFloatDtypes[nd], 7, 3, 64, scaled};
        failures += check_append_rounding(h, &f, (uint64_t)(cd * 8 + nd * 2 + scaled) + 77);
      }
    }
  }
  assert_int_equal(fd_destroy(h), FD_SUCCESS);
  assert_int_equal(failures, 0);
}

/* ---- append into a page pool ------------------------------------------------------------------ */
/* Five sequences over a pool of 6 pages of 4 slots, HND pages (strides
 * {H*P*D, D, P*D, 1}), per-token scales: crossing a page boundary, a page
 * shared by two sequences' tables (each writes its own slots), entries -1
 * and 6 (outside the pool: not written), positions before the sequence
 * (skipped), a length beyond the capacity (clamped). The expected pool is
 * built by the definition from a poisoned copy and compared byte for byte. */
static void test_append_paged(void **state) {
  (void)state;
  enum { kBatch = 5, kPages = 6, kP = 4, kMaxPages = 3, kH = 2, kD = 16, kNew = 3 };
  /* New positions: sequence 0 (length 6) 3..5: page 2 slot 3, page 5 slots 0 and 1; sequence 1 (5)
   * 2..4: page 5 slots 2 and 3 (the page it shares with sequence 0), page 1 slot 0; sequence 2 (6)
   * 3..5: entry -1 (not written), page 3 slots 0 and 1; sequence 3 (1): -2 and -1 skipped, page 4
   * slot 0; sequence 4 (100, clamped to 12) 9..11: entry kPages, outside the pool (not written). */
  const int32_t table[kBatch][kMaxPages] = {{2, 5, 0}, {5, 1, -1}, {-1, 3, 4}, {4, 0, 0}, {1, 1, kPages}};
  const int32_t lens[kBatch] = {6, 5, 6, 1, 100};
  fd_handle *h = fdt_cpu_handle(3, FD_CHECK_NONE);
  assert_non_null(h);
  for (int cd = 0; cd < 6; ++cd) {
    static const fd_dtype caches[] = {FD_DTYPE_E4M3, FD_DTYPE_E5M2, FD_DTYPE_I8,
                                      FD_DTYPE_F32,  FD_DTYPE_F16,  FD_DTYPE_BF16};
    const fd_dtype cdt = caches[cd], ndt = kFloatDtypes[cd % 3];
    const int scaled = fdt_is_quantized(cdt);
    const size_t es = fdt_dtype_size(cdt);
    const int64_t cache_strides[4] = {kH * kP * kD, kD, kP * kD, 1}; /* HND */
    const int64_t scale_strides[3] = {kP * kH, kH, 1};
    unsigned char k[kPages * kP * kH * kD * 4], v[kPages * kP * kH * kD * 4];
    unsigned char k_want[sizeof k], v_want[sizeof v];
    float k_scale[kPages * kP * kH], v_scale[kPages * kP * kH];
    double k_new[kBatch * kNew * kH * kD * 2], v_new[kBatch * kNew * kH * kD * 2]; /* storage of ndt */
    fdt_rng rng = {900 + (uint64_t)cd};
    for (int64_t i = 0; i < (int64_t)sizeof k; ++i) {
      k[i] = (unsigned char)fdt_next(&rng);
      v[i] = (unsigned char)fdt_next(&rng);
    }
    for (int64_t i = 0; i < kPages * kP * kH; ++i) {
      k_scale[i] = (float)fdt_uniform(&rng, 0.01, 0.1);
      v_scale[i] = (float)fdt_uniform(&rng, 0.005, 0.05);
    }
    for (int64_t i = 0; i < kBatch * kNew * kH * kD; ++i) {
      fdt_store(ndt, k_new, i, fdt_uniform(&rng, -3.0, 3.0));
      fdt_store(ndt, v_new, i, fdt_uniform(&rng, -1.0, 1.0));
    }
    memcpy(k_want, k, sizeof k);
    memcpy(v_want, v, sizeof v);
    for (int b = 0; b < kBatch; ++b) {
      const int64_t len = lens[b] > kMaxPages * kP ? kMaxPages * kP : lens[b];
      for (int i = 0; i < kNew; ++i) {
        const int64_t pos = len - kNew + i;
        if (pos < 0) continue;
        const int32_t page = table[b][pos / kP];
        if (page < 0 || page >= kPages) continue;
        for (int g = 0; g < kH; ++g) {
          const int64_t slot = page * scale_strides[0] + (pos % kP) * scale_strides[1] + g;
          const int64_t row = page * cache_strides[0] + (pos % kP) * cache_strides[1] + g * cache_strides[2];
          for (int d = 0; d < kD; ++d) {
            const int64_t src = ((b * kNew + i) * kH + g) * kD + d;
            fdt_append_store(cdt, k_want, row + d, fdt_load(ndt, k_new, src), scaled ? &k_scale[slot] : NULL);
            fdt_append_store(cdt, v_want, row + d, fdt_load(ndt, v_new, src), scaled ? &v_scale[slot] : NULL);
          }
        }
      }
    }
    fd_append_args a;
    fd_append_args_init(&a, sizeof a);
    const int64_t new_shape[4] = {kBatch, kNew, kH, kD}, new_strides[4] = {kNew * kH * kD, kH * kD, kD, 1};
    const int64_t pool_shape[4] = {kPages, kP, kH, kD};
    const int64_t scale_shape[3] = {kPages, kP, kH};
    const int64_t bt_shape[2] = {kBatch, kMaxPages}, bt_strides[2] = {kMaxPages, 1};
    const int64_t lens_shape[1] = {kBatch}, lens_strides[1] = {1};
    a.k_new = fdt_tensor(k_new, ndt, 4, new_shape, new_strides);
    a.v_new = fdt_tensor(v_new, ndt, 4, new_shape, new_strides);
    a.k = fdt_tensor(k, cdt, 4, pool_shape, cache_strides);
    a.v = fdt_tensor(v, cdt, 4, pool_shape, cache_strides);
    if (scaled) {
      a.k_scale = fdt_tensor(k_scale, FD_DTYPE_F32, 3, scale_shape, scale_strides);
      a.v_scale = fdt_tensor(v_scale, FD_DTYPE_F32, 3, scale_shape, scale_strides);
    }
    a.block_table = fdt_tensor((void *)table, FD_DTYPE_I32, 2, bt_shape, bt_strides);
    a.seq_lens = fdt_tensor((void *)lens, FD_DTYPE_I32, 1, lens_shape, lens_strides);
    if (fd_append_kv(h, &a, NULL) != FD_SUCCESS) fail_msg("fd_append_kv: %s", last_message());
    /* The whole buffers: bytes past the pool (of the widest dtype) must not change either. */
    if (memcmp(k, k_want, sizeof k) != 0 || memcmp(v, v_want, sizeof v) != 0) {
      for (int64_t i = 0; i < (int64_t)(sizeof k / es); ++i) {
        if (memcmp(k + i * (int64_t)es, k_want + i * (int64_t)es, es) != 0) {
          fail_msg("%s cache: k element %lld: got %g, want %g", fdt_dtype_name(cdt), (long long)i, fdt_load(cdt, k, i),
                   fdt_load(cdt, k_want, i));
        }
      }
      fail_msg("%s cache: v differs", fdt_dtype_name(cdt));
    }
  }
  assert_int_equal(fd_destroy(h), FD_SUCCESS);
}

/* ---- append of a long broadcast step --------------------------------------------------------------- */
/* new_len far beyond the capacity (k_new and v_new broadcast along it, so
 * no memory backs it): only the last kv_capacity tokens can land, and the
 * call's work follows them, not new_len (on the old CPU loop this test ran
 * for minutes). Every new token of sequence b carries b's rows, so every
 * slot must end up holding them. Then an empty cache: nothing written. */
static void test_append_long_step(void **state) {
  (void)state;
  enum { kBatch = 3, kCap = 5, kH = 2, kD = 8 };
  fd_handle *h = fdt_cpu_handle(2, FD_CHECK_NONE);
  assert_non_null(h);
  float rows[kBatch * kH * kD], k[kBatch * kCap * kH * kD], v[kBatch * kCap * kH * kD];
  for (int i = 0; i < kBatch * kH * kD; ++i) rows[i] = (float)(i % 13) - 6.0f;
  memset(k, 0xff, sizeof k);
  memset(v, 0xff, sizeof v);
  const int64_t new_shape[4] = {kBatch, FD_MAX_KV_LEN, kH, kD}, new_strides[4] = {kH * kD, 0, kD, 1};
  const int64_t cache_shape[4] = {kBatch, kCap, kH, kD}, cache_strides[4] = {kCap * kH * kD, kH * kD, kD, 1};
  fd_append_args a;
  fd_append_args_init(&a, sizeof a);
  a.k_new = fdt_tensor(rows, FD_DTYPE_F32, 4, new_shape, new_strides);
  a.v_new = fdt_tensor(rows, FD_DTYPE_F32, 4, new_shape, new_strides);
  a.k = fdt_tensor(k, FD_DTYPE_F32, 4, cache_shape, cache_strides);
  a.v = fdt_tensor(v, FD_DTYPE_F32, 4, cache_shape, cache_strides);
  assert_int_equal(fd_append_kv(h, &a, NULL), FD_SUCCESS);
  for (int b = 0; b < kBatch; ++b) {
    for (int j = 0; j < kCap; ++j) {
      for (int e = 0; e < kH * kD; ++e) {
        assert_true(k[(b * kCap + j) * kH * kD + e] == rows[b * kH * kD + e]);
        assert_true(v[(b * kCap + j) * kH * kD + e] == rows[b * kH * kD + e]);
      }
    }
  }
  /* The same step into an empty cache writes nothing, at once. */
  const int64_t empty_shape[4] = {kBatch, 0, kH, kD};
  memset(k, 0xff, sizeof k);
  memset(v, 0xff, sizeof v);
  a.k = fdt_tensor(k, FD_DTYPE_F32, 4, empty_shape, cache_strides);
  a.v = fdt_tensor(v, FD_DTYPE_F32, 4, empty_shape, cache_strides);
  assert_int_equal(fd_append_kv(h, &a, NULL), FD_SUCCESS);
  for (size_t i = 0; i < sizeof k; ++i) {
    assert_int_equal(((const unsigned char *)k)[i], 0xff);
    assert_int_equal(((const unsigned char *)v)[i], 0xff);
  }
  assert_int_equal(fd_destroy(h), FD_SUCCESS);
}

/* ---- append then decode ------------------------------------------------------------------------- */
/* A generated problem whose last new tokens (up to 3 per sequence) are
 * replaced by padding, then appended from their values (f32, stored value x
 * scale) with the problem's scales: the cache comes back byte for byte and
 * the decode matches the reference. */
static void test_append_then_decode(void **state) {
  (void)state;
  fd_handle *h = fdt_cpu_handle(2, FD_CHECK_NONE);
  assert_non_null(h);
  int failures = 0;
  for (int kd = 0; kd < 3; ++kd) {
    for (int mode = 0; mode < 4; ++mode) {
      for (int paged = 0; paged < 2; ++paged) {
        fdt_case c = base_case(kCacheDtypes[kd], kFloatDtypes[(kd + mode) % 3], (fdt_scale_mode)mode,
                               paged ? FDT_PAGED_NHD : FDT_BHND);
        c.page_size = 6;
        c.seed = 6000 + (uint64_t)((kd * 4 + mode) * 2 + paged);
        fdt_problem p;
        assert_int_equal(fdt_problem_make(&p, &c), 0);
        const int64_t B = c.batch, N = p.c.kv_len, H = c.kv_heads, D = c.head_dim, T = 3;
        unsigned char *k_orig = malloc(p.kv_bytes), *v_orig = malloc(p.kv_bytes);
        float *k_new = malloc((size_t)(B * T * H * D) * sizeof(float));
        float *v_new = malloc((size_t)(B * T * H * D) * sizeof(float));
        assert_true(k_orig && v_orig && k_new && v_new);
        memcpy(k_orig, p.k, p.kv_bytes);
        memcpy(v_orig, p.v, p.kv_bytes);
        for (int64_t b = 0; b < B; ++b) {
          for (int64_t i = 0; i < T; ++i) {
            const int64_t pos = p.lens[b] - T + i;
            for (int64_t g = 0; g < H; ++g) {
              int64_t row = 0;
              if (pos >= 0) {
                const fd_tensor *t = &p.args.k;
                const int64_t outer = paged ? p.block_table[b * (N / c.page_size) + pos / c.page_size] : b;
                const int64_t inner = paged ? pos % c.page_size : pos;
                row = outer * t->strides[0] + inner * t->strides[1] + g * t->strides[2];
                row += ((unsigned char *)t->data - (unsigned char *)p.k);
              }
              for (int64_t d = 0; d < D; ++d) {
                const int64_t src = ((b * T + i) * H + g) * D + d;
                if (pos < 0) { /* skipped: anything goes */
                  k_new[src] = NAN;
                  v_new[src] = 1e30f;
                  continue;
                }
                k_new[src] = (float)p.ref_k[((b * N + pos) * H + g) * D + d];
                v_new[src] = (float)p.ref_v[((b * N + pos) * H + g) * D + d];
                ((uint8_t *)p.k)[row + d] = fdt_pad_byte(kCacheDtypes[kd], d);
                ((uint8_t *)p.v)[row + d] = fdt_pad_byte(kCacheDtypes[kd], d + 1);
              }
            }
          }
        }
        fd_append_args a;
        fd_append_args_init(&a, sizeof a);
        const int64_t new_shape[4] = {B, T, H, D}, new_strides[4] = {T * H * D, H * D, D, 1};
        a.k_new = fdt_tensor(k_new, FD_DTYPE_F32, 4, new_shape, new_strides);
        a.v_new = fdt_tensor(v_new, FD_DTYPE_F32, 4, new_shape, new_strides);
        a.k = p.args.k;
        a.v = p.args.v;
        a.k_scale = p.args.k_scale;
        a.v_scale = p.args.v_scale;
        a.seq_lens = p.args.seq_lens;
        a.block_table = p.args.block_table;
        if (fd_append_kv(h, &a, NULL) != FD_SUCCESS) fail_msg("fd_append_kv: %s", last_message());
        if (memcmp(p.k, k_orig, p.kv_bytes) != 0 || memcmp(p.v, v_orig, p.kv_bytes) != 0) {
          char description[384];
          fdt_case_describe(&c, description, sizeof description);
          print_message("append then decode: %s: the cache differs from the original\n", description);
          ++failures;
        }
        failures += decode_and_check(h, &p, "append then decode");
        free(k_orig);
        free(v_orig);
        free(k_new);
        free(v_new);
        fdt_problem_free(&p);
      }
    }
  }
  assert_int_equal(fd_destroy(h), FD_SUCCESS);
  assert_int_equal(failures, 0);
}

/* ---- append validation ---------------------------------------------------------------------------- */
typedef struct append_setup {
  float k_new[2 * 2 * 2 * 8], v_new[2 * 2 * 2 * 8];
  uint8_t k[2 * 6 * 2 * 8], v[2 * 6 * 2 * 8];
  uint16_t k16[2 * 6 * 2 * 8], v16[2 * 6 * 2 * 8];
  float k_scale[2 * 6 * 2], v_scale[2 * 6 * 2];
  int32_t lens[2];
  fd_append_args args;
} append_setup;

static void make_append_setup(append_setup *s) {
  memset(s, 0, sizeof *s);
  for (size_t i = 0; i < sizeof s->k_new / sizeof s->k_new[0]; ++i) s->k_new[i] = s->v_new[i] = 1.0f;
  memset(s->k, 0xee, sizeof s->k);
  memset(s->v, 0xee, sizeof s->v);
  memset(s->k16, 0xee, sizeof s->k16);
  memset(s->v16, 0xee, sizeof s->v16);
  for (size_t i = 0; i < sizeof s->k_scale / sizeof s->k_scale[0]; ++i) s->k_scale[i] = s->v_scale[i] = 0.5f;
  s->lens[0] = 3;
  s->lens[1] = 6;
  fd_append_args_init(&s->args, sizeof s->args);
  const int64_t new_shape[4] = {2, 2, 2, 8}, new_strides[4] = {32, 16, 8, 1};
  const int64_t cache_shape[4] = {2, 6, 2, 8}, cache_strides[4] = {96, 16, 8, 1};
  const int64_t scale_shape[3] = {2, 6, 2}, scale_strides[3] = {12, 2, 1};
  const int64_t lens_shape[1] = {2}, lens_strides[1] = {1};
  s->args.k_new = fdt_tensor(s->k_new, FD_DTYPE_F32, 4, new_shape, new_strides);
  s->args.v_new = fdt_tensor(s->v_new, FD_DTYPE_F32, 4, new_shape, new_strides);
  s->args.k = fdt_tensor(s->k, FD_DTYPE_E4M3, 4, cache_shape, cache_strides);
  s->args.v = fdt_tensor(s->v, FD_DTYPE_E4M3, 4, cache_shape, cache_strides);
  s->args.k_scale = fdt_tensor(s->k_scale, FD_DTYPE_F32, 3, scale_shape, scale_strides);
  s->args.v_scale = fdt_tensor(s->v_scale, FD_DTYPE_F32, 3, scale_shape, scale_strides);
  s->args.seq_lens = fdt_tensor(s->lens, FD_DTYPE_I32, 1, lens_shape, lens_strides);
}

/* The call fails with `status`, its message holds `needle` (the argument at
 * fault as validate.cpp prints it, with what is wrong; see
 * expect_decode_error), and it writes nothing. */
static void expect_append_error(fd_handle *h, append_setup *s, const fd_append_args *a, fd_status status,
                                const char *needle) {
  assert_int_equal(fd_append_kv(h, a, NULL), status);
  if (strstr(last_message(), needle) == NULL) fail_msg("message \"%s\" lacks \"%s\"", last_message(), needle);
  for (size_t i = 0; i < sizeof s->k; ++i) assert_true(s->k[i] == 0xee && s->v[i] == 0xee);
  for (size_t i = 0; i < sizeof s->k16 / 2; ++i) assert_true(s->k16[i] == 0xeeee && s->v16[i] == 0xeeee);
}

static void test_append_validation(void **state) {
  (void)state;
  fd_handle *h = fdt_cpu_handle(2, FD_CHECK_NONE);
  assert_non_null(h);
  static append_setup s;
  make_append_setup(&s);
  fd_append_args a = s.args;
  assert_int_equal(fd_append_kv(h, &a, NULL), FD_SUCCESS); /* the fixture is valid and writes */
  assert_int_not_equal(s.k[(0 * 6 + 1) * 16], 0xee);
  make_append_setup(&s);

  assert_int_equal(fd_append_kv(h, NULL, NULL), FD_ERROR_NULL_POINTER);
  a = s.args;
  a.k_new.dtype = FD_DTYPE_I32;
  expect_append_error(h, &s, &a, FD_ERROR_INVALID_DTYPE, ": k_new: dtype must be f32, f16 or bf16, got i32");
  a = s.args;
  a.v_new.dtype = FD_DTYPE_E4M3;
  expect_append_error(h, &s, &a, FD_ERROR_INVALID_DTYPE, ": v_new: dtype must be f32, got e4m3");
  a = s.args;
  a.v.dtype = FD_DTYPE_E5M2;
  expect_append_error(h, &s, &a, FD_ERROR_INVALID_DTYPE, ": v: dtype must be e4m3, got e5m2");
  a = s.args;
  a.k.dtype = FD_DTYPE_I32;
  expect_append_error(h, &s, &a, FD_ERROR_INVALID_DTYPE, ": k: dtype must be f32, f16 or bf16, got i32");
  a = s.args;
  a.k_new.shape[3] = 4;
  expect_append_error(h, &s, &a, FD_ERROR_INVALID_SHAPE, ": k_new: head_dim must be 8 (from k), got 4");
  a = s.args;
  a.v_new.shape[1] = 1;
  expect_append_error(h, &s, &a, FD_ERROR_INVALID_SHAPE, ": v_new: new_len must be 2 (from k_new), got 1");
  a = s.args;
  a.k_new.shape[0] = 1; /* dense: the cache's batch is k_new's */
  a.v_new.shape[0] = 1;
  expect_append_error(h, &s, &a, FD_ERROR_INVALID_SHAPE, ": k: batch must be 1 (from k_new), got 2");
  a = s.args;
  a.k_new.shape[2] = 1;
  expect_append_error(h, &s, &a, FD_ERROR_INVALID_SHAPE, ": k_new: kv_heads must be 2 (from k), got 1");
  a = s.args;
  a.k_scale.shape[2] = 3;
  expect_append_error(h, &s, &a, FD_ERROR_INVALID_SHAPE, ": k_scale: kv_heads must be 2 (from k), got 3");
  a = s.args;
  a.v_scale.dtype = FD_DTYPE_BF16;
  expect_append_error(h, &s, &a, FD_ERROR_INVALID_DTYPE, ": v_scale: dtype must be f32, got bf16");
  a = s.args;
  a.seq_lens.shape[0] = 3;
  expect_append_error(h, &s, &a, FD_ERROR_INVALID_SHAPE, ": seq_lens: batch must be 2 (from k_new), got 3");
  a = s.args;
  a.seq_lens.dtype = FD_DTYPE_F32;
  expect_append_error(h, &s, &a, FD_ERROR_INVALID_DTYPE, ": seq_lens: dtype must be i32, got f32");
  a = s.args;
  a.k.data = NULL;
  expect_append_error(h, &s, &a, FD_ERROR_NULL_POINTER, ": k: data is NULL");
  a = s.args;
  a.k_new.data = NULL;
  expect_append_error(h, &s, &a, FD_ERROR_NULL_POINTER, ": k_new: data is NULL");
  /* Overlaps: the cache with k_new, v_new, a scale, seq_lens; a cache over itself. */
  a = s.args;
  a.k_new.data = s.k; /* f32 [2, 2, 2, 8]: 256 bytes over the 192 of k and past them */
  expect_append_error(h, &s, &a, FD_ERROR_INVALID_ARGUMENT, "overlap those of input k_new (");
  assert_non_null(strstr(last_message(), ": k: its bytes"));
  a = s.args;
  a.v_new.data = s.k_new; /* inputs may share memory; the cache may not */
  a.k_new.data = s.v;
  expect_append_error(h, &s, &a, FD_ERROR_INVALID_ARGUMENT, "overlap those of input k_new (");
  assert_non_null(strstr(last_message(), ": v: its bytes"));
  a = s.args;
  a.v_scale.data = s.k;
  a.v_scale.strides[0] = a.v_scale.strides[1] = a.v_scale.strides[2] = 0;
  expect_append_error(h, &s, &a, FD_ERROR_INVALID_ARGUMENT, "overlap those of input v_scale (");
  assert_non_null(strstr(last_message(), ": k: its bytes"));
  a = s.args;
  a.seq_lens.data = s.v + 16;
  expect_append_error(h, &s, &a, FD_ERROR_INVALID_ARGUMENT, "overlap those of input seq_lens (");
  assert_non_null(strstr(last_message(), ": v: its bytes"));
  a = s.args;
  a.k.strides[1] = 4; /* rows overlapping rows */
  expect_append_error(h, &s, &a, FD_ERROR_INVALID_STRIDE, ": k: its strides do not nest");
  /* Scales on a 16-bit cache. */
  a = s.args;
  a.k.data = s.k16;
  a.v.data = s.v16;
  a.k.dtype = a.v.dtype = FD_DTYPE_BF16;
  expect_append_error(h, &s, &a, FD_ERROR_INVALID_DTYPE,
                      ": k_scale: scales apply to 8-bit caches only, and k and v are bf16");
  memset(&a.k_scale, 0, sizeof a.k_scale);
  expect_append_error(h, &s, &a, FD_ERROR_INVALID_DTYPE,
                      ": v_scale: scales apply to 8-bit caches only, and k and v are bf16");
  assert_int_equal(fd_destroy(h), FD_SUCCESS);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_fdt_formats),           cmocka_unit_test(test_decode_matrix),
      cmocka_unit_test(test_decode_variants),       cmocka_unit_test(test_decode_wide_scales),
      cmocka_unit_test(test_decode_large_scales),   cmocka_unit_test(test_decode_every_value_code),
      cmocka_unit_test(test_decode_every_key_code), cmocka_unit_test(test_batch_invariant),
      cmocka_unit_test(test_decode_validation),     cmocka_unit_test(test_append_rounding),
      cmocka_unit_test(test_append_paged),          cmocka_unit_test(test_append_then_decode),
      cmocka_unit_test(test_append_validation),     cmocka_unit_test(test_append_long_step),
  };
  return cmocka_run_group_tests_name("quantized", tests, NULL, NULL);
}
