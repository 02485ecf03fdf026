// SPDX-License-Identifier: Apache-2.0
// FD_CHECK_CONTENTS on the device: one CTA reads every query length,
// length and block-table entry a sequence uses, and records the first bad
// one (lowest sequence; its q_lens entry, its length, then its pages by
// column: the CPU backend's order, core/validate.cpp) in the
// handle's mapped ContentReport, unless a report is already waiting there.
// A debugging mode: simple and exact rather than fast. One warp a sequence,
// its lanes over the sequence's pages.
#pragma once

#include <cstdint>

#include "backend/cuda/params.h"

namespace fd {
namespace cuda {

constexpr int kCheckThreads = 1024;

// Orders bad elements: sequence first, then its q_lens entry (column
// kQueryLengthColumn), its length (kLengthColumn), then its pages by column.
// Sequences and columns are below 2^31.
constexpr int64_t kQueryLengthColumn = -2;
constexpr int64_t kLengthColumn = -1;
__device__ __forceinline__ unsigned long long check_key(int64_t sequence, int64_t column, int64_t max_pages) {
  return static_cast<unsigned long long>(sequence) * static_cast<unsigned long long>(max_pages + 2) +
         static_cast<unsigned long long>(column + 2);
}

__global__ void __launch_bounds__(kCheckThreads) check_contents_kernel(const CheckParams p) {
  __shared__ unsigned long long first_bad;
  if (threadIdx.x == 0) first_bad = ~0ull;
  __syncthreads();

  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  constexpr int kWarps = kCheckThreads / 32;
  for (int64_t b = warp; b < p.batch; b += kWarps) {
    // Another warp found a bad element before this sequence: nothing here
    // can come first. Read by one lane, so that the warp leaves together.
    unsigned long long seen = 0;
    if (lane == 0) seen = *static_cast<volatile unsigned long long *>(&first_bad);
    if (check_key(b, kQueryLengthColumn, p.max_pages) > __shfl_sync(0xffffffffu, seen, 0)) break;
    if (p.q_lens != nullptr) {
      const int64_t q_len_b = p.q_lens[b * p.q_lens_stride];
      if (q_len_b < 0 || q_len_b > p.q_len) {
        if (lane == 0) atomicMin(&first_bad, check_key(b, kQueryLengthColumn, p.max_pages));
        break;
      }
    }
    int64_t len = p.kv_capacity;
    if (p.seq_lens != nullptr) len = p.seq_lens[b * p.seq_lens_stride];
    if (len < 0 || len > p.kv_capacity) {
      if (lane == 0) atomicMin(&first_bad, check_key(b, kLengthColumn, p.max_pages));
      break;  // later sequences of this warp order after this one
    }
    if (p.block_table == nullptr) continue;
    const int64_t pages_used = (len + p.page_size - 1) / p.page_size;
    bool found = false;
    for (int64_t first = 0; first < pages_used && !found; first += 32) {
      const int64_t column = first + lane;
      bool bad = false;
      if (column < pages_used) {
        const int64_t page = p.block_table[b * p.block_table_strides[0] + column * p.block_table_strides[1]];
        bad = page < 0 || page >= p.num_pages;
      }
      const unsigned bad_lanes = __ballot_sync(0xffffffffu, bad);
      if (bad_lanes != 0) {
        if (lane == 0) atomicMin(&first_bad, check_key(b, first + __ffs(bad_lanes) - 1, p.max_pages));
        found = true;
      }
    }
    if (found) break;
  }
  __syncthreads();

  if (threadIdx.x != 0 || first_bad == ~0ull) return;
  volatile ContentReport *report = p.report;
  if (report->found != 0) return;  // the earlier report is still waiting for the host
  const int64_t b = static_cast<int64_t>(first_bad / static_cast<unsigned long long>(p.max_pages + 2));
  const int64_t column = static_cast<int64_t>(first_bad % static_cast<unsigned long long>(p.max_pages + 2)) - 2;
  report->sequence = b;
  report->column = column;
  if (column == kQueryLengthColumn) {
    report->value = p.q_lens[b * p.q_lens_stride];
    report->bound = p.q_len;
  } else if (column == kLengthColumn) {
    report->value = p.seq_lens[b * p.seq_lens_stride];
    report->bound = p.kv_capacity;
  } else {
    report->value = p.block_table[b * p.block_table_strides[0] + column * p.block_table_strides[1]];
    report->bound = p.num_pages;
  }
  __threadfence_system();  // the fields before the flag, as the host reads them
  report->found = column == kQueryLengthColumn ? kFoundQueryLength
                  : column == kLengthColumn    ? kFoundLength
                                               : kFoundPage;
}

}  // namespace cuda
}  // namespace fd
