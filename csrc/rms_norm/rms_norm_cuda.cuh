// What rms_norm's CUDA forward (rms_norm_cuda.cu: its kernels, the ops' registration) and
// backward (rms_norm_backward_cuda.cu: its kernels) share. Two translation units, which the
// build compiles side by side, and a change to the forward's kernels rebuilds those alone (sm_90,
// nvcc 13.0: 46 s for the one file they were, 22 s and 43 s for the two).
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <optional>
#include <tuple>
#include <type_traits>

#include "../common/cuda_utils.cuh"
#include "../common/dependent_launch.cuh"
#include "../common/norm_casting.cuh"
#include "../common/row_launch.cuh"
#include "../common/scalar_rows.cuh"
#include "../common/span_rows.cuh"
#include "../common/staged_rows.cuh"
#include "rms_norm_checks.h"

namespace hotloop {

// Whether a kernel multiplies by a weight. Only kTorch's kernels run without one: a call
// without a weight computes alike in every mode and takes them, so the kLlama and kGemma
// kernels compile no weightless path (a smaller library).
template <Casting kCasting, typename T>
__device__ __forceinline__ bool has_weight(const T* weight) {
  return kCasting != Casting::kTorch || weight != nullptr;
}

// Writes grad_x (contiguous, x's shape) and returns grad_weight: rms_norm_backward's and
// rms_norm_backward_'s CUDA kernel (rms_norm_backward_cuda.cu).
Tensor rms_norm_backward_cuda_into(const Tensor& grad_out, const Tensor& x,
                                   const std::optional<Tensor>& weight, double eps, Casting mode,
                                   double offset, const Tensor& grad_x);

}  // namespace hotloop
