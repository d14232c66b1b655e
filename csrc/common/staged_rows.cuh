// Wide rows of the row-wise norms (rms_norm forward and backward, fused_add_rms_norm):
// rows that are 16-byte aligned but too long to stay in registers (bfloat16 beyond 32768
// elements in the forward, 16384 in the backward) or, in fused_add_rms_norm, to be re-read
// from L2 (beyond about 40000 on an H100). Each block takes one row at a time and stages it in
// dynamic shared memory, so that the second pass over the row reads the staged copy instead of
// DRAM. The forward and backward copy their rows with asynchronous 16-byte copies (cp.async, sm_80
// and newer), all of a thread's vectors in flight at once and none of them through registers;
// fused_add_rms_norm stages the sums it computes. Every thread reads back only the vectors it
// staged itself, so the passes need no barrier beyond the row sum's, and a slot that the second
// pass has read can at once take the block's next row: its copies fly while this row is written.
//
// On sm_90 a row whose staged copy would leave room for too few blocks an SM (the
// forward: fewer than two) or not fit at all is split over a cluster of kStagedCluster
// blocks: each stages and writes
// its part of the row's columns, and the blocks add their row sums through distributed
// shared memory. A 128 KB row (bfloat16, H = 65536) then takes two 64 KB parts, three
// blocks an SM instead of one, and the backward's x and grad_out of such a row (256 KB)
// fit at all. The backward splits such rows over four blocks where it can, two an SM
// (rms_norm_backward_cuda.cu, kBackwardSplitCluster).
//
// Before this, such rows took the generic kernels with scalar loads: 34% of copy
// bandwidth for the forward at H = 65536, 32% for forward+backward at H = 32768 and 44 / 41 %
// for fused_add_rms_norm at 32768 / 65536 (H100, bfloat16; benchmarks/NOTES.md, run 12).
// Staged: fused_add_rms_norm 94 / 91 % (run 13), forward+backward at 32768 90 % once the
// copies went through cp.async (run 14), the forward at 65536 85 % on 1024 threads and a
// cluster of two (runs 15-16 and the quick run after them).
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include <cooperative_groups.h>
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
// Blocks of the split rows' clusters (sm_90 and newer).
constexpr int kStagedCluster = 2;

// Which part of its rows a block takes: the cluster's rows, strided over the grid's
// clusters; in each, the vectors [first_vector, first_vector + num_vectors).
struct RowPart {
  int64_t first_row;
  int64_t row_step;
  int first_vector;
  int num_vectors;
};

// For a 1-D grid of clusters of kCluster blocks, block b is rank b % kCluster of cluster
// b / kCluster. The host makes row_vectors a multiple of kCluster.
template <int kCluster>
__device__ __forceinline__ RowPart row_part(int row_vectors) {
  const int part = row_vectors / kCluster;
  return {static_cast<int64_t>(blockIdx.x / kCluster), static_cast<int64_t>(gridDim.x / kCluster),
          static_cast<int>(blockIdx.x % kCluster) * part, part};
}

// This block's vectors of `row` in `base` ([rows, hidden]).
template <typename Vec, typename T>
__device__ __forceinline__ auto part_vectors(T* base, int64_t row, int64_t hidden,
                                             const RowPart& part) {
  using PartVec = std::conditional_t<std::is_const_v<T>, const Vec, Vec>;
  return reinterpret_cast<PartVec*>(base + row * hidden) + part.first_vector;
}

// Adds each of v[0..N), already summed over this block, over the blocks of the cluster,
// in rank order (every block gets the same bits). `exchange[parity]` is this block's slot
// for the row; two slots alternate by row, so one cluster barrier a row suffices: a block
// writes a slot again only after the next row's barrier, which its peers pass once they
// have read it.
template <int kCluster, typename T, int N>
__device__ __forceinline__ void cluster_sum(T (&v)[N], T (&exchange)[2][N], int parity) {
  if constexpr (kCluster > 1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    namespace cg = cooperative_groups;
    cg::cluster_group cluster = cg::this_cluster();
    if (threadIdx.x == 0) {
#pragma unroll
      for (int n = 0; n < N; ++n) {
        exchange[parity][n] = v[n];
      }
    }
    cluster.sync();
#pragma unroll
    for (int n = 0; n < N; ++n) {
      v[n] = 0;
    }
    for (int rank = 0; rank < kCluster; ++rank) {
      const T* peer = cluster.map_shared_rank(&exchange[parity][0], rank);
#pragma unroll
      for (int n = 0; n < N; ++n) {
        v[n] += peer[n];
      }
    }
#else
    __trap();  // launched only on sm_90 and newer (staged_cluster_size)
#endif
  }
}

// A block may leave only when its peers are done reading its shared memory.
template <int kCluster>
__device__ __forceinline__ void leave_cluster() {
  if constexpr (kCluster > 1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    cooperative_groups::this_cluster().sync();
#endif
  }
}

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

// The row a block works on after `row`, or -1.
__device__ __forceinline__ int64_t next_staged_row(const RowPart& part, int64_t row, int64_t rows) {
  const int64_t next = row + part.row_step;
  return next < rows ? next : -1;
}

// Dynamic shared memory a block of the current device may stage rows in.
inline int64_t staged_bytes_limit() {
  return int64_t{device_attribute_once<cudaDevAttrMaxSharedMemoryPerBlockOptin>(current_device())} -
         kStagedReservedBytes;
}

// Blocks a staged row of `row_bytes` (every tensor the kernel stages) and `row_vectors`
// vectors is split over: 1, kStagedCluster (sm_90 and newer, when a whole row would leave
// room for fewer than `min_blocks_per_sm` blocks an SM, or not fit), or 0 where neither
// fits. A kernel whose registers allow one block an SM anyway passes 1: splitting it
// only adds a cluster barrier a row (the backward at H = 32768 on an H100: 89.5 % of copy
// bandwidth whole, 71.5 % split).
inline int staged_cluster_size(int64_t row_bytes, int64_t row_vectors, int min_blocks_per_sm) {
  const int64_t limit = staged_bytes_limit();
  const bool can_split = compute_capability_major() >= 9 && row_vectors % kStagedCluster == 0 &&
                         row_bytes / kStagedCluster <= limit;
  if (can_split && row_bytes * min_blocks_per_sm > limit) {
    return kStagedCluster;
  }
  return row_bytes <= limit ? 1 : 0;
}

// Raises the kernel's dynamic shared memory limit to `bytes`: above 48 KB a kernel must
// opt in.
template <typename Kernel>
void allow_dynamic_shared_memory(Kernel kernel, int64_t bytes) {
  HOTLOOP_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          static_cast<int>(bytes)));
}

// A persistent grid of staged blocks: `cluster` blocks a row (1 or kStagedCluster), each
// staging `bytes`, as many clusters as fit on the GPU at once, at most one per row.
struct StagedLaunch {
  int cluster;
  int threads;
  int64_t bytes;
  int64_t clusters;

  cudaLaunchConfig_t config(cudaStream_t stream, cudaLaunchAttribute* attribute) const {
    cudaLaunchConfig_t launch = {};
    launch.gridDim = dim3(static_cast<unsigned>(clusters * cluster));
    launch.blockDim = dim3(static_cast<unsigned>(threads));
    launch.dynamicSmemBytes = static_cast<size_t>(bytes);
    launch.stream = stream;
    attribute->id = cudaLaunchAttributeClusterDimension;
    attribute->val.clusterDim.x = static_cast<unsigned>(cluster);
    attribute->val.clusterDim.y = 1;
    attribute->val.clusterDim.z = 1;
    launch.attrs = attribute;
    launch.numAttrs = cluster > 1 ? 1 : 0;
    return launch;
  }
};

// allow_dynamic_shared_memory, then how many clusters of the kernel fit at once.
template <typename... Params>
StagedLaunch plan_staged_launch(void (*kernel)(Params...), int cluster, int threads, int64_t bytes,
                                int64_t rows) {
  allow_dynamic_shared_memory(kernel, bytes);
  StagedLaunch plan{cluster, threads, bytes, /*clusters=*/1};
  int fitting = 0;
  if (cluster > 1) {
    cudaLaunchAttribute attribute;
    const cudaLaunchConfig_t config = plan.config(nullptr, &attribute);
    HOTLOOP_CUDA_CHECK(cudaOccupancyMaxActiveClusters(&fitting, kernel, &config));
  } else {
    HOTLOOP_CUDA_CHECK(
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&fitting, kernel, threads, bytes));
    fitting *= num_sms();
  }
  HOTLOOP_CHECK(fitting > 0, "hotloop: a block staging ", bytes,
                " bytes of each row does not fit on this GPU");
  plan.clusters = std::min<int64_t>(fitting, rows);
  return plan;
}

template <typename... Params, typename... Args>
void launch_staged(const StagedLaunch& plan, cudaStream_t stream, void (*kernel)(Params...),
                   Args... args) {
  cudaLaunchAttribute attribute;
  const cudaLaunchConfig_t config = plan.config(stream, &attribute);
  HOTLOOP_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, args...));
}

}  // namespace hotloop
