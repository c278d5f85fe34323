#include "parallel_copy.h"
#include "spin.h"

#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

// ATen's intra-op thread count, when the process has ATen (torch_npu._C links it;
// the runtime's own tests do not). Weak and default-visible: resolved against
// libtorch at load time, null without it. The runtime stays plain C++17.
namespace at {
__attribute__((weak, visibility("default"))) int get_num_threads();
}  // namespace at

namespace npu::runtime::emu {
namespace {

// Chunks small enough that the caller's wait at the end (for chunks helpers are
// still copying) stays short, large enough that claiming one costs nothing.
constexpr std::size_t kChunk = std::size_t(512) << 10;
// Below this a copy is one memcpy: waking a helper (tens of microseconds) would
// cost about what it could save.
constexpr std::size_t kMinBytes = std::size_t(4) << 20;
constexpr int kMaxThreads = 16;
// Every kProbe-th copy of a size takes the way that is not the faster one.
constexpr uint32_t kProbe = 16;

struct Job {
  char* dst;
  const char* src;
  std::size_t n;
  std::size_t chunks;
  std::atomic<std::size_t> next{0};  // the next chunk to claim
  std::atomic<std::size_t> done{0};  // chunks copied

  // Claims and copies chunks until none is left.
  void work() {
    for (;;) {
      const std::size_t i = next.fetch_add(1, std::memory_order_relaxed);
      if (i >= chunks) return;
      const std::size_t begin = i * kChunk;
      std::memcpy(dst + begin, src + begin, std::min(kChunk, n - begin));
      done.fetch_add(1, std::memory_order_release);
    }
  }
};

// Helpers park on a condition variable; a copy publishes its job and wakes as
// many as it may use. A helper holds the job by a shared pointer, so a job
// outlives a helper that wakes after its copy returned (it finds no chunk left).
class Pool {
 public:
  void post(const std::shared_ptr<Job>& job, int helpers) {
    bool all;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      while (static_cast<int>(threads_.size()) < helpers) {
        threads_.emplace_back([this] { loop(); });
        threads_.back().detach();  // parked for the process's life; never destroyed
      }
      job_ = job;
      ++generation_;
      wanted_ = helpers;
      all = helpers >= static_cast<int>(threads_.size());
    }
    if (all) {
      ready_.notify_all();
    } else {
      for (int i = 0; i < helpers; ++i) ready_.notify_one();
    }
  }

 private:
  void loop() {
    pthread_setname_np(pthread_self(), "npu_copy");  // tells them apart in a profile or /proc
    uint64_t seen = 0;
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      ready_.wait(lock, [&] { return generation_ != seen && wanted_ > 0; });
      seen = generation_;
      --wanted_;
      std::shared_ptr<Job> job = job_;
      lock.unlock();
      job->work();
      job.reset();
      lock.lock();
    }
  }

  std::mutex mutex_;
  std::condition_variable ready_;
  std::vector<std::thread> threads_;
  std::shared_ptr<Job> job_;
  uint64_t generation_ = 0;
  int wanted_ = 0;  // helpers the latest job may still take
};

// Whether sharing a copy pays on this host now. It does while other cores are
// idle; while other processes keep them busy a woken helper takes a core from
// the copy (on 2 cores it may preempt the copying thread itself) or is preempted
// holding a chunk the copy then waits for. Which is the case only timing tells:
// for each size (by powers of two) the recent time per byte of shared and of
// unshared copies (halfway averages), the faster taken, the other probed.
class Chooser {
 public:
  // Whether the copy of `n` bytes shares its chunks.
  bool share(std::size_t n, std::atomic<double>** estimate) {
    Size& size = sizes_[index(n)];
    const uint32_t count = size.count.fetch_add(1, std::memory_order_relaxed);
    const double shared = size.shared.load(std::memory_order_relaxed);
    const double alone = size.alone.load(std::memory_order_relaxed);
    bool share;
    if (shared == 0 || alone == 0) {
      share = shared == 0;  // each way timed once first
    } else {
      share = shared < alone;
      if (count % kProbe == kProbe - 1) share = !share;
    }
    *estimate = share ? &size.shared : &size.alone;
    return share;
  }

  static void record(std::atomic<double>* estimate, std::size_t n, std::chrono::steady_clock::duration took) {
    const double per_byte = std::chrono::duration<double, std::nano>(took).count() / static_cast<double>(n);
    const double before = estimate->load(std::memory_order_relaxed);
    estimate->store(before == 0 ? per_byte : (before + per_byte) / 2, std::memory_order_relaxed);
  }

 private:
  struct Size {
    std::atomic<double> shared{0};  // ns per byte; 0 until timed
    std::atomic<double> alone{0};
    std::atomic<uint32_t> count{0};
  };
  static std::size_t index(std::size_t n) {
    std::size_t i = 0;
    for (std::size_t limit = kMinBytes * 2; n >= limit && i + 1 < kSizes; limit *= 2) ++i;
    return i;
  }
  static constexpr std::size_t kSizes = 8;  // 4 MiB, 8 MiB, ..., 512 MiB and more
  Size sizes_[kSizes];
};

Chooser& g_chooser = *new Chooser;

Pool* g_pool = nullptr;
std::once_flag g_pool_once;

Pool& pool() {
  std::call_once(g_pool_once, [] {
    g_pool = new Pool;  // never destroyed: its helpers outlive static destruction
    // A forked child has none of the parent's helpers, and the pool's mutex may
    // have been held: it starts a fresh pool (the old one is left as it was).
    pthread_atfork(nullptr, nullptr, [] { g_pool = new Pool; });
  });
  return *g_pool;
}

}  // namespace

int copyThreads() {
  const int threads = at::get_num_threads ? at::get_num_threads()
                                          : static_cast<int>(std::thread::hardware_concurrency());
  return std::clamp(threads, 1, kMaxThreads);
}

std::size_t parallelCopyMinBytes() { return kMinBytes; }

void parallelCopy(void* dst, const void* src, std::size_t n, int threads) {
  if (n < kMinBytes || threads <= 1) {
    std::memcpy(dst, src, n);
    return;
  }
  std::atomic<double>* estimate;
  const bool share = g_chooser.share(n, &estimate);
  const auto start = std::chrono::steady_clock::now();
  if (!share) {
    std::memcpy(dst, src, n);
    Chooser::record(estimate, n, std::chrono::steady_clock::now() - start);
    return;
  }
  auto job = std::make_shared<Job>();
  job->dst = static_cast<char*>(dst);
  job->src = static_cast<const char*>(src);
  job->n = n;
  job->chunks = (n + kChunk - 1) / kChunk;
  pool().post(job, std::min<int>(threads, kMaxThreads) - 1);
  job->work();
  // Every chunk is claimed: wait for those helpers are copying (a chunk each).
  while (job->done.load(std::memory_order_acquire) < job->chunks) {
    for (int i = 0; i < 64; ++i) cpuRelax();
    if (job->done.load(std::memory_order_acquire) < job->chunks) std::this_thread::yield();
  }
  Chooser::record(estimate, n, std::chrono::steady_clock::now() - start);
}

}  // namespace npu::runtime::emu
