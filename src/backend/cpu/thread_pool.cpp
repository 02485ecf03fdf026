#include "backend/cpu/thread_pool.h"

namespace fd {

ThreadPool::ThreadPool(int num_threads) {
  for (int i = 1; i < num_threads; ++i) workers_.emplace_back([this] { worker_loop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  work_ready_.notify_all();
  for (auto &worker : workers_) worker.join();
}

// Tasks are coarse (a whole split of a KV head group), so taking the lock
// per task costs nothing measurable and keeps the pool simple.
void ThreadPool::run_tasks() {
  for (;;) {
    int64_t index;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (next_ >= count_) return;
      index = next_++;
    }
    (*task_)(index);
  }
}

void ThreadPool::worker_loop() {
  int64_t seen_generation = 0;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mutex_);
      work_ready_.wait(lock, [&] { return stopping_ || generation_ != seen_generation; });
      if (stopping_) return;
      seen_generation = generation_;
      ++busy_workers_;
    }
    run_tasks();
    {
      std::lock_guard<std::mutex> lock(mutex_);
      --busy_workers_;
    }
    work_done_.notify_one();
  }
}

void ThreadPool::parallel_for(int64_t count, const std::function<void(int64_t)> &task) {
  if (count <= 0) return;
  if (workers_.empty() || count == 1) {
    for (int64_t i = 0; i < count; ++i) task(i);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    task_ = &task;
    count_ = count;
    next_ = 0;
    ++generation_;
  }
  work_ready_.notify_all();
  run_tasks();
  std::unique_lock<std::mutex> lock(mutex_);
  work_done_.wait(lock, [&] { return next_ >= count_ && busy_workers_ == 0; });
  task_ = nullptr;
}

}  // namespace fd
