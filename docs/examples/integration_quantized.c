// SPDX-License-Identifier: Apache-2.0
/* Integration guide (docs/integration.md), 8-bit caches: an int8 paged cache
 * with one scale per KV head, filled and extended by fd_append_kv and read
 * by fd_decode. A prefill appends the first PREFILL tokens of every
 * sequence; a decode step appends one more token and decodes with the same
 * seq_lens, block table and scales. The test values are multiples of 1/64,
 * which int8 with a scale of 1/64 holds exactly, so the output is checked
 * against float64 attention over the values themselves. Runs on the CPU
 * backend; on CUDA the same calls take device pointers. */
#include <flashdecode.h>
#include <stdio.h>

#include "integration_reference.h"

enum { NUM_SEQS = 3, Q_HEADS = 8, KV_HEADS = 2, HEAD_DIM = 64, PAGE_SIZE = 16, PAGES_PER_SEQ = 4, PREFILL = 40 };
enum { NUM_PAGES = NUM_SEQS * PAGES_PER_SEQ, SLOT = KV_HEADS * HEAD_DIM, PAGE = PAGE_SIZE * SLOT };

static int8_t k_cache[NUM_PAGES * PAGE]; /* page pool [num_pages, page_size, kv_heads, head_dim] */
static int8_t v_cache[NUM_PAGES * PAGE];
static float scale_per_head[KV_HEADS] = {1.0f / 64, 1.0f / 64};
static int32_t block_table[NUM_SEQS * PAGES_PER_SEQ];
static uint16_t new_k[NUM_SEQS * PREFILL * SLOT]; /* bf16 [seqs, new tokens, kv_heads, head_dim] */
static uint16_t new_v[NUM_SEQS * PREFILL * SLOT];
static uint16_t q[NUM_SEQS * Q_HEADS * HEAD_DIM];
static float out[NUM_SEQS * Q_HEADS * HEAD_DIM];

/* The tokens [first, first + count) of every sequence, as bf16 rows. */
static void fill_new_tokens(int first, int count) {
  for (int b = 0; b < NUM_SEQS; ++b)
    for (int t = 0; t < count; ++t)
      for (int h = 0; h < KV_HEADS; ++h)
        for (int d = 0; d < HEAD_DIM; ++d) {
          const int64_t i = ((int64_t)(b * count + t) * KV_HEADS + h) * HEAD_DIM + d;
          new_k[i] = to_bf16(test_value(VALUE_K, b, first + t, h, d));
          new_v[i] = to_bf16(test_value(VALUE_V, b, first + t, h, d));
        }
}

static fd_tensor cache(int8_t *data) {
  return (fd_tensor){data, FD_DTYPE_I8, 4, {NUM_PAGES, PAGE_SIZE, KV_HEADS, HEAD_DIM}, {PAGE, SLOT, HEAD_DIM, 1}};
}

/* One scale per KV head: the cache's shape without head_dim, strides {0, 0, 1}. */
static fd_tensor scales(void) {
  return (fd_tensor){scale_per_head, FD_DTYPE_F32, 3, {NUM_PAGES, PAGE_SIZE, KV_HEADS}, {0, 0, 1}};
}

static fd_status append(fd_handle *handle, int count, int32_t *seq_lens) {
  fd_append_args args;
  fd_append_args_init(&args, sizeof args);
  args.k_new =
      (fd_tensor){new_k, FD_DTYPE_BF16, 4, {NUM_SEQS, count, KV_HEADS, HEAD_DIM}, {count * SLOT, SLOT, HEAD_DIM, 1}};
  args.v_new =
      (fd_tensor){new_v, FD_DTYPE_BF16, 4, {NUM_SEQS, count, KV_HEADS, HEAD_DIM}, {count * SLOT, SLOT, HEAD_DIM, 1}};
  args.k = cache(k_cache);
  args.v = cache(v_cache);
  args.k_scale = scales();
  args.v_scale = scales();
  args.seq_lens = (fd_tensor){seq_lens, FD_DTYPE_I32, 1, {NUM_SEQS}, {1}}; /* lengths with the new tokens */
  args.block_table = (fd_tensor){block_table, FD_DTYPE_I32, 2, {NUM_SEQS, PAGES_PER_SEQ}, {PAGES_PER_SEQ, 1}};
  return fd_append_kv(handle, &args, NULL);
}

static fd_status decode(fd_handle *handle, int32_t *seq_lens) {
  fd_decode_args args;
  fd_decode_args_init(&args, sizeof args);
  const int64_t row = Q_HEADS * HEAD_DIM;
  args.q = (fd_tensor){q, FD_DTYPE_BF16, 4, {NUM_SEQS, 1, Q_HEADS, HEAD_DIM}, {row, row, HEAD_DIM, 1}};
  args.k = cache(k_cache);
  args.v = cache(v_cache);
  args.k_scale = scales();
  args.v_scale = scales();
  args.seq_lens = (fd_tensor){seq_lens, FD_DTYPE_I32, 1, {NUM_SEQS}, {1}};
  args.block_table = (fd_tensor){block_table, FD_DTYPE_I32, 2, {NUM_SEQS, PAGES_PER_SEQ}, {PAGES_PER_SEQ, 1}};
  args.out = (fd_tensor){out, FD_DTYPE_F32, 4, {NUM_SEQS, 1, Q_HEADS, HEAD_DIM}, {row, row, HEAD_DIM, 1}};
  return fd_decode(handle, &args, NULL);
}

int main(void) {
  fd_options options;
  fd_options_init(&options, sizeof options);
  options.backend = FD_BACKEND_CPU;
  options.num_threads = 2;
  fd_handle *handle = NULL;
  fd_status status = fd_create(&handle, &options);
  if (status != FD_SUCCESS) return report_failure("fd_create", status);

  /* Pages handed out in no order; the rest of the pool holds -128s. */
  for (int i = 0; i < NUM_SEQS * PAGES_PER_SEQ; ++i) block_table[i] = (i * 5 + 3) % NUM_PAGES;
  memset(k_cache, 0x80, sizeof k_cache);
  memset(v_cache, 0x80, sizeof v_cache);
  for (int b = 0; b < NUM_SEQS; ++b)
    for (int h = 0; h < Q_HEADS; ++h)
      for (int d = 0; d < HEAD_DIM; ++d) q[(b * Q_HEADS + h) * HEAD_DIM + d] = to_bf16(test_value(VALUE_Q, b, 0, h, d));
  fill_f32_nan(out, sizeof out / sizeof out[0]);

  int32_t seq_lens[NUM_SEQS] = {PREFILL, PREFILL, PREFILL};
  fill_new_tokens(0, PREFILL);
  status = append(handle, PREFILL, seq_lens); /* the prefill's keys and values */
  if (status != FD_SUCCESS) return report_failure("fd_append_kv (prefill)", status);

  for (int b = 0; b < NUM_SEQS; ++b) seq_lens[b] = PREFILL + 1; /* one decode step */
  fill_new_tokens(PREFILL, 1);
  status = append(handle, 1, seq_lens);
  if (status == FD_SUCCESS) status = decode(handle, seq_lens);
  if (status != FD_SUCCESS) return report_failure("fd_append_kv + fd_decode", status);

  const int failed = check_output("int8 paged cache, appended and decoded", out, FD_DTYPE_F32, NUM_SEQS, seq_lens, NULL,
                                  Q_HEADS, KV_HEADS, HEAD_DIM);
  fd_destroy(handle);
  return failed;
}
