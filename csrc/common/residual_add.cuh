// The residual add of the fused norms (fused_add_rms_norm and the FP8 norms' fused twins): an
// element's rounded sum, a vector's, and the rows of any hidden size and alignment that the
// kernels take with scalar loads.
#pragma once

#include <cstdint>

#include "cuda_utils.cuh"

namespace hotloop {

// Elements of x and of the residual a thread loads before it stores their sums: a store to
// the residual between the loads would, for all nvcc can tell, alias the next loads, which
// then wait for it one round trip at a time (49% of copy bandwidth at H = 4095 on an H100).
constexpr int kResidualAddChunk = 4;

// a + b, added in acc_t and rounded to scalar_t: an element of the new residual.
template <typename scalar_t>
__device__ __forceinline__ scalar_t rounded_sum(scalar_t a, scalar_t b) {
  using acc_t = acc_type<scalar_t>;
  return static_cast<scalar_t>(static_cast<acc_t>(a) + static_cast<acc_t>(b));
}

// sum = rounded_sum(sum, addend), element by element, adding each new element's square to
// sum_sq as it is formed: with the squares in a loop of their own, fused_add_rms_norm's 16-bit
// vector and staged kernels compile to another order of instructions.
template <typename acc_t, typename scalar_t, int kSize>
__device__ __forceinline__ void add_rounded_squares(AlignedVector<scalar_t, kSize>& sum,
                                                    const AlignedVector<scalar_t, kSize>& addend,
                                                    acc_t& sum_sq) {
#pragma unroll
  for (int k = 0; k < kSize; ++k) {
    sum.val[k] = rounded_sum(sum.val[k], addend.val[k]);
    const acc_t value = static_cast<acc_t>(sum.val[k]);
    sum_sq += value * value;
  }
}

// res_row[j] = x_row[j] + res_row[j], added in acc_t and rounded to scalar_t, for this
// thread's elements j = threadIdx.x + n * blockDim.x < row_hidden; returns the sum of their
// squares (of the rounded sums, which the norm then reads back: the same thread stored
// them, so no barrier is needed in between).
template <typename scalar_t>
__device__ __forceinline__ acc_type<scalar_t> add_residual_row(const scalar_t* x_row,
                                                               scalar_t* res_row,
                                                               int64_t row_hidden) {
  using acc_t = acc_type<scalar_t>;
  const int64_t chunk_stride = int64_t{kResidualAddChunk} * blockDim.x;
  acc_t sum_sq = 0;
  for (int64_t j0 = threadIdx.x; j0 < row_hidden; j0 += chunk_stride) {
    scalar_t xv[kResidualAddChunk];
    scalar_t rv[kResidualAddChunk];
#pragma unroll
    for (int c = 0; c < kResidualAddChunk; ++c) {
      const int64_t j = j0 + c * static_cast<int64_t>(blockDim.x);
      xv[c] = j < row_hidden ? x_row[j] : scalar_t(0);
      rv[c] = j < row_hidden ? res_row[j] : scalar_t(0);
    }
#pragma unroll
    for (int c = 0; c < kResidualAddChunk; ++c) {
      const int64_t j = j0 + c * static_cast<int64_t>(blockDim.x);
      const scalar_t sum = rounded_sum(xv[c], rv[c]);
      if (j < row_hidden) {
        res_row[j] = sum;
      }
      const acc_t value = static_cast<acc_t>(sum);
      sum_sq += value * value;
    }
  }
  return sum_sq;
}

}  // namespace hotloop
