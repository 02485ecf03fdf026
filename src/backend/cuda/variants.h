// SPDX-License-Identifier: Apache-2.0
// The split-kernel variants of the CUDA backend by name, and the checked
// mappings from runtime values (dtype, head dim) to the slots of the tables
// that describe them. Host code only, no CUDA types: policy.cpp reads this.
//
// Adding a variant: a value here, a row in dispatch.cu's kSplitVariants
// (name, and a family of dispatch_families.cuh: traits, launch), its kernel
// under kernels/, and the policy rule that picks it (policy.cpp). Nothing
// else indexes variants.
#pragma once

#include <cstdint>

#include "backend/cuda/params.h"
#include "flashdecode.h"

namespace fd {
namespace cuda {

enum class SplitVariant : uint8_t {
  cuda_core,                // any dtype, any alignment: the fallback that runs every problem
  tensor_core,              // 16-bit K/V and out, 16-byte aligned rows, standard tiles
  tensor_core_wide,         // the same with wide tiles (GPUs with 200+ KiB of shared memory a block)
  cuda_core_8bit,           // 8-bit K/V (e4m3, e5m2, i8) with any q: the fallback for them
  tensor_core_8bit,         // 8-bit K/V, 16-bit q and out, 16-byte aligned rows, dequantized into 16-bit tiles
  tensor_core_rows,         // tensor_core's inputs with 17-32 query rows a KV head (variants' scoring), in one CTA
  tensor_core_rows64,       // the same with over 32 rows, up to 64 a CTA
  tensor_core_compact,      // tensor_core's inputs up to head_dim 128 in compact tiles: paged serving batches
  tensor_core_8bit_keys,    // tensor_core_8bit's inputs with up to 8 query rows a KV head, keys on the MMA's M
  tensor_core_rows64_wide,  // tensor_core_rows64's inputs on sm_90: two warpgroups on a tile's halves, 192 KiB stages
};
constexpr int kSplitVariantCount = 10;

// The variant at a table index (Plan::variant), failing closed
// (FD_ERROR_INTERNAL) on an index no variant has.
SplitVariant split_variant_at(int index);
inline int index_of(SplitVariant variant) { return static_cast<int>(variant); }

// Storage dtypes the kernels are built for, as table slots: a dtype without
// a slot fails closed (FD_ERROR_INTERNAL) wherever a table is indexed.
constexpr int kDtypeSlotCount = 4;  // f32, f16, bf16, and the 8-bit caches (one slot)
int dtype_slot(const fd_dtype &dtype);

// Head dims are rounded up to a bucket that fixes a kernel's row width.
constexpr int kBucketCount = 3;
constexpr int kBuckets[kBucketCount] = {64, 128, 256};
int head_dim_bucket(int64_t head_dim);  // 64, 128 or 256; head_dim must be supported
int bucket_slot(int bucket);

// What the host needs to know about one instantiation of a split kernel.
struct SplitKernelShape {
  int head_dim_bucket = 0;  // 64, 128 or 256: head_dim rounded up
  int threads = 0;
  int rows = 0;               // head slots (x token groups for the CUDA-core kernel) of a CTA
  int tile_tokens = 0;        // tokens per pipeline stage
  int stages = 0;             // tiles in flight
  int smem_bytes = 0;         // launched with
  int usable_smem_bytes = 0;  // of those, what its work areas may use (the rest aligns them)
};

// The variant's table entries (dispatch.cu): its name for fd_plan_info::kernel
// (a static string), whether it has kernels for a K/V storage dtype, whether
// it is built only with the variants' scoring (SplitParams::variant_scores
// must then be set), and the shape of its kernel for a dtype it takes (else
// FD_ERROR_INTERNAL).
const char *split_variant_name(SplitVariant variant, int head_dim_bucket);
bool split_variant_takes(SplitVariant variant, fd_dtype kv_dtype);
bool split_variant_scores_only(SplitVariant variant);
SplitKernelShape split_kernel_shape(SplitVariant variant, fd_dtype kv_dtype, int64_t head_dim);

// Resident CTAs a multiprocessor of the current device holds, per variant,
// dtype slot and bucket slot (0: the variant cannot run there), and clusters
// of n CTAs (2..kMaxClusterSplits) held at once (0: no cluster launch).
class KernelOccupancy {
 public:
  int ctas(SplitVariant variant, fd_dtype dtype, int head_dim_bucket) const;
  int clusters(SplitVariant variant, fd_dtype dtype, int head_dim_bucket, int splits) const;

  // For prepare_kernels, by table slot (dtype_slot, bucket_slot).
  int &ctas_at(SplitVariant variant, int dtype_slot, int bucket_slot);
  int (&clusters_at(SplitVariant variant, int dtype_slot, int bucket_slot))[kMaxClusterSplits + 1];

 private:
  struct PerVariant {
    int ctas[kDtypeSlotCount][kBucketCount] = {};
    int clusters[kDtypeSlotCount][kBucketCount][kMaxClusterSplits + 1] = {};
  };
  PerVariant variants_[kSplitVariantCount];
};

}  // namespace cuda
}  // namespace fd
