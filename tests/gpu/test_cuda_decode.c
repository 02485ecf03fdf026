// SPDX-License-Identifier: Apache-2.0
/* The CUDA backend against the float64 reference and against the CPU
 * backend, over a matrix of dtypes, head dims (odd multiples of 8 too), GQA
 * ratios (5, 7, 12, 64, MQA), layouts (BNHD, BHND, padded slice, paged NHD
 * and HND with shuffled block tables and page sizes 1..256), ragged lengths
 * (0, 1, 63, 64, 65, full) and split counts (automatic, 1 .. 1024). Fresh
 * random data per case; outputs poisoned with NaN; NaN in every cache slot a
 * sequence does not own. Then: determinism, CUDA graph capture and replay
 * with new data and lengths, the merge paths on a caller-provided
 * workspace, ragged batches of many shapes, two handles on two streams in
 * two threads, element offsets past 2^31, unaligned caches, length
 * clamping, a batch past the grid's y limit, rejected input leaving the
 * output untouched.
 *
 * Exits 77 (CTest: skipped) without a CUDA device.
 * FD_GPU_TEST_QUICK=1 shrinks the matrix (for compute-sanitizer) and skips
 * the multi-GiB large-offset test. FD_GPU_TEST_SEED=n draws other data.
 * 16-bit cases with a 16-bit output run the tensor-core kernel; the rest,
 * and unaligned caches, the CUDA-core kernel. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fdt.h"
#include "fdt_cuda.h"
#include "flashdecode.h"
#include "kernel_specs.h"

#define CUDA_CHECK(call)                                                          \
  do {                                                                            \
    const cudaError_t err_ = (call);                                              \
    if (err_ != cudaSuccess) fail_msg("%s: %s", #call, cudaGetErrorString(err_)); \
  } while (0)

static int g_quick;
static uint64_t g_seed = 1;
static fd_handle *g_cuda;
static fd_handle *g_cpu;
static cudaStream_t g_stream;

/* Worst errors seen, per (q dtype, out is f32). */
typedef struct worst_errors {
  int cases;
  double ref_out, ref_lse, cpu_out, cpu_lse;
} worst_errors;
static worst_errors g_worst[3][2];

static const char *last_message(void) {
  static _Thread_local char buffer[512];
  fd_last_error_message(buffer, sizeof buffer);
  return buffer;
}

static fd_handle *make_handle(fd_backend backend) {
  fd_options options;
  fd_options_init(&options, sizeof options);
  options.backend = backend;
  fd_handle *h = NULL;
  const fd_status s = fd_create(&h, &options);
  if (s != FD_SUCCESS) fail_msg("fd_create(%d) failed: %s", (int)backend, last_message());
  return h;
}

/* fd_describe_plan's answer for args on h: which kernel and merge decode runs. */
static fd_plan_info describe(const fd_handle *h, const fd_decode_args *args) {
  fd_plan_info info;
  fd_plan_info_init(&info, sizeof info);
  const fd_status s = fd_describe_plan(h, args, &info);
  if (s != FD_SUCCESS) fail_msg("fd_describe_plan failed: %s: %s", fd_status_string(s), last_message());
  /* The ordering kernel of a fixed grid ordered longest first (lengths on
   * the device) is one more launch (handles that check contents, which add
   * one, are described apart). The balanced schedule reports 0 splits. */
  const int ordered = info.schedule == FD_SCHEDULE_LONGEST_FIRST;
  const int extra = info.launches - (info.merge == FD_MERGE_SEPARATE ? 2 : 1) - ordered;
  if (extra != 0 || (ordered && (info.num_splits == 0 || args->seq_lens.data == NULL)) ||
      (info.schedule == FD_SCHEDULE_BALANCED) != (info.num_splits == 0)) {
    fail_msg("plan of %d launches with merge %d, schedule %d and %d splits", (int)info.launches, (int)info.merge,
             (int)info.schedule, (int)info.num_splits);
  }
  return info;
}

static int starts_with(const char *s, const char *prefix) { return strncmp(s, prefix, strlen(prefix)) == 0; }

static void make_problem(fdt_problem *p, const fdt_case *c) {
  if (fdt_problem_make(p, c) != 0) fail_msg("out of host memory generating a problem");
}

/* Decodes on the CUDA handle and copies the outputs back into p. The tests
 * fill device memory with cudaMemcpy/cudaMemset on the legacy stream, which
 * a non-blocking stream does not wait for: wait here first. */
static void decode_cuda(fd_handle *h, fdt_problem *p, fdt_device_problem *d, cudaStream_t stream) {
  CUDA_CHECK(cudaDeviceSynchronize());
  const fd_status s = fd_decode(h, &d->args, (fd_cuda_stream)stream);
  if (s != FD_SUCCESS) fail_msg("fd_decode (CUDA) failed: %s: %s", fd_status_string(s), last_message());
  CUDA_CHECK(cudaStreamSynchronize(stream));
  CUDA_CHECK(cudaGetLastError());
  if (fdt_cuda_download(d, p) != 0) fail_msg("copying the outputs back failed");
}

/* ---- one case: generate, upload, decode, check ------------------------------ */
/* A generated problem, its device copy and the verdict on a decode of it.
 * Tests go open_case, then (after altering d where they test something
 * particular) check_case, close_case, and only then fail_msg: failing
 * longjmps, and device buffers left behind (GiBs in the large-offset test)
 * would starve the tests after it. */
enum { kReportBytes = 256 }; /* a case's fdt_check summary */

typedef struct gpu_case {
  fdt_problem p;             /* host storage and the float64 reference */
  fdt_device_problem d;      /* device copy; tests may repoint d.args or overwrite d's buffers */
  char report[kReportBytes]; /* fdt_check's summary; close_case keeps it for the failure message */
  double out_error, lse_error;
} gpu_case;

/* Generates c's problem (outputs poisoned, NaN in unowned cache slots) and
 * copies it to the device with the same layout. */
static void open_case(gpu_case *t, const fdt_case *c) {
  memset(t, 0, sizeof *t);
  make_problem(&t->p, c);
  if (fdt_cuda_upload(&t->p, &t->d) != 0) {
    fdt_problem_free(&t->p);
    fail_msg("copying the problem to the device failed");
  }
}

/* Decodes t->d.args on the shared CUDA handle and stream, copies the outputs
 * back and checks them against the float64 reference (every element written,
 * empty sequences zero with LSE -inf, error within the dtype's bound).
 * Returns nonzero on a mismatch; t->report says what was measured. */
static int check_case(gpu_case *t) {
  decode_cuda(g_cuda, &t->p, &t->d, g_stream);
  return fdt_check(&t->p, t->report, sizeof t->report, &t->out_error, &t->lse_error);
}

/* check_case twice, the outputs poisoned before each run; *same says
 * whether the two runs wrote bitwise-equal outputs. Returns nonzero on a
 * mismatch with the reference (the second run is skipped then). */
static int check_case_twice(gpu_case *t, int *same) {
  unsigned char *first = malloc(t->p.out_bytes);
  if (first == NULL) fail_msg("out of host memory");
  int bad = 0;
  *same = 1;
  for (int run = 0; run < 2 && !bad; ++run) {
    if (fdt_cuda_poison_outputs(&t->p, &t->d) != 0) fail_msg("poisoning failed");
    bad = check_case(t);
    if (run == 0) memcpy(first, t->p.out, t->p.out_bytes);
    else *same = memcmp(first, t->p.out, t->p.out_bytes) == 0;
  }
  free(first);
  return bad;
}

static void close_case(gpu_case *t) {
  fdt_cuda_free(&t->d);
  fdt_problem_free(&t->p);
}

/* A case planned on the shared handle and checked twice (check_case_twice):
 * its plan, whether it missed the reference, whether the runs were bitwise
 * equal, and the report. */
typedef struct planned_check {
  fd_plan_info plan;
  int bad, same;
  char report[kReportBytes];
} planned_check;

static planned_check check_planned_case(const fdt_case *c) {
  planned_check r;
  gpu_case t;
  open_case(&t, c);
  r.plan = describe(g_cuda, &t.d.args);
  r.bad = check_case_twice(&t, &r.same);
  memcpy(r.report, t.report, sizeof r.report);
  close_case(&t);
  return r;
}

/* Fails `test`'s case `what` where check_planned_case found a mismatch. */
static void expect_checked(const planned_check *r, const char *test, const char *what) {
  if (r->bad) fail_msg("%s, %s: %s", test, what, r->report);
  if (!r->same) fail_msg("%s, %s: two runs differ", test, what);
}

/* open_case, check_case, a line naming the case (`what`) with the report,
 * close_case, then the failure if any: for tests that check c as generated. */
static void expect_case_passes(const fdt_case *c, const char *what) {
  gpu_case t;
  open_case(&t, c);
  const int bad = check_case(&t);
  print_message("%s: %s\n", what, t.report);
  close_case(&t);
  if (bad) fail_msg("%s: %s", what, t.report);
}

/* The fields every single test sets; the rest start at zero (BNHD, not ragged, no LSE, automatic splits). */
static fdt_case dense_case(fd_dtype dtype, int64_t batch, int64_t q_heads, int64_t kv_heads, int64_t head_dim,
                           int64_t kv_len, uint64_t seed) {
  fdt_case c = {0};
  c.batch = batch;
  c.q_heads = q_heads;
  c.kv_heads = kv_heads;
  c.head_dim = head_dim;
  c.kv_len = kv_len;
  c.dtype = c.out_dtype = dtype;
  c.layout = FDT_BNHD;
  c.seed = seed;
  return c;
}

/* ||a - b|| / ||b|| over the logical outputs, and the largest |lse_a - lse_b|
 * (-inf on both sides counts as equal). */
static void compare_outputs(const fdt_problem *p, const void *out_a, const float *lse_a, const void *out_b,
                            const float *lse_b, double *out_rel, double *lse_diff) {
  const fdt_case *c = &p->c;
  const int64_t *s = p->args.out.strides, *ls = p->args.lse.strides;
  double diff2 = 0.0, ref2 = 0.0, lse_max = 0.0;
  for (int64_t b = 0; b < c->batch; ++b) {
    for (int64_t t = 0; t < fdt_q_len(c); ++t) {
      for (int64_t h = 0; h < c->q_heads; ++h) {
        for (int64_t d = 0; d < c->head_dim; ++d) {
          const int64_t i = b * s[0] + t * s[1] + h * s[2] + d;
          const double x = fdt_load(c->out_dtype, out_a, i), y = fdt_load(c->out_dtype, out_b, i);
          diff2 += (x - y) * (x - y);
          ref2 += y * y;
        }
        if (lse_a && lse_b) {
          const int64_t i = b * ls[0] + t * ls[1] + h * ls[2];
          const double x = lse_a[i], y = lse_b[i];
          const double diff = (isinf(x) && isinf(y) && x == y) ? 0.0 : fabs(x - y);
          if (!(diff <= lse_max)) lse_max = diff; /* NaN propagates */
        }
      }
    }
  }
  *out_rel = ref2 > 0.0 ? sqrt(diff2 / ref2) : sqrt(diff2);
  *lse_diff = lse_max;
}

static void note_worst(const fdt_case *c, double ref_out, double ref_lse, double cpu_out, double cpu_lse) {
  worst_errors *w = &g_worst[c->dtype][c->out_dtype == FD_DTYPE_F32 && c->dtype != FD_DTYPE_F32];
  w->cases++;
  if (ref_out > w->ref_out) w->ref_out = ref_out;
  if (ref_lse > w->ref_lse) w->ref_lse = ref_lse;
  if (cpu_out > w->cpu_out) w->cpu_out = cpu_out;
  if (cpu_lse > w->cpu_lse) w->cpu_lse = cpu_lse;
}

/* One matrix case: CUDA vs the float64 reference, then vs the CPU backend. */
static void run_case(void **state) {
  const fdt_case *c = *state;
  char description[256];
  fdt_case_describe(c, description, sizeof description);
  gpu_case t;
  open_case(&t, c);
  const int bad = check_case(&t);

  /* The CPU backend decodes the same host problem; keep the CUDA outputs aside. */
  unsigned char *cuda_out = malloc(t.p.out_bytes);
  float *cuda_lse = t.p.lse ? malloc(t.p.lse_bytes) : NULL;
  memcpy(cuda_out, t.p.out, t.p.out_bytes);
  if (t.p.lse) memcpy(cuda_lse, t.p.lse, t.p.lse_bytes);
  fdt_poison_outputs(&t.p);
  const fd_status s = fd_decode(g_cpu, &t.p.args, NULL);
  if (s != FD_SUCCESS) fail_msg("%s: CPU fd_decode failed: %s", description, last_message());
  double cpu_out = 0.0, cpu_lse = 0.0;
  compare_outputs(&t.p, cuda_out, cuda_lse, t.p.out, (const float *)t.p.lse, &cpu_out, &cpu_lse);
  const double bound = fdt_error_bound(c->out_dtype);
  const int cpu_bad = !(cpu_out <= bound) || !(cpu_lse <= 1e-4);

  print_message("%s | vs f64: %s | vs cpu: rel_err=%.3g lse_err=%.3g%s\n", description, t.report, cpu_out, cpu_lse,
                cpu_bad ? " FAIL" : "");
  note_worst(c, t.out_error, t.lse_error, cpu_out, cpu_lse);
  free(cuda_out);
  free(cuda_lse);
  close_case(&t);
  if (bad) fail_msg("%s: against the reference: %s", description, t.report);
  if (cpu_bad) fail_msg("%s: against the CPU backend: rel_err=%.3g lse_err=%.3g", description, cpu_out, cpu_lse);
}

/* ---- the matrix ------------------------------------------------------------ */
enum { kFullCases = 180, kQuickCases = 48 };

static int make_matrix(fdt_case *cases, int quick) {
  static const fd_dtype dtypes[] = {FD_DTYPE_F32, FD_DTYPE_F16, FD_DTYPE_BF16};
  static const int64_t head_dims[] = {16, 24, 32, 40, 64, 72, 128, 136, 200, 256, 128, 64};
  static const int64_t heads[][2] = {{4, 4},  {8, 1},  {32, 8}, {10, 2}, {14, 2},
                                     {16, 2}, {12, 1}, {64, 1}, {6, 3},  {128, 2}};
  static const fdt_layout layouts[] = {FDT_BNHD, FDT_BHND, FDT_BNHD_PADDED, FDT_PAGED_NHD, FDT_PAGED_HND};
  static const int64_t kv_lens[] = {1, 63, 64, 65, 300, 1000, 4097, 2500};
  static const int32_t splits[] = {0, 1, 2, 3, 7, 16, 64, 0, 200, 1024, 0, 5};
  static const int64_t page_sizes[] = {16, 1, 64, 256};
  const int count = quick ? kQuickCases : kFullCases;
  /* Bounds the float64 reference (and sanitizer run time). */
  const int64_t budget = quick ? (int64_t)4 << 20 : (int64_t)24 << 20;
  for (int i = 0; i < count; ++i) {
    fdt_case *c = &cases[i];
    memset(c, 0, sizeof *c);
    c->dtype = dtypes[i % 3];
    c->out_dtype = (i % 4 == 3) ? FD_DTYPE_F32 : c->dtype;
    c->head_dim = head_dims[(i / 3) % 12];
    c->q_heads = heads[i % 10][0];
    c->kv_heads = heads[i % 10][1];
    c->layout = layouts[(i / 7) % 5];
    c->kv_len = kv_lens[(i / 2) % 8];
    c->num_splits = splits[(i / 5) % 12];
    c->page_size = page_sizes[(i / 11) % 4];
    c->batch = 1 + (i * 5) % 8;
    c->ragged = (i / 3) % 3 != 0;
    c->with_lse = i % 5 != 2;
    c->softmax_scale = (i % 9 == 4) ? 0.3 : 0.0;
    c->seed = g_seed * 100003u + (uint64_t)i;
    /* Ragged lengths go 0, full, 1, 63, 64, 65, random..: keep a ragged batch
     * at 3 or more so it is not only the empty sequence; shrink the cache
     * before going below that. */
    const int64_t min_batch = c->ragged ? 3 : 1;
    if (c->batch < min_batch) c->batch = min_batch;
#define FDT_CASE_COST (c->batch * c->q_heads * c->kv_len * c->head_dim)
    while (c->batch > min_batch && FDT_CASE_COST > budget) c->batch--;
    while (c->kv_len > 65 && FDT_CASE_COST > budget) c->kv_len /= 2;
    while (c->batch > 1 && FDT_CASE_COST > budget) c->batch--;
#undef FDT_CASE_COST
  }
  return count;
}

/* ---- tensor-core path ------------------------------------------------------- */
/* The matrix sends every 16-bit case with a 16-bit output and aligned rows
 * through the tensor-core kernel (about half of it). These add longer caches
 * than its budget allows: many pipeline tiles and splits per sequence, every
 * head-dim bucket, a page size that is not a power of two, a group of 5.
 * Cases 5-8 are dense, of one length, with automatic splits and head_dim
 * above 64: on a GPU with 200+ KiB of shared memory per block (H100, H200,
 * B200) the planner gives them the wide tiles (two 64 KiB stages of 128 or
 * 64 tokens), with a fused merge (5: 4 rows x 16 splits) or the merge kernel
 * (6-8: larger units), a head_dim that is not a bucket (8: 96) and a length
 * that is not a multiple of the tile. Case 9 is a dense ragged batch with
 * automatic splits, which gets wide tiles on those GPUs too. Cases 10-12
 * have pages small enough for the loader's shared-memory ring of block table
 * entries, over many tiles: 3 tokens (not a power of two: its division
 * path), 1 token with 5 forced splits, and 2 tokens with 3 forced splits,
 * whose splits start mid-page and mid-tile (a tile then spans one page
 * more). */
enum { kTensorCoreCases = 13 };

static int make_tensor_core_cases(fdt_case *cases, int quick) {
  static const struct {
    fd_dtype dtype;
    int64_t batch, q_heads, kv_heads, head_dim, kv_len, quick_len, page_size;
    fdt_layout layout;
    int ragged;
    int32_t splits;
    double scale;
  } spec[kTensorCoreCases] = {
      {FD_DTYPE_F16, 1, 32, 8, 128, 20000, 1200, 0, FDT_BHND, 0, 0, 0.0},
      {FD_DTYPE_BF16, 2, 8, 4, 256, 5000, 600, 16, FDT_PAGED_NHD, 1, 0, 0.0},
      {FD_DTYPE_F16, 3, 16, 16, 64, 3000, 500, 7, FDT_PAGED_HND, 1, 3, 0.0},
      {FD_DTYPE_BF16, 4, 64, 8, 128, 2000, 300, 0, FDT_BNHD, 0, 1, 0.0},
      {FD_DTYPE_F16, 2, 40, 8, 72, 2500, 400, 0, FDT_BNHD_PADDED, 1, 0, 0.3},
      {FD_DTYPE_F16, 1, 32, 8, 128, 8192, 1200, 0, FDT_BHND, 0, 0, 0.0},
      {FD_DTYPE_BF16, 2, 8, 1, 128, 16384, 2000, 0, FDT_BHND, 0, 0, 0.0},
      {FD_DTYPE_F16, 1, 8, 4, 256, 8192, 1500, 0, FDT_BNHD, 0, 0, 0.0},
      {FD_DTYPE_BF16, 1, 16, 2, 96, 6000, 1000, 0, FDT_BHND, 0, 0, 0.0},
      {FD_DTYPE_F16, 6, 32, 8, 128, 7000, 900, 0, FDT_BHND, 1, 0, 0.0},
      {FD_DTYPE_BF16, 3, 32, 8, 128, 3000, 500, 3, FDT_PAGED_NHD, 1, 0, 0.0},
      {FD_DTYPE_F16, 2, 32, 8, 128, 4000, 700, 1, FDT_PAGED_NHD, 0, 5, 0.0},
      {FD_DTYPE_F16, 2, 16, 2, 64, 5001, 801, 2, FDT_PAGED_HND, 1, 3, 0.0},
  };
  for (int i = 0; i < kTensorCoreCases; ++i) {
    fdt_case *c = &cases[i];
    memset(c, 0, sizeof *c);
    c->dtype = c->out_dtype = spec[i].dtype;
    c->batch = spec[i].batch;
    c->q_heads = spec[i].q_heads;
    c->kv_heads = spec[i].kv_heads;
    c->head_dim = spec[i].head_dim;
    c->kv_len = quick ? spec[i].quick_len : spec[i].kv_len;
    c->page_size = spec[i].page_size;
    c->layout = spec[i].layout;
    c->ragged = spec[i].ragged;
    c->with_lse = 1;
    c->num_splits = spec[i].splits;
    c->softmax_scale = spec[i].scale;
    c->seed = g_seed * 7919u + 31u * (uint64_t)i;
  }
  return kTensorCoreCases;
}

/* ---- single tests ------------------------------------------------------------ */

/* ---- attention variants ------------------------------------------------------ */
/* Cases with several query tokens, masks, windows, softcaps, ALiBi and
 * sinks, alone and together, drawn from a generator seeded by the case's
 * index: every kernel (tensor-core rows of query tokens x heads in one or
 * several chunks, the CUDA-core kernel for f32 and unaligned rows), dense and
 * paged caches, ragged lengths, every merge; checked against the float64
 * reference and the CPU backend by run_case. */
enum { kVariantCases = 120, kQuickVariantCases = 40 };

static int make_variant_cases(fdt_case *cases, int quick) {
  static const fd_dtype dtypes[] = {FD_DTYPE_F16, FD_DTYPE_BF16, FD_DTYPE_F16, FD_DTYPE_F32};
  static const fdt_layout layouts[] = {FDT_BNHD, FDT_BHND, FDT_BNHD_PADDED, FDT_PAGED_NHD, FDT_PAGED_HND};
  static const int64_t q_lens[] = {1, 2, 3, 4, 8, 16, FD_MAX_Q_LEN};
  static const int64_t heads[][2] = {{32, 8}, {8, 1}, {16, 16}, {12, 2}, {64, 8}, {4, 4}};
  static const int64_t head_dims[] = {64, 128, 256, 96, 128};
  static const int64_t kv_lens[] = {1, 40, 300, 1500, 5000};
  static const int64_t page_sizes[] = {1, 7, 16, 64};
  static const int32_t splits[] = {0, 0, 0, 1, 3, 9};
  static const double softcaps[] = {0.0, 0.0, 5.0, 30.0};
  const int count = quick ? kQuickVariantCases : kVariantCases;
  for (int i = 0; i < count; ++i) {
    fdt_rng rng = {0xa77e0000ull + g_seed + (uint64_t)i};
    fdt_case *c = &cases[i];
    memset(c, 0, sizeof *c);
    c->dtype = dtypes[fdt_int(&rng, 0, 3)];
    c->out_dtype = fdt_int(&rng, 0, 4) == 0 ? FD_DTYPE_F32 : c->dtype;
    c->layout = layouts[fdt_int(&rng, 0, 4)];
    c->q_len = q_lens[fdt_int(&rng, 0, 6)];
    c->mask = fdt_int(&rng, 0, 3) == 0 ? FD_MASK_NONE : FD_MASK_CAUSAL;
    const int64_t *hk = heads[fdt_int(&rng, 0, 5)];
    c->q_heads = hk[0];
    c->kv_heads = hk[1];
    c->head_dim = head_dims[fdt_int(&rng, 0, 4)];
    c->kv_len = kv_lens[fdt_int(&rng, 0, 4)];
    if (quick && c->kv_len > 1500) c->kv_len = 1500;
    c->page_size = page_sizes[fdt_int(&rng, 0, 3)];
    c->batch = fdt_int(&rng, 1, 5);
    c->ragged = (int)fdt_int(&rng, 0, 1);
    c->with_lse = fdt_int(&rng, 0, 3) != 0;
    c->num_splits = splits[fdt_int(&rng, 0, 5)];
    switch (fdt_int(&rng, 0, 5)) {
      case 0: c->window = 1; break;
      case 1: c->window = c->kv_len / 3 + 1; break;
      case 2: c->window = c->kv_len + 20; break;
      default: c->window = 0; break;
    }
    c->softcap = softcaps[fdt_int(&rng, 0, 3)];
    c->alibi = (int)(fdt_int(&rng, 0, 3) % 3);
    c->sinks = (int)fdt_int(&rng, 0, 1);
    c->ragged_q = fdt_int(&rng, 0, 3) == 0; /* drawn last: the other draws stay as they were */
    c->seed = g_seed + 9000 + (uint64_t)i;
    /* Keep the float64 reference affordable. */
    while (c->batch * fdt_q_len(c) * c->q_heads * c->kv_len * c->head_dim > ((int64_t)24 << 20)) {
      if (c->batch > 1) c->batch = (c->batch + 1) / 2;
      else c->kv_len /= 2;
    }
  }
  return count;
}

static void graph_replay_case(fdt_case c, const char *what, const int64_t *round_lens);

/* ---- quantized caches ------------------------------------------------------- */
/* Every 8-bit cache dtype x q dtype x scale mode x dense / paged (the quick
 * run takes the dense and paged of one q dtype per pair), ragged, with
 * padding of NaN and saturating bytes; run_case checks them against the
 * float64 reference and the CPU backend. */
enum { kQuantizedCases = 72 };

static int make_quantized_cases(fdt_case *cases, int quick) {
  static const fd_dtype kv_dtypes[] = {FD_DTYPE_E4M3, FD_DTYPE_E5M2, FD_DTYPE_I8};
  static const fd_dtype q_dtypes[] = {FD_DTYPE_F16, FD_DTYPE_BF16, FD_DTYPE_F32};
  static const fdt_layout dense[] = {FDT_BNHD, FDT_BHND, FDT_BNHD_PADDED};
  static const fdt_layout pools[] = {FDT_PAGED_NHD, FDT_PAGED_HND};
  static const int64_t heads[][2] = {{32, 8}, {8, 1}, {16, 16}, {12, 2}};
  /* 72 and 40: rows that end inside a 16-byte chunk column, whose threads
   * still copy per-token scales. */
  static const int64_t head_dims[] = {64, 128, 256, 128, 72, 40};
  int n = 0;
  for (int kd = 0; kd < 3; ++kd) {
    for (int qd = 0; qd < 3; ++qd) {
      for (int mode = 0; mode < 4; ++mode) {
        if (quick && qd != (kd + mode) % 3) continue;
        for (int paged = 0; paged < 2; ++paged) {
          const int i = ((kd * 3 + qd) * 4 + mode) * 2 + paged;
          fdt_rng rng = {0x8b170000ull + g_seed + (uint64_t)i};
          fdt_case *c = &cases[n++];
          memset(c, 0, sizeof *c);
          c->kv_dtype = kv_dtypes[kd];
          c->dtype = q_dtypes[qd];
          c->out_dtype = fdt_int(&rng, 0, 3) == 0 ? FD_DTYPE_F32 : c->dtype;
          c->scale_mode = (fdt_scale_mode)mode;
          c->layout = paged ? pools[fdt_int(&rng, 0, 1)] : dense[fdt_int(&rng, 0, 2)];
          c->page_size = paged ? (fdt_int(&rng, 0, 1) ? 16 : 7) : 0;
          const int64_t *hk = heads[fdt_int(&rng, 0, 3)];
          c->q_heads = hk[0];
          c->kv_heads = hk[1];
          c->head_dim = head_dims[fdt_int(&rng, 0, 5)];
          c->kv_len = quick ? 300 : fdt_int(&rng, 1, 3000);
          c->batch = fdt_int(&rng, 1, 7);
          c->ragged = 1;
          c->with_lse = 1;
          c->q_len = fdt_int(&rng, 0, 3) == 0 ? fdt_int(&rng, 2, 8) : 1;
          c->window = fdt_int(&rng, 0, 4) == 0 ? c->kv_len / 3 + 1 : 0;
          c->sinks = fdt_int(&rng, 0, 4) == 0;
          c->num_splits = fdt_int(&rng, 0, 2) == 0 ? 3 : 0;
          c->ragged_q = c->q_len > 1 && fdt_int(&rng, 0, 1) == 0;
          c->seed = g_seed + 12000 + (uint64_t)i;
          while (c->batch * fdt_q_len(c) * c->q_heads * c->kv_len * c->head_dim > ((int64_t)24 << 20)) {
            if (c->batch > 1) c->batch = (c->batch + 1) / 2;
            else c->kv_len /= 2;
          }
        }
      }
    }
  }
  return n;
}

/* A host buffer's copy on the device. */
static void *device_copy(const void *host, size_t bytes) {
  void *d = NULL;
  CUDA_CHECK(cudaMalloc(&d, bytes ? bytes : 1));
  if (bytes) CUDA_CHECK(cudaMemcpy(d, host, bytes, cudaMemcpyHostToDevice));
  return d;
}

/* fd_append_kv on the device against the CPU backend's on the same inputs,
 * bit for bit over the whole cache buffers (bytes outside the written
 * slots included): every cache dtype (F32, F16, BF16, E4M3, E5M2, I8) from
 * every new dtype, a ragged paged pool (HND pages) whose block table has
 * pages shared by two sequences (page 5: sequence 0 writes its slots 0-3
 * and sequence 6 its slots 4-7 in the same call; the table check below
 * works it out) and entries outside the pool, positions before the
 * sequence, per-token scales (among them 0, tiny and huge ones) for the
 * 8-bit caches, and new values over every magnitude with NaN, infinities,
 * -0 and ties; then a dense cache with per-head scales. */
static void test_append_matches_cpu(void **state) {
  (void)state;
  enum { kBatch = 7, kPages = 10, kP = 8, kMaxPages = 3, kH = 4, kD = 128, kNew = 5 };
  static const fd_dtype caches[] = {FD_DTYPE_E4M3, FD_DTYPE_E5M2, FD_DTYPE_I8,
                                    FD_DTYPE_F32,  FD_DTYPE_F16,  FD_DTYPE_BF16};
  static const fd_dtype news[] = {FD_DTYPE_F32, FD_DTYPE_F16, FD_DTYPE_BF16};
  const int32_t table[kBatch][kMaxPages] = {{2, 5, 0},      {5, 1, -1}, {-1, 3, 4}, {4, 0, 0},
                                            {1, 1, kPages}, {9, 8, 7},  {5, 6, 0}};
  const int32_t lens[kBatch] = {12, 19, 14, 2, 100, 24, 9};
  /* Who writes which slot of the pool in the paged step (positions L - kNew .. L - 1, L clamped to the
   * capacity): no slot twice (which value lands there would be unspecified), and some page by two
   * sequences. */
  {
    int writer[kPages][kP];
    int shared_pages = 0;
    memset(writer, 0xff, sizeof writer); /* -1: nobody */
    for (int b = 0; b < kBatch; ++b) {
      const int len = lens[b] < kMaxPages * kP ? lens[b] : kMaxPages * kP;
      for (int pos = len - kNew; pos < len; ++pos) {
        const int page = pos < 0 ? -1 : table[b][pos / kP];
        if (page < 0 || page >= kPages) continue; /* before the sequence, or outside the pool: not written */
        if (writer[page][pos % kP] >= 0) fail_msg("slot %d of page %d written twice", pos % kP, page);
        writer[page][pos % kP] = b;
      }
    }
    for (int page = 0; page < kPages; ++page) {
      int first = -1, two = 0;
      for (int slot = 0; slot < kP; ++slot) {
        if (writer[page][slot] < 0) continue;
        if (first < 0) first = writer[page][slot];
        two |= writer[page][slot] != first;
      }
      shared_pages += two;
    }
    if (shared_pages == 0) fail_msg("no page is written by two sequences");
  }
  static const double specials[] = {0.0,   -0.0,    INFINITY, -INFINITY, NAN,    448.0,
                                    464.0, 57344.0, 61440.0,  127.5,     -126.5, 2.5,
                                    1e30,  1e-30,   65520.0,  3.4e38,    1e-40,  0.0625 * 1.0625};
  for (int dense = 0; dense < 2; ++dense) {
    for (int cd = 0; cd < 6; ++cd) {
      for (int nd = 0; nd < 3; ++nd) {
        const fd_dtype cdt = caches[cd], ndt = news[nd];
        const int quantized = fdt_is_quantized(cdt);
        const size_t es = fdt_dtype_size(cdt), nes = fdt_dtype_size(ndt);
        const int64_t cache_elems = dense ? kBatch * kMaxPages * kP * kH * kD : kPages * kP * kH * kD;
        const int64_t scale_elems = dense ? kH : kPages * kP * kH;
        const int64_t new_elems = kBatch * kNew * kH * kD;
        unsigned char *k = malloc((size_t)cache_elems * es), *v = malloc((size_t)cache_elems * es);
        unsigned char *k_cpu = malloc((size_t)cache_elems * es), *v_cpu = malloc((size_t)cache_elems * es);
        void *k_new = malloc((size_t)new_elems * nes), *v_new = malloc((size_t)new_elems * nes);
        float *k_scale = malloc((size_t)scale_elems * sizeof(float)),
              *v_scale = malloc((size_t)scale_elems * sizeof(float));
        assert_true(k && v && k_cpu && v_cpu && k_new && v_new && k_scale && v_scale);
        fdt_rng rng = {g_seed * 31 + (uint64_t)(dense * 64 + cd * 8 + nd)};
        for (int64_t i = 0; i < cache_elems * (int64_t)es; ++i) {
          k[i] = (unsigned char)fdt_next(&rng);
          v[i] = (unsigned char)fdt_next(&rng);
        }
        for (int64_t i = 0; i < scale_elems; ++i) {
          const int64_t kind = fdt_int(&rng, 0, 15);
          k_scale[i] = kind == 0   ? 0.0f
                       : kind == 1 ? 1e-30f
                       : kind == 2 ? 1e30f
                                   : (float)pow(2.0, fdt_uniform(&rng, -12.0, 12.0));
          v_scale[i] = (float)fdt_uniform(&rng, 0.001, 2.0);
        }
        for (int64_t i = 0; i < new_elems; ++i) {
          const double x = fdt_int(&rng, 0, 7) == 0
                               ? specials[fdt_int(&rng, 0, sizeof specials / sizeof specials[0] - 1)]
                               : fdt_uniform(&rng, -1.0, 1.0) * pow(2.0, fdt_uniform(&rng, -30, 20));
          fdt_store(ndt, k_new, i, x);
          fdt_store(ndt, v_new, i, -x * 0.75);
        }
        memcpy(k_cpu, k, (size_t)cache_elems * es);
        memcpy(v_cpu, v, (size_t)cache_elems * es);

        fd_append_args a;
        fd_append_args_init(&a, sizeof a);
        const int64_t new_shape[4] = {kBatch, kNew, kH, kD}, new_strides[4] = {kNew * kH * kD, kH * kD, kD, 1};
        const int64_t lens_shape[1] = {kBatch}, lens_strides[1] = {1};
        a.k_new = fdt_tensor(k_new, ndt, 4, new_shape, new_strides);
        a.v_new = fdt_tensor(v_new, ndt, 4, new_shape, new_strides);
        if (dense) {
          const int64_t shape[4] = {kBatch, kMaxPages * kP, kH, kD};
          const int64_t strides[4] = {kMaxPages * kP * kH * kD, kH * kD, kD, 1};
          const int64_t scale_shape[3] = {kBatch, kMaxPages * kP, kH}, scale_strides[3] = {0, 0, 1};
          a.k = fdt_tensor(k_cpu, cdt, 4, shape, strides);
          a.v = fdt_tensor(v_cpu, cdt, 4, shape, strides);
          if (quantized) {
            a.k_scale = fdt_tensor(k_scale, FD_DTYPE_F32, 3, scale_shape, scale_strides);
            a.v_scale = fdt_tensor(v_scale, FD_DTYPE_F32, 3, scale_shape, scale_strides);
          }
        } else {
          const int64_t shape[4] = {kPages, kP, kH, kD}, strides[4] = {kH * kP * kD, kD, kP * kD, 1};
          const int64_t scale_shape[3] = {kPages, kP, kH}, scale_strides[3] = {kP * kH, kH, 1};
          const int64_t bt_shape[2] = {kBatch, kMaxPages}, bt_strides[2] = {kMaxPages, 1};
          a.k = fdt_tensor(k_cpu, cdt, 4, shape, strides);
          a.v = fdt_tensor(v_cpu, cdt, 4, shape, strides);
          if (quantized) {
            a.k_scale = fdt_tensor(k_scale, FD_DTYPE_F32, 3, scale_shape, scale_strides);
            a.v_scale = fdt_tensor(v_scale, FD_DTYPE_F32, 3, scale_shape, scale_strides);
          }
          a.block_table = fdt_tensor((void *)table, FD_DTYPE_I32, 2, bt_shape, bt_strides);
        }
        a.seq_lens = fdt_tensor((void *)lens, FD_DTYPE_I32, 1, lens_shape, lens_strides);
        if (fd_append_kv(g_cpu, &a, NULL) != FD_SUCCESS) fail_msg("CPU fd_append_kv: %s", last_message());

        /* The same on the device, from the untouched host caches. */
        fd_append_args da = a;
        void *dk = device_copy(k, (size_t)cache_elems * es), *dv = device_copy(v, (size_t)cache_elems * es);
        void *dk_new = device_copy(k_new, (size_t)new_elems * nes),
             *dv_new = device_copy(v_new, (size_t)new_elems * nes);
        void *dk_scale = device_copy(k_scale, (size_t)scale_elems * sizeof(float));
        void *dv_scale = device_copy(v_scale, (size_t)scale_elems * sizeof(float));
        void *dlens = device_copy(lens, sizeof lens), *dtable = device_copy(table, sizeof table);
        da.k.data = dk;
        da.v.data = dv;
        da.k_new.data = dk_new;
        da.v_new.data = dv_new;
        if (quantized) {
          da.k_scale.data = dk_scale;
          da.v_scale.data = dv_scale;
        }
        da.seq_lens.data = dlens;
        if (!dense) da.block_table.data = dtable;
        CUDA_CHECK(cudaDeviceSynchronize());
        const fd_status status = fd_append_kv(g_cuda, &da, (fd_cuda_stream)g_stream);
        CUDA_CHECK(cudaStreamSynchronize(g_stream));
        if (status == FD_SUCCESS) {
          CUDA_CHECK(cudaMemcpy(k, dk, (size_t)cache_elems * es, cudaMemcpyDeviceToHost));
          CUDA_CHECK(cudaMemcpy(v, dv, (size_t)cache_elems * es, cudaMemcpyDeviceToHost));
        }
        void *device[] = {dk, dv, dk_new, dv_new, dk_scale, dv_scale, dlens, dtable};
        for (size_t i = 0; i < sizeof device / sizeof device[0]; ++i) CUDA_CHECK(cudaFree(device[i]));
        /* Bit for bit, except that a NaN in an F32/F16/BF16 cache may have any
         * payload (flashdecode.h does not fix it; 8-bit NaN is always 0x7F). */
        int64_t first_bad = -1;
        int which = 0;
        for (int64_t e = 0; status == FD_SUCCESS && e < cache_elems && first_bad < 0; ++e) {
          for (int w = 0; w < 2 && first_bad < 0; ++w) {
            const unsigned char *got = w ? v : k, *want = w ? v_cpu : k_cpu;
            if (memcmp(got + e * (int64_t)es, want + e * (int64_t)es, es) == 0) continue;
            if (!quantized && isnan(fdt_load(cdt, got, e)) && isnan(fdt_load(cdt, want, e))) continue;
            first_bad = e * (int64_t)es;
            which = w;
          }
        }
        print_message("append %s %s <- %s: %s\n", dense ? "dense" : "paged", fdt_dtype_name(cdt), fdt_dtype_name(ndt),
                      status != FD_SUCCESS ? "failed"
                      : first_bad < 0      ? "bit-identical"
                                           : "DIFFERS");
        char detail[160] = "";
        if (first_bad >= 0) {
          const int64_t e = first_bad / (int64_t)es;
          snprintf(detail, sizeof detail, "%s element %lld: cuda %g, cpu %g", which ? "v" : "k", (long long)e,
                   fdt_load(cdt, which ? v : k, e), fdt_load(cdt, which ? v_cpu : k_cpu, e));
        }
        free(k);
        free(v);
        free(k_cpu);
        free(v_cpu);
        free(k_new);
        free(v_new);
        free(k_scale);
        free(v_scale);
        if (status != FD_SUCCESS) fail_msg("CUDA fd_append_kv: %s: %s", fd_status_string(status), last_message());
        if (first_bad >= 0)
          fail_msg("append %s %s <- %s: %s", dense ? "dense" : "paged", fdt_dtype_name(cdt), fdt_dtype_name(ndt),
                   detail);
      }
    }
  }
}

/* A step of INT32_MAX new tokens broadcast along new_len into a 5-token
 * dense cache: only the last 5 land (every slot of sequence b takes b's
 * rows), and the launch covers those, not new_len. */
static void test_append_long_step(void **state) {
  (void)state;
  enum { kBatch = 3, kCap = 5, kH = 2, kD = 8 };
  float rows[kBatch * kH * kD], cache[kBatch * kCap * kH * kD];
  for (int i = 0; i < kBatch * kH * kD; ++i) rows[i] = (float)(i % 13) - 6.0f;
  memset(cache, 0xff, sizeof cache);
  void *d_rows = device_copy(rows, sizeof rows), *dk = device_copy(cache, sizeof cache);
  void *dv = device_copy(cache, sizeof cache);
  const int64_t new_shape[4] = {kBatch, FD_MAX_KV_LEN, kH, kD}, new_strides[4] = {kH * kD, 0, kD, 1};
  const int64_t shape[4] = {kBatch, kCap, kH, kD}, strides[4] = {kCap * kH * kD, kH * kD, kD, 1};
  fd_append_args a;
  fd_append_args_init(&a, sizeof a);
  a.k_new = fdt_tensor(d_rows, FD_DTYPE_F32, 4, new_shape, new_strides);
  a.v_new = fdt_tensor(d_rows, FD_DTYPE_F32, 4, new_shape, new_strides);
  a.k = fdt_tensor(dk, FD_DTYPE_F32, 4, shape, strides);
  a.v = fdt_tensor(dv, FD_DTYPE_F32, 4, shape, strides);
  const fd_status status = fd_append_kv(g_cuda, &a, (fd_cuda_stream)g_stream);
  CUDA_CHECK(cudaStreamSynchronize(g_stream));
  float k[kBatch * kCap * kH * kD], v[kBatch * kCap * kH * kD];
  CUDA_CHECK(cudaMemcpy(k, dk, sizeof k, cudaMemcpyDeviceToHost));
  CUDA_CHECK(cudaMemcpy(v, dv, sizeof v, cudaMemcpyDeviceToHost));
  CUDA_CHECK(cudaFree(d_rows));
  CUDA_CHECK(cudaFree(dk));
  CUDA_CHECK(cudaFree(dv));
  if (status != FD_SUCCESS) fail_msg("fd_append_kv: %s", last_message());
  for (int b = 0; b < kBatch; ++b) {
    for (int j = 0; j < kCap; ++j) {
      for (int e = 0; e < kH * kD; ++e) {
        assert_true(k[(b * kCap + j) * kH * kD + e] == rows[b * kH * kD + e]);
        assert_true(v[(b * kCap + j) * kH * kD + e] == rows[b * kH * kD + e]);
      }
    }
  }
}

/* A captured decode of a paged e4m3 cache with per-token scales, replayed
 * with new data, lengths, block table and scales (read at run time). */
static void test_quantized_graph_replay(void **state) {
  (void)state;
  fdt_case c = dense_case(FD_DTYPE_F16, 12, 32, 8, 128, g_quick ? 400 : 3000, g_seed + 800);
  c.layout = FDT_PAGED_NHD;
  c.page_size = 16;
  c.ragged = 1;
  c.with_lse = 1;
  c.kv_dtype = FD_DTYPE_E4M3;
  c.scale_mode = FDT_SCALE_TOKEN;
  graph_replay_case(c, "e4m3, token scales, paged", NULL);
  c.layout = FDT_BHND;
  c.dtype = c.out_dtype = FD_DTYPE_BF16;
  c.kv_dtype = FD_DTYPE_I8;
  c.scale_mode = FDT_SCALE_HEAD;
  c.seed = g_seed + 810;
  graph_replay_case(c, "i8, head scales, dense", NULL);
}

/* Same inputs and plan, bitwise-identical outputs (manual and automatic splits). */
static void test_deterministic(void **state) {
  (void)state;
  const int32_t split_choices[] = {9, 0};
  for (int k = 0; k < 2; ++k) {
    fdt_case c = dense_case(FD_DTYPE_BF16, 3, 32, 8, 128, g_quick ? 700 : 5000, g_seed + 99);
    c.layout = FDT_PAGED_HND;
    c.page_size = 16;
    c.ragged = 1;
    c.with_lse = 1;
    c.num_splits = split_choices[k];
    gpu_case t;
    open_case(&t, &c);
    unsigned char *first = malloc(t.p.out_bytes), *first_lse = malloc(t.p.lse_bytes);
    for (int run = 0; run < 3; ++run) {
      if (fdt_cuda_poison_outputs(&t.p, &t.d) != 0) fail_msg("poisoning failed");
      decode_cuda(g_cuda, &t.p, &t.d, g_stream);
      if (run == 0) {
        memcpy(first, t.p.out, t.p.out_bytes);
        memcpy(first_lse, t.p.lse, t.p.lse_bytes);
      } else {
        assert_memory_equal(t.p.out, first, t.p.out_bytes);
        assert_memory_equal(t.p.lse, first_lse, t.p.lse_bytes);
      }
    }
    /* The runs are equal, so checking the last one checks them all. */
    if (fdt_check(&t.p, t.report, sizeof t.report, NULL, NULL)) fail_msg("%s", t.report);
    print_message("deterministic (splits %d): 3 runs bitwise equal; %s\n", (int)c.num_splits, t.report);
    free(first);
    free(first_lse);
    close_case(&t);
  }
}

/* Captures one fd_decode on `stream` in a graph (global capture mode: any
 * allocation, copy or synchronisation inside would break the capture) and
 * instantiates it; the test fails unless fd_decode succeeded. */
static cudaGraphExec_t capture_decode(fd_handle *h, const fd_decode_args *args, cudaStream_t stream,
                                      cudaGraph_t *graph) {
  CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  const fd_status captured = fd_decode(h, args, (fd_cuda_stream)stream);
  CUDA_CHECK(cudaStreamEndCapture(stream, graph));
  if (captured != FD_SUCCESS) fail_msg("fd_decode during capture failed: %s", last_message());
  cudaGraphExec_t exec;
  CUDA_CHECK(cudaGraphInstantiate(&exec, *graph, 0));
  return exec;
}

/* Reserves on h the workspace fd_workspace_size says args need, so that a
 * capture of fd_decode allocates nothing. */
static void reserve_for(fd_handle *h, const fd_decode_args *args) {
  size_t bytes = 0;
  assert_int_equal(fd_workspace_size(h, args, &bytes), FD_SUCCESS);
  assert_int_equal(fd_reserve_workspace(h, bytes), FD_SUCCESS);
}

/* Poisons t's outputs, replays exec on stream, waits and downloads them. */
static void replay_poisoned(gpu_case *t, cudaGraphExec_t exec, cudaStream_t stream) {
  if (fdt_cuda_poison_outputs(&t->p, &t->d) != 0) fail_msg("poisoning failed");
  CUDA_CHECK(cudaGraphLaunch(exec, stream));
  CUDA_CHECK(cudaStreamSynchronize(stream));
  if (fdt_cuda_download(&t->d, &t->p) != 0) fail_msg("download failed");
}

static void destroy_graph(cudaGraphExec_t exec, cudaGraph_t graph, cudaStream_t stream) {
  CUDA_CHECK(cudaGraphExecDestroy(exec));
  CUDA_CHECK(cudaGraphDestroy(graph));
  CUDA_CHECK(cudaStreamDestroy(stream));
}

/* Capturing before the workspace is reserved: fd_decode refuses to allocate
 * during capture, with a message saying what to do, and leaves the capture
 * intact; after fd_reserve_workspace the same capture works. */
static void test_capture_without_reserve(void **state) {
  (void)state;
  fdt_case c = dense_case(FD_DTYPE_F16, 2, 8, 2, 64, 2000, g_seed + 900);
  c.num_splits = 4;
  gpu_case t;
  open_case(&t, &c);
  fd_handle *h = make_handle(FD_BACKEND_CUDA);
  cudaStream_t stream;
  CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaGraph_t graph;
  CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  const fd_status refused = fd_decode(h, &t.d.args, (fd_cuda_stream)stream);
  CUDA_CHECK(cudaStreamEndCapture(stream, &graph)); /* still a valid capture */
  CUDA_CHECK(cudaGraphDestroy(graph));
  assert_int_equal(refused, FD_ERROR_WORKSPACE_TOO_SMALL);
  if (strstr(last_message(), "fd_reserve_workspace") == NULL) fail_msg("unhelpful message: %s", last_message());
  print_message("capture without reserve refused: %s\n", last_message());

  reserve_for(h, &t.d.args);
  const cudaGraphExec_t exec = capture_decode(h, &t.d.args, stream, &graph);
  replay_poisoned(&t, exec, stream);
  if (fdt_check(&t.p, t.report, sizeof t.report, NULL, NULL)) fail_msg("after reserving: %s", t.report);
  destroy_graph(exec, graph, stream);
  assert_int_equal(fd_destroy(h), FD_SUCCESS);
  close_case(&t);
}

/* A captured fd_decode replayed after overwriting q, K, V, seq_lens and the
 * block table in place: a paged ragged batch, a dense one (on sm_90+ the
 * wide tiles), and a paged one of many units (the compact tiles). */
/* round_lens: NULL (random lengths each round), or 3 x batch lengths, a
 * row a round. */
static void graph_replay_case(fdt_case c, const char *what, const int64_t *round_lens) {
  gpu_case t;
  if (round_lens != NULL) c.lens = round_lens;
  open_case(&t, &c);
  fd_handle *h = make_handle(FD_BACKEND_CUDA);
  reserve_for(h, &t.d.args);
  cudaStream_t stream;
  CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));

  cudaGraph_t graph;
  const cudaGraphExec_t exec = capture_decode(h, &t.d.args, stream, &graph);

  for (int round = 0; round < 3; ++round) {
    fdt_problem fresh;
    if (round > 0) { /* new data, new lengths, a new page shuffle; same shapes */
      c.seed = g_seed + 500 + (uint64_t)round * 7919;
      if (round_lens != NULL) c.lens = round_lens + round * c.batch;
      make_problem(&fresh, &c);
      assert_int_equal(fresh.kv_bytes, t.p.kv_bytes);
      if (fdt_cuda_refresh_inputs(&fresh, &t.d) != 0) fail_msg("refreshing the inputs failed");
      fdt_problem_free(&t.p);
      t.p = fresh;
    }
    replay_poisoned(&t, exec, stream);
    const int bad = fdt_check(&t.p, t.report, sizeof t.report, NULL, NULL);
    /* Three lengths, from sequence 6 where there are 9 (the first six of a
     * random batch are its fixed 0, full, 1, 63, 64, 65); -1: no sequence. */
    const int64_t first = c.batch > 8 ? 6 : 0;
    long long shown[3];
    for (int64_t i = 0; i < 3; ++i) shown[i] = first + i < c.batch ? (long long)t.p.lens[first + i] : -1;
    print_message("graph replay, %s, %d (lens[%lld..] %lld %lld %lld): %s\n", what, round, (long long)first, shown[0],
                  shown[1], shown[2], t.report);
    if (bad) fail_msg("graph replay, %s, %d: %s", what, round, t.report);
  }
  destroy_graph(exec, graph, stream);
  assert_int_equal(fd_destroy(h), FD_SUCCESS);
  close_case(&t);
}

static void test_graph_replay(void **state) {
  (void)state;
  /* batch 12: sequences 6.. get random lengths, new ones each round */
  fdt_case c = dense_case(FD_DTYPE_F16, 12, 28, 4, 128, g_quick ? 400 : 3000, g_seed + 500);
  c.layout = FDT_PAGED_NHD;
  c.page_size = 16;
  c.ragged = 1;
  c.with_lse = 1;
  graph_replay_case(c, "paged", NULL);
  c.layout = FDT_BHND;
  c.seed = g_seed + 510;
  graph_replay_case(c, "dense", NULL);
  /* 320 units: the compact tiles on the balanced schedule (test_compact_tiles) */
  c = dense_case(FD_DTYPE_BF16, 40, 32, 8, 128, g_quick ? 400 : 2500, g_seed + 520);
  c.layout = FDT_PAGED_NHD;
  c.page_size = 16;
  c.ragged = 1;
  c.with_lse = 1;
  graph_replay_case(c, "paged, compact tiles", NULL);
}

/* A captured graph replayed with new queries, caches, lengths, block table,
 * slopes and sinks (read on the device at run time): several causal query
 * tokens with a window, a softcap, ALiBi and sinks. */
static void test_variants_graph_replay(void **state) {
  (void)state;
  fdt_case c = dense_case(FD_DTYPE_BF16, 12, 32, 8, 128, g_quick ? 400 : 3000, g_seed + 700);
  c.layout = FDT_PAGED_NHD;
  c.page_size = 16;
  c.ragged = 1;
  c.with_lse = 1;
  c.q_len = 4;
  c.window = g_quick ? 150 : 1000;
  c.softcap = 20.0;
  c.alibi = 2;
  c.sinks = 1;
  graph_replay_case(c, "variants, paged", NULL);
  /* Ragged query lengths (q_lens), new ones every round; the rows kernel. */
  c = dense_case(FD_DTYPE_F16, 12, 32, 8, 128, g_quick ? 400 : 3000, g_seed + 720);
  c.layout = FDT_BHND;
  c.ragged = 1;
  c.ragged_q = 1;
  c.with_lse = 1;
  c.q_len = 6;
  c.sinks = 1;
  graph_replay_case(c, "ragged q_lens, dense", NULL);
}

/* The step of new_len new tokens at the end of each of p's sequences (the
 * positions L - new_len + i that are not negative; flashdecode.h,
 * fd_append_args), as fd_append_kv is to write it. k_new and v_new
 * ([batch, new_len, kv_heads, head_dim] of new_dtype) take p's own values
 * at those positions (0.5 and -0.5 at positions before the sequence, which
 * are never written); p's host cache takes what fd_append_kv stores from
 * them (fdt_append_store: new / scale in float32, rounded into the cache's
 * dtype), its logical ref_k / ref_v the stored value x scale, and the
 * reference is recomputed. pre_k / pre_v (p->kv_bytes each) take the cache
 * as it was before the step: the same bytes, but 0x7f (e4m3 NaN, int8
 * 127) or 0xff (NaN) in every element the step writes. */
static void make_append_step(fdt_problem *p, int64_t new_len, fd_dtype new_dtype, void *k_new, void *v_new,
                             unsigned char *pre_k, unsigned char *pre_v) {
  const fdt_case *c = &p->c;
  const int64_t B = c->batch, N = c->kv_len, Hkv = c->kv_heads, D = c->head_dim;
  const fd_dtype kv_dtype = fdt_kv_dtype(c);
  const size_t es = fdt_dtype_size(kv_dtype);
  const int paged = p->args.block_table.data != NULL;
  const int64_t P = paged ? p->args.k.shape[1] : 0, max_pages = paged ? p->args.block_table.shape[1] : 0;
  memcpy(pre_k, p->k, p->kv_bytes);
  memcpy(pre_v, p->v, p->kv_bytes);
  for (int64_t e = 0; e < B * new_len * Hkv * D; ++e) {
    fdt_store(new_dtype, k_new, e, 0.5);
    fdt_store(new_dtype, v_new, e, -0.5);
  }
  for (int kv = 0; kv < 2; ++kv) {
    const fd_tensor *cache = kv ? &p->args.v : &p->args.k, *scales = kv ? &p->args.v_scale : &p->args.k_scale;
    void *rows = kv ? v_new : k_new;
    double *ref = kv ? p->ref_v : p->ref_k;
    unsigned char *pre = kv ? pre_v : pre_k;
    const size_t offset = (size_t)((const char *)cache->data - (const char *)(kv ? p->v : p->k));
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t i = 0; i < new_len; ++i) {
        const int64_t pos = p->lens[b] - new_len + i;
        if (pos < 0) continue;
        const int64_t outer = paged ? p->block_table[b * max_pages + pos / P] : b, inner = paged ? pos % P : pos;
        for (int64_t g = 0; g < Hkv; ++g) {
          const float *scale = scales->data == NULL ? NULL
                                                    : (const float *)scales->data + outer * scales->strides[0] +
                                                          inner * scales->strides[1] + g * scales->strides[2];
          for (int64_t d = 0; d < D; ++d) {
            const int64_t logical = ((b * N + pos) * Hkv + g) * D + d, row = ((b * new_len + i) * Hkv + g) * D + d;
            const int64_t element = outer * cache->strides[0] + inner * cache->strides[1] + g * cache->strides[2] + d;
            fdt_store(new_dtype, rows, row, ref[logical]);
            fdt_append_store(kv_dtype, cache->data, element, fdt_load(new_dtype, rows, row), scale);
            ref[logical] = fdt_load(kv_dtype, cache->data, element) * (scale ? (double)*scale : 1.0);
            memset(pre + offset + (size_t)element * es, fdt_is_quantized(kv_dtype) ? 0x7f : 0xff, es);
          }
        }
      }
    }
  }
  fdt_reference(p);
}

/* An engine's step in one graph: fd_append_kv of this step's keys and
 * values into a paged cache, then the fd_decode of the same step (q_len
 * the new tokens, causal), captured once (global mode: neither may
 * allocate, copy or synchronise) and replayed three times. Before each
 * replay, on the device: new lengths (every sequence's changes, to and from
 * 0, shorter than the step, across page boundaries, the full capacity), a
 * new block table, new scales, new data, and the step's slots overwritten
 * (NaN or 127), which only the append can restore. After each: the whole
 * cache must be bytewise what fd_append_kv's definition stores
 * (make_append_step; nothing else written, no position before a sequence
 * or past its length), and the decode's output the float64 reference's
 * over that cache. 8-bit caches with per-token and per-head scales, and a
 * bf16 cache. */
static void test_append_graph_replay(void **state) {
  (void)state;
  enum { kBatch = 9, kRounds = 3 };
  static const struct {
    const char *what;
    fd_dtype dtype, kv_dtype, new_dtype;
    fdt_scale_mode scales;
    fdt_layout layout;
    int64_t q_heads, kv_heads, head_dim, kv_len, quick_len, page_size, new_len;
  } spec[] = {
      {"e4m3, per-token scales, pages of 16, one new token", FD_DTYPE_F16, FD_DTYPE_E4M3, FD_DTYPE_F32, FDT_SCALE_TOKEN,
       FDT_PAGED_NHD, 32, 8, 128, 2000, 400, 16, 1},
      {"int8, per-head scales, HND pages of 7, three new tokens", FD_DTYPE_BF16, FD_DTYPE_I8, FD_DTYPE_BF16,
       FDT_SCALE_HEAD, FDT_PAGED_HND, 16, 4, 64, 700, 210, 7, 3},
      {"bf16 cache, pages of 16, two new tokens", FD_DTYPE_BF16, 0, FD_DTYPE_F32, FDT_SCALE_NONE, FDT_PAGED_NHD, 16, 2,
       128, 1000, 300, 16, 2},
  };
  for (size_t i = 0; i < sizeof spec / sizeof spec[0]; ++i) {
    const int64_t P = spec[i].page_size, new_len = spec[i].new_len;
    const int64_t kv_len = g_quick ? spec[i].quick_len : spec[i].kv_len;
    const int64_t N = (kv_len + P - 1) / P * P; /* the capacity, in whole pages (fdt_problem_make) */
    const int64_t edges[kBatch] = {0, 1, 2, P - 1, P, P + 1, N - 1, N, N / 2 + 3};
    int64_t lens[kRounds][kBatch];
    for (int r = 0; r < kRounds; ++r) {
      for (int b = 0; b < kBatch; ++b) lens[r][b] = edges[(b + 4 * r) % kBatch];
    }
    fdt_case c = dense_case(spec[i].dtype, kBatch, spec[i].q_heads, spec[i].kv_heads, spec[i].head_dim, kv_len,
                            g_seed + 1900 + (uint64_t)i * 16);
    c.kv_dtype = spec[i].kv_dtype;
    c.scale_mode = spec[i].scales;
    c.layout = spec[i].layout;
    c.page_size = P;
    c.ragged = 1;
    c.lens = lens[0];
    c.with_lse = 1;
    c.q_len = new_len;
    gpu_case t;
    open_case(&t, &c);
    const int64_t Hkv = c.kv_heads, D = c.head_dim;
    const size_t new_bytes = (size_t)(kBatch * new_len * Hkv * D) * fdt_dtype_size(spec[i].new_dtype);
    const size_t kv_bytes = t.p.kv_bytes;
    void *k_new = malloc(new_bytes), *v_new = malloc(new_bytes);
    unsigned char *pre_k = malloc(kv_bytes), *pre_v = malloc(kv_bytes), *got_k = malloc(kv_bytes),
                  *got_v = malloc(kv_bytes);
    if (!k_new || !v_new || !pre_k || !pre_v || !got_k || !got_v) fail_msg("out of host memory");
    void *dk_new = NULL, *dv_new = NULL;
    CUDA_CHECK(cudaMalloc(&dk_new, new_bytes));
    CUDA_CHECK(cudaMalloc(&dv_new, new_bytes));
    fd_append_args a;
    fd_append_args_init(&a, sizeof a);
    const int64_t new_shape[4] = {kBatch, new_len, Hkv, D}, new_strides[4] = {new_len * Hkv * D, Hkv * D, D, 1};
    a.k_new = fdt_tensor(dk_new, spec[i].new_dtype, 4, new_shape, new_strides);
    a.v_new = fdt_tensor(dv_new, spec[i].new_dtype, 4, new_shape, new_strides);
    a.k = t.d.args.k;
    a.v = t.d.args.v;
    a.k_scale = t.d.args.k_scale;
    a.v_scale = t.d.args.v_scale;
    a.seq_lens = t.d.args.seq_lens;
    a.block_table = t.d.args.block_table;

    fd_handle *h = make_handle(FD_BACKEND_CUDA);
    reserve_for(h, &t.d.args);
    cudaStream_t stream;
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    cudaGraph_t graph;
    CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
    const fd_status appended = fd_append_kv(h, &a, (fd_cuda_stream)stream);
    char append_message[512];
    snprintf(append_message, sizeof append_message, "%s", last_message());
    const fd_status decoded = fd_decode(h, &t.d.args, (fd_cuda_stream)stream);
    CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
    if (appended != FD_SUCCESS) fail_msg("fd_append_kv during capture failed: %s", append_message);
    if (decoded != FD_SUCCESS) fail_msg("fd_decode during capture failed: %s", last_message());
    cudaGraphExec_t exec;
    CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));

    int bad = 0;
    char cache_report[160] = "";
    for (int round = 0; round < kRounds && !bad; ++round) {
      if (round > 0) { /* new data, lengths, page shuffle and scales; the same shapes */
        c.lens = lens[round];
        c.seed = g_seed + 1900 + (uint64_t)i * 16 + (uint64_t)round;
        fdt_problem fresh;
        make_problem(&fresh, &c);
        assert_int_equal(fresh.kv_bytes, t.p.kv_bytes);
        assert_int_equal(fresh.k_scale_bytes, t.p.k_scale_bytes);
        fdt_problem_free(&t.p);
        t.p = fresh;
      }
      make_append_step(&t.p, new_len, spec[i].new_dtype, k_new, v_new, pre_k, pre_v);
      if (fdt_cuda_refresh_inputs(&t.p, &t.d) != 0) fail_msg("refreshing the inputs failed");
      CUDA_CHECK(cudaMemcpy(t.d.k, pre_k, kv_bytes, cudaMemcpyHostToDevice));
      CUDA_CHECK(cudaMemcpy(t.d.v, pre_v, kv_bytes, cudaMemcpyHostToDevice));
      CUDA_CHECK(cudaMemcpy(dk_new, k_new, new_bytes, cudaMemcpyHostToDevice));
      CUDA_CHECK(cudaMemcpy(dv_new, v_new, new_bytes, cudaMemcpyHostToDevice));
      replay_poisoned(&t, exec, stream); /* synchronises the device first */
      CUDA_CHECK(cudaMemcpy(got_k, t.d.k, kv_bytes, cudaMemcpyDeviceToHost));
      CUDA_CHECK(cudaMemcpy(got_v, t.d.v, kv_bytes, cudaMemcpyDeviceToHost));
      for (size_t byte = 0; byte < kv_bytes && cache_report[0] == '\0'; ++byte) {
        for (int kv = 0; kv < 2; ++kv) {
          const unsigned char got = (kv ? got_v : got_k)[byte],
                              want = ((const unsigned char *)(kv ? t.p.v : t.p.k))[byte];
          if (got != want && cache_report[0] == '\0') {
            snprintf(cache_report, sizeof cache_report,
                     "%s cache byte %zu: 0x%02x, expected 0x%02x (before the step 0x%02x)", kv ? "v" : "k", byte, got,
                     want, (kv ? pre_v : pre_k)[byte]);
          }
        }
      }
      bad = fdt_check(&t.p, t.report, sizeof t.report, NULL, NULL) != 0 || cache_report[0] != '\0';
      print_message("append + decode graph, %s, replay %d (lens %lld %lld %lld ...): cache %s; %s\n", spec[i].what,
                    round, (long long)t.p.lens[0], (long long)t.p.lens[1], (long long)t.p.lens[2],
                    cache_report[0] ? cache_report : "bytewise as defined", t.report);
    }
    destroy_graph(exec, graph, stream);
    assert_int_equal(fd_destroy(h), FD_SUCCESS);
    CUDA_CHECK(cudaFree(dk_new));
    CUDA_CHECK(cudaFree(dv_new));
    free(k_new);
    free(v_new);
    free(pre_k);
    free(pre_v);
    free(got_k);
    free(got_v);
    close_case(&t);
    if (bad)
      fail_msg("append + decode graph, %s: %s%s%s", spec[i].what, cache_report, cache_report[0] ? "; " : "", t.report);
  }
}

/* ---- ragged batches of many shapes ----------------------------------------- */
/* Dense ragged batches with automatic splits (on sm_90+ the wide tiles,
 * fused merges of splits planned on the capacity), lengths 0, full, 1, 63,
 * 64, 65, then random: a serving batch, one long sequence among five short
 * ones, groups of 5 (head_dim 96) and 64 (four chunks of 16), MHA with
 * head_dim 64 and 256, 130 and 600 sequences; each against the reference
 * and twice bitwise equal. */
static void test_ragged_batches(void **state) {
  (void)state;
  static const struct {
    fd_dtype dtype;
    int64_t batch, q_heads, kv_heads, head_dim, kv_len;
  } spec[] = {
      {FD_DTYPE_F16, 16, 32, 8, 128, 4000},  {FD_DTYPE_BF16, 6, 8, 1, 128, 20000},
      {FD_DTYPE_F16, 37, 40, 8, 96, 2500},   {FD_DTYPE_BF16, 5, 64, 1, 128, 3000},
      {FD_DTYPE_F16, 64, 8, 8, 64, 1500},    {FD_DTYPE_BF16, 3, 16, 16, 256, 5000},
      {FD_DTYPE_F16, 130, 16, 2, 128, 2000}, {FD_DTYPE_BF16, 600, 8, 8, 128, 300},
  };
  for (size_t i = 0; i < sizeof spec / sizeof spec[0]; ++i) {
    fdt_case c = dense_case(spec[i].dtype, spec[i].batch, spec[i].q_heads, spec[i].kv_heads, spec[i].head_dim,
                            g_quick ? spec[i].kv_len / 4 : spec[i].kv_len, g_seed + 1100 + (uint64_t)i);
    c.layout = i % 2 ? FDT_BNHD : FDT_BHND;
    c.ragged = 1;
    c.with_lse = 1;
    const planned_check r = check_planned_case(&c);
    const fd_plan_info plan = r.plan;
    print_message("ragged batch %zu: %lldx%lld/%lldx%lldx%lld (%s, %d x %lld, merge %d): %s\n", i, (long long)c.batch,
                  (long long)c.q_heads, (long long)c.kv_heads, (long long)c.kv_len, (long long)c.head_dim, plan.kernel,
                  (int)plan.num_splits, (long long)plan.split_tokens, (int)plan.merge, r.report);
    char what[32];
    snprintf(what, sizeof what, "%zu", i);
    expect_checked(&r, "ragged batch", what);
  }
}

/* ---- the balanced schedule ----------------------------------------------------- */
/* Paged caches with per-sequence lengths and automatic splits run the
 * balanced schedule (prims/schedule.cuh): every resident CTA takes an equal
 * run of the batch's real keys, and units cut between runs merge in the
 * split kernel. Lengths that stress the cut, each against the reference and
 * twice bitwise equal: a few long sequences among many short and empty
 * ones, one long sequence (too few units to cut: the fixed schedule), 40
 * MQA units whose ten long ones take some 20 pieces each (several batches
 * of the merge's loads on 264 workers), head_dim 256 (four items a thread
 * reuse its load slots), a batch past one warp's scan with several query
 * tokens under a window, float outputs on the
 * CUDA-core kernel, an 8-bit cache, and more units than the merge counters
 * hold (the fixed schedule). `long_every`: every long_every-th sequence is
 * kv_len long, the others at most kv_len / 16 (0: the generated lengths). */
/* The next of a test's reproducible draws (a 64-bit LCG's high bits) below n. */
static int64_t draw_below(uint64_t *rng, int64_t n) {
  *rng = *rng * 6364136223846793005ull + 1442695040888963407ull;
  return (int64_t)((*rng >> 33) % (uint64_t)n);
}

/* A case of the paged schedule tests below: pages of 16 tokens in `layout`
 * (a paged one), per-sequence lengths, LSE; an 8-bit kv_dtype (0: the cache
 * is dtype) with `scales`. */
static fdt_case paged_lengths_case(fd_dtype dtype, fd_dtype kv_dtype, fdt_scale_mode scales, fdt_layout layout,
                                   int64_t batch, int64_t q_heads, int64_t kv_heads, int64_t head_dim, int64_t kv_len,
                                   uint64_t seed) {
  fdt_case c = dense_case(dtype, batch, q_heads, kv_heads, head_dim, kv_len, seed);
  c.kv_dtype = kv_dtype;
  if (kv_dtype != 0) c.scale_mode = scales;
  c.layout = layout;
  c.page_size = 16;
  c.ragged = 1;
  c.with_lse = 1;
  return c;
}

/* Paged batches on the balanced schedule (and two that must not be). Each
 * case's schedule is pinned on the host by test_cuda_policy's
 * test_gpu_test_schedules: change both together. */
static void test_balanced_schedule(void **state) {
  (void)state;
  static const struct {
    const char *what;
    fd_dtype dtype, out_dtype, kv_dtype;
    fdt_layout layout;
    int64_t batch, q_heads, kv_heads, head_dim, kv_len, q_len, window;
    int long_every;
    int balanced; /* whether fd_describe_plan must report the device's cut (0 splits) */
  } spec[] = {
      {"skewed", FD_DTYPE_F16, FD_DTYPE_F16, 0, FDT_PAGED_NHD, 60, 8, 2, 128, 6000, 1, 0, 10, 1},
      {"one sequence: fixed splits", FD_DTYPE_BF16, FD_DTYPE_BF16, 0, FDT_PAGED_HND, 1, 8, 1, 128, 30000, 1, 0, 1, 0},
      {"40 units, a few long ones of many pieces", FD_DTYPE_BF16, FD_DTYPE_BF16, 0, FDT_PAGED_HND, 40, 8, 1, 128, 20000,
       1, 0, 4, 1},
      {"head_dim 256, 2 KV heads", FD_DTYPE_F16, FD_DTYPE_F16, 0, FDT_PAGED_NHD, 20, 16, 2, 256, 12000, 1, 0, 1, 1},
      {"q_len 3, window", FD_DTYPE_BF16, FD_DTYPE_BF16, 0, FDT_PAGED_HND, 45, 16, 4, 64, 3000, 3, 700, 0, 1},
      {"MHA, head_dim 64", FD_DTYPE_F16, FD_DTYPE_F16, 0, FDT_PAGED_NHD, 40, 16, 16, 64, 3000, 1, 0, 7, 1},
      {"float out", FD_DTYPE_F16, FD_DTYPE_F32, 0, FDT_PAGED_NHD, 50, 8, 2, 96, 2000, 1, 0, 5, 1},
      {"e4m3 cache", FD_DTYPE_F16, FD_DTYPE_F16, FD_DTYPE_E4M3, FDT_PAGED_NHD, 36, 32, 8, 128, 1500, 1, 0, 0, 1},
      {"units past the counters", FD_DTYPE_F16, FD_DTYPE_F16, 0, FDT_PAGED_NHD, 2100, 8, 8, 32, 32, 1, 0, 0, 0},
  };
  for (size_t i = 0; i < sizeof spec / sizeof spec[0]; ++i) {
    const int64_t kv_len = g_quick && spec[i].kv_len > 1000 ? spec[i].kv_len / 4 : spec[i].kv_len;
    fdt_case c =
        paged_lengths_case(spec[i].dtype, spec[i].kv_dtype, FDT_SCALE_TENSOR, spec[i].layout, spec[i].batch,
                           spec[i].q_heads, spec[i].kv_heads, spec[i].head_dim, kv_len, g_seed + 1300 + (uint64_t)i);
    c.out_dtype = spec[i].out_dtype;
    c.q_len = spec[i].q_len;
    c.window = spec[i].window;
    int64_t *lens = malloc((size_t)c.batch * sizeof *lens);
    if (lens == NULL) fail_msg("out of host memory");
    if (spec[i].long_every > 0) {
      uint64_t rng = g_seed + 1350 + (uint64_t)i;
      for (int64_t b = 0; b < c.batch; ++b) {
        const int64_t short_len = draw_below(&rng, kv_len / 16 + 1);
        lens[b] = b % spec[i].long_every == spec[i].long_every / 2 ? kv_len - (b % 3) : short_len;
        if (b % 11 == 3) lens[b] = 0;
      }
      c.lens = lens;
    }
    const planned_check r = check_planned_case(&c);
    free(lens);
    const fd_plan_info plan = r.plan;
    if ((plan.num_splits == 0) != spec[i].balanced) {
      fail_msg("balanced schedule, %s: planned %d splits of %lld", spec[i].what, (int)plan.num_splits,
               (long long)plan.split_tokens);
    }
    print_message("balanced schedule, %s: %lldx%lld/%lld, capacity %lld x %lld (%s, %lld blocks, merge %d): %s\n",
                  spec[i].what, (long long)c.batch, (long long)c.q_heads, (long long)c.kv_heads, (long long)kv_len,
                  (long long)c.head_dim, plan.kernel, (long long)plan.blocks, (int)plan.merge, r.report);
    expect_checked(&r, "balanced schedule", spec[i].what);
  }
}

/* Paged batches of few units (sequence, KV head) with per-sequence lengths:
 * automatic fixed splits, which the kernels fit to the lengths instead of
 * the capacity on a grid of one wave (each CTA one piece with keys, the
 * empty states of shorter sequences' splits shared out after them), and the
 * merge kernel merges only the splits in use (policy.cpp,
 * fitted_split_floor). A cut that left a key out or read one twice, an
 * empty state not written, or a merge of a skipped split's stale state,
 * shows in the reference check (outputs poisoned first). Each case's plan
 * is pinned on the host by test_cuda_policy's test_gpu_test_schedules. */
static void test_fitted_splits(void **state) {
  (void)state;
  static const struct {
    const char *what;
    fd_dtype dtype, kv_dtype;
    fdt_layout layout;
    int64_t batch, q_heads, kv_heads, head_dim, capacity, longest, q_len, window;
    int ragged_q;
    int64_t short_below;  // > 0: every sequence but the last shorter than this, every other one empty
  } spec[] = {
      {"paged, 4 units", FD_DTYPE_F16, 0, FDT_PAGED_NHD, 2, 16, 2, 64, 65536, 3000, 1, 0, 0, 0},
      {"a sequence of length 0", FD_DTYPE_BF16, 0, FDT_PAGED_NHD, 3, 12, 3, 64, 32768, 2500, 1, 0, 0, 0},
      {"q_len 4, wide window, ragged queries", FD_DTYPE_F16, 0, FDT_PAGED_HND, 2, 8, 2, 128, 32768, 4000, 4, 20000, 1,
       0},
      {"e4m3, head_dim 256", FD_DTYPE_F16, FD_DTYPE_E4M3, FDT_PAGED_NHD, 1, 16, 2, 256, 32768, 3001, 1, 0, 0, 0},
      /* One wave of pieces with keys, all on the long sequence; the short
       * and empty ones' splits in use are empty states spread over the
       * grid, several a CTA. */
      {"one long sequence among short and empty ones", FD_DTYPE_F16, 0, FDT_PAGED_NHD, 6, 8, 1, 128, 65536, 50000, 1, 0,
       0, 300},
      {"table as wide as the longest", FD_DTYPE_BF16, 0, FDT_PAGED_NHD, 4, 8, 1, 128, 40000, 40000, 1, 0, 0, 0},
      /* One split in use: the split kernel writes out and lse itself, the
       * empty sequences' rows too, and the merge kernel returns. */
      {"every sequence within its first split", FD_DTYPE_F16, 0, FDT_PAGED_NHD, 5, 8, 1, 128, 65536, 100, 1, 0, 0, 100},
      {"one sequence within one split, q_len 3", FD_DTYPE_BF16, 0, FDT_PAGED_HND, 1, 32, 8, 128, 131072, 90, 3, 0, 0,
       0},
  };
  for (size_t i = 0; i < sizeof spec / sizeof spec[0]; ++i) {
    const int64_t capacity = g_quick ? spec[i].capacity / 4 : spec[i].capacity;
    const int64_t longest = spec[i].longest < capacity ? spec[i].longest : capacity;
    fdt_case c =
        paged_lengths_case(spec[i].dtype, spec[i].kv_dtype, FDT_SCALE_HEAD, spec[i].layout, spec[i].batch,
                           spec[i].q_heads, spec[i].kv_heads, spec[i].head_dim, capacity, g_seed + 1400 + (uint64_t)i);
    c.q_len = spec[i].q_len;
    c.window = spec[i].window;
    c.ragged_q = spec[i].ragged_q;
    int64_t lens[8];
    uint64_t rng = g_seed + 1450 + (uint64_t)i;
    for (int64_t b = 0; b < c.batch; ++b) {
      const int64_t drawn = draw_below(&rng, spec[i].short_below > 0 ? spec[i].short_below : longest);
      lens[b] = b == c.batch - 1 ? longest : spec[i].short_below > 0 && b % 2 == 1 ? 0 : drawn;
    }
    if (c.batch == 3) lens[1] = 0;
    c.lens = lens;
    const planned_check r = check_planned_case(&c);
    const fd_plan_info plan = r.plan;
    print_message(
        "fitted splits, %s: %lldx%lld/%lld, capacity %lld, longest %lld x %lld (%s, %d splits of up to %lld, "
        "merge %d): %s\n",
        spec[i].what, (long long)c.batch, (long long)c.q_heads, (long long)c.kv_heads, (long long)capacity,
        (long long)longest, (long long)c.head_dim, plan.kernel, (int)plan.num_splits, (long long)plan.split_tokens,
        (int)plan.merge, r.report);
    if (plan.num_splits < 2) fail_msg("fitted splits, %s: planned %d splits", spec[i].what, (int)plan.num_splits);
    expect_checked(&r, "fitted splits", spec[i].what);
  }
  /* One captured graph, its lengths moving between one split in use and
   * many: the split kernel writes the output while every sequence is within
   * its first split, the merge kernel merges otherwise. */
  static const int64_t round_lens[3][3] = {{100, 0, 60}, {3000, 70, 0}, {128, 1, 127}};
  const fdt_case c = paged_lengths_case(FD_DTYPE_F16, 0, FDT_SCALE_HEAD, FDT_PAGED_NHD, 3, 16, 2, 128,
                                        g_quick ? 8192 : 32768, g_seed + 1490);
  graph_replay_case(c, "fitted splits, one in use and many", &round_lens[0][0]);
}

/* Paged and dense batches on the fixed schedule, more than a wave of CTAs,
 * lengths on the device: the grid's rows take their sequences longest
 * first (policy.cpp, kLongestFirstMaxBatch), in the order a kernel ahead of
 * the split kernel writes (kernels/sequence_order.cuh). An order that
 * attended a sequence twice or left one out shows in the reference check
 * (outputs poisoned first): lengths drawn, all alike, one long among short,
 * many ties over several of the order kernel's chunks of 1024 sequences;
 * a graph replayed over new lengths reorders without a new plan. Many
 * units of short capacity: the float64 reference holds every slot. Each
 * case's ordered plan is pinned on the host by test_cuda_policy's
 * test_gpu_test_schedules: change both together. */
static void test_longest_first(void **state) {
  (void)state;
  enum { kDrawn, kAlike, kOneLong, kTies };
  static const struct {
    const char *what;
    fd_dtype dtype, kv_dtype;
    fdt_layout layout;
    int64_t batch, q_heads, kv_heads, head_dim, capacity, q_len, window;
    int lengths;
  } spec[] = {
      {"lengths drawn", FD_DTYPE_F16, 0, FDT_PAGED_NHD, 270, 16, 8, 64, 512, 1, 0, kDrawn},
      {"all alike", FD_DTYPE_BF16, 0, FDT_PAGED_HND, 270, 16, 8, 64, 512, 1, 0, kAlike},
      {"one long among short, q_len 2, window", FD_DTYPE_F16, 0, FDT_PAGED_NHD, 270, 16, 8, 64, 512, 2, 450, kOneLong},
      {"many ties, 2500 sequences", FD_DTYPE_F16, 0, FDT_PAGED_NHD, 2500, 2, 1, 64, 512, 1, 0, kTies},
      {"e4m3 cache, dense", FD_DTYPE_F16, FD_DTYPE_E4M3, FDT_BNHD, 72, 32, 8, 64, 800, 1, 0, kDrawn},
      {"dense cache", FD_DTYPE_BF16, 0, FDT_BNHD, 200, 8, 4, 64, 800, 1, 0, kDrawn},
  };
  int sms = 0;
  CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  for (size_t i = 0; i < sizeof spec / sizeof spec[0]; ++i) {
    const int64_t capacity = spec[i].capacity;
    fdt_case c =
        paged_lengths_case(spec[i].dtype, spec[i].kv_dtype, FDT_SCALE_HEAD, spec[i].layout, spec[i].batch,
                           spec[i].q_heads, spec[i].kv_heads, spec[i].head_dim, capacity, g_seed + 1500 + (uint64_t)i);
    if (spec[i].layout == FDT_BNHD) c.page_size = 0;
    c.q_len = spec[i].q_len;
    c.window = spec[i].window;
    int64_t *lens = malloc((size_t)c.batch * sizeof *lens);
    if (lens == NULL) fail_msg("out of host memory");
    uint64_t rng = g_seed + 1550 + (uint64_t)i;
    for (int64_t b = 0; b < c.batch; ++b) {
      const int64_t ties[] = {0, 17, 300, 301, capacity};
      switch (spec[i].lengths) {
        case kDrawn: lens[b] = b % 13 == 5 ? 0 : draw_below(&rng, capacity + 1); break;
        case kAlike: lens[b] = capacity - 5; break;
        case kOneLong: lens[b] = b == c.batch / 2 ? capacity : b % 7 == 0 ? 0 : draw_below(&rng, capacity / 20); break;
        default: lens[b] = ties[draw_below(&rng, 5)]; break;
      }
    }
    c.lens = lens;
    const planned_check r = check_planned_case(&c);
    free(lens);
    const fd_plan_info plan = r.plan;
    print_message(
        "longest first, %s: %lldx%lld/%lld, capacity %lld x %lld (%s, %d splits, %lld blocks, merge %d): %s\n",
        spec[i].what, (long long)c.batch, (long long)c.q_heads, (long long)c.kv_heads, (long long)capacity,
        (long long)c.head_dim, plan.kernel, (int)plan.num_splits, (long long)plan.blocks, (int)plan.merge, r.report);
    /* Not balanced (0 splits) and more than a wave: at most 4 CTAs a multiprocessor. */
    if (plan.num_splits == 0 || plan.blocks <= 4 * (int64_t)sms) {
      fail_msg("longest first, %s: %d splits, %lld blocks", spec[i].what, (int)plan.num_splits, (long long)plan.blocks);
    }
    expect_checked(&r, "longest first", spec[i].what);
  }
  /* One graph over three rounds of lengths, each in another order. */
  enum { kBatch = 270, kCapacity = 512 };
  static int64_t round_lens[3][kBatch];
  uint64_t rng = g_seed + 1590;
  for (int64_t b = 0; b < kBatch; ++b) {
    round_lens[0][b] = draw_below(&rng, kCapacity + 1);
    round_lens[1][b] = b % 9 == 0 ? kCapacity : draw_below(&rng, 20);
    round_lens[2][b] = kCapacity - round_lens[0][b];
  }
  const fdt_case c =
      paged_lengths_case(FD_DTYPE_F16, 0, FDT_SCALE_HEAD, FDT_PAGED_NHD, kBatch, 16, 8, 64, kCapacity, g_seed + 1595);
  graph_replay_case(c, "longest first, lengths reordered between replays", &round_lens[0][0]);
}

/* Plans c on the shared handle, checks it twice against the reference
 * (bitwise equal runs) and that the plan's kernel starts with `kernel`
 * ("tensor-core-": the standard or wide tiles, not the rows, compact or
 * 8-bit kernels). */
static void expect_case_on_kernel(const fdt_case *c, const char *test, const char *what, const char *kernel) {
  const planned_check r = check_planned_case(c);
  const fd_plan_info plan = r.plan;
  print_message("%s, %s: %lldx%lld/%lld x %lld x %lld, q_len %lld%s (%s, %d splits, merge %d): %s\n", test, what,
                (long long)c->batch, (long long)c->q_heads, (long long)c->kv_heads, (long long)c->kv_len,
                (long long)c->head_dim, (long long)c->q_len, c->ragged_q ? " ragged" : "", plan.kernel,
                (int)plan.num_splits, (int)plan.merge, r.report);
  const int other_tensor_core = starts_with(plan.kernel, "tensor-core-rows") ||
                                starts_with(plan.kernel, "tensor-core-compact-") ||
                                starts_with(plan.kernel, "tensor-core-8bit-");
  if (!starts_with(plan.kernel, kernel) || (strcmp(kernel, "tensor-core-") == 0 && other_tensor_core)) {
    fail_msg("%s, %s: kernel %s", test, what, plan.kernel);
  }
  expect_checked(&r, test, what);
}

/* Whether the CUDA backend plans compact tiles for spec on this device
 * (kernel_spec_compact_planned). */
static int compact_tiles_planned(const kernel_spec *spec) {
  int sms = 0, cc_major = 0;
  CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  CUDA_CHECK(cudaDeviceGetAttribute(&cc_major, cudaDevAttrComputeCapabilityMajor, 0));
  return kernel_spec_compact_planned(spec, sms, cc_major);
}

/* Whether this device and build plan the wide 64-row rows kernel (sm_90 in
 * sm_90a builds): a 64-row problem's plan names it. */
static int wide_rows_kernel_planned(void) {
  static int planned = -1;
  if (planned < 0) {
    fdt_case c = dense_case(FD_DTYPE_F16, 1, 8, 1, 128, 256, g_seed);
    c.q_len = 8;
    gpu_case t;
    open_case(&t, &c);
    planned = starts_with(describe(g_cuda, &t.d.args).kernel, "tensor-core-rows64-wide-");
    close_case(&t);
  }
  return planned;
}

/* Builds spec's case (a quarter of kv_len in quick mode), with LSE, and
 * checks it with expect_case_on_kernel on the kernel kernel_spec_expected
 * names for this device. */
static void expect_spec_on_kernel_scaled(const kernel_spec *spec, const char *test, uint64_t seed,
                                         fdt_scale_mode scale_mode, int wide_scales) {
  const int64_t kv_len = g_quick ? spec->kv_len / 4 : spec->kv_len;
  const char *kernel =
      kernel_spec_expected(spec, kv_len, g_quick, compact_tiles_planned(spec), wide_rows_kernel_planned());
  fdt_case c = dense_case(spec->dtype, spec->batch, spec->q_heads, spec->kv_heads, spec->head_dim, kv_len, seed);
  c.kv_dtype = spec->kv_dtype;
  c.scale_mode = spec->kv_dtype ? scale_mode : FDT_SCALE_NONE;
  c.wide_scales = spec->kv_dtype ? wide_scales : 0;
  c.layout = spec->layout;
  c.page_size = spec->page_size;
  c.q_len = spec->q_len;
  c.window = spec->window;
  c.softcap = spec->softcap;
  c.alibi = spec->alibi;
  c.sinks = spec->sinks;
  c.ragged = spec->ragged;
  c.ragged_q = spec->ragged_q;
  c.num_splits = spec->splits;
  c.with_lse = 1;
  expect_case_on_kernel(&c, test, spec->what, kernel);
}

/* expect_spec_on_kernel_scaled with per-head scales for an 8-bit cache. */
static void expect_spec_on_kernel(const kernel_spec *spec, const char *test, uint64_t seed) {
  expect_spec_on_kernel_scaled(spec, test, seed, FDT_SCALE_HEAD, 0);
}

/* ---- over 16 query rows a KV head -------------------------------------------- */
/* Several query tokens x the GQA group, or a group above 16: the rows kernels
 * take up to 32 rows of a KV head in one CTA (two m-tiles, four warps along
 * each one's tokens) or, above 32, up to 64 (four m-tiles, a warp each over
 * whole tiles; warps of m-tiles without real rows idle, but on sm_90a, where
 * the four warps are one wgmma warpgroup, they compute). Against the float64
 * reference, twice bitwise equal, and the plan names the kernel: 17-32 rows
 * (on sm_90 the wide 64-row kernel where splits are long and fit one wave),
 * 33-64 rows, 128 rows in two chunks, the variants' scoring (the plain causal
 * fast path and softcap + ALiBi), splits and merges, paged and balanced,
 * head_dim 64/96/128; 16 rows and head_dim 256 keep the standard tiles. */
static void test_rows_kernel(void **state) {
  (void)state;
  for (size_t i = 0; i < sizeof rows_kernel_specs / sizeof rows_kernel_specs[0]; ++i)
    expect_spec_on_kernel(&rows_kernel_specs[i], "rows", g_seed + 1400 + (uint64_t)i);
}

/* ---- ragged query lengths --------------------------------------------------------- */
/* q_lens on every kernel family (the plan's kernel is checked): each
 * sequence its own query tokens (0, all, 1, then random), q's padding
 * tokens NaN (never read); against the reference and twice bitwise equal. */
static void test_ragged_query_lengths(void **state) {
  (void)state;
  for (size_t i = 0; i < sizeof ragged_query_specs / sizeof ragged_query_specs[0]; ++i)
    expect_spec_on_kernel(&ragged_query_specs[i], "ragged q_lens", g_seed + 1500 + (uint64_t)i);
}

/* ---- 8-bit caches on tensor cores ------------------------------------------- */
/* Up to 8 query rows a KV head run the keys on the MMA's M
 * (tensor-core-8bit-keys-*): every format and q dtype, per-tensor,
 * per-head and per-token scales, dense, strided and paged (pages of 1, 16
 * and 7 tokens), ragged lengths and query lengths, MHA, head_dim 64, 96,
 * 128 and 256, the variants (causal steps, window, softcap, ALiBi, sinks),
 * automatic and manual splits (fused merge and merge kernel), the balanced
 * schedule, scales over 2^-12 .. 2^12 with zeros; more rows keep the
 * 16-row kernel. Each against the reference and twice bitwise equal; the
 * plan names the kernel. */
static void test_8bit_kernels(void **state) {
  (void)state;
  _Static_assert(sizeof kernel_8bit_scales / sizeof kernel_8bit_scales[0] ==
                     sizeof kernel_8bit_specs / sizeof kernel_8bit_specs[0],
                 "a scale mode a case");
  for (size_t i = 0; i < sizeof kernel_8bit_specs / sizeof kernel_8bit_specs[0]; ++i) {
    expect_spec_on_kernel_scaled(&kernel_8bit_specs[i], "8-bit kernels", g_seed + 1700 + (uint64_t)i,
                                 kernel_8bit_scales[i].mode, kernel_8bit_scales[i].wide);
  }
}

/* ---- every 8-bit code inside a sequence ---------------------------------------- */
/* The value of byte `code` of an 8-bit cache format, from the formats'
 * definitions in flashdecode.h (fd_dtype), written apart from
 * fdt_fp8_value: int8 in two's complement; e4m3 with exponent bias 7, no
 * infinity, S.1111.111 NaN; e5m2 with bias 15, exponent 31 infinity
 * (mantissa 0) or NaN; exponent 0 subnormal in both. */
static double decode_8bit(fd_dtype format, unsigned code) {
  if (format == FD_DTYPE_I8) return code < 128 ? (double)code : (double)code - 256.0;
  const int e4m3 = format == FD_DTYPE_E4M3;
  const unsigned mantissa_bits = e4m3 ? 3u : 2u, exponent_top = e4m3 ? 0xfu : 0x1fu;
  const int bias = e4m3 ? 7 : 15;
  const double sign = (code & 0x80u) ? -1.0 : 1.0;
  const unsigned exponent = (code >> mantissa_bits) & exponent_top, mantissa = code & ((1u << mantissa_bits) - 1u);
  if (e4m3 && exponent == exponent_top && mantissa == 7u) return NAN;
  if (!e4m3 && exponent == exponent_top) return mantissa != 0 ? NAN : sign * INFINITY;
  const double fraction = (double)mantissa / (double)(1u << mantissa_bits);
  if (exponent == 0) return sign * fraction * pow(2.0, 1 - bias);
  return sign * (1.0 + fraction) * pow(2.0, (int)exponent - bias);
}

/* Every byte of each 8-bit format inside a sequence, exactly (flashdecode.h,
 * "Quantized caches": both backends decode the formats exactly). Sequences
 * of one token (a dense cache of capacity 1), so that the softmax weight is
 * exactly 1, whose V rows hold all 256 codes (code (row x 128 + d) x 37 +
 * 11: each 4 times, in different dims and heads); q random in [-2, 2], K
 * random finite codes. Each output element must be decode_8bit(code) x its
 * V scale exactly (NaN codes NaN, e5m2's infinities infinite; 0 and -0 are
 * not told apart), and the LSE the float64 score within 1e-4. Every
 * kernel that takes 8-bit caches, the plan names it:
 * - cuda-core-8bit (f32 out): m is the token's score, its weight
 *   ex2.approx.ftz(score - m) = ex2(+0), which PTX defines as exactly 1;
 *   l = 1, acc = 1 x value (x scale in one float product, or per token
 *   fmaf(1 x scale, value, 0)), out = acc x (1 / 1). The codes reach float
 *   through fp16, where each is exact; scales with at most 3 significant
 *   bits keep value x scale exact in float (0 among them: 0 x inf is NaN on
 *   both sides).
 * - tensor-core-8bit-keys and tensor-core-8bit (16-bit out): P =
 *   exp2(score - (m - 15)) is 2^15 (1 + e) with |e| below 2^-16 (m - 15
 *   rounds in float), rounded to 16 bits for the MMA: exactly 2^15. V's
 *   codes multiply in fp16 or q's type, exactly (per-token scales of a
 *   power of two fold into V or P exactly), so acc = 2^15 x value x scale
 *   exactly, and out = acc / l = value x scale x (1 - e'), |e'| below 2^-15:
 *   rounding to f16 or bf16 gives value x scale back, since it is
 *   representable there (e4m3 and e5m2 values are f16 values, int8 needs 7
 *   significant bits of bf16's 8) and e' is far below half their spacing.
 *   So these outputs are exact too, by rounding rather than by arithmetic;
 *   scales are powers of two (at most 1 for an f16 q, whose range the
 *   dequantized values must stay in). */
static void test_8bit_codes_exact(void **state) {
  (void)state;
  enum { kBatch = 4, kD = 128 };
  static const fd_dtype formats[] = {FD_DTYPE_E4M3, FD_DTYPE_E5M2, FD_DTYPE_I8};
  static const struct {
    const char *what;
    fd_dtype q, out;
    int64_t q_heads, kv_heads;
    fdt_scale_mode v_scales; /* k_scale is absent (1) */
    const char *kernel;      /* the plan's kernel */
  } spec[] = {
      {"f16 -> f32, group 4, no scales", FD_DTYPE_F16, FD_DTYPE_F32, 8, 2, FDT_SCALE_NONE, "cuda-core-8bit-128"},
      {"bf16 -> f32, MHA, per-token scales", FD_DTYPE_BF16, FD_DTYPE_F32, 4, 4, FDT_SCALE_TOKEN, "cuda-core-8bit-128"},
      {"f16, group 4, per-head scales", FD_DTYPE_F16, FD_DTYPE_F16, 8, 2, FDT_SCALE_HEAD, "tensor-core-8bit-keys-128"},
      {"bf16, group 2, per-token scales", FD_DTYPE_BF16, FD_DTYPE_BF16, 4, 2, FDT_SCALE_TOKEN,
       "tensor-core-8bit-keys-128"},
      {"f16, group 16, per-tensor scale", FD_DTYPE_F16, FD_DTYPE_F16, 32, 2, FDT_SCALE_TENSOR, "tensor-core-8bit-128"},
      {"bf16, group 16, per-token scales", FD_DTYPE_BF16, FD_DTYPE_BF16, 32, 2, FDT_SCALE_TOKEN,
       "tensor-core-8bit-128"},
  };
  /* V scales, by (sequence x KV heads + KV head) % 8: few significant bits for a float output, powers of two
   * (and 0) for a bf16 one, powers of two up to 1 for an f16 one. */
  static const float f32_scales[8] = {0.375f, 1.5f, 3.0f, 0.0f, 1.0f, 2.5f, 0.75f, 0.5f};
  static const float bf16_scales[8] = {2.0f, 0.5f, 0.0f, 4.0f, 1.0f, 0.25f, 8.0f, 0.125f};
  static const float f16_scales[8] = {0.5f, 0.25f, 1.0f, 0.125f, 0.5f, 1.0f, 0.0f, 0.0625f};

  /* The decoding here and the support library's must agree on every code. */
  for (size_t f = 0; f < sizeof formats / sizeof formats[0]; ++f) {
    for (unsigned code = 0; code < 256; ++code) {
      const double a = decode_8bit(formats[f], code), b = fdt_fp8_value(formats[f], (uint8_t)code);
      if (!(a == b || (isnan(a) && isnan(b))))
        fail_msg("%s code 0x%02x: decoded %g here, %g by fdt_fp8_value", fdt_dtype_name(formats[f]), code, a, b);
    }
  }

  int failures = 0;
  for (size_t i = 0; i < sizeof spec / sizeof spec[0]; ++i) {
    for (size_t f = 0; f < sizeof formats / sizeof formats[0]; ++f) {
      const fd_dtype format = formats[f];
      const int64_t Hq = spec[i].q_heads, Hkv = spec[i].kv_heads, group = Hq / Hkv;
      const size_t q_es = fdt_dtype_size(spec[i].q), out_es = fdt_dtype_size(spec[i].out);
      const float *scale_list = spec[i].out == FD_DTYPE_F32  ? f32_scales
                                : spec[i].q == FD_DTYPE_BF16 ? bf16_scales
                                                             : f16_scales;
      fdt_rng rng = {g_seed * 131 + 1800 + (uint64_t)(i * 4 + f)};
      void *q = malloc((size_t)(kBatch * Hq * kD) * q_es);
      uint8_t *k = malloc((size_t)(kBatch * Hkv * kD)), *v = malloc((size_t)(kBatch * Hkv * kD));
      void *out = malloc((size_t)(kBatch * Hq * kD) * out_es);
      float *lse = malloc((size_t)(kBatch * Hq) * sizeof(float));
      float scales[kBatch * 8] = {0}; /* per (sequence, KV head); the tensor holds what the mode keeps of it */
      if (q == NULL || k == NULL || v == NULL || out == NULL || lse == NULL) fail_msg("out of host memory");
      for (int64_t e = 0; e < kBatch * Hq * kD; ++e) fdt_store(spec[i].q, q, e, fdt_uniform(&rng, -2.0, 2.0));
      int seen[256] = {0};
      for (int64_t e = 0; e < kBatch * Hkv * kD; ++e) {
        k[e] = fdt_quantize(format, fdt_uniform(&rng, -2.0, 2.0));
        v[e] = (uint8_t)((e * 37 + 11) & 0xff);
        seen[v[e]] = 1;
      }
      for (int code = 0; code < 256; ++code) {
        if (!seen[code]) fail_msg("code 0x%02x is in no V row", code);
      }
      for (int64_t r = 0; r < kBatch * Hkv; ++r) {
        const int64_t g = r % Hkv;
        scales[r] = spec[i].v_scales == FDT_SCALE_NONE     ? 1.0f
                    : spec[i].v_scales == FDT_SCALE_TENSOR ? scale_list[0]
                    : spec[i].v_scales == FDT_SCALE_HEAD   ? scale_list[g]
                                                           : scale_list[r % 8];
      }
      memset(out, 0xff, (size_t)(kBatch * Hq * kD) * out_es);
      memset(lse, 0xff, (size_t)(kBatch * Hq) * sizeof(float));

      void *dq = device_copy(q, (size_t)(kBatch * Hq * kD) * q_es);
      void *dk = device_copy(k, (size_t)(kBatch * Hkv * kD)), *dv = device_copy(v, (size_t)(kBatch * Hkv * kD));
      void *dout = device_copy(out, (size_t)(kBatch * Hq * kD) * out_es);
      void *dlse = device_copy(lse, (size_t)(kBatch * Hq) * sizeof(float));
      /* The scale tensor [batch, 1, kv_heads]: per token its own value per (sequence, head) (the token
       * stride is not 0: the per-token path), per head one per head, per tensor one. */
      void *dscale = device_copy(scales, sizeof scales);
      fd_decode_args a;
      fd_decode_args_init(&a, sizeof a);
      const int64_t q_shape[4] = {kBatch, 1, Hq, kD}, q_strides[4] = {Hq * kD, Hq * kD, kD, 1};
      const int64_t kv_shape[4] = {kBatch, 1, Hkv, kD}, kv_strides[4] = {Hkv * kD, Hkv * kD, kD, 1};
      const int64_t lse_shape[3] = {kBatch, 1, Hq}, lse_strides[3] = {Hq, Hq, 1};
      a.q = fdt_tensor(dq, spec[i].q, 4, q_shape, q_strides);
      a.k = fdt_tensor(dk, format, 4, kv_shape, kv_strides);
      a.v = fdt_tensor(dv, format, 4, kv_shape, kv_strides);
      a.out = fdt_tensor(dout, spec[i].out, 4, q_shape, q_strides);
      a.lse = fdt_tensor(dlse, FD_DTYPE_F32, 3, lse_shape, lse_strides);
      if (spec[i].v_scales != FDT_SCALE_NONE) {
        const int64_t scale_shape[3] = {kBatch, 1, Hkv};
        int64_t scale_strides[3] = {0, 0, 0};
        if (spec[i].v_scales == FDT_SCALE_HEAD) scale_strides[2] = 1;
        if (spec[i].v_scales == FDT_SCALE_TOKEN) {
          scale_strides[0] = scale_strides[1] = Hkv;
          scale_strides[2] = 1;
        }
        a.v_scale = fdt_tensor(dscale, FD_DTYPE_F32, 3, scale_shape, scale_strides);
      }
      const fd_plan_info plan = describe(g_cuda, &a);
      CUDA_CHECK(cudaDeviceSynchronize());
      const fd_status status = fd_decode(g_cuda, &a, (fd_cuda_stream)g_stream);
      CUDA_CHECK(cudaStreamSynchronize(g_stream));
      if (status == FD_SUCCESS) {
        CUDA_CHECK(cudaMemcpy(out, dout, (size_t)(kBatch * Hq * kD) * out_es, cudaMemcpyDeviceToHost));
        CUDA_CHECK(cudaMemcpy(lse, dlse, (size_t)(kBatch * Hq) * sizeof(float), cudaMemcpyDeviceToHost));
      }
      void *device[] = {dq, dk, dv, dout, dlse, dscale};
      for (size_t j = 0; j < sizeof device / sizeof device[0]; ++j) CUDA_CHECK(cudaFree(device[j]));

      int64_t wrong = 0, lse_wrong = 0;
      char first[160] = "";
      const double softmax_scale = 1.0 / sqrt((double)kD);
      for (int64_t b = 0; status == FD_SUCCESS && b < kBatch; ++b) {
        for (int64_t h = 0; h < Hq; ++h) {
          const int64_t row = b * Hkv + h / group; /* the V (and K) row of this head */
          double score = 0.0;
          for (int64_t d = 0; d < kD; ++d) {
            const unsigned code = v[row * kD + d];
            const double want = decode_8bit(format, code) * (double)scales[row];
            const double got = fdt_load(spec[i].out, out, (b * Hq + h) * kD + d);
            score += fdt_load(spec[i].q, q, (b * Hq + h) * kD + d) * decode_8bit(format, k[row * kD + d]);
            if (isnan(want) ? isnan(got) : got == want) continue;
            if (wrong++ == 0) {
              snprintf(first, sizeof first,
                       "sequence %lld head %lld dim %lld: code 0x%02x x scale %g = %.17g, got %.17g", (long long)b,
                       (long long)h, (long long)d, code, (double)scales[row], want, got);
            }
          }
          const double want_lse = score * softmax_scale;
          if (!(fabs(lse[b * Hq + h] - want_lse) <= 1e-4)) ++lse_wrong;
        }
      }
      const int wrong_kernel = !starts_with(plan.kernel, spec[i].kernel);
      print_message("8-bit codes, %s, %s (%s): %s%lld elements wrong, %lld LSEs%s%s\n", fdt_dtype_name(format),
                    spec[i].what, plan.kernel, status != FD_SUCCESS ? "decode failed; " : "", (long long)wrong,
                    (long long)lse_wrong, wrong ? "; first " : "", first);
      free(q);
      free(k);
      free(v);
      free(out);
      free(lse);
      if (status != FD_SUCCESS) fail_msg("fd_decode: %s: %s", fd_status_string(status), last_message());
      if (wrong_kernel)
        fail_msg("8-bit codes, %s: planned on %s, expected %s", spec[i].what, plan.kernel, spec[i].kernel);
      failures += wrong != 0 || lse_wrong != 0;
    }
  }
  assert_int_equal(failures, 0);
}

/* ---- sliding windows at their edges ------------------------------------------ */
/* A window exactly as long as the sequence (W == L: the last query token
 * sees key 0, and nothing past the sequence's first page is skipped) among
 * sequences of W - 1 and W + 1 and others, with several query tokens
 * (causal and no mask), paged caches (pages of 16 and of 7, a window that
 * is not a multiple of the page), on the tensor cores, the rows kernel with
 * manual splits, the CUDA cores and an 8-bit cache; then W = 1 (a token
 * sees its own position only, or with no mask every key from it on) with
 * each 8-bit format, dense and paged, per-token, per-head and per-tensor
 * scales, the 8-bit kernels and the CUDA cores. Each by run_case: against
 * the float64 reference and the CPU backend. */
static void test_window_edges(void **state) {
  (void)state;
  static const int64_t lens_256[] = {256, 255, 257, 256, 240, 272, 1, 0};
  static const int64_t lens_100[] = {100, 99, 101, 100, 98, 3, 0, 105};
  static const int64_t lens_64[] = {64, 63, 65, 64, 1, 0, 80, 2};
  static const int64_t lens_500[] = {500, 499, 501, 500, 250, 0};
  static const int64_t lens_320[] = {320, 319, 321, 320, 16, 0};
  static const struct {
    const char *what;
    fd_dtype dtype, out_dtype, kv_dtype;
    fdt_scale_mode scales;
    fdt_layout layout;
    int64_t batch, q_heads, kv_heads, head_dim, kv_len, page_size, q_len, window;
    fd_attention_mask mask;
    int32_t splits;
    const int64_t *lens; /* NULL: the generated ragged lengths (0, full, 1, 63, 64, 65, random) */
  } spec[] = {
      {"W == L = 256, q_len 4, pages of 16", FD_DTYPE_F16, FD_DTYPE_F16, 0, FDT_SCALE_NONE, FDT_PAGED_NHD, 8, 32, 8,
       128, 272, 16, 4, 256, FD_MASK_CAUSAL, 0, lens_256},
      {"W == L = 100, q_len 3, no mask, pages of 7", FD_DTYPE_BF16, FD_DTYPE_BF16, 0, FDT_SCALE_NONE, FDT_PAGED_HND, 8,
       16, 4, 64, 105, 7, 3, 100, FD_MASK_NONE, 0, lens_100},
      {"W == L = 64, q_len 2, f32: CUDA cores", FD_DTYPE_F32, FD_DTYPE_F32, 0, FDT_SCALE_NONE, FDT_PAGED_NHD, 8, 8, 2,
       128, 80, 16, 2, 64, FD_MASK_CAUSAL, 0, lens_64},
      {"W == L = 500, q_len 8 x group 8: rows kernel, 3 splits", FD_DTYPE_F16, FD_DTYPE_F16, 0, FDT_SCALE_NONE,
       FDT_PAGED_NHD, 6, 32, 4, 128, 512, 16, 8, 500, FD_MASK_CAUSAL, 3, lens_500},
      {"W == L = 320, q_len 2, e4m3, per-token scales", FD_DTYPE_F16, FD_DTYPE_F16, FD_DTYPE_E4M3, FDT_SCALE_TOKEN,
       FDT_PAGED_NHD, 6, 32, 8, 128, 336, 16, 2, 320, FD_MASK_CAUSAL, 0, lens_320},
      {"W = 1, q_len 3, e4m3, per-token scales, paged", FD_DTYPE_F16, FD_DTYPE_F16, FD_DTYPE_E4M3, FDT_SCALE_TOKEN,
       FDT_PAGED_NHD, 7, 32, 8, 128, 300, 16, 3, 1, FD_MASK_CAUSAL, 0, NULL},
      {"W = 1, int8, f32 out: CUDA cores, per-head scales", FD_DTYPE_BF16, FD_DTYPE_F32, FD_DTYPE_I8, FDT_SCALE_HEAD,
       FDT_BHND, 7, 16, 4, 128, 500, 0, 1, 1, FD_MASK_CAUSAL, 0, NULL},
      {"W = 1, q_len 4, no mask, e5m2, pages of 7", FD_DTYPE_F16, FD_DTYPE_F16, FD_DTYPE_E5M2, FDT_SCALE_TENSOR,
       FDT_PAGED_HND, 7, 8, 8, 64, 200, 7, 4, 1, FD_MASK_NONE, 0, NULL},
      {"W = 1, q_len 2 x group 8: 16 rows, int8, 3 splits", FD_DTYPE_BF16, FD_DTYPE_BF16, FD_DTYPE_I8, FDT_SCALE_TOKEN,
       FDT_PAGED_NHD, 7, 32, 4, 128, 400, 16, 2, 1, FD_MASK_CAUSAL, 3, NULL},
  };
  for (size_t i = 0; i < sizeof spec / sizeof spec[0]; ++i) {
    fdt_case c = dense_case(spec[i].dtype, spec[i].batch, spec[i].q_heads, spec[i].kv_heads, spec[i].head_dim,
                            spec[i].kv_len, g_seed + 1850 + (uint64_t)i);
    c.out_dtype = spec[i].out_dtype;
    c.kv_dtype = spec[i].kv_dtype;
    c.scale_mode = spec[i].scales;
    c.layout = spec[i].layout;
    c.page_size = spec[i].page_size;
    c.q_len = spec[i].q_len;
    c.window = spec[i].window;
    c.mask = spec[i].mask;
    c.num_splits = spec[i].splits;
    c.ragged = 1;
    c.lens = spec[i].lens;
    c.with_lse = 1;
    print_message("window edges: %s\n", spec[i].what);
    void *case_state = &c;
    run_case(&case_state);
  }
}

/* ---- compact tensor-core tiles ------------------------------------------------ */
/* Paged batches with per-sequence lengths of at least two units (sequence,
 * KV head, chunk of 16 rows) a multiprocessor, in pages of 16 tokens or
 * more, run the compact tiles (4 warps, 32- or 64-token tiles, three
 * stages): on the balanced schedule, on the fixed one past 4 waves of units,
 * with the variants' scoring and ragged query lengths, head_dim 64, 96 and
 * 128; small pages, few units and head_dim 256 keep the standard tiles.
 * Each against the reference and twice bitwise equal; the plan names the
 * kernel. The cases are kernel_specs.h's, whose kernels test_cuda_policy's
 * test_gpu_test_kernels pins on the host. */
static void test_compact_tiles(void **state) {
  (void)state;
  for (size_t i = 0; i < sizeof compact_tile_specs / sizeof compact_tile_specs[0]; ++i)
    expect_spec_on_kernel(&compact_tile_specs[i], "compact tiles", g_seed + 1600 + (uint64_t)i);
}

/* ---- the merge paths and the workspace's counters ---------------------------- */
/* With several splits, on sm_90+ the tensor-core kernel's 2-8 splits of a
 * unit (sequence, KV head, chunk) run as one cluster and merge through
 * distributed shared memory, when the clusters fit on the device in as few
 * waves as the CTAs alone. Otherwise the last CTA of each unit merges the
 * splits itself when their partials fit its shared memory, counting
 * finished CTAs in counters at the start of the workspace that every launch
 * leaves at zero; larger merges run the merge kernel. Here, on a
 * caller-provided workspace filled with garbage
 * (NaN) before fd_set_workspace (which must clear the counters): cluster
 * merges (8 splits, 2 splits, empty trailing splits), merge-kernel cases
 * (one unit of 8 rows, units of 12 rows in two chunks of a group, 640
 * one-row units, the CUDA-core kernel, ragged with empty splits), then
 * fused merges on both split kernels (odd row and split counts, more splits
 * than a warp has lanes, empty trailing splits, units of 48-64 KiB of
 * partials), each against the
 * reference, and the counters read back as zero after every case. The
 * cases are kernel_specs.h's, whose merges test_cuda_policy's
 * test_gpu_test_merges pins on the host. */
static void test_merge_paths_on_caller_workspace(void **state) {
  (void)state;
  enum { kCases = sizeof merge_path_specs / sizeof merge_path_specs[0] };
  int cc_major = 0;
  CUDA_CHECK(cudaDeviceGetAttribute(&cc_major, cudaDevAttrComputeCapabilityMajor, 0));
  fd_handle *h = make_handle(FD_BACKEND_CUDA);
  gpu_case cases[kCases];
  size_t bytes = 0;
  for (int i = 0; i < kCases; ++i) {
    const merge_path_spec *spec = &merge_path_specs[i];
    fdt_case c = dense_case(spec->dtype, spec->batch, spec->q_heads, spec->kv_heads, spec->head_dim,
                            g_quick ? spec->kv_len / 4 : spec->kv_len, g_seed + 700 + (uint64_t)i);
    c.out_dtype = spec->out_dtype;
    c.layout = FDT_BHND;
    c.ragged = spec->ragged;
    c.with_lse = 1;
    c.num_splits = spec->splits;
    open_case(&cases[i], &c);
    size_t needed = 0;
    assert_int_equal(fd_workspace_size(h, &cases[i].d.args, &needed), FD_SUCCESS);
    if (needed > bytes) bytes = needed;
  }
  void *workspace = NULL;
  CUDA_CHECK(cudaMalloc(&workspace, bytes));
  CUDA_CHECK(cudaMemset(workspace, 0xff, bytes));
  CUDA_CHECK(cudaDeviceSynchronize());
  assert_int_equal(fd_set_workspace(h, workspace, bytes), FD_SUCCESS);
  int failed = -1, wrong_path = -1, counters_left = -1;
  fd_merge planned[kCases];
  for (int i = 0; i < kCases; ++i) {
    const merge_path_spec *spec = &merge_path_specs[i];
    const fd_plan_info plan = describe(h, &cases[i].d.args);
    planned[i] = plan.merge;
    const int expected = merge_path_expected(spec, cc_major);
    if ((int)plan.merge != expected && wrong_path < 0) wrong_path = i;
    decode_cuda(h, &cases[i].p, &cases[i].d, g_stream);
    const int bad = fdt_check(&cases[i].p, cases[i].report, sizeof cases[i].report, NULL, NULL);
    print_message("merge path: %s (%s, merge %d): %s\n", spec->what, plan.kernel, (int)plan.merge, cases[i].report);
    if (bad && failed < 0) failed = i;
    /* Every launch leaves the counters (the workspace's first
     * cuda::kMergeCounterSlots words) at zero, whichever merge counted in them. */
    enum { kCounterSlots = 16384 };
    static unsigned counters[kCounterSlots];
    CUDA_CHECK(cudaMemcpy(counters, workspace, sizeof counters, cudaMemcpyDeviceToHost));
    for (int j = 0; j < kCounterSlots && counters_left < 0; ++j) {
      if (counters[j] != 0) counters_left = i;
    }
  }
  assert_int_equal(fd_destroy(h), FD_SUCCESS);
  CUDA_CHECK(cudaFree(workspace));
  for (int i = 0; i < kCases; ++i) close_case(&cases[i]);
  if (failed >= 0) fail_msg("merge path %s: %s", merge_path_specs[failed].what, cases[failed].report);
  if (wrong_path >= 0) {
    fail_msg("merge path %s: planned merge %d, expected %d", merge_path_specs[wrong_path].what,
             (int)planned[wrong_path], merge_path_expected(&merge_path_specs[wrong_path], cc_major));
  }
  if (counters_left >= 0) fail_msg("merge path %s left a merge counter nonzero", merge_path_specs[counters_left].what);
}

/* ---- the caller's device and context --------------------------------------- */
/* A handle on device 1 used from a thread with no current context (it never
 * chose a device, so the runtime reports device 0) must leave the thread
 * without one: restoring "device 0" with cudaSetDevice would create device
 * 0's primary context in it. And from a thread with device 0 current, device
 * 0 stays current. Needs two devices (skipped with one). */
typedef struct context_probe {
  PFN_cuCtxGetCurrent_v4000 get_current;
  const fd_decode_args *args; /* on device 1 */
  fd_status create, decode, destroy;
  CUcontext before, after;
} context_probe;

static void *context_worker(void *arg) {
  context_probe *c = arg;
  c->get_current(&c->before);
  fd_options options;
  fd_options_init(&options, sizeof options);
  options.backend = FD_BACKEND_CUDA;
  options.device = 1;
  fd_handle *h = NULL;
  c->create = fd_create(&h, &options);
  if (c->create == FD_SUCCESS) {
    c->decode = fd_decode(h, c->args, NULL);
    c->destroy = fd_destroy(h); /* frees the workspace: waits for the decode */
  }
  c->get_current(&c->after);
  return NULL;
}

static void test_callers_context_is_kept(void **state) {
  (void)state;
  int devices = 0;
  CUDA_CHECK(cudaGetDeviceCount(&devices));
  if (devices < 2) skip();
  void *get = NULL;
  enum cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuCtxGetCurrent", &get, 4000, cudaEnableDefault, &found));
  if (found != cudaDriverEntryPointSuccess) fail_msg("cuCtxGetCurrent not found");
  fdt_case c = dense_case(FD_DTYPE_F16, 3, 16, 4, 128, 700, g_seed + 800);
  c.with_lse = 1;
  gpu_case t;
  CUDA_CHECK(cudaSetDevice(1));
  open_case(&t, &c);
  CUDA_CHECK(cudaSetDevice(0));

  context_probe probe;
  memset(&probe, 0, sizeof probe);
  probe.get_current = (PFN_cuCtxGetCurrent_v4000)get;
  probe.args = &t.d.args;
  pthread_t thread;
  if (pthread_create(&thread, NULL, context_worker, &probe) != 0) fail_msg("pthread_create failed");
  pthread_join(thread, NULL);

  /* From this thread, with device 0 current: a second decode on device 1. */
  fd_options options;
  fd_options_init(&options, sizeof options);
  options.backend = FD_BACKEND_CUDA;
  options.device = 1;
  fd_handle *h = NULL;
  assert_int_equal(fd_create(&h, &options), FD_SUCCESS);
  int current = -1;
  CUDA_CHECK(cudaGetDevice(&current));
  const fd_status second = fd_decode(h, &t.d.args, NULL);
  int after = -1;
  CUDA_CHECK(cudaGetDevice(&after));
  assert_int_equal(fd_destroy(h), FD_SUCCESS);

  CUDA_CHECK(cudaSetDevice(1));
  CUDA_CHECK(cudaDeviceSynchronize());
  const int bad = fdt_cuda_download(&t.d, &t.p) != 0 || fdt_check(&t.p, t.report, sizeof t.report, NULL, NULL);
  print_message("device-1 handle from a thread without a context: before %p, after %p; output %s\n",
                (void *)probe.before, (void *)probe.after, t.report);
  close_case(&t);
  CUDA_CHECK(cudaSetDevice(0));
  if (probe.create != FD_SUCCESS || probe.decode != FD_SUCCESS || probe.destroy != FD_SUCCESS) {
    fail_msg("calls from the worker: create %d, decode %d, destroy %d", (int)probe.create, (int)probe.decode,
             (int)probe.destroy);
  }
  if (probe.before != NULL) fail_msg("a new thread started with a current context");
  if (probe.after != NULL) fail_msg("the handle left a context current in a thread that had none");
  assert_int_equal(second, FD_SUCCESS);
  if (current != 0 || after != 0) fail_msg("device %d current before the decode, %d after; 0 expected", current, after);
  if (bad) fail_msg("device-1 decode: %s", t.report);
}

/* ---- two handles, two streams, two threads ---------------------------------- */
typedef struct worker {
  fdt_case c;
  int iterations;
  int ok;
  char report[640];
} worker;

static void *worker_main(void *arg) {
  worker *w = arg;
  w->ok = 0;
  fd_options options;
  fd_options_init(&options, sizeof options);
  options.backend = FD_BACKEND_CUDA;
  fd_handle *h = NULL;
  fdt_problem p;
  fdt_device_problem d;
  cudaStream_t stream;
  if (fd_create(&h, &options) != FD_SUCCESS) {
    snprintf(w->report, sizeof w->report, "fd_create: %s", last_message());
    return NULL;
  }
  if (fdt_problem_make(&p, &w->c) != 0 || fdt_cuda_upload(&p, &d) != 0 ||
      cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess) {
    snprintf(w->report, sizeof w->report, "setup failed");
    return NULL;
  }
  for (int i = 0; i < w->iterations; ++i) {
    const fd_status s = fd_decode(h, &d.args, (fd_cuda_stream)stream);
    if (s != FD_SUCCESS) {
      snprintf(w->report, sizeof w->report, "fd_decode: %s", last_message());
      return NULL;
    }
  }
  const cudaError_t err = cudaStreamSynchronize(stream);
  if (err != cudaSuccess || fdt_cuda_download(&d, &p) != 0) {
    snprintf(w->report, sizeof w->report, "sync/download: %s", cudaGetErrorString(err));
    return NULL;
  }
  char check[256];
  w->ok = fdt_check(&p, check, sizeof check, NULL, NULL) == 0;
  snprintf(w->report, sizeof w->report, "%d decodes: %s", w->iterations, check);
  cudaStreamDestroy(stream);
  fdt_cuda_free(&d);
  fdt_problem_free(&p);
  fd_destroy(h);
  return NULL;
}

static void test_two_threads_two_streams(void **state) {
  (void)state;
  worker workers[2];
  memset(workers, 0, sizeof workers);
  fdt_case *a = &workers[0].c, *b = &workers[1].c;
  a->batch = 4, a->q_heads = 32, a->kv_heads = 8, a->head_dim = 128, a->kv_len = g_quick ? 500 : 4000;
  a->dtype = a->out_dtype = FD_DTYPE_F16, a->layout = FDT_PAGED_NHD, a->page_size = 16, a->ragged = 1;
  a->with_lse = 1, a->seed = g_seed + 11;
  b->batch = 2, b->q_heads = 56, b->kv_heads = 8, b->head_dim = 64, b->kv_len = g_quick ? 700 : 6000;
  b->dtype = FD_DTYPE_BF16, b->out_dtype = FD_DTYPE_F32, b->layout = FDT_BHND, b->num_splits = 13;
  b->seed = g_seed + 12;
  pthread_t threads[2];
  for (int i = 0; i < 2; ++i) {
    workers[i].iterations = g_quick ? 3 : 40;
    assert_int_equal(pthread_create(&threads[i], NULL, worker_main, &workers[i]), 0);
  }
  for (int i = 0; i < 2; ++i) assert_int_equal(pthread_join(threads[i], NULL), 0);
  for (int i = 0; i < 2; ++i) {
    print_message("thread %d: %s\n", i, workers[i].report);
    if (!workers[i].ok) fail_msg("thread %d: %s", i, workers[i].report);
  }
}

/* Places each sequence's dense K/V (or each page) past 2^31 elements in a
 * multi-GiB buffer, so every offset needs 64 bits. */
static void run_large_offset(int paged) {
  fdt_case c = dense_case(FD_DTYPE_F16, 2, 8, 2, 128, 256, g_seed + 77 + (uint64_t)paged);
  c.layout = paged ? FDT_PAGED_NHD : FDT_BNHD;
  c.page_size = 16;
  c.ragged = 1;
  c.with_lse = 1;
  c.num_splits = 0;
  gpu_case t;
  open_case(&t, &c);
  const int64_t two31 = (int64_t)1 << 31;
  const size_t es = 2;
  int64_t block_elems, blocks, stride;
  if (paged) { /* pages shifted up by first_page so page * page_stride > 2^31 */
    stride = t.p.args.k.strides[0];
    block_elems = stride;
    blocks = t.p.args.k.shape[0];
  } else { /* a batch stride just past 2^31 (a multiple of 8: rows stay 16-byte aligned) */
    stride = two31 + 1024;
    block_elems = t.p.args.k.strides[0];
    blocks = c.batch;
  }
  const int64_t first_block = paged ? two31 / stride + 1 : 0;
  const size_t total = (size_t)((first_block + blocks - 1) * stride + block_elems) * es;
  size_t free_bytes = 0, total_bytes = 0;
  CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  if (free_bytes < 2 * total + ((size_t)1 << 30)) {
    print_message("large offsets (%s): skipped, %zu bytes free\n", paged ? "paged" : "dense", free_bytes);
    close_case(&t);
    skip();
  }
  void *big[2] = {NULL, NULL};
  const void *host[2] = {t.p.k, t.p.v};
  for (int kv = 0; kv < 2; ++kv) {
    CUDA_CHECK(cudaMalloc(&big[kv], total));
    CUDA_CHECK(cudaMemset(big[kv], 0xff, total)); /* NaN everywhere no token lives */
    for (int64_t i = 0; i < blocks; ++i) {
      CUDA_CHECK(cudaMemcpy((char *)big[kv] + (size_t)((first_block + i) * stride) * es,
                            (const char *)host[kv] + (size_t)(i * block_elems) * es, (size_t)block_elems * es,
                            cudaMemcpyHostToDevice));
    }
  }
  fd_decode_args args = t.d.args;
  args.k.data = big[0];
  args.v.data = big[1];
  if (paged) {
    const int64_t entries = args.block_table.shape[0] * args.block_table.shape[1];
    int32_t *table = malloc((size_t)entries * sizeof *table);
    for (int64_t i = 0; i < entries; ++i) table[i] = (int32_t)(t.p.block_table[i] + first_block);
    CUDA_CHECK(cudaMemcpy(t.d.block_table, table, (size_t)entries * sizeof *table, cudaMemcpyHostToDevice));
    free(table);
    args.k.shape[0] = args.v.shape[0] = first_block + blocks;
  } else {
    args.k.strides[0] = args.v.strides[0] = stride;
  }
  t.d.args = args; /* t.d still owns (and close_case frees) the small K/V copies */
  const int bad = check_case(&t);
  print_message("large offsets (%s, last row at element %lld, %.1f GiB per cache): %s\n", paged ? "paged" : "dense",
                (long long)((first_block + blocks - 1) * stride), (double)total / (1 << 30), t.report);
  CUDA_CHECK(cudaFree(big[0]));
  CUDA_CHECK(cudaFree(big[1]));
  close_case(&t);
  if (bad) fail_msg("%s", t.report);
}

static void test_large_offsets_dense(void **state) {
  (void)state;
  if (g_quick) skip();
  run_large_offset(0);
}

static void test_large_offsets_paged(void **state) {
  (void)state;
  if (g_quick) skip();
  run_large_offset(1);
}

/* K/V whose rows are not 16-byte aligned take the plain-load path. */
static void test_unaligned_cache(void **state) {
  (void)state;
  const fd_dtype dtypes[] = {FD_DTYPE_F16, FD_DTYPE_F32, FD_DTYPE_BF16};
  for (int k = 0; k < 3; ++k) {
    fdt_case c = dense_case(dtypes[k], 3, 12, 4, k == 1 ? 40 : 64, 300, g_seed + 300 + (uint64_t)k);
    c.layout = k == 2 ? FDT_PAGED_HND : FDT_BNHD;
    c.page_size = 16;
    c.ragged = 1;
    c.with_lse = 1;
    c.num_splits = k == 0 ? 0 : 3;
    gpu_case t;
    open_case(&t, &c);
    const size_t es = fdt_dtype_size(c.dtype);
    void *shifted[2];
    const void *host[2] = {t.p.k, t.p.v};
    fd_tensor *tensors[2] = {&t.d.args.k, &t.d.args.v};
    for (int kv = 0; kv < 2; ++kv) {
      const size_t shift = es * (size_t)(1 + 2 * kv); /* one and three elements */
      CUDA_CHECK(cudaMalloc(&shifted[kv], t.p.kv_bytes + 16));
      CUDA_CHECK(cudaMemcpy((char *)shifted[kv] + shift, host[kv], t.p.kv_bytes, cudaMemcpyHostToDevice));
      tensors[kv]->data = (char *)shifted[kv] + shift + ((const char *)t.p.args.k.data - (const char *)t.p.k);
    }
    const fd_plan_info plan = describe(g_cuda, &t.d.args);
    const int bad = check_case(&t);
    print_message("unaligned %s cache (%s): %s\n", fdt_dtype_name(c.dtype), plan.kernel, t.report);
    CUDA_CHECK(cudaFree(shifted[0]));
    CUDA_CHECK(cudaFree(shifted[1]));
    close_case(&t);
    if (bad) fail_msg("%s", t.report);
    if (!starts_with(plan.kernel, "cuda-core-")) fail_msg("unaligned rows planned on %s", plan.kernel);
  }
}

/* Device lengths outside [0, kv_capacity] are clamped, not trusted. */
static void test_lengths_clamped(void **state) {
  (void)state;
  fdt_case c = dense_case(FD_DTYPE_F32, 3, 8, 2, 64, 200, g_seed + 400);
  c.with_lse = 1;
  c.num_splits = 2;
  gpu_case t; /* not ragged: the reference uses every token */
  open_case(&t, &c);
  const int32_t lens[3] = {(int32_t)c.kv_len + 1000, INT32_MAX, (int32_t)c.kv_len};
  int32_t *device_lens = NULL;
  CUDA_CHECK(cudaMalloc((void **)&device_lens, sizeof lens));
  CUDA_CHECK(cudaMemcpy(device_lens, lens, sizeof lens, cudaMemcpyHostToDevice));
  const int64_t shape[1] = {3}, strides[1] = {1};
  t.d.args.seq_lens.data = device_lens;
  t.d.args.seq_lens.dtype = FD_DTYPE_I32;
  t.d.args.seq_lens.ndim = 1;
  t.d.args.seq_lens.shape[0] = shape[0];
  t.d.args.seq_lens.strides[0] = strides[0];
  int bad = check_case(&t);
  print_message("lengths past the capacity clamped: %s\n", t.report);
  CUDA_CHECK(cudaFree(device_lens));
  close_case(&t);
  if (bad) fail_msg("%s", t.report);

  /* A negative length reads as 0: zeros and LSE -inf, like the reference's empty sequence. */
  c.ragged = 1; /* sequence 0 is empty */
  open_case(&t, &c);
  const int32_t negative = -7;
  CUDA_CHECK(cudaMemcpy(t.d.seq_lens, &negative, sizeof negative, cudaMemcpyHostToDevice));
  bad = check_case(&t);
  print_message("negative length clamped to 0: %s\n", t.report);
  close_case(&t);
  if (bad) fail_msg("%s", t.report);
}

/* A CUDA handle with FD_CHECK_CONTENTS. */
static fd_handle *make_checking_handle(void) {
  fd_options options;
  fd_options_init(&options, sizeof options);
  options.backend = FD_BACKEND_CUDA;
  options.checks = FD_CHECK_CONTENTS;
  fd_handle *h = NULL;
  if (fd_create(&h, &options) != FD_SUCCESS) fail_msg("fd_create with checks failed: %s", last_message());
  return h;
}

static void set_device_entry(int32_t *device_array, int64_t index, int32_t value) {
  CUDA_CHECK(cudaMemcpy(device_array + index, &value, sizeof value, cudaMemcpyHostToDevice));
}

/* FD_CHECK_CONTENTS on the device: the first bad length or used block-table
 * entry is reported by fd_check_contents or by the next fd_decode (which
 * then writes nothing); unused entries are never looked at; without the
 * check, bad entries are clamped into the pool (compute-sanitizer memcheck
 * runs this test: no access outside k and v either way). */
static void test_contents_checked_on_device(void **state) {
  (void)state;
  fdt_case c = dense_case(FD_DTYPE_F16, 6, 16, 4, 128, 200, g_seed + 450);
  c.layout = FDT_PAGED_NHD;
  c.page_size = 16;
  c.ragged = 1; /* lengths 0, 208 (full), 1, 63, 64, 65 */
  c.with_lse = 1;
  gpu_case t;
  open_case(&t, &c);
  const int64_t cols = t.p.args.block_table.shape[1];
  const int32_t pool = (int32_t)t.p.args.k.shape[0];
  fd_handle *checking = make_checking_handle();
  char report[256] = "";
  int bad = 0;

  /* The check kernel is one more launch. */
  fd_plan_info info;
  fd_plan_info_init(&info, sizeof info);
  assert_int_equal(fd_describe_plan(checking, &t.d.args, &info), FD_SUCCESS);
  const fd_plan_info unchecked_plan = describe(g_cuda, &t.d.args);
  if (info.launches != unchecked_plan.launches + 1) bad = 1;

  /* Good contents: nothing to report, and the right answer. */
  CUDA_CHECK(cudaDeviceSynchronize());
  assert_int_equal(fd_decode(checking, &t.d.args, (fd_cuda_stream)g_stream), FD_SUCCESS);
  assert_int_equal(fd_check_contents(checking, (fd_cuda_stream)g_stream), FD_SUCCESS);
  if (fdt_cuda_download(&t.d, &t.p) != 0) fail_msg("download failed");
  bad = fdt_check(&t.p, report, sizeof report, NULL, NULL);
  print_message("checked decode of good contents: %s\n", report);

  /* Bad entries in use (sequence 3's column 1, sequence 5's column 0) and
   * one past a sequence's pages (sequence 2 uses column 0 only). */
  set_device_entry(t.d.block_table, 2 * cols + 3, 99999);
  set_device_entry(t.d.block_table, 3 * cols + 1, 1000000);
  set_device_entry(t.d.block_table, 5 * cols + 0, -3);
  CUDA_CHECK(cudaDeviceSynchronize());
  assert_int_equal(fd_decode(checking, &t.d.args, (fd_cuda_stream)g_stream), FD_SUCCESS); /* enqueued */
  const fd_status found = fd_check_contents(checking, (fd_cuda_stream)g_stream);
  print_message("fd_check_contents: %s\n", last_message());
  if (found != FD_ERROR_INVALID_BLOCK_TABLE || strstr(last_message(), "block_table[3][1]") == NULL ||
      strstr(last_message(), "got 1000000") == NULL)
    bad = 1;
  assert_int_equal(fd_check_contents(checking, (fd_cuda_stream)g_stream), FD_SUCCESS); /* reported once */

  /* Reported by the next decode instead, which then writes nothing. */
  assert_int_equal(fd_decode(checking, &t.d.args, (fd_cuda_stream)g_stream), FD_SUCCESS);
  CUDA_CHECK(cudaStreamSynchronize(g_stream));
  if (fdt_cuda_poison_outputs(&t.p, &t.d) != 0) fail_msg("poisoning failed");
  CUDA_CHECK(cudaDeviceSynchronize());
  if (fd_decode(checking, &t.d.args, (fd_cuda_stream)g_stream) != FD_ERROR_INVALID_BLOCK_TABLE) bad = 1;
  print_message("next fd_decode: %s\n", last_message());
  CUDA_CHECK(cudaStreamSynchronize(g_stream));
  if (fdt_cuda_download(&t.d, &t.p) != 0) fail_msg("download failed");
  const unsigned char *out_bytes = t.p.out;
  for (size_t i = 0; i < t.p.out_bytes; ++i) bad |= out_bytes[i] != 0xff;

  /* A bad length comes before its sequence's pages. */
  set_device_entry(t.d.seq_lens, 3, 5000);
  CUDA_CHECK(cudaDeviceSynchronize());
  assert_int_equal(fd_decode(checking, &t.d.args, (fd_cuda_stream)g_stream), FD_SUCCESS);
  if (fd_check_contents(checking, (fd_cuda_stream)g_stream) != FD_ERROR_INVALID_LENGTH ||
      strstr(last_message(), "seq_lens[3] must be in [0, 208]") == NULL)
    bad = 1;
  print_message("bad length: %s\n", last_message());
  set_device_entry(t.d.seq_lens, 3, 63);

  /* Query lengths (q_lens) are checked too, before their sequence's length. */
  {
    fdt_case qc = c;
    qc.ragged_q = 1;
    qc.q_len = 3;
    qc.seed = g_seed + 455;
    gpu_case qt;
    open_case(&qt, &qc);
    set_device_entry(qt.d.q_lens, 4, 4);
    set_device_entry(qt.d.seq_lens, 4, 5000);
    CUDA_CHECK(cudaDeviceSynchronize());
    assert_int_equal(fd_decode(checking, &qt.d.args, (fd_cuda_stream)g_stream), FD_SUCCESS);
    if (fd_check_contents(checking, (fd_cuda_stream)g_stream) != FD_ERROR_INVALID_LENGTH ||
        strstr(last_message(), "q_lens[4] must be in [0, 3] (q's q_len), got 4") == NULL)
      bad = 1;
    print_message("bad query length: %s\n", last_message());
    close_case(&qt);
  }

  /* Waiting is refused while the stream is being captured. */
  CUDA_CHECK(cudaStreamBeginCapture(g_stream, cudaStreamCaptureModeThreadLocal));
  const fd_status capturing = fd_check_contents(checking, (fd_cuda_stream)g_stream);
  cudaGraph_t graph = NULL;
  CUDA_CHECK(cudaStreamEndCapture(g_stream, &graph));
  if (graph != NULL) CUDA_CHECK(cudaGraphDestroy(graph));
  if (capturing != FD_ERROR_INVALID_ARGUMENT || strstr(last_message(), "being captured") == NULL) bad = 1;

  /* Unchecked: the bad entries read the pool's first and last pages, exactly
   * as if the table said so. */
  fdt_problem *p = &t.p;
  unsigned char *expected = malloc(p->out_bytes);
  set_device_entry(t.d.block_table, 3 * cols + 1, pool - 1);
  set_device_entry(t.d.block_table, 5 * cols + 0, 0);
  decode_cuda(g_cuda, p, &t.d, g_stream);
  memcpy(expected, p->out, p->out_bytes);
  set_device_entry(t.d.block_table, 3 * cols + 1, 1000000);
  set_device_entry(t.d.block_table, 5 * cols + 0, -3);
  if (fdt_cuda_poison_outputs(p, &t.d) != 0) fail_msg("poisoning failed");
  decode_cuda(g_cuda, p, &t.d, g_stream);
  const int clamped_differs = memcmp(p->out, expected, p->out_bytes) != 0;
  print_message("unchecked bad entries read clamped pages: %s\n", clamped_differs ? "NO" : "yes, bitwise");
  free(expected);
  assert_int_equal(fd_destroy(checking), FD_SUCCESS);
  close_case(&t);
  if (bad || clamped_differs) fail_msg("content checks misbehaved (see above): %s", report);
}

/* What may share memory (flashdecode.h, fd_tensor): out may be q itself,
 * inputs may repeat with stride 0, lse may sit in out's row padding. */
static void test_allowed_sharing(void **state) {
  (void)state;
  const fd_dtype dtypes[] = {FD_DTYPE_F16, FD_DTYPE_BF16, FD_DTYPE_F32};
  for (int k = 0; k < 3; ++k) {
    fdt_case c = dense_case(dtypes[k], 5, 32, 8, 128, 1500, g_seed + 460 + (uint64_t)k);
    c.with_lse = 1;
    c.num_splits = k == 2 ? 1 : 0; /* one split: the split kernel writes out itself */
    gpu_case t;
    open_case(&t, &c);
    fdt_problem *p = &t.p;
    decode_cuda(g_cuda, p, &t.d, g_stream);
    char report[256];
    int bad = fdt_check(p, report, sizeof report, NULL, NULL);
    unsigned char *expected = malloc(p->out_bytes);
    memcpy(expected, p->out, p->out_bytes);

    /* In place: out is q. */
    fd_decode_args a = t.d.args;
    a.out = a.q;
    CUDA_CHECK(cudaDeviceSynchronize());
    if (fd_decode(g_cuda, &a, (fd_cuda_stream)g_stream) != FD_SUCCESS) fail_msg("in place: %s", last_message());
    CUDA_CHECK(cudaStreamSynchronize(g_stream));
    unsigned char *in_place = malloc(p->out_bytes);
    CUDA_CHECK(cudaMemcpy(in_place, t.d.q, p->out_bytes, cudaMemcpyDeviceToHost));
    const int in_place_differs = memcmp(in_place, expected, p->out_bytes) != 0;
    CUDA_CHECK(cudaMemcpy(t.d.q, p->q, p->q_bytes, cudaMemcpyHostToDevice));

    /* lse in out's padding: rows of head_dim + 8 elements, lse after each. */
    const int64_t B = c.batch, H = c.q_heads, D = c.head_dim, pitch = D + 8;
    const size_t es = fdt_dtype_size(c.dtype);
    void *padded = NULL;
    CUDA_CHECK(cudaMalloc(&padded, (size_t)(B * H * pitch) * es));
    CUDA_CHECK(cudaMemset(padded, 0xff, (size_t)(B * H * pitch) * es)); /* poison: the rest of the padding stays so */
    a = t.d.args;
    a.out.data = padded;
    a.out.strides[0] = a.out.strides[1] = H * pitch;
    a.out.strides[2] = pitch;
    a.lse.data = (char *)padded + (size_t)D * es;
    a.lse.strides[0] = a.lse.strides[1] = H * pitch * (int64_t)es / 4;
    a.lse.strides[2] = pitch * (int64_t)es / 4;
    CUDA_CHECK(cudaDeviceSynchronize());
    if (fd_decode(g_cuda, &a, (fd_cuda_stream)g_stream) != FD_SUCCESS) fail_msg("lse in padding: %s", last_message());
    CUDA_CHECK(cudaStreamSynchronize(g_stream));
    unsigned char *rows = malloc((size_t)(B * H * pitch) * es);
    CUDA_CHECK(cudaMemcpy(rows, padded, (size_t)(B * H * pitch) * es, cudaMemcpyDeviceToHost));
    int padding_differs = 0;
    for (int64_t r = 0; r < B * H; ++r) {
      padding_differs |= memcmp(rows + (size_t)(r * pitch) * es, expected + (size_t)(r * D) * es, (size_t)D * es);
      padding_differs |= memcmp(rows + (size_t)(r * pitch + D) * es, (const unsigned char *)p->lse + r * 4, 4);
      for (size_t i = (size_t)D * es + 4; i < (size_t)pitch * es; ++i)
        padding_differs |= rows[(size_t)(r * pitch) * es + i] != 0xff;
    }
    CUDA_CHECK(cudaFree(padded));
    free(rows);

    /* Stride 0: every sequence reads sequence 0's query and cache. */
    a = t.d.args;
    a.q.strides[0] = a.k.strides[0] = a.v.strides[0] = 0;
    CUDA_CHECK(cudaDeviceSynchronize());
    if (fd_decode(g_cuda, &a, (fd_cuda_stream)g_stream) != FD_SUCCESS) fail_msg("stride 0: %s", last_message());
    CUDA_CHECK(cudaStreamSynchronize(g_stream));
    if (fdt_cuda_download(&t.d, p) != 0) fail_msg("download failed");
    int broadcast_differs = 0;
    const size_t row_bytes = (size_t)(H * D) * es;
    for (int64_t b = 0; b < B; ++b)
      broadcast_differs |= memcmp((unsigned char *)p->out + (size_t)b * row_bytes, expected, row_bytes) != 0;

    print_message("%s: %s; in place %s, lse in padding %s, stride-0 broadcast %s\n", fdt_dtype_name(c.dtype), report,
                  in_place_differs ? "DIFFERS" : "bitwise", padding_differs ? "DIFFERS" : "bitwise",
                  broadcast_differs ? "DIFFERS" : "bitwise");
    bad |= in_place_differs | padding_differs | broadcast_differs;
    free(in_place);
    free(expected);
    close_case(&t);
    if (bad) fail_msg("%s: sharing memory changed the result", fdt_dtype_name(c.dtype));
  }
}

/* Batch invariance (split_tokens): every sequence run alone (cache of its
 * own length, with or without seq_lens) gives bitwise the out and LSE it
 * gets in the batch, on every kernel; the batch is also right. */
static void test_batch_invariant(void **state) {
  (void)state;
  struct {
    fd_dtype dtype;
    fdt_layout layout;
    int64_t q_heads, kv_heads, head_dim, split_tokens;
    int variants; /* q_len 3, a window, softcap, ALiBi and sinks */
  } cases[] = {
      {FD_DTYPE_F16, FDT_BNHD, 32, 8, 128, 512, 0},      {FD_DTYPE_BF16, FDT_PAGED_NHD, 32, 8, 128, 1000, 0},
      {FD_DTYPE_F16, FDT_PAGED_HND, 16, 16, 64, 256, 0}, {FD_DTYPE_F32, FDT_BHND, 8, 2, 256, 300, 0},
      {FD_DTYPE_BF16, FDT_BNHD, 16, 16, 128, 2048, 0},   {FD_DTYPE_F16, FDT_BNHD, 32, 8, 128, 8192, 0}, /* one split */
      {FD_DTYPE_F16, FDT_PAGED_NHD, 32, 8, 128, 512, 1}, {FD_DTYPE_BF16, FDT_BNHD, 16, 2, 64, 1024, 1},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i) {
    fdt_case c = dense_case(cases[i].dtype, 11, cases[i].q_heads, cases[i].kv_heads, cases[i].head_dim, 5000,
                            g_seed + 470 + (uint64_t)i);
    c.layout = cases[i].layout;
    c.page_size = 16;
    c.ragged = 1;
    c.with_lse = 1;
    if (cases[i].variants) {
      c.q_len = 3;
      c.window = 1500;
      c.softcap = 10.0;
      c.alibi = 2;
      c.sinks = 1;
    }
    gpu_case t;
    open_case(&t, &c);
    fdt_problem *p = &t.p;
    t.d.args.split_tokens = cases[i].split_tokens;
    const fd_plan_info plan = describe(g_cuda, &t.d.args);
    const int bad_check = check_case(&t);
    unsigned char *batch_out = malloc(p->out_bytes), *batch_lse = malloc(p->lse_bytes);
    memcpy(batch_out, p->out, p->out_bytes);
    memcpy(batch_lse, p->lse, p->lse_bytes);
    if (fdt_cuda_poison_outputs(p, &t.d) != 0) fail_msg("poisoning failed");
    CUDA_CHECK(cudaDeviceSynchronize());
    for (int64_t b = 0; b < c.batch; ++b) {
      const fd_decode_args solo = fdt_solo_args(&t.d.args, b, p->lens[b], (int)(b % 2));
      if (fd_decode(g_cuda, &solo, (fd_cuda_stream)g_stream) != FD_SUCCESS) fail_msg("solo: %s", last_message());
    }
    CUDA_CHECK(cudaStreamSynchronize(g_stream));
    if (fdt_cuda_download(&t.d, p) != 0) fail_msg("download failed");
    const int differs = memcmp(p->out, batch_out, p->out_bytes) != 0 || memcmp(p->lse, batch_lse, p->lse_bytes) != 0;
    print_message("batch-invariant %s %s split_tokens %lld (%s, %d splits of %lld, merge %d): %s; alone %s\n",
                  fdt_dtype_name(c.dtype), c.layout == FDT_BNHD ? "dense" : "paged/strided",
                  (long long)cases[i].split_tokens, plan.kernel, (int)plan.num_splits, (long long)plan.split_tokens,
                  (int)plan.merge, t.report, differs ? "DIFFERS" : "bitwise");
    free(batch_out);
    free(batch_lse);
    close_case(&t);
    const fd_merge merge = plan.num_splits > 1 ? FD_MERGE_SEPARATE : FD_MERGE_NONE;
    if (bad_check || differs || plan.merge != merge) fail_msg("batch invariance case %zu failed", i);
  }
}

/* A case's cache decoded in parts into device states, for fd_merge_states:
 * part s (of `parts` equal pieces, the last ones possibly empty) goes into
 * state slot[s], of dtype dtype[slot[s]] (the caller's), with LSE and
 * its own device lengths; free_device_states frees every slot's buffers. */
typedef struct device_states {
  void *out[FD_MAX_MERGE_STATES];
  float *lse[FD_MAX_MERGE_STATES];
  int32_t *lens[FD_MAX_MERGE_STATES]; /* NULL for a state no part made */
  fd_dtype dtype[FD_MAX_MERGE_STATES];
  fd_tensor states_out[FD_MAX_MERGE_STATES], states_lse[FD_MAX_MERGE_STATES];
} device_states;

static void decode_parts_on_device(gpu_case *t, int parts, const int *slot, device_states *ds) {
  const fdt_problem *p = &t->p;
  const int64_t B = p->c.batch, H = p->c.q_heads, D = p->c.head_dim, N = p->c.kv_len;
  const int64_t chunk = (N + parts - 1) / parts;
  if (B > 64) fail_msg("decode_parts_on_device: batch %lld above 64", (long long)B);
  CUDA_CHECK(cudaDeviceSynchronize());
  for (int s = 0; s < parts; ++s) {
    const int i = slot[s];
    const int64_t start = s * chunk, n = start + chunk <= N ? chunk : N - start;
    int32_t host_lens[64];
    fdt_part_lengths(p->lens, B, start, n, host_lens);
    CUDA_CHECK(cudaMalloc(&ds->out[i], (size_t)(B * H * D) * fdt_dtype_size(ds->dtype[i])));
    CUDA_CHECK(cudaMalloc((void **)&ds->lse[i], (size_t)(B * H) * sizeof(float)));
    CUDA_CHECK(cudaMalloc((void **)&ds->lens[i], (size_t)B * sizeof(int32_t)));
    CUDA_CHECK(cudaMemcpy(ds->lens[i], host_lens, (size_t)B * sizeof(int32_t), cudaMemcpyHostToDevice));
    const fd_decode_args a = fdt_part_args(&t->d.args, start, n, ds->lens[i], ds->out[i], ds->dtype[i], ds->lse[i]);
    if (fd_decode(g_cuda, &a, (fd_cuda_stream)g_stream) != FD_SUCCESS) fail_msg("part %d: %s", s, last_message());
    ds->states_out[i] = a.out;
    ds->states_lse[i] = a.lse;
  }
}

/* State i moved into a layout of its own, for merges of states whose
 * strides differ: out rows padded by 8 elements (still 16-byte aligned) and
 * the LSE at every third float; the old buffers are freed. */
static void repack_device_state(device_states *ds, int i, int64_t B, int64_t H, int64_t D, int pad_out, int pad_lse) {
  CUDA_CHECK(cudaStreamSynchronize(g_stream)); /* the decodes that wrote the state (a non-blocking stream) */
  if (pad_out) {
    const size_t elem = fdt_dtype_size(ds->dtype[i]), pitch = (size_t)(D + 8) * elem;
    void *padded = NULL;
    CUDA_CHECK(cudaMalloc(&padded, (size_t)(B * H) * pitch));
    CUDA_CHECK(cudaMemcpy2D(padded, pitch, ds->out[i], (size_t)D * elem, (size_t)D * elem, (size_t)(B * H),
                            cudaMemcpyDeviceToDevice));
    CUDA_CHECK(cudaFree(ds->out[i]));
    ds->out[i] = padded;
    fd_tensor *t = &ds->states_out[i];
    t->data = padded;
    t->strides[0] = t->strides[1] = H * (D + 8);
    t->strides[2] = D + 8;
  }
  if (pad_lse) {
    float *spread = NULL;
    CUDA_CHECK(cudaMalloc((void **)&spread, (size_t)(B * H) * 3 * sizeof(float)));
    CUDA_CHECK(cudaMemcpy2D(spread, 3 * sizeof(float), ds->lse[i], sizeof(float), sizeof(float), (size_t)(B * H),
                            cudaMemcpyDeviceToDevice));
    CUDA_CHECK(cudaFree(ds->lse[i]));
    ds->lse[i] = spread;
    fd_tensor *t = &ds->states_lse[i];
    t->data = spread;
    t->strides[0] = t->strides[1] = 3 * H;
    t->strides[2] = 3;
  }
}

static void free_device_states(device_states *ds, int count) {
  for (int i = 0; i < count; ++i) {
    CUDA_CHECK(cudaFree(ds->out[i]));
    CUDA_CHECK(cudaFree(ds->lse[i]));
    CUDA_CHECK(cudaFree(ds->lens[i]));
  }
}

/* fd_merge_states on the device: the cache decoded in parts (each with its
 * LSE) and merged equals the whole within the output's bound; also in place,
 * over state 0's own out and lse. The cases reach both kernels: up to 8
 * aligned states of one dtype (the vector kernel, head_dim 40 leaving lanes
 * idle; states of one layout, and states whose out rows or LSEs are laid out
 * differently), and more states, or mixed state dtypes (the general one); from 1
 * state (the whole cache: the merge must give that state back, each
 * element exactly, rounded to out's dtype) to FD_MAX_MERGE_STATES (64
 * parts of 47 tokens). Ragged lengths leave some parts empty (LSE -inf):
 * with 64 parts, every part of the short sequences but the first. */
static void test_merge_states(void **state) {
  (void)state;
  enum { kMaxParts = FD_MAX_MERGE_STATES };
  /* kPaddedOut: odd states' out rows padded; kSpreadLse: the last state's
   * LSE strided (only the LSEs' layouts differ). Both in the case's dtype. */
  enum state_dtypes { kSame, kF32, kMixed, kPaddedOut, kSpreadLse };
  static const struct {
    fd_dtype dtype;
    int64_t head_dim;
    int parts;
    enum state_dtypes states;
  } cases[] = {
      {FD_DTYPE_F16, 128, 3, kSame},      {FD_DTYPE_BF16, 128, 3, kSame},    {FD_DTYPE_F32, 128, 3, kSame},
      {FD_DTYPE_F16, 64, 3, kF32},        {FD_DTYPE_BF16, 64, 8, kF32},      {FD_DTYPE_F32, 64, 3, kF32},
      {FD_DTYPE_F16, 40, 5, kSame},       {FD_DTYPE_BF16, 256, 2, kSame},    {FD_DTYPE_F16, 128, 12, kSame},
      {FD_DTYPE_BF16, 128, 4, kMixed},    {FD_DTYPE_F16, 72, 6, kMixed},     {FD_DTYPE_F16, 128, 1, kSame},
      {FD_DTYPE_BF16, 64, 1, kF32},       {FD_DTYPE_BF16, 128, 64, kSame},   {FD_DTYPE_F16, 64, 64, kMixed},
      {FD_DTYPE_F16, 128, 4, kPaddedOut}, {FD_DTYPE_F32, 64, 3, kPaddedOut}, {FD_DTYPE_BF16, 128, 3, kSpreadLse},
  };
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; ++k) {
    fdt_case c = dense_case(cases[k].dtype, 9, 32, 8, cases[k].head_dim, 3000, g_seed + 480 + (uint64_t)k);
    c.ragged = 1;
    c.with_lse = 1;
    gpu_case t;
    open_case(&t, &c);
    fdt_problem *p = &t.p;
    const int parts = cases[k].parts;
    const int64_t B = c.batch, H = c.q_heads, D = c.head_dim;
    device_states ds;
    int slot[kMaxParts];
    for (int s = 0; s < parts; ++s) {
      slot[s] = s;
      ds.dtype[s] = cases[k].states == kF32 || (cases[k].states == kMixed && s % 2 == 1) ? FD_DTYPE_F32 : c.dtype;
    }
    decode_parts_on_device(&t, parts, slot, &ds);
    for (int s = 0; s < parts; ++s) {
      repack_device_state(&ds, s, B, H, D, cases[k].states == kPaddedOut && s % 2 == 1,
                          cases[k].states == kSpreadLse && s == parts - 1);
    }
    void **outs = ds.out;
    float **lses = ds.lse;
    const fd_dtype *state_dtypes = ds.dtype;
    fd_tensor *states_out = ds.states_out, *states_lse = ds.states_lse;
    fd_merge_args m;
    fd_merge_args_init(&m, sizeof m);
    m.num_states = parts;
    m.states_out = states_out;
    m.states_lse = states_lse;
    m.out = t.d.args.out;
    m.lse = t.d.args.lse;
    if (fd_merge_states(g_cuda, &m, (fd_cuda_stream)g_stream) != FD_SUCCESS) fail_msg("merge: %s", last_message());
    CUDA_CHECK(cudaStreamSynchronize(g_stream));
    if (fdt_cuda_download(&t.d, p) != 0) fail_msg("download failed");
    char report[256];
    int bad = fdt_check(p, report, sizeof report, NULL, NULL);
    /* One state: the merge gives it back (its weight exp(0) is 1, and so is
     * l), each element rounded to out's dtype, and its LSE as it is
     * (+ log 1). Before the in-place merge below overwrites it. */
    int64_t identity_bad = 0;
    if (parts == 1) {
      const size_t state_bytes = (size_t)(B * H * D) * fdt_dtype_size(state_dtypes[0]);
      void *state_out = malloc(state_bytes);
      float *state_lse = malloc((size_t)(B * H) * sizeof(float));
      if (state_out == NULL || state_lse == NULL) fail_msg("out of host memory");
      CUDA_CHECK(cudaMemcpy(state_out, outs[0], state_bytes, cudaMemcpyDeviceToHost));
      CUDA_CHECK(cudaMemcpy(state_lse, lses[0], (size_t)(B * H) * sizeof(float), cudaMemcpyDeviceToHost));
      /* out and the state are both [B, 1, H, D] contiguous, lse [B, 1, H]. */
      for (int64_t i = 0; i < B * H * D; ++i) {
        const double want = fdt_round_to(c.out_dtype, fdt_load(state_dtypes[0], state_out, i));
        identity_bad += !(fdt_load(c.out_dtype, p->out, i) == want);
      }
      for (int64_t i = 0; i < B * H; ++i) identity_bad += !(((const float *)p->lse)[i] == state_lse[i]);
      free(state_out);
      free(state_lse);
    }
    /* In place over state 0 (when its dtype is out's). */
    int in_place_bad = 0;
    const int in_place = state_dtypes[0] == c.out_dtype;
    if (in_place) {
      unsigned char *expected = malloc(p->out_bytes);
      memcpy(expected, p->out, p->out_bytes);
      m.out = states_out[0];
      m.lse = states_lse[0];
      if (fd_merge_states(g_cuda, &m, (fd_cuda_stream)g_stream) != FD_SUCCESS) fail_msg("in place: %s", last_message());
      CUDA_CHECK(cudaStreamSynchronize(g_stream));
      unsigned char *got = malloc(p->out_bytes);
      CUDA_CHECK(cudaMemcpy(got, outs[0], p->out_bytes, cudaMemcpyDeviceToHost));
      in_place_bad = memcmp(got, expected, p->out_bytes) != 0;
      free(got);
      free(expected);
    }
    static const char *const kLayouts[] = {"", "", "", ", padded out rows", ", a spread LSE"};
    print_message("merge of %d parts, %s states%s -> %s, head_dim %lld: %s; in place %s%s\n", parts,
                  cases[k].states == kMixed ? "mixed" : fdt_dtype_name(state_dtypes[0]), kLayouts[cases[k].states],
                  fdt_dtype_name(c.out_dtype), (long long)D, report,
                  in_place ? (in_place_bad ? "DIFFERS" : "bitwise") : "n/a",
                  parts == 1 ? (identity_bad ? "; the state back: DIFFERS" : "; the state back: exactly") : "");
    free_device_states(&ds, parts);
    close_case(&t);
    if (bad || in_place_bad) fail_msg("merge case %zu: %s", k, report);
    if (identity_bad)
      fail_msg("merge case %zu: %lld elements of one state's merge are not the state", k, (long long)identity_bad);
  }
}

/* fd_merge_states' rules for empty and non-finite states (flashdecode.h,
 * fd_merge_args) on both kernels: the cache decoded in parts as above, with
 * NaN written into every row of a part's output whose LSE is -inf (an
 * empty part of that row), and a state that is empty everywhere (LSE -inf)
 * and NaN everywhere put in after the first part: neither NaN may reach the
 * result, which must still be the whole decode. Three rows get a
 * non-finite LSE in one state, and must come out NaN (every element and
 * the LSE): NaN in a part that has keys (sequence 1, full), NaN in the one
 * sequence with no keys (sequence 0: every other state of that row is
 * empty), and +inf (sequence 3, whose keys all lie in the first part). 4
 * states of one dtype (the vector kernel), then 10 of two dtypes (the
 * general one). */
static void test_merge_states_nan_rules(void **state) {
  (void)state;
  enum { kMaxStates = 10 };
  static const struct {
    fd_dtype dtype;
    int parts; /* decoded parts; the all-empty NaN state makes one more */
    int mixed; /* the odd parts' states in f32 */
  } cases[] = {{FD_DTYPE_F16, 3, 0}, {FD_DTYPE_BF16, 9, 1}};
  /* (sequence, query head) of the rows given a non-finite LSE, the state (a part's) it goes into, and the LSE. */
  static const struct {
    int64_t b, h;
    int part;
    float lse;
  } special[] = {{1, 3, 1, NAN}, {0, 5, 0, NAN}, {3, 9, 0, INFINITY}};
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; ++k) {
    /* lengths 0, 1000, 1, 63, 64, 65, random: sequence 3's 63 keys lie in the first part (of 334 or 112) */
    fdt_case c = dense_case(cases[k].dtype, 7, 16, 4, 128, 1000, g_seed + 496 + (uint64_t)k);
    c.ragged = 1;
    c.with_lse = 1;
    gpu_case t;
    open_case(&t, &c);
    fdt_problem *p = &t.p;
    const int parts = cases[k].parts, states = parts + 1;
    const int64_t B = c.batch, H = c.q_heads, D = c.head_dim;
    device_states ds;
    memset(&ds, 0, sizeof ds);
    /* State 0 is part 0, state 1 the all-empty one, state s + 1 part s. */
    int slot[kMaxStates];
    for (int s = 0; s < parts; ++s) {
      slot[s] = s == 0 ? 0 : s + 1;
      ds.dtype[slot[s]] = cases[k].mixed && s % 2 == 1 ? FD_DTYPE_F32 : c.dtype;
    }
    decode_parts_on_device(&t, parts, slot, &ds);
    void **outs = ds.out;
    float **lses = ds.lse;
    fd_dtype *dtypes = ds.dtype;
    fd_tensor *states_out = ds.states_out, *states_lse = ds.states_lse;
    CUDA_CHECK(cudaStreamSynchronize(g_stream));
    /* The all-empty state: out all NaN, LSE all -inf; its tensors as part 0's. */
    dtypes[1] = c.dtype;
    CUDA_CHECK(cudaMalloc(&outs[1], (size_t)(B * H * D) * fdt_dtype_size(c.dtype)));
    CUDA_CHECK(cudaMalloc((void **)&lses[1], (size_t)(B * H) * sizeof(float)));
    CUDA_CHECK(cudaMemset(outs[1], 0xff, (size_t)(B * H * D) * fdt_dtype_size(c.dtype)));
    float *host_lse = malloc((size_t)(B * H) * sizeof(float));
    unsigned char *host_out = malloc((size_t)(B * H * D) * sizeof(float));
    if (host_lse == NULL || host_out == NULL) fail_msg("out of host memory");
    for (int64_t r = 0; r < B * H; ++r) host_lse[r] = -INFINITY;
    CUDA_CHECK(cudaMemcpy(lses[1], host_lse, (size_t)(B * H) * sizeof(float), cudaMemcpyHostToDevice));
    states_out[1] = states_out[0];
    states_out[1].data = outs[1];
    states_lse[1] = states_lse[0];
    states_lse[1].data = lses[1];
    /* NaN in every empty row of every part, and the special LSEs. */
    int64_t nan_rows = 0;
    for (int i = 0; i < states; ++i) {
      if (i == 1) continue;
      const size_t es = fdt_dtype_size(dtypes[i]);
      CUDA_CHECK(cudaMemcpy(host_out, outs[i], (size_t)(B * H * D) * es, cudaMemcpyDeviceToHost));
      CUDA_CHECK(cudaMemcpy(host_lse, lses[i], (size_t)(B * H) * sizeof(float), cudaMemcpyDeviceToHost));
      for (int64_t r = 0; r < B * H; ++r) {
        if (host_lse[r] != -INFINITY) continue;
        memset(host_out + (size_t)(r * D) * es, 0xff, (size_t)D * es);
        ++nan_rows;
      }
      for (size_t j = 0; j < sizeof special / sizeof special[0]; ++j) {
        if ((special[j].part == 0 ? 0 : special[j].part + 1) == i)
          host_lse[special[j].b * H + special[j].h] = special[j].lse;
      }
      CUDA_CHECK(cudaMemcpy(outs[i], host_out, (size_t)(B * H * D) * es, cudaMemcpyHostToDevice));
      CUDA_CHECK(cudaMemcpy(lses[i], host_lse, (size_t)(B * H) * sizeof(float), cudaMemcpyHostToDevice));
    }
    for (size_t j = 0; j < sizeof special / sizeof special[0]; ++j) {
      const int64_t row = special[j].b * H + special[j].h; /* one query token */
      for (int64_t d = 0; d < D; ++d) p->expect_out[row * D + d] = NAN;
      p->expect_lse[row] = NAN;
    }
    CUDA_CHECK(cudaDeviceSynchronize()); /* the copies above, before the merge on the non-blocking stream */
    fd_merge_args m;
    fd_merge_args_init(&m, sizeof m);
    m.num_states = states;
    m.states_out = states_out;
    m.states_lse = states_lse;
    m.out = t.d.args.out;
    m.lse = t.d.args.lse;
    const fd_status status = fd_merge_states(g_cuda, &m, (fd_cuda_stream)g_stream);
    CUDA_CHECK(cudaStreamSynchronize(g_stream));
    char report[256] = "not run";
    int bad = 1;
    if (status == FD_SUCCESS) {
      if (fdt_cuda_download(&t.d, p) != 0) fail_msg("download failed");
      bad = fdt_check(p, report, sizeof report, NULL, NULL);
    }
    print_message(
        "merge of %d states (%d parts and an empty one of NaN, %s), %lld empty part rows of NaN, "
        "NaN / +inf LSEs: %s\n",
        states, parts, cases[k].mixed ? "mixed dtypes" : fdt_dtype_name(c.dtype), (long long)nan_rows, report);
    free(host_lse);
    free(host_out);
    free_device_states(&ds, states);
    close_case(&t);
    if (status != FD_SUCCESS) fail_msg("merge: %s: %s", fd_status_string(status), last_message());
    if (bad || nan_rows == 0) fail_msg("merge NaN rules case %zu: %s", k, report);
  }
}

/* Zeroing a new workspace's counters stays off the legacy default stream,
 * which CUDA forbids while any blocking stream captures: a handle sizes its
 * workspace (fd_reserve_workspace, fd_set_workspace) beside another stream's
 * capture in relaxed mode, and the capture survives it. */
static void test_workspace_setup_beside_a_capture(void **state) {
  (void)state;
  /* Fresh handles: neither frees a workspace (cudaFree) inside the capture. */
  fd_handle *h = make_handle(FD_BACKEND_CUDA), *h2 = make_handle(FD_BACKEND_CUDA);
  cudaStream_t capturing;
  CUDA_CHECK(cudaStreamCreate(&capturing)); /* a blocking stream */
  void *caller_workspace = NULL;
  CUDA_CHECK(cudaMalloc(&caller_workspace, (size_t)1 << 20));
  CUDA_CHECK(cudaStreamBeginCapture(capturing, cudaStreamCaptureModeRelaxed));
  const fd_status reserved = fd_reserve_workspace(h, (size_t)4 << 20);
  char reserve_message[512];
  snprintf(reserve_message, sizeof reserve_message, "%s", last_message());
  const fd_status set = fd_set_workspace(h2, caller_workspace, (size_t)1 << 20);
  char set_message[512];
  snprintf(set_message, sizeof set_message, "%s", last_message());
  cudaGraph_t graph = NULL;
  const cudaError_t ended = cudaStreamEndCapture(capturing, &graph);
  if (graph != NULL) CUDA_CHECK(cudaGraphDestroy(graph));
  fd_destroy(h);
  fd_destroy(h2);
  CUDA_CHECK(cudaFree(caller_workspace));
  CUDA_CHECK(cudaStreamDestroy(capturing));
  print_message("beside a capture: reserve %d, set %d, capture %s\n", (int)reserved, (int)set,
                cudaGetErrorString(ended));
  if (reserved != FD_SUCCESS) fail_msg("fd_reserve_workspace beside a capture: %s", reserve_message);
  if (set != FD_SUCCESS) fail_msg("fd_set_workspace beside a capture: %s", set_message);
  if (ended != cudaSuccess) fail_msg("the capture beside them: %s", cudaGetErrorString(ended));
}

/* fd_merge_states over more than 2^32 rows (head_dim 1, one broadcast f32
 * state: the general kernel): rows past 2^32 are written too (a 32-bit row
 * index once wrapped there and left them). 8 GiB of output, poisoned with
 * NaN; the first, middle and last 1024 rows are checked. */
static void test_merge_states_many_rows(void **state) {
  (void)state;
  if (g_quick) skip();
  const int64_t heads = 1024, batch = ((int64_t)1 << 32) / heads + 1; /* rows = 2^32 + 1024 */
  const int64_t rows = batch * heads;
  const size_t bytes = (size_t)rows * sizeof(uint16_t);
  size_t free_bytes = 0, total_bytes = 0;
  CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  if (free_bytes < bytes + ((size_t)1 << 30)) {
    print_message("merge of 2^32 + 1024 rows: skipped, %zu bytes free\n", free_bytes);
    skip();
  }
  uint16_t *out = NULL;
  float *scalars = NULL; /* the state's value and its LSE */
  CUDA_CHECK(cudaMalloc((void **)&out, bytes));
  CUDA_CHECK(cudaMalloc((void **)&scalars, 2 * sizeof(float)));
  CUDA_CHECK(cudaMemset(out, 0xff, bytes));
  const float host_scalars[2] = {1.5f, 0.25f};
  CUDA_CHECK(cudaMemcpy(scalars, host_scalars, sizeof host_scalars, cudaMemcpyHostToDevice));
  fd_tensor state_out = {scalars, FD_DTYPE_F32, 4, {batch, 1, heads, 1}, {0, 0, 0, 0}};
  fd_tensor state_lse = {scalars + 1, FD_DTYPE_F32, 3, {batch, 1, heads}, {0, 0, 0}};
  fd_merge_args m;
  fd_merge_args_init(&m, sizeof m);
  m.num_states = 1;
  m.states_out = &state_out;
  m.states_lse = &state_lse;
  m.out = (fd_tensor){out, FD_DTYPE_F16, 4, {batch, 1, heads, 1}, {heads, heads, 1, 1}};
  const fd_status status = fd_merge_states(g_cuda, &m, (fd_cuda_stream)g_stream);
  if (status == FD_SUCCESS) CUDA_CHECK(cudaStreamSynchronize(g_stream));
  const int64_t firsts[] = {0, rows / 2, rows - heads};
  int64_t wrong = 0, first_wrong = -1;
  uint16_t got[1024];
  for (int k = 0; status == FD_SUCCESS && k < 3; ++k) {
    CUDA_CHECK(cudaMemcpy(got, out + firsts[k], sizeof got, cudaMemcpyDeviceToHost));
    for (int64_t i = 0; i < heads; ++i) {
      if (got[i] == 0x3e00) continue; /* 1.5 in f16 */
      if (first_wrong < 0) first_wrong = firsts[k] + i;
      ++wrong;
    }
  }
  CUDA_CHECK(cudaFree(out));
  CUDA_CHECK(cudaFree(scalars));
  if (status != FD_SUCCESS) fail_msg("merge of %lld rows: %s", (long long)rows, last_message());
  print_message("merge of %lld rows: %lld of 3072 checked rows wrong\n", (long long)rows, (long long)wrong);
  if (wrong) fail_msg("merge of %lld rows: row %lld not written", (long long)rows, (long long)first_wrong);
}

/* Every sequence empty: zeros and LSE -inf, never NaN, with one split or many. */
static void test_all_sequences_empty(void **state) {
  (void)state;
  const int32_t split_choices[] = {1, 3, 0};
  for (int k = 0; k < 3; ++k) {
    fdt_case c = dense_case(FD_DTYPE_F32, 2, 4, 1, 32, 0, 0);
    c.with_lse = 1;
    c.num_splits = split_choices[k];
    char what[64];
    snprintf(what, sizeof what, "all sequences empty, splits %d", (int)c.num_splits);
    expect_case_passes(&c, what);
  }
}

/* A paged batch whose every length is 0 (zero keys in all: the balanced
 * schedule, which cuts the batch's keys into equal runs, has nothing to
 * cut): zeros and LSE -inf (the sink with sinks) on the tensor cores
 * (standard and compact tiles), the CUDA cores, an 8-bit cache and the
 * variants, the plan the device's cut (0 splits), twice
 * bitwise equal; then each captured in a graph and replayed as the lengths
 * go from the generated ragged ones to all 0, to new ragged ones and back
 * to all 0 (with new data and block tables each round), checked against
 * the reference every replay. Each case's plan is pinned on the host by
 * test_cuda_policy's test_gpu_test_schedules. */
static void test_paged_all_sequences_empty(void **state) {
  (void)state;
  static const struct {
    const char *what;
    fd_dtype dtype, out_dtype, kv_dtype;
    int64_t batch, q_heads, kv_heads, head_dim, kv_len, q_len, window;
    int sinks;
  } spec[] = {
      {"120 units", FD_DTYPE_F16, FD_DTYPE_F16, 0, 60, 8, 2, 128, 500, 1, 0, 0},
      {"320 units (compact tiles on sm_90)", FD_DTYPE_BF16, FD_DTYPE_BF16, 0, 40, 32, 8, 128, 500, 1, 0, 0},
      {"f32 out: CUDA cores", FD_DTYPE_F16, FD_DTYPE_F32, 0, 50, 8, 2, 96, 500, 1, 0, 0},
      {"e4m3 cache", FD_DTYPE_F16, FD_DTYPE_F16, FD_DTYPE_E4M3, 36, 32, 8, 128, 500, 1, 0, 0},
      {"q_len 3, window, sinks", FD_DTYPE_BF16, FD_DTYPE_BF16, 0, 45, 16, 4, 64, 500, 3, 150, 1},
  };
  for (size_t i = 0; i < sizeof spec / sizeof spec[0]; ++i) {
    fdt_case c = dense_case(spec[i].dtype, spec[i].batch, spec[i].q_heads, spec[i].kv_heads, spec[i].head_dim,
                            g_quick ? spec[i].kv_len / 2 : spec[i].kv_len, g_seed + 1950 + (uint64_t)i);
    c.out_dtype = spec[i].out_dtype;
    c.kv_dtype = spec[i].kv_dtype;
    if (c.kv_dtype != 0) c.scale_mode = FDT_SCALE_TENSOR;
    c.layout = FDT_PAGED_NHD;
    c.page_size = 16;
    c.ragged = 1;
    c.with_lse = 1;
    c.q_len = spec[i].q_len;
    c.window = spec[i].window;
    c.sinks = spec[i].sinks;
    int64_t *zeros = calloc((size_t)c.batch, sizeof *zeros);
    if (zeros == NULL) fail_msg("out of host memory");
    c.lens = zeros;
    gpu_case t;
    open_case(&t, &c);
    const fd_plan_info plan = describe(g_cuda, &t.d.args);
    int same = 1;
    int bad = check_case_twice(&t, &same);
    print_message("paged, every length 0, %s: %lldx%lld/%lld x %lld (%s, %d splits, %lld blocks): %s\n", spec[i].what,
                  (long long)c.batch, (long long)c.q_heads, (long long)c.kv_heads, (long long)c.head_dim, plan.kernel,
                  (int)plan.num_splits, (long long)plan.blocks, t.report);
    if (bad || !same || plan.num_splits != 0) {
      close_case(&t);
      free(zeros);
      if (plan.num_splits != 0)
        fail_msg("paged, every length 0, %s: %d splits planned, not the device's cut", spec[i].what,
                 (int)plan.num_splits);
      fail_msg("paged, every length 0, %s: %s", spec[i].what, bad ? t.report : "two runs differ");
    }

    /* The graph: captured now, replayed with ragged lengths, all 0, new ragged ones, all 0. */
    fd_handle *h = make_handle(FD_BACKEND_CUDA);
    reserve_for(h, &t.d.args);
    cudaStream_t stream;
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    cudaGraph_t graph;
    const cudaGraphExec_t exec = capture_decode(h, &t.d.args, stream, &graph);
    bad = 0;
    for (int round = 0; round < 4 && !bad; ++round) {
      c.lens = round % 2 ? zeros : NULL;
      c.seed = g_seed + 1960 + (uint64_t)(i * 8 + (size_t)round);
      fdt_problem fresh;
      make_problem(&fresh, &c);
      assert_int_equal(fresh.kv_bytes, t.p.kv_bytes);
      if (fdt_cuda_refresh_inputs(&fresh, &t.d) != 0) fail_msg("refreshing the inputs failed");
      fdt_problem_free(&t.p);
      t.p = fresh;
      replay_poisoned(&t, exec, stream);
      bad = fdt_check(&t.p, t.report, sizeof t.report, NULL, NULL);
      print_message("paged, every length 0, %s: graph replay %d (%s): %s\n", spec[i].what, round,
                    round % 2 ? "every length 0" : "ragged lengths", t.report);
    }
    destroy_graph(exec, graph, stream);
    assert_int_equal(fd_destroy(h), FD_SUCCESS);
    close_case(&t);
    free(zeros);
    if (bad) fail_msg("paged, every length 0, %s: graph replay: %s", spec[i].what, t.report);
  }
}

/* Non-finite scores by the header's rules (fdt.h, "non-finite values") on
 * each split kernel and merge: f16 and bf16 on the tensor cores (one split,
 * a few, automatic), f32 on the CUDA cores, MHA head_dim 64 and GQA head_dim
 * 256; and one key dominating long contexts, whose thousands of tiny weights
 * (~2^-20 of the largest) must survive the tensor cores' 16-bit P. */
static void test_non_finite_scores(void **state) {
  (void)state;
  static const struct {
    fd_dtype dtype;
    int64_t q_heads, kv_heads, head_dim, kv_len;
    int32_t splits;
  } shapes[] = {
      {FD_DTYPE_F16, 32, 8, 128, 1500, 1},  {FD_DTYPE_F16, 32, 8, 128, 1500, 4},  {FD_DTYPE_F16, 32, 8, 128, 1500, 0},
      {FD_DTYPE_BF16, 16, 2, 256, 3000, 0}, {FD_DTYPE_F32, 8, 2, 128, 1500, 0},   {FD_DTYPE_F32, 8, 2, 64, 1500, 9},
      {FD_DTYPE_F16, 16, 16, 64, 2000, 0},  {FD_DTYPE_BF16, 8, 1, 128, 16384, 0}, {FD_DTYPE_F16, 32, 8, 128, 16384, 0},
      {FD_DTYPE_F16, 32, 8, 128, 16384, 1},
  };
  int failures = 0, checked = 0;
  for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; ++si) {
    for (int special = 0; special < FDT_SPECIAL_COUNT; ++special) {
      /* Long contexts for the dominant key only: their float64 reference is slow. */
      if (shapes[si].kv_len > 4096 && special != FDT_SPECIAL_DOMINANT_KEY) continue;
      fdt_case c = dense_case(shapes[si].dtype, 2, shapes[si].q_heads, shapes[si].kv_heads, shapes[si].head_dim,
                              shapes[si].kv_len, g_seed + 700 + si * 16 + (uint64_t)special);
      c.with_lse = 1;
      c.num_splits = shapes[si].splits;
      gpu_case t;
      memset(&t, 0, sizeof t);
      const int made = fdt_problem_make_special(&t.p, &c, (fdt_special)special);
      if (made == 1) continue; /* does not apply to this dtype */
      if (made != 0) fail_msg("out of host memory generating a problem");
      if (fdt_cuda_upload(&t.p, &t.d) != 0) {
        fdt_problem_free(&t.p);
        fail_msg("copying the problem to the device failed");
      }
      const fd_plan_info plan = describe(g_cuda, &t.d.args);
      const int bad = check_case(&t);
      ++checked;
      if (bad || special == FDT_SPECIAL_DOMINANT_KEY) {
        print_message("%s, %s %lld/%lld x%lld d%lld, %s %dx%lld %d: %s\n", fdt_special_name((fdt_special)special),
                      fdt_dtype_name(c.dtype), (long long)c.q_heads, (long long)c.kv_heads, (long long)c.kv_len,
                      (long long)c.head_dim, plan.kernel, (int)plan.num_splits, (long long)plan.split_tokens,
                      (int)plan.merge, t.report);
      }
      failures += bad;
      close_case(&t);
    }
  }
  print_message("non-finite and dominant-key cases: %d checked, %d failed\n", checked, failures);
  assert_int_equal(failures, 0);
}

/* More sequences than a grid's y dimension holds (65535): CTAs loop over them.
 * With up to 300 tokens a sequence may take several tiles of the tensor-core
 * kernel (128 tokens for this head_dim), so a CTA's pipeline runs dry and
 * starts again from one sequence to the next, not just one partial tile. */
static void test_batch_beyond_grid_limit(void **state) {
  (void)state;
  const int64_t lengths[] = {5, 5, 300};
  const int32_t split_choices[] = {1, 2, 1};
  for (int k = 0; k < 3; ++k) {
    fdt_case c = dense_case(FD_DTYPE_F16, 70000, 2, 1, 16, lengths[k], g_seed + 600 + (uint64_t)k);
    c.ragged = 1;
    c.with_lse = 1;
    c.num_splits = split_choices[k];
    char what[64];
    snprintf(what, sizeof what, "batch 70000, up to %lld tokens, splits %d", (long long)lengths[k], (int)c.num_splits);
    expect_case_passes(&c, what);
  }
}

/* The planner's rules, over a grid of dense shapes (fd_describe_plan reads
 * no memory, so the tensors are shapes at a made-up, aligned address):
 * automatic splits cover the cache and are at least 128 tokens (or one);
 * wide tensor-core splits are longer than the wide pipeline (two stages of
 * 256, 128 or 64 tokens for head_dim buckets 64, 128, 256:
 * refills_pipeline in policy.cpp); cluster merges have 2-8 splits;
 * the merge decides the launches; the workspace is fd_workspace_size's.
 * On sm_90+ some shapes must get wide tiles (they exist there). */
/* A dense tensor at a made-up address (plans never read memory): q and out
 * at 2^32, the cache at 2^40, apart as outputs and inputs must be. */
static fd_tensor fake_dense(fd_dtype dtype, int64_t b, int64_t n, int64_t h, int64_t d) {
  const uintptr_t address = n == 1 ? (uintptr_t)1 << 32 : (uintptr_t)1 << 40;
  fd_tensor t = {(void *)address, dtype, 4, {b, n, h, d}, {n * h * d, h * d, d, 1}};
  return t;
}

static void test_plan_rules(void **state) {
  (void)state;
  static const int64_t batches[] = {1, 2, 8, 32, 128};
  static const int64_t heads[][2] = {{32, 8}, {32, 32}, {64, 8}, {8, 1}, {16, 16}, {8, 4}};
  static const int64_t lengths[] = {100, 1024, 2048, 4096, 8192, 32768, 262144};
  static const int64_t head_dims[] = {64, 128, 256};
  int cc_major = 0;
  CUDA_CHECK(cudaDeviceGetAttribute(&cc_major, cudaDevAttrComputeCapabilityMajor, 0));
  int checked = 0, wide = 0;
  for (size_t bi = 0; bi < sizeof batches / sizeof batches[0]; ++bi)
    for (size_t hi = 0; hi < sizeof heads / sizeof heads[0]; ++hi)
      for (size_t li = 0; li < sizeof lengths / sizeof lengths[0]; ++li)
        for (size_t di = 0; di < sizeof head_dims / sizeof head_dims[0]; ++di) {
          const int64_t b = batches[bi], hq = heads[hi][0], hkv = heads[hi][1], n = lengths[li], d = head_dims[di];
          if (b * n > (int64_t)1 << 24) continue; /* beyond any cache a test machine would hold */
          fd_decode_args a;
          fd_decode_args_init(&a, sizeof a);
          a.q = fake_dense(FD_DTYPE_F16, b, 1, hq, d);
          a.k = a.v = fake_dense(FD_DTYPE_F16, b, n, hkv, d);
          a.out = a.q;
          const fd_plan_info plan = describe(g_cuda, &a);
          size_t bytes = 0;
          assert_int_equal(fd_workspace_size(g_cuda, &a, &bytes), FD_SUCCESS);
          const int64_t splits = plan.num_splits, tokens = plan.split_tokens;
          const int64_t wide_tile = d <= 64 ? 256 : d <= 128 ? 128 : 64;
          const char *broken = NULL;
          if (splits < 1 || splits * tokens < n || (splits - 1) * tokens >= n) broken = "splits do not cover the cache";
          else if (splits > 1 && tokens < 128) broken = "splits shorter than 128 tokens";
          else if (starts_with(plan.kernel, "tensor-core-wide-") && tokens <= 2 * wide_tile)
            broken = "wide splits that fit in the pipeline";
          else if (plan.merge == FD_MERGE_CLUSTER &&
                   (splits < 2 || splits > 8 || !starts_with(plan.kernel, "tensor-core")))
            broken = "a cluster merge outside 2-8 tensor-core splits";
          else if ((splits == 1) != (plan.merge == FD_MERGE_NONE)) broken = "a merge that does not match the splits";
          else if (plan.workspace_bytes != bytes) broken = "a workspace other than fd_workspace_size's";
          if (broken) {
            fail_msg("%lldx%lld/%lldx%lldx%lld: %s (%s, %lld splits of %lld, merge %d)", (long long)b, (long long)hq,
                     (long long)hkv, (long long)n, (long long)d, broken, plan.kernel, (long long)splits,
                     (long long)tokens, (int)plan.merge);
          }
          wide += starts_with(plan.kernel, "tensor-core-wide-");
          ++checked;
        }
  print_message("plan rules held on %d shapes, %d of them on wide tiles\n", checked, wide);
  if (cc_major >= 9 && wide == 0) fail_msg("no shape was planned on wide tiles on compute capability %d", cc_major);
}

/* MHA with head_dim 65-128 takes the CUDA-core kernel with thousands of
 * sequence-heads (16+ waves of tensor-core CTAs: 4224 on a 132-SM H200) and
 * the tensor cores below that (kMhaCudaCoreMinWaves, policy.cpp): one
 * problem on each side, each dtype, with automatic splits; fd_describe_plan
 * must name the kernel family that ran (pinned on the host by
 * test_cuda_policy's test_gpu_test_merges). */
static void test_mha_128_both_kernels(void **state) {
  (void)state;
  const int64_t batches[] = {6, 160}; /* x 32 heads: 192 and 5120 units */
  for (int k = 0; k < 4; ++k) {
    const fd_dtype dtype = k % 2 ? FD_DTYPE_BF16 : FD_DTYPE_F16;
    fdt_case c = dense_case(dtype, batches[k / 2], 32, 32, 128, k / 2 ? 96 : 1500, g_seed + 700 + (uint64_t)k);
    c.with_lse = 1;
    gpu_case t;
    open_case(&t, &c);
    const fd_plan_info plan = describe(g_cuda, &t.d.args);
    const int bad = check_case(&t);
    print_message("MHA-128 %s batch %lld (%s): %s\n", fdt_dtype_name(dtype), (long long)c.batch, plan.kernel, t.report);
    close_case(&t);
    if (bad) fail_msg("MHA-128 batch %lld: %s", (long long)c.batch, t.report);
    const char *expected = k / 2 ? "cuda-core-128" : "tensor-core-"; /* standard or wide tiles */
    if (!starts_with(plan.kernel, expected)) {
      fail_msg("MHA-128 batch %lld planned on %s, expected %s...", (long long)c.batch, plan.kernel, expected);
    }
  }
}

/* ---- rejected input -------------------------------------------------------------- */

/* Expects `status` with `needle` in the message and the device output untouched. */
static void expect_rejected(fd_handle *h, const fdt_problem *p, const fdt_device_problem *d, const fd_decode_args *args,
                            fd_status status, const char *needle) {
  const fd_status got = fd_decode(h, args, (fd_cuda_stream)g_stream);
  if (got != status || strstr(last_message(), needle) == NULL) {
    fail_msg("expected %s with \"%s\", got %s: %s", fd_status_string(status), needle, fd_status_string(got),
             last_message());
  }
  print_message("rejected as expected: %s\n", last_message());
  CUDA_CHECK(cudaStreamSynchronize(g_stream));
  unsigned char *out = malloc(p->out_bytes);
  CUDA_CHECK(cudaMemcpy(out, d->out, p->out_bytes, cudaMemcpyDeviceToHost));
  for (size_t i = 0; i < p->out_bytes; ++i) {
    if (out[i] != 0xff) fail_msg("output byte %zu was written (0x%02x) by a rejected call", i, out[i]);
  }
  free(out);
}

static void test_bad_input_rejected(void **state) {
  (void)state;
  fdt_case c = dense_case(FD_DTYPE_F16, 2, 8, 2, 64, 100, g_seed + 7);
  c.ragged = 1;
  c.with_lse = 1;
  gpu_case t;
  open_case(&t, &c);
  fd_decode_args a;

  a = t.d.args;
  a.k.strides[3] = 2;
  expect_rejected(g_cuda, &t.p, &t.d, &a, FD_ERROR_INVALID_STRIDE, "k: stride of head_dim");
  a = t.d.args;
  a.v.dtype = FD_DTYPE_BF16;
  expect_rejected(g_cuda, &t.p, &t.d, &a, FD_ERROR_INVALID_DTYPE, "v: dtype");
  a = t.d.args;
  a.num_splits = FD_MAX_SPLITS + 1;
  expect_rejected(g_cuda, &t.p, &t.d, &a, FD_ERROR_INVALID_SPLITS, "num_splits");
  a = t.d.args;
  a.out.shape[2] += 1;
  expect_rejected(g_cuda, &t.p, &t.d, &a, FD_ERROR_INVALID_SHAPE, "out: q_heads");
  a = t.d.args;
  a.q.data = NULL;
  expect_rejected(g_cuda, &t.p, &t.d, &a, FD_ERROR_NULL_POINTER, "q: data is NULL");

  /* A caller-provided device workspace that is too small. */
  fd_handle *h = make_handle(FD_BACKEND_CUDA);
  void *small = NULL;
  CUDA_CHECK(cudaMalloc(&small, 256));
  assert_int_equal(fd_set_workspace(h, small, 256), FD_SUCCESS);
  a = t.d.args;
  a.num_splits = 8;
  expect_rejected(h, &t.p, &t.d, &a, FD_ERROR_WORKSPACE_TOO_SMALL, "workspace");
  assert_int_equal(fd_destroy(h), FD_SUCCESS);
  CUDA_CHECK(cudaFree(small));
  close_case(&t);
}

/* head_dim the CUDA kernels do not take: INVALID_HEAD_DIM naming head_dim. */
static void test_unsupported_head_dim(void **state) {
  (void)state;
  const int64_t dims[] = {8, 12, 20, 100};
  for (int k = 0; k < 4; ++k) {
    fdt_case c = dense_case(FD_DTYPE_F16, 1, 4, 2, dims[k], 10, 0);
    gpu_case t;
    open_case(&t, &c);
    expect_rejected(g_cuda, &t.p, &t.d, &t.d.args, FD_ERROR_INVALID_HEAD_DIM, "head_dim");
    size_t bytes = 0;
    assert_int_equal(fd_workspace_size(g_cuda, &t.d.args, &bytes), FD_ERROR_INVALID_HEAD_DIM);
    close_case(&t);
  }
}

static void test_auto_backend_is_cuda(void **state) {
  (void)state;
  fd_handle *h = make_handle(FD_BACKEND_AUTO);
  fd_backend backend = FD_BACKEND_CPU;
  assert_int_equal(fd_get_backend(h, &backend), FD_SUCCESS);
  assert_int_equal(backend, FD_BACKEND_CUDA);
  assert_int_equal(fd_destroy(h), FD_SUCCESS);
}

/* ---- setup and summary ---------------------------------------------------------- */
static int group_setup(void **state) {
  (void)state;
  g_cuda = make_handle(FD_BACKEND_CUDA);
  g_cpu = make_handle(FD_BACKEND_CPU);
  return cudaStreamCreateWithFlags(&g_stream, cudaStreamNonBlocking) == cudaSuccess ? 0 : -1;
}

static int group_teardown(void **state) {
  (void)state;
  static const char *names[] = {"f32", "f16", "bf16"};
  printf("\nworst errors of the matrix cases (rel = ||out - ref|| / ||ref||; lse = max |lse - ref|):\n");
  printf("%-12s %6s %12s %12s %12s %12s %10s\n", "q -> out", "cases", "rel vs f64", "lse vs f64", "rel vs cpu",
         "lse vs cpu", "rel bound");
  for (int d = 0; d < 3; ++d) {
    for (int f = 0; f < 2; ++f) {
      const worst_errors *w = &g_worst[d][f];
      if (w->cases == 0) continue;
      char label[32];
      snprintf(label, sizeof label, "%s -> %s", names[d], f ? "f32" : names[d]);
      printf("%-12s %6d %12.3g %12.3g %12.3g %12.3g %10.1g\n", label, w->cases, w->ref_out, w->ref_lse, w->cpu_out,
             w->cpu_lse, fdt_error_bound(f ? FD_DTYPE_F32 : (fd_dtype)d));
    }
  }
  fflush(stdout);
  cudaStreamDestroy(g_stream);
  fd_destroy(g_cuda);
  fd_destroy(g_cpu);
  return 0;
}

int main(void) {
  int devices = 0;
  const cudaError_t err = cudaGetDeviceCount(&devices);
  if (err != cudaSuccess || devices == 0) {
    printf("no CUDA device (%s): skipping the GPU tests\n",
           err == cudaSuccess ? "none found" : cudaGetErrorString(err));
    return 77;
  }
  const char *quick = getenv("FD_GPU_TEST_QUICK");
  g_quick = quick != NULL && quick[0] != '\0' && strcmp(quick, "0") != 0;
  const char *seed = getenv("FD_GPU_TEST_SEED");
  if (seed != NULL && seed[0] != '\0') g_seed = strtoull(seed, NULL, 10);
  /* A glob over test names (e.g. "tensor_core_case_*"): racecheck is too slow for the whole suite. */
  const char *filter = getenv("FD_GPU_TEST_FILTER");
  if (filter != NULL && filter[0] != '\0') cmocka_set_test_filter(filter);

  static fdt_case cases[kFullCases];
  static char names[kFullCases][32];
  const int count = make_matrix(cases, g_quick);
  static struct CMUnitTest tests[kFullCases + kTensorCoreCases + kVariantCases + kQuantizedCases + 48];
  int n = 0;
  tests[n++] = (struct CMUnitTest)cmocka_unit_test(test_auto_backend_is_cuda);
  for (int i = 0; i < count; ++i) {
    snprintf(names[i], sizeof names[i], "matrix_case_%03d", i);
    tests[n++] = (struct CMUnitTest){names[i], run_case, NULL, NULL, &cases[i]};
  }
  static fdt_case tc_cases[kTensorCoreCases];
  static char tc_names[kTensorCoreCases][32];
  const int tc_count = make_tensor_core_cases(tc_cases, g_quick);
  for (int i = 0; i < tc_count; ++i) {
    snprintf(tc_names[i], sizeof tc_names[i], "tensor_core_case_%d", i);
    tests[n++] = (struct CMUnitTest){tc_names[i], run_case, NULL, NULL, &tc_cases[i]};
  }
  static fdt_case variant_cases[kVariantCases];
  static char variant_names[kVariantCases][32];
  const int variant_count = make_variant_cases(variant_cases, g_quick);
  for (int i = 0; i < variant_count; ++i) {
    snprintf(variant_names[i], sizeof variant_names[i], "variant_case_%03d", i);
    tests[n++] = (struct CMUnitTest){variant_names[i], run_case, NULL, NULL, &variant_cases[i]};
  }
  static fdt_case quantized_cases[kQuantizedCases];
  static char quantized_names[kQuantizedCases][32];
  const int quantized_count = make_quantized_cases(quantized_cases, g_quick);
  for (int i = 0; i < quantized_count; ++i) {
    snprintf(quantized_names[i], sizeof quantized_names[i], "quantized_case_%02d", i);
    tests[n++] = (struct CMUnitTest){quantized_names[i], run_case, NULL, NULL, &quantized_cases[i]};
  }
  tests[n++] = (struct CMUnitTest)cmocka_unit_test(test_append_matches_cpu);
  tests[n++] = (struct CMUnitTest)cmocka_unit_test(test_append_long_step);
  tests[n++] = (struct CMUnitTest)cmocka_unit_test(test_append_graph_replay);
  tests[n++] = (struct CMUnitTest)cmocka_unit_test(test_quantized_graph_replay);
  tests[n++] = (struct CMUnitTest)cmocka_unit_test(test_deterministic);
  tests[n++] = (struct CMUnitTest)cmocka_unit_test(test_graph_replay);
  tests[n++] = (struct CMUnitTest)cmocka_unit_test(test_variants_graph_replay);
  tests[n++] = (struct CMUnitTest)cmocka_unit_test(test_capture_without_reserve);
  tests[n++] = (struct CMUnitTest)cmocka_unit_test(test_merge_paths_on_caller_workspace);
  tests[n++] = (struct CMUnitTest)cmocka_unit_test(test_ragged_batches);
  tests[n++] = (struct CMUnitTest)cmocka_unit_test(test_balanced_schedule);
  tests[n++] = (struct CMUnitTest)cmocka_unit_test(test_fitted_splits);
  tests[n++] = (struct CMUnitTest)cmocka_unit_test(test_longest_first);
  tests[n++] = (struct CMUnitTest)cmocka_unit_test(test_two_threads_two_streams);
  tests[n++] = (struct CMUnitTest)cmocka_unit_test(test_large_offsets_dense);
  tests[n++] = (struct CMUnitTest)cmocka_unit_test(test_large_offsets_paged);
  tests[n++] = (struct CMUnitTest)cmocka_unit_test(test_unaligned_cache);
  tests[n++] = (struct CMUnitTest)cmocka_unit_test(test_lengths_clamped);
  tests[n++] = (struct CMUnitTest)cmocka_unit_test(test_contents_checked_on_device);
  tests[n++] = (struct CMUnitTest)cmocka_unit_test(test_allowed_sharing);
  tests[n++] = (struct CMUnitTest)cmocka_unit_test(test_batch_invariant);
  tests[n++] = (struct CMUnitTest)cmocka_unit_test(test_merge_states);
  tests[n++] = (struct CMUnitTest)cmocka_unit_test(test_merge_states_nan_rules);
  tests[n++] = (struct CMUnitTest)cmocka_unit_test(test_merge_states_many_rows);
  tests[n++] = (struct CMUnitTest)cmocka_unit_test(test_workspace_setup_beside_a_capture);
  tests[n++] = (struct CMUnitTest)cmocka_unit_test(test_rows_kernel);
  tests[n++] = (struct CMUnitTest)cmocka_unit_test(test_ragged_query_lengths);
  tests[n++] = (struct CMUnitTest)cmocka_unit_test(test_compact_tiles);
  tests[n++] = (struct CMUnitTest)cmocka_unit_test(test_8bit_kernels);
  tests[n++] = (struct CMUnitTest)cmocka_unit_test(test_8bit_codes_exact);
  tests[n++] = (struct CMUnitTest)cmocka_unit_test(test_window_edges);
  tests[n++] = (struct CMUnitTest)cmocka_unit_test(test_all_sequences_empty);
  tests[n++] = (struct CMUnitTest)cmocka_unit_test(test_paged_all_sequences_empty);
  tests[n++] = (struct CMUnitTest)cmocka_unit_test(test_non_finite_scores);
  tests[n++] = (struct CMUnitTest)cmocka_unit_test(test_batch_beyond_grid_limit);
  tests[n++] = (struct CMUnitTest)cmocka_unit_test(test_mha_128_both_kernels);
  tests[n++] = (struct CMUnitTest)cmocka_unit_test(test_plan_rules);
  tests[n++] = (struct CMUnitTest)cmocka_unit_test(test_callers_context_is_kept);
  tests[n++] = (struct CMUnitTest)cmocka_unit_test(test_bad_input_rejected);
  tests[n++] = (struct CMUnitTest)cmocka_unit_test(test_unsupported_head_dim);
  /* "i/n": every n-th test from the i-th, so that n processes share the
   * suite (tests/tools/gpu-check.sh, FD_GPU_CHECK_SHARDS) and together run
   * every test once, whatever its name. */
  const char *shard = getenv("FD_GPU_TEST_SHARD");
  if (shard != NULL && shard[0] != '\0') {
    int index = -1, shards = 0;
    char rest = 0;
    if (sscanf(shard, "%d/%d%c", &index, &shards, &rest) != 2 || shards < 1 || index < 0 || index >= shards) {
      fprintf(stderr, "FD_GPU_TEST_SHARD must be i/n with 0 <= i < n, got \"%s\"\n", shard);
      return 2;
    }
    int kept = 0;
    for (int i = index; i < n; i += shards) tests[kept++] = tests[i];
    n = kept;
  }
  printf("GPU tests: %d matrix cases%s, seed %llu, %d device(s), %d test(s) here\n", count, g_quick ? " (quick)" : "",
         (unsigned long long)g_seed, devices, n);
  return _cmocka_run_group_tests("cuda_decode", tests, (size_t)n, group_setup, group_teardown);
}
