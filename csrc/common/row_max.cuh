// The maximum across the threads of a row, beside row_sum (cuda_utils.cuh): the
// FP8 norms need a row's largest magnitude for their per-row scale.
#pragma once

#include "cuda_utils.cuh"

namespace hotloop {

// The largest of each v[0..N) over the threads of a row, returned to every one
// of them. The same contract as row_sum: blockDim.x is a power of two <= 32 or a
// multiple of 32 (then blockDim.y == 1), and every thread of the block calls it.
// fmax drops NaN in favour of the other operand, so one NaN does not poison the
// row's maximum (its own output stays NaN).
template <typename T, int N>
__device__ __forceinline__ void row_max(T (&v)[N]) {
  const int lanes = blockDim.x < kWarpSize ? blockDim.x : kWarpSize;
  for (int offset = lanes / 2; offset > 0; offset /= 2) {
#pragma unroll
    for (int n = 0; n < N; ++n) {
      v[n] = fmax(v[n], __shfl_xor_sync(0xffffffffu, v[n], offset));
    }
  }
  if (blockDim.x <= kWarpSize) {
    return;
  }
  __shared__ T partial[N][kMaxThreadsPerBlock / kWarpSize];
  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  const int num_warps = blockDim.x / kWarpSize;
  if (lane == 0) {
#pragma unroll
    for (int n = 0; n < N; ++n) {
      partial[n][warp] = v[n];
    }
  }
  __syncthreads();
  // Lanes past the last warp read the first warp's value: a neutral element for
  // max without assuming the values' sign.
#pragma unroll
  for (int n = 0; n < N; ++n) {
    v[n] = partial[n][lane < num_warps ? lane : 0];
  }
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
#pragma unroll
    for (int n = 0; n < N; ++n) {
      v[n] = fmax(v[n], __shfl_xor_sync(0xffffffffu, v[n], offset));
    }
  }
  // The next call may overwrite `partial` only after everyone has read it.
  __syncthreads();
}

}  // namespace hotloop
