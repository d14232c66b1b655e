// Input checks of fused_add_rms_norm, shared by its CPU and CUDA implementations.
#pragma once

#include <ATen/core/Tensor.h>

#include "checks.h"

namespace hotloop {

inline void check_fused_add_rms_norm_inputs(const at::Tensor& x, const at::Tensor& residual,
                                            const at::Tensor& weight) {
  constexpr const char* op = "fused_add_rms_norm";
  check_norm_input(op, "x", x);
  check_same_device(op, "x", x, "residual", residual);
  check_same_dtype(op, "x", x, "residual", residual);
  check_same_shape(op, "x", x, "residual", residual);
  // Both are written in place, so a contiguous copy would silently drop the result.
  TORCH_CHECK(x.is_contiguous(), op,
              ": x is updated in place and must be contiguous, but got strides ", x.strides(),
              " for shape ", x.sizes());
  TORCH_CHECK(residual.is_contiguous(), op,
              ": residual is updated in place and must be contiguous, but got strides ",
              residual.strides(), " for shape ", residual.sizes());
  check_norm_weight(op, weight, x);
}

}  // namespace hotloop
