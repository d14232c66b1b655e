// Input checks shared by the CPU and CUDA implementations of the hotloop ops.
//
// Each op validates its inputs with these before touching data, so a bad call
// fails with a message naming the op, the argument, what was expected and what
// came in -- never with a crash or an out-of-bounds access. Checks that only one
// op needs live in that op's folder.
#pragma once

#include <optional>

#include "tensor_api.h"

namespace hotloop {

inline bool is_floating(ScalarType dtype) {
  return dtype == ScalarType::Half || dtype == ScalarType::BFloat16 || dtype == ScalarType::Float ||
         dtype == ScalarType::Double;
}

// None for a required tensor argument reaches a kernel as an undefined tensor, whose first
// use would fail inside torch with a message that names neither the op nor the argument.
inline void check_defined(const char* op, const char* name, const Tensor& t) {
  HOTLOOP_CHECK(t.defined(), op, ": expected a tensor for ", name,
                " but got None (or an undefined tensor); ", name, " is required");
}

inline void check_floating(const char* op, const char* name, const Tensor& t) {
  HOTLOOP_CHECK(is_floating(t.scalar_type()), op,
                ": expected a floating-point tensor (float16, bfloat16, float32, float64) but got ",
                t.scalar_type(), " for ", name);
}

inline void check_same_device(const char* op, const char* name_a, const Tensor& a,
                              const char* name_b, const Tensor& b) {
  HOTLOOP_CHECK(same_device(a, b), op, ": ", name_a, " is on ", device_name(a), " but ", name_b,
                " is on ", device_name(b));
}

inline void check_same_dtype(const char* op, const char* name_a, const Tensor& a,
                             const char* name_b, const Tensor& b) {
  HOTLOOP_CHECK(a.scalar_type() == b.scalar_type(), op, ": ", name_a, " is ", a.scalar_type(),
                " but ", name_b, " is ", b.scalar_type(), " (expected the same dtype)");
}

inline void check_same_shape(const char* op, const char* name_a, const Tensor& a,
                             const char* name_b, const Tensor& b) {
  HOTLOOP_CHECK(sizes_of(a) == sizes_of(b), op, ": ", name_a, " has shape ", shape_of(a), " but ",
                name_b, " has shape ", shape_of(b), " (expected the same shape)");
}

// Inputs of the elementwise ops (muladd, mul): a and b alike in device, dtype and shape.
inline void check_elementwise_inputs(const char* op, const Tensor& a, const Tensor& b) {
  check_defined(op, "a", a);
  check_defined(op, "b", b);
  check_same_device(op, "a", a, "b", b);
  check_floating(op, "a", a);
  check_same_dtype(op, "a", a, "b", b);
  check_same_shape(op, "a", a, "b", b);
}

// x of a norm over the last dimension: floating and at least 1-d.
inline void check_norm_input(const char* op, const char* name, const Tensor& x) {
  check_defined(op, name, x);
  HOTLOOP_CHECK(x.dim() >= 1, op, ": expected ", name,
                " to have at least 1 dimension (the normalised one) but got a 0-dim tensor");
  check_floating(op, name, x);
}

// The weight of a norm: 1-D with H elements, same dtype and device as x.
inline void check_norm_weight(const char* op, const Tensor& weight, const Tensor& x) {
  check_defined(op, "weight", weight);
  check_same_device(op, "x", x, "weight", weight);
  check_same_dtype(op, "x", x, "weight", weight);
  HOTLOOP_CHECK(weight.dim() == 1, op, ": weight must be 1-D (x's last dim, ", x.size(-1),
                " elements) but has shape ", shape_of(weight));
  HOTLOOP_CHECK(weight.numel() == x.size(-1), op, ": weight has ", weight.numel(),
                " elements but x's last dim is ", x.size(-1));
}

}  // namespace hotloop
