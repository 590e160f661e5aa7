// The inner kernels of attention, one set per instruction set (attention.cpp drives them). Both
// work a pool block at a time. A score is a chain of FMAs over the head's dimensions in order,
// one lane per key (a block's keys are stored transposed: dimension c of key j at c * B + j);
// an output lane accumulates its keys' weighted values in key order. So every set gives the
// same bits, whatever the queries a call serves: a row's attention never depends on the rows
// beside it, nor on the CPU's vector width.
#pragma once

#include <cstdint>
#include <string>

namespace dllm {

struct AttentionBlocks {
  const char* name;
  bool (*supported)();
  int score_queries;  // the most queries one score call serves
  int value_queries;  // the most queries one value call serves
  // S[r, 0:B) = Q[r] · key j of one block, r < count: Q rows d apart, S rows lds apart; keys
  // fp32 or fp16 (`half`), B a multiple of 8
  void (*score)(int count, const float* Q, int64_t d, const void* keys, bool half, int64_t B, float* S, int64_t lds);
  // O[r][0:d) += sum_{begin <= j < end} P[r, j] V[j, 0:d), r < count, j in order: value j is row
  // j % B of block blocks[j / B]; P rows lds apart
  void (*value)(int count, const float* P, int64_t lds, int64_t begin, int64_t end, const char* const* blocks,
                int64_t B, bool half, int64_t d, float* const* O);
};

extern const AttentionBlocks kAttentionAvx2;
extern const AttentionBlocks kAttentionAvx512;

// by name ("auto": the widest this CPU runs); nullptr: unknown or unsupported
const AttentionBlocks* attention_blocks(const std::string& name);

}  // namespace dllm
