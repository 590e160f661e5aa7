// Activation quantization for the integer matmuls (int8.h), and the variant registry.
#include <cmath>

#include "int8.h"
#include "simd.h"

namespace dllm {

void QuantizedStorage::reserve(int64_t rows, int64_t cols) {
  if (int64_t(q.size()) < rows * cols) q.resize(rows * cols);
  if (int64_t(d.size()) < rows * (cols / 32)) {
    d.resize(rows * (cols / 32));
    sum.resize(rows * (cols / 32));
    scaled_sum.resize(rows * (cols / 32));
  }
}

QuantizedRows QuantizedStorage::view(int64_t rows, int64_t cols) {
  return QuantizedRows{rows, cols, cols / 32, q.data(), d.data(), sum.data(), scaled_sum.data()};
}

void quantize_rows(const float* x, int64_t ldx, int64_t r0, int64_t r1, const QuantizedRows& out) {
  const __m256 sign_bit = _mm256_set1_ps(-0.0f);
  for (int64_t r = r0; r < r1; ++r) {
    const float* src = x + r * ldx;
    int8_t* q = out.q + r * out.cols;
    for (int64_t b = 0; b < out.blocks; ++b) {
      __m256 v[4];
      __m256 amax = _mm256_setzero_ps();
      for (int i = 0; i < 4; ++i) {
        v[i] = _mm256_loadu_ps(src + 32 * b + 8 * i);
        amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign_bit, v[i]));
      }
      const float top = hmax(amax);
      const float d = top / 127.0f;
      const float id = top > 0.0f ? 127.0f / top : 0.0f;
      const __m256 scale = _mm256_set1_ps(id);
      __m256i ints[4];
      for (int i = 0; i < 4; ++i) ints[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], scale));  // nearest even
      // 32 int32 -> 32 int8 in order (packs work per 128-bit lane: undo their interleave)
      __m256i lo = _mm256_packs_epi32(ints[0], ints[1]), hi = _mm256_packs_epi32(ints[2], ints[3]);
      __m256i bytes = _mm256_packs_epi16(lo, hi);
      bytes = _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + 32 * b), bytes);
      __m256i total = _mm256_add_epi32(_mm256_add_epi32(ints[0], ints[1]), _mm256_add_epi32(ints[2], ints[3]));
      __m128i s = _mm_add_epi32(_mm256_castsi256_si128(total), _mm256_extracti128_si256(total, 1));
      s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
      s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
      out.d[r * out.blocks + b] = d;
      out.sum[r * out.blocks + b] = _mm_cvtsi128_si32(s);
      out.scaled_sum[r * out.blocks + b] = d * float(out.sum[r * out.blocks + b]);
    }
  }
}

void dequantize_rows(const QuantizedRows& in, float* out) {
  for (int64_t r = 0; r < in.rows; ++r)
    for (int64_t k = 0; k < in.cols; ++k) out[r * in.cols + k] = float(in.q[r * in.cols + k]) * in.d[r * in.blocks + k / 32];
}

const Int8Variant* int8_variant(const std::string& name) {
  const Int8Variant* all[] = {&kInt8Avx512Vnni, &kInt8Avx2};  // fastest first
  for (const Int8Variant* v : all)
    if ((name == "auto" || name == v->name) && v->supported()) return v;
  return nullptr;
}

std::vector<std::string> int8_variants_supported() {
  std::vector<std::string> names;
  for (const Int8Variant* v : {&kInt8Avx512Vnni, &kInt8Avx2})
    if (v->supported()) names.push_back(v->name);
  return names;
}

}  // namespace dllm
