// SPDX-License-Identifier: Apache-2.0
#include "backend/cpu/thread_pool.h"

#include <system_error>

#include "core/error.h"

namespace fd {

ThreadPool::ThreadPool(int num_threads) {
  try {
    for (int i = 1; i < num_threads; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
  } catch (const std::system_error &e) {
    // The threads already started wait on this pool's condition variables:
    // stop and join them before the members go away, then report.
    stop_and_join();
    fail(FD_ERROR_OUT_OF_MEMORY, "options: num_threads %d: starting worker thread %zu failed: %s", num_threads,
         workers_.size() + 1, e.what());
  } catch (...) {
    stop_and_join();
    throw;
  }
}

ThreadPool::~ThreadPool() { stop_and_join(); }

void ThreadPool::stop_and_join() noexcept {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  work_ready_.notify_all();
  for (auto &worker : workers_) {
    if (worker.joinable()) worker.join();
  }
}

// Tasks are coarse (a whole split of a KV head group), so taking the lock
// per task costs nothing measurable and keeps the pool simple. A task that
// throws (e.g. std::bad_alloc) stops the handing out of
// tasks; its exception goes to parallel_for's caller, not past a worker
// thread's entry (which would terminate the process).
void ThreadPool::run_tasks(int thread) {
  for (;;) {
    int64_t index;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (next_ >= count_) return;
      index = next_++;
    }
    try {
      task_function_(task_context_, index, thread);
    } catch (...) {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!failure_) failure_ = std::current_exception();
      next_ = count_;
      return;
    }
  }
}

void ThreadPool::worker_loop(int thread) {
  int64_t seen_generation = 0;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mutex_);
      work_ready_.wait(lock, [&] { return stopping_ || generation_ != seen_generation; });
      if (stopping_) return;
      seen_generation = generation_;
      ++busy_workers_;
    }
    run_tasks(thread);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      --busy_workers_;
    }
    work_done_.notify_one();
  }
}

void ThreadPool::run(int64_t count, void *context, TaskFunction function) {
  if (count <= 0) return;
  if (workers_.empty() || count == 1) {
    for (int64_t i = 0; i < count; ++i) function(context, i, 0);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    task_context_ = context;
    task_function_ = function;
    count_ = count;
    next_ = 0;
    failure_ = nullptr;
    ++generation_;
  }
  work_ready_.notify_all();
  run_tasks(0);
  // Every worker is out of the task (which lives in the caller's frame) before
  // this returns or rethrows.
  std::exception_ptr failure;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    work_done_.wait(lock, [&] { return next_ >= count_ && busy_workers_ == 0; });
    task_context_ = nullptr;
    task_function_ = nullptr;
    failure = failure_;
    failure_ = nullptr;
  }
  if (failure) std::rethrow_exception(failure);
}

}  // namespace fd
