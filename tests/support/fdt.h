// SPDX-License-Identifier: Apache-2.0
/*
 * Test support for flashdecode: random problems in any layout, a naive
 * float64 reference, and checks that every output element was written.
 *
 * A problem is generated once as logical float64 tensors (values already
 * rounded to the storage dtype), then laid out into storage buffers with the
 * requested strides (BHND, BNHD, padded slice, or a shuffled page pool). The
 * reference reads only the logical tensors, so it is independent of the
 * layout plumbing it checks. Storage buffers are host memory; a GPU test
 * copies them to the device with the same strides.
 *
 * Written independently of the library's internals (its own fp16/bf16
 * conversion, its own indexing), so the two can disagree.
 */
#ifndef FDT_H_INCLUDED
#define FDT_H_INCLUDED

#include <stddef.h>
#include <stdint.h>

#include "flashdecode.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- random numbers (splitmix64) ---------------------------------------- */
typedef struct fdt_rng {
  uint64_t state;
} fdt_rng;
uint64_t fdt_next(fdt_rng *rng);
double fdt_uniform(fdt_rng *rng, double lo, double hi);
int64_t fdt_int(fdt_rng *rng, int64_t lo, int64_t hi_inclusive);

/* ---- dtype conversion ---------------------------------------------------- */
size_t fdt_dtype_size(fd_dtype dtype);
const char *fdt_dtype_name(fd_dtype dtype);
double fdt_round_to(fd_dtype dtype, double x); /* value after storing in dtype */
void fdt_store(fd_dtype dtype, void *base, int64_t index, double x);
double fdt_load(fd_dtype dtype, const void *base, int64_t index);
/* 8-bit cache types: the stored byte of x (round to nearest even,
 * saturating) and the exact value of a byte. */
uint8_t fdt_quantize(fd_dtype dtype, double x);
double fdt_fp8_value(fd_dtype dtype, uint8_t bits);
/* Whether dtype is an 8-bit cache dtype (E4M3, E5M2, I8). */
int fdt_is_quantized(fd_dtype dtype);
/* What fd_append_kv stores for a new element `value` (exact in its dtype)
 * at element `index` of a cache of `cache_dtype`: x = value / *scale in
 * float32 (x = value when scale is NULL), then the 8-bit formats by
 * fdt_quantize, F32/F16/BF16 rounded to nearest even (flashdecode.h,
 * fd_append_args). */
void fdt_append_store(fd_dtype cache_dtype, void *base, int64_t index, double value, const float *scale);
/* The byte that stands for "never read" at element i of an 8-bit cache's
 * padding: NaN and saturating values in turn (e4m3 0x7F, 0xFF, 0x7E, 0xFE;
 * e5m2 0x7C, 0xFC, 0x7F, 0x7B; i8 127, -128, -127, 127). */
uint8_t fdt_pad_byte(fd_dtype dtype, int64_t i);

/* ---- problems ------------------------------------------------------------- */
/* A tensor descriptor over `data` with the given extents and element strides. */
fd_tensor fdt_tensor(void *data, fd_dtype dtype, int ndim, const int64_t *shape, const int64_t *strides);

typedef enum fdt_layout {
  FDT_BNHD = 0,        /* [batch, seq, heads, dim], contiguous */
  FDT_BHND = 1,        /* [batch, heads, seq, dim], contiguous */
  FDT_BNHD_PADDED = 2, /* BNHD slice of a bigger buffer: extra heads and dims between rows */
  FDT_PAGED_NHD = 3,   /* page pool [pages, page_size, heads, dim], shuffled block table */
  FDT_PAGED_HND = 4    /* page pool [pages, heads, page_size, dim], shuffled block table */
} fdt_layout;

/* Scales of an 8-bit cache (flashdecode.h, "Quantized caches"), k and v
 * alike (each its own values). */
typedef enum fdt_scale_mode {
  FDT_SCALE_NONE = 0,   /* no k_scale / v_scale: 1 */
  FDT_SCALE_TENSOR = 1, /* one scale, every stride 0 */
  FDT_SCALE_HEAD = 2,   /* per KV head, strides {0, 0, 1} (2 in the padded layout) */
  FDT_SCALE_TOKEN = 3   /* per token and KV head: a full tensor in the cache's order; padding NaN or 1e30 */
} fdt_scale_mode;

/* A problem to generate. Zero-initialised fields mean plain decode: one
 * query token, the causal mask, no window, softcap, ALiBi or sinks
 * (flashdecode.h, "Attention variants"). */
typedef struct fdt_case {
  int64_t batch, q_heads, kv_heads, head_dim;
  int64_t kv_len;    /* cache capacity per sequence (dense) or pages * page_size (paged) */
  int64_t page_size; /* paged layouts only */
  fd_dtype dtype;
  fd_dtype out_dtype; /* dtype, or FD_DTYPE_F32 */
  fdt_layout layout;
  int ragged;          /* per-sequence lengths: random in [0, kv_len], including 0 and kv_len */
  const int64_t *lens; /* ragged: these [batch] lengths (clamped to [0, kv_len]) instead; NULL: random */
  int with_lse;
  int32_t num_splits;   /* 0 = automatic */
  double softmax_scale; /* 0 = default */
  uint64_t seed;
  /* Attention variants. */
  int64_t q_len;          /* query tokens per sequence; 0 is taken as 1 */
  int ragged_q;           /* q_lens: per-sequence query tokens in [0, q_len] (0, q_len and 1 first, then random);
                             q's padding tokens hold NaN, so a read shows */
  fd_attention_mask mask; /* FD_MASK_CAUSAL (0) or FD_MASK_NONE */
  int64_t window;         /* window_left; 0 = none */
  double softcap;         /* logit_softcap (stored as a float); 0 = none */
  int alibi;              /* 0 none; 1 the standard slopes 2^(-8 (h + 1) / q_heads); 2 random in [0.01, 1] */
  int sinks;              /* 0 none; else random sink logits in [-1, log(kv_len + 1) + 3], around the LSEs */
  /* Quantized caches. Values are drawn as for a float cache, divided by a
   * random scale and quantized; the reference reads stored value x scale.
   * Padding (past each length, spare pages) holds fdt_pad_byte's NaN and
   * saturating bytes, and its per-token scales NaN or 1e30, so a read shows. */
  fd_dtype kv_dtype;         /* E4M3, E5M2 or I8: an 8-bit cache; any other value (0 included): the cache is dtype */
  fdt_scale_mode scale_mode; /* FDT_SCALE_NONE (0): no scales */
  int wide_scales;           /* scales 2^[-12, 12] times the dtype's base, one in eight 0 (else [0.5, 2] x base) */
} fdt_case;

/* The cache dtype of c: c->kv_dtype when 8-bit, else c->dtype. */
fd_dtype fdt_kv_dtype(const fdt_case *c);

/* c->q_len, with 0 taken as 1. */
int64_t fdt_q_len(const fdt_case *c);

/* A generated problem: storage (what the library reads and writes) and the
 * logical float64 tensors the reference reads. Every storage buffer is a
 * plain host allocation of the given bytes, which a GPU test copies to the
 * device as it is (fdt_cuda_upload), repointing the args' tensor at the
 * same offset in the copy; absent ones are NULL with 0 bytes. */
typedef struct fdt_problem {
  fdt_case c;
  fd_decode_args args; /* points at the host storage below */
  void *q, *k, *v, *out, *lse;
  int32_t *seq_lens, *block_table, *q_lens; /* q_lens: args.q_lens (ragged_q), or NULL */
  float *alibi_slopes, *sinks;              /* [q_heads] f32 (args.alibi_slopes, args.sinks), or NULL */
  size_t q_bytes, kv_bytes, out_bytes, lse_bytes, seq_lens_bytes, block_table_bytes, alibi_slopes_bytes, sinks_bytes,
      q_lens_bytes;
  float *k_scale, *v_scale; /* storage of args.k_scale / args.v_scale, or NULL */
  size_t k_scale_bytes, v_scale_bytes;
  double *ref_q; /* [batch, q_len, q_heads, dim] */
  double *ref_k; /* [batch, kv_len, kv_heads, dim] */
  double *ref_v;
  double *ref_alibi_slopes; /* [q_heads], or NULL: no ALiBi */
  double *ref_sinks;        /* [q_heads], or NULL: no sinks */
  int64_t *lens;            /* [batch] */
  int64_t *q_counts;        /* [batch]: each sequence's query tokens (q_len without ragged_q) */
  double *expect_out;       /* [batch, q_len, q_heads, dim] */
  double *expect_lse;       /* [batch, q_len, q_heads] */
} fdt_problem;

/* Generates random data, lays it out, poisons out/lse with NaN and computes
 * the reference. Returns 0 on success. */
int fdt_problem_make(fdt_problem *p, const fdt_case *c);
void fdt_problem_free(fdt_problem *p);

/* Computes expect_out and expect_lse in float64 from the logical tensors
 * alone, by flashdecode.h's formulas ("Attention variants"; non-finite
 * scores as below): reads c.batch, c.q_heads, c.kv_heads, c.head_dim,
 * c.kv_len, c.softmax_scale, c.q_len, c.mask, c.window, c.softcap, ref_q,
 * ref_k, ref_v, ref_alibi_slopes and ref_sinks (when not NULL) and lens (see
 * fdt_problem). For callers that lay out storage of their own (tests/fuzz). */
void fdt_reference(fdt_problem *p);

/* Whether query token t of a sequence of length len with q_count query
 * tokens sees key j under c's mask and window (flashdecode.h, "Attention
 * variants"; a token t >= q_count is padding and sees none). */
int fdt_sees(const fdt_case *c, int64_t len, int64_t q_count, int64_t t, int64_t j);

/* Fills out and lse with NaN bit patterns (every element "unwritten"). */
void fdt_poison_outputs(fdt_problem *p);

/* Compares p->out / p->lse (host storage) to the reference, every element
 * of [batch, q_len, q_heads]. Writes a one-line summary to `report` and
 * returns 0 when every element was written (none left with the poison's
 * all-ones bytes), NaN appeared exactly where the reference has NaN, query
 * tokens that see no key (empty sequences, tokens before the sequence under
 * the causal mask) gave zeros and LSE -inf (exactly the sink with sinks),
 * and the relative error ||out - ref|| / ||ref|| over the finite elements is
 * within the dtype's bound; the measured errors are returned through
 * out_error / lse_error (may be NULL). */
int fdt_check(const fdt_problem *p, char *report, size_t report_size, double *out_error, double *lse_error);

/* ---- non-finite values and extreme weights ---------------------------------
 * flashdecode.h's rules ("Non-finite values"): a score that is NaN or +inf
 * makes its row's output and LSE NaN; a score of -inf masks its key; a row
 * whose keys are all masked is zero with LSE -inf. The reference follows
 * them. Each special writes one such pattern into q and k (storage and the
 * logical tensors) of a dense problem and recomputes the reference. */
typedef enum fdt_special {
  FDT_SPECIAL_NAN_IN_Q,        /* q[0, head 0, 0] is NaN: that row is NaN */
  FDT_SPECIAL_NEG_INF_KEY,     /* one key of sequence 0 scores -inf for KV head 0's group: masked */
  FDT_SPECIAL_MASKED_PREFIX,   /* the first 3/4 of sequence 0's keys score -inf for that group: whole splits masked */
  FDT_SPECIAL_ALL_MASKED,      /* every key of sequence 0 scores -inf for that group: zeros, LSE -inf */
  FDT_SPECIAL_POS_INF_KEY,     /* one key scores +inf for that group: its rows are NaN */
  FDT_SPECIAL_NAN_KEY,         /* one key element is NaN: the group's rows are NaN */
  FDT_SPECIAL_OVERFLOWING_KEY, /* one key of -1e38s (f32, bf16): its float score overflows to -inf, masked */
  FDT_SPECIAL_DOMINANT_KEY,    /* per (sequence, KV head) one key scores 14 nats above the rest (weights ~2^-20) */
  FDT_SPECIAL_COUNT
} fdt_special;

const char *fdt_special_name(fdt_special special);

/* Makes c's problem (a dense layout, kv_len >= 4, not ragged) with `special`
 * written in, outputs poisoned. With several query tokens, what the special
 * writes into q goes into every token's (NAN_IN_Q: token 0's only). Returns
 * 0 on success, 1 when the special does not apply to c (-1e38 in f16, or an
 * 8-bit cache), -1 when out of memory. */
int fdt_problem_make_special(fdt_problem *p, const fdt_case *c, fdt_special special);

/* Bound on ||out - ref|| / ||ref|| for an output dtype. */
double fdt_error_bound(fd_dtype out_dtype);

/* The arguments of sequence b of a batch's args, run on its own: q, out,
 * lse, seq_lens and (dense) k, v or (paged) the block table sliced to that
 * sequence, batch 1, by pointer arithmetic alone (host or device pointers
 * alike), so that it writes its row of the batch's outputs. `len` is its
 * length: the cache's capacity shrinks to it (dense: exactly, and seq_lens
 * is dropped when drop_lengths; paged: whole pages); k_scale and v_scale
 * (dense) follow k and v. For batch-invariance
 * tests (flashdecode.h, "Batch invariance"). */
fd_decode_args fdt_solo_args(const fd_decode_args *batch, int64_t b, int64_t len, int drop_lengths);

/* The arguments of one part of a dense problem's cache, tokens
 * [start, start + count), for fd_merge_states tests (one query token): k
 * and v (and their scales) sliced (pointer arithmetic alone, host or device), seq_lens at
 * part_lens (int32 [batch], filled by fdt_part_lengths; host or device),
 * out [batch, 1, q_heads, head_dim] contiguous at `out` in out_dtype, lse
 * [batch, 1, q_heads] at `lse`. */
fd_decode_args fdt_part_args(const fd_decode_args *whole, int64_t start, int64_t count, int32_t *part_lens, void *out,
                             fd_dtype out_dtype, float *lse);
/* How many of each sequence's tokens (lens[b]) fall in [start, start + count). */
void fdt_part_lengths(const int64_t *lens, int64_t batch, int64_t start, int64_t count, int32_t *part_lens);

/* A CPU-backend handle with `threads` worker threads (0: every core) and
 * fd_options.checks set to `checks`; NULL if fd_create fails. */
fd_handle *fdt_cpu_handle(int32_t threads, uint32_t checks);

/* Human-readable case description. */
void fdt_case_describe(const fdt_case *c, char *buffer, size_t size);

#ifdef __cplusplus
}
#endif

#endif
