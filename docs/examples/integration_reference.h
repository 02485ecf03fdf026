// SPDX-License-Identifier: Apache-2.0
/* Shared by the integration guide's examples (docs/integration.md): the test
 * values they store in each engine's cache layout, and the float64 reference
 * they check flashdecode's output against. The reference computes attention
 * from the values themselves, never through the engine's layout, so a wrong
 * stride, offset or block table fails the check; caches start out as NaN, so
 * reading a slot no sequence owns fails it too. */
#ifndef FD_INTEGRATION_REFERENCE_H
#define FD_INTEGRATION_REFERENCE_H

#include <flashdecode.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

enum { VALUE_Q = 0, VALUE_K = 1, VALUE_V = 2 };

/* Element d of head `head` of token `token` of sequence `seq` of q (token
 * 0), k or v: a multiple of 1/64 in [-1, 1), which bfloat16 holds exactly. */
static inline double test_value(int kind, int64_t seq, int64_t token, int64_t head, int64_t d) {
  uint64_t x = (uint64_t)kind;
  const uint64_t parts[4] = {(uint64_t)seq, (uint64_t)token, (uint64_t)head, (uint64_t)d};
  for (int i = 0; i < 4; ++i) {
    x = (x ^ parts[i]) * 0x9e3779b97f4a7c15ULL;
    x ^= x >> 29;
  }
  return (double)((int)(x % 128) - 64) / 64.0;
}

/* bfloat16 is the upper half of a float: exact for the test values. */
static inline uint16_t to_bf16(double x) {
  const float f = (float)x;
  uint32_t bits;
  memcpy(&bits, &f, sizeof bits);
  return (uint16_t)(bits >> 16);
}

static inline double from_bf16(uint16_t h) {
  const uint32_t bits = (uint32_t)h << 16;
  float f;
  memcpy(&f, &bits, sizeof f);
  return f;
}

/* What caches hold before an engine writes them: a NaN in a slot the
 * decode reads makes its output NaN, which the check below reports. */
#define BF16_NAN ((uint16_t)0x7fc0)

static inline void fill_bf16_nan(uint16_t *data, size_t count) {
  for (size_t i = 0; i < count; ++i) data[i] = BF16_NAN;
}

/* Outputs start out as NaN too, so that an element left unwritten fails. */
static inline void fill_f32_nan(float *data, size_t count) {
  for (size_t i = 0; i < count; ++i) data[i] = NAN;
}

/* Checks out, [batch, 1, q_heads, head_dim] and contiguous, of f32 or bf16,
 * against float64 attention of q over the first seq_lens[b] tokens of each
 * sequence, query head h reading KV head h / (q_heads / kv_heads), with the
 * default scale 1/sqrt(head_dim). seqs[b] names the test values of row b
 * (NULL: sequence b). Each row's relative error ||out - ref|| / ||ref|| must
 * be within 1e-4 (f32) or 1e-2 (bf16); an empty sequence's row must be zero.
 * Prints one line; returns 0 when every row passes. */
static inline int check_output(const char *what, const void *out, fd_dtype out_dtype, int64_t batch,
                               const int32_t *seq_lens, const int64_t *seqs, int64_t q_heads, int64_t kv_heads,
                               int64_t head_dim) {
  const double bound = out_dtype == FD_DTYPE_F32 ? 1e-4 : 1e-2;
  const double scale = 1.0 / sqrt((double)head_dim);
  double worst = 0.0;
  int bad_rows = 0;
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t seq = seqs != NULL ? seqs[b] : b;
    const int64_t len = seq_lens[b];
    for (int64_t h = 0; h < q_heads; ++h) {
      const int64_t g = h / (q_heads / kv_heads);
      double ref[FD_MAX_HEAD_DIM] = {0};
      double max_score = -INFINITY, sum = 0.0;
      for (int64_t t = 0; t < len; ++t) {
        double score = 0.0;
        for (int64_t d = 0; d < head_dim; ++d)
          score += test_value(VALUE_Q, seq, 0, h, d) * test_value(VALUE_K, seq, t, g, d);
        max_score = score * scale > max_score ? score * scale : max_score;
      }
      for (int64_t t = 0; t < len; ++t) {
        double score = 0.0;
        for (int64_t d = 0; d < head_dim; ++d)
          score += test_value(VALUE_Q, seq, 0, h, d) * test_value(VALUE_K, seq, t, g, d);
        const double weight = exp(score * scale - max_score);
        sum += weight;
        for (int64_t d = 0; d < head_dim; ++d) ref[d] += weight * test_value(VALUE_V, seq, t, g, d);
      }
      double error = 0.0, norm = 0.0;
      for (int64_t d = 0; d < head_dim; ++d) {
        const int64_t index = (b * q_heads + h) * head_dim + d;
        const double got =
            out_dtype == FD_DTYPE_F32 ? ((const float *)out)[index] : from_bf16(((const uint16_t *)out)[index]);
        const double want = len > 0 ? ref[d] / sum : 0.0;
        error += (got - want) * (got - want);
        norm += want * want;
      }
      const double relative = norm > 0.0 ? sqrt(error / norm) : sqrt(error);
      if (!(relative <= bound)) ++bad_rows;                        /* NaN fails too */
      if (!isnan(worst) && !(relative <= worst)) worst = relative; /* keeps a NaN */
    }
  }
  printf("%s: %s (worst relative error %.2g, bound %.0e)\n", what, bad_rows == 0 ? "ok" : "WRONG", worst, bound);
  return bad_rows == 0 ? 0 : 1;
}

/* Prints the calling thread's last flashdecode error; returns 1. */
static inline int report_failure(const char *what, fd_status status) {
  char message[512];
  fd_last_error_message(message, sizeof message);
  fprintf(stderr, "%s failed (%s): %s\n", what, fd_status_string(status), message);
  return 1;
}

#endif
