// SPDX-License-Identifier: Apache-2.0
// A fixed pool of worker threads for the CPU backend. parallel_for hands out
// task indices dynamically; results stay deterministic because every task
// writes only its own outputs.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace fd {

class ThreadPool {
 public:
  // Total threads including the caller. Throws fd::Error
  // (FD_ERROR_OUT_OF_MEMORY) when the system refuses a thread, with the
  // threads already started stopped and joined.
  explicit ThreadPool(int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool &) = delete;
  ThreadPool &operator=(const ThreadPool &) = delete;

  int size() const { return static_cast<int>(workers_.size()) + 1; }

  // Calls task(i) for every i in [0, count) across the pool and the calling
  // thread; returns when all are done. If a task throws, the tasks not yet
  // started are skipped and, once every thread is done, the first exception
  // is rethrown here. Not reentrant.
  void parallel_for(int64_t count, const std::function<void(int64_t)> &task);

 private:
  void worker_loop();
  void run_tasks();
  void stop_and_join() noexcept;

  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable work_ready_;
  std::condition_variable work_done_;
  const std::function<void(int64_t)> *task_ = nullptr;
  int64_t count_ = 0;
  int64_t next_ = 0;        // next task index to hand out (guarded by mutex_)
  int64_t generation_ = 0;  // bumped per parallel_for so sleeping workers notice
  int busy_workers_ = 0;
  bool stopping_ = false;
  std::exception_ptr failure_;  // the first task exception of this parallel_for (guarded by mutex_)
};

}  // namespace fd
