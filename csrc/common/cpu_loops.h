// Loop helpers for the CPU kernels: the parallel grain and an accurate row sum.
#pragma once

#include <algorithm>
#include <cstdint>

namespace hotloop {

// Elements of work per at::parallel_for task (ATen's own GRAIN_SIZE, which lives
// in the heavy TensorIterator.h).
constexpr int64_t kGrainSize = 32768;

// Sum of term(j) for j in [0, n), accumulated in acc_t.
//
// A plain running sum of thousands of float32 terms loses ~sqrt(n) ulps, enough to
// fail float32 comparisons against a float64 reference for large hidden sizes.
// Eight independent lanes summed per block of 1024 terms keep the error near that
// of a pairwise sum, and the lanes give the compiler independent adds to schedule.
template <typename acc_t, typename Term>
inline acc_t blocked_sum(int64_t n, const Term& term) {
  constexpr int64_t kLanes = 8;
  constexpr int64_t kBlock = 1024;
  acc_t total = 0;
  for (int64_t begin = 0; begin < n; begin += kBlock) {
    const int64_t end = std::min(n, begin + kBlock);
    acc_t lanes[kLanes] = {};
    int64_t j = begin;
    for (; j + kLanes <= end; j += kLanes) {
      for (int64_t l = 0; l < kLanes; ++l) {
        lanes[l] += term(j + l);
      }
    }
    for (; j < end; ++j) {
      lanes[0] += term(j);
    }
    acc_t block = 0;
    for (int64_t l = 0; l < kLanes; ++l) {
      block += lanes[l];
    }
    total += block;
  }
  return total;
}

}  // namespace hotloop
