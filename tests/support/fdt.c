// SPDX-License-Identifier: Apache-2.0
/* Test support: see fdt.h. */
#include "fdt.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- random numbers ------------------------------------------------------ */
uint64_t fdt_next(fdt_rng *rng) {
  uint64_t z = (rng->state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

double fdt_uniform(fdt_rng *rng, double lo, double hi) {
  return lo + (hi - lo) * (double)(fdt_next(rng) >> 11) * (1.0 / 9007199254740992.0);
}

int64_t fdt_int(fdt_rng *rng, int64_t lo, int64_t hi_inclusive) {
  return lo + (int64_t)(fdt_next(rng) % (uint64_t)(hi_inclusive - lo + 1));
}

/* ---- dtype conversion ---------------------------------------------------- */
size_t fdt_dtype_size(fd_dtype dtype) {
  switch (dtype) {
    case FD_DTYPE_F32:
    case FD_DTYPE_I32: return 4;
    case FD_DTYPE_F16:
    case FD_DTYPE_BF16: return 2;
    case FD_DTYPE_E4M3:
    case FD_DTYPE_E5M2:
    case FD_DTYPE_I8: return 1;
  }
  return 0;
}

const char *fdt_dtype_name(fd_dtype dtype) {
  switch (dtype) {
    case FD_DTYPE_F32: return "f32";
    case FD_DTYPE_F16: return "f16";
    case FD_DTYPE_BF16: return "bf16";
    case FD_DTYPE_I32: return "i32";
    case FD_DTYPE_E4M3: return "e4m3";
    case FD_DTYPE_E5M2: return "e5m2";
    case FD_DTYPE_I8: return "i8";
  }
  return "?";
}

/* Rounds to the nearest representable value with `mantissa_bits` explicit
 * bits and a minimum normal exponent, ties to even (via nearbyint). */
static double round_float_format(double x, int mantissa_bits, int min_exponent, double max_value) {
  if (x == 0.0 || isnan(x) || isinf(x)) return x;
  int exponent;
  frexp(x, &exponent);                                  /* x = f * 2^exponent, 0.5 <= |f| < 1 */
  exponent -= 1;                                        /* x = 1.f * 2^exponent */
  if (exponent < min_exponent) exponent = min_exponent; /* subnormal spacing */
  const double quantum = ldexp(1.0, exponent - mantissa_bits);
  const double r = nearbyint(x / quantum) * quantum;
  if (fabs(r) > max_value) return copysign(INFINITY, x);
  return r;
}

double fdt_round_to(fd_dtype dtype, double x) {
  switch (dtype) {
    case FD_DTYPE_F32: return (double)(float)x;
    case FD_DTYPE_F16: return round_float_format(x, 10, -14, 65504.0);
    case FD_DTYPE_BF16: return round_float_format((double)(float)x, 7, -126, 3.3895313892515355e38);
    case FD_DTYPE_I32: return x;
    case FD_DTYPE_E4M3:
    case FD_DTYPE_E5M2:
    case FD_DTYPE_I8: return fdt_fp8_value(dtype, fdt_quantize(dtype, x));
  }
  return x;
}

/* Rounds to the 8-bit format, ties to even, saturating (fp8: to the largest
 * finite value, NaN stays NaN; int8: to [-127, 127], NaN gives 0), and
 * returns the stored byte. */
uint8_t fdt_quantize(fd_dtype dtype, double x) {
  if (dtype == FD_DTYPE_I8) {
    if (isnan(x)) return 0;
    double r = nearbyint(x);
    if (r > 127.0) r = 127.0;
    if (r < -127.0) r = -127.0;
    return (uint8_t)(int8_t)r;
  }
  const int e4m3 = dtype == FD_DTYPE_E4M3;
  const int mantissa_bits = e4m3 ? 3 : 2;
  const int bias = e4m3 ? 7 : 15;
  const double max_value = e4m3 ? 448.0 : 57344.0;
  const uint8_t sign = signbit(x) ? 0x80u : 0;
  if (isnan(x)) return 0x7fu;
  double r = round_float_format(fabs(x), mantissa_bits, 1 - bias, INFINITY);
  if (r > max_value) r = max_value;
  if (r == 0.0) return sign;
  int exponent;
  const double f = frexp(r, &exponent); /* r = f * 2^exponent, 0.5 <= f < 1 */
  exponent -= 1;
  if (exponent < 1 - bias) { /* subnormal: r = m * 2^(1 - bias - mantissa_bits) */
    return (uint8_t)(sign | (uint8_t)(r / ldexp(1.0, 1 - bias - mantissa_bits)));
  }
  const unsigned mantissa = (unsigned)((f * 2.0 - 1.0) * (double)(1 << mantissa_bits));
  return (uint8_t)(sign | (unsigned)(exponent + bias) << mantissa_bits | mantissa);
}

/* The value of an 8-bit element (fp8 decoded exactly, int8 as an integer). */
double fdt_fp8_value(fd_dtype dtype, uint8_t bits) {
  if (dtype == FD_DTYPE_I8) return (double)(int8_t)bits;
  const int e4m3 = dtype == FD_DTYPE_E4M3;
  const int mantissa_bits = e4m3 ? 3 : 2;
  const int bias = e4m3 ? 7 : 15;
  const double sign = (bits & 0x80u) ? -1.0 : 1.0;
  const int exponent = (bits & 0x7fu) >> mantissa_bits;
  const int mantissa = bits & ((1 << mantissa_bits) - 1);
  if (e4m3 && (bits & 0x7fu) == 0x7fu) return NAN;
  if (!e4m3 && exponent == 0x1f) return mantissa ? NAN : sign * INFINITY;
  if (exponent == 0) return sign * ldexp((double)mantissa, 1 - bias - mantissa_bits);
  return sign * ldexp(1.0 + (double)mantissa / (double)(1 << mantissa_bits), exponent - bias);
}

int fdt_is_quantized(fd_dtype dtype) {
  return dtype == FD_DTYPE_E4M3 || dtype == FD_DTYPE_E5M2 || dtype == FD_DTYPE_I8;
}

fd_dtype fdt_kv_dtype(const fdt_case *c) { return fdt_is_quantized(c->kv_dtype) ? c->kv_dtype : c->dtype; }

uint8_t fdt_pad_byte(fd_dtype dtype, int64_t i) {
  static const uint8_t e4m3[4] = {0x7f, 0xff, 0x7e, 0xfe}, e5m2[4] = {0x7c, 0xfc, 0x7f, 0x7b},
                       i8[4] = {0x7f, 0x80, 0x81, 0x7f};
  const uint8_t *pattern = dtype == FD_DTYPE_E4M3 ? e4m3 : dtype == FD_DTYPE_E5M2 ? e5m2 : i8;
  return pattern[i & 3];
}

static uint16_t half_bits(double x) {
  const double r = fdt_round_to(FD_DTYPE_F16, x);
  uint16_t sign = signbit(r) ? 0x8000u : 0;
  const double a = fabs(r);
  if (isnan(r)) return 0x7e00u;
  if (isinf(a)) return (uint16_t)(sign | 0x7c00u);
  if (a == 0.0) return sign;
  int exponent;
  const double f = frexp(a, &exponent);                                              /* a = f * 2^exponent */
  if (exponent - 1 < -14) return (uint16_t)(sign | (uint16_t)(a / ldexp(1.0, -24))); /* subnormal */
  return (uint16_t)(sign | (uint16_t)((exponent - 1 + 15) << 10) | (uint16_t)((f * 2.0 - 1.0) * 1024.0));
}

static double half_value(uint16_t h) {
  const int exponent = (h >> 10) & 0x1f;
  const int mantissa = h & 0x3ff;
  const double sign = (h & 0x8000u) ? -1.0 : 1.0;
  if (exponent == 0x1f) return mantissa ? NAN : sign * INFINITY;
  if (exponent == 0) return sign * ldexp((double)mantissa, -24);
  return sign * ldexp(1.0 + mantissa / 1024.0, exponent - 15);
}

void fdt_store(fd_dtype dtype, void *base, int64_t index, double x) {
  switch (dtype) {
    case FD_DTYPE_F32: ((float *)base)[index] = (float)x; break;
    case FD_DTYPE_F16: ((uint16_t *)base)[index] = half_bits(x); break;
    case FD_DTYPE_BF16: {
      const float f = (float)fdt_round_to(FD_DTYPE_BF16, x);
      uint32_t bits;
      memcpy(&bits, &f, sizeof bits);
      ((uint16_t *)base)[index] = (uint16_t)(bits >> 16); /* exact: already rounded */
      break;
    }
    case FD_DTYPE_I32: ((int32_t *)base)[index] = (int32_t)x; break;
    case FD_DTYPE_E4M3:
    case FD_DTYPE_E5M2:
    case FD_DTYPE_I8: ((uint8_t *)base)[index] = fdt_quantize(dtype, x); break;
  }
}

double fdt_load(fd_dtype dtype, const void *base, int64_t index) {
  switch (dtype) {
    case FD_DTYPE_F32: return ((const float *)base)[index];
    case FD_DTYPE_F16: return half_value(((const uint16_t *)base)[index]);
    case FD_DTYPE_BF16: {
      const uint32_t bits = (uint32_t)((const uint16_t *)base)[index] << 16;
      float f;
      memcpy(&f, &bits, sizeof f);
      return f;
    }
    case FD_DTYPE_I32: return ((const int32_t *)base)[index];
    case FD_DTYPE_E4M3:
    case FD_DTYPE_E5M2:
    case FD_DTYPE_I8: return fdt_fp8_value(dtype, ((const uint8_t *)base)[index]);
  }
  return NAN;
}

void fdt_append_store(fd_dtype cache_dtype, void *base, int64_t index, double value, const float *scale) {
  float x = (float)value;
  if (scale) x = x / *scale; /* float32 division, as the library computes it */
  if (fdt_is_quantized(cache_dtype)) {
    ((uint8_t *)base)[index] = fdt_quantize(cache_dtype, (double)x);
  } else {
    fdt_store(cache_dtype, base, index, (double)x);
  }
}

/* ---- problems ------------------------------------------------------------- */
fd_tensor fdt_tensor(void *data, fd_dtype dtype, int ndim, const int64_t *shape, const int64_t *strides) {
  fd_tensor t;
  memset(&t, 0, sizeof t);
  t.data = data;
  t.dtype = dtype;
  t.ndim = ndim;
  for (int d = 0; d < ndim; ++d) {
    t.shape[d] = shape[d];
    t.strides[d] = strides[d];
  }
  return t;
}

static void *alloc_nan(size_t bytes) {
  void *p = malloc(bytes ? bytes : 1);
  if (p) memset(p, 0xff, bytes); /* all-ones: NaN in f32, f16 and bf16 */
  return p;
}

static int is_paged(fdt_layout layout) { return layout == FDT_PAGED_NHD || layout == FDT_PAGED_HND; }

void fdt_poison_outputs(fdt_problem *p) {
  memset(p->out, 0xff, p->out_bytes);
  if (p->lse) memset(p->lse, 0xff, p->lse_bytes);
}

int64_t fdt_q_len(const fdt_case *c) { return c->q_len > 0 ? c->q_len : 1; }

/* Straight from flashdecode.h's definition: token t sits at position
 * len - q_count + t; key j is seen if j < len, at or before that position
 * under the causal mask, and fewer than `window` positions behind it;
 * padding tokens (t >= q_count) see nothing. */
int fdt_sees(const fdt_case *c, int64_t len, int64_t q_count, int64_t t, int64_t j) {
  const int64_t pos_q = len - q_count + t;
  if (t >= q_count || j < 0 || j >= len) return 0;
  if (c->mask == FD_MASK_CAUSAL && j > pos_q) return 0;
  if (c->window > 0 && pos_q - j >= c->window) return 0;
  return 1;
}

/* The float64 reference, by flashdecode.h's formulas for the variants and
 * its rules for non-finite scores: NaN or +inf among a row's scores makes
 * it NaN; -inf masks a key (before the softcap, which maps it to -c: the
 * key then counts). A row that sees no key, or whose keys are all masked,
 * is zeros with LSE -inf, or the sink's logit. */
void fdt_reference(fdt_problem *p) {
  const fdt_case *c = &p->c;
  const int64_t D = c->head_dim, group = c->q_heads / c->kv_heads, Lq = fdt_q_len(c);
  const double scale = c->softmax_scale != 0.0 ? c->softmax_scale : 1.0 / sqrt((double)D);
  const double cap = (double)(float)c->softcap; /* the library reads a float */
  double *scores = malloc((size_t)(c->kv_len > 0 ? c->kv_len : 1) * sizeof *scores);
  for (int64_t b = 0; b < c->batch; ++b) {
    const int64_t len = p->lens[b], q_count = p->q_counts[b];
    for (int64_t t = 0; t < Lq; ++t) {
      const int64_t pos_q = len - q_count + t;
      for (int64_t h = 0; h < c->q_heads; ++h) {
        const int64_t g = h / group, row = (b * Lq + t) * c->q_heads + h;
        const double *q = p->ref_q + row * D;
        double *out = p->expect_out + row * D;
        double *lse = p->expect_lse + row;
        const double sink = p->ref_sinks ? p->ref_sinks[h] : -INFINITY; /* exp(-inf): nothing joins */
        double m = -INFINITY;
        int nan_row = 0;
        for (int64_t j = 0; j < len; ++j) {
          if (!fdt_sees(c, len, q_count, t, j)) continue; /* unseen: no score, its v never read */
          const double *k = p->ref_k + ((b * c->kv_len + j) * c->kv_heads + g) * D;
          double s = 0.0;
          for (int64_t d = 0; d < D; ++d) s += q[d] * k[d];
          s *= scale;
          if (cap > 0.0) s = cap * tanh(s / cap);
          if (p->ref_alibi_slopes) s += p->ref_alibi_slopes[h] * (double)(j - pos_q);
          scores[j] = s;
          if (isnan(s) || s == INFINITY) nan_row = 1;
          if (s > m) m = s;
        }
        if (nan_row) {
          for (int64_t d = 0; d < D; ++d) out[d] = NAN;
          *lse = NAN;
          continue;
        }
        if (m == -INFINITY) { /* sees no key, or every key masked */
          for (int64_t d = 0; d < D; ++d) out[d] = 0.0;
          *lse = sink;
          continue;
        }
        const double top = sink > m ? sink : m; /* both terms relative to the larger */
        double l = exp(sink - top);
        for (int64_t d = 0; d < D; ++d) out[d] = 0.0;
        for (int64_t j = 0; j < len; ++j) {
          if (!fdt_sees(c, len, q_count, t, j)) continue;
          const double w = exp(scores[j] - top); /* 0 for a masked key (its v still multiplied, as before) */
          const double *v = p->ref_v + ((b * c->kv_len + j) * c->kv_heads + g) * D;
          l += w;
          for (int64_t d = 0; d < D; ++d) out[d] += w * v[d];
        }
        for (int64_t d = 0; d < D; ++d) out[d] /= l;
        *lse = top + log(l);
      }
    }
  }
  free(scores);
}

/* The scale of a quantized cache's element before any data: 1 for fp8 (values
 * O(1) are in range), 1/127 of the value range for int8. */
static double base_scale(fd_dtype dtype, double range) { return dtype == FD_DTYPE_I8 ? range / 127.0 : 1.0; }

static double draw_scale(fdt_rng *rng, const fdt_case *c, double range) {
  const double base = base_scale(c->kv_dtype, range);
  if (!c->wide_scales) return (double)(float)(base * fdt_uniform(rng, 0.5, 2.0));
  if (fdt_int(rng, 0, 7) == 0) return 0.0;
  return (double)(float)(base * pow(2.0, fdt_uniform(rng, -12.0, 12.0)));
}

/* Quantizes the drawn ref_k / ref_v of an 8-bit problem: per logical row
 * (sequence, token, KV head) a scale by c->scale_mode, the stored bytes
 * fdt_quantize(value / scale) and the reference value stored x scale. */
static int quantize_problem(fdt_problem *p, uint8_t **kq, uint8_t **vq, double **ks, double **vs) {
  const fdt_case *c = &p->c;
  const int64_t B = c->batch, N = c->kv_len, Hkv = c->kv_heads, D = c->head_dim;
  fdt_rng rng = {c->seed * 0x9e3779b97f4a7c15ull + 0x51ed2701u};
  *kq = malloc((size_t)(B * N * Hkv * D) + 1);
  *vq = malloc((size_t)(B * N * Hkv * D) + 1);
  *ks = malloc((size_t)(B * N * Hkv) * sizeof(double) + 1);
  *vs = malloc((size_t)(B * N * Hkv) * sizeof(double) + 1);
  if (!*kq || !*vq || !*ks || !*vs) return -1;
  for (int pass = 0; pass < 2; ++pass) {
    double *scales = pass == 0 ? *ks : *vs, *ref = pass == 0 ? p->ref_k : p->ref_v;
    uint8_t *bytes = pass == 0 ? *kq : *vq;
    const double range = pass == 0 ? 2.0 : 1.0; /* k in [-2, 2], v in [-1, 1] */
    double head_scale[FD_MAX_HEADS];
    const double tensor_scale = draw_scale(&rng, c, range);
    for (int64_t g = 0; g < Hkv; ++g) head_scale[g] = draw_scale(&rng, c, range);
    for (int64_t row = 0; row < B * N * Hkv; ++row) {
      switch (c->scale_mode) {
        case FDT_SCALE_TENSOR: scales[row] = tensor_scale; break;
        case FDT_SCALE_HEAD: scales[row] = head_scale[row % Hkv]; break;
        case FDT_SCALE_TOKEN: scales[row] = draw_scale(&rng, c, range); break;
        case FDT_SCALE_NONE:
        default: scales[row] = 1.0; break;
      }
      for (int64_t d = 0; d < D; ++d) {
        const double x = ref[row * D + d];
        const uint8_t q = fdt_quantize(c->kv_dtype, scales[row] != 0.0 ? x / scales[row] : x);
        bytes[row * D + d] = q;
        ref[row * D + d] = fdt_fp8_value(c->kv_dtype, q) * scales[row];
      }
    }
  }
  return 0;
}

/* Lays out one scale tensor of an 8-bit problem (k or v's) by c->scale_mode,
 * the shape of the cache's first three dimensions: per-token scales in the
 * cache's order (head-major for BHND and paged HND), their padding NaN and
 * 1e30 in turn. */
static int lay_out_scales(fdt_problem *p, const double *scales, const int64_t *kv_shape, float **storage, size_t *bytes,
                          fd_tensor *tensor) {
  const fdt_case *c = &p->c;
  const int64_t B = c->batch, N = c->kv_len, Hkv = c->kv_heads;
  const int paged = is_paged(c->layout);
  const int64_t outer = kv_shape[0], inner = kv_shape[1], P = c->page_size;
  const int64_t max_pages = paged ? N / P : 0;
  int64_t strides[3] = {0, 0, 0}, elems = 1;
  if (c->scale_mode == FDT_SCALE_HEAD) {
    const int64_t pitch = c->layout == FDT_BNHD_PADDED ? 2 : 1;
    strides[2] = pitch;
    elems = Hkv * pitch;
  } else if (c->scale_mode == FDT_SCALE_TOKEN) {
    const int head_major = c->layout == FDT_BHND || c->layout == FDT_PAGED_HND;
    strides[0] = inner * Hkv;
    strides[1] = head_major ? 1 : Hkv;
    strides[2] = head_major ? inner : 1;
    elems = outer * inner * Hkv;
  }
  *bytes = (size_t)elems * sizeof(float);
  *storage = malloc(*bytes);
  if (!*storage) return -1;
  for (int64_t i = 0; i < elems; ++i) (*storage)[i] = (i & 1) ? NAN : 1e30f;
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t j = 0; j < N; ++j) {
      /* Broadcast scales are written once; per-token ones for valid tokens only. */
      if (c->scale_mode == FDT_SCALE_TOKEN && j >= p->lens[b]) continue;
      const int64_t o = paged ? p->block_table[b * max_pages + j / P] : b, in = paged ? j % P : j;
      for (int64_t g = 0; g < Hkv; ++g) {
        (*storage)[o * strides[0] + in * strides[1] + g * strides[2]] = (float)scales[(b * N + j) * Hkv + g];
      }
    }
  }
  if (c->scale_mode != FDT_SCALE_TOKEN) { /* broadcast: valid whatever the lengths */
    for (int64_t g = 0; g < Hkv; ++g) (*storage)[g * strides[2]] = (float)scales[g];
  }
  const int64_t shape[3] = {kv_shape[0], kv_shape[1], kv_shape[2]};
  *tensor = fdt_tensor(*storage, FD_DTYPE_F32, 3, shape, strides);
  return 0;
}

/* values [batch] as an i32 storage buffer and its tensor (seq_lens, q_lens). */
static int per_sequence_i32(const int64_t *values, int64_t batch, int32_t **storage, size_t *bytes, fd_tensor *tensor) {
  *bytes = (size_t)batch * sizeof(int32_t);
  *storage = malloc(*bytes + 1);
  if (!*storage) return -1;
  for (int64_t b = 0; b < batch; ++b) (*storage)[b] = (int32_t)values[b];
  const int64_t shape[1] = {batch}, strides[1] = {1};
  *tensor = fdt_tensor(*storage, FD_DTYPE_I32, 1, shape, strides);
  return 0;
}

int fdt_problem_make(fdt_problem *p, const fdt_case *case_in) {
  memset(p, 0, sizeof *p);
  p->c = *case_in;
  fdt_case *c = &p->c;
  fdt_rng rng = {c->seed * 0x2545f4914f6cdd1dull + 1};
  const int64_t B = c->batch, Hq = c->q_heads, Hkv = c->kv_heads, D = c->head_dim, Lq = fdt_q_len(c);
  const fd_dtype dt = c->dtype, kvdt = fdt_kv_dtype(c);
  const int quantized = fdt_is_quantized(kvdt);
  const size_t es = fdt_dtype_size(dt), kv_es = fdt_dtype_size(kvdt);
  int64_t max_pages = 0, num_pages = 0, P = c->page_size;
  if (is_paged(c->layout)) {
    max_pages = (c->kv_len + P - 1) / P;
    c->kv_len = max_pages * P;
    num_pages = B * max_pages + 3; /* spare pages stay NaN: reading one shows */
  }
  const int64_t N = c->kv_len;

  /* Logical float64 tensors, values exactly representable in dtype. */
  p->ref_q = malloc((size_t)(B * Lq * Hq * D) * sizeof(double) + 1);
  p->ref_k = malloc((size_t)(B * N * Hkv * D) * sizeof(double) + 1);
  p->ref_v = malloc((size_t)(B * N * Hkv * D) * sizeof(double) + 1);
  p->lens = malloc((size_t)B * sizeof(int64_t) + 1);
  p->q_counts = malloc((size_t)B * sizeof(int64_t) + 1);
  p->expect_out = malloc((size_t)(B * Lq * Hq * D) * sizeof(double) + 1);
  p->expect_lse = malloc((size_t)(B * Lq * Hq) * sizeof(double) + 1);
  if (!p->ref_q || !p->ref_k || !p->ref_v || !p->lens || !p->q_counts || !p->expect_out || !p->expect_lse) return -1;
  for (int64_t i = 0; i < B * Lq * Hq * D; ++i) p->ref_q[i] = fdt_round_to(dt, fdt_uniform(&rng, -2.0, 2.0));
  for (int64_t i = 0; i < B * N * Hkv * D; ++i) p->ref_k[i] = fdt_round_to(dt, fdt_uniform(&rng, -2.0, 2.0));
  for (int64_t i = 0; i < B * N * Hkv * D; ++i) p->ref_v[i] = fdt_round_to(dt, fdt_uniform(&rng, -1.0, 1.0));
  /* Ragged lengths cover the edges: empty, full, one, and around 64. */
  static const int64_t edge_lens[] = {0, -1, 1, 63, 64, 65};
  for (int64_t b = 0; b < B; ++b) {
    int64_t len = N;
    if (c->ragged) {
      len = b < 6 ? edge_lens[b] : fdt_int(&rng, 0, N);
      if (len < 0 || len > N) len = N;
      if (c->lens != NULL) len = c->lens[b] < 0 ? 0 : c->lens[b] > N ? N : c->lens[b];
    }
    p->lens[b] = len;
  }
  p->c.lens = NULL; /* read: p->lens holds them, and the caller's array need not outlive the problem */
  /* Query tokens per sequence, from a generator of their own (cases
   * without ragged_q draw what they drew before): 0, all and 1 first. */
  fdt_rng q_rng = {c->seed * 0xd1b54a32d192ed03ull + 7};
  for (int64_t b = 0; b < B; ++b) {
    static const int64_t edge_counts[] = {0, -1, 1};
    int64_t count = Lq;
    if (c->ragged_q) count = b < 3 ? (edge_counts[b] < 0 ? Lq : edge_counts[b]) : fdt_int(&q_rng, 0, Lq);
    p->q_counts[b] = count;
  }
  /* An 8-bit cache: scales and stored bytes per logical element, from a
   * generator of their own (a float cache draws the same data as before). */
  uint8_t *kq = NULL, *vq = NULL;
  double *ks = NULL, *vs = NULL; /* [B, N, Hkv]: the scale of each logical row */
  if (quantized && quantize_problem(p, &kq, &vq, &ks, &vs) != 0) return -1;

  /* q and out: [B, Lq, Hq, D]; the padded layout leaves gaps between heads. */
  const int64_t head_pitch = c->layout == FDT_BNHD_PADDED ? D + 8 : D;
  const int64_t q_shape[4] = {B, Lq, Hq, D};
  const int64_t q_strides[4] = {Lq * Hq * head_pitch, Hq * head_pitch, head_pitch, 1};
  p->q_bytes = (size_t)(B * Lq * Hq * head_pitch) * es;
  p->q = alloc_nan(p->q_bytes);
  const size_t out_es = fdt_dtype_size(c->out_dtype);
  p->out_bytes = (size_t)(B * Lq * Hq * head_pitch) * out_es;
  p->out = alloc_nan(p->out_bytes);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < p->q_counts[b]; ++t) /* padding tokens stay NaN */
      for (int64_t h = 0; h < Hq; ++h)
        for (int64_t d = 0; d < D; ++d)
          fdt_store(dt, p->q, b * q_strides[0] + t * q_strides[1] + h * q_strides[2] + d,
                    p->ref_q[((b * Lq + t) * Hq + h) * D + d]);

  /* K/V storage; everything not a valid token stays NaN. */
  int64_t kv_shape[4], kv_strides[4], kv_elems, base_offset = 0;
  /* One line of shape and one of strides per layout, kept as a table. */
  /* clang-format off */
  switch (c->layout) {
    case FDT_BHND:
      kv_shape[0] = B; kv_shape[1] = N; kv_shape[2] = Hkv; kv_shape[3] = D;
      kv_strides[0] = Hkv * N * D; kv_strides[1] = D; kv_strides[2] = N * D; kv_strides[3] = 1;
      kv_elems = B * Hkv * N * D;
      break;
    case FDT_BNHD_PADDED: /* a slice of [B, N + 3, Hkv + 1, D + 8] starting at head 1 */
      kv_shape[0] = B; kv_shape[1] = N; kv_shape[2] = Hkv; kv_shape[3] = D;
      kv_strides[0] = (N + 3) * (Hkv + 1) * (D + 8); kv_strides[1] = (Hkv + 1) * (D + 8);
      kv_strides[2] = D + 8; kv_strides[3] = 1;
      kv_elems = B * (N + 3) * (Hkv + 1) * (D + 8);
      base_offset = D + 8;
      break;
    case FDT_PAGED_NHD:
      kv_shape[0] = num_pages; kv_shape[1] = P; kv_shape[2] = Hkv; kv_shape[3] = D;
      kv_strides[0] = P * Hkv * D; kv_strides[1] = Hkv * D; kv_strides[2] = D; kv_strides[3] = 1;
      kv_elems = num_pages * P * Hkv * D;
      break;
    case FDT_PAGED_HND:
      kv_shape[0] = num_pages; kv_shape[1] = P; kv_shape[2] = Hkv; kv_shape[3] = D;
      kv_strides[0] = Hkv * P * D; kv_strides[1] = D; kv_strides[2] = P * D; kv_strides[3] = 1;
      kv_elems = num_pages * Hkv * P * D;
      break;
    case FDT_BNHD:
    default:
      kv_shape[0] = B; kv_shape[1] = N; kv_shape[2] = Hkv; kv_shape[3] = D;
      kv_strides[0] = N * Hkv * D; kv_strides[1] = Hkv * D; kv_strides[2] = D; kv_strides[3] = 1;
      kv_elems = B * N * Hkv * D;
      break;
  }
  /* clang-format on */
  p->kv_bytes = (size_t)kv_elems * kv_es;
  p->k = alloc_nan(p->kv_bytes);
  p->v = alloc_nan(p->kv_bytes);
  if (!p->q || !p->out || !p->k || !p->v) return -1;
  if (quantized) {
    for (int64_t i = 0; i < kv_elems; ++i) {
      ((uint8_t *)p->k)[i] = fdt_pad_byte(kvdt, i);
      ((uint8_t *)p->v)[i] = fdt_pad_byte(kvdt, i + 1);
    }
  }

  if (is_paged(c->layout)) {
    /* Shuffled assignment of pool pages to (sequence, page) slots. */
    p->block_table_bytes = (size_t)(B * max_pages) * sizeof(int32_t);
    p->block_table = malloc(p->block_table_bytes + 1);
    int64_t *perm = malloc((size_t)num_pages * sizeof *perm);
    if (!p->block_table || !perm) return -1;
    for (int64_t i = 0; i < num_pages; ++i) perm[i] = i;
    for (int64_t i = num_pages - 1; i > 0; --i) {
      const int64_t j = fdt_int(&rng, 0, i);
      const int64_t t = perm[i];
      perm[i] = perm[j];
      perm[j] = t;
    }
    for (int64_t i = 0; i < B * max_pages; ++i) p->block_table[i] = (int32_t)perm[i];
    free(perm);
  }

  for (int64_t b = 0; b < B; ++b) {
    for (int64_t j = 0; j < p->lens[b]; ++j) {
      for (int64_t g = 0; g < Hkv; ++g) {
        int64_t row;
        if (is_paged(c->layout)) {
          row = p->block_table[b * max_pages + j / P] * kv_strides[0] + (j % P) * kv_strides[1] + g * kv_strides[2];
        } else {
          row = base_offset + b * kv_strides[0] + j * kv_strides[1] + g * kv_strides[2];
        }
        const int64_t src = ((b * N + j) * Hkv + g) * D;
        if (quantized) {
          for (int64_t d = 0; d < D; ++d) {
            ((uint8_t *)p->k)[row + d] = kq[src + d];
            ((uint8_t *)p->v)[row + d] = vq[src + d];
          }
          continue;
        }
        for (int64_t d = 0; d < D; ++d) {
          fdt_store(dt, p->k, row + d, p->ref_k[src + d]);
          fdt_store(dt, p->v, row + d, p->ref_v[src + d]);
        }
      }
    }
  }

  fd_decode_args_init(&p->args, sizeof p->args);
  p->args.q = fdt_tensor(p->q, dt, 4, q_shape, q_strides);
  p->args.out = fdt_tensor(p->out, c->out_dtype, 4, q_shape, q_strides);
  p->args.k = fdt_tensor((char *)p->k + base_offset * (int64_t)kv_es, kvdt, 4, kv_shape, kv_strides);
  p->args.v = fdt_tensor((char *)p->v + base_offset * (int64_t)kv_es, kvdt, 4, kv_shape, kv_strides);
  if (is_paged(c->layout)) {
    const int64_t bt_shape[2] = {B, max_pages}, bt_strides[2] = {max_pages, 1};
    p->args.block_table = fdt_tensor(p->block_table, FD_DTYPE_I32, 2, bt_shape, bt_strides);
  }
  if (quantized && c->scale_mode != FDT_SCALE_NONE) {
    const int ok = lay_out_scales(p, ks, kv_shape, &p->k_scale, &p->k_scale_bytes, &p->args.k_scale) == 0 &&
                   lay_out_scales(p, vs, kv_shape, &p->v_scale, &p->v_scale_bytes, &p->args.v_scale) == 0;
    if (!ok) return -1;
  }
  free(kq);
  free(vq);
  free(ks);
  free(vs);
  if (c->ragged && per_sequence_i32(p->lens, B, &p->seq_lens, &p->seq_lens_bytes, &p->args.seq_lens) != 0) return -1;
  if (c->ragged_q && per_sequence_i32(p->q_counts, B, &p->q_lens, &p->q_lens_bytes, &p->args.q_lens) != 0) return -1;
  if (c->with_lse) {
    p->lse_bytes = (size_t)(B * Lq * Hq) * sizeof(float);
    p->lse = alloc_nan(p->lse_bytes);
    if (!p->lse) return -1;
    const int64_t shape[3] = {B, Lq, Hq}, strides[3] = {Lq * Hq, Hq, 1};
    p->args.lse = fdt_tensor(p->lse, FD_DTYPE_F32, 3, shape, strides);
  }
  p->args.softmax_scale = c->softmax_scale;
  p->args.num_splits = c->num_splits;

  /* Variants. Their random values come after everything else's, so that a
   * case without them draws the same data as before they existed. Slopes and
   * sinks have stride 2 in the padded layout. */
  p->args.mask = c->mask;
  p->args.window_left = c->window;
  p->args.logit_softcap = (float)c->softcap;
  const int64_t per_head_stride = c->layout == FDT_BNHD_PADDED ? 2 : 1;
  const int64_t per_head_shape[1] = {Hq}, per_head_strides[1] = {per_head_stride};
  if (c->alibi) {
    p->alibi_slopes_bytes = (size_t)(Hq * per_head_stride) * sizeof(float);
    p->alibi_slopes = alloc_nan(p->alibi_slopes_bytes);
    p->ref_alibi_slopes = malloc((size_t)Hq * sizeof(double) + 1);
    if (!p->alibi_slopes || !p->ref_alibi_slopes) return -1;
    for (int64_t h = 0; h < Hq; ++h) {
      const double slope = c->alibi == 1 ? pow(2.0, -8.0 * (double)(h + 1) / (double)Hq) : fdt_uniform(&rng, 0.01, 1.0);
      p->alibi_slopes[h * per_head_stride] = (float)slope;
      p->ref_alibi_slopes[h] = (double)(float)slope;
    }
    p->args.alibi_slopes = fdt_tensor(p->alibi_slopes, FD_DTYPE_F32, 1, per_head_shape, per_head_strides);
  }
  if (c->sinks) {
    /* Around the LSEs (log of the keys seen plus the spread of the scores),
     * so that the sink takes from a few percent to most of the weight. */
    p->sinks_bytes = (size_t)(Hq * per_head_stride) * sizeof(float);
    p->sinks = alloc_nan(p->sinks_bytes);
    p->ref_sinks = malloc((size_t)Hq * sizeof(double) + 1);
    if (!p->sinks || !p->ref_sinks) return -1;
    for (int64_t h = 0; h < Hq; ++h) {
      const float sink = (float)fdt_uniform(&rng, -1.0, log((double)N + 1.0) + 3.0);
      p->sinks[h * per_head_stride] = sink;
      p->ref_sinks[h] = sink;
    }
    p->args.sinks = fdt_tensor(p->sinks, FD_DTYPE_F32, 1, per_head_shape, per_head_strides);
  }
  fdt_reference(p);
  return 0;
}

void fdt_problem_free(fdt_problem *p) {
  free(p->q);
  free(p->k);
  free(p->v);
  free(p->out);
  free(p->lse);
  free(p->seq_lens);
  free(p->q_lens);
  free(p->block_table);
  free(p->alibi_slopes);
  free(p->sinks);
  free(p->k_scale);
  free(p->v_scale);
  free(p->ref_alibi_slopes);
  free(p->ref_sinks);
  free(p->ref_q);
  free(p->ref_k);
  free(p->ref_v);
  free(p->lens);
  free(p->q_counts);
  free(p->expect_out);
  free(p->expect_lse);
  memset(p, 0, sizeof *p);
}

double fdt_error_bound(fd_dtype out_dtype) {
  switch (out_dtype) {
    case FD_DTYPE_F16: return 2e-3;
    case FD_DTYPE_BF16: return 1e-2;
    default: return 1e-5;
  }
}

/* Whether element `index` of a buffer of `dtype` still holds the poison. */
static int is_poison(const void *base, fd_dtype dtype, int64_t index) {
  const size_t size = fdt_dtype_size(dtype);
  const unsigned char *bytes = (const unsigned char *)base + (size_t)index * size;
  for (size_t i = 0; i < size; ++i) {
    if (bytes[i] != 0xff) return 0;
  }
  return 1;
}

/* Whether query token t of sequence b sees any key. */
static int sees_any(const fdt_problem *p, int64_t b, int64_t t) {
  for (int64_t j = 0; j < p->lens[b]; ++j) {
    if (fdt_sees(&p->c, p->lens[b], p->q_counts[b], t, j)) return 1;
  }
  return 0;
}

int fdt_check(const fdt_problem *p, char *report, size_t report_size, double *out_error, double *lse_error) {
  const fdt_case *c = &p->c;
  const int64_t D = c->head_dim, Lq = fdt_q_len(c);
  const int64_t *out_strides = p->args.out.strides, *lse_strides = p->args.lse.strides;
  double diff2 = 0.0, ref2 = 0.0, lse_max = 0.0;
  int64_t unwritten = 0, bad_empty = 0, bad_nan = 0;
  for (int64_t b = 0; b < c->batch; ++b) {
    for (int64_t t = 0; t < Lq; ++t) {
      const int empty = !sees_any(p, b, t);
      for (int64_t h = 0; h < c->q_heads; ++h) {
        const int64_t row = (b * Lq + t) * c->q_heads + h;
        for (int64_t d = 0; d < D; ++d) {
          const int64_t index = b * out_strides[0] + t * out_strides[1] + h * out_strides[2] + d;
          const double got = fdt_load(c->out_dtype, p->out, index);
          const double want = p->expect_out[row * D + d];
          if (is_poison(p->out, c->out_dtype, index)) {
            ++unwritten;
            continue;
          }
          if (isnan(got) || isnan(want)) {
            if (isnan(got) != isnan(want)) ++bad_nan;
            continue;
          }
          if (empty && got != 0.0) ++bad_empty;
          diff2 += (got - want) * (got - want);
          ref2 += want * want;
        }
        if (p->lse) {
          const int64_t index = b * lse_strides[0] + t * lse_strides[1] + h * lse_strides[2];
          const double got = ((const float *)p->lse)[index];
          const double want = p->expect_lse[row];
          if (is_poison(p->lse, FD_DTYPE_F32, index)) {
            ++unwritten;
          } else if (isnan(got) || isnan(want)) {
            if (isnan(got) != isnan(want)) ++bad_nan;
          } else if (isinf(want) || empty) { /* -inf, or exactly the sink (a float) */
            if (got != want) ++bad_empty;
          } else if (fabs(got - want) > lse_max) {
            lse_max = fabs(got - want);
          }
        }
      }
    }
  }
  const double rel = ref2 > 0.0 ? sqrt(diff2 / ref2) : sqrt(diff2);
  const double bound = fdt_error_bound(c->out_dtype);
  const double lse_bound = 1e-4;
  if (out_error) *out_error = rel;
  if (lse_error) *lse_error = lse_max;
  const int ok = unwritten == 0 && bad_empty == 0 && bad_nan == 0 && rel <= bound && lse_max <= lse_bound;
  if (report && report_size) {
    snprintf(report, report_size,
             "%s rel_err=%.3g (bound %.1g) lse_err=%.3g unwritten=%lld bad_empty=%lld bad_nan=%lld", ok ? "ok" : "FAIL",
             rel, bound, lse_max, (long long)unwritten, (long long)bad_empty, (long long)bad_nan);
  }
  return ok ? 0 : 1;
}

const char *fdt_special_name(fdt_special special) {
  static const char *const names[FDT_SPECIAL_COUNT] = {"NaN in q", "-inf key", "masked prefix",   "all masked",
                                                       "+inf key", "NaN key",  "overflowing key", "dominant key"};
  return special >= 0 && special < FDT_SPECIAL_COUNT ? names[special] : "unknown";
}

/* Element (b, row, head, d) of a dense 4-d view (strides in elements). */
static int64_t dense_index(const fd_tensor *t, int64_t b, int64_t row, int64_t head, int64_t d) {
  return b * t->strides[0] + row * t->strides[1] + head * t->strides[2] + d * t->strides[3];
}

/* Element (b, t, h, d) of the logical q. */
static double *ref_q_at(fdt_problem *p, int64_t b, int64_t t, int64_t h, int64_t d) {
  const fdt_case *c = &p->c;
  return p->ref_q + ((b * fdt_q_len(c) + t) * c->q_heads + h) * c->head_dim + d;
}

static void set_q(fdt_problem *p, int64_t b, int64_t t, int64_t h, int64_t d, double x) {
  const fdt_case *c = &p->c;
  const double r = fdt_round_to(c->dtype, x);
  *ref_q_at(p, b, t, h, d) = r;
  fdt_store(c->dtype, p->args.q.data, dense_index(&p->args.q, b, t, h, d), r);
}

static void set_k(fdt_problem *p, int64_t b, int64_t t, int64_t g, int64_t d, double x) {
  const fdt_case *c = &p->c;
  const double r = fdt_round_to(c->dtype, x);
  p->ref_k[((b * c->kv_len + t) * c->kv_heads + g) * c->head_dim + d] = r;
  fdt_store(c->dtype, p->args.k.data, dense_index(&p->args.k, b, t, g, d), r);
}

/* Makes q element d of every query head of KV head g's group in sequence b
 * positive, for every query token, so that a key element of -inf or +inf
 * there gives that sign. */
static void positive_q(fdt_problem *p, int64_t b, int64_t g, int64_t d) {
  const int64_t group = p->c.q_heads / p->c.kv_heads;
  for (int64_t t = 0; t < fdt_q_len(&p->c); ++t) {
    for (int64_t h = g * group; h < (g + 1) * group; ++h) set_q(p, b, t, h, d, fabs(*ref_q_at(p, b, t, h, d)) + 0.25);
  }
}

int fdt_problem_make_special(fdt_problem *p, const fdt_case *c, fdt_special special) {
  if (c->ragged || c->kv_len < 4 || c->layout == FDT_PAGED_NHD || c->layout == FDT_PAGED_HND) return -1;
  if (fdt_is_quantized(c->kv_dtype)) return 1;
  if (special == FDT_SPECIAL_OVERFLOWING_KEY && c->dtype == FD_DTYPE_F16) return 1;
  if (fdt_problem_make(p, c) != 0) return -1;
  const int64_t N = c->kv_len, D = c->head_dim, group = c->q_heads / c->kv_heads;
  const int64_t t = N / 3; /* a key inside the cache, in some split other than the first */
  switch (special) {
    case FDT_SPECIAL_NAN_IN_Q: set_q(p, 0, 0, 0, 0, NAN); break;
    case FDT_SPECIAL_NEG_INF_KEY:
      positive_q(p, 0, 0, 0);
      set_k(p, 0, t, 0, 0, -INFINITY);
      break;
    case FDT_SPECIAL_MASKED_PREFIX:
    case FDT_SPECIAL_ALL_MASKED:
      positive_q(p, 0, 0, 0);
      for (int64_t j = 0; j < (special == FDT_SPECIAL_ALL_MASKED ? N : 3 * N / 4); ++j) set_k(p, 0, j, 0, 0, -INFINITY);
      break;
    case FDT_SPECIAL_POS_INF_KEY:
      positive_q(p, 0, 0, 0);
      set_k(p, 0, t, 0, 0, INFINITY);
      break;
    case FDT_SPECIAL_NAN_KEY: set_k(p, 0, t, 0, D - 1, NAN); break;
    case FDT_SPECIAL_OVERFLOWING_KEY:
      for (int64_t d = 0; d < D; ++d) positive_q(p, 0, 0, d);
      for (int64_t d = 0; d < D; ++d) set_k(p, 0, t, 0, d, -1e38);
      break;
    case FDT_SPECIAL_DOMINANT_KEY: {
      const double scale = c->softmax_scale != 0.0 ? c->softmax_scale : 1.0 / sqrt((double)D);
      for (int64_t b = 0; b < c->batch; ++b) {
        for (int64_t g = 0; g < c->kv_heads; ++g) {
          /* One query for the whole group and every token, and a key along
           * it 14 nats up. */
          const double *q0 = ref_q_at(p, b, 0, g * group, 0);
          double norm2 = 0.0;
          for (int64_t d = 0; d < D; ++d) norm2 += q0[d] * q0[d];
          for (int64_t t = 0; t < fdt_q_len(c); ++t) {
            for (int64_t h = g * group; h < (g + 1) * group; ++h) {
              if (t == 0 && h == g * group) continue;
              for (int64_t d = 0; d < D; ++d) set_q(p, b, t, h, d, q0[d]);
            }
          }
          const int64_t key = (b * 7 + g * 13 + 1) % N;
          for (int64_t d = 0; d < D; ++d) set_k(p, b, key, g, d, q0[d] * 14.0 / (scale * norm2));
        }
      }
      break;
    }
    default: return -1;
  }
  fdt_reference(p);
  return 0;
}

void fdt_case_describe(const fdt_case *c, char *buffer, size_t size) {
  static const char *layouts[] = {"BNHD", "BHND", "BNHD-padded", "paged-NHD", "paged-HND"};
  int n = snprintf(buffer, size, "B=%lld Hq=%lld Hkv=%lld N=%lld D=%lld %s->%s %s%s%s splits=%d page=%lld seed=%llu",
                   (long long)c->batch, (long long)c->q_heads, (long long)c->kv_heads, (long long)c->kv_len,
                   (long long)c->head_dim, fdt_dtype_name(c->dtype), fdt_dtype_name(c->out_dtype), layouts[c->layout],
                   c->ragged ? " ragged" : "", c->with_lse ? " lse" : "", (int)c->num_splits, (long long)c->page_size,
                   (unsigned long long)c->seed);
  /* Variants only when set: plain cases read as before. */
  if (n < 0 || (size_t)n >= size) return;
  if (fdt_q_len(c) > 1 || c->mask != FD_MASK_CAUSAL) {
    n += snprintf(buffer + n, size - (size_t)n, " q_len=%lld %s", (long long)fdt_q_len(c),
                  c->mask == FD_MASK_CAUSAL ? "causal" : "mask-none");
  }
  if (n >= 0 && (size_t)n < size && c->ragged_q) n += snprintf(buffer + n, size - (size_t)n, " ragged-q");
  if (n >= 0 && (size_t)n < size && c->window > 0)
    n += snprintf(buffer + n, size - (size_t)n, " window=%lld", (long long)c->window);
  if (n >= 0 && (size_t)n < size && c->softcap > 0.0)
    n += snprintf(buffer + n, size - (size_t)n, " softcap=%g", c->softcap);
  if (n >= 0 && (size_t)n < size && c->alibi)
    n += snprintf(buffer + n, size - (size_t)n, " alibi=%s", c->alibi == 1 ? "standard" : "random");
  if (n >= 0 && (size_t)n < size && c->sinks) n += snprintf(buffer + n, size - (size_t)n, " sinks");
  if (n >= 0 && (size_t)n < size && fdt_is_quantized(c->kv_dtype)) {
    static const char *modes[] = {"none", "tensor", "head", "token"};
    snprintf(buffer + n, size - (size_t)n, " kv=%s scales=%s%s", fdt_dtype_name(c->kv_dtype),
             c->scale_mode >= 0 && c->scale_mode <= 3 ? modes[c->scale_mode] : "?", c->wide_scales ? " wide" : "");
  }
}

static void *offset_elements(void *data, fd_dtype dtype, int64_t elements) {
  return (char *)data + elements * (int64_t)fdt_dtype_size(dtype);
}

fd_decode_args fdt_solo_args(const fd_decode_args *batch, int64_t b, int64_t len, int drop_lengths) {
  fd_decode_args a = *batch;
  fd_tensor *rows[] = {&a.q, &a.out, &a.lse, &a.seq_lens, &a.q_lens};
  for (size_t i = 0; i < sizeof rows / sizeof rows[0]; ++i) {
    if (rows[i]->data == NULL) continue;
    rows[i]->data = offset_elements(rows[i]->data, rows[i]->dtype, b * rows[i]->strides[0]);
    rows[i]->shape[0] = 1;
  }
  if (a.block_table.data == NULL) {
    a.k.data = offset_elements(a.k.data, a.k.dtype, b * a.k.strides[0]);
    a.v.data = offset_elements(a.v.data, a.v.dtype, b * a.v.strides[0]);
    a.k.shape[0] = a.v.shape[0] = 1;
    a.k.shape[1] = a.v.shape[1] = len;
    fd_tensor *scales[] = {&a.k_scale, &a.v_scale};
    for (size_t i = 0; i < 2; ++i) {
      if (scales[i]->data == NULL) continue;
      scales[i]->data = offset_elements(scales[i]->data, FD_DTYPE_F32, b * scales[i]->strides[0]);
      scales[i]->shape[0] = 1;
      scales[i]->shape[1] = len;
    }
    if (drop_lengths) memset(&a.seq_lens, 0, sizeof a.seq_lens);
  } else {
    const int64_t page_size = a.k.shape[1];
    a.block_table.data = offset_elements(a.block_table.data, FD_DTYPE_I32, b * a.block_table.strides[0]);
    a.block_table.shape[0] = 1;
    a.block_table.shape[1] = (len + page_size - 1) / page_size;
  }
  return a;
}

fd_decode_args fdt_part_args(const fd_decode_args *whole, int64_t start, int64_t count, int32_t *part_lens, void *out,
                             fd_dtype out_dtype, float *lse) {
  fd_decode_args a = *whole;
  a.k.data = offset_elements(a.k.data, a.k.dtype, start * a.k.strides[1]);
  a.v.data = offset_elements(a.v.data, a.v.dtype, start * a.v.strides[1]);
  a.k.shape[1] = a.v.shape[1] = count;
  fd_tensor *scales[] = {&a.k_scale, &a.v_scale};
  for (size_t i = 0; i < 2; ++i) {
    if (scales[i]->data == NULL) continue;
    scales[i]->data = offset_elements(scales[i]->data, FD_DTYPE_F32, start * scales[i]->strides[1]);
    scales[i]->shape[1] = count;
  }
  const int64_t batch = a.q.shape[0], heads = a.q.shape[2], dim = a.q.shape[3];
  const int64_t lens_shape[1] = {batch}, lens_strides[1] = {1};
  a.seq_lens = fdt_tensor(part_lens, FD_DTYPE_I32, 1, lens_shape, lens_strides);
  const int64_t out_shape[4] = {batch, 1, heads, dim}, out_strides[4] = {heads * dim, heads * dim, dim, 1};
  a.out = fdt_tensor(out, out_dtype, 4, out_shape, out_strides);
  const int64_t lse_shape[3] = {batch, 1, heads}, lse_strides[3] = {heads, heads, 1};
  a.lse = fdt_tensor(lse, FD_DTYPE_F32, 3, lse_shape, lse_strides);
  return a;
}

void fdt_part_lengths(const int64_t *lens, int64_t batch, int64_t start, int64_t count, int32_t *part_lens) {
  for (int64_t b = 0; b < batch; ++b) {
    int64_t n = lens[b] - start;
    part_lens[b] = (int32_t)(n < 0 ? 0 : n > count ? count : n);
  }
}

fd_handle *fdt_cpu_handle(int32_t threads, uint32_t checks) {
  fd_options options;
  fd_options_init(&options, sizeof options);
  options.backend = FD_BACKEND_CPU;
  options.num_threads = threads;
  options.checks = checks;
  fd_handle *h = NULL;
  return fd_create(&h, &options) == FD_SUCCESS ? h : NULL;
}
