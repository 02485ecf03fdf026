// SPDX-License-Identifier: Apache-2.0
/* Integration guide (docs/integration.md), TensorRT-LLM: one decode step of
 * one layer over TensorRT-LLM's paged KV cache pool, read where it lies.
 *
 * TensorRT-LLM's primary pool holds every layer of a block together:
 * [num_blocks, num_layers, 2, tokens_per_block * kv_heads * head_dim], K
 * then V of each layer. Its own attention kernels lay out each half-block
 * as [kv_heads, tokens_per_block, head_dim] (HND); the PyTorch flow's
 * KVCacheManager.get_buffers(layer, kv_layout) views one layer as
 * [num_blocks, 2, kv_heads, tokens_per_block, head_dim] ("HND") or
 * [num_blocks, 2, tokens_per_block, kv_heads, head_dim] ("NHD"), as the
 * backend that writes it expects. K and V of layer l are then page pools
 * whose page stride is num_layers * 2 * tokens_per_block * kv_heads *
 * head_dim, V one half-block after K. The block table holds each
 * sequence's block ids (get_batch_cache_indices, or get_block_ids_per_seq,
 * padded with 0). Runs on the CPU backend; a CUDA handle takes the same
 * descriptors over device memory. */
#include <flashdecode.h>
#include <stdio.h>

#include "integration_reference.h"

enum {
  NUM_BLOCKS = 40,
  NUM_LAYERS = 3,
  TOKENS_PER_BLOCK = 32,
  BATCH = 3,
  MAX_BLOCKS_PER_SEQ = 4,
  Q_HEADS = 8,
  KV_HEADS = 2,
  HEAD_DIM = 64,
  LAYER = 1 /* the layer this step decodes */
};

static uint16_t pool[NUM_BLOCKS * NUM_LAYERS * 2 * TOKENS_PER_BLOCK * KV_HEADS * HEAD_DIM]; /* bf16 */
static uint16_t q[BATCH * Q_HEADS * HEAD_DIM];
static float out[BATCH * Q_HEADS * HEAD_DIM];
static int32_t block_ids[BATCH][MAX_BLOCKS_PER_SEQ];
static int32_t seq_lens[BATCH] = {65, 128, 3};
static int64_t layer_seqs[BATCH]; /* the test values of LAYER's rows */

/* K (kv 0) or V (kv 1) of `layer` as flashdecode's page pool,
 * [num_blocks, tokens_per_block, kv_heads, head_dim]. */
static fd_tensor trtllm_cache(uint16_t *pool, int64_t layer, int kv, int hnd) {
  const int64_t half = TOKENS_PER_BLOCK * KV_HEADS * HEAD_DIM; /* elements of K (or V) of one layer of a block */
  uint16_t *data = pool + (layer * 2 + kv) * half;             /* in block 0: the layer's K, then its V */
  fd_tensor t = {data, FD_DTYPE_BF16, 4, {NUM_BLOCKS, TOKENS_PER_BLOCK, KV_HEADS, HEAD_DIM}, {0, 0, 0, 1}};
  t.strides[0] = NUM_LAYERS * 2 * half;                        /* block */
  t.strides[1] = hnd ? HEAD_DIM : KV_HEADS * HEAD_DIM;         /* token slot */
  t.strides[2] = hnd ? TOKENS_PER_BLOCK * HEAD_DIM : HEAD_DIM; /* KV head */
  return t;
}

/* What TensorRT-LLM has done before attention runs: blocks handed out in no
 * particular order, every layer's K and V of token t written into block
 * block_ids[b][t / tokens_per_block] at slot t % tokens_per_block. Each
 * layer holds other values (sequence b + 1000 * layer), so reading the
 * wrong layer fails the check. */
static void fill_like_trtllm(int hnd) {
  fill_bf16_nan(pool, sizeof pool / sizeof pool[0]);
  fill_f32_nan(out, sizeof out / sizeof out[0]);
  int64_t handed_out = 0;
  for (int64_t b = 0; b < BATCH; ++b) {
    for (int64_t j = 0; j < MAX_BLOCKS_PER_SEQ; ++j)
      block_ids[b][j] = j * TOKENS_PER_BLOCK < seq_lens[b] ? (int32_t)((handed_out++ * 13 + 5) % NUM_BLOCKS) : 0;
    for (int64_t t = 0; t < seq_lens[b]; ++t) {
      const int64_t block = block_ids[b][t / TOKENS_PER_BLOCK], slot = t % TOKENS_PER_BLOCK;
      for (int64_t layer = 0; layer < NUM_LAYERS; ++layer) {
        for (int64_t kv = 0; kv < 2; ++kv) {
          for (int64_t h = 0; h < KV_HEADS; ++h) {
            const int64_t half = (block * NUM_LAYERS + layer) * 2 + kv;
            const int64_t row =
                hnd ? (half * KV_HEADS + h) * TOKENS_PER_BLOCK + slot : (half * TOKENS_PER_BLOCK + slot) * KV_HEADS + h;
            for (int64_t d = 0; d < HEAD_DIM; ++d)
              pool[row * HEAD_DIM + d] = to_bf16(test_value(kv == 0 ? VALUE_K : VALUE_V, b + 1000 * layer, t, h, d));
          }
        }
      }
    }
    layer_seqs[b] = b + 1000 * LAYER;
    for (int64_t i = 0; i < Q_HEADS * HEAD_DIM; ++i)
      q[b * Q_HEADS * HEAD_DIM + i] = to_bf16(test_value(VALUE_Q, layer_seqs[b], 0, i / HEAD_DIM, i % HEAD_DIM));
  }
}

int main(void) {
  fd_options options;
  fd_options_init(&options, sizeof options);
  options.backend = FD_BACKEND_CPU;
  fd_handle *handle = NULL;
  fd_status status = fd_create(&handle, &options);
  if (status != FD_SUCCESS) return report_failure("fd_create", status);

  int failures = 0;
  for (int hnd = 1; hnd >= 0; --hnd) {
    fill_like_trtllm(hnd);
    const int64_t row = Q_HEADS * HEAD_DIM;
    fd_decode_args args;
    fd_decode_args_init(&args, sizeof args);
    args.q = (fd_tensor){q, FD_DTYPE_BF16, 4, {BATCH, 1, Q_HEADS, HEAD_DIM}, {row, row, HEAD_DIM, 1}};
    args.k = trtllm_cache(pool, LAYER, 0, hnd);
    args.v = trtllm_cache(pool, LAYER, 1, hnd);
    args.block_table = (fd_tensor){block_ids, FD_DTYPE_I32, 2, {BATCH, MAX_BLOCKS_PER_SEQ}, {MAX_BLOCKS_PER_SEQ, 1}};
    args.seq_lens = (fd_tensor){seq_lens, FD_DTYPE_I32, 1, {BATCH}, {1}};
    args.out = (fd_tensor){out, FD_DTYPE_F32, 4, {BATCH, 1, Q_HEADS, HEAD_DIM}, {row, row, HEAD_DIM, 1}};
    status = fd_decode(handle, &args, NULL);
    if (status != FD_SUCCESS) return report_failure("fd_decode", status);
    failures += check_output(hnd ? "TensorRT-LLM pool, HND blocks" : "TensorRT-LLM pool, NHD blocks", out, FD_DTYPE_F32,
                             BATCH, seq_lens, layer_seqs, Q_HEADS, KV_HEADS, HEAD_DIM);
  }
  fd_destroy(handle);
  return failures == 0 ? 0 : 1;
}
