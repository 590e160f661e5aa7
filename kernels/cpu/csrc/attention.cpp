// Attention of a packed pass's rows over their requests' paged KV caches. Work items are (segment,
// kv head, chunk of rows), or per query head for short segments (decoding) so a few rows still
// split over the team. An item's queries are scored a pool block at a time, several queries
// per step: a block's keys are stored transposed, so one vector holds one dimension of 8 or 16
// keys and a score is a chain of FMAs over the dimensions in order, with no sums across lanes
// (attention_blocks.h, one set of inner kernels per instruction set). Then each query's scores
// are softmaxed and weighted over the values, several queries per value row read. A row's result never depends on which other rows share its item
// or pass (AR decoding and a verify pass give the same bits), nor on which blocks hold its keys.
// Pools hold fp32 or fp16 keys and values (Segment::half); the arithmetic is fp32 either way.
#include "attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "attention_blocks.h"
#include "simd.h"

namespace dllm {
namespace {

constexpr int64_t kRowsPerItem = 8;
constexpr int64_t kRowsForHeadItems = 16;  // segments this short get an item per query head

struct Item {
  int64_t segment, group, first, count;
  int64_t head0, heads;  // the group's query heads this item computes (all, or one)
};

bool same_rows(const Item& a, const Item& b) {
  return a.segment == b.segment && a.group == b.group && a.first == b.first;
}

float* scratch(int slot, int64_t floats) {
  thread_local std::vector<float> buffers[2];
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

// One item: every (row, query head) of it is a query over the same kv head's keys and values,
// in query order (row, then head), so their key limits never fall. Scores go a block of keys at a
// time, each block read once for all of the item's queries (2 KB at d = 64 in fp16, in L1
// meanwhile); values a group of queries at a time over all the keys the group's first query sees
// (its outputs held in registers throughout), then each query's further keys.
void attend_item(const Item& item, const Segment& seg, int64_t layer, const AttentionShape& shape,
                 const AttentionBlocks& kernels, const float* q, int64_t ldq, float* out) {
  const int64_t d = shape.head_dim, first_head = item.group * (shape.heads / shape.kv_heads) + item.head0;
  const int64_t queries = item.count * item.heads, B = seg.block_tokens;
  const int64_t longest = seg.key_limit(item.first + item.count - 1);  // limits grow with the row
  const int64_t lds = (longest + B - 1) / B * B;                       // whole blocks of scores a query
  const float scale = 1.0f / std::sqrt(float(d));
  float* Q = scratch(0, queries * d);
  float* S = scratch(1, queries * lds);
  std::vector<float*> outs(queries);
  std::vector<int64_t> limits(queries);
  for (int64_t i = 0; i < queries; ++i) {
    const int64_t row = seg.row0 + item.first + i / item.heads, head = first_head + i % item.heads;
    const float* src = q + row * ldq + head * d;
    for (int64_t c = 0; c < d; ++c) Q[i * d + c] = src[c] * scale;
    outs[i] = out + row * shape.heads * d + head * d;
    limits[i] = seg.key_limit(item.first + i / item.heads);
  }
  const int64_t element = seg.half ? 2 : 4, blocks = lds / B;
  std::vector<const char*> keys(blocks), values(blocks);  // the item's kv head in each of its blocks
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t at = seg.block_start(b, layer, item.group, shape.kv_heads, d) * element;
    keys[b] = static_cast<const char*>(seg.k) + at;
    values[b] = static_cast<const char*>(seg.v) + at;
  }
  for (int64_t b = 0; b < blocks; ++b)  // scores; past a query's limit they are never read
    for (int64_t i = 0; i < queries; i += kernels.score_queries) {
      const int r = int(std::min<int64_t>(kernels.score_queries, queries - i));
      if (limits[i + r - 1] > b * B) kernels.score(r, Q + i * d, d, keys[b], seg.half, B, S + i * lds + b * B, lds);
    }
  for (int64_t i = 0; i < queries; ++i) {
    softmax_prefix(S + i * lds, limits[i], limits[i]);
    std::fill(outs[i], outs[i] + d, 0.0f);
  }
  for (int64_t i = 0; i < queries; i += kernels.value_queries) {
    const int r = int(std::min<int64_t>(kernels.value_queries, queries - i));
    const int64_t shared = limits[i];  // the group's first query sees the fewest keys
    kernels.value(r, S + i * lds, lds, 0, shared, values.data(), B, seg.half, d, &outs[i]);
    for (int k = 1; k < r; ++k)  // then each query's own further keys, still in key order
      if (limits[i + k] > shared)
        kernels.value(1, S + (i + k) * lds, lds, shared, limits[i + k], values.data(), B, seg.half, d, &outs[i + k]);
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

// a key into its block's transposed slots: dimension c at c * B + slot
void store_key(const float* x, int64_t d, void* cache, int64_t block, int64_t slot, int64_t B, bool half) {
  for (int64_t c = 0; c < d; ++c) {
    const int64_t at = block + c * B + slot;
    if (half) static_cast<uint16_t*>(cache)[at] = _cvtss_sh(x[c], _MM_FROUND_TO_NEAREST_INT);
    else static_cast<float*>(cache)[at] = x[c];
  }
}

void write_cache(const Segment& seg, int64_t layer, const AttentionShape& shape, const float* k, const float* v,
                 int64_t ld) {
  const int64_t d = shape.head_dim, B = seg.block_tokens;
  for (int64_t i = 0; i < seg.rows; ++i)
    for (int64_t g = 0; g < shape.kv_heads; ++g) {
      const int64_t pos = seg.pos0 + i, block = seg.block_start(pos / B, layer, g, shape.kv_heads, d);
      store_key(k + (seg.row0 + i) * ld + g * d, d, seg.k, block, pos % B, B, seg.half);
      store_row(v + (seg.row0 + i) * ld + g * d, d, seg.v, block + pos % B * d, seg.half);
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

void attention(const std::vector<Segment>& segments, int64_t layer, const AttentionShape& shape,
               const AttentionBlocks& kernels, const float* qkv, int64_t ld, float* out, const Team& team) {
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
      attend_item(merged, segments[merged.segment], layer, shape, kernels, qkv, ld, out);
    }
    team.barrier();
  }
}

}  // namespace dllm
