// SPDX-License-Identifier: Apache-2.0
// Every runtime-to-table mapping fails closed: a dtype, head-dim bucket or
// kernel variant that no table has gets FD_ERROR_INTERNAL, never a default
// (src/core/dtype.cpp, src/backend/cuda/variants.cpp; both internal, so this
// test compiles them in). Host code only: the CUDA variant tables are plain
// C++ and run here without a GPU.
// The library's headers first: cmocka.h defines a fail() macro.
#include "backend/cpu/convert.h"
#include "backend/cuda/variants.h"
#include "core/dtype.h"
#include "core/error.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmath>
#include <cstring>
#include <vector>

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

// The CPU backend converts fp16 rows by F16C where the CPU has it, else by
// the table: every one of the 65536 values comes out as half_to_float's
// bits (NaNs: a NaN; F16C quiets signalling ones), also in a row of 13,
// whose last 5 take the one-at-a-time path.
void test_half_rows_exact(void **) {
  std::vector<uint16_t> bits(1 << 16);
  for (uint32_t h = 0; h < bits.size(); ++h) bits[h] = static_cast<uint16_t>(h);
  std::vector<float> row(bits.size());
  fd::Storage<FD_DTYPE_F16>::load_row(bits.data(), row.data(), static_cast<int64_t>(bits.size()) - 13);
  fd::Storage<FD_DTYPE_F16>::load_row(bits.data() + bits.size() - 13, row.data() + row.size() - 13, 13);
  int wrong = 0;
  for (uint32_t h = 0; h < bits.size(); ++h) {
    const float expected = fd::half_to_float(static_cast<uint16_t>(h));
    const bool same =
        std::isnan(expected) ? std::isnan(row[h]) : fd::float_to_bits(row[h]) == fd::float_to_bits(expected);
    if (!same && wrong++ < 5) print_message("fp16 %04x: got %a, expected %a\n", h, row[h], expected);
  }
  assert_int_equal(wrong, 0);
}

}  // namespace

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_dtype_sizes),
      cmocka_unit_test(test_kernel_table_slots),
      cmocka_unit_test(test_occupancy_table),
      cmocka_unit_test(test_half_rows_exact),
  };
  return cmocka_run_group_tests(tests, nullptr, nullptr);
}
