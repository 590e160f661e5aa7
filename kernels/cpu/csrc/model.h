// A decoder-only transformer's packed forward pass, whole, in one call: the engine's hot path
// on CPUs (dllm_engine.models.transformer.Transformer.forward_segments is its torch twin).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "attention.h"
#include "int8.h"
#include "profile.h"
#include "weights.h"

namespace dllm {

struct LoRA {  // y[adapter rows] += (x downᵀ) up_scaled; down [rank, in], up_scaled = (scale * up)ᵀ [rank, out]
  Weight down, up_scaled;
  bool present() const { return down.data != nullptr; }
};

struct Projection {
  Weight weight;
  PackedInt8 packed;  // the weight repacked for the integer matmul (8-bit activations only)
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
  // hidden states after the layers in tap_layers, for the rows in tap_rows (a draft head's
  // context: taps[tap_row, j * hidden ..] is the output of layer tap_layers[j] at that row)
  const int64_t* tap_layers = nullptr;
  int64_t tap_layer_count = 0;
  const int64_t* tap_rows = nullptr;
  int64_t tap_row_count = 0;
  float* taps = nullptr;
};

class Model {
 public:
  Config config;
  Weight embed, head;
  PackedInt8 head_packed, draft_head_packed;
  // The most frequent tokens of the model's own replies, as a head of their own: a drafted
  // row (never committed unchecked) needs only them, at a sixth of the full head's cost.
  Weight draft_head;
  const int64_t* draft_ids = nullptr;  // draft_head row -> token id
  const float* final_norm = nullptr;
  const float* mask_embedding = nullptr;
  const float* rope_cos = nullptr;  // [max_positions, head_dim]
  const float* rope_sin = nullptr;
  std::vector<Layer> layers;
  // A draft head's context input (dllm_engine/models/draft_head.py): target features are
  // projected by context_fc and normed by context_norm, and every layer's keys and values of
  // them go into the cache. Absent in a plain model.
  Projection context_fc;
  const float* context_norm = nullptr;
  // the integer kernels (8-bit activations) or null: fp32 activations, dequantized weights
  const Int8Variant* int8 = nullptr;
  // attention's inner kernels: the same instruction set as the integer kernels' (the widest
  // this CPU runs with fp32 activations); every set gives the same bits
  const AttentionBlocks* attention_kernels = &kAttentionAvx2;
  int threads = 1;  // the team size of a pass on idle cores (see team_size())

  // 8-bit activations with this variant ("auto": the best this CPU has), or fp32 ("fp32");
  // repacks every quantized weight, and takes the attention kernels of the variant's
  // instruction set. An error message, or "" when done.
  std::string set_activations(const std::string& mode);
  // hidden [out_count, hidden] (and pass.taps)
  void forward(const Pass& pass, float* hidden) const;
  // greedy head: argmax token and its softmax probability per row, over the whole vocabulary
  // or (draft) over the draft vocabulary only
  void greedy(const float* hidden, int64_t rows, int64_t* tokens, float* confidence, bool draft) const;
  // logits [rows, vocab]
  void logits(const float* hidden, int64_t rows, float* out) const;
  // a draft head's context: features [pass.rows, context_fc.weight.cols] at pass.positions,
  // written as keys and values of every layer into pass.segments' caches
  void context(const Pass& pass, const float* features) const;
  // an empty string when every required part is present and shapes agree, else what is wrong
  std::string check() const;

 private:
  // a pass's buffers, shared by its team (one pass at a time per model)
  mutable std::vector<float> x_, normed_, qkv_, attn_, gate_up_, act_;
  mutable QuantizedStorage quantized_;
  mutable SpinBarrier barrier_;
  // Cores shared with other work: a teammate that is not scheduled makes the others wait at
  // every barrier, and a pass then takes several times longer than one thread alone. A pass
  // whose threads waited most of it runs the next ones alone, trying the team again later.
  mutable int team_size_ = 0;  // 0: not decided yet (threads)
  mutable int solo_passes_ = 0;
  mutable double last_wait_fraction_ = 0.0;

 public:
  int team_size() const { return team_size_ ? team_size_ : threads; }
  double last_wait_fraction() const { return last_wait_fraction_; }

 private:
  void observe_team(int size, uint64_t cycles) const;

  void prepare_buffers(int64_t rows) const;
  void norm_rows(const float* x, const float* weight, int64_t rows, float* out, const Team& team) const;
  void project(const Projection& p, Phase phase, const float* x, int64_t rows, int64_t ldx, float* y, int64_t ldy,
               bool accumulate, const Pass& pass, const Team& team) const;
  void matmul(const Weight& w, const PackedInt8& packed, const QuantizedRows& quantized, const float* x,
              int64_t rows, int64_t ldx, float* y, int64_t ldy, bool accumulate, int64_t n0, int64_t n1) const;
  void add_lora(const LoRA& lora, const float* x, int64_t ldx, float* y, int64_t ldy, const Pass& pass,
                int64_t n0, int64_t n1) const;
  void embed_tokens(const Pass& pass, float* x, const Team& team) const;
  void position_heads(const Layer& layer, float* qkv, int64_t width, const Pass& pass, const Team& team) const;
  void attention_block(const Layer& layer, int64_t index, float* x, const Pass& pass, const Team& team) const;
  void mlp_block(const Layer& layer, float* x, const Pass& pass, const Team& team) const;
  void tap(const Pass& pass, int64_t layer, const float* x, const Team& team) const;
};

}  // namespace dllm
