#include "cpu/parallel.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <new>
#include <thread>
#include <vector>

namespace dsa {
namespace cpu {
namespace {

thread_local bool t_in_pool_task = false;

// Runs body(b, e), recording an exception as a code in `failed` (the first one wins).
void run_guarded(const std::function<void(int64_t, int64_t)>& body, int64_t b, int64_t e,
                 std::atomic<int>* failed) {
  try {
    body(b, e);
  } catch (const std::bad_alloc&) {
    int expect = 0;
    failed->compare_exchange_strong(expect, static_cast<int>(StatusCode::kOutOfMemory));
  } catch (...) {
    int expect = 0;
    failed->compare_exchange_strong(expect, static_cast<int>(StatusCode::kInternal));
  }
}

class Pool {
 public:
  ~Pool() { stop(); }

  int threads() {
    std::lock_guard<std::mutex> g(config_mu_);
    return target_;
  }

  void set_threads(int n) {
    std::lock_guard<std::mutex> g(config_mu_);
    int want = n > 0 ? n : hw();
    if (want == target_) return;
    stop_locked();
    target_ = want;
  }

  StatusCode run(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& body) {
    if (n <= 0) return StatusCode::kOk;
    grain = std::max<int64_t>(grain, 1);
    std::atomic<int> failed{0};
    std::unique_lock<std::mutex> cfg(config_mu_);
    int t = target_;
    int64_t tasks = std::min<int64_t>(t, n / grain + (n % grain != 0));
    if (tasks <= 1 || t_in_pool_task) {
      cfg.unlock();
      run_guarded(body, 0, n, &failed);
      return static_cast<StatusCode>(failed.load());
    }
    try {
      start_locked();
    } catch (...) {  // std::system_error: no threads to be had; run serially
      cfg.unlock();
      run_guarded(body, 0, n, &failed);
      return static_cast<StatusCode>(failed.load());
    }
    // One loop at a time: concurrent callers (several engine threads) queue here.
    std::lock_guard<std::mutex> serial(run_mu_);
    cfg.unlock();
    const int64_t per = (n + tasks - 1) / tasks;
    std::atomic<int64_t> next{0};
    std::atomic<int64_t> done{0};
    std::function<void()> work = [&]() {
      for (;;) {
        int64_t i = next.fetch_add(1);
        if (i >= tasks) break;
        int64_t b = i * per, e = std::min(n, b + per);
        if (b < e) run_guarded(body, b, e, &failed);
        done.fetch_add(1);
      }
    };
    {
      std::lock_guard<std::mutex> g(mu_);
      job_ = &work;
      ++generation_;
    }
    cv_.notify_all();
    t_in_pool_task = true;
    work();
    t_in_pool_task = false;
    {
      std::unique_lock<std::mutex> g(mu_);
      done_cv_.wait(g, [&] { return done.load() >= tasks && active_ == 0; });
      job_ = nullptr;
    }
    return static_cast<StatusCode>(failed.load());
  }

 private:
  static int hw() {
    unsigned h = std::thread::hardware_concurrency();
    return h ? static_cast<int>(h) : 1;
  }

  void start_locked() {
    if (!workers_.empty()) return;
    quit_ = false;
    for (int i = 1; i < target_; ++i) workers_.emplace_back([this] { loop(); });
  }

  void loop() {
    uint64_t seen = 0;
    for (;;) {
      std::function<void()>* job;
      {
        std::unique_lock<std::mutex> g(mu_);
        cv_.wait(g, [&] { return quit_ || (job_ != nullptr && generation_ != seen); });
        if (quit_) return;
        seen = generation_;
        job = job_;
        ++active_;
      }
      t_in_pool_task = true;
      (*job)();
      t_in_pool_task = false;
      {
        std::lock_guard<std::mutex> g(mu_);
        --active_;
      }
      done_cv_.notify_all();
    }
  }

  void stop() {
    std::lock_guard<std::mutex> g(config_mu_);
    stop_locked();
  }

  void stop_locked() {
    {
      std::lock_guard<std::mutex> g(mu_);
      quit_ = true;
    }
    cv_.notify_all();
    for (auto& w : workers_) w.join();
    workers_.clear();
    quit_ = false;
  }

  std::mutex config_mu_;
  std::mutex run_mu_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::condition_variable done_cv_;
  std::vector<std::thread> workers_;
  std::function<void()>* job_ = nullptr;
  uint64_t generation_ = 0;
  int active_ = 0;
  bool quit_ = false;
  int target_ = hw();
};

Pool& pool() {
  static Pool p;
  return p;
}

}  // namespace

int pool_threads() { return pool().threads(); }
void set_pool_threads(int n) { pool().set_threads(n); }

StatusCode parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& body) {
  return pool().run(n, grain, body);
}

}  // namespace cpu
}  // namespace dsa
