// SPDX-License-Identifier: Apache-2.0
/* Integration guide (docs/integration.md), CUDA graphs: fd_decode captured
 * once per batch size and replayed while the sequences, their lengths and
 * their block tables change. What a graph holds are addresses and shapes:
 * the tensors live in buffers allocated once for the largest batch, a
 * replay reads whatever they hold by then, and a batch smaller than the
 * graph's is padded with sequences of length 0 (their rows come out zero).
 * The workspace is reserved before capturing, for the largest of the
 * captured shapes, since memory cannot be allocated during a capture.
 *
 * Needs a CUDA device and a libflashdecode built with CUDA; without them it
 * says so and exits 77, which CTest reports as skipped. */
#include <cuda_runtime_api.h>
#include <flashdecode.h>
#include <stdio.h>

#include "integration_reference.h"

enum {
  MAX_BATCH = 8,
  Q_HEADS = 8,
  KV_HEADS = 2,
  HEAD_DIM = 128,
  NUM_PAGES = 256,
  PAGE_SIZE = 16,
  MAX_PAGES = 16, /* block table columns: at most 256 tokens a sequence */
  GRAPHS = 4,
  STEPS = 3
};
static const int64_t graph_batch[GRAPHS] = {1, 2, 4, 8}; /* a graph for each of these batch sizes */

#define CHECK_CUDA(call)                                                                       \
  do {                                                                                         \
    const cudaError_t err_ = (call);                                                           \
    if (err_ != cudaSuccess) {                                                                 \
      fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(err_)); \
      return 1;                                                                                \
    }                                                                                          \
  } while (0)

/* Device buffers, allocated once for the largest batch; the graphs hold their addresses. */
typedef struct buffers {
  uint16_t *q, *k, *v, *out; /* bf16 */
  int32_t *seq_lens, *block_table;
} buffers;

/* Host copies of one step's inputs and output. */
static uint16_t host_q[MAX_BATCH * Q_HEADS * HEAD_DIM], host_out[MAX_BATCH * Q_HEADS * HEAD_DIM];
static uint16_t host_k[NUM_PAGES * PAGE_SIZE * KV_HEADS * HEAD_DIM],
    host_v[NUM_PAGES * PAGE_SIZE * KV_HEADS * HEAD_DIM];
static int32_t host_seq_lens[MAX_BATCH], host_block_table[MAX_BATCH * MAX_PAGES];
static int64_t host_seqs[MAX_BATCH];

/* The decode of the first `batch` rows of the buffers: same addresses for
 * every batch size, only the batch dimension differs. */
static fd_decode_args graph_args(const buffers *d, int64_t batch) {
  const int64_t row = Q_HEADS * HEAD_DIM, token = KV_HEADS * HEAD_DIM, page = PAGE_SIZE * token;
  fd_decode_args args;
  fd_decode_args_init(&args, sizeof args);
  args.q = (fd_tensor){d->q, FD_DTYPE_BF16, 4, {batch, 1, Q_HEADS, HEAD_DIM}, {row, row, HEAD_DIM, 1}};
  args.k = (fd_tensor){d->k, FD_DTYPE_BF16, 4, {NUM_PAGES, PAGE_SIZE, KV_HEADS, HEAD_DIM}, {page, token, HEAD_DIM, 1}};
  args.v = args.k;
  args.v.data = d->v;
  args.block_table = (fd_tensor){d->block_table, FD_DTYPE_I32, 2, {batch, MAX_PAGES}, {MAX_PAGES, 1}};
  args.seq_lens = (fd_tensor){d->seq_lens, FD_DTYPE_I32, 1, {batch}, {1}};
  args.out = (fd_tensor){d->out, FD_DTYPE_BF16, 4, {batch, 1, Q_HEADS, HEAD_DIM}, {row, row, HEAD_DIM, 1}};
  return args;
}

/* Step `step`'s batch of `real` sequences, padded to `batch` rows with
 * empty ones: new sequences, new lengths, pages handed out anew. */
static void fill_step(int step, int64_t real, int64_t batch) {
  fill_bf16_nan(host_k, sizeof host_k / sizeof host_k[0]);
  fill_bf16_nan(host_v, sizeof host_v / sizeof host_v[0]);
  int64_t handed_out = 0;
  for (int64_t b = 0; b < batch; ++b) {
    host_seqs[b] = step * 100 + b;
    host_seq_lens[b] = b < real ? (int32_t)(1 + (b * 97 + step * 31) % (MAX_PAGES * PAGE_SIZE)) : 0;
    for (int64_t j = 0; j < MAX_PAGES; ++j) {
      const int used = j * PAGE_SIZE < host_seq_lens[b];
      host_block_table[b * MAX_PAGES + j] = used ? (int32_t)((handed_out++ * 101 + step * 17) % NUM_PAGES) : 0;
    }
    for (int64_t t = 0; t < host_seq_lens[b]; ++t) {
      const int64_t page = host_block_table[b * MAX_PAGES + t / PAGE_SIZE], slot = t % PAGE_SIZE;
      for (int64_t i = 0; i < KV_HEADS * HEAD_DIM; ++i) {
        const int64_t at = (page * PAGE_SIZE + slot) * KV_HEADS * HEAD_DIM + i;
        host_k[at] = to_bf16(test_value(VALUE_K, host_seqs[b], t, i / HEAD_DIM, i % HEAD_DIM));
        host_v[at] = to_bf16(test_value(VALUE_V, host_seqs[b], t, i / HEAD_DIM, i % HEAD_DIM));
      }
    }
    for (int64_t i = 0; i < Q_HEADS * HEAD_DIM; ++i)
      host_q[b * Q_HEADS * HEAD_DIM + i] = to_bf16(test_value(VALUE_Q, host_seqs[b], 0, i / HEAD_DIM, i % HEAD_DIM));
  }
}

int main(void) {
  fd_options options;
  fd_options_init(&options, sizeof options);
  options.backend = FD_BACKEND_CUDA;
  options.device = 0;
  fd_handle *handle = NULL;
  fd_status status = fd_create(&handle, &options);
  if (status == FD_ERROR_NO_DEVICE) {
    char message[256];
    fd_last_error_message(message, sizeof message);
    printf("skipped, no CUDA device for flashdecode: %s\n", message);
    return 77;
  }
  if (status != FD_SUCCESS) return report_failure("fd_create", status);
  CHECK_CUDA(cudaSetDevice(options.device));
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  buffers d;
  CHECK_CUDA(cudaMalloc((void **)&d.q, sizeof host_q));
  CHECK_CUDA(cudaMalloc((void **)&d.k, sizeof host_k));
  CHECK_CUDA(cudaMalloc((void **)&d.v, sizeof host_v));
  CHECK_CUDA(cudaMalloc((void **)&d.out, sizeof host_out));
  CHECK_CUDA(cudaMalloc((void **)&d.seq_lens, sizeof host_seq_lens));
  CHECK_CUDA(cudaMalloc((void **)&d.block_table, sizeof host_block_table));

  /* Workspace for the largest of the shapes that will be captured (the
   * automatic split count depends on the batch, so the largest batch does
   * not always need the most), reserved before any capture. */
  size_t workspace = 0;
  for (int g = 0; g < GRAPHS; ++g) {
    const fd_decode_args args = graph_args(&d, graph_batch[g]);
    size_t bytes = 0;
    status = fd_workspace_size(handle, &args, &bytes);
    if (status != FD_SUCCESS) return report_failure("fd_workspace_size", status);
    workspace = bytes > workspace ? bytes : workspace;
  }
  status = fd_reserve_workspace(handle, workspace);
  if (status != FD_SUCCESS) return report_failure("fd_reserve_workspace", status);

  /* One graph per batch size. The capture records fd_decode's launches with
   * the buffers' addresses; nothing is read from them yet. */
  cudaGraph_t graphs[GRAPHS];
  cudaGraphExec_t execs[GRAPHS];
  for (int g = 0; g < GRAPHS; ++g) {
    const fd_decode_args args = graph_args(&d, graph_batch[g]);
    CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
    status = fd_decode(handle, &args, (fd_cuda_stream)stream);
    CHECK_CUDA(cudaStreamEndCapture(stream, &graphs[g])); /* end the capture whatever fd_decode said */
    if (status != FD_SUCCESS) return report_failure("fd_decode during capture", status);
    CHECK_CUDA(cudaGraphInstantiateWithFlags(&execs[g], graphs[g], 0));
  }

  /* Each step: the engine writes the step's K/V, lengths, block table and
   * queries into the same buffers, then replays the smallest graph that
   * holds the batch. */
  const int64_t real_batch[STEPS] = {1, 3, 8};
  int failures = 0;
  for (int step = 0; step < STEPS; ++step) {
    int g = 0;
    while (graph_batch[g] < real_batch[step]) ++g;
    const int64_t batch = graph_batch[g];
    fill_step(step, real_batch[step], batch);
    CHECK_CUDA(cudaMemcpyAsync(d.k, host_k, sizeof host_k, cudaMemcpyHostToDevice, stream));
    CHECK_CUDA(cudaMemcpyAsync(d.v, host_v, sizeof host_v, cudaMemcpyHostToDevice, stream));
    CHECK_CUDA(cudaMemcpyAsync(d.q, host_q, sizeof host_q, cudaMemcpyHostToDevice, stream));
    CHECK_CUDA(cudaMemcpyAsync(d.seq_lens, host_seq_lens, sizeof host_seq_lens, cudaMemcpyHostToDevice, stream));
    CHECK_CUDA(
        cudaMemcpyAsync(d.block_table, host_block_table, sizeof host_block_table, cudaMemcpyHostToDevice, stream));
    CHECK_CUDA(cudaMemsetAsync(d.out, 0xff, sizeof host_out, stream)); /* NaN: a row left unwritten fails */
    CHECK_CUDA(cudaGraphLaunch(execs[g], stream));
    CHECK_CUDA(cudaMemcpyAsync(host_out, d.out, sizeof host_out, cudaMemcpyDeviceToHost, stream));
    CHECK_CUDA(cudaStreamSynchronize(stream));
    char what[96];
    snprintf(what, sizeof what, "step %d: %lld sequences through the graph of batch %lld", step,
             (long long)real_batch[step], (long long)batch);
    failures +=
        check_output(what, host_out, FD_DTYPE_BF16, batch, host_seq_lens, host_seqs, Q_HEADS, KV_HEADS, HEAD_DIM);
  }

  for (int g = 0; g < GRAPHS; ++g) {
    CHECK_CUDA(cudaGraphExecDestroy(execs[g]));
    CHECK_CUDA(cudaGraphDestroy(graphs[g]));
  }
  CHECK_CUDA(cudaStreamSynchronize(stream));
  fd_destroy(handle); /* after the last replay has finished: the graphs used its workspace */
  CHECK_CUDA(cudaFree(d.q));
  CHECK_CUDA(cudaFree(d.k));
  CHECK_CUDA(cudaFree(d.v));
  CHECK_CUDA(cudaFree(d.out));
  CHECK_CUDA(cudaFree(d.seq_lens));
  CHECK_CUDA(cudaFree(d.block_table));
  CHECK_CUDA(cudaStreamDestroy(stream));
  return failures == 0 ? 0 : 1;
}
