// SPDX-License-Identifier: Apache-2.0
// The one place where runtime choices become template parameters, and the
// table of split-kernel variants: each row names a variant and holds what
// the host needs of it (names, shapes, preparation, launch), built from its
// kernel family (dispatch_families.cuh). Every kernel instantiation of the
// library is here, but those of the families that compile in translation
// units of their own (dispatch_8bit*.cu, dispatch_rows*.cu); every switch
// fails closed (FD_ERROR_INTERNAL) on a value no kernel was built for.
#include "backend/cuda/dispatch.h"

#include <type_traits>
#include <utility>

#include "backend/cuda/kernels/append_kv.cuh"
#include "backend/cuda/kernels/check_contents.cuh"
#include "backend/cuda/kernels/merge_kernel.cuh"
#include "backend/cuda/kernels/merge_states.cuh"
#include "backend/cuda/kernels/sequence_order.cuh"
#include "backend/cuda/dispatch_families.cuh"
#include "core/dtype.h"
#include "core/error.h"

namespace fd {
namespace cuda {

using namespace dispatch;  // NOLINT: the families and their templates (dispatch_families.cuh)

namespace dispatch {
// The 8-bit families' row functions are instantiated in dispatch_8bit.cu
// (16 rows), dispatch_8bit_cuda_core.cu and dispatch_8bit_keys.cu (keys on M),
// the rows families' and the compact tiles' in dispatch_rows.cu (the wide
// 64-row one's in dispatch_rows64_wide.cu).
FD_FAMILY_FUNCTIONS(extern template, CudaCoreQuantizedFamily)
FD_FAMILY_FUNCTIONS(extern template, TensorCoreQuantizedFamily)
FD_FAMILY_FUNCTIONS(extern template, TensorCoreQuantizedKeysFamily)
FD_FAMILY_FUNCTIONS(extern template, TensorCoreRowsFamily<2>)
FD_FAMILY_FUNCTIONS(extern template, TensorCoreRowsFamily<4>)
FD_FAMILY_FUNCTIONS(extern template, TensorCoreFamily<MmaTiles::compact>)
FD_FAMILY_FUNCTIONS(extern template, TensorCoreRows64WideFamily)
}  // namespace dispatch

namespace {

// In SplitVariant order (row_of checks).
const SplitVariantRow kSplitVariants[kSplitVariantCount] = {
    row<CudaCoreFamily>(SplitVariant::cuda_core, "cuda-core-64", "cuda-core-128", "cuda-core-256"),
    row<TensorCoreFamily<MmaTiles::standard>>(SplitVariant::tensor_core, "tensor-core-64", "tensor-core-128",
                                              "tensor-core-256"),
    row<TensorCoreFamily<MmaTiles::wide>>(SplitVariant::tensor_core_wide, "tensor-core-wide-64", "tensor-core-wide-128",
                                          "tensor-core-wide-256"),
    row<CudaCoreQuantizedFamily>(SplitVariant::cuda_core_8bit, "cuda-core-8bit-64", "cuda-core-8bit-128",
                                 "cuda-core-8bit-256"),
    row<TensorCoreQuantizedFamily>(SplitVariant::tensor_core_8bit, "tensor-core-8bit-64", "tensor-core-8bit-128",
                                   "tensor-core-8bit-256"),
    row<TensorCoreRowsFamily<2>>(SplitVariant::tensor_core_rows, "tensor-core-rows-64", "tensor-core-rows-128",
                                 "tensor-core-rows-256"),
    row<TensorCoreRowsFamily<4>>(SplitVariant::tensor_core_rows64, "tensor-core-rows64-64", "tensor-core-rows64-128",
                                 "tensor-core-rows64-256"),
    row<TensorCoreFamily<MmaTiles::compact>>(SplitVariant::tensor_core_compact, "tensor-core-compact-64",
                                             "tensor-core-compact-128", "tensor-core-compact-256"),
    row<TensorCoreQuantizedKeysFamily>(SplitVariant::tensor_core_8bit_keys, "tensor-core-8bit-keys-64",
                                       "tensor-core-8bit-keys-128", "tensor-core-8bit-keys-256"),
    row<TensorCoreRows64WideFamily>(SplitVariant::tensor_core_rows64_wide, "tensor-core-rows64-wide-64",
                                    "tensor-core-rows64-wide-128", "tensor-core-rows64-wide-256"),
};

const SplitVariantRow &row_of(SplitVariant variant) {
  const int index = index_of(variant);
  if (index < 0 || index >= kSplitVariantCount || kSplitVariants[index].variant != variant) {
    fail(FD_ERROR_INTERNAL, "CUDA backend: unknown split variant %d", index);
  }
  return kSplitVariants[index];
}

// One K/V dtype per table slot (dtype_slot): the 8-bit formats share one.
constexpr fd_dtype kCacheDtypes[kDtypeSlotCount] = {FD_DTYPE_F32, FD_DTYPE_F16, FD_DTYPE_BF16, FD_DTYPE_E4M3};

// Queues kernel and returns that launch's own status. A <<<>>> launch
// reports only through cudaGetLastError, which a program linking the static
// library shares with it: a pending error of the program's would read as a
// failed launch after the kernel was queued (outputs written, an error
// returned).
// programmatic: the kernel begins with grid_dependency_wait (sm_90+, see
// allow_programmatic_launch).
template <class... Params, class... Args>
cudaError_t launch_on(cudaStream_t stream, bool programmatic, dim3 grid, int threads, void (*kernel)(Params...),
                      Args &&...args) {
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = dim3(static_cast<unsigned>(threads));
  config.stream = stream;
  cudaLaunchAttribute attribute;
  if (programmatic) allow_programmatic_launch(config, attribute);
  return cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
}

template <class OutT>
struct MergeKernel;

template <class OutT>
cudaError_t launch_merge(const MergeParams &merge, bool programmatic, cudaStream_t stream) {
  MergeParams p = merge;
  const MergeLayout layout = merge_layout(p.num_splits, p.head_dim, p.invariant_order);
  p.groups = layout.groups;
  p.columns = layout.columns;
  p.column_slices = layout.slices;
  const int64_t max_rows = (int64_t{1} << 30) / layout.slices;  // CTAs past it loop over rows
  const dim3 grid(static_cast<unsigned>((p.rows < max_rows ? p.rows : max_rows) * layout.slices));
  // Programmatic dependent launch: the merge's CTAs may be scheduled once
  // every split CTA has started, and wait in grid_dependency_wait for the
  // split grid to finish; this takes the launch gap off the critical path.
  return launch_on(stream, programmatic, grid, layout.threads(), MergeKernel<OutT>::function, p);
}

// The merge kernel for one output type, as a value.
template <class OutT>
struct MergeKernel {
  using Out = OutT;
  static constexpr auto function = merge_kernel<OutT>;
};

// Calls body(MergeKernel<OutT>{}) for the output type of dtype.
template <class Body>
auto with_merge_kernel(fd_dtype out_dtype, Body &&body) {
  switch (out_dtype) {
    case FD_DTYPE_F32: return body(MergeKernel<StorageOf<FD_DTYPE_F32>::type>{});
    case FD_DTYPE_F16: return body(MergeKernel<StorageOf<FD_DTYPE_F16>::type>{});
    case FD_DTYPE_BF16: return body(MergeKernel<StorageOf<FD_DTYPE_BF16>::type>{});
    default: break;
  }
  fail(FD_ERROR_INTERNAL, "CUDA backend: no merge kernel for output dtype %d", static_cast<int>(out_dtype));
}

}  // namespace

SplitVariant split_variant_at(int index) {
  if (index < 0 || index >= kSplitVariantCount) fail(FD_ERROR_INTERNAL, "CUDA backend: no split variant %d", index);
  return row_of(static_cast<SplitVariant>(index)).variant;
}

const char *split_variant_name(SplitVariant variant, int head_dim_bucket) {
  return row_of(variant).names[bucket_slot(head_dim_bucket)];
}

bool split_variant_takes(SplitVariant variant, fd_dtype kv_dtype) { return row_of(variant).takes(kv_dtype); }

bool split_variant_scores_only(SplitVariant variant) { return row_of(variant).variant_scores_only; }

SplitKernelShape split_kernel_shape(SplitVariant variant, fd_dtype kv_dtype, int64_t head_dim) {
  return row_of(variant).shape(kv_dtype, head_dim_bucket(head_dim));
}

cudaError_t prepare_kernels(KernelOccupancy *occupancy) {
  cudaFuncAttributes attributes;
  // Loaded now, not on the first decode (which may be under graph capture).
  if (const cudaError_t err = cudaFuncGetAttributes(&attributes, sequence_order_kernel); err != cudaSuccess) return err;
  for (fd_dtype dtype : kStorageDtypes) {
    const cudaError_t err =
        with_merge_kernel(dtype, [&](auto kernel) { return cudaFuncGetAttributes(&attributes, kernel.function); });
    if (err != cudaSuccess) return err;
  }
  int device_index = 0, smem_optin = 0, cluster_launch = 0, compute_major = 0;
  cudaError_t err = cudaGetDevice(&device_index);
  if (err == cudaSuccess) {
    err = cudaDeviceGetAttribute(&smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device_index);
  }
  if (err == cudaSuccess) {
    err = cudaDeviceGetAttribute(&compute_major, cudaDevAttrComputeCapabilityMajor, device_index);
  }
  if (err != cudaSuccess) return err;
  if (cudaDeviceGetAttribute(&cluster_launch, cudaDevAttrClusterLaunch, device_index) != cudaSuccess) {
    cudaGetLastError();  // no cluster merge (prepare_clusters), not a failed handle
    cluster_launch = 0;
  }
  DeviceLimits device;
  device.smem_optin = smem_optin;
  device.cluster_launch = cluster_launch != 0;
  device.compute_major = compute_major;
  *occupancy = KernelOccupancy{};
  for (const SplitVariantRow &variant : kSplitVariants) {
    for (fd_dtype dtype : kCacheDtypes) {
      if (!variant.takes(dtype)) continue;
      for (int bucket : kBuckets) {
        const int d = dtype_slot(dtype);
        const int b = bucket_slot(bucket);
        err = variant.prepare(dtype, bucket, device, occupancy->ctas_at(variant.variant, d, b),
                              occupancy->clusters_at(variant.variant, d, b));
        if (err != cudaSuccess) return err;
      }
    }
  }
  return cudaSuccess;
}

cudaError_t merge_supports_programmatic_launch(bool *supported) {
  *supported = false;
  int device = 0, major = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  if (err != cudaSuccess || major < 9) return err;
  // The image the device runs must have been compiled for sm_90 or later
  // (an sm_80 PTX JIT-compiled here would not wait on the split grid).
  for (fd_dtype dtype : kStorageDtypes) {
    cudaFuncAttributes attributes;
    err = with_merge_kernel(dtype, [&](auto kernel) { return cudaFuncGetAttributes(&attributes, kernel.function); });
    if (err != cudaSuccess) return err;
    if (!built_for_sm90(attributes)) return cudaSuccess;
  }
  *supported = true;
  return cudaSuccess;
}

cudaError_t probe_kernel_image() {
  cudaFuncAttributes attributes;
  return cudaFuncGetAttributes(&attributes, merge_kernel<float>);
}

namespace {

// merge_aligned_states_kernel's conditions beyond the rows' alignment: few
// states of one dtype, rows whole vectors of kVector elements.
bool vector_merge_takes(const MergeStatesParams &merge) {
  if (merge.num_states > kMergeStatesBatch || merge.head_dim % kVector != 0) return false;
  for (int s = 1; s < merge.num_states; ++s) {
    if (merge.states[s].dtype != merge.states[0].dtype) return false;
  }
  return true;
}

// Every state has state 0's out and LSE strides: one offset a row serves all.
bool states_share_layout(const MergeStatesParams &merge) {
  const MergeStateView &first = merge.states[0];
  for (int s = 1; s < merge.num_states; ++s) {
    for (int d = 0; d < 3; ++d) {
      if (merge.states[s].out_strides[d] != first.out_strides[d] ||
          merge.states[s].lse_strides[d] != first.lse_strides[d]) {
        return false;
      }
    }
  }
  return true;
}

// Calls body(T{}) with the storage type of a float dtype; fails closed.
template <class Body>
void with_storage_type(fd_dtype dtype, const char *what, Body &&body) {
  switch (dtype) {
    case FD_DTYPE_F32: return body(StorageOf<FD_DTYPE_F32>::type{});
    case FD_DTYPE_F16: return body(StorageOf<FD_DTYPE_F16>::type{});
    case FD_DTYPE_BF16: return body(StorageOf<FD_DTYPE_BF16>::type{});
    default: break;
  }
  fail(FD_ERROR_INTERNAL, "CUDA backend: no merge-states kernel for %s dtype %s", what, dtype_name(dtype));
}

}  // namespace

cudaError_t launch_merge_states(fd_dtype out_dtype, const MergeStatesParams &merge, bool states_aligned,
                                bool out_aligned, bool programmatic, cudaStream_t stream) {
  // Up to 8 states (the common case) launch with an 8-state parameter struct:
  // a launch's parameters are copied with it, 4.7 KiB of them for 64 states.
  static_assert(kMergeStatesBatch == 8, "the small parameter struct holds one batch of states");
  MergeStatesParamsFor<kMergeStatesBatch> few;
  const bool use_few = merge.num_states <= kMergeStatesBatch;
  if (use_few) {
    few.num_states = merge.num_states;
    few.head_dim = merge.head_dim;
    few.q_len = merge.q_len;
    few.heads = merge.heads;
    few.rows = merge.rows;
    few.out = merge.out;
    few.lse = merge.lse;
    for (int d = 0; d < 3; ++d) {
      few.out_strides[d] = merge.out_strides[d];
      few.lse_strides[d] = merge.lse_strides[d];
    }
    for (int s = 0; s < merge.num_states; ++s) few.states[s] = merge.states[s];
  }
  const auto grid_for = [&](int64_t rows_per_block) {
    const int64_t blocks = (merge.rows + rows_per_block - 1) / rows_per_block;
    return dim3(static_cast<unsigned>(blocks < (int64_t{1} << 30) ? blocks : (int64_t{1} << 30)));
  };
  if (states_aligned && vector_merge_takes(merge)) {
    int row_lanes_log2 = 0;
    while ((kVector << row_lanes_log2) < merge.head_dim) ++row_lanes_log2;  // head_dim <= 32 * kVector
    const dim3 grid = grid_for((kMergeStatesThreads / 32) * (32 >> row_lanes_log2));
    const bool one_layout = states_share_layout(merge);
    cudaError_t err = cudaSuccess;
    with_storage_type(out_dtype, "output", [&](auto out_type) {
      with_storage_type(static_cast<fd_dtype>(merge.states[0].dtype), "state", [&](auto state_type) {
        using OutT = decltype(out_type);
        using StateT = decltype(state_type);
        err = one_layout
                  ? launch_on(stream, programmatic, grid, kMergeStatesThreads,
                              merge_aligned_states_kernel<OutT, StateT, true>, few, row_lanes_log2, out_aligned)
                  : launch_on(stream, programmatic, grid, kMergeStatesThreads,
                              merge_aligned_states_kernel<OutT, StateT, false>, few, row_lanes_log2, out_aligned);
      });
    });
    return err;
  }
  const dim3 grid = grid_for(kMergeStatesThreads / 32);
  cudaError_t err = cudaSuccess;
  with_storage_type(out_dtype, "output", [&](auto out_type) {
    using OutT = decltype(out_type);
    const auto with_states = [&](auto per_lane) {
      constexpr int kPerLane = decltype(per_lane)::value;
      if (use_few) {
        err = launch_on(stream, programmatic, grid, kMergeStatesThreads,
                        merge_states_kernel<OutT, kPerLane, kMergeStatesBatch>, few);
      } else {
        err = launch_on(stream, programmatic, grid, kMergeStatesThreads,
                        merge_states_kernel<OutT, kPerLane, FD_MAX_MERGE_STATES>, merge);
      }
    };
    switch (merge_states_per_lane(merge.head_dim)) {
      case 1: return with_states(std::integral_constant<int, 1>{});
      case 2: return with_states(std::integral_constant<int, 2>{});
      case 4: return with_states(std::integral_constant<int, 4>{});
      case 8: return with_states(std::integral_constant<int, 8>{});
      default: break;
    }
    fail(FD_ERROR_INTERNAL, "CUDA backend: no merge-states kernel for head_dim %d", merge.head_dim);
  });
  return err;
}

cudaError_t launch_append_kv(const AppendParams &append, bool programmatic, cudaStream_t stream) {
  const int64_t landing = append.new_len < append.kv_capacity ? append.new_len : append.kv_capacity;
  const int64_t tokens = append.batch * landing;
  const int64_t items =
      static_cast<int64_t>(append.kv_heads) * ((append.head_dim + kAppendElements - 1) / kAppendElements);
  const dim3 grid(static_cast<unsigned>((items + kAppendThreads - 1) / kAppendThreads),
                  static_cast<unsigned>(tokens < 65535 ? tokens : 65535));
  const auto launch = [&](auto new_type, auto cache_dtype) {
    using NewT = decltype(new_type);
    constexpr int kCache = decltype(cache_dtype)::value;
    return append.vector
               ? launch_on(stream, programmatic, grid, kAppendThreads, append_kv_kernel<NewT, kCache, true>, append)
               : launch_on(stream, programmatic, grid, kAppendThreads, append_kv_kernel<NewT, kCache, false>, append);
  };
  const auto with_cache = [&](auto new_type) {
    switch (append.cache_dtype) {
      case FD_DTYPE_F32: return launch(new_type, std::integral_constant<int, FD_DTYPE_F32>{});
      case FD_DTYPE_F16: return launch(new_type, std::integral_constant<int, FD_DTYPE_F16>{});
      case FD_DTYPE_BF16: return launch(new_type, std::integral_constant<int, FD_DTYPE_BF16>{});
      case FD_DTYPE_E4M3: return launch(new_type, std::integral_constant<int, FD_DTYPE_E4M3>{});
      case FD_DTYPE_E5M2: return launch(new_type, std::integral_constant<int, FD_DTYPE_E5M2>{});
      case FD_DTYPE_I8: return launch(new_type, std::integral_constant<int, FD_DTYPE_I8>{});
      default: break;
    }
    fail(FD_ERROR_INTERNAL, "CUDA backend: no append kernel for cache dtype %d", append.cache_dtype);
  };
  switch (append.new_dtype) {
    case FD_DTYPE_F32: return with_cache(float{});
    case FD_DTYPE_F16: return with_cache(__half{});
    case FD_DTYPE_BF16: return with_cache(__nv_bfloat16{});
    default: break;
  }
  fail(FD_ERROR_INTERNAL, "CUDA backend: no append kernel for new-token dtype %d", append.new_dtype);
}

cudaError_t launch_check_contents(const CheckParams &check, cudaStream_t stream) {
  return launch_on(stream, false, dim3(1), kCheckThreads, check_contents_kernel, check);
}

cudaError_t launch_decode(SplitVariant variant, fd_dtype q_dtype, fd_dtype kv_dtype, fd_dtype out_dtype,
                          const SplitParams &split, const MergeParams *merge, bool programmatic, cudaStream_t stream) {
  if (split.sequence_order != nullptr) {
    const cudaError_t err = launch_on(stream, programmatic, dim3(1), kOrderThreads, sequence_order_kernel, split);
    if (err != cudaSuccess) return err;
  }
  const cudaError_t err =
      row_of(variant).launch(q_dtype, kv_dtype, head_dim_bucket(split.head_dim), split, programmatic, stream);
  if (err != cudaSuccess || merge == nullptr) return err;
  return with_merge_kernel(out_dtype, [&](auto kernel) {
    return launch_merge<typename decltype(kernel)::Out>(*merge, programmatic, stream);
  });
}

}  // namespace cuda
}  // namespace fd
