// SPDX-License-Identifier: Apache-2.0
/* Integration guide (docs/integration.md), several GPUs: one handle per
 * device, and the two ways to divide a decode between devices.
 *
 * Tensor parallelism divides the heads: rank r of T holds q_heads / T query
 * heads and the KV heads they read (kv_heads / T of them, or one replicated
 * KV head when T > kv_heads), and decodes them alone; the outputs are
 * concatenated along the heads. Sequence (context) parallelism divides the
 * tokens: each rank decodes its part of every sequence and returns the
 * log-sum-exp too, and the parts merge exactly through it.
 *
 * Every rank here is a CPU handle in one process; on GPUs, rank r's handle
 * is created with FD_BACKEND_CUDA and options.device = r, and its tensors
 * live on that device. */
#include <flashdecode.h>
#include <math.h>
#include <stdio.h>

#include "integration_reference.h"

enum { MAX_RANKS = 4, BATCH = 3, Q_HEADS = 8, KV_HEADS = 2, HEAD_DIM = 64, KV_CAPACITY = 128 };
enum { GROUP = Q_HEADS / KV_HEADS, TOKENS_PER_RANK = KV_CAPACITY / 2 };

static int32_t seq_lens[BATCH] = {50, 128, 20};
static uint16_t q[BATCH * Q_HEADS * HEAD_DIM];                           /* every rank's query heads, side by side */
static float out[BATCH * Q_HEADS * HEAD_DIM];                            /* every rank's output heads, side by side */
static uint16_t k[MAX_RANKS][BATCH * KV_CAPACITY * KV_HEADS * HEAD_DIM]; /* each rank's own cache */
static uint16_t v[MAX_RANKS][BATCH * KV_CAPACITY * KV_HEADS * HEAD_DIM];

/* The heads rank `rank` of `ranks` holds. */
typedef struct shard {
  int64_t first_q_head, q_heads, first_kv_head, kv_heads;
} shard;

static shard tensor_parallel_shard(int64_t rank, int64_t ranks) {
  shard s;
  s.q_heads = Q_HEADS / ranks;
  s.first_q_head = rank * s.q_heads;
  s.kv_heads = KV_HEADS >= ranks ? KV_HEADS / ranks : 1; /* more ranks than KV heads: each holds a copy of one */
  s.first_kv_head = s.first_q_head / GROUP;              /* the KV head of its first query head */
  return s;
}

/* Rank `rank`'s decode: its query heads are a view into q (pointer at its
 * first head, q's strides), its cache holds only its KV heads, and its
 * output heads are a view into out. Query head i of the rank reads the
 * rank's KV head i / (q_heads / kv_heads), which is the model's KV head of
 * its model query head: the group mapping holds within every shard. */
static fd_status decode_shard(fd_handle *handle, shard s, uint16_t *k_rank, uint16_t *v_rank) {
  const int64_t row = Q_HEADS * HEAD_DIM, token = s.kv_heads * HEAD_DIM;
  fd_decode_args args;
  fd_decode_args_init(&args, sizeof args);
  args.q = (fd_tensor){
      q + s.first_q_head * HEAD_DIM, FD_DTYPE_BF16, 4, {BATCH, 1, s.q_heads, HEAD_DIM}, {row, row, HEAD_DIM, 1}};
  args.k = (fd_tensor){
      k_rank, FD_DTYPE_BF16, 4, {BATCH, KV_CAPACITY, s.kv_heads, HEAD_DIM}, {KV_CAPACITY * token, token, HEAD_DIM, 1}};
  args.v = args.k;
  args.v.data = v_rank;
  args.seq_lens = (fd_tensor){seq_lens, FD_DTYPE_I32, 1, {BATCH}, {1}};
  args.out = (fd_tensor){
      out + s.first_q_head * HEAD_DIM, FD_DTYPE_F32, 4, {BATCH, 1, s.q_heads, HEAD_DIM}, {row, row, HEAD_DIM, 1}};
  return fd_decode(handle, &args, NULL);
}

static void fill_query(void) {
  fill_f32_nan(out, sizeof out / sizeof out[0]);
  for (int64_t i = 0; i < BATCH * Q_HEADS * HEAD_DIM; ++i)
    q[i] = to_bf16(test_value(VALUE_Q, i / (Q_HEADS * HEAD_DIM), 0, i / HEAD_DIM % Q_HEADS, i % HEAD_DIM));
}

/* What each rank's engine has written: its KV heads (model heads
 * first_kv_head...) of tokens [first_token, first_token + tokens) of every
 * sequence, in a dense [batch, tokens, kv_heads, head_dim] cache. */
static void fill_rank_cache(uint16_t *k_rank, uint16_t *v_rank, shard s, int64_t first_token, int64_t tokens) {
  fill_bf16_nan(k_rank, BATCH * KV_CAPACITY * KV_HEADS * HEAD_DIM);
  fill_bf16_nan(v_rank, BATCH * KV_CAPACITY * KV_HEADS * HEAD_DIM);
  for (int64_t b = 0; b < BATCH; ++b) {
    for (int64_t t = 0; t < tokens && first_token + t < seq_lens[b]; ++t) {
      for (int64_t j = 0; j < s.kv_heads; ++j) {
        for (int64_t d = 0; d < HEAD_DIM; ++d) {
          const int64_t at = ((b * tokens + t) * s.kv_heads + j) * HEAD_DIM + d;
          k_rank[at] = to_bf16(test_value(VALUE_K, b, first_token + t, s.first_kv_head + j, d));
          v_rank[at] = to_bf16(test_value(VALUE_V, b, first_token + t, s.first_kv_head + j, d));
        }
      }
    }
  }
}

static int tensor_parallel(fd_handle **handles, int ranks) {
  fill_query();
  for (int r = 0; r < ranks; ++r) {
    const shard s = tensor_parallel_shard(r, ranks);
    fill_rank_cache(k[r], v[r], s, 0, KV_CAPACITY);
    const fd_status status = decode_shard(handles[r], s, k[r], v[r]);
    if (status != FD_SUCCESS) return report_failure("fd_decode", status);
  }
  char what[64];
  snprintf(what, sizeof what, "tensor parallel, %d ranks", ranks);
  return check_output(what, out, FD_DTYPE_F32, BATCH, seq_lens, NULL, Q_HEADS, KV_HEADS, HEAD_DIM);
}

/* Merges the outputs of the parts of a sequence through their log-sum-exps
 * (natural log) with fd_merge_states: with lse = log(sum_r exp(lse_r)),
 * out = sum_r exp(lse_r - lse) out_r. A part with no tokens has lse -inf
 * and weight 0. On GPUs the parts are first gathered onto one device (an
 * NCCL all-gather of out and lse), and the handle is that device's. */
static fd_status merge_parts(fd_handle *handle, int parts, float part_out[][BATCH * Q_HEADS * HEAD_DIM],
                             float part_lse[][BATCH * Q_HEADS], float *merged) {
  const int64_t row = Q_HEADS * HEAD_DIM;
  fd_tensor states_out[MAX_RANKS], states_lse[MAX_RANKS];
  for (int r = 0; r < parts; ++r) {
    states_out[r] = (fd_tensor){part_out[r], FD_DTYPE_F32, 4, {BATCH, 1, Q_HEADS, HEAD_DIM}, {row, row, HEAD_DIM, 1}};
    states_lse[r] = (fd_tensor){part_lse[r], FD_DTYPE_F32, 3, {BATCH, 1, Q_HEADS}, {Q_HEADS, Q_HEADS, 1}};
  }
  fd_merge_args args;
  fd_merge_args_init(&args, sizeof args);
  args.num_states = parts;
  args.states_out = states_out;
  args.states_lse = states_lse;
  args.out = (fd_tensor){merged, FD_DTYPE_F32, 4, {BATCH, 1, Q_HEADS, HEAD_DIM}, {row, row, HEAD_DIM, 1}};
  return fd_merge_states(handle, &args, NULL);
}

static int sequence_parallel(fd_handle **handles) {
  static float part_out[2][BATCH * Q_HEADS * HEAD_DIM], part_lse[2][BATCH * Q_HEADS];
  const shard all_heads = tensor_parallel_shard(0, 1);
  const int64_t row = Q_HEADS * HEAD_DIM, token = KV_HEADS * HEAD_DIM;
  fill_query();
  for (int r = 0; r < 2; ++r) {
    /* Rank r holds tokens [r * TOKENS_PER_RANK, (r + 1) * TOKENS_PER_RANK). */
    fill_rank_cache(k[r], v[r], all_heads, r * TOKENS_PER_RANK, TOKENS_PER_RANK);
    int32_t part_lens[BATCH];
    for (int64_t b = 0; b < BATCH; ++b) {
      const int64_t rest = seq_lens[b] - r * TOKENS_PER_RANK;
      part_lens[b] = (int32_t)(rest < 0 ? 0 : rest > TOKENS_PER_RANK ? TOKENS_PER_RANK : rest);
    }
    fd_decode_args args;
    fd_decode_args_init(&args, sizeof args);
    args.q = (fd_tensor){q, FD_DTYPE_BF16, 4, {BATCH, 1, Q_HEADS, HEAD_DIM}, {row, row, HEAD_DIM, 1}};
    args.k = (fd_tensor){k[r],
                         FD_DTYPE_BF16,
                         4,
                         {BATCH, TOKENS_PER_RANK, KV_HEADS, HEAD_DIM},
                         {TOKENS_PER_RANK * token, token, HEAD_DIM, 1}};
    args.v = args.k;
    args.v.data = v[r];
    args.seq_lens = (fd_tensor){part_lens, FD_DTYPE_I32, 1, {BATCH}, {1}};
    args.out = (fd_tensor){part_out[r], FD_DTYPE_F32, 4, {BATCH, 1, Q_HEADS, HEAD_DIM}, {row, row, HEAD_DIM, 1}};
    args.lse = (fd_tensor){part_lse[r], FD_DTYPE_F32, 3, {BATCH, 1, Q_HEADS}, {Q_HEADS, Q_HEADS, 1}};
    const fd_status status = fd_decode(handles[r], &args, NULL);
    if (status != FD_SUCCESS) return report_failure("fd_decode", status);
  }
  const fd_status merged = merge_parts(handles[0], 2, part_out, part_lse, out);
  if (merged != FD_SUCCESS) return report_failure("fd_merge_states", merged);
  return check_output("sequence parallel, 2 ranks, merged by LSE", out, FD_DTYPE_F32, BATCH, seq_lens, NULL, Q_HEADS,
                      KV_HEADS, HEAD_DIM);
}

int main(void) {
  fd_handle *handles[MAX_RANKS] = {NULL};
  for (int r = 0; r < MAX_RANKS; ++r) {
    fd_options options;
    fd_options_init(&options, sizeof options);
    options.backend = FD_BACKEND_CPU; /* on GPUs: FD_BACKEND_CUDA */
    options.device = r;               /* the rank's device (read by the CUDA backend only) */
    options.num_threads = 1;
    const fd_status status = fd_create(&handles[r], &options);
    if (status != FD_SUCCESS) return report_failure("fd_create", status);
  }
  int failures = 0;
  failures += tensor_parallel(handles, 2); /* 4 query heads and 1 KV head a rank */
  failures += tensor_parallel(handles, 4); /* 2 query heads a rank; each KV head on 2 ranks */
  failures += sequence_parallel(handles);
  for (int r = 0; r < MAX_RANKS; ++r) fd_destroy(handles[r]);
  return failures == 0 ? 0 : 1;
}
