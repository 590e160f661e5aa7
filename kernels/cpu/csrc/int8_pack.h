// Repacking Q4_1 / Q8_0 rows for the integer kernels (int8.h): groups of G output columns, each
// group's blocks interleaved so that vector v of a block holds bytes 4v..4v+3 of every column.
// Scalar code, compiled without any target pragma, for every variant.
#pragma once

#include <cstring>

#include "int8.h"

namespace dllm {

// Per (group, block): d[G] fp16, then for Q4_1 m[G] fp16 and 4 vectors of nibbles, for Q8_0 8
// vectors of bytes (stored + 128, unsigned, when q8_unsigned: what `vpdpbusd` multiplies).
template <int64_t G, bool q8_unsigned>
void pack_interleaved(const Weight& w, PackedInt8& out) {
  constexpr int64_t q41_bytes = 4 * G + 4 * 4 * G, q80_bytes = 2 * G + 8 * 4 * G;
  const int64_t blocks = w.cols / 32, groups = (w.rows + G - 1) / G;
  const int64_t stride = w.type == kQ4_1 ? q41_bytes : q80_bytes;
  out.type = w.type;
  out.rows = w.rows;
  out.cols = w.cols;
  out.group = G;
  out.bytes.assign(groups * blocks * stride, 0);
  for (int64_t g = 0; g < groups; ++g)
    for (int64_t b = 0; b < blocks; ++b) {
      uint8_t* dst = out.bytes.data() + (g * blocks + b) * stride;
      if (w.type == kQ8_0 && q8_unsigned) std::memset(dst + 2 * G, 128, 8 * 4 * G);  // padding columns: weight 0
      for (int64_t c = 0; c < G && g * G + c < w.rows; ++c) {
        const uint8_t* row = w.row(g * G + c);
        if (w.type == kQ4_1) {
          const auto& blk = reinterpret_cast<const BlockQ4_1*>(row)[b];
          std::memcpy(dst + 2 * c, &blk.d, 2);
          std::memcpy(dst + 2 * G + 2 * c, &blk.m, 2);
          for (int v = 0; v < 4; ++v) std::memcpy(dst + 4 * G + 4 * G * v + 4 * c, blk.qs + 4 * v, 4);
        } else {
          const auto& blk = reinterpret_cast<const BlockQ8_0*>(row)[b];
          std::memcpy(dst + 2 * c, &blk.d, 2);
          for (int v = 0; v < 8; ++v)
            for (int i = 0; i < 4; ++i)
              dst[2 * G + 4 * G * v + 4 * c + i] = uint8_t(int(blk.qs[4 * v + i]) + (q8_unsigned ? 128 : 0));
        }
      }
    }
}

}  // namespace dllm
