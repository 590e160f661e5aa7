// The integer matmul on AVX-512 VNNI (int8.h): `vpdpbusd` multiplies unsigned bytes by int8
// activations and adds groups of 4 into int32 lanes in one instruction. Lane c of every vector
// is output column c of a 16-column group. Q8_0 weights are stored as unsigned bytes q + 128
// and the integer sum corrected by 128 * sum(q_x): the same integers as the AVX2 variant's, and
// the same fp32 operations after them, so both give bit-identical outputs.
//
// Layout of a packed group of 16 columns, per 32-weight block:
//   Q4_1: d[16] fp16 | m[16] fp16 | 4 x 64 bytes (vector v: bytes 4v..4v+3 of each column)
//   Q8_0: d[16] fp16 | 8 x 64 bytes (vector v: weights 4v..4v+3 of each column, + 128)
//
// Only the kernels are compiled for AVX-512 (the pragma below), and they call nothing with
// external linkage: an inline function instantiated here could otherwise replace the AVX2
// build's copy at link time and fault on a CPU without AVX-512.
#include <cstring>

#include "int8.h"
#include "int8_pack.h"

namespace dllm {
namespace {

constexpr int64_t G = 16;
constexpr int64_t kQ41Bytes = 32 + 32 + 4 * 64;  // = 16 columns x 20 bytes
constexpr int64_t kQ80Bytes = 32 + 8 * 64;       // = 16 columns x 34 bytes
constexpr int kRowsPerTile = 8;

bool supported() {
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
}

void pack(const Weight& w, PackedInt8& out) { pack_interleaved<G, true>(w, out); }

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512vnni,avx512dq,f16c,fma")

inline __m512i broadcast4(const int8_t* p) {
  int32_t v;
  __builtin_memcpy(&v, p, 4);
  return _mm512_set1_epi32(v);
}

inline __m512 half16(const uint8_t* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

// Rows are the inner loop: each weight vector meets every row of the tile before the next, so
// the tile's MR integer sums are MR independent `vpdpbusd` chains (one chain per row would wait
// on the instruction's latency). Integer sums are exact in any order; the fp32 steps after them
// are the AVX2 variant's, in its order.
template <int MR>
void q4_1_tile(const QuantizedRows& x, int64_t r0, const uint8_t* group, __m512 acc[MR]) {
  const __m512i low = _mm512_set1_epi8(0x0F);
  for (int64_t b = 0; b < x.blocks; ++b) {
    const uint8_t* blk = group + b * kQ41Bytes;
    __m512i sums[MR];
#pragma GCC unroll 8
    for (int m = 0; m < MR; ++m) sums[m] = _mm512_setzero_si512();
#pragma GCC unroll 4
    for (int v = 0; v < 4; ++v) {
      const __m512i raw = _mm512_loadu_si512(blk + 64 + 64 * v);
      const __m512i lo = _mm512_and_si512(raw, low), hi = _mm512_and_si512(_mm512_srli_epi16(raw, 4), low);
#pragma GCC unroll 8
      for (int m = 0; m < MR; ++m) {
        const int8_t* xq = x.row(r0 + m) + 32 * b;
        sums[m] = _mm512_dpbusd_epi32(sums[m], lo, broadcast4(xq + 4 * v));
        sums[m] = _mm512_dpbusd_epi32(sums[m], hi, broadcast4(xq + 16 + 4 * v));
      }
    }
    const __m512 dw = half16(blk), mw = half16(blk + 32);
#pragma GCC unroll 8
    for (int m = 0; m < MR; ++m) {
      const int64_t r = r0 + m;
      const float dx = x.d[r * x.blocks + b];
      const float sx = x.scaled_sum[r * x.blocks + b];
      acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sums[m]), _mm512_mul_ps(dw, _mm512_set1_ps(dx)), acc[m]);
      acc[m] = _mm512_fmadd_ps(mw, _mm512_set1_ps(sx), acc[m]);
    }
  }
}

template <int MR>
void q8_0_tile(const QuantizedRows& x, int64_t r0, const uint8_t* group, __m512 acc[MR]) {
  for (int64_t b = 0; b < x.blocks; ++b) {
    const uint8_t* blk = group + b * kQ80Bytes;
    __m512i sums[MR];
#pragma GCC unroll 8
    for (int m = 0; m < MR; ++m) sums[m] = _mm512_set1_epi32(-128 * x.sum[(r0 + m) * x.blocks + b]);  // the bytes are q + 128
#pragma GCC unroll 8
    for (int v = 0; v < 8; ++v) {
      const __m512i w = _mm512_loadu_si512(blk + 32 + 64 * v);
#pragma GCC unroll 8
      for (int m = 0; m < MR; ++m) sums[m] = _mm512_dpbusd_epi32(sums[m], w, broadcast4(x.row(r0 + m) + 32 * b + 4 * v));
    }
    const __m512 dw = half16(blk);
#pragma GCC unroll 8
    for (int m = 0; m < MR; ++m) {
      const float dx = x.d[(r0 + m) * x.blocks + b];
      acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sums[m]), _mm512_mul_ps(dw, _mm512_set1_ps(dx)), acc[m]);
    }
  }
}

template <int MR>
void tile(const QuantizedRows& x, int64_t r0, const PackedInt8& w, int64_t g, int64_t n1, float* y, int64_t ldy,
          int64_t n0, bool accumulate) {
  __m512 acc[MR];
  for (int m = 0; m < MR; ++m) acc[m] = _mm512_setzero_ps();
  const int64_t stride = w.type == kQ4_1 ? kQ41Bytes : kQ80Bytes;
  const uint8_t* group = w.bytes.data() + g * x.blocks * stride;
  if (w.type == kQ4_1) q4_1_tile<MR>(x, r0, group, acc);
  else q8_0_tile<MR>(x, r0, group, acc);
  const int64_t first = g * G, left = n1 - first;
  const __mmask16 lanes = left >= G ? __mmask16(0xFFFF) : __mmask16((1u << left) - 1);
  for (int m = 0; m < MR; ++m) {
    float* out = y + (r0 + m) * ldy + (first - n0);
    __m512 value = acc[m];
    if (accumulate) value = _mm512_add_ps(_mm512_maskz_loadu_ps(lanes, out), value);
    _mm512_mask_storeu_ps(out, lanes, value);
  }
}

void gemm(const QuantizedRows& x, const PackedInt8& w, int64_t n0, int64_t n1, float* y, int64_t ldy,
          bool accumulate) {
  for (int64_t g = n0 / G; g * G < n1; ++g) {
    int64_t r = 0;
    for (; r + kRowsPerTile <= x.rows; r += kRowsPerTile) tile<kRowsPerTile>(x, r, w, g, n1, y, ldy, n0, accumulate);
    switch (x.rows - r) {
      case 7: tile<7>(x, r, w, g, n1, y, ldy, n0, accumulate); break;
      case 6: tile<6>(x, r, w, g, n1, y, ldy, n0, accumulate); break;
      case 5: tile<5>(x, r, w, g, n1, y, ldy, n0, accumulate); break;
      case 4: tile<4>(x, r, w, g, n1, y, ldy, n0, accumulate); break;
      case 3: tile<3>(x, r, w, g, n1, y, ldy, n0, accumulate); break;
      case 2: tile<2>(x, r, w, g, n1, y, ldy, n0, accumulate); break;
      case 1: tile<1>(x, r, w, g, n1, y, ldy, n0, accumulate); break;
      default: break;
    }
  }
}

#pragma GCC pop_options

}  // namespace

const Int8Variant kInt8Avx512Vnni{"avx512_vnni", G, supported, pack, gemm};

}  // namespace dllm
