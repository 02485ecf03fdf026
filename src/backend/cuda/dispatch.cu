// The one place where runtime choices become template parameters: the
// storage dtype, the head-dim bucket and the tile shape pick the split
// kernel, the output dtype picks the merge kernel. Every kernel
// instantiation of the library is here: 3 dtypes x 3 buckets CUDA-core split
// kernels, 2 dtypes x 3 buckets x 2 tile shapes x 2 merges (fused or
// through the workspace; in clusters) tensor-core split kernels and 3 merge
// kernels.
#include "backend/cuda/launch.h"
#include "backend/cuda/merge_kernel.cuh"
#include "backend/cuda/mma_kernel.cuh"
#include "backend/cuda/split_kernel.cuh"

namespace fd {
namespace cuda {
namespace {

// A split kernel as a value: its traits and its function.
template <class T, int kBucket>
struct SplitKernel {
  using Traits = SplitTraits<T, kBucket>;
  static constexpr auto function = split_kernel<T, kBucket>;
};

// A tensor-core split kernel as a value.
template <class T, int kBucket, bool kWide, bool kCluster>
struct MmaKernel {
  using Traits = MmaTraits<kBucket, kWide>;
  static constexpr auto function = mma_split_kernel<T, kBucket, kWide, kCluster>;
};

int head_dim_bucket(int64_t head_dim) { return head_dim <= 64 ? 64 : head_dim <= 128 ? 128 : 256; }

template <class T, class Body>
auto with_bucket(int bucket, Body &&body) {
  switch (bucket) {
    case 64: return body(SplitKernel<T, 64>{});
    case 128: return body(SplitKernel<T, 128>{});
    default: return body(SplitKernel<T, 256>{});
  }
}

// Calls body(SplitKernel<T, bucket>{}) for the storage type of dtype.
template <class Body>
auto with_split_kernel(fd_dtype dtype, int bucket, Body &&body) {
  switch (dtype) {
    case FD_DTYPE_F16: return with_bucket<StorageOf<FD_DTYPE_F16>::type>(bucket, body);
    case FD_DTYPE_BF16: return with_bucket<StorageOf<FD_DTYPE_BF16>::type>(bucket, body);
    default: return with_bucket<StorageOf<FD_DTYPE_F32>::type>(bucket, body);
  }
}

template <class T, int kBucket, class Body>
auto with_mma_tiles(bool wide, bool cluster, Body &&body) {
  if (wide) return cluster ? body(MmaKernel<T, kBucket, true, true>{}) : body(MmaKernel<T, kBucket, true, false>{});
  return cluster ? body(MmaKernel<T, kBucket, false, true>{}) : body(MmaKernel<T, kBucket, false, false>{});
}

template <class T, class Body>
auto with_mma_bucket(int bucket, bool wide, bool cluster, Body &&body) {
  switch (bucket) {
    case 64: return with_mma_tiles<T, 64>(wide, cluster, body);
    case 128: return with_mma_tiles<T, 128>(wide, cluster, body);
    default: return with_mma_tiles<T, 256>(wide, cluster, body);
  }
}

// Calls body(MmaKernel<T, bucket, wide, cluster>{}) for the storage type of
// dtype (f16 or bf16).
template <class Body>
auto with_mma_kernel(fd_dtype dtype, int bucket, bool wide, bool cluster, Body &&body) {
  if (dtype == FD_DTYPE_BF16) return with_mma_bucket<StorageOf<FD_DTYPE_BF16>::type>(bucket, wide, cluster, body);
  return with_mma_bucket<StorageOf<FD_DTYPE_F16>::type>(bucket, wide, cluster, body);
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
  config.gridDim = dim3(static_cast<unsigned>(ctas_per_sequence),
                        static_cast<unsigned>(split.batch < 65535 ? split.batch : 65535));
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
  return cudaLaunchKernelEx(&config, merge_kernel<OutT>, p);
}

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

constexpr fd_dtype kDtypes[3] = {FD_DTYPE_F32, FD_DTYPE_F16, FD_DTYPE_BF16};
constexpr int kWideTilesMinSmemOptin = 200 * 1024;
constexpr int kBuckets[3] = {64, 128, 256};

}  // namespace

int bucket_index(int head_dim_bucket) { return head_dim_bucket == 64 ? 0 : head_dim_bucket == 128 ? 1 : 2; }

SplitKernelShape split_kernel_shape(fd_dtype dtype, int64_t head_dim) {
  return with_split_kernel(dtype, head_dim_bucket(head_dim),
                           [](auto kernel) { return shape_of<typename decltype(kernel)::Traits>(); });
}

SplitKernelShape mma_kernel_shape(int64_t head_dim, bool wide) {
  return with_mma_kernel(FD_DTYPE_F16, head_dim_bucket(head_dim), wide, false,
                         [](auto kernel) { return shape_of<typename decltype(kernel)::Traits>(); });
}

cudaError_t prepare_kernels(KernelOccupancy *occupancy) {
  // Touching every kernel here also loads it now: with lazy loading, a first
  // load inside fd_decode could synchronise the context or land in a graph
  // capture.
  cudaFuncAttributes attributes;
  cudaError_t merge_err = cudaFuncGetAttributes(&attributes, merge_kernel<float>);
  if (merge_err == cudaSuccess) merge_err = cudaFuncGetAttributes(&attributes, merge_kernel<__half>);
  if (merge_err == cudaSuccess) merge_err = cudaFuncGetAttributes(&attributes, merge_kernel<__nv_bfloat16>);
  if (merge_err != cudaSuccess) return merge_err;
  int device = 0, smem_optin = 0, cluster_launch = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
  if (err != cudaSuccess) return err;
  if (cudaDeviceGetAttribute(&cluster_launch, cudaDevAttrClusterLaunch, device) != cudaSuccess) {
    cudaGetLastError();  // no cluster merge (prepare_clusters), not a failed handle
    cluster_launch = 0;
  }
  *occupancy = KernelOccupancy{};
  for (int d = 0; d < 3; ++d) {
    for (int b = 0; b < 3; ++b) {
      err = with_split_kernel(kDtypes[d], kBuckets[b],
                              [&](auto kernel) { return prepare<decltype(kernel)>(occupancy->cuda_core[d][b]); });
      if (err == cudaSuccess && d > 0) {
        err = with_mma_kernel(kDtypes[d], kBuckets[b], false, false,
                              [&](auto kernel) { return prepare<decltype(kernel)>(occupancy->mma[d - 1][b]); });
      }
      if (err == cudaSuccess && d > 0 && cluster_launch) {
        err = with_mma_kernel(kDtypes[d], kBuckets[b], false, true, [&](auto kernel) {
          return prepare_clusters<decltype(kernel)>(occupancy->mma_clusters[d - 1][b]);
        });
      }
      // Wide tiles on GPUs that give a block 200+ KiB of shared memory
      // (sm_90 and sm_100: 227 KiB), where they were measured; 0 = none.
      // Their 128 KiB would also fit sm_80's 164 KiB, where nobody has
      // timed them against the standard tiles.
      if (err == cudaSuccess && d > 0 && smem_optin >= kWideTilesMinSmemOptin &&
          mma_kernel_shape(kBuckets[b], true).smem_bytes <= smem_optin) {
        err = with_mma_kernel(kDtypes[d], kBuckets[b], true, false,
                              [&](auto kernel) { return prepare<decltype(kernel)>(occupancy->wide[d - 1][b]); });
        if (err == cudaSuccess && cluster_launch) {
          err = with_mma_kernel(kDtypes[d], kBuckets[b], true, true, [&](auto kernel) {
            return prepare_clusters<decltype(kernel)>(occupancy->wide_clusters[d - 1][b]);
          });
        }
      }
      if (err != cudaSuccess) return err;
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
  const void *kernels[3] = {reinterpret_cast<const void *>(merge_kernel<float>),
                            reinterpret_cast<const void *>(merge_kernel<__half>),
                            reinterpret_cast<const void *>(merge_kernel<__nv_bfloat16>)};
  for (const void *kernel : kernels) {
    cudaFuncAttributes attributes;
    err = cudaFuncGetAttributes(&attributes, kernel);
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

cudaError_t launch_decode(fd_dtype dtype, fd_dtype out_dtype, const SplitParams &split, const MergeParams *merge,
                          SplitKernelChoice kernel, bool programmatic, cudaStream_t stream) {
  const int bucket = head_dim_bucket(split.head_dim);
  cudaError_t err =
      kernel.mma && dtype != FD_DTYPE_F32
          ? with_mma_kernel(dtype, bucket, kernel.wide, split.cluster_merge,
                            [&](auto chosen) { return launch_split<decltype(chosen)>(split, programmatic, stream); })
          : with_split_kernel(dtype, bucket,
                              [&](auto chosen) { return launch_split<decltype(chosen)>(split, programmatic, stream); });
  if (err != cudaSuccess || merge == nullptr) return err;
  switch (out_dtype) {
    case FD_DTYPE_F16: return launch_merge<StorageOf<FD_DTYPE_F16>::type>(*merge, programmatic, stream);
    case FD_DTYPE_BF16: return launch_merge<StorageOf<FD_DTYPE_BF16>::type>(*merge, programmatic, stream);
    default: return launch_merge<float>(*merge, programmatic, stream);
  }
}

}  // namespace cuda
}  // namespace fd
