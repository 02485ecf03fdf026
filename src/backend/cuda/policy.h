// SPDX-License-Identifier: Apache-2.0
// The CUDA backend's policy: which split kernel a problem is planned for,
// how many splits, which merge runs, and why. Decided from shapes and the
// device's occupancy alone (and, at launch, the alignment of K/V), so plans
// and workspace sizes never depend on tensor contents. Every threshold's
// measurement is in tests/bench/policy.md (the section named where it is
// set).
#pragma once

#include <cstdint>

#include "backend/backend.h"
#include "backend/cuda/variants.h"
#include "core/plan.h"
#include "core/problem.h"

namespace fd {
namespace cuda {

// What policy needs to know about the device, read once per handle.
struct DeviceProfile {
  int sm_count = 1;
  KernelOccupancy occupancy;
};

// How a GQA group maps onto CTAs: at most `rows` head slots per CTA, the
// group cut into equal chunks when it is larger; slots are a power of two.
struct HeadTiling {
  int chunks = 1;
  int heads_per_chunk = 1;
  int heads_per_cta = 1;
};

// The plan: split kernel variant, split count, workspace layout (with the
// merge counters' header). The one planning path of the backend.
Plan plan_decode(const Problem &problem, const DeviceProfile &device);

// Everything a launch decides about a planned problem beyond the plan.
struct LaunchChoice {
  SplitVariant variant = SplitVariant::cuda_core;
  HeadTiling heads;
  bool aligned = false;  // every K/V row on 16 bytes (SplitParams::kv_aligned)
  int64_t units = 0;     // (sequence, KV head, chunk) units; each runs plan.num_splits CTAs
  fd_merge merge = FD_MERGE_NONE;
  bool variant_scores = false;  // SplitParams::variant_scores (needs_variant_scores)
  // > 0: the balanced schedule with this many worker CTAs (SplitParams::balanced_workers).
  int32_t balanced_workers = 0;
  int32_t balanced_group = 1;  // SplitParams::balanced_group
  int32_t piece_overhead_tiles = 1;
  int32_t fitted_split_floor = 0;  // SplitParams::fitted_split_floor (and then the merge kernel)
  int32_t fitted_target_ctas = 1;  // the CTAs of keys that cut aims at (SplitParams::fitted_tokens_per_total)
  int32_t fitted_ctas = 0;         // SplitParams::fitted_ctas: the fitted launch's grid
  bool longest_first = false;      // SplitParams::sequence_order, in the plan's scratch (may_order_sequences)
};

bool needs_variant_scores(const Problem &problem);

// Whether a tensor's data and every row it holds (its first three
// dimensions' strides, those of extent 1 aside) start on an `alignment`-byte
// boundary: the condition of the kernels' vector loads and copies.
bool rows_aligned(const StridedView &view, size_t element_bytes, uintptr_t alignment = 16);

// The plan's variant, unless these K/V rows are not 16-byte aligned or a
// paged pool's strides are too large for the tensor-core loader: then the
// CUDA-core kernel runs the same plan (it takes any split length). Then the
// merge. decode and describe both ask this.
LaunchChoice choose_launch(const Problem &problem, const Plan &plan, const DeviceProfile &device);

// fd_plan_info for a launch choice.
LaunchSummary summarize(const Problem &problem, const Plan &plan, const LaunchChoice &launch);

}  // namespace cuda
}  // namespace fd
