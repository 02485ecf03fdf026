// SPDX-License-Identifier: Apache-2.0
/* Integration guide (docs/integration.md), plans: fd_describe_plan says what
 * fd_decode would run for a problem (split count and length, kernel, merge,
 * launches, blocks, workspace) without running it, for an engine's logs and
 * for tuning. Runs on the CPU backend, whose plan has one kernel ("cpu"), a
 * separate merge pass and no launches; on CUDA the same call names the
 * kernel and the merge the GPU would run. */
#include <flashdecode.h>
#include <stdio.h>

#include "integration_reference.h"

enum { BATCH = 4, Q_HEADS = 8, KV_HEADS = 2, HEAD_DIM = 64, KV_CAPACITY = 1024 };

static uint16_t q[BATCH * Q_HEADS * HEAD_DIM];
static uint16_t k[BATCH * KV_CAPACITY * KV_HEADS * HEAD_DIM]; /* dense [batch, kv_capacity, kv_heads, head_dim] */
static uint16_t v[BATCH * KV_CAPACITY * KV_HEADS * HEAD_DIM];
static float out[BATCH * Q_HEADS * HEAD_DIM];
static int32_t seq_lens[BATCH] = {1024, 700, 33, 1};

static const char *merge_name(fd_merge merge) {
  switch (merge) {
    case FD_MERGE_NONE: return "none";
    case FD_MERGE_SEPARATE: return "separate";
    case FD_MERGE_FUSED: return "fused";
    case FD_MERGE_CLUSTER: return "cluster";
  }
  return "unknown";
}

static const char *schedule_name(fd_schedule schedule) {
  switch (schedule) {
    case FD_SCHEDULE_FIXED: return "fixed";
    case FD_SCHEDULE_LONGEST_FIRST: return "longest first";
    case FD_SCHEDULE_FITTED: return "fitted";
    case FD_SCHEDULE_BALANCED: return "balanced";
  }
  return "unknown";
}

/* Logs what fd_decode would run for args on this handle. */
static fd_status log_plan(const char *label, const fd_handle *handle, const fd_decode_args *args, fd_plan_info *info) {
  fd_plan_info_init(info, sizeof *info);
  const fd_status status = fd_describe_plan(handle, args, info);
  if (status != FD_SUCCESS) return status;
  printf("%s: %s, kernel %s, splits %d x %lld tokens (%s), merge %s, launches %d, blocks %lld, workspace %zu bytes\n",
         label, info->backend == FD_BACKEND_CUDA ? "CUDA" : "CPU", info->kernel, (int)info->num_splits,
         (long long)info->split_tokens, schedule_name(info->schedule), merge_name(info->merge), (int)info->launches,
         (long long)info->blocks, info->workspace_bytes);
  return FD_SUCCESS;
}

static int expect(int condition, const char *what) {
  if (!condition) fprintf(stderr, "unexpected plan: %s\n", what);
  return condition ? 0 : 1;
}

int main(void) {
  fd_options options;
  fd_options_init(&options, sizeof options);
  options.backend = FD_BACKEND_CPU;
  options.num_threads = 2;
  fd_handle *handle = NULL;
  fd_status status = fd_create(&handle, &options);
  if (status != FD_SUCCESS) return report_failure("fd_create", status);

  fill_bf16_nan(k, sizeof k / sizeof k[0]);
  fill_bf16_nan(v, sizeof v / sizeof v[0]);
  fill_f32_nan(out, sizeof out / sizeof out[0]);
  const int64_t token = KV_HEADS * HEAD_DIM, row = Q_HEADS * HEAD_DIM;
  for (int64_t b = 0; b < BATCH; ++b) {
    for (int64_t i = 0; i < seq_lens[b] * token; ++i) {
      k[b * KV_CAPACITY * token + i] =
          to_bf16(test_value(VALUE_K, b, i / token, i / HEAD_DIM % KV_HEADS, i % HEAD_DIM));
      v[b * KV_CAPACITY * token + i] =
          to_bf16(test_value(VALUE_V, b, i / token, i / HEAD_DIM % KV_HEADS, i % HEAD_DIM));
    }
    for (int64_t i = 0; i < row; ++i) q[b * row + i] = to_bf16(test_value(VALUE_Q, b, 0, i / HEAD_DIM, i % HEAD_DIM));
  }
  fd_decode_args args;
  fd_decode_args_init(&args, sizeof args);
  args.q = (fd_tensor){q, FD_DTYPE_BF16, 4, {BATCH, 1, Q_HEADS, HEAD_DIM}, {row, row, HEAD_DIM, 1}};
  args.k = (fd_tensor){
      k, FD_DTYPE_BF16, 4, {BATCH, KV_CAPACITY, KV_HEADS, HEAD_DIM}, {KV_CAPACITY * token, token, HEAD_DIM, 1}};
  args.v = args.k;
  args.v.data = v;
  args.seq_lens = (fd_tensor){seq_lens, FD_DTYPE_I32, 1, {BATCH}, {1}};
  args.out = (fd_tensor){out, FD_DTYPE_F32, 4, {BATCH, 1, Q_HEADS, HEAD_DIM}, {row, row, HEAD_DIM, 1}};

  int failures = 0;
  fd_plan_info info;
  size_t bytes = 0;
  status = log_plan("automatic splits", handle, &args, &info);
  if (status == FD_SUCCESS) status = fd_workspace_size(handle, &args, &bytes);
  if (status != FD_SUCCESS) return report_failure("fd_describe_plan", status);
  failures += expect(info.backend == FD_BACKEND_CPU && info.launches == 0, "a CPU plan launches no kernel");
  failures += expect(info.schedule == FD_SCHEDULE_FIXED, "the CPU runs every split of every sequence in order");
  failures += expect(info.workspace_bytes == bytes, "workspace_bytes is fd_workspace_size's answer");
  failures += expect(info.num_splits * info.split_tokens >= KV_CAPACITY, "the splits cover the capacity");

  /* A fixed split count is kept as asked, and each split covers the
   * capacity's share, whatever the lengths in seq_lens. */
  args.num_splits = 3;
  status = log_plan("3 splits", handle, &args, &info);
  if (status != FD_SUCCESS) return report_failure("fd_describe_plan", status);
  failures += expect(info.num_splits == 3 && info.split_tokens == (KV_CAPACITY + 2) / 3, "3 splits of 342 tokens");
  failures += expect(info.blocks == BATCH * KV_HEADS * 3, "a CPU task per sequence, KV head and split");
  status = fd_decode(handle, &args, NULL);
  if (status != FD_SUCCESS) return report_failure("fd_decode", status);
  failures +=
      check_output("decode with 3 splits", out, FD_DTYPE_F32, BATCH, seq_lens, NULL, Q_HEADS, KV_HEADS, HEAD_DIM);

  /* An empty batch runs nothing. */
  args.q.shape[0] = args.k.shape[0] = args.v.shape[0] = args.out.shape[0] = args.seq_lens.shape[0] = 0;
  status = log_plan("empty batch", handle, &args, &info);
  if (status != FD_SUCCESS) return report_failure("fd_describe_plan", status);
  failures += expect(info.merge == FD_MERGE_NONE && info.launches == 0 && info.blocks == 0, "nothing to run");

  fd_destroy(handle);
  return failures == 0 ? 0 : 1;
}
