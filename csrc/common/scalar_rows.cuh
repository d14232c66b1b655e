// The register-resident scalar kernels of the row-wise norms (rms_norm forward
// and backward, fused_add_rms_norm): rows that the 16-byte vector kernels cannot
// take (a hidden size that is not a multiple of the vector width, or pointers off
// a 16-byte boundary) but that fit in registers as scalars. Each thread keeps
// elements j = threadIdx.x + i * stride, i < kElemsPerThread, of its row, read
// with coalesced scalar loads, so a row is read from global memory once. Against the generic
// kernels, which read it twice: bfloat16 forward 42 -> 82 % of copy bandwidth at H = 4095 and
// 46 -> 85 % at 8193, forward+backward 41 -> 78 % and 27 -> 76 % (H100, benchmarks/NOTES.md,
// run 2); fused_add_rms_norm 49 -> 83 % and 41 -> 81 %, with its loads ahead of its stores
// (runs 3-5).
//
// The variants (ScalarRows): kElemsPerThread elements a thread on kFixedThreads threads a
// row, a constant, so that a thread's elements sit at constant offsets from one pointer and
// the row fits in the registers (with a run-time stride nvcc kept a 64-bit address per
// element: more registers, fewer threads an SM). Only the shortest rows (up to 768
// elements) take blockDim.x as planned, so that rows of up to 32 threads can share a block.
// Longer rows, and float64 (whose rows would not fit in registers), take the generic kernels.
// benchmarks/NOTES.md (runs 32-34) has the fixed variants against the planned blockDim.x.
#pragma once

#include <cstddef>
#include <cstdint>
#include <tuple>
#include <type_traits>
#include <utility>

#include "cuda_utils.cuh"
#include "row_launch.cuh"

namespace hotloop {

// Threads of a row in the variant that takes blockDim.x as planned: at most this many. Up
// to 768 elements it keeps those rows: the fixed 256 threads would leave a quarter or more
// of theirs without an element, and rms_norm_fp8 ran 17 % slower so at H = 601.
constexpr int kScalarPlannedMaxThreads = 192;

template <int kElems, int kThreads>  // kThreads == 0: blockDim.x as planned
struct ScalarRows {
  static constexpr int kElemsPerThread = kElems;
  static constexpr int kFixedThreads = kThreads;
  static constexpr int64_t kMaxHidden =
      int64_t{kElems} * (kThreads > 0 ? kThreads : kScalarPlannedMaxThreads);
  // __launch_bounds__: the planned variant keeps the 1024 of a block whose blockDim.x was
  // up to 512 (its registers as they were).
  static constexpr int kLaunchBound = kThreads > 0 ? kThreads : kMaxThreadsPerBlock;
};

using ScalarRowsPlanned = ScalarRows<4, 0>;

// In the order the planner tries them (the first that holds the row).
using ScalarRowVariants = std::tuple<ScalarRowsPlanned, ScalarRows<4, 256>, ScalarRows<8, 256>,
                                     ScalarRows<16, 256>, ScalarRows<24, 384>, ScalarRows<32, 512>>;

// The distance between a thread's consecutive elements in its row.
template <typename Rows>
__device__ __forceinline__ int scalar_stride() {
  return Rows::kFixedThreads > 0 ? Rows::kFixedThreads : static_cast<int>(blockDim.x);
}

// a[i] = a_own[i * stride] and b[i] = b_own[i * stride] for this thread's elements of the row
// (i * stride < row_columns), zeros past its end: both tensors' loads before any store of the
// caller's.
template <int kElems, typename scalar_t>
__device__ __forceinline__ void load_scalar_pairs(scalar_t (&a)[kElems], const scalar_t* a_own,
                                                  scalar_t (&b)[kElems], const scalar_t* b_own,
                                                  int stride, int row_columns) {
#pragma unroll
  for (int i = 0; i < kElems; ++i) {
    const bool in_row = i * stride < row_columns;
    a[i] = in_row ? a_own[i * stride] : scalar_t(0);
    b[i] = in_row ? b_own[i * stride] : scalar_t(0);
  }
}

template <typename scalar_t>
constexpr bool kScalarRowsInRegisters = sizeof(scalar_t) <= 4;

struct ScalarRowLaunch {
  int variant = -1;  // index into ScalarRowVariants; -1: the row is too long for every one
  RowLaunch launch;  // its threads_per_row and rows_per_block
};

namespace detail {
template <std::size_t... kIndex>
ScalarRowLaunch plan_scalar_rows(int64_t hidden, std::index_sequence<kIndex...>) {
  ScalarRowLaunch plan;
  ((hidden <= std::tuple_element_t<kIndex, ScalarRowVariants>::kMaxHidden &&
    (plan.variant = static_cast<int>(kIndex),
     plan.launch.threads_per_row = std::tuple_element_t<kIndex, ScalarRowVariants>::kFixedThreads,
     true)) ||
   ...);
  return plan;
}

template <typename Launch, std::size_t... kIndex>
bool launch_scalar_variant(int variant, Launch&& launch, std::index_sequence<kIndex...>) {
  return ((variant == static_cast<int>(kIndex) &&
           (launch(std::tuple_element_t<kIndex, ScalarRowVariants>{}), true)) ||
          ...);
}
}  // namespace detail

inline ScalarRowLaunch plan_scalar_row_launch(int64_t hidden) {
  constexpr auto kVariants = std::make_index_sequence<std::tuple_size_v<ScalarRowVariants>>{};
  ScalarRowLaunch plan = detail::plan_scalar_rows(hidden, kVariants);
  if (plan.variant >= 0 && plan.launch.threads_per_row == 0) {  // blockDim.x as planned
    plan.launch.threads_per_row =
        threads_for_row(ceil_div(hidden, int64_t{ScalarRowsPlanned::kElemsPerThread}));
  }
  if (plan.launch.threads_per_row <= kWarpSize) {
    plan.launch.rows_per_block = kThreadsForShortRows / plan.launch.threads_per_row;
  }
  return plan;
}

// Calls launch(Rows{}) for the variant the plan picked and returns true, or returns false
// where no variant takes the rows (too long, or float64): the caller falls back to its
// generic kernel.
template <typename scalar_t, typename Launch>
bool launch_scalar_rows(const ScalarRowLaunch& plan, Launch&& launch) {
  if constexpr (!kScalarRowsInRegisters<scalar_t>) {
    return false;
  } else {
    return detail::launch_scalar_variant(
        plan.variant, launch, std::make_index_sequence<std::tuple_size_v<ScalarRowVariants>>{});
  }
}

// The last resort of the row-wise norms' launchers: launch_row_kernel of
// scalar_kernel_of(Rows{}) for the variant that plan_scalar_row_launch picks for rows of
// `hidden` elements, or, where none takes them, of `generic` on generic_plan's blocks.
template <typename scalar_t, typename ScalarKernelOf, typename... Params, typename... Args>
void launch_scalar_or_generic(int64_t hidden, int64_t rows, cudaStream_t stream,
                              const ScalarKernelOf& scalar_kernel_of, void (*generic)(Params...),
                              const RowLaunch& generic_plan, Args... args) {
  const ScalarRowLaunch plan = plan_scalar_row_launch(hidden);
  const bool launched = launch_scalar_rows<scalar_t>(plan, [&](auto rows_variant) {
    launch_row_kernel(scalar_kernel_of(rows_variant), plan.launch, rows, stream, args...);
  });
  if (!launched) {
    launch_row_kernel(generic, generic_plan, rows, stream, args...);
  }
}

}  // namespace hotloop
