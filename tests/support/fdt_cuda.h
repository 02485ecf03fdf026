// SPDX-License-Identifier: Apache-2.0
/*
 * Test support for the CUDA backend: a generated fdt_problem copied to the
 * device with the same layout (strides, offsets, padding and NaN included),
 * and its outputs copied back for fdt_check. Built only with CUDA.
 */
#ifndef FDT_CUDA_H_INCLUDED
#define FDT_CUDA_H_INCLUDED

#include "fdt.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct fdt_device_problem {
  fd_decode_args args; /* the problem's args, pointing at the device copies below */
  void *q, *k, *v, *out, *lse;
  int32_t *seq_lens, *block_table, *q_lens; /* q_lens: NULL when the problem has none */
  float *alibi_slopes, *sinks;              /* NULL when the problem has none */
  float *k_scale, *v_scale;                 /* NULL when the problem has none */
} fdt_device_problem;

/* Allocates device buffers the size of p's storage, copies every one (out
 * and lse too, so they start poisoned) and retargets args. Returns once the
 * data is on the device, so work on any stream (a non-blocking one too) sees
 * it. Returns 0 on success; on failure prints the CUDA error and frees what
 * it allocated. */
int fdt_cuda_upload(const fdt_problem *p, fdt_device_problem *d);

/* Copies p's inputs (q, k, v, seq_lens, q_lens, block_table, alibi_slopes, sinks, k_scale, v_scale) into d's existing
 * buffers: p must have the same storage sizes as the problem d was made
 * from. For replaying a captured graph with new data. Returns once the data
 * is on the device; 0 on success. */
int fdt_cuda_refresh_inputs(const fdt_problem *p, fdt_device_problem *d);

/* Fills d's out and lse with NaN (all-ones bytes). Returns 0 on success. */
int fdt_cuda_poison_outputs(const fdt_problem *p, fdt_device_problem *d);

/* Copies d's out and lse back into p's host storage. Returns 0 on success. */
int fdt_cuda_download(const fdt_device_problem *d, fdt_problem *p);

void fdt_cuda_free(fdt_device_problem *d);

#ifdef __cplusplus
}
#endif

#endif
