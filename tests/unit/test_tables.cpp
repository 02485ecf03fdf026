// SPDX-License-Identifier: Apache-2.0
// Every runtime-to-table mapping fails closed: a dtype, head-dim bucket or
// kernel variant that no table has gets FD_ERROR_INTERNAL, never a default
// (src/core/dtype.cpp, src/backend/cuda/variants.cpp; both internal, so this
// test compiles them in). Host code only: the CUDA variant tables are plain
// C++ and run here without a GPU.
// The library's headers first: cmocka.h defines a fail() macro.
#include "backend/cuda/variants.h"
#include "core/dtype.h"
#include "core/error.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cstring>

extern "C" {  // this cmocka.h has no C++ guards
#include <cmocka.h>
}

namespace {

// An fd_dtype value no version of the header has, as a C caller may store
// it. Only ever bound to references: loading it as an fd_dtype would be
// undefined behaviour (UBSan says so), which is why the library reads
// dtypes through raw_enum_value.
const fd_dtype &unknown_dtype() {
  static fd_dtype stored;
  const int raw = 1000;
  std::memcpy(&stored, &raw, sizeof stored);
  return stored;
}

template <class Body>
fd_status status_of(Body &&body) {
  try {
    body();
  } catch (const fd::Error &error) {
    return error.status();
  }
  return FD_SUCCESS;
}

void test_dtype_sizes(void **) {
  assert_int_equal(fd::dtype_bytes(FD_DTYPE_F32), 4);
  assert_int_equal(fd::dtype_bytes(FD_DTYPE_F16), 2);
  assert_int_equal(fd::dtype_bytes(FD_DTYPE_BF16), 2);
  assert_int_equal(fd::dtype_bytes(FD_DTYPE_I32), 4);
  assert_true(fd::is_known_dtype(FD_DTYPE_BF16));
  assert_false(fd::is_known_dtype(unknown_dtype()));
  assert_string_equal(fd::dtype_name(unknown_dtype()), "unknown");
  assert_int_equal(status_of([] { fd::dtype_bytes(unknown_dtype()); }), FD_ERROR_INTERNAL);
}

void test_kernel_table_slots(void **) {
  assert_int_equal(fd::cuda::dtype_slot(FD_DTYPE_F32), 0);
  assert_int_equal(fd::cuda::dtype_slot(FD_DTYPE_F16), 1);
  assert_int_equal(fd::cuda::dtype_slot(FD_DTYPE_BF16), 2);
  assert_int_equal(status_of([] { fd::cuda::dtype_slot(FD_DTYPE_I32); }), FD_ERROR_INTERNAL);
  assert_int_equal(status_of([] { fd::cuda::dtype_slot(unknown_dtype()); }), FD_ERROR_INTERNAL);

  assert_int_equal(fd::cuda::head_dim_bucket(16), 64);
  assert_int_equal(fd::cuda::head_dim_bucket(64), 64);
  assert_int_equal(fd::cuda::head_dim_bucket(72), 128);
  assert_int_equal(fd::cuda::head_dim_bucket(256), 256);
  assert_int_equal(status_of([] { fd::cuda::head_dim_bucket(264); }), FD_ERROR_INTERNAL);
  assert_int_equal(status_of([] { fd::cuda::head_dim_bucket(0); }), FD_ERROR_INTERNAL);
  assert_int_equal(fd::cuda::bucket_slot(128), 1);
  assert_int_equal(status_of([] { fd::cuda::bucket_slot(96); }), FD_ERROR_INTERNAL);
}

void test_occupancy_table(void **) {
  fd::cuda::KernelOccupancy occupancy;
  const fd::cuda::SplitVariant wide = fd::cuda::SplitVariant::tensor_core_wide;
  occupancy.ctas_at(wide, fd::cuda::dtype_slot(FD_DTYPE_BF16), fd::cuda::bucket_slot(256)) = 1;
  occupancy.clusters_at(wide, fd::cuda::dtype_slot(FD_DTYPE_BF16), fd::cuda::bucket_slot(256))[4] = 33;
  const fd::cuda::KernelOccupancy &read = occupancy;
  assert_int_equal(read.ctas(wide, FD_DTYPE_BF16, 256), 1);
  assert_int_equal(read.ctas(wide, FD_DTYPE_F16, 256), 0);  // every other slot stays 0: not available
  assert_int_equal(read.ctas(fd::cuda::SplitVariant::tensor_core, FD_DTYPE_BF16, 256), 0);
  assert_int_equal(read.clusters(wide, FD_DTYPE_BF16, 256, 4), 33);
  assert_int_equal(read.clusters(wide, FD_DTYPE_BF16, 256, fd::cuda::kMaxClusterSplits + 1), 0);

  const auto no_variant = static_cast<fd::cuda::SplitVariant>(fd::cuda::kSplitVariantCount);
  assert_int_equal(status_of([&] { read.ctas(no_variant, FD_DTYPE_F16, 128); }), FD_ERROR_INTERNAL);
  assert_int_equal(status_of([&] { read.ctas(wide, FD_DTYPE_I32, 128); }), FD_ERROR_INTERNAL);
  assert_int_equal(status_of([&] { read.ctas(wide, FD_DTYPE_F16, 96); }), FD_ERROR_INTERNAL);
  assert_int_equal(status_of([&] { occupancy.ctas_at(wide, fd::cuda::kDtypeSlotCount, 0); }), FD_ERROR_INTERNAL);
  assert_int_equal(status_of([&] { occupancy.clusters_at(wide, 0, -1); }), FD_ERROR_INTERNAL);
}

}  // namespace

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_dtype_sizes),
      cmocka_unit_test(test_kernel_table_slots),
      cmocka_unit_test(test_occupancy_table),
  };
  return cmocka_run_group_tests(tests, nullptr, nullptr);
}
