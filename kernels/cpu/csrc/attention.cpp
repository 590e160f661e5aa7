// Attention of a packed pass's rows over their requests' paged KV caches. Work items are (segment,
// kv head, chunk of rows), or per query head for short segments (decoding) so a few rows still
// split over the team. Each row's query is scored against exactly the keys it may see, 8 keys
// at a time, softmaxed and weighted over the values: a row's result never depends on which
// other rows share its item or pass (AR decoding and a verify pass give the same bits), nor on
// which blocks hold its keys. Pools hold fp32 or fp16 keys and values (Segment::half); the
// arithmetic is fp32 either way.
#include "attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "simd.h"

namespace dllm {
namespace {

constexpr int64_t kRowsPerItem = 8;
constexpr int64_t kRowsForHeadItems = 16;  // segments this short get an item per query head
constexpr int64_t kSpanKeys = 32;           // keys read at a time where blocks lie side by side

struct Item {
  int64_t segment, group, first, count;
  int64_t head0, heads;  // the group's query heads this item computes (all, or one)
};

// Cache elements: fp32, or fp16 (uint16_t) widened exactly to fp32 on load; every operation
// after the load is the same for both.
inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const uint16_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
inline float value(float x) { return x; }
inline float value(uint16_t h) { return fp16_to_fp32(h); }

bool same_rows(const Item& a, const Item& b) {
  return a.segment == b.segment && a.group == b.group && a.first == b.first;
}

float* scratch(int slot, int64_t floats) {
  thread_local std::vector<float> buffers[3];
  auto& buffer = buffers[slot];
  if (int64_t(buffer.size()) < floats) buffer.resize(floats);
  return buffer.data();
}

// row[0, n) = softmax(row[0, limit)), zero after
void softmax_prefix(float* row, int64_t limit, int64_t n) {
  // the maximum 8 lanes at a time (the same value in any order; a scalar loop is a chain of
  // dependent compares the compiler may not reorder)
  __m256 top8 = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  int64_t j = 0;
  for (; j + 8 <= limit; j += 8) top8 = _mm256_max_ps(top8, _mm256_loadu_ps(row + j));
  float top = hmax(top8);
  for (; j < limit; ++j) top = std::max(top, row[j]);
  top8 = _mm256_set1_ps(top);
  __m256 total = _mm256_setzero_ps();
  j = 0;
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

// The sum of a vector's 8 lanes in the order scores8 sums each of its keys:
// ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7)).
inline float tree_sum(__m256 v) {
  float l[8];
  _mm256_storeu_ps(l, v);
  return ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
}

// s[j] = q · K[j] for 8 keys: one accumulator per key over the head dimension, then the 8 of
// them reduced and transposed together. Every score is the same whatever block or count of
// keys it is computed in (the tail uses the same order), so a row's attention never depends
// on the other rows of its item.
template <typename T>
inline void scores8(const float* q, const T* K, int64_t d, float* s) {
  __m256 acc[8];
  for (int j = 0; j < 8; ++j) acc[j] = _mm256_setzero_ps();
  for (int64_t c = 0; c < d; c += 8) {
    const __m256 qv = _mm256_loadu_ps(q + c);
    for (int j = 0; j < 8; ++j) acc[j] = _mm256_fmadd_ps(qv, load8(K + j * d + c), acc[j]);
  }
  const __m256 h0 = _mm256_hadd_ps(acc[0], acc[1]), h1 = _mm256_hadd_ps(acc[2], acc[3]);
  const __m256 h2 = _mm256_hadd_ps(acc[4], acc[5]), h3 = _mm256_hadd_ps(acc[6], acc[7]);
  const __m256 h01 = _mm256_hadd_ps(h0, h1), h23 = _mm256_hadd_ps(h2, h3);
  _mm256_storeu_ps(s, _mm256_add_ps(_mm256_permute2f128_ps(h01, h23, 0x20), _mm256_permute2f128_ps(h01, h23, 0x31)));
}

// s[j] = q · K[j] for the first n keys of a span: 8 at a time, then one by one; a span starts
// at a multiple of 8 positions, so every key is scored by the same code whatever the range.
template <typename T>
void scores(const float* q, const T* K, int64_t d, int64_t n, float* s) {
  int64_t j = 0;
  if (d % 8 == 0) {
    for (; j + 8 <= n; j += 8) scores8(q, K + j * d, d, s + j);
    for (; j < n; ++j) {
      __m256 acc = _mm256_setzero_ps();
      for (int64_t c = 0; c < d; c += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + c), load8(K + j * d + c), acc);
      s[j] = tree_sum(acc);
    }
    return;
  }
  for (; j < n; ++j) {  // head dims that are not a multiple of 8 (tiny test models)
    float total = 0.0f;
    for (int64_t c = 0; c < d; ++c) total += q[c] * value(K[j * d + c]);
    s[j] = total;
  }
}

// O[0:d) += sum_{j < n} P[j] V[j, 0:d) over the first n keys of a span: each lane accumulates
// over the keys in order, so a row's output is the same however its keys are cut into blocks (a
// key past a row's limit is never visited). d = 64: all 64 columns of a head at once, 8
// independent FMA chains.
template <typename T>
void weighted_values(const float* P, int64_t n, const T* V, int64_t d, float* O) {
  if (d == 64) {
    __m256 acc[8];
    for (int v = 0; v < 8; ++v) acc[v] = _mm256_loadu_ps(O + 8 * v);
    for (int64_t j = 0; j < n; ++j) {
      const __m256 p = _mm256_set1_ps(P[j]);
      for (int v = 0; v < 8; ++v) acc[v] = _mm256_fmadd_ps(p, load8(V + j * 64 + 8 * v), acc[v]);
    }
    for (int v = 0; v < 8; ++v) _mm256_storeu_ps(O + 8 * v, acc[v]);
    return;
  }
  for (int64_t c = 0; c < d; ++c) {
    float total = O[c];
    for (int64_t j = 0; j < n; ++j) total = std::fma(P[j], value(V[j * d + c]), total);
    O[c] = total;
  }
}

// One item: every (row, query head) of it is a query over the same kv head's keys and values.
// The keys go a span at a time (a pool block, or up to kSpanKeys where the table's blocks are
// side by side in the pool: 8 KB of K or V at d = 64 in fp32, kept in L1), and each span serves
// every query before the next is read: the kv head is read once per item,
// not once per row and head. Each query's arithmetic is the same as alone (scores per key,
// softmax over its prefix, values in key order), so the grouping never changes its bits.
template <typename T>
void attend_item(const Item& item, const Segment& seg, int64_t layer, const AttentionShape& shape,
                 const float* q, int64_t ldq, float* out) {
  const int64_t d = shape.head_dim, first_head = item.group * (shape.heads / shape.kv_heads) + item.head0;
  const int64_t queries = item.count * item.heads;
  const int64_t longest = seg.key_limit(item.first + item.count - 1);  // limits grow with the row
  const float scale = 1.0f / std::sqrt(float(d));
  float* Q = scratch(0, queries * d);
  float* S = scratch(1, queries * longest);
  const int64_t B = seg.block_tokens;
  auto keys_of = [&](const void* pool, int64_t j0) {  // the block holding keys j0.. (j0 % B == 0)
    return static_cast<const T*>(pool) + seg.block_start(j0 / B, layer, item.group, shape.kv_heads, d);
  };
  auto span_of = [&](int64_t j0) {  // keys from j0 that lie in one run of memory
    int64_t span = B;
    while (span < kSpanKeys && j0 + span < longest && seg.table[(j0 + span) / B] == seg.table[j0 / B] + span / B)
      span += B;
    return span;
  };
  auto row_of = [&](int64_t i) { return seg.row0 + item.first + i / item.heads; };
  auto limit_of = [&](int64_t i) { return seg.key_limit(item.first + i / item.heads); };
  auto out_of = [&](int64_t i) { return out + row_of(i) * shape.heads * d + (first_head + i % item.heads) * d; };
  for (int64_t i = 0; i < queries; ++i) {
    const float* src = q + row_of(i) * ldq + (first_head + i % item.heads) * d;
    for (int64_t c = 0; c < d; ++c) Q[i * d + c] = src[c] * scale;
  }
  for (int64_t j0 = 0, span = 0; j0 < longest; j0 += span) {
    span = span_of(j0);
    const T* K = keys_of(seg.k, j0);
    for (int64_t i = 0; i < queries; ++i) {
      const int64_t limit = limit_of(i);
      if (j0 < limit) scores(Q + i * d, K, d, std::min(limit - j0, span), S + i * longest + j0);
    }
  }
  for (int64_t i = 0; i < queries; ++i) {
    softmax_prefix(S + i * longest, limit_of(i), limit_of(i));
    std::fill(out_of(i), out_of(i) + d, 0.0f);
  }
  for (int64_t j0 = 0, span = 0; j0 < longest; j0 += span) {
    span = span_of(j0);
    const T* V = keys_of(seg.v, j0);
    for (int64_t i = 0; i < queries; ++i) {
      const int64_t limit = limit_of(i);
      if (j0 < limit) weighted_values(S + i * longest + j0, std::min(limit - j0, span), V, d, out_of(i));
    }
  }
}

// d floats into the cache: copied, or rounded to the nearest fp16 (ties to even)
void store_row(const float* x, int64_t d, void* cache, int64_t at, bool half) {
  if (!half) {
    std::memcpy(static_cast<float*>(cache) + at, x, d * sizeof(float));
    return;
  }
  uint16_t* out = static_cast<uint16_t*>(cache) + at;
  int64_t c = 0;
  for (; c + 8 <= d; c += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + c), _mm256_cvtps_ph(_mm256_loadu_ps(x + c), _MM_FROUND_TO_NEAREST_INT));
  for (; c < d; ++c) out[c] = _cvtss_sh(x[c], _MM_FROUND_TO_NEAREST_INT);
}

void write_cache(const Segment& seg, int64_t layer, const AttentionShape& shape, const float* k, const float* v,
                 int64_t ld) {
  const int64_t d = shape.head_dim;
  for (int64_t i = 0; i < seg.rows; ++i)
    for (int64_t g = 0; g < shape.kv_heads; ++g) {
      const int64_t pos = seg.pos0 + i;
      const int64_t at = seg.block_start(pos / seg.block_tokens, layer, g, shape.kv_heads, d) + pos % seg.block_tokens * d;
      store_row(k + (seg.row0 + i) * ld + g * d, d, seg.k, at, seg.half);
      store_row(v + (seg.row0 + i) * ld + g * d, d, seg.v, at, seg.half);
    }
}

}  // namespace

void write_keys_values(const std::vector<Segment>& segments, int64_t layer, const AttentionShape& shape,
                       const float* qkv, int64_t ld, const Team& team) {
  const int64_t kv_width = shape.kv_heads * shape.head_dim, q_width = shape.heads * shape.head_dim;
  for (int64_t s = team.index; s < int64_t(segments.size()); s += team.size)
    write_cache(segments[s], layer, shape, qkv + q_width, qkv + q_width + kv_width, ld);
  team.barrier();
}

void attention(const std::vector<Segment>& segments, int64_t layer, const AttentionShape& shape, const float* qkv,
               int64_t ld, float* out, const Team& team) {
  // A request's later segment may overwrite cache slots its earlier one wrote and attends to
  // (a drafted block over the checked drafts): segments go in waves, the n-th segment of each
  // request (its block table) in wave n, each wave writing its keys and values before it attends.
  std::vector<int64_t> wave(segments.size(), 0);
  int64_t waves = 1;
  for (size_t s = 0; s < segments.size(); ++s) {
    for (size_t t = 0; t < s; ++t) wave[s] += segments[t].table == segments[s].table;
    waves = std::max(waves, wave[s] + 1);
  }
  const int64_t kv_width = shape.kv_heads * shape.head_dim, q_width = shape.heads * shape.head_dim;
  for (int64_t w = 0; w < waves; ++w) {
    std::vector<Item> items;  // the same list on every thread, shared out in order
    for (int64_t s = 0; s < int64_t(segments.size()); ++s) {
      if (wave[s] != w) continue;
      if (s % team.size == team.index) write_cache(segments[s], layer, shape, qkv + q_width, qkv + q_width + kv_width, ld);
      // short segments (decoding) per query head, so a few rows still split over the team
      const int64_t rows = segments[s].rows, group = shape.heads / shape.kv_heads;
      const bool per_head = rows <= kRowsForHeadItems;
      for (int64_t g = 0; g < shape.kv_heads; ++g)
        for (int64_t first = 0; first < rows; first += kRowsPerItem)
          for (int64_t h = 0; h < (per_head ? group : 1); ++h)
            items.push_back({s, g, first, std::min(kRowsPerItem, rows - first), per_head ? h : 0, per_head ? 1 : group});
    }
    team.barrier();
    // a thread's share is a run of neighbours; the query heads of one kv head in it merge into
    // one item, which reads the keys and values once for all of them
    const auto [i0, i1] = team.share(int64_t(items.size()));
    for (int64_t i = i0; i < i1;) {
      Item merged = items[i];
      for (++i; i < i1 && same_rows(items[i], merged) && items[i].head0 == merged.head0 + merged.heads; ++i)
        merged.heads += items[i].heads;
      const Segment& seg = segments[merged.segment];
      if (seg.half) attend_item<uint16_t>(merged, seg, layer, shape, qkv, ld, out);
      else attend_item<float>(merged, seg, layer, shape, qkv, ld, out);
    }
    team.barrier();
  }
}

}  // namespace dllm
