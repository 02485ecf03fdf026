// SPDX-License-Identifier: Apache-2.0
// The one place where runtime choices become template parameters, and the
// table of split-kernel variants: each row names a variant and holds what
// the host needs of it (names, shapes, preparation, launch), built from its
// kernel family. Every kernel instantiation of the library is here; every
// switch fails closed (FD_ERROR_INTERNAL) on a value no kernel was built for.
#include "backend/cuda/dispatch.h"

#include <type_traits>

#include "backend/cuda/kernels/append_kv.cuh"
#include "backend/cuda/kernels/check_contents.cuh"
#include "backend/cuda/kernels/merge_kernel.cuh"
#include "backend/cuda/kernels/merge_states.cuh"
#include "backend/cuda/kernels/split_cuda_core.cuh"
#include "backend/cuda/kernels/split_tensor_core.cuh"
#include "core/dtype.h"
#include "core/error.h"

namespace fd {
namespace cuda {

// A kernel family: a kernel template, the storage types it is built for,
// whether it has a cluster-merge instantiation, and the shared memory a
// block must be able to opt into for the family to be used at all.
// T is the storage type of q (and, but for the 8-bit families, of K/V);
// kQuantized families read 8-bit caches of any of the three formats.
struct CudaCoreFamily {
  static constexpr bool kQuantized = false;
  template <class T>
  static constexpr bool kTakes = true;
  static constexpr bool kHasClusters = false;
  static constexpr int kMinSmemOptin = 0;
  template <class T, int kBucket, bool kCluster, bool kVariants>
  struct Kernel {
    using Traits = SplitTraits<T, kBucket>;
    static constexpr auto function = split_kernel<T, kBucket, kVariants>;
  };
};

// Wide tiles only where a block gets 200+ KiB of shared memory (sm_90 and
// sm_100: 227 KiB), where they were measured; their 128 KiB would also fit
// sm_80's 164 KiB, where nobody has timed them against the standard tiles.
template <bool kWide>
struct TensorCoreFamily {
  static constexpr bool kQuantized = false;
  template <class T>
  static constexpr bool kTakes = sizeof(T) == 2;
  static constexpr bool kHasClusters = true;
  static constexpr int kMinSmemOptin = kWide ? 200 * 1024 : 0;
  template <class T, int kBucket, bool kCluster, bool kVariants>
  struct Kernel {
    using Traits = MmaTraits<T, kBucket, kWide>;
    static constexpr auto function = mma_split_kernel<T, kBucket, kWide, kCluster, kVariants>;
  };
};

// 8-bit caches: the CUDA-core kernel for any q type, the tensor cores for
// 16-bit q (standard tiles, no cluster merge).
struct CudaCoreQuantizedFamily {
  static constexpr bool kQuantized = true;
  template <class T>
  static constexpr bool kTakes = true;
  static constexpr bool kHasClusters = false;
  static constexpr int kMinSmemOptin = 0;
  template <class T, int kBucket, bool kCluster, bool kVariants>
  struct Kernel {
    using Traits = SplitTraits<uint8_t, kBucket>;
    static constexpr auto function = split_kernel<T, kBucket, kVariants, true>;
  };
};

struct TensorCoreQuantizedFamily {
  static constexpr bool kQuantized = true;
  template <class T>
  static constexpr bool kTakes = sizeof(T) == 2;
  static constexpr bool kHasClusters = false;
  static constexpr int kMinSmemOptin = 0;
  template <class T, int kBucket, bool kCluster, bool kVariants>
  struct Kernel {
    using Traits = MmaTraits<T, kBucket, false, true>;
    static constexpr auto function = mma_split_kernel<T, kBucket, false, false, kVariants, true>;
  };
};

namespace {

template <class Family, class T, bool kCluster, bool kVariants, class Body>
auto with_bucket(int bucket, Body &&body) {
  switch (bucket) {
    case 64: return body(typename Family::template Kernel<T, 64, kCluster, kVariants>{});
    case 128: return body(typename Family::template Kernel<T, 128, kCluster, kVariants>{});
    case 256: return body(typename Family::template Kernel<T, 256, kCluster, kVariants>{});
    default: break;
  }
  fail(FD_ERROR_INTERNAL, "CUDA backend: no split kernel for head-dim bucket %d", bucket);
}

// Kernels with the variants' scoring have no cluster merge (policy.cpp does
// not choose it for them): one instantiation less per bucket.
template <class Family, class T, class Body>
auto with_cluster(int bucket, bool cluster, bool variants, Body &&body) {
  if constexpr (Family::kHasClusters) {
    if (cluster && !variants) return with_bucket<Family, T, true, false>(bucket, body);
  }
  if (cluster) fail(FD_ERROR_INTERNAL, "CUDA backend: this split kernel has no cluster merge");
  if (variants) return with_bucket<Family, T, false, true>(bucket, body);
  return with_bucket<Family, T, false, false>(bucket, body);
}

// Calls body(Family::Kernel<T, bucket, cluster, variants>{}) for the storage
// type T of q_dtype, K/V being kv_dtype: q's type, or 8-bit for the
// quantized families.
template <class Family, class Body>
auto with_kernel(fd_dtype q_dtype, fd_dtype kv_dtype, int bucket, bool cluster, bool variants, Body &&body) {
  if (is_quantized_dtype(kv_dtype) != Family::kQuantized || (!Family::kQuantized && q_dtype != kv_dtype)) {
    fail(FD_ERROR_INTERNAL, "CUDA backend: no split kernel of this family for %s K/V with %s q", dtype_name(kv_dtype),
         dtype_name(q_dtype));
  }
  switch (q_dtype) {
    case FD_DTYPE_F32:
      if constexpr (Family::template kTakes<StorageOf<FD_DTYPE_F32>::type>) {
        return with_cluster<Family, StorageOf<FD_DTYPE_F32>::type>(bucket, cluster, variants, body);
      }
      break;
    case FD_DTYPE_F16:
      if constexpr (Family::template kTakes<StorageOf<FD_DTYPE_F16>::type>) {
        return with_cluster<Family, StorageOf<FD_DTYPE_F16>::type>(bucket, cluster, variants, body);
      }
      break;
    case FD_DTYPE_BF16:
      if constexpr (Family::template kTakes<StorageOf<FD_DTYPE_BF16>::type>) {
        return with_cluster<Family, StorageOf<FD_DTYPE_BF16>::type>(bucket, cluster, variants, body);
      }
      break;
    default: break;
  }
  fail(FD_ERROR_INTERNAL, "CUDA backend: no split kernel for q dtype %d", static_cast<int>(q_dtype));
}

// The q dtype whose kernel stands for a K/V dtype's in the tables (shape,
// occupancy): q's own, or for 8-bit caches f16 (every q type's kernel of
// these families has the same shape).
fd_dtype representative_q(fd_dtype kv_dtype) { return is_quantized_dtype(kv_dtype) ? FD_DTYPE_F16 : kv_dtype; }

constexpr fd_dtype kStorageDtypes[] = {FD_DTYPE_F32, FD_DTYPE_F16, FD_DTYPE_BF16};

template <class Family>
bool family_takes(fd_dtype dtype) {
  if (Family::kQuantized) return is_quantized_dtype(dtype);
  switch (dtype) {
    case FD_DTYPE_F32: return Family::template kTakes<StorageOf<FD_DTYPE_F32>::type>;
    case FD_DTYPE_F16: return Family::template kTakes<StorageOf<FD_DTYPE_F16>::type>;
    case FD_DTYPE_BF16: return Family::template kTakes<StorageOf<FD_DTYPE_BF16>::type>;
    default: return false;
  }
}

// Programmatic stream serialization (sm_90+, see launch_decode): the kernel
// may be scheduled while the previous kernel on the stream finishes, and
// waits in griddepcontrol.wait before its first memory access.
void allow_programmatic_launch(cudaLaunchConfig_t &config, cudaLaunchAttribute &attribute) {
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  config.attrs = &attribute;
  config.numAttrs = 1;
}

// Whether a kernel's loaded image was compiled for sm_90 or later: its
// griddepcontrol and cluster code exist. An older PTX JIT-compiled for this
// device reports the device's binaryVersion but its own ptxVersion.
bool built_for_sm90(const cudaFuncAttributes &attributes) {
  return attributes.ptxVersion >= 90 && attributes.binaryVersion >= 90;
}

// Clusters of `size` CTAs along x (the cluster merge: a unit's splits).
cudaLaunchAttribute cluster_attribute(int size) {
  cudaLaunchAttribute attribute;
  attribute.id = cudaLaunchAttributeClusterDimension;
  attribute.val.clusterDim.x = static_cast<unsigned>(size);
  attribute.val.clusterDim.y = 1;
  attribute.val.clusterDim.z = 1;
  return attribute;
}

template <class Kernel>
cudaError_t launch_split(const SplitParams &split, bool programmatic, cudaStream_t stream) {
  using Traits = typename Kernel::Traits;
  cudaLaunchConfig_t config = {};
  const int64_t ctas_per_sequence = static_cast<int64_t>(split.head_chunks) * split.kv_heads * split.num_splits;
  config.gridDim =
      dim3(static_cast<unsigned>(ctas_per_sequence), static_cast<unsigned>(split.batch < 65535 ? split.batch : 65535));
  config.blockDim = dim3(Traits::kThreads);
  config.dynamicSmemBytes = Traits::kSmemBytes;
  config.stream = stream;
  cudaLaunchAttribute attributes[2];
  if (programmatic) allow_programmatic_launch(config, attributes[0]);
  if (split.cluster_merge) {
    attributes[config.numAttrs] = cluster_attribute(split.num_splits);
    config.attrs = attributes;
    ++config.numAttrs;
  }
  return cudaLaunchKernelEx(&config, Kernel::function, split);
}

template <class Kernel>
cudaError_t prepare(int &ctas_per_sm) {
  using Traits = typename Kernel::Traits;
  cudaError_t e =
      cudaFuncSetAttribute(Kernel::function, cudaFuncAttributeMaxDynamicSharedMemorySize, Traits::kSmemBytes);
  // All of L1 as shared memory: these kernels stream through shared memory
  // and want as many CTAs resident as it holds.
  if (e == cudaSuccess) {
    e = cudaFuncSetAttribute(Kernel::function, cudaFuncAttributePreferredSharedMemoryCarveout,
                             cudaSharedmemCarveoutMaxShared);
  }
  if (e == cudaSuccess) {
    e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&ctas_per_sm, Kernel::function, Traits::kThreads,
                                                      Traits::kSmemBytes);
  }
  return e;
}

// Prepares a cluster-merge split kernel (see prepare) and counts the
// clusters of 2..kMaxClusterSplits of its CTAs the device holds at once
// ([n]). Left all 0 where cluster launch is unavailable (before sm_90; an
// image compiled for an older architecture, including sm_80 PTX that the
// driver JIT-compiles for this device: its merge_in_cluster is empty) or
// any of this fails: the cluster merge is an optimisation, and the other
// merges cover every problem, so this never fails the handle.
template <class Kernel>
cudaError_t prepare_clusters(int (&clusters)[kMaxClusterSplits + 1]) {
  using Traits = typename Kernel::Traits;
  cudaFuncAttributes attributes;
  int ctas_per_sm = 0;
  cudaError_t err = cudaFuncGetAttributes(&attributes, Kernel::function);
  if (err == cudaSuccess && !built_for_sm90(attributes)) return cudaSuccess;
  if (err == cudaSuccess) err = prepare<Kernel>(ctas_per_sm);
  for (int size = 2; size <= kMaxClusterSplits && err == cudaSuccess; ++size) {
    cudaLaunchConfig_t config = {};
    config.gridDim = dim3(static_cast<unsigned>(size));
    config.blockDim = dim3(Traits::kThreads);
    config.dynamicSmemBytes = Traits::kSmemBytes;
    cudaLaunchAttribute attribute = cluster_attribute(size);
    config.attrs = &attribute;
    config.numAttrs = 1;
    err = cudaOccupancyMaxActiveClusters(&clusters[size], Kernel::function, &config);
  }
  if (err != cudaSuccess) {
    cudaGetLastError();  // not this library's caller's error: nothing is reported
    for (int &count : clusters) count = 0;
  }
  return cudaSuccess;
}

// What prepare_variant needs to know of the device.
struct DeviceLimits {
  int smem_optin = 0;  // shared memory a block may opt into
  bool cluster_launch = false;
};

// What the host needs to know about a split kernel, from its traits.
template <class Traits>
SplitKernelShape shape_of() {
  SplitKernelShape shape;
  shape.head_dim_bucket = Traits::kBucket;
  shape.threads = Traits::kThreads;
  shape.rows = Traits::kRows;
  shape.tile_tokens = Traits::kTileTokens;
  shape.stages = Traits::kStages;
  shape.smem_bytes = Traits::kSmemBytes;
  return shape;
}

template <class Family>
SplitKernelShape family_shape(fd_dtype dtype, int bucket) {
  return with_kernel<Family>(representative_q(dtype), dtype, bucket, false, false,
                             [](auto kernel) { return shape_of<typename decltype(kernel)::Traits>(); });
}

// Whether the family has a kernel for q of q_dtype with K/V of kv_dtype.
template <class Family>
bool family_takes_q(fd_dtype q_dtype, fd_dtype kv_dtype) {
  if (!family_takes<Family>(kv_dtype)) return false;
  if (!Family::kQuantized) return q_dtype == kv_dtype;
  switch (q_dtype) {
    case FD_DTYPE_F32: return Family::template kTakes<StorageOf<FD_DTYPE_F32>::type>;
    case FD_DTYPE_F16: return Family::template kTakes<StorageOf<FD_DTYPE_F16>::type>;
    case FD_DTYPE_BF16: return Family::template kTakes<StorageOf<FD_DTYPE_BF16>::type>;
    default: return false;
  }
}

// Prepares the family's kernels for one dtype and bucket: resident CTAs and
// clusters, or 0 where the device cannot run them.
template <class Family>
cudaError_t prepare_family(fd_dtype dtype, int bucket, const DeviceLimits &device, int &ctas,
                           int (&clusters)[kMaxClusterSplits + 1]) {
  if (Family::kMinSmemOptin > 0 && (device.smem_optin < Family::kMinSmemOptin ||
                                    family_shape<Family>(dtype, bucket).smem_bytes > device.smem_optin)) {
    return cudaSuccess;
  }
  const fd_dtype q_dtype = representative_q(dtype);
  cudaError_t err = with_kernel<Family>(q_dtype, dtype, bucket, false, false,
                                        [&](auto kernel) { return prepare<decltype(kernel)>(ctas); });
  // The variants' kernel has the plain one's shape, and so do the other q
  // types' kernels of an 8-bit family: their occupancy is not planned with
  // (plain plans stay as they were), only their attributes set.
  int other_ctas = 0;
  for (fd_dtype q : kStorageDtypes) {
    if (!family_takes_q<Family>(q, dtype)) continue;
    for (int variants = 0; variants < 2 && err == cudaSuccess; ++variants) {
      if (q == q_dtype && variants == 0) continue;
      err = with_kernel<Family>(q, dtype, bucket, false, variants == 1,
                                [&](auto kernel) { return prepare<decltype(kernel)>(other_ctas); });
    }
  }
  if (err == cudaSuccess && Family::kHasClusters && device.cluster_launch) {
    err = with_kernel<Family>(q_dtype, dtype, bucket, true, false,
                              [&](auto kernel) { return prepare_clusters<decltype(kernel)>(clusters); });
  }
  return err;
}

template <class Family>
cudaError_t launch_family(fd_dtype q_dtype, fd_dtype kv_dtype, int bucket, const SplitParams &split, bool programmatic,
                          cudaStream_t stream) {
  return with_kernel<Family>(q_dtype, kv_dtype, bucket, split.cluster_merge, split.variant_scores,
                             [&](auto kernel) { return launch_split<decltype(kernel)>(split, programmatic, stream); });
}

// A variant: its names per head-dim bucket, and its family's functions.
struct SplitVariantRow {
  SplitVariant variant;
  const char *names[kBucketCount];
  bool (*takes)(fd_dtype);
  SplitKernelShape (*shape)(fd_dtype, int bucket);
  cudaError_t (*prepare)(fd_dtype, int bucket, const DeviceLimits &, int &ctas, int (&clusters)[kMaxClusterSplits + 1]);
  cudaError_t (*launch)(fd_dtype q_dtype, fd_dtype kv_dtype, int bucket, const SplitParams &, bool programmatic,
                        cudaStream_t);
};

template <class Family>
constexpr SplitVariantRow row(SplitVariant variant, const char *name_64, const char *name_128, const char *name_256) {
  return {variant,
          {name_64, name_128, name_256},
          family_takes<Family>,
          family_shape<Family>,
          prepare_family<Family>,
          launch_family<Family>};
}

// In SplitVariant order (row_of checks).
const SplitVariantRow kSplitVariants[kSplitVariantCount] = {
    row<CudaCoreFamily>(SplitVariant::cuda_core, "cuda-core-64", "cuda-core-128", "cuda-core-256"),
    row<TensorCoreFamily<false>>(SplitVariant::tensor_core, "tensor-core-64", "tensor-core-128", "tensor-core-256"),
    row<TensorCoreFamily<true>>(SplitVariant::tensor_core_wide, "tensor-core-wide-64", "tensor-core-wide-128",
                                "tensor-core-wide-256"),
    row<CudaCoreQuantizedFamily>(SplitVariant::cuda_core_8bit, "cuda-core-8bit-64", "cuda-core-8bit-128",
                                 "cuda-core-8bit-256"),
    row<TensorCoreQuantizedFamily>(SplitVariant::tensor_core_8bit, "tensor-core-8bit-64", "tensor-core-8bit-128",
                                   "tensor-core-8bit-256"),
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

template <class OutT>
struct MergeKernel;

template <class OutT>
cudaError_t launch_merge(const MergeParams &merge, bool programmatic, cudaStream_t stream) {
  MergeParams p = merge;
  p.groups = merge_groups(p.num_splits, p.head_dim);
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(static_cast<unsigned>(p.rows < (int64_t{1} << 30) ? p.rows : (int64_t{1} << 30)));
  config.blockDim = dim3(static_cast<unsigned>(merge_threads(p.num_splits, p.head_dim)));
  config.dynamicSmemBytes = 0;
  config.stream = stream;
  // Programmatic dependent launch: the merge's CTAs may be scheduled once
  // every split CTA has started, and wait in grid_dependency_wait for the
  // split grid to finish; this takes the launch gap off the critical path.
  cudaLaunchAttribute attribute;
  if (programmatic) allow_programmatic_launch(config, attribute);
  return cudaLaunchKernelEx(&config, MergeKernel<OutT>::function, p);
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

SplitKernelShape split_kernel_shape(SplitVariant variant, fd_dtype kv_dtype, int64_t head_dim) {
  return row_of(variant).shape(kv_dtype, head_dim_bucket(head_dim));
}

cudaError_t prepare_kernels(KernelOccupancy *occupancy) {
  cudaFuncAttributes attributes;
  for (fd_dtype dtype : kStorageDtypes) {
    const cudaError_t err =
        with_merge_kernel(dtype, [&](auto kernel) { return cudaFuncGetAttributes(&attributes, kernel.function); });
    if (err != cudaSuccess) return err;
  }
  int device_index = 0, smem_optin = 0, cluster_launch = 0;
  cudaError_t err = cudaGetDevice(&device_index);
  if (err == cudaSuccess) {
    err = cudaDeviceGetAttribute(&smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device_index);
  }
  if (err != cudaSuccess) return err;
  if (cudaDeviceGetAttribute(&cluster_launch, cudaDevAttrClusterLaunch, device_index) != cudaSuccess) {
    cudaGetLastError();  // no cluster merge (prepare_clusters), not a failed handle
    cluster_launch = 0;
  }
  DeviceLimits device;
  device.smem_optin = smem_optin;
  device.cluster_launch = cluster_launch != 0;
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

cudaError_t launch_merge_states(fd_dtype out_dtype, const MergeStatesParams &merge, cudaStream_t stream) {
  constexpr int64_t kRowsPerBlock = kMergeStatesThreads / 32;
  const int64_t blocks = (merge.rows + kRowsPerBlock - 1) / kRowsPerBlock;
  const dim3 grid(static_cast<unsigned>(blocks < (int64_t{1} << 30) ? blocks : (int64_t{1} << 30)));
  // Up to 8 states (the common case) launch with an 8-state parameter struct:
  // a launch's parameters are copied with it, 4.7 KiB of them for 64 states.
  MergeStatesParamsFor<8> few;
  const bool use_few = merge.num_states <= 8;
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
  const auto launch = [&](auto out_type) {
    using OutT = decltype(out_type);
    const auto with_states = [&](auto per_lane) {
      constexpr int kPerLane = decltype(per_lane)::value;
      if (use_few) {
        merge_states_kernel<OutT, kPerLane, 8><<<grid, kMergeStatesThreads, 0, stream>>>(few);
      } else {
        merge_states_kernel<OutT, kPerLane, FD_MAX_MERGE_STATES><<<grid, kMergeStatesThreads, 0, stream>>>(merge);
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
  };
  switch (out_dtype) {
    case FD_DTYPE_F32: launch(float{}); break;
    case FD_DTYPE_F16: launch(__half{}); break;
    case FD_DTYPE_BF16: launch(__nv_bfloat16{}); break;
    default: fail(FD_ERROR_INTERNAL, "CUDA backend: no merge-states kernel for output dtype %s", dtype_name(out_dtype));
  }
  return cudaGetLastError();
}

cudaError_t launch_append_kv(const AppendParams &append, bool programmatic, cudaStream_t stream) {
  const int64_t landing = append.new_len < append.kv_capacity ? append.new_len : append.kv_capacity;
  const int64_t tokens = append.batch * landing;
  const int64_t items =
      static_cast<int64_t>(append.kv_heads) * ((append.head_dim + kAppendElements - 1) / kAppendElements);
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(static_cast<unsigned>((items + kAppendThreads - 1) / kAppendThreads),
                        static_cast<unsigned>(tokens < 65535 ? tokens : 65535));
  config.blockDim = dim3(kAppendThreads);
  config.stream = stream;
  cudaLaunchAttribute attribute;
  if (programmatic) allow_programmatic_launch(config, attribute);
  const auto launch = [&](auto new_type, auto cache_dtype) {
    using NewT = decltype(new_type);
    constexpr int kCache = decltype(cache_dtype)::value;
    return append.vector ? cudaLaunchKernelEx(&config, append_kv_kernel<NewT, kCache, true>, append)
                         : cudaLaunchKernelEx(&config, append_kv_kernel<NewT, kCache, false>, append);
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
  check_contents_kernel<<<1, kCheckThreads, 0, stream>>>(check);
  return cudaGetLastError();
}

cudaError_t launch_decode(SplitVariant variant, fd_dtype q_dtype, fd_dtype kv_dtype, fd_dtype out_dtype,
                          const SplitParams &split, const MergeParams *merge, bool programmatic, cudaStream_t stream) {
  const cudaError_t err =
      row_of(variant).launch(q_dtype, kv_dtype, head_dim_bucket(split.head_dim), split, programmatic, stream);
  if (err != cudaSuccess || merge == nullptr) return err;
  return with_merge_kernel(out_dtype, [&](auto kernel) {
    return launch_merge<typename decltype(kernel)::Out>(*merge, programmatic, stream);
  });
}

}  // namespace cuda
}  // namespace fd
