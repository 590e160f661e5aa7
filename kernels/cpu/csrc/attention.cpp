// Each (segment, kv head, chunk of rows) is one work item: its queries (every head of the group
// for every row) form a small matrix Q; scores S = Q Kᵀ run through the projections'
// micro-kernel, each row's softmax is limited to the keys it may see, and O = S V is
// accumulated in register tiles. One parallel region serves every segment of every request.
#include "attention.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "matmul.h"
#include "simd.h"

namespace dllm {
namespace {

constexpr int64_t kRowsPerItem = 16;

struct Item {
  int64_t segment, group, first, count;
};

float* scratch(int slot, int64_t floats) {
  thread_local std::vector<float> buffers[3];
  auto& buffer = buffers[slot];
  if (int64_t(buffer.size()) < floats) buffer.resize(floats);
  return buffer.data();
}

// row[0, n) = softmax(row[0, limit)), zero after
void softmax_prefix(float* row, int64_t limit, int64_t n) {
  float top = -std::numeric_limits<float>::infinity();
  for (int64_t j = 0; j < limit; ++j) top = std::max(top, row[j]);
  __m256 total = _mm256_setzero_ps();
  __m256 top8 = _mm256_set1_ps(top);
  int64_t j = 0;
  for (; j + 8 <= limit; j += 8) {
    __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(row + j), top8));
    _mm256_storeu_ps(row + j, e);
    total = _mm256_add_ps(total, e);
  }
  float sum = hsum(total);
  for (; j < limit; ++j) {
    row[j] = exp1(row[j] - top);
    sum += row[j];
  }
  const float inv = 1.0f / sum;
  for (j = 0; j < limit; ++j) row[j] *= inv;
  for (; j < n; ++j) row[j] = 0.0f;
}

// O[q, 0:d) = sum_j P[q, j] V[j, 0:d) for QR queries, 8 * CV columns from c: QR x CV
// accumulators, each V row loaded once for all QR queries.
template <int QR, int CV>
void values_tile(const float* P, int64_t ldp, int64_t keys, const float* V, int64_t d, int64_t c, float* O) {
  __m256 acc[QR][CV];
  for (int q = 0; q < QR; ++q)
    for (int v = 0; v < CV; ++v) acc[q][v] = _mm256_setzero_ps();
  for (int64_t j = 0; j < keys; ++j) {
    __m256 row[CV];
    for (int v = 0; v < CV; ++v) row[v] = _mm256_loadu_ps(V + j * d + c + 8 * v);
    for (int q = 0; q < QR; ++q) {
      const __m256 p = _mm256_set1_ps(P[q * ldp + j]);
      for (int v = 0; v < CV; ++v) acc[q][v] = _mm256_fmadd_ps(p, row[v], acc[q][v]);
    }
  }
  for (int q = 0; q < QR; ++q)
    for (int v = 0; v < CV; ++v) _mm256_storeu_ps(O + q * d + c + 8 * v, acc[q][v]);
}

template <int QR>
void values_rows(const float* P, int64_t ldp, int64_t keys, const float* V, int64_t d, float* O) {
  int64_t c = 0;
  for (; c + 32 <= d; c += 32) values_tile<QR, 4>(P, ldp, keys, V, d, c, O);
  for (; c + 8 <= d; c += 8) values_tile<QR, 1>(P, ldp, keys, V, d, c, O);
  for (; c < d; ++c)  // head dims that are not a multiple of 8 (tiny test models)
    for (int q = 0; q < QR; ++q) {
      float s = 0.0f;
      for (int64_t j = 0; j < keys; ++j) s += P[q * ldp + j] * V[j * d + c];
      O[q * d + c] = s;
    }
}

// O = P V for `queries` rows of P
void weighted_values(const float* P, int64_t queries, int64_t keys, const float* V, int64_t d, float* O) {
  int64_t q = 0;
  for (; q + 3 <= queries; q += 3) values_rows<3>(P + q * keys, keys, keys, V, d, O + q * d);
  for (; q < queries; ++q) values_rows<1>(P + q * keys, keys, keys, V, d, O + q * d);
}

void attend_item(const Item& item, const Segment& seg, int64_t layer, const AttentionShape& shape,
                 const float* q, int64_t ldq, float* out) {
  const int64_t d = shape.head_dim, group = shape.heads / shape.kv_heads;
  const int64_t queries = item.count * group;
  const int64_t keys = seg.key_limit(item.first + item.count - 1);  // limits grow with the row
  const float scale = 1.0f / std::sqrt(float(d));
  float* Q = scratch(0, queries * d);
  float* S = scratch(1, queries * keys);
  float* O = scratch(2, queries * d);
  for (int64_t i = 0; i < item.count; ++i)
    for (int64_t h = 0; h < group; ++h) {
      const float* src = q + (seg.row0 + item.first + i) * ldq + (item.group * group + h) * d;
      for (int64_t c = 0; c < d; ++c) Q[(i * group + h) * d + c] = src[c] * scale;
    }
  const int64_t head_offset = (layer * shape.kv_heads + item.group) * seg.max_len * d;
  Weight keys_w{kF32, reinterpret_cast<const uint8_t*>(seg.k + head_offset), keys, d};
  linear_columns(Q, queries, d, keys_w, S, keys, false, 0, keys);
  for (int64_t i = 0; i < item.count; ++i) {
    const int64_t limit = seg.key_limit(item.first + i);
    for (int64_t h = 0; h < group; ++h) softmax_prefix(S + (i * group + h) * keys, limit, keys);
  }
  weighted_values(S, queries, keys, seg.v + head_offset, d, O);
  for (int64_t i = 0; i < item.count; ++i)
    for (int64_t h = 0; h < group; ++h)
      std::memcpy(out + (seg.row0 + item.first + i) * shape.heads * d + (item.group * group + h) * d,
                  O + (i * group + h) * d, d * sizeof(float));
}

void write_cache(const Segment& seg, int64_t layer, const AttentionShape& shape, const float* k, const float* v,
                 int64_t ld) {
  const int64_t d = shape.head_dim;
  for (int64_t i = 0; i < seg.rows; ++i)
    for (int64_t g = 0; g < shape.kv_heads; ++g) {
      const int64_t at = ((layer * shape.kv_heads + g) * seg.max_len + seg.pos0 + i) * d;
      std::memcpy(seg.k + at, k + (seg.row0 + i) * ld + g * d, d * sizeof(float));
      std::memcpy(seg.v + at, v + (seg.row0 + i) * ld + g * d, d * sizeof(float));
    }
}

}  // namespace

void attention(const std::vector<Segment>& segments, int64_t layer, const AttentionShape& shape, const float* qkv,
               int64_t ld, float* out) {
  // A request's later segment may overwrite cache slots its earlier one wrote and attends to
  // (a drafted block over the checked drafts): segments go in waves, the n-th segment of each
  // cache in wave n, each wave writing its keys and values before it attends.
  std::vector<int64_t> wave(segments.size(), 0);
  int64_t waves = 1;
  for (size_t s = 0; s < segments.size(); ++s) {
    for (size_t t = 0; t < s; ++t) wave[s] += segments[t].k == segments[s].k;
    waves = std::max(waves, wave[s] + 1);
  }
  const int64_t kv_width = shape.kv_heads * shape.head_dim, q_width = shape.heads * shape.head_dim;
  for (int64_t w = 0; w < waves; ++w) {
    std::vector<Item> items;
    for (int64_t s = 0; s < int64_t(segments.size()); ++s) {
      if (wave[s] != w) continue;
      write_cache(segments[s], layer, shape, qkv + q_width, qkv + q_width + kv_width, ld);
      for (int64_t g = 0; g < shape.kv_heads; ++g)
        for (int64_t first = 0; first < segments[s].rows; first += kRowsPerItem)
          items.push_back({s, g, first, std::min(kRowsPerItem, segments[s].rows - first)});
    }
    at::parallel_for(0, int64_t(items.size()), 1, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i)
        attend_item(items[i], segments[items[i].segment], layer, shape, qkv, ld, out);
    });
  }
}

}  // namespace dllm
