#include "model.h"

#include <ATen/Parallel.h>

#include <cmath>
#include <limits>

#include "matmul.h"
#include "profile.h"
#include "simd.h"

namespace dllm {

Profile profile;

namespace {

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

std::vector<float>& buffer(int slot, int64_t floats) {
  thread_local std::vector<float> buffers[8];
  auto& b = buffers[slot];
  if (int64_t(b.size()) < floats) b.resize(floats);
  return b;
}

struct RowStats {  // running argmax and softmax denominator of one row over part of the vocab
  float max = -std::numeric_limits<float>::infinity();
  int64_t argmax = 0;
  float sum = 0.0f;  // sum of exp(logit - max)
};

}  // namespace

void Model::project(const Projection& p, Phase phase, const float* x, int64_t rows, int64_t ldx, float* y,
                    int64_t ldy, bool accumulate, const Pass& pass) const {
  {
    Timed timed(phase);
    linear(x, rows, ldx, p.weight, y, ldy, accumulate);
    if (p.bias != nullptr)
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t n = 0; n < p.weight.rows; ++n) y[r * ldy + n] += p.bias[n];
  }
  if (p.lora.present() && pass.adapter_count > 0) add_lora(p.lora, x, ldx, y, ldy, pass);
}

// The adapter's rows gathered and taken down to the rank on this thread (a few thousand
// MACs), then added back up column-parallel as rank axpys per row: no dot products of length
// rank, whose horizontal sums would cost more than their arithmetic.
void Model::add_lora(const LoRA& lora, const float* x, int64_t ldx, float* y, int64_t ldy, const Pass& pass) const {
  Timed timed(kLora);
  const int64_t count = pass.adapter_count, in = lora.down.cols, rank = lora.down.rows, out = lora.up_scaled.cols;
  float* gathered = buffer(6, count * in).data();
  float* low = buffer(7, count * rank).data();
  for (int64_t a = 0; a < count; ++a) std::memcpy(gathered + a * in, x + pass.adapter_rows[a] * ldx, in * sizeof(float));
  linear_columns(gathered, count, in, lora.down, low, rank, false, 0, rank);
  const float* up = reinterpret_cast<const float*>(lora.up_scaled.data);
  // 64 columns at a time: 8 independent accumulators, rank FMAs each
  at::parallel_for(0, (out + 63) / 64, 4, [&](int64_t begin, int64_t end) {
    for (int64_t a = 0; a < count; ++a) {
      float* dst = y + pass.adapter_rows[a] * ldy;
      const float* coeff = low + a * rank;
      for (int64_t tile = begin; tile < end; ++tile) {
        const int64_t n0 = tile * 64, width = std::min<int64_t>(64, out - n0);
        if (width < 64) {
          for (int64_t n = n0; n < n0 + width; ++n)
            for (int64_t r = 0; r < rank; ++r) dst[n] += coeff[r] * up[r * out + n];
          continue;
        }
        __m256 acc[8];
        for (int q = 0; q < 8; ++q) acc[q] = _mm256_loadu_ps(dst + n0 + 8 * q);
        for (int64_t r = 0; r < rank; ++r) {
          const __m256 c = _mm256_set1_ps(coeff[r]);
          const float* row = up + r * out + n0;
          for (int q = 0; q < 8; ++q) acc[q] = _mm256_fmadd_ps(c, _mm256_loadu_ps(row + 8 * q), acc[q]);
        }
        for (int q = 0; q < 8; ++q) _mm256_storeu_ps(dst + n0 + 8 * q, acc[q]);
      }
    }
  });
}

// q and k heads: their norms (Qwen3) and the rotary embedding of each row's position
void Model::position_heads(const Layer& layer, float* qkv, int64_t width, const Pass& pass) const {
  Timed timed(kRope);
  const Config& c = config;
  for (int64_t r = 0; r < pass.rows; ++r) {
    const float* cos = rope_cos + pass.positions[r] * c.head_dim;
    const float* sin = rope_sin + pass.positions[r] * c.head_dim;
    for (int64_t h = 0; h < c.heads + c.kv_heads; ++h) {
      float* head = qkv + r * width + h * c.head_dim;
      if (layer.q_norm != nullptr) rms_norm(head, h < c.heads ? layer.q_norm : layer.k_norm, c.head_dim, c.eps, head);
      rotate(head, cos, sin, c.head_dim);
    }
  }
}

void Model::attention_block(const Layer& layer, int64_t index, float* x, const Pass& pass) const {
  const Config& c = config;
  const int64_t rows = pass.rows, q_width = c.heads * c.head_dim, kv_width = c.kv_heads * c.head_dim;
  const int64_t width = q_width + 2 * kv_width;
  float* normed = buffer(0, rows * c.hidden).data();
  float* qkv = buffer(1, rows * width).data();
  float* attn = buffer(2, rows * q_width).data();
  {
    Timed timed(kNorm);
    for (int64_t r = 0; r < rows; ++r) rms_norm(x + r * c.hidden, layer.attn_norm, c.hidden, c.eps, normed + r * c.hidden);
  }
  project(layer.qkv, kQkv, normed, rows, c.hidden, qkv, width, false, pass);
  position_heads(layer, qkv, width, pass);
  const AttentionShape shape{c.heads, c.kv_heads, c.head_dim};
  {
    Timed timed(kAttention);
    attention(pass.segments, index, shape, qkv, width, attn);
  }
  project(layer.o, kOut, attn, rows, q_width, x, c.hidden, true, pass);
}

void Model::mlp_block(const Layer& layer, float* x, const Pass& pass) const {
  const Config& c = config;
  const int64_t rows = pass.rows;
  float* normed = buffer(0, rows * c.hidden).data();
  float* gate_up = buffer(3, rows * 2 * c.intermediate).data();
  float* act = buffer(4, rows * c.intermediate).data();
  {
    Timed timed(kNorm);
    for (int64_t r = 0; r < rows; ++r) rms_norm(x + r * c.hidden, layer.mlp_norm, c.hidden, c.eps, normed + r * c.hidden);
  }
  project(layer.gate_up, kGateUp, normed, rows, c.hidden, gate_up, 2 * c.intermediate, false, pass);
  {
    Timed timed(kSwiglu);
    for (int64_t r = 0; r < rows; ++r)
      swiglu(gate_up + r * 2 * c.intermediate, gate_up + r * 2 * c.intermediate + c.intermediate, c.intermediate,
             act + r * c.intermediate);
  }
  project(layer.down, kDown, act, rows, c.intermediate, x, c.hidden, true, pass);
}

void Model::embed_tokens(const Pass& pass, float* x) const {
  Timed timed(kEmbed);
  for (int64_t r = 0; r < pass.rows; ++r) {
    float* row = x + r * config.hidden;
    if (pass.tokens[r] == config.mask_token && mask_embedding != nullptr) std::memcpy(row, mask_embedding, config.hidden * 4);
    else dequant_row(embed, pass.tokens[r], row);
  }
}

void Model::forward(const Pass& pass, float* hidden) const {
  const Config& c = config;
  if (profile.enabled) profile.passes += 1;
  std::vector<float> x(pass.rows * c.hidden);
  embed_tokens(pass, x.data());
  for (int64_t i = 0; i < int64_t(layers.size()); ++i) {
    attention_block(layers[i], i, x.data(), pass);
    mlp_block(layers[i], x.data(), pass);
  }
  Timed final_time(kFinalNorm);
  for (int64_t o = 0; o < pass.out_count; ++o)
    rms_norm(x.data() + pass.out_rows[o] * c.hidden, final_norm, c.hidden, c.eps, hidden + o * c.hidden);
}

void Model::logits(const float* hidden, int64_t rows, float* out) const {
  Timed timed(kHead);
  linear(hidden, rows, config.hidden, head, out, config.vocab, false);
}

void Model::greedy(const float* hidden, int64_t rows, int64_t* tokens, float* confidence, bool draft) const {
  const Weight& head = draft ? draft_head : this->head;
  // Each part of the vocabulary is a thread's: logits a chunk at a time into a small buffer,
  // folded into per-row running stats; the parts are merged at the end. No [rows, vocab] array.
  Timed timed(kHead);
  constexpr int64_t kChunk = 240;  // a multiple of the matmul's panel
  const int64_t vocab = head.rows, parts = std::max<int64_t>(1, at::get_num_threads());
  std::vector<RowStats> stats(parts * rows);
  at::parallel_for(0, parts, 1, [&](int64_t begin, int64_t end) {
    for (int64_t part = begin; part < end; ++part) {
      const int64_t lo = vocab * part / parts, hi = vocab * (part + 1) / parts;
      float* chunk = buffer(5, rows * kChunk).data();
      for (int64_t v0 = lo; v0 < hi; v0 += kChunk) {
        const int64_t width = std::min(kChunk, hi - v0);
        linear_columns(hidden, rows, config.hidden, head, chunk, kChunk, false, v0, v0 + width);
        for (int64_t r = 0; r < rows; ++r) {
          RowStats& s = stats[part * rows + r];
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
  });
  for (int64_t r = 0; r < rows; ++r) {
    RowStats best;
    for (int64_t part = 0; part < parts; ++part) {  // parts in vocab order: ties keep the lowest id
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
