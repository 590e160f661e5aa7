// Python bindings: kernels.cpu builds this extension; dllm_engine/models/fused_cpu.py drives it.
#include <torch/extension.h>

#include "int8.h"
#include "machine.h"
#include "matmul.h"
#include "model.h"

namespace {

using dllm::Weight;

void need(bool ok, const std::string& what) { TORCH_CHECK(ok, "dllm cpu kernels: ", what); }

void need_float(const at::Tensor& t, const std::string& name) {
  need(t.device().is_cpu() && t.scalar_type() == at::kFloat && t.is_contiguous(), name + " must be a contiguous fp32 CPU tensor");
}

void need_cache(const at::Tensor& t, const std::string& name) {
  need(t.device().is_cpu() && (t.scalar_type() == at::kFloat || t.scalar_type() == at::kHalf) && t.is_contiguous(),
       name + " must be a contiguous fp32 or fp16 CPU tensor");
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
    model.threads = at::get_num_threads();
  }

  void set_activations(const std::string& mode) {
    const std::string problem = model.set_activations(mode);
    need(problem.empty(), problem);
  }

  std::string activations() const { return model.int8 == nullptr ? "fp32" : model.int8->name; }

  void set_attention_kernels(const std::string& name) {
    const dllm::AttentionBlocks* kernels = dllm::attention_blocks(name);
    need(kernels != nullptr, "no attention kernels '" + name + "' run on this CPU");
    model.attention_kernels = kernels;
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
    else if (name == "context_fc") model.context_fc.weight = w;
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
    if (name == "context_norm") { model.context_norm = p; return; }
    need(layer >= 0 && layer < int64_t(model.layers.size()), "layer index out of range");
    auto& l = model.layers[layer];
    if (name == "attn_norm") l.attn_norm = p;
    else if (name == "mlp_norm") l.mlp_norm = p;
    else if (name == "q_norm") l.q_norm = p;
    else if (name == "k_norm") l.k_norm = p;
    else if (name == "qkv_bias") l.qkv.bias = p;
    else need(false, "unknown vector " + name);
  }

  // The rows of a pass laid out by its segment table ([S, 6]: row0, rows, pos0, attend_len,
  // visibility, block_size), each segment over its request's block table (int64 block ids) into
  // a pool of keys ([pool_layers, kv_heads, blocks, head_dim, block_tokens]: a block's keys
  // transposed) and values ([pool_layers, kv_heads, blocks, block_tokens, head_dim]); this
  // model's layers are the pool's layers [layer0, layer0 + layers).
  void lay_out(dllm::Pass& pass, std::vector<int64_t>& positions, const at::Tensor& segments,
               const std::vector<at::Tensor>& tables, const std::vector<at::Tensor>& keys,
               const std::vector<at::Tensor>& values, int64_t layer0) const {
    need(segments.scalar_type() == at::kLong && segments.is_contiguous(), "index tensors must be contiguous int64");
    const int64_t count = segments.size(0);
    need(segments.dim() == 2 && segments.size(1) == 6, "segments must be [S, 6]");
    need(int64_t(tables.size()) == count && int64_t(keys.size()) == count && int64_t(values.size()) == count,
         "one block table, key pool and value pool per segment");
    const auto& c = model.config;
    positions.assign(pass.rows, 0);  // each row's position follows from its segment
    pass.positions = positions.data();
    const int64_t* s = segments.data_ptr<int64_t>();
    int64_t covered = 0;
    for (int64_t i = 0; i < count; ++i, s += 6) {
      const at::Tensor& k = keys[i];
      need_cache(k, "key pool");
      need(values[i].scalar_type() == k.scalar_type(), "key and value pools must have one dtype");
      need_cache(values[i], "value pool");
      const at::Tensor& v = values[i];
      need(k.dim() == 5 && v.dim() == 5 && layer0 >= 0 && k.size(0) >= layer0 + int64_t(model.layers.size()) &&
           k.size(1) == c.kv_heads && k.size(3) == c.head_dim && v.size(0) == k.size(0) && v.size(1) == k.size(1) &&
           v.size(2) == k.size(2) && v.size(3) == k.size(4) && v.size(4) == c.head_dim,
           "pools must be keys [layers, kv_heads, blocks, head_dim, block_tokens] and values [layers, kv_heads, "
           "blocks, block_tokens, head_dim] with this model's layers from layer0");
      need(v.size(3) > 0 && v.size(3) % 8 == 0, "a pool block must hold a multiple of 8 positions");
      const at::Tensor& table = tables[i];
      need(table.scalar_type() == at::kLong && table.is_contiguous() && table.dim() == 1 && table.device().is_cpu(),
           "block tables must be contiguous int64 vectors");
      const int64_t* ids = table.data_ptr<int64_t>();
      for (int64_t b = 0; b < table.numel(); ++b) need(ids[b] >= 0 && ids[b] < k.size(2), "block id out of range");
      dllm::Segment seg{s[0], s[1], s[2], s[3], s[4], std::max<int64_t>(1, s[5]), k.data_ptr(), v.data_ptr(),
                        ids, table.numel(), v.size(3), v.size(2), layer0, k.scalar_type() == at::kHalf};
      need(seg.row0 == covered && seg.rows > 0 && seg.row0 + seg.rows <= pass.rows, "segments must tile the pass's rows in order");
      need(seg.pos0 >= 0 && seg.pos0 + seg.rows <= seg.attend_len && seg.attend_len <= seg.table_len * seg.block_tokens,
           "a segment must see its own rows and fit its block table");
      need(seg.pos0 + seg.rows <= c.max_positions, "position past the rope table");
      for (int64_t r = 0; r < seg.rows; ++r) positions[seg.row0 + r] = seg.pos0 + r;
      covered += seg.rows;
      pass.segments.push_back(seg);
    }
    need(covered == pass.rows, "segments must cover every row");
  }

  // hidden [out_rows, hidden]; taps [tap_rows, tap_layers * hidden] (empty when no tap layers)
  std::tuple<at::Tensor, at::Tensor> forward(const at::Tensor& tokens, const at::Tensor& adapter_rows,
                                             const at::Tensor& segments, const std::vector<at::Tensor>& tables,
                                             const std::vector<at::Tensor>& keys, const std::vector<at::Tensor>& values,
                                             int64_t layer0, const at::Tensor& out_rows,
                                             const at::Tensor& tap_layers, const at::Tensor& tap_rows) {
    for (const auto* t : {&tokens, &adapter_rows, &out_rows, &tap_layers, &tap_rows})
      need(t->scalar_type() == at::kLong && t->is_contiguous() && t->device().is_cpu(), "index tensors must be contiguous int64");
    const auto& c = model.config;
    std::vector<int64_t> positions;
    dllm::Pass pass{tokens.data_ptr<int64_t>(), nullptr, tokens.numel(),
                    adapter_rows.data_ptr<int64_t>(), adapter_rows.numel(), {}, out_rows.data_ptr<int64_t>(),
                    out_rows.numel()};
    lay_out(pass, positions, segments, tables, keys, values, layer0);
    const int64_t* tok = pass.tokens;
    for (int64_t r = 0; r < pass.rows; ++r)
      need((tok[r] >= 0 && tok[r] < model.embed.rows) || (tok[r] == c.mask_token && model.mask_embedding), "token id out of range");
    for (int64_t a = 0; a < pass.adapter_count; ++a)
      need(pass.adapter_rows[a] >= 0 && pass.adapter_rows[a] < pass.rows, "adapter row out of range");
    for (int64_t o = 0; o < pass.out_count; ++o)
      need(pass.out_rows[o] >= 0 && pass.out_rows[o] < pass.rows, "output row out of range");
    pass.tap_layers = tap_layers.data_ptr<int64_t>();
    pass.tap_layer_count = tap_layers.numel();
    pass.tap_rows = tap_rows.data_ptr<int64_t>();
    pass.tap_row_count = pass.tap_layer_count ? tap_rows.numel() : 0;
    for (int64_t j = 0; j < pass.tap_layer_count; ++j)
      need(pass.tap_layers[j] >= 0 && pass.tap_layers[j] < int64_t(model.layers.size()), "tap layer out of range");
    for (int64_t t = 0; t < pass.tap_row_count; ++t)
      need(pass.tap_rows[t] >= 0 && pass.tap_rows[t] < pass.rows, "tap row out of range");
    at::Tensor hidden = at::empty({pass.out_count, c.hidden}, at::kFloat);
    at::Tensor taps = at::empty({pass.tap_row_count, pass.tap_layer_count * c.hidden}, at::kFloat);
    pass.taps = taps.data_ptr<float>();
    model.forward(pass, hidden.data_ptr<float>());
    return {hidden, taps};
  }

  // a draft head's context: features [rows, context width] into the segments' caches
  void context(const at::Tensor& features, const at::Tensor& segments, const std::vector<at::Tensor>& tables,
               const std::vector<at::Tensor>& keys, const std::vector<at::Tensor>& values, int64_t layer0) {
    need(model.context_fc.weight.data != nullptr, "this model takes no context (it is not a draft head)");
    need_float(features, "features");
    need(features.dim() == 2 && features.size(1) == model.context_fc.weight.cols, "features must be [rows, context width]");
    std::vector<int64_t> positions;
    dllm::Pass pass{nullptr, nullptr, features.size(0), nullptr, 0, {}, nullptr, 0};
    lay_out(pass, positions, segments, tables, keys, values, layer0);
    if (pass.rows) model.context(pass, features.data_ptr<float>());
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

// y = x wᵀ through one integer kernel variant (tests and benches): [M, rows]
at::Tensor linear_int8(const at::Tensor& x, const at::Tensor& w, int64_t type, int64_t rows, int64_t cols,
                       const std::string& variant_name, int64_t repeats) {
  need_float(x, "x");
  need(x.dim() == 2 && x.size(1) == cols, "x must be [M, cols]");
  need(type == dllm::kQ4_1 || type == dllm::kQ8_0, "integer kernels read Q4_1 or Q8_0 weights");
  const dllm::Int8Variant* variant = dllm::int8_variant(variant_name);
  need(variant != nullptr, "no integer kernel '" + variant_name + "' runs on this CPU");
  Weight weight = as_weight(w, type, rows, cols, "w");
  dllm::PackedInt8 packed;
  variant->pack(weight, packed);
  dllm::QuantizedStorage storage;
  storage.reserve(x.size(0), cols);
  const dllm::QuantizedRows quantized = storage.view(x.size(0), cols);
  dllm::quantize_rows(x.data_ptr<float>(), cols, 0, x.size(0), quantized);
  at::Tensor y = at::empty({x.size(0), rows}, at::kFloat);
  const int threads = at::get_num_threads();
  for (int64_t i = 0; i < std::max<int64_t>(1, repeats); ++i) {
#pragma omp parallel num_threads(threads)
    {
      const dllm::Team team{omp_get_thread_num(), omp_get_num_threads()};  // no barrier: columns are independent
      const auto [n0, n1] = team.share(rows, 16);
      if (n0 < n1) variant->gemm(quantized, packed, n0, n1, y.data_ptr<float>() + n0, rows, false);
    }
  }
  return y;
}

// x as the integer kernels see it: each 32-block of a row quantized to int8 and scaled back
at::Tensor quantize_activations(const at::Tensor& x) {
  need_float(x, "x");
  need(x.dim() == 2 && x.size(1) % 32 == 0, "x must be [M, K] with K a multiple of 32");
  dllm::QuantizedStorage storage;
  storage.reserve(x.size(0), x.size(1));
  const dllm::QuantizedRows quantized = storage.view(x.size(0), x.size(1));
  dllm::quantize_rows(x.data_ptr<float>(), x.size(1), 0, x.size(0), quantized);
  at::Tensor out = at::empty_like(x);
  dllm::dequantize_rows(quantized, out.data_ptr<float>());
  return out;
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
  m.def("linear_int8", &linear_int8, "y = x wᵀ by an integer kernel variant (8-bit activations)",
        pybind11::arg("x"), pybind11::arg("w"), pybind11::arg("type"), pybind11::arg("rows"), pybind11::arg("cols"),
        pybind11::arg("variant") = "auto", pybind11::arg("repeats") = 1,
        pybind11::call_guard<pybind11::gil_scoped_release>());
  m.def("quantize_activations", &quantize_activations, "x through the 8-bit activation quantizer (q * d)");
  m.def("int8_variants", &dllm::int8_variants_supported, "the integer kernels this CPU runs, fastest first");
  m.def("attention_kernel_sets", []() {
    std::vector<std::string> names;
    for (const dllm::AttentionBlocks* kernels : {&dllm::kAttentionAvx512, &dllm::kAttentionAvx2})
      if (kernels->supported()) names.push_back(kernels->name);
    return names;
  }, "the attention kernel sets this CPU runs, widest first");
  m.def("read_bandwidth", &dllm::read_bandwidth, "GB/s the pass's threads read a buffer of this many MiB",
        pybind11::arg("mib") = 256, pybind11::arg("repeats") = 5, pybind11::call_guard<pybind11::gil_scoped_release>());
  pybind11::class_<BoundModel>(m, "Model")
      .def(pybind11::init<>())
      .def("configure", &BoundModel::configure)
      .def("set_weight", &BoundModel::set_weight)
      .def("set_vector", &BoundModel::set_vector)
      .def("set_draft_ids", &BoundModel::set_draft_ids)
      .def("check", [](const BoundModel& b) { return b.model.check(); })
      .def("set_activations", &BoundModel::set_activations)
      .def("activations", &BoundModel::activations)
      .def("set_attention_kernels", &BoundModel::set_attention_kernels)
      .def("attention_kernels", [](const BoundModel& b) { return std::string(b.model.attention_kernels->name); })
      .def("team", [](const BoundModel& b) {
        return pybind11::make_tuple(b.model.team_size(), b.model.threads, b.model.last_wait_fraction());
      }, "(threads of the next pass, threads on idle cores, share of the last team pass spent waiting)")
      .def("forward", &BoundModel::forward, pybind11::call_guard<pybind11::gil_scoped_release>())
      .def("context", &BoundModel::context, pybind11::call_guard<pybind11::gil_scoped_release>())
      .def("greedy", &BoundModel::greedy, pybind11::arg("hidden"), pybind11::arg("draft") = false,
           pybind11::call_guard<pybind11::gil_scoped_release>())
      .def("logits", &BoundModel::logits, pybind11::call_guard<pybind11::gil_scoped_release>());
}
