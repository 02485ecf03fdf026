// SPDX-License-Identifier: Apache-2.0
/*
 * The kernel-family cases of the GPU suite (tests/gpu/test_cuda_decode.c:
 * test_rows_kernel, test_ragged_query_lengths, test_8bit_kernels,
 * test_compact_tiles, test_merge_paths_on_caller_workspace), shared with the host's policy test
 * (tests/unit/test_cuda_policy.cpp, test_gpu_test_kernels), which pins the
 * kernel each case's plan must name on an H200: a policy change that moves
 * one fails there, in CI, before any device run. C and C++.
 */
#ifndef KERNEL_SPECS_H_INCLUDED
#define KERNEL_SPECS_H_INCLUDED

#include <stdint.h>
#include <string.h>

#include "fdt.h"
#include "flashdecode.h"

/* kernel_spec::kv_dtype: the cache in q's dtype (fdt_case::kv_dtype 0). */
#define FDT_KV_AS_Q ((fd_dtype)0)

/* A case: q's dtype (an 8-bit kv_dtype gets scales), the shape (kv_len the
 * capacity, every length with ragged, a quarter in quick mode), the
 * options, and the kernel its plan must name on an H200 (a prefix;
 * "tensor-core-" is the standard or wide tiles, see kernel_spec_expected). */
typedef struct {
  const char *what;
  fd_dtype dtype, kv_dtype;
  fdt_layout layout;
  int64_t batch, q_heads, kv_heads, head_dim, kv_len, page_size, q_len, window;
  double softcap;
  int alibi, sinks, ragged, ragged_q;
  int32_t splits;
  const char *kernel;
} kernel_spec;

/* Whether the CUDA backend plans compact tiles for spec on a device of
 * `sms` multiprocessors and compute capability `cc_major` (policy.cpp,
 * compact_tiles_take): a paged 16-bit cache with per-sequence lengths and
 * automatic splits, pages of 16+ tokens, head_dim up to 128, up to 16 query
 * rows a KV head, at least two units (sequence, KV head) a multiprocessor,
 * on a device that holds four compact CTAs a multiprocessor against two
 * standard ones (sm_90, sm_100). */
static inline int kernel_spec_compact_planned(const kernel_spec *spec, int sms, int cc_major) {
  const int paged = spec->layout == FDT_PAGED_NHD || spec->layout == FDT_PAGED_HND;
  const int sixteen_bit = (spec->dtype == FD_DTYPE_F16 || spec->dtype == FD_DTYPE_BF16) && spec->kv_dtype == 0;
  const int64_t rows = spec->q_len * (spec->q_heads / spec->kv_heads);
  return (cc_major == 9 || cc_major == 10) && paged && sixteen_bit && spec->ragged && spec->splits == 0 &&
         spec->page_size >= 16 && spec->head_dim <= 128 && rows <= 16 && spec->batch * spec->kv_heads >= 2 * sms;
}

/* The kernel (a prefix) spec's plan must name at kv_len tokens (automatic
 * splits: `quick` says whether kv_len is the quick quarter). spec's kernel
 * is the H200's: where the device decides between compact and standard
 * tiles otherwise (compact_planned), the other; 17-32 rows planned on the
 * wide 64-row kernel keep it only where the device plans it
 * (wide_rows_planned: sm_90 in sm_90a builds) and the splits (asked ones;
 * automatic ones at the full kv_len) stay 4096 tokens or longer, else the
 * 32-row kernel. */
static inline const char *kernel_spec_expected(const kernel_spec *spec, int64_t kv_len, int quick, int compact_planned,
                                               int wide_rows_planned) {
  static const char standard[] = "tensor-core-", compact[] = "tensor-core-compact-",
                    wide_rows[] = "tensor-core-rows64-wide-";
  const int wants_compact = strncmp(spec->kernel, compact, sizeof compact - 1) == 0;
  if ((wants_compact || strcmp(spec->kernel, standard) == 0) && compact_planned != wants_compact)
    return wants_compact ? standard : compact;
  if (strncmp(spec->kernel, wide_rows, sizeof wide_rows - 1) == 0 &&
      spec->q_len * (spec->q_heads / spec->kv_heads) <= 32) {
    const int long_splits = spec->splits > 0 ? kv_len / spec->splits >= 4096 : !quick;
    if (!long_splits || !wide_rows_planned) return "tensor-core-rows-";
  }
  return spec->kernel;
}

/* test_rows_kernel: over 16 query rows a KV head. */
static const kernel_spec rows_kernel_specs[] = {
    {"q_len 4 x group 4: 16 rows", FD_DTYPE_F16, FDT_KV_AS_Q, FDT_BNHD, 3, 32, 8, 128, 3000, 16, 4, 0, 0.0, 0, 0, 0, 0,
     0, "tensor-core-"},
    {"q_len 5 x group 4: 20 rows", FD_DTYPE_F16, FDT_KV_AS_Q, FDT_BNHD, 3, 32, 8, 128, 3000, 16, 5, 0, 0.0, 0, 0, 1, 0,
     0, "tensor-core-rows-"},
    {"q_len 8 x group 8, window", FD_DTYPE_BF16, FDT_KV_AS_Q, FDT_PAGED_NHD, 4, 64, 8, 128, 2500, 16, 8, 700, 0.0, 0, 0,
     1, 0, 0, "tensor-core-rows64-"},
    {"q_len 16 x group 8: two chunks", FD_DTYPE_F16, FDT_KV_AS_Q, FDT_BHND, 2, 16, 2, 128, 2000, 16, 16, 0, 0.0, 0, 1,
     1, 0, 3, "tensor-core-rows64-"},
    {"q_len 9 x group 4, softcap, ALiBi", FD_DTYPE_BF16, FDT_KV_AS_Q, FDT_BNHD_PADDED, 3, 16, 4, 96, 1800, 16, 9, 0,
     30.0, 1, 0, 1, 0, 0, "tensor-core-rows64-"},
    {"q_len 7 x group 4, ALiBi", FD_DTYPE_F16, FDT_KV_AS_Q, FDT_BNHD, 2, 16, 4, 128, 2100, 16, 7, 0, 0.0, 1, 0, 0, 0, 0,
     "tensor-core-rows-"},
    {"group 32, one token", FD_DTYPE_F16, FDT_KV_AS_Q, FDT_BNHD, 4, 64, 2, 64, 4000, 16, 1, 0, 0.0, 0, 0, 1, 0, 0,
     "tensor-core-rows-"},
    {"q_len 3 x group 12, manual splits", FD_DTYPE_F16, FDT_KV_AS_Q, FDT_PAGED_HND, 5, 24, 2, 64, 3000, 16, 3, 0, 0.0,
     0, 1, 0, 0, 9, "tensor-core-rows64-"},
    {"q_len 8 x group 8, head_dim 64", FD_DTYPE_BF16, FDT_KV_AS_Q, FDT_BNHD, 2, 32, 4, 64, 2600, 16, 8, 0, 0.0, 0, 0, 0,
     0, 0, "tensor-core-rows64-"},
    {"q_len 6 x group 8, balanced", FD_DTYPE_BF16, FDT_KV_AS_Q, FDT_PAGED_NHD, 40, 32, 4, 128, 3000, 16, 6, 0, 0.0, 0,
     0, 1, 0, 0, "tensor-core-rows64-"},
    /* 17-32 rows in long splits of one wave: the wide 64-row kernel where it is planned (sm_90 in sm_90a builds;
     * kernel_spec_expected), else 32 rows; pages of 8 go through the block-table ring */
    {"q_len 2 x group 12, two long splits, pages of 8", FD_DTYPE_BF16, FDT_KV_AS_Q, FDT_PAGED_NHD, 2, 24, 2, 128, 36000,
     8, 2, 0, 0.0, 0, 1, 1, 0, 2, "tensor-core-rows64-wide-"},
    {"q_len 3 x group 8, head_dim 64, two long splits", FD_DTYPE_F16, FDT_KV_AS_Q, FDT_BHND, 3, 16, 2, 64, 40000, 16, 3,
     0, 30.0, 1, 0, 0, 0, 2, "tensor-core-rows64-wide-"},
    {"q_len 4 x group 8, one wave of long splits", FD_DTYPE_F16, FDT_KV_AS_Q, FDT_BNHD, 32, 32, 4, 64, 4096, 16, 4, 0,
     0.0, 0, 0, 0, 0, 0, "tensor-core-rows64-wide-"},
    {"head_dim 256", FD_DTYPE_F16, FDT_KV_AS_Q, FDT_BNHD, 2, 32, 4, 256, 1500, 16, 8, 0, 0.0, 0, 0, 0, 0, 0,
     "tensor-core-"},
    /* 64 rows x 2 splits: 64 KiB of partials a unit, merged by the last CTA in several passes */
    {"q_len 8 x group 8, two splits merged fused", FD_DTYPE_F16, FDT_KV_AS_Q, FDT_BNHD, 2, 16, 2, 128, 12000, 16, 8, 0,
     0.0, 0, 0, 0, 0, 2, "tensor-core-rows64-"},
};

/* test_ragged_query_lengths: q_lens on every kernel family. */
static const kernel_spec ragged_query_specs[] = {
    {"q_len 1 (0 or 1 tokens)", FD_DTYPE_F16, FDT_KV_AS_Q, FDT_BNHD, 7, 32, 8, 128, 2000, 16, 1, 0, 0.0, 0, 1, 1, 1, 0,
     "tensor-core-"},
    {"q_len 4 x group 4", FD_DTYPE_BF16, FDT_KV_AS_Q, FDT_PAGED_NHD, 9, 32, 8, 128, 2500, 16, 4, 0, 0.0, 0, 0, 1, 1, 0,
     "tensor-core-"},
    {"q_len 6 x group 4, window", FD_DTYPE_F16, FDT_KV_AS_Q, FDT_BNHD, 6, 16, 4, 128, 3000, 16, 6, 500, 0.0, 0, 1, 1, 1,
     0, "tensor-core-rows-"},
    {"q_len 8 x group 8, balanced", FD_DTYPE_BF16, FDT_KV_AS_Q, FDT_PAGED_NHD, 40, 32, 4, 128, 3000, 16, 8, 0, 0.0, 0,
     0, 1, 1, 0, "tensor-core-rows64-"},
    {"q_len 16 x group 4, manual splits", FD_DTYPE_F16, FDT_KV_AS_Q, FDT_BHND, 5, 8, 2, 64, 2000, 16, 16, 0, 0.0, 0, 1,
     0, 1, 5, "tensor-core-rows64-"},
    {"f32 q: CUDA cores", FD_DTYPE_F32, FDT_KV_AS_Q, FDT_BNHD, 6, 16, 4, 128, 1500, 16, 5, 0, 0.0, 0, 1, 1, 1, 0,
     "cuda-core-"},
    {"e4m3 cache", FD_DTYPE_F16, FD_DTYPE_E4M3, FDT_PAGED_HND, 8, 32, 8, 128, 2000, 16, 3, 0, 0.0, 0, 0, 1, 1, 0,
     "tensor-core-8bit-"},
    {"MHA head_dim 256", FD_DTYPE_F16, FDT_KV_AS_Q, FDT_BNHD_PADDED, 4, 8, 8, 256, 1200, 16, 4, 0, 0.0, 0, 1, 1, 1, 3,
     "tensor-core-"},
};

/* test_8bit_kernels: 8-bit caches on tensor cores; the scales of each in kernel_8bit_scales. */
static const kernel_spec kernel_8bit_specs[] = {
    {"e4m3, group 4", FD_DTYPE_F16, FD_DTYPE_E4M3, FDT_BNHD, 3, 32, 8, 128, 3000, 16, 1, 0, 0.0, 0, 0, 0, 0, 0,
     "tensor-core-8bit-keys-128"},
    {"e5m2, group 8, paged, per-token scales", FD_DTYPE_BF16, FD_DTYPE_E5M2, FDT_PAGED_NHD, 5, 64, 8, 128, 2500, 16, 1,
     0, 0.0, 0, 0, 1, 0, 0, "tensor-core-8bit-keys-128"},
    {"int8, MHA, head_dim 64, pages of 7", FD_DTYPE_F16, FD_DTYPE_I8, FDT_PAGED_HND, 4, 8, 8, 64, 2000, 7, 1, 0, 0.0, 0,
     0, 1, 0, 0, "tensor-core-8bit-keys-64"},
    {"e4m3, q_len 2 x group 4, softcap, ALiBi, sinks", FD_DTYPE_F16, FD_DTYPE_E4M3, FDT_BHND, 3, 16, 4, 128, 2200, 16,
     2, 0, 30.0, 1, 1, 1, 0, 0, "tensor-core-8bit-keys-128"},
    {"int8, q_len 3 x group 2, window, ragged q_lens, per-token", FD_DTYPE_BF16, FD_DTYPE_I8, FDT_BHND, 5, 8, 4, 96,
     2600, 16, 3, 700, 0.0, 0, 1, 1, 1, 0, "tensor-core-8bit-keys-128"},
    {"e5m2, group 6, manual splits", FD_DTYPE_F16, FD_DTYPE_E5M2, FDT_BNHD, 2, 12, 2, 128, 4000, 16, 1, 0, 0.0, 0, 0, 1,
     0, 9, "tensor-core-8bit-keys-128"},
    {"e4m3, one long sequence: merge kernel", FD_DTYPE_BF16, FD_DTYPE_E4M3, FDT_BNHD, 1, 8, 1, 128, 60000, 16, 1, 0,
     0.0, 0, 0, 0, 0, 0, "tensor-core-8bit-keys-128"},
    {"e4m3, balanced schedule, pages of 1", FD_DTYPE_F16, FD_DTYPE_E4M3, FDT_PAGED_NHD, 40, 32, 8, 64, 3000, 1, 1, 0,
     0.0, 0, 1, 1, 0, 0, "tensor-core-8bit-keys-64"},
    {"int8, group 16: 16 rows", FD_DTYPE_F16, FD_DTYPE_I8, FDT_BNHD, 2, 32, 2, 128, 2000, 16, 1, 0, 0.0, 0, 0, 1, 0, 0,
     "tensor-core-8bit-128"},
    {"e4m3, q_len 3 x group 4: 12 rows", FD_DTYPE_BF16, FD_DTYPE_E4M3, FDT_PAGED_NHD, 3, 32, 8, 128, 2000, 16, 3, 0,
     0.0, 0, 0, 1, 0, 0, "tensor-core-8bit-128"},
    {"e5m2, head_dim 256", FD_DTYPE_F16, FD_DTYPE_E5M2, FDT_BNHD, 2, 16, 4, 256, 2000, 16, 1, 0, 0.0, 0, 0, 1, 0, 0,
     "tensor-core-8bit-keys-256"},
    {"e4m3, group 8, wide per-token scales", FD_DTYPE_F16, FD_DTYPE_E4M3, FDT_BNHD, 4, 32, 4, 128, 3000, 16, 1, 0, 0.0,
     0, 0, 1, 0, 0, "tensor-core-8bit-keys-128"},
    {"int8, head_dim 256, paged, softcap, sinks, splits", FD_DTYPE_BF16, FD_DTYPE_I8, FDT_PAGED_HND, 3, 16, 2, 256,
     3000, 16, 1, 0, 20.0, 0, 1, 1, 0, 5, "tensor-core-8bit-keys-256"},
    {"e4m3, head_dim 256, q_len 3 x group 4: 12 rows", FD_DTYPE_F16, FD_DTYPE_E4M3, FDT_BNHD, 2, 16, 4, 256, 1500, 16,
     3, 0, 0.0, 0, 0, 1, 0, 0, "tensor-core-8bit-256"},
    {"int8, MHA, paged, wide per-token scales", FD_DTYPE_BF16, FD_DTYPE_I8, FDT_PAGED_NHD, 6, 8, 8, 64, 2500, 16, 1, 0,
     0.0, 0, 1, 1, 0, 0, "tensor-core-8bit-keys-64"},
    {"e5m2, group 4, wide per-head scales, splits", FD_DTYPE_F16, FD_DTYPE_E5M2, FDT_BHND, 2, 16, 4, 128, 5000, 16, 1,
     0, 0.0, 0, 0, 1, 0, 6, "tensor-core-8bit-keys-128"},
    /* Every sequence at the capacity, no variants, head_dim 128: the host plans the pieces (SplitSchedule::planned). */
    {"e4m3, group 16, host-planned pieces", FD_DTYPE_BF16, FD_DTYPE_E4M3, FDT_BNHD, 3, 32, 2, 128, 3000, 16, 1, 0, 0.0,
     0, 0, 0, 0, 0, "tensor-core-8bit-128"},
    {"int8, group 16, host-planned splits", FD_DTYPE_F16, FD_DTYPE_I8, FDT_BHND, 2, 32, 2, 128, 2500, 16, 1, 0, 0.0, 0,
     0, 0, 0, 5, "tensor-core-8bit-128"},
};

/* kernel_8bit_specs' scales, case by case: the mode, and whether drawn over 2^-12 .. 2^12 with zeros
 * (fdt_case::wide_scales). The policy does not read scales. */
static const struct {
  fdt_scale_mode mode;
  int wide;
} kernel_8bit_scales[] = {{FDT_SCALE_TENSOR, 0}, {FDT_SCALE_TOKEN, 0}, {FDT_SCALE_TOKEN, 0}, {FDT_SCALE_HEAD, 0},
                          {FDT_SCALE_TOKEN, 0},  {FDT_SCALE_TOKEN, 0}, {FDT_SCALE_HEAD, 0},  {FDT_SCALE_TOKEN, 0},
                          {FDT_SCALE_HEAD, 0},   {FDT_SCALE_TOKEN, 0}, {FDT_SCALE_HEAD, 0},  {FDT_SCALE_TOKEN, 1},
                          {FDT_SCALE_TOKEN, 0},  {FDT_SCALE_HEAD, 0},  {FDT_SCALE_TOKEN, 1}, {FDT_SCALE_HEAD, 1},
                          {FDT_SCALE_TOKEN, 0},  {FDT_SCALE_HEAD, 1}};

/* test_compact_tiles: paged batches on compact tensor-core tiles, and those that keep the standard ones. */
static const kernel_spec compact_tile_specs[] = {
    {"many short sequences: fixed schedule", FD_DTYPE_F16, FDT_KV_AS_Q, FDT_PAGED_NHD, 270, 32, 8, 128, 512, 16, 1, 0,
     0.0, 0, 0, 1, 0, 0, "tensor-core-compact-128"},
    {"balanced, group 2", FD_DTYPE_BF16, FDT_KV_AS_Q, FDT_PAGED_HND, 40, 16, 8, 128, 5000, 32, 1, 0, 0.0, 0, 0, 1, 0, 0,
     "tensor-core-compact-128"},
    {"MHA, head_dim 64", FD_DTYPE_F16, FDT_KV_AS_Q, FDT_PAGED_NHD, 40, 8, 8, 64, 4000, 16, 1, 0, 0.0, 0, 1, 1, 0, 0,
     "tensor-core-compact-64"},
    {"head_dim 96, softcap, ALiBi, sinks", FD_DTYPE_BF16, FDT_KV_AS_Q, FDT_PAGED_NHD, 40, 32, 8, 96, 3000, 64, 1, 0,
     30.0, 1, 1, 1, 0, 0, "tensor-core-compact-128"},
    {"q_len 4 x group 4, window, ragged q_lens", FD_DTYPE_F16, FDT_KV_AS_Q, FDT_PAGED_NHD, 40, 32, 8, 128, 3000, 16, 4,
     500, 0.0, 0, 0, 1, 1, 0, "tensor-core-compact-128"},
    {"pages of 8: standard tiles", FD_DTYPE_F16, FDT_KV_AS_Q, FDT_PAGED_NHD, 40, 32, 8, 128, 3000, 8, 1, 0, 0.0, 0, 0,
     1, 0, 0, "tensor-core-"},
    {"4 sequences: standard tiles", FD_DTYPE_BF16, FDT_KV_AS_Q, FDT_PAGED_NHD, 4, 32, 8, 128, 6000, 16, 1, 0, 0.0, 0, 0,
     1, 0, 0, "tensor-core-"},
    {"head_dim 256: standard tiles", FD_DTYPE_F16, FDT_KV_AS_Q, FDT_PAGED_NHD, 40, 16, 8, 256, 2000, 16, 1, 0, 0.0, 0,
     0, 1, 0, 0, "tensor-core-"},
};

/* test_merge_paths_on_caller_workspace: each case's merge (BHND, LSE; a
 * quarter of kv_len in quick mode). */
/* merge_path_spec::merge: FD_MERGE_CLUSTER on compute capability 9.0+, else FD_MERGE_FUSED. */
#define FDT_MERGE_CLUSTER_ON_SM90 (-1)

typedef struct {
  const char *what;
  fd_dtype dtype, out_dtype;
  int64_t batch, q_heads, kv_heads, head_dim, kv_len;
  int32_t splits;
  int merge;  /* the fd_merge fd_describe_plan must report */
  int ragged; /* per-sequence lengths */
} merge_path_spec;

static const merge_path_spec merge_path_specs[] = {
    {"cluster (sm_90+; else fused), tensor cores (4 rows x 8 splits)", FD_DTYPE_F16, FD_DTYPE_F16, 2, 16, 4, 128, 3000,
     8, FDT_MERGE_CLUSTER_ON_SM90, 0},
    {"cluster (sm_90+; else fused), 8 splits, the trailing ones empty", FD_DTYPE_F16, FD_DTYPE_F16, 2, 16, 4, 128, 300,
     8, FDT_MERGE_CLUSTER_ON_SM90, 0},
    {"cluster (sm_90+; else fused), MHA, head_dim 64, 2 splits", FD_DTYPE_BF16, FD_DTYPE_BF16, 3, 8, 8, 64, 2000, 2,
     FDT_MERGE_CLUSTER_ON_SM90, 0},
    {"merge kernel (8 rows x 64 splits x 128)", FD_DTYPE_BF16, FD_DTYPE_BF16, 1, 8, 1, 128, 4096, 64, FD_MERGE_SEPARATE,
     0},
    {"merge kernel, group 24 in 2 chunks of 12 rows x 40 splits", FD_DTYPE_F16, FD_DTYPE_F16, 3, 48, 2, 128, 5000, 40,
     FD_MERGE_SEPARATE, 0},
    {"merge kernel, MHA, 640 units of 1 row x 80 splits x 256", FD_DTYPE_F16, FD_DTYPE_F16, 20, 32, 32, 256, 2600, 80,
     FD_MERGE_SEPARATE, 0},
    {"merge kernel, CUDA cores, f32 out (4 rows x 64 splits x 64)", FD_DTYPE_F16, FD_DTYPE_F32, 2, 8, 2, 64, 4000, 64,
     FD_MERGE_SEPARATE, 0},
    {"merge kernel, ragged (16 rows x 33 splits, trailing ones empty)", FD_DTYPE_BF16, FD_DTYPE_BF16, 4, 32, 2, 128,
     3300, 33, FD_MERGE_SEPARATE, 1},
    {"fused, CUDA cores, f32 out (16 splits)", FD_DTYPE_BF16, FD_DTYPE_F32, 3, 4, 4, 64, 2000, 16, FD_MERGE_FUSED, 0},
    {"fused, tensor cores, head_dim 256 (2 rows x 16 splits)", FD_DTYPE_BF16, FD_DTYPE_BF16, 2, 8, 4, 256, 2500, 16,
     FD_MERGE_FUSED, 0},
    {"fused, 3 rows x 13 splits", FD_DTYPE_F16, FD_DTYPE_F16, 3, 6, 2, 64, 2600, 13, FD_MERGE_FUSED, 0},
    {"fused, 2 rows x 48 splits, the trailing ones empty", FD_DTYPE_F16, FD_DTYPE_F16, 1, 2, 1, 32, 3000, 48,
     FD_MERGE_FUSED, 0},
    {"fused, tensor cores again, ragged", FD_DTYPE_F16, FD_DTYPE_F16, 5, 16, 4, 128, 3000, 8, FD_MERGE_FUSED, 1},
    {"fused, 50 KiB a unit (MHA, 1 row x 100 splits, the trailing ones empty)", FD_DTYPE_F16, FD_DTYPE_F16, 4, 16, 16,
     128, 3000, 100, FD_MERGE_FUSED, 0},
    {"fused, 48 KiB a unit (4 rows x 24 splits), ragged", FD_DTYPE_BF16, FD_DTYPE_BF16, 2, 32, 8, 128, 6000, 24,
     FD_MERGE_FUSED, 1},
    {"fused, CUDA cores, 64 KiB a unit (2 rows x 64 splits x 128, f32)", FD_DTYPE_F32, FD_DTYPE_F32, 2, 8, 4, 128, 8000,
     64, FD_MERGE_FUSED, 0},
};

/* The fd_merge fd_describe_plan must report for spec on a device of compute capability cc_major. */
static inline int merge_path_expected(const merge_path_spec *spec, int cc_major) {
  if (spec->merge != FDT_MERGE_CLUSTER_ON_SM90) return spec->merge;
  return cc_major >= 9 ? FD_MERGE_CLUSTER : FD_MERGE_FUSED;
}

#endif /* KERNEL_SPECS_H_INCLUDED */
