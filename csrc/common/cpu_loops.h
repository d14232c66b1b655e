// The parallel grain of the CPU kernels (their vector loops: cpu_vec.h).
#pragma once

#include <cstdint>

namespace hotloop {

// Elements of work per at::parallel_for task (ATen's own GRAIN_SIZE, which lives
// in the heavy TensorIterator.h).
constexpr int64_t kGrainSize = 32768;

}  // namespace hotloop
