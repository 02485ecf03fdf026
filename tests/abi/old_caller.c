// SPDX-License-Identifier: Apache-2.0
/* A caller built against the 0.2 header (tests/abi/v0.2/flashdecode.h, the
 * header of 0.2 as released: smaller fd_options and fd_decode_args), run
 * against this library: options, a decode checked against a float64
 * reference, a plan description and an error all work as they did.
 * docs/abi.md promises this for every earlier minor of the same major. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flashdecode.h" /* the 0.2 header: this file's include path puts tests/abi/v0.2 first */

#if FD_VERSION_MAJOR != 0 || FD_VERSION_MINOR != 2
#error "built against the wrong header: this test must see the 0.2 header"
#endif

enum { B = 3, HQ = 4, HKV = 2, D = 16, N = 37 };

static int failures;

static void expect(int ok, const char *what) {
  if (!ok) {
    char message[256];
    fd_last_error_message(message, sizeof message);
    fprintf(stderr, "FAILED: %s (last error: %s)\n", what, message);
    ++failures;
  }
}

static fd_tensor tensor4(void *data, fd_dtype dtype, int64_t d0, int64_t d1, int64_t d2, int64_t d3) {
  fd_tensor t;
  memset(&t, 0, sizeof t);
  t.data = data;
  t.dtype = dtype;
  t.ndim = 4;
  t.shape[0] = d0;
  t.shape[1] = d1;
  t.shape[2] = d2;
  t.shape[3] = d3;
  t.strides[3] = 1;
  t.strides[2] = d3;
  t.strides[1] = d2 * d3;
  t.strides[0] = d1 * d2 * d3;
  return t;
}

int main(void) {
  const unsigned version = fd_version_number();
  printf("old caller (header %s) on library %s\n", FD_VERSION_STRING, fd_version_string());
  expect(version / 10000 == 0 && version / 100 % 100 >= 2, "a 0.x library of minor 2 or later");

  fd_options options;
  expect(fd_options_init(&options, sizeof options) >= sizeof options, "the library's fd_options is no smaller");
  options.backend = FD_BACKEND_CPU;
  options.num_threads = 2;
  fd_handle *handle = NULL;
  expect(fd_create(&handle, &options) == FD_SUCCESS, "fd_create with a 0.2 fd_options");
  if (handle == NULL) return 1;

  static float q[B * HQ * D], k[B * N * HKV * D], v[B * N * HKV * D], out[B * HQ * D], lse[B * HQ];
  static int32_t lens[B] = {N, 0, 20};
  unsigned state = 12345;
  float *inputs[3] = {q, k, v};
  const size_t sizes[3] = {B * HQ * D, B * N * HKV * D, B * N * HKV * D};
  for (int i = 0; i < 3; ++i)
    for (size_t j = 0; j < sizes[i]; ++j) {
      state = state * 1103515245u + 12345u;
      inputs[i][j] = (float)((state >> 8) % 2001) / 1000.0f - 1.0f;
    }
  memset(out, 0xff, sizeof out);

  fd_decode_args args;
  fd_decode_args_init(&args, sizeof args);
  args.q = tensor4(q, FD_DTYPE_F32, B, 1, HQ, D);
  args.k = tensor4(k, FD_DTYPE_F32, B, N, HKV, D);
  args.v = tensor4(v, FD_DTYPE_F32, B, N, HKV, D);
  args.out = tensor4(out, FD_DTYPE_F32, B, 1, HQ, D);
  args.lse.data = lse;
  args.lse.dtype = FD_DTYPE_F32;
  args.lse.ndim = 3;
  args.lse.shape[0] = B;
  args.lse.shape[1] = 1;
  args.lse.shape[2] = HQ;
  args.lse.strides[0] = HQ;
  args.lse.strides[1] = HQ;
  args.lse.strides[2] = 1;
  args.seq_lens.data = lens;
  args.seq_lens.dtype = FD_DTYPE_I32;
  args.seq_lens.ndim = 1;
  args.seq_lens.shape[0] = B;
  args.seq_lens.strides[0] = 1;
  args.num_splits = 3;
  expect(fd_decode(handle, &args, NULL) == FD_SUCCESS, "fd_decode with a 0.2 fd_decode_args");

  double worst = 0.0;
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < HQ; ++h) {
      const int g = h / (HQ / HKV);
      double m = -INFINITY, l = 0.0, acc[D] = {0};
      double scores[N];
      for (int t = 0; t < lens[b]; ++t) {
        double s = 0.0;
        for (int d = 0; d < D; ++d) s += (double)q[(b * HQ + h) * D + d] * k[((b * N + t) * HKV + g) * D + d];
        scores[t] = s / sqrt((double)D);
        if (scores[t] > m) m = scores[t];
      }
      for (int t = 0; t < lens[b]; ++t) {
        const double w = exp(scores[t] - m);
        l += w;
        for (int d = 0; d < D; ++d) acc[d] += w * v[((b * N + t) * HKV + g) * D + d];
      }
      for (int d = 0; d < D; ++d) {
        const double want = l > 0.0 ? acc[d] / l : 0.0;
        const double diff = fabs(out[(b * HQ + h) * D + d] - want);
        if (!(diff <= worst)) worst = diff; /* NaN (unwritten) makes worst NaN */
      }
      const double want_lse = l > 0.0 ? m + log(l) : -INFINITY;
      expect(lse[b * HQ + h] == (float)want_lse || fabs(lse[b * HQ + h] - want_lse) < 1e-5, "lse matches float64");
    }
  printf("largest |out - float64| = %.3g\n", worst);
  expect(worst < 1e-5, "out matches float64 within 1e-5");

  fd_plan_info info;
  fd_plan_info_init(&info, sizeof info);
  expect(fd_describe_plan(handle, &args, &info) == FD_SUCCESS, "fd_describe_plan with 0.2 structs");
  expect(info.num_splits == 3 && strcmp(info.kernel, "cpu") == 0, "the plan asked for");

  args.k.strides[3] = 2;
  expect(fd_decode(handle, &args, NULL) == FD_ERROR_INVALID_STRIDE, "a bad stride is still INVALID_STRIDE");
  expect(fd_destroy(handle) == FD_SUCCESS, "fd_destroy");
  if (failures == 0) printf("ok\n");
  return failures == 0 ? 0 : 1;
}
