// The threads of one pass. A pass runs inside a single OpenMP parallel region: each op takes
// its share of rows or columns by the thread's index, and threads meet at a barrier only where
// an op needs another's output. A parallel region per op (at::parallel_for) costs a wake-up of
// the pool each time, ~300 of them a pass for a 30-layer model; and libgomp's own barrier, once
// its threads have gone to sleep, costs a futex wake-up (5-12 us measured): more than the
// arithmetic of a one-row op. So the team meets at its own barrier, which spins (~0.1 us on two
// cores) and yields the core when the wait grows long (another process may need it).
#pragma once

#include <immintrin.h>
#include <linux/futex.h>
#include <omp.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <x86intrin.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <utility>

namespace dllm {

class SpinBarrier {
 public:
  static constexpr int kMaxThreads = 256;

  void reset(int size) {
    size_ = size;
    arrived_.store(0, std::memory_order_relaxed);
    for (int t = 0; t < size && t < kMaxThreads; ++t) waited_[t].cycles = 0;
  }

  // cycles thread t spent waiting here since the last reset
  uint64_t waited(int t) const { return waited_[t].cycles; }

  void wait(int t) {
    const uint64_t start = __rdtsc();
    arrive();
    if (t < kMaxThreads) waited_[t].cycles += __rdtsc() - start;
  }

 private:
  void arrive() {
    const int generation = generation_.load(std::memory_order_acquire);
    if (arrived_.fetch_add(1, std::memory_order_acq_rel) == size_ - 1) {
      arrived_.store(0, std::memory_order_relaxed);
      generation_.fetch_add(1, std::memory_order_acq_rel);
      if (sleepers_.load(std::memory_order_acquire) > 0) futex(FUTEX_WAKE_PRIVATE, INT32_MAX);
      return;
    }
    for (int spins = 0; spins < kSpins; ++spins) {
      if (generation_.load(std::memory_order_acquire) != generation) return;
      _mm_pause();
    }
    sleepers_.fetch_add(1, std::memory_order_acq_rel);
    while (generation_.load(std::memory_order_acquire) == generation) futex(FUTEX_WAIT_PRIVATE, generation);
    sleepers_.fetch_sub(1, std::memory_order_acq_rel);
  }

  static constexpr int kSpins = 4096;  // tens of microseconds of pause instructions, then sleep

  void futex(int op, int value) {
    syscall(SYS_futex, reinterpret_cast<int*>(&generation_), op, value, nullptr, nullptr, 0);
  }

  int size_ = 1;
  alignas(64) std::atomic<int> arrived_{0};
  alignas(64) std::atomic<int> generation_{0};
  alignas(64) std::atomic<int> sleepers_{0};
  struct alignas(64) Waited {
    uint64_t cycles = 0;
  };
  Waited waited_[kMaxThreads];
};

struct Team {
  int index = 0, size = 1;
  SpinBarrier* meeting = nullptr;

  // Called by every thread at the start of a parallel region: the team and its barrier.
  static Team join(SpinBarrier& barrier) {
    const Team team{omp_get_thread_num(), omp_get_num_threads(), &barrier};
    if (team.index == 0) barrier.reset(team.size);
#pragma omp barrier
    return team;
  }

  // this thread's part [begin, end) of n items, parts in multiples of `align` (the last may be short)
  std::pair<int64_t, int64_t> share(int64_t n, int64_t align = 1) const {
    const int64_t units = (n + align - 1) / align;
    const int64_t begin = units * index / size * align, end = units * (index + 1) / size * align;
    return {std::min(begin, n), std::min(end, n)};
  }
  bool leader() const { return index == 0; }
  void barrier() const {
    if (size > 1) meeting->wait(index);
  }
};

}  // namespace dllm
