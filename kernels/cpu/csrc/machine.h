// What the machine can do, measured by the same threads a pass uses: the floors the benches
// compare a pass against (docs/kernels.md).
#pragma once

#include <cstdint>

namespace dllm {

// GB/s of reading a buffer of `mib` MiB (far past the caches) with the pass's threads; the best of `repeats`
double read_bandwidth(int64_t mib, int64_t repeats);

}  // namespace dllm
