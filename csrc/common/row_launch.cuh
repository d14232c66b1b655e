// How the row-wise norm kernels (rms_norm forward/backward, fused_add_rms_norm)
// map rows of a [rows, hidden] tensor onto blocks.
#pragma once

#include <ATen/ATen.h>

#include <algorithm>
#include <cstdint>
#include <initializer_list>

#include "cuda_utils.cuh"

namespace hotloop {

// The compiled register-resident variants hold 1, 2, 4 or 8 16-byte vectors of a
// row per thread; kMaxVectorsPerThread bounds the row length they cover
// (8 vectors * 1024 threads * 8 elements = 65536 float16/bfloat16 elements).
constexpr int kMaxVectorsPerThread = 8;

// Threads per row the planner aims for: enough 16-byte loads in flight per row
// without leaving many threads idle at the end of a row.
constexpr int kTargetThreadsPerRow = 256;

// Rows per block when one warp handles a row: 4 warps = 128 threads per block.
constexpr int kRowsPerBlockForWarpRows = 4;

struct RowLaunch {
  // 0 selects the generic kernel (scalar loads, any hidden size, any alignment);
  // otherwise each thread keeps this many 16-byte vectors of its row in registers.
  int vectors_per_thread = 0;
  int threads_per_row = kWarpSize;  // blockDim.x, a multiple of 32
  int rows_per_block = 1;           // blockDim.y, > 1 only when threads_per_row == 32

  dim3 block() const { return dim3(threads_per_row, rows_per_block); }
};

inline int round_up_to_warp(int64_t n) {
  return static_cast<int>(ceil_div(n, kWarpSize) * kWarpSize);
}

// `vector_ok`: every pointer the kernel touches is 16-byte aligned, so rows of
// `hidden` elements, a multiple of the vector width, start on a vector boundary.
inline RowLaunch plan_row_launch(int64_t hidden, int vector_width, bool vector_ok) {
  RowLaunch plan;
  if (vector_ok && hidden % vector_width == 0) {
    const int64_t num_vectors = hidden / vector_width;
    for (int vpt : {1, 2, 4, 8}) {
      const int64_t threads = ceil_div(num_vectors, vpt);
      if (threads <= kTargetThreadsPerRow ||
          (vpt == kMaxVectorsPerThread && threads <= kMaxThreadsPerBlock)) {
        plan.vectors_per_thread = vpt;
        plan.threads_per_row = round_up_to_warp(threads);
        break;
      }
    }
  }
  if (plan.vectors_per_thread == 0) {
    plan.threads_per_row = round_up_to_warp(std::min<int64_t>(hidden, 512));
  }
  if (plan.threads_per_row == kWarpSize) {
    plan.rows_per_block = kRowsPerBlockForWarpRows;
  }
  return plan;
}

// One block per group of rows, capped (kernels loop over rows with a grid stride).
inline int64_t row_blocks(int64_t rows, const RowLaunch& plan) {
  return std::min<int64_t>(ceil_div(rows, plan.rows_per_block), int64_t{1} << 20);
}

}  // namespace hotloop
