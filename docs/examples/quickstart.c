// SPDX-License-Identifier: Apache-2.0
/* Quickstart: decode attention for 2 sequences on the CPU backend.
 * Build: cc quickstart.c $(pkg-config --cflags --libs flashdecode) */
#include <flashdecode.h>
#include <stdio.h>

enum { B = 2, HQ = 8, HKV = 2, N = 512, D = 64 };
static float q[B][HQ][D], k[B][N][HKV][D], v[B][N][HKV][D], out[B][HQ][D];

static fd_tensor bnhd(void *data, int64_t b, int64_t n, int64_t h, int64_t d) {
  fd_tensor t = {data, FD_DTYPE_F32, 4, {b, n, h, d}, {n * h * d, h * d, d, 1}};
  return t;
}

int main(void) {
  for (int i = 0; i < B * N * HKV * D; ++i) {
    (&k[0][0][0][0])[i] = (float)((i * 7919) % 1000) / 1000.0f - 0.5f;
    (&v[0][0][0][0])[i] = (float)((i * 104729LL) % 1000) / 1000.0f - 0.5f; /* 64-bit: i * 104729 overflows int */
  }
  for (int i = 0; i < B * HQ * D; ++i) (&q[0][0][0])[i] = (float)(i % 17) / 17.0f;

  fd_options options;
  fd_options_init(&options, sizeof options);
  options.backend = FD_BACKEND_CPU; /* FD_BACKEND_CUDA takes device pointers */
  fd_handle *handle = NULL;
  fd_status status = fd_create(&handle, &options);

  fd_decode_args args;
  fd_decode_args_init(&args, sizeof args);
  args.q = bnhd(q, B, 1, HQ, D);
  args.k = bnhd(k, B, N, HKV, D);
  args.v = bnhd(v, B, N, HKV, D);
  args.out = bnhd(out, B, 1, HQ, D);
  if (status == FD_SUCCESS) status = fd_decode(handle, &args, NULL);

  if (status != FD_SUCCESS) {
    char message[256];
    fd_last_error_message(message, sizeof message);
    fprintf(stderr, "flashdecode: %s\n", message);
  } else {
    printf("flashdecode %s: out[1][7][0] = %f\n", fd_version_string(), out[1][7][0]);
  }
  fd_destroy(handle);
  return status == FD_SUCCESS ? 0 : 1;
}
