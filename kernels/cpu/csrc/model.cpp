#include "model.h"

#include <ATen/Parallel.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "matmul.h"
#include "profile.h"
#include "simd.h"
#include "team.h"

namespace dllm {

Profile profile;

namespace {

// Column shares are whole groups of the widest integer kernel, so every variant splits alike.
constexpr int64_t kColumnAlign = 16;

void rms_norm(const float* x, const float* weight, int64_t n, float eps, float* out) {
  __m256 squares = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 v = _mm256_loadu_ps(x + i);
    squares = _mm256_fmadd_ps(v, v, squares);
  }
  float sum = hsum(squares);
  for (; i < n; ++i) sum += x[i] * x[i];
  const float inv = 1.0f / std::sqrt(sum / float(n) + eps);
  for (i = 0; i < n; ++i) out[i] = x[i] * inv * weight[i];
}

// rotate-half rotary embedding of one head vector in place
void rotate(float* x, const float* cos, const float* sin, int64_t d) {
  const int64_t half = d / 2;
  for (int64_t i = 0; i < half; ++i) {
    const float a = x[i], b = x[i + half];
    x[i] = a * cos[i] - b * sin[i];
    x[i + half] = b * cos[i + half] + a * sin[i + half];
  }
}

// out[i] = silu(gate[i]) * up[i]
void swiglu(const float* gate, const float* up, int64_t n, float* out) {
  int64_t i = 0;
  const __m256 one = _mm256_set1_ps(1.0f);
  for (; i + 8 <= n; i += 8) {
    __m256 g = _mm256_loadu_ps(gate + i);
    __m256 e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), g));
    __m256 silu = _mm256_div_ps(g, _mm256_add_ps(one, e));
    _mm256_storeu_ps(out + i, _mm256_mul_ps(silu, _mm256_loadu_ps(up + i)));
  }
  for (; i < n; ++i) out[i] = gate[i] / (1.0f + exp1(-gate[i])) * up[i];
}

std::vector<float>& local_buffer(int slot, int64_t floats) {
  thread_local std::vector<float> buffers[3];
  auto& b = buffers[slot];
  if (int64_t(b.size()) < floats) b.resize(floats);
  return b;
}

void grow(std::vector<float>& v, int64_t floats) {
  if (int64_t(v.size()) < floats) v.resize(floats);
}

struct RowStats {  // running argmax and softmax denominator of one row over part of the vocab
  float max = -std::numeric_limits<float>::infinity();
  int64_t argmax = 0;
  float sum = 0.0f;  // sum of exp(logit - max)
};

// Timed on the team's first thread only: a phase's time then includes its wait at the barrier.
struct LeaderTimed {
  LeaderTimed(Phase phase, const Team& team) : on(team.leader() && profile.enabled) {
    if (on) timed = new Timed(phase);
  }
  ~LeaderTimed() { delete timed; }
  bool on;
  Timed* timed = nullptr;
};

}  // namespace

std::string Model::set_activations(const std::string& mode) {
  if (mode == "fp32") {
    int8 = nullptr;
    attention_kernels = attention_blocks("auto");
    return "";
  }
  const Int8Variant* variant = int8_variant(mode);
  if (variant == nullptr) return "no integer kernel '" + mode + "' runs on this CPU";
  int8 = variant;
  const AttentionBlocks* same_set = attention_blocks(std::string(variant->name) == "avx2" ? "avx2" : "auto");
  attention_kernels = same_set != nullptr ? same_set : &kAttentionAvx2;
  auto repack = [&](const Weight& w, PackedInt8& out) {
    out = PackedInt8{};
    if (w.data != nullptr && (w.type == kQ4_1 || w.type == kQ8_0)) variant->pack(w, out);
  };
  for (Layer& l : layers)
    for (Projection* p : {&l.qkv, &l.o, &l.gate_up, &l.down}) repack(p->weight, p->packed);
  repack(context_fc.weight, context_fc.packed);
  repack(head, head_packed);
  repack(draft_head, draft_head_packed);
  return "";
}

void Model::prepare_buffers(int64_t rows) const {
  const Config& c = config;
  const int64_t width = (c.heads + 2 * c.kv_heads) * c.head_dim;
  grow(x_, rows * c.hidden);
  grow(normed_, rows * std::max(c.hidden, c.heads * c.head_dim));
  grow(qkv_, rows * width);
  grow(attn_, rows * c.heads * c.head_dim);
  grow(gate_up_, rows * 2 * c.intermediate);
  grow(act_, rows * c.intermediate);
  quantized_.reserve(rows, std::max(c.hidden, c.intermediate));
}

void Model::norm_rows(const float* x, const float* weight, int64_t rows, float* out, const Team& team) const {
  LeaderTimed timed(kNorm, team);
  const auto [r0, r1] = team.share(rows);
  for (int64_t r = r0; r < r1; ++r) rms_norm(x + r * config.hidden, weight, config.hidden, config.eps, out + r * config.hidden);
  team.barrier();
}

// Columns [n0, n1) of x wᵀ into y (which points at column n0): the integer kernel over the
// quantized rows, or fp32.
void Model::matmul(const Weight& w, const PackedInt8& packed, const QuantizedRows& quantized, const float* x,
                   int64_t rows, int64_t ldx, float* y, int64_t ldy, bool accumulate, int64_t n0, int64_t n1) const {
  if (n0 >= n1) return;
  if (int8 != nullptr && !packed.empty()) int8->gemm(quantized, packed, n0, n1, y, ldy, accumulate);
  else linear_columns(x, rows, ldx, w, y, ldy, accumulate, n0, n1);
}

void Model::project(const Projection& p, Phase phase, const float* x, int64_t rows, int64_t ldx, float* y,
                    int64_t ldy, bool accumulate, const Pass& pass, const Team& team) const {
  const QuantizedRows quantized = quantized_.view(rows, p.weight.cols);
  if (int8 != nullptr && !p.packed.empty()) {  // each input row quantized once, for every column
    LeaderTimed timed(kQuantize, team);
    const auto [r0, r1] = team.share(rows);
    quantize_rows(x, ldx, r0, r1, quantized);
    team.barrier();
  }
  {
    LeaderTimed timed(phase, team);
    const auto [n0, n1] = team.share(p.weight.rows, kColumnAlign);
    matmul(p.weight, p.packed, quantized, x, rows, ldx, y + n0, ldy, accumulate, n0, n1);
    if (p.bias != nullptr)
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t n = n0; n < n1; ++n) y[r * ldy + n] += p.bias[n];
    // the adapter on the same columns: this thread's own, so no barrier before it
    if (p.lora.present() && pass.adapter_count > 0) add_lora(p.lora, x, ldx, y, ldy, pass, n0, n1);
  }
  team.barrier();
}

// The adapter's rows gathered and taken down to the rank (by every thread: a few thousand
// MACs), then added back up on columns [n0, n1) as rank axpys per row: no dot products of
// length rank, whose horizontal sums would cost more than their arithmetic.
void Model::add_lora(const LoRA& lora, const float* x, int64_t ldx, float* y, int64_t ldy, const Pass& pass,
                     int64_t n0, int64_t n1) const {
  const int64_t count = pass.adapter_count, in = lora.down.cols, rank = lora.down.rows, out = lora.up_scaled.cols;
  float* gathered = local_buffer(0, count * in).data();
  float* low = local_buffer(1, count * rank).data();
  for (int64_t a = 0; a < count; ++a) std::memcpy(gathered + a * in, x + pass.adapter_rows[a] * ldx, in * sizeof(float));
  linear_columns(gathered, count, in, lora.down, low, rank, false, 0, rank);
  const float* up = reinterpret_cast<const float*>(lora.up_scaled.data);
  for (int64_t a = 0; a < count; ++a) {
    float* dst = y + pass.adapter_rows[a] * ldy;
    const float* coeff = low + a * rank;
    for (int64_t t = n0; t < n1; t += 64) {  // 64 columns: 8 independent accumulators, rank FMAs each
      const int64_t width = std::min<int64_t>(64, n1 - t);
      if (width < 64) {
        for (int64_t n = t; n < t + width; ++n)
          for (int64_t r = 0; r < rank; ++r) dst[n] += coeff[r] * up[r * out + n];
        continue;
      }
      __m256 acc[8];
      for (int q = 0; q < 8; ++q) acc[q] = _mm256_loadu_ps(dst + t + 8 * q);
      for (int64_t r = 0; r < rank; ++r) {
        const __m256 c = _mm256_set1_ps(coeff[r]);
        const float* row = up + r * out + t;
        for (int q = 0; q < 8; ++q) acc[q] = _mm256_fmadd_ps(c, _mm256_loadu_ps(row + 8 * q), acc[q]);
      }
      for (int q = 0; q < 8; ++q) _mm256_storeu_ps(dst + t + 8 * q, acc[q]);
    }
  }
}

// q and k heads: their norms (Qwen3) and the rotary embedding of each row's position
void Model::position_heads(const Layer& layer, float* qkv, int64_t width, const Pass& pass, const Team& team) const {
  LeaderTimed timed(kRope, team);
  const Config& c = config;
  const auto [r0, r1] = team.share(pass.rows);
  for (int64_t r = r0; r < r1; ++r) {
    const float* cos = rope_cos + pass.positions[r] * c.head_dim;
    const float* sin = rope_sin + pass.positions[r] * c.head_dim;
    for (int64_t h = 0; h < c.heads + c.kv_heads; ++h) {
      float* head = qkv + r * width + h * c.head_dim;
      if (layer.q_norm != nullptr) rms_norm(head, h < c.heads ? layer.q_norm : layer.k_norm, c.head_dim, c.eps, head);
      rotate(head, cos, sin, c.head_dim);
    }
  }
  team.barrier();
}

void Model::attention_block(const Layer& layer, int64_t index, float* x, const Pass& pass, const Team& team) const {
  const Config& c = config;
  const int64_t rows = pass.rows, q_width = c.heads * c.head_dim, kv_width = c.kv_heads * c.head_dim;
  const int64_t width = q_width + 2 * kv_width;
  float* normed = normed_.data();
  float* qkv = qkv_.data();
  float* attn = attn_.data();
  norm_rows(x, layer.attn_norm, rows, normed, team);
  project(layer.qkv, kQkv, normed, rows, c.hidden, qkv, width, false, pass, team);
  position_heads(layer, qkv, width, pass, team);
  {
    LeaderTimed timed(kAttention, team);
    attention(pass.segments, index, AttentionShape{c.heads, c.kv_heads, c.head_dim}, *attention_kernels, qkv, width, attn,
              team);
  }
  project(layer.o, kOut, attn, rows, q_width, x, c.hidden, true, pass, team);
}

void Model::mlp_block(const Layer& layer, float* x, const Pass& pass, const Team& team) const {
  const Config& c = config;
  const int64_t rows = pass.rows;
  float* normed = normed_.data();
  float* gate_up = gate_up_.data();
  float* act = act_.data();
  norm_rows(x, layer.mlp_norm, rows, normed, team);
  project(layer.gate_up, kGateUp, normed, rows, c.hidden, gate_up, 2 * c.intermediate, false, pass, team);
  {
    LeaderTimed timed(kSwiglu, team);
    const auto [r0, r1] = team.share(rows);
    for (int64_t r = r0; r < r1; ++r)
      swiglu(gate_up + r * 2 * c.intermediate, gate_up + r * 2 * c.intermediate + c.intermediate, c.intermediate,
             act + r * c.intermediate);
    team.barrier();
  }
  project(layer.down, kDown, act, rows, c.intermediate, x, c.hidden, true, pass, team);
}

void Model::embed_tokens(const Pass& pass, float* x, const Team& team) const {
  LeaderTimed timed(kEmbed, team);
  const auto [r0, r1] = team.share(pass.rows);
  for (int64_t r = r0; r < r1; ++r) {
    float* row = x + r * config.hidden;
    if (pass.tokens[r] == config.mask_token && mask_embedding != nullptr) std::memcpy(row, mask_embedding, config.hidden * 4);
    else dequant_row(embed, pass.tokens[r], row);
  }
  team.barrier();
}

void Model::tap(const Pass& pass, int64_t layer, const float* x, const Team& team) const {
  for (int64_t j = 0; j < pass.tap_layer_count; ++j) {
    if (pass.tap_layers[j] != layer) continue;
    const auto [t0, t1] = team.share(pass.tap_row_count);
    const int64_t hidden = config.hidden;
    for (int64_t t = t0; t < t1; ++t)
      std::memcpy(pass.taps + (t * pass.tap_layer_count + j) * hidden, x + pass.tap_rows[t] * hidden, hidden * 4);
  }  // the next op's barrier orders these copies before x changes
}

// A team whose threads spent over this share of the pass waiting for each other is not getting
// its cores (quiet, the waits are the ops' imbalance: 10-30% measured; a core taken by another
// process: 90%).
constexpr double kContendedWaitFraction = 0.6;
constexpr int kSoloPasses = 64;  // passes run alone before the team is tried again

void Model::observe_team(int size, uint64_t cycles) const {
  if (size <= 1) {
    if (threads > 1 && ++solo_passes_ >= kSoloPasses) team_size_ = threads;  // try the team again
    return;
  }
  uint64_t waited = 0;
  for (int t = 0; t < size; ++t) waited = std::max(waited, barrier_.waited(t));
  last_wait_fraction_ = cycles ? double(waited) / double(cycles) : 0.0;
  if (last_wait_fraction_ > kContendedWaitFraction) {
    team_size_ = 1;
    solo_passes_ = 0;
  }
}

void Model::forward(const Pass& pass, float* hidden) const {
  const Config& c = config;
  if (profile.enabled) profile.passes += 1;
  prepare_buffers(pass.rows);
  float* x = x_.data();
  const int size = team_size();
  const uint64_t start = __rdtsc();
#pragma omp parallel num_threads(size)
  {
    const Team team = Team::join(barrier_);
    embed_tokens(pass, x, team);
    for (int64_t i = 0; i < int64_t(layers.size()); ++i) {
      attention_block(layers[i], i, x, pass, team);
      mlp_block(layers[i], x, pass, team);
      tap(pass, i, x, team);
    }
    LeaderTimed timed(kFinalNorm, team);
    const auto [o0, o1] = team.share(pass.out_count);
    for (int64_t o = o0; o < o1; ++o)
      rms_norm(x + pass.out_rows[o] * c.hidden, final_norm, c.hidden, c.eps, hidden + o * c.hidden);
  }
  observe_team(size, __rdtsc() - start);
}

void Model::context(const Pass& pass, const float* features) const {
  const Config& c = config;
  const int64_t rows = pass.rows, width = (c.heads + 2 * c.kv_heads) * c.head_dim;
  prepare_buffers(rows);
  quantized_.reserve(rows, context_fc.weight.cols);
  float* projected = x_.data();
  float* normed = normed_.data();
  float* qkv = qkv_.data();
  const AttentionShape shape{c.heads, c.kv_heads, c.head_dim};
#pragma omp parallel num_threads(team_size())
  {
    const Team team = Team::join(barrier_);
    project(context_fc, kQkv, features, rows, context_fc.weight.cols, projected, c.hidden, false, pass, team);
    norm_rows(projected, context_norm, rows, normed, team);
    for (int64_t i = 0; i < int64_t(layers.size()); ++i) {  // no input norm: DFlash feeds the context as is
      project(layers[i].qkv, kQkv, normed, rows, c.hidden, qkv, width, false, pass, team);
      position_heads(layers[i], qkv, width, pass, team);
      LeaderTimed timed(kAttention, team);
      write_keys_values(pass.segments, i, shape, qkv, width, team);
    }
  }
}

void Model::logits(const float* hidden, int64_t rows, float* out) const {
  quantized_.reserve(rows, config.hidden);
  const QuantizedRows quantized = quantized_.view(rows, config.hidden);
#pragma omp parallel num_threads(team_size())
  {
    const Team team = Team::join(barrier_);
    LeaderTimed timed(kHead, team);
    if (int8 != nullptr && !head_packed.empty()) {
      const auto [r0, r1] = team.share(rows);
      quantize_rows(hidden, config.hidden, r0, r1, quantized);
      team.barrier();
    }
    const auto [n0, n1] = team.share(config.vocab, kColumnAlign);
    matmul(head, head_packed, quantized, hidden, rows, config.hidden, out + n0, config.vocab, false, n0, n1);
  }
}

void Model::greedy(const float* hidden, int64_t rows, int64_t* tokens, float* confidence, bool draft) const {
  const Weight& head = draft ? draft_head : this->head;
  const PackedInt8& packed = draft ? draft_head_packed : head_packed;
  // Each part of the vocabulary is a thread's: logits a chunk at a time into a small buffer,
  // folded into per-row running stats; the parts are merged at the end. No [rows, vocab] array.
  constexpr int64_t kChunk = 240;  // a multiple of the column groups and of the fp32 panel
  const int64_t vocab = head.rows;
  const int size = team_size();
  std::vector<RowStats> stats(size * rows);
  quantized_.reserve(rows, config.hidden);
  const QuantizedRows quantized = quantized_.view(rows, config.hidden);
#pragma omp parallel num_threads(size)
  {
    const Team team = Team::join(barrier_);
    LeaderTimed timed(kHead, team);
    if (int8 != nullptr && !packed.empty()) {
      const auto [r0, r1] = team.share(rows);
      quantize_rows(hidden, config.hidden, r0, r1, quantized);
      team.barrier();
    }
    const auto [lo, hi] = team.share(vocab, kColumnAlign);
    float* chunk = local_buffer(2, rows * kChunk).data();
    for (int64_t v0 = lo; v0 < hi; v0 += kChunk) {
      const int64_t width = std::min(kChunk, hi - v0);
      matmul(head, packed, quantized, hidden, rows, config.hidden, chunk, kChunk, false, v0, v0 + width);
      for (int64_t r = 0; r < rows; ++r) {
        RowStats& s = stats[team.index * rows + r];
        const float* l = chunk + r * kChunk;
        int64_t best = 0;
        for (int64_t j = 1; j < width; ++j) best = l[j] > l[best] ? j : best;
        if (l[best] > s.max) {
          s.sum *= exp1(s.max - l[best]);
          s.max = l[best];
          s.argmax = v0 + best;
        }
        __m256 total = _mm256_setzero_ps(), top = _mm256_set1_ps(s.max);
        int64_t j = 0;
        for (; j + 8 <= width; j += 8) total = _mm256_add_ps(total, exp8(_mm256_sub_ps(_mm256_loadu_ps(l + j), top)));
        float sum = hsum(total);
        for (; j < width; ++j) sum += exp1(l[j] - s.max);
        s.sum += sum;
      }
    }
  }
  for (int64_t r = 0; r < rows; ++r) {
    RowStats best;
    for (int64_t part = 0; part < size; ++part) {  // parts in vocab order: ties keep the lowest id
      const RowStats& s = stats[part * rows + r];
      if (s.sum == 0.0f) continue;
      if (s.max > best.max) {
        best.sum = best.sum * exp1(best.max - s.max) + s.sum;
        best.max = s.max;
        best.argmax = s.argmax;
      } else {
        best.sum += s.sum * exp1(s.max - best.max);
      }
    }
    tokens[r] = draft ? draft_ids[best.argmax] : best.argmax;
    confidence[r] = 1.0f / best.sum;
  }
}

std::string Model::check() const {
  const Config& c = config;
  if (c.hidden <= 0 || c.heads <= 0 || c.kv_heads <= 0 || c.heads % c.kv_heads != 0 || c.head_dim % 2 != 0)
    return "bad config";
  if (embed.data == nullptr || head.data == nullptr || final_norm == nullptr || rope_cos == nullptr || rope_sin == nullptr)
    return "embed, head, final_norm and rope tables are required";
  if (embed.cols != c.hidden || head.cols != c.hidden || head.rows != c.vocab) return "embed/head shape";
  if (draft_head.data != nullptr && (draft_ids == nullptr || draft_head.cols != c.hidden || draft_head.rows > c.vocab))
    return "draft head shape";
  if (threads < 1) return "a pass needs at least one thread";
  if (context_fc.weight.data != nullptr && (context_norm == nullptr || context_fc.weight.rows != c.hidden))
    return "a draft head's context needs its norm and a projection to the model width";
  const int64_t width = (c.heads + 2 * c.kv_heads) * c.head_dim;
  for (size_t i = 0; i < layers.size(); ++i) {
    const Layer& l = layers[i];
    const std::string at = "layer " + std::to_string(i) + ": ";
    if (l.attn_norm == nullptr || l.mlp_norm == nullptr) return at + "norms missing";
    if ((l.q_norm == nullptr) != (l.k_norm == nullptr)) return at + "q_norm and k_norm go together";
    if (l.qkv.weight.rows != width || l.qkv.weight.cols != c.hidden) return at + "qkv shape";
    if (l.o.weight.rows != c.hidden || l.o.weight.cols != c.heads * c.head_dim) return at + "o shape";
    if (l.gate_up.weight.rows != 2 * c.intermediate || l.gate_up.weight.cols != c.hidden) return at + "gate_up shape";
    if (l.down.weight.rows != c.hidden || l.down.weight.cols != c.intermediate) return at + "down shape";
    for (const Projection* p : {&l.qkv, &l.o, &l.gate_up, &l.down}) {
      if (p->weight.data == nullptr) return at + "a projection has no weight";
      if (p->weight.type != kF32 && p->weight.cols % 32 != 0) return at + "quantized rows must be whole blocks";
      if (p->lora.present() && (p->lora.down.cols != p->weight.cols || p->lora.up_scaled.cols != p->weight.rows ||
                                p->lora.up_scaled.rows != p->lora.down.rows || p->lora.down.type != kF32 ||
                                p->lora.up_scaled.type != kF32))
        return at + "LoRA shape";
    }
  }
  return "";
}

}  // namespace dllm
