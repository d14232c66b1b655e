// Device helpers shared by the hotloop CUDA kernels: aligned vectors and sums
// across a warp or a block. Only .cu files include this.
#pragma once

#include <cuda_runtime.h>

#include "cuda_api.cuh"

#include <atomic>
#include <cstdint>
#include <cstring>
#include <type_traits>

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

// The bytes of `from` as a To of the same size: a 16-byte vector as its four 32-bit words
// (uint4) and back.
template <typename To, typename From>
__device__ __forceinline__ To bit_copy(const From& from) {
  static_assert(sizeof(To) == sizeof(From), "the same size");
  To to;
  memcpy(&to, &from, sizeof to);
  return to;
}

// Element k of a 16-byte vector held as its four words (bit_copy<uint4>), in acc_t. bfloat16 by
// shifting or masking its word: through the 16-bit element, nvcc extracted an upper half with
// a PRMT before shifting it.
template <typename T, typename acc_t, int kSize>
__device__ __forceinline__ acc_t word_element(const uint4& words, int k) {
  if constexpr (std::is_same_v<T, BFloat16>) {
    const unsigned w = (&words.x)[k / 2];
    return __uint_as_float(k % 2 == 0 ? w << 16 : w & 0xffff0000u);
  } else {
    return static_cast<acc_t>(bit_copy<AlignedVector<T, kSize>>(words).val[k]);
  }
}

// add_squares of a vector held as its four words.
template <typename T, typename acc_t, int kSize>
__device__ __forceinline__ void add_word_squares(acc_t& sum, const uint4& words) {
#pragma unroll
  for (int k = 0; k < kSize; ++k) {
    const acc_t value = word_element<T, acc_t, kSize>(words, k);
    sum += value * value;
  }
}

// sum += each element of v squared, in acc_t, in order.
template <typename acc_t, typename T, int kSize>
__device__ __forceinline__ void add_squares(acc_t& sum, const AlignedVector<T, kSize>& v) {
#pragma unroll
  for (int k = 0; k < kSize; ++k) {
    const acc_t value = static_cast<acc_t>(v.val[k]);
    sum += value * value;
  }
}

// How long a load asks L2 to keep its line (PTX createpolicy with ld's L2::cache_hint, what
// Triton's eviction_policy compiles to): kKeep (evict_last) for a first read that a second pass
// reads again, kLastUse (evict_first) for that second read, so the lines of rows still to be
// re-read outlast it.
enum class L2Eviction { kKeep, kLastUse };

template <L2Eviction kEviction, typename Vec>
__device__ __forceinline__ Vec load_with_l2_eviction(const Vec* p) {
  static_assert(sizeof(Vec) == kVectorBytes, "one 16-byte vector");
  uint64_t policy;
  uint32_t w0, w1, w2, w3;
  if constexpr (kEviction == L2Eviction::kKeep) {
    asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(policy));
    asm volatile("ld.global.L1::evict_last.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
                 : "=r"(w0), "=r"(w1), "=r"(w2), "=r"(w3)
                 : "l"(p), "l"(policy)
                 : "memory");
  } else {
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
    asm volatile("ld.global.L1::evict_first.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
                 : "=r"(w0), "=r"(w1), "=r"(w2), "=r"(w3)
                 : "l"(p), "l"(policy)
                 : "memory");
  }
  return bit_copy<Vec>(make_uint4(w0, w1, w2, w3));
}

inline bool is_vector_aligned(const void* ptr) {
  return reinterpret_cast<std::uintptr_t>(ptr) % kVectorBytes == 0;
}

// How row_reduce combines two values of slot `slot`. Lanes past the last warp pad each
// slot with 0, the identity of a sum and of a maximum of magnitudes (which are >= 0).
struct SumOp {
  template <typename T>
  __device__ __forceinline__ T operator()(int /*slot*/, T a, T b) const {
    return a + b;
  }
};

// Slot 0 summed, slot 1 maximised: the FP8 norms' sum of squares and largest |v * weight|
// in one exchange. fmax drops NaN in favour of the other operand, so one NaN does not
// poison a row's maximum (the NaN element's own output stays NaN).
struct SumAndMaxOp {
  template <typename T>
  __device__ __forceinline__ T operator()(int slot, T a, T b) const {
    return slot == 0 ? a + b : fmax(a, b);
  }
};

// Combines each of v[0..N) over the threads of a row with Op, returned to every one of
// them.
//
// A row is the threadIdx.x dimension of the block. blockDim.x is either a power of two
// <= 32 -- several rows share a warp, and the xor shuffles below never cross the aligned
// group of blockDim.x lanes -- or a multiple of 32, and then the per-warp results meet in
// shared memory, with blockDim.y == 1 unless kManyRows (then the block's rows wait for one
// another at its barriers). Every thread of the block must call this (the caller masks rows
// past the end instead of skipping them), since the shuffles name the full warp and there is
// a barrier.
//
// kWholeWarps: the caller's blockDim.x is a multiple of 32, and the exchanges within a warp
// are unrolled (a loop over the row's lanes costs seven instructions a step).
template <typename Op, bool kManyRows = false, bool kWholeWarps = false, typename T, int N>
__device__ __forceinline__ void row_reduce(T (&v)[N]) {
  const Op combine;
  const auto exchange = [&](int offset) {
#pragma unroll
    for (int n = 0; n < N; ++n) {
      v[n] = combine(n, v[n], __shfl_xor_sync(0xffffffffu, v[n], offset));
    }
  };
  if constexpr (kWholeWarps) {
#pragma unroll
    for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
      exchange(offset);
    }
  } else {
    const int lanes = blockDim.x < kWarpSize ? blockDim.x : kWarpSize;
    for (int offset = lanes / 2; offset > 0; offset /= 2) {
      exchange(offset);
    }
  }
  if (blockDim.x <= kWarpSize) {
    return;
  }
  __shared__ T partial[N][kMaxThreadsPerBlock / kWarpSize];
  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  const int num_warps = blockDim.x / kWarpSize;
  const int first_slot = kManyRows ? static_cast<int>(threadIdx.y) * num_warps : 0;
  if (lane == 0) {
#pragma unroll
    for (int n = 0; n < N; ++n) {
      partial[n][first_slot + warp] = v[n];
    }
  }
  __syncthreads();
  // Every warp reduces the per-warp results itself: no second barrier to broadcast.
#pragma unroll
  for (int n = 0; n < N; ++n) {
    v[n] = lane < num_warps ? partial[n][first_slot + lane] : T(0);
  }
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    exchange(offset);
  }
  // The next call may overwrite `partial` only after everyone has read it.
  __syncthreads();
}

template <bool kManyRows = false, bool kWholeWarps = false, typename T, int N>
__device__ __forceinline__ void row_sum(T (&v)[N]) {
  row_reduce<SumOp, kManyRows, kWholeWarps>(v);
}

// v[0] summed and v[1], a magnitude, maximised over the row.
template <typename T>
__device__ __forceinline__ void row_sum_and_max(T (&v)[2]) {
  row_reduce<SumAndMaxOp>(v);
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

// An attribute of `device`, the current one by default. (Read directly rather than through
// at::cuda::getCurrentDeviceProperties(), whose header pulls in cuBLAS/cuSPARSE.)
inline int device_attribute(cudaDeviceAttr attribute, int device = current_device()) {
  int value = 0;
  HOTLOOP_CUDA_CHECK(cudaDeviceGetAttribute(&value, attribute, device));
  return value;
}

// A fixed attribute of `device`, asked of the runtime once a device (the first 64 devices;
// a later one asks every time): for some attributes the runtime asks the driver on every call,
// which took a forward at (1, 4096) from 24 to 530 us on an H100 with the memory clock
// (benchmarks/NOTES.md, run O22), and launch decisions on a call's path read them.
template <cudaDeviceAttr kAttribute>
inline int device_attribute_once(int device) {
  constexpr int kCachedDevices = 64;
  static std::atomic<int> cached[kCachedDevices] = {};  // 0: not asked yet
  if (device < kCachedDevices) {
    const int known = cached[device].load(std::memory_order_relaxed);
    if (known != 0) {
      return known;
    }
  }
  const int value = device_attribute(kAttribute, device);
  if (device < kCachedDevices) {
    cached[device].store(value, std::memory_order_relaxed);
  }
  return value;
}

inline int num_sms(int device = current_device()) {
  return device_attribute_once<cudaDevAttrMultiProcessorCount>(device);
}

// 9 for Hopper.
inline int compute_capability_major() {
  return device_attribute_once<cudaDevAttrComputeCapabilityMajor>(current_device());
}

// Peak memory bandwidth of the current device an SM, GB/s: two transfers a memory clock over
// the bus (H100 SXM 25, H200 37).
inline double memory_gbps_per_sm() {
  const int device = current_device();
  const double clock_khz = device_attribute_once<cudaDevAttrMemoryClockRate>(device);
  const int bus_bits = device_attribute_once<cudaDevAttrGlobalMemoryBusWidth>(device);
  return 2.0 * clock_khz * 1e3 * (bus_bits / 8) / 1e9 / num_sms(device);
}

// Whether the current device's peak memory bandwidth an SM is at most 30 GB/s (an H100 SXM's
// 25, not an H200's 37): such a GPU keeps its memory busy with fewer bytes in flight a thread,
// and the norms' forward kernels take more threads with fewer vectors each there
// (rms_norm's plan_forward, fused_add_rms_norm's launch).
inline bool memory_is_slow_for_an_sm() {
  constexpr double kSlowMemoryGbpsPerSm = 30;
  return memory_gbps_per_sm() <= kSlowMemoryGbpsPerSm;
}

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace hotloop
