// SPDX-License-Identifier: Apache-2.0
// The CUDA backend's policy (src/backend/cuda/policy.cpp) on an H200-like
// device profile, without a GPU: which kernel, schedule, split count and
// merge a problem gets. The rules are those of docs/performance.md ("How the
// CUDA backend chooses") and the plans its tables show; a change of policy
// shows up here, in CI, before any device run. The profile is what the
// backend would read on an H200 (132 multiprocessors; resident CTAs per
// variant as the kernels' launch bounds and shared memory give them; the
// cluster counts are those the policy's wave test sees there).
//
// Problems come through validate_decode_args() with distinct, aligned fake
// addresses: planning reads shapes and alignment, never memory.
// The library's headers first: cmocka.h defines a fail() macro.
#include "backend/cuda/policy.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/problem.h"
#include "kernel_specs.h"  // the GPU suite's kernel-family cases (tests/gpu)

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <algorithm>
#include <functional>
#include <string>

extern "C" {  // this cmocka.h has no C++ guards
#include <cmocka.h>
}

namespace {

using fd::cuda::SplitVariant;

// Resident CTAs a multiprocessor of an H200 holds, per variant (16-bit
// storage, and the 8-bit slot for the 8-bit variants), by bucket 64/128/256.
struct Residency {
  SplitVariant variant;
  int ctas[fd::cuda::kBucketCount];
};
constexpr Residency kH200[] = {
    {SplitVariant::cuda_core, {4, 4, 2}},
    {SplitVariant::tensor_core, {2, 2, 2}},
    {SplitVariant::tensor_core_wide, {1, 1, 1}},
    {SplitVariant::cuda_core_8bit, {4, 4, 2}},
    {SplitVariant::tensor_core_8bit, {2, 2, 2}},
    {SplitVariant::tensor_core_rows, {2, 2, 0}},
    {SplitVariant::tensor_core_rows64, {2, 2, 0}},
    {SplitVariant::tensor_core_compact, {4, 4, 0}},
    {SplitVariant::tensor_core_8bit_keys, {2, 2, 2}},
    {SplitVariant::tensor_core_rows64_wide, {1, 1, 0}},
};

fd::cuda::DeviceProfile h200() {
  fd::cuda::DeviceProfile device;
  device.sm_count = 132;
  const fd_dtype dtypes[] = {FD_DTYPE_F32, FD_DTYPE_F16, FD_DTYPE_BF16, FD_DTYPE_E4M3};
  for (const Residency &r : kH200) {
    for (fd_dtype dtype : dtypes) {
      if (!fd::cuda::split_variant_takes(r.variant, dtype)) continue;
      for (int b = 0; b < fd::cuda::kBucketCount; ++b) {
        const int d = fd::cuda::dtype_slot(dtype);
        device.occupancy.ctas_at(r.variant, d, b) = r.ctas[b];
        // Clusters of the 16-bit tensor-core tiles: the H200 holds every
        // wide CTA in clusters of 2, and 117-120 of its 132 in clusters of
        // 3, 4 or 8 (a cluster stays within a GPC); standard tiles alike.
        const bool clustered = r.variant == SplitVariant::tensor_core || r.variant == SplitVariant::tensor_core_wide;
        if (!clustered || dtype == FD_DTYPE_F32) continue;
        for (int size = 2; size <= fd::cuda::kMaxClusterSplits; ++size) {
          const int ctas = size == 2 ? device.sm_count * r.ctas[b] : 120 * r.ctas[b];
          device.occupancy.clusters_at(r.variant, d, b)[size] = ctas / size;
        }
      }
    }
  }
  return device;
}

// A tensor at a fake address: distinct for every tensor, 256-byte aligned.
fd_tensor tensor(fd_dtype dtype, std::initializer_list<int64_t> shape, uintptr_t offset = 0) {
  static uintptr_t next = uintptr_t{1} << 40;
  fd_tensor t;
  memset(&t, 0, sizeof t);
  t.data = reinterpret_cast<void *>(next + offset);
  next += uintptr_t{1} << 36;
  t.dtype = dtype;
  t.ndim = static_cast<int32_t>(shape.size());
  int i = 0;
  for (int64_t extent : shape) t.shape[i++] = extent;
  int64_t stride = 1;
  for (int d = t.ndim - 1; d >= 0; --d) {
    t.strides[d] = stride;
    stride *= t.shape[d];
  }
  return t;
}

struct Shape {
  int64_t batch = 1, q_len = 1, q_heads = 32, kv_heads = 8, capacity = 4096, head_dim = 128;
  fd_dtype dtype = FD_DTYPE_F16;     // q, out
  fd_dtype kv_dtype = FD_DTYPE_F16;  // k, v
  int64_t page_size = 0;             // > 0: a paged pool of exactly the pages the batch needs
  bool seq_lens = false;
  int32_t num_splits = 0;
  int64_t split_tokens = 0;
  uintptr_t k_offset = 0;        // bytes past an aligned address: unaligned rows
  int64_t window = 0;            // window_left
  bool float_out = false;        // out in f32 instead of q's dtype
  bool q_lens = false;           // per-sequence query lengths
  bool sinks = false;            // attention-sink logits
  float softcap = 0.0f;          // logit_softcap
  bool alibi = false;            // ALiBi slopes
  fdt_layout layout = FDT_BNHD;  // the strides tests/support/fdt.c gives it (paged ones need page_size)
};

// Strides of s.layout over the contiguous tensors args_of made, as
// tests/support/fdt.c lays out its storage: head-major (BHND, paged HND),
// or the padded slice of [B, N + 3, Hkv + 1, D + 8] from head 1, whose q
// and out rows are D + 8 apart.
void lay_out(fd_decode_args &a, const Shape &s) {
  const int64_t n = s.page_size > 0 ? s.page_size : s.capacity, h = s.kv_heads, d = s.head_dim;
  for (fd_tensor *cache : {&a.k, &a.v}) {
    if (s.layout == FDT_BHND || s.layout == FDT_PAGED_HND) {
      cache->strides[1] = d;
      cache->strides[2] = n * d;
    } else if (s.layout == FDT_BNHD_PADDED) {
      cache->strides[0] = (n + 3) * (h + 1) * (d + 8);
      cache->strides[1] = (h + 1) * (d + 8);
      cache->strides[2] = d + 8;
      cache->data = static_cast<char *>(cache->data) + (d + 8) * fd::dtype_bytes(cache->dtype);
    }
  }
  if (s.layout != FDT_BNHD_PADDED) return;
  for (fd_tensor *rows : {&a.q, &a.out}) {
    rows->strides[2] = d + 8;
    rows->strides[1] = s.q_heads * (d + 8);
    rows->strides[0] = s.q_len * s.q_heads * (d + 8);
  }
}

fd_decode_args args_of(const Shape &s) {
  fd_decode_args a;
  fd_decode_args_init(&a, sizeof a);
  a.q = tensor(s.dtype, {s.batch, s.q_len, s.q_heads, s.head_dim});
  a.out = tensor(s.float_out ? FD_DTYPE_F32 : s.dtype, {s.batch, s.q_len, s.q_heads, s.head_dim});
  if (s.page_size > 0) {
    const int64_t pages_per_sequence = (s.capacity + s.page_size - 1) / s.page_size;
    const int64_t pool = s.batch * pages_per_sequence;
    a.k = tensor(s.kv_dtype, {pool, s.page_size, s.kv_heads, s.head_dim}, s.k_offset);
    a.v = tensor(s.kv_dtype, {pool, s.page_size, s.kv_heads, s.head_dim});
    a.block_table = tensor(FD_DTYPE_I32, {s.batch, pages_per_sequence});
  } else {
    a.k = tensor(s.kv_dtype, {s.batch, s.capacity, s.kv_heads, s.head_dim}, s.k_offset);
    a.v = tensor(s.kv_dtype, {s.batch, s.capacity, s.kv_heads, s.head_dim});
  }
  lay_out(a, s);
  if (s.seq_lens) a.seq_lens = tensor(FD_DTYPE_I32, {s.batch});
  if (s.q_lens) a.q_lens = tensor(FD_DTYPE_I32, {s.batch});
  if (s.sinks) a.sinks = tensor(FD_DTYPE_F32, {s.q_heads});
  if (s.alibi) a.alibi_slopes = tensor(FD_DTYPE_F32, {s.q_heads});
  a.logit_softcap = s.softcap;
  a.window_left = s.window;
  a.num_splits = s.num_splits;
  a.split_tokens = s.split_tokens;
  return a;
}

// A problem's plan, its launch, and what fd_describe_plan() reports of them.
struct Planned {
  fd::Plan plan;
  fd::cuda::LaunchChoice launch;
  fd::LaunchSummary summary;
};
Planned planned(const Shape &s, const fd::cuda::DeviceProfile &device = h200()) {
  const fd_decode_args args = args_of(s);
  const fd::Problem problem = fd::validate_decode_args(&args);
  const fd::Plan plan = fd::cuda::plan_decode(problem, device);
  const fd::cuda::LaunchChoice launch = fd::cuda::choose_launch(problem, plan, device);
  return {plan, launch, fd::cuda::summarize(problem, plan, launch)};
}

// What fd_describe_plan() would report, as the benchmarks print it:
// "<kernel> <splits>x<tokens> <merge>", the balanced schedule as 0x<tile>.
std::string plan_of(const Shape &s, const fd::cuda::DeviceProfile &device = h200()) {
  const Planned p = planned(s, device);
  const fd::Plan &plan = p.plan;
  const fd::LaunchSummary &summary = p.summary;
  const char *merge = summary.merge == FD_MERGE_NONE      ? "direct"
                      : summary.merge == FD_MERGE_FUSED   ? "fused"
                      : summary.merge == FD_MERGE_CLUSTER ? "cluster"
                                                          : "merge kernel";
  const bool device_cut = summary.device_cut_tokens > 0;
  return std::string(summary.kernel) + " " + std::to_string(device_cut ? 0 : plan.num_splits) + "x" +
         std::to_string(device_cut ? summary.device_cut_tokens : plan.split_tokens) + " " + merge;
}

void expect_plan(const Shape &s, const char *want, const char *what) {
  std::string got;
  try {
    got = plan_of(s);
  } catch (const fd::Error &error) {
    got = std::string("error: ") + error.what();
  }
  if (got != want) fail_msg("%s: planned '%s', expected '%s'", what, got.c_str(), want);
}

fd_status status_of(const std::function<void()> &f) {
  try {
    f();
  } catch (const fd::Error &error) {
    return error.status();
  }
  return FD_SUCCESS;
}

Shape dense(int64_t batch, int64_t q_heads, int64_t kv_heads, int64_t capacity, int64_t head_dim) {
  Shape s;
  s.batch = batch;
  s.q_heads = q_heads;
  s.kv_heads = kv_heads;
  s.capacity = capacity;
  s.head_dim = head_dim;
  return s;
}

// A GPU test's paged case as tests/gpu/test_cuda_decode.c builds it: q and
// the cache in these dtypes, lengths on the device, q_len query tokens.
Shape gpu_test_case(fd_dtype dtype, fd_dtype kv_dtype, int64_t batch, int64_t q_heads, int64_t kv_heads,
                    int64_t head_dim, int64_t capacity, int64_t page_size, int64_t q_len, int64_t window) {
  Shape s = dense(batch, q_heads, kv_heads, capacity, head_dim);
  s.dtype = dtype;
  s.kv_dtype = kv_dtype;
  s.page_size = page_size;
  s.seq_lens = true;
  s.q_len = q_len;
  s.window = window;
  return s;
}

// docs/performance.md, "Results": the dense shapes' plans.
void test_dense_shapes(void **) {
  expect_plan(dense(1, 32, 8, 32768, 128), "tensor-core-wide-128 16x2048 fused", "shape 1");
  expect_plan(dense(32, 32, 8, 2048, 128), "tensor-core-128 1x2048 direct", "shape 2");
  expect_plan(dense(8, 64, 8, 16384, 128), "tensor-core-wide-128 2x8192 cluster", "shape 3");
  expect_plan(dense(256, 32, 32, 512, 128), "cuda-core-128 1x512 direct", "shape 4 (MHA on CUDA cores)");
  expect_plan(dense(1, 32, 32, 2048, 128), "tensor-core-wide-128 4x512 fused", "shape 5");
  expect_plan(dense(4, 16, 16, 65536, 64), "tensor-core-wide-64 2x32768 cluster", "shape 6");
  expect_plan(dense(2, 8, 1, 262144, 128), "tensor-core-wide-128 64x4096 merge kernel", "shape 7");
  expect_plan(dense(4, 8, 4, 16384, 256), "tensor-core-wide-256 8x2048 fused", "shape 8");
  expect_plan(dense(1, 32, 8, 4096, 128), "tensor-core-128 32x128 merge kernel", "shape 101");
  expect_plan(dense(4, 8, 4, 4096, 256), "tensor-core-wide-256 8x512 fused", "shape 102");
  expect_plan(dense(1, 8, 4, 4096, 256), "tensor-core-256 32x128 merge kernel", "shape 103");
  expect_plan(dense(1, 32, 8, 1024, 128), "tensor-core-128 8x128 cluster", "shape 104");
  expect_plan(dense(1, 32, 32, 1024, 128), "tensor-core-128 8x128 fused", "shape 105");
  expect_plan(dense(1, 16, 16, 4096, 64), "tensor-core-64 16x256 fused", "shape 106");
  Shape bf16 = dense(1, 32, 8, 32768, 128);
  bf16.dtype = bf16.kv_dtype = FD_DTYPE_BF16;
  expect_plan(bf16, "tensor-core-wide-128 16x2048 fused", "shape 1, bf16");
  Shape ragged = dense(16, 32, 8, 16384, 128);
  ragged.seq_lens = true;
  expect_plan(ragged, "tensor-core-wide-128 5x3328 fused", "shape 9 (ragged dense: fixed splits)");
  ragged.page_size = 16;  // the 0.2.0 table shows its plan then, 9x1856
  expect_plan(ragged, "tensor-core-128 0x64 fused", "shape 12 (ragged paged: the balanced schedule)");
  Shape paged = dense(32, 32, 8, 2048, 128);
  paged.page_size = 16;
  expect_plan(paged, "tensor-core-128 1x2048 direct", "shape 10 (paged, one length)");
}

// "Serving batches": paged caches with device lengths run the balanced
// schedule (compact tiles from two units a multiprocessor), many waves of units
// the fixed one.
void test_serving_batches(void **) {
  // A serving batch: lengths on the device, pages of `page_size` (0: dense).
  const auto serving = [](int64_t batch, int64_t q_heads, int64_t kv_heads, int64_t capacity, int64_t head_dim,
                          int64_t page_size) {
    Shape s = dense(batch, q_heads, kv_heads, capacity, head_dim);
    s.page_size = page_size;
    s.seq_lens = true;
    return s;
  };
  expect_plan(serving(48, 32, 8, 12288, 128, 16), "tensor-core-compact-128 0x32 fused", "serving 1");
  expect_plan(serving(24, 64, 8, 24576, 128, 16), "tensor-core-128 0x64 fused",
              "serving 2 (192 units, under two a multiprocessor: standard tiles)");
  expect_plan(serving(384, 32, 8, 1536, 128, 16), "tensor-core-compact-128 1x1536 direct",
              "serving 3 (many waves of units: fixed)");
  expect_plan(serving(32, 16, 16, 3000, 64, 16), "tensor-core-compact-64 0x64 fused", "serving 4 (MHA head_dim 64)");
  expect_plan(serving(6, 32, 8, 98304, 128, 32), "tensor-core-128 0x64 fused", "serving 5 (48 units: standard tiles)");
  expect_plan(serving(66, 32, 4, 8192, 128, 16), "tensor-core-compact-128 0x32 fused",
              "264 units, two a multiprocessor: compact tiles");
  expect_plan(serving(65, 32, 4, 8192, 128, 16), "tensor-core-128 0x64 fused", "260 units: standard tiles");
  // Units cut into more than 8 pieces on average (264 workers): the fixed schedule.
  expect_plan(serving(33, 8, 1, 65536, 128, 16), "tensor-core-128 0x64 fused", "33 MQA units: balanced");
  assert_true(plan_of(serving(32, 8, 1, 65536, 128, 16)).find(" 0x") == std::string::npos);
  assert_true(plan_of(serving(16, 16, 2, 32768, 256, 16)).find(" 0x") == std::string::npos);
  assert_true(plan_of(serving(4, 8, 1, 65536, 128, 16)).find(" 0x") == std::string::npos);
  expect_plan(serving(128, 32, 8, 32768, 128, 16), "tensor-core-compact-128 0x32 fused", "serving 6");
  expect_plan(serving(48, 32, 8, 12288, 128, 1), "tensor-core-128 0x64 fused",
              "serving 7 (pages of 1: no compact tiles)");
  expect_plan(serving(48, 32, 8, 12288, 128, 0), "tensor-core-wide-128 2x6144 fused",
              "serving 8 (dense: the fixed schedule)");
  // Its workers take runs in groups as wide as a sequence's KV heads where both divide evenly.
  const auto group_of = [](const Shape &s) { return planned(s).launch.balanced_group; };
  assert_int_equal(group_of(serving(48, 32, 8, 12288, 128, 16)), 8);
  assert_int_equal(group_of(serving(6, 32, 8, 98304, 128, 32)), 8);
  assert_int_equal(group_of(serving(32, 16, 16, 3000, 64, 16)), 16);   // 528 compact workers
  assert_int_equal(group_of(serving(32, 40, 5, 3000, 128, 16)), 5);    // 5 KV heads: 525 of the 528 workers
  assert_int_equal(group_of(serving(32, 32, 32, 3000, 128, 16)), 16);  // groups of 32 would idle 16 of 528
  // Fixed grids of more than a wave with lengths on the device take their sequences longest first.
  const auto longest_first = [](const Shape &s) { return planned(s).launch.longest_first; };
  assert_true(longest_first(serving(384, 32, 8, 1536, 128, 16)));                     // 3072 CTAs, 528 slots
  assert_int_equal(planned(serving(384, 32, 8, 1536, 128, 16)).summary.launches, 2);  // the order kernel first
  assert_int_equal(planned(serving(48, 32, 8, 12288, 128, 16)).summary.launches, 1);  // balanced: no order
  assert_true(longest_first(serving(48, 32, 8, 12288, 128, 0)));                      // dense: 768 wide CTAs, 132 slots
  assert_true(longest_first(serving(4096, 8, 1, 1024, 128, 16)));    // up to kLongestFirstMaxBatch sequences
  assert_false(longest_first(serving(4097, 8, 1, 1024, 128, 16)));   // the order kernel would read too many lengths
  assert_true(longest_first(serving(640, 32, 8, 1024, 128, 16)));    // 5120 CTAs: 106 tokens a wave
  assert_false(longest_first(serving(1024, 32, 8, 1024, 128, 16)));  // 66 tokens a wave: too many waves of short units
  assert_false(longest_first(serving(4096, 32, 8, 256, 128, 16)));   // 4 tokens a wave
  assert_false(longest_first(serving(48, 32, 8, 12288, 128, 16)));   // balanced
  assert_false(longest_first(serving(4, 8, 1, 65536, 128, 16)));     // fitted: a grid of one wave
  assert_false(longest_first(dense(384, 32, 8, 1536, 128)));         // host lengths: all alike
  assert_false(longest_first(serving(16, 32, 8, 1536, 128, 16)));    // 128 CTAs: one wave, order costs nothing
  assert_false(longest_first(serving(16, 32, 8, 16384, 128, 0)));  // 5 splits a unit: whole splits, whatever the order
  assert_false(longest_first(serving(32, 32, 8, 16384, 128, 0)));  // 3 splits
  // fd_plan_info::schedule names each.
  const auto schedule_of = [](const Shape &s) { return planned(s).summary.schedule; };
  assert_int_equal(schedule_of(serving(48, 32, 8, 12288, 128, 16)), FD_SCHEDULE_BALANCED);
  assert_int_equal(schedule_of(serving(384, 32, 8, 1536, 128, 16)), FD_SCHEDULE_LONGEST_FIRST);
  assert_int_equal(schedule_of(serving(48, 32, 8, 12288, 128, 0)), FD_SCHEDULE_LONGEST_FIRST);
  assert_int_equal(schedule_of(serving(4, 8, 1, 65536, 128, 16)), FD_SCHEDULE_FITTED);    // a wave of fitted pieces
  assert_int_equal(schedule_of(serving(1, 8, 1, 65536, 128, 16)), FD_SCHEDULE_FITTED);    // one sequence: planned grid
  assert_int_equal(schedule_of(serving(16, 32, 8, 16384, 128, 0)), FD_SCHEDULE_FIXED);    // dense, 5 splits
  assert_int_equal(schedule_of(serving(1024, 32, 8, 1024, 128, 16)), FD_SCHEDULE_FIXED);  // too few tokens a wave
  assert_int_equal(schedule_of(dense(1, 32, 8, 32768, 128)), FD_SCHEDULE_FIXED);
}

// The GPU tests' paged cases with device lengths (tests/gpu/test_cuda_decode.c:
// test_balanced_schedule, test_fitted_splits, test_paged_all_sequences_empty)
// must plan the schedule each expects, at its full and its quick capacity,
// so that a policy change that moves one fails here, in CI, first.
void test_gpu_test_schedules(void **) {
  // kFixed: fixed splits in index order; kFitted: splits fitted to the lengths, at least 2; kLongestFirst: fixed,
  // ordered, more than 4 CTAs a multiprocessor
  enum Schedule { kBalanced, kFixed, kFitted, kLongestFirst };
  struct Case {
    const char *what;
    fd_dtype dtype, kv_dtype;
    bool float_out;
    int64_t batch, q_heads, kv_heads, head_dim, capacity, quick_capacity, q_len, window;
    bool q_lens, sinks;
    Schedule schedule;
    bool dense_cache = false;  // else pages of 16
  };
  const fd_dtype f16 = FD_DTYPE_F16, bf16 = FD_DTYPE_BF16, e4m3 = FD_DTYPE_E4M3;
  const Case cases[] = {
      // test_balanced_schedule (quick: capacities over 1000 divided by 4)
      {"skewed", f16, f16, false, 60, 8, 2, 128, 6000, 1500, 1, 0, false, false, kBalanced},
      {"one sequence: fixed splits", bf16, bf16, false, 1, 8, 1, 128, 30000, 7500, 1, 0, false, false, kFitted},
      {"40 units, a few long ones of many pieces", bf16, bf16, false, 40, 8, 1, 128, 20000, 5000, 1, 0, false, false,
       kBalanced},
      {"head_dim 256, 2 KV heads", f16, f16, false, 20, 16, 2, 256, 12000, 3000, 1, 0, false, false, kBalanced},
      {"q_len 3, window", bf16, bf16, false, 45, 16, 4, 64, 3000, 750, 3, 700, false, false, kBalanced},
      {"MHA, head_dim 64", f16, f16, false, 40, 16, 16, 64, 3000, 750, 1, 0, false, false, kBalanced},
      {"float out", f16, f16, true, 50, 8, 2, 96, 2000, 500, 1, 0, false, false, kBalanced},
      {"e4m3 cache", f16, e4m3, false, 36, 32, 8, 128, 1500, 375, 1, 0, false, false, kBalanced},
      {"units past the counters", f16, f16, false, 2100, 8, 8, 32, 32, 32, 1, 0, false, false, kFixed},
      // test_fitted_splits (quick: capacity / 4)
      {"paged, 4 units", f16, f16, false, 2, 16, 2, 64, 65536, 16384, 1, 0, false, false, kFitted},
      {"a sequence of length 0", bf16, bf16, false, 3, 12, 3, 64, 32768, 8192, 1, 0, false, false, kFitted},
      {"q_len 4, wide window, ragged queries", f16, f16, false, 2, 8, 2, 128, 32768, 8192, 4, 20000, true, false,
       kFitted},
      {"e4m3, head_dim 256", f16, e4m3, false, 1, 16, 2, 256, 32768, 8192, 1, 0, false, false, kFitted},
      {"one long sequence among short and empty ones", f16, f16, false, 6, 8, 1, 128, 65536, 16384, 1, 0, false, false,
       kFitted},
      {"table as wide as the longest", bf16, bf16, false, 4, 8, 1, 128, 40000, 10000, 1, 0, false, false, kFitted},
      {"every sequence within its first split", f16, f16, false, 5, 8, 1, 128, 65536, 16384, 1, 0, false, false,
       kFitted},
      {"one sequence within one split, q_len 3", bf16, bf16, false, 1, 32, 8, 128, 131072, 32768, 3, 0, false, false,
       kFitted},
      // test_paged_all_sequences_empty (quick: capacity / 2)
      {"every length 0, 120 units", f16, f16, false, 60, 8, 2, 128, 500, 250, 1, 0, false, false, kBalanced},
      {"every length 0, 320 units", bf16, bf16, false, 40, 32, 8, 128, 500, 250, 1, 0, false, false, kBalanced},
      {"every length 0, f32 out", f16, f16, true, 50, 8, 2, 96, 500, 250, 1, 0, false, false, kBalanced},
      {"every length 0, e4m3 cache", f16, e4m3, false, 36, 32, 8, 128, 500, 250, 1, 0, false, false, kBalanced},
      {"every length 0, q_len 3, window, sinks", bf16, bf16, false, 45, 16, 4, 64, 500, 250, 3, 150, false, true,
       kBalanced},
      // test_longest_first (the same capacity quick)
      {"lengths drawn", f16, f16, false, 270, 16, 8, 64, 512, 512, 1, 0, false, false, kLongestFirst},
      {"all alike", bf16, bf16, false, 270, 16, 8, 64, 512, 512, 1, 0, false, false, kLongestFirst},
      {"one long among short, q_len 2, window", f16, f16, false, 270, 16, 8, 64, 512, 512, 2, 450, false, false,
       kLongestFirst},
      {"many ties, 2500 sequences", f16, f16, false, 2500, 2, 1, 64, 512, 512, 1, 0, false, false, kLongestFirst},
      {"e4m3 cache, dense", f16, e4m3, false, 72, 32, 8, 64, 800, 800, 1, 0, false, false, kLongestFirst, true},
      {"dense cache", bf16, bf16, false, 200, 8, 4, 64, 800, 800, 1, 0, false, false, kLongestFirst, true},
      {"lengths reordered between replays", f16, f16, false, 270, 16, 8, 64, 512, 512, 1, 0, false, false,
       kLongestFirst},
  };
  for (const Case &c : cases) {
    for (const bool quick : {false, true}) {
      Shape s = gpu_test_case(c.dtype, c.kv_dtype, c.batch, c.q_heads, c.kv_heads, c.head_dim,
                              quick ? c.quick_capacity : c.capacity, c.dense_cache ? 0 : 16, c.q_len, c.window);
      s.float_out = c.float_out;
      s.q_lens = c.q_lens;
      s.sinks = c.sinks;
      const Planned p = planned(s);
      const bool balanced = p.summary.device_cut_tokens > 0;
      const bool as_expected = c.schedule == kBalanced ? balanced && p.summary.schedule == FD_SCHEDULE_BALANCED
                               : c.schedule == kFixed  ? p.summary.schedule == FD_SCHEDULE_FIXED
                               : c.schedule == kFitted
                                   ? p.summary.schedule == FD_SCHEDULE_FITTED && p.plan.num_splits >= 2
                                   : p.summary.schedule == FD_SCHEDULE_LONGEST_FIRST && p.launch.longest_first &&
                                         p.summary.blocks > 4 * h200().sm_count;
      if (!as_expected) fail_msg("%s%s: planned '%s'", c.what, quick ? " (quick)" : "", plan_of(s).c_str());
    }
  }
}

// The kernel each kernel-family case of the GPU suite expects
// (tests/gpu/kernel_specs.h: test_rows_kernel, test_ragged_query_lengths,
// test_8bit_kernels, test_compact_tiles), at its full and quick (kv_len / 4)
// capacity, as kernel_spec_expected names it on an H200: a policy change
// that moves one fails here, in CI, first. "tensor-core-" is the standard or
// wide tiles, no other family.
void test_gpu_test_kernels(void **) {
  struct Family {
    const char *test;
    const kernel_spec *specs;
    size_t count;
  };
  const Family families[] = {
      {"rows", rows_kernel_specs, sizeof rows_kernel_specs / sizeof rows_kernel_specs[0]},
      {"ragged q_lens", ragged_query_specs, sizeof ragged_query_specs / sizeof ragged_query_specs[0]},
      {"8-bit kernels", kernel_8bit_specs, sizeof kernel_8bit_specs / sizeof kernel_8bit_specs[0]},
      {"compact tiles", compact_tile_specs, sizeof compact_tile_specs / sizeof compact_tile_specs[0]},
  };
  const auto starts_with = [](const std::string &s, const char *prefix) { return s.rfind(prefix, 0) == 0; };
  const int sms = h200().sm_count, cc_major = 9;
  for (const Family &family : families) {
    for (size_t i = 0; i < family.count; ++i) {
      const kernel_spec &c = family.specs[i];
      for (const bool quick : {false, true}) {
        const int64_t kv_len = quick ? c.kv_len / 4 : c.kv_len;
        const bool paged = c.layout == FDT_PAGED_NHD || c.layout == FDT_PAGED_HND;
        Shape s = gpu_test_case(c.dtype, c.kv_dtype == FDT_KV_AS_Q ? c.dtype : c.kv_dtype, c.batch, c.q_heads,
                                c.kv_heads, c.head_dim, kv_len, paged ? c.page_size : 0, c.q_len, c.window);
        s.layout = c.layout;
        s.seq_lens = c.ragged != 0;
        s.q_lens = c.ragged_q != 0;
        s.softcap = static_cast<float>(c.softcap);
        s.alibi = c.alibi != 0;
        s.sinks = c.sinks != 0;
        s.num_splits = c.splits;
        const char *want =
            kernel_spec_expected(&c, kv_len, quick, kernel_spec_compact_planned(&c, sms, cc_major), /*wide rows*/ 1);
        std::string kernel;
        try {
          kernel = planned(s).summary.kernel;
        } catch (const fd::Error &error) {
          kernel = std::string("error: ") + error.what();
        }
        const bool other_tensor_core = starts_with(kernel, "tensor-core-rows") ||
                                       starts_with(kernel, "tensor-core-compact-") ||
                                       starts_with(kernel, "tensor-core-8bit-");
        if (!starts_with(kernel, want) || (std::string(want) == "tensor-core-" && other_tensor_core)) {
          fail_msg("%s, %s%s: planned '%s', expected %s", family.test, c.what, quick ? " (quick)" : "", kernel.c_str(),
                   want);
        }
      }
    }
  }
}

// The merge each case of the GPU suite's test_merge_paths_on_caller_workspace
// expects (tests/gpu/kernel_specs.h: BHND, asked splits) at its full and
// quick (kv_len / 4) length, and the kernels of test_mha_128_both_kernels.
void test_gpu_test_merges(void **) {
  for (const merge_path_spec &c : merge_path_specs) {
    for (const bool quick : {false, true}) {
      Shape s = dense(c.batch, c.q_heads, c.kv_heads, quick ? c.kv_len / 4 : c.kv_len, c.head_dim);
      s.dtype = s.kv_dtype = c.dtype;
      s.float_out = c.out_dtype == FD_DTYPE_F32;
      s.layout = FDT_BHND;
      s.seq_lens = c.ragged != 0;
      s.num_splits = c.splits;
      const int want = merge_path_expected(&c, 9);
      const int got = planned(s).summary.merge;
      if (got != want) fail_msg("%s%s: planned merge %d, expected %d", c.what, quick ? " (quick)" : "", got, want);
    }
  }
  // MHA at head_dim 128: tensor cores below 16 waves of tensor-core CTAs, CUDA cores above.
  for (const fd_dtype dtype : {FD_DTYPE_F16, FD_DTYPE_BF16}) {
    Shape few = dense(6, 32, 32, 1500, 128), many = dense(160, 32, 32, 96, 128);
    few.dtype = few.kv_dtype = many.dtype = many.kv_dtype = dtype;
    const std::string few_kernel = planned(few).summary.kernel, many_kernel = planned(many).summary.kernel;
    assert_true(few_kernel.rfind("tensor-core-128", 0) == 0 || few_kernel.rfind("tensor-core-wide-128", 0) == 0);
    assert_true(many_kernel.rfind("cuda-core-128", 0) == 0);
  }
}

// Several query rows a KV head: the tensor-core kernel up to 16, the rows
// kernels above (up to 32 on two m-tiles, up to 64 a CTA on four).
void test_query_rows(void **) {
  Shape s = dense(1, 32, 8, 32768, 128);
  s.q_len = 4;  // 16 rows: 16 splits' partials of 16 rows are 128 KiB a unit, over the fused merge's 64
  expect_plan(s, "tensor-core-wide-128 16x2048 merge kernel", "16 rows");
  s.q_len = 8;  // 32 rows in splits of 16 wide tiles: the 32-row kernel
  assert_true(plan_of(s).rfind("tensor-core-rows-128 ", 0) == 0);
  s = dense(32, 32, 8, 2048, 128);
  s.q_len = 8;  // 32 rows, a split of 16 wide tiles a unit
  assert_true(plan_of(s).rfind("tensor-core-rows-128 ", 0) == 0);
  s = dense(64, 32, 8, 4096, 128);
  s.q_len = 8;  // 32 rows, 32 wide tiles a unit, but four waves of them
  assert_true(plan_of(s).rfind("tensor-core-rows-128 ", 0) == 0);
  s = dense(16, 64, 8, 4096, 128);
  s.q_len = 4;  // 32 rows, 32 wide tiles a unit, one wave
  expect_plan(s, "tensor-core-rows64-wide-128 1x4096 direct", "32 rows, one wave of 32-tile splits");
  s = dense(8, 64, 8, 16384, 128);
  s.q_len = 4;  // 32 rows in splits of 64 wide tiles: the wide 64-row kernel
  expect_plan(s, "tensor-core-rows64-wide-128 2x8192 fused", "32 rows, long splits");
  s.q_len = 3;  // 24 rows
  expect_plan(s, "tensor-core-rows64-wide-128 2x8192 fused", "24 rows, long splits");
  s.num_splits = 8;  // asked for splits of 16 tiles
  assert_true(plan_of(s).rfind("tensor-core-rows-128 8x", 0) == 0);
  s.num_splits = 2;
  expect_plan(s, "tensor-core-rows64-wide-128 2x8192 fused", "24 rows, two long splits asked");
  s.num_splits = 0;
  s.split_tokens = 8192;  // batch invariant: no kernel that depends on the batch
  assert_true(plan_of(s).rfind("tensor-core-rows-128 ", 0) == 0);
  s.split_tokens = 0;
  {  // the GPU suite's rows cases on the wide kernel (test_rows_kernel): 17-32 rows, 64 merged fused
    Shape two = dense(2, 24, 2, 36000, 128);
    two.q_len = 2;  // 24 rows, two splits asked, pages of 8
    two.num_splits = 2;
    two.seq_lens = true;
    two.page_size = 8;
    expect_plan(two, "tensor-core-rows64-wide-128 2x18048 fused", "24 rows, two long splits, ragged, pages of 8");
    two.capacity = 9000;  // the GPU suite's quick mode: a quarter of the keys
    expect_plan(two, "tensor-core-rows64-wide-128 2x4608 fused", "24 rows, two 4500-token splits");
    Shape small = dense(3, 16, 2, 40000, 64);
    small.q_len = 3;  // 24 rows at head_dim 64
    small.num_splits = 2;
    expect_plan(small, "tensor-core-rows64-wide-64 2x20096 fused", "24 rows, head_dim 64, two long splits");
    Shape fused = dense(2, 16, 2, 12000, 128);
    fused.q_len = 8;  // 64 rows x 2 splits: 64 KiB of partials a unit
    fused.num_splits = 2;
    expect_plan(fused, "tensor-core-rows64-wide-128 2x6016 fused", "64 rows, two splits");
    fused.capacity = 3000;  // the GPU suite's quick mode
    expect_plan(fused, "tensor-core-rows64-wide-128 2x1536 fused", "64 rows, two 1500-token splits");
    Shape wave = dense(32, 32, 4, 4096, 64);
    wave.q_len = 4;  // 32 rows, 128 units: one wave of one split each
    expect_plan(wave, "tensor-core-rows64-wide-64 1x4096 direct", "32 rows, one wave, head_dim 64");
  }
  s.q_len = 8;  // 64 rows: the wide 64-row kernel (sm_90); two splits' partials are 64 KiB, fused
  expect_plan(s, "tensor-core-rows64-wide-128 2x8192 fused", "64 rows, long splits");
  s.q_len = 16;  // 128 rows: two CTAs a KV head
  assert_true(plan_of(s).rfind("tensor-core-rows64-wide-128 ", 0) == 0);
  // A device without the wide kernel (not sm_90, or less shared memory): the 64-row one.
  fd::cuda::DeviceProfile narrow = h200();
  for (int d = 0; d < fd::cuda::kDtypeSlotCount; ++d) {
    for (int b = 0; b < fd::cuda::kBucketCount; ++b)
      narrow.occupancy.ctas_at(SplitVariant::tensor_core_rows64_wide, d, b) = 0;
  }
  assert_true(plan_of(s, narrow).rfind("tensor-core-rows64-128 ", 0) == 0);
  s.q_len = 4;  // 32 rows in long splits
  assert_true(plan_of(s, narrow).rfind("tensor-core-rows-128 ", 0) == 0);
  s = dense(4, 8, 4, 16384, 256);
  s.q_len = 16;  // 32 rows at head_dim 256: no rows kernel, standard or wide tiles
  const std::string plan = plan_of(s);
  assert_true(plan.rfind("tensor-core-rows", 0) != 0);
  assert_true(plan.rfind("tensor-core", 0) == 0);
}

// 8-bit caches: keys on the MMA's M up to 8 rows a KV head, 16-row tiles
// above; int8 and e5m2 alike.
void test_8bit_caches(void **) {
  const fd_dtype formats[] = {FD_DTYPE_E4M3, FD_DTYPE_E5M2, FD_DTYPE_I8};
  for (fd_dtype format : formats) {
    Shape s = dense(32, 32, 8, 2048, 128);
    s.kv_dtype = format;
    assert_true(plan_of(s).rfind("tensor-core-8bit-keys-128 ", 0) == 0);
    s = dense(4, 128, 8, 8192, 128);  // a group of 16
    s.kv_dtype = format;
    assert_true(plan_of(s).rfind("tensor-core-8bit-128 ", 0) == 0);
    s = dense(4, 8, 4, 16384, 256);
    s.kv_dtype = format;
    assert_true(plan_of(s).rfind("tensor-core-8bit-keys-256 ", 0) == 0);
  }
}

// Rows that are not on 16 bytes, and f32 caches, take the CUDA-core kernel,
// which runs every problem.
void test_fallbacks(void **) {
  Shape s = dense(32, 32, 8, 2048, 128);
  s.k_offset = 2;  // f16 rows 2 bytes off 16
  assert_true(plan_of(s).rfind("cuda-core-128 ", 0) == 0);
  s = dense(32, 32, 8, 2048, 128);
  s.dtype = s.kv_dtype = FD_DTYPE_F32;
  assert_true(plan_of(s).rfind("cuda-core-128 ", 0) == 0);
  s = dense(32, 32, 8, 2048, 96);
  s.kv_dtype = FD_DTYPE_E4M3;
  s.k_offset = 8;
  assert_true(plan_of(s).rfind("cuda-core-8bit-128 ", 0) == 0);
}

// Batch-invariant splits always merge in the merge kernel; wide tiles only
// from 2048-token splits and above head_dim 64 ("Batch-invariant mode").
void test_batch_invariant(void **) {
  Shape s = dense(1, 32, 8, 32768, 128);
  s.split_tokens = 2048;
  expect_plan(s, "tensor-core-wide-128 16x2048 merge kernel", "2048-token splits");
  s.split_tokens = 1024;
  expect_plan(s, "tensor-core-128 32x1024 merge kernel", "1024-token splits");
  s = dense(4, 16, 16, 65536, 64);
  s.split_tokens = 4096;
  expect_plan(s, "tensor-core-64 16x4096 merge kernel", "head_dim 64");
  s = dense(1, 32, 8, 1000, 128);
  s.split_tokens = 2048;
  expect_plan(s, "tensor-core-wide-128 1x2048 direct", "one split writes its output");
}

// A sliding window is planned on the keys it sees: 4096 over a 32768-token
// cache as a 4096-token cache, dense and paged ("Attention variants").
void test_window_plans(void **) {
  for (int64_t page_size : {int64_t{0}, int64_t{16}}) {
    Shape window = dense(1, 32, 8, 32768, 128);
    window.window = 4096;
    window.page_size = page_size;
    Shape short_cache = dense(1, 32, 8, 4096, 128);
    short_cache.page_size = page_size;
    const std::string want = plan_of(short_cache);
    expect_plan(window, want.c_str(), page_size > 0 ? "window 4096, pages of 16" : "window 4096, dense");
  }
}

// Manual split counts are kept; the tables fail closed.
void test_manual_splits_and_tables(void **) {
  Shape s = dense(32, 32, 8, 2048, 128);
  s.num_splits = 3;
  expect_plan(s, "tensor-core-128 3x704 fused", "3 splits asked (of whole 64-token tiles)");
  // Units of up to 64 KiB of partials merge fused where they fit the split kernel's
  // shared memory (the GPU suite's merge-path cases over 32 KiB, full and quick sizes).
  Shape mha = dense(4, 16, 16, 3000, 128);
  mha.num_splits = 100;  // 1 row x 100 splits x 512 bytes
  expect_plan(mha, "tensor-core-128 100x64 fused", "50 KiB a unit");
  Shape ragged = dense(2, 32, 8, 6000, 128);
  ragged.num_splits = 24;  // 4 rows x 24 splits x 512 bytes
  ragged.seq_lens = true;
  expect_plan(ragged, "tensor-core-128 24x256 fused", "48 KiB a unit, ragged");
  Shape f32 = dense(2, 8, 4, 8000, 128);
  f32.dtype = f32.kv_dtype = FD_DTYPE_F32;
  f32.num_splits = 64;  // 2 rows x 64 splits x 512 bytes
  expect_plan(f32, "cuda-core-128 64x128 fused", "64 KiB a unit, CUDA cores");
  f32.capacity = 2000;  // the GPU suite's quick mode
  expect_plan(f32, "cuda-core-128 64x32 fused", "64 KiB a unit, CUDA cores, 2000 tokens");
  Shape over = dense(2, 16, 2, 3000, 128);
  over.num_splits = 16;  // 8 rows x 16 splits: 64 KiB, but over the standard tiles' shared memory
  expect_plan(over, "tensor-core-128 16x192 merge kernel", "64 KiB a unit, standard tiles");
  // A block table far wider than the lengths: the splits fitted on the
  // device use at most a wave's share of CTAs a unit (264 on the H200), so
  // no more are planned (nor launched, for one sequence).
  Shape table = dense(1, 8, 1, 262144, 128);
  table.page_size = 16;
  table.seq_lens = true;
  expect_plan(table, "tensor-core-128 256x1024 merge kernel", "one sequence, 262144-token table");
  table = dense(2, 32, 8, 131072, 128);
  table.page_size = 16;
  table.seq_lens = true;
  expect_plan(table, "tensor-core-128 33x4032 merge kernel", "two sequences of 8 units, 131072-token table");
  assert_int_equal(status_of([] { fd::cuda::split_variant_at(fd::cuda::kSplitVariantCount); }), FD_ERROR_INTERNAL);
  assert_int_equal(status_of([] { fd::cuda::split_variant_at(-1); }), FD_ERROR_INTERNAL);
  for (int i = 0; i < fd::cuda::kSplitVariantCount; ++i) {
    assert_int_equal(static_cast<int>(fd::cuda::split_variant_at(i)), i);
  }
}

// The planner's invariants on random problems (fixed seed): every problem
// plans and launches without an exception; 1..FD_MAX_SPLITS splits; a CTA's
// head slots hold its chunk of rows; the rows kernels take exactly the
// 16-bit tensor-core problems of over 16 rows a KV head; the wide 64-row
// kernel takes 17-32 rows only in fixed splits of 32+ tiles in one wave;
// batch-invariant plans name the same kernel and split length whatever the
// batch size, capacity and lengths.
void test_random_problems(void **) {
  uint64_t state = 0x9e3779b97f4a7c15ull;
  const auto draw = [&state](int64_t lo, int64_t hi) {  // uniform in [lo, hi], splitmix64
    uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return lo + static_cast<int64_t>(z % static_cast<uint64_t>(hi - lo + 1));
  };
  const fd::cuda::DeviceProfile device = h200();
  const int64_t head_dims[] = {64, 80, 96, 128, 256};
  const int64_t pages[] = {0, 0, 1, 16, 32};
  const fd_dtype dtypes[] = {FD_DTYPE_F16, FD_DTYPE_BF16, FD_DTYPE_F32};
  const fd_dtype kv_dtypes[] = {FD_DTYPE_F16, FD_DTYPE_E4M3, FD_DTYPE_I8};
  int planned = 0, rows_kernels = 0, wide_rows = 0, invariant = 0, balanced = 0, fitted = 0;
  for (int i = 0; i < 3000; ++i) {
    Shape s;
    s.kv_heads = draw(1, 16);
    s.q_heads = s.kv_heads * draw(1, 32);
    s.q_len = draw(0, 3) == 0 ? draw(1, 16) : 1;
    s.batch = draw(1, 512);
    s.capacity = draw(1, 4) == 1 ? draw(1, 256) : draw(1, 131072 / (1 + s.batch / 16));
    s.head_dim = head_dims[draw(0, 4)];
    s.dtype = dtypes[draw(0, 2)];
    s.kv_dtype = draw(0, 3) == 0 && s.dtype != FD_DTYPE_F32 ? kv_dtypes[draw(1, 2)] : s.dtype;
    s.page_size = pages[draw(0, 4)];
    s.seq_lens = draw(0, 1) == 1;
    if (draw(0, 4) == 0) s.num_splits = static_cast<int32_t>(draw(1, 64));
    if (s.num_splits == 0 && draw(0, 5) == 0) s.split_tokens = 256 * draw(1, 32);
    if (draw(0, 5) == 0) {  // 17-36 rows of few units and long caches: where the wide kernel may take them
      s.q_heads = s.kv_heads * (4 * draw(1, 3));
      s.q_len = (draw(17, 32) + s.q_heads / s.kv_heads - 1) / (s.q_heads / s.kv_heads);
      s.batch = std::max<int64_t>(1, draw(8, 160) / s.kv_heads);
      s.capacity = draw(4096, 65536);
      s.dtype = s.kv_dtype = FD_DTYPE_BF16;
      s.head_dim = 128;
    }
    const fd_decode_args args = args_of(s);
    const fd::Problem p = fd::validate_decode_args(&args);
    const fd::Plan plan = fd::cuda::plan_decode(p, device);
    const fd::cuda::LaunchChoice launch = fd::cuda::choose_launch(p, plan, device);
    const fd::LaunchSummary summary = fd::cuda::summarize(p, plan, launch);
    ++planned;
    const std::string what = std::to_string(s.batch) + "x" + std::to_string(s.q_heads) + "/" +
                             std::to_string(s.kv_heads) + "x" + std::to_string(s.capacity) + "x" +
                             std::to_string(s.head_dim) + " q_len " + std::to_string(s.q_len) + " pages " +
                             std::to_string(s.page_size) + " splits " + std::to_string(s.num_splits) + "/" +
                             std::to_string(s.split_tokens) + ": " + summary.kernel;
    if (plan.num_splits < 1 || plan.num_splits > FD_MAX_SPLITS)
      fail_msg("%s: %d splits", what.c_str(), plan.num_splits);
    const fd::cuda::SplitKernelShape shape = fd::cuda::split_kernel_shape(launch.variant, p.kv_dtype, p.head_dim);
    if (launch.heads.heads_per_chunk > shape.rows ||
        static_cast<int64_t>(launch.heads.chunks) * launch.heads.heads_per_chunk < p.rows_per_kv_head()) {
      fail_msg("%s: chunks of %d rows for %lld", what.c_str(), launch.heads.heads_per_chunk,
               static_cast<long long>(p.rows_per_kv_head()));
    }
    if (launch.balanced_workers > 0) {  // groups of workers share a run: they must split both evenly
      const int64_t units_per_sequence = p.kv_heads * launch.heads.chunks;
      const int64_t slots = static_cast<int64_t>(device.sm_count) *
                            device.occupancy.ctas(launch.variant, p.kv_dtype, shape.head_dim_bucket);
      if (launch.balanced_group < 1 || launch.balanced_workers % launch.balanced_group != 0 ||
          units_per_sequence % launch.balanced_group != 0 || launch.balanced_workers > slots ||
          launch.balanced_workers * 64 < slots * 63 ||
          (launch.balanced_group == 1 && units_per_sequence % 2 == 0 && slots % 2 == 0)) {
        fail_msg("%s: groups of %d of %d workers, %lld units a sequence", what.c_str(), launch.balanced_group,
                 launch.balanced_workers, static_cast<long long>(units_per_sequence));
      }
      ++balanced;
    }
    if (launch.fitted_split_floor > 0) {  // fixed splits fitted to the lengths on the device: paged, few units,
                                          // automatic, merged by the merge kernel, one wave of CTAs
      const int64_t slots = static_cast<int64_t>(device.sm_count) *
                            device.occupancy.ctas(launch.variant, p.kv_dtype, shape.head_dim_bucket);
      if (!p.paged || !p.has_seq_lens || p.batch_invariant() || p.requested_splits > 0 || launch.balanced_workers > 0 ||
          plan.num_splits < 2 || launch.units >= slots || launch.merge != FD_MERGE_SEPARATE ||
          launch.fitted_target_ctas != slots - launch.units ||
          launch.fitted_ctas != (p.batch > 1 ? std::min<int64_t>(slots, launch.units * plan.num_splits) : 0) ||
          summary.blocks != (p.batch > 1 ? launch.fitted_ctas : launch.units * plan.num_splits) ||
          // no more splits than a sequence's units can use: a wave's share each
          (launch.variant == fd::cuda::split_variant_at(plan.kernel_variant) &&
           plan.num_splits > (slots + launch.units / p.batch - 1) / (launch.units / p.batch))) {
        fail_msg("%s: splits fitted to the lengths (%d splits, %lld units, %lld slots)", what.c_str(), plan.num_splits,
                 static_cast<long long>(launch.units), static_cast<long long>(slots));
      }
      ++fitted;
    } else if (p.paged && p.has_seq_lens && !p.batch_invariant() && p.requested_splits == 0 &&
               launch.balanced_workers == 0 && plan.num_splits > 1 &&
               launch.units < static_cast<int64_t>(device.sm_count) *
                                  device.occupancy.ctas(launch.variant, p.kv_dtype, shape.head_dim_bucket)) {
      fail_msg("%s: %d splits over the capacity for %lld units", what.c_str(), plan.num_splits,
               static_cast<long long>(launch.units));
    }
    const std::string kernel = summary.kernel;
    const bool rows_kernel = kernel.rfind("tensor-core-rows", 0) == 0;
    const bool sixteen_bit_tensor_cores = s.dtype != FD_DTYPE_F32 && s.kv_dtype == s.dtype && s.head_dim <= 128;
    if (rows_kernel != (sixteen_bit_tensor_cores && launch.aligned && p.rows_per_kv_head() > 16)) {
      fail_msg("%s: rows kernel %d for %lld rows", what.c_str(), rows_kernel,
               static_cast<long long>(p.rows_per_kv_head()));
    }
    rows_kernels += rows_kernel;
    if (kernel.rfind("tensor-core-rows64-wide-", 0) == 0 && p.rows_per_kv_head() <= 32) {
      ++wide_rows;
      const int64_t ctas = p.batch * p.kv_heads * plan.num_splits;
      const int64_t slots = static_cast<int64_t>(device.sm_count) *
                            device.occupancy.ctas(launch.variant, p.kv_dtype, shape.head_dim_bucket);
      if (p.batch_invariant() || launch.balanced_workers > 0 || plan.split_tokens < 32 * shape.tile_tokens ||
          ctas > slots) {
        fail_msg("%s: the wide kernel for %lld rows, %d x %lld tokens", what.c_str(),
                 static_cast<long long>(p.rows_per_kv_head()), plan.num_splits,
                 static_cast<long long>(plan.split_tokens));
      }
    }
    if (s.split_tokens > 0) {  // the same problem at another batch size, capacity and lengths
      ++invariant;
      Shape other = s;
      other.batch = draw(1, 512);
      other.capacity = draw(1, 65536);
      other.seq_lens = !s.seq_lens;
      const fd_decode_args other_args = args_of(other);
      const fd::Problem q = fd::validate_decode_args(&other_args);
      const fd::Plan other_plan = fd::cuda::plan_decode(q, device);
      const fd::LaunchSummary other_summary =
          fd::cuda::summarize(q, other_plan, fd::cuda::choose_launch(q, other_plan, device));
      if (kernel != other_summary.kernel ||
          (plan.num_splits > 1 && other_plan.num_splits > 1 && plan.split_tokens != other_plan.split_tokens)) {
        fail_msg("%s: batch invariant, but %s in %lld-token splits at batch %lld, capacity %lld", what.c_str(),
                 other_summary.kernel, static_cast<long long>(other_plan.split_tokens),
                 static_cast<long long>(other.batch), static_cast<long long>(other.capacity));
      }
    }
  }
  print_message(
      "%d random problems planned: %d on rows kernels (%d of 17-32 rows on the wide one), %d batch "
      "invariant, %d balanced, %d fixed splits fitted to the lengths\n",
      planned, rows_kernels, wide_rows, invariant, balanced, fitted);
  assert_true(rows_kernels > 100 && wide_rows > 0 && invariant > 100 && balanced > 100 && fitted > 5);
}

}  // namespace

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_dense_shapes),
      cmocka_unit_test(test_serving_batches),
      cmocka_unit_test(test_gpu_test_schedules),
      cmocka_unit_test(test_gpu_test_kernels),
      cmocka_unit_test(test_gpu_test_merges),
      cmocka_unit_test(test_query_rows),
      cmocka_unit_test(test_8bit_caches),
      cmocka_unit_test(test_fallbacks),
      cmocka_unit_test(test_batch_invariant),
      cmocka_unit_test(test_window_plans),
      cmocka_unit_test(test_manual_splits_and_tables),
      cmocka_unit_test(test_random_problems),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
