/* flashdecode: the demo / benchmark program.
 *
 * Decodes a realistic Llama-3-8B-like shape (GQA 32/8, head_dim 128, fp16) on
 * the GPU when the library has a usable CUDA backend, else on the CPU backend;
 * checks the result against a float64 reference; prints time and effective
 * bandwidth (K and V bytes of real tokens, plus q and out, over the median
 * time of the timed runs).
 *
 *   flashdecode [--backend auto|cpu|cuda] [--batch B] [--q-heads H] [--kv-heads H]
 *               [--kv-len N] [--head-dim D] [--dtype f16|bf16|f32] [--splits S] [--iters I]
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fdt.h"
#include "flashdecode.h"

#ifdef FD_DEMO_WITH_CUDA
#include <cuda_runtime_api.h>

#include "fdt_cuda.h"
#endif

typedef struct demo_options {
  fd_backend backend;
  fdt_case c;
  int iters;
} demo_options;

static int usage(const char *argv0) {
  fprintf(stderr,
          "usage: %s [--backend auto|cpu|cuda] [--batch B] [--q-heads H] [--kv-heads H] [--kv-len N]\n"
          "          [--head-dim D] [--dtype f16|bf16|f32] [--splits S] [--iters I]\n",
          argv0);
  return 2;
}

static int parse(int argc, char **argv, demo_options *o) {
  memset(o, 0, sizeof *o);
  o->backend = FD_BACKEND_AUTO;
  o->c.batch = 4;
  o->c.q_heads = 32;
  o->c.kv_heads = 8;
  o->c.kv_len = 4096;
  o->c.head_dim = 128;
  o->c.dtype = o->c.out_dtype = FD_DTYPE_F16;
  o->c.layout = FDT_BNHD;
  o->c.with_lse = 1;
  o->c.seed = (uint64_t)time(NULL);
  o->iters = 20;
  for (int i = 1; i < argc; ++i) {
    const char *flag = argv[i];
    const char *value = i + 1 < argc ? argv[i + 1] : NULL;
    if (strcmp(flag, "--help") == 0 || strcmp(flag, "-h") == 0) return usage(argv[0]);
    if (value == NULL) return usage(argv[0]);
    ++i;
    if (strcmp(flag, "--backend") == 0) {
      if (strcmp(value, "auto") == 0) o->backend = FD_BACKEND_AUTO;
      else if (strcmp(value, "cpu") == 0) o->backend = FD_BACKEND_CPU;
      else if (strcmp(value, "cuda") == 0) o->backend = FD_BACKEND_CUDA;
      else return usage(argv[0]);
    } else if (strcmp(flag, "--dtype") == 0) {
      if (strcmp(value, "f16") == 0) o->c.dtype = FD_DTYPE_F16;
      else if (strcmp(value, "bf16") == 0) o->c.dtype = FD_DTYPE_BF16;
      else if (strcmp(value, "f32") == 0) o->c.dtype = FD_DTYPE_F32;
      else return usage(argv[0]);
      o->c.out_dtype = o->c.dtype;
    } else {
      char *end = NULL;
      const long long n = strtoll(value, &end, 10);
      if (end == value || *end != '\0' || n < 0) return usage(argv[0]);
      if (strcmp(flag, "--batch") == 0) o->c.batch = n;
      else if (strcmp(flag, "--q-heads") == 0) o->c.q_heads = n;
      else if (strcmp(flag, "--kv-heads") == 0) o->c.kv_heads = n;
      else if (strcmp(flag, "--kv-len") == 0) o->c.kv_len = n;
      else if (strcmp(flag, "--head-dim") == 0) o->c.head_dim = n;
      else if (strcmp(flag, "--splits") == 0) o->c.num_splits = (int32_t)n;
      else if (strcmp(flag, "--iters") == 0) o->iters = (int)(n > 0 ? n : 1);
      else return usage(argv[0]);
    }
  }
  return 0;
}

static double now_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int compare_doubles(const void *a, const void *b) {
  const double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static int fail_status(const char *what, fd_status status) {
  char message[512];
  fd_last_error_message(message, sizeof message);
  fprintf(stderr, "flashdecode: %s failed (%s): %s\n", what, fd_status_string(status), message);
  return 1;
}

#ifdef FD_DEMO_WITH_CUDA
/* Copies the problem to the device (same layout), decodes there, and copies
 * the outputs back for the check. Each timed run is one fd_decode between two
 * events on the legacy default stream. */
static int run_cuda(fd_handle *h, fdt_problem *p, int iters, double *times) {
  fdt_device_problem d;
  if (fdt_cuda_upload(p, &d) != 0) return 1;
  int rc = 1;
  cudaEvent_t start = NULL, stop = NULL;
  size_t bytes = 0;
  fd_status s = fd_workspace_size(h, &d.args, &bytes);
  if (s == FD_SUCCESS) s = fd_reserve_workspace(h, bytes);
  if (s != FD_SUCCESS) {
    fail_status("workspace", s);
    goto done;
  }
  if (cudaEventCreate(&start) != cudaSuccess || cudaEventCreate(&stop) != cudaSuccess) {
    fprintf(stderr, "flashdecode: cudaEventCreate failed\n");
    goto done;
  }
  for (int i = -2; i < iters; ++i) { /* two warm-up runs */
    cudaEventRecord(start, NULL);
    s = fd_decode(h, &d.args, NULL);
    if (s != FD_SUCCESS) {
      fail_status("fd_decode", s);
      goto done;
    }
    cudaEventRecord(stop, NULL);
    const cudaError_t err = cudaEventSynchronize(stop);
    if (err != cudaSuccess) {
      fprintf(stderr, "flashdecode: the decode failed on the device: %s\n", cudaGetErrorString(err));
      goto done;
    }
    float ms = 0.0f;
    cudaEventElapsedTime(&ms, start, stop);
    if (i >= 0) times[i] = ms * 1e-3;
  }
  rc = fdt_cuda_download(&d, p) == 0 ? 0 : 1;
done:
  if (start) cudaEventDestroy(start);
  if (stop) cudaEventDestroy(stop);
  fdt_cuda_free(&d);
  return rc;
}
#endif

static int run_cpu(fd_handle *h, fdt_problem *p, int iters, double *times) {
  for (int i = -1; i < iters; ++i) { /* one warm-up run */
    const double t0 = now_seconds();
    const fd_status s = fd_decode(h, &p->args, NULL);
    if (s != FD_SUCCESS) return fail_status("fd_decode", s);
    if (i >= 0) times[i] = now_seconds() - t0;
  }
  return 0;
}

int main(int argc, char **argv) {
  demo_options o;
  if (parse(argc, argv, &o) != 0) return 2;

  fd_options options;
  fd_options_init(&options);
  options.backend = o.backend;
  fd_handle *h = NULL;
  fd_status s = fd_create(&h, &options);
  if (s != FD_SUCCESS) return fail_status("fd_create", s);
  fd_backend backend = FD_BACKEND_CPU;
  fd_get_backend(h, &backend);

  char description[256];
  fdt_case_describe(&o.c, description, sizeof description);
  printf("flashdecode %s, %s backend\nproblem: %s\n", fd_version_string(), backend == FD_BACKEND_CUDA ? "CUDA" : "CPU",
         description);
  fdt_problem p;
  if (fdt_problem_make(&p, &o.c) != 0) {
    fprintf(stderr, "flashdecode: out of host memory for the problem\n");
    return 1;
  }
  double *times = calloc((size_t)o.iters, sizeof *times);
  int rc;
  if (backend == FD_BACKEND_CUDA) {
#ifdef FD_DEMO_WITH_CUDA
    rc = run_cuda(h, &p, o.iters, times);
#else
    fprintf(stderr, "flashdecode: this demo was built without CUDA\n");
    rc = 1;
#endif
  } else {
    rc = run_cpu(h, &p, o.iters, times);
  }
  if (rc != 0) return rc;

  char report[256];
  double out_error = 0.0, lse_error = 0.0;
  const int bad = fdt_check(&p, report, sizeof report, &out_error, &lse_error);
  qsort(times, (size_t)o.iters, sizeof *times, compare_doubles);
  const double median = times[o.iters / 2];
  const double kv_bytes = 2.0 * (double)(o.c.batch * o.c.kv_len * o.c.kv_heads * o.c.head_dim) *
                          (double)fdt_dtype_size(o.c.dtype);
  const double io_bytes = 2.0 * (double)(o.c.batch * o.c.q_heads * o.c.head_dim) * (double)fdt_dtype_size(o.c.dtype);
  printf("check against float64 reference: %s\n", report);
  printf("time: median %.3f ms over %d runs (min %.3f, max %.3f)\n", median * 1e3, o.iters, times[0] * 1e3,
         times[o.iters - 1] * 1e3);
  printf("effective bandwidth: %.1f GB/s (%.1f MiB of K/V)\n", (kv_bytes + io_bytes) / median * 1e-9,
         kv_bytes / (1024.0 * 1024.0));
  free(times);
  fdt_problem_free(&p);
  fd_destroy(h);
  return bad ? 1 : 0;
}
