// The integer matmul on AVX2 (int8.h): `vpmaddubsw` multiplies the unsigned 4-bit (Q4_1) or
// absolute 8-bit (Q8_0, signs moved onto the activations) weights by the int8 activations and
// adds pairs into int16; `vpmaddwd` by ones widens to int32. Lane c of every vector is output
// column c of an 8-column group.
//
// Layout of a packed group of 8 columns, per 32-weight block:
//   Q4_1: d[8] fp16 | m[8] fp16 | 4 x 32 bytes: vector v holds, for columns c = 0..7, bytes
//         4v..4v+3 of the column's block: low nibbles are weights 4v..4v+3, high ones 16+4v..
//   Q8_0: d[8] fp16 | 8 x 32 bytes: vector v holds weights 4v..4v+3 of each column (int8)
// No saturation: |q| <= 127 and Q4_1 weights <= 15, so 8 products of pairs of a Q4_1 block
// sum to at most 8 * 2 * 15 * 127 = 30480 in int16; Q8_0 pairs (<= 32258) are widened at once.
#include <cstring>

#include "int8.h"
#include "int8_pack.h"
#include "simd.h"

namespace dllm {
namespace {

constexpr int64_t G = 8;
constexpr int64_t kQ41Bytes = 16 + 16 + 4 * 32;  // per (group, block) = 8 columns x 20 bytes
constexpr int64_t kQ80Bytes = 16 + 8 * 32;       // = 8 columns x 34 bytes
constexpr int kRowsPerTile = 4;

bool supported() { return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"); }

void pack(const Weight& w, PackedInt8& out) { pack_interleaved<G, false>(w, out); }

inline __m256i broadcast4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm256_set1_epi32(v);
}

inline __m256 scale_of(__m256 dw, const QuantizedRows& x, int64_t r, int64_t b) {
  return _mm256_mul_ps(dw, _mm256_set1_ps(x.d[r * x.blocks + b]));
}

// Weights unpacked a vector pair at a time and applied to every row of the tile before the
// next (AVX2 has 16 registers: the tile's sums and accumulators stay in them).
template <int MR>
void q4_1_tile(const QuantizedRows& x, int64_t r0, const uint8_t* group, __m256 acc[MR]) {
  const __m256i low = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
  for (int64_t b = 0; b < x.blocks; ++b) {
    const uint8_t* blk = group + b * kQ41Bytes;
    __m256i pairs[MR];
    for (int m = 0; m < MR; ++m) pairs[m] = _mm256_setzero_si256();
    for (int v = 0; v < 4; ++v) {
      const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 32 + 32 * v));
      const __m256i lo = _mm256_and_si256(raw, low), hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low);
      for (int m = 0; m < MR; ++m) {
        const int8_t* xq = x.row(r0 + m) + 32 * b;
        pairs[m] = _mm256_add_epi16(pairs[m], _mm256_maddubs_epi16(lo, broadcast4(xq + 4 * v)));
        pairs[m] = _mm256_add_epi16(pairs[m], _mm256_maddubs_epi16(hi, broadcast4(xq + 16 + 4 * v)));
      }
    }
    const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk)));
    const __m256 mw = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 16)));
    for (int m = 0; m < MR; ++m) {
      const int64_t r = r0 + m;
      const __m256 dot = _mm256_cvtepi32_ps(_mm256_madd_epi16(pairs[m], ones));
      acc[m] = _mm256_fmadd_ps(dot, scale_of(dw, x, r, b), acc[m]);
      acc[m] = _mm256_fmadd_ps(mw, _mm256_set1_ps(x.scaled_sum[r * x.blocks + b]), acc[m]);
    }
  }
}

template <int MR>
void q8_0_tile(const QuantizedRows& x, int64_t r0, const uint8_t* group, __m256 acc[MR]) {
  const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t b = 0; b < x.blocks; ++b) {
    const uint8_t* blk = group + b * kQ80Bytes;
    __m256i sums[MR];
    for (int m = 0; m < MR; ++m) sums[m] = _mm256_setzero_si256();
    for (int v = 0; v < 8; ++v) {
      const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 16 + 32 * v));
      const __m256i magnitude = _mm256_sign_epi8(w, w);
      for (int m = 0; m < MR; ++m) {
        const __m256i signed_x = _mm256_sign_epi8(broadcast4(x.row(r0 + m) + 32 * b + 4 * v), w);
        sums[m] = _mm256_add_epi32(sums[m], _mm256_madd_epi16(_mm256_maddubs_epi16(magnitude, signed_x), ones));
      }
    }
    const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk)));
    for (int m = 0; m < MR; ++m)
      acc[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums[m]), scale_of(dw, x, r0 + m, b), acc[m]);
  }
}

template <int MR>
void tile(const QuantizedRows& x, int64_t r0, const PackedInt8& w, int64_t g, int64_t n1, float* y, int64_t ldy,
          int64_t n0, bool accumulate) {
  __m256 acc[MR];
  for (int m = 0; m < MR; ++m) acc[m] = _mm256_setzero_ps();
  const int64_t stride = w.type == kQ4_1 ? kQ41Bytes : kQ80Bytes;
  const uint8_t* group = w.bytes.data() + g * x.blocks * stride;
  if (w.type == kQ4_1) q4_1_tile<MR>(x, r0, group, acc);
  else q8_0_tile<MR>(x, r0, group, acc);
  const int64_t first = g * G, valid = std::min<int64_t>(G, n1 - first);
  for (int m = 0; m < MR; ++m) {
    float* out = y + (r0 + m) * ldy + (first - n0);
    if (valid == G && !accumulate) {
      _mm256_storeu_ps(out, acc[m]);
    } else if (valid == G) {
      _mm256_storeu_ps(out, _mm256_add_ps(_mm256_loadu_ps(out), acc[m]));
    } else {
      float lanes[G];
      _mm256_storeu_ps(lanes, acc[m]);
      for (int64_t c = 0; c < valid; ++c) out[c] = accumulate ? out[c] + lanes[c] : lanes[c];
    }
  }
}

void gemm(const QuantizedRows& x, const PackedInt8& w, int64_t n0, int64_t n1, float* y, int64_t ldy,
          bool accumulate) {
  for (int64_t g = n0 / G; g * G < n1; ++g) {
    int64_t r = 0;
    for (; r + kRowsPerTile <= x.rows; r += kRowsPerTile) tile<kRowsPerTile>(x, r, w, g, n1, y, ldy, n0, accumulate);
    switch (x.rows - r) {
      case 3: tile<3>(x, r, w, g, n1, y, ldy, n0, accumulate); break;
      case 2: tile<2>(x, r, w, g, n1, y, ldy, n0, accumulate); break;
      case 1: tile<1>(x, r, w, g, n1, y, ldy, n0, accumulate); break;
      default: break;
    }
  }
}

}  // namespace

const Int8Variant kInt8Avx2{"avx2", G, supported, pack, gemm};

}  // namespace dllm
