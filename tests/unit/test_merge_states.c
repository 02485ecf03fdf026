// SPDX-License-Identifier: Apache-2.0
/* fd_merge_states on the CPU backend: a cache decoded in parts (each with its
 * LSE) and merged gives the attention over the whole cache, checked against
 * the float64 reference: 1 to FD_MAX_MERGE_STATES parts, states of mixed
 * dtypes, empty parts (LSE -inf) whose output rows hold NaN, rows with a NaN
 * or +inf LSE; in-place merges and every bad argument. */
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

static fd_handle *cpu_handle(void) {
  fd_handle *h = fdt_cpu_handle(3, FD_CHECK_NONE);
  assert_non_null(h);
  return h;
}

static const char *last_message(void) {
  static _Thread_local char buffer[512];
  fd_last_error_message(buffer, sizeof buffer);
  return buffer;
}

enum { kMaxParts = FD_MAX_MERGE_STATES };

/* The problem's cache cut into `parts` pieces (the last ones may be empty),
 * each decoded into states of state_dtype (with `mixed`, every odd state in
 * f32 instead: the states may differ in dtype), merged into p's own out and
 * lse. The output rows of empty states (LSE -inf: no key of that part) are
 * then overwritten with NaN, which the merge must not read. */
typedef struct parts {
  int count;
  int64_t empty_rows; /* (state, row) pairs with LSE -inf, NaN in their output */
  void *out[kMaxParts];
  float *lse[kMaxParts];
  int32_t *lens[kMaxParts];
  fd_tensor states_out[kMaxParts], states_lse[kMaxParts];
} parts;

static void decode_parts(fd_handle *h, fdt_problem *p, int count, fd_dtype state_dtype, int mixed, parts *ps) {
  const int64_t B = p->c.batch, H = p->c.q_heads, D = p->c.head_dim, N = p->c.kv_len;
  const int64_t chunk = (N + count - 1) / count;
  assert_true(count >= 1 && count <= kMaxParts);
  ps->count = count;
  ps->empty_rows = 0;
  for (int s = 0; s < count; ++s) {
    const fd_dtype dtype = mixed && s % 2 ? FD_DTYPE_F32 : state_dtype;
    const int64_t start = s * chunk < N ? s * chunk : N;
    const int64_t n = start + chunk <= N ? chunk : N - start;
    ps->out[s] = malloc((size_t)(B * H * D) * fdt_dtype_size(dtype));
    ps->lse[s] = malloc((size_t)(B * H) * sizeof(float));
    ps->lens[s] = malloc((size_t)B * sizeof(int32_t));
    assert_true(ps->out[s] && ps->lse[s] && ps->lens[s]);
    fdt_part_lengths(p->lens, B, start, n, ps->lens[s]);
    const fd_decode_args a = fdt_part_args(&p->args, start, n, ps->lens[s], ps->out[s], dtype, ps->lse[s]);
    if (fd_decode(h, &a, NULL) != FD_SUCCESS) fail_msg("decoding part %d: %s", s, last_message());
    ps->states_out[s] = a.out;
    ps->states_lse[s] = a.lse;
    for (int64_t row = 0; row < B * H; ++row) {
      if (!(isinf(ps->lse[s][row]) && ps->lse[s][row] < 0)) continue;
      for (int64_t d = 0; d < D; ++d) fdt_store(dtype, ps->out[s], row * D + d, NAN);
      ++ps->empty_rows;
    }
  }
}

static void free_parts(parts *ps) {
  for (int s = 0; s < ps->count; ++s) {
    free(ps->out[s]);
    free(ps->lse[s]);
    free(ps->lens[s]);
  }
}

static fd_merge_args merge_args(const fdt_problem *p, const parts *ps) {
  fd_merge_args m;
  fd_merge_args_init(&m, sizeof m);
  m.num_states = ps->count;
  m.states_out = ps->states_out;
  m.states_lse = ps->states_lse;
  m.out = p->args.out;
  m.lse = p->args.lse;
  return m;
}

/* Parts decoded and merged equal the whole, within the output's bound: from
 * one state (the merge is then the state itself) to FD_MAX_MERGE_STATES,
 * where most states of the short sequences are empty and hold NaN. */
static void test_parts_merge_to_the_whole(void **state) {
  (void)state;
  const fd_dtype dtypes[] = {FD_DTYPE_F32, FD_DTYPE_BF16, FD_DTYPE_F16};
  const int counts[] = {1, 2, 3, 6, FD_MAX_MERGE_STATES};
  fd_handle *h = cpu_handle();
  for (int i = 0; i < 20; ++i) {
    fdt_case c = {0};
    c.batch = 7;
    c.q_heads = 8;
    c.kv_heads = 2;
    c.head_dim = i % 2 ? 128 : 40;
    c.kv_len = 300 + 37 * i;
    c.dtype = dtypes[i % 3];
    c.out_dtype = i % 4 == 3 ? FD_DTYPE_F32 : c.dtype;
    c.ragged = 1; /* lengths 0, full, 1, 63, 64, 65, random: parts past a length are empty */
    c.with_lse = 1;
    c.seed = 500 + (uint64_t)i;
    fdt_problem p;
    assert_int_equal(fdt_problem_make(&p, &c), 0);
    parts ps;
    /* States in f32, or in the output's dtype (what fd_decode would write);
     * with many states, the two in turn. */
    const int count = counts[i % 5];
    decode_parts(h, &p, count, i % 2 ? FD_DTYPE_F32 : c.out_dtype, count == FD_MAX_MERGE_STATES, &ps);
    if (count == FD_MAX_MERGE_STATES) assert_true(ps.empty_rows > 0); /* the case exists */
    const fd_merge_args m = merge_args(&p, &ps);
    assert_int_equal(fd_merge_states(h, &m, NULL), FD_SUCCESS);
    if (count == 1 && m.states_out[0].dtype == c.out_dtype) {
      /* One state: weight exp(0) = 1, so the merge is the state itself, bit
       * for bit (zeros and -inf where it is empty). */
      const int64_t *os = p.args.out.strides, *ls = p.args.lse.strides;
      for (int64_t row = 0; row < c.batch * c.q_heads; ++row) {
        const int64_t b = row / c.q_heads, hd = row % c.q_heads;
        const float lse = ps.lse[0][row];
        assert_true(((const float *)p.lse)[b * ls[0] + hd * ls[2]] == lse);
        for (int64_t d = 0; d < c.head_dim; ++d) {
          const double got = fdt_load(c.out_dtype, p.out, b * os[0] + hd * os[2] + d);
          assert_true(isinf(lse) ? got == 0.0 : got == fdt_load(c.out_dtype, ps.out[0], row * c.head_dim + d));
        }
      }
    }
    char report[256];
    const int bad = fdt_check(&p, report, sizeof report, NULL, NULL);
    const int mixed = count == FD_MAX_MERGE_STATES && m.states_out[0].dtype != FD_DTYPE_F32;
    print_message("%d parts (%lld empty state rows), %s%s states -> %s: %s\n", ps.count, (long long)ps.empty_rows,
                  fdt_dtype_name(m.states_out[0].dtype), mixed ? " and f32" : "", fdt_dtype_name(c.out_dtype), report);
    free_parts(&ps);
    fdt_problem_free(&p);
    if (bad) fail_msg("case %d: %s", i, report);
  }
  assert_int_equal(fd_destroy(h), FD_SUCCESS);
}

/* Empty states (LSE -inf) are not read, NaN in their output included; a row
 * of empty states is zeros with LSE -inf; a NaN LSE makes its row NaN; the
 * merge runs in place; the same inputs give the same bits. */
static void test_empty_nan_and_in_place(void **state) {
  (void)state;
  enum { R = 3, D = 4 };
  float out0[R * D], out1[R * D], merged[R * D], merged_lse[R];
  float lse0[R] = {0.5f, -INFINITY, NAN}, lse1[R] = {-INFINITY, -INFINITY, 1.0f};
  for (int i = 0; i < R * D; ++i) {
    out0[i] = (float)(i + 1);
    out1[i] = NAN; /* row 0's second state is empty: must not be read */
  }
  const int64_t out_shape[4] = {1, 1, R, D}, out_strides[4] = {R * D, R * D, D, 1};
  const int64_t lse_shape[3] = {1, 1, R}, lse_strides[3] = {R, R, 1};
  fd_tensor outs[2] = {fdt_tensor(out0, FD_DTYPE_F32, 4, out_shape, out_strides),
                       fdt_tensor(out1, FD_DTYPE_F32, 4, out_shape, out_strides)};
  fd_tensor lses[2] = {fdt_tensor(lse0, FD_DTYPE_F32, 3, lse_shape, lse_strides),
                       fdt_tensor(lse1, FD_DTYPE_F32, 3, lse_shape, lse_strides)};
  fd_merge_args m;
  fd_merge_args_init(&m, sizeof m);
  m.num_states = 2;
  m.states_out = outs;
  m.states_lse = lses;
  m.out = fdt_tensor(merged, FD_DTYPE_F32, 4, out_shape, out_strides);
  m.lse = fdt_tensor(merged_lse, FD_DTYPE_F32, 3, lse_shape, lse_strides);
  fd_handle *h = cpu_handle();
  assert_int_equal(fd_merge_states(h, &m, NULL), FD_SUCCESS);
  for (int d = 0; d < D; ++d) assert_true(merged[d] == out0[d]); /* one non-empty state: itself */
  assert_true(merged_lse[0] == 0.5f);
  for (int d = 0; d < D; ++d) assert_true(merged[D + d] == 0.0f && !signbit(merged[D + d]));
  assert_true(isinf(merged_lse[1]) && merged_lse[1] < 0);
  for (int d = 0; d < D; ++d) assert_true(isnan(merged[2 * D + d]));
  assert_true(isnan(merged_lse[2]));

  /* In place: out and lse are state 0's own. */
  lse0[2] = 0.0f;
  for (int d = 0; d < D; ++d) out1[2 * D + d] = 1.0f;
  const float w = 1.0f / (1.0f + expf(1.0f)); /* state 0's weight in row 2 */
  const float expected = w * out0[2 * D] + (1.0f - w) * 1.0f;
  m.out = outs[0];
  m.lse = lses[0];
  assert_int_equal(fd_merge_states(h, &m, NULL), FD_SUCCESS);
  assert_true(fabsf(out0[2 * D] - expected) < 1e-5f);
  assert_true(fabsf(lse0[2] - (1.0f + log1pf(expf(-1.0f)))) < 1e-6f);
  assert_int_equal(fd_destroy(h), FD_SUCCESS);
}

/* FD_MAX_MERGE_STATES states of a ragged problem, where single states of a
 * few rows carry a NaN or +inf LSE: those rows come out NaN (output and LSE;
 * flashdecode.h, fd_merge_args), even where every other state of the row is
 * empty, and every other row is still the attention over the whole cache. */
static void test_nan_and_inf_lse_among_many_states(void **state) {
  (void)state;
  fdt_case c = {0};
  c.batch = 7;
  c.q_heads = 8;
  c.kv_heads = 2;
  c.head_dim = 64;
  c.kv_len = 640;
  c.dtype = FD_DTYPE_F16;
  c.out_dtype = FD_DTYPE_F16;
  c.ragged = 1; /* lengths 0, 640, 1, 63, 64, 65, random */
  c.with_lse = 1;
  c.seed = 540;
  fd_handle *h = cpu_handle();
  fdt_problem p;
  assert_int_equal(fdt_problem_make(&p, &c), 0);
  assert_true(p.lens[0] == 0 && p.lens[1] == c.kv_len && p.lens[3] == 63);
  parts ps;
  decode_parts(h, &p, FD_MAX_MERGE_STATES, FD_DTYPE_F16, 1, &ps);
  /* (sequence, head, state, LSE): sequence 0 is empty, so its states all
   * are; state 40 of sequence 3 (tokens 400..409, past its length) is empty;
   * the others hold keys. */
  const struct {
    int64_t b, h;
    int s;
    float lse;
  } poisoned[] = {{0, 1, FD_MAX_MERGE_STATES - 1, NAN},
                  {0, 5, 3, INFINITY},
                  {1, 2, 0, NAN},
                  {2, 3, 0, INFINITY},
                  {3, 0, 40, NAN},
                  {1, 7, FD_MAX_MERGE_STATES - 1, INFINITY}};
  for (size_t i = 0; i < sizeof poisoned / sizeof poisoned[0]; ++i) {
    const int64_t row = poisoned[i].b * c.q_heads + poisoned[i].h;
    ps.lse[poisoned[i].s][row] = poisoned[i].lse;
    p.expect_lse[row] = NAN;
    for (int64_t d = 0; d < c.head_dim; ++d) p.expect_out[row * c.head_dim + d] = NAN;
  }
  const fd_merge_args m = merge_args(&p, &ps);
  assert_int_equal(fd_merge_states(h, &m, NULL), FD_SUCCESS);
  char report[256];
  const int bad = fdt_check(&p, report, sizeof report, NULL, NULL);
  print_message("%d states, %lld empty state rows, NaN and +inf LSEs: %s\n", ps.count, (long long)ps.empty_rows,
                report);
  /* fdt_check counts NaN where it is expected; check those rows exactly. */
  const int64_t *os = p.args.out.strides, *ls = p.args.lse.strides;
  for (size_t i = 0; i < sizeof poisoned / sizeof poisoned[0]; ++i) {
    const int64_t b = poisoned[i].b, hd = poisoned[i].h;
    assert_true(isnan(((const float *)p.lse)[b * ls[0] + hd * ls[2]]));
    for (int64_t d = 0; d < c.head_dim; ++d)
      assert_true(isnan(fdt_load(c.out_dtype, p.out, b * os[0] + hd * os[2] + d)));
  }
  free_parts(&ps);
  fdt_problem_free(&p);
  assert_int_equal(fd_destroy(h), FD_SUCCESS);
  if (bad) fail_msg("%s", report);
}

static void expect_refused(fd_handle *h, const fd_merge_args *m, fd_status status, const char *needle) {
  const fd_status got = fd_merge_states(h, m, NULL);
  if (got != status || strstr(last_message(), needle) == NULL)
    fail_msg("expected %s with \"%s\", got %s: %s", fd_status_string(status), needle, fd_status_string(got),
             last_message());
}

static void test_bad_arguments(void **state) {
  (void)state;
  enum { R = 2, D = 8 };
  /* The two states apart in one buffer: an output shifted into b overlaps
   * b alone, wherever the compiler puts the locals. */
  float states[4 * R * D];
  float *a = states, *b = states + 2 * R * D;
  float out[R * D], la[R], lb[R];
  memset(out, 0xff, sizeof out);
  for (int i = 0; i < R * D; ++i) a[i] = b[i] = 1.0f;
  la[0] = la[1] = lb[0] = lb[1] = 0.0f;
  const int64_t out_shape[4] = {1, 1, R, D}, out_strides[4] = {R * D, R * D, D, 1};
  const int64_t lse_shape[3] = {1, 1, R}, lse_strides[3] = {R, R, 1};
  fd_tensor outs[2] = {fdt_tensor(a, FD_DTYPE_F32, 4, out_shape, out_strides),
                       fdt_tensor(b, FD_DTYPE_F32, 4, out_shape, out_strides)};
  fd_tensor lses[2] = {fdt_tensor(la, FD_DTYPE_F32, 3, lse_shape, lse_strides),
                       fdt_tensor(lb, FD_DTYPE_F32, 3, lse_shape, lse_strides)};
  fd_merge_args good;
  fd_merge_args_init(&good, sizeof good);
  good.num_states = 2;
  good.states_out = outs;
  good.states_lse = lses;
  good.out = fdt_tensor(out, FD_DTYPE_F32, 4, out_shape, out_strides);
  fd_handle *h = cpu_handle();
  fd_merge_args m = good;
  m.num_states = 0;
  expect_refused(h, &m, FD_ERROR_INVALID_ARGUMENT, "num_states must be in [1, 64], got 0");
  m.num_states = FD_MAX_MERGE_STATES + 1;
  expect_refused(h, &m, FD_ERROR_INVALID_ARGUMENT, "got 65");
  m = good;
  m.states_lse = NULL;
  expect_refused(h, &m, FD_ERROR_NULL_POINTER, "states_lse is NULL");
  assert_int_equal(fd_merge_states(h, NULL, NULL), FD_ERROR_NULL_POINTER);
  assert_int_equal(fd_merge_states(NULL, &good, NULL), FD_ERROR_NULL_POINTER);
  m = good;
  m.struct_size = 8;
  expect_refused(h, &m, FD_ERROR_INVALID_ARGUMENT, "args: struct_size is 8");
  fd_tensor wrong[2] = {outs[0], outs[1]};
  wrong[1].shape[2] = 1;
  m = good;
  m.states_out = wrong;
  expect_refused(h, &m, FD_ERROR_INVALID_SHAPE, "states_out[1]: heads must be 2 (from out), got 1");
  wrong[1] = outs[1];
  wrong[1].dtype = FD_DTYPE_I32;
  expect_refused(h, &m, FD_ERROR_INVALID_DTYPE, "states_out[1]: dtype must be f32, f16 or bf16");
  fd_tensor wrong_lse[2] = {lses[0], lses[1]};
  wrong_lse[0].dtype = FD_DTYPE_F16;
  m = good;
  m.states_lse = wrong_lse;
  expect_refused(h, &m, FD_ERROR_INVALID_DTYPE, "states_lse[0]: dtype must be f32");
  m = good;
  m.out.data = b + 1; /* overlaps state 1 without being it */
  expect_refused(h, &m, FD_ERROR_INVALID_ARGUMENT, "overlap those of input states_out[1]");
  m = good;
  m.lse = lses[1];
  m.lse.data = a; /* merged lse inside state 0's output */
  expect_refused(h, &m, FD_ERROR_INVALID_ARGUMENT, "lse: its bytes");
  for (int i = 0; i < R * D; ++i) assert_true(isnan(out[i])); /* nothing written on error */
  assert_int_equal(fd_merge_states(h, &good, NULL), FD_SUCCESS);
  for (int i = 0; i < R * D; ++i) assert_true(out[i] == 1.0f);
  assert_int_equal(fd_destroy(h), FD_SUCCESS);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_parts_merge_to_the_whole),
      cmocka_unit_test(test_empty_nan_and_in_place),
      cmocka_unit_test(test_nan_and_inf_lse_among_many_states),
      cmocka_unit_test(test_bad_arguments),
  };
  return cmocka_run_group_tests_name("merge_states", tests, NULL, NULL);
}
