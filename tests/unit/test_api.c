// SPDX-License-Identifier: Apache-2.0
/* The API contract on the CPU backend: version, status strings, handle
 * lifetime, workspace control, thread-local errors, and one test per kind of
 * bad input (specific status, message naming the argument, output untouched). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fdt.h"
#include "flashdecode.h"

#if defined(__SANITIZE_ADDRESS__)
/* ASan aborts when an allocation is refused, even a nothrow one, unless told
 * to return NULL: test_reserve_refuses_impossible_sizes checks that the
 * library turns the allocator's refusal into FD_ERROR_OUT_OF_MEMORY. */
const char *__asan_default_options(void);
const char *__asan_default_options(void) { return "allocator_may_return_null=1"; }
#endif
#if defined(__SANITIZE_THREAD__)
/* Likewise ThreadSanitizer (make tsan). */
const char *__tsan_default_options(void);
const char *__tsan_default_options(void) { return "allocator_may_return_null=1"; }
#endif

/* ---- fixtures ------------------------------------------------------------ */
typedef struct fixture {
  fd_handle *handle;
  fdt_problem problem;
  unsigned char *pristine_out; /* copy of the poisoned output, to prove nothing was written */
} fixture;

static int setup(void **state) {
  fixture *f = calloc(1, sizeof *f);
  fd_options options;
  fd_options_init(&options, sizeof options);
  options.backend = FD_BACKEND_CPU;
  options.num_threads = 2;
  if (fd_create(&f->handle, &options) != FD_SUCCESS) return -1;
  fdt_case c = {0};
  c.batch = 2;
  c.q_heads = 8;
  c.kv_heads = 2;
  c.head_dim = 64;
  c.kv_len = 100;
  c.dtype = FD_DTYPE_F16;
  c.out_dtype = FD_DTYPE_F16;
  c.ragged = 1;
  c.with_lse = 1;
  c.seed = 7;
  if (fdt_problem_make(&f->problem, &c) != 0) return -1;
  f->pristine_out = malloc(f->problem.out_bytes);
  memcpy(f->pristine_out, f->problem.out, f->problem.out_bytes);
  *state = f;
  return 0;
}

static int teardown(void **state) {
  fixture *f = *state;
  assert_int_equal(fd_destroy(f->handle), FD_SUCCESS);
  fdt_problem_free(&f->problem);
  free(f->pristine_out);
  free(f);
  return 0;
}

static const char *last_message(void) {
  static _Thread_local char buffer[512];
  fd_last_error_message(buffer, sizeof buffer);
  return buffer;
}

/* Runs fd_decode on args and expects `status` with `needle` in the message
 * and the output untouched. */
static void expect_rejected(fixture *f, const fd_decode_args *args, fd_status status, const char *needle) {
  const fd_status got = fd_decode(f->handle, args, NULL);
  if (got != status || strstr(last_message(), needle) == NULL) {
    fail_msg("expected status %d (%s) with \"%s\", got %d: %s", status, fd_status_string(status), needle, got,
             last_message());
  }
  assert_memory_equal(f->problem.out, f->pristine_out, f->problem.out_bytes);
  /* fd_workspace_size validates the same arguments; it never reads tensor
   * contents (seq_lens values) and does not look at the workspace itself. */
  const int content_error = strstr(needle, "seq_lens[") != NULL || status == FD_ERROR_WORKSPACE_TOO_SMALL;
  size_t bytes = 0;
  assert_int_equal(fd_workspace_size(f->handle, args, &bytes), content_error ? FD_SUCCESS : status);
  /* So does fd_describe_plan, which leaves its output alone on error. */
  fd_plan_info info, pristine_info;
  fd_plan_info_init(&info, sizeof info);
  pristine_info = info;
  assert_int_equal(fd_describe_plan(f->handle, args, &info), content_error ? FD_SUCCESS : status);
  if (!content_error) assert_memory_equal(&info, &pristine_info, sizeof info);
}

/* ---- version, strings, lifetime -------------------------------------------- */
static void test_version(void **state) {
  (void)state;
  assert_int_equal(fd_version_number(), FD_VERSION_NUMBER);
  char expected[32];
  snprintf(expected, sizeof expected, "%d.%d.%d", FD_VERSION_MAJOR, FD_VERSION_MINOR, FD_VERSION_PATCH);
  assert_string_equal(fd_version_string(), expected);
  /* The header's string literal is built from the same numbers. */
  assert_string_equal(FD_VERSION_STRING, expected);
  assert_string_equal(FD_VERSION_STRING, fd_version_string());
}

static void test_status_strings(void **state) {
  (void)state;
  assert_string_equal(fd_status_string(FD_SUCCESS), "success");
  for (int s = 0; s <= FD_ERROR_INTERNAL; ++s) {
    const char *text = fd_status_string((fd_status)s);
    assert_non_null(text);
    assert_true(strlen(text) > 0);
    assert_string_not_equal(text, "unknown status");
  }
  assert_string_equal(fd_status_string((fd_status)12345), "unknown status");
  /* Pinned values: bindings hard-code them. */
  assert_int_equal(FD_ERROR_INVALID_SHAPE, 6);
  assert_int_equal(FD_ERROR_INVALID_HANDLE, 12);
  assert_int_equal(FD_ERROR_INTERNAL, 17);
}

static void test_create_destroy(void **state) {
  (void)state;
  fd_handle *h = (fd_handle *)0x1;
  fd_options options;
  fd_options_init(&options, sizeof options);
  assert_int_equal(options.struct_size, sizeof options);
  options.backend = FD_BACKEND_CPU;
  assert_int_equal(fd_create(&h, &options), FD_SUCCESS);
  assert_non_null(h);
  fd_backend backend = FD_BACKEND_AUTO;
  assert_int_equal(fd_get_backend(h, &backend), FD_SUCCESS);
  assert_int_equal(backend, FD_BACKEND_CPU);
  assert_int_equal(fd_destroy(h), FD_SUCCESS);
  assert_int_equal(fd_destroy(NULL), FD_SUCCESS);

  /* Defaults (NULL options) pick AUTO: the CPU on a machine without a usable GPU backend. */
  assert_int_equal(fd_create(&h, NULL), FD_SUCCESS);
  assert_int_equal(fd_get_backend(h, &backend), FD_SUCCESS);
  assert_true(backend == FD_BACKEND_CPU || backend == FD_BACKEND_CUDA);
  assert_int_equal(fd_destroy(h), FD_SUCCESS);
}

static void test_create_rejects_bad_options(void **state) {
  (void)state;
  fd_handle *h = NULL;
  assert_int_equal(fd_create(NULL, NULL), FD_ERROR_NULL_POINTER);
  assert_non_null(strstr(last_message(), "handle"));

  fd_options options;
  fd_options_init(&options, sizeof options);
  options.struct_size = 4;
  assert_int_equal(fd_create(&h, &options), FD_ERROR_INVALID_ARGUMENT);
  assert_non_null(strstr(last_message(), "struct_size"));
  assert_null(h);

  fd_options_init(&options, sizeof options);
  options.backend = (fd_backend)42;
  assert_int_equal(fd_create(&h, &options), FD_ERROR_INVALID_ARGUMENT);
  assert_non_null(strstr(last_message(), "backend"));

  fd_options_init(&options, sizeof options);
  options.backend = FD_BACKEND_CPU;
  options.num_threads = -3;
  assert_int_equal(fd_create(&h, &options), FD_ERROR_INVALID_ARGUMENT);
  assert_non_null(strstr(last_message(), "num_threads"));
  options.num_threads = FD_MAX_THREADS + 1; /* e.g. 100000 would start threads until the system refused */
  assert_int_equal(fd_create(&h, &options), FD_ERROR_INVALID_ARGUMENT);
  assert_non_null(strstr(last_message(), "num_threads must be at most 1024"));
  assert_null(h);

  fd_options_init(&options, sizeof options);
  options.backend = FD_BACKEND_CUDA;
  options.device = -1;
  assert_int_equal(fd_create(&h, &options), FD_ERROR_INVALID_ARGUMENT);
  assert_non_null(strstr(last_message(), "device"));

  /* A device ordinal no machine has. */
  options.device = 1000;
  assert_int_equal(fd_create(&h, &options), FD_ERROR_NO_DEVICE);
  assert_non_null(strstr(last_message(), "device"));
  assert_null(h);
}

static void test_old_options_struct_is_accepted(void **state) {
  (void)state;
  /* A caller compiled when fd_options ended at `backend` still works. */
  fd_options options;
  fd_options_init(&options, sizeof options);
  options.backend = FD_BACKEND_CPU;
  options.num_threads = -99; /* beyond the old struct: must be ignored */
  options.struct_size = offsetof(fd_options, backend) + sizeof options.backend;
  fd_handle *h = NULL;
  assert_int_equal(fd_create(&h, &options), FD_SUCCESS);
  assert_int_equal(fd_destroy(h), FD_SUCCESS);
}

/* The init functions write exactly the caller's struct_size bytes: an older,
 * smaller struct is never overrun, and bytes of a newer, larger one that this
 * library does not know are zeroed (the default of every later field). */
static void test_init_writes_only_struct_size(void **state) {
  (void)state;
  unsigned char buffer[sizeof(fd_decode_args) + 64];
  const size_t old_size = offsetof(fd_options, backend) + sizeof(fd_backend);
  memset(buffer, 0xab, sizeof buffer);
  assert_int_equal(fd_options_init((fd_options *)buffer, old_size), sizeof(fd_options));
  for (size_t i = old_size; i < sizeof buffer; ++i) assert_int_equal(buffer[i], 0xab);
  assert_int_equal(((fd_options *)buffer)->struct_size, old_size);

  memset(buffer, 0xab, sizeof buffer);
  const size_t new_size = sizeof(fd_decode_args) + 32;
  assert_int_equal(fd_decode_args_init((fd_decode_args *)buffer, new_size), sizeof(fd_decode_args));
  for (size_t i = sizeof(fd_decode_args); i < new_size; ++i) assert_int_equal(buffer[i], 0);
  for (size_t i = new_size; i < sizeof buffer; ++i) assert_int_equal(buffer[i], 0xab);
  assert_int_equal(((fd_decode_args *)buffer)->struct_size, new_size);

  /* NULL, or a size too small to hold struct_size, writes nothing. */
  assert_int_equal(fd_options_init(NULL, 0), sizeof(fd_options));
  memset(buffer, 0xab, sizeof buffer);
  assert_int_equal(fd_decode_args_init((fd_decode_args *)buffer, 3), sizeof(fd_decode_args));
  assert_int_equal(buffer[0], 0xab);
}

static void test_use_after_destroy(void **state) {
  fixture *f = *state;
  fd_options options;
  fd_options_init(&options, sizeof options);
  options.backend = FD_BACKEND_CPU;
  fd_handle *h = NULL;
  assert_int_equal(fd_create(&h, &options), FD_SUCCESS);
  assert_int_equal(fd_destroy(h), FD_SUCCESS);
  assert_int_equal(fd_decode(h, &f->problem.args, NULL), FD_ERROR_INVALID_HANDLE);
  assert_non_null(strstr(last_message(), "handle"));
  assert_memory_equal(f->problem.out, f->pristine_out, f->problem.out_bytes);
  assert_int_equal(fd_destroy(h), FD_ERROR_INVALID_HANDLE);
  fd_backend backend;
  assert_int_equal(fd_get_backend(h, &backend), FD_ERROR_INVALID_HANDLE);
  int not_a_handle = 0;
  assert_int_equal(fd_decode((fd_handle *)&not_a_handle, &f->problem.args, NULL), FD_ERROR_INVALID_HANDLE);
}

/* ---- forward compatibility ------------------------------------------------------ */
/* A caller compiled against a newer header passes a larger struct. The bytes
 * past this library's sizeof are fields it does not know: all zero (nothing
 * asked of them) is accepted; a non-zero byte is refused with
 * FD_ERROR_UNSUPPORTED naming the struct and the offset of the first such
 * byte (Linux's copy_struct_from_user rule), and nothing is written. The
 * structs live on the heap, exactly struct_size bytes, so that ASan sees any
 * read past them. */
enum { kNewerTail = 64 };

/* f's args in a heap block of `size` bytes, zero beyond what fits. */
static fd_decode_args *args_of_size(const fixture *f, size_t size) {
  unsigned char *block = calloc(1, size);
  memcpy(block, &f->problem.args, size < sizeof(fd_decode_args) ? size : sizeof(fd_decode_args));
  memcpy(block + offsetof(fd_decode_args, struct_size), &size,
         sizeof size); /* the block may be smaller than the type */
  return (fd_decode_args *)block;
}

static void test_newer_args_with_zero_tail_accepted(void **state) {
  fixture *f = *state;
  assert_int_equal(fd_decode(f->handle, &f->problem.args, NULL), FD_SUCCESS);
  unsigned char *expected = malloc(f->problem.out_bytes);
  memcpy(expected, f->problem.out, f->problem.out_bytes);
  size_t expected_bytes = 0;
  assert_int_equal(fd_workspace_size(f->handle, &f->problem.args, &expected_bytes), FD_SUCCESS);

  fd_decode_args *newer = args_of_size(f, sizeof(fd_decode_args) + kNewerTail);
  fdt_poison_outputs(&f->problem);
  assert_int_equal(fd_decode(f->handle, newer, NULL), FD_SUCCESS);
  assert_memory_equal(f->problem.out, expected, f->problem.out_bytes);
  size_t bytes = 0;
  assert_int_equal(fd_workspace_size(f->handle, newer, &bytes), FD_SUCCESS);
  assert_int_equal(bytes, expected_bytes);
  fd_plan_info info;
  fd_plan_info_init(&info, sizeof info);
  assert_int_equal(fd_describe_plan(f->handle, newer, &info), FD_SUCCESS);
  assert_int_equal(info.workspace_bytes, expected_bytes);
  free(newer);

  /* Through the init function, as a newer caller would fill it. */
  const size_t size = sizeof(fd_decode_args) + kNewerTail;
  fd_decode_args *inited = malloc(size);
  memset(inited, 0xab, size);
  assert_int_equal(fd_decode_args_init(inited, size), sizeof(fd_decode_args));
  inited->q = f->problem.args.q;
  inited->k = f->problem.args.k;
  inited->v = f->problem.args.v;
  inited->out = f->problem.args.out;
  inited->lse = f->problem.args.lse;
  inited->seq_lens = f->problem.args.seq_lens;
  fdt_poison_outputs(&f->problem);
  assert_int_equal(fd_decode(f->handle, inited, NULL), FD_SUCCESS);
  assert_memory_equal(f->problem.out, expected, f->problem.out_bytes);
  free(inited);
  free(expected);
}

static void test_newer_args_with_nonzero_tail_refused(void **state) {
  fixture *f = *state;
  const size_t size = sizeof(fd_decode_args) + kNewerTail;
  const size_t offsets[] = {sizeof(fd_decode_args), sizeof(fd_decode_args) + 1, sizeof(fd_decode_args) + 7,
                            sizeof(fd_decode_args) + 8, sizeof(fd_decode_args) + kNewerTail - 1};
  for (size_t i = 0; i < sizeof offsets / sizeof offsets[0]; ++i) {
    fd_decode_args *newer = args_of_size(f, size);
    unsigned char *bytes = (unsigned char *)newer;
    bytes[offsets[i]] = (unsigned char)(1u << (i % 8));
    char needle[160];
    snprintf(needle, sizeof needle, "args: fd_decode_args has a non-zero byte at offset %zu, past the %zu bytes",
             offsets[i], sizeof(fd_decode_args));
    expect_rejected(f, newer, FD_ERROR_UNSUPPORTED, needle);
    /* A later non-zero byte too: the first one is named. */
    bytes[size - 1] = 0xff;
    expect_rejected(f, newer, FD_ERROR_UNSUPPORTED, needle);
    /* Bytes past struct_size are not the caller's struct: not looked at. */
    newer->struct_size = offsets[i];
    if (offsets[i] > sizeof(fd_decode_args)) {
      assert_int_equal(fd_decode(f->handle, newer, NULL), FD_SUCCESS);
      fdt_poison_outputs(&f->problem); /* as pristine_out again */
    }
    free(newer);
  }

  /* A struct_size no header will have (an uninitialised struct) is refused
   * before any byte past the library's struct is read. */
  fd_decode_args a = f->problem.args;
  a.struct_size = 4097;
  expect_rejected(f, &a, FD_ERROR_INVALID_ARGUMENT, "args: struct_size is 4097, expected at most 4096");
  a.struct_size = SIZE_MAX;
  expect_rejected(f, &a, FD_ERROR_INVALID_ARGUMENT, "expected at most 4096 (initialise it with fd_decode_args_init)");
}

/* An older caller's smaller struct (without the trailing padding of this
 * one) still works, and only its own bytes are read. */
static void test_older_args_accepted(void **state) {
  fixture *f = *state;
  assert_int_equal(fd_decode(f->handle, &f->problem.args, NULL), FD_SUCCESS);
  unsigned char *expected = malloc(f->problem.out_bytes);
  memcpy(expected, f->problem.out, f->problem.out_bytes);
  const size_t old_size = offsetof(fd_decode_args, num_splits) + sizeof(int32_t);
  assert_true(old_size < sizeof(fd_decode_args));
  fd_decode_args *older = args_of_size(f, old_size);
  fdt_poison_outputs(&f->problem);
  assert_int_equal(fd_decode(f->handle, older, NULL), FD_SUCCESS);
  assert_memory_equal(f->problem.out, expected, f->problem.out_bytes);
  free(older);
  free(expected);
}

static void test_newer_options(void **state) {
  (void)state;
  const size_t size = sizeof(fd_options) + kNewerTail;
  fd_options *newer = malloc(size);
  memset(newer, 0xab, size);
  assert_int_equal(fd_options_init(newer, size), sizeof(fd_options));
  newer->backend = FD_BACKEND_CPU;
  newer->num_threads = 2;
  fd_handle *h = NULL;
  assert_int_equal(fd_create(&h, newer), FD_SUCCESS);
  fd_backend backend = FD_BACKEND_AUTO;
  assert_int_equal(fd_get_backend(h, &backend), FD_SUCCESS);
  assert_int_equal(backend, FD_BACKEND_CPU);
  assert_int_equal(fd_destroy(h), FD_SUCCESS);

  const size_t offsets[] = {sizeof(fd_options), sizeof(fd_options) + 3, sizeof(fd_options) + kNewerTail - 1};
  for (size_t i = 0; i < sizeof offsets / sizeof offsets[0]; ++i) {
    ((unsigned char *)newer)[offsets[i]] = 0x80;
    h = (fd_handle *)0x1;
    assert_int_equal(fd_create(&h, newer), FD_ERROR_UNSUPPORTED);
    assert_null(h); /* documented: set to NULL on failure, nothing created */
    char needle[128];
    snprintf(needle, sizeof needle, "options: fd_options has a non-zero byte at offset %zu, past the %zu bytes",
             offsets[i], sizeof(fd_options));
    if (strstr(last_message(), needle) == NULL) fail_msg("expected \"%s\", got: %s", needle, last_message());
    ((unsigned char *)newer)[offsets[i]] = 0;
  }
  newer->struct_size = 5000;
  assert_int_equal(fd_create(&h, newer), FD_ERROR_INVALID_ARGUMENT);
  assert_non_null(strstr(last_message(), "options: struct_size is 5000, expected at most 4096"));
  assert_null(h);
  free(newer);
}

/* ---- bad input: one test per rejection --------------------------------------- */
static void test_rejects_null_handle(void **state) {
  fixture *f = *state;
  assert_int_equal(fd_decode(NULL, &f->problem.args, NULL), FD_ERROR_NULL_POINTER);
  assert_non_null(strstr(last_message(), "handle is NULL"));
}

static void test_rejects_null_args(void **state) {
  fixture *f = *state;
  assert_int_equal(fd_decode(f->handle, NULL, NULL), FD_ERROR_NULL_POINTER);
  assert_non_null(strstr(last_message(), "args is NULL"));
}

static void test_rejects_bad_struct_size(void **state) {
  fixture *f = *state;
  fd_decode_args a = f->problem.args;
  a.struct_size = 8;
  expect_rejected(f, &a, FD_ERROR_INVALID_ARGUMENT, "struct_size");
}

static void test_rejects_null_tensor_data(void **state) {
  fixture *f = *state;
  const char *names[] = {"q:", "k:", "v:", "out:"};
  for (int i = 0; i < 4; ++i) {
    fd_decode_args a = f->problem.args;
    fd_tensor *t[] = {&a.q, &a.k, &a.v, &a.out};
    t[i]->data = NULL;
    expect_rejected(f, &a, FD_ERROR_NULL_POINTER, names[i]);
  }
}

static void test_rejects_unknown_dtype(void **state) {
  fixture *f = *state;
  fd_decode_args a = f->problem.args;
  a.q.dtype = (fd_dtype)9;
  expect_rejected(f, &a, FD_ERROR_INVALID_DTYPE, "q: unknown dtype 9");
}

static void test_rejects_mixed_dtypes(void **state) {
  fixture *f = *state;
  fd_decode_args a = f->problem.args;
  a.k.dtype = FD_DTYPE_BF16;
  expect_rejected(f, &a, FD_ERROR_INVALID_DTYPE, "k: dtype must be f16");
  a = f->problem.args;
  a.out.dtype = FD_DTYPE_BF16;
  expect_rejected(f, &a, FD_ERROR_INVALID_DTYPE, "out: dtype must be f16 (that of q) or f32, got bf16");
  a = f->problem.args;
  a.q.dtype = a.k.dtype = a.v.dtype = FD_DTYPE_F32; /* an f32 q allows one out dtype: f32 */
  expect_rejected(f, &a, FD_ERROR_INVALID_DTYPE, "out: dtype must be f32 (that of q), got f16");
  a = f->problem.args;
  a.q.dtype = a.k.dtype = a.v.dtype = FD_DTYPE_I32;
  expect_rejected(f, &a, FD_ERROR_INVALID_DTYPE, "q: dtype must be f32, f16 or bf16");
  a = f->problem.args;
  a.lse.dtype = FD_DTYPE_F16;
  expect_rejected(f, &a, FD_ERROR_INVALID_DTYPE, "lse: dtype must be f32");
  a = f->problem.args;
  a.seq_lens.dtype = FD_DTYPE_F32;
  expect_rejected(f, &a, FD_ERROR_INVALID_DTYPE, "seq_lens: dtype must be i32");
}

static void test_rejects_head_dim_out_of_range(void **state) {
  fixture *f = *state;
  fd_decode_args a = f->problem.args;
  a.q.shape[3] = a.k.shape[3] = a.v.shape[3] = a.out.shape[3] = 512;
  expect_rejected(f, &a, FD_ERROR_INVALID_HEAD_DIM, "head_dim must be in [1, 256], got 512");
  a.q.shape[3] = a.k.shape[3] = a.v.shape[3] = a.out.shape[3] = 0;
  expect_rejected(f, &a, FD_ERROR_INVALID_HEAD_DIM, "got 0");
}

static void test_rejects_head_counts(void **state) {
  fixture *f = *state;
  fd_decode_args a = f->problem.args;
  a.k.shape[2] = a.v.shape[2] = 3; /* 8 query heads over 3 KV heads */
  expect_rejected(f, &a, FD_ERROR_INVALID_HEAD_COUNT, "multiple of kv_heads");
  a = f->problem.args;
  a.q.shape[2] = a.out.shape[2] = 0;
  expect_rejected(f, &a, FD_ERROR_INVALID_HEAD_COUNT, "q_heads must be in");
  a = f->problem.args;
  a.q.shape[2] = a.out.shape[2] = FD_MAX_HEADS + 2;
  expect_rejected(f, &a, FD_ERROR_INVALID_HEAD_COUNT, "q_heads must be in");
  a = f->problem.args;
  a.k.shape[2] = a.v.shape[2] = 0;
  expect_rejected(f, &a, FD_ERROR_INVALID_HEAD_COUNT, "kv_heads must be in");
}

static void test_rejects_shape_mismatch(void **state) {
  fixture *f = *state;
  fd_decode_args a = f->problem.args;
  a.k.shape[3] = 32;
  expect_rejected(f, &a, FD_ERROR_INVALID_SHAPE, "k: head_dim must be 64");
  a = f->problem.args;
  a.v.shape[1] = 99;
  expect_rejected(f, &a, FD_ERROR_INVALID_SHAPE, "v: kv_capacity must be 100");
  a = f->problem.args;
  a.out.shape[2] = 4;
  expect_rejected(f, &a, FD_ERROR_INVALID_SHAPE, "out: q_heads must be 8");
  a = f->problem.args;
  a.k.shape[0] = a.v.shape[0] = 3;
  expect_rejected(f, &a, FD_ERROR_INVALID_SHAPE, "k: batch must be 2");
  a = f->problem.args;
  a.seq_lens.shape[0] = 5;
  expect_rejected(f, &a, FD_ERROR_INVALID_SHAPE, "seq_lens: batch must be 2");
  a = f->problem.args;
  a.lse.shape[2] = 1;
  expect_rejected(f, &a, FD_ERROR_INVALID_SHAPE, "lse: q_heads must be 8");
  a = f->problem.args;
  a.q.ndim = 3;
  expect_rejected(f, &a, FD_ERROR_INVALID_SHAPE, "q: ndim must be 4, got 3");
  a = f->problem.args;
  a.q.shape[0] = a.out.shape[0] = -1;
  expect_rejected(f, &a, FD_ERROR_INVALID_SHAPE, "q: shape[0] (batch) must not be negative");
  /* Stride 0 makes any batch addressable; the bound keeps sequence x head products from overflowing. */
  a = f->problem.args;
  a.q.shape[0] = (int64_t)FD_MAX_BATCH + 1;
  a.q.strides[0] = 0;
  expect_rejected(f, &a, FD_ERROR_INVALID_SHAPE, "q: batch must be at most 2147483647");
}

static void test_rejects_non_contiguous_head_dim(void **state) {
  fixture *f = *state;
  fd_decode_args a = f->problem.args;
  a.k.strides[3] = 3;
  expect_rejected(f, &a, FD_ERROR_INVALID_STRIDE, "k: stride of head_dim must be 1, got 3");
  a = f->problem.args;
  a.out.strides[3] = 2;
  expect_rejected(f, &a, FD_ERROR_INVALID_STRIDE, "out: stride of head_dim must be 1");
}

/* Outputs are written by many threads: elements that share memory would
 * race (and break bitwise determinism). Padded layouts stay valid. */
static void test_rejects_overlapping_outputs(void **state) {
  fixture *f = *state;
  fd_decode_args a = f->problem.args;
  a.out.strides[2] = 0; /* every head on one row */
  expect_rejected(f, &a, FD_ERROR_INVALID_STRIDE, "out: its strides do not nest");
  a = f->problem.args;
  a.out.strides[0] = a.out.strides[2]; /* sequence b's heads run into sequence b + 1's */
  expect_rejected(f, &a, FD_ERROR_INVALID_STRIDE, "out: its strides do not nest");
  a = f->problem.args;
  a.lse.strides[0] = 0;
  expect_rejected(f, &a, FD_ERROR_INVALID_STRIDE, "lse: its strides do not nest");
  a = f->problem.args;
  a.lse.data = (char *)a.out.data + 64; /* inside out's bytes */
  expect_rejected(f, &a, FD_ERROR_INVALID_ARGUMENT, "lse: an element shares memory with an element of out");
  /* Rows further apart than they need to be are fine (in buffers of their
   * own: outputs may not overlap the inputs). */
  a = f->problem.args;
  a.out.strides[2] *= 3;
  a.out.strides[0] *= 5;
  a.lse.strides[2] = 2;
  a.lse.strides[0] = 100;
  void *spread_out = calloc((size_t)(a.out.strides[0] * 2), 2);
  void *spread_lse = calloc(200, 4);
  a.out.data = spread_out;
  a.lse.data = spread_lse;
  assert_int_equal(fd_decode(f->handle, &a, NULL), FD_SUCCESS);
  free(spread_out);
  free(spread_lse);
  size_t bytes = 0;
  /* Inputs may overlap (broadcast a query, a shared cache): they are only read. */
  a = f->problem.args;
  a.q.strides[2] = 0;
  assert_int_equal(fd_workspace_size(f->handle, &a, &bytes), FD_SUCCESS);
}

/* out may be q itself (an in-place decode), and gives what a separate out
 * gives; any other overlap of an output with an input is refused. */
static void test_out_may_be_q_only(void **state) {
  fixture *f = *state;
  fdt_problem *p = &f->problem;
  assert_int_equal(fd_decode(f->handle, &p->args, NULL), FD_SUCCESS);
  unsigned char *expected = malloc(p->out_bytes);
  memcpy(expected, p->out, p->out_bytes);
  assert_int_equal(p->q_bytes, p->out_bytes);
  unsigned char *saved_q = malloc(p->q_bytes);
  memcpy(saved_q, p->q, p->q_bytes);
  fd_decode_args a = p->args;
  a.out = a.q;
  assert_int_equal(fd_decode(f->handle, &a, NULL), FD_SUCCESS);
  assert_memory_equal(p->q, expected, p->out_bytes);
  memcpy(p->q, saved_q, p->q_bytes);

  fdt_poison_outputs(p); /* as pristine_out, for expect_rejected */
  a = p->args;
  a.out.data = a.q.data; /* the same bytes with other strides: not in place */
  a.out.strides[0] = a.q.strides[2];
  a.out.strides[2] = a.q.strides[0] / 4;
  expect_rejected(f, &a, FD_ERROR_INVALID_ARGUMENT, "out: its bytes");
  assert_non_null(strstr(last_message(), "overlap those of input q"));
  a = p->args;
  a.out.data = p->k;
  expect_rejected(f, &a, FD_ERROR_INVALID_ARGUMENT, "overlap those of input k");
  a = p->args;
  a.lse.data = p->seq_lens;
  a.lse.shape[0] = 1; /* fits in seq_lens' bytes */
  a.out.shape[0] = a.q.shape[0] = a.k.shape[0] = a.v.shape[0] = 1;
  a.seq_lens.shape[0] = 1;
  expect_rejected(f, &a, FD_ERROR_INVALID_ARGUMENT, "lse: its bytes");
  assert_non_null(strstr(last_message(), "overlap those of input seq_lens"));
  assert_memory_equal(p->q, saved_q, p->q_bytes);
  free(saved_q);
  free(expected);
}

/* lse may live in the padding between out's rows: no element is shared. */
static void test_lse_in_out_padding(void **state) {
  fixture *f = *state;
  fdt_problem *p = &f->problem;
  assert_int_equal(fd_decode(f->handle, &p->args, NULL), FD_SUCCESS);
  const int64_t batch = 2, heads = 8, dim = 64, row = dim + 2; /* f16 rows with 4 spare bytes each */
  unsigned char *expected_out = malloc(p->out_bytes);
  unsigned char *expected_lse = malloc(p->lse_bytes);
  memcpy(expected_out, p->out, p->out_bytes);
  memcpy(expected_lse, p->lse, p->lse_bytes);
  uint16_t *padded = malloc((size_t)(batch * heads * row) * sizeof(uint16_t));
  fd_decode_args a = p->args;
  a.out.data = padded;
  a.out.strides[0] = heads * row;
  a.out.strides[1] = heads * row;
  a.out.strides[2] = row;
  a.lse.data = padded + dim; /* the spare bytes of each row */
  a.lse.strides[0] = heads * row / 2;
  a.lse.strides[1] = heads * row / 2;
  a.lse.strides[2] = row / 2;
  assert_int_equal(fd_decode(f->handle, &a, NULL), FD_SUCCESS);
  for (int64_t r = 0; r < batch * heads; ++r) {
    assert_memory_equal(padded + r * row, expected_out + r * dim * 2, (size_t)dim * 2);
    assert_memory_equal(padded + r * row + dim, expected_lse + r * 4, 4);
  }
  /* Four bytes earlier, each lse element covers out's last two elements. */
  a.lse.data = padded + dim - 2;
  assert_int_equal(fd_decode(f->handle, &a, NULL), FD_ERROR_INVALID_ARGUMENT);
  assert_non_null(strstr(last_message(), "lse: an element shares memory with an element of out"));
  free(padded);
  free(expected_out);
  free(expected_lse);
}

/* A stride of 0 broadcasts an input: every sequence reads sequence 0's
 * query, as if it had been copied. */
static void test_stride_zero_inputs(void **state) {
  fixture *f = *state;
  fdt_problem *p = &f->problem;
  fd_decode_args a = p->args;
  a.q.strides[0] = 0;
  assert_int_equal(fd_decode(f->handle, &a, NULL), FD_SUCCESS);
  unsigned char *broadcast = malloc(p->out_bytes);
  memcpy(broadcast, p->out, p->out_bytes);
  const size_t row_bytes = p->q_bytes / 2;
  memcpy((unsigned char *)p->q + row_bytes, p->q, row_bytes);
  fdt_poison_outputs(p);
  assert_int_equal(fd_decode(f->handle, &p->args, NULL), FD_SUCCESS);
  assert_memory_equal(p->out, broadcast, p->out_bytes);
  free(broadcast);
}

/* Kernels load whole elements: data must be aligned to its element size. */
static void test_rejects_misaligned_data(void **state) {
  fixture *f = *state;
  fd_decode_args a = f->problem.args;
  a.q.data = (char *)a.q.data + 1;
  expect_rejected(f, &a, FD_ERROR_INVALID_ARGUMENT, "q: data");
  assert_non_null(strstr(last_message(), "not aligned to its 2-byte f16 elements"));
  a = f->problem.args;
  a.seq_lens.data = (char *)a.seq_lens.data + 2;
  expect_rejected(f, &a, FD_ERROR_INVALID_ARGUMENT, "seq_lens: data");
  assert_non_null(strstr(last_message(), "4-byte i32"));
}

/* A k that disagrees with q is named, not the v that agrees with q. */
static void test_names_the_tensor_at_fault(void **state) {
  fixture *f = *state;
  fd_decode_args a = f->problem.args;
  a.k.shape[0] = 3;
  a.k.strides[0] = 0; /* addressable */
  expect_rejected(f, &a, FD_ERROR_INVALID_SHAPE, "k: batch must be 2 (from q), got 3");
}

static void test_rejects_negative_stride(void **state) {
  fixture *f = *state;
  fd_decode_args a = f->problem.args;
  a.v.strides[1] = -64;
  expect_rejected(f, &a, FD_ERROR_INVALID_STRIDE, "v: stride of kv_capacity must not be negative");
}

static void test_rejects_offset_overflow(void **state) {
  fixture *f = *state;
  fd_decode_args a = f->problem.args;
  a.k.strides[1] = INT64_MAX / 4;
  expect_rejected(f, &a, FD_ERROR_INVALID_STRIDE, "k: stride of kv_capacity (2305843009213693951) over 100 elements");
  /* The largest stride: one step past the first element is beyond any block. */
  a = f->problem.args;
  a.k.strides[1] = a.v.strides[1] = INT64_MAX;
  expect_rejected(f, &a, FD_ERROR_INVALID_STRIDE, "k: stride of kv_capacity");
  /* Element offsets that fit in 64 bits, byte offsets that do not: lse's
   * second sequence would be 2^64 bytes on, the address of its first. */
  a = f->problem.args;
  a.lse.strides[0] = (int64_t)1 << 62;
  expect_rejected(f, &a, FD_ERROR_INVALID_STRIDE, "lse: extent runs beyond any memory block or the address space");
  /* More than PTRDIFF_MAX bytes (2-byte elements 2^62 apart): no object is that large. */
  a = f->problem.args;
  a.k.strides[0] = a.v.strides[0] = (int64_t)1 << 62;
  expect_rejected(f, &a, FD_ERROR_INVALID_STRIDE, "k: extent runs beyond any memory block");
  /* A small tensor that would run past the end of the address space. */
  a = f->problem.args;
  a.q.data = (void *)(UINTPTR_MAX - 255);
  expect_rejected(f, &a, FD_ERROR_INVALID_STRIDE, "q: extent runs beyond any memory block or the address space");
}

static void test_rejects_oversized_capacity(void **state) {
  fixture *f = *state;
  fd_decode_args a = f->problem.args;
  a.k.shape[1] = a.v.shape[1] = (int64_t)INT32_MAX + 1;
  a.k.strides[1] = a.v.strides[1] = 0; /* keep the extent addressable */
  expect_rejected(f, &a, FD_ERROR_INVALID_LENGTH, "kv_capacity must be at most");
}

/* FD_CHECK_CONTENTS: a handle that checks what its decodes read. */
static fd_handle *checking_handle(void) {
  fd_handle *h = fdt_cpu_handle(2, FD_CHECK_CONTENTS);
  assert_non_null(h);
  return h;
}

/* Runs a decode that must be refused for its contents on a checking handle:
 * status, message, output untouched; shape queries do not read contents. */
static void expect_contents_rejected(fixture *f, const fd_decode_args *args, fd_status status, const char *needle) {
  fd_handle *checking = checking_handle();
  fd_handle *unchecked = f->handle;
  f->handle = checking;
  expect_rejected(f, args, status, needle);
  assert_int_equal(fd_check_contents(checking, NULL), FD_SUCCESS); /* the CPU reports at once: nothing left */
  f->handle = unchecked;
  assert_int_equal(fd_destroy(checking), FD_SUCCESS);
}

static void test_rejects_negative_seq_len(void **state) {
  fixture *f = *state;
  const int32_t saved = f->problem.seq_lens[1];
  f->problem.seq_lens[1] = -5;
  expect_contents_rejected(f, &f->problem.args, FD_ERROR_INVALID_LENGTH, "seq_lens[1] must be in [0, 100]");
  f->problem.seq_lens[1] = saved;
}

static void test_rejects_seq_len_beyond_cache(void **state) {
  fixture *f = *state;
  const int32_t saved = f->problem.seq_lens[0];
  f->problem.seq_lens[0] = 101;
  expect_contents_rejected(f, &f->problem.args, FD_ERROR_INVALID_LENGTH,
                           "seq_lens[0] must be in [0, 100] (the KV capacity), got 101");
  f->problem.seq_lens[0] = saved;
}

/* Unchecked, lengths are clamped to [0, kv_capacity], as on the CUDA
 * backend: 101 reads the 100 tokens there are, -5 none. */
static void test_unchecked_lengths_are_clamped(void **state) {
  fixture *f = *state;
  fdt_problem *p = &f->problem;
  p->seq_lens[0] = 100;
  p->seq_lens[1] = 0;
  assert_int_equal(fd_decode(f->handle, &p->args, NULL), FD_SUCCESS);
  unsigned char *expected_out = malloc(p->out_bytes);
  unsigned char *expected_lse = malloc(p->lse_bytes);
  memcpy(expected_out, p->out, p->out_bytes);
  memcpy(expected_lse, p->lse, p->lse_bytes);
  const int32_t bad[][2] = {{101, -5}, {INT32_MAX, INT32_MIN}};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; ++i) {
    p->seq_lens[0] = bad[i][0];
    p->seq_lens[1] = bad[i][1];
    fdt_poison_outputs(p);
    assert_int_equal(fd_decode(f->handle, &p->args, NULL), FD_SUCCESS);
    assert_memory_equal(p->out, expected_out, p->out_bytes);
    assert_memory_equal(p->lse, expected_lse, p->lse_bytes);
  }
  free(expected_out);
  free(expected_lse);
}

/* FLASHDECODE_CHECKS turns checks on for handles created while it is set;
 * unknown names and unknown option bits are refused by name. */
static void test_checks_from_options_and_environment(void **state) {
  fixture *f = *state;
  fd_handle *h = NULL;
  assert_int_equal(fd_check_contents(f->handle, NULL), FD_ERROR_INVALID_ARGUMENT);
  assert_non_null(strstr(last_message(), "handle: it checks nothing"));
  assert_int_equal(fd_check_contents(NULL, NULL), FD_ERROR_NULL_POINTER);

  fd_options options;
  fd_options_init(&options, sizeof options);
  options.backend = FD_BACKEND_CPU;
  options.checks = 0x6;
  assert_int_equal(fd_create(&h, &options), FD_ERROR_INVALID_ARGUMENT);
  assert_non_null(strstr(last_message(), "options: checks has unknown bits 0x6"));
  assert_null(h);
  options.checks = FD_CHECK_NONE;

  f->problem.seq_lens[0] = 101;
  assert_int_equal(setenv("FLASHDECODE_CHECKS", "none,contents", 1), 0);
  assert_int_equal(fd_create(&h, &options), FD_SUCCESS);
  assert_int_equal(fd_decode(h, &f->problem.args, NULL), FD_ERROR_INVALID_LENGTH);
  assert_int_equal(fd_check_contents(h, NULL), FD_SUCCESS);
  assert_int_equal(fd_destroy(h), FD_SUCCESS);
  assert_int_equal(setenv("FLASHDECODE_CHECKS", "contents,pointers", 1), 0);
  assert_int_equal(fd_create(&h, &options), FD_ERROR_INVALID_ARGUMENT);
  assert_non_null(strstr(last_message(), "FLASHDECODE_CHECKS=contents,pointers: unknown check \"pointers\""));
  assert_int_equal(setenv("FLASHDECODE_CHECKS", "", 1), 0);
  assert_int_equal(fd_create(&h, &options), FD_SUCCESS);
  assert_int_equal(fd_decode(h, &f->problem.args, NULL), FD_SUCCESS); /* clamped */
  assert_int_equal(fd_destroy(h), FD_SUCCESS);
  assert_int_equal(unsetenv("FLASHDECODE_CHECKS"), 0);
}

static void test_rejects_bad_splits(void **state) {
  fixture *f = *state;
  fd_decode_args a = f->problem.args;
  a.num_splits = -1;
  expect_rejected(f, &a, FD_ERROR_INVALID_SPLITS, "num_splits must be in [0, 1024]");
  a.num_splits = FD_MAX_SPLITS + 1;
  expect_rejected(f, &a, FD_ERROR_INVALID_SPLITS, "got 1025");
  a = f->problem.args;
  a.split_tokens = -1;
  expect_rejected(f, &a, FD_ERROR_INVALID_SPLITS, "split_tokens must be in [0, 2147483647]");
  a.split_tokens = 32;
  a.num_splits = 4;
  expect_rejected(f, &a, FD_ERROR_INVALID_SPLITS, "split_tokens (32) and num_splits (4) are both set");
  /* 5000 tokens in splits of 4 would be 1250 splits. */
  a = f->problem.args;
  a.k.shape[1] = a.v.shape[1] = 5000;
  a.k.strides[1] = a.v.strides[1] = 0;
  a.seq_lens.data = NULL;
  a.split_tokens = 4;
  expect_rejected(f, &a, FD_ERROR_INVALID_SPLITS, "into 1250 splits, more than 1024: use at least 5");
  a.split_tokens = 5;
  size_t bytes = 0;
  assert_int_equal(fd_workspace_size(f->handle, &a, &bytes), FD_SUCCESS);
}

static void test_rejects_non_finite_scale(void **state) {
  fixture *f = *state;
  fd_decode_args a = f->problem.args;
  a.softmax_scale = NAN;
  expect_rejected(f, &a, FD_ERROR_INVALID_ARGUMENT, "softmax_scale must be finite");
  a.softmax_scale = 1e300; /* finite double, infinite float */
  expect_rejected(f, &a, FD_ERROR_INVALID_ARGUMENT, "softmax_scale");
  a.softmax_scale = -3e38; /* a finite float whose product with log2(e) is not */
  expect_rejected(f, &a, FD_ERROR_INVALID_ARGUMENT, "softmax_scale -3e+38 is too large");
}

/* Several query tokens a sequence (since 0.3): valid up to FD_MAX_Q_LEN. The
 * last token of a causal decode sees what a one-token decode sees, and gets
 * bitwise its result; one token more than FD_MAX_Q_LEN is refused. */
static void test_several_query_tokens(void **state) {
  fixture *f = *state;
  assert_int_equal(fd_decode(f->handle, &f->problem.args, NULL), FD_SUCCESS);
  fd_decode_args a = f->problem.args;
  a.q.shape[1] = a.out.shape[1] = a.lse.shape[1] = 2;
  a.q.strides[1] = 0; /* one query row read twice: inputs may repeat */
  /* Two query tokens a sequence: outputs of their own with room for both. */
  unsigned char *out = malloc(2 * f->problem.out_bytes);
  float *lse = malloc(2 * f->problem.lse_bytes);
  a.out.data = out;
  a.out.strides[1] = a.out.strides[0];
  a.out.strides[0] *= 2;
  a.lse.data = lse;
  a.lse.strides[1] = a.lse.strides[0];
  a.lse.strides[0] *= 2;
  assert_int_equal(fd_decode(f->handle, &a, NULL), FD_SUCCESS);
  const size_t row_bytes = f->problem.out_bytes / 2, lse_row_bytes = f->problem.lse_bytes / 2;
  for (int b = 0; b < 2; ++b) {
    assert_memory_equal(out + (2 * b + 1) * row_bytes, (unsigned char *)f->problem.out + b * row_bytes, row_bytes);
    assert_memory_equal((unsigned char *)lse + (2 * b + 1) * lse_row_bytes,
                        (unsigned char *)f->problem.lse + b * lse_row_bytes, lse_row_bytes);
  }
  fdt_poison_outputs(&f->problem);
  memcpy(f->pristine_out, f->problem.out, f->problem.out_bytes);
  fd_decode_args too_many = f->problem.args;
  too_many.q.shape[1] = too_many.out.shape[1] = too_many.lse.shape[1] = FD_MAX_Q_LEN + 1;
  too_many.q.strides[1] = too_many.out.strides[1] = too_many.lse.strides[1] = 0;
  expect_rejected(f, &too_many, FD_ERROR_INVALID_SHAPE, "q_len must be in [1, 64]");
  free(out);
  free(lse);
}

static void test_rejects_bad_block_table(void **state) {
  fixture *f = *state;
  fdt_case c = f->problem.c;
  c.layout = FDT_PAGED_NHD;
  c.page_size = 16;
  c.ragged = 0;
  fdt_problem paged;
  assert_int_equal(fdt_problem_make(&paged, &c), 0);
  unsigned char *pristine = malloc(paged.out_bytes);
  memcpy(pristine, paged.out, paged.out_bytes);
  /* Checked: the first bad entry a sequence uses is named, nothing written. */
  fd_handle *checking = checking_handle();
  const int32_t saved = paged.block_table[3];
  paged.block_table[3] = 100000;
  assert_int_equal(fd_decode(checking, &paged.args, NULL), FD_ERROR_INVALID_BLOCK_TABLE);
  assert_non_null(strstr(last_message(), "block_table[0][3] must be in [0,"));
  paged.block_table[3] = -1;
  assert_int_equal(fd_decode(checking, &paged.args, NULL), FD_ERROR_INVALID_BLOCK_TABLE);
  assert_memory_equal(paged.out, pristine, paged.out_bytes);
  assert_int_equal(fd_destroy(checking), FD_SUCCESS);
  /* Unchecked: entries are clamped into the pool (-1 reads page 0, 100000
   * the last page), as on the CUDA backend; nothing outside k and v is read. */
  const int32_t last_page = (int32_t)paged.args.k.shape[0] - 1;
  const int32_t substitutes[][2] = {{-1, 0}, {100000, last_page}};
  unsigned char *expected = malloc(paged.out_bytes);
  for (size_t i = 0; i < 2; ++i) {
    paged.block_table[3] = substitutes[i][1];
    assert_int_equal(fd_decode(f->handle, &paged.args, NULL), FD_SUCCESS);
    memcpy(expected, paged.out, paged.out_bytes);
    paged.block_table[3] = substitutes[i][0];
    fdt_poison_outputs(&paged);
    assert_int_equal(fd_decode(f->handle, &paged.args, NULL), FD_SUCCESS);
    assert_memory_equal(paged.out, expected, paged.out_bytes);
  }
  free(expected);
  paged.block_table[3] = saved;
  fdt_poison_outputs(&paged);
  /* A block table of the wrong width or dtype, or pages of size 0. */
  fd_decode_args a = paged.args;
  a.block_table.shape[0] = 1;
  assert_int_equal(fd_decode(f->handle, &a, NULL), FD_ERROR_INVALID_SHAPE);
  assert_non_null(strstr(last_message(), "block_table: batch must be 2"));
  a = paged.args;
  a.block_table.dtype = FD_DTYPE_F32;
  assert_int_equal(fd_decode(f->handle, &a, NULL), FD_ERROR_INVALID_DTYPE);
  a = paged.args;
  a.k.shape[1] = a.v.shape[1] = 0;
  assert_int_equal(fd_decode(f->handle, &a, NULL), FD_ERROR_INVALID_LENGTH);
  assert_non_null(strstr(last_message(), "page_size must be at least 1"));
  assert_memory_equal(paged.out, pristine, paged.out_bytes);
  free(pristine);
  fdt_problem_free(&paged);
}

/* ---- workspace ------------------------------------------------------------------- */
static void test_workspace_size_and_caller_memory(void **state) {
  fixture *f = *state;
  size_t bytes = 0;
  assert_int_equal(fd_workspace_size(f->handle, &f->problem.args, &bytes), FD_SUCCESS);
  assert_true(bytes > 0);
  assert_int_equal(fd_workspace_size(f->handle, &f->problem.args, NULL), FD_ERROR_NULL_POINTER);

  /* More splits need more workspace. */
  fd_decode_args a = f->problem.args;
  a.num_splits = 1;
  size_t one = 0, many = 0;
  assert_int_equal(fd_workspace_size(f->handle, &a, &one), FD_SUCCESS);
  a.num_splits = 64;
  assert_int_equal(fd_workspace_size(f->handle, &a, &many), FD_SUCCESS);
  assert_true(many > one);

  /* Too small a caller buffer is refused and nothing is written. */
  void *small = aligned_alloc(256, 256);
  assert_int_equal(fd_set_workspace(f->handle, small, 256), FD_SUCCESS);
  expect_rejected(f, &f->problem.args, FD_ERROR_WORKSPACE_TOO_SMALL, "workspace");
  assert_int_equal(fd_reserve_workspace(f->handle, bytes), FD_ERROR_WORKSPACE_TOO_SMALL);

  /* Misaligned memory is refused. */
  assert_int_equal(fd_set_workspace(f->handle, (char *)small + 4, 252), FD_ERROR_INVALID_ARGUMENT);
  assert_non_null(strstr(last_message(), "aligned"));

  /* A large enough caller buffer works and gives the same bits as library-owned memory. */
  void *big = aligned_alloc(256, (bytes + 255) / 256 * 256);
  assert_int_equal(fd_set_workspace(f->handle, big, bytes), FD_SUCCESS);
  assert_int_equal(fd_decode(f->handle, &f->problem.args, NULL), FD_SUCCESS);
  unsigned char *with_caller = malloc(f->problem.out_bytes);
  memcpy(with_caller, f->problem.out, f->problem.out_bytes);
  assert_int_equal(fd_set_workspace(f->handle, NULL, 0), FD_SUCCESS);
  assert_int_equal(fd_reserve_workspace(f->handle, bytes), FD_SUCCESS);
  fdt_poison_outputs(&f->problem);
  assert_int_equal(fd_decode(f->handle, &f->problem.args, NULL), FD_SUCCESS);
  assert_memory_equal(f->problem.out, with_caller, f->problem.out_bytes);
  free(with_caller);
  free(big);
  free(small);
  fdt_poison_outputs(&f->problem);
}

/* Decodes f's problem on f's handle and checks the result against the
 * reference: after a refused workspace call the handle must still work. */
static void expect_decode_correct(fd_handle *handle, fdt_problem *problem) {
  fdt_poison_outputs(problem);
  assert_int_equal(fd_decode(handle, &problem->args, NULL), FD_SUCCESS);
  char report[256];
  if (fdt_check(problem, report, sizeof report, NULL, NULL) != 0) fail_msg("decode after a refusal: %s", report);
}

/* Sizes no allocator can satisfy are refused with OUT_OF_MEMORY before any
 * allocator sees them: GCC's aligned operator new rounds a size up to the
 * 256-byte alignment, which wraps for n > SIZE_MAX - 255 and gives a tiny
 * block the handle took for n bytes. The handle keeps its workspace, and
 * decodes on it still run (under ASan: without writing out of bounds). */
static void test_reserve_refuses_impossible_sizes(void **state) {
  fixture *f = *state;
  const size_t impossible[] = {SIZE_MAX,           SIZE_MAX - 1,   SIZE_MAX - 254,
                               SIZE_MAX - 255,     SIZE_MAX - 256, (size_t)PTRDIFF_MAX + 1,
                               (size_t)PTRDIFF_MAX};
  for (size_t i = 0; i < sizeof impossible / sizeof impossible[0]; ++i) {
    /* On a handle without workspace yet: this was the heap overflow. */
    fd_options options;
    fd_options_init(&options, sizeof options);
    options.backend = FD_BACKEND_CPU;
    options.num_threads = 2;
    fd_handle *fresh = NULL;
    assert_int_equal(fd_create(&fresh, &options), FD_SUCCESS);
    assert_int_equal(fd_reserve_workspace(fresh, impossible[i]), FD_ERROR_OUT_OF_MEMORY);
    assert_non_null(strstr(last_message(), "workspace: "));
    assert_non_null(strstr(last_message(), "more than any allocator can provide"));
    expect_decode_correct(fresh, &f->problem);
    assert_int_equal(fd_destroy(fresh), FD_SUCCESS);

    /* On a handle that has one. */
    expect_decode_correct(f->handle, &f->problem);
    assert_int_equal(fd_reserve_workspace(f->handle, impossible[i]), FD_ERROR_OUT_OF_MEMORY);
    expect_decode_correct(f->handle, &f->problem);
  }

  /* Huge but representable: the allocator itself refuses 4 EiB. */
  assert_int_equal(fd_reserve_workspace(f->handle, (size_t)1 << 62), FD_ERROR_OUT_OF_MEMORY);
  assert_non_null(strstr(last_message(), "workspace: allocating 4611686018427387904 bytes"));
  expect_decode_correct(f->handle, &f->problem);
  /* Reserving what the decode needs still works afterwards. */
  size_t bytes = 0;
  assert_int_equal(fd_workspace_size(f->handle, &f->problem.args, &bytes), FD_SUCCESS);
  assert_int_equal(fd_reserve_workspace(f->handle, bytes), FD_SUCCESS);
  expect_decode_correct(f->handle, &f->problem);
}

/* The shape: B=8, H=8, N=1024, D=128 after fd_reserve_workspace(SIZE_MAX). */
static void test_reserve_then_decode_larger_problem(void **state) {
  (void)state;
  fdt_case c = {0};
  c.batch = 8;
  c.q_heads = 8;
  c.kv_heads = 8;
  c.head_dim = 128;
  c.kv_len = 1024;
  c.dtype = FD_DTYPE_F32;
  c.out_dtype = FD_DTYPE_F32;
  c.seed = 11;
  fdt_problem problem;
  assert_int_equal(fdt_problem_make(&problem, &c), 0);
  fd_options options;
  fd_options_init(&options, sizeof options);
  options.backend = FD_BACKEND_CPU;
  fd_handle *h = NULL;
  assert_int_equal(fd_create(&h, &options), FD_SUCCESS);
  const size_t sizes[] = {SIZE_MAX, SIZE_MAX - 255, SIZE_MAX - 256};
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; ++i) {
    assert_int_equal(fd_reserve_workspace(h, sizes[i]), FD_ERROR_OUT_OF_MEMORY);
    expect_decode_correct(h, &problem);
  }
  assert_int_equal(fd_destroy(h), FD_SUCCESS);
  fdt_problem_free(&problem);
}

/* Caller memory that no block can be is refused as an invalid argument (the
 * library allocates nothing here), and the handle keeps its own workspace. */
static void test_set_workspace_refuses_impossible_sizes(void **state) {
  fixture *f = *state;
  void *memory = aligned_alloc(256, 256);
  assert_int_equal(fd_set_workspace(f->handle, memory, SIZE_MAX), FD_ERROR_INVALID_ARGUMENT);
  assert_non_null(strstr(last_message(), "workspace: 18446744073709551615 bytes is larger than any memory block"));
  assert_int_equal(fd_set_workspace(f->handle, memory, SIZE_MAX - 255), FD_ERROR_INVALID_ARGUMENT);
  assert_int_equal(fd_set_workspace(f->handle, memory, (size_t)PTRDIFF_MAX + 1), FD_ERROR_INVALID_ARGUMENT);
  /* A block that would run past the end of the address space. */
  void *last_page = (void *)(UINTPTR_MAX - 4095);
  assert_int_equal(fd_set_workspace(f->handle, last_page, 8192), FD_ERROR_INVALID_ARGUMENT);
  assert_non_null(strstr(last_message(), "run past the end of the address space"));
  expect_decode_correct(f->handle, &f->problem);
  /* The handle kept library-owned memory: it still grows on demand. */
  fd_decode_args a = f->problem.args;
  a.num_splits = 64;
  assert_int_equal(fd_decode(f->handle, &a, NULL), FD_SUCCESS);
  free(memory);
}

/* ---- thread-local errors ----------------------------------------------------------- */
typedef struct thread_job {
  fixture *f;
  int num_splits;
  char message[512];
  fd_status status;
} thread_job;

static void *provoke_error(void *arg) {
  thread_job *job = arg;
  fd_decode_args a = job->f->problem.args;
  a.num_splits = job->num_splits;
  for (int i = 0; i < 200; ++i) {
    job->status = fd_workspace_size(job->f->handle, &a, &(size_t){0});
    fd_last_error_message(job->message, sizeof job->message);
  }
  return NULL;
}

static void test_error_messages_are_thread_local(void **state) {
  fixture *f = *state;
  thread_job a = {f, -7, {0}, FD_SUCCESS}, b = {f, 5000, {0}, FD_SUCCESS};
  pthread_t ta, tb;
  /* fd_workspace_size on one handle from two threads is read-only and allowed. */
  assert_int_equal(pthread_create(&ta, NULL, provoke_error, &a), 0);
  assert_int_equal(pthread_create(&tb, NULL, provoke_error, &b), 0);
  pthread_join(ta, NULL);
  pthread_join(tb, NULL);
  assert_int_equal(a.status, FD_ERROR_INVALID_SPLITS);
  assert_int_equal(b.status, FD_ERROR_INVALID_SPLITS);
  assert_non_null(strstr(a.message, "got -7"));
  assert_non_null(strstr(b.message, "got 5000"));
  /* The main thread's message is its own. */
  assert_int_equal(fd_decode(NULL, NULL, NULL), FD_ERROR_NULL_POINTER);
  assert_non_null(strstr(last_message(), "handle is NULL"));
}

static void test_error_message_truncation(void **state) {
  (void)state;
  assert_int_equal(fd_decode(NULL, NULL, NULL), FD_ERROR_NULL_POINTER);
  const size_t full = fd_last_error_message(NULL, 0);
  assert_true(full > 5);
  char small[6];
  assert_int_equal(fd_last_error_message(small, sizeof small), full);
  assert_int_equal(strlen(small), 5);
}

/* ---- plans ------------------------------------------------------------------------ */
/* fd_describe_plan reports the plan fd_decode runs: on the CPU backend a task
 * per (sequence, KV head, split) and a merge pass, no launches. */
static void test_describe_plan(void **state) {
  fixture *f = *state;
  fd_plan_info info;
  assert_int_equal(fd_plan_info_init(&info, sizeof info), sizeof(fd_plan_info));
  assert_int_equal(info.struct_size, sizeof info);
  assert_string_equal(info.kernel, "");
  assert_int_equal(fd_describe_plan(f->handle, &f->problem.args, &info), FD_SUCCESS);
  size_t bytes = 0;
  assert_int_equal(fd_workspace_size(f->handle, &f->problem.args, &bytes), FD_SUCCESS);
  assert_int_equal(info.struct_size, sizeof info);
  assert_int_equal(info.backend, FD_BACKEND_CPU);
  assert_string_equal(info.kernel, "cpu");
  assert_int_equal(info.merge, FD_MERGE_SEPARATE);
  assert_int_equal(info.launches, 0);
  assert_int_equal(info.workspace_bytes, bytes);
  assert_true(info.num_splits >= 1);
  assert_true(info.split_tokens * info.num_splits >= 100 && info.split_tokens * (info.num_splits - 1) < 100);
  assert_int_equal(info.blocks, 2 * 2 * info.num_splits); /* batch x kv_heads x splits */
  assert_int_equal(info.schedule, FD_SCHEDULE_FIXED);
  /* Pinned values: bindings hard-code them. */
  assert_int_equal(FD_SCHEDULE_LONGEST_FIRST, 1);
  assert_int_equal(FD_SCHEDULE_FITTED, 2);
  assert_int_equal(FD_SCHEDULE_BALANCED, 3);

  /* A requested split count is kept, and the workspace grows with it. */
  fd_decode_args a = f->problem.args;
  a.num_splits = 7;
  info.schedule = (fd_schedule)77; /* written by every call */
  assert_int_equal(fd_describe_plan(f->handle, &a, &info), FD_SUCCESS);
  assert_int_equal(info.schedule, FD_SCHEDULE_FIXED);
  assert_int_equal(info.num_splits, 7);
  assert_int_equal(info.split_tokens, 15); /* ceil(100 / 7) */
  assert_int_equal(info.blocks, 2 * 2 * 7);
  assert_int_equal(fd_workspace_size(f->handle, &a, &bytes), FD_SUCCESS);
  assert_int_equal(info.workspace_bytes, bytes);

  /* The handle is not changed: a caller workspace far too small for the
   * decode is not looked at. */
  void *small = aligned_alloc(256, 256);
  assert_int_equal(fd_set_workspace(f->handle, small, 256), FD_SUCCESS);
  assert_int_equal(fd_describe_plan(f->handle, &a, &info), FD_SUCCESS);
  assert_int_equal(fd_set_workspace(f->handle, NULL, 0), FD_SUCCESS);
  free(small);

  /* An empty batch launches nothing. */
  a = f->problem.args;
  a.q.shape[0] = a.k.shape[0] = a.v.shape[0] = a.out.shape[0] = a.lse.shape[0] = a.seq_lens.shape[0] = 0;
  assert_int_equal(fd_describe_plan(f->handle, &a, &info), FD_SUCCESS);
  assert_int_equal(info.blocks, 0);
  assert_int_equal(info.launches, 0);
  assert_int_equal(info.merge, FD_MERGE_NONE);
  assert_int_equal(info.schedule, FD_SCHEDULE_FIXED);
}

/* The output struct is versioned like the inputs: an older, smaller struct
 * gets only its own bytes; a NULL or uninitialised one is refused. */
static void test_describe_plan_struct_size(void **state) {
  fixture *f = *state;
  unsigned char buffer[sizeof(fd_plan_info) + 32];
  const size_t old_size = offsetof(fd_plan_info, kernel);
  memset(buffer, 0xab, sizeof buffer);
  assert_int_equal(fd_plan_info_init((fd_plan_info *)buffer, old_size), sizeof(fd_plan_info));
  assert_int_equal(fd_describe_plan(f->handle, &f->problem.args, (fd_plan_info *)buffer), FD_SUCCESS);
  for (size_t i = old_size; i < sizeof buffer; ++i) assert_int_equal(buffer[i], 0xab);
  fd_plan_info old;
  memcpy(&old, buffer, old_size);
  assert_int_equal(old.struct_size, old_size);
  assert_int_equal(old.backend, FD_BACKEND_CPU);
  assert_true(old.num_splits >= 1);

  /* A 0.2 caller's struct ends before schedule (0.3): its bytes are all it gets. */
  const size_t v02_size = offsetof(fd_plan_info, schedule);
  memset(buffer, 0xab, sizeof buffer);
  assert_int_equal(fd_plan_info_init((fd_plan_info *)buffer, v02_size), sizeof(fd_plan_info));
  assert_int_equal(fd_describe_plan(f->handle, &f->problem.args, (fd_plan_info *)buffer), FD_SUCCESS);
  for (size_t i = v02_size; i < sizeof buffer; ++i) assert_int_equal(buffer[i], 0xab);

  assert_int_equal(fd_describe_plan(f->handle, &f->problem.args, NULL), FD_ERROR_NULL_POINTER);
  assert_non_null(strstr(last_message(), "info"));
  fd_plan_info info;
  memset(&info, 0xab, sizeof info);
  info.struct_size = 3;
  fd_plan_info pristine = info;
  assert_int_equal(fd_describe_plan(f->handle, &f->problem.args, &info), FD_ERROR_INVALID_ARGUMENT);
  assert_non_null(strstr(last_message(), "fd_plan_info_init"));
  assert_memory_equal(&info, &pristine, sizeof info); /* nothing written, struct_size included */
  fd_plan_info_init(&info, sizeof info);
  assert_int_equal(fd_describe_plan(NULL, &f->problem.args, &info), FD_ERROR_NULL_POINTER);
  assert_int_equal(fd_describe_plan(f->handle, NULL, &info), FD_ERROR_NULL_POINTER);
  assert_int_equal(info.num_splits, 0);
}

static void test_empty_batch_is_a_no_op(void **state) {
  fixture *f = *state;
  fd_decode_args a = f->problem.args;
  a.q.shape[0] = a.k.shape[0] = a.v.shape[0] = a.out.shape[0] = a.lse.shape[0] = a.seq_lens.shape[0] = 0;
  assert_int_equal(fd_decode(f->handle, &a, NULL), FD_SUCCESS);
  assert_memory_equal(f->problem.out, f->pristine_out, f->problem.out_bytes);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_version),
      cmocka_unit_test(test_status_strings),
      cmocka_unit_test(test_create_destroy),
      cmocka_unit_test(test_create_rejects_bad_options),
      cmocka_unit_test(test_old_options_struct_is_accepted),
      cmocka_unit_test(test_init_writes_only_struct_size),
      cmocka_unit_test(test_newer_options),
      cmocka_unit_test(test_error_message_truncation),
      cmocka_unit_test_setup_teardown(test_use_after_destroy, setup, teardown),
      cmocka_unit_test_setup_teardown(test_rejects_null_handle, setup, teardown),
      cmocka_unit_test_setup_teardown(test_rejects_null_args, setup, teardown),
      cmocka_unit_test_setup_teardown(test_rejects_bad_struct_size, setup, teardown),
      cmocka_unit_test_setup_teardown(test_newer_args_with_zero_tail_accepted, setup, teardown),
      cmocka_unit_test_setup_teardown(test_newer_args_with_nonzero_tail_refused, setup, teardown),
      cmocka_unit_test_setup_teardown(test_older_args_accepted, setup, teardown),
      cmocka_unit_test_setup_teardown(test_rejects_null_tensor_data, setup, teardown),
      cmocka_unit_test_setup_teardown(test_rejects_unknown_dtype, setup, teardown),
      cmocka_unit_test_setup_teardown(test_rejects_mixed_dtypes, setup, teardown),
      cmocka_unit_test_setup_teardown(test_rejects_head_dim_out_of_range, setup, teardown),
      cmocka_unit_test_setup_teardown(test_rejects_head_counts, setup, teardown),
      cmocka_unit_test_setup_teardown(test_rejects_shape_mismatch, setup, teardown),
      cmocka_unit_test_setup_teardown(test_rejects_non_contiguous_head_dim, setup, teardown),
      cmocka_unit_test_setup_teardown(test_rejects_overlapping_outputs, setup, teardown),
      cmocka_unit_test_setup_teardown(test_out_may_be_q_only, setup, teardown),
      cmocka_unit_test_setup_teardown(test_lse_in_out_padding, setup, teardown),
      cmocka_unit_test_setup_teardown(test_stride_zero_inputs, setup, teardown),
      cmocka_unit_test_setup_teardown(test_rejects_misaligned_data, setup, teardown),
      cmocka_unit_test_setup_teardown(test_names_the_tensor_at_fault, setup, teardown),
      cmocka_unit_test_setup_teardown(test_rejects_negative_stride, setup, teardown),
      cmocka_unit_test_setup_teardown(test_rejects_offset_overflow, setup, teardown),
      cmocka_unit_test_setup_teardown(test_rejects_oversized_capacity, setup, teardown),
      cmocka_unit_test_setup_teardown(test_rejects_negative_seq_len, setup, teardown),
      cmocka_unit_test_setup_teardown(test_rejects_seq_len_beyond_cache, setup, teardown),
      cmocka_unit_test_setup_teardown(test_unchecked_lengths_are_clamped, setup, teardown),
      cmocka_unit_test_setup_teardown(test_checks_from_options_and_environment, setup, teardown),
      cmocka_unit_test_setup_teardown(test_rejects_bad_splits, setup, teardown),
      cmocka_unit_test_setup_teardown(test_rejects_non_finite_scale, setup, teardown),
      cmocka_unit_test_setup_teardown(test_several_query_tokens, setup, teardown),
      cmocka_unit_test_setup_teardown(test_rejects_bad_block_table, setup, teardown),
      cmocka_unit_test_setup_teardown(test_workspace_size_and_caller_memory, setup, teardown),
      cmocka_unit_test_setup_teardown(test_reserve_refuses_impossible_sizes, setup, teardown),
      cmocka_unit_test(test_reserve_then_decode_larger_problem),
      cmocka_unit_test_setup_teardown(test_set_workspace_refuses_impossible_sizes, setup, teardown),
      cmocka_unit_test_setup_teardown(test_error_messages_are_thread_local, setup, teardown),
      cmocka_unit_test_setup_teardown(test_empty_batch_is_a_no_op, setup, teardown),
      cmocka_unit_test_setup_teardown(test_describe_plan, setup, teardown),
      cmocka_unit_test_setup_teardown(test_describe_plan_struct_size, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
