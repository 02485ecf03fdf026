// SPDX-License-Identifier: Apache-2.0
/* Integration guide (docs/integration.md), vLLM: one decode step of one layer
 * over vLLM's paged KV cache, read where it lies.
 *
 * vLLM keeps a layer's K and V in one tensor, [2, num_blocks, block_size,
 * kv_heads, head_dim] (K first), or [num_blocks, 2, block_size, kv_heads,
 * head_dim] in other versions and attention backends; its block table is
 * [num_seqs, max_blocks_per_seq] int32 and seq_lens [num_seqs] int32, which
 * counts the token being decoded. The query is a view into the fused QKV
 * projection's output. This program runs on the CPU backend over host
 * memory; a CUDA handle takes the same descriptors over device memory.
 * It checks both layouts against the float64 reference. */
#include <flashdecode.h>
#include <stdio.h>

#include "integration_reference.h"

enum {
  NUM_BLOCKS = 64,
  BLOCK_SIZE = 16,
  NUM_SEQS = 3,
  MAX_BLOCKS_PER_SEQ = 8,
  Q_HEADS = 8,
  KV_HEADS = 2,
  HEAD_DIM = 64,
  QKV_WIDTH = (Q_HEADS + 2 * KV_HEADS) * HEAD_DIM /* one token's row of the fused QKV output */
};

static uint16_t kv_cache[2 * NUM_BLOCKS * BLOCK_SIZE * KV_HEADS * HEAD_DIM]; /* bf16, one layer */
static uint16_t qkv[NUM_SEQS * QKV_WIDTH];
static float out[NUM_SEQS * Q_HEADS * HEAD_DIM];
static int32_t block_table[NUM_SEQS][MAX_BLOCKS_PER_SEQ];
static int32_t seq_lens[NUM_SEQS] = {37, 128, 1};

/* K (kv 0) or V (kv 1) of vLLM's layer tensor as flashdecode's page pool,
 * [num_blocks, block_size, kv_heads, head_dim], strides in elements.
 * kv_first: the tensor is [2, num_blocks, ...], else [num_blocks, 2, ...]. */
static fd_tensor vllm_cache(uint16_t *kv_cache, int kv_first, int kv) {
  const int64_t block = BLOCK_SIZE * KV_HEADS * HEAD_DIM; /* elements of one block of K (or of V) */
  uint16_t *data = kv == 0 ? kv_cache : kv_cache + (kv_first ? NUM_BLOCKS * block : block);
  fd_tensor t = {data, FD_DTYPE_BF16, 4, {NUM_BLOCKS, BLOCK_SIZE, KV_HEADS, HEAD_DIM}, {0, 0, 0, 1}};
  t.strides[0] = kv_first ? block : 2 * block; /* from one block to the next */
  t.strides[1] = KV_HEADS * HEAD_DIM;          /* from one token slot to the next */
  t.strides[2] = HEAD_DIM;                     /* from one KV head to the next */
  return t;
}

/* What vLLM has done before attention runs: blocks handed out in no
 * particular order, and token t's K and V written to slot t % block_size of
 * block block_table[b][t / block_size] (an index of the engine's own layout,
 * independent of the descriptors above). Table entries past a sequence's
 * blocks hold -1: flashdecode never reads them. */
static void fill_like_vllm(int kv_first) {
  fill_bf16_nan(kv_cache, sizeof kv_cache / sizeof kv_cache[0]);
  fill_bf16_nan(qkv, sizeof qkv / sizeof qkv[0]); /* the K and V columns of qkv are not read either */
  fill_f32_nan(out, sizeof out / sizeof out[0]);
  int64_t handed_out = 0;
  for (int64_t b = 0; b < NUM_SEQS; ++b) {
    for (int64_t j = 0; j < MAX_BLOCKS_PER_SEQ; ++j)
      block_table[b][j] = j * BLOCK_SIZE < seq_lens[b] ? (int32_t)((handed_out++ * 37 + 11) % NUM_BLOCKS) : -1;
    for (int64_t t = 0; t < seq_lens[b]; ++t) {
      const int64_t block = block_table[b][t / BLOCK_SIZE], slot = t % BLOCK_SIZE;
      for (int64_t h = 0; h < KV_HEADS; ++h) {
        for (int64_t d = 0; d < HEAD_DIM; ++d) {
          const int64_t outer_k = kv_first ? block : block * 2, outer_v = kv_first ? NUM_BLOCKS + block : block * 2 + 1;
          kv_cache[((outer_k * BLOCK_SIZE + slot) * KV_HEADS + h) * HEAD_DIM + d] =
              to_bf16(test_value(VALUE_K, b, t, h, d));
          kv_cache[((outer_v * BLOCK_SIZE + slot) * KV_HEADS + h) * HEAD_DIM + d] =
              to_bf16(test_value(VALUE_V, b, t, h, d));
        }
      }
    }
    for (int64_t i = 0; i < Q_HEADS * HEAD_DIM; ++i)
      qkv[b * QKV_WIDTH + i] = to_bf16(test_value(VALUE_Q, b, 0, i / HEAD_DIM, i % HEAD_DIM));
  }
}

static fd_status decode_vllm(fd_handle *handle, int kv_first) {
  const int64_t row = Q_HEADS * HEAD_DIM;
  fd_decode_args args;
  fd_decode_args_init(&args, sizeof args);
  /* q: the first Q_HEADS * HEAD_DIM columns of each token's row of qkv. */
  args.q = (fd_tensor){qkv, FD_DTYPE_BF16, 4, {NUM_SEQS, 1, Q_HEADS, HEAD_DIM}, {QKV_WIDTH, QKV_WIDTH, HEAD_DIM, 1}};
  args.k = vllm_cache(kv_cache, kv_first, 0);
  args.v = vllm_cache(kv_cache, kv_first, 1);
  args.block_table = (fd_tensor){block_table, FD_DTYPE_I32, 2, {NUM_SEQS, MAX_BLOCKS_PER_SEQ}, {MAX_BLOCKS_PER_SEQ, 1}};
  args.seq_lens = (fd_tensor){seq_lens, FD_DTYPE_I32, 1, {NUM_SEQS}, {1}};
  args.out = (fd_tensor){out, FD_DTYPE_F32, 4, {NUM_SEQS, 1, Q_HEADS, HEAD_DIM}, {row, row, HEAD_DIM, 1}};
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
  for (int kv_first = 1; kv_first >= 0; --kv_first) {
    fill_like_vllm(kv_first);
    status = decode_vllm(handle, kv_first);
    if (status != FD_SUCCESS) return report_failure("fd_decode", status);
    failures += check_output(kv_first ? "vLLM [2, num_blocks, block_size, kv_heads, head_dim]"
                                      : "vLLM [num_blocks, 2, block_size, kv_heads, head_dim]",
                             out, FD_DTYPE_F32, NUM_SEQS, seq_lens, NULL, Q_HEADS, KV_HEADS, HEAD_DIM);
  }
  fd_destroy(handle);
  return failures == 0 ? 0 : 1;
}
