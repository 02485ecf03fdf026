// SPDX-License-Identifier: Apache-2.0
/* libFuzzer harness for fd_append_kv and fd_merge_states on the CPU backend
 * (tests/fuzz/README.md). The first byte picks the call.
 *
 * fd_append_kv: dtypes (new values f32/f16/bf16, any cache dtype), batch,
 * new tokens, heads, head_dim, a dense cache or a page pool (page size, the
 * table's columns, pool size; table entries valid, shared, or outside the
 * pool), lengths (in range or not: clamped), per-tensor, per-head or
 * per-token scales of 8-bit caches (zeros, huge and negative ones among
 * them), non-finite and saturating new values, and each tensor's layout.
 * The expected cache is built from its old bytes by the header's rule
 * (fdt_append_store); where two sequences' tables select the same element,
 * either writer's value may land.
 *
 * fd_merge_states: 1-64 states of any float dtype and layout (broadcast
 * ones too), LSEs with -inf (empty parts, whose outputs hold NaN), NaN and
 * +inf among them, an optional lse, and in-place merges (out a state's
 * output, lse a state's LSE). Checked against a float64 merge.
 *
 * For both: about one input in four gets one invalid field, with the status
 * it must produce; a failing call sets a message and writes nothing; no
 * input changes; a successful call writes exactly its elements. Any
 * violation prints the problem and aborts: libFuzzer saves the input. */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fdt.h"
#include "flashdecode.h"
#include "fuzz_support.h"

const char *fuzz_name = "fuzz_cache";
static int verbose = -1; /* FUZZ_CACHE_VERBOSE=1: every input's problem and status on stderr */

static const fd_dtype kFloatDtypes[3] = {FD_DTYPE_F32, FD_DTYPE_F16, FD_DTYPE_BF16};
static const fd_dtype kCacheDtypes[6] = {FD_DTYPE_F32,  FD_DTYPE_F16,  FD_DTYPE_BF16,
                                         FD_DTYPE_E4M3, FD_DTYPE_E5M2, FD_DTYPE_I8};

static int64_t elements_of(const fd_tensor *t) {
  int64_t n = 1;
  for (int d = 0; d < t->ndim; ++d) n *= t->shape[d];
  return n;
}

/* A tensor of `shape` laid out by the bytes over a buffer of exactly the
 * elements it reaches, every byte random. */
static fd_tensor make_tensor(input *in, fdt_rng *rng, buffer *b, fd_dtype dtype, int ndim, const int64_t *shape,
                             int contiguous_last, int may_broadcast) {
  int64_t strides[FD_MAX_DIMS] = {0};
  const int64_t elements = lay_out(in, ndim, shape, strides, contiguous_last, may_broadcast);
  buffer_alloc(b, elements, fdt_dtype_size(dtype), 0);
  for (size_t i = 0; i < b->size; ++i) b->bytes[i] = (unsigned char)fdt_next(rng);
  return fdt_tensor(b->bytes, dtype, ndim, shape, strides);
}

/* Whether a dimension of extent > 1 has stride 0 (elements share memory). */
static int broadcasts(const fd_tensor *t) {
  for (int d = 0; d < t->ndim; ++d)
    if (t->shape[d] > 1 && t->strides[d] == 0) return 1;
  return 0;
}

/* A new value: mostly moderate, down to the 8-bit formats' subnormals, with
 * saturating, infinite and NaN ones. */
static double new_value(fdt_rng *rng) {
  const double u = fdt_uniform(rng, 0.0, 1.0);
  if (u < 1.0 / 64) return NAN;
  if (u < 2.0 / 64) return u < 1.5 / 64 ? INFINITY : -INFINITY;
  if (u < 4.0 / 64) return fdt_uniform(rng, -1e6, 1e6);
  return fdt_uniform(rng, -8.0, 8.0) * ldexp(1.0, (int)fdt_int(rng, -12, 4));
}

/* A scale: mostly moderate, with zeros, huge, tiny and negative ones. */
static float scale_value(fdt_rng *rng) {
  const double u = fdt_uniform(rng, 0.0, 1.0);
  if (u < 1.0 / 8) return 0.0f;
  if (u < 3.0 / 16) return 1e30f;
  if (u < 4.0 / 16) return 1e-30f;
  if (u < 5.0 / 16) return -(float)fdt_uniform(rng, 0.01, 4.0);
  return (float)fdt_uniform(rng, 0.01, 4.0);
}

/* Grows or shrinks extent d by one (a stride that a second index would
 * overflow becomes 1): the tensor then disagrees with the others. */
static void change_extent(fd_tensor *t, int d) {
  if (t->shape[d] > 0) {
    t->shape[d] -= 1;
  } else {
    t->shape[d] = 1;
  }
  if (t->shape[d] > 1 && t->strides[d] > (int64_t)1 << 20) t->strides[d] = 1;
}

/* The struct-size mutations both calls share: too small or above 4096
 * (FD_ERROR_INVALID_ARGUMENT), or a newer caller's non-zero field
 * (FD_ERROR_UNSUPPORTED). `raw` is the caller's struct of `size` bytes
 * (this header's) plus 32 of a newer caller's. */
static fd_status mutate_struct_size(input *in, unsigned char *raw, size_t size, size_t required, const char **what) {
  size_t struct_size;
  if (take(in, 2)) {
    const size_t sizes[] = {0, sizeof(size_t), required - 1, 4097, SIZE_MAX};
    struct_size = sizes[take(in, 5)];
    memcpy(raw, &struct_size, sizeof struct_size);
    *what = "args.struct_size too small or above 4096";
    return FD_ERROR_INVALID_ARGUMENT;
  }
  struct_size = size + 32;
  memcpy(raw, &struct_size, sizeof struct_size);
  raw[size + take(in, 32)] = (unsigned char)(1 + take(in, 255));
  *what = "a non-zero byte past the struct (a newer caller's field)";
  return FD_ERROR_UNSUPPORTED;
}

/* ==== fd_append_kv ================================================================ */
typedef struct append_case {
  fd_dtype new_dtype, cache_dtype;
  int64_t batch, new_len, kv_heads, head_dim, capacity, page_size, max_pages, num_pages;
  int paged;
  buffer k_new, v_new, k, v, k_scale, v_scale, seq_lens, block_table;
  union {
    fd_append_args args;
    unsigned char raw[sizeof(fd_append_args) + 32]; /* a newer caller's longer struct */
  } call;
  fd_status expect;
  const char *mutation;
} append_case;

/* A scale tensor over the cache's first three dimensions: per tensor
 * (strides 0), per KV head, or per token and head (any layout). */
static fd_tensor make_scale(input *in, fdt_rng *rng, buffer *b, const int64_t *cache_shape) {
  const unsigned mode = take(in, 3);
  int64_t strides[3] = {0, 0, 0};
  int64_t elements = 1;
  if (mode == 1) {
    strides[2] = 1;
    elements = cache_shape[2];
  } else if (mode == 2) {
    elements = lay_out(in, 3, cache_shape, strides, 0, 0);
  }
  buffer_alloc(b, elements, sizeof(float), 0);
  for (int64_t i = 0; i < elements; ++i) ((float *)b->bytes)[i] = scale_value(rng);
  return fdt_tensor(b->bytes, FD_DTYPE_F32, 3, cache_shape, strides);
}

static void make_append(input *in, fdt_rng *rng, append_case *c) {
  c->new_dtype = kFloatDtypes[take(in, 3)];
  c->cache_dtype = kCacheDtypes[take(in, 6)];
  c->batch = take(in, 5);
  c->new_len = take(in, 6);
  c->kv_heads = 1 + take(in, 3);
  c->head_dim = take(in, 4) ? 1 + take(in, 16) : 24 + 8 * take(in, 4);
  c->paged = (int)take(in, 2);
  int64_t cache_shape[4];
  if (c->paged) {
    c->page_size = 1 + take(in, 6);
    c->max_pages = take(in, 4);
    c->num_pages = 1 + take(in, 8);
    c->capacity = c->max_pages * c->page_size;
    cache_shape[0] = c->num_pages;
    cache_shape[1] = c->page_size;
  } else {
    c->capacity = take(in, 9);
    cache_shape[0] = c->batch;
    cache_shape[1] = c->capacity;
  }
  cache_shape[2] = c->kv_heads;
  cache_shape[3] = c->head_dim;
  const int64_t new_shape[4] = {c->batch, c->new_len, c->kv_heads, c->head_dim};

  fd_append_args *a = &c->call.args;
  fd_append_args_init(a, sizeof *a);
  buffer *news[2] = {&c->k_new, &c->v_new};
  fd_tensor *new_tensors[2] = {&a->k_new, &a->v_new};
  for (int i = 0; i < 2; ++i) {
    *new_tensors[i] = make_tensor(in, rng, news[i], c->new_dtype, 4, new_shape, 1, 1);
    for (int64_t e = 0; e < news[i]->elements; ++e) fdt_store(c->new_dtype, news[i]->bytes, e, new_value(rng));
  }
  a->k = make_tensor(in, rng, &c->k, c->cache_dtype, 4, cache_shape, 1, 0);
  a->v = make_tensor(in, rng, &c->v, c->cache_dtype, 4, cache_shape, 1, 0);
  if (take(in, 2)) {
    const int64_t shape[1] = {c->batch};
    a->seq_lens = make_tensor(in, rng, &c->seq_lens, FD_DTYPE_I32, 1, shape, 0, 1);
    for (int64_t e = 0; e < c->seq_lens.elements; ++e) {
      const double u = fdt_uniform(rng, 0.0, 1.0);
      const int64_t len = u < 0.8    ? fdt_int(rng, 0, c->capacity)
                          : u < 0.95 ? fdt_int(rng, -3, c->capacity + 3)
                                     : (u < 0.975 ? INT32_MAX : INT32_MIN);
      fdt_store(FD_DTYPE_I32, c->seq_lens.bytes, e, (double)len);
    }
  }
  if (c->paged) {
    const int64_t shape[2] = {c->batch, c->max_pages};
    a->block_table = make_tensor(in, rng, &c->block_table, FD_DTYPE_I32, 2, shape, 0, 1);
    const unsigned mode = take(in, 4); /* 0 random, 1 with entries outside the pool, 2 one page, 3 distinct */
    static const int64_t outside[] = {-1, INT32_MIN, INT32_MAX, 0 /* num_pages */};
    for (int64_t e = 0; e < c->block_table.elements; ++e) {
      int64_t page = fdt_int(rng, 0, c->num_pages - 1);
      if (mode == 1 && fdt_int(rng, 0, 3) == 0) {
        page = outside[fdt_int(rng, 0, 3)];
        if (page == 0) page = c->num_pages;
      }
      if (mode == 2) page = 0;
      if (mode == 3) page = e % c->num_pages;
      fdt_store(FD_DTYPE_I32, c->block_table.bytes, e, (double)page);
    }
  }
  if (fdt_is_quantized(c->cache_dtype)) {
    if (take(in, 2)) a->k_scale = make_scale(in, rng, &c->k_scale, cache_shape);
    if (take(in, 2)) a->v_scale = make_scale(in, rng, &c->v_scale, cache_shape);
  }
  c->expect = FD_SUCCESS;
  c->mutation = NULL;
}

enum {
  APPEND_NULL_DATA,
  APPEND_DTYPE,
  APPEND_NDIM,
  APPEND_NEGATIVE_STRIDE,
  APPEND_HEAD_DIM_STRIDE,
  APPEND_EXTENT,
  APPEND_CACHE_OVERLAP,
  APPEND_CACHE_OVER_INPUT,
  APPEND_STRUCT_SIZE,
  APPEND_PAGE_SIZE,
  APPEND_BATCH,
  APPEND_NEW_LEN,
  APPEND_SCALE,
  APPEND_INDEX_DTYPE,
  APPEND_MUTATIONS
};

/* Makes one field of c invalid (`which`), with the status it must give;
 * returns 0 where that field cannot be made invalid here. */
static int mutate_append(input *in, append_case *c, unsigned which) {
  fd_append_args *a = &c->call.args;
  fd_tensor *tensors[4] = {&a->k_new, &a->v_new, &a->k, &a->v};
  static const char *const names[4] = {"k_new", "v_new", "k", "v"};
  const int pick = (int)take(in, 4);
  fd_tensor *t = tensors[pick];
  switch (which) {
    case APPEND_NULL_DATA:
      t->data = NULL;
      c->expect = FD_ERROR_NULL_POINTER;
      c->mutation = names[pick];
      return 1;
    case APPEND_DTYPE: {
      /* k_new not a float type, v_new not k_new's, v not k's, or unknown. */
      const unsigned kind = take(in, 4);
      if (kind == 0) a->k_new.dtype = FD_DTYPE_E4M3;
      if (kind == 1) a->v_new.dtype = c->new_dtype == FD_DTYPE_F32 ? FD_DTYPE_BF16 : FD_DTYPE_F32;
      if (kind == 2) a->v.dtype = c->cache_dtype == FD_DTYPE_I8 ? FD_DTYPE_E4M3 : FD_DTYPE_I8;
      if (kind == 3) set_raw_dtype(t, 99);
      c->expect = FD_ERROR_INVALID_DTYPE;
      c->mutation = "a dtype";
      return 1;
    }
    case APPEND_NDIM:
      t->ndim = take(in, 2) ? 3 : 5;
      c->expect = FD_ERROR_INVALID_SHAPE;
      c->mutation = "ndim";
      return 1;
    case APPEND_NEGATIVE_STRIDE:
      t->strides[take(in, 4)] = -1 - (int64_t)take(in, 3);
      c->expect = FD_ERROR_INVALID_STRIDE;
      c->mutation = "a negative stride";
      return 1;
    case APPEND_HEAD_DIM_STRIDE:
      if (t->shape[3] < 2) return 0;
      t->strides[3] = 2;
      c->expect = FD_ERROR_INVALID_STRIDE;
      c->mutation = "head_dim not contiguous";
      return 1;
    case APPEND_EXTENT: {
      /* v against k, v_new against k_new, k_new's heads or head_dim against k. */
      const unsigned kind = take(in, 3);
      if (kind == 0) change_extent(&a->v, (int)take(in, 4));
      if (kind == 1) change_extent(&a->v_new, (int)take(in, 4));
      if (kind == 2) change_extent(&a->k_new, 2 + (int)take(in, 2));
      c->expect = FD_ERROR_INVALID_SHAPE;
      c->mutation = "an extent disagreeing with another tensor's";
      return 1;
    }
    case APPEND_CACHE_OVERLAP: {
      /* Two elements of the cache share memory. */
      fd_tensor *cache = take(in, 2) ? &a->k : &a->v;
      if (elements_of(cache) == 0) return 0;
      for (int d = 0; d < 3; ++d) {
        if (cache->shape[d] > 1) {
          cache->strides[d] = 0;
          c->expect = FD_ERROR_INVALID_STRIDE;
          c->mutation = "a cache whose elements overlap";
          return 1;
        }
      }
      return 0;
    }
    case APPEND_CACHE_OVER_INPUT:
      if (c->k.size == 0 || c->k_new.size == 0) return 0;
      a->k.data = a->k_new.data;
      c->expect = FD_ERROR_INVALID_ARGUMENT;
      c->mutation = "k over k_new";
      return 1;
    case APPEND_STRUCT_SIZE:
      c->expect = mutate_struct_size(in, c->call.raw, sizeof c->call.args, sizeof c->call.args, &c->mutation);
      return 1;
    case APPEND_PAGE_SIZE:
      if (!c->paged) return 0;
      a->k.shape[1] = a->v.shape[1] = 0;
      c->expect = FD_ERROR_INVALID_LENGTH;
      c->mutation = "page_size 0";
      return 1;
    case APPEND_BATCH:
    case APPEND_NEW_LEN: {
      const int d = which == APPEND_BATCH ? 0 : 1;
      a->k_new.shape[d] = a->v_new.shape[d] = (int64_t)INT32_MAX + 1;
      a->k_new.strides[d] = a->v_new.strides[d] = 0;
      c->expect = FD_ERROR_INVALID_SHAPE;
      c->mutation = d == 0 ? "batch above FD_MAX_BATCH" : "new_len above FD_MAX_KV_LEN";
      return 1;
    }
    case APPEND_SCALE: {
      /* A scale on a 16/32-bit cache, or of another dtype than f32. */
      static float one = 1.0f;
      static const int64_t zeros[3] = {0, 0, 0};
      const int64_t shape[3] = {a->k.shape[0], a->k.shape[1], a->k.shape[2]};
      fd_tensor *scale = take(in, 2) ? &a->k_scale : &a->v_scale;
      if (scale->data == NULL) *scale = fdt_tensor(&one, FD_DTYPE_F32, 3, shape, zeros);
      if (fdt_is_quantized(c->cache_dtype)) scale->dtype = FD_DTYPE_F16;
      c->expect = FD_ERROR_INVALID_DTYPE;
      c->mutation = "a scale of the wrong dtype, or on a 16/32-bit cache";
      return 1;
    }
    case APPEND_INDEX_DTYPE:
      if (a->seq_lens.data != NULL && take(in, 2)) {
        a->seq_lens.dtype = FD_DTYPE_F32;
      } else if (c->paged) {
        a->block_table.dtype = FD_DTYPE_F32;
      } else {
        return 0;
      }
      c->expect = FD_ERROR_INVALID_DTYPE;
      c->mutation = "seq_lens or block_table not i32";
      return 1;
  }
  return 0;
}

/* Where new token i of sequence b lands: 1 and the cache's (outer, slot),
 * or 0 (a position before the cache, or a page outside the pool). */
static int append_target(const append_case *c, int64_t b, int64_t i, int64_t *outer, int64_t *slot) {
  const fd_append_args *a = &c->call.args;
  int64_t len = c->capacity;
  if (a->seq_lens.data != NULL) {
    len = (int64_t)fdt_load(FD_DTYPE_I32, c->seq_lens.bytes, b * a->seq_lens.strides[0]);
    len = len < 0 ? 0 : len > c->capacity ? c->capacity : len;
  }
  const int64_t pos = len - c->new_len + i;
  if (pos < 0) return 0;
  *outer = b;
  *slot = pos;
  if (c->paged) {
    const int64_t column = pos / c->page_size;
    const int64_t page = (int64_t)fdt_load(FD_DTYPE_I32, c->block_table.bytes,
                                           b * a->block_table.strides[0] + column * a->block_table.strides[1]);
    if (page < 0 || page >= c->num_pages) return 0;
    *outer = page;
    *slot = pos - column * c->page_size;
  }
  return 1;
}

/* One cache (k or v) after the call, against the rule: every element no new
 * token selects keeps its bytes; one that one token selects holds that
 * token's converted value; one that several select holds one of theirs. */
static void check_cache(const append_case *c, int is_v, const unsigned char *before) {
  const fd_append_args *a = &c->call.args;
  const fd_tensor *cache = is_v ? &a->v : &a->k;
  const fd_tensor *src = is_v ? &a->v_new : &a->k_new;
  const buffer *got = is_v ? &c->v : &c->k;
  const buffer *news = is_v ? &c->v_new : &c->k_new;
  const buffer *scales = is_v ? &c->v_scale : &c->k_scale;
  const fd_tensor *scale_tensor = is_v ? &a->v_scale : &a->k_scale;
  const size_t es = got->element;
  int32_t *writers = calloc((size_t)(got->elements ? got->elements : 1), sizeof *writers);
  unsigned char *want = buffer_copy(got);
  if (writers == NULL || want == NULL) fuzz_fail("out of memory");
  if (got->size) memcpy(want, before, got->size);
  for (int pass = 0; pass < 2; ++pass) { /* 0: count the writers, 1: the expected bytes */
    for (int64_t b = 0; b < c->batch; ++b) {
      for (int64_t i = 0; i < c->new_len; ++i) {
        int64_t outer, slot;
        if (!append_target(c, b, i, &outer, &slot)) continue;
        for (int64_t h = 0; h < c->kv_heads; ++h) {
          const float *scale = scale_tensor->data != NULL
                                   ? (const float *)scales->bytes + outer * scale_tensor->strides[0] +
                                         slot * scale_tensor->strides[1] + h * scale_tensor->strides[2]
                                   : NULL;
          for (int64_t d = 0; d < c->head_dim; ++d) {
            const int64_t index = at(cache, outer, slot, h, d);
            if (pass == 0) {
              ++writers[index];
              continue;
            }
            unsigned char candidate[4];
            const double x = fdt_load(c->new_dtype, news->bytes, at(src, b, i, h, d));
            fdt_append_store(c->cache_dtype, candidate, 0, x, scale);
            if (writers[index] == 1) {
              memcpy(want + (size_t)index * es, candidate, es);
            } else if (memcmp(got->bytes + (size_t)index * es, candidate, es) == 0 ||
                       (!fdt_is_quantized(c->cache_dtype) && isnan(fdt_load(c->cache_dtype, candidate, 0)) &&
                        isnan(fdt_load(c->cache_dtype, got->bytes, index)))) {
              writers[index] = -1; /* shared: one of its writers' values landed */
            }
          }
        }
      }
    }
  }
  for (int64_t e = 0; e < got->elements; ++e) {
    const unsigned char *g = got->bytes + (size_t)e * es, *w = want + (size_t)e * es;
    if (writers[e] > 1)
      fuzz_fail("%s element %lld, selected by %d new tokens, holds none of their values", is_v ? "v" : "k",
                (long long)e, writers[e]);
    if (writers[e] < 0 || memcmp(g, w, es) == 0) continue;
    /* F32/F16/BF16: which NaN lands may differ (flashdecode.h). */
    if (!fdt_is_quantized(c->cache_dtype) && isnan(fdt_load(c->cache_dtype, g, 0)) &&
        isnan(fdt_load(c->cache_dtype, w, 0)))
      continue;
    fuzz_fail("%s element %lld: got %g, want %g (%s)", is_v ? "v" : "k", (long long)e, fdt_load(c->cache_dtype, g, 0),
              fdt_load(c->cache_dtype, w, 0),
              writers[e] ? "written by one new token" : "no new token selects it: must keep its bytes");
  }
  free(writers);
  free(want);
}

static void describe_append(const append_case *c) {
  char *cursor = problem_text;
  size_t left = sizeof problem_text;
  const fd_append_args *a = &c->call.args;
  describe_text(
      &cursor, &left,
      "fd_append_kv: %s new values into a %s %s cache, batch %lld, new_len %lld, kv_heads %lld, head_dim %lld, "
      "capacity %lld (page_size %lld, max_pages %lld, num_pages %lld)%s%s\n",
      fdt_dtype_name(c->new_dtype), fdt_dtype_name(c->cache_dtype), c->paged ? "paged" : "dense", (long long)c->batch,
      (long long)c->new_len, (long long)c->kv_heads, (long long)c->head_dim, (long long)c->capacity,
      (long long)c->page_size, (long long)c->max_pages, (long long)c->num_pages, c->mutation ? ", invalid: " : "",
      c->mutation ? c->mutation : "");
  const fd_tensor *tensors[] = {&a->k_new,   &a->v_new,   &a->k,        &a->v,
                                &a->k_scale, &a->v_scale, &a->seq_lens, &a->block_table};
  static const char *const names[] = {"k_new", "v_new", "k", "v", "k_scale", "v_scale", "seq_lens", "block_table"};
  for (int i = 0; i < 8; ++i)
    if (tensors[i]->data != NULL || i < 4) describe_tensor(&cursor, &left, names[i], tensors[i]);
}

static void run_append(input *in, fdt_rng *rng, fd_handle *handle) {
  append_case c;
  memset(&c, 0, sizeof c);
  const unsigned draw = take(in, 4 * APPEND_MUTATIONS);
  make_append(in, rng, &c);
  if (draw >= 3 * APPEND_MUTATIONS && !mutate_append(in, &c, draw - 3 * APPEND_MUTATIONS)) {
    c.expect = FD_SUCCESS;
    c.mutation = NULL;
  }
  describe_append(&c);
  buffer *all[] = {&c.k_new, &c.v_new, &c.k, &c.v, &c.k_scale, &c.v_scale, &c.seq_lens, &c.block_table};
  enum { ALL = sizeof all / sizeof all[0] };
  unsigned char *kept[ALL];
  for (int i = 0; i < ALL; ++i) kept[i] = buffer_copy(all[i]);

  const fd_status status = fd_append_kv(handle, &c.call.args, NULL);
  if (verbose) fprintf(stderr, "%s=> %s\n", problem_text, fd_status_string(status));
  if (status != c.expect)
    fuzz_fail("fd_append_kv returned %s, expected %s", fd_status_string(status), fd_status_string(c.expect));
  for (int i = 0; i < ALL; ++i) {
    const int cache = all[i] == &c.k || all[i] == &c.v;
    if ((status != FD_SUCCESS || !cache) && all[i]->size && memcmp(kept[i], all[i]->bytes, all[i]->size) != 0)
      fuzz_fail("fd_append_kv changed %s (buffer %d of k_new, v_new, k, v, k_scale, v_scale, seq_lens, block_table)",
                cache ? "the cache and failed" : "an input", i);
  }
  if (status != FD_SUCCESS) {
    require_message("fd_append_kv");
  } else {
    check_cache(&c, 0, kept[2]);
    check_cache(&c, 1, kept[3]);
  }
  for (int i = 0; i < ALL; ++i) {
    free(kept[i]);
    free(all[i]->bytes);
  }
}

/* ==== fd_merge_states ================================================================ */
typedef struct merge_case {
  int num_states, in_place_out, in_place_lse; /* in_place_*: the state the output is, or -1 */
  int64_t batch, q_len, heads, head_dim;
  fd_dtype out_dtype;
  buffer states_out[FD_MAX_MERGE_STATES], states_lse[FD_MAX_MERGE_STATES], out, lse;
  fd_tensor out_tensors[FD_MAX_MERGE_STATES], lse_tensors[FD_MAX_MERGE_STATES];
  union {
    fd_merge_args args;
    unsigned char raw[sizeof(fd_merge_args) + 32];
  } call;
  fd_status expect;
  const char *mutation;
} merge_case;

/* An LSE: mostly moderate, with large magnitudes, -inf (an empty part),
 * and, rarely, NaN and +inf (the row's result is NaN). */
static double lse_value(fdt_rng *rng) {
  const double u = fdt_uniform(rng, 0.0, 1.0);
  if (u < 1.0 / 8) return -INFINITY;
  if (u < 1.0 / 8 + 1.0 / 128) return NAN;
  if (u < 1.0 / 8 + 2.0 / 128) return INFINITY;
  if (u < 1.0 / 8 + 10.0 / 128) return fdt_uniform(rng, -90.0, 90.0);
  return fdt_uniform(rng, -6.0, 6.0);
}

static void make_merge(input *in, fdt_rng *rng, merge_case *c) {
  c->num_states = take(in, 8) == 0 ? 1 + (int)take(in, FD_MAX_MERGE_STATES) : 1 + (int)take(in, 4);
  c->batch = take(in, 4);
  c->q_len = take(in, 3);
  c->heads = take(in, 4);
  c->head_dim = take(in, 4) ? 1 + take(in, 16) : 24 + 8 * take(in, 4);
  c->out_dtype = kFloatDtypes[take(in, 3)];
  const int with_lse = (int)take(in, 2);
  c->in_place_out = take(in, 4) == 0 ? (int)take(in, (unsigned)c->num_states) : -1;
  c->in_place_lse = with_lse && take(in, 4) == 0 ? (int)take(in, (unsigned)c->num_states) : -1;
  const int64_t out_shape[4] = {c->batch, c->q_len, c->heads, c->head_dim};
  for (int s = 0; s < c->num_states; ++s) {
    const fd_dtype dtype = s == c->in_place_out ? c->out_dtype : kFloatDtypes[take(in, 3)];
    c->out_tensors[s] = make_tensor(in, rng, &c->states_out[s], dtype, 4, out_shape, 1, s != c->in_place_out);
    for (int64_t e = 0; e < c->states_out[s].elements; ++e)
      fdt_store(dtype, c->states_out[s].bytes, e, fdt_uniform(rng, -2.0, 2.0));
    c->lse_tensors[s] = make_tensor(in, rng, &c->states_lse[s], FD_DTYPE_F32, 3, out_shape, 0, s != c->in_place_lse);
    for (int64_t e = 0; e < c->states_lse[s].elements; ++e)
      fdt_store(FD_DTYPE_F32, c->states_lse[s].bytes, e, lse_value(rng));
    /* An empty part's output may be anything (NaN here): it must not enter
     * the result. Only where neither tensor broadcasts, so that the NaN
     * stays in that row. */
    if (!broadcasts(&c->out_tensors[s]) && !broadcasts(&c->lse_tensors[s])) {
      for (int64_t b = 0; b < c->batch; ++b)
        for (int64_t t = 0; t < c->q_len; ++t)
          for (int64_t h = 0; h < c->heads; ++h) {
            if (fdt_load(FD_DTYPE_F32, c->states_lse[s].bytes, at(&c->lse_tensors[s], b, t, h, 0)) != -INFINITY)
              continue;
            for (int64_t d = 0; d < c->head_dim; ++d)
              fdt_store(dtype, c->states_out[s].bytes, at(&c->out_tensors[s], b, t, h, d), NAN);
          }
    }
  }
  fd_merge_args *a = &c->call.args;
  fd_merge_args_init(a, sizeof *a);
  a->num_states = c->num_states;
  a->states_out = c->out_tensors;
  a->states_lse = c->lse_tensors;
  if (c->in_place_out >= 0) {
    a->out = c->out_tensors[c->in_place_out];
  } else {
    a->out = make_tensor(in, rng, &c->out, c->out_dtype, 4, out_shape, 1, 0);
    if (c->out.size) memset(c->out.bytes, 0xff, c->out.size);
  }
  if (c->in_place_lse >= 0) {
    a->lse = c->lse_tensors[c->in_place_lse];
  } else if (with_lse) {
    a->lse = make_tensor(in, rng, &c->lse, FD_DTYPE_F32, 3, out_shape, 0, 0);
    if (c->lse.size) memset(c->lse.bytes, 0xff, c->lse.size);
  }
  c->expect = FD_SUCCESS;
  c->mutation = NULL;
}

enum {
  MERGE_NUM_STATES,
  MERGE_NULL_ARRAY,
  MERGE_NULL_OUT,
  MERGE_OUT_DTYPE,
  MERGE_STATE_DTYPE,
  MERGE_EXTENT,
  MERGE_HEAD_DIM,
  MERGE_OUT_OVERLAP,
  MERGE_OUT_OVER_INPUT,
  MERGE_STRUCT_SIZE,
  MERGE_HEADS,
  MERGE_BATCH,
  MERGE_MUTATIONS
};

static int mutate_merge(input *in, merge_case *c, unsigned which) {
  fd_merge_args *a = &c->call.args;
  const int s = (int)take(in, (unsigned)c->num_states);
  switch (which) {
    case MERGE_NUM_STATES:
      a->num_states = take(in, 2) ? 0 : FD_MAX_MERGE_STATES + 1;
      c->expect = FD_ERROR_INVALID_ARGUMENT;
      c->mutation = "num_states out of range";
      return 1;
    case MERGE_NULL_ARRAY:
      if (take(in, 2)) {
        a->states_out = NULL;
      } else {
        a->states_lse = NULL;
      }
      c->expect = FD_ERROR_NULL_POINTER;
      c->mutation = "a NULL state array";
      return 1;
    case MERGE_NULL_OUT:
      if (take(in, 2)) {
        a->out.data = NULL;
      } else {
        c->out_tensors[s].data = NULL;
      }
      c->expect = FD_ERROR_NULL_POINTER;
      c->mutation = "NULL data";
      return 1;
    case MERGE_OUT_DTYPE:
      if (take(in, 2)) {
        a->out.dtype = FD_DTYPE_I32;
      } else {
        set_raw_dtype(&a->out, 99);
      }
      c->expect = FD_ERROR_INVALID_DTYPE;
      c->mutation = "out's dtype";
      return 1;
    case MERGE_STATE_DTYPE:
      if (take(in, 2)) {
        c->out_tensors[s].dtype = FD_DTYPE_E4M3;
      } else {
        c->lse_tensors[s].dtype = FD_DTYPE_F16;
      }
      c->expect = FD_ERROR_INVALID_DTYPE;
      c->mutation = "a state's dtype";
      return 1;
    case MERGE_EXTENT: {
      const unsigned kind = take(in, 3);
      if (kind == 0) change_extent(&c->out_tensors[s], (int)take(in, 4));
      if (kind == 1) change_extent(&c->lse_tensors[s], (int)take(in, 3));
      if (kind == 2) {
        if (a->lse.data == NULL) return 0;
        change_extent(&a->lse, (int)take(in, 3));
      }
      c->expect = FD_ERROR_INVALID_SHAPE;
      c->mutation = "an extent disagreeing with out's";
      return 1;
    }
    case MERGE_HEAD_DIM:
      a->out.shape[3] = take(in, 2) ? 0 : FD_MAX_HEAD_DIM + 1;
      a->out.strides[3] = 1; /* an extent-1 head_dim may have had any stride */
      c->expect = FD_ERROR_INVALID_HEAD_DIM;
      c->mutation = "head_dim out of range";
      return 1;
    case MERGE_OUT_OVERLAP:
      if (elements_of(&a->out) == 0) return 0;
      for (int d = 0; d < 3; ++d) {
        if (a->out.shape[d] > 1) {
          a->out.strides[d] = 0;
          c->expect = FD_ERROR_INVALID_STRIDE;
          c->mutation = "out's elements overlap";
          return 1;
        }
      }
      return 0;
    case MERGE_OUT_OVER_INPUT:
      /* out over a state's LSE: never in place. */
      if (elements_of(&a->out) == 0 || c->states_lse[s].size == 0) return 0;
      a->out.data = c->states_lse[s].bytes;
      c->expect = FD_ERROR_INVALID_ARGUMENT;
      c->mutation = "out over a state's LSE";
      return 1;
    case MERGE_STRUCT_SIZE:
      c->expect = mutate_struct_size(in, c->call.raw, sizeof c->call.args, sizeof c->call.args, &c->mutation);
      return 1;
    case MERGE_HEADS:
    case MERGE_BATCH: {
      const int d = which == MERGE_HEADS ? 2 : 0;
      a->out.shape[d] = d == 2 ? FD_MAX_HEADS + 1 : (int64_t)INT32_MAX + 1;
      a->out.strides[d] = 0;
      c->expect = d == 2 ? FD_ERROR_INVALID_HEAD_COUNT : FD_ERROR_INVALID_SHAPE;
      c->mutation = d == 2 ? "heads above FD_MAX_HEADS" : "batch above FD_MAX_BATCH";
      return 1;
    }
  }
  return 0;
}

/* out and lse against a float64 merge of the states as they were
 * (`states_before`, `lse_before`: their bytes before the call). */
static void check_merge(const merge_case *c, unsigned char *const *states_before, unsigned char *const *lse_before) {
  const fd_merge_args *a = &c->call.args;
  const unsigned char *out = (const unsigned char *)a->out.data;
  const double bound = c->out_dtype == FD_DTYPE_F32 ? 1e-4 : fdt_error_bound(c->out_dtype);
  /* Below the smallest normal, out's rounding is a fixed step, not relative. */
  const double subnormal_step = ldexp(1.0, c->out_dtype == FD_DTYPE_F16    ? -24
                                           : c->out_dtype == FD_DTYPE_BF16 ? -133
                                                                           : -149);
  double weights[FD_MAX_MERGE_STATES];
  for (int64_t b = 0; b < c->batch; ++b) {
    for (int64_t t = 0; t < c->q_len; ++t) {
      for (int64_t h = 0; h < c->heads; ++h) {
        double m = -INFINITY;
        int nan_row = 0;
        for (int s = 0; s < c->num_states; ++s) {
          const double l = fdt_load(FD_DTYPE_F32, lse_before[s], at(&c->lse_tensors[s], b, t, h, 0));
          nan_row |= isnan(l) || l == INFINITY;
          if (l > m) m = l;
        }
        double total = 0.0;
        for (int s = 0; s < c->num_states; ++s) {
          const double l = fdt_load(FD_DTYPE_F32, lse_before[s], at(&c->lse_tensors[s], b, t, h, 0));
          weights[s] = nan_row || m == -INFINITY || l == -INFINITY ? 0.0 : exp(l - m);
          total += weights[s];
        }
        char row_text[96];
        snprintf(row_text, sizeof row_text, "row (%lld, %lld, %lld)", (long long)b, (long long)t, (long long)h);
        for (int64_t d = 0; d < c->head_dim; ++d) {
          const double got = fdt_load(c->out_dtype, out, at(&a->out, b, t, h, d));
          if (nan_row) {
            if (!isnan(got))
              fuzz_fail("%s has a NaN or +inf LSE: out[%lld] must be NaN, got %g", row_text, (long long)d, got);
            continue;
          }
          if (total == 0.0) {
            if (got != 0.0)
              fuzz_fail("%s has only empty states: out[%lld] must be 0, got %g", row_text, (long long)d, got);
            continue;
          }
          double want = 0.0, magnitude = 0.0;
          for (int s = 0; s < c->num_states; ++s) {
            if (weights[s] == 0.0) continue;
            const double x = fdt_load(c->out_tensors[s].dtype, states_before[s], at(&c->out_tensors[s], b, t, h, d));
            want += weights[s] * x;
            magnitude += weights[s] * fabs(x);
          }
          want /= total;
          magnitude /= total;
          if (!(fabs(got - want) <= bound * magnitude + subnormal_step))
            fuzz_fail("%s: out[%lld] = %.9g, want %.9g (bound %g x %g)", row_text, (long long)d, got, want, bound,
                      magnitude);
        }
        if (a->lse.data == NULL) continue;
        const double got = fdt_load(FD_DTYPE_F32, a->lse.data, at(&a->lse, b, t, h, 0));
        const double want = nan_row ? NAN : total == 0.0 ? -INFINITY : m + log(total);
        if (isnan(want) ? !isnan(got) : isinf(want) ? got != want : !(fabs(got - want) <= 1e-5 * fmax(1.0, fabs(want))))
          fuzz_fail("%s: lse %.9g, want %.9g", row_text, got, want);
      }
    }
  }
}

/* Every slot of an output's buffer outside its elements keeps its bytes. */
static void check_only_elements(const char *name, const buffer *b, const unsigned char *before, const fd_tensor *t) {
  if (b->size == 0) return;
  unsigned char *is_element = element_mask(b, t, t->ndim);
  for (int64_t e = 0; e < b->elements; ++e)
    if (!is_element[e] && memcmp(b->bytes + (size_t)e * b->element, before + (size_t)e * b->element, b->element) != 0)
      fuzz_fail("%s: element slot %lld outside its elements changed", name, (long long)e);
  free(is_element);
}

static void describe_merge(const merge_case *c) {
  char *cursor = problem_text;
  size_t left = sizeof problem_text;
  const fd_merge_args *a = &c->call.args;
  describe_text(
      &cursor, &left,
      "fd_merge_states: %d states into %s out [%lld, %lld, %lld, %lld], lse %s, in place: out %d, lse %d%s%s\n",
      c->num_states, fdt_dtype_name(c->out_dtype), (long long)c->batch, (long long)c->q_len, (long long)c->heads,
      (long long)c->head_dim, a->lse.data ? "yes" : "no", c->in_place_out, c->in_place_lse,
      c->mutation ? ", invalid: " : "", c->mutation ? c->mutation : "");
  describe_tensor(&cursor, &left, "out", &a->out);
  if (a->lse.data != NULL) describe_tensor(&cursor, &left, "lse", &a->lse);
  for (int s = 0; s < c->num_states && s < 4; ++s) {
    describe_tensor(&cursor, &left, "states_out", &c->out_tensors[s]);
    describe_tensor(&cursor, &left, "states_lse", &c->lse_tensors[s]);
  }
}

static void run_merge(input *in, fdt_rng *rng, fd_handle *handle) {
  static merge_case c; /* large: not on the stack */
  memset(&c, 0, sizeof c);
  const unsigned draw = take(in, 4 * MERGE_MUTATIONS);
  make_merge(in, rng, &c);
  if (draw >= 3 * MERGE_MUTATIONS && !mutate_merge(in, &c, draw - 3 * MERGE_MUTATIONS)) {
    c.expect = FD_SUCCESS;
    c.mutation = NULL;
  }
  describe_merge(&c);
  unsigned char *states_before[FD_MAX_MERGE_STATES], *lse_before[FD_MAX_MERGE_STATES];
  for (int s = 0; s < c.num_states; ++s) {
    states_before[s] = buffer_copy(&c.states_out[s]);
    lse_before[s] = buffer_copy(&c.states_lse[s]);
  }
  unsigned char *out_before = buffer_copy(&c.out), *lse_out_before = buffer_copy(&c.lse);

  const fd_status status = fd_merge_states(handle, &c.call.args, NULL);
  if (verbose) fprintf(stderr, "%s=> %s\n", problem_text, fd_status_string(status));
  if (status != c.expect)
    fuzz_fail("fd_merge_states returned %s, expected %s", fd_status_string(status), fd_status_string(c.expect));
  for (int s = 0; s < c.num_states; ++s) {
    const int wrote_out = status == FD_SUCCESS && s == c.in_place_out;
    const int wrote_lse = status == FD_SUCCESS && s == c.in_place_lse;
    if (wrote_out) {
      check_only_elements("out (in place)", &c.states_out[s], states_before[s], &c.out_tensors[s]);
    } else if (c.states_out[s].size && memcmp(states_before[s], c.states_out[s].bytes, c.states_out[s].size) != 0) {
      fuzz_fail("fd_merge_states changed states_out[%d]", s);
    }
    if (wrote_lse) {
      check_only_elements("lse (in place)", &c.states_lse[s], lse_before[s], &c.lse_tensors[s]);
    } else if (c.states_lse[s].size && memcmp(lse_before[s], c.states_lse[s].bytes, c.states_lse[s].size) != 0) {
      fuzz_fail("fd_merge_states changed states_lse[%d]", s);
    }
  }
  if (status != FD_SUCCESS) {
    require_message("fd_merge_states");
    if (c.out.size && memcmp(out_before, c.out.bytes, c.out.size) != 0) fuzz_fail("a failing merge wrote out");
    if (c.lse.size && memcmp(lse_out_before, c.lse.bytes, c.lse.size) != 0) fuzz_fail("a failing merge wrote lse");
  } else {
    if (c.in_place_out < 0) check_only_elements("out", &c.out, out_before, &c.call.args.out);
    if (c.in_place_lse < 0 && c.lse.bytes != NULL) check_only_elements("lse", &c.lse, lse_out_before, &c.call.args.lse);
    check_merge(&c, states_before, lse_before);
  }
  for (int s = 0; s < c.num_states; ++s) {
    free(states_before[s]);
    free(lse_before[s]);
    free(c.states_out[s].bytes);
    free(c.states_lse[s].bytes);
  }
  free(out_before);
  free(lse_out_before);
  free(c.out.bytes);
  free(c.lse.bytes);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (verbose < 0) verbose = getenv("FUZZ_CACHE_VERBOSE") != NULL ? atoi(getenv("FUZZ_CACHE_VERBOSE")) : 0;
  input in = {data, size};
  fdt_rng rng = {input_seed(data, size)};
  const unsigned call = take(&in, 2); /* 0 fd_append_kv, 1 fd_merge_states */
  const int32_t threads = 1 + (int32_t)take(&in, 3);
  /* Contents checks change nothing here: append clamps lengths and skips
   * pages outside the pool with them too. */
  fd_handle *handle = fdt_cpu_handle(threads, take(&in, 2) ? FD_CHECK_CONTENTS : FD_CHECK_NONE);
  if (handle == NULL) fuzz_fail("fd_create failed");
  if (call == 0) {
    run_append(&in, &rng, handle);
  } else {
    run_merge(&in, &rng, handle);
  }
  if (fd_destroy(handle) != FD_SUCCESS) fuzz_fail("fd_destroy failed");
  return 0;
}
