// Input checks of rms_norm and rms_norm_backward, shared by the CPU and CUDA files.
#pragma once

#include <optional>
#include <tuple>

#include "../common/checks.h"
#include "../common/norm_casting.h"

namespace hotloop {

inline void check_rms_norm_inputs(const char* op, const Tensor& x,
                                  const std::optional<Tensor>& weight) {
  check_norm_input(op, "x", x);
  if (weight.has_value()) {
    check_norm_weight(op, *weight, x);
  }
}

// rms_norm's inputs, plus a grad_out that matches x.
inline void check_rms_norm_backward_inputs(const char* op, const Tensor& grad_out, const Tensor& x,
                                           const std::optional<Tensor>& weight) {
  check_defined(op, "grad_out", grad_out);
  check_rms_norm_inputs(op, x, weight);
  check_same_device(op, "x", x, "grad_out", grad_out);
  check_same_dtype(op, "x", x, "grad_out", grad_out);
  check_same_shape(op, "x", x, "grad_out", grad_out);
}

// The entry point of rms_norm_backward around a device's
// `into(grad_out, x, weight, eps, mode, offset, grad_x)`, which writes grad_x (contiguous,
// x's shape) and returns grad_weight.
template <typename Into>
std::tuple<Tensor, Tensor> rms_norm_backward_op(const Tensor& grad_out, const Tensor& x,
                                                const std::optional<Tensor>& weight, double eps,
                                                int64_t casting, double offset, const Into& into) {
  constexpr const char* op = "rms_norm_backward";
  const Casting mode = checked_casting(op, casting, offset);
  check_rms_norm_backward_inputs(op, grad_out, x, weight);
  Tensor grad_x = empty_like_contiguous(x);
  Tensor grad_weight = into(grad_out, x, weight, eps, mode, offset, grad_x);
  return {grad_x, grad_weight};
}

// y for rms_norm(x): laid out like x (torch.empty_like's preserve_format, so a
// channels_last x gives a channels_last y, as torch's own norms do).
inline Tensor rms_norm_output(const Tensor& x) { return empty_preserving_layout(x); }

// Hands back y, copying the contiguous result into it when y is laid out otherwise.
inline Tensor finish_rms_norm_output(Tensor y, const Tensor& y_contig) {
  if (!y.is_contiguous()) {
    copy_into(y, y_contig);
  }
  return y;
}

}  // namespace hotloop
