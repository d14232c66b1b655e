// Wide rows of the row-wise norms (rms_norm forward and backward, fused_add_rms_norm):
// rows that are 16-byte aligned but too long to stay in registers (bfloat16 beyond 32768
// elements in the forward, 16384 in the backward and fused_add_rms_norm). Each block
// takes one row at a time and stages it in dynamic shared memory, so that the second
// pass over the row reads the staged copy instead of DRAM. The forward and backward copy
// their rows with asynchronous 16-byte copies (cp.async, sm_80 and newer), all of a
// thread's vectors in flight at once and none of them through registers; fused_add_rms_norm
// stages the sums it computes. Every thread reads back only the vectors it staged itself,
// so the passes need no barrier beyond the row sum's, and a slot that the second pass has
// read can at once take the block's next row: its copies fly while this row is written.
// (One 64 KB bfloat16 row per SM at H = 65536: without that overlap an SM alternated
// between reading and writing, 70% of copy bandwidth.)
//
// Before this, such rows took the generic kernels with scalar loads: 34% of copy
// bandwidth for the forward at H = 65536 and 32% for forward+backward at H = 32768
// (H100, bfloat16; benchmarks/NOTES.md).
#pragma once

#include <algorithm>
#include <cstdint>

#include <cuda_pipeline.h>

#include "cuda_utils.cuh"

namespace hotloop {

// 512 threads: up to 128 registers each for the loads in flight (fused_add_rms_norm) and
// the backward's grad_weight accumulator; with 1024, at most 64 registers each, they
// spilled. The forward, which stages its loads with cp.async, needs few registers and
// takes 1024: a block of 512 left an SM with 16 warps to hide each row's latency
// (ncu at H = 65536 on an H100: 25% occupancy, warps stalled on L1TEX 75% of the time).
constexpr int kStagedThreads = 512;
constexpr int kStagedForwardThreads = kMaxThreadsPerBlock;
// Vectors of each tensor a fused_add_rms_norm thread loads before it stages their sums.
constexpr int kStagedUnroll = 4;
// Shared memory the row sums and the compiler keep for themselves, out of the opt-in
// maximum a block may have.
constexpr int kStagedReservedBytes = 2 * 1024;

// The block's staged rows, as vectors of T.
template <typename T>
__device__ __forceinline__ T* staged_rows() {
  extern __shared__ __align__(16) unsigned char hotloop_staged_bytes[];
  return reinterpret_cast<T*>(hotloop_staged_bytes);
}

// `*src` into `*dst`, asynchronously: in flight until wait_for_staged_vectors().
template <typename Vec>
__device__ __forceinline__ void stage_vector(Vec* dst, const Vec* src) {
  static_assert(sizeof(Vec) == kVectorBytes, "cp.async copies 16 bytes at a time here");
  __pipeline_memcpy_async(dst, src, sizeof(Vec));
}

// Vectors idx = threadIdx.x + i * kThreads of `src` into the same places of `dst`.
template <int kThreads, typename Vec>
__device__ __forceinline__ void stage_vectors(Vec* dst, const Vec* src, int num_vectors) {
  for (int idx = threadIdx.x; idx < num_vectors; idx += kThreads) {
    stage_vector(dst + idx, src + idx);
  }
}

// Waits for this thread's staged copies.
__device__ __forceinline__ void wait_for_staged_vectors() {
  __pipeline_commit();
  __pipeline_wait_prior(0);
}

// The row a block works on after `row` (the kernels stride rows over the grid), or -1.
__device__ __forceinline__ int64_t next_staged_row(int64_t row, int64_t rows) {
  const int64_t next = row + gridDim.x;
  return next < rows ? next : -1;
}

// Dynamic shared memory a block of the current device may stage rows in.
inline int64_t staged_bytes_limit() {
  int optin = 0;
  HOTLOOP_CUDA_CHECK(
      cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, current_device()));
  return int64_t{optin} - kStagedReservedBytes;
}

// Raises the kernel's dynamic shared memory limit to `bytes`: above 48 KB a kernel must
// opt in.
template <typename Kernel>
void allow_dynamic_shared_memory(Kernel kernel, int64_t bytes) {
  HOTLOOP_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          static_cast<int>(bytes)));
}

// allow_dynamic_shared_memory, then the persistent grid: as many blocks as fit on the
// GPU at once, at most one per row.
template <typename Kernel>
int64_t prepare_staged_launch(Kernel kernel, int threads, int64_t bytes, int64_t rows) {
  allow_dynamic_shared_memory(kernel, bytes);
  int blocks_per_sm = 0;
  HOTLOOP_CUDA_CHECK(
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks_per_sm, kernel, threads, bytes));
  HOTLOOP_CHECK(blocks_per_sm > 0, "hotloop: a block staging ", bytes,
                " bytes of each row does not fit on this GPU");
  return std::min<int64_t>(int64_t{blocks_per_sm} * num_sms(), rows);
}

}  // namespace hotloop
