// Python bindings: kernels.cpu builds this extension and wraps it (kernels/cpu/fused_model.py).
#include <torch/extension.h>

#include "matmul.h"
#include "model.h"

namespace {

using dllm::Weight;

void need(bool ok, const std::string& what) { TORCH_CHECK(ok, "dllm cpu kernels: ", what); }

void need_float(const at::Tensor& t, const std::string& name) {
  need(t.device().is_cpu() && t.scalar_type() == at::kFloat && t.is_contiguous(), name + " must be a contiguous fp32 CPU tensor");
}

Weight as_weight(const at::Tensor& t, int64_t type, int64_t rows, int64_t cols, const std::string& name) {
  need(t.device().is_cpu() && t.is_contiguous(), name + " must be a contiguous CPU tensor");
  Weight w{int(type), static_cast<const uint8_t*>(t.data_ptr()), rows, cols};
  need(type == dllm::kF32 || type == dllm::kQ8_0 || type == dllm::kQ4_1, name + ": unknown weight type");
  need(type == dllm::kF32 ? t.scalar_type() == at::kFloat : t.scalar_type() == at::kByte,
       name + ": fp32 weights as float tensors, quantized ones as uint8 blocks");
  need(type == dllm::kF32 || cols % 32 == 0, name + ": quantized rows must be whole blocks of 32");
  need(int64_t(t.numel() * t.element_size()) == rows * w.row_bytes(), name + ": byte size does not match its shape");
  return w;
}

// A Model plus the tensors it points into, kept alive with it.
struct BoundModel {
  dllm::Model model;
  std::vector<at::Tensor> keep;

  void configure(int64_t hidden, int64_t heads, int64_t kv_heads, int64_t head_dim, int64_t intermediate,
                 int64_t vocab, int64_t max_positions, int64_t mask_token, double eps, int64_t layers) {
    model.config = {hidden, heads, kv_heads, head_dim, intermediate, vocab, max_positions, mask_token, float(eps)};
    model.layers.assign(layers, dllm::Layer{});
  }

  dllm::Projection& projection(const std::string& name, int64_t layer) {
    need(layer >= 0 && layer < int64_t(model.layers.size()), "layer index out of range");
    auto& l = model.layers[layer];
    if (name == "qkv") return l.qkv;
    if (name == "o") return l.o;
    if (name == "gate_up") return l.gate_up;
    if (name == "down") return l.down;
    need(false, "unknown projection " + name);
    return l.qkv;
  }

  void set_weight(const std::string& name, int64_t layer, const at::Tensor& t, int64_t type, int64_t rows, int64_t cols) {
    keep.push_back(t);
    Weight w = as_weight(t, type, rows, cols, name);
    if (name == "embed") model.embed = w;
    else if (name == "head") model.head = w;
    else if (name == "draft_head") model.draft_head = w;
    else if (name.rfind("lora_down.", 0) == 0) projection(name.substr(10), layer).lora.down = w;
    else if (name.rfind("lora_up_scaled.", 0) == 0) projection(name.substr(15), layer).lora.up_scaled = w;
    else projection(name, layer).weight = w;
  }

  void set_draft_ids(const at::Tensor& ids) {
    need(ids.scalar_type() == at::kLong && ids.is_contiguous() && ids.dim() == 1, "draft ids must be contiguous int64");
    const int64_t* p = ids.data_ptr<int64_t>();
    for (int64_t i = 0; i < ids.numel(); ++i) need(p[i] >= 0 && p[i] < model.config.vocab, "draft id out of range");
    keep.push_back(ids);
    model.draft_ids = p;
  }

  void set_vector(const std::string& name, int64_t layer, const at::Tensor& t) {
    need_float(t, name);
    keep.push_back(t);
    const float* p = t.data_ptr<float>();
    if (name == "final_norm") { model.final_norm = p; return; }
    if (name == "mask_embedding") { model.mask_embedding = p; return; }
    if (name == "rope_cos") { model.rope_cos = p; return; }
    if (name == "rope_sin") { model.rope_sin = p; return; }
    need(layer >= 0 && layer < int64_t(model.layers.size()), "layer index out of range");
    auto& l = model.layers[layer];
    if (name == "attn_norm") l.attn_norm = p;
    else if (name == "mlp_norm") l.mlp_norm = p;
    else if (name == "q_norm") l.q_norm = p;
    else if (name == "k_norm") l.k_norm = p;
    else if (name == "qkv_bias") l.qkv.bias = p;
    else need(false, "unknown vector " + name);
  }

  at::Tensor forward(const at::Tensor& tokens, const at::Tensor& adapter_rows,
                     const at::Tensor& segments, const std::vector<at::Tensor>& keys,
                     const std::vector<at::Tensor>& values, const at::Tensor& out_rows) {
    for (const auto* t : {&tokens, &adapter_rows, &segments, &out_rows})
      need(t->scalar_type() == at::kLong && t->is_contiguous() && t->device().is_cpu(), "index tensors must be contiguous int64");
    const int64_t count = segments.size(0);
    need(segments.dim() == 2 && segments.size(1) == 6, "segments must be [S, 6]");
    need(int64_t(keys.size()) == count && int64_t(values.size()) == count, "one key and one value cache per segment");
    const auto& c = model.config;
    std::vector<int64_t> positions(tokens.numel());  // each row's position follows from its segment
    dllm::Pass pass{tokens.data_ptr<int64_t>(), positions.data(), tokens.numel(),
                    adapter_rows.data_ptr<int64_t>(), adapter_rows.numel(), {}, out_rows.data_ptr<int64_t>(),
                    out_rows.numel()};
    const int64_t* s = segments.data_ptr<int64_t>();
    int64_t covered = 0;
    for (int64_t i = 0; i < count; ++i, s += 6) {
      const at::Tensor& k = keys[i];
      need_float(k, "key cache");
      need_float(values[i], "value cache");
      need(k.dim() == 4 && k.size(0) == int64_t(model.layers.size()) && k.size(1) == c.kv_heads && k.size(3) == c.head_dim &&
           values[i].sizes() == k.sizes(), "caches must be [layers, kv_heads, max_len, head_dim]");
      dllm::Segment seg{s[0], s[1], s[2], s[3], s[4], std::max<int64_t>(1, s[5]), k.data_ptr<float>(),
                        values[i].data_ptr<float>(), k.size(2)};
      need(seg.row0 == covered && seg.rows > 0 && seg.row0 + seg.rows <= pass.rows, "segments must tile the pass's rows in order");
      need(seg.pos0 >= 0 && seg.pos0 + seg.rows <= seg.attend_len && seg.attend_len <= seg.max_len,
           "a segment must see its own rows and fit its cache");
      need(seg.pos0 + seg.rows <= c.max_positions, "position past the rope table");
      for (int64_t r = 0; r < seg.rows; ++r) positions[seg.row0 + r] = seg.pos0 + r;
      covered += seg.rows;
      pass.segments.push_back(seg);
    }
    need(covered == pass.rows, "segments must cover every row");
    const int64_t* tok = pass.tokens;
    for (int64_t r = 0; r < pass.rows; ++r)
      need((tok[r] >= 0 && tok[r] < model.embed.rows) || (tok[r] == c.mask_token && model.mask_embedding), "token id out of range");
    for (int64_t a = 0; a < pass.adapter_count; ++a)
      need(pass.adapter_rows[a] >= 0 && pass.adapter_rows[a] < pass.rows, "adapter row out of range");
    for (int64_t o = 0; o < pass.out_count; ++o)
      need(pass.out_rows[o] >= 0 && pass.out_rows[o] < pass.rows, "output row out of range");
    at::Tensor hidden = at::empty({pass.out_count, c.hidden}, at::kFloat);
    model.forward(pass, hidden.data_ptr<float>());
    return hidden;
  }

  std::tuple<at::Tensor, at::Tensor> greedy(const at::Tensor& hidden, bool draft) {
    need_float(hidden, "hidden");
    need(!draft || model.draft_head.data != nullptr, "this model has no draft head");
    need(hidden.dim() == 2 && hidden.size(1) == model.config.hidden, "hidden must be [rows, hidden]");
    const int64_t rows = hidden.size(0);
    at::Tensor tokens = at::empty({rows}, at::kLong), confidence = at::empty({rows}, at::kFloat);
    if (rows) model.greedy(hidden.data_ptr<float>(), rows, tokens.data_ptr<int64_t>(), confidence.data_ptr<float>(), draft);
    return {tokens, confidence};
  }

  at::Tensor logits(const at::Tensor& hidden) {
    need_float(hidden, "hidden");
    need(hidden.dim() == 2 && hidden.size(1) == model.config.hidden, "hidden must be [rows, hidden]");
    at::Tensor out = at::empty({hidden.size(0), model.config.vocab}, at::kFloat);
    if (hidden.size(0)) model.logits(hidden.data_ptr<float>(), hidden.size(0), out.data_ptr<float>());
    return out;
  }
};

at::Tensor linear(const at::Tensor& x, const at::Tensor& w, int64_t type, int64_t rows, int64_t cols) {
  need_float(x, "x");
  need(x.dim() == 2 && x.size(1) == cols, "x must be [M, cols]");
  Weight weight = as_weight(w, type, rows, cols, "w");
  at::Tensor y = at::empty({x.size(0), rows}, at::kFloat);
  dllm::linear(x.data_ptr<float>(), x.size(0), cols, weight, y.data_ptr<float>(), rows, false);
  return y;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("linear", &linear, "y = x wᵀ for fp32 / Q8_0 / Q4_1 weights");
  m.def("profile_enable", [](bool on) { dllm::profile = dllm::Profile{}; dllm::profile.enabled = on; });
  m.def("profile_read", []() {
    pybind11::dict out;
    for (int i = 0; i < dllm::kPhaseCount; ++i) out[dllm::kPhaseNames[i]] = dllm::profile.seconds[i];
    out["passes"] = dllm::profile.passes;
    return out;
  });
  m.def("set_direct_rows", [](int64_t n) { dllm::direct_rows_limit = n; });
  pybind11::class_<BoundModel>(m, "Model")
      .def(pybind11::init<>())
      .def("configure", &BoundModel::configure)
      .def("set_weight", &BoundModel::set_weight)
      .def("set_vector", &BoundModel::set_vector)
      .def("set_draft_ids", &BoundModel::set_draft_ids)
      .def("check", [](const BoundModel& b) { return b.model.check(); })
      .def("forward", &BoundModel::forward, pybind11::call_guard<pybind11::gil_scoped_release>())
      .def("greedy", &BoundModel::greedy, pybind11::arg("hidden"), pybind11::arg("draft") = false,
           pybind11::call_guard<pybind11::gil_scoped_release>())
      .def("logits", &BoundModel::logits, pybind11::call_guard<pybind11::gil_scoped_release>());
}
