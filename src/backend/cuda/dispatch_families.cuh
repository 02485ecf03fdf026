// SPDX-License-Identifier: Apache-2.0
// The kernel families and the templates that turn runtime choices into
// their template parameters (dispatch.cu's table rows), shared by the two
// translation units that instantiate kernels: dispatch.cu (16-bit caches,
// merges, the rest) and one for each large family (dispatch_8bit*.cu,
// dispatch_rows*.cu), which compile in parallel. Every switch fails closed
// (FD_ERROR_INTERNAL).
#pragma once

#include <cuda_runtime_api.h>

#include <type_traits>

#include "backend/cuda/kernels/split_8bit_keys.cuh"
#include "backend/cuda/kernels/split_cuda_core.cuh"
#include "backend/cuda/kernels/split_tensor_core.cuh"
#include "backend/cuda/variants.h"
#include "core/dtype.h"
#include "core/error.h"

namespace fd {
namespace cuda {
namespace dispatch {

// A kernel family: a kernel template, the storage types it is built for,
// whether it has a cluster-merge instantiation, the head-dim buckets with
// one for host-planned pieces (has_planned: SplitSchedule,
// prims/schedule.cuh; other buckets walk the host's pieces), whether it is
// built only with the variants' scoring, its largest head-dim bucket
// (larger ones have no kernel: 0 resident CTAs), and the shared memory a
// block must be able to opt into for the family to be used at all.
// T is the storage type of q (and, but for the 8-bit families, of K/V);
// kQuantized families read 8-bit caches of any of the three formats.
struct CudaCoreFamily {
  static constexpr bool kQuantized = false;
  template <class T>
  static constexpr bool kTakes = true;
  static constexpr bool kHasClusters = false;
  static constexpr bool has_planned(int) { return false; }
  static constexpr bool kVariantsOnly = false;
  static constexpr int kMaxBucket = 256;
  static constexpr int kMinSmemOptin = 0;
  static constexpr int kComputeMajor = 0;
  static constexpr bool kFormatKernels = false;
  template <class T, int kBucket, SplitSchedule kSchedule, bool kVariants, int kFormat>
  struct Kernel {
    using Traits = SplitTraits<T, kBucket>;
    static constexpr auto function = split_kernel<T, kBucket, kVariants>;
  };
};

// The tile shapes of MmaTraits. Wide tiles only where a block gets 200+ KiB
// of shared memory (sm_90 and sm_100: 227 KiB), where they were measured;
// their 128 KiB would also fit sm_80's 164 KiB, where nobody has timed them
// against the standard tiles. Compact tiles run paged serving batches with
// per-sequence lengths (policy.cpp), which never take the cluster merge,
// and stop at head_dim 128 (MmaTraits).
template <MmaTiles kTiles>
struct TensorCoreFamily {
  static constexpr bool kQuantized = false;
  template <class T>
  static constexpr bool kTakes = sizeof(T) == 2;
  static constexpr bool kHasClusters = kTiles != MmaTiles::compact;
  static constexpr bool has_planned(int) { return kTiles != MmaTiles::compact; }
  static constexpr bool kVariantsOnly = false;
  static constexpr int kMaxBucket = kTiles == MmaTiles::compact ? 128 : 256;
  static constexpr int kMinSmemOptin = kTiles == MmaTiles::wide ? 200 * 1024 : 0;
  static constexpr int kComputeMajor = 0;
  static constexpr bool kFormatKernels = false;
  template <class T, int kBucket, SplitSchedule kSchedule, bool kVariants, int kFormat>
  struct Kernel {
    using Traits = MmaTraits<T, kBucket, kTiles>;
    static constexpr auto function = mma_split_kernel<T, kBucket, kTiles, kSchedule, kVariants>;
  };
};

// 8-bit caches: the CUDA-core kernel for any q type (one for the three
// formats, read at run time), the tensor cores for 16-bit q (standard
// tiles, no cluster merge, a kernel per format: kFormatKernels). The
// tensor-core families' host-planned kernels are built for head_dim 128
// alone, where their gain is (tests/bench/policy.md, "Kernel variants as
// template parameters"): every planned bucket of the 8-bit families adds
// six kernels (three formats, two q types) to the slowest translation units.
struct CudaCoreQuantizedFamily {
  static constexpr bool kQuantized = true;
  template <class T>
  static constexpr bool kTakes = true;
  static constexpr bool kHasClusters = false;
  static constexpr bool has_planned(int) { return false; }
  static constexpr bool kVariantsOnly = false;
  static constexpr int kMaxBucket = 256;
  static constexpr int kMinSmemOptin = 0;
  static constexpr int kComputeMajor = 0;
  static constexpr bool kFormatKernels = false;
  template <class T, int kBucket, SplitSchedule kSchedule, bool kVariants, int kFormat>
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
  static constexpr bool has_planned(int bucket) { return bucket == 128; }
  static constexpr bool kVariantsOnly = false;
  static constexpr int kMaxBucket = 256;
  static constexpr int kMinSmemOptin = 0;
  static constexpr int kComputeMajor = 0;
  static constexpr bool kFormatKernels = true;
  template <class T, int kBucket, SplitSchedule kSchedule, bool kVariants, int kFormat>
  struct Kernel {
    using Traits = MmaTraits<T, kBucket, MmaTiles::standard, true>;
    static constexpr auto function =
        mma_split_kernel<T, kBucket, MmaTiles::standard, kSchedule, kVariants, true, 1, kFormat>;
  };
};

// 8-bit caches with up to 8 query rows a KV head: the keys on the MMA's M,
// the rows on its N (split_8bit_keys.cuh). No cluster merge; a kernel for
// host-planned pieces at head_dim 128 (above); a kernel per format. Its
// pipeline stages, FD_Q8_KEYS_STAGES, are overridable at build time for
// A/B measurements ("8-bit caches").
#ifndef FD_Q8_KEYS_STAGES
#define FD_Q8_KEYS_STAGES 2
#endif
struct TensorCoreQuantizedKeysFamily {
  static constexpr bool kQuantized = true;
  template <class T>
  static constexpr bool kTakes = sizeof(T) == 2;
  static constexpr bool kHasClusters = false;
  static constexpr bool has_planned(int bucket) { return bucket == 128; }
  static constexpr bool kVariantsOnly = false;
  static constexpr int kMaxBucket = 256;
  static constexpr int kMinSmemOptin = 0;
  static constexpr int kComputeMajor = 0;
  static constexpr bool kFormatKernels = true;
  template <class T, int kBucket, SplitSchedule kSchedule, bool kVariants, int kFormat>
  struct Kernel {
    using Traits = KeysTraits<T, kBucket, FD_Q8_KEYS_STAGES>;
    static constexpr auto function = mma_keys_split_kernel<T, kBucket, kSchedule, kVariants, kFormat, Traits>;
  };
};

// Query rows past 16 a KV head (several query tokens x the GQA group, which
// only the variants' scoring has) on kMTiles m-tiles in one CTA (MmaTraits'
// MTiles), 16-bit K/V up to head_dim 128: two m-tiles for up to 32 rows,
// four (a warp per m-tile over whole tiles) above (tests/bench/policy.md,
// "Rows kernels").
// Whether the build's architectures include sm_90a (src/CMakeLists.txt):
// only then does an sm_90 device run the wide 64-row kernel on wgmma.
#ifndef FD_SM90A_BUILD
#define FD_SM90A_BUILD 0
#endif
template <int kMTiles, int kWholeTileGroups = 1>
struct TensorCoreRowsFamily {
  static constexpr bool kQuantized = false;
  template <class T>
  static constexpr bool kTakes = sizeof(T) == 2;
  static constexpr bool kHasClusters = false;
  static constexpr bool has_planned(int) { return false; }
  static constexpr bool kVariantsOnly = true;
  static constexpr int kMaxBucket = 128;
  // Two token groups: 192 KiB of stages, one CTA a multiprocessor, on sm_90
  // with sm_90a code only, where it runs on wgmma (its mma.sync form has
  // never been measured; tests/bench/policy.md, "Rows kernels").
  static constexpr int kMinSmemOptin = kWholeTileGroups > 1 ? 200 * 1024 : 0;
  static constexpr int kComputeMajor = kWholeTileGroups > 1 ? (FD_SM90A_BUILD ? 9 : -1) : 0;
  static constexpr bool kFormatKernels = false;
  template <class T, int kBucket, SplitSchedule kSchedule, bool kVariants, int kFormat>
  struct Kernel {
    using Traits = MmaTraits<T, kBucket, MmaTiles::standard, false, kMTiles, kWholeTileGroups>;
    static constexpr auto function = mma_split_kernel<T, kBucket, MmaTiles::standard, SplitSchedule::walked, true,
                                                      false, kMTiles, 0, kWholeTileGroups>;
  };
};

// The 64-row kernel in two token groups (tensor_core_rows64_wide).
using TensorCoreRows64WideFamily = TensorCoreRowsFamily<4, 2>;

// Whether the family has a kernel for (bucket, schedule): the planned
// schedule only in its has_planned buckets.
template <class Family, int kBucket, SplitSchedule kSchedule>
constexpr bool has_kernel = kBucket <= Family::kMaxBucket &&
                            (kSchedule != SplitSchedule::planned || Family::has_planned(kBucket));

template <class Family>
constexpr bool has_any_planned = Family::has_planned(64) || Family::has_planned(128) || Family::has_planned(256);

template <class Family, class T, int kFormat, SplitSchedule kSchedule, bool kVariants, class Body>
auto with_bucket(int bucket, Body &&body) {
  switch (bucket) {
    case 64:
      if constexpr (has_kernel<Family, 64, kSchedule>)
        return body(typename Family::template Kernel<T, 64, kSchedule, kVariants, kFormat>{});
      break;
    case 128:
      if constexpr (has_kernel<Family, 128, kSchedule>)
        return body(typename Family::template Kernel<T, 128, kSchedule, kVariants, kFormat>{});
      break;
    case 256:
      if constexpr (has_kernel<Family, 256, kSchedule>)
        return body(typename Family::template Kernel<T, 256, kSchedule, kVariants, kFormat>{});
      break;
    default: break;
  }
  fail(FD_ERROR_INTERNAL, "CUDA backend: no split kernel for head-dim bucket %d", bucket);
}

// Kernels with the variants' scoring walk their pieces (policy.cpp chooses
// no cluster merge for them, and their host-planned calls run the walked
// kernel): instantiations fewer per bucket.
template <class Family, class T, int kFormat, class Body>
auto with_schedule(int bucket, SplitSchedule schedule, bool variants, Body &&body) {
  if constexpr (Family::kHasClusters) {
    if (schedule == SplitSchedule::cluster && !variants)
      return with_bucket<Family, T, kFormat, SplitSchedule::cluster, false>(bucket, body);
  }
  if constexpr (has_any_planned<Family>) {
    if (schedule == SplitSchedule::planned && !variants)
      return with_bucket<Family, T, kFormat, SplitSchedule::planned, false>(bucket, body);
  }
  if (schedule == SplitSchedule::cluster)
    fail(FD_ERROR_INTERNAL, "CUDA backend: this split kernel has no cluster merge");
  if (schedule != SplitSchedule::walked) {
    fail(FD_ERROR_INTERNAL, "CUDA backend: this split kernel has no kernel for host-planned pieces");
  }
  if constexpr (Family::kVariantsOnly) {
    if (!variants) fail(FD_ERROR_INTERNAL, "CUDA backend: this split kernel has only the variants' scoring");
    return with_bucket<Family, T, kFormat, SplitSchedule::walked, true>(bucket, body);
  } else {
    if (variants) return with_bucket<Family, T, kFormat, SplitSchedule::walked, true>(bucket, body);
    return with_bucket<Family, T, kFormat, SplitSchedule::walked, false>(bucket, body);
  }
}

// The kernel a launch of the family runs: the cluster schedule for the
// cluster merge, the planned one for the host's pieces where the family
// has it for the bucket (not with the variants' scoring), else the walked
// one, which walks the same pieces.
template <class Family>
SplitSchedule schedule_of(const SplitParams &split, int bucket) {
  if (split.cluster_merge) return SplitSchedule::cluster;
  if (Family::has_planned(bucket) && !split.variant_scores && host_planned(split)) return SplitSchedule::planned;
  return SplitSchedule::walked;
}

// Calls body(Family::Kernel<T, bucket, schedule, variants, kFormat>{}) for
// the storage type T of q_dtype.
template <class Family, int kFormat, class Body>
auto with_query(fd_dtype q_dtype, int bucket, SplitSchedule schedule, bool variants, Body &&body) {
  switch (q_dtype) {
    case FD_DTYPE_F32:
      if constexpr (Family::template kTakes<StorageOf<FD_DTYPE_F32>::type>) {
        return with_schedule<Family, StorageOf<FD_DTYPE_F32>::type, kFormat>(bucket, schedule, variants, body);
      }
      break;
    case FD_DTYPE_F16:
      if constexpr (Family::template kTakes<StorageOf<FD_DTYPE_F16>::type>) {
        return with_schedule<Family, StorageOf<FD_DTYPE_F16>::type, kFormat>(bucket, schedule, variants, body);
      }
      break;
    case FD_DTYPE_BF16:
      if constexpr (Family::template kTakes<StorageOf<FD_DTYPE_BF16>::type>) {
        return with_schedule<Family, StorageOf<FD_DTYPE_BF16>::type, kFormat>(bucket, schedule, variants, body);
      }
      break;
    default: break;
  }
  fail(FD_ERROR_INTERNAL, "CUDA backend: no split kernel for q dtype %d", static_cast<int>(q_dtype));
}

// Calls body(Family::Kernel<T, bucket, schedule, variants, kFormat>{}) for the
// storage type T of q_dtype, K/V being kv_dtype: q's type, or 8-bit for the
// quantized families, whose kFormatKernels ones have a kernel per format
// (kFormat the 8-bit fd_dtype; 0 elsewhere: the format is read at run time).
template <class Family, class Body>
auto with_kernel(fd_dtype q_dtype, fd_dtype kv_dtype, int bucket, SplitSchedule schedule, bool variants, Body &&body) {
  if (is_quantized_dtype(kv_dtype) != Family::kQuantized || (!Family::kQuantized && q_dtype != kv_dtype)) {
    fail(FD_ERROR_INTERNAL, "CUDA backend: no split kernel of this family for %s K/V with %s q", dtype_name(kv_dtype),
         dtype_name(q_dtype));
  }
  if constexpr (Family::kFormatKernels) {
    switch (kv_dtype) {
      case FD_DTYPE_E4M3: return with_query<Family, FD_DTYPE_E4M3>(q_dtype, bucket, schedule, variants, body);
      case FD_DTYPE_E5M2: return with_query<Family, FD_DTYPE_E5M2>(q_dtype, bucket, schedule, variants, body);
      case FD_DTYPE_I8: return with_query<Family, FD_DTYPE_I8>(q_dtype, bucket, schedule, variants, body);
      default: break;
    }
    fail(FD_ERROR_INTERNAL, "CUDA backend: no split kernel for the 8-bit format %d", static_cast<int>(kv_dtype));
  } else {
    return with_query<Family, 0>(q_dtype, bucket, schedule, variants, body);
  }
}

// The q dtype whose kernel stands for a K/V dtype's in the tables (shape,
// occupancy): q's own, or for 8-bit caches f16 (every q type's kernel of
// these families has the same shape).
inline fd_dtype representative_q(fd_dtype kv_dtype) { return is_quantized_dtype(kv_dtype) ? FD_DTYPE_F16 : kv_dtype; }

inline constexpr fd_dtype kStorageDtypes[] = {FD_DTYPE_F32, FD_DTYPE_F16, FD_DTYPE_BF16};

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
inline void allow_programmatic_launch(cudaLaunchConfig_t &config, cudaLaunchAttribute &attribute) {
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  config.attrs = &attribute;
  config.numAttrs = 1;
}

// Whether a kernel's loaded image was compiled for sm_90 or later: its
// griddepcontrol and cluster code exist. An older PTX JIT-compiled for this
// device reports the device's binaryVersion but its own ptxVersion.
inline bool built_for_sm90(const cudaFuncAttributes &attributes) {
  return attributes.ptxVersion >= 90 && attributes.binaryVersion >= 90;
}

// Clusters of `size` CTAs along x (the cluster merge: a unit's splits).
inline cudaLaunchAttribute cluster_attribute(int size) {
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
  if (split.balanced_workers > 0) {
    config.gridDim = dim3(static_cast<unsigned>(split.balanced_workers));
  } else if (split.fitted_ctas > 0) {
    config.gridDim = dim3(static_cast<unsigned>(split.fitted_ctas));
  } else {
    config.gridDim = dim3(static_cast<unsigned>(ctas_per_sequence),
                          static_cast<unsigned>(split.batch < 65535 ? split.batch : 65535));
  }
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
  int compute_major = 0;  // compute capability
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
  shape.usable_smem_bytes = Traits::kSmemBytes - Traits::kSmemSlack;
  return shape;
}

template <class Family>
SplitKernelShape family_shape(fd_dtype dtype, int bucket) {
  return with_kernel<Family>(representative_q(dtype), dtype, bucket, SplitSchedule::walked, Family::kVariantsOnly,
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
  if (bucket > Family::kMaxBucket) return cudaSuccess;
  if (Family::kComputeMajor != 0 && device.compute_major != Family::kComputeMajor) return cudaSuccess;
  if (Family::kMinSmemOptin > 0 && (device.smem_optin < Family::kMinSmemOptin ||
                                    family_shape<Family>(dtype, bucket).smem_bytes > device.smem_optin)) {
    return cudaSuccess;
  }
  const fd_dtype q_dtype = representative_q(dtype);
  const bool planned_variants = Family::kVariantsOnly;  // the kernel whose occupancy plans are made with
  cudaError_t err = with_kernel<Family>(q_dtype, dtype, bucket, SplitSchedule::walked, planned_variants,
                                        [&](auto kernel) { return prepare<decltype(kernel)>(ctas); });
  // The variants' kernel has the plain one's shape, and so do the other q
  // types' kernels of an 8-bit family and its other formats' (which share
  // the table slot of dtype): their occupancy is not planned with (plain
  // plans stay as they were), only their attributes set.
  int other_ctas = 0;
  const fd_dtype formats[] = {FD_DTYPE_E4M3, FD_DTYPE_E5M2, FD_DTYPE_I8};
  const bool per_format = Family::kFormatKernels && is_quantized_dtype(dtype);
  const fd_dtype *const kv_dtypes = per_format ? formats : &dtype;
  for (int f = 0; f < (per_format ? 3 : 1); ++f) {
    const fd_dtype kv = kv_dtypes[f];
    for (fd_dtype q : kStorageDtypes) {
      if (!family_takes_q<Family>(q, kv)) continue;
      for (int variants = Family::kVariantsOnly ? 1 : 0; variants < 2 && err == cudaSuccess; ++variants) {
        if (kv == dtype && q == q_dtype && (variants == 1) == planned_variants) continue;
        err = with_kernel<Family>(q, kv, bucket, SplitSchedule::walked, variants == 1,
                                  [&](auto kernel) { return prepare<decltype(kernel)>(other_ctas); });
      }
      // The host-planned kernel has the walked one's shape and launch bounds.
      if (Family::has_planned(bucket) && err == cudaSuccess) {
        err = with_kernel<Family>(q, kv, bucket, SplitSchedule::planned, false,
                                  [&](auto kernel) { return prepare<decltype(kernel)>(other_ctas); });
      }
    }
  }
  if (err == cudaSuccess && Family::kHasClusters && device.cluster_launch) {
    err = with_kernel<Family>(q_dtype, dtype, bucket, SplitSchedule::cluster, false,
                              [&](auto kernel) { return prepare_clusters<decltype(kernel)>(clusters); });
  }
  return err;
}

template <class Family>
cudaError_t launch_family(fd_dtype q_dtype, fd_dtype kv_dtype, int bucket, const SplitParams &split, bool programmatic,
                          cudaStream_t stream) {
  // Kernels without the variants' scoring read no q_lens (sequence_q_len).
  if (split.q_lens != nullptr && !split.variant_scores)
    fail(FD_ERROR_INTERNAL, "CUDA backend: ragged query lengths need the variants' scoring");
  return with_kernel<Family>(q_dtype, kv_dtype, bucket, schedule_of<Family>(split, bucket), split.variant_scores,
                             [&](auto kernel) { return launch_split<decltype(kernel)>(split, programmatic, stream); });
}

// A family's row functions, for a translation unit that instantiates them
// (kind `template`: dispatch_8bit*.cu, dispatch_rows*.cu, which compile in
// parallel with dispatch.cu) and for dispatch.cu, which declares them
// (kind `extern template`) and puts them in its table.
#define FD_FAMILY_FUNCTIONS(kind, Family)                                                                             \
  kind bool family_takes<Family>(fd_dtype);                                                                           \
  kind SplitKernelShape family_shape<Family>(fd_dtype, int);                                                          \
  kind cudaError_t prepare_family<Family>(fd_dtype, int, const DeviceLimits &, int &, int(&)[kMaxClusterSplits + 1]); \
  kind cudaError_t launch_family<Family>(fd_dtype, fd_dtype, int, const SplitParams &, bool, cudaStream_t);

// A variant: its names per head-dim bucket, and its family's functions.
struct SplitVariantRow {
  SplitVariant variant;
  const char *names[kBucketCount];
  bool variant_scores_only;  // Family::kVariantsOnly
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
          Family::kVariantsOnly,
          family_takes<Family>,
          family_shape<Family>,
          prepare_family<Family>,
          launch_family<Family>};
}

}  // namespace dispatch
}  // namespace cuda
}  // namespace fd
