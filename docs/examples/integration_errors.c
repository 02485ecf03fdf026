// SPDX-License-Identifier: Apache-2.0
/* Integration guide (docs/integration.md), troubleshooting: the mistakes an
 * integration makes most often, each made on purpose on a valid paged
 * decode, with the status and the message flashdecode returns. Checks each
 * status, and that a refused decode left its output untouched. Prints what
 * the guide shows (docs/integration.md must match this output; a pointer
 * in a message is printed as 0x...). Runs on the CPU backend. */
#include <flashdecode.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

enum { BATCH = 2, Q_HEADS = 4, KV_HEADS = 2, HEAD_DIM = 16, NUM_PAGES = 8, PAGE_SIZE = 16, MAX_PAGES = 4 };

static uint16_t q[BATCH * 2 * Q_HEADS * HEAD_DIM]; /* room for 2 query tokens */
static uint16_t k[NUM_PAGES * PAGE_SIZE * KV_HEADS * HEAD_DIM];
static uint16_t v[NUM_PAGES * PAGE_SIZE * KV_HEADS * HEAD_DIM];
static float out[BATCH * 2 * Q_HEADS * HEAD_DIM];
static int32_t block_table[BATCH][MAX_PAGES] = {{3, 6, 0, 0}, {1, 7, 2, 5}};
static int32_t seq_lens[BATCH] = {20, 64};
static unsigned char workspace_memory[1024 + 256]; /* 1024 bytes aligned to 256 inside */

static const char *status_name(fd_status status) {
  switch (status) {
    case FD_SUCCESS: return "FD_SUCCESS";
    case FD_ERROR_NULL_POINTER: return "FD_ERROR_NULL_POINTER";
    case FD_ERROR_INVALID_ARGUMENT: return "FD_ERROR_INVALID_ARGUMENT";
    case FD_ERROR_INVALID_DTYPE: return "FD_ERROR_INVALID_DTYPE";
    case FD_ERROR_INVALID_HEAD_DIM: return "FD_ERROR_INVALID_HEAD_DIM";
    case FD_ERROR_INVALID_HEAD_COUNT: return "FD_ERROR_INVALID_HEAD_COUNT";
    case FD_ERROR_INVALID_SHAPE: return "FD_ERROR_INVALID_SHAPE";
    case FD_ERROR_INVALID_STRIDE: return "FD_ERROR_INVALID_STRIDE";
    case FD_ERROR_INVALID_LENGTH: return "FD_ERROR_INVALID_LENGTH";
    case FD_ERROR_INVALID_BLOCK_TABLE: return "FD_ERROR_INVALID_BLOCK_TABLE";
    case FD_ERROR_INVALID_SPLITS: return "FD_ERROR_INVALID_SPLITS";
    case FD_ERROR_WORKSPACE_TOO_SMALL: return "FD_ERROR_WORKSPACE_TOO_SMALL";
    case FD_ERROR_INVALID_HANDLE: return "FD_ERROR_INVALID_HANDLE";
    case FD_ERROR_UNSUPPORTED: return "FD_ERROR_UNSUPPORTED";
    case FD_ERROR_NO_DEVICE: return "FD_ERROR_NO_DEVICE";
    case FD_ERROR_OUT_OF_MEMORY: return "FD_ERROR_OUT_OF_MEMORY";
    case FD_ERROR_CUDA: return "FD_ERROR_CUDA";
    case FD_ERROR_INTERNAL: return "FD_ERROR_INTERNAL";
  }
  return "unknown status";
}

/* A valid decode: bf16 page pool [pages, page_size, kv_heads, head_dim]. */
static fd_decode_args valid_args(void) {
  const int64_t row = Q_HEADS * HEAD_DIM, token = KV_HEADS * HEAD_DIM;
  fd_decode_args args;
  fd_decode_args_init(&args, sizeof args);
  args.q = (fd_tensor){q, FD_DTYPE_BF16, 4, {BATCH, 1, Q_HEADS, HEAD_DIM}, {row, row, HEAD_DIM, 1}};
  args.k = (fd_tensor){
      k, FD_DTYPE_BF16, 4, {NUM_PAGES, PAGE_SIZE, KV_HEADS, HEAD_DIM}, {PAGE_SIZE * token, token, HEAD_DIM, 1}};
  args.v = args.k;
  args.v.data = v;
  args.block_table = (fd_tensor){block_table, FD_DTYPE_I32, 2, {BATCH, MAX_PAGES}, {MAX_PAGES, 1}};
  args.seq_lens = (fd_tensor){seq_lens, FD_DTYPE_I32, 1, {BATCH}, {1}};
  args.out = (fd_tensor){out, FD_DTYPE_F32, 4, {BATCH, 1, Q_HEADS, HEAD_DIM}, {row, row, HEAD_DIM, 1}};
  return args;
}

/* Prints a case: what was done wrong, then the status and the calling
 * thread's message (fd_last_error_message), pointers as 0x... so that the
 * output is the same on every run. Returns 1 unless the status is the
 * expected one and out is untouched (still NaN). */
static int report(const char *mistake, fd_status status, fd_status expected) {
  char message[512], shown[512];
  fd_last_error_message(message, sizeof message);
  size_t n = 0;
  for (const char *c = message; *c != '\0' && n + 6 < sizeof shown; ++c) {
    if (c[0] == '0' && c[1] == 'x') {
      memcpy(shown + n, "0x...", 5);
      n += 5;
      for (c += 2; c[0] != '\0' && strchr("0123456789abcdef", c[0]) != NULL; ++c) {
      }
      --c;
    } else {
      shown[n++] = *c;
    }
  }
  shown[n] = '\0';
  printf("%s\n  %s: %s\n", mistake, status_name(status), shown);
  int untouched = 1;
  for (size_t i = 0; i < sizeof out / sizeof out[0]; ++i) untouched = untouched && isnan(out[i]);
  if (status != expected) fprintf(stderr, "expected %s, got %s\n", status_name(expected), status_name(status));
  if (!untouched) fprintf(stderr, "a refused call wrote to out\n");
  return status == expected && untouched ? 0 : 1;
}

int main(void) {
  for (size_t i = 0; i < sizeof out / sizeof out[0]; ++i) out[i] = NAN;
  fd_options options;
  fd_options_init(&options, sizeof options);
  options.backend = FD_BACKEND_CPU;
  options.num_threads = 2;
  options.checks = FD_CHECK_CONTENTS; /* lengths and page ids too, as while debugging an integration */
  fd_handle *handle = NULL;
  if (fd_create(&handle, &options) != FD_SUCCESS) return 1;
  int failures = 0;
  fd_decode_args args;

  args = valid_args();
  args.struct_size = 0; /* e.g. fd_decode_args args = {0}; */
  failures += report("fd_decode_args not initialised with fd_decode_args_init", fd_decode(handle, &args, NULL),
                     FD_ERROR_INVALID_ARGUMENT);

  args = valid_args();
  args.out.data = NULL;
  failures += report("out not set", fd_decode(handle, &args, NULL), FD_ERROR_NULL_POINTER);

  args = valid_args();
  for (int d = 0; d < 4; ++d) args.k.strides[d] *= 2; /* bf16: 2 bytes an element */
  failures += report("strides in bytes instead of elements", fd_decode(handle, &args, NULL), FD_ERROR_INVALID_STRIDE);

  args = valid_args();
  args.q = (fd_tensor){q, FD_DTYPE_BF16, 3, {BATCH, Q_HEADS, HEAD_DIM}, {Q_HEADS * HEAD_DIM, HEAD_DIM, 1}};
  failures += report("q as [batch, q_heads, head_dim], without its q_len dimension", fd_decode(handle, &args, NULL),
                     FD_ERROR_INVALID_SHAPE);

  args = valid_args();
  args.v.shape[1] = PAGE_SIZE / 2;
  failures += report("V described with another shape than K", fd_decode(handle, &args, NULL), FD_ERROR_INVALID_SHAPE);

  args = valid_args();
  args.k.shape[2] = args.v.shape[2] = 3;
  failures +=
      report("a cache of 3 KV heads under 4 query heads", fd_decode(handle, &args, NULL), FD_ERROR_INVALID_HEAD_COUNT);

  args = valid_args();
  args.out.dtype = FD_DTYPE_F16;
  failures += report("out in another 16-bit type than q", fd_decode(handle, &args, NULL), FD_ERROR_INVALID_DTYPE);

  args = valid_args();
  seq_lens[1] = MAX_PAGES * PAGE_SIZE + 1;
  failures += report("a sequence longer than its row of the block table covers", fd_decode(handle, &args, NULL),
                     FD_ERROR_INVALID_LENGTH);
  seq_lens[1] = 64;

  args = valid_args();
  block_table[0][1] = NUM_PAGES; /* e.g. a block id of another pool */
  failures +=
      report("a block table entry outside the page pool", fd_decode(handle, &args, NULL), FD_ERROR_INVALID_BLOCK_TABLE);
  block_table[0][1] = 6;

  args = valid_args();
  args.q.shape[1] = 2; /* out left at one token */
  args.q.strides[0] = 2 * Q_HEADS * HEAD_DIM;
  failures += report("two query tokens per sequence (speculative decoding), out shaped for one",
                     fd_decode(handle, &args, NULL), FD_ERROR_INVALID_SHAPE);

  args = valid_args();
  args.num_splits = 4;
  void *small_workspace = (void *)(((uintptr_t)workspace_memory + 255) & ~(uintptr_t)255);
  fd_set_workspace(handle, small_workspace, 1024);
  failures += report("a caller-provided workspace smaller than fd_workspace_size", fd_decode(handle, &args, NULL),
                     FD_ERROR_WORKSPACE_TOO_SMALL);
  fd_set_workspace(handle, NULL, 0); /* back to a library-owned workspace */

  const size_t needed = 0, reserved = 4096;
  failures += report("fd_reserve_workspace of a size that wrapped around",
                     fd_reserve_workspace(handle, needed - reserved), FD_ERROR_OUT_OF_MEMORY);

  fd_handle *destroyed = NULL;
  fd_create(&destroyed, &options);
  fd_destroy(destroyed);
  args = valid_args();
  failures += report("a handle used after fd_destroy", fd_decode(destroyed, &args, NULL), FD_ERROR_INVALID_HANDLE);

  args = valid_args();
  if (fd_decode(handle, &args, NULL) != FD_SUCCESS) ++failures; /* the valid decode still runs */
  fd_destroy(handle);
  return failures == 0 ? 0 : 1;
}
