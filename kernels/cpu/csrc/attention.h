// Attention of a packed pass's segments over their requests' KV caches.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "attention_blocks.h"
#include "team.h"

namespace dllm {

enum Visibility : int64_t { kFull = 0, kCausal = 1, kBlocks = 2 };

// A run of one request's rows in the pass (see dllm_engine.models.transformer.Segment). Its
// keys and values live in fixed-size blocks of a pool ([pool_layers, kv_heads, pool_blocks, then
// a block: [head_dim, block_tokens] for keys, transposed, and [block_tokens, head_dim] for
// values]: a kv head's blocks side by side, so a request's blocks taken in a row are one run of
// memory); `table` lists the request's blocks in position order, so position p is slot
// p % block_tokens of block table[p / block_tokens]. Requests that share a prompt head list the
// same blocks.
struct Segment {
  int64_t row0, rows;    // rows [row0, row0 + rows) of the pass
  int64_t pos0;          // position of the first row in the request's sequence
  int64_t attend_len;    // keys [0, attend_len) of the cache are candidates
  int64_t visibility;    // kFull | kCausal | kBlocks
  int64_t block_size;    // for kBlocks
  void* k;               // the pool's keys and values: fp32, or fp16 when `half`
  void* v;
  const int64_t* table;  // the request's blocks
  int64_t table_len;
  int64_t block_tokens;  // positions a block holds (a multiple of 8)
  int64_t pool_blocks;   // blocks the pool holds
  int64_t layer0;        // the pool layer of this model's layer 0 (a draft head's sit after the target's)
  bool half;             // keys and values stored as fp16 (half the bytes attention reads)

  // keys [0, limit) that row i of the segment may see
  int64_t key_limit(int64_t i) const {
    if (visibility == kCausal) return pos0 + i + 1;
    if (visibility == kBlocks) return std::min(attend_len, pos0 + (i / block_size + 1) * block_size);
    return attend_len;
  }

  // where the slots of table entry `entry` for (layer, kv head g) start, in elements
  int64_t block_start(int64_t entry, int64_t layer, int64_t g, int64_t kv_heads, int64_t head_dim) const {
    return (((layer0 + layer) * kv_heads + g) * pool_blocks + table[entry]) * block_tokens * head_dim;
  }
};

struct AttentionShape {
  int64_t heads, kv_heads, head_dim;
};

// One layer's attention for a pass, computed by the whole team (called by every thread of it):
// each segment's keys and values (from qkv, rows of [q | k | v] after rope, row stride ld) go
// into its cache at its positions, then out[row, heads * head_dim] = softmax(q kᵀ / sqrt(d)) v
// per head, keys limited per row, by one instruction set's block kernels. Ends with a barrier.
void attention(const std::vector<Segment>& segments, int64_t layer, const AttentionShape& shape,
               const AttentionBlocks& kernels, const float* qkv, int64_t ld, float* out, const Team& team);

// Only the first part of that: each segment's keys and values into its cache (a draft head's
// context, which is attended to but attends to nothing). Ends with a barrier.
void write_keys_values(const std::vector<Segment>& segments, int64_t layer, const AttentionShape& shape,
                       const float* qkv, int64_t ld, const Team& team);

}  // namespace dllm
