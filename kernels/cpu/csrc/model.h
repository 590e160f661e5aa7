// A decoder-only transformer's packed forward pass, whole, in one call: the engine's hot path
// on CPUs (dllm_engine.models.transformer.Transformer.forward_segments is its torch twin).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "attention.h"
#include "profile.h"
#include "weights.h"

namespace dllm {

struct LoRA {  // y[adapter rows] += (x downᵀ) up_scaled; down [rank, in], up_scaled = (scale * up)ᵀ [rank, out]
  Weight down, up_scaled;
  bool present() const { return down.data != nullptr; }
};

struct Projection {
  Weight weight;
  const float* bias = nullptr;  // [out] or null
  LoRA lora;
};

struct Layer {
  const float* attn_norm = nullptr;
  const float* mlp_norm = nullptr;
  const float* q_norm = nullptr;  // [head_dim] (Qwen3) or null
  const float* k_norm = nullptr;
  Projection qkv, o, gate_up, down;
};

struct Config {
  int64_t hidden = 0, heads = 0, kv_heads = 0, head_dim = 0, intermediate = 0, vocab = 0, max_positions = 0;
  int64_t mask_token = -1;
  float eps = 1e-5f;
};

struct Pass {  // what one forward pass computes (built by the caller from its step plans)
  const int64_t* tokens;
  const int64_t* positions;
  int64_t rows;
  const int64_t* adapter_rows;  // rows whose projections add the LoRA (drafted blocks)
  int64_t adapter_count;
  std::vector<Segment> segments;
  const int64_t* out_rows;  // rows whose final-normed hidden state is returned
  int64_t out_count;
};

class Model {
 public:
  Config config;
  Weight embed, head;
  // The most frequent tokens of the model's own replies, as a head of their own: a drafted
  // row (never committed unchecked) needs only them, at a sixth of the full head's cost.
  Weight draft_head;
  const int64_t* draft_ids = nullptr;  // draft_head row -> token id
  const float* final_norm = nullptr;
  const float* mask_embedding = nullptr;
  const float* rope_cos = nullptr;  // [max_positions, head_dim]
  const float* rope_sin = nullptr;
  std::vector<Layer> layers;

  // hidden [out_count, hidden]
  void forward(const Pass& pass, float* hidden) const;
  // greedy head: argmax token and its softmax probability per row, over the whole vocabulary
  // or (draft) over the draft vocabulary only
  void greedy(const float* hidden, int64_t rows, int64_t* tokens, float* confidence, bool draft) const;
  // logits [rows, vocab]
  void logits(const float* hidden, int64_t rows, float* out) const;
  // an empty string when every required part is present and shapes agree, else what is wrong
  std::string check() const;

 private:
  void add_lora(const LoRA& lora, const float* x, int64_t ldx, float* y, int64_t ldy, const Pass& pass) const;
  void project(const Projection& p, Phase phase, const float* x, int64_t rows, int64_t ldx, float* y, int64_t ldy,
               bool accumulate, const Pass& pass) const;
  void embed_tokens(const Pass& pass, float* x) const;
  void position_heads(const Layer& layer, float* qkv, int64_t width, const Pass& pass) const;
  void attention_block(const Layer& layer, int64_t index, float* x, const Pass& pass) const;
  void mlp_block(const Layer& layer, float* x, const Pass& pass) const;
};

}  // namespace dllm
