// SPDX-License-Identifier: Apache-2.0
// A fixed pool of worker threads for the CPU backend. parallel_for hands out
// task indices dynamically; results stay deterministic because every task
// writes only its own outputs.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <mutex>
#include <thread>
#include <type_traits>
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

  // Calls task(i, thread) (or task(i)) for every i in [0, count) across the
  // pool and the calling thread, where thread in [0, size()) names the
  // thread running it (0: the caller), for per-thread scratch; returns when
  // all are done. If a task throws, the tasks not yet started are skipped
  // and, once every thread is done, the first exception is rethrown here.
  // Not reentrant. Allocates nothing: the task is called through a pointer
  // to it (a std::function would copy a large lambda to the heap).
  template <class Task>
  void parallel_for(int64_t count, Task &&task) {
    using T = std::remove_reference_t<Task>;
    void *task_pointer = const_cast<void *>(static_cast<const void *>(&task));  // T may be const
    run(count, task_pointer, [](void *context, int64_t index, int thread) {
      T &call = *static_cast<T *>(context);
      if constexpr (std::is_invocable_v<T &, int64_t, int>) {
        call(index, thread);
      } else {
        (void)thread;
        call(index);
      }
    });
  }

 private:
  using TaskFunction = void (*)(void *context, int64_t index, int thread);
  void run(int64_t count, void *context, TaskFunction function);
  void worker_loop(int thread);
  void run_tasks(int thread);
  void stop_and_join() noexcept;

  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable work_ready_;
  std::condition_variable work_done_;
  void *task_context_ = nullptr;  // the running parallel_for's task and its caller (guarded by mutex_)
  TaskFunction task_function_ = nullptr;
  int64_t count_ = 0;
  int64_t next_ = 0;        // next task index to hand out (guarded by mutex_)
  int64_t generation_ = 0;  // bumped per parallel_for so sleeping workers notice
  int busy_workers_ = 0;
  bool stopping_ = false;
  std::exception_ptr failure_;  // the first task exception of this parallel_for (guarded by mutex_)
};

}  // namespace fd
