// SPDX-License-Identifier: Apache-2.0
/* Integration guide (docs/integration.md), SGLang: one decode step of one
 * layer over SGLang's token pool, read where it lies.
 *
 * SGLang's MHA pool keeps, per layer, k_buffer and v_buffer of
 * [pool_size + 1, kv_heads, head_dim] (page size 1; slot 0 is padding that
 * no request owns). req_to_token [max_requests, max_context_len] int32
 * holds, per request slot, the pool slot of each of its tokens, and a batch
 * names its requests' slots in req_pool_indices. To flashdecode the pool is
 * a page pool of one-token pages, and the block table is the batch's rows
 * of req_to_token: gathered into a [batch, max_context_len] table, or, when
 * the batch's request slots are consecutive, a strided view of
 * req_to_token itself. Runs on the CPU backend; a CUDA handle takes the
 * same descriptors over device memory. */
#include <flashdecode.h>
#include <stdio.h>

#include "integration_reference.h"

enum {
  POOL_SIZE = 512, /* token slots 1..POOL_SIZE; slot 0 is padding */
  MAX_REQUESTS = 8,
  MAX_CONTEXT_LEN = 160,
  BATCH = 3,
  Q_HEADS = 8,
  KV_HEADS = 2,
  HEAD_DIM = 64
};

static uint16_t k_buffer[(POOL_SIZE + 1) * KV_HEADS * HEAD_DIM]; /* bf16, one layer */
static uint16_t v_buffer[(POOL_SIZE + 1) * KV_HEADS * HEAD_DIM];
static int32_t req_to_token[MAX_REQUESTS][MAX_CONTEXT_LEN];
static uint16_t q[BATCH * Q_HEADS * HEAD_DIM];
static float out[BATCH * Q_HEADS * HEAD_DIM];

/* What SGLang has done before attention runs: each request's tokens got
 * pool slots from a free list, in no particular order, recorded in its row
 * of req_to_token, and their K and V were written to those slots. */
static void fill_like_sglang(const int32_t *req_pool_indices, const int32_t *seq_lens) {
  fill_bf16_nan(k_buffer, sizeof k_buffer / sizeof k_buffer[0]);
  fill_bf16_nan(v_buffer, sizeof v_buffer / sizeof v_buffer[0]);
  fill_f32_nan(out, sizeof out / sizeof out[0]);
  int64_t allocated = 0;
  for (int64_t b = 0; b < BATCH; ++b) {
    for (int64_t t = 0; t < seq_lens[b]; ++t) {
      const int32_t loc = (int32_t)(1 + (allocated++ * 101 + 7) % POOL_SIZE); /* never slot 0 */
      req_to_token[req_pool_indices[b]][t] = loc;
      for (int64_t h = 0; h < KV_HEADS; ++h) {
        for (int64_t d = 0; d < HEAD_DIM; ++d) {
          k_buffer[(loc * KV_HEADS + h) * HEAD_DIM + d] = to_bf16(test_value(VALUE_K, b, t, h, d));
          v_buffer[(loc * KV_HEADS + h) * HEAD_DIM + d] = to_bf16(test_value(VALUE_V, b, t, h, d));
        }
      }
    }
    for (int64_t i = 0; i < Q_HEADS * HEAD_DIM; ++i)
      q[b * Q_HEADS * HEAD_DIM + i] = to_bf16(test_value(VALUE_Q, b, 0, i / HEAD_DIM, i % HEAD_DIM));
  }
}

/* The pool as pages of one token: [pool_size + 1, 1, kv_heads, head_dim]. */
static fd_tensor sglang_pool(uint16_t *buffer) {
  const int64_t token = KV_HEADS * HEAD_DIM; /* elements of one token slot */
  fd_tensor t = {buffer, FD_DTYPE_BF16, 4, {POOL_SIZE + 1, 1, KV_HEADS, HEAD_DIM}, {token, token, HEAD_DIM, 1}};
  return t;
}

static fd_status decode_sglang(fd_handle *handle, fd_tensor block_table, int32_t *seq_lens) {
  const int64_t row = Q_HEADS * HEAD_DIM;
  fd_decode_args args;
  fd_decode_args_init(&args, sizeof args);
  args.q = (fd_tensor){q, FD_DTYPE_BF16, 4, {BATCH, 1, Q_HEADS, HEAD_DIM}, {row, row, HEAD_DIM, 1}};
  args.k = sglang_pool(k_buffer);
  args.v = sglang_pool(v_buffer);
  args.block_table = block_table;
  args.seq_lens = (fd_tensor){seq_lens, FD_DTYPE_I32, 1, {BATCH}, {1}};
  args.out = (fd_tensor){out, FD_DTYPE_F32, 4, {BATCH, 1, Q_HEADS, HEAD_DIM}, {row, row, HEAD_DIM, 1}};
  return fd_decode(handle, &args, NULL);
}

int main(void) {
  fd_options options;
  fd_options_init(&options, sizeof options);
  options.backend = FD_BACKEND_CPU;
  fd_handle *handle = NULL;
  fd_status status = fd_create(&handle, &options);
  if (status != FD_SUCCESS) return report_failure("fd_create", status);
  int failures = 0;

  /* Any request slots: gather the batch's rows of req_to_token (on a GPU,
   * one index_select into a buffer that stays allocated). Only the first
   * seq_lens[b] entries of a row are read; the rest may hold anything. */
  int32_t req_pool_indices[BATCH] = {5, 1, 6};
  int32_t seq_lens[BATCH] = {100, 7, 160};
  fill_like_sglang(req_pool_indices, seq_lens);
  static int32_t gathered[BATCH][MAX_CONTEXT_LEN];
  for (int64_t b = 0; b < BATCH; ++b)
    for (int64_t j = 0; j < seq_lens[b]; ++j) gathered[b][j] = req_to_token[req_pool_indices[b]][j];
  fd_tensor table = {gathered, FD_DTYPE_I32, 2, {BATCH, MAX_CONTEXT_LEN}, {MAX_CONTEXT_LEN, 1}};
  status = decode_sglang(handle, table, seq_lens);
  if (status != FD_SUCCESS) return report_failure("fd_decode", status);
  failures += check_output("SGLang, req_to_token rows gathered", out, FD_DTYPE_F32, BATCH, seq_lens, NULL, Q_HEADS,
                           KV_HEADS, HEAD_DIM);

  /* Request slots first, first + 1, ...: the rows are a view of req_to_token. */
  int32_t consecutive[BATCH] = {2, 3, 4};
  int32_t new_lens[BATCH] = {1, 160, 64};
  fill_like_sglang(consecutive, new_lens);
  fd_tensor view = {req_to_token[consecutive[0]], FD_DTYPE_I32, 2, {BATCH, MAX_CONTEXT_LEN}, {MAX_CONTEXT_LEN, 1}};
  status = decode_sglang(handle, view, new_lens);
  if (status != FD_SUCCESS) return report_failure("fd_decode", status);
  failures += check_output("SGLang, a view of req_to_token", out, FD_DTYPE_F32, BATCH, new_lens, NULL, Q_HEADS,
                           KV_HEADS, HEAD_DIM);

  fd_destroy(handle);
  return failures == 0 ? 0 : 1;
}
