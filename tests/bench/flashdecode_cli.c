// SPDX-License-Identifier: Apache-2.0
/* flashdecode: the demo / benchmark program (installed as bin/flashdecode).
 *
 * Decodes a realistic Llama-3-8B-like shape (GQA 32/8, head_dim 128, fp16) on
 * the GPU when the library has a usable CUDA backend, else on the CPU backend
 * (saying why not the GPU); checks the result against a float64 reference;
 * prints time and effective bandwidth (K and V bytes of real tokens, plus q
 * and out, over the median time of the timed runs).
 *
 *   flashdecode [--backend auto|cpu|cuda] [--threads T] [--batch B] [--q-heads H] [--kv-heads H]
 *               [--kv-len N] [--head-dim D] [--dtype f16|bf16|f32] [--splits S] [--iters I]
 *               [--q-len N] [--mask causal|none] [--window W] [--softcap C] [--alibi] [--sinks]
 *
 * Benchmark mode: shapes from an argument or a file, each as
 * BATCHxQHEADS/KVHEADSxKVLENxHEADDIM (dense BNHD cache, every sequence full),
 * on the backend --backend selects:
 *
 *   flashdecode --bench 1x32/8x32768x128,32x32/8x2048x128 [--backend auto|cpu|cuda] [--dtype f16|bf16|f32]
 *               [--bench-file shapes.txt] [--rotate-mib 1024] [--iters I] [--threads T] [--json out.json]
 *               [the attention variants above]
 *
 * The attention variants (flashdecode.h, "Attention variants") apply to both
 * modes: query tokens per sequence, the mask, a sliding window, a logit
 * softcap, and ALiBi slopes and sink logits (random values: their cost does
 * not depend on them). Bandwidth then counts the K/V of the keys a window
 * leaves to read, and q and out of every query token.
 *
 * CUDA: for each shape it allocates as many K/V sets as make --rotate-mib (at
 * least two), so that the timed reads come from memory, not from L2; times I
 * launches one by one with CUDA events (rotating the sets) and I replays of a
 * CUDA graph that decodes every set once; and reports medians, spread, the
 * host time of one fd_decode call (validation, plan lookup, kernel launch)
 * after the GPU went idle, the host and GPU time per call of I calls issued
 * back to back (what an eager decode loop pays: its host cost, and the GPU
 * time including the gaps between launches), the effective bandwidth over the
 * bytes that must move (K and V once, q, out) and
 * its share of the device-to-device copy rate it measures first (bytes read +
 * written: a memory ceiling that needs no kernel of its own).
 * CPU: one K/V set per shape (refused if it needs more than half of the
 * machine's memory); I timed calls after one warm-up, median and spread, and
 * the effective bandwidth. A table goes to stdout, JSON to --json; progress
 * of runs longer than --progress seconds (default 1) goes to stderr.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "fdt.h"
#include "flashdecode.h"

#ifdef FD_DEMO_WITH_CUDA
#include <cuda_runtime_api.h>

#include "fdt_cuda.h"
#endif

typedef struct demo_options {
  fd_backend backend;
  int threads; /* CPU backend worker threads; 0 = every core */
  fdt_case c;
  int iters;
  const char *bench;      /* comma-separated shapes, or NULL */
  const char *bench_file; /* one shape a line, '#' comments, or NULL */
  const char *json;       /* benchmark JSON output, or NULL */
  long long rotate_mib;
  long long progress_seconds; /* report progress of long runs every this many seconds */
} demo_options;

static void print_usage(FILE *out, const char *argv0) {
  fprintf(out,
          "usage: %s [--backend auto|cpu|cuda] [--threads T] [--batch B] [--q-heads H] [--kv-heads H]\n"
          "          [--kv-len N] [--head-dim D] [--dtype f16|bf16|f32] [--splits S] [--iters I]\n"
          "          [--progress P] [VARIANTS]\n"
          "       %s --bench BxHQ/HKVxNxD[,...] | --bench-file FILE [--backend auto|cpu|cuda] [--threads T]\n"
          "          [--dtype f16|bf16|f32] [--rotate-mib M] [--iters I] [--progress P] [--json FILE] [VARIANTS]\n"
          "       %s --help | --version\n"
          "VARIANTS: [--q-len N] [--mask causal|none] [--window W] [--softcap C] [--alibi] [--sinks]\n"
          "\n"
          "Without --bench: decodes one problem (default 4 sequences, 32 query heads over 8 KV heads,\n"
          "4096 tokens, head_dim 128, f16) on the GPU if the library can use one, else on the CPU,\n"
          "checks it against a float64 reference and prints the time and effective bandwidth.\n"
          "With --bench: times each shape (batch x query heads / KV heads x KV length x head_dim,\n"
          "dense cache) on the selected backend; a table to stdout, JSON to --json.\n"
          "\n"
          "  --backend     auto (default: CUDA if usable, else the CPU), cpu or cuda\n"
          "  --threads     CPU backend worker threads (default 0: every core)\n"
          "  --batch, --q-heads, --kv-heads, --kv-len, --head-dim   the problem's shape\n"
          "  --dtype       q, k, v and out element type (default f16)\n"
          "  --splits      KV splits (default 0: the planner chooses)\n"
          "  --iters       timed runs (default 20)\n"
          "  --rotate-mib  CUDA benchmark: K/V sets of at least this many MiB in all (default 1024)\n"
          "  --progress    report progress on stderr every P seconds of a long run (default 1;\n"
          "                0: at every step)\n"
          "Attention variants, in both modes:\n"
          "  --q-len       query tokens per sequence, 1 to %d (default 1)\n"
          "  --mask        causal (default: each query token sees the keys up to its own position)\n"
          "                or none (every query token sees every key)\n"
          "  --window      a sliding window of W keys behind each query token (default 0: none)\n"
          "  --softcap     cap scores to C * tanh(score / C) (default 0: none)\n"
          "  --alibi       ALiBi position biases, with random slopes\n"
          "  --sinks       attention sinks, with random logits\n"
          "Exit status: 0 ok, 1 a failure, 2 bad usage.\n",
          argv0, argv0, argv0, FD_MAX_Q_LEN);
}

/* Names what is wrong with the command line; exit status 2. */
static int bad_usage(const char *argv0, const char *format, ...) {
  va_list ap;
  va_start(ap, format);
  fprintf(stderr, "flashdecode: ");
  vfprintf(stderr, format, ap);
  va_end(ap);
  fprintf(stderr, "\nRun '%s --help' for the options.\n", argv0);
  return 2;
}

enum { PARSE_RUN = 0, PARSE_EXIT_OK = 1 }; /* or 2: bad usage */

static const char *const value_flags[] = {"--backend", "--threads",    "--batch",      "--q-heads", "--kv-heads",
                                          "--kv-len",  "--head-dim",   "--dtype",      "--splits",  "--iters",
                                          "--bench",   "--bench-file", "--rotate-mib", "--json",    "--progress",
                                          "--q-len",   "--mask",       "--window",     "--softcap"};

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
  o->rotate_mib = 1024;
  o->progress_seconds = 1;
  for (int i = 1; i < argc; ++i) {
    const char *flag = argv[i];
    if (strcmp(flag, "--help") == 0 || strcmp(flag, "-h") == 0) {
      print_usage(stdout, argv[0]);
      return PARSE_EXIT_OK;
    }
    if (strcmp(flag, "--version") == 0) {
      printf("flashdecode %s (header %s)\n", fd_version_string(), FD_VERSION_STRING);
      return PARSE_EXIT_OK;
    }
    /* The options without a value. */
    if (strcmp(flag, "--alibi") == 0) {
      o->c.alibi = 2; /* random slopes in [0.01, 1] */
      continue;
    }
    if (strcmp(flag, "--sinks") == 0) {
      o->c.sinks = 1;
      continue;
    }
    int known = 0;
    for (size_t f = 0; f < sizeof value_flags / sizeof value_flags[0]; ++f) known |= strcmp(flag, value_flags[f]) == 0;
    if (!known) {
      return flag[0] == '-' ? bad_usage(argv[0], "unknown option '%s'", flag)
                            : bad_usage(argv[0], "unexpected argument '%s'", flag);
    }
    if (i + 1 >= argc) return bad_usage(argv[0], "option '%s' needs a value", flag);
    const char *value = argv[++i];
    if (strcmp(flag, "--bench") == 0) {
      o->bench = value;
    } else if (strcmp(flag, "--bench-file") == 0) {
      o->bench_file = value;
    } else if (strcmp(flag, "--json") == 0) {
      o->json = value;
    } else if (strcmp(flag, "--backend") == 0) {
      if (strcmp(value, "auto") == 0) o->backend = FD_BACKEND_AUTO;
      else if (strcmp(value, "cpu") == 0) o->backend = FD_BACKEND_CPU;
      else if (strcmp(value, "cuda") == 0) o->backend = FD_BACKEND_CUDA;
      else return bad_usage(argv[0], "--backend must be auto, cpu or cuda, not '%s'", value);
    } else if (strcmp(flag, "--dtype") == 0) {
      if (strcmp(value, "f16") == 0) o->c.dtype = FD_DTYPE_F16;
      else if (strcmp(value, "bf16") == 0) o->c.dtype = FD_DTYPE_BF16;
      else if (strcmp(value, "f32") == 0) o->c.dtype = FD_DTYPE_F32;
      else return bad_usage(argv[0], "--dtype must be f16, bf16 or f32, not '%s'", value);
      o->c.out_dtype = o->c.dtype;
    } else if (strcmp(flag, "--mask") == 0) {
      if (strcmp(value, "causal") == 0) o->c.mask = FD_MASK_CAUSAL;
      else if (strcmp(value, "none") == 0) o->c.mask = FD_MASK_NONE;
      else return bad_usage(argv[0], "--mask must be causal or none, not '%s'", value);
    } else if (strcmp(flag, "--softcap") == 0) {
      char *end = NULL;
      const double c = strtod(value, &end);
      if (end == value || *end != '\0' || !(c >= 0.0) || !isfinite((float)c)) {
        return bad_usage(argv[0], "--softcap takes a finite non-negative number, not '%s'", value);
      }
      o->c.softcap = c;
    } else {
      char *end = NULL;
      const long long n = strtoll(value, &end, 10);
      if (end == value || *end != '\0' || n < 0) {
        return bad_usage(argv[0], "%s takes a non-negative integer, not '%s'", flag, value);
      }
      if (strcmp(flag, "--batch") == 0) o->c.batch = n;
      else if (strcmp(flag, "--q-heads") == 0) o->c.q_heads = n;
      else if (strcmp(flag, "--kv-heads") == 0) o->c.kv_heads = n;
      else if (strcmp(flag, "--kv-len") == 0) o->c.kv_len = n;
      else if (strcmp(flag, "--head-dim") == 0) o->c.head_dim = n;
      else if (strcmp(flag, "--splits") == 0) o->c.num_splits = (int32_t)n;
      else if (strcmp(flag, "--threads") == 0) o->threads = (int)(n < 1 << 20 ? n : 1 << 20);
      else if (strcmp(flag, "--iters") == 0) o->iters = (int)(n < 1 ? 1 : n < 1000000 ? n : 1000000);
      else if (strcmp(flag, "--progress") == 0) o->progress_seconds = n;
      else if (strcmp(flag, "--window") == 0) o->c.window = n;
      else if (strcmp(flag, "--q-len") == 0) {
        if (n < 1 || n > FD_MAX_Q_LEN)
          return bad_usage(argv[0], "--q-len must be 1 to %d, not '%s'", FD_MAX_Q_LEN, value);
        o->c.q_len = n;
      } else o->rotate_mib = n > 0 ? n : 1; /* --rotate-mib */
    }
  }
  return PARSE_RUN;
}

static double now_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---- progress of long runs, on stderr ---------------------------------------
 * Silent for the first interval (--progress, default a second); then at most
 * one line an interval (rewritten in place on a terminal). */
static double progress_interval = 1.0;

typedef struct progress {
  double start, last;
  int shown; /* a line is on a terminal and needs clearing */
} progress;

static void progress_start(progress *p) {
  p->start = p->last = now_seconds();
  p->shown = 0;
}

static void progress_note(progress *p, const char *format, ...) {
  const double now = now_seconds();
  if (now - p->last < progress_interval) return;
  p->last = now;
  const int tty = isatty(fileno(stderr));
  char text[200];
  va_list ap;
  va_start(ap, format);
  vsnprintf(text, sizeof text, format, ap);
  va_end(ap);
  fprintf(stderr, tty ? "\rflashdecode: %s, %.0f s\033[K" : "flashdecode: %s, %.0f s\n", text, now - p->start);
  fflush(stderr);
  p->shown = tty;
}

static void progress_end(progress *p) {
  if (p->shown) fprintf(stderr, "\r\033[K");
  p->shown = 0;
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

/* What fd_decode runs for args on h, as "KERNEL SPLITSxTOKENS MERGE" (e.g.
 * "tensor-core-wide-128 16x2048 fused"), from fd_describe_plan. */
static void describe_plan(const fd_handle *h, const fd_decode_args *args, char *text, size_t size) {
  static const char *const merges[] = {"direct", "separate", "fused", "cluster"};
  fd_plan_info info;
  fd_plan_info_init(&info, sizeof info);
  if (fd_describe_plan(h, args, &info) != FD_SUCCESS) {
    snprintf(text, size, "?");
    return;
  }
  const char *merge = (unsigned)info.merge < 4 ? merges[info.merge] : "?";
  snprintf(text, size, "%s %dx%lld %s", info.kernel, (int)info.num_splits, (long long)info.split_tokens, merge);
}

/* A handle on the requested backend. For auto it asks for CUDA first and,
 * as FD_BACKEND_AUTO does, takes the CPU when the library says there is no
 * usable device (FD_ERROR_NO_DEVICE), keeping the library's message in
 * `why_cpu`; any other failure is reported as fd_create reported it. */
static int open_handle(const demo_options *o, fd_handle **h, fd_backend *backend, char *why_cpu, size_t why_size) {
  fd_options options;
  fd_options_init(&options, sizeof options);
  options.num_threads = o->threads;
  why_cpu[0] = '\0';
  *h = NULL;
  fd_status s;
  if (o->backend != FD_BACKEND_CPU) {
    options.backend = FD_BACKEND_CUDA;
    s = fd_create(h, &options);
    if (s == FD_SUCCESS) {
#ifdef FD_DEMO_WITH_CUDA
      *backend = FD_BACKEND_CUDA;
      return 0;
#else
      fd_destroy(*h);
      *h = NULL;
      if (o->backend == FD_BACKEND_CUDA) {
        fprintf(stderr, "flashdecode: this flashdecode program was built without CUDA\n");
        return 1;
      }
      snprintf(why_cpu, why_size, "this flashdecode program was built without CUDA");
#endif
    } else if (o->backend == FD_BACKEND_CUDA || s != FD_ERROR_NO_DEVICE) {
      return fail_status("fd_create (CUDA)", s);
    } else {
      fd_last_error_message(why_cpu, why_size);
    }
  }
  options.backend = FD_BACKEND_CPU;
  s = fd_create(h, &options);
  if (s != FD_SUCCESS) return fail_status("fd_create", s);
  *backend = FD_BACKEND_CPU;
  return 0;
}

/* "CPU backend" or "CUDA backend", and why not CUDA when auto took the CPU. */
static void print_backend(fd_backend backend, const char *why_cpu) {
  printf("flashdecode %s, %s backend\n", fd_version_string(), backend == FD_BACKEND_CUDA ? "CUDA" : "CPU");
  if (backend == FD_BACKEND_CPU && why_cpu[0] != '\0') printf("why not CUDA: %s\n", why_cpu);
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
  char plan[160];
  describe_plan(h, &d.args, plan, sizeof plan);
  printf("plan: %s\n", plan);
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
  char plan[160];
  describe_plan(h, &p->args, plan, sizeof plan);
  printf("plan: %s\n", plan);
  progress bar;
  progress_start(&bar);
  for (int i = -1; i < iters; ++i) { /* one warm-up run */
    const double t0 = now_seconds();
    const fd_status s = fd_decode(h, &p->args, NULL);
    if (s != FD_SUCCESS) return fail_status("fd_decode", s);
    if (i >= 0) times[i] = now_seconds() - t0;
    progress_note(&bar, "run %d of %d", i + 2, iters + 1);
  }
  progress_end(&bar);
  return 0;
}

/* ---- benchmark mode ---------------------------------------------------------- */
typedef struct bench_shape {
  long long batch, q_heads, kv_heads, kv_len, head_dim;
} bench_shape;

static int parse_shape(const char *text, bench_shape *s) {
  char tail = 0;
  const int n = sscanf(text, " %lldx%lld/%lldx%lldx%lld %c", &s->batch, &s->q_heads, &s->kv_heads, &s->kv_len,
                       &s->head_dim, &tail);
  return n == 5 && s->batch > 0 && s->q_heads > 0 && s->kv_heads > 0 && s->kv_len > 0 && s->head_dim > 0 ? 0 : -1;
}

/* Shapes from a comma-separated list and/or a file (one a line, '#' starts a comment). */
static int collect_shapes(const demo_options *o, bench_shape **shapes, int *count) {
  int capacity = 16, n = 0;
  bench_shape *list = malloc((size_t)capacity * sizeof *list);
  if (list == NULL) return -1;
  char line[256];
  const char *sources[2] = {o->bench, NULL};
  FILE *file = NULL;
  if (o->bench_file != NULL) {
    file = fopen(o->bench_file, "r");
    if (file == NULL) {
      fprintf(stderr, "flashdecode: cannot open %s\n", o->bench_file);
      free(list);
      return -1;
    }
  }
  for (int src = 0; src < 2; ++src) {
    const char *text = sources[src];
    while (1) {
      if (src == 0) {
        if (text == NULL || *text == '\0') break;
        const char *comma = strchr(text, ',');
        const size_t len = comma ? (size_t)(comma - text) : strlen(text);
        if (len >= sizeof line) {
          fprintf(stderr, "flashdecode: shape too long: '%.*s'\n", (int)len, text);
          free(list);
          return -1;
        }
        memcpy(line, text, len);
        line[len] = '\0';
        text = comma ? comma + 1 : text + len;
      } else {
        if (file == NULL || fgets(line, sizeof line, file) == NULL) break;
        char *hash = strchr(line, '#');
        if (hash) *hash = '\0';
        if (strspn(line, " \t\r\n") == strlen(line)) continue;
      }
      if (n == capacity) {
        capacity *= 2;
        bench_shape *grown = realloc(list, (size_t)capacity * sizeof *list);
        if (grown == NULL) {
          if (file) fclose(file);
          free(list);
          return -1;
        }
        list = grown;
      }
      if (parse_shape(line, &list[n]) != 0) {
        fprintf(stderr, "flashdecode: bad shape '%s' (want BATCHxQHEADS/KVHEADSxKVLENxHEADDIM)\n", line);
        if (file) fclose(file);
        free(list);
        return -1;
      }
      ++n;
    }
  }
  if (file) fclose(file);
  *shapes = list;
  *count = n;
  return 0;
}

/* Random finite values in +-[0.125, 0.5) as raw bits of the dtype. */
static void fill_random(fd_dtype dtype, void *dst, size_t elements, uint64_t seed) {
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (size_t i = 0; i < elements; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    const uint32_t r = (uint32_t)(x >> 16);
    if (dtype == FD_DTYPE_F32) {
      ((uint32_t *)dst)[i] = ((r & 1u) << 31) | ((124u + ((r >> 1) & 1u)) << 23) | ((r >> 2) & 0x7FFFFFu);
    } else if (dtype == FD_DTYPE_F16) {
      ((uint16_t *)dst)[i] = (uint16_t)(((r & 1u) << 15) | ((12u + ((r >> 1) & 1u)) << 10) | ((r >> 2) & 0x3FFu));
    } else {
      ((uint16_t *)dst)[i] = (uint16_t)(((r & 1u) << 15) | ((124u + ((r >> 1) & 1u)) << 7) | ((r >> 2) & 0x7Fu));
    }
  }
}

static fd_tensor dense_tensor(void *data, fd_dtype dtype, int64_t d0, int64_t d1, int64_t d2, int64_t d3) {
  fd_tensor t;
  memset(&t, 0, sizeof t);
  t.data = data;
  t.dtype = dtype;
  t.ndim = 4;
  const int64_t shape[4] = {d0, d1, d2, d3};
  int64_t stride = 1;
  for (int i = 3; i >= 0; --i) {
    t.shape[i] = shape[i];
    t.strides[i] = stride;
    stride *= shape[i];
  }
  return t;
}

/* K/V tokens a decode reads of a sequence of n: all of them, or under a
 * window the window's and the query tokens' when those are fewer. */
static long long keys_read(const fdt_case *c, long long n) {
  const long long span = c->window + fdt_q_len(c) - 1;
  return c->window > 0 && span < n ? span : n;
}

/* Random ALiBi slopes in [0.01, 1] at per_head[0, q_heads) and sink
 * logits in [-1, 5] at [q_heads, 2 q_heads): the values do not change what a
 * decode costs. */
static void fill_per_head(float *per_head, long long q_heads) {
  fdt_rng rng = {42};
  for (long long h = 0; h < q_heads; ++h) per_head[h] = (float)fdt_uniform(&rng, 0.01, 1.0);
  for (long long h = 0; h < q_heads; ++h) per_head[q_heads + h] = (float)fdt_uniform(&rng, -1.0, 5.0);
}

/* c's variants into args; per_head (in the memory of args' other tensors,
 * filled by fill_per_head) holds the slopes, then the sinks. */
static void set_variants(const fdt_case *c, fd_decode_args *args, float *per_head, long long q_heads) {
  args->mask = c->mask;
  args->window_left = c->window;
  args->logit_softcap = (float)c->softcap;
  const int64_t shape[1] = {q_heads}, strides[1] = {1};
  if (c->alibi) args->alibi_slopes = fdt_tensor(per_head, FD_DTYPE_F32, 1, shape, strides);
  if (c->sinks) args->sinks = fdt_tensor(per_head + q_heads, FD_DTYPE_F32, 1, shape, strides);
}

/* The variants that are on, as ", q_len 4, mask none, window 128, softcap
 * 30, alibi, sinks"; "" for plain decode. */
static void describe_variants(const fdt_case *c, char *text, size_t size) {
  char window[32] = "", softcap[32] = "", q_len[32] = "";
  if (fdt_q_len(c) > 1) snprintf(q_len, sizeof q_len, ", q_len %lld", (long long)fdt_q_len(c));
  if (c->window > 0) snprintf(window, sizeof window, ", window %lld", (long long)c->window);
  if (c->softcap > 0.0) snprintf(softcap, sizeof softcap, ", softcap %g", c->softcap);
  snprintf(text, size, "%s%s%s%s%s%s", q_len, c->mask == FD_MASK_NONE ? ", mask none" : "", window, softcap,
           c->alibi ? ", alibi" : "", c->sinks ? ", sinks" : "");
}

/* The variants as a JSON object, for the benchmark's output. */
static void json_variants(FILE *json, const fdt_case *c) {
  fprintf(json,
          "\"variants\": {\"q_len\": %lld, \"mask\": \"%s\", \"window\": %lld, \"softcap\": %g, \"alibi\": %s, "
          "\"sinks\": %s}",
          (long long)fdt_q_len(c), c->mask == FD_MASK_NONE ? "none" : "causal", (long long)c->window, c->softcap,
          c->alibi ? "true" : "false", c->sinks ? "true" : "false");
}

static double median_of(double *values, int n) {
  qsort(values, (size_t)n, sizeof *values, compare_doubles);
  return values[n / 2];
}

static const char *dtype_name(fd_dtype dtype) {
  return dtype == FD_DTYPE_F16 ? "f16" : dtype == FD_DTYPE_BF16 ? "bf16" : "f32";
}

static void shape_label(const bench_shape *sh, char *label, size_t size) {
  snprintf(label, size, "%lldx%lld/%lldx%lldx%lld", sh->batch, sh->q_heads, sh->kv_heads, sh->kv_len, sh->head_dim);
}

/* Bytes of physical memory, or 0 if unknown. */
static double physical_memory_bytes(void) {
  const long pages = sysconf(_SC_PHYS_PAGES), page_size = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page_size > 0 ? (double)pages * (double)page_size : 0.0;
}

typedef struct cpu_result {
  double kv_mib, bytes;
  double median, min, max; /* seconds per call */
  char plan[160];
} cpu_result;

/* One K/V set in host memory; one warm-up call, then o->iters timed calls. */
static int bench_one_cpu(fd_handle *h, const bench_shape *sh, const char *label, const demo_options *o, int index,
                         int count, cpu_result *r) {
  const fd_dtype dtype = o->c.dtype;
  const size_t es = fdt_dtype_size(dtype);
  const long long q_len = fdt_q_len(&o->c);
  const double kv_elems_d = (double)sh->batch * (double)sh->kv_len * (double)sh->kv_heads * (double)sh->head_dim;
  const double q_elems_d = (double)sh->batch * (double)q_len * (double)sh->q_heads * (double)sh->head_dim;
  const double need = (2.0 * kv_elems_d + 2.0 * q_elems_d) * (double)es;
  const double memory = physical_memory_bytes();
  r->kv_mib = 2.0 * kv_elems_d * (double)es / 1048576.0;
  /* The bytes that must move: K and V of the keys read, q and out. */
  r->bytes =
      (2.0 * kv_elems_d * (double)keys_read(&o->c, sh->kv_len) / (double)sh->kv_len + 2.0 * q_elems_d) * (double)es;
  if ((memory > 0.0 && need > memory / 2) || need > (double)(SIZE_MAX / 2)) {
    fprintf(stderr, "flashdecode: %s needs %.0f MiB of host memory, more than half of this machine's %.0f MiB\n", label,
            need / 1048576.0, memory / 1048576.0);
    return 1;
  }
  const size_t kv_elems = (size_t)kv_elems_d, q_elems = (size_t)q_elems_d;
  int rc = 1;
  void *q = malloc(q_elems * es), *k = malloc(kv_elems * es), *v = malloc(kv_elems * es), *out = malloc(q_elems * es);
  float *per_head = malloc(2 * (size_t)sh->q_heads * sizeof *per_head);
  double *times = calloc((size_t)o->iters, sizeof *times);
  if (q == NULL || k == NULL || v == NULL || out == NULL || per_head == NULL || times == NULL) {
    fprintf(stderr, "flashdecode: out of host memory for %s (%.0f MiB)\n", label, need / 1048576.0);
    goto done;
  }
  fill_random(dtype, k, kv_elems, 1);
  fill_random(dtype, v, kv_elems, 2);
  fill_random(dtype, q, q_elems, 3);
  fill_per_head(per_head, sh->q_heads);
  fd_decode_args args;
  fd_decode_args_init(&args, sizeof args);
  args.q = dense_tensor(q, dtype, sh->batch, q_len, sh->q_heads, sh->head_dim);
  args.k = dense_tensor(k, dtype, sh->batch, sh->kv_len, sh->kv_heads, sh->head_dim);
  args.v = dense_tensor(v, dtype, sh->batch, sh->kv_len, sh->kv_heads, sh->head_dim);
  args.out = dense_tensor(out, dtype, sh->batch, q_len, sh->q_heads, sh->head_dim);
  args.num_splits = o->c.num_splits;
  set_variants(&o->c, &args, per_head, sh->q_heads);
  size_t workspace = 0;
  fd_status s = fd_workspace_size(h, &args, &workspace);
  if (s == FD_SUCCESS) s = fd_reserve_workspace(h, workspace);
  if (s != FD_SUCCESS) {
    fail_status(label, s);
    goto done;
  }
  describe_plan(h, &args, r->plan, sizeof r->plan);
  progress bar;
  progress_start(&bar);
  for (int i = -1; i < o->iters; ++i) { /* one warm-up call */
    const double t0 = now_seconds();
    s = fd_decode(h, &args, NULL);
    if (s != FD_SUCCESS) {
      progress_end(&bar);
      fail_status(label, s);
      goto done;
    }
    if (i >= 0) times[i] = now_seconds() - t0;
    progress_note(&bar, "shape %d of %d (%s), run %d of %d", index + 1, count, label, i + 2, o->iters + 1);
  }
  progress_end(&bar);
  r->median = median_of(times, o->iters);
  r->min = times[0];
  r->max = times[o->iters - 1];
  rc = 0;
done:
  free(q);
  free(k);
  free(v);
  free(out);
  free(per_head);
  free(times);
  return rc;
}

static int run_bench_cpu(const demo_options *o, fd_handle *h, const bench_shape *shapes, int count) {
  const char *dtype = dtype_name(o->c.dtype);
  printf("%-26s %8s %10s %10s %10s %8s  %s\n", "shape BxHq/HkvxNxD", "KV MiB", "median us", "min us", "max us", "GB/s",
         "plan");
  FILE *json = o->json ? fopen(o->json, "w") : NULL;
  if (o->json && json == NULL) fprintf(stderr, "flashdecode: cannot write %s\n", o->json);
  if (json) {
    fprintf(json, "{\"backend\": \"cpu\", \"dtype\": \"%s\", ", dtype);
    json_variants(json, &o->c);
    fprintf(json, ", \"results\": [");
  }
  int rc = 0, written = 0;
  for (int i = 0; i < count; ++i) {
    char label[64];
    shape_label(&shapes[i], label, sizeof label);
    cpu_result r;
    memset(&r, 0, sizeof r);
    if (bench_one_cpu(h, &shapes[i], label, o, i, count, &r) != 0) {
      printf("%-26s failed\n", label);
      rc = 1;
      continue;
    }
    const double gbps = r.bytes / r.median * 1e-9;
    printf("%-26s %8.1f %10.1f %10.1f %10.1f %8.2f  %s\n", label, r.kv_mib, r.median * 1e6, r.min * 1e6, r.max * 1e6,
           gbps, r.plan);
    fflush(stdout);
    if (json) {
      fprintf(json,
              "%s\n {\"shape\": \"%s\", \"kv_mib\": %.3f, \"bytes\": %.0f, \"time_us\": {\"median\": %.3f, "
              "\"min\": %.3f, \"max\": %.3f}, \"gbps\": %.3f, \"plan\": \"%s\"}",
              written++ ? "," : "", label, r.kv_mib, r.bytes, r.median * 1e6, r.min * 1e6, r.max * 1e6, gbps, r.plan);
    }
  }
  if (json) {
    fprintf(json, "\n]}\n");
    fclose(json);
  }
  return rc;
}

#ifdef FD_DEMO_WITH_CUDA
/* Device-to-device copy rate over 1 GiB (bytes read + written), median of 7. */
static double copy_ceiling_gbps(void) {
  const size_t bytes = (size_t)1 << 30;
  void *a = NULL, *b = NULL;
  if (cudaMalloc(&a, bytes) != cudaSuccess || cudaMalloc(&b, bytes) != cudaSuccess) {
    cudaFree(a);
    cudaGetLastError();
    return 0.0;
  }
  cudaMemset(a, 1, bytes);
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  double t[7];
  for (int i = -1; i < 7; ++i) {
    cudaEventRecord(start, NULL);
    cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, NULL);
    cudaEventRecord(stop, NULL);
    cudaEventSynchronize(stop);
    float ms = 0.0f;
    cudaEventElapsedTime(&ms, start, stop);
    if (i >= 0) t[i] = ms * 1e-3;
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cudaFree(a);
  cudaFree(b);
  return 2.0 * (double)bytes / median_of(t, 7) * 1e-9;
}

typedef struct bench_result {
  int sets;
  double kv_mib, bytes;
  double event_median, event_min, event_max;
  double graph_median, graph_min, graph_max;
  double host_median; /* host time of one fd_decode call: validation, plan lookup, kernel launch */
  double burst_host;  /* host time per call of back-to-back calls, as an eager decode loop issues them */
  double burst_gpu;   /* GPU time per call of those, gaps between launches included */
  char plan[160];     /* describe_plan of the shape */
} bench_result;

/* Issues `count` fd_decode calls back to back (sets first, first + 1, ...,
 * rotating) between two events on the stream, and waits for them: the host
 * seconds spent issuing and the GPU seconds between the events. */
static int timed_decodes(fd_handle *h, const fd_decode_args *args, int sets, int first, int count, cudaStream_t stream,
                         cudaEvent_t start, cudaEvent_t stop, double *host_seconds, double *gpu_seconds) {
  cudaEventRecord(start, stream);
  const double host_start = now_seconds();
  fd_status s = FD_SUCCESS;
  for (int i = 0; i < count && s == FD_SUCCESS; ++i) {
    s = fd_decode(h, &args[(first + i) % sets], (fd_cuda_stream)stream);
  }
  *host_seconds = now_seconds() - host_start;
  if (s != FD_SUCCESS) return fail_status("fd_decode", s);
  cudaEventRecord(stop, stream);
  if (cudaEventSynchronize(stop) != cudaSuccess) return 1;
  float ms = 0.0f;
  cudaEventElapsedTime(&ms, start, stop);
  *gpu_seconds = ms * 1e-3;
  return 0;
}

static int bench_one_cuda(fd_handle *h, const bench_shape *sh, fd_dtype dtype, const demo_options *o, bench_result *r) {
  const size_t es = fdt_dtype_size(dtype);
  const long long q_len = fdt_q_len(&o->c);
  const size_t kv_elems = (size_t)(sh->batch * sh->kv_len * sh->kv_heads * sh->head_dim);
  const size_t q_elems = (size_t)(sh->batch * q_len * sh->q_heads * sh->head_dim);
  const double set_bytes = 2.0 * (double)kv_elems * (double)es;
  int sets = (int)ceil((double)o->rotate_mib * 1048576.0 / set_bytes);
  if (sets < 2) sets = 2;
  r->sets = sets;
  r->kv_mib = set_bytes / 1048576.0;
  /* The bytes that must move: K and V of the keys read, q and out. */
  r->bytes = set_bytes * (double)keys_read(&o->c, sh->kv_len) / (double)sh->kv_len + 2.0 * (double)q_elems * (double)es;

  int rc = 1;
  void **mem = calloc((size_t)sets * 4, sizeof *mem); /* q, k, v, out per set */
  fd_decode_args *args = calloc((size_t)sets, sizeof *args);
  double *times = calloc((size_t)o->iters, sizeof *times);
  double *host_times = calloc((size_t)o->iters, sizeof *host_times);
  void *host = malloc(kv_elems * es > q_elems * es ? kv_elems * es : q_elems * es);
  float *per_head = NULL; /* device: slopes, then sinks (fill_per_head) */
  float *host_per_head = malloc(2 * (size_t)sh->q_heads * sizeof *host_per_head);
  cudaStream_t stream = NULL;
  cudaGraph_t graph = NULL;
  cudaGraphExec_t exec = NULL;
  cudaEvent_t start = NULL, stop = NULL;
  if (mem == NULL || args == NULL || times == NULL || host_times == NULL || host == NULL || host_per_head == NULL)
    goto done;
  fill_per_head(host_per_head, sh->q_heads);
  if (cudaMalloc((void **)&per_head, 2 * (size_t)sh->q_heads * sizeof *per_head) != cudaSuccess ||
      cudaMemcpy(per_head, host_per_head, 2 * (size_t)sh->q_heads * sizeof *per_head, cudaMemcpyHostToDevice) !=
          cudaSuccess) {
    fprintf(stderr, "flashdecode: out of device memory for the slopes and sinks\n");
    goto done;
  }
  for (int i = 0; i < sets; ++i) {
    if (cudaMalloc(&mem[4 * i + 0], q_elems * es) != cudaSuccess ||
        cudaMalloc(&mem[4 * i + 1], kv_elems * es) != cudaSuccess ||
        cudaMalloc(&mem[4 * i + 2], kv_elems * es) != cudaSuccess ||
        cudaMalloc(&mem[4 * i + 3], q_elems * es) != cudaSuccess) {
      fprintf(stderr, "flashdecode: out of device memory for %d K/V sets\n", sets);
      goto done;
    }
  }
  /* K, then V, then every q: random bits; sets after the first copy them on the device. */
  fill_random(dtype, host, kv_elems, 1);
  cudaMemcpy(mem[1], host, kv_elems * es, cudaMemcpyHostToDevice);
  fill_random(dtype, host, kv_elems, 2);
  cudaMemcpy(mem[2], host, kv_elems * es, cudaMemcpyHostToDevice);
  for (int i = 0; i < sets; ++i) {
    fill_random(dtype, host, q_elems, 3 + (uint64_t)i);
    cudaMemcpy(mem[4 * i], host, q_elems * es, cudaMemcpyHostToDevice);
    if (i > 0) {
      cudaMemcpy(mem[4 * i + 1], mem[1], kv_elems * es, cudaMemcpyDeviceToDevice);
      cudaMemcpy(mem[4 * i + 2], mem[2], kv_elems * es, cudaMemcpyDeviceToDevice);
    }
    fd_decode_args_init(&args[i], sizeof args[i]);
    args[i].q = dense_tensor(mem[4 * i], dtype, sh->batch, q_len, sh->q_heads, sh->head_dim);
    args[i].k = dense_tensor(mem[4 * i + 1], dtype, sh->batch, sh->kv_len, sh->kv_heads, sh->head_dim);
    args[i].v = dense_tensor(mem[4 * i + 2], dtype, sh->batch, sh->kv_len, sh->kv_heads, sh->head_dim);
    args[i].out = dense_tensor(mem[4 * i + 3], dtype, sh->batch, q_len, sh->q_heads, sh->head_dim);
    set_variants(&o->c, &args[i], per_head, sh->q_heads);
  }
  if (cudaDeviceSynchronize() != cudaSuccess) goto done;
  size_t workspace = 0;
  fd_status s = fd_workspace_size(h, &args[0], &workspace);
  if (s == FD_SUCCESS) s = fd_reserve_workspace(h, workspace);
  if (s != FD_SUCCESS) {
    fail_status("workspace", s);
    goto done;
  }
  describe_plan(h, &args[0], r->plan, sizeof r->plan);
  if (cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess ||
      cudaEventCreate(&start) != cudaSuccess || cudaEventCreate(&stop) != cudaSuccess)
    goto done;

  /* Launches one by one, rotating the sets. */
  for (int i = -2; i < o->iters; ++i) {
    double host_seconds = 0.0, gpu_seconds = 0.0;
    const int set = (i + 2) % sets;
    if (timed_decodes(h, args, sets, set, 1, stream, start, stop, &host_seconds, &gpu_seconds) != 0) goto done;
    if (i >= 0) {
      host_times[i] = host_seconds;
      times[i] = gpu_seconds;
    }
  }
  r->event_median = median_of(times, o->iters);
  r->host_median = median_of(host_times, o->iters);

  /* Back to back, without waiting in between (the launch queue holds far
   * more than I calls, so the host does not block). */
  if (cudaStreamSynchronize(stream) != cudaSuccess) goto done;
  double burst_host = 0.0, burst_gpu = 0.0;
  if (timed_decodes(h, args, sets, 0, o->iters, stream, start, stop, &burst_host, &burst_gpu) != 0) goto done;
  r->burst_host = burst_host / o->iters;
  r->burst_gpu = burst_gpu / o->iters;
  r->event_min = times[0];
  r->event_max = times[o->iters - 1];

  /* One graph decodes every set once; replays are timed and divided. */
  if (cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal) != cudaSuccess) goto done;
  for (int i = 0; i < sets && s == FD_SUCCESS; ++i) s = fd_decode(h, &args[i], (fd_cuda_stream)stream);
  if (cudaStreamEndCapture(stream, &graph) != cudaSuccess || s != FD_SUCCESS) {
    if (s != FD_SUCCESS) fail_status("fd_decode under capture", s);
    goto done;
  }
  if (cudaGraphInstantiate(&exec, graph, 0) != cudaSuccess) goto done;
  for (int i = -2; i < o->iters; ++i) {
    cudaEventRecord(start, stream);
    cudaGraphLaunch(exec, stream);
    cudaEventRecord(stop, stream);
    if (cudaEventSynchronize(stop) != cudaSuccess) goto done;
    float ms = 0.0f;
    cudaEventElapsedTime(&ms, start, stop);
    if (i >= 0) times[i] = ms * 1e-3 / sets;
  }
  r->graph_median = median_of(times, o->iters);
  r->graph_min = times[0];
  r->graph_max = times[o->iters - 1];
  rc = 0;
done:
  if (rc != 0 && cudaGetLastError() != cudaSuccess) fprintf(stderr, "flashdecode: a CUDA call failed\n");
  if (exec) cudaGraphExecDestroy(exec);
  if (graph) cudaGraphDestroy(graph);
  if (start) cudaEventDestroy(start);
  if (stop) cudaEventDestroy(stop);
  if (stream) cudaStreamDestroy(stream);
  if (mem) {
    for (int i = 0; i < 4 * sets; ++i) cudaFree(mem[i]);
  }
  free(mem);
  free(args);
  free(times);
  free(host_times);
  free(host);
  cudaFree(per_head);
  free(host_per_head);
  return rc;
}

static int run_bench_cuda(const demo_options *o, fd_handle *h, const bench_shape *shapes, int count) {
  const fd_dtype dtype = o->c.dtype;
  const double ceiling = copy_ceiling_gbps();
  char variants[160];
  describe_variants(&o->c, variants, sizeof variants);
  printf("%s benchmark%s; device-to-device copy %.0f GB/s (read + written)\n", dtype_name(dtype), variants, ceiling);
  printf("%-26s %8s %5s %8s %8s %8s %10s %10s %10s %8s %7s  %s\n", "shape BxHq/HkvxNxD", "KV MiB", "sets", "host us",
         "burst us", "eager us", "launch us", "graph us", "spread us", "GB/s", "%copy", "plan");
  FILE *json = o->json ? fopen(o->json, "w") : NULL;
  if (o->json && json == NULL) fprintf(stderr, "flashdecode: cannot write %s\n", o->json);
  if (json) {
    fprintf(json, "{\"backend\": \"cuda\", \"dtype\": \"%s\", \"copy_gbps\": %.1f, ", dtype_name(dtype), ceiling);
    json_variants(json, &o->c);
    fprintf(json, ", \"results\": [");
  }
  int rc = 0;
  progress bar;
  progress_start(&bar);
  for (int i = 0; i < count; ++i) {
    const bench_shape *sh = &shapes[i];
    char label[64];
    shape_label(sh, label, sizeof label);
    progress_note(&bar, "shape %d of %d (%s)", i + 1, count, label);
    bench_result r;
    memset(&r, 0, sizeof r);
    const int failed = bench_one_cuda(h, sh, dtype, o, &r) != 0;
    progress_end(&bar); /* the row goes on a line of its own */
    if (failed) {
      printf("%-26s failed\n", label);
      rc = 1;
      continue;
    }
    const double gbps = r.bytes / r.graph_median * 1e-9;
    printf("%-26s %8.1f %5d %8.2f %8.2f %8.1f %10.1f %10.1f %10.1f %8.0f %7.1f  %s\n", label, r.kv_mib, r.sets,
           r.host_median * 1e6, r.burst_host * 1e6, r.burst_gpu * 1e6, r.event_median * 1e6, r.graph_median * 1e6,
           (r.graph_max - r.graph_min) * 1e6, gbps, ceiling > 0 ? 100.0 * gbps / ceiling : 0.0, r.plan);
    fflush(stdout);
    if (json) {
      fprintf(json,
              "%s\n {\"shape\": \"%s\", \"kv_mib\": %.3f, \"sets\": %d, \"bytes\": %.0f, \"host_us\": %.3f, "
              "\"burst_host_us\": %.3f, \"burst_gpu_us\": %.3f, \"launch_us\": {\"median\": %.3f, "
              "\"min\": %.3f, \"max\": %.3f}, \"graph_us\": {\"median\": %.3f, \"min\": %.3f, \"max\": %.3f}, "
              "\"gbps\": %.1f, \"pct_of_copy\": %.2f, \"plan\": \"%s\"}",
              i ? "," : "", label, r.kv_mib, r.sets, r.bytes, r.host_median * 1e6, r.burst_host * 1e6,
              r.burst_gpu * 1e6, r.event_median * 1e6, r.event_min * 1e6, r.event_max * 1e6, r.graph_median * 1e6,
              r.graph_min * 1e6, r.graph_max * 1e6, gbps, ceiling > 0 ? 100.0 * gbps / ceiling : 0.0, r.plan);
    }
  }
  if (json) {
    fprintf(json, "\n]}\n");
    fclose(json);
  }
  progress_end(&bar);
  return rc;
}
#endif

static int run_bench(const demo_options *o) {
  bench_shape *shapes = NULL;
  int count = 0;
  if (collect_shapes(o, &shapes, &count) != 0) return 2;
  if (count == 0) {
    fprintf(stderr, "flashdecode: no shapes to benchmark\n");
    free(shapes);
    return 2;
  }
  fd_handle *h = NULL;
  fd_backend backend = FD_BACKEND_CPU;
  char why_cpu[512];
  if (open_handle(o, &h, &backend, why_cpu, sizeof why_cpu) != 0) {
    free(shapes);
    return 1;
  }
  print_backend(backend, why_cpu);
  int rc = 1;
#ifdef FD_DEMO_WITH_CUDA
  if (backend == FD_BACKEND_CUDA) rc = run_bench_cuda(o, h, shapes, count);
#endif
  if (backend == FD_BACKEND_CPU) {
    char variants[160];
    describe_variants(&o->c, variants, sizeof variants);
    printf("%s benchmark%s, one K/V set per shape, %d timed calls each\n", dtype_name(o->c.dtype), variants, o->iters);
    rc = run_bench_cpu(o, h, shapes, count);
  }
  fd_destroy(h);
  free(shapes);
  return rc;
}

int main(int argc, char **argv) {
  demo_options o;
  const int parsed = parse(argc, argv, &o);
  if (parsed == PARSE_EXIT_OK) return 0;
  if (parsed != PARSE_RUN) return 2;
  progress_interval = (double)o.progress_seconds;
  if (o.bench != NULL || o.bench_file != NULL) return run_bench(&o);

  fd_handle *h = NULL;
  fd_backend backend = FD_BACKEND_CPU;
  char why_cpu[512];
  if (open_handle(&o, &h, &backend, why_cpu, sizeof why_cpu) != 0) return 1;
  print_backend(backend, why_cpu);

  char description[256];
  fdt_case_describe(&o.c, description, sizeof description);
  printf("problem: %s\n", description);
  fflush(stdout);
  fdt_problem p;
  if (fdt_problem_make(&p, &o.c) != 0) {
    fprintf(stderr, "flashdecode: out of host memory for the problem\n");
    fd_destroy(h);
    return 1;
  }
  double *times = calloc((size_t)o.iters, sizeof *times);
  int rc = times == NULL ? 1 : 0;
  if (rc == 0 && backend == FD_BACKEND_CUDA) {
#ifdef FD_DEMO_WITH_CUDA
    rc = run_cuda(h, &p, o.iters, times);
#endif
  } else if (rc == 0) {
    rc = run_cpu(h, &p, o.iters, times);
  }
  if (rc != 0) {
    free(times);
    fdt_problem_free(&p);
    fd_destroy(h);
    return rc;
  }

  char report[256];
  double out_error = 0.0, lse_error = 0.0;
  const int bad = fdt_check(&p, report, sizeof report, &out_error, &lse_error);
  qsort(times, (size_t)o.iters, sizeof *times, compare_doubles);
  const double median = times[o.iters / 2];
  /* K and V of the keys read (p.c.kv_len: the cache as laid out), q and out of every query token. */
  const double kv_bytes = 2.0 * (double)(o.c.batch * keys_read(&o.c, p.c.kv_len) * o.c.kv_heads * o.c.head_dim) *
                          (double)fdt_dtype_size(o.c.dtype);
  const double io_bytes =
      2.0 * (double)(o.c.batch * fdt_q_len(&o.c) * o.c.q_heads * o.c.head_dim) * (double)fdt_dtype_size(o.c.dtype);
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
