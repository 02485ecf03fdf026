// SPDX-License-Identifier: Apache-2.0
/* Integration guide (docs/integration.md), FlashInfer: one decode step of
 * one layer over a FlashInfer paged KV cache, read where it lies.
 *
 * FlashInfer's paged cache is [max_num_pages, 2, page_size, kv_heads,
 * head_dim] (NHD) or [max_num_pages, 2, kv_heads, page_size, head_dim]
 * (HND), K at index 0 of the second dimension (or two such tensors without
 * it, one for K and one for V). Its page table is CSR: the pages of request
 * b are kv_indices[kv_indptr[b] .. kv_indptr[b + 1]), and its last page
 * holds kv_last_page_len[b] tokens (1..page_size). flashdecode takes a
 * padded block table and lengths instead: csr_to_block_table converts.
 * Runs on the CPU backend; a CUDA handle takes the same descriptors over
 * device memory. */
#include <flashdecode.h>
#include <stdio.h>

#include "integration_reference.h"

enum { MAX_NUM_PAGES = 48, PAGE_SIZE = 16, BATCH = 4, Q_HEADS = 8, KV_HEADS = 2, HEAD_DIM = 64, MAX_PAGES = 5 };

static uint16_t paged_kv_cache[MAX_NUM_PAGES * 2 * PAGE_SIZE * KV_HEADS * HEAD_DIM]; /* bf16, one layer */
static uint16_t q[BATCH * Q_HEADS * HEAD_DIM];
static float out[BATCH * Q_HEADS * HEAD_DIM];

/* FlashInfer's page table for 4 requests of 33, 16, 1 and 70 tokens. */
static const int32_t kv_indptr[BATCH + 1] = {0, 3, 4, 5, 10};
static const int32_t kv_indices[10] = {17, 3, 40, 8, 29, 0, 33, 12, 47, 21};
static const int32_t kv_last_page_len[BATCH] = {1, 16, 1, 6};

/* CSR page table -> block table [batch, max_pages] and seq_lens [batch].
 * max_pages must be at least the most pages of any request; the entries
 * past a request's pages are padding that flashdecode never reads. On a
 * GPU the same loop is a small kernel (one thread per (b, j)) writing into
 * buffers allocated once, so that a CUDA graph can keep their addresses. */
static void csr_to_block_table(int64_t batch, const int32_t *indptr, const int32_t *indices,
                               const int32_t *last_page_len, int64_t page_size, int64_t max_pages, int32_t *block_table,
                               int32_t *seq_lens) {
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t pages = indptr[b + 1] - indptr[b];
    seq_lens[b] = pages == 0 ? 0 : (int32_t)((pages - 1) * page_size + last_page_len[b]);
    for (int64_t j = 0; j < max_pages; ++j) block_table[b * max_pages + j] = j < pages ? indices[indptr[b] + j] : 0;
  }
}

/* K (kv 0) or V (kv 1) of the paged cache as flashdecode's page pool,
 * [max_num_pages, page_size, kv_heads, head_dim]: NHD and HND differ only
 * in which of the slot and head strides is the larger. */
static fd_tensor flashinfer_cache(uint16_t *cache, int hnd, int kv) {
  const int64_t half = PAGE_SIZE * KV_HEADS * HEAD_DIM; /* elements of one page of K (or of V) */
  fd_tensor t = {cache + kv * half, FD_DTYPE_BF16, 4, {MAX_NUM_PAGES, PAGE_SIZE, KV_HEADS, HEAD_DIM}, {0, 0, 0, 1}};
  t.strides[0] = 2 * half;                              /* page */
  t.strides[1] = hnd ? HEAD_DIM : KV_HEADS * HEAD_DIM;  /* token slot */
  t.strides[2] = hnd ? PAGE_SIZE * HEAD_DIM : HEAD_DIM; /* KV head */
  return t;
}

/* What FlashInfer's append has done before attention runs: token t of
 * request b went to slot t % page_size of page kv_indices[kv_indptr[b] +
 * t / page_size], in the engine's own indexing of each layout. */
static void fill_like_flashinfer(int hnd) {
  fill_bf16_nan(paged_kv_cache, sizeof paged_kv_cache / sizeof paged_kv_cache[0]);
  fill_f32_nan(out, sizeof out / sizeof out[0]);
  for (int64_t b = 0; b < BATCH; ++b) {
    const int64_t pages = kv_indptr[b + 1] - kv_indptr[b];
    for (int64_t t = 0; t < (pages - 1) * PAGE_SIZE + kv_last_page_len[b]; ++t) {
      const int64_t page = kv_indices[kv_indptr[b] + t / PAGE_SIZE], slot = t % PAGE_SIZE;
      for (int64_t kv = 0; kv < 2; ++kv) {
        for (int64_t h = 0; h < KV_HEADS; ++h) {
          const int64_t row = hnd ? ((page * 2 + kv) * KV_HEADS + h) * PAGE_SIZE + slot
                                  : ((page * 2 + kv) * PAGE_SIZE + slot) * KV_HEADS + h;
          for (int64_t d = 0; d < HEAD_DIM; ++d)
            paged_kv_cache[row * HEAD_DIM + d] = to_bf16(test_value(kv == 0 ? VALUE_K : VALUE_V, b, t, h, d));
        }
      }
    }
    for (int64_t i = 0; i < Q_HEADS * HEAD_DIM; ++i)
      q[b * Q_HEADS * HEAD_DIM + i] = to_bf16(test_value(VALUE_Q, b, 0, i / HEAD_DIM, i % HEAD_DIM));
  }
}

int main(void) {
  fd_options options;
  fd_options_init(&options, sizeof options);
  options.backend = FD_BACKEND_CPU;
  fd_handle *handle = NULL;
  fd_status status = fd_create(&handle, &options);
  if (status != FD_SUCCESS) return report_failure("fd_create", status);

  int32_t block_table[BATCH * MAX_PAGES], seq_lens[BATCH];
  csr_to_block_table(BATCH, kv_indptr, kv_indices, kv_last_page_len, PAGE_SIZE, MAX_PAGES, block_table, seq_lens);

  int failures = 0;
  for (int hnd = 0; hnd <= 1; ++hnd) {
    fill_like_flashinfer(hnd);
    const int64_t row = Q_HEADS * HEAD_DIM;
    fd_decode_args args;
    fd_decode_args_init(&args, sizeof args);
    args.q = (fd_tensor){q, FD_DTYPE_BF16, 4, {BATCH, 1, Q_HEADS, HEAD_DIM}, {row, row, HEAD_DIM, 1}};
    args.k = flashinfer_cache(paged_kv_cache, hnd, 0);
    args.v = flashinfer_cache(paged_kv_cache, hnd, 1);
    args.block_table = (fd_tensor){block_table, FD_DTYPE_I32, 2, {BATCH, MAX_PAGES}, {MAX_PAGES, 1}};
    args.seq_lens = (fd_tensor){seq_lens, FD_DTYPE_I32, 1, {BATCH}, {1}};
    args.out = (fd_tensor){out, FD_DTYPE_F32, 4, {BATCH, 1, Q_HEADS, HEAD_DIM}, {row, row, HEAD_DIM, 1}};
    status = fd_decode(handle, &args, NULL);
    if (status != FD_SUCCESS) return report_failure("fd_decode", status);
    failures += check_output(hnd ? "FlashInfer HND" : "FlashInfer NHD", out, FD_DTYPE_F32, BATCH, seq_lens, NULL,
                             Q_HEADS, KV_HEADS, HEAD_DIM);
  }
  fd_destroy(handle);
  return failures == 0 ? 0 : 1;
}
