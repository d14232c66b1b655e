// Device helpers shared by the hotloop CUDA kernels: aligned vectors and sums
// across a warp or a block. Only .cu files include this.
#pragma once

#include <ATen/cuda/CUDAContext.h>
#include <c10/macros/Macros.h>

#include <cstdint>

namespace hotloop {

constexpr int kWarpSize = 32;
constexpr int kMaxThreadsPerBlock = 1024;
constexpr int kVectorBytes = 16;

// kSize elements moved as one 16-byte load or store.
template <typename T, int kSize>
struct alignas(sizeof(T) * kSize) AlignedVector {
  T val[kSize];
};

// Elements of T in one 16-byte vector: 8 for float16/bfloat16, 4 for float32, 2 for float64.
template <typename T>
constexpr int vector_size() {
  return kVectorBytes / static_cast<int>(sizeof(T));
}

inline bool is_vector_aligned(const void* ptr) {
  return reinterpret_cast<std::uintptr_t>(ptr) % kVectorBytes == 0;
}

template <typename T>
__device__ __forceinline__ T warp_sum(T v) {
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    v += __shfl_xor_sync(0xffffffffu, v, offset);
  }
  return v;
}

// Sums of a and b over the threadIdx.x dimension of the block (the threads that
// share one row), returned to every thread. blockDim.x is a multiple of 32; when
// it is 32 the row is one warp and no shared memory or barrier is involved, which
// lets several independent rows share a block along threadIdx.y.
// Must be reached by all threads of the block when blockDim.x > 32.
template <typename T>
__device__ __forceinline__ void row_sum2(T& a, T& b) {
  a = warp_sum(a);
  b = warp_sum(b);
  if (blockDim.x == kWarpSize) {
    return;
  }
  __shared__ T partial[2][kMaxThreadsPerBlock / kWarpSize];
  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  const int num_warps = blockDim.x / kWarpSize;
  if (lane == 0) {
    partial[0][warp] = a;
    partial[1][warp] = b;
  }
  __syncthreads();
  // Every warp reduces the per-warp sums itself: no second barrier to broadcast.
  a = lane < num_warps ? partial[0][lane] : T(0);
  b = lane < num_warps ? partial[1][lane] : T(0);
  a = warp_sum(a);
  b = warp_sum(b);
  // The next call may overwrite `partial` only after everyone has read it.
  __syncthreads();
}

template <typename T>
__device__ __forceinline__ T row_sum(T a) {
  a = warp_sum(a);
  if (blockDim.x == kWarpSize) {
    return a;
  }
  __shared__ T partial[kMaxThreadsPerBlock / kWarpSize];
  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  const int num_warps = blockDim.x / kWarpSize;
  if (lane == 0) {
    partial[warp] = a;
  }
  __syncthreads();
  a = lane < num_warps ? partial[lane] : T(0);
  a = warp_sum(a);
  __syncthreads();
  return a;
}

template <typename T>
__device__ __forceinline__ T rsqrt_acc(T v);
template <>
__device__ __forceinline__ float rsqrt_acc<float>(float v) {
  return rsqrtf(v);
}
template <>
__device__ __forceinline__ double rsqrt_acc<double>(double v) {
  return rsqrt(v);
}

inline int num_sms() { return at::cuda::getCurrentDeviceProperties()->multiProcessorCount; }

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace hotloop
