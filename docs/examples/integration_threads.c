// SPDX-License-Identifier: Apache-2.0
/* Integration guide (docs/integration.md), handles and threads: each worker
 * thread owns a handle (and, on CUDA, a stream) and decodes its own batches,
 * concurrently with the others. Calls on one handle run one at a time, so
 * a handle shared by threads would serialise them, and on CUDA decodes on
 * one handle share its workspace and must be ordered on the device. The
 * last error message is per thread, so each worker reads its own. Runs on
 * the CPU backend; with FD_BACKEND_CUDA each worker also creates its stream
 * and passes it to fd_decode. */
#include <flashdecode.h>
#include <pthread.h>
#include <stdio.h>

#include "integration_reference.h"

enum { WORKERS = 3, STEPS = 4, BATCH = 2, Q_HEADS = 4, KV_HEADS = 2, HEAD_DIM = 32, KV_CAPACITY = 96 };

typedef struct worker {
  int index;
  int failures;
  fd_status status;
  char message[256];
  uint16_t q[BATCH * Q_HEADS * HEAD_DIM];
  uint16_t k[BATCH * KV_CAPACITY * KV_HEADS * HEAD_DIM]; /* dense [batch, kv_capacity, kv_heads, head_dim] */
  uint16_t v[BATCH * KV_CAPACITY * KV_HEADS * HEAD_DIM];
  float out[BATCH * Q_HEADS * HEAD_DIM];
  int32_t seq_lens[BATCH];
  int64_t seqs[BATCH];
} worker;

/* Step `step` of worker w: new sequences, new lengths. */
static void fill_step(worker *w, int step) {
  fill_bf16_nan(w->k, sizeof w->k / sizeof w->k[0]);
  fill_bf16_nan(w->v, sizeof w->v / sizeof w->v[0]);
  fill_f32_nan(w->out, sizeof w->out / sizeof w->out[0]);
  for (int64_t b = 0; b < BATCH; ++b) {
    w->seqs[b] = (w->index * STEPS + step) * BATCH + b;
    w->seq_lens[b] = (int32_t)(1 + (w->seqs[b] * 29) % KV_CAPACITY);
    for (int64_t t = 0; t < w->seq_lens[b]; ++t) {
      for (int64_t i = 0; i < KV_HEADS * HEAD_DIM; ++i) {
        const int64_t at = (b * KV_CAPACITY + t) * KV_HEADS * HEAD_DIM + i;
        w->k[at] = to_bf16(test_value(VALUE_K, w->seqs[b], t, i / HEAD_DIM, i % HEAD_DIM));
        w->v[at] = to_bf16(test_value(VALUE_V, w->seqs[b], t, i / HEAD_DIM, i % HEAD_DIM));
      }
    }
    for (int64_t i = 0; i < Q_HEADS * HEAD_DIM; ++i)
      w->q[b * Q_HEADS * HEAD_DIM + i] = to_bf16(test_value(VALUE_Q, w->seqs[b], 0, i / HEAD_DIM, i % HEAD_DIM));
  }
}

static fd_decode_args worker_args(worker *w) {
  const int64_t token = KV_HEADS * HEAD_DIM, row = Q_HEADS * HEAD_DIM;
  fd_decode_args args;
  fd_decode_args_init(&args, sizeof args);
  args.q = (fd_tensor){w->q, FD_DTYPE_BF16, 4, {BATCH, 1, Q_HEADS, HEAD_DIM}, {row, row, HEAD_DIM, 1}};
  args.k = (fd_tensor){
      w->k, FD_DTYPE_BF16, 4, {BATCH, KV_CAPACITY, KV_HEADS, HEAD_DIM}, {KV_CAPACITY * token, token, HEAD_DIM, 1}};
  args.v = args.k;
  args.v.data = w->v;
  args.seq_lens = (fd_tensor){w->seq_lens, FD_DTYPE_I32, 1, {BATCH}, {1}};
  args.out = (fd_tensor){w->out, FD_DTYPE_F32, 4, {BATCH, 1, Q_HEADS, HEAD_DIM}, {row, row, HEAD_DIM, 1}};
  return args;
}

static void *decode_worker(void *arg) {
  worker *w = arg;
  fd_options options;
  fd_options_init(&options, sizeof options);
  options.backend = FD_BACKEND_CPU; /* FD_BACKEND_CUDA: also cudaStreamCreate a stream of this worker's own */
  options.num_threads = 1;          /* CPU only: this handle's worker threads */
  fd_handle *handle = NULL;         /* this thread's handle: no other thread uses it */
  w->status = fd_create(&handle, &options);
  for (int step = 0; w->status == FD_SUCCESS && step < STEPS; ++step) {
    fill_step(w, step);
    const fd_decode_args args = worker_args(w);
    w->status = fd_decode(handle, &args, NULL); /* CUDA: the worker's stream */
    if (w->status == FD_SUCCESS) {
      char what[64];
      snprintf(what, sizeof what, "worker %d, step %d", w->index, step);
      w->failures += check_output(what, w->out, FD_DTYPE_F32, BATCH, w->seq_lens, w->seqs, Q_HEADS, KV_HEADS, HEAD_DIM);
    }
  }
  if (w->status != FD_SUCCESS) fd_last_error_message(w->message, sizeof w->message); /* this thread's error */
  fd_destroy(handle);
  return NULL;
}

int main(void) {
  static worker workers[WORKERS];
  pthread_t threads[WORKERS];
  for (int i = 0; i < WORKERS; ++i) {
    workers[i].index = i;
    if (pthread_create(&threads[i], NULL, decode_worker, &workers[i]) != 0) return 1;
  }
  int failures = 0;
  for (int i = 0; i < WORKERS; ++i) {
    pthread_join(threads[i], NULL);
    if (workers[i].status != FD_SUCCESS) fprintf(stderr, "worker %d: %s\n", i, workers[i].message);
    failures += workers[i].failures + (workers[i].status != FD_SUCCESS);
  }
  return failures == 0 ? 0 : 1;
}
