// SPDX-License-Identifier: Apache-2.0
// Run 72's probe (performance-history.md): does the order in which CTAs visit
// (KV head, token range) change the DRAM read rate of an NHD cache
// [tokens, heads, 128] fp16? Each CTA sums rows of one head (256 B at a 2 KiB
// stride) over a token range. Not part of the build:
//   nvcc -O3 -std=c++17 -arch=sm_90a -o dram-locality-probe dram-locality-probe.cu && ./dram-locality-probe
// Its output on an H100: dram-locality-h100-run72.txt.
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <algorithm>
#include <cuda_runtime.h>

#define CK(x)                                        \
  do {                                               \
    cudaError_t e = (x);                             \
    if (e != cudaSuccess) {                          \
      printf("%s: %s\n", #x, cudaGetErrorString(e)); \
      exit(1);                                       \
    }                                                \
  } while (0)

constexpr int kHeads = 8, kDim = 128, kRowBytes = kDim * 2, kThreads = 256;

// mode 0: head fastest (c -> head c % H, chunk c / H); 1: chunk fastest;
// 2: persistent workers, contiguous runs of the head-major line;
// 3: persistent, head-aligned (worker w: head w % H, range w / H).
// 4: paged (pages of P tokens, shuffled), persistent contiguous runs; 5: paged head-aligned.
__global__ void __launch_bounds__(kThreads)
    read_rows(const uint4 *__restrict__ kv, long tokens, int mode, long chunk_tokens, int workers,
              const int *__restrict__ page_of, int page_size, float *sink) {
  const int lane16 = threadIdx.x % 16, row_in = threadIdx.x / 16;  // 16 rows a CTA a step
  uint4 acc = {0, 0, 0, 0};
  long head, t0, t1;
  auto read = [&](long h, long a, long b) {
    for (long t = a + row_in; t < b; t += 16 * 4) {
      uint4 x[4];
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        long tt = t + u * 16;
        if (tt < b) {
          long phys = tt;
          if (page_of) phys = (long)page_of[tt / page_size] * page_size + tt % page_size;
          x[u] = __ldg(kv + (phys * kHeads + h) * (kRowBytes / 16) + lane16);
        } else x[u] = make_uint4(0, 0, 0, 0);
      }
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        acc.x ^= x[u].x;
        acc.y ^= x[u].y;
        acc.z ^= x[u].z;
        acc.w ^= x[u].w;
      }
    }
  };
  if (mode == 0 || mode == 1) {
    long chunks = (tokens + chunk_tokens - 1) / chunk_tokens;
    long c = blockIdx.x;
    long chunk = mode == 0 ? c / kHeads : c % chunks;
    head = mode == 0 ? c % kHeads : c / chunks;
    t0 = chunk * chunk_tokens;
    t1 = t0 + chunk_tokens < tokens ? t0 + chunk_tokens : tokens;
    read(head, t0, t1);
  } else if (mode == 2 || mode == 4) {
    // workers - 3: run boundaries fall at different offsets of each head, as units' overheads make them
    long total = tokens * kHeads, run = (total + workers - 4) / (workers - 3);
    long a = blockIdx.x * run, b = a + run < total ? a + run : total;
    while (a < b) {
      long h = a / tokens, s = a % tokens, e = (h + 1) * tokens < b ? tokens : b - h * tokens;
      read(h, s, e);
      a = h * tokens + e;
    }
  } else {
    long groups = workers / kHeads, run = (tokens + groups - 1) / groups;
    long g = blockIdx.x / kHeads;
    head = blockIdx.x % kHeads;
    t0 = g * run;
    t1 = t0 + run < tokens ? t0 + run : tokens;
    if (g < groups) read(head, t0, t1);
  }
  if ((acc.x ^ acc.y ^ acc.z ^ acc.w) == 0x12345678u) sink[0] = 1.f;
}

int main(int argc, char **argv) {
  long bytes = 2l << 30;  // 2 GiB cache
  long tokens = bytes / (kHeads * kRowBytes);
  int dev = 0, sms, per_sm;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, read_rows, kThreads, 0));
  uint4 *kv;
  float *sink;
  int *page_of;
  CK(cudaMalloc(&kv, bytes));
  CK(cudaMalloc(&sink, 4));
  CK(cudaMemset(kv, 0x3c, bytes));
  const int page = 32;
  long pages = tokens / page;
  std::vector<int> perm(pages);
  for (long i = 0; i < pages; ++i) perm[i] = (int)i;
  srand(0);
  for (long i = pages - 1; i > 0; --i) std::swap(perm[i], perm[rand() % (i + 1)]);
  CK(cudaMalloc(&page_of, pages * 4));
  CK(cudaMemcpy(page_of, perm.data(), pages * 4, cudaMemcpyHostToDevice));
  int workers = sms * per_sm;
  printf("SMs %d, CTAs/SM %d, workers %d, tokens %ld, %.2f GiB\n", sms, per_sm, workers, tokens, bytes / 1073741824.0);
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  struct Case {
    const char *name;
    int mode;
    long chunk;
    int grid;
    bool paged;
  };
  std::vector<Case> cases;
  for (long waves : {1L, 4L}) {
    long chunk = (tokens * kHeads + workers * waves - 1) / (workers * waves);
    int grid = (int)(((tokens + chunk - 1) / chunk) * kHeads);
    static char names[8][64];
    static int k = 0;
    snprintf(names[k], 64, "grid %ld waves, head fastest", waves);
    cases.push_back({names[k++], 0, chunk, grid, false});
    snprintf(names[k], 64, "grid %ld waves, chunk fastest", waves);
    cases.push_back({names[k++], 1, chunk, grid, false});
  }
  cases.push_back({"persistent, head-major runs", 2, 0, workers, false});
  cases.push_back({"persistent, head-aligned", 3, 0, workers, false});
  cases.push_back({"paged32, persistent head-major runs", 4, 0, workers, true});
  cases.push_back({"paged32, persistent head-aligned", 5, 0, workers, true});
  const int rounds = 5, iters = 20;
  std::vector<std::vector<float>> ms(cases.size());
  for (int r = 0; r < rounds; ++r)
    for (size_t i = 0; i < cases.size(); ++i) {
      const Case &c = cases[(r % 2) ? cases.size() - 1 - i : i];
      size_t idx = (r % 2) ? cases.size() - 1 - i : i;
      read_rows<<<c.grid, kThreads>>>(kv, tokens, c.mode, c.chunk, workers, c.paged ? page_of : nullptr, page, sink);
      CK(cudaEventRecord(e0));
      for (int it = 0; it < iters; ++it)
        read_rows<<<c.grid, kThreads>>>(kv, tokens, c.mode, c.chunk, workers, c.paged ? page_of : nullptr, page, sink);
      CK(cudaEventRecord(e1));
      CK(cudaEventSynchronize(e1));
      float t;
      CK(cudaEventElapsedTime(&t, e0, e1));
      ms[idx].push_back(t / iters);
    }
  for (size_t i = 0; i < cases.size(); ++i) {
    std::sort(ms[i].begin(), ms[i].end());
    float m = ms[i][rounds / 2];
    printf("%-40s grid %6d  %8.1f us  %6.0f GB/s\n", cases[i].name, cases[i].grid, m * 1e3, bytes / (m * 1e-3) / 1e9);
  }
  CK(cudaGetLastError());
  return 0;
}
