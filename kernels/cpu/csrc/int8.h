// Integer matmuls over quantized activations: the projections and heads of a pass when the
// weights are llama.cpp blocks (Q4_1, Q8_0) and activations are 8-bit (the default).
//
// Each input row is quantized once per matmul, 32 values at a time, to int8 with one fp32 scale
// (and the block's sum, for Q4_1's min term and for Q8_0 weights read as unsigned bytes): the
// dot products are then exact integer sums, scaled once per block. Weights are repacked at load
// so that one vector register holds 4 consecutive weights of each of 8 (AVX2) or 16 (AVX-512)
// output columns: a multiply-add instruction then computes 8 or 16 partial dot products at
// once, each lane is one output column (no horizontal sums), and a weight block unpacked into
// registers is used for every row of the pass.
//
// Every variant computes the same integers and the same fp32 operations per output, in the same
// order, whatever the row count or the tile: results are bit-identical across variants, row
// counts and threads (a row's logits never depend on what else is in the pass).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "weights.h"

namespace dllm {

// A pass's activations for one matmul: row r's block b is d[r, b] * q[r, 32 b .. 32 b + 31].
// A view into QuantizedStorage: every thread of a pass makes its own copy of the view, and the
// threads write disjoint rows through it.
struct QuantizedRows {
  int64_t rows = 0, cols = 0, blocks = 0;
  int8_t* q = nullptr;     // [rows, cols]
  float* d = nullptr;      // [rows, blocks]: max |x| / 127 (0 for an all-zero block)
  int32_t* sum = nullptr;  // [rows, blocks]: sum of the block's q
  float* scaled_sum = nullptr;  // [rows, blocks]: d * sum (Q4_1's min term multiplies it)

  const int8_t* row(int64_t r) const { return q + r * cols; }
};

struct QuantizedStorage {
  std::vector<int8_t> q;
  std::vector<float> d;
  std::vector<int32_t> sum;
  std::vector<float> scaled_sum;

  void reserve(int64_t rows, int64_t cols);  // not while a pass uses it
  QuantizedRows view(int64_t rows, int64_t cols);  // within what was reserved
};

// Rows [r0, r1) of x (row stride ldx, `out.cols` values each) into out.
// q = round-to-nearest-even(x * (127 / max|x|)), so |q| <= 127.
void quantize_rows(const float* x, int64_t ldx, int64_t r0, int64_t r1, const QuantizedRows& out);

// The same values as floats (q * d): what the integer matmul multiplies (tests, the torch twin).
void dequantize_rows(const QuantizedRows& in, float* out);

// A Q4_1 or Q8_0 weight [rows, cols] repacked for one variant (its layout is the variant's own).
struct PackedInt8 {
  int type = kQ4_1;
  int64_t rows = 0, cols = 0;
  int64_t group = 8;  // output columns per interleaved group
  std::vector<uint8_t> bytes;
  bool empty() const { return bytes.empty(); }
};

struct Int8Variant {
  const char* name;
  int64_t group;  // columns per group: matmuls split columns in multiples of it
  bool (*supported)();
  void (*pack)(const Weight& w, PackedInt8& out);
  // y[r, n - n0] (row stride ldy) = (or +=) sum_k x[r, k] w[n, k], every row of x, columns
  // [n0, n1): n0 a multiple of `group`, n1 too or the matrix's last column.
  void (*gemm)(const QuantizedRows& x, const PackedInt8& w, int64_t n0, int64_t n1, float* y, int64_t ldy,
               bool accumulate);
};

extern const Int8Variant kInt8Avx2;
extern const Int8Variant kInt8Avx512Vnni;

// "auto": the fastest variant this CPU runs; else a variant by name (nullptr: unknown or unsupported)
const Int8Variant* int8_variant(const std::string& name);
std::vector<std::string> int8_variants_supported();

}  // namespace dllm
