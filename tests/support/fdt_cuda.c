// SPDX-License-Identifier: Apache-2.0
/* Test support: see fdt_cuda.h. */
#include "fdt_cuda.h"

#include <cuda_runtime_api.h>
#include <stdio.h>
#include <string.h>

static int cuda_ok(cudaError_t err, const char *what) {
  if (err == cudaSuccess) return 1;
  fprintf(stderr, "fdt_cuda: %s failed: %s\n", what, cudaGetErrorString(err));
  return 0;
}

/* Copies one host storage buffer to a new device buffer and repoints the
 * tensor, keeping its offset inside the buffer. */
static int upload(void **device, fd_tensor *tensor, const void *host, size_t bytes) {
  *device = NULL;
  if (host == NULL) return 1;
  if (!cuda_ok(cudaMalloc(device, bytes ? bytes : 1), "cudaMalloc")) return 0;
  if (bytes && !cuda_ok(cudaMemcpy(*device, host, bytes, cudaMemcpyHostToDevice), "cudaMemcpy to device")) return 0;
  tensor->data = (char *)*device + ((const char *)tensor->data - (const char *)host);
  return 1;
}

int fdt_cuda_upload(const fdt_problem *p, fdt_device_problem *d) {
  memset(d, 0, sizeof *d);
  d->args = p->args;
  const int ok = upload(&d->q, &d->args.q, p->q, p->q_bytes) && upload(&d->k, &d->args.k, p->k, p->kv_bytes) &&
                 upload(&d->v, &d->args.v, p->v, p->kv_bytes) && upload(&d->out, &d->args.out, p->out, p->out_bytes) &&
                 upload(&d->lse, &d->args.lse, p->lse, p->lse_bytes) &&
                 upload((void **)&d->seq_lens, &d->args.seq_lens, p->seq_lens, p->seq_lens_bytes) &&
                 upload((void **)&d->q_lens, &d->args.q_lens, p->q_lens, p->q_lens_bytes) &&
                 upload((void **)&d->block_table, &d->args.block_table, p->block_table, p->block_table_bytes) &&
                 upload((void **)&d->alibi_slopes, &d->args.alibi_slopes, p->alibi_slopes, p->alibi_slopes_bytes) &&
                 upload((void **)&d->sinks, &d->args.sinks, p->sinks, p->sinks_bytes) &&
                 upload((void **)&d->k_scale, &d->args.k_scale, p->k_scale, p->k_scale_bytes) &&
                 upload((void **)&d->v_scale, &d->args.v_scale, p->v_scale, p->v_scale_bytes);
  /* A pageable host-to-device copy may return before its data lands, and a
   * non-blocking stream does not wait for the legacy stream it ran on. */
  if (!ok || !cuda_ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize")) {
    fdt_cuda_free(d);
    return -1;
  }
  return 0;
}

static int copy_in(void *device, const void *host, size_t bytes) {
  if (device == NULL || host == NULL || bytes == 0) return 1;
  return cuda_ok(cudaMemcpy(device, host, bytes, cudaMemcpyHostToDevice), "cudaMemcpy to device");
}

int fdt_cuda_refresh_inputs(const fdt_problem *p, fdt_device_problem *d) {
  const int ok =
      copy_in(d->q, p->q, p->q_bytes) && copy_in(d->k, p->k, p->kv_bytes) && copy_in(d->v, p->v, p->kv_bytes) &&
      copy_in(d->seq_lens, p->seq_lens, p->seq_lens_bytes) && copy_in(d->q_lens, p->q_lens, p->q_lens_bytes) &&
      copy_in(d->block_table, p->block_table, p->block_table_bytes) &&
      copy_in(d->alibi_slopes, p->alibi_slopes, p->alibi_slopes_bytes) && copy_in(d->sinks, p->sinks, p->sinks_bytes) &&
      copy_in(d->k_scale, p->k_scale, p->k_scale_bytes) && copy_in(d->v_scale, p->v_scale, p->v_scale_bytes) &&
      cuda_ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  return ok ? 0 : -1;
}

int fdt_cuda_poison_outputs(const fdt_problem *p, fdt_device_problem *d) {
  int ok = cuda_ok(cudaMemset(d->out, 0xff, p->out_bytes), "cudaMemset out");
  if (ok && d->lse) ok = cuda_ok(cudaMemset(d->lse, 0xff, p->lse_bytes), "cudaMemset lse");
  if (ok) ok = cuda_ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  return ok ? 0 : -1;
}

int fdt_cuda_download(const fdt_device_problem *d, fdt_problem *p) {
  int ok = cuda_ok(cudaMemcpy(p->out, d->out, p->out_bytes, cudaMemcpyDeviceToHost), "cudaMemcpy out to host");
  if (ok && p->lse)
    ok = cuda_ok(cudaMemcpy(p->lse, d->lse, p->lse_bytes, cudaMemcpyDeviceToHost), "cudaMemcpy lse to host");
  return ok ? 0 : -1;
}

void fdt_cuda_free(fdt_device_problem *d) {
  cudaFree(d->q);
  cudaFree(d->k);
  cudaFree(d->v);
  cudaFree(d->out);
  cudaFree(d->lse);
  cudaFree(d->seq_lens);
  cudaFree(d->q_lens);
  cudaFree(d->block_table);
  cudaFree(d->alibi_slopes);
  cudaFree(d->sinks);
  cudaFree(d->k_scale);
  cudaFree(d->v_scale);
  memset(d, 0, sizeof *d);
}
