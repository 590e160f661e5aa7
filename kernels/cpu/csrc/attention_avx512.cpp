// attention_blocks.h on AVX-512: 16 lanes; a score step serves up to 12 queries x 16 keys (one
// vector of a block's keys a dimension), a value step up to 4 queries x 64 dimensions (16
// accumulators). Lanes are keys in a score and dimensions in a value, as on AVX2, and each
// lane's chain of FMAs is the same: the bits are the AVX2 kernels'.
//
// Only this file is compiled for AVX-512 (the pragma below), and it calls nothing with external
// linkage but the AVX2 set's entry points: an inline function instantiated here could otherwise
// replace the AVX2 build's copy at link time and fault on a CPU without AVX-512.
#include <immintrin.h>

#include <cstdint>

#include "attention_blocks.h"

namespace dllm {
namespace {

bool supported() {
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("f16c");
}

#pragma GCC push_options
#pragma GCC target("avx512f,avx512vl,avx2,f16c,fma")

constexpr int kQueriesPerScore = 12;
constexpr int kQueriesPerValue = 4;

inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load16(const uint16_t* p) { return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const uint16_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }

// S[r, 0:16) for R queries and 16 keys of a transposed block (kt[c * B + j])
template <typename T, int R>
inline void score16(const float* Q, int64_t d, const T* kt, int64_t B, float* S, int64_t lds) {
  __m512 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  for (int64_t c = 0; c < d; ++c) {
    const __m512 k = load16(kt + c * B);
    for (int r = 0; r < R; ++r) acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(Q[r * d + c]), k, acc[r]);
  }
  for (int r = 0; r < R; ++r) _mm512_storeu_ps(S + r * lds, acc[r]);
}

// the same for a block's last 8 keys where B is not a multiple of 16
template <typename T, int R>
inline void score8(const float* Q, int64_t d, const T* kt, int64_t B, float* S, int64_t lds) {
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t c = 0; c < d; ++c) {
    const __m256 k = load8(kt + c * B);
    for (int r = 0; r < R; ++r) acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(Q[r * d + c]), k, acc[r]);
  }
  for (int r = 0; r < R; ++r) _mm256_storeu_ps(S + r * lds, acc[r]);
}

// queries [0, count) against one block, count <= R (one instantiation per count)
template <typename T, int R>
void score_block(int count, const float* Q, int64_t d, const T* kt, int64_t B, float* S, int64_t lds) {
  if constexpr (R > 1)
    if (count < R) return score_block<T, R - 1>(count, Q, d, kt, B, S, lds);
  int64_t j = 0;
  for (; j + 16 <= B; j += 16) score16<T, R>(Q, d, kt + j, B, S + j, lds);
  if (j < B) score8<T, R>(Q, d, kt + j, B, S + j, lds);
}

// O[r][c0, c0 + 16 NV) += sum_{begin <= j < end} P[r, j] V[j, c0 ..] for R queries, keys in
// order, the accumulators in registers across the blocks
template <typename T, int R, int NV>
inline void value16(const float* P, int64_t lds, int64_t begin, int64_t end, const char* const* blocks, int64_t B,
                    int64_t d, int64_t c0, float* const* O) {
  __m512 acc[R][NV];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_loadu_ps(O[r] + c0 + 16 * v);
  for (int64_t j0 = begin; j0 < end;) {
    const int64_t first = j0 / B * B, j1 = end < first + B ? end : first + B;
    const T* V = reinterpret_cast<const T*>(blocks[j0 / B]) + c0;
    for (int64_t j = j0; j < j1; ++j) {
      __m512 x[NV];
      for (int v = 0; v < NV; ++v) x[v] = load16(V + (j - first) * d + 16 * v);
      for (int r = 0; r < R; ++r) {
        const __m512 p = _mm512_set1_ps(P[r * lds + j]);
        for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_fmadd_ps(p, x[v], acc[r][v]);
      }
    }
    j0 = j1;
  }
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < NV; ++v) _mm512_storeu_ps(O[r] + c0 + 16 * v, acc[r][v]);
}

template <typename T, int R>
inline void value8(const float* P, int64_t lds, int64_t begin, int64_t end, const char* const* blocks, int64_t B,
                   int64_t d, int64_t c0, float* const* O) {
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_loadu_ps(O[r] + c0);
  for (int64_t j = begin; j < end; ++j) {
    const __m256 x = load8(reinterpret_cast<const T*>(blocks[j / B]) + j % B * d + c0);
    for (int r = 0; r < R; ++r) acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(P[r * lds + j]), x, acc[r]);
  }
  for (int r = 0; r < R; ++r) _mm256_storeu_ps(O[r] + c0, acc[r]);
}

template <typename T, int R>
void value_block(int count, const float* P, int64_t lds, int64_t begin, int64_t end, const char* const* blocks,
                 int64_t B, int64_t d, float* const* O) {
  if constexpr (R > 1)
    if (count < R) return value_block<T, R - 1>(count, P, lds, begin, end, blocks, B, d, O);
  int64_t c = 0;
  for (; c + 64 <= d; c += 64) value16<T, R, 4>(P, lds, begin, end, blocks, B, d, c, O);
  for (; c + 16 <= d; c += 16) value16<T, R, 1>(P, lds, begin, end, blocks, B, d, c, O);
  if (c < d) value8<T, R>(P, lds, begin, end, blocks, B, d, c, O);  // d is a multiple of 8 here
}

void score(int count, const float* Q, int64_t d, const void* keys, bool half, int64_t B, float* S, int64_t lds) {
  if (half) score_block<uint16_t, kQueriesPerScore>(count, Q, d, static_cast<const uint16_t*>(keys), B, S, lds);
  else score_block<float, kQueriesPerScore>(count, Q, d, static_cast<const float*>(keys), B, S, lds);
}

void value(int count, const float* P, int64_t lds, int64_t begin, int64_t end, const char* const* blocks, int64_t B,
           bool half, int64_t d, float* const* O) {
  if (d % 8) return kAttentionAvx2.value(count, P, lds, begin, end, blocks, B, half, d, O);  // tiny test models
  if (half) value_block<uint16_t, kQueriesPerValue>(count, P, lds, begin, end, blocks, B, d, O);
  else value_block<float, kQueriesPerValue>(count, P, lds, begin, end, blocks, B, d, O);
}

#pragma GCC pop_options

}  // namespace

const AttentionBlocks kAttentionAvx512{"avx512", supported, kQueriesPerScore, kQueriesPerValue, score, value};

}  // namespace dllm
