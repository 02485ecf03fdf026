/* SPDX-License-Identifier: Apache-2.0 */
/* The CPU backend keeps fd_decode(), fd_append_kv() and fd_merge_states()
 * free of allocation once the workspace is reserved (flashdecode.h,
 * "Workspace": real-time loops): every malloc, calloc, realloc and
 * aligned allocation of the process (the library's operator new, its
 * worker threads' included) is counted while a call runs, and must be 0 on
 * the first call after fd_reserve_workspace() as on later ones, for plain,
 * multi-token, paged and 8-bit problems on 1, 2 and 4 threads. glibc only:
 * the counters wrap glibc's own allocator entry points; not built with
 * sanitizers, whose allocators these would replace. */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <cmocka.h>

#include "fdt.h"
#include "flashdecode.h"

#ifndef __GLIBC__
#error "test_no_allocation counts glibc's allocator calls"
#endif

void *__libc_malloc(size_t size);
void *__libc_calloc(size_t count, size_t size);
void *__libc_realloc(void *pointer, size_t size);
void *__libc_memalign(size_t alignment, size_t size);

static atomic_int g_counting;
static atomic_long g_allocations;

static void note_allocation(void) {
  if (atomic_load(&g_counting)) atomic_fetch_add(&g_allocations, 1);
}

void *malloc(size_t size) {
  note_allocation();
  return __libc_malloc(size);
}
void *calloc(size_t count, size_t size) {
  note_allocation();
  return __libc_calloc(count, size);
}
void *realloc(void *pointer, size_t size) {
  note_allocation();
  return __libc_realloc(pointer, size);
}
void *aligned_alloc(size_t alignment, size_t size) {
  note_allocation();
  return __libc_memalign(alignment, size);
}
void *memalign(size_t alignment, size_t size) {
  note_allocation();
  return __libc_memalign(alignment, size);
}
int posix_memalign(void **out, size_t alignment, size_t size) {
  note_allocation();
  void *pointer = __libc_memalign(alignment, size);
  if (pointer == NULL) return 12; /* ENOMEM */
  *out = pointer;
  return 0;
}

/* Allocations while `call` runs (0 expected), its status in *status. */
#define COUNT_ALLOCATIONS(status, call) \
  do {                                  \
    atomic_store(&g_allocations, 0);    \
    atomic_store(&g_counting, 1);       \
    (status) = (call);                  \
    atomic_store(&g_counting, 0);       \
  } while (0)

static fdt_case plain_case(fdt_layout layout, uint64_t seed) {
  fdt_case c = {0};
  c.batch = 3;
  c.q_heads = 8;
  c.kv_heads = 2;
  c.head_dim = 64;
  c.kv_len = 640;
  c.page_size = 16;
  c.dtype = FD_DTYPE_F16;
  c.out_dtype = FD_DTYPE_F16;
  c.layout = layout;
  c.ragged = 1;
  c.with_lse = 1;
  c.seed = seed;
  return c;
}

/* Every decode runs twice: the first call after the reserve may not
 * allocate either (no lazily grown per-thread buffers). Results are
 * checked too: a decode that skipped its work would allocate nothing. */
static void test_decode_allocates_nothing(void **state) {
  (void)state;
  fdt_case cases[4];
  cases[0] = plain_case(FDT_BNHD, 11);
  cases[1] = plain_case(FDT_PAGED_NHD, 12);
  cases[2] = plain_case(FDT_BNHD, 13); /* a speculative step with variants */
  cases[2].q_len = 4;
  cases[2].window = 100;
  cases[2].softcap = 30.0;
  cases[2].sinks = 1;
  cases[2].num_splits = 3;
  cases[3] = plain_case(FDT_PAGED_NHD, 14); /* an 8-bit cache with per-token scales */
  cases[3].kv_dtype = FD_DTYPE_E4M3;
  cases[3].scale_mode = FDT_SCALE_TOKEN;
  const int thread_counts[] = {1, 2, 4};
  for (size_t t = 0; t < sizeof thread_counts / sizeof thread_counts[0]; ++t) {
    fd_handle *handle = fdt_cpu_handle(thread_counts[t], 0);
    assert_non_null(handle);
    fdt_problem problems[4];
    size_t largest = 0;
    for (int k = 0; k < 4; ++k) {
      assert_int_equal(fdt_problem_make(&problems[k], &cases[k]), 0);
      fdt_reference(&problems[k]);
      size_t bytes = 0;
      assert_int_equal(fd_workspace_size(handle, &problems[k].args, &bytes), FD_SUCCESS);
      if (bytes > largest) largest = bytes;
    }
    assert_int_equal(fd_reserve_workspace(handle, largest), FD_SUCCESS);
    for (int k = 0; k < 4; ++k) {
      for (int round = 0; round < 2; ++round) {
        fdt_poison_outputs(&problems[k]);
        fd_status status;
        COUNT_ALLOCATIONS(status, fd_decode(handle, &problems[k].args, NULL));
        assert_int_equal(status, FD_SUCCESS);
        char report[256];
        if (fdt_check(&problems[k], report, sizeof report, NULL, NULL) != 0) {
          fail_msg("case %d on %d threads: %s", k, thread_counts[t], report);
        }
        if (atomic_load(&g_allocations) != 0) {
          fail_msg("case %d, call %d on %d threads: fd_decode allocated %ld times", k, round + 1, thread_counts[t],
                   atomic_load(&g_allocations));
        }
      }
    }
    for (int k = 0; k < 4; ++k) fdt_problem_free(&problems[k]);
    assert_int_equal(fd_destroy(handle), FD_SUCCESS);
  }
}

/* fd_append_kv and fd_merge_states need no workspace: none of their calls
 * allocates. */
static void test_append_and_merge_allocate_nothing(void **state) {
  (void)state;
  enum { B = 4, N = 32, H = 2, D = 64, NEW = 2, HQ = 4 };
  static uint16_t k[B * N * H * D], v[B * N * H * D], k_new[B * NEW * H * D], v_new[B * NEW * H * D];
  static float outs[2][B * HQ * D], lses[2][B * HQ], out[B * HQ * D], lse[B * HQ];
  int32_t lens[B] = {32, 7, 2, 20};
  for (int i = 0; i < B * NEW * H * D; ++i) k_new[i] = v_new[i] = (uint16_t)(0x3c00 + i % 512);
  for (int s = 0; s < 2; ++s) {
    for (int i = 0; i < B * HQ * D; ++i) outs[s][i] = (float)(i % 13) * 0.25f - 1.0f + (float)s;
    for (int i = 0; i < B * HQ; ++i) lses[s][i] = (float)(i % 5) - 2.0f * (float)s;
  }
  const int thread_counts[] = {1, 4};
  for (size_t t = 0; t < sizeof thread_counts / sizeof thread_counts[0]; ++t) {
    fd_handle *handle = fdt_cpu_handle(thread_counts[t], 0);
    assert_non_null(handle);
    fd_append_args a;
    fd_append_args_init(&a, sizeof a);
    const int64_t cache_shape[] = {B, N, H, D}, cache_strides[] = {N * H * D, H * D, D, 1};
    const int64_t new_shape[] = {B, NEW, H, D}, new_strides[] = {NEW * H * D, H * D, D, 1};
    a.k = fdt_tensor(k, FD_DTYPE_F16, 4, cache_shape, cache_strides);
    a.v = fdt_tensor(v, FD_DTYPE_F16, 4, cache_shape, cache_strides);
    a.k_new = fdt_tensor(k_new, FD_DTYPE_F16, 4, new_shape, new_strides);
    a.v_new = fdt_tensor(v_new, FD_DTYPE_F16, 4, new_shape, new_strides);
    const int64_t len_shape[] = {B}, len_strides[] = {1};
    a.seq_lens = fdt_tensor(lens, FD_DTYPE_I32, 1, len_shape, len_strides);
    fd_status status;
    COUNT_ALLOCATIONS(status, fd_append_kv(handle, &a, NULL));
    assert_int_equal(status, FD_SUCCESS);
    assert_int_equal(atomic_load(&g_allocations), 0);
    /* The new tokens landed: sequence 1's last position holds token 1's first element. */
    assert_int_equal(k[(1 * N + 6) * H * D], k_new[(1 * NEW + 1) * H * D]);

    const int64_t out_shape[] = {B, 1, HQ, D}, out_strides[] = {HQ * D, HQ * D, D, 1};
    const int64_t lse_shape[] = {B, 1, HQ}, lse_strides[] = {HQ, HQ, 1};
    fd_tensor states_out[2], states_lse[2];
    for (int s = 0; s < 2; ++s) {
      states_out[s] = fdt_tensor(outs[s], FD_DTYPE_F32, 4, out_shape, out_strides);
      states_lse[s] = fdt_tensor(lses[s], FD_DTYPE_F32, 3, lse_shape, lse_strides);
    }
    fd_merge_args m;
    fd_merge_args_init(&m, sizeof m);
    m.num_states = 2;
    m.states_out = states_out;
    m.states_lse = states_lse;
    m.out = fdt_tensor(out, FD_DTYPE_F32, 4, out_shape, out_strides);
    m.lse = fdt_tensor(lse, FD_DTYPE_F32, 3, lse_shape, lse_strides);
    lse[B * HQ - 1] = -1.0f;
    COUNT_ALLOCATIONS(status, fd_merge_states(handle, &m, NULL));
    assert_int_equal(status, FD_SUCCESS);
    assert_int_equal(atomic_load(&g_allocations), 0);
    /* log(e^a + e^b) of the last row's two LSEs: the merge ran. */
    const double a0 = lses[0][B * HQ - 1], b0 = lses[1][B * HQ - 1];
    const double expected = a0 > b0 ? a0 + log1p(exp(b0 - a0)) : b0 + log1p(exp(a0 - b0));
    assert_true(fabs(lse[B * HQ - 1] - expected) < 1e-5);
    assert_int_equal(fd_destroy(handle), FD_SUCCESS);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_decode_allocates_nothing),
      cmocka_unit_test(test_append_and_merge_allocate_nothing),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
