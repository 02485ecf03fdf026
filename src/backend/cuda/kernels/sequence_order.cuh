// SPDX-License-Identifier: Apache-2.0
// The order in which a fixed-schedule grid's rows take the batch's
// sequences (SplitParams::sequence_order): longest first, so that no long
// unit is handed out last to stream alone at the end of the call. One CTA,
// launched ahead of the split kernel, which waits for it: it classes each
// sequence's span (the keys its queries see; up to kMaxOrderedSequences
// sequences) into kLengthClasses classes of equal width up to the longest,
// and writes the sequences class by class, the longest class first, in
// index order within a class (the same lengths give the same order).
// Classes are enough: what the order saves is a long unit started late,
// and a list-scheduling model of serving batch 3 put 16 classes within 2%
// of an exact sort.
#pragma once

#include <cstdint>

#include "backend/cuda/params.h"
#include "backend/cuda/prims/grid_dependency.cuh"
#include "backend/cuda/prims/schedule.cuh"

namespace fd {
namespace cuda {

constexpr int kOrderThreads = 1024;
constexpr int kLengthClasses = 16;

__global__ void __launch_bounds__(kOrderThreads) sequence_order_kernel(SplitParams p) {
  constexpr int kWarps = kOrderThreads / 32;
  __shared__ unsigned warp_longest[kWarps];
  // Each sequence's class, read once: the placement matches the counts even
  // if the lengths changed under the kernel, so the order is a permutation.
  __shared__ uint8_t sequence_class[kMaxOrderedSequences];
  __shared__ unsigned class_next[kLengthClasses];               // counts, then where a class's next sequence goes
  __shared__ unsigned warp_class_next[kWarps][kLengthClasses];  // a chunk's counts, then its warps' first slots
  grid_dependency_wait();                                       // the lengths may be the previous kernel's output
  grid_dependency_launch_dependents();  // the split kernel may be scheduled; it waits for this grid to finish
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  const int batch = static_cast<int>(min(p.batch, kMaxOrderedSequences));  // the policy's cap
  unsigned longest = 0;
  for (int b = threadIdx.x; b < batch; b += kOrderThreads) longest = max(longest, schedule_detail::sequence_span(p, b));
  longest = __reduce_max_sync(0xffffffffu, longest);
  if (lane == 0) warp_longest[warp] = longest;
  if (threadIdx.x < kLengthClasses) class_next[threadIdx.x] = 0;
  __syncthreads();
  longest = 0;
  for (int w = 0; w < kWarps; ++w) longest = max(longest, warp_longest[w]);
  for (int b = threadIdx.x; b < batch; b += kOrderThreads) {
    const unsigned span = min(schedule_detail::sequence_span(p, b), longest);
    const int c = static_cast<int>(uint64_t{span} * kLengthClasses / (uint64_t{longest} + 1));
    sequence_class[b] = static_cast<uint8_t>(c);
    atomicAdd(&class_next[c], 1u);
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    unsigned start = 0;
    for (int c = kLengthClasses - 1; c >= 0; --c) {
      const unsigned count = class_next[c];
      class_next[c] = start;
      start += count;
    }
  }
  // Chunk by chunk of kOrderThreads sequences: within a class, a warp's
  // sequences follow the warps before it, a lane's the lanes before it.
  for (int first = 0; first < batch; first += kOrderThreads) {
    if (threadIdx.x < kWarps * kLengthClasses) {
      warp_class_next[threadIdx.x / kLengthClasses][threadIdx.x % kLengthClasses] = 0;
    }
    __syncthreads();
    const int b = first + threadIdx.x;
    const int c = b < batch ? sequence_class[b] : -1;
    const unsigned peers = __match_any_sync(0xffffffffu, c);
    const unsigned peers_before = __popc(peers & ((1u << lane) - 1u));
    if (c >= 0 && peers_before == 0) warp_class_next[warp][c] = __popc(peers);
    __syncthreads();
    if (threadIdx.x < kLengthClasses) {
      unsigned next = class_next[threadIdx.x];
      for (int w = 0; w < kWarps; ++w) {
        const unsigned count = warp_class_next[w][threadIdx.x];
        warp_class_next[w][threadIdx.x] = next;
        next += count;
      }
      class_next[threadIdx.x] = next;
    }
    __syncthreads();
    if (c >= 0) p.sequence_order[warp_class_next[warp][c] + peers_before] = b;
    __syncthreads();  // every slot is read before the next chunk clears them
  }
}

}  // namespace cuda
}  // namespace fd
