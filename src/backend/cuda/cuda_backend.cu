// SPDX-License-Identifier: Apache-2.0
// The CUDA backend: a handle's device and workspace memory, and a validated
// Problem and Plan turned into kernel parameters and one launch call. Which
// kernel and merge run is policy.cpp's; the kernels are behind dispatch.h.
//
// fd_decode on this backend enqueues the split kernel (after the kernel
// that orders its grid longest first where choose_launch says so; before
// the merge kernel when the merge is not fused into it) on the caller's
// stream and nothing else: no allocation (the api layer reserved the
// workspace), no copy, no synchronisation, so it can be captured in a CUDA
// graph.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <new>

#include "backend/backend.h"
#include "backend/cuda/device.h"
#include "backend/cuda/dispatch.h"
#include "backend/cuda/params.h"
#include "backend/cuda/policy.h"
#include "core/error.h"

namespace fd {
namespace {

using cuda::check_cuda;
using cuda::DeviceGuard;

constexpr float kLog2e = 1.4426950408889634f;

bool supported_head_dim(int64_t head_dim) {
  return head_dim >= cuda::kMinHeadDim && head_dim <= cuda::kMaxHeadDim && head_dim % cuda::kHeadDimMultiple == 0;
}

cuda::OutputParams output_params(const Problem &p) {
  cuda::OutputParams o;
  o.out = p.out.data;
  o.out_batch_stride = p.out.strides[0];
  o.out_token_stride = p.out.strides[1];
  o.out_head_stride = p.out.strides[2];
  if (p.has_lse) {
    o.lse = static_cast<float *>(p.lse.data);
    o.lse_batch_stride = p.lse.strides[0];
    o.lse_token_stride = p.lse.strides[1];
    o.lse_head_stride = p.lse.strides[2];
  }
  if (p.has_sinks) {
    o.sinks = static_cast<const float *>(p.sinks.data);
    o.sinks_stride = p.sinks.strides[0];
  }
  return o;
}

cuda::SplitParams split_params(const Problem &p, const Plan &plan, const cuda::LaunchChoice &launch, char *workspace) {
  cuda::SplitParams s;
  s.q = p.q.data;
  s.q_batch_stride = p.q.strides[0];
  s.q_token_stride = p.q.strides[1];
  s.q_head_stride = p.q.strides[2];
  s.k = p.k.data;
  s.v = p.v.data;
  for (int d = 0; d < 3; ++d) {
    s.k_strides[d] = p.k.strides[d];
    s.v_strides[d] = p.v.strides[d];
  }
  s.kv_aligned = launch.aligned;
  if (p.kv_quantized) {
    s.kv_format = static_cast<int32_t>(p.kv_dtype);
    const auto scale = [&](bool has, const StridedView &view, const float *&data, int64_t(&strides)[3],
                           bool &per_token) {
      if (!has) return;
      data = static_cast<const float *>(view.data);
      for (int d = 0; d < 3; ++d) strides[d] = view.shape[d] > 1 ? view.strides[d] : 0;
      per_token = strides[1] != 0 || (p.paged && strides[0] != 0);
    };
    scale(p.has_k_scale, p.k_scale, s.k_scale, s.k_scale_strides, s.k_scale_per_token);
    scale(p.has_v_scale, p.v_scale, s.v_scale, s.v_scale_strides, s.v_scale_per_token);
  }
  if (p.has_seq_lens) {
    s.seq_lens = static_cast<const int32_t *>(p.seq_lens.data);
    s.seq_lens_stride = p.seq_lens.strides[0];
  }
  if (p.paged) {
    s.block_table = static_cast<const int32_t *>(p.block_table.data);
    s.block_table_strides[0] = p.block_table.strides[0];
    s.block_table_strides[1] = p.block_table.strides[1];
    // Validation bounds max_pages * page_size by INT32_MAX; a table with no
    // columns leaves page_size unbounded but unused.
    s.page_size = static_cast<int32_t>(std::min<int64_t>(p.page_size, INT32_MAX));
    // Entries are int32: a pool past INT32_MAX pages is addressed up to there.
    s.last_page = static_cast<int32_t>(std::min<int64_t>(p.num_pages - 1, INT32_MAX));
    if (s.page_size > 0 && (s.page_size & (s.page_size - 1)) == 0) {
      s.page_shift = 0;
      while ((1 << s.page_shift) < s.page_size) ++s.page_shift;
    }
  }
  s.batch = p.batch;
  s.kv_capacity = static_cast<int32_t>(p.kv_capacity);
  s.head_dim = static_cast<int32_t>(p.head_dim);
  s.q_heads = static_cast<int32_t>(p.q_heads);
  s.kv_heads = static_cast<int32_t>(p.kv_heads);
  s.group_size = static_cast<int32_t>(p.group_size);
  s.q_len = static_cast<int32_t>(p.q_len);
  s.kv_rows = static_cast<int32_t>(p.rows_per_kv_head());
  if (p.has_q_lens) {
    s.q_lens = static_cast<const int32_t *>(p.q_lens.data);
    s.q_lens_stride = p.q_lens.strides[0];
  }
  s.head_chunks = launch.heads.chunks;
  s.heads_per_chunk = launch.heads.heads_per_chunk;
  s.heads_per_cta = launch.heads.heads_per_cta;
  s.q_scale = p.softmax_scale * kLog2e;
  s.variant_scores = launch.variant_scores;
  s.causal = p.causal;
  s.window = static_cast<int32_t>(p.window);  // validation keeps it below 2^31
  s.softcap = p.softcap * kLog2e;
  if (p.has_alibi) {
    s.alibi_slopes = static_cast<const float *>(p.alibi_slopes.data);
    s.alibi_stride = p.alibi_slopes.strides[0];
  }
  s.num_splits = plan.num_splits;
  s.split_tokens = plan.split_tokens;
  s.fitted_split_floor = launch.fitted_split_floor;
  s.fitted_tokens_per_total = static_cast<float>(p.kv_heads * launch.heads.chunks) /
                              static_cast<float>(std::max<int64_t>(1, launch.fitted_target_ctas));
  if (launch.fitted_split_floor > 0) s.used_splits = reinterpret_cast<int32_t *>(workspace + cuda::kUsedSplitsOffset);
  s.fitted_ctas = launch.fitted_ctas;
  if (launch.longest_first) {
    // plan_decode reserved the order as the plan's scratch.
    if (p.batch > cuda::kMaxOrderedSequences || plan.scratch_bytes < static_cast<size_t>(p.batch) * sizeof(int32_t)) {
      fail(FD_ERROR_INTERNAL, "CUDA backend: no workspace for the order of %lld sequences",
           static_cast<long long>(p.batch));
    }
    s.sequence_order = reinterpret_cast<int32_t *>(workspace + plan.scratch_offset);
  }
  s.balanced_workers = launch.balanced_workers;
  s.balanced_group = launch.balanced_group;
  s.piece_overhead_tiles = launch.piece_overhead_tiles;
  s.m = reinterpret_cast<float *>(workspace + plan.m_offset);
  s.l = reinterpret_cast<float *>(workspace + plan.l_offset);
  s.acc = reinterpret_cast<float *>(workspace + plan.acc_offset);
  s.write_output = launch.merge == FD_MERGE_NONE;
  s.cluster_merge = launch.merge == FD_MERGE_CLUSTER;
  if (launch.merge == FD_MERGE_FUSED) s.merge_counters = reinterpret_cast<unsigned *>(workspace);
  s.out_f32 = p.out_dtype == FD_DTYPE_F32;
  s.output = output_params(p);
  return s;
}

cuda::MergeParams merge_params(const Problem &p, const Plan &plan, const cuda::SplitParams &s) {
  cuda::MergeParams merge;
  merge.m = s.m;
  merge.l = s.l;
  merge.acc = s.acc;
  merge.rows = plan.rows;
  merge.num_splits = plan.num_splits;
  merge.head_dim = s.head_dim;
  merge.q_heads = s.q_heads;
  merge.group_size = s.group_size;
  merge.kv_rows = s.kv_rows;
  merge.output = output_params(p);
  merge.used_splits = s.used_splits;
  merge.invariant_order = p.batch_invariant();
  return merge;
}

cuda::CheckParams check_params(const Problem &p, cuda::ContentReport *report) {
  cuda::CheckParams c;
  if (p.has_seq_lens) {
    c.seq_lens = static_cast<const int32_t *>(p.seq_lens.data);
    c.seq_lens_stride = p.seq_lens.strides[0];
  }
  if (p.has_q_lens) {
    c.q_lens = static_cast<const int32_t *>(p.q_lens.data);
    c.q_lens_stride = p.q_lens.strides[0];
  }
  c.q_len = p.q_len;
  if (p.paged) {
    c.block_table = static_cast<const int32_t *>(p.block_table.data);
    c.block_table_strides[0] = p.block_table.strides[0];
    c.block_table_strides[1] = p.block_table.strides[1];
    c.page_size = p.page_size;
    c.num_pages = p.num_pages;
    c.max_pages = p.max_pages;
  }
  c.batch = p.batch;
  c.kv_capacity = p.kv_capacity;
  c.report = report;
  return c;
}

// What fd_decode or fd_check_contents reports for what the check kernel
// found: the status and wording of the CPU backend's host check.
[[noreturn]] void fail_with_report(const cuda::ContentReport &r) {
  const char *found_by = " (found on the device by a checked decode on this handle)";
  if (r.found == cuda::kFoundQueryLength) fail_bad_query_length(r.sequence, r.value, r.bound, found_by);
  if (r.found == cuda::kFoundLength) fail_bad_length(r.sequence, r.value, r.bound, found_by);
  fail_bad_page(r.sequence, r.column, r.value, r.bound, found_by);
}

class CudaBackend final : public Backend {
 public:
  CudaBackend(int device, bool check_contents) : device_(device) {
    DeviceGuard guard(device_, primary_context_);
    // Often the first call that creates the device's context: a missing or
    // unloadable kernel image, or a device that is busy (exclusive mode) or
    // needs a newer driver, means this build cannot use it
    // (FD_BACKEND_AUTO then takes the CPU); running out of memory or
    // another failure is reported as what it is.
    const cudaError_t image = cuda::probe_kernel_image();
    if (image == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      fail(FD_ERROR_OUT_OF_MEMORY, "options: creating the context of CUDA device %d: %s", device_,
           cudaGetErrorString(image));
    }
    if (cuda::is_kernel_image_error(image)) {
      cudaGetLastError();
      int major = 0, minor = 0;
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device_);
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device_);
      fail(FD_ERROR_NO_DEVICE, "options: CUDA device %d (compute capability %d.%d) cannot run this build's kernels: %s",
           device_, major, minor, cudaGetErrorString(image));
    }
    if (image == cudaErrorDevicesUnavailable || image == cudaErrorInsufficientDriver || image == cudaErrorNoDevice ||
        image == cudaErrorInvalidDevice) {
      cudaGetLastError();
      fail(FD_ERROR_NO_DEVICE, "options: CUDA device %d is not usable: %s", device_, cudaGetErrorString(image));
    }
    check_cuda(image, "options: loading the kernels");
    check_cuda(cudaDeviceGetAttribute(&profile_.sm_count, cudaDevAttrMultiProcessorCount, device_),
               "CUDA backend: reading the multiprocessor count");
    check_cuda(cuda::prepare_kernels(&profile_.occupancy), "CUDA backend: preparing the kernels");
    check_cuda(cuda::merge_supports_programmatic_launch(&programmatic_),
               "CUDA backend: checking for programmatic dependent launch");
    if (check_contents) {
      // Mapped, so that the host reads what the check kernel wrote without
      // synchronising; with unified addressing the device uses the same
      // address (fetched anyway, as the runtime documents).
      void *host = nullptr;
      check_cuda(cudaHostAlloc(&host, sizeof(cuda::ContentReport), cudaHostAllocMapped | cudaHostAllocPortable),
                 "options: allocating the content-check report");
      report_ = static_cast<cuda::ContentReport *>(host);
      std::memset(host, 0, sizeof(cuda::ContentReport));
      void *device_view = nullptr;
      const cudaError_t mapped = cudaHostGetDevicePointer(&device_view, host, 0);
      if (mapped != cudaSuccess) {
        cudaFreeHost(host);
        report_ = nullptr;
        cuda::fail_cuda("options: mapping the content-check report", mapped);
      }
      device_report_ = static_cast<cuda::ContentReport *>(device_view);
    }
    // Zeroing a new workspace's counters runs on a stream of the handle's
    // own: the legacy default stream cannot be used while another thread
    // captures a blocking stream, even in cudaStreamCaptureModeThreadLocal.
    const cudaError_t stream = cudaStreamCreateWithFlags(&setup_stream_, cudaStreamNonBlocking);
    if (stream != cudaSuccess) {
      if (report_ != nullptr) cudaFreeHost(report_);
      cuda::fail_cuda("options: creating the handle's setup stream", stream);
    }
    // The device's primary context, current now: later guards skip the
    // switch when the caller has it current (DeviceGuard).
    primary_context_ = cuda::current_context();
  }

  ~CudaBackend() override {
    DeviceGuard guard(device_, primary_context_, std::nothrow);
    if (report_ != nullptr) cudaFreeHost(report_);
    cudaStreamDestroy(setup_stream_);
    cudaGetLastError();  // nothing to report from a destructor
  }
  CudaBackend(const CudaBackend &) = delete;
  CudaBackend &operator=(const CudaBackend &) = delete;

  fd_backend kind() const override { return FD_BACKEND_CUDA; }

  void check_supported(const Problem &p) const override {
    if (!supported_head_dim(p.head_dim)) {
      fail(FD_ERROR_INVALID_HEAD_DIM,
           "q: head_dim %lld is not supported by the CUDA backend (it takes multiples of %d from %d to %d)",
           static_cast<long long>(p.head_dim), cuda::kHeadDimMultiple, cuda::kMinHeadDim, cuda::kMaxHeadDim);
    }
    // The CUDA-core kernel runs every problem the others cannot: it must
    // take the dtypes.
    const cuda::SplitVariant fallback =
        p.kv_quantized ? cuda::SplitVariant::cuda_core_8bit : cuda::SplitVariant::cuda_core;
    if ((!p.kv_quantized && p.q_dtype != p.kv_dtype) || !cuda::split_variant_takes(fallback, p.kv_dtype)) {
      fail(FD_ERROR_UNSUPPORTED, "k: a %s cache with %s queries is not supported by the CUDA backend",
           dtype_name(p.kv_dtype), dtype_name(p.q_dtype));
    }
  }

  bool checks_contents() const override { return report_ != nullptr; }

  // seq_lens and block_table live on the device: reading them here would
  // synchronise. The check kernel that decode enqueues reads them there;
  // what an earlier one found is reported now, before this decode does
  // anything.
  void check_contents(const Problem &) override { report_pending(); }

  void wait_and_check_contents(fd_cuda_stream stream) override {
    DeviceGuard guard(device_, primary_context_);
    check_cuda(cudaStreamSynchronize(reinterpret_cast<cudaStream_t>(stream)), "fd_check_contents: waiting for stream");
    report_pending();
  }

  Plan plan(const Problem &p) const override { return cuda::plan_decode(p, profile_); }

  // Under the handle's device: NULL is that device's legacy stream, as in
  // decode's launch.
  bool stream_is_capturing(fd_cuda_stream stream) const override {
    DeviceGuard guard(device_, primary_context_);
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(reinterpret_cast<cudaStream_t>(stream), &status) != cudaSuccess) {
      cudaGetLastError();
      return true;  // e.g. the legacy stream while another stream captures globally: do not allocate either
    }
    return status != cudaStreamCaptureStatusNone;
  }

  void *allocate_workspace(size_t bytes) override {
    require_allocatable_workspace(bytes, "workspace");  // before cudaMalloc rounds it to its granularity
    DeviceGuard guard(device_, primary_context_);
    void *memory = nullptr;
    const cudaError_t err = cudaMalloc(&memory, bytes);
    if (err == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      fail(FD_ERROR_OUT_OF_MEMORY, "workspace: cudaMalloc of %zu bytes on CUDA device %d failed: %s", bytes, device_,
           cudaGetErrorString(err));
    }
    check_cuda(err, "workspace: cudaMalloc");
    return memory;
  }

  void free_workspace(void *workspace) noexcept override {
    DeviceGuard guard(device_, primary_context_, std::nothrow);
    cudaFree(workspace);
    cudaGetLastError();  // nothing to report from a destructor path
  }

  // The merge counters must start at zero; every launch leaves them so.
  // Waits for the memset: the decode that follows may run on any stream.
  void prepare_workspace(void *workspace, size_t bytes) override {
    DeviceGuard guard(device_, primary_context_);
    check_cuda(cudaMemsetAsync(workspace, 0, std::min(bytes, cuda::kMergeCounterBytes), setup_stream_),
               "workspace: clearing the counters");
    check_cuda(cudaStreamSynchronize(setup_stream_), "workspace: clearing the counters");
  }

  void decode(const Problem &p, const Plan &plan, void *workspace, fd_cuda_stream stream) override {
    const cuda::LaunchChoice launch = cuda::choose_launch(p, plan, profile_);
    const cuda::SplitParams split = split_params(p, plan, launch, static_cast<char *>(workspace));
    const cuda::MergeParams merge = merge_params(p, plan, split);
    DeviceGuard guard(device_, primary_context_);
    if (report_ != nullptr) {
      check_cuda(cuda::launch_check_contents(check_params(p, device_report_), reinterpret_cast<cudaStream_t>(stream)),
                 "fd_decode: content-check kernel launch");
    }
    check_cuda(cuda::launch_decode(launch.variant, p.q_dtype, p.kv_dtype, p.out_dtype, split,
                                   launch.merge == FD_MERGE_SEPARATE ? &merge : nullptr, programmatic_,
                                   reinterpret_cast<cudaStream_t>(stream)),
               "fd_decode: kernel launch");
  }

  void append_kv(const AppendProblem &p, fd_cuda_stream stream) override {
    cuda::AppendParams a;
    a.k_new = p.k_new.data;
    a.v_new = p.v_new.data;
    a.new_dtype = static_cast<int32_t>(p.new_dtype);
    a.k = p.k.data;
    a.v = p.v.data;
    a.cache_dtype = static_cast<int32_t>(p.kv_dtype);
    // Extents of 1 may carry any stride: 0 keeps the offsets small.
    const auto strides = [](const StridedView &view, int64_t(&out)[3]) {
      for (int d = 0; d < 3; ++d) out[d] = view.shape[d] > 1 ? view.strides[d] : 0;
    };
    strides(p.k_new, a.k_new_strides);
    strides(p.v_new, a.v_new_strides);
    strides(p.k, a.k_strides);
    strides(p.v, a.v_strides);
    if (p.has_k_scale) {
      a.k_scale = static_cast<const float *>(p.k_scale.data);
      strides(p.k_scale, a.k_scale_strides);
    }
    if (p.has_v_scale) {
      a.v_scale = static_cast<const float *>(p.v_scale.data);
      strides(p.v_scale, a.v_scale_strides);
    }
    if (p.has_seq_lens) {
      a.seq_lens = static_cast<const int32_t *>(p.seq_lens.data);
      a.seq_lens_stride = p.seq_lens.strides[0];
    }
    if (p.paged) {
      a.block_table = static_cast<const int32_t *>(p.block_table.data);
      a.block_table_strides[0] = p.block_table.strides[0];
      a.block_table_strides[1] = p.block_table.strides[1];
      a.page_size = p.page_size;
      a.num_pages = p.num_pages;
    }
    a.batch = p.batch;
    a.new_len = p.new_len;
    a.kv_capacity = p.kv_capacity;
    a.kv_heads = static_cast<int32_t>(p.kv_heads);
    a.head_dim = static_cast<int32_t>(p.head_dim);
    const size_t new_bytes = dtype_bytes(p.new_dtype);
    const size_t cache_bytes = dtype_bytes(p.kv_dtype);
    a.vector = p.head_dim % cuda::kAppendVectorElements == 0 && cuda::rows_aligned(p.k_new, new_bytes) &&
               cuda::rows_aligned(p.v_new, new_bytes) && cuda::rows_aligned(p.k, cache_bytes, 8) &&
               cuda::rows_aligned(p.v, cache_bytes, 8);
    DeviceGuard guard(device_, primary_context_);
    check_cuda(cuda::launch_append_kv(a, programmatic_, reinterpret_cast<cudaStream_t>(stream)),
               "fd_append_kv: kernel launch");
  }

  void merge_states(const MergeProblem &p, fd_cuda_stream stream) override {
    if (p.head_dim > cuda::kMaxHeadDim) {
      fail(FD_ERROR_INVALID_HEAD_DIM, "out: head_dim %lld is more than the CUDA backend's %d",
           static_cast<long long>(p.head_dim), cuda::kMaxHeadDim);
    }
    cuda::MergeStatesParams m;
    m.num_states = p.num_states;
    m.head_dim = static_cast<int32_t>(p.head_dim);
    m.q_len = p.q_len;
    m.heads = p.heads;
    m.rows = p.batch * p.q_len * p.heads;
    m.out = p.out.data;
    for (int d = 0; d < 3; ++d) m.out_strides[d] = p.out.strides[d];
    if (p.has_lse) {
      m.lse = static_cast<float *>(p.lse.data);
      for (int d = 0; d < 3; ++d) m.lse_strides[d] = p.lse.strides[d];
    }
    bool states_aligned = true;  // every state's rows on 16 bytes: the vector merge may take them
    for (int s = 0; s < p.num_states; ++s) {
      states_aligned = states_aligned && cuda::rows_aligned(p.states_out[s], dtype_bytes(p.states_dtype[s]));
      cuda::MergeStateView &state = m.states[s];
      state.out = p.states_out[s].data;
      state.lse = static_cast<const float *>(p.states_lse[s].data);
      state.dtype = p.states_dtype[s];
      for (int d = 0; d < 3; ++d) {
        state.out_strides[d] = p.states_out[s].strides[d];
        state.lse_strides[d] = p.states_lse[s].strides[d];
      }
    }
    if (m.rows == 0) return;
    DeviceGuard guard(device_, primary_context_);
    const bool out_aligned = cuda::rows_aligned(p.out, dtype_bytes(p.out_dtype));
    check_cuda(cuda::launch_merge_states(p.out_dtype, m, states_aligned, out_aligned, programmatic_,
                                         reinterpret_cast<cudaStream_t>(stream)),
               "fd_merge_states: kernel launch");
  }

  LaunchSummary describe(const Problem &p, const Plan &plan) const override {
    LaunchSummary summary = cuda::summarize(p, plan, cuda::choose_launch(p, plan, profile_));
    if (report_ != nullptr) ++summary.launches;  // the check kernel ahead of the decode
    return summary;
  }

 private:
  int device_;
  CUcontext primary_context_ = nullptr;  // set at creation; compared, never used to switch
  cuda::DeviceProfile profile_;
  bool programmatic_ = false;            // compute capability 9.0+ with sm_90+ merge code: overlap the next launch
  cudaStream_t setup_stream_ = nullptr;  // non-blocking, for prepare_workspace's memset
  // FD_CHECK_CONTENTS: the check kernel's report (null: the handle checks nothing).
  cuda::ContentReport *report_ = nullptr;
  cuda::ContentReport *device_report_ = nullptr;

  // Reports and clears what a check kernel found. `found` is read first
  // (acquire: the kernel fenced the fields before setting it).
  void report_pending() {
    if (__atomic_load_n(&report_->found, __ATOMIC_ACQUIRE) == 0) return;
    const cuda::ContentReport found = *report_;
    __atomic_store_n(&report_->found, 0, __ATOMIC_RELEASE);
    fail_with_report(found);
  }
};

}  // namespace

bool cuda_backend_available(int device) noexcept {
  char why[160];
  return cuda::probe_device(device, why, sizeof why);
}

std::unique_ptr<Backend> make_cuda_backend(int device, bool check_contents) {
  char why[160];
  if (!cuda::probe_device(device, why, sizeof why)) {
    fail(FD_ERROR_NO_DEVICE, "options: CUDA device %d is not available: %s", device, why);
  }
  return std::make_unique<CudaBackend>(device, check_contents);
}

}  // namespace fd
