// SPDX-License-Identifier: Apache-2.0
/* libFuzzer harness for fd_decode, fd_workspace_size and fd_describe_plan on
 * the CPU backend (tests/fuzz/README.md).
 *
 * The fuzzer's bytes choose a problem: dtypes, batch, heads, head_dim, a
 * dense or paged cache, sequence lengths, an LSE output, split count, softmax
 * scale, non-finite values, each tensor's layout (dimension order, padding,
 * broadcast strides, arbitrary strides on extent-1 dimensions), and the
 * attention variants (query tokens, mask, window, softcap, ALiBi, sinks).
 * Every tensor gets a real buffer of exactly the bytes its shape and strides
 * reach, so that AddressSanitizer sees any access beyond them. About one
 * input in four then gets exactly one invalid field, with the status it
 * must produce.
 *
 * Checked for every input:
 * - fd_workspace_size and fd_describe_plan succeed or fail together with the
 *   same status; on success they agree (bytes, splits, kernel, merge,
 *   blocks), and a caller workspace of exactly that many bytes is enough for
 *   fd_decode (one byte less is refused).
 * - A failing call returns the status the invalid field calls for (never
 *   FD_ERROR_INTERNAL), sets a message, and writes no output byte and no
 *   fd_plan_info byte.
 * - A successful decode writes every output element, no byte between them,
 *   matches the float64 reference of tests/support within fdt_error_bound
 *   (LSE within 1e-4, NaN and -inf where it has them; see check_numerics
 *   for the latitude the header allows), gives zeros and LSE -inf for empty
 *   sequences, and, in a quarter of the inputs, repeats bitwise on the same
 *   handle.
 * - No input byte changes.
 * Any violation prints the problem and aborts: libFuzzer saves the input. */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fdt.h"
#include "flashdecode.h"
#include "fuzz_support.h"

const char *fuzz_name = "fuzz_decode";
static int verbose = -1; /* FUZZ_DECODE_VERBOSE: 1 prints every input's problem, 2 also its specials */

/* ---- invalid fields ------------------------------------------------------------ */
/* When a call must fail, and how. */
typedef enum stage {
  VALID = 0,    /* every call succeeds */
  ARGS = 1,     /* fd_workspace_size, fd_describe_plan and fd_decode fail with `expect` */
  CONTENTS = 2, /* only fd_decode fails (seq_lens or block_table values) */
} stage;

enum {
  MUT_NULL_DATA,
  MUT_UNKNOWN_DTYPE,
  MUT_WRONG_DTYPE,
  MUT_MISALIGNED,
  MUT_NDIM,
  MUT_NEGATIVE_SHAPE,
  MUT_NEGATIVE_STRIDE,
  MUT_HEAD_DIM_STRIDE,
  MUT_OFFSET_OVERFLOW,
  MUT_HEAD_DIM,
  MUT_HEAD_COUNT,
  MUT_Q_LEN,
  MUT_EXTENT,
  MUT_OUTPUT_OVERLAP,
  MUT_LSE_IN_OUT,
  MUT_SCALE,
  MUT_SPLITS,
  MUT_STRUCT_SIZE,
  MUT_NEWER_FIELD,
  MUT_PAGE_SIZE,
  MUT_CAPACITY,
  MUT_BATCH,
  MUT_SEQ_LEN,
  MUT_BLOCK_TABLE,
  MUT_MASK,
  MUT_SOFTCAP,
  MUT_WINDOW,
  MUT_PER_HEAD_OVERLAP,
  MUT_COUNT
};

/* ---- one input ----------------------------------------------------------------- */
typedef struct fuzz_case {
  /* The problem, as generated. */
  fd_dtype dtype, out_dtype;
  int64_t batch, q_heads, kv_heads, head_dim, capacity, page_size, max_pages, num_pages;
  int paged, with_lens, with_lse;
  buffer q, k, v, out, lse, seq_lens, block_table, alibi_slopes, sinks;
  buffer q_lens;     /* ragged query lengths (add_variants), or none */
  int64_t *q_counts; /* [batch]: each sequence's query tokens, as the library reads them; NULL: q_len */
  fd_dtype kv_dtype; /* c->dtype, or an 8-bit cache dtype (quantize_case) */
  buffer k_scale, v_scale;
  int64_t *lens; /* [batch], as stored (read back) */
  /* The variants, as the library reads them (add_variants). */
  int64_t q_len, window;
  fd_attention_mask mask;
  float softcap;
  /* The call. */
  union {
    fd_decode_args args;
    unsigned char raw[sizeof(fd_decode_args) + 32]; /* a newer caller's longer struct */
  } call;
  stage stage;
  fd_status expect;
  const char *mutation;
} fuzz_case;

static void free_case(fuzz_case *c) {
  free(c->q.bytes);
  free(c->k.bytes);
  free(c->v.bytes);
  free(c->out.bytes);
  free(c->lse.bytes);
  free(c->seq_lens.bytes);
  free(c->block_table.bytes);
  free(c->alibi_slopes.bytes);
  free(c->sinks.bytes);
  free(c->k_scale.bytes);
  free(c->v_scale.bytes);
  free(c->q_lens.bytes);
  free(c->q_counts);
  free(c->lens);
}

/* Element offset of token j of sequence b, KV head g, element d in k or v
 * (t), through the block table of a paged cache. */
static int64_t kv_at(const fuzz_case *c, const fd_tensor *t, int64_t b, int64_t j, int64_t g, int64_t d) {
  if (!c->paged) return at(t, b, j, g, d);
  const int64_t page =
      (int64_t)fdt_load(FD_DTYPE_I32, c->block_table.bytes, at(&c->call.args.block_table, b, j / c->page_size, 0, 0));
  return at(t, page, j % c->page_size, g, d);
}

static void add_specials(input *in, fuzz_case *c, fdt_rng *rng);
static void add_variants(input *in, fuzz_case *c, fdt_rng *rng);

/* Scale of (sequence b, token j, KV head g) of k or v: 1 without a scale tensor. */
static double scale_at(const fuzz_case *c, const fd_tensor *t, const buffer *s, int64_t b, int64_t j, int64_t g) {
  if (t->data == NULL) return 1.0;
  if (!c->paged) return fdt_load(FD_DTYPE_F32, s->bytes, at(t, b, j, g, 0));
  const int64_t page =
      (int64_t)fdt_load(FD_DTYPE_I32, c->block_table.bytes, at(&c->call.args.block_table, b, j / c->page_size, 0, 0));
  return fdt_load(FD_DTYPE_F32, s->bytes, at(t, page, j % c->page_size, g, 0));
}

/* The value the library must see at element (b, j, g, d) of k or v: the
 * stored value, times its scale on an 8-bit cache. */
static double kv_value(const fuzz_case *c, int is_v, int64_t b, int64_t j, int64_t g, int64_t d) {
  const fd_decode_args *a = &c->call.args;
  const fd_tensor *t = is_v ? &a->v : &a->k;
  const double x = fdt_load(c->kv_dtype, is_v ? c->v.bytes : c->k.bytes, kv_at(c, t, b, j, g, d));
  if (!fdt_is_quantized(c->kv_dtype)) return x;
  return x * scale_at(c, is_v ? &a->v_scale : &a->k_scale, is_v ? &c->v_scale : &c->k_scale, b, j, g);
}

/* Turns a valid problem's cache into an 8-bit one (same strides, padding
 * 0xff: NaN in e4m3 and e5m2) with scales: none, per tensor, per KV head or
 * per token and head (zeros among them); each valid element is the old
 * value divided by its scale, quantized (specials included: NaN stays NaN,
 * infinities saturate). */
static void quantize_case(input *in, fuzz_case *c, fdt_rng *rng) {
  static const fd_dtype kinds[] = {FD_DTYPE_E4M3, FD_DTYPE_E5M2, FD_DTYPE_I8};
  fd_decode_args *a = &c->call.args;
  if (a->struct_size < sizeof(fd_decode_args)) return; /* an older caller's struct has no scales */
  /* Plain data only: the specials' magnitudes, saturated, would leave the
   * range check_numerics' latitude is made for. */
  for (int64_t b = 0; b < c->batch; ++b)
    for (int64_t j = 0; j < c->lens[b]; ++j)
      for (int64_t g = 0; g < c->kv_heads; ++g)
        for (int64_t d = 0; d < c->head_dim; ++d) {
          const double x = fdt_load(c->dtype, c->k.bytes, kv_at(c, &a->k, b, j, g, d));
          const double y = fdt_load(c->dtype, c->v.bytes, kv_at(c, &a->v, b, j, g, d));
          if (!(fabs(x) <= 2.0) || !(fabs(y) <= 1.0)) return;
        }
  for (int64_t b = 0; b < c->batch; ++b)
    for (int64_t t = 0; t < c->q_len; ++t)
      for (int64_t h = 0; h < c->q_heads; ++h)
        for (int64_t d = 0; d < c->head_dim; ++d)
          if (!(fabs(fdt_load(c->dtype, c->q.bytes, at(&a->q, b, t, h, d))) <= 2.0)) return;
  const fd_dtype old = c->dtype, kv = kinds[take(in, 3)];
  const unsigned mode = take(in, 4);
  const int64_t shape[3] = {a->k.shape[0], a->k.shape[1], a->k.shape[2]};
  int64_t strides[3] = {0, 0, 0}, elements = 1;
  if (mode == 2) {
    strides[2] = 1;
    elements = shape[2];
  } else if (mode == 3) {
    strides[0] = shape[1] * shape[2];
    strides[1] = shape[2];
    strides[2] = 1;
    elements = shape[0] * shape[1] * shape[2];
  }
  buffer *scales[2] = {&c->k_scale, &c->v_scale};
  fd_tensor *scale_tensors[2] = {&a->k_scale, &a->v_scale};
  for (int i = 0; i < 2 && mode > 0; ++i) {
    buffer_alloc(scales[i], elements, sizeof(float), 0xff); /* NaN where never read */
    *scale_tensors[i] = fdt_tensor(scales[i]->bytes, FD_DTYPE_F32, 3, shape, strides);
    for (int64_t e = 0; e < elements; ++e) {
      const float value = fdt_int(rng, 0, 9) == 0 ? 0.0f : (float)fdt_uniform(rng, 0.01, 4.0);
      if (mode < 3 || fdt_int(rng, 0, 3) != 0) ((float *)scales[i]->bytes)[e] = value;
    }
  }
  c->kv_dtype = kv;
  buffer *caches[2] = {&c->k, &c->v};
  fd_tensor *cache_tensors[2] = {&a->k, &a->v};
  for (int i = 0; i < 2; ++i) {
    buffer q;
    buffer_alloc(&q, caches[i]->elements, 1, 0xff);
    for (int64_t b = 0; b < c->batch; ++b)
      for (int64_t j = 0; j < c->lens[b]; ++j)
        for (int64_t g = 0; g < c->kv_heads; ++g) {
          /* A per-token scale left NaN above is read now: give it a value. */
          if (mode == 3) {
            const int64_t outer = c->paged ? (int64_t)fdt_load(FD_DTYPE_I32, c->block_table.bytes,
                                                               at(&a->block_table, b, j / c->page_size, 0, 0))
                                           : b;
            const int64_t inner = c->paged ? j % c->page_size : j;
            float *slot = (float *)scales[i]->bytes + outer * strides[0] + inner * strides[1] + g;
            if (isnan(*slot)) *slot = 0.5f;
          }
          const double s = scale_at(c, scale_tensors[i], scales[i], b, j, g);
          for (int64_t d = 0; d < c->head_dim; ++d) {
            const int64_t offset = kv_at(c, cache_tensors[i], b, j, g, d);
            const double x = fdt_load(old, caches[i]->bytes, offset);
            q.bytes[offset] = fdt_quantize(kv, s != 0.0 ? x / s : x);
          }
        }
    free(caches[i]->bytes);
    *caches[i] = q;
    cache_tensors[i]->data = q.bytes;
    cache_tensors[i]->dtype = kv;
  }
}

/* Draws the valid problem, with real data in exactly sized buffers. */
static void make_problem(input *in, fuzz_case *c, fdt_rng *rng) {
  static const fd_dtype dtypes[] = {FD_DTYPE_F32, FD_DTYPE_F16, FD_DTYPE_BF16};
  static const int64_t head_dims[] = {16, 32, 40, 64, 128, 256, 3, 8};
  c->dtype = dtypes[take(in, 3)];
  c->out_dtype = take(in, 3) == 0 ? FD_DTYPE_F32 : c->dtype;
  const unsigned batch = take(in, 6); /* 1 once the bytes run out */
  c->batch = batch == 5 ? 0 : 1 + batch;
  c->kv_heads = 1 + take(in, 4);
  c->q_heads = c->kv_heads * (1 + take(in, 4));
  c->head_dim = take(in, 2) ? 1 + take(in, 16) : head_dims[take(in, 8)];
  c->paged = take(in, 3) == 0;
  c->with_lens = take(in, 2);
  c->with_lse = take(in, 3) != 0;
  /* Bounded work (the reference is naive): batch x q_heads x capacity x head_dim. */
  const int64_t budget = 1 << 13, per_token = (c->batch > 0 ? c->batch : 1) * c->q_heads * c->head_dim;
  int64_t most = budget / per_token;
  if (c->paged) {
    static const int64_t page_sizes[] = {1, 2, 3, 4, 7, 8, 16, 64};
    c->page_size = page_sizes[take(in, 8)];
    const unsigned pages = take(in, 7);
    c->max_pages = pages == 6 ? 0 : 1 + pages;
    while (c->max_pages > 0 && c->max_pages * c->page_size > most) --c->max_pages;
    c->capacity = c->max_pages * c->page_size;
    /* Fewer pages than slots share pages between sequences; more leave spare ones. */
    c->num_pages = c->capacity > 0 ? 1 + take(in, (unsigned)(c->batch * c->max_pages + 3)) : take(in, 3);
  } else {
    const unsigned capacity = take(in, 6);
    c->capacity = capacity == 5 ? take(in, 600) : capacity == 4 ? 0 : 1 + take(in, 70);
    if (c->capacity > most) c->capacity = most;
  }
  const int64_t B = c->batch, Hq = c->q_heads, Hkv = c->kv_heads, D = c->head_dim, N = c->capacity;
  const size_t es = fdt_dtype_size(c->dtype);
  c->kv_dtype = c->dtype;
  fd_decode_args_init(&c->call.args, sizeof c->call.args);
  fd_decode_args *a = &c->call.args;

  int64_t shape[4], strides[4];
  /* q, out: [batch, 1, q_heads, head_dim]. */
  const int64_t q_shape[4] = {B, 1, Hq, D};
  buffer_alloc(&c->q, lay_out(in, 4, q_shape, strides, 1, 1), es, 0xff);
  a->q = fdt_tensor(c->q.bytes, c->dtype, 4, q_shape, strides);
  buffer_alloc(&c->out, lay_out(in, 4, q_shape, strides, 1, 0), fdt_dtype_size(c->out_dtype), 0xff);
  a->out = fdt_tensor(c->out.bytes, c->out_dtype, 4, q_shape, strides);
  if (c->with_lse) {
    const int64_t lse_shape[3] = {B, 1, Hq};
    buffer_alloc(&c->lse, lay_out(in, 3, lse_shape, strides, 0, 0), sizeof(float), 0xff);
    a->lse = fdt_tensor(c->lse.bytes, FD_DTYPE_F32, 3, lse_shape, strides);
  }
  /* k, v: dense [batch, capacity, kv_heads, head_dim] or the page pool; each
   * with a layout of its own. */
  shape[0] = c->paged ? c->num_pages : B;
  shape[1] = c->paged ? c->page_size : N;
  shape[2] = Hkv;
  shape[3] = D;
  buffer_alloc(&c->k, lay_out(in, 4, shape, strides, 1, 1), es, 0xff);
  a->k = fdt_tensor(c->k.bytes, c->dtype, 4, shape, strides);
  buffer_alloc(&c->v, lay_out(in, 4, shape, strides, 1, 1), es, 0xff);
  a->v = fdt_tensor(c->v.bytes, c->dtype, 4, shape, strides);

  /* Sequence lengths: written, then read back (a broadcast stride shares one
   * value between sequences). */
  c->lens = calloc((size_t)(B > 0 ? B : 1), sizeof *c->lens);
  if (c->lens == NULL) fuzz_fail("out of memory");
  for (int64_t b = 0; b < B; ++b) c->lens[b] = N;
  if (c->with_lens) {
    const int64_t lens_shape[1] = {B};
    buffer_alloc(&c->seq_lens, lay_out(in, 1, lens_shape, strides, 0, 1), sizeof(int32_t), 0xff);
    a->seq_lens = fdt_tensor(c->seq_lens.bytes, FD_DTYPE_I32, 1, lens_shape, strides);
    for (int64_t b = 0; b < B; ++b) {
      const unsigned pick = take(in, 4);
      const int64_t len = pick == 2 ? 0 : pick == 3 ? N : fdt_int(rng, 0, N); /* empty and full ones too */
      fdt_store(FD_DTYPE_I32, c->seq_lens.bytes, b * strides[0], (double)len);
    }
    for (int64_t b = 0; b < B; ++b) c->lens[b] = (int64_t)fdt_load(FD_DTYPE_I32, c->seq_lens.bytes, b * strides[0]);
  }
  /* Block table: junk everywhere (never read past a sequence's pages), then
   * pages for the slots each sequence uses. */
  if (c->paged) {
    const int64_t table_shape[2] = {B, c->max_pages};
    buffer_alloc(&c->block_table, lay_out(in, 2, table_shape, strides, 0, 1), sizeof(int32_t), 0xff);
    a->block_table = fdt_tensor(c->block_table.bytes, FD_DTYPE_I32, 2, table_shape, strides);
    static const int32_t junk[] = {-1, INT32_MIN, INT32_MAX, 0};
    for (int64_t b = 0; b < B; ++b)
      for (int64_t j = 0; j < c->max_pages; ++j)
        fdt_store(FD_DTYPE_I32, c->block_table.bytes, at(&a->block_table, b, j, 0, 0),
                  j == 0 ? (double)c->num_pages : (double)junk[take(in, 4)]);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t j = 0; j * c->page_size < c->lens[b]; ++j)
        fdt_store(FD_DTYPE_I32, c->block_table.bytes, at(&a->block_table, b, j, 0, 0),
                  (double)fdt_int(rng, 0, c->num_pages - 1));
  }
  /* Data: every element a valid token reaches gets a random value; the rest
   * of every buffer stays NaN, so reading it shows in the result. */
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < Hq; ++h)
      for (int64_t d = 0; d < D; ++d)
        fdt_store(c->dtype, c->q.bytes, at(&a->q, b, 0, h, d), fdt_uniform(rng, -2.0, 2.0));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t j = 0; j < c->lens[b]; ++j)
      for (int64_t g = 0; g < Hkv; ++g)
        for (int64_t d = 0; d < D; ++d) {
          fdt_store(c->dtype, c->k.bytes, kv_at(c, &a->k, b, j, g, d), fdt_uniform(rng, -2.0, 2.0));
          fdt_store(c->dtype, c->v.bytes, kv_at(c, &a->v, b, j, g, d), fdt_uniform(rng, -1.0, 1.0));
        }

  /* Scale: the default, or a moderate one of either sign (scores stay in the
   * range where float32 scoring meets the f32 bound). */
  switch (take(in, 4)) {
    case 0:
    case 1: a->softmax_scale = 0.0; break;
    case 2: a->softmax_scale = fdt_uniform(rng, 0.05, 2.0) / sqrt((double)D); break;
    default: a->softmax_scale = -fdt_uniform(rng, 0.05, 2.0) / sqrt((double)D); break;
  }
  switch (take(in, 4)) {
    case 0:
    case 1: a->num_splits = 0; break;
    case 2: a->num_splits = (int32_t)(1 + take(in, 8)); break;
    default: a->num_splits = (int32_t)(1 + take(in, FD_MAX_SPLITS)); break;
  }
  /* Every split, empty or not, costs a partial state per row: bounded too. */
  const int64_t most_splits = (budget << 2) / ((B > 0 ? B : 1) * Hq * D);
  if (a->num_splits > 8 && a->num_splits > most_splits) a->num_splits = (int32_t)(most_splits > 8 ? most_splits : 8);
  /* A fixed split length (batch-invariant mode) in one automatic call in
   * four, within the same bound on splits. */
  if (a->num_splits == 0 && c->capacity > 0 && take(in, 4) == 3) {
    const int64_t limit = most_splits < 8 ? 8 : most_splits > FD_MAX_SPLITS ? FD_MAX_SPLITS : most_splits;
    const int64_t shortest = (c->capacity + limit - 1) / limit;
    a->split_tokens = shortest + (int64_t)take(in, (unsigned)(c->capacity < 4096 ? c->capacity : 4096));
  }
  if (take(in, 4) == 3) add_specials(in, c, rng);
  /* struct_size: this header's, an older caller's (no trailing padding), or a
   * newer caller's longer struct with zeros (the defaults) past ours. */
  switch (take(in, 3)) {
    case 0: break;
    case 1: a->struct_size = offsetof(fd_decode_args, num_splits) + sizeof a->num_splits; break;
    default: a->struct_size = sizeof c->call.raw; break;
  }
  c->q_len = 1;
  c->mask = FD_MASK_CAUSAL;
  add_variants(in, c, rng);
}

/* An f32 [q_heads] tensor (alibi_slopes, sinks) in a buffer of its own with
 * a layout of its own, holding values from `value`. */
static fd_tensor per_head_tensor(input *in, fuzz_case *c, buffer *b, fdt_rng *rng,
                                 double (*value)(fdt_rng *, int64_t, int64_t)) {
  int64_t strides[1];
  const int64_t shape[1] = {c->q_heads};
  buffer_alloc(b, lay_out(in, 1, shape, strides, 0, 0), sizeof(float), 0xff);
  for (int64_t h = 0; h < c->q_heads; ++h) fdt_store(FD_DTYPE_F32, b->bytes, h * strides[0], value(rng, h, c->q_heads));
  return fdt_tensor(b->bytes, FD_DTYPE_F32, 1, shape, strides);
}

/* The standard slopes 2^(-8 (h + 1) / H), or random ones in (0, 1]: positive,
 * as ALiBi's are, so that scores stay within float32's reach of the
 * reference (a negative slope over a long cache makes the largest score
 * hundreds of nats, where float32's rounding of it alone exceeds the f32
 * bound). */
static double slope_value(fdt_rng *rng, int64_t h, int64_t heads) {
  return fdt_int(rng, 0, 1) ? pow(2.0, -8.0 * (double)(h + 1) / (double)heads) : fdt_uniform(rng, 0.001, 1.0);
}

/* Sink logits about where the LSEs are, so that they matter. */
static double sink_value(fdt_rng *rng, int64_t h, int64_t heads) {
  (void)h;
  (void)heads;
  return fdt_uniform(rng, -3.0, 8.0);
}

/* Attention variants (flashdecode.h, "Attention variants"), drawn last so
 * that the bytes before them mean what they did before variants existed,
 * and only into a struct that has their fields. Several query tokens put
 * their dimension outermost in q, out and lse (or broadcast q's, stride 0),
 * in buffers grown to hold it, token 0 keeping what it had (specials
 * included) and the others getting values of their own; their number is
 * bounded like the rest of the work. */
static void add_variants(input *in, fuzz_case *c, fdt_rng *rng) {
  fd_decode_args *a = &c->call.args;
  if (a->struct_size < sizeof(fd_decode_args)) return;
  const int64_t work = (c->batch > 0 ? c->batch : 1) * c->q_heads * c->head_dim * (c->capacity > 0 ? c->capacity : 1);
  int64_t most_tokens = ((int64_t)1 << 14) / work;
  if (most_tokens > FD_MAX_Q_LEN) most_tokens = FD_MAX_Q_LEN;
  switch (take(in, 6)) {
    case 0:
    case 1:
    case 2: c->q_len = 1; break;
    case 3: c->q_len = 2; break;
    case 4: c->q_len = 1 + take(in, 8); break;
    default: c->q_len = 1 + take(in, FD_MAX_Q_LEN); break;
  }
  if (c->q_len > most_tokens) c->q_len = most_tokens > 1 ? most_tokens : 1;
  if (c->q_len > 1) {
    const int broadcast = take(in, 4) == 0;
    buffer *grown[3] = {&c->q, &c->out, &c->lse};
    fd_tensor *views[3] = {&a->q, &a->out, &a->lse};
    for (int i = 0; i < 3; ++i) {
      if (views[i]->data == NULL) continue;
      const int64_t slice = grown[i]->elements; /* 0 for an empty batch: nothing to grow */
      views[i]->shape[1] = c->q_len;
      views[i]->strides[1] = i == 0 && broadcast ? 0 : slice > 0 ? slice : 1;
      if (views[i]->strides[1] == 0 || slice == 0) continue;
      buffer bigger;
      buffer_alloc(&bigger, slice * c->q_len, grown[i]->element, 0xff);
      if (i == 0 && grown[i]->size) memcpy(bigger.bytes, grown[i]->bytes, grown[i]->size);
      free(grown[i]->bytes);
      *grown[i] = bigger;
      views[i]->data = bigger.bytes;
    }
    if (!broadcast) {
      for (int64_t b = 0; b < c->batch; ++b)
        for (int64_t t = 1; t < c->q_len; ++t)
          for (int64_t h = 0; h < c->q_heads; ++h)
            for (int64_t d = 0; d < c->head_dim; ++d)
              fdt_store(c->dtype, c->q.bytes, at(&a->q, b, t, h, d), fdt_uniform(rng, -2.0, 2.0));
    }
  }
  c->mask = take(in, 3) == 2 ? FD_MASK_NONE : FD_MASK_CAUSAL;
  a->mask = c->mask;
  /* A window of one key, a few, about the cache or beyond it. */
  switch (take(in, 6)) {
    case 3: c->window = 1; break;
    case 4: c->window = 1 + take(in, 16); break;
    case 5: c->window = c->capacity + (int64_t)take(in, 5) - 2; break;
    default: c->window = 0; break;
  }
  if (c->window < 0) c->window = 0;
  a->window_left = c->window;
  static const float softcaps[] = {0.5f, 1.0f, 5.0f, 30.0f};
  c->softcap = take(in, 4) == 3 ? (take(in, 2) ? softcaps[take(in, 4)] : (float)fdt_uniform(rng, 0.05, 50.0)) : 0.0f;
  a->logit_softcap = c->softcap;
  if (take(in, 4) == 3) a->alibi_slopes = per_head_tensor(in, c, &c->alibi_slopes, rng, slope_value);
  if (take(in, 4) == 3) a->sinks = per_head_tensor(in, c, &c->sinks, rng, sink_value);
  /* Ragged query lengths, in [0, q_len]; the padding tokens of q (when it
   * has its own rows per token) hold NaN, which must never be read. */
  if (c->batch > 0 && take(in, 4) == 3) {
    const int64_t shape[1] = {c->batch}, strides[1] = {1};
    buffer_alloc(&c->q_lens, c->batch, sizeof(int32_t), 0xff);
    c->q_counts = calloc((size_t)c->batch, sizeof *c->q_counts);
    if (c->q_counts == NULL) fuzz_fail("out of memory");
    for (int64_t b = 0; b < c->batch; ++b) {
      c->q_counts[b] = fdt_int(rng, 0, c->q_len);
      fdt_store(FD_DTYPE_I32, c->q_lens.bytes, b, (double)c->q_counts[b]);
      if (a->q.data == NULL || a->q.strides[1] == 0) continue;
      for (int64_t t = c->q_counts[b]; t < c->q_len; ++t)
        for (int64_t h = 0; h < c->q_heads; ++h)
          for (int64_t d = 0; d < c->head_dim; ++d) fdt_store(c->dtype, c->q.bytes, at(&a->q, b, t, h, d), NAN);
    }
    a->q_lens = fdt_tensor(c->q_lens.bytes, FD_DTYPE_I32, 1, shape, strides);
  }
}

/* Non-finite values where valid tokens reach (flashdecode.h, "Non-finite
 * values"), in one input in four: NaN or an infinity in a q or k element; a
 * run of keys whose scores one query head sees as -inf (masked) or +inf,
 * with or without a NaN in v under them; NaN in a v element. The scores'
 * non-finite parts are exact in float32 and float64 alike, as the values
 * around them are small. Infinities in v are left out: where a weight
 * underflows to 0 in float32 but not in float64, 0 * inf (NaN) and w * inf
 * (inf) differ by rounding, not by the rules. */
static void add_specials(input *in, fuzz_case *c, fdt_rng *rng) {
  const fd_decode_args *a = &c->call.args;
  const double values[3] = {NAN, INFINITY, -INFINITY};
  const int64_t Hq = c->q_heads, Hkv = c->kv_heads, D = c->head_dim, group = Hq / Hkv;
  int64_t filled[8], n = 0; /* sequences with tokens */
  for (int64_t b = 0; b < c->batch && n < 8; ++b)
    if (c->lens[b] > 0) filled[n++] = b;
  for (unsigned count = 1 + take(in, 3); count > 0; --count) {
    const unsigned kind = take(in, 4);
    if (kind == 0) {
      if (c->batch == 0) continue;
      const int64_t b = fdt_int(rng, 0, c->batch - 1), h = fdt_int(rng, 0, Hq - 1), d = fdt_int(rng, 0, D - 1);
      const double value = values[take(in, 3)];
      fdt_store(c->dtype, c->q.bytes, at(&a->q, b, 0, h, d), value);
      if (verbose >= 2)
        fprintf(stderr, "special: q[%lld][0][%lld][%lld] = %g\n", (long long)b, (long long)h, (long long)d, value);
      continue;
    }
    if (n == 0) continue;
    const int64_t b = filled[fdt_int(rng, 0, n - 1)], g = fdt_int(rng, 0, Hkv - 1), d = fdt_int(rng, 0, D - 1);
    const int64_t len = c->lens[b], j = fdt_int(rng, 0, len - 1);
    if (kind == 1) {
      const double value = values[take(in, 3)];
      fdt_store(c->dtype, c->k.bytes, kv_at(c, &a->k, b, j, g, d), value);
      if (verbose >= 2)
        fprintf(stderr, "special: k of sequence %lld token %lld head %lld [%lld] = %g\n", (long long)b, (long long)j,
                (long long)g, (long long)d, value);
    } else if (kind == 2) {
      fdt_store(c->dtype, c->v.bytes, kv_at(c, &a->v, b, j, g, d), NAN);
      if (verbose >= 2)
        fprintf(stderr, "special: v of sequence %lld token %lld head %lld [%lld] = nan\n", (long long)b, (long long)j,
                (long long)g, (long long)d);
    } else {
      /* Keys j..j+run-1 score -inf (or +inf) for head h of group g: the
       * sign of the infinity in k element d is that of q * scale there. */
      const int64_t run = fdt_int(rng, 1, len - j), h = g * group + fdt_int(rng, 0, group - 1);
      const double qd = fdt_load(c->dtype, c->q.bytes, at(&a->q, b, 0, h, d));
      const double sign = ((qd < 0) != (a->softmax_scale < 0)) ? -1.0 : 1.0;
      const double key = (take(in, 4) != 0 ? -sign : sign) * INFINITY;
      for (int64_t t = j; t < j + run; ++t) fdt_store(c->dtype, c->k.bytes, kv_at(c, &a->k, b, t, g, d), key);
      if (verbose >= 2)
        fprintf(stderr,
                "special: k of sequence %lld tokens %lld-%lld head %lld [%lld] = %g: query head %lld scores %s\n",
                (long long)b, (long long)j, (long long)(j + run - 1), (long long)g, (long long)d, key, (long long)h,
                key * sign < 0 ? "-inf" : "+inf");
      if (take(in, 2)) {
        const int64_t t = fdt_int(rng, j, j + run - 1), e = fdt_int(rng, 0, D - 1);
        fdt_store(c->dtype, c->v.bytes, kv_at(c, &a->v, b, t, g, e), NAN);
        if (verbose >= 2)
          fprintf(stderr, "special: v of sequence %lld token %lld head %lld [%lld] = nan\n", (long long)b, (long long)t,
                  (long long)g, (long long)e);
      }
    }
  }
}

/* The tensors of a call, by index, and their buffers. */
enum { TENSORS = 9 };
static const char *const tensor_names[TENSORS] = {
    "q", "k", "v", "out", "lse", "seq_lens", "block_table", "alibi_slopes", "sinks"};

static fd_tensor *tensor_at(fd_decode_args *a, int index) {
  fd_tensor *all[TENSORS] = {&a->q,    &a->k, &a->v, &a->out, &a->lse, &a->seq_lens, &a->block_table, &a->alibi_slopes,
                             &a->sinks};
  return all[index];
}

static buffer *buffer_at(fuzz_case *c, int index) {
  buffer *all[TENSORS] = {&c->q,    &c->k, &c->v, &c->out, &c->lse, &c->seq_lens, &c->block_table, &c->alibi_slopes,
                          &c->sinks};
  return all[index];
}

/* A present tensor, drawn: q k v out, and lse seq_lens block_table
 * alibi_slopes sinks when given. */
static int pick_tensor(input *in, fuzz_case *c) {
  int present[TENSORS], n = 0;
  for (int i = 0; i < TENSORS; ++i)
    if (tensor_at(&c->call.args, i)->data != NULL) present[n++] = i;
  return present[take(in, (unsigned)n)];
}

/* Sets extent d of tensor i. A dimension of extent 1 may have had any
 * stride: it gets one that keeps the tensor valid but for the extent (1 for
 * head_dim, else past every element). */
static void set_extent(fuzz_case *c, int i, int d, int64_t extent) {
  fd_tensor *t = tensor_at(&c->call.args, i);
  if (t->shape[d] <= 1) t->strides[d] = (t->ndim == 4 && d == 3) ? 1 : buffer_at(c, i)->elements + 1;
  t->shape[d] = extent;
}

/* Makes exactly one field invalid; returns 0 if the drawn one does not apply
 * to this problem (the input then stays valid). */
static int mutate(input *in, fuzz_case *c, unsigned which) {
  fd_decode_args *a = &c->call.args;
  c->stage = ARGS;
  switch (which) {
    case MUT_NULL_DATA: {
      tensor_at(a, (int)take(in, 4))->data = NULL; /* q k v out: required */
      c->expect = FD_ERROR_NULL_POINTER;
      c->mutation = "a required tensor's data is NULL";
      return 1;
    }
    case MUT_UNKNOWN_DTYPE: {
      static const int raw[] = {4, -1, 1000, INT32_MIN};
      set_raw_dtype(tensor_at(a, pick_tensor(in, c)), raw[take(in, 4)]);
      c->expect = FD_ERROR_INVALID_DTYPE;
      c->mutation = "an unknown dtype";
      return 1;
    }
    case MUT_WRONG_DTYPE: {
      /* A known dtype of the wrong family or size for its role; pointers
       * from malloc are aligned for any of them. */
      fd_tensor *t = tensor_at(a, pick_tensor(in, c));
      const fd_dtype was = t->dtype;
      if (t == &a->out) {
        /* Neither q's dtype nor f32. */
        t->dtype = take(in, 2) ? FD_DTYPE_I32 : c->dtype == FD_DTYPE_F16 ? FD_DTYPE_BF16 : FD_DTYPE_F16;
      } else if (t == &a->lse || t == &a->seq_lens || t == &a->block_table) {
        t->dtype = t == &a->lse ? FD_DTYPE_I32 : FD_DTYPE_F32;
      } else if (t == &a->alibi_slopes || t == &a->sinks) {
        t->dtype = take(in, 2) ? FD_DTYPE_F16 : FD_DTYPE_I32;
      } else {
        t->dtype = was == FD_DTYPE_F16 ? FD_DTYPE_BF16 : was == FD_DTYPE_BF16 ? FD_DTYPE_I32 : FD_DTYPE_F16;
      }
      c->expect = FD_ERROR_INVALID_DTYPE;
      c->mutation = "a dtype wrong for its role";
      return 1;
    }
    case MUT_MISALIGNED: {
      const int i = pick_tensor(in, c);
      if (buffer_at(c, i)->size == 0) return 0;
      tensor_at(a, i)->data = buffer_at(c, i)->bytes + 1; /* inside the buffer, off its element size */
      c->expect = FD_ERROR_INVALID_ARGUMENT;
      c->mutation = "data not aligned to its elements";
      return 1;
    }
    case MUT_NDIM: {
      static const int32_t ndims[] = {0, 2, 3, 4, 5, -1};
      fd_tensor *t = tensor_at(a, pick_tensor(in, c));
      const int32_t was = t->ndim;
      t->ndim = ndims[take(in, 6)];
      if (t->ndim == was) t->ndim = was + 1;
      c->expect = FD_ERROR_INVALID_SHAPE;
      c->mutation = "a wrong ndim";
      return 1;
    }
    case MUT_NEGATIVE_SHAPE: {
      fd_tensor *t = tensor_at(a, pick_tensor(in, c));
      t->shape[take(in, (unsigned)t->ndim)] = take(in, 2) ? -1 : INT64_MIN;
      c->expect = FD_ERROR_INVALID_SHAPE;
      c->mutation = "a negative extent";
      return 1;
    }
    case MUT_NEGATIVE_STRIDE: {
      fd_tensor *t = tensor_at(a, pick_tensor(in, c));
      t->strides[take(in, (unsigned)t->ndim)] = take(in, 2) ? -1 : INT64_MIN;
      c->expect = FD_ERROR_INVALID_STRIDE;
      c->mutation = "a negative stride";
      return 1;
    }
    case MUT_HEAD_DIM_STRIDE: {
      if (c->head_dim < 2) return 0;
      tensor_at(a, (int)take(in, 4))->strides[3] = take(in, 2) ? 0 : 2; /* q k v out */
      c->expect = FD_ERROR_INVALID_STRIDE;
      c->mutation = "head_dim not contiguous";
      return 1;
    }
    case MUT_OFFSET_OVERFLOW: {
      /* The furthest element beyond 64-bit element offsets. */
      fd_tensor *t = tensor_at(a, (int)take(in, 4)); /* q k v out */
      const int d = (int)take(in, 3);
      if (t->shape[d] < 3) t->shape[d] = 3;
      t->strides[d] = INT64_MAX / 2 + 1;
      c->expect = FD_ERROR_INVALID_STRIDE;
      c->mutation = "extents overflow 64-bit offsets";
      return 1;
    }
    case MUT_HEAD_DIM:
      set_extent(c, 0, 3, take(in, 2) ? 0 : FD_MAX_HEAD_DIM + 1);
      c->expect = FD_ERROR_INVALID_HEAD_DIM;
      c->mutation = "head_dim out of range";
      return 1;
    case MUT_HEAD_COUNT:
      switch (take(in, 3)) {
        case 0:
          if (c->kv_heads < 2) return 0;
          a->q.shape[2] += 1; /* not a multiple of kv_heads */
          break;
        case 1: set_extent(c, 0, 2, take(in, 2) ? 0 : FD_MAX_HEADS + 1); break;
        default: {
          const int64_t heads = take(in, 2) ? 0 : FD_MAX_HEADS + 1;
          set_extent(c, 1, 2, heads);
          set_extent(c, 2, 2, heads);
          break;
        }
      }
      c->expect = FD_ERROR_INVALID_HEAD_COUNT;
      c->mutation = "a head count out of range or not a multiple";
      return 1;
    case MUT_Q_LEN:
      /* 0, or more than FD_MAX_Q_LEN (checked before out's q_len is
       * compared with q's, and before anything is read). */
      set_extent(c, 0, 1, take(in, 2) ? 0 : FD_MAX_Q_LEN + 1 + (int64_t)take(in, 3));
      c->expect = FD_ERROR_INVALID_SHAPE;
      c->mutation = "q_len 0 or above FD_MAX_Q_LEN";
      return 1;
    case MUT_EXTENT: {
      /* One extent disagrees with the tensor it must match. */
      switch (take(in, 7)) {
        case 0: {
          const int d = (int)take(in, 4);
          if (d == 3 && take(in, 2)) {
            set_extent(c, 1, 3, a->k.shape[3] + 1); /* head_dim of k against q */
          } else {
            set_extent(c, 2, d, a->v.shape[d] + 1);
          }
          break;
        }
        case 1: {
          const int d = (int)take(in, 4);
          set_extent(c, 3, d, a->out.shape[d] + 1);
          break;
        }
        case 2: {
          if (!c->with_lse) return 0;
          const int d = (int)take(in, 3);
          set_extent(c, 4, d, a->lse.shape[d] + 1);
          break;
        }
        case 3:
          if (!c->with_lens) return 0;
          set_extent(c, 5, 0, a->seq_lens.shape[0] + 1);
          break;
        case 4:
          if (!c->paged) return 0;
          set_extent(c, 6, 0, a->block_table.shape[0] + 1);
          break;
        case 5: {
          const int i = take(in, 2) ? 7 : 8; /* alibi_slopes or sinks: [q_heads] */
          if (tensor_at(a, i)->data == NULL) return 0;
          set_extent(c, i, 0, take(in, 2) ? c->q_heads + 1 : c->q_heads - 1);
          break;
        }
        default:
          if (c->paged) return 0;
          set_extent(c, 1, 0, a->k.shape[0] + 1); /* dense batch against q */
          set_extent(c, 2, 0, a->v.shape[0] + 1);
          break;
      }
      c->expect = FD_ERROR_INVALID_SHAPE;
      c->mutation = "an extent disagreeing with another tensor";
      return 1;
    }
    case MUT_OUTPUT_OVERLAP: {
      /* Two elements of an output at one address: a stride of 0 for batch
       * or heads, or of 1 next to a contiguous head_dim (out). */
      if (c->batch == 0) return 0; /* an empty output cannot overlap */
      fd_tensor *t = c->with_lse && take(in, 2) ? &a->lse : &a->out;
      int dims[2], n = 0;
      if (t->shape[0] > 1) dims[n++] = 0;
      if (t->shape[2] > 1) dims[n++] = 2;
      if (n == 0) return 0;
      t->strides[dims[take(in, (unsigned)n)]] = t == &a->out && a->out.shape[3] > 1 && take(in, 2) ? 1 : 0;
      c->expect = FD_ERROR_INVALID_STRIDE;
      c->mutation = "an output's elements share memory";
      return 1;
    }
    case MUT_LSE_IN_OUT:
      if (!c->with_lse || c->batch == 0) return 0;
      a->lse.data = c->out.bytes; /* aligned to 4: the start of a malloc block */
      c->expect = FD_ERROR_INVALID_ARGUMENT;
      c->mutation = "lse shares memory with out";
      return 1;
    case MUT_SCALE: {
      static const double scales[] = {NAN, INFINITY, -INFINITY, 1e39, -1e39, 1e-50, 3e38};
      a->softmax_scale = scales[take(in, 7)];
      c->expect = FD_ERROR_INVALID_ARGUMENT;
      c->mutation = "softmax_scale not finite, or not a usable float";
      return 1;
    }
    case MUT_SPLITS: {
      static const int32_t splits[] = {-1, FD_MAX_SPLITS + 1, INT32_MIN, INT32_MAX};
      static const int64_t split_tokens[] = {-1, INT64_MIN, (int64_t)FD_MAX_KV_LEN + 1};
      a->struct_size = sizeof(fd_decode_args); /* split_tokens is read */
      switch (take(in, 4)) {
        case 0: a->num_splits = splits[take(in, 4)]; break;
        case 1: a->split_tokens = split_tokens[take(in, 3)]; break;
        case 2: /* both set */
          a->num_splits = (int32_t)(1 + take(in, 8));
          a->split_tokens = 1 + (int64_t)take(in, 100);
          break;
        default: /* more splits than FD_MAX_SPLITS */
          if (c->capacity <= FD_MAX_SPLITS) return 0;
          a->num_splits = 0;
          a->split_tokens = 1 + (int64_t)take(in, (unsigned)((c->capacity - 1) / FD_MAX_SPLITS));
          if ((c->capacity + a->split_tokens - 1) / a->split_tokens <= FD_MAX_SPLITS) return 0;
          break;
      }
      c->expect = FD_ERROR_INVALID_SPLITS;
      c->mutation = "num_splits or split_tokens out of range, or both set";
      return 1;
    }
    case MUT_STRUCT_SIZE: {
      const size_t sizes[] = {0, sizeof(size_t), offsetof(fd_decode_args, num_splits) + sizeof(int32_t) - 1, 4097,
                              SIZE_MAX};
      a->struct_size = sizes[take(in, 5)];
      c->expect = FD_ERROR_INVALID_ARGUMENT;
      c->mutation = "args.struct_size too small or above 4096";
      return 1;
    }
    case MUT_NEWER_FIELD:
      /* A newer caller's field this library does not know, set. */
      a->struct_size = sizeof c->call.raw;
      c->call.raw[sizeof c->call.args + take(in, sizeof c->call.raw - sizeof c->call.args)] =
          (unsigned char)(1 + take(in, 255));
      c->expect = FD_ERROR_UNSUPPORTED;
      c->mutation = "a non-zero byte past fd_decode_args (a newer caller's field)";
      return 1;
    case MUT_PAGE_SIZE:
      if (!c->paged) return 0;
      if (take(in, 2)) {
        a->k.shape[1] = a->v.shape[1] = 0;
      } else {
        /* max_pages * page_size beyond FD_MAX_KV_LEN. */
        set_extent(c, 6, 1, FD_MAX_KV_LEN / c->page_size + 1);
      }
      c->expect = FD_ERROR_INVALID_LENGTH;
      c->mutation = "page_size 0, or a paged capacity beyond FD_MAX_KV_LEN";
      return 1;
    case MUT_CAPACITY:
      if (c->paged) return 0;
      set_extent(c, 1, 1, (int64_t)FD_MAX_KV_LEN + 1);
      set_extent(c, 2, 1, (int64_t)FD_MAX_KV_LEN + 1);
      c->expect = FD_ERROR_INVALID_LENGTH;
      c->mutation = "a dense capacity beyond FD_MAX_KV_LEN";
      return 1;
    case MUT_BATCH:
      set_extent(c, 0, 0, (int64_t)FD_MAX_BATCH + 1);
      c->expect = FD_ERROR_INVALID_SHAPE;
      c->mutation = "batch beyond FD_MAX_BATCH";
      return 1;
    case MUT_SEQ_LEN: {
      if (!c->with_lens || c->batch == 0) return 0;
      const int64_t b = take(in, (unsigned)c->batch);
      fdt_store(FD_DTYPE_I32, c->seq_lens.bytes, b * a->seq_lens.strides[0],
                take(in, 2) ? -1.0 : (double)(c->capacity + 1 + take(in, 3)));
      c->stage = CONTENTS;
      c->expect = FD_ERROR_INVALID_LENGTH;
      c->mutation = "a sequence length outside [0, capacity]";
      return 1;
    }
    case MUT_BLOCK_TABLE: {
      if (!c->paged) return 0;
      int64_t used[64][2];
      int n = 0;
      for (int64_t b = 0; b < c->batch; ++b)
        for (int64_t j = 0; j * c->page_size < c->lens[b] && n < 64; ++j) {
          used[n][0] = b;
          used[n++][1] = j;
        }
      if (n == 0) return 0;
      const int i = (int)take(in, (unsigned)n);
      static const int32_t bad[] = {-1, INT32_MIN, INT32_MAX};
      const double page = take(in, 2) ? (double)c->num_pages : (double)bad[take(in, 3)];
      fdt_store(FD_DTYPE_I32, c->block_table.bytes, at(&a->block_table, used[i][0], used[i][1], 0, 0), page);
      c->stage = CONTENTS;
      c->expect = FD_ERROR_INVALID_BLOCK_TABLE;
      c->mutation = "a block table entry outside the page pool";
      return 1;
    }
    case MUT_MASK: {
      static const int masks[] = {2, 7, -1, INT32_MIN};
      a->struct_size = sizeof(fd_decode_args); /* mask is read */
      memcpy(&a->mask, &masks[take(in, 4)], sizeof(int));
      c->expect = FD_ERROR_INVALID_ARGUMENT;
      c->mutation = "mask neither FD_MASK_CAUSAL nor FD_MASK_NONE";
      return 1;
    }
    case MUT_SOFTCAP: {
      const float softcaps[] = {-1.0f, -1e-30f, NAN, INFINITY, -INFINITY};
      a->struct_size = sizeof(fd_decode_args);
      a->logit_softcap = softcaps[take(in, 5)];
      c->expect = FD_ERROR_INVALID_ARGUMENT;
      c->mutation = "logit_softcap negative or not finite";
      return 1;
    }
    case MUT_WINDOW:
      a->struct_size = sizeof(fd_decode_args);
      a->window_left = take(in, 2) ? -1 - (int64_t)take(in, 100) : INT64_MIN;
      c->expect = FD_ERROR_INVALID_ARGUMENT;
      c->mutation = "window_left negative";
      return 1;
    case MUT_PER_HEAD_OVERLAP: {
      /* Slopes or sinks in out's memory (or lse's): an input under an output. */
      if (c->out.size < c->q_heads * sizeof(float)) return 0;
      fd_tensor *t = take(in, 2) ? &a->alibi_slopes : &a->sinks;
      const int64_t shape[1] = {c->q_heads}, strides[1] = {1};
      const buffer *target =
          c->with_lse && c->lse.size >= c->q_heads * sizeof(float) && take(in, 2) ? &c->lse : &c->out;
      *t = fdt_tensor(target->bytes, FD_DTYPE_F32, 1, shape, strides); /* a malloc block: aligned for f32 */
      a->struct_size = sizeof(fd_decode_args);
      c->expect = FD_ERROR_INVALID_ARGUMENT;
      c->mutation = "alibi_slopes or sinks in an output's memory";
      return 1;
    }
  }
  return 0;
}

/* ---- the checks ------------------------------------------------------------------- */
static const char *status_name(fd_status s) { return fd_status_string(s); }

/* The calls that failed must have said why. */
static void check_plan(const fuzz_case *c, const fd_plan_info *info, size_t info_size, size_t bytes) {
  const fd_decode_args *a = &c->call.args;
#define HAS(field) (offsetof(fd_plan_info, field) + sizeof info->field <= info_size)
  if (HAS(backend) && info->backend != FD_BACKEND_CPU) fuzz_fail("plan: backend %d", (int)info->backend);
  /* split_tokens as the library reads it: an older caller's struct lacks it. */
  const int64_t split_tokens =
      a->struct_size >= offsetof(fd_decode_args, split_tokens) + sizeof a->split_tokens ? a->split_tokens : 0;
  /* Plans cut the keys a sequence's query tokens can see: the capacity, or
   * less under a window (core/problem.h, planned_kv_span). */
  const int64_t span = c->window > 0 && c->window + c->q_len - 1 < c->capacity ? c->window + c->q_len - 1 : c->capacity;
  if (split_tokens > 0 && HAS(split_tokens)) {
    const int64_t expected = span > 0 ? (span + split_tokens - 1) / split_tokens : 1;
    if (info->split_tokens != split_tokens || info->num_splits != expected)
      fuzz_fail("plan: %d splits of %lld tokens, asked for splits of %lld (%lld keys)", (int)info->num_splits,
                (long long)info->split_tokens, (long long)split_tokens, (long long)span);
  }
  if (HAS(num_splits)) {
    if (a->num_splits > 0 && info->num_splits != a->num_splits)
      fuzz_fail("plan: %d splits, %d requested", (int)info->num_splits, (int)a->num_splits);
    if (info->num_splits < 1 || info->num_splits > FD_MAX_SPLITS) fuzz_fail("plan: %d splits", (int)info->num_splits);
  }
  if (HAS(split_tokens)) {
    const int64_t n = span;
    if (info->split_tokens < 1 || info->split_tokens * info->num_splits < n)
      fuzz_fail("plan: %d splits of %lld tokens do not cover %lld", (int)info->num_splits,
                (long long)info->split_tokens, (long long)n);
    if (a->num_splits == 0 && (int64_t)(info->num_splits - 1) * info->split_tokens >= (n > 0 ? n : 1))
      fuzz_fail("plan: automatic %d splits of %lld tokens leave one empty (%lld keys)", (int)info->num_splits,
                (long long)info->split_tokens, (long long)n);
  }
  if (HAS(workspace_bytes)) {
    if (info->workspace_bytes != bytes)
      fuzz_fail("fd_describe_plan: %zu workspace bytes, fd_workspace_size: %zu", info->workspace_bytes, bytes);
    const size_t states = (size_t)(c->batch * c->q_len * c->q_heads) * (size_t)info->num_splits;
    if (bytes < states * (size_t)(2 + c->head_dim) * sizeof(float))
      fuzz_fail("workspace: %zu bytes cannot hold %zu partial states of head_dim %lld", bytes, states,
                (long long)c->head_dim);
  }
  if (HAS(kernel) && (info->kernel == NULL || strcmp(info->kernel, "cpu") != 0))
    fuzz_fail("plan: kernel %s", info->kernel ? info->kernel : "(null)");
  if (HAS(merge) && info->merge != (c->batch == 0 ? FD_MERGE_NONE : FD_MERGE_SEPARATE))
    fuzz_fail("plan: merge %d for batch %lld", (int)info->merge, (long long)c->batch);
  if (HAS(launches) && info->launches != 0) fuzz_fail("plan: %d launches on the CPU", (int)info->launches);
  if (HAS(blocks) && info->blocks != c->batch * c->kv_heads * (c->batch == 0 ? 0 : info->num_splits))
    fuzz_fail("plan: %lld blocks for batch %lld, %lld KV heads, %d splits", (long long)info->blocks,
              (long long)c->batch, (long long)c->kv_heads, (int)info->num_splits);
#undef HAS
}

/* After a successful decode: every element written, every byte between the
 * elements untouched. */
static void check_written(const char *name, const buffer *b, const fd_tensor *t, int ndim) {
  if (b->size == 0) return;
  unsigned char *is_element = element_mask(b, t, ndim);
  for (int64_t e = 0; e < b->elements; ++e) {
    const int poisoned = all_bytes(b->bytes + (size_t)e * b->element, b->element, 0xff);
    if (is_element[e] && poisoned) fuzz_fail("%s: element at offset %lld was not written", name, (long long)e);
    if (!is_element[e] && !poisoned)
      fuzz_fail("%s: byte outside every element (offset %lld) was written", name, (long long)e);
  }
  free(is_element);
}

/* Whether v element d of token j of sequence b, KV head g is NaN, for a key
 * that query token t sees, only where that key is masked (scores -inf) for
 * query head h: a NaN the header lets a row drop (the CPU backend does if
 * every key before it in its split or 32-token block is masked too). Scores
 * as the reference makes them: a softcap turns -inf into -c, a key that
 * counts. */
static int only_masked_nan(const fdt_problem *p, int64_t b, int64_t t, int64_t h, int64_t d) {
  const fdt_case *c = &p->c;
  const int64_t D = c->head_dim, g = h / (c->q_heads / c->kv_heads), len = p->lens[b];
  const double scale = c->softmax_scale != 0.0 ? c->softmax_scale : 1.0 / sqrt((double)D);
  const double *q = p->ref_q + ((b * fdt_q_len(c) + t) * c->q_heads + h) * D;
  int masked_nan = 0;
  for (int64_t j = 0; j < len; ++j) {
    if (!fdt_sees(c, len, p->q_counts[b], t, j)) continue; /* never read */
    const double *k = p->ref_k + ((b * c->kv_len + j) * c->kv_heads + g) * D;
    if (!isnan(p->ref_v[((b * c->kv_len + j) * c->kv_heads + g) * D + d])) continue;
    double score = 0.0;
    for (int64_t e = 0; e < D; ++e) score += q[e] * k[e];
    score *= scale;
    if (c->softcap > 0.0) score = c->softcap * tanh(score / c->softcap);
    if (score != -INFINITY) return 0; /* NaN under a key that counts: the row must be NaN */
    masked_nan = 1;
  }
  return masked_nan;
}

/* Whether query token t of sequence b sees any key. */
static int sees_any(const fdt_problem *p, int64_t b, int64_t t) {
  for (int64_t j = 0; j < p->lens[b]; ++j)
    if (fdt_sees(&p->c, p->lens[b], p->q_counts[b], t, j)) return 1;
  return 0;
}

/* How far row (b, t, h)'s float32 LSE may lie from the float64 one: 1e-4,
 * plus float32 rounding relative to the sizes of what it is computed from.
 * Each score is a float32 dot product of head_dim terms, scaled, with its
 * ALiBi bias, and the LSE moves by at most its largest score error (it is
 * 1-Lipschitz in the scores); m + log(l) then rounds once more at the
 * LSE's own size (a sink's included). Bounded by (head_dim + 4) ulps of
 * the largest |scale| sum |q_d k_d| + |bias| of the keys the row sees and
 * of |lse|, with a factor 2 to spare. */
static double lse_tolerance(const fdt_problem *p, int64_t b, int64_t t, int64_t h, double lse) {
  const fdt_case *c = &p->c;
  const int64_t D = c->head_dim, group = c->q_heads / c->kv_heads, Lq = fdt_q_len(c), len = p->lens[b];
  const double scale = fabs(c->softmax_scale != 0.0 ? c->softmax_scale : 1.0 / sqrt((double)D));
  const double *q = p->ref_q + ((b * Lq + t) * c->q_heads + h) * D;
  double largest = 0.0;
  for (int64_t j = 0; j < len; ++j) {
    if (!fdt_sees(c, len, p->q_counts[b], t, j)) continue;
    const double *k = p->ref_k + ((b * c->kv_len + j) * c->kv_heads + h / group) * D;
    double size = 0.0;
    for (int64_t d = 0; d < D; ++d) size += fabs(q[d] * k[d]);
    size *= scale;
    if (p->ref_alibi_slopes) size += fabs(p->ref_alibi_slopes[h] * (double)(j - (len - p->q_counts[b] + t)));
    if (size > largest) largest = size;
  }
  return 1e-4 + 2.0 * (double)(D + 4) * ldexp(1.0, -23) * (largest + fabs(lse));
}

/* A dtype's smallest normal value: below it the spacing of its values stops
 * shrinking (subnormals), so a smaller element is stored no more precisely,
 * in absolute terms, than one of this size. */
static double smallest_normal(fd_dtype dtype) { return dtype == FD_DTYPE_F16 ? ldexp(1.0, -14) : ldexp(1.0, -126); }

/* A [q_heads] f32 tensor read back into float64, or NULL if absent. */
static double *read_per_head(const fuzz_case *c, const fd_tensor *t) {
  if (t->data == NULL) return NULL;
  double *values = calloc((size_t)c->q_heads, sizeof(double));
  if (values == NULL) fuzz_fail("out of memory");
  for (int64_t h = 0; h < c->q_heads; ++h) values[h] = fdt_load(FD_DTYPE_F32, t->data, h * t->strides[0]);
  return values;
}

/* Against the float64 reference of tests/support, on the logical tensors
 * read back from storage, every query token of every sequence. The measure
 * is fdt_check's (norm over the whole output, fdt_error_bound; LSE within
 * 1e-4, plus float32 rounding at the scores' size (lse_tolerance): the
 * fuzzer's scales and values make scores of thousands; tokens that see no
 * key give zeros and LSE -inf, or the sink), but
 * relative to the norm of sum_j w_j |v_j| / l, the magnitude of what each
 * output element sums, rather than to the norm of the output: the fuzzer's
 * outputs are often a single element, whose weighted sum of values in
 * [-1, 1] can cancel to near zero, and float32 summation error is bounded
 * relative to the terms, not to their sum. Each element's magnitude is at
 * least the output dtype's smallest normal value: a sink can take all but
 * 1e-6 (or 1e-12) of a row's weight, and f16 stores such an output as a
 * subnormal, with an absolute precision of 2^-24 (or as 0). NaN and -inf must be where the
 * reference has them (flashdecode.h, "Non-finite values"), but for a NaN in
 * v under masked keys, which the header lets a row drop (the element then
 * matches the reference without the masked keys' NaN). */
static void check_numerics(const fuzz_case *c) {
  const fd_decode_args *a = &c->call.args;
  const int64_t B = c->batch, Lq = c->q_len, Hq = c->q_heads, Hkv = c->kv_heads, D = c->head_dim, N = c->capacity;
  fdt_problem p;
  memset(&p, 0, sizeof p);
  p.c.batch = B;
  p.c.q_heads = Hq;
  p.c.kv_heads = Hkv;
  p.c.head_dim = D;
  p.c.kv_len = N;
  p.c.softmax_scale = a->softmax_scale;
  p.c.q_len = Lq;
  p.c.mask = c->mask;
  p.c.window = c->window;
  p.c.softcap = c->softcap;
  p.lens = c->lens;
  int64_t *q_counts = calloc((size_t)B + 1, sizeof *q_counts);
  if (q_counts == NULL) fuzz_fail("out of memory");
  for (int64_t b = 0; b < B; ++b) q_counts[b] = c->q_counts ? c->q_counts[b] : Lq;
  p.q_counts = q_counts;
  p.ref_alibi_slopes = read_per_head(c, &a->alibi_slopes);
  p.ref_sinks = read_per_head(c, &a->sinks);
  const size_t kv = (size_t)(B * N * Hkv * D) + 1, rows = (size_t)(B * Lq * Hq) + 1, outs = rows * (size_t)D;
  p.ref_q = calloc(outs, sizeof(double));
  p.ref_k = calloc(kv, sizeof(double));
  double *v = calloc(kv, sizeof(double)), *expect_out = calloc(outs, sizeof(double));
  double *expect_lse = calloc(rows, sizeof(double)), *unmasked = calloc(outs, sizeof(double));
  double *magnitude = calloc(outs, sizeof(double)), *unused_lse = calloc(rows, sizeof(double));
  if (!p.ref_q || !p.ref_k || !v || !expect_out || !expect_lse || !unmasked || !magnitude || !unused_lse)
    fuzz_fail("out of memory");
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < Lq; ++t)
      for (int64_t h = 0; h < Hq; ++h)
        for (int64_t d = 0; d < D; ++d)
          p.ref_q[((b * Lq + t) * Hq + h) * D + d] = fdt_load(c->dtype, c->q.bytes, at(&a->q, b, t, h, d));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t j = 0; j < c->lens[b]; ++j)
      for (int64_t g = 0; g < Hkv; ++g)
        for (int64_t d = 0; d < D; ++d) {
          const int64_t i = ((b * N + j) * Hkv + g) * D + d;
          p.ref_k[i] = kv_value(c, 0, b, j, g, d);
          v[i] = kv_value(c, 1, b, j, g, d);
        }
  /* The reference; without v's NaNs (for elements where only masked keys
   * have them); and the magnitude, from |v| without NaNs. */
  p.ref_v = v;
  p.expect_out = expect_out;
  p.expect_lse = expect_lse;
  fdt_reference(&p);
  p.ref_v = calloc(kv, sizeof(double));
  if (p.ref_v == NULL) fuzz_fail("out of memory");
  for (size_t i = 0; i < kv; ++i) p.ref_v[i] = isnan(v[i]) ? 0.0 : v[i];
  p.expect_out = unmasked;
  p.expect_lse = unused_lse;
  fdt_reference(&p);
  for (size_t i = 0; i < kv; ++i) p.ref_v[i] = fabs(p.ref_v[i]);
  p.expect_out = magnitude;
  fdt_reference(&p);
  free(p.ref_v);
  p.ref_v = v;

  double diff2 = 0.0, magnitude2 = 0.0;
  const double floor_magnitude = smallest_normal(c->out_dtype);
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < Lq; ++t) {
      const int empty = !sees_any(&p, b, t);
      for (int64_t h = 0; h < Hq; ++h) {
        const int64_t row = (b * Lq + t) * Hq + h;
        for (int64_t d = 0; d < D; ++d) {
          const int64_t i = row * D + d;
          const double got = fdt_load(c->out_dtype, c->out.bytes, at(&a->out, b, t, h, d));
          double want = expect_out[i];
          if (isnan(want) && !isnan(got) && !isnan(expect_lse[row]) && only_masked_nan(&p, b, t, h, d)) {
            /* flashdecode.h, "Non-finite values": a NaN in v under masked keys
             * may or may not reach the row; without it, the value without them. */
            want = unmasked[i];
            if (verbose)
              fprintf(stderr, "fuzz_decode: out[%lld][%lld][%lld][%lld] is %g: a NaN in v under masked keys left out\n",
                      (long long)b, (long long)t, (long long)h, (long long)d, got);
          }
          if (isnan(want) != isnan(got) || (!isnan(want) && !isfinite(got)))
            fuzz_fail("out[%lld][%lld][%lld][%lld] is %g, float64 reference %g (flashdecode.h, \"Non-finite values\")",
                      (long long)b, (long long)t, (long long)h, (long long)d, got, want);
          if (isnan(want)) continue;
          if (empty && got != 0.0)
            fuzz_fail("out[%lld][%lld][%lld][%lld] is %g for a query token that sees no key", (long long)b,
                      (long long)t, (long long)h, (long long)d, got);
          diff2 += (got - want) * (got - want);
          const double m = magnitude[i] > floor_magnitude ? magnitude[i] : floor_magnitude;
          magnitude2 += m * m;
        }
        if (c->with_lse) {
          const double got = fdt_load(FD_DTYPE_F32, c->lse.bytes, at(&a->lse, b, t, h, 0));
          const double want = expect_lse[row];
          if (isnan(want) || isinf(want) || empty) { /* a NaN row; an empty or all-masked one (-inf, or the sink) */
            if (isnan(want) != isnan(got) || (!isnan(want) && got != want))
              fuzz_fail("lse[%lld][%lld][%lld] is %g, float64 reference %g", (long long)b, (long long)t, (long long)h,
                        got, want);
          } else if (!(fabs(got - want) <= lse_tolerance(&p, b, t, h, want))) {
            fuzz_fail("lse[%lld][%lld][%lld] is %.9g, float64 reference %.9g", (long long)b, (long long)t, (long long)h,
                      got, want);
          }
        }
      }
    }
  }
  const double rel = magnitude2 > 0.0 ? sqrt(diff2 / magnitude2) : sqrt(diff2);
  const double bound = fdt_error_bound(c->out_dtype);
  if (!(rel <= bound))
    fuzz_fail("out: ||out - ref|| / ||sum w|v| / l|| = %.3g, bound %.1g (||out - ref|| = %.3g)", rel, bound,
              sqrt(diff2));
  free(p.ref_q);
  free(p.ref_k);
  free(q_counts);
  free(p.ref_alibi_slopes);
  free(p.ref_sinks);
  free(v);
  free(expect_out);
  free(expect_lse);
  free(unmasked);
  free(magnitude);
  free(unused_lse);
}

static void describe_case(const fuzz_case *c, unsigned threads, unsigned workspace_mode) {
  char *cursor = problem_text;
  size_t left = sizeof problem_text;
  const fd_decode_args *a = &c->call.args;
  int n =
      snprintf(cursor, left,
               "  problem: batch=%lld q_heads=%lld kv_heads=%lld head_dim=%lld capacity=%lld %s%s -> %s%s%s "
               "page_size=%lld max_pages=%lld num_pages=%lld\n"
               "  call: struct_size=%zu softmax_scale=%.17g num_splits=%d split_tokens=%lld threads=%u workspace=%s\n"
               "  variants: q_len=%lld q_lens=%s mask=%s window=%lld softcap=%.9g alibi=%s sinks=%s\n"
               "  invalid: %s (expect %s)\n",
               (long long)c->batch, (long long)c->q_heads, (long long)c->kv_heads, (long long)c->head_dim,
               (long long)c->capacity, c->paged ? "paged " : "", fdt_dtype_name(c->dtype), fdt_dtype_name(c->out_dtype),
               c->with_lens ? " seq_lens" : "", c->with_lse ? " lse" : "", (long long)c->page_size,
               (long long)c->max_pages, (long long)c->num_pages, a->struct_size, a->softmax_scale, (int)a->num_splits,
               (long long)a->split_tokens, threads,
               workspace_mode == 0   ? "library"
               : workspace_mode == 1 ? "caller, exact"
                                     : "caller, 1 byte short",
               (long long)c->q_len, c->q_counts ? "ragged" : "no", c->mask == FD_MASK_NONE ? "none" : "causal",
               (long long)c->window, (double)c->softcap, a->alibi_slopes.data ? "yes" : "no",
               a->sinks.data ? "yes" : "no", c->mutation ? c->mutation : "nothing", status_name(c->expect));
  if (n < 0 || (size_t)n >= left) return;
  cursor += n;
  left -= (size_t)n;
  fd_decode_args copy = *a;
  for (int i = 0; i < TENSORS; ++i) {
    const fd_tensor *t = tensor_at(&copy, i);
    if (t->data || i < 4) describe_tensor(&cursor, &left, tensor_names[i], t);
  }
  if (copy.k_scale.data) describe_tensor(&cursor, &left, "k_scale", &copy.k_scale);
  if (copy.v_scale.data) describe_tensor(&cursor, &left, "v_scale", &copy.v_scale);
  if (c->with_lens && c->batch > 0) {
    n = snprintf(cursor, left, "  lens:");
    for (int64_t b = 0; b < c->batch && n > 0 && (size_t)n < left; ++b) {
      cursor += n;
      left -= (size_t)n;
      n = snprintf(cursor, left, " %lld", (long long)c->lens[b]);
    }
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (verbose < 0) verbose = getenv("FUZZ_DECODE_VERBOSE") != NULL ? atoi(getenv("FUZZ_DECODE_VERBOSE")) : 0;
  input in = {data, size};
  /* Values come from a generator seeded by every byte; structure from the
   * bytes in order. */
  fdt_rng rng = {input_seed(data, size)};

  fuzz_case c;
  memset(&c, 0, sizeof c);
  const unsigned threads = 1 + take(&in, 3);
  /* FD_CHECK_CONTENTS or not: bad lengths and block-table entries are
   * errors with it, clamped without it (flashdecode.h). */
  const int checked = take(&in, 2) == 1;
  unsigned workspace_mode = take(&in, 4); /* 0, 1: library-owned; 2: caller, exact; 3: caller, short */
  workspace_mode = workspace_mode < 2 ? 0 : workspace_mode - 1;
  const unsigned info_mode = take(&in, 3);
  const int repeat = take(&in, 4) == 3;
  /* One input in four gets an invalid field; which one is byte 5 (none once
   * the bytes run out). */
  const unsigned draw = take(&in, 4 * MUT_COUNT);
  make_problem(&in, &c, &rng);
  c.stage = VALID;
  c.expect = FD_SUCCESS;
  if (draw >= 3 * MUT_COUNT && !mutate(&in, &c, draw - 3 * MUT_COUNT)) {
    c.stage = VALID;
    c.expect = FD_SUCCESS;
    c.mutation = NULL;
  }
  /* Valid inputs only (the mutations assume the float cache): an 8-bit cache
   * in one in six, from bytes no older input used. */
  if (c.mutation == NULL && take(&in, 6) == 1) quantize_case(&in, &c, &rng);
  describe_case(&c, threads, workspace_mode);
  if (verbose) fprintf(stderr, "fuzz_decode: input of %zu bytes\n%s\n", size, problem_text);
  const fd_decode_args *args = &c.call.args;

  fd_options options;
  fd_options_init(&options, sizeof options);
  options.backend = FD_BACKEND_CPU;
  options.num_threads = (int32_t)threads;
  options.checks = checked ? FD_CHECK_CONTENTS : FD_CHECK_NONE;
  fd_handle *handle = NULL;
  if (fd_create(&handle, &options) != FD_SUCCESS) fuzz_fail("fd_create failed");

  /* fd_workspace_size and fd_describe_plan, against each other. */
  size_t bytes = 0;
  const fd_status size_status = fd_workspace_size(handle, args, &bytes);
  union {
    fd_plan_info info;
    unsigned char raw[sizeof(fd_plan_info) + 32];
  } plan;
  const size_t info_size = info_mode == 0   ? sizeof plan.info
                           : info_mode == 1 ? offsetof(fd_plan_info, workspace_bytes) + sizeof(size_t) /* older */
                                            : sizeof plan.raw;                                         /* newer */
  memset(plan.raw, 0xa5, sizeof plan.raw);
  fd_plan_info_init(&plan.info, info_size);
  unsigned char plan_before[sizeof plan.raw];
  memcpy(plan_before, plan.raw, sizeof plan.raw);
  const fd_status plan_status = fd_describe_plan(handle, args, &plan.info);
  const fd_status shape_expect = c.stage == ARGS ? c.expect : FD_SUCCESS;
  if (size_status != shape_expect)
    fuzz_fail("fd_workspace_size returned %s, expected %s", status_name(size_status), status_name(shape_expect));
  if (plan_status != shape_expect)
    fuzz_fail("fd_describe_plan returned %s, expected %s", status_name(plan_status), status_name(shape_expect));
  if (plan_status != FD_SUCCESS) {
    require_message("fd_describe_plan");
    if (memcmp(plan.raw, plan_before, sizeof plan.raw) != 0) fuzz_fail("a failing fd_describe_plan wrote its info");
  } else {
    if (!all_bytes(plan.raw + info_size, sizeof plan.raw - info_size, 0xa5))
      fuzz_fail("fd_describe_plan wrote past its caller's struct_size %zu", info_size);
    if (memcmp(plan.raw + sizeof plan.info, plan_before + sizeof plan.info, sizeof plan.raw - sizeof plan.info) != 0)
      fuzz_fail("fd_describe_plan changed a newer caller's fields past its own struct");
    check_plan(&c, &plan.info, info_size, bytes);
  }

  /* The caller's workspace: exactly the bytes fd_workspace_size asked for
   * (or one fewer), NaN-filled. */
  void *workspace = NULL;
  int workspace_short = 0;
  if (workspace_mode != 0 && size_status == FD_SUCCESS) {
    workspace_short = workspace_mode == 2 && bytes > 0;
    const size_t given = bytes - (workspace_short ? 1 : 0);
    if (posix_memalign(&workspace, 256, given ? given : 1) != 0) fuzz_fail("out of memory");
    memset(workspace, 0xff, given);
    if (fd_set_workspace(handle, workspace, given) != FD_SUCCESS) fuzz_fail("fd_set_workspace(%zu bytes)", given);
  }

  /* The decode, with poisoned outputs and inputs kept to compare. */
  const buffer *inputs[] = {&c.q,     &c.k,       &c.v,      &c.seq_lens, &c.block_table, &c.alibi_slopes,
                            &c.sinks, &c.k_scale, &c.v_scale};
  enum { INPUTS = sizeof inputs / sizeof inputs[0] };
  unsigned char *kept[INPUTS];
  for (int i = 0; i < INPUTS; ++i) kept[i] = buffer_copy(inputs[i]);
  fd_status expect = c.expect;
  /* Unchecked, bad contents are clamped: the decode runs (ASan sees any
   * read outside the buffers) and writes every output element. */
  const int clamped = c.stage == CONTENTS && !checked;
  if (clamped) expect = workspace_short && c.batch > 0 ? FD_ERROR_WORKSPACE_TOO_SMALL : FD_SUCCESS;
  if (c.stage == VALID && workspace_short && c.batch > 0) expect = FD_ERROR_WORKSPACE_TOO_SMALL;
  const fd_status status = fd_decode(handle, args, NULL);
  if (verbose) fprintf(stderr, "fuzz_decode: fd_decode returned %s\n", status_name(status));
  if (status != expect) fuzz_fail("fd_decode returned %s, expected %s", status_name(status), status_name(expect));
  for (int i = 0; i < INPUTS; ++i)
    if (inputs[i]->size && memcmp(kept[i], inputs[i]->bytes, inputs[i]->size) != 0)
      fuzz_fail("fd_decode changed an input (tensor %d)", i);
  if (status != FD_SUCCESS) {
    require_message("fd_decode");
    if (!all_bytes(c.out.bytes, c.out.size, 0xff)) fuzz_fail("a failing fd_decode wrote out");
    if (!all_bytes(c.lse.bytes, c.lse.size, 0xff)) fuzz_fail("a failing fd_decode wrote lse");
  } else if (clamped) {
    /* Clamped lengths read cache slots past the original ones, whose poison
     * (all-ones NaN) can reach out bit for bit: nothing more to compare. */
  } else {
    check_written("out", &c.out, &args->out, 4);
    if (c.with_lse) check_written("lse", &c.lse, &args->lse, 3);
    check_numerics(&c);
  }
  if (status == FD_SUCCESS && repeat) {
    /* Again on the same handle (its cached plan): bitwise the same. */
    unsigned char *first_out = buffer_copy(&c.out), *first_lse = buffer_copy(&c.lse);
    memset(c.out.bytes, 0xff, c.out.size);
    if (c.lse.size) memset(c.lse.bytes, 0xff, c.lse.size);
    const fd_status again = fd_decode(handle, args, NULL);
    if (again != FD_SUCCESS) fuzz_fail("a second fd_decode returned %s", status_name(again));
    if ((c.out.size && memcmp(first_out, c.out.bytes, c.out.size) != 0) ||
        (c.lse.size && memcmp(first_lse, c.lse.bytes, c.lse.size) != 0))
      fuzz_fail("a second fd_decode on the same handle gave different bits");
    free(first_out);
    free(first_lse);
  }
  for (int i = 0; i < INPUTS; ++i) free(kept[i]);

  if (fd_destroy(handle) != FD_SUCCESS) fuzz_fail("fd_destroy failed");
  free(workspace);
  free_case(&c);
  return 0;
}
