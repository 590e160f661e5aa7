// Where a pass's time goes, phase by phase (kernels.cpu.profile() reads it). Off unless
// switched on: then each phase costs two clock reads.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>

namespace dllm {

enum Phase : int {
  kEmbed, kNorm, kQuantize, kQkv, kRope, kAttention, kOut, kGateUp, kSwiglu, kDown, kFinalNorm, kHead,
  kPhaseCount
};
constexpr const char* kPhaseNames[kPhaseCount] = {
    "embed", "norm", "quantize", "qkv", "rope", "attention", "o_proj", "gate_up", "swiglu", "down",
    "final_norm", "head"};

struct Profile {
  bool enabled = false;
  std::array<double, kPhaseCount> seconds{};
  int64_t passes = 0;
};
extern Profile profile;

class Timed {
 public:
  explicit Timed(Phase phase) : phase_(phase), on_(profile.enabled) {
    if (on_) start_ = std::chrono::steady_clock::now();
  }
  ~Timed() {
    if (on_) profile.seconds[phase_] += std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }

 private:
  Phase phase_;
  bool on_;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace dllm
