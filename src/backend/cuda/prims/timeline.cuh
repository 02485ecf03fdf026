// SPDX-License-Identifier: Apache-2.0
// Per-CTA timestamps, for finding where one call's time goes (how they were
// read: tests/bench/history/performance-history.md, "Run 8"). Only in a build configured with
// -DFLASHDECODE_TIMELINE=ON (never for production: every CTA prints a line):
// each CTA of the split and merge kernels records %globaltimer at fixed
// points, and its thread 0 prints them at exit as
//   FDTL <kernel> <launch> <cta> <sm> <t0> <t1> <t2> <t3> <t4> <t5> <merged>
// with the points
//   t0 start, t1 after griddepcontrol.wait, t2 first tile landed, t3 last tile
//   done, t4 epilogue done (partials stored), t5 exit; merged: 1 when this CTA
//   ran a fused merge (the last sequence it took, when it took several).
// <launch> is the query pointer (the output pointer for the merge kernel):
// it tells apart the calls of a graph that rotates inputs.
// tests/bench/timeline.py runs a shape and tabulates the lines. In every
// other build the macros below are empty and the kernels are unchanged.
#pragma once

#ifdef FD_TIMELINE

#include <cstdint>
#include <cstdio>

namespace fd {
namespace cuda {

struct Timeline {
  unsigned long long t[6];
  int merged;
};

__device__ __forceinline__ unsigned long long timeline_now() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__device__ __forceinline__ void timeline_print(const Timeline &tl, const char *kernel, const void *launch) {
  if (threadIdx.x != 0) return;
  unsigned sm;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
  printf("FDTL %s %llx %u %u %llu %llu %llu %llu %llu %llu %d\n", kernel,
         static_cast<unsigned long long>(reinterpret_cast<uintptr_t>(launch)), blockIdx.x + gridDim.x * blockIdx.y, sm,
         tl.t[0], tl.t[1], tl.t[2], tl.t[3], tl.t[4], tl.t[5], tl.merged);
}

}  // namespace cuda
}  // namespace fd

#define FD_TIMELINE_BEGIN(tl)   \
  ::fd::cuda::Timeline tl = {}; \
  tl.t[0] = ::fd::cuda::timeline_now()
#define FD_TIMELINE_MARK(tl, i) tl.t[i] = ::fd::cuda::timeline_now()
#define FD_TIMELINE_MARK_IF(tl, i, condition) \
  if (condition) tl.t[i] = ::fd::cuda::timeline_now()
#define FD_TIMELINE_MERGED(tl) tl.merged = 1
#define FD_TIMELINE_END(tl, kernel, launch) \
  tl.t[5] = ::fd::cuda::timeline_now();     \
  ::fd::cuda::timeline_print(tl, kernel, launch)

#else

#define FD_TIMELINE_BEGIN(tl)
#define FD_TIMELINE_MARK(tl, i)
#define FD_TIMELINE_MARK_IF(tl, i, condition)
#define FD_TIMELINE_MERGED(tl)
#define FD_TIMELINE_END(tl, kernel, launch)

#endif
