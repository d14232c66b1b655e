// Input checks of rms_norm and rms_norm_backward, shared by the CPU and CUDA files.
#pragma once

#include <optional>
#include <tuple>

#include "../common/checks.h"
#include "../common/norm_casting.h"
// overlaps(): rms_norm_backward_ writes grad_out in place.
#include "../fused_add_rms_norm/fused_add_rms_norm_checks.h"

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

// rms_norm_backward of a device whose `into(grad_out, x, weight, eps, mode, offset, grad_x)`
// writes grad_x (contiguous, x's shape) and returns grad_weight: the op its library registers.
template <auto into>
std::tuple<Tensor, Tensor> rms_norm_backward_op(const Tensor& grad_out, const Tensor& x,
                                                const std::optional<Tensor>& weight, double eps,
                                                int64_t casting, double offset) {
  constexpr const char* op = "rms_norm_backward";
  const Casting mode = checked_casting(op, casting, offset);
  check_rms_norm_backward_inputs(op, grad_out, x, weight);
  Tensor grad_x = empty_like_contiguous(x);
  Tensor grad_weight = into(grad_out, x, weight, eps, mode, offset, grad_x);
  return {grad_x, grad_weight};
}

// rms_norm_backward_ of the same `into`, with grad_x = grad_out: each
// kernel reads an element's grad_out before it writes that element's grad_x, in the same
// thread (their grad_out and grad_x pointers are not __restrict__ for this reason); the CUDA
// span kernel also reads the neighbouring rows' elements of its edge vectors, which other
// blocks may have written, and uses none of them. The rows take the kernels of the
// out-of-place call, so grad_x and grad_weight are equal to its bit for bit (except where
// grad_out and x share an offset from the 16-byte boundary: the out-of-place grad_x, a new
// tensor, sits on it, and those rows take another kernel there). Returns grad_weight.
template <auto into>
Tensor rms_norm_backward_in_place_op(Tensor& grad_out, const Tensor& x,
                                     const std::optional<Tensor>& weight, double eps,
                                     int64_t casting, double offset) {
  constexpr const char* op = "rms_norm_backward_";
  const Casting mode = checked_casting(op, casting, offset);
  check_rms_norm_backward_inputs(op, grad_out, x, weight);
  HOTLOOP_CHECK(grad_out.is_contiguous(), op,
                ": grad_x is written over grad_out, which must be contiguous, but got a "
                "non-contiguous grad_out of shape ",
                shape_of(grad_out), "; pass grad_out.contiguous(), or call rms_norm_backward");
  HOTLOOP_CHECK(!overlaps(grad_out, x), op,
                ": unsupported operation: some elements of x and grad_out (written in place) "
                "refer to a single memory location; call rms_norm_backward");
  HOTLOOP_CHECK(!weight.has_value() || !overlaps(grad_out, *weight), op,
                ": unsupported operation: some elements of weight and grad_out (written in "
                "place) refer to a single memory location; call rms_norm_backward");
  return into(grad_out, x, weight, eps, mode, offset, grad_out);
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
