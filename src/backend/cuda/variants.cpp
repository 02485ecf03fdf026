// SPDX-License-Identifier: Apache-2.0
#include "backend/cuda/variants.h"

#include "core/error.h"

namespace fd {
namespace cuda {

int dtype_slot(const fd_dtype &dtype) {
  switch (raw_enum_value(dtype)) {
    case FD_DTYPE_F32: return 0;
    case FD_DTYPE_F16: return 1;
    case FD_DTYPE_BF16: return 2;
    case FD_DTYPE_E4M3:
    case FD_DTYPE_E5M2:
    case FD_DTYPE_I8: return 3;
    default: break;
  }
  fail(FD_ERROR_INTERNAL, "CUDA backend: no kernel table slot for dtype %d", raw_enum_value(dtype));
}

int head_dim_bucket(int64_t head_dim) {
  for (int bucket : kBuckets) {
    if (head_dim >= 1 && head_dim <= bucket) return bucket;
  }
  fail(FD_ERROR_INTERNAL, "CUDA backend: no kernel for head_dim %lld", static_cast<long long>(head_dim));
}

int bucket_slot(int bucket) {
  for (int slot = 0; slot < kBucketCount; ++slot) {
    if (kBuckets[slot] == bucket) return slot;
  }
  fail(FD_ERROR_INTERNAL, "CUDA backend: no kernel table slot for head-dim bucket %d", bucket);
}

namespace {
int checked_variant(SplitVariant variant) {
  const int index = index_of(variant);
  if (index < 0 || index >= kSplitVariantCount) fail(FD_ERROR_INTERNAL, "CUDA backend: no split variant %d", index);
  return index;
}

void check_slots(int dtype, int bucket) {
  if (dtype < 0 || dtype >= kDtypeSlotCount || bucket < 0 || bucket >= kBucketCount) {
    fail(FD_ERROR_INTERNAL, "CUDA backend: no kernel table slot [%d][%d]", dtype, bucket);
  }
}
}  // namespace

int &KernelOccupancy::ctas_at(SplitVariant variant, int dtype, int bucket) {
  check_slots(dtype, bucket);
  return variants_[checked_variant(variant)].ctas[dtype][bucket];
}

int (&KernelOccupancy::clusters_at(SplitVariant variant, int dtype, int bucket))[kMaxClusterSplits + 1] {
  check_slots(dtype, bucket);
  return variants_[checked_variant(variant)].clusters[dtype][bucket];
}

int KernelOccupancy::ctas(SplitVariant variant, fd_dtype dtype, int head_dim_bucket) const {
  return variants_[checked_variant(variant)].ctas[dtype_slot(dtype)][bucket_slot(head_dim_bucket)];
}

int KernelOccupancy::clusters(SplitVariant variant, fd_dtype dtype, int head_dim_bucket, int splits) const {
  if (splits < 0 || splits > kMaxClusterSplits) return 0;
  return variants_[checked_variant(variant)].clusters[dtype_slot(dtype)][bucket_slot(head_dim_bucket)][splits];
}

}  // namespace cuda
}  // namespace fd
