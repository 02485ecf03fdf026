// SPDX-License-Identifier: Apache-2.0
// What every backend provides. The C ABI layer (src/api) owns handles and
// workspaces and calls these; backends know nothing of the C ABI structs.
#pragma once

#include <cstddef>
#include <memory>

#include "core/plan.h"
#include "core/problem.h"
#include "flashdecode.h"

namespace fd {

// What decode enqueues for a planned problem (fd_describe_plan); backends
// decide it with the same code decode uses.
struct LaunchSummary {
  const char *kernel = "";  // static string; see fd_plan_info::kernel
  fd_merge merge = FD_MERGE_SEPARATE;
  int32_t launches = 0;
  int64_t blocks = 0;
  // > 0: the split kernel cuts each sequence on the device, from its length,
  // at multiples of this many tokens (the CUDA backend's balanced schedule):
  // fd_plan_info reports 0 splits of this many tokens.
  int64_t device_cut_tokens = 0;
  fd_schedule schedule = FD_SCHEDULE_FIXED;  // fd_plan_info::schedule
};

class Backend {
 public:
  virtual ~Backend() = default;

  virtual fd_backend kind() const = 0;

  // Rejects valid problems this backend cannot run (FD_ERROR_UNSUPPORTED or a
  // more specific status), before any work.
  virtual void check_supported(const Problem &problem) const = 0;

  // Whether the handle was created with FD_CHECK_CONTENTS.
  virtual bool checks_contents() const = 0;

  // Before a decode on a handle that checks contents: reports bad lengths
  // or page indices (FD_ERROR_INVALID_LENGTH, FD_ERROR_INVALID_BLOCK_TABLE)
  // that this backend can know of without synchronising: the problem's own
  // on the host, or what an earlier decode found on the device.
  virtual void check_contents(const Problem &problem) = 0;

  // fd_check_contents: waits for the work on `stream`, then reports what a
  // checked decode found (nothing to wait for on the host).
  virtual void wait_and_check_contents(fd_cuda_stream stream) = 0;

  // How this backend runs a supported problem: its kernel variant and split
  // count, and the workspace layout (core/plan.h's helpers). May depend only
  // on the fields of PlanKey: handles reuse plans across problems with equal
  // keys.
  virtual Plan plan(const Problem &problem) const = 0;

  // Whether work enqueued on `stream` now would be captured into a CUDA
  // graph (or the stream cannot tell): then the workspace must not grow,
  // since allocating during capture is not allowed.
  virtual bool stream_is_capturing(fd_cuda_stream) const { return false; }

  // Workspace memory in this backend's address space (host or device).
  virtual void *allocate_workspace(size_t bytes) = 0;
  virtual void free_workspace(void *workspace) noexcept = 0;

  // Called when memory becomes a handle's workspace (allocated here or handed
  // over by the caller), before any decode uses it: sets up the header its
  // plans reserve at the start of the workspace (the CUDA backend zeroes
  // its merge counters and waits for that). `bytes` may be smaller than the
  // header; decodes then fail for a too-small workspace before using it.
  virtual void prepare_workspace(void * /*workspace*/, size_t /*bytes*/) {}

  // Runs (or enqueues) one validated, planned decode. `workspace` holds at
  // least plan.workspace_bytes. Must not allocate.
  virtual void decode(const Problem &problem, const Plan &plan, void *workspace, fd_cuda_stream stream) = 0;

  // Runs (or enqueues) one validated fd_merge_states: no workspace, no
  // allocation.
  virtual void merge_states(const MergeProblem &problem, fd_cuda_stream stream) = 0;

  // Runs (or enqueues) one validated fd_append_kv: no workspace, no
  // allocation; never writes outside the cache's pages.
  virtual void append_kv(const AppendProblem &problem, fd_cuda_stream stream) = 0;

  // What decode(problem, plan, ...) would enqueue, without enqueueing it
  // (never called for an empty batch, which fd_decode does not pass on).
  virtual LaunchSummary describe(const Problem &problem, const Plan &plan) const = 0;
};

// num_threads: 0 = every online core. check_contents: FD_CHECK_CONTENTS.
std::unique_ptr<Backend> make_cpu_backend(int num_threads, bool check_contents);

// Throws FD_ERROR_NO_DEVICE if the library was built without CUDA or the
// device is missing.
std::unique_ptr<Backend> make_cuda_backend(int device, bool check_contents);

// Whether make_cuda_backend(device) would succeed; never throws.
bool cuda_backend_available(int device) noexcept;

}  // namespace fd
