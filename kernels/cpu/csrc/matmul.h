// y = x · wᵀ for the small row counts of a decoding pass (1 to a few hundred rows).
#pragma once

#include <cstdint>

#include "weights.h"

namespace dllm {

// y[M, N] (row stride ldy) = x[M, K] (row stride ldx) · w[N, K]ᵀ, or += when accumulate.
// Splits the N columns over torch's intra-op threads.
void linear(const float* x, int64_t M, int64_t ldx, const Weight& w, float* y, int64_t ldy, bool accumulate);

// The same for columns [n0, n1) only, on the calling thread (inside another parallel region);
// y points at column n0.
void linear_columns(const float* x, int64_t M, int64_t ldx, const Weight& w, float* y, int64_t ldy,
                    bool accumulate, int64_t n0, int64_t n1);

// Up to this many rows, quantized weights are dequantized in registers straight from the stream
// (kernels.cpu tunes it; more rows go through a dequantized panel).
extern int64_t direct_rows_limit;

}  // namespace dllm
