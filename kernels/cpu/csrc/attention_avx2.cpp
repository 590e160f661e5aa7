// attention_blocks.h on AVX2 + FMA + F16C: 8 lanes; a score step serves up to 6 queries x 16
// keys (12 accumulators), a value step up to 4 queries x 16 dimensions (8 accumulators).
#include <algorithm>
#include <cmath>

#include "attention_blocks.h"
#include "simd.h"

namespace dllm {
namespace {

constexpr int kQueriesPerScore = 6;
constexpr int kQueriesPerValue = 4;

// Cache elements: fp32, or fp16 (uint16_t) widened exactly to fp32 on load; every operation
// after the load is the same for both.
inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const uint16_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
inline float value(float x) { return x; }
inline float value(uint16_t h) { return fp16_to_fp32(h); }

// S[r, 0:8 NV) = Q[r] · K[j] for R queries (rows of Q, d apart) and 8 NV keys of a transposed
// block (KT[c * B + j]: dimension c of key j): per score an FMA chain over c = 0, 1, .., d - 1,
// the same whichever queries and keys share the step.
template <typename T, int R, int NV>
inline void score_step(const float* Q, int64_t d, const T* KT, int64_t B, float* S, int64_t lds) {
  __m256 acc[R][NV];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < NV; ++v) acc[r][v] = _mm256_setzero_ps();
  for (int64_t c = 0; c < d; ++c) {
    __m256 k[NV];
    for (int v = 0; v < NV; ++v) k[v] = load8(KT + c * B + 8 * v);
    for (int r = 0; r < R; ++r) {
      const __m256 q = _mm256_broadcast_ss(Q + r * d + c);
      for (int v = 0; v < NV; ++v) acc[r][v] = _mm256_fmadd_ps(q, k[v], acc[r][v]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < NV; ++v) _mm256_storeu_ps(S + r * lds + 8 * v, acc[r][v]);
}

// S[i, 0:B) = the scores of queries [0, count) (count <= R) against one block's B keys (one
// instantiation per count)
template <typename T, int R>
void score_block(int count, const float* Q, int64_t d, const T* KT, int64_t B, float* S, int64_t lds) {
  if constexpr (R > 1)
    if (count < R) return score_block<T, R - 1>(count, Q, d, KT, B, S, lds);
  int64_t j = 0;
  for (; j + 16 <= B; j += 16) score_step<T, R, 2>(Q, d, KT + j, B, S + j, lds);
  if (j < B) score_step<T, R, 1>(Q, d, KT + j, B, S + j, lds);  // B is a multiple of 8
}

// O[r][c0, c0 + 8 NV) += sum_{begin <= j < end} P[r][j] V[j, c0 ..] for R queries: each lane
// accumulates over the keys in order (one FMA a key), so a query's output is the same whichever
// queries share the step and however its keys are cut into blocks. The accumulators stay in
// registers across the blocks.
template <typename T, int R, int NV>
inline void value_step(const float* P, int64_t lds, int64_t begin, int64_t end, const char* const* blocks, int64_t B,
                       int64_t d, int64_t c0, float* const* O) {
  __m256 acc[R][NV];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < NV; ++v) acc[r][v] = _mm256_loadu_ps(O[r] + c0 + 8 * v);
  for (int64_t j0 = begin; j0 < end;) {
    const int64_t first = j0 / B * B, j1 = std::min(end, first + B);  // the block's first key, and where to stop
    const T* V = reinterpret_cast<const T*>(blocks[j0 / B]) + c0;
    for (int64_t j = j0; j < j1; ++j) {
      __m256 x[NV];
      for (int v = 0; v < NV; ++v) x[v] = load8(V + (j - first) * d + 8 * v);
      for (int r = 0; r < R; ++r) {
        const __m256 p = _mm256_broadcast_ss(P + r * lds + j);
        for (int v = 0; v < NV; ++v) acc[r][v] = _mm256_fmadd_ps(p, x[v], acc[r][v]);
      }
    }
    j0 = j1;
  }
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < NV; ++v) _mm256_storeu_ps(O[r] + c0 + 8 * v, acc[r][v]);
}

// Queries [0, count) (count <= R): d a multiple of 8 vectorised; any other d (tiny test models)
// one lane at a time, in the same key order.
template <typename T, int R>
void value_block(int count, const float* P, int64_t lds, int64_t begin, int64_t end, const char* const* blocks,
                 int64_t B, int64_t d, float* const* O) {
  if (d % 8) {
    for (int i = 0; i < count; ++i)
      for (int64_t c = 0; c < d; ++c)
        for (int64_t j = begin; j < end; ++j) {
          const T* V = reinterpret_cast<const T*>(blocks[j / B]);
          O[i][c] = std::fma(P[i * lds + j], value(V[j % B * d + c]), O[i][c]);
        }
    return;
  }
  if constexpr (R > 1)
    if (count < R) return value_block<T, R - 1>(count, P, lds, begin, end, blocks, B, d, O);
  int64_t c = 0;
  for (; c + 16 <= d; c += 16) value_step<T, R, 2>(P, lds, begin, end, blocks, B, d, c, O);
  if (c < d) value_step<T, R, 1>(P, lds, begin, end, blocks, B, d, c, O);
}

void score(int count, const float* Q, int64_t d, const void* keys, bool half, int64_t B, float* S, int64_t lds) {
  if (half) score_block<uint16_t, kQueriesPerScore>(count, Q, d, static_cast<const uint16_t*>(keys), B, S, lds);
  else score_block<float, kQueriesPerScore>(count, Q, d, static_cast<const float*>(keys), B, S, lds);
}

void value(int count, const float* P, int64_t lds, int64_t begin, int64_t end, const char* const* blocks, int64_t B,
           bool half, int64_t d, float* const* O) {
  if (half) value_block<uint16_t, kQueriesPerValue>(count, P, lds, begin, end, blocks, B, d, O);
  else value_block<float, kQueriesPerValue>(count, P, lds, begin, end, blocks, B, d, O);
}

bool supported() { return true; }  // the extension's baseline

}  // namespace

const AttentionBlocks kAttentionAvx2{"avx2", supported, kQueriesPerScore, kQueriesPerValue, score, value};

const AttentionBlocks* attention_blocks(const std::string& name) {
  const AttentionBlocks* all[] = {&kAttentionAvx512, &kAttentionAvx2};  // widest first
  for (const AttentionBlocks* blocks : all)
    if ((name == "auto" || name == blocks->name) && blocks->supported()) return blocks;
  return nullptr;
}

}  // namespace dllm
