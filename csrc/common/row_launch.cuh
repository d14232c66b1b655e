// How the row-wise norm kernels (rms_norm forward/backward, fused_add_rms_norm)
// map rows of a [rows, hidden] tensor onto blocks.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <type_traits>

#include "cuda_utils.cuh"

namespace hotloop {

// Every norm has a generic kernel besides its vector, staged and scalar variants: scalar
// loads, any hidden size and alignment, the row re-read (mostly from L1/L2) for the second
// pass. It is the one that takes every row the others cannot (float64 rows past the vector
// kernels' reach, unaligned rows longer than the scalar variants hold), not a fast path.

// Threads in a block whose rows are short enough to share it.
constexpr int kThreadsForShortRows = 128;

// Threads per row of the generic (scalar) kernels.
constexpr int kGenericThreadsPerRow = 512;

struct RowLaunch {
  // 0 selects the generic kernel (scalar loads, any hidden size, any alignment);
  // otherwise each thread keeps this many 16-byte vectors of its row in registers.
  int vectors_per_thread = 0;
  // blockDim.x: a power of two <= 32, or a multiple of 32.
  int threads_per_row = kWarpSize;
  // blockDim.y: > 1 only when threads_per_row <= 32, or in the vector backward where rows fill
  // their threads (rms_norm_backward_cuda.cu, rows_a_block).
  int rows_per_block = 1;

  dim3 block() const { return dim3(threads_per_row, rows_per_block); }
};

// What a kernel family supports: its compiled vectors-per-thread variants go from
// min_vectors_per_thread up to max_vectors_per_thread, and the planner picks the fewest
// vectors per thread that keep a row within target_threads threads (more threads, fewer
// registers).
struct RowKernelLimits {
  int max_vectors_per_thread;
  int target_threads;
  int max_threads;
  int min_vectors_per_thread = 1;
};

inline int threads_for_row(int64_t work_items) {
  if (work_items <= kWarpSize) {
    int lanes = 1;
    while (lanes < work_items) {
      lanes *= 2;
    }
    return lanes;
  }
  return static_cast<int>(ceil_div(work_items, kWarpSize) * kWarpSize);
}

// `vector_ok`: every pointer the kernel touches is 16-byte aligned, so rows of
// `hidden` elements, a multiple of the vector width, start on a vector boundary.
inline RowLaunch plan_row_launch(int64_t hidden, int vector_width, bool vector_ok,
                                 const RowKernelLimits& limits) {
  RowLaunch plan;
  if (vector_ok && hidden % vector_width == 0) {
    const int64_t num_vectors = hidden / vector_width;
    for (int vpt = limits.min_vectors_per_thread; vpt <= limits.max_vectors_per_thread; vpt *= 2) {
      const int64_t threads = ceil_div(num_vectors, vpt);
      if (threads <= limits.target_threads ||
          (vpt == limits.max_vectors_per_thread && threads <= limits.max_threads)) {
        plan.vectors_per_thread = vpt;
        plan.threads_per_row = threads_for_row(threads);
        break;
      }
    }
  }
  if (plan.vectors_per_thread == 0) {
    plan.threads_per_row = threads_for_row(std::min<int64_t>(hidden, kGenericThreadsPerRow));
  }
  if (plan.threads_per_row <= kWarpSize) {
    plan.rows_per_block = kThreadsForShortRows / plan.threads_per_row;
  }
  return plan;
}

// The plan of the first of `limits_list` that takes a vector kernel, or where none does, the
// last's.
template <std::size_t kCount>
inline RowLaunch first_vector_plan(int64_t hidden, int vector_width, bool vector_ok,
                                   const RowKernelLimits (&limits_list)[kCount]) {
  RowLaunch plan;
  for (const RowKernelLimits& limits : limits_list) {
    plan = plan_row_launch(hidden, vector_width, vector_ok, limits);
    if (plan.vectors_per_thread != 0) {
      break;
    }
  }
  return plan;
}

// On a GPU whose memory is slow for an SM (memory_is_slow_for_an_sm), the plan of the first of
// `slow_memory_limits` that takes a vector kernel; elsewhere, or where none does,
// first_vector_plan of `limits`.
template <std::size_t kSlowCount, std::size_t kCount>
inline RowLaunch plan_row_launch_for_device(int64_t hidden, int vector_width, bool vector_ok,
                                            const RowKernelLimits (&slow_memory_limits)[kSlowCount],
                                            const RowKernelLimits (&limits)[kCount]) {
  if (memory_is_slow_for_an_sm()) {
    const RowLaunch plan = first_vector_plan(hidden, vector_width, vector_ok, slow_memory_limits);
    if (plan.vectors_per_thread != 0) {
      return plan;
    }
  }
  return first_vector_plan(hidden, vector_width, vector_ok, limits);
}

// Calls launch(std::integral_constant<int, V>{}) for the V of kVariants the plan picked
// (its vectors per thread) and returns true, or returns false where it picked none of
// them (0: the caller's scalar or generic kernels).
template <int... kVariants, typename Launch>
bool launch_vector_rows(const RowLaunch& plan, Launch&& launch) {
  return ((plan.vectors_per_thread == kVariants &&
           (launch(std::integral_constant<int, kVariants>{}), true)) ||
          ...);
}

// Whether the plan's vector kernel leaves an SM, by its registers, one block at a time or
// fewer than half of its threads while the rows fill every SM with its blocks more than once
// over: its row sums then stall the SM, or too few warps keep the memory busy
// (fused_add_rms_norm's launch takes another kernel instead). Rows that fit on the GPU at
// once skip the runtime's query: none of them waits for a block.
template <int... kVariants, typename KernelOf>
bool vector_plan_underfills_sms(const RowLaunch& plan, int64_t rows, const KernelOf& kernel_of) {
  const int sms = num_sms();
  if (plan.vectors_per_thread == 0 || rows <= sms) {
    return false;
  }
  const int threads = plan.threads_per_row * plan.rows_per_block;
  int blocks = 0;
  launch_vector_rows<kVariants...>(plan, [&](auto vpt) {
    HOTLOOP_CUDA_CHECK(
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel_of(vpt), threads, 0));
  });
  const bool rows_wait = rows > int64_t{blocks} * plan.rows_per_block * sms;
  return rows_wait &&
         (blocks < 2 ||
          2 * blocks * threads <
              device_attribute_once<cudaDevAttrMaxThreadsPerMultiProcessor>(current_device()));
}

// Blocks an SM of the fused ops' re-read kernels (fused_add_rms_norm's and the FP8 ones), each of
// kMaxThreadsPerBlock threads on one row at a time: one block's row sum leaves the other's
// loads in flight.
constexpr int kRereadBlocksPerSm = 2;

// How many blocks an SM (a row each) a re-read kernel may keep resident so that the rows of
// row_bytes they store (or read) in their first pass stay in the L2 for their second: while
// those rows fit in l2_percent of the L2.
// Two fifths where the second read comes after a pass over other tensors: past that the rows are
// evicted before they are read back; on an H100 (50 MB), fused_add_rms_norm in bfloat16, % of
// copy, re-read against staged in shared memory (benchmarks/NOTES.md, run O33): 32768 with 17 MB
// in flight 96.7 / 94.2, 49152 with 26 MB 92.2 / 93.0, 65536 with 35 MB 85.5 / 93.4.
inline int64_t reread_blocks_in_l2(int64_t row_bytes, int64_t l2_percent = 40) {
  const int device = current_device();
  // (Rows of no bytes fit any number: counted as rows of one.)
  return l2_percent * int64_t{device_attribute_once<cudaDevAttrL2CacheSize>(device)} /
         (100 * int64_t{device_attribute_once<cudaDevAttrMultiProcessorCount>(device)} *
          std::max<int64_t>(row_bytes, 1));
}

// One block per group of rows, capped (kernels loop over rows with a grid stride).
inline int64_t row_blocks(int64_t rows, const RowLaunch& plan) {
  return std::min<int64_t>(ceil_div(rows, plan.rows_per_block), int64_t{1} << 20);
}

// The rows of this thread, `for (const int64_t row : block_rows(rows))`: its block's rows,
// blockDim.y of them (row threadIdx.y of each), strided over the grid. The loop bound is the
// same for the whole block, as row_reduce needs, so a row may be past the end (>= rows): the
// kernel masks it. (An iterator, not a loop around a lambda: through a lambda's captures nvcc
// compiled fused_add_rms_norm's kernels differently.)
class BlockRows {
 public:
  class Iterator {
   public:
    __device__ __forceinline__ Iterator(int64_t block_row, int64_t rows)
        : block_row_(block_row), rows_(rows) {}
    __device__ __forceinline__ int64_t operator*() const { return block_row_ + threadIdx.y; }
    __device__ __forceinline__ Iterator& operator++() {
      block_row_ += static_cast<int64_t>(gridDim.x) * blockDim.y;
      return *this;
    }
    __device__ __forceinline__ bool operator!=(const Iterator& /*end*/) const {
      return block_row_ < rows_;
    }

   private:
    int64_t block_row_;
    int64_t rows_;
  };

  __device__ __forceinline__ explicit BlockRows(int64_t rows) : rows_(rows) {}
  __device__ __forceinline__ Iterator begin() const {
    return Iterator(static_cast<int64_t>(blockIdx.x) * blockDim.y, rows_);
  }
  __device__ __forceinline__ Iterator end() const { return Iterator(rows_, rows_); }

 private:
  int64_t rows_;
};

__device__ __forceinline__ BlockRows block_rows(int64_t rows) { return BlockRows(rows); }

// use(i, idx) for this thread's vectors of a row that `threads` threads share, vector i at
// idx = threadIdx.x + i * threads < num_vectors (none where !row_valid), unrolled. (row_valid
// apart from num_vectors: folded into one count, the vector kernels compiled to other code.)
template <int kVectors, typename Use>
__device__ __forceinline__ void for_row_vectors(int threads, bool row_valid, int num_vectors,
                                                Use&& use) {
#pragma unroll
  for (int i = 0; i < kVectors; ++i) {
    const int idx = threadIdx.x + i * threads;
    if (row_valid && idx < num_vectors) {
      use(i, idx);
    }
  }
}

// a[i] = a_row[idx] and b[i] = b_row[idx] for this thread's vectors of a vector kernel's row,
// idx = threadIdx.x + i * blockDim.x < num_vectors (none where !row_valid): both tensors'
// loads before any store of the caller's.
template <int kVectors, typename Vec>
__device__ __forceinline__ void load_vector_pairs(Vec (&a)[kVectors], const Vec* a_row,
                                                  Vec (&b)[kVectors], const Vec* b_row,
                                                  bool row_valid, int num_vectors) {
  for_row_vectors<kVectors>(blockDim.x, row_valid, num_vectors, [&](int i, int idx) {
    a[i] = a_row[idx];
    b[i] = b_row[idx];
  });
}

// kernel(args...) on the plan's blocks, row_blocks of them, and the launch's error check.
template <typename... Params, typename... Args>
void launch_row_kernel(void (*kernel)(Params...), const RowLaunch& plan, int64_t rows,
                       cudaStream_t stream, Args... args) {
  kernel<<<dim3(static_cast<unsigned>(row_blocks(rows, plan))), plan.block(), 0, stream>>>(args...);
  HOTLOOP_KERNEL_LAUNCH_CHECK();
}

// A re-read kernel on its blocks: one row a block of kThreads.
template <int kThreads = kMaxThreadsPerBlock, typename... Params, typename... Args>
void launch_reread_kernel(void (*kernel)(Params...), int64_t rows, cudaStream_t stream,
                          Args... args) {
  RowLaunch plan;
  plan.threads_per_row = kThreads;
  launch_row_kernel(kernel, plan, rows, stream, args...);
}

// launch_row_kernel of kernel_of(std::integral_constant<int, V>{}) for the V of kVariants the
// plan picked; returns whether it picked one (as launch_vector_rows).
template <int... kVariants, typename KernelOf, typename... Args>
bool launch_vector_row_kernel(const RowLaunch& plan, int64_t rows, cudaStream_t stream,
                              const KernelOf& kernel_of, Args... args) {
  return launch_vector_rows<kVariants...>(
      plan, [&](auto vpt) { launch_row_kernel(kernel_of(vpt), plan, rows, stream, args...); });
}

}  // namespace hotloop
