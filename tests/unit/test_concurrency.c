// SPDX-License-Identifier: Apache-2.0
/* Handles used from several threads at once, on the CPU backend: threads that
 * create, decode on and destroy their own handles; calls racing fd_destroy
 * of their handle (each must succeed or report FD_ERROR_INVALID_HANDLE, never
 * crash); one handle shared by several threads, each with its own outputs;
 * one handle answering read-only queries (fd_workspace_size,
 * fd_describe_plan, fd_get_backend) from several threads at once, each
 * thread keeping its own error message. Every successful decode is checked against the float64 reference of fdt on
 * random data.
 *
 * Worker threads never call cmocka's assertions (a failure longjmps into the
 * main thread's test): they count failures and keep the first message, which
 * the test asserts on after joining them. Run one test with
 * `test_concurrency <name pattern>`; meant to run under ASan and TSan too. */
#define _POSIX_C_SOURCE 200809L

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fdt.h"
#include "flashdecode.h"

/* ---- failures seen by worker threads --------------------------------------- */
static atomic_int failure_count;
static pthread_mutex_t failure_mutex = PTHREAD_MUTEX_INITIALIZER;
static char first_failure[512];

static void record_failure(const char *format, ...) {
  if (atomic_fetch_add(&failure_count, 1) != 0) return;
  pthread_mutex_lock(&failure_mutex);
  va_list ap;
  va_start(ap, format);
  vsnprintf(first_failure, sizeof first_failure, format, ap);
  va_end(ap);
  pthread_mutex_unlock(&failure_mutex);
}

static void reset_failures(void) {
  atomic_store(&failure_count, 0);
  first_failure[0] = '\0';
}

static void assert_no_failures(void) {
  const int count = atomic_load(&failure_count);
  if (count != 0) {
    pthread_mutex_lock(&failure_mutex);
    fail_msg("%d failure(s) in worker threads; first: %s", count, first_failure);
    pthread_mutex_unlock(&failure_mutex);
  }
}

/* ---- helpers ---------------------------------------------------------------- */
static fd_handle *create_cpu_handle(int num_threads) {
  fd_options options;
  fd_options_init(&options, sizeof options);
  options.backend = FD_BACKEND_CPU;
  options.num_threads = num_threads;
  fd_handle *handle = NULL;
  const fd_status status = fd_create(&handle, &options);
  if (status != FD_SUCCESS) {
    record_failure("fd_create(num_threads %d): %s", num_threads, fd_status_string(status));
    return NULL;
  }
  return handle;
}

/* Small problems of different shapes, dtypes and layouts (so that one handle
 * switches plans and grows its workspace); all but one split the sequence,
 * so decodes go through the workspace. */
enum { NUM_VARIANTS = 4 };

static const fdt_case variants[NUM_VARIANTS] = {
    {.batch = 2,
     .q_heads = 4,
     .kv_heads = 2,
     .head_dim = 64,
     .kv_len = 300,
     .dtype = FD_DTYPE_F16,
     .out_dtype = FD_DTYPE_F16,
     .layout = FDT_BNHD,
     .ragged = 1,
     .num_splits = 3},
    {.batch = 3,
     .q_heads = 8,
     .kv_heads = 1,
     .head_dim = 32,
     .kv_len = 520,
     .dtype = FD_DTYPE_BF16,
     .out_dtype = FD_DTYPE_F32,
     .layout = FDT_BHND,
     .num_splits = 4},
    {.batch = 1,
     .q_heads = 2,
     .kv_heads = 2,
     .head_dim = 128,
     .kv_len = 700,
     .page_size = 16,
     .dtype = FD_DTYPE_F32,
     .out_dtype = FD_DTYPE_F32,
     .layout = FDT_PAGED_NHD,
     .ragged = 1,
     .num_splits = 5},
    {.batch = 4,
     .q_heads = 4,
     .kv_heads = 4,
     .head_dim = 64,
     .kv_len = 64,
     .dtype = FD_DTYPE_F16,
     .out_dtype = FD_DTYPE_F16,
     .layout = FDT_BNHD_PADDED,
     .num_splits = 1},
};

static int make_problem(fdt_problem *p, int variant, uint64_t seed) {
  fdt_case c = variants[variant % NUM_VARIANTS];
  c.seed = seed;
  c.with_lse = 1;
  if (fdt_problem_make(p, &c) == 0) return 0;
  record_failure("fdt_problem_make failed (variant %d)", variant);
  return -1;
}

/* Poisons p's outputs, decodes, and on success checks them against the
 * reference (and, if given, bitwise against `expected_out`). Returns the
 * decode's status; a wrong result is recorded as a failure. */
static fd_status decode_checked(fd_handle *handle, fdt_problem *p, const void *expected_out, const char *what) {
  fdt_poison_outputs(p);
  const fd_status status = fd_decode(handle, &p->args, NULL);
  if (status != FD_SUCCESS) return status;
  char report[256];
  if (fdt_check(p, report, sizeof report, NULL, NULL) != 0) {
    char desc[256];
    fdt_case_describe(&p->c, desc, sizeof desc);
    record_failure("%s: wrong result for %s: %s", what, desc, report);
  } else if (expected_out != NULL && memcmp(p->out, expected_out, p->out_bytes) != 0) {
    record_failure("%s: result differs from the same decode run alone", what);
  }
  return status;
}

static void sleep_us(long us) {
  struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
  nanosleep(&ts, NULL);
}

/* ---- threads with handles of their own ------------------------------------- */
enum { OWN_THREADS = 4, OWN_ROUNDS = 10 };

static void *own_handles_thread(void *arg) {
  const int id = (int)(intptr_t)arg;
  fdt_problem problems[NUM_VARIANTS];
  int made = 0;
  while (made < NUM_VARIANTS && make_problem(&problems[made], made, 100u + (uint64_t)(id * NUM_VARIANTS + made)) == 0) {
    ++made;
  }
  for (int round = 0; made == NUM_VARIANTS && round < OWN_ROUNDS; ++round) {
    fd_handle *handle = create_cpu_handle(1 + (id + round) % 2);
    if (handle == NULL) break;
    for (int v = 0; v < NUM_VARIANTS; ++v) {
      const fd_status status = decode_checked(handle, &problems[(v + round) % NUM_VARIANTS], NULL, "own handle");
      if (status != FD_SUCCESS) record_failure("own handle: fd_decode returned %s", fd_status_string(status));
    }
    const fd_status status = fd_destroy(handle);
    if (status != FD_SUCCESS) record_failure("own handle: fd_destroy returned %s", fd_status_string(status));
  }
  for (int v = 0; v < made; ++v) fdt_problem_free(&problems[v]);
  return NULL;
}

static void test_threads_with_own_handles(void **state) {
  (void)state;
  reset_failures();
  pthread_t threads[OWN_THREADS];
  for (int t = 0; t < OWN_THREADS; ++t) {
    assert_int_equal(pthread_create(&threads[t], NULL, own_handles_thread, (void *)(intptr_t)t), 0);
  }
  for (int t = 0; t < OWN_THREADS; ++t) pthread_join(threads[t], NULL);
  assert_no_failures();
}

/* ---- calls racing fd_destroy of their handle --------------------------------- */
/* Destroyer threads put a fresh handle in their slot, let it be used, destroy
 * it and leave the dead pointer in the slot for a while; hammer threads call
 * whatever the slots hold, each with a problem of its own. Meanwhile other
 * threads create, use and destroy handles of their own, which may reuse a
 * dead handle's address: then a hammer's call runs on their live handle, and
 * both must still get correct results. */
enum { SLOTS = 2, HAMMERS = 3, CYCLES = 40, BYSTANDERS = 2 };

typedef struct race {
  _Atomic(fd_handle *) slots[SLOTS];
  atomic_int hammers_ready;
  atomic_int destroyers_left;
  atomic_int successes;
  atomic_int invalid_handles;
  fdt_problem problems[HAMMERS];
  size_t expected_bytes[HAMMERS][2]; /* fixed split counts; on handles of 1 and 2 threads (their scratch) */
} race;

typedef struct race_arg {
  race *r;
  int id;
} race_arg;

static void *destroyer_thread(void *arg) {
  const race_arg *a = arg;
  race *r = a->r;
  while (atomic_load(&r->hammers_ready) < HAMMERS) sleep_us(100);
  for (int cycle = 0; cycle < CYCLES; ++cycle) {
    fd_handle *handle = create_cpu_handle(1 + cycle % 2);
    if (handle == NULL) break;
    atomic_store(&r->slots[a->id], handle);
    sleep_us(1000); /* hammers use it, decodes included */
    const fd_status status = fd_destroy(handle);
    if (status != FD_SUCCESS) record_failure("fd_destroy of a live handle returned %s", fd_status_string(status));
    sleep_us(300); /* hammers use the dead pointer */
  }
  atomic_fetch_sub(&r->destroyers_left, 1);
  return NULL;
}

static void count(race *r, fd_status status, const char *call) {
  if (status == FD_SUCCESS) {
    atomic_fetch_add(&r->successes, 1);
  } else if (status == FD_ERROR_INVALID_HANDLE) {
    atomic_fetch_add(&r->invalid_handles, 1);
  } else {
    record_failure("%s on a handle being destroyed returned %s", call, fd_status_string(status));
  }
}

static void *hammer_thread(void *arg) {
  const race_arg *a = arg;
  race *r = a->r;
  fdt_problem *problem = &r->problems[a->id];
  const size_t *expected_bytes = r->expected_bytes[a->id];
  atomic_fetch_add(&r->hammers_ready, 1);
  for (unsigned i = 0; atomic_load(&r->destroyers_left) > 0; ++i) {
    fd_handle *handle = atomic_load(&r->slots[i % SLOTS]);
    if (handle == NULL) continue;
    switch (i % 4) {
      case 0:
      case 1: count(r, decode_checked(handle, problem, NULL, "decode racing destroy"), "fd_decode"); break;
      case 2: {
        size_t bytes = 0;
        const fd_status status = fd_workspace_size(handle, &problem->args, &bytes);
        count(r, status, "fd_workspace_size");
        if (status == FD_SUCCESS && bytes != expected_bytes[0] && bytes != expected_bytes[1]) {
          record_failure("fd_workspace_size: %zu bytes, expected %zu or %zu", bytes, expected_bytes[0],
                         expected_bytes[1]);
        }
        break;
      }
      default: {
        fd_plan_info info;
        fd_plan_info_init(&info, sizeof info);
        const fd_status status = fd_describe_plan(handle, &problem->args, &info);
        count(r, status, "fd_describe_plan");
        if (status == FD_SUCCESS && (info.backend != FD_BACKEND_CPU || info.num_splits != problem->c.num_splits)) {
          record_failure("fd_describe_plan: backend %d, %d splits", (int)info.backend, (int)info.num_splits);
        }
        fd_backend backend = FD_BACKEND_AUTO;
        count(r, fd_get_backend(handle, &backend), "fd_get_backend");
        break;
      }
    }
  }
  return NULL;
}

static void test_calls_racing_destroy(void **state) {
  (void)state;
  reset_failures();
  race *r = calloc(1, sizeof *r);
  assert_non_null(r);
  atomic_store(&r->destroyers_left, SLOTS);
  fd_handle *references[2] = {create_cpu_handle(1), create_cpu_handle(2)};
  assert_non_null(references[0]);
  assert_non_null(references[1]);
  for (int t = 0; t < HAMMERS; ++t) {
    assert_int_equal(make_problem(&r->problems[t], t % 3 /* the variants that split */, 500u + (uint64_t)t), 0);
    for (int k = 0; k < 2; ++k) {
      assert_int_equal(fd_workspace_size(references[k], &r->problems[t].args, &r->expected_bytes[t][k]), FD_SUCCESS);
    }
  }
  assert_int_equal(fd_destroy(references[0]), FD_SUCCESS);
  assert_int_equal(fd_destroy(references[1]), FD_SUCCESS);

  race_arg destroyer_args[SLOTS], hammer_args[HAMMERS];
  pthread_t destroyers[SLOTS], hammers[HAMMERS], bystanders[BYSTANDERS];
  for (int t = 0; t < BYSTANDERS; ++t) {
    assert_int_equal(pthread_create(&bystanders[t], NULL, own_handles_thread, (void *)(intptr_t)(OWN_THREADS + t)), 0);
  }
  for (int t = 0; t < HAMMERS; ++t) {
    hammer_args[t] = (race_arg){r, t};
    assert_int_equal(pthread_create(&hammers[t], NULL, hammer_thread, &hammer_args[t]), 0);
  }
  for (int s = 0; s < SLOTS; ++s) {
    destroyer_args[s] = (race_arg){r, s};
    assert_int_equal(pthread_create(&destroyers[s], NULL, destroyer_thread, &destroyer_args[s]), 0);
  }
  for (int s = 0; s < SLOTS; ++s) pthread_join(destroyers[s], NULL);
  for (int t = 0; t < HAMMERS; ++t) pthread_join(hammers[t], NULL);
  for (int t = 0; t < BYSTANDERS; ++t) pthread_join(bystanders[t], NULL);
  assert_no_failures();
  print_message("racing destroy: %d calls succeeded, %d found their handle destroyed\n", atomic_load(&r->successes),
                atomic_load(&r->invalid_handles));
  /* Both outcomes happened: the race was exercised. */
  assert_true(atomic_load(&r->successes) > 0);
  assert_true(atomic_load(&r->invalid_handles) > 0);
  /* The slots hold destroyed handles now: still recognised, twice over. */
  for (int s = 0; s < SLOTS; ++s) {
    fd_handle *dead = atomic_load(&r->slots[s]);
    assert_int_equal(fd_destroy(dead), FD_ERROR_INVALID_HANDLE);
    assert_int_equal(fd_destroy(dead), FD_ERROR_INVALID_HANDLE);
  }
  for (int t = 0; t < HAMMERS; ++t) fdt_problem_free(&r->problems[t]);
  free(r);
}

/* ---- one handle shared by several threads ------------------------------------ */
/* Each thread decodes its own problem (its own shape, so the handle's plan
 * cache switches between them and its workspace grows) into its own outputs,
 * and asks for workspace sizes and plans; thread 0 also grows the workspace.
 * Results must match the reference and, bitwise, the same decode run alone. */
enum { SHARING_THREADS = 4, SHARED_ROUNDS = 25 };

typedef struct sharer {
  fd_handle *handle;
  int id;
  fdt_problem problem;
  void *expected_out; /* the output of this decode run alone on the handle */
  size_t expected_bytes;
} sharer;

static void *sharing_thread(void *arg) {
  sharer *s = arg;
  for (int round = 0; round < SHARED_ROUNDS; ++round) {
    const fd_status status = decode_checked(s->handle, &s->problem, s->expected_out, "shared handle");
    if (status != FD_SUCCESS) record_failure("shared handle: fd_decode returned %s", fd_status_string(status));
    size_t bytes = 0;
    if (fd_workspace_size(s->handle, &s->problem.args, &bytes) != FD_SUCCESS || bytes != s->expected_bytes) {
      record_failure("shared handle: fd_workspace_size gave %zu bytes, expected %zu", bytes, s->expected_bytes);
    }
    fd_plan_info info;
    fd_plan_info_init(&info, sizeof info);
    if (fd_describe_plan(s->handle, &s->problem.args, &info) != FD_SUCCESS ||
        info.workspace_bytes != s->expected_bytes) {
      record_failure("shared handle: fd_describe_plan gave %zu bytes, expected %zu", info.workspace_bytes,
                     s->expected_bytes);
    }
    if (s->id == 0 && fd_reserve_workspace(s->handle, s->expected_bytes + (size_t)(round + 1) * 4096) != FD_SUCCESS) {
      record_failure("shared handle: fd_reserve_workspace failed");
    }
  }
  return NULL;
}

static void run_shared_handle(int num_threads) {
  reset_failures();
  fd_handle *handle = create_cpu_handle(num_threads);
  assert_non_null(handle);
  sharer sharers[SHARING_THREADS];
  for (int t = 0; t < SHARING_THREADS; ++t) {
    sharer *s = &sharers[t];
    s->handle = handle;
    s->id = t;
    assert_int_equal(make_problem(&s->problem, t, 900u + (uint64_t)t), 0);
    /* Alone first: the result every concurrent decode must reproduce. */
    assert_int_equal(decode_checked(handle, &s->problem, NULL, "alone"), FD_SUCCESS);
    assert_no_failures();
    s->expected_out = malloc(s->problem.out_bytes);
    assert_non_null(s->expected_out);
    memcpy(s->expected_out, s->problem.out, s->problem.out_bytes);
    assert_int_equal(fd_workspace_size(handle, &s->problem.args, &s->expected_bytes), FD_SUCCESS);
  }
  pthread_t threads[SHARING_THREADS];
  for (int t = 0; t < SHARING_THREADS; ++t) {
    assert_int_equal(pthread_create(&threads[t], NULL, sharing_thread, &sharers[t]), 0);
  }
  for (int t = 0; t < SHARING_THREADS; ++t) pthread_join(threads[t], NULL);
  assert_int_equal(fd_destroy(handle), FD_SUCCESS);
  for (int t = 0; t < SHARING_THREADS; ++t) {
    fdt_problem_free(&sharers[t].problem);
    free(sharers[t].expected_out);
  }
  assert_no_failures();
}

static void test_shared_handle_one_worker(void **state) {
  (void)state;
  run_shared_handle(1);
}

static void test_shared_handle_two_workers(void **state) {
  (void)state;
  run_shared_handle(2);
}

/* ---- read-only queries on one shared handle ----------------------------------- */
/* Several threads ask one handle, at the same time and nothing else, for
 * workspace sizes, plans and its backend: each answer must be the one the
 * handle gave for that problem alone. Each thread also makes a call that
 * fails with a value of its own, and must read back its own message (the
 * detailed message is thread-local). */
enum { QUERY_THREADS = 4, QUERY_ROUNDS = 200 };

typedef struct querier {
  fd_handle *handle;
  int id;
  fdt_problem problem;
  size_t expected_bytes;
  fd_plan_info expected_plan;
} querier;

static void *query_thread(void *arg) {
  querier *q = arg;
  fd_decode_args bad = q->problem.args;
  bad.num_splits = -(q->id + 1);
  char expected_message[64];
  snprintf(expected_message, sizeof expected_message, "got %d", (int)bad.num_splits);
  for (int round = 0; round < QUERY_ROUNDS; ++round) {
    size_t bytes = 0;
    fd_status status = fd_workspace_size(q->handle, &q->problem.args, &bytes);
    if (status != FD_SUCCESS || bytes != q->expected_bytes) {
      record_failure("thread %d: fd_workspace_size returned %s, %zu bytes, expected %zu", q->id,
                     fd_status_string(status), bytes, q->expected_bytes);
    }
    fd_plan_info info;
    fd_plan_info_init(&info, sizeof info);
    status = fd_describe_plan(q->handle, &q->problem.args, &info);
    const fd_plan_info *want = &q->expected_plan;
    if (status != FD_SUCCESS || info.backend != want->backend || info.num_splits != want->num_splits ||
        info.split_tokens != want->split_tokens || info.workspace_bytes != want->workspace_bytes ||
        strcmp(info.kernel, want->kernel) != 0 || info.merge != want->merge || info.launches != want->launches ||
        info.blocks != want->blocks) {
      record_failure("thread %d: fd_describe_plan returned %s and a plan other than the one described alone", q->id,
                     fd_status_string(status));
    }
    fd_backend backend = FD_BACKEND_AUTO;
    status = fd_get_backend(q->handle, &backend);
    if (status != FD_SUCCESS || backend != FD_BACKEND_CPU) {
      record_failure("thread %d: fd_get_backend returned %s, backend %d", q->id, fd_status_string(status),
                     (int)backend);
    }
    status = fd_workspace_size(q->handle, &bad, &bytes);
    char message[256];
    fd_last_error_message(message, sizeof message);
    if (status != FD_ERROR_INVALID_SPLITS || strstr(message, expected_message) == NULL) {
      record_failure("thread %d: num_splits %d gave %s, message \"%s\" (another thread's?)", q->id, (int)bad.num_splits,
                     fd_status_string(status), message);
    }
  }
  return NULL;
}

static void test_shared_handle_read_only_queries(void **state) {
  (void)state;
  reset_failures();
  fd_handle *handle = create_cpu_handle(2);
  assert_non_null(handle);
  querier queriers[QUERY_THREADS];
  for (int t = 0; t < QUERY_THREADS; ++t) {
    querier *q = &queriers[t];
    q->handle = handle;
    q->id = t;
    assert_int_equal(make_problem(&q->problem, t, 1300u + (uint64_t)t), 0);
    q->problem.args.num_splits = 0; /* the planner's choice: the same on every call */
    assert_int_equal(fd_workspace_size(handle, &q->problem.args, &q->expected_bytes), FD_SUCCESS);
    fd_plan_info_init(&q->expected_plan, sizeof q->expected_plan);
    assert_int_equal(fd_describe_plan(handle, &q->problem.args, &q->expected_plan), FD_SUCCESS);
    assert_int_equal(q->expected_plan.workspace_bytes, q->expected_bytes);
  }
  pthread_t threads[QUERY_THREADS];
  for (int t = 0; t < QUERY_THREADS; ++t) {
    assert_int_equal(pthread_create(&threads[t], NULL, query_thread, &queriers[t]), 0);
  }
  for (int t = 0; t < QUERY_THREADS; ++t) pthread_join(threads[t], NULL);
  assert_no_failures();
  /* The queries left the handle as it was: each problem still decodes right. */
  for (int t = 0; t < QUERY_THREADS; ++t) {
    assert_int_equal(decode_checked(handle, &queriers[t].problem, NULL, "after the queries"), FD_SUCCESS);
  }
  assert_no_failures();
  assert_int_equal(fd_destroy(handle), FD_SUCCESS);
  for (int t = 0; t < QUERY_THREADS; ++t) fdt_problem_free(&queriers[t].problem);
}

int main(int argc, char **argv) {
  if (argc > 1) cmocka_set_test_filter(argv[1]);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_threads_with_own_handles),        cmocka_unit_test(test_calls_racing_destroy),
      cmocka_unit_test(test_shared_handle_one_worker),        cmocka_unit_test(test_shared_handle_two_workers),
      cmocka_unit_test(test_shared_handle_read_only_queries),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
