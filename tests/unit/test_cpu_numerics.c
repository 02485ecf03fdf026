// SPDX-License-Identifier: Apache-2.0
/* CPU backend numerics against a naive float64 reference, over a matrix of
 * batch sizes, KV lengths, ragged lengths (including 0), head dims, GQA
 * ratios and MQA, layouts (BNHD, BHND, strided slices, paged NHD/HND), dtypes
 * and split counts. Fresh random data per case, NaN-poisoned outputs and NaN
 * in every cache slot past a sequence's length. Also the Triton split-K
 * reference kernel's own check and determinism across runs and thread
 * counts. */
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

static fd_handle *make_cpu_handle(int threads) {
  fd_handle *h = fdt_cpu_handle(threads, FD_CHECK_NONE);
  assert_non_null(h);
  return h;
}

static void run_case(void **state) {
  const fdt_case *c = *state;
  char description[256], report[256];
  fdt_case_describe(c, description, sizeof description);
  fdt_problem p;
  assert_int_equal(fdt_problem_make(&p, c), 0);
  fd_handle *h = make_cpu_handle(0);
  const fd_status status = fd_decode(h, &p.args, NULL);
  if (status != FD_SUCCESS) {
    char message[512];
    fd_last_error_message(message, sizeof message);
    fail_msg("%s: fd_decode failed: %s", description, message);
  }
  const int bad = fdt_check(&p, report, sizeof report, NULL, NULL);
  print_message("%s: %s\n", description, report);
  if (bad) fail_msg("%s: %s", description, report);
  assert_int_equal(fd_destroy(h), FD_SUCCESS);
  fdt_problem_free(&p);
}

/* The Triton split-K reference kernel's self-test: batch 2, heads 4,
 * head_dim 64, kv_len 256, 4 splits, fp16, elementwise
 * |out - ref| <= 2e-2 + 2e-2 * |ref|. */
static void test_seed_check(void **state) {
  (void)state;
  fdt_case c = {0};
  c.batch = 2;
  c.q_heads = c.kv_heads = 4;
  c.head_dim = 64;
  c.kv_len = 256;
  c.num_splits = 4;
  c.dtype = c.out_dtype = FD_DTYPE_F16;
  c.seed = 0;
  fdt_problem p;
  assert_int_equal(fdt_problem_make(&p, &c), 0);
  fd_handle *h = make_cpu_handle(0);
  assert_int_equal(fd_decode(h, &p.args, NULL), FD_SUCCESS);
  for (int64_t i = 0; i < c.batch * c.q_heads * c.head_dim; ++i) {
    const double got = fdt_load(FD_DTYPE_F16, p.out, i);
    const double want = p.expect_out[i];
    if (!(fabs(got - want) <= 2e-2 + 2e-2 * fabs(want))) fail_msg("element %lld: %g vs %g", (long long)i, got, want);
  }
  assert_int_equal(fd_destroy(h), FD_SUCCESS);
  fdt_problem_free(&p);
}

/* Same inputs and plan: bitwise-identical output, whatever the thread count. */
static void test_deterministic(void **state) {
  (void)state;
  fdt_case c = {0};
  c.batch = 3;
  c.q_heads = 16;
  c.kv_heads = 2;
  c.head_dim = 128;
  c.kv_len = 3000;
  c.dtype = c.out_dtype = FD_DTYPE_BF16;
  c.ragged = 1;
  c.with_lse = 1;
  c.num_splits = 9;
  c.seed = 99;
  fdt_problem p;
  assert_int_equal(fdt_problem_make(&p, &c), 0);
  unsigned char *first = malloc(p.out_bytes), *first_lse = malloc(p.lse_bytes);
  const int threads[] = {1, 2, 5, 1};
  for (int i = 0; i < 4; ++i) {
    fd_handle *h = make_cpu_handle(threads[i]);
    fdt_poison_outputs(&p);
    assert_int_equal(fd_decode(h, &p.args, NULL), FD_SUCCESS);
    if (i == 0) {
      memcpy(first, p.out, p.out_bytes);
      memcpy(first_lse, p.lse, p.lse_bytes);
    } else {
      assert_memory_equal(p.out, first, p.out_bytes);
      assert_memory_equal(p.lse, first_lse, p.lse_bytes);
    }
    assert_int_equal(fd_destroy(h), FD_SUCCESS);
  }
  free(first);
  free(first_lse);
  fdt_problem_free(&p);
}

/* Batch invariance (split_tokens): each sequence run alone, with a cache
 * of its own length, with or without seq_lens, on another thread count,
 * gives bitwise the output and LSE it gets in the batch. */
static void test_batch_invariant(void **state) {
  (void)state;
  const fdt_layout layouts[] = {FDT_BNHD, FDT_PAGED_NHD, FDT_BHND};
  const fd_dtype dtypes[] = {FD_DTYPE_BF16, FD_DTYPE_F16, FD_DTYPE_F32};
  const int64_t split_tokens[] = {64, 100, 1000};
  for (int i = 0; i < 3; ++i) {
    fdt_case c = {0};
    c.batch = 9;
    c.q_heads = 8;
    c.kv_heads = 2;
    c.head_dim = 64;
    c.kv_len = 700;
    c.page_size = 16;
    c.layout = layouts[i];
    c.dtype = c.out_dtype = dtypes[i];
    c.ragged = 1;
    c.with_lse = 1;
    c.seed = 1234 + (uint64_t)i;
    fdt_problem p;
    assert_int_equal(fdt_problem_make(&p, &c), 0);
    p.args.split_tokens = split_tokens[i];
    fd_handle *batch_handle = make_cpu_handle(1);
    fd_handle *solo_handle = make_cpu_handle(8); /* automatic plans would split solos more */
    assert_int_equal(fd_decode(batch_handle, &p.args, NULL), FD_SUCCESS);
    char report[256];
    if (fdt_check(&p, report, sizeof report, NULL, NULL)) fail_msg("case %d: %s", i, report);
    unsigned char *batch_out = malloc(p.out_bytes), *batch_lse = malloc(p.lse_bytes);
    memcpy(batch_out, p.out, p.out_bytes);
    memcpy(batch_lse, p.lse, p.lse_bytes);
    fdt_poison_outputs(&p);
    for (int64_t b = 0; b < c.batch; ++b) {
      const fd_decode_args solo = fdt_solo_args(&p.args, b, p.lens[b], (int)(b % 2));
      assert_int_equal(fd_decode(solo_handle, &solo, NULL), FD_SUCCESS);
    }
    assert_memory_equal(p.out, batch_out, p.out_bytes);
    assert_memory_equal(p.lse, batch_lse, p.lse_bytes);
    free(batch_out);
    free(batch_lse);
    assert_int_equal(fd_destroy(batch_handle), FD_SUCCESS);
    assert_int_equal(fd_destroy(solo_handle), FD_SUCCESS);
    fdt_problem_free(&p);
  }
}

/* Empty sequences: zeros and LSE -inf, never NaN, at any split count. */
static void test_all_sequences_empty(void **state) {
  (void)state;
  fdt_case c = {0};
  c.batch = 1;
  c.q_heads = 4;
  c.kv_heads = 1;
  c.head_dim = 32;
  c.kv_len = 0;
  c.dtype = c.out_dtype = FD_DTYPE_F32;
  c.with_lse = 1;
  c.num_splits = 3;
  fdt_problem p;
  assert_int_equal(fdt_problem_make(&p, &c), 0);
  fd_handle *h = make_cpu_handle(0);
  assert_int_equal(fd_decode(h, &p.args, NULL), FD_SUCCESS);
  char report[256];
  if (fdt_check(&p, report, sizeof report, NULL, NULL)) fail_msg("%s", report);
  assert_int_equal(fd_destroy(h), FD_SUCCESS);
  fdt_problem_free(&p);
}

/* One handle across changing shapes: the handle reuses its last plan while
 * the shape is unchanged, so switching back and forth must replan each time
 * (and grow the workspace as needed). */
static void test_handle_reused_across_shapes(void **state) {
  (void)state;
  fd_handle *h = make_cpu_handle(2);
  const int64_t kv_lens[] = {300, 5000, 300, 64, 5000};
  const int32_t splits[] = {0, 0, 7, 7, 0};
  for (int i = 0; i < 5; ++i) {
    fdt_case c = {0};
    c.batch = 2; /* only the KV length, split count or layout change between neighbours */
    c.q_heads = 8;
    c.kv_heads = i == 3 ? 8 : 2;
    c.head_dim = 64;
    c.kv_len = kv_lens[i];
    c.dtype = c.out_dtype = FD_DTYPE_F32;
    c.ragged = i == 4;
    c.with_lse = 1;
    c.num_splits = splits[i];
    c.seed = 300 + (uint64_t)i;
    fdt_problem p;
    assert_int_equal(fdt_problem_make(&p, &c), 0);
    assert_int_equal(fd_decode(h, &p.args, NULL), FD_SUCCESS);
    char report[256];
    if (fdt_check(&p, report, sizeof report, NULL, NULL)) fail_msg("shape %d: %s", i, report);
    fdt_problem_free(&p);
  }
  assert_int_equal(fd_destroy(h), FD_SUCCESS);
}

/* ---- the matrix ---------------------------------------------------------------- */
enum { kCases = 120 };

/* Non-finite scores by the header's rules (fdt.h, "non-finite values"),
 * in every dtype, with one split and with enough that whole splits are
 * masked (64: the count that once turned a masked split's sum into NaN). */
static void test_non_finite_scores(void **state) {
  (void)state;
  static const fd_dtype dtypes[] = {FD_DTYPE_F32, FD_DTYPE_F16, FD_DTYPE_BF16};
  static const int32_t splits[] = {1, 8, 64, 0};
  fd_handle *h = make_cpu_handle(2);
  int failures = 0;
  for (int special = 0; special < FDT_SPECIAL_COUNT; ++special) {
    for (size_t di = 0; di < sizeof dtypes / sizeof dtypes[0]; ++di) {
      for (size_t si = 0; si < sizeof splits / sizeof splits[0]; ++si) {
        fdt_case c = {0};
        c.batch = 2;
        c.q_heads = 8;
        c.kv_heads = 2;
        c.head_dim = 64;
        c.kv_len = 700;
        c.dtype = c.out_dtype = dtypes[di];
        c.layout = FDT_BNHD;
        c.with_lse = 1;
        c.num_splits = splits[si];
        c.seed = 9000 + (uint64_t)(special * 16 + (int)di * 4 + (int)si);
        fdt_problem p;
        const int made = fdt_problem_make_special(&p, &c, (fdt_special)special);
        if (made == 1) continue; /* does not apply to this dtype */
        assert_int_equal(made, 0);
        char report[256];
        const fd_status status = fd_decode(h, &p.args, NULL);
        const int bad = status != FD_SUCCESS || fdt_check(&p, report, sizeof report, NULL, NULL) != 0;
        if (bad) {
          ++failures;
          print_message("%s, %s, splits %d: %s\n", fdt_special_name((fdt_special)special), fdt_dtype_name(dtypes[di]),
                        (int)splits[si], status != FD_SUCCESS ? fd_status_string(status) : report);
        }
        fdt_problem_free(&p);
      }
    }
  }
  assert_int_equal(fd_destroy(h), FD_SUCCESS);
  assert_int_equal(failures, 0);
}

static void make_matrix(fdt_case *cases) {
  static const fd_dtype dtypes[] = {FD_DTYPE_F32, FD_DTYPE_F16, FD_DTYPE_BF16};
  static const fdt_layout layouts[] = {FDT_BNHD, FDT_BHND, FDT_BNHD_PADDED, FDT_PAGED_NHD, FDT_PAGED_HND};
  static const int64_t head_dims[] = {64, 128, 256, 16, 40, 8};
  static const int64_t kv_lens[] = {1, 63, 64, 65, 1000, 4097};
  static const int64_t heads[][2] = {{4, 4}, {8, 2}, {16, 2}, {8, 1}, {6, 6}, {32, 4}, {12, 1}};
  static const int32_t splits[] = {0, 1, 2, 3, 7, 16, 64, 200};
  static const int64_t page_sizes[] = {1, 16, 64, 7};
  for (int i = 0; i < kCases; ++i) {
    fdt_case *c = &cases[i];
    memset(c, 0, sizeof *c);
    c->dtype = dtypes[i % 3];
    c->out_dtype = (i % 7 == 3) ? FD_DTYPE_F32 : c->dtype;
    c->layout = layouts[(i / 3) % 5];
    c->head_dim = head_dims[i % 6];
    c->kv_len = kv_lens[(i / 2) % 6];
    c->q_heads = heads[i % 7][0];
    c->kv_heads = heads[i % 7][1];
    c->batch = 1 + (i * 5) % 8;
    c->ragged = (i / 4) % 2;
    c->with_lse = (i % 4) != 1;
    c->num_splits = splits[i % 8];
    c->page_size = page_sizes[(i / 5) % 4];
    c->seed = 1000 + (uint64_t)i;
    /* Keep the float64 reference affordable: shrink the biggest combinations. */
    while (c->batch > 1 && c->batch * c->q_heads * c->kv_len * c->head_dim > (int64_t)40 << 20) c->batch /= 2;
  }
}

int main(void) {
  static fdt_case cases[kCases];
  static char names[kCases][64];
  make_matrix(cases);
  enum { kFixed = 6 }; /* the tests before the matrix */
  struct CMUnitTest tests[kCases + kFixed];
  tests[0] = (struct CMUnitTest)cmocka_unit_test(test_seed_check);
  tests[1] = (struct CMUnitTest)cmocka_unit_test(test_deterministic);
  tests[2] = (struct CMUnitTest)cmocka_unit_test(test_all_sequences_empty);
  tests[3] = (struct CMUnitTest)cmocka_unit_test(test_handle_reused_across_shapes);
  tests[4] = (struct CMUnitTest)cmocka_unit_test(test_non_finite_scores);
  tests[5] = (struct CMUnitTest)cmocka_unit_test(test_batch_invariant);
  for (int i = 0; i < kCases; ++i) {
    snprintf(names[i], sizeof names[i], "matrix_case_%03d", i);
    tests[i + kFixed] = (struct CMUnitTest){names[i], run_case, NULL, NULL, &cases[i]};
  }
  return _cmocka_run_group_tests("cpu_numerics", tests, kCases + kFixed, NULL, NULL);
}
