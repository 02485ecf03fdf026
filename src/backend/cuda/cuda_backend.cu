// The CUDA backend: device selection, workspace memory, the split plan's
// parallelism, and turning a validated Problem into kernel parameters. No
// templates here; the kernels are chosen in dispatch.cu.
//
// fd_decode on this backend enqueues one kernel (two when the merge is not
// fused into the split kernel) on the caller's stream and nothing else: no
// allocation (the api layer reserved the workspace), no copy, no
// synchronisation, so it can be captured in a CUDA graph. The CUDA runtime
// is linked statically and hidden, so its "last error" state is this
// library's own: reading it cannot eat a caller's error.
#include <cuda.h>  // the driver's context types; its calls come through the runtime (context_calls)
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <new>

#include "backend/backend.h"
#include "backend/cuda/launch.h"
#include "core/error.h"

namespace fd {
namespace {

constexpr float kLog2e = 1.4426950408889634f;

// Splits shorter than this cost more in partial-state traffic and pipeline
// start-up than they win in parallelism. 128 tokens are the standard
// tensor-core pipeline for head_dim 128 (two 64-token stages) and what lets
// caches of a few MiB fill the GPU: on the H200 (fp16, same call, against
// 256 tokens) 1x32/8x1024x128 ran 8 splits in 6.6 us against 4 in 7.6,
// 1x8/4x4096x256 32 in 10.9 against 16 wide ones in 11.6, 1x32/32x1024x128
// 9.5 against 10.1; splits it allows but the wave model does not pick cost
// nothing (the issue's shapes and 8 more unchanged, 1x32/8x4096x128 10.6 ->
// 10.8 at its worst). The CUDA-core kernel (up to 4 CTAs per SM, 32-64-token
// tiles) had it first: 1x32/32x2048x128 15.3 us at 16 splits against 16.1 at
// 8.
constexpr int64_t kMinSplitTokens = 128;
// The planner's wave model (core/plan.cpp): a CTA's fixed cost (pipeline
// fill, epilogue) and the merge launch, in tokens a CTA streams meanwhile.
constexpr int64_t kSplitOverheadTokens = 64;
constexpr int64_t kMergeOverheadTokens = 128;

// The merge is fused into the split kernel (the last CTA of a unit merges
// it) when a unit's partials fit in the split kernel's shared memory and are
// at most this many bytes: a single CTA reads them all, at the end of the
// grid. On the H200 (fp16, same process, against the merge kernel):
// 4x8/4x16384x256 (2 rows x 16 splits x 1 KiB = 32 KiB a unit) 82.0 -> 79.0
// us, 1x32/32x2048x128 (8 KiB) 15.5 -> 15.2, but 1x32/8x32768x128 (4 rows x
// 32 splits x 512 B = 64 KiB) 41.7 -> 42.6: larger units go to the merge
// kernel, which spreads each row over its own CTA. Overridable at build
// time for A/B measurements (0: never fused).
#ifndef FD_FUSED_MERGE_MAX_BYTES
#define FD_FUSED_MERGE_MAX_BYTES (32 * 1024)
#endif
constexpr int64_t kFusedMergeMaxBytes = FD_FUSED_MERGE_MAX_BYTES;

// The cluster merge (cluster_merge_fits below); 0 at build time turns it off
// for A/B measurements.
#ifndef FD_CLUSTER_MERGE
#define FD_CLUSTER_MERGE 1
#endif

// Whether the tensor-core kernel can run a problem (choose_split_kernel, in
// the backend below, decides with it). It takes 16-bit inputs with a 16-bit
// output: P is rounded to 16 bits before P V, which a float output's 1e-5
// bound would not absorb, so float outputs stay on the CUDA-core kernel.
// Decided from dtypes and shapes (PlanKey fields) alone, so the plan and the
// workspace size do not depend on pointers; K/V rows that are not 16-byte
// aligned run the CUDA-core kernel on the same plan.
bool mma_eligible(const Problem &p) { return p.dtype != FD_DTYPE_F32 && p.out_dtype == p.dtype; }

// MHA (one query head per KV head) with head_dim 65-128 and at least this
// many waves of standard tensor-core CTAs runs the CUDA-core kernel: the
// tensor-core CTA fills 1 of its 16 head slots and has the larger fixed
// cost (256 threads, 2 per SM, against 128 threads, 4 per SM), which many
// short CTAs pay over and over. On the H200 (fp16, graph replay, since the
// two-stage pipeline) the tensor cores won with 2048 units of 512 tokens
// (64x32/32x512x128, 7.8 waves: 129.8 -> 127.8 us) and everything smaller
// (up to 7% with 8x16/16x4096x128, 3% with 1x32/32x2048x128), and lost with
// 8192 units (256x32/32x512x128, 31 waves: 489.5 -> 502.6 us); the threshold
// sits between the two. (For head_dim 64 the CUDA-core kernel is slower
// everywhere measured: 4x16/16x65536x64 256 -> 303 us.)
constexpr int64_t kMhaCudaCoreMinWaves = 16;

bool mha_bucket_128(const Problem &p) { return p.group_size == 1 && p.head_dim > 64 && p.head_dim <= 128; }

[[noreturn]] void fail_cuda(const char *what, cudaError_t err) {
  cudaGetLastError();  // the error is reported here; do not leave it pending
  fail(FD_ERROR_CUDA, "%s: %s", what, cudaGetErrorString(err));
}

void check_cuda(cudaError_t err, const char *what) {
  if (err != cudaSuccess) fail_cuda(what, err);
}

// The driver's current-context calls, reached through the runtime (the
// library does not link libcuda), so that DeviceGuard can put back the
// caller's exact context. cudaSetDevice(previous) cannot: it makes the
// previous device's primary context current, creating it when the caller
// never used that device (a thread that chose none reads device 0) and
// replacing a context of the caller's own (cuCtxCreate).
struct ContextCalls {
  PFN_cuCtxGetCurrent_v4000 get_current = nullptr;
  PFN_cuCtxSetCurrent_v4000 set_current = nullptr;
};

const ContextCalls &context_calls() {
  static const ContextCalls calls = [] {
    ContextCalls found;
    void *get = nullptr;
    void *set = nullptr;
    cudaDriverEntryPointQueryResult get_status = cudaDriverEntryPointSymbolNotFound;
    cudaDriverEntryPointQueryResult set_status = cudaDriverEntryPointSymbolNotFound;
    if (cudaGetDriverEntryPointByVersion("cuCtxGetCurrent", &get, 4000, cudaEnableDefault, &get_status) ==
            cudaSuccess &&
        cudaGetDriverEntryPointByVersion("cuCtxSetCurrent", &set, 4000, cudaEnableDefault, &set_status) ==
            cudaSuccess &&
        get_status == cudaDriverEntryPointSuccess && set_status == cudaDriverEntryPointSuccess) {
      found.get_current = reinterpret_cast<PFN_cuCtxGetCurrent_v4000>(get);
      found.set_current = reinterpret_cast<PFN_cuCtxSetCurrent_v4000>(set);
    }
    cudaGetLastError();  // without them the guard falls back to cudaSetDevice
    return found;
  }();
  return calls;
}

// Makes the handle's device current for a scope and then puts back the
// context the calling thread had (none, a primary context, or one of its
// own). `primary` is the device's primary context once known (the backend
// records it at creation): when it is already current, nothing changes
// hands, which is the common case and costs one driver call.
class DeviceGuard {
 public:
  DeviceGuard(int device, CUcontext primary) {
    check_cuda(enter(device, primary), "making the handle's CUDA device current");
  }
  // For paths that must not throw (freeing): on failure the caller's
  // context stays current.
  DeviceGuard(int device, CUcontext primary, std::nothrow_t) noexcept {
    if (enter(device, primary) != cudaSuccess) cudaGetLastError();
  }
  ~DeviceGuard() {
    if (!switched_) return;
    if (restore_context_) {
      context_calls().set_current(previous_context_);
    } else {
      cudaSetDevice(previous_device_);
    }
    cudaGetLastError();  // nothing to report from a destructor
  }
  DeviceGuard(const DeviceGuard &) = delete;
  DeviceGuard &operator=(const DeviceGuard &) = delete;

 private:
  cudaError_t enter(int device, CUcontext primary) noexcept {
    const ContextCalls &driver = context_calls();
    if (driver.get_current != nullptr && driver.get_current(&previous_context_) == CUDA_SUCCESS) {
      if (previous_context_ != nullptr && previous_context_ == primary) return cudaSuccess;
      restore_context_ = true;
    } else {
      // Without the driver's calls: compare and restore devices.
      cudaError_t err = cudaGetDevice(&previous_device_);
      if (err != cudaSuccess || previous_device_ == device) return err;
    }
    const cudaError_t err = cudaSetDevice(device);
    switched_ = err == cudaSuccess;
    return err;
  }

  int previous_device_ = 0;
  CUcontext previous_context_ = nullptr;
  bool restore_context_ = false;
  bool switched_ = false;
};

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

int next_power_of_two(int64_t n) {
  int p = 1;
  while (p < n) p *= 2;
  return p;
}

bool supported_head_dim(int64_t head_dim) {
  return head_dim >= cuda::kMinHeadDim && head_dim <= cuda::kMaxHeadDim && head_dim % cuda::kHeadDimMultiple == 0;
}

// How a GQA group maps onto CTAs: at most `rows` head slots per CTA, the
// group cut into equal chunks when it is larger; slots are a power of two.
struct HeadTiling {
  int chunks;
  int heads_per_chunk;
  int heads_per_cta;
};

HeadTiling tile_heads(int64_t group_size, int rows) {
  HeadTiling t;
  t.chunks = static_cast<int>(ceil_div(group_size, rows));
  t.heads_per_chunk = static_cast<int>(ceil_div(group_size, t.chunks));
  t.heads_per_cta = next_power_of_two(t.heads_per_chunk);
  return t;
}

// Whether every K/V row the kernel reads starts on a 16-byte boundary, so
// that it can use 16-byte cp.async copies.
bool rows_aligned(const StridedView &view, size_t element_bytes) {
  if (reinterpret_cast<uintptr_t>(view.data) % 16 != 0) return false;
  for (int d = 0; d < 3; ++d) {
    if (view.shape[d] > 1 && (static_cast<uint64_t>(view.strides[d]) * element_bytes) % 16 != 0) return false;
  }
  return true;
}

// Whether the tensor-core kernel's paged loader (32-bit page and slot byte
// offsets, widened once; mma_kernel.cuh) can address this pool and table:
// a page's byte stride, the bytes of a page's slots and the block table's
// column offsets all below 2^31. Always true for pools laid out as
// [page, slot, head, dim] or [page, head, slot, dim] with pages under 2 GiB.
bool paged_fits_32bit(const Problem &p) {
  constexpr int64_t kLimit = int64_t{1} << 31;
  const int64_t bytes = static_cast<int64_t>(dtype_bytes(p.dtype));
  const StridedView *caches[2] = {&p.k, &p.v};
  // Compared by division: a dimension of extent 1 may carry any stride, so
  // the products could overflow.
  for (const StridedView *cache : caches) {
    if (cache->strides[0] >= kLimit / bytes || cache->strides[1] >= kLimit / bytes / p.page_size) return false;
  }
  return p.block_table.strides[1] == 0 || p.block_table.shape[1] < kLimit / p.block_table.strides[1];
}

// Errors that say this build's kernels cannot run on the device.
bool is_kernel_image_error(cudaError_t err) {
  switch (err) {
    case cudaErrorNoKernelImageForDevice:
    case cudaErrorInvalidKernelImage:
    case cudaErrorInvalidPtx:
    case cudaErrorUnsupportedPtxVersion:
    case cudaErrorJitCompilerNotFound:
    case cudaErrorJitCompilationDisabled:
    case cudaErrorInvalidDeviceFunction:
    case cudaErrorSharedObjectInitFailed:
      return true;
    default:
      return false;
  }
}

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(int device) : device_(device) {
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
    if (is_kernel_image_error(image)) {
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
    check_cuda(cudaDeviceGetAttribute(&sm_count_, cudaDevAttrMultiProcessorCount, device_),
               "CUDA backend: reading the multiprocessor count");
    check_cuda(cuda::prepare_kernels(&occupancy_), "CUDA backend: preparing the kernels");
    check_cuda(cuda::merge_supports_programmatic_launch(&programmatic_merge_),
               "CUDA backend: checking for programmatic dependent launch");
    // The device's primary context, current now: later guards skip the
    // switch when the caller has it current (DeviceGuard).
    if (context_calls().get_current != nullptr) context_calls().get_current(&primary_context_);
  }

  fd_backend kind() const override { return FD_BACKEND_CUDA; }

  void check_supported(const Problem &p) const override {
    if (!supported_head_dim(p.head_dim)) {
      fail(FD_ERROR_INVALID_HEAD_DIM,
           "q: head_dim %lld is not supported by the CUDA backend (it takes multiples of %d from %d to %d)",
           static_cast<long long>(p.head_dim), cuda::kHeadDimMultiple, cuda::kMinHeadDim, cuda::kMaxHeadDim);
    }
  }

  // seq_lens and block_table live on the device: reading them would
  // synchronise. The kernel clamps lengths instead (see flashdecode.h).
  void check_contents(const Problem &) const override {}

  // The plan is made for the kernel choose_split_kernel picks; its tag
  // travels in the plan (Plan::kernel) to decode.
  ParallelismHint parallelism(const Problem &p) const override { return hint_for(p, choose_split_kernel(p)); }

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
    check_cuda(cudaMemset(workspace, 0, std::min(bytes, cuda::kMergeCounterBytes)), "workspace: clearing the counters");
    check_cuda(cudaStreamSynchronize(cudaStreamLegacy), "workspace: clearing the counters");
  }

  void decode(const Problem &p, const Plan &plan, void *workspace, fd_cuda_stream stream) override {
    const LaunchChoice launch = choose_launch(p, plan);
    const cuda::SplitKernelChoice kernel = launch.kernel;
    const HeadTiling heads = launch.heads;
    auto *base = static_cast<char *>(workspace);

    cuda::SplitParams s;
    s.q = p.q.data;
    s.q_batch_stride = p.q.strides[0];
    s.q_head_stride = p.q.strides[2];
    s.k = p.k.data;
    s.v = p.v.data;
    for (int d = 0; d < 3; ++d) {
      s.k_strides[d] = p.k.strides[d];
      s.v_strides[d] = p.v.strides[d];
    }
    s.kv_aligned = launch.aligned;
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
    s.head_chunks = heads.chunks;
    s.heads_per_chunk = heads.heads_per_chunk;
    s.heads_per_cta = heads.heads_per_cta;
    s.q_scale = p.softmax_scale * kLog2e;
    s.num_splits = plan.num_splits;
    s.split_tokens = plan.split_tokens;
    s.m = reinterpret_cast<float *>(base + plan.m_offset);
    s.l = reinterpret_cast<float *>(base + plan.l_offset);
    s.acc = reinterpret_cast<float *>(base + plan.acc_offset);
    s.write_output = launch.merge == FD_MERGE_NONE;
    s.cluster_merge = launch.merge == FD_MERGE_CLUSTER;
    if (launch.merge == FD_MERGE_FUSED) s.merge_counters = reinterpret_cast<unsigned *>(base);
    s.out = p.out.data;
    s.out_batch_stride = p.out.strides[0];
    s.out_head_stride = p.out.strides[2];
    s.out_f32 = p.out_dtype == FD_DTYPE_F32;
    if (p.has_lse) {
      s.lse = static_cast<float *>(p.lse.data);
      s.lse_batch_stride = p.lse.strides[0];
      s.lse_head_stride = p.lse.strides[2];
    }

    cuda::MergeParams merge;
    merge.m = s.m;
    merge.l = s.l;
    merge.acc = s.acc;
    merge.rows = plan.rows;
    merge.num_splits = plan.num_splits;
    merge.head_dim = s.head_dim;
    merge.q_heads = s.q_heads;
    merge.out = s.out;
    merge.out_batch_stride = s.out_batch_stride;
    merge.out_head_stride = s.out_head_stride;
    merge.lse = s.lse;
    merge.lse_batch_stride = s.lse_batch_stride;
    merge.lse_head_stride = s.lse_head_stride;

    DeviceGuard guard(device_, primary_context_);
    const bool merge_launch = launch.merge == FD_MERGE_SEPARATE;
    check_cuda(cuda::launch_decode(p.dtype, p.out_dtype, s, merge_launch ? &merge : nullptr,
                                   kernel, programmatic_merge_, reinterpret_cast<cudaStream_t>(stream)),
               "fd_decode: kernel launch");
  }

  LaunchSummary describe(const Problem &p, const Plan &plan) const override {
    const LaunchChoice launch = choose_launch(p, plan);
    LaunchSummary summary;
    summary.kernel = kernel_name(launch.kernel, kernel_shape(p, launch.kernel).head_dim_bucket);
    summary.merge = launch.merge;
    summary.launches = launch.merge == FD_MERGE_SEPARATE ? 2 : 1;
    summary.blocks = launch.units * plan.num_splits;
    return summary;
  }

 private:
  // Everything decode decides about a planned problem beyond the plan.
  struct LaunchChoice {
    cuda::SplitKernelChoice kernel;
    HeadTiling heads{};
    bool aligned = false;  // every K/V row on 16 bytes (SplitParams::kv_aligned)
    int64_t units = 0;     // (sequence, KV head, chunk) units; each runs plan.num_splits CTAs
    fd_merge merge = FD_MERGE_NONE;
  };

  // The plan's kernel, unless these K/V rows are not 16-byte aligned or a
  // paged pool's strides are too large for the tensor-core loader: then the
  // CUDA-core kernel runs the same plan (it takes any split length). Then the
  // merge: in clusters where they fit (cluster_merge_fits), else fused into
  // the split kernel where a unit's partials fit (kFusedMergeMaxBytes), else
  // the merge kernel.
  LaunchChoice choose_launch(const Problem &p, const Plan &plan) const {
    LaunchChoice launch;
    launch.kernel = from_tag(plan.kernel);
    launch.aligned = rows_aligned(p.k, dtype_bytes(p.dtype)) && rows_aligned(p.v, dtype_bytes(p.dtype));
    if (!launch.aligned || (p.paged && !paged_fits_32bit(p))) launch.kernel = cuda::SplitKernelChoice{};
    const cuda::SplitKernelShape shape = kernel_shape(p, launch.kernel);
    launch.heads = tile_heads(p.group_size, shape.rows);
    launch.units = p.batch * p.kv_heads * launch.heads.chunks;
    if (plan.num_splits == 1) return launch;
    const int64_t unit_states = static_cast<int64_t>(launch.heads.heads_per_chunk) * plan.num_splits;
    const bool fused = launch.units <= cuda::kMergeCounterSlots &&
                       unit_states * p.head_dim * static_cast<int64_t>(sizeof(float)) <= kFusedMergeMaxBytes &&
                       cuda::fused_merge_smem_bytes(unit_states, p.head_dim, shape.threads) <= shape.smem_bytes;
    if (cluster_merge_fits(p, launch.kernel, plan.num_splits, launch.units * plan.num_splits)) {
      launch.merge = FD_MERGE_CLUSTER;
    } else {
      launch.merge = fused ? FD_MERGE_FUSED : FD_MERGE_SEPARATE;
    }
    return launch;
  }

  // fd_plan_info::kernel: static names, one per kernel family and bucket.
  static const char *kernel_name(cuda::SplitKernelChoice kernel, int head_dim_bucket) {
    static const char *const names[3][3] = {
        {"cuda-core-64", "cuda-core-128", "cuda-core-256"},
        {"tensor-core-64", "tensor-core-128", "tensor-core-256"},
        {"tensor-core-wide-64", "tensor-core-wide-128", "tensor-core-wide-256"},
    };
    const int family = !kernel.mma ? 0 : kernel.wide ? 2 : 1;
    return names[family][cuda::bucket_index(head_dim_bucket)];
  }

  static cuda::SplitKernelShape kernel_shape(const Problem &p, cuda::SplitKernelChoice kernel) {
    return kernel.mma ? cuda::mma_kernel_shape(p.head_dim, kernel.wide) : cuda::split_kernel_shape(p.dtype, p.head_dim);
  }

  static int32_t to_tag(cuda::SplitKernelChoice kernel) { return (kernel.mma ? 1 : 0) | (kernel.wide ? 2 : 0); }
  static cuda::SplitKernelChoice from_tag(int32_t tag) {
    cuda::SplitKernelChoice kernel;
    kernel.mma = (tag & 1) != 0;
    kernel.wide = (tag & 2) != 0;
    return kernel;
  }

  // Whether the splits of each unit can merge as one thread-block cluster
  // (SplitParams::cluster_merge): tensor-core kernel, 2..kMaxClusterSplits
  // splits, every sequence as long as the cache (a cluster holds its
  // multiprocessors until its longest split is done: with per-sequence
  // lengths, the empty and short splits would wait there), and the grid of
  // `ctas` needs no more waves in clusters than without them (a cluster's
  // CTAs share one GPC, which can leave multiprocessors idle).
  bool cluster_merge_fits(const Problem &p, cuda::SplitKernelChoice kernel, int splits, int64_t ctas) const {
    if (!FD_CLUSTER_MERGE || !kernel.mma || p.has_seq_lens) return false;
    if (splits < 2 || splits > cuda::kMaxClusterSplits) return false;
    const int bucket = cuda::bucket_index(kernel_shape(p, kernel).head_dim_bucket);
    const int clusters = kernel.wide ? occupancy_.wide_clusters[p.dtype - 1][bucket][splits]
                                     : occupancy_.mma_clusters[p.dtype - 1][bucket][splits];
    if (clusters == 0) return false;
    const int64_t slots = static_cast<int64_t>(sm_count_) * resident_ctas(p, kernel);
    return ceil_div(ctas, static_cast<int64_t>(clusters) * splits) <= ceil_div(ctas, slots);
  }

  int resident_ctas(const Problem &p, cuda::SplitKernelChoice kernel) const {
    const int bucket = cuda::bucket_index(kernel_shape(p, kernel).head_dim_bucket);
    const int ctas = !kernel.mma  ? occupancy_.cuda_core[p.dtype][bucket]
                     : kernel.wide ? occupancy_.wide[p.dtype - 1][bucket]
                                   : occupancy_.mma[p.dtype - 1][bucket];
    return std::max(1, ctas);
  }

  // What the planner needs to know about running p on `kernel`.
  ParallelismHint hint_for(const Problem &p, cuda::SplitKernelChoice kernel) const {
    const cuda::SplitKernelShape shape = kernel_shape(p, kernel);
    const HeadTiling heads = tile_heads(p.group_size, shape.rows);
    const int resident = resident_ctas(p, kernel);
    ParallelismHint hint;
    // A unit of the planner is one (sequence, KV head); each takes
    // heads.chunks CTAs per split.
    hint.workers = std::max<int64_t>(1, static_cast<int64_t>(sm_count_) * resident / heads.chunks);
    hint.min_split_tokens = kMinSplitTokens;
    hint.split_granularity = shape.tile_tokens;
    hint.split_overhead_tokens = kSplitOverheadTokens;
    hint.merge_overhead_tokens = kMergeOverheadTokens;
    // A wide CTA holds twice the loads in flight of a standard one (128 KiB
    // of stages against 64) and streams a split about twice as fast.
    hint.time_per_token = kernel.mma && kernel.wide ? 0.5 : 1.0;
    hint.workspace_header_bytes = cuda::kMergeCounterBytes;
    hint.kernel = to_tag(kernel);
    return hint;
  }

  // Whether splits of a problem cut `splits` ways are longer than the
  // pipeline of a kernel of this shape (stages x tile tokens), so that its
  // CTAs refill stages while computing. A wide CTA whose split fits in its
  // stages requests all of it at once and computes every tile after the
  // bytes land; standard CTAs, with half the bytes a stage, overlap half of
  // it. The wave model's per-token costs do not see this: on the H200 (fp16,
  // graph replay, same call) 1x32/8x4096x128 ran 16 wide splits of 2 tiles
  // in 11.0 us and 16 standard splits in 10.6, 1x16/16x4096x64 8 wide splits
  // of 2 tiles in 10.0 and 16 standard ones in 9.6, while wide splits of 4
  // tiles were level or 3% faster (2x32/8x4096x128 14.3 against 14.8,
  // 4x32/8x2048x128 14.1 against 14.5, 1x32/8x8192x128 14.7 against 14.6).
  static bool refills_pipeline(const Problem &p, const cuda::SplitKernelShape &shape, int splits) {
    const int64_t tile = std::max(1, shape.tile_tokens);
    const int64_t split_tokens = ceil_div(ceil_div(std::max<int64_t>(1, p.kv_capacity), std::max(1, splits)), tile) * tile;
    return split_tokens > static_cast<int64_t>(shape.stages) * shape.tile_tokens;
  }

  // The one place that decides which split kernel a problem is planned for
  // (see mma_eligible and kMhaCudaCoreMinWaves), from PlanKey fields alone.
  // Wide tensor-core tiles
  // when the device has them, for dense caches with automatic splits: with
  // one length when the wave model expects them to finish sooner (they lose
  // where the grid cannot be sized to the multiprocessors; mma_kernel.cuh)
  // and their splits are longer than their pipeline (refills_pipeline),
  // always with per-sequence lengths, whose four waves of splits the wide
  // tiles stream faster (H200, 16x32/8 ragged up to 16384 x128: fp16 151.1
  // -> 146.7 us, bf16 151.7 -> 146.3). Paged caches measured slower with them.
  cuda::SplitKernelChoice choose_split_kernel(const Problem &p) const {
    cuda::SplitKernelChoice kernel;
    kernel.mma = mma_eligible(p);
    if (kernel.mma && mha_bucket_128(p)) {
      const int64_t slots = static_cast<int64_t>(sm_count_) * resident_ctas(p, kernel);
      if (p.batch * p.kv_heads >= kMhaCudaCoreMinWaves * slots) kernel.mma = false;
    }
    if (!kernel.mma || p.paged || p.requested_splits > 0) return kernel;
    cuda::SplitKernelChoice wide = kernel;
    wide.wide = true;
    if (occupancy_.wide[p.dtype - 1][cuda::bucket_index(kernel_shape(p, wide).head_dim_bucket)] == 0) return kernel;
    if (p.has_seq_lens) return wide;  // the wave model has no lengths to compare them on
    const SplitEstimate wide_estimate = estimate_splits(p, hint_for(p, wide));
    if (!refills_pipeline(p, kernel_shape(p, wide), wide_estimate.splits)) return kernel;
    if (wide_estimate.cost < estimate_splits(p, hint_for(p, kernel)).cost) return wide;
    return kernel;
  }

  int device_;
  CUcontext primary_context_ = nullptr;  // set at creation; compared, never used to switch
  int sm_count_ = 1;
  cuda::KernelOccupancy occupancy_;
  bool programmatic_merge_ = false;  // compute capability 9.0+ with sm_90+ merge code: overlap the merge's launch
};

// The device count and compute capability, or why the device is unusable.
bool probe_device(int device, char *why, size_t why_size) {
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    cudaGetLastError();
    snprintf(why, why_size, "no CUDA device is usable (%s)", cudaGetErrorString(err));
    return false;
  }
  if (device < 0 || device >= count) {
    snprintf(why, why_size, "%d CUDA device(s) found", count);
    return false;
  }
  int major = 0;
  err = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  if (err != cudaSuccess) {
    cudaGetLastError();
    snprintf(why, why_size, "%s", cudaGetErrorString(err));
    return false;
  }
  if (major < 8) {
    snprintf(why, why_size, "compute capability %d.x is below the 8.0 the kernels need", major);
    return false;
  }
  return true;
}

}  // namespace

bool cuda_backend_available(int device) noexcept {
  char why[160];
  return probe_device(device, why, sizeof why);
}

std::unique_ptr<Backend> make_cuda_backend(int device) {
  char why[160];
  if (!probe_device(device, why, sizeof why)) {
    fail(FD_ERROR_NO_DEVICE, "options: CUDA device %d is not available: %s", device, why);
  }
  return std::make_unique<CudaBackend>(device);
}

}  // namespace fd
