// Input checks of fused_add_rms_norm, shared by its CPU and CUDA implementations.
#pragma once

#include <cstdint>

#include "../common/checks.h"

namespace hotloop {

// The bytes [first, last) a strided tensor can touch (none when it is empty).
struct ByteSpan {
  std::uintptr_t first = 0;
  std::uintptr_t last = 0;
};

inline ByteSpan byte_span(const Tensor& t) {
  if (t.numel() == 0) {
    return {};
  }
  int64_t extent = 1;
  for (int64_t d = 0; d < t.dim(); ++d) {
    extent += (t.size(d) - 1) * (t.stride(d) < 0 ? -t.stride(d) : t.stride(d));
  }
  const auto first = reinterpret_cast<std::uintptr_t>(t.const_data_ptr());
  return {first, first + static_cast<std::uintptr_t>(extent) * t.element_size()};
}

inline bool overlaps(const Tensor& a, const Tensor& b) {
  const ByteSpan sa = byte_span(a);
  const ByteSpan sb = byte_span(b);
  return sa.first < sb.last && sb.first < sa.last;
}

inline void check_fused_add_rms_norm_inputs(const Tensor& x, const Tensor& residual,
                                            const Tensor& weight) {
  constexpr const char* op = "fused_add_rms_norm";
  check_norm_input(op, "x", x);
  check_defined(op, "residual", residual);
  check_same_device(op, "x", x, "residual", residual);
  check_same_dtype(op, "x", x, "residual", residual);
  check_same_shape(op, "x", x, "residual", residual);
  // Both are written in place, so a contiguous copy would silently drop the result.
  HOTLOOP_CHECK(x.is_contiguous(), op,
                ": x is updated in place and must be contiguous, but got a non-contiguous x of "
                "shape ",
                shape_of(x));
  HOTLOOP_CHECK(residual.is_contiguous(), op,
                ": residual is updated in place and must be contiguous, but got a non-contiguous "
                "residual of shape ",
                shape_of(residual));
  check_norm_weight(op, weight, x);
  // The kernels read each row of x, residual and weight after writing to x and
  // residual: shared memory would give wrong results. torch's in-place ops refuse
  // the same way (at::assert_no_overlap), with this wording.
  HOTLOOP_CHECK(!overlaps(x, residual), op,
                ": unsupported operation: some elements of x and residual refer to a single "
                "memory location (both are written in place); pass separate tensors");
  HOTLOOP_CHECK(!overlaps(x, weight) && !overlaps(residual, weight), op,
                ": unsupported operation: some elements of weight and of x or residual (written "
                "in place) refer to a single memory location; pass weight.clone()");
}

}  // namespace hotloop
