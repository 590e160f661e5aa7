// The matmul of every projection and of the output head.
//
// Columns are taken a panel at a time (kPanel rows of w): quantized rows are dequantized once
// into a per-thread fp32 panel that stays in L1/L2 (fp32 weights are read in place), then a
// register-blocked micro-kernel computes MR x NR dot products of length K with 8-wide FMAs.
// With MR = 4, NR = 3 the kernel keeps 12 accumulators, 3 weight vectors and 1 input vector in
// the 16 ymm registers and issues 12 FMAs per 7 loads: on a 2-FMA-port core it is FMA-bound,
// which is the best an fp32 matmul can do. At one row (an AR step) the pass is bound by the
// bytes of weights it streams, which is why the blocks stay quantized in memory.
#include "matmul.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <vector>

namespace dllm {
namespace {

constexpr int kMR = 4, kNR = 3;
constexpr int64_t kPanel = 12;  // a multiple of kNR

template <int MR, int NR>
void micro(const float* x, int64_t ldx, const float* w, int64_t ldw, int64_t K, float* y, int64_t ldy,
           bool accumulate) {
  __m256 c[MR][NR];
  for (int m = 0; m < MR; ++m)
    for (int n = 0; n < NR; ++n) c[m][n] = _mm256_setzero_ps();
  int64_t k = 0;
  for (; k + 8 <= K; k += 8) {
    __m256 b[NR];
    for (int n = 0; n < NR; ++n) b[n] = _mm256_loadu_ps(w + n * ldw + k);
    for (int m = 0; m < MR; ++m) {
      __m256 a = _mm256_loadu_ps(x + m * ldx + k);
      for (int n = 0; n < NR; ++n) c[m][n] = _mm256_fmadd_ps(a, b[n], c[m][n]);
    }
  }
  for (int m = 0; m < MR; ++m) {
    const __m256 zero = _mm256_setzero_ps();
    float sums[4];
    _mm_storeu_ps(sums, hsum4(c[m][0], NR > 1 ? c[m][NR > 1 ? 1 : 0] : zero, NR > 2 ? c[m][NR > 2 ? 2 : 0] : zero, zero));
    for (int n = 0; n < NR; ++n) {
      float s = sums[n];
      for (int64_t kk = k; kk < K; ++kk) s += x[m * ldx + kk] * w[n * ldw + kk];
      float& out = y[m * ldy + n];
      out = accumulate ? out + s : s;
    }
  }
}

using Micro = void (*)(const float*, int64_t, const float*, int64_t, int64_t, float*, int64_t, bool);

template <int MR>
constexpr Micro micro_for(int nr) {
  return nr == 1 ? micro<MR, 1> : nr == 2 ? micro<MR, 2> : micro<MR, 3>;
}

Micro micro_table(int mr, int nr) {
  switch (mr) {
    case 1: return micro_for<1>(nr);
    case 2: return micro_for<2>(nr);
    case 3: return micro_for<3>(nr);
    default: return micro_for<4>(nr);
  }
}

// Few rows (decoding): each block is dequantized into registers once and used by every row,
// straight from the stream of weights, one column at a time. Rows get 4, 2 or 1 accumulators
// so that enough independent FMA chains are in flight to hide the FMA latency.
template <int MR, class Block>
void direct(const float* x, int64_t ldx, const Weight& w, float* y, int64_t ldy, bool accumulate, int64_t n0,
            int64_t n1) {
  constexpr int kAcc = MR <= 2 ? 4 : MR <= 4 ? 2 : 1;
  const int64_t blocks = w.cols / 32;
  for (int64_t n = n0; n < n1; ++n) {
    const Block* b = reinterpret_cast<const Block*>(w.row(n));
    __m256 acc[MR][kAcc];
    for (int m = 0; m < MR; ++m)
      for (int a = 0; a < kAcc; ++a) acc[m][a] = _mm256_setzero_ps();
    for (int64_t kb = 0; kb < blocks; ++kb) {
      __m256 wv[4];
      dequant_regs(b + kb, wv);
      const float* xk = x + kb * 32;
      for (int m = 0; m < MR; ++m)
        for (int c = 0; c < 4; ++c)
          acc[m][c % kAcc] = _mm256_fmadd_ps(wv[c], _mm256_loadu_ps(xk + m * ldx + 8 * c), acc[m][c % kAcc]);
    }
    for (int m = 0; m < MR; ++m) {
      __m256 total = acc[m][0];
      for (int a = 1; a < kAcc; ++a) total = _mm256_add_ps(total, acc[m][a]);
      float& out = y[m * ldy + (n - n0)];
      out = accumulate ? out + hsum(total) : hsum(total);
    }
  }
}

template <class Block>
void direct_rows(const float* x, int64_t M, int64_t ldx, const Weight& w, float* y, int64_t ldy, bool accumulate,
                 int64_t n0, int64_t n1) {
  for (int64_t m = 0; m < M; m += 8) {
    const float* xm = x + m * ldx;
    float* ym = y + m * ldy;
    switch (std::min<int64_t>(8, M - m)) {
      case 1: direct<1, Block>(xm, ldx, w, ym, ldy, accumulate, n0, n1); break;
      case 2: direct<2, Block>(xm, ldx, w, ym, ldy, accumulate, n0, n1); break;
      case 3: direct<3, Block>(xm, ldx, w, ym, ldy, accumulate, n0, n1); break;
      case 4: direct<4, Block>(xm, ldx, w, ym, ldy, accumulate, n0, n1); break;
      case 5: direct<5, Block>(xm, ldx, w, ym, ldy, accumulate, n0, n1); break;
      case 6: direct<6, Block>(xm, ldx, w, ym, ldy, accumulate, n0, n1); break;
      case 7: direct<7, Block>(xm, ldx, w, ym, ldy, accumulate, n0, n1); break;
      default: direct<8, Block>(xm, ldx, w, ym, ldy, accumulate, n0, n1); break;
    }
  }
}

float* panel_scratch(int64_t floats) {
  thread_local std::vector<float> scratch;
  if (int64_t(scratch.size()) < floats) scratch.resize(floats);
  return scratch.data();
}

}  // namespace

int64_t direct_rows_limit = 8;

void linear_columns(const float* x, int64_t M, int64_t ldx, const Weight& w, float* y, int64_t ldy,
                    bool accumulate, int64_t n0, int64_t n1) {
  const int64_t K = w.cols;
  if (M <= direct_rows_limit && w.type == kQ4_1) return direct_rows<BlockQ4_1>(x, M, ldx, w, y, ldy, accumulate, n0, n1);
  if (M <= direct_rows_limit && w.type == kQ8_0) return direct_rows<BlockQ8_0>(x, M, ldx, w, y, ldy, accumulate, n0, n1);
  float* scratch = w.type == kF32 ? nullptr : panel_scratch(kPanel * K);
  for (int64_t p = n0; p < n1; p += kPanel) {
    const int64_t rows = std::min(kPanel, n1 - p);
    const float* panel;
    if (w.type == kF32) {
      panel = reinterpret_cast<const float*>(w.row(p));
    } else {
      for (int64_t r = 0; r < rows; ++r) dequant_row(w, p + r, scratch + r * K);
      panel = scratch;
    }
    for (int64_t m = 0; m < M; m += kMR) {
      const int mr = int(std::min<int64_t>(kMR, M - m));
      for (int64_t n = 0; n < rows; n += kNR) {
        const int nr = int(std::min<int64_t>(kNR, rows - n));
        micro_table(mr, nr)(x + m * ldx, ldx, panel + n * K, K, K, y + m * ldy + (p - n0) + n, ldy, accumulate);
      }
    }
  }
}

void linear(const float* x, int64_t M, int64_t ldx, const Weight& w, float* y, int64_t ldy, bool accumulate) {
  const int64_t N = w.rows;
  // at least a few panels per thread, and no threads at all for a tiny matmul
  const int64_t grain = M * N * w.cols < (1 << 16) ? N : std::max<int64_t>(kPanel, N / 64 / kPanel * kPanel);
  at::parallel_for(0, N, grain, [&](int64_t begin, int64_t end) {
    linear_columns(x, M, ldx, w, y + begin, ldy, accumulate, begin, end);
  });
}

}  // namespace dllm
