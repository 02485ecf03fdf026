// SPDX-License-Identifier: Apache-2.0
// The CPU backend's thread pool (src/backend/cpu/thread_pool.cpp), which
// the library hides: this test compiles it in. What it guards: an exception
// thrown by a task, on a worker thread or the caller's, reaches the caller
// of parallel_for once every thread is out of the task (a worker thread
// that let it escape would terminate the process; a caller that unwound
// early would leave workers running a task in a dead frame), and the pool
// keeps working after it.
// The library's headers first: cmocka.h defines a fail() macro.
#include "backend/cpu/thread_pool.h"

#include <atomic>
#include <chrono>
#include <new>
#include <stdexcept>
#include <thread>
#include <vector>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

extern "C" {  // this cmocka.h has no C++ guards
#include <cmocka.h>
}

namespace {

// Every index runs exactly once when nothing throws.
void expect_all_ran(fd::ThreadPool &pool, int64_t count) {
  std::vector<std::atomic<int>> runs(static_cast<size_t>(count));
  pool.parallel_for(count, [&](int64_t i) { runs[static_cast<size_t>(i)].fetch_add(1); });
  for (int64_t i = 0; i < count; ++i) assert_int_equal(runs[static_cast<size_t>(i)].load(), 1);
}

void test_worker_exception_reaches_the_caller(void **) {
  fd::ThreadPool pool(4);
  const std::thread::id caller = std::this_thread::get_id();
  std::atomic<int> active{0};
  std::atomic<bool> late_task{false};
  bool caught = false;
  try {
    pool.parallel_for(400, [&](int64_t) {
      active.fetch_add(1);
      std::this_thread::sleep_for(std::chrono::microseconds(200));
      const bool on_worker = std::this_thread::get_id() != caller;
      active.fetch_sub(1);
      if (on_worker) throw std::bad_alloc();
    });
  } catch (const std::bad_alloc &) {
    caught = true;
    // Every thread is out of the task before parallel_for throws.
    late_task.store(active.load() != 0);
  }
  assert_true(caught);
  assert_false(late_task.load());
  expect_all_ran(pool, 1000);
}

void test_caller_exception_waits_for_the_workers(void **) {
  fd::ThreadPool pool(3);
  std::atomic<int> active{0};
  int seen_active_after = -1;
  try {
    pool.parallel_for(64, [&](int64_t i) {
      active.fetch_add(1);
      std::this_thread::sleep_for(std::chrono::microseconds(i == 0 ? 0 : 500));
      active.fetch_sub(1);
      if (i == 0) throw std::runtime_error("task 0");
    });
  } catch (const std::runtime_error &e) {
    seen_active_after = active.load();
    assert_string_equal(e.what(), "task 0");
  }
  assert_int_equal(seen_active_after, 0);
  expect_all_ran(pool, 257);
}

void test_single_thread_pool_runs_inline(void **) {
  fd::ThreadPool pool(1);
  assert_int_equal(pool.size(), 1);
  expect_all_ran(pool, 10);
  bool caught = false;
  try {
    pool.parallel_for(3, [](int64_t i) {
      if (i == 1) throw std::runtime_error("inline");
    });
  } catch (const std::runtime_error &) {
    caught = true;
  }
  assert_true(caught);
}

}  // namespace

int main() {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_worker_exception_reaches_the_caller),
      cmocka_unit_test(test_caller_exception_waits_for_the_workers),
      cmocka_unit_test(test_single_thread_pool_runs_inline),
  };
  return cmocka_run_group_tests(tests, nullptr, nullptr);
}
