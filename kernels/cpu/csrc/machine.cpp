#include "machine.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <chrono>
#include <vector>

#include "simd.h"
#include "team.h"

namespace dllm {

double read_bandwidth(int64_t mib, int64_t repeats) {
  const int64_t floats = mib * (1 << 20) / 4;
  std::vector<float> buffer(floats, 1.0f);
  const int threads = at::get_num_threads();
  double best = 0.0;
  volatile float sink = 0.0f;
  for (int64_t i = 0; i < std::max<int64_t>(1, repeats); ++i) {
    const auto start = std::chrono::steady_clock::now();
    float total = 0.0f;
#pragma omp parallel num_threads(threads) reduction(+ : total)
    {
      const Team team{omp_get_thread_num(), omp_get_num_threads()};
      const auto [f0, f1] = team.share(floats, 64);
      __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
      for (int64_t f = f0; f + 32 <= f1; f += 32)
        for (int a = 0; a < 4; ++a) acc[a] = _mm256_add_ps(acc[a], _mm256_loadu_ps(buffer.data() + f + 8 * a));
      total += hsum(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    sink = sink + total;
    best = std::max(best, double(floats) * 4 / seconds / 1e9);
  }
  return best;
}

}  // namespace dllm
