// The register-resident scalar kernels of the row-wise norms (rms_norm forward
// and backward, fused_add_rms_norm): rows that the 16-byte vector kernels cannot
// take (a hidden size that is not a multiple of the vector width, or pointers off
// a 16-byte boundary) but that fit in registers as scalars. Each thread keeps
// elements j = threadIdx.x + i * stride, i < kElemsPerThread, of its row, read
// with coalesced scalar loads, so a row is read from global memory once.
//
// Four variants: kScalarElemsShort elements per thread with blockDim.x as
// planned, for rows up to kScalarElemsShort * 512; then kScalarElemsMid,
// kScalarElemsWide and kScalarElemsLong elements per thread with a thread count
// fixed at compile time (scalar_fixed_threads), for rows up to the product. With
// the thread count a constant, a thread's elements sit at constant offsets from
// one pointer, so the row fits in the registers without spilling (with a run-time
// stride nvcc kept a 64-bit address per element and spilled). Longer rows, and
// float64 (whose rows would not fit in registers), take the generic kernels.
#pragma once

#include <cstdint>
#include <type_traits>

#include "cuda_utils.cuh"
#include "row_launch.cuh"

namespace hotloop {

constexpr int kScalarElemsShort = 4;
constexpr int kScalarElemsMid = 16;
constexpr int kScalarElemsWide = 24;
constexpr int kScalarElemsLong = 32;

// blockDim.x of the scalar kernels: 0 = as planned.
constexpr int scalar_fixed_threads(int elems_per_thread) {
  return elems_per_thread == kScalarElemsShort  ? 0
         : elems_per_thread == kScalarElemsMid  ? 256
         : elems_per_thread == kScalarElemsWide ? 384
                                                : 512;
}

constexpr int scalar_max_threads(int elems_per_thread) {
  return elems_per_thread == kScalarElemsShort ? kMaxThreadsPerBlock
                                               : scalar_fixed_threads(elems_per_thread);
}

// The distance between a thread's consecutive elements in its row.
template <int kElemsPerThread>
__device__ __forceinline__ int scalar_stride() {
  constexpr int kFixedThreads = scalar_fixed_threads(kElemsPerThread);
  return kFixedThreads > 0 ? kFixedThreads : static_cast<int>(blockDim.x);
}

template <typename scalar_t>
constexpr bool kScalarRowsInRegisters = sizeof(scalar_t) <= 4;

// vectors_per_thread of the plan holds the elements per thread; 0 when the row
// is too long for every variant.
inline RowLaunch plan_scalar_row_launch(int64_t hidden) {
  RowLaunch plan;
  if (hidden <= int64_t{kScalarElemsShort} * 512) {
    plan.vectors_per_thread = kScalarElemsShort;
    plan.threads_per_row = threads_for_row(ceil_div(hidden, kScalarElemsShort));
  } else {
    for (const int elems : {kScalarElemsMid, kScalarElemsWide, kScalarElemsLong}) {
      if (hidden <= int64_t{elems} * scalar_fixed_threads(elems)) {
        plan.vectors_per_thread = elems;
        plan.threads_per_row = scalar_fixed_threads(elems);
        break;
      }
    }
  }
  if (plan.threads_per_row <= kWarpSize) {
    plan.rows_per_block = kThreadsForShortRows / plan.threads_per_row;
  }
  return plan;
}

// Calls launch(std::integral_constant<int, kElemsPerThread>{}) for the variant the
// plan picked and returns true, or returns false where no variant takes the rows
// (too long, or float64): the caller falls back to its generic kernel.
template <typename scalar_t, typename Launch>
bool launch_scalar_rows(const RowLaunch& scalar_plan, Launch&& launch) {
  if constexpr (!kScalarRowsInRegisters<scalar_t>) {
    return false;
  } else {
    switch (scalar_plan.vectors_per_thread) {
      case kScalarElemsShort:
        launch(std::integral_constant<int, kScalarElemsShort>{});
        return true;
      case kScalarElemsMid:
        launch(std::integral_constant<int, kScalarElemsMid>{});
        return true;
      case kScalarElemsWide:
        launch(std::integral_constant<int, kScalarElemsWide>{});
        return true;
      case kScalarElemsLong:
        launch(std::integral_constant<int, kScalarElemsLong>{});
        return true;
      default:
        return false;
    }
  }
}

}  // namespace hotloop
