// SPDX-License-Identifier: Apache-2.0
/* Attention variants on the CPU backend (flashdecode.h, "Attention
 * variants"): several query tokens, the causal and no mask, sliding windows,
 * logit softcaps, ALiBi and attention sinks, each alone and all combined,
 * against the float64 reference of tests/support over GQA ratios (MHA and
 * MQA included), dtypes, dense and paged layouts, ragged lengths (0
 * included), split counts and LSE on and off; query tokens before the start
 * of a short sequence; sinks over an empty sequence; batch invariance with
 * variants; ragged query lengths (q_lens); and every bad variant argument
 * refused with its status, a message naming it and nothing written. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fdt.h"
#include "flashdecode.h"

static const char *last_message(void) {
  static char buffer[512];
  fd_last_error_message(buffer, sizeof buffer);
  return buffer;
}

/* The largest errors fdt_check measured, per output dtype (f32, f16, bf16),
 * reported by the last test. */
static double worst_out[3], worst_lse[3];
static int checked_cases;

static void note_errors(fd_dtype out_dtype, double out_error, double lse_error) {
  if (out_error > worst_out[out_dtype]) worst_out[out_dtype] = out_error;
  if (lse_error > worst_lse[out_dtype]) worst_lse[out_dtype] = lse_error;
  ++checked_cases;
}

/* Decodes p on h and checks it against the reference; returns nonzero (after
 * printing why) on a mismatch. */
static int decode_and_check(fd_handle *h, fdt_problem *p, const char *what) {
  char description[320], report[256];
  fdt_case_describe(&p->c, description, sizeof description);
  const fd_status status = fd_decode(h, &p->args, NULL);
  if (status != FD_SUCCESS) {
    print_message("%s: %s: fd_decode failed: %s\n", what, description, last_message());
    return 1;
  }
  double out_error = 0.0, lse_error = 0.0;
  const int bad = fdt_check(p, report, sizeof report, &out_error, &lse_error);
  note_errors(p->c.out_dtype, out_error, lse_error);
  if (bad) print_message("%s: %s: %s\n", what, description, report);
  return bad;
}

/* Makes c's problem, decodes it on h and checks it; returns nonzero on a mismatch. */
static int check_case(fd_handle *h, const fdt_case *c, const char *what) {
  fdt_problem p;
  assert_int_equal(fdt_problem_make(&p, c), 0);
  const int bad = decode_and_check(h, &p, what);
  fdt_problem_free(&p);
  return bad;
}

/* ---- each variant alone, in every dtype and two layouts -------------------- */
static void test_each_variant_alone(void **state) {
  (void)state;
  enum { N = 257 };
  typedef struct variant {
    const char *name;
    int64_t q_len, window;
    fd_attention_mask mask;
    double softcap;
    int alibi, sinks;
  } variant;
  static const variant variants[] = {
      {"plain", 1, 0, FD_MASK_CAUSAL, 0, 0, 0},
      {"q_len 2", 2, 0, FD_MASK_CAUSAL, 0, 0, 0},
      {"q_len 16", 16, 0, FD_MASK_CAUSAL, 0, 0, 0},
      {"q_len FD_MAX_Q_LEN", FD_MAX_Q_LEN, 0, FD_MASK_CAUSAL, 0, 0, 0},
      {"mask none, q_len 1", 1, 0, FD_MASK_NONE, 0, 0, 0},
      {"mask none, q_len 5", 5, 0, FD_MASK_NONE, 0, 0, 0},
      {"window larger than the sequence", 1, N + 40, FD_MASK_CAUSAL, 0, 0, 0},
      {"window equal to the sequence", 1, N, FD_MASK_CAUSAL, 0, 0, 0},
      {"window smaller than the sequence", 1, N / 4, FD_MASK_CAUSAL, 0, 0, 0},
      {"window 1", 1, 1, FD_MASK_CAUSAL, 0, 0, 0},
      {"softcap 0.5", 1, 0, FD_MASK_CAUSAL, 0.5, 0, 0},
      {"softcap 5", 1, 0, FD_MASK_CAUSAL, 5.0, 0, 0},
      {"softcap 50", 1, 0, FD_MASK_CAUSAL, 50.0, 0, 0},
      {"alibi, standard slopes", 1, 0, FD_MASK_CAUSAL, 0, 1, 0},
      {"alibi, random slopes", 1, 0, FD_MASK_CAUSAL, 0, 2, 0},
      {"sinks", 1, 0, FD_MASK_CAUSAL, 0, 0, 1},
  };
  static const fd_dtype dtypes[] = {FD_DTYPE_F32, FD_DTYPE_F16, FD_DTYPE_BF16};
  static const fdt_layout layouts[] = {FDT_BNHD, FDT_PAGED_HND};
  fd_handle *h = fdt_cpu_handle(2, FD_CHECK_NONE);
  assert_non_null(h);
  int failures = 0;
  for (size_t v = 0; v < sizeof variants / sizeof variants[0]; ++v) {
    for (int d = 0; d < 3; ++d) {
      for (int l = 0; l < 2; ++l) {
        fdt_case c = {0};
        c.batch = 4;
        c.q_heads = 8;
        c.kv_heads = 2;
        c.head_dim = 64;
        c.kv_len = N;
        c.page_size = 7;
        c.layout = layouts[l];
        c.dtype = c.out_dtype = dtypes[d];
        c.ragged = 1;
        c.with_lse = 1;
        c.num_splits = l == 0 ? 0 : 3;
        c.seed = 100 + v * 8 + (uint64_t)(d * 2 + l);
        c.q_len = variants[v].q_len;
        c.mask = variants[v].mask;
        c.window = variants[v].window;
        c.softcap = variants[v].softcap;
        c.alibi = variants[v].alibi;
        c.sinks = variants[v].sinks;
        failures += check_case(h, &c, variants[v].name);
      }
    }
  }
  assert_int_equal(fd_destroy(h), FD_SUCCESS);
  assert_int_equal(failures, 0);
}

/* ---- everything combined ----------------------------------------------------- */
enum { kMatrixCases = 240 };

/* Case i of the matrix: every dimension drawn independently from a
 * generator seeded by i, so that the variants meet each other and every
 * layout, dtype, GQA ratio and split count. */
static fdt_case matrix_case(int i) {
  static const fd_dtype dtypes[] = {FD_DTYPE_F32, FD_DTYPE_F16, FD_DTYPE_BF16};
  static const fdt_layout layouts[] = {FDT_BNHD, FDT_BHND, FDT_BNHD_PADDED, FDT_PAGED_NHD, FDT_PAGED_HND};
  static const int64_t q_lens[] = {1, 1, 2, 3, 4, 7, 16, FD_MAX_Q_LEN};
  static const int64_t heads[][2] = {{4, 4}, {8, 2}, {8, 1}, {6, 3}, {12, 1}, {16, 4}, {2, 2}};
  static const int64_t head_dims[] = {8, 16, 40, 64, 128, 256};
  static const int64_t kv_lens[] = {1, 5, 33, 64, 100, 300, 1000};
  static const int64_t page_sizes[] = {1, 3, 5, 7, 16};
  static const int32_t splits[] = {0, 0, 1, 2, 3, 7, 16, 64};
  static const double softcaps[] = {0.0, 0.0, 1.0, 4.0, 30.0};
  fdt_rng rng = {0x5eed0000ull + (uint64_t)i};
  fdt_case c = {0};
  c.dtype = dtypes[fdt_int(&rng, 0, 2)];
  c.out_dtype = fdt_int(&rng, 0, 3) == 0 ? FD_DTYPE_F32 : c.dtype;
  c.layout = layouts[fdt_int(&rng, 0, 4)];
  c.q_len = q_lens[fdt_int(&rng, 0, 7)];
  c.mask = fdt_int(&rng, 0, 2) == 0 ? FD_MASK_NONE : FD_MASK_CAUSAL;
  const int64_t *hk = heads[fdt_int(&rng, 0, 6)];
  c.q_heads = hk[0];
  c.kv_heads = hk[1];
  c.head_dim = head_dims[fdt_int(&rng, 0, 5)];
  c.kv_len = kv_lens[fdt_int(&rng, 0, 6)];
  c.page_size = page_sizes[fdt_int(&rng, 0, 4)];
  c.batch = fdt_int(&rng, 1, 6);
  c.ragged = (int)fdt_int(&rng, 0, 1);
  c.with_lse = fdt_int(&rng, 0, 3) != 0;
  c.num_splits = splits[fdt_int(&rng, 0, 7)];
  c.softmax_scale = fdt_int(&rng, 0, 4) == 0 ? 0.3 : 0.0;
  /* Windows of 1, a few keys, about a third, exactly, and beyond the cache. */
  switch (fdt_int(&rng, 0, 6)) {
    case 0: c.window = 1; break;
    case 1: c.window = 7; break;
    case 2: c.window = c.kv_len / 3 + 1; break;
    case 3: c.window = c.kv_len; break;
    case 4: c.window = c.kv_len + 50; break;
    default: c.window = 0; break;
  }
  c.softcap = softcaps[fdt_int(&rng, 0, 4)];
  c.alibi = (int)fdt_int(&rng, 0, 3) % 3; /* none twice as often */
  c.sinks = (int)fdt_int(&rng, 0, 1);
  c.seed = 5000 + (uint64_t)i;
  c.ragged_q = fdt_int(&rng, 0, 3) == 0; /* drawn last: the other draws stay as they were */
  /* Keep the float64 reference affordable. */
  while (c.batch * c.q_len * c.q_heads * c.kv_len * c.head_dim > (int64_t)6 << 20) {
    if (c.batch > 1) c.batch = (c.batch + 1) / 2;
    else if (c.kv_len > 100) c.kv_len /= 2;
    else c.head_dim /= 2;
  }
  return c;
}

static void run_matrix_case(void **state) {
  const fdt_case *c = *state;
  fd_handle *h = fdt_cpu_handle(2, FD_CHECK_NONE);
  assert_non_null(h);
  const int bad = check_case(h, c, "matrix");
  assert_int_equal(fd_destroy(h), FD_SUCCESS);
  if (bad) fail_msg("mismatch (above)");
}

/* ---- query tokens that see nothing ------------------------------------------- */
/* More query tokens than keys: under the causal mask the first q_len - len
 * tokens sit before the sequence and see nothing (zeros, LSE -inf, or the
 * sink with sinks); without a mask every token sees every key. The ragged
 * lengths are 0, 100, 1, 63, 64, 65 and random, against q_len 64. */
static void test_q_len_beyond_length(void **state) {
  (void)state;
  fd_handle *h = fdt_cpu_handle(2, FD_CHECK_NONE);
  assert_non_null(h);
  for (int variant = 0; variant < 4; ++variant) {
    fdt_case c = {0};
    c.batch = 8;
    c.q_heads = 4;
    c.kv_heads = 2;
    c.head_dim = 32;
    c.kv_len = 100;
    c.dtype = c.out_dtype = variant == 2 ? FD_DTYPE_BF16 : FD_DTYPE_F32;
    c.ragged = 1;
    c.with_lse = 1;
    c.q_len = FD_MAX_Q_LEN;
    c.mask = variant == 1 ? FD_MASK_NONE : FD_MASK_CAUSAL;
    c.sinks = variant >= 2;
    c.window = variant == 3 ? 10 : 0;
    c.num_splits = variant == 3 ? 0 : 4;
    c.seed = 700 + (uint64_t)variant;
    fdt_problem p;
    assert_int_equal(fdt_problem_make(&p, &c), 0);
    assert_int_equal(p.lens[2], 1); /* fdt's edge lengths */
    if (decode_and_check(h, &p, "q_len beyond the length")) fail_msg("variant %d: mismatch (above)", variant);
    /* Sequence 2 has one key: under the causal mask only its last token sees it. */
    const float *lse = p.lse;
    for (int64_t t = 0; t < c.q_len; ++t) {
      for (int64_t hq = 0; hq < c.q_heads; ++hq) {
        const float got = lse[(2 * c.q_len + t) * c.q_heads + hq];
        const int sees = c.mask == FD_MASK_NONE || t == c.q_len - 1;
        const float nothing = c.sinks ? p.sinks[hq] : -INFINITY;
        if (sees ? got == nothing : got != nothing)
          fail_msg("variant %d: token %lld head %lld of a one-key sequence: LSE %g", variant, (long long)t,
                   (long long)hq, (double)got);
      }
    }
    fdt_problem_free(&p);
  }
  assert_int_equal(fd_destroy(h), FD_SUCCESS);
}

/* Sinks over empty sequences: output zeros and LSE exactly the sink, at any
 * split count. */
static void test_sinks_empty_sequence(void **state) {
  (void)state;
  fd_handle *h = fdt_cpu_handle(2, FD_CHECK_NONE);
  assert_non_null(h);
  for (int splits = 0; splits < 4; ++splits) {
    fdt_case c = {0};
    c.batch = 2;
    c.q_heads = 6;
    c.kv_heads = 3;
    c.head_dim = 16;
    c.kv_len = splits == 3 ? 50 : 0; /* the last: a ragged batch whose first sequence is empty */
    c.ragged = splits == 3;
    c.dtype = c.out_dtype = FD_DTYPE_F16;
    c.with_lse = 1;
    c.q_len = 3;
    c.num_splits = splits;
    c.sinks = 1;
    c.seed = 800 + (uint64_t)splits;
    fdt_problem p;
    assert_int_equal(fdt_problem_make(&p, &c), 0);
    assert_int_equal(p.lens[0], 0);
    if (decode_and_check(h, &p, "sinks, empty sequence")) fail_msg("splits %d: mismatch (above)", splits);
    for (int64_t t = 0; t < c.q_len; ++t) {
      for (int64_t hq = 0; hq < c.q_heads; ++hq) {
        const int64_t row = t * c.q_heads + hq;
        assert_true(((const float *)p.lse)[row] == p.sinks[hq]);
        for (int64_t d = 0; d < c.head_dim; ++d) assert_true(fdt_load(FD_DTYPE_F16, p.out, row * c.head_dim + d) == 0);
      }
    }
    fdt_problem_free(&p);
  }
  assert_int_equal(fd_destroy(h), FD_SUCCESS);
}

/* ---- ragged query lengths --------------------------------------------------------- */
/* q_lens: each sequence its own query tokens (0, all, 1, then random), q's
 * padding tokens NaN (never read), against the reference at positions
 * L - q_lens[b] + i, with every mask, windows, sinks, ALiBi and softcaps,
 * dense and paged, ragged lengths and several split counts; padding rows
 * come out zero with LSE -inf (or the sink). */
static void test_ragged_query_lengths(void **state) {
  (void)state;
  static const int64_t q_lens[] = {1, 3, 8, 16, FD_MAX_Q_LEN};
  static const fdt_layout layouts[] = {FDT_BNHD, FDT_PAGED_NHD, FDT_BHND};
  static const fd_dtype dtypes[] = {FD_DTYPE_F32, FD_DTYPE_F16, FD_DTYPE_BF16};
  fd_handle *h = fdt_cpu_handle(3, FD_CHECK_NONE);
  assert_non_null(h);
  int failures = 0;
  for (int i = 0; i < 5 * 3 * 4; ++i) {
    fdt_case c = {0};
    c.batch = 9;
    c.q_heads = 8;
    c.kv_heads = i % 2 ? 2 : 8;
    c.head_dim = 32;
    c.kv_len = 150;
    c.page_size = 16;
    c.q_len = q_lens[i % 5];
    c.layout = layouts[(i / 5) % 3];
    c.dtype = c.out_dtype = dtypes[i % 3];
    c.ragged = i % 4 != 3;
    c.ragged_q = 1;
    c.with_lse = 1;
    c.num_splits = (int32_t)(i % 4);
    c.mask = i % 7 == 3 ? FD_MASK_NONE : FD_MASK_CAUSAL;
    c.window = i % 5 == 2 ? 9 : 0;
    c.sinks = i % 3 == 1;
    c.alibi = i % 11 == 4 ? 2 : 0;
    c.softcap = i % 13 == 6 ? 5.0 : 0.0;
    c.seed = 900 + (uint64_t)i;
    fdt_problem p;
    assert_int_equal(fdt_problem_make(&p, &c), 0);
    assert_int_equal(p.q_counts[0], 0); /* fdt's edge counts */
    assert_int_equal(p.q_counts[1], c.q_len);
    failures += decode_and_check(h, &p, "ragged q_lens");
    fdt_problem_free(&p);
  }
  assert_int_equal(fd_destroy(h), FD_SUCCESS);
  assert_int_equal(failures, 0);
}

/* Entries outside [0, q_len] are clamped (without FD_CHECK_CONTENTS): -3
 * is 0 tokens, q_len + 5 is q_len; with it, the first bad entry is an
 * error naming it, before anything is written. */
static void test_ragged_query_lengths_clamped_or_checked(void **state) {
  (void)state;
  fdt_case c = {0};
  c.batch = 4;
  c.q_heads = 4;
  c.kv_heads = 2;
  c.head_dim = 16;
  c.kv_len = 40;
  c.q_len = 5;
  c.ragged_q = 1;
  c.with_lse = 1;
  c.sinks = 1;
  c.dtype = c.out_dtype = FD_DTYPE_F32;
  c.seed = 990;
  fdt_problem p;
  assert_int_equal(fdt_problem_make(&p, &c), 0);
  p.q_lens[0] = -3;                   /* its count is 0 */
  p.q_lens[1] = (int32_t)c.q_len + 5; /* its count is q_len */
  fd_handle *h = fdt_cpu_handle(2, FD_CHECK_NONE);
  assert_non_null(h);
  if (decode_and_check(h, &p, "clamped q_lens")) fail_msg("mismatch (above)");
  assert_int_equal(fd_destroy(h), FD_SUCCESS);

  fdt_poison_outputs(&p);
  h = fdt_cpu_handle(2, FD_CHECK_CONTENTS);
  assert_non_null(h);
  assert_int_equal(fd_decode(h, &p.args, NULL), FD_ERROR_INVALID_LENGTH);
  assert_non_null(strstr(last_message(), "q_lens[0] must be in [0, 5] (q's q_len), got -3"));
  p.q_lens[0] = 0;
  assert_int_equal(fd_decode(h, &p.args, NULL), FD_ERROR_INVALID_LENGTH);
  assert_non_null(strstr(last_message(), "q_lens[1] must be in [0, 5] (q's q_len), got 10"));
  char report[256];
  assert_int_not_equal(fdt_check(&p, report, sizeof report, NULL, NULL), 0); /* nothing written */
  const unsigned char *out = p.out;
  for (size_t i = 0; i < p.out_bytes; ++i) assert_int_equal(out[i], 0xff);
  p.q_lens[1] = (int32_t)c.q_len;
  assert_int_equal(fd_decode(h, &p.args, NULL), FD_SUCCESS);
  if (fdt_check(&p, report, sizeof report, NULL, NULL)) fail_msg("checked: %s", report);
  assert_int_equal(fd_destroy(h), FD_SUCCESS);
  fdt_problem_free(&p);
}

/* ---- batch invariance ------------------------------------------------------------ */
/* With split_tokens set and variants on, each sequence run alone (its cache
 * cut to its length, with or without seq_lens) on 4 threads gives bitwise
 * its row of the batch run on 1 thread, as does the batch on 4 threads. */
static void test_batch_invariant_variants(void **state) {
  (void)state;
  typedef struct setting {
    fdt_layout layout;
    fd_dtype dtype;
    int64_t split_tokens, q_len, window;
    fd_attention_mask mask;
    double softcap;
    int alibi, sinks;
  } setting;
  static const setting settings[] = {
      {FDT_BNHD, FD_DTYPE_BF16, 64, 4, 100, FD_MASK_CAUSAL, 0.0, 2, 1},
      {FDT_PAGED_NHD, FD_DTYPE_F16, 100, 7, 0, FD_MASK_NONE, 20.0, 1, 0},
      {FDT_BHND, FD_DTYPE_F32, 1000, 16, 1, FD_MASK_CAUSAL, 0.0, 0, 1},
      {FDT_PAGED_HND, FD_DTYPE_BF16, 32, FD_MAX_Q_LEN, 300, FD_MASK_CAUSAL, 8.0, 2, 1},
      {FDT_BNHD_PADDED, FD_DTYPE_F16, 50, 3, 45, FD_MASK_NONE, 3.0, 0, 1},
  };
  for (size_t i = 0; i < sizeof settings / sizeof settings[0]; ++i) {
    const setting *s = &settings[i];
    fdt_case c = {0};
    c.batch = 9;
    c.q_heads = 8;
    c.kv_heads = 2;
    c.head_dim = 64;
    c.kv_len = 700;
    c.page_size = s->layout == FDT_PAGED_HND ? 5 : 16;
    c.layout = s->layout;
    c.dtype = c.out_dtype = s->dtype;
    c.ragged = 1;
    c.with_lse = 1;
    c.q_len = s->q_len;
    c.window = s->window;
    c.mask = s->mask;
    c.softcap = s->softcap;
    c.alibi = s->alibi;
    c.sinks = s->sinks;
    c.seed = 900 + (uint64_t)i;
    fdt_problem p;
    assert_int_equal(fdt_problem_make(&p, &c), 0);
    p.args.split_tokens = s->split_tokens;
    fd_handle *one = fdt_cpu_handle(1, FD_CHECK_NONE), *four = fdt_cpu_handle(4, FD_CHECK_NONE);
    assert_non_null(one);
    assert_non_null(four);
    if (decode_and_check(one, &p, "batch invariance")) fail_msg("setting %d: mismatch (above)", (int)i);
    unsigned char *batch_out = malloc(p.out_bytes), *batch_lse = malloc(p.lse_bytes);
    memcpy(batch_out, p.out, p.out_bytes);
    memcpy(batch_lse, p.lse, p.lse_bytes);
    fdt_poison_outputs(&p);
    assert_int_equal(fd_decode(four, &p.args, NULL), FD_SUCCESS);
    assert_memory_equal(p.out, batch_out, p.out_bytes);
    assert_memory_equal(p.lse, batch_lse, p.lse_bytes);
    fdt_poison_outputs(&p);
    for (int64_t b = 0; b < c.batch; ++b) {
      const fd_decode_args solo = fdt_solo_args(&p.args, b, p.lens[b], (int)(b % 2));
      assert_int_equal(fd_decode(four, &solo, NULL), FD_SUCCESS);
    }
    assert_memory_equal(p.out, batch_out, p.out_bytes);
    assert_memory_equal(p.lse, batch_lse, p.lse_bytes);
    free(batch_out);
    free(batch_lse);
    assert_int_equal(fd_destroy(one), FD_SUCCESS);
    assert_int_equal(fd_destroy(four), FD_SUCCESS);
    fdt_problem_free(&p);
  }
}

/* ---- bad variant arguments ------------------------------------------------------- */
typedef struct fixture {
  fd_handle *handle;
  fdt_problem problem;
  unsigned char *pristine_out, *pristine_lse; /* the poisoned outputs, to prove nothing was written */
} fixture;

static int setup(void **state) {
  fixture *f = calloc(1, sizeof *f);
  if (f == NULL) return -1;
  f->handle = fdt_cpu_handle(2, FD_CHECK_NONE);
  if (f->handle == NULL) return -1;
  fdt_case c = {0};
  c.batch = 2;
  c.q_heads = 8;
  c.kv_heads = 2;
  c.head_dim = 32;
  c.kv_len = 80;
  c.dtype = c.out_dtype = FD_DTYPE_F16;
  c.ragged = 1;
  c.with_lse = 1;
  c.q_len = 4;
  c.window = 20;
  c.softcap = 10.0;
  c.alibi = 2;
  c.sinks = 1;
  c.ragged_q = 1;
  c.seed = 11;
  if (fdt_problem_make(&f->problem, &c) != 0) return -1;
  f->pristine_out = malloc(f->problem.out_bytes);
  f->pristine_lse = malloc(f->problem.lse_bytes);
  if (f->pristine_out == NULL || f->pristine_lse == NULL) return -1;
  memcpy(f->pristine_out, f->problem.out, f->problem.out_bytes);
  memcpy(f->pristine_lse, f->problem.lse, f->problem.lse_bytes);
  *state = f;
  return 0;
}

static int teardown(void **state) {
  fixture *f = *state;
  assert_int_equal(fd_destroy(f->handle), FD_SUCCESS);
  fdt_problem_free(&f->problem);
  free(f->pristine_out);
  free(f->pristine_lse);
  free(f);
  return 0;
}

/* fd_decode, fd_workspace_size and fd_describe_plan all refuse args with
 * `status` and a message containing `needle` (the argument's name), and the
 * decode writes no output byte. */
static void expect_rejected(fixture *f, const fd_decode_args *args, fd_status status, const char *needle) {
  const fd_status got = fd_decode(f->handle, args, NULL);
  if (got != status || strstr(last_message(), needle) == NULL) {
    fail_msg("expected %s with \"%s\", got %s: %s", fd_status_string(status), needle, fd_status_string(got),
             last_message());
  }
  assert_memory_equal(f->problem.out, f->pristine_out, f->problem.out_bytes);
  assert_memory_equal(f->problem.lse, f->pristine_lse, f->problem.lse_bytes);
  size_t bytes = 0;
  assert_int_equal(fd_workspace_size(f->handle, args, &bytes), status);
  assert_non_null(strstr(last_message(), needle));
  fd_plan_info info;
  fd_plan_info_init(&info, sizeof info);
  assert_int_equal(fd_describe_plan(f->handle, args, &info), status);
}

/* The fixture's args decode: the bad ones below differ in one field. */
static void test_fixture_is_valid(void **state) {
  fixture *f = *state;
  assert_int_equal(fd_decode(f->handle, &f->problem.args, NULL), FD_SUCCESS);
  char report[256];
  if (fdt_check(&f->problem, report, sizeof report, NULL, NULL)) fail_msg("%s", report);
  fdt_poison_outputs(&f->problem);
}

static void test_rejects_bad_q_len(void **state) {
  fixture *f = *state;
  fd_decode_args a = f->problem.args;
  a.q.shape[1] = a.out.shape[1] = a.lse.shape[1] = 0;
  expect_rejected(f, &a, FD_ERROR_INVALID_SHAPE, "q: q_len must be in [1, 64], got 0");
  a = f->problem.args;
  /* Room for FD_MAX_Q_LEN + 1 tokens is not needed: nothing is read. */
  a.q.shape[1] = a.out.shape[1] = a.lse.shape[1] = FD_MAX_Q_LEN + 1;
  expect_rejected(f, &a, FD_ERROR_INVALID_SHAPE, "q: q_len must be in [1, 64], got 65");
}

static void test_rejects_bad_window(void **state) {
  fixture *f = *state;
  fd_decode_args a = f->problem.args;
  a.window_left = -1;
  expect_rejected(f, &a, FD_ERROR_INVALID_ARGUMENT, "window_left");
  a.window_left = INT64_MIN;
  expect_rejected(f, &a, FD_ERROR_INVALID_ARGUMENT, "window_left");
}

static void test_rejects_bad_softcap(void **state) {
  fixture *f = *state;
  const float bad[] = {-1.0f, -0.0f - 1e-30f, NAN, INFINITY, -INFINITY};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; ++i) {
    fd_decode_args a = f->problem.args;
    a.logit_softcap = bad[i];
    expect_rejected(f, &a, FD_ERROR_INVALID_ARGUMENT, "logit_softcap");
  }
}

static void test_rejects_bad_mask(void **state) {
  fixture *f = *state;
  const int bad[] = {7, 2, -1, INT32_MIN};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; ++i) {
    fd_decode_args a = f->problem.args;
    memcpy(&a.mask, &bad[i], sizeof bad[i]); /* an enum may hold any int the caller stores */
    expect_rejected(f, &a, FD_ERROR_INVALID_ARGUMENT, "mask");
  }
}

/* alibi_slopes and sinks, each: a wrong extent or rank, a wrong dtype, and
 * memory that an output overlaps. */
static void check_per_head_tensor(fixture *f, fd_tensor *(*pick)(fd_decode_args *), const char *name) {
  char needle[64];
  fd_decode_args a = f->problem.args;
  pick(&a)->shape[0] = f->problem.c.q_heads + 1;
  snprintf(needle, sizeof needle, "%s: q_heads must be 8", name);
  expect_rejected(f, &a, FD_ERROR_INVALID_SHAPE, needle);

  a = f->problem.args;
  pick(&a)->shape[0] = f->problem.c.q_heads / 2;
  expect_rejected(f, &a, FD_ERROR_INVALID_SHAPE, needle);

  a = f->problem.args;
  fd_tensor *t = pick(&a);
  t->ndim = 2;
  t->shape[1] = 1;
  t->strides[1] = 1;
  snprintf(needle, sizeof needle, "%s: ndim must be 1", name);
  expect_rejected(f, &a, FD_ERROR_INVALID_SHAPE, needle);

  const fd_dtype dtypes[] = {FD_DTYPE_F16, FD_DTYPE_BF16, FD_DTYPE_I32};
  for (int i = 0; i < 3; ++i) {
    a = f->problem.args;
    pick(&a)->dtype = dtypes[i];
    snprintf(needle, sizeof needle, "%s: dtype must be f32", name);
    expect_rejected(f, &a, FD_ERROR_INVALID_DTYPE, needle);
  }

  /* In out's memory, then in lse's: the message names the input. */
  snprintf(needle, sizeof needle, "overlap those of input %s", name);
  a = f->problem.args;
  pick(&a)->data = f->problem.out;
  pick(&a)->strides[0] = 1;
  expect_rejected(f, &a, FD_ERROR_INVALID_ARGUMENT, needle);
  a = f->problem.args;
  pick(&a)->data = (char *)f->problem.lse + 4 * sizeof(float);
  pick(&a)->strides[0] = 1;
  expect_rejected(f, &a, FD_ERROR_INVALID_ARGUMENT, needle);
}

static fd_tensor *pick_alibi(fd_decode_args *a) { return &a->alibi_slopes; }
static fd_tensor *pick_sinks(fd_decode_args *a) { return &a->sinks; }

/* q_lens: a wrong extent or rank, a wrong dtype, and memory an output overlaps. */
static void test_rejects_bad_q_lens(void **state) {
  fixture *f = *state;
  fd_decode_args a = f->problem.args;
  a.q_lens.shape[0] = f->problem.c.batch + 1;
  expect_rejected(f, &a, FD_ERROR_INVALID_SHAPE, "q_lens: batch must be 2 (from q), got 3");
  a = f->problem.args;
  a.q_lens.ndim = 2;
  a.q_lens.shape[1] = 1;
  a.q_lens.strides[1] = 1;
  expect_rejected(f, &a, FD_ERROR_INVALID_SHAPE, "q_lens: ndim must be 1");
  const fd_dtype dtypes[] = {FD_DTYPE_F32, FD_DTYPE_F16, FD_DTYPE_I8};
  for (int i = 0; i < 3; ++i) {
    a = f->problem.args;
    a.q_lens.dtype = dtypes[i];
    expect_rejected(f, &a, FD_ERROR_INVALID_DTYPE, "q_lens: dtype must be i32");
  }
  a = f->problem.args;
  a.q_lens.data = f->problem.lse;
  expect_rejected(f, &a, FD_ERROR_INVALID_ARGUMENT, "overlap those of input q_lens");
}

static void test_rejects_bad_alibi_slopes(void **state) { check_per_head_tensor(*state, pick_alibi, "alibi_slopes"); }
static void test_rejects_bad_sinks(void **state) { check_per_head_tensor(*state, pick_sinks, "sinks"); }

/* ---- the errors measured --------------------------------------------------------- */
static void test_report_worst_errors(void **state) {
  (void)state;
  static const char *const names[3] = {"f32", "f16", "bf16"};
  print_message("worst errors over %d checked decodes (relative out error; absolute LSE error):\n", checked_cases);
  for (int d = 0; d < 3; ++d) {
    print_message("  out %-4s: %.3g (bound %.1g), lse %.3g\n", names[d], worst_out[d], fdt_error_bound((fd_dtype)d),
                  worst_lse[d]);
  }
}

int main(void) {
  static fdt_case cases[kMatrixCases];
  static char names[kMatrixCases][32];
  const struct CMUnitTest fixed[] = {
      cmocka_unit_test(test_each_variant_alone),
      cmocka_unit_test(test_q_len_beyond_length),
      cmocka_unit_test(test_sinks_empty_sequence),
      cmocka_unit_test(test_ragged_query_lengths),
      cmocka_unit_test(test_ragged_query_lengths_clamped_or_checked),
      cmocka_unit_test(test_batch_invariant_variants),
      cmocka_unit_test_setup_teardown(test_fixture_is_valid, setup, teardown),
      cmocka_unit_test_setup_teardown(test_rejects_bad_q_len, setup, teardown),
      cmocka_unit_test_setup_teardown(test_rejects_bad_window, setup, teardown),
      cmocka_unit_test_setup_teardown(test_rejects_bad_softcap, setup, teardown),
      cmocka_unit_test_setup_teardown(test_rejects_bad_mask, setup, teardown),
      cmocka_unit_test_setup_teardown(test_rejects_bad_alibi_slopes, setup, teardown),
      cmocka_unit_test_setup_teardown(test_rejects_bad_sinks, setup, teardown),
      cmocka_unit_test_setup_teardown(test_rejects_bad_q_lens, setup, teardown),
  };
  enum { kFixed = sizeof fixed / sizeof fixed[0] };
  static struct CMUnitTest tests[kFixed + kMatrixCases + 1];
  memcpy(tests, fixed, sizeof fixed);
  for (int i = 0; i < kMatrixCases; ++i) {
    cases[i] = matrix_case(i);
    snprintf(names[i], sizeof names[i], "matrix_case_%03d", i);
    tests[kFixed + i] = (struct CMUnitTest){names[i], run_matrix_case, NULL, NULL, &cases[i]};
  }
  tests[kFixed + kMatrixCases] = (struct CMUnitTest)cmocka_unit_test(test_report_worst_errors);
  return _cmocka_run_group_tests("variants", tests, kFixed + kMatrixCases + 1, NULL, NULL);
}
