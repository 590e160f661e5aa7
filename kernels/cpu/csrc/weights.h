// Weight matrices as the checkpoint stores them: fp32, or llama.cpp's Q8_0 / Q4_1 blocks of 32
// along each row. A matmul streams the blocks and dequantizes them in registers, so a pass
// reads 4.5-5 bits a weight (Q4_1) instead of 16 (bf16) or 32 (fp32).
#pragma once

#include <cstdint>

#include "simd.h"

namespace dllm {

enum WeightType : int { kF32 = 0, kQ8_0 = 1, kQ4_1 = 2 };

struct BlockQ8_0 {  // value = d * q
  uint16_t d;
  int8_t qs[32];
};
struct BlockQ4_1 {  // value = d * q + m; qs[j] holds weight j (low nibble) and j + 16 (high)
  uint16_t d, m;
  uint8_t qs[16];
};
static_assert(sizeof(BlockQ8_0) == 34, "Q8_0 block layout");
static_assert(sizeof(BlockQ4_1) == 20, "Q4_1 block layout");

// A row-major [rows, cols] matrix; quantized rows are cols / 32 consecutive blocks.
struct Weight {
  int type = kF32;
  const uint8_t* data = nullptr;
  int64_t rows = 0, cols = 0;

  int64_t row_bytes() const {
    if (type == kQ8_0) return cols / 32 * int64_t(sizeof(BlockQ8_0));
    if (type == kQ4_1) return cols / 32 * int64_t(sizeof(BlockQ4_1));
    return cols * 4;
  }
  const uint8_t* row(int64_t r) const { return data + r * row_bytes(); }
};

// The 32 weights of a block in four registers. Each 8-byte half of the quants is widened
// straight from memory to 8 int32 lanes; for Q4_1 a lane's byte holds two weights, split by a
// mask and a shift (weights j and j + 16 share byte j).
inline void dequant_regs(const BlockQ8_0* b, __m256 out[4]) {
  const __m256 d = _mm256_set1_ps(fp16_to_fp32(b->d));
  for (int i = 0; i < 4; ++i) {
    __m256i q = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(b->qs + 8 * i)));
    out[i] = _mm256_mul_ps(_mm256_cvtepi32_ps(q), d);
  }
}

inline void dequant_regs(const BlockQ4_1* b, __m256 out[4]) {
  const __m256 d = _mm256_set1_ps(fp16_to_fp32(b->d)), m = _mm256_set1_ps(fp16_to_fp32(b->m));
  const __m256i low = _mm256_set1_epi32(0x0F);
  __m256i b0 = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(b->qs)));
  __m256i b1 = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(b->qs + 8)));
  out[0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_and_si256(b0, low)), d, m);
  out[1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_and_si256(b1, low)), d, m);
  out[2] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(b0, 4)), d, m);
  out[3] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(b1, 4)), d, m);
}

template <class Block>
inline void dequant_block(const Block* b, float* out) {
  __m256 v[4];
  dequant_regs(b, v);
  for (int i = 0; i < 4; ++i) _mm256_storeu_ps(out + 8 * i, v[i]);
}

// Row r of w, dequantized into out[cols].
inline void dequant_row(const Weight& w, int64_t r, float* out) {
  const uint8_t* src = w.row(r);
  if (w.type == kF32) {
    std::memcpy(out, src, w.cols * 4);
  } else if (w.type == kQ8_0) {
    auto* blocks = reinterpret_cast<const BlockQ8_0*>(src);
    for (int64_t b = 0; b < w.cols / 32; ++b) dequant_block(blocks + b, out + 32 * b);
  } else {
    auto* blocks = reinterpret_cast<const BlockQ4_1*>(src);
    for (int64_t b = 0; b < w.cols / 32; ++b) dequant_block(blocks + b, out + 32 * b);
  }
}

}  // namespace dllm
