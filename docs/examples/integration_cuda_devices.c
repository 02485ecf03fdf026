// SPDX-License-Identifier: Apache-2.0
/* Integration guide (docs/integration.md), several GPUs: tensor
 * parallelism over every visible device (a power of two, up to 8), one
 * handle and one stream per device. Rank r's handle is created with
 * options.device = r; its tensors live on device r and its stream belongs
 * to device r. fd_decode runs on the handle's device whatever device the
 * calling thread has current, so one thread can enqueue every rank's
 * decode before waiting for any. Each rank decodes its query heads against
 * its KV heads; the ranks' outputs are the model's heads side by side.
 *
 * Needs a CUDA device and a libflashdecode built with CUDA; without them it
 * says so and exits 77, which CTest reports as skipped. */
#include <cuda_runtime_api.h>
#include <flashdecode.h>
#include <stdio.h>

#include "integration_reference.h"

enum { MAX_RANKS = 8, BATCH = 4, Q_HEADS = 32, KV_HEADS = 8, HEAD_DIM = 128, KV_CAPACITY = 512 };
enum { GROUP = Q_HEADS / KV_HEADS };

#define CHECK_CUDA(call)                                                                       \
  do {                                                                                         \
    const cudaError_t err_ = (call);                                                           \
    if (err_ != cudaSuccess) {                                                                 \
      fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(err_)); \
      return 1;                                                                                \
    }                                                                                          \
  } while (0)

static int32_t seq_lens[BATCH] = {512, 1, 300, 77};
static uint16_t out[BATCH * Q_HEADS * HEAD_DIM]; /* bf16: every rank's heads, side by side */
static uint16_t host_q[BATCH * Q_HEADS * HEAD_DIM];
static uint16_t host_k[BATCH * KV_CAPACITY * KV_HEADS * HEAD_DIM], host_v[BATCH * KV_CAPACITY * KV_HEADS * HEAD_DIM];

typedef struct rank {
  fd_handle *handle;
  cudaStream_t stream;
  int64_t first_q_head, q_heads, first_kv_head, kv_heads;
  uint16_t *q, *k, *v, *out; /* on the rank's device */
  int32_t *seq_lens;
} rank;

/* Rank r's shard of the model's heads, its inputs on its device, and its handle. */
static int open_rank(rank *r, int index, int ranks) {
  r->q_heads = Q_HEADS / ranks;
  r->first_q_head = index * r->q_heads;
  r->kv_heads = KV_HEADS / ranks;
  r->first_kv_head = r->first_q_head / GROUP;

  fd_options options;
  fd_options_init(&options, sizeof options);
  options.backend = FD_BACKEND_CUDA;
  options.device = index; /* this rank's GPU */
  const fd_status status = fd_create(&r->handle, &options);
  if (status == FD_ERROR_NO_DEVICE) {
    char message[256];
    fd_last_error_message(message, sizeof message);
    printf("skipped, no CUDA device for flashdecode: %s\n", message);
    return 77;
  }
  if (status != FD_SUCCESS) return report_failure("fd_create", status);

  /* The rank's memory and stream: allocated with its device current. */
  CHECK_CUDA(cudaSetDevice(index));
  CHECK_CUDA(cudaStreamCreateWithFlags(&r->stream, cudaStreamNonBlocking));
  const size_t q_bytes = BATCH * r->q_heads * HEAD_DIM * sizeof(uint16_t);
  const size_t kv_bytes = BATCH * KV_CAPACITY * r->kv_heads * HEAD_DIM * sizeof(uint16_t);
  CHECK_CUDA(cudaMalloc((void **)&r->q, q_bytes));
  CHECK_CUDA(cudaMalloc((void **)&r->out, q_bytes));
  CHECK_CUDA(cudaMalloc((void **)&r->k, kv_bytes));
  CHECK_CUDA(cudaMalloc((void **)&r->v, kv_bytes));
  CHECK_CUDA(cudaMalloc((void **)&r->seq_lens, sizeof seq_lens));

  /* What the rank's engine holds: its query heads and its KV heads. */
  for (int64_t b = 0; b < BATCH; ++b) {
    for (int64_t i = 0; i < r->q_heads * HEAD_DIM; ++i) {
      const int64_t h = r->first_q_head + i / HEAD_DIM;
      host_q[b * r->q_heads * HEAD_DIM + i] = to_bf16(test_value(VALUE_Q, b, 0, h, i % HEAD_DIM));
    }
    for (int64_t t = 0; t < KV_CAPACITY; ++t) {
      for (int64_t i = 0; i < r->kv_heads * HEAD_DIM; ++i) {
        const int64_t at = (b * KV_CAPACITY + t) * r->kv_heads * HEAD_DIM + i, g = r->first_kv_head + i / HEAD_DIM;
        host_k[at] = t < seq_lens[b] ? to_bf16(test_value(VALUE_K, b, t, g, i % HEAD_DIM)) : BF16_NAN;
        host_v[at] = t < seq_lens[b] ? to_bf16(test_value(VALUE_V, b, t, g, i % HEAD_DIM)) : BF16_NAN;
      }
    }
  }
  CHECK_CUDA(cudaMemcpy(r->q, host_q, q_bytes, cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(r->k, host_k, kv_bytes, cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(r->v, host_v, kv_bytes, cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(r->seq_lens, seq_lens, sizeof seq_lens, cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemset(r->out, 0xff, q_bytes)); /* NaN: an element left unwritten fails */
  return 0;
}

/* Enqueues rank r's decode on its stream; returns at once. */
static fd_status enqueue_rank(const rank *r) {
  const int64_t row = r->q_heads * HEAD_DIM, token = r->kv_heads * HEAD_DIM;
  fd_decode_args args;
  fd_decode_args_init(&args, sizeof args);
  args.q = (fd_tensor){r->q, FD_DTYPE_BF16, 4, {BATCH, 1, r->q_heads, HEAD_DIM}, {row, row, HEAD_DIM, 1}};
  args.k = (fd_tensor){
      r->k, FD_DTYPE_BF16, 4, {BATCH, KV_CAPACITY, r->kv_heads, HEAD_DIM}, {KV_CAPACITY * token, token, HEAD_DIM, 1}};
  args.v = args.k;
  args.v.data = r->v;
  args.seq_lens = (fd_tensor){r->seq_lens, FD_DTYPE_I32, 1, {BATCH}, {1}};
  args.out = (fd_tensor){r->out, FD_DTYPE_BF16, 4, {BATCH, 1, r->q_heads, HEAD_DIM}, {row, row, HEAD_DIM, 1}};
  return fd_decode(r->handle, &args, (fd_cuda_stream)r->stream);
}

int main(void) {
  int devices = 0;
  const cudaError_t err = cudaGetDeviceCount(&devices);
  if (err != cudaSuccess || devices == 0) {
    printf("skipped, no CUDA device (%s)\n", err == cudaSuccess ? "none found" : cudaGetErrorString(err));
    return 77;
  }
  int ranks = 1;
  while (ranks * 2 <= devices && ranks * 2 <= MAX_RANKS) ranks *= 2;

  static rank r[MAX_RANKS];
  for (int i = 0; i < ranks; ++i) {
    const int opened = open_rank(&r[i], i, ranks);
    if (opened != 0) return opened;
  }
  for (int i = 0; i < ranks; ++i) { /* every rank's decode in flight at once */
    const fd_status status = enqueue_rank(&r[i]);
    if (status != FD_SUCCESS) return report_failure("fd_decode", status);
  }
  for (int i = 0; i < ranks; ++i) { /* gather: rank i's heads go to columns first_q_head.. of out */
    CHECK_CUDA(cudaSetDevice(i));
    CHECK_CUDA(cudaMemcpy2DAsync(out + r[i].first_q_head * HEAD_DIM, Q_HEADS * HEAD_DIM * sizeof(uint16_t), r[i].out,
                                 r[i].q_heads * HEAD_DIM * sizeof(uint16_t), r[i].q_heads * HEAD_DIM * sizeof(uint16_t),
                                 BATCH, cudaMemcpyDeviceToHost, r[i].stream));
    CHECK_CUDA(cudaStreamSynchronize(r[i].stream));
  }
  char what[64];
  snprintf(what, sizeof what, "tensor parallel over %d GPU%s", ranks, ranks > 1 ? "s" : "");
  const int failures = check_output(what, out, FD_DTYPE_BF16, BATCH, seq_lens, NULL, Q_HEADS, KV_HEADS, HEAD_DIM);

  for (int i = 0; i < ranks; ++i) {
    fd_destroy(r[i].handle); /* its decode has finished: its stream was synchronised */
    CHECK_CUDA(cudaSetDevice(i));
    CHECK_CUDA(cudaFree(r[i].q));
    CHECK_CUDA(cudaFree(r[i].k));
    CHECK_CUDA(cudaFree(r[i].v));
    CHECK_CUDA(cudaFree(r[i].out));
    CHECK_CUDA(cudaFree(r[i].seq_lens));
    CHECK_CUDA(cudaStreamDestroy(r[i].stream));
  }
  return failures == 0 ? 0 : 1;
}
