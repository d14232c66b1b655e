// Input checks shared by the CPU and CUDA implementations of every hotloop op.
//
// Each op validates its inputs with these before touching data, so a bad call
// fails with a message naming the op, the argument, what was expected and what
// came in -- never with a crash or an out-of-bounds access.
#pragma once

#include <ATen/Dispatch.h>
#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include <optional>

// The four floating dtypes every hotloop op accepts.
#define HOTLOOP_DISPATCH_FLOATING(TYPE, NAME, ...) \
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, TYPE, NAME, __VA_ARGS__)

namespace hotloop {

inline void check_floating(const char* op, const char* name, const at::Tensor& t) {
  const auto dtype = t.scalar_type();
  TORCH_CHECK(
      dtype == at::kHalf || dtype == at::kBFloat16 || dtype == at::kFloat || dtype == at::kDouble,
      op, ": expected a floating-point tensor (float16, bfloat16, float32, float64) but got ",
      dtype, " for ", name);
}

inline void check_same_device(const char* op, const char* name_a, const at::Tensor& a,
                              const char* name_b, const at::Tensor& b) {
  TORCH_CHECK(a.device() == b.device(), op, ": ", name_a, " is on ", a.device(), " but ", name_b,
              " is on ", b.device());
}

inline void check_same_dtype(const char* op, const char* name_a, const at::Tensor& a,
                             const char* name_b, const at::Tensor& b) {
  TORCH_CHECK(a.scalar_type() == b.scalar_type(), op, ": ", name_a, " is ", a.scalar_type(),
              " but ", name_b, " is ", b.scalar_type(), " (expected the same dtype)");
}

inline void check_same_shape(const char* op, const char* name_a, const at::Tensor& a,
                             const char* name_b, const at::Tensor& b) {
  TORCH_CHECK(a.sizes() == b.sizes(), op, ": ", name_a, " has shape ", a.sizes(), " but ", name_b,
              " has shape ", b.sizes(), " (expected the same shape)");
}

// Inputs of the elementwise ops (muladd, mul): a and b alike in device, dtype and shape.
inline void check_elementwise_inputs(const char* op, const at::Tensor& a, const at::Tensor& b) {
  check_same_device(op, "a", a, "b", b);
  check_floating(op, "a", a);
  check_same_dtype(op, "a", a, "b", b);
  check_same_shape(op, "a", a, "b", b);
}

// x of a norm over the last dimension: floating and at least 1-d.
inline void check_norm_input(const char* op, const char* name, const at::Tensor& x) {
  TORCH_CHECK(x.dim() >= 1, op, ": expected ", name,
              " to have at least 1 dimension (the normalised one) but got a 0-dim tensor");
  check_floating(op, name, x);
}

// The optional weight of a norm: 1-D with H elements, same dtype and device as x.
inline void check_norm_weight(const char* op, const at::Tensor& weight, const at::Tensor& x) {
  check_same_device(op, "x", x, "weight", weight);
  check_same_dtype(op, "x", x, "weight", weight);
  TORCH_CHECK(weight.dim() == 1, op, ": weight must be 1-D (x's last dim, ", x.size(-1),
              " elements) but has shape ", weight.sizes());
  TORCH_CHECK(weight.numel() == x.size(-1), op, ": weight has ", weight.numel(),
              " elements but x's last dim is ", x.size(-1));
}

// rms_norm's inputs, on every backend.
inline void check_rms_norm_inputs(const char* op, const at::Tensor& x,
                                  const std::optional<at::Tensor>& weight) {
  check_norm_input(op, "x", x);
  if (weight.has_value()) {
    check_norm_weight(op, *weight, x);
  }
}

// rms_norm_backward's inputs: rms_norm's, plus a grad_out that matches x.
inline void check_rms_norm_backward_inputs(const char* op, const at::Tensor& grad_out,
                                           const at::Tensor& x,
                                           const std::optional<at::Tensor>& weight) {
  check_rms_norm_inputs(op, x, weight);
  check_same_device(op, "x", x, "grad_out", grad_out);
  check_same_dtype(op, "x", x, "grad_out", grad_out);
  check_same_shape(op, "x", x, "grad_out", grad_out);
}
}  // namespace hotloop
