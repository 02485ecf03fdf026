// SPDX-License-Identifier: Apache-2.0
/* Integration guide (docs/integration.md), speculative steps: the verify step
 * of speculative decoding, where each sequence brings its own number of
 * draft tokens. q holds MAX_NEW query tokens per sequence; q_lens says how
 * many of them are real (the last accepted token plus its drafts), and
 * seq_lens counts every sequence's cache with its new tokens already
 * appended. Token i of sequence b sits at position seq_lens[b] - q_lens[b] + i
 * and sees the keys up to it (the causal mask). The padding tokens of q hold
 * NaN, which is never read; their rows come out as zeros with LSE -inf. The
 * output is checked against float64 attention over the test values. Runs on
 * the CPU backend; on CUDA the same call takes device pointers. */
#include <flashdecode.h>
#include <stdio.h>

#include "integration_reference.h"

enum { NUM_SEQS = 3, MAX_NEW = 5, Q_HEADS = 8, KV_HEADS = 2, HEAD_DIM = 64, CAPACITY = 96 };
enum { SLOT = KV_HEADS * HEAD_DIM, ROW = Q_HEADS * HEAD_DIM };

static uint16_t k_cache[NUM_SEQS * CAPACITY * SLOT]; /* bf16 [seqs, capacity, kv_heads, head_dim] */
static uint16_t v_cache[NUM_SEQS * CAPACITY * SLOT];
static uint16_t q[NUM_SEQS * MAX_NEW * ROW]; /* bf16 [seqs, MAX_NEW, q_heads, head_dim] */
static float out[NUM_SEQS * MAX_NEW * ROW];
static float lse[NUM_SEQS * MAX_NEW * Q_HEADS];

/* Query token i of sequence b: the test values of a sequence numbered
 * b * MAX_NEW + i, so that every token asks something else. */
static double query_value(int b, int i, int h, int d) { return test_value(VALUE_Q, b * MAX_NEW + i, 0, h, d); }

/* out and lse of query token i of sequence b, head h, against float64
 * attention over keys 0 .. pos; returns the row's relative error. */
static double row_error(int b, int i, int h, int pos) {
  const int g = h / (Q_HEADS / KV_HEADS);
  double scores[CAPACITY], max_score = -INFINITY, sum = 0.0, ref[HEAD_DIM] = {0};
  for (int t = 0; t <= pos; ++t) {
    scores[t] = 0.0;
    for (int d = 0; d < HEAD_DIM; ++d) scores[t] += query_value(b, i, h, d) * test_value(VALUE_K, b, t, g, d);
    scores[t] /= sqrt((double)HEAD_DIM);
    if (scores[t] > max_score) max_score = scores[t];
  }
  for (int t = 0; t <= pos; ++t) {
    const double weight = exp(scores[t] - max_score);
    sum += weight;
    for (int d = 0; d < HEAD_DIM; ++d) ref[d] += weight * test_value(VALUE_V, b, t, g, d);
  }
  const float *row = out + ((b * MAX_NEW + i) * Q_HEADS + h) * HEAD_DIM;
  double error = 0.0, norm = 0.0;
  for (int d = 0; d < HEAD_DIM; ++d) {
    error += (row[d] - ref[d] / sum) * (row[d] - ref[d] / sum);
    norm += (ref[d] / sum) * (ref[d] / sum);
  }
  const double lse_error = fabs(lse[(b * MAX_NEW + i) * Q_HEADS + h] - (max_score + log(sum)));
  return lse_error > 1e-4 ? INFINITY : sqrt(error / norm);
}

int main(void) {
  fd_options options;
  fd_options_init(&options, sizeof options);
  options.backend = FD_BACKEND_CPU;
  options.num_threads = 2;
  fd_handle *handle = NULL;
  fd_status status = fd_create(&handle, &options);
  if (status != FD_SUCCESS) return report_failure("fd_create", status);

  /* Sequence 0 verifies 4 drafts, sequence 1 none (plain decode), sequence 2 two. */
  int32_t q_lens[NUM_SEQS] = {5, 1, 3};
  int32_t seq_lens[NUM_SEQS] = {70, 33, 96}; /* with the new tokens appended */
  fill_bf16_nan(k_cache, sizeof k_cache / sizeof k_cache[0]);
  fill_bf16_nan(v_cache, sizeof v_cache / sizeof v_cache[0]);
  fill_bf16_nan(q, sizeof q / sizeof q[0]);
  for (int b = 0; b < NUM_SEQS; ++b) {
    for (int t = 0; t < seq_lens[b]; ++t)
      for (int i = 0; i < SLOT; ++i) {
        k_cache[(b * CAPACITY + t) * SLOT + i] = to_bf16(test_value(VALUE_K, b, t, i / HEAD_DIM, i % HEAD_DIM));
        v_cache[(b * CAPACITY + t) * SLOT + i] = to_bf16(test_value(VALUE_V, b, t, i / HEAD_DIM, i % HEAD_DIM));
      }
    for (int i = 0; i < q_lens[b]; ++i) /* the rest of q stays NaN */
      for (int j = 0; j < ROW; ++j)
        q[(b * MAX_NEW + i) * ROW + j] = to_bf16(query_value(b, i, j / HEAD_DIM, j % HEAD_DIM));
  }
  fill_f32_nan(out, sizeof out / sizeof out[0]);
  fill_f32_nan(lse, sizeof lse / sizeof lse[0]);

  fd_decode_args args;
  fd_decode_args_init(&args, sizeof args);
  args.q = (fd_tensor){q, FD_DTYPE_BF16, 4, {NUM_SEQS, MAX_NEW, Q_HEADS, HEAD_DIM}, {MAX_NEW * ROW, ROW, HEAD_DIM, 1}};
  args.k = (fd_tensor){
      k_cache, FD_DTYPE_BF16, 4, {NUM_SEQS, CAPACITY, KV_HEADS, HEAD_DIM}, {CAPACITY * SLOT, SLOT, HEAD_DIM, 1}};
  args.v = (fd_tensor){
      v_cache, FD_DTYPE_BF16, 4, {NUM_SEQS, CAPACITY, KV_HEADS, HEAD_DIM}, {CAPACITY * SLOT, SLOT, HEAD_DIM, 1}};
  args.out =
      (fd_tensor){out, FD_DTYPE_F32, 4, {NUM_SEQS, MAX_NEW, Q_HEADS, HEAD_DIM}, {MAX_NEW * ROW, ROW, HEAD_DIM, 1}};
  args.lse = (fd_tensor){lse, FD_DTYPE_F32, 3, {NUM_SEQS, MAX_NEW, Q_HEADS}, {MAX_NEW * Q_HEADS, Q_HEADS, 1}};
  args.seq_lens = (fd_tensor){seq_lens, FD_DTYPE_I32, 1, {NUM_SEQS}, {1}};
  args.q_lens = (fd_tensor){q_lens, FD_DTYPE_I32, 1, {NUM_SEQS}, {1}}; /* real query tokens of each sequence */
  status = fd_decode(handle, &args, NULL);
  if (status != FD_SUCCESS) return report_failure("fd_decode", status);

  double worst = 0.0;
  int bad = 0;
  for (int b = 0; b < NUM_SEQS; ++b)
    for (int i = 0; i < MAX_NEW; ++i)
      for (int h = 0; h < Q_HEADS; ++h) {
        if (i < q_lens[b]) {
          const double error = row_error(b, i, h, seq_lens[b] - q_lens[b] + i);
          bad += !(error <= 1e-4);
          if (!(error <= worst)) worst = error;
        } else { /* padding: zeros, LSE -inf */
          bad += lse[(b * MAX_NEW + i) * Q_HEADS + h] != -INFINITY;
          for (int d = 0; d < HEAD_DIM; ++d) bad += out[((b * MAX_NEW + i) * Q_HEADS + h) * HEAD_DIM + d] != 0.0f;
        }
      }
  printf("speculative verify step, 4 / 0 / 2 drafts: %s (worst relative error %.2g, bound 1e-04)\n",
         bad == 0 ? "ok" : "WRONG", worst);
  fd_destroy(handle);
  return bad != 0;
}
