// What the CPU and CUDA files of the FP8 norms share: the quantisation's
// constants and scale formula, the input checks and the outputs.
//
// y = rms_norm(x) * weight in float32 (float64 for float64 x), then
// out = e4m3(y * (1 / scale)) with 1 / scale formed once in float32, rounded to
// nearest even and saturated to +-448 (NaN stays NaN): the static ops take one
// scale for the whole tensor, the dynamic ones compute one per row from the row's
// largest |y|, formed as rstd * max|v * weight| (v: x, or the new residual).
// y is the casting mode's (common/norm_casting.h) before its rounding to the dtype, which
// the quantisation replaces: v * rstd * weight (torch), (v * rstd rounded to the dtype) *
// weight (llama), v * rstd * (offset + weight) (gemma). The dynamic scale's weight is the
// weight as it multiplies (offset + weight in gemma); llama's rounding of v * rstd stays out
// of it, so that one exchange between threads still gives rstd and the maximum (a value
// rounded up past rstd * max|v * weight| is within half a step of the dtype of it, which
// e4m3's rounding at 448 absorbs).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <tuple>
#include <utility>
#include <vector>

#include "../common/checks.h"
#include "../common/norm_casting.h"
// overlaps(): the fused ops write residual in place, as fused_add_rms_norm does.
#include "../fused_add_rms_norm/fused_add_rms_norm_checks.h"

#ifdef __CUDACC__
#define HOTLOOP_HOST_DEVICE __host__ __device__
#else
#define HOTLOOP_HOST_DEVICE
#endif

namespace hotloop {

// The largest finite float8_e4m3fn.
constexpr float kE4m3Max = 448.0f;
// The smallest per-row scale, vLLM's: 1 / (448 * 512). A row of zeros gets it
// instead of 0 (which would divide by zero), and a row whose values are so small
// that max / 448 falls below it is quantised against it, so its outputs lose
// precision into e4m3's subnormals rather than the scale going to zero.
constexpr float kMinDynamicScale = 1.0f / (kE4m3Max * 512.0f);

// Scale of a row whose largest |y| is `amax`: amax / 448, lowered to scale_ub's
// value when there is one (then larger values saturate), and at least kMinDynamicScale.
HOTLOOP_HOST_DEVICE inline float dynamic_row_scale(float amax, const float* scale_ub) {
  const float bounded = scale_ub != nullptr ? fminf(amax, *scale_ub) : amax;
  return fmaxf(bounded / kE4m3Max, kMinDynamicScale);
}

// float -> float8_e4m3fn bits, rounded to nearest even, saturated to +-448;
// NaN -> 0x7f. What __nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3) gives
// on the GPU. Written here rather than taken from torch: c10's (pinned wheels)
// and torch/headeronly's conversion in torch 2.10/2.11 turn overflow into NaN,
// and later releases saturate, so the result would depend on the build's torch.
inline uint8_t e4m3_from_float(float value) {
  uint32_t bits = 0;
  std::memcpy(&bits, &value, sizeof(bits));
  const uint8_t sign = static_cast<uint8_t>((bits >> 24) & 0x80u);
  const uint32_t magnitude = bits & 0x7fffffffu;
  if (magnitude > 0x7f800000u) {
    return 0x7f;
  }
  if (magnitude >= 0x43e00000u) {  // >= 448 (or inf): saturate
    return sign | 0x7e;
  }
  if (magnitude < 0x3c800000u) {  // < 2^-6: a subnormal e4m3, k * 2^-9 with k < 8 ...
    const float units = std::nearbyint(std::fabs(value) * 512.0f);
    // ... whose bits are k; k == 8 rounds up to 2^-6, whose bits are 0x08 too.
    return sign | static_cast<uint8_t>(units);
  }
  // Keep 3 mantissa bits, rounding the 20 dropped ones to nearest even (a carry
  // moves into the exponent), then rebias the exponent from 127 to 7.
  const uint32_t odd = (magnitude >> 20) & 1u;
  const uint32_t rounded = (magnitude + 0x7ffffu + odd) >> 20;
  return sign | static_cast<uint8_t>(rounded - ((127u - 7u) << 3));
}

// The rows of the [rows, hidden] view of x (hidden may be 0).
inline int64_t rows_of(const Tensor& x) {
  int64_t rows = 1;
  for (int64_t d = 0; d + 1 < x.dim(); ++d) {
    rows *= x.size(d);
  }
  return rows;
}

// A one-element float32 tensor on x's device: the static scale or scale_ub.
inline void check_scale_tensor(const char* op, const char* name, const Tensor& scale,
                               const Tensor& x) {
  check_defined(op, name, scale);
  check_same_device(op, "x", x, name, scale);
  HOTLOOP_CHECK(scale.scalar_type() == ScalarType::Float, op, ": ", name,
                " must be a float32 tensor but is ", scale.scalar_type(), "; pass ", name,
                ".float()");
  HOTLOOP_CHECK(scale.dim() <= 1 && scale.numel() == 1, op, ": ", name,
                " must hold one element (shape [] or [1]) but has shape ", shape_of(scale),
                "; for one scale per row use the _dynamic op");
}

inline void check_rms_norm_fp8_inputs(const char* op, const Tensor& x, const Tensor& weight,
                                      const std::optional<Tensor>& scale,
                                      const std::optional<Tensor>& scale_ub) {
  check_norm_input(op, "x", x);
  check_norm_weight(op, weight, x);
  if (scale.has_value()) {
    check_scale_tensor(op, "scale", *scale, x);
  }
  if (scale_ub.has_value()) {
    check_scale_tensor(op, "scale_ub", *scale_ub, x);
  }
}

// The fused ops' residual: like x, written in place (so contiguous), sharing no
// memory with anything the kernels read.
inline void check_fp8_residual(const char* op, const Tensor& x, const Tensor& residual,
                               const Tensor& weight, const std::optional<Tensor>& scale) {
  check_defined(op, "residual", residual);
  check_same_device(op, "x", x, "residual", residual);
  check_same_dtype(op, "x", x, "residual", residual);
  check_same_shape(op, "x", x, "residual", residual);
  HOTLOOP_CHECK(residual.is_contiguous(), op,
                ": residual is updated in place and must be contiguous, but got a "
                "non-contiguous residual of shape ",
                shape_of(residual));
  HOTLOOP_CHECK(!overlaps(residual, x), op,
                ": unsupported operation: some elements of x and residual refer to a single "
                "memory location (residual is written in place); pass separate tensors");
  HOTLOOP_CHECK(!overlaps(residual, weight), op,
                ": unsupported operation: some elements of weight and residual (written in "
                "place) refer to a single memory location; pass weight.clone()");
  HOTLOOP_CHECK(!scale.has_value() || !overlaps(residual, *scale), op,
                ": unsupported operation: the scale is a view of residual, which is written in "
                "place; pass scale.clone()");
}

// out: float8_e4m3fn, shaped like x, contiguous.
inline Tensor fp8_output(const Tensor& x) {
  return empty_on(x, sizes_of(x), ScalarType::Float8_e4m3fn);
}

// scales of the dynamic ops: float32, x.shape[:-1] + [1], so that
// out.float() * scales broadcasts back to y.
inline Tensor fp8_row_scales(const Tensor& x) {
  std::vector<int64_t> sizes = sizes_of(x);
  sizes.back() = 1;
  return empty_on(x, sizes, ScalarType::Float);
}

// What a kernel of one call gets: contiguous rows, and either the static scale
// or a per-row scale to compute (row_scales, bounded by scale_ub when given).
template <typename scalar_t>
struct Fp8NormPointers {
  const scalar_t* x;
  scalar_t* residual;  // nullptr unless fused: then residual += x first
  const scalar_t* weight;
  const float* scale;     // static ops; nullptr for the dynamic ones
  const float* scale_ub;  // dynamic ops, optional
  uint8_t* out;
  float* row_scales;  // dynamic ops
  int64_t rows;
  int64_t hidden;
  double eps;
  double offset;  // gemma's; the kernel's instantiation says the casting mode
};

// out, and the per-row scales of the dynamic ops.
using Fp8NormOutputs = std::pair<Tensor, std::optional<Tensor>>;

// The host side of all four ops for one device's Launch: checks, outputs,
// contiguous inputs, dtype and casting-mode dispatch. Launch has
//   static void check_device(const char* op, const Tensor& x);  // after the input checks
//   template <typename scalar_t, Casting kCasting>
//   static void run(const Tensor& x, const Fp8NormPointers<scalar_t>& p);
// residual: nullptr unless fused; scale given for the static ops, scale_ub
// optional for the dynamic ones.
template <typename Launch>
Fp8NormOutputs run_rms_norm_fp8(const char* op, const Tensor& x, Tensor* residual,
                                const Tensor& weight, const std::optional<Tensor>& scale,
                                const std::optional<Tensor>& scale_ub, double eps, int64_t casting,
                                double offset) {
  const Casting mode = checked_casting(op, casting, offset);
  check_rms_norm_fp8_inputs(op, x, weight, scale, scale_ub);
  if (residual != nullptr) {
    check_fp8_residual(op, x, *residual, weight, scale.has_value() ? scale : scale_ub);
  }
  Launch::check_device(op, x);
  Fp8NormOutputs outputs{fp8_output(x), std::nullopt};
  if (!scale.has_value()) {
    outputs.second = fp8_row_scales(x);
  }
  const int64_t rows = rows_of(x);
  if (rows == 0) {
    return outputs;
  }
  const Tensor x_contig = as_contiguous(x);
  const Tensor w_contig = as_contiguous(weight);
  HOTLOOP_DISPATCH_FLOATING(x.scalar_type(), op, [&] {
    dispatch_casting<scalar_t>(mode, offset, [&](auto tag, double kernel_offset) {
      Launch::template run<scalar_t, decltype(tag)::value>(
          x, Fp8NormPointers<scalar_t>{
                 const_data<scalar_t>(x_contig),
                 residual != nullptr ? mutable_data<scalar_t>(*residual) : nullptr,
                 const_data<scalar_t>(w_contig),
                 scale.has_value() ? const_data<float>(*scale) : nullptr,
                 scale_ub.has_value() ? const_data<float>(*scale_ub) : nullptr,
                 mutable_data<uint8_t>(outputs.first),
                 outputs.second.has_value() ? mutable_data<float>(*outputs.second) : nullptr,
                 rows,
                 x.size(-1),
                 eps,
                 kernel_offset,
             });
    });
  });
  return outputs;
}

// The four ops' entry points for one device's Launch (see run_rms_norm_fp8),
// for HOTLOOP_LIBRARY_IMPL to register.
template <typename Launch>
struct RmsNormFp8Ops {
  static Tensor rms_norm_fp8(const Tensor& x, const Tensor& weight, const Tensor& scale, double eps,
                             int64_t casting, double offset) {
    return run_rms_norm_fp8<Launch>("rms_norm_fp8", x, nullptr, weight, scale, std::nullopt, eps,
                                    casting, offset)
        .first;
  }

  static std::tuple<Tensor, Tensor> rms_norm_fp8_dynamic(const Tensor& x, const Tensor& weight,
                                                         double eps,
                                                         const std::optional<Tensor>& scale_ub,
                                                         int64_t casting, double offset) {
    Fp8NormOutputs outputs = run_rms_norm_fp8<Launch>("rms_norm_fp8_dynamic", x, nullptr, weight,
                                                      std::nullopt, scale_ub, eps, casting, offset);
    return {outputs.first, *outputs.second};
  }

  static Tensor fused_add_rms_norm_fp8(const Tensor& x, Tensor& residual, const Tensor& weight,
                                       const Tensor& scale, double eps, int64_t casting,
                                       double offset) {
    return run_rms_norm_fp8<Launch>("fused_add_rms_norm_fp8", x, &residual, weight, scale,
                                    std::nullopt, eps, casting, offset)
        .first;
  }

  static std::tuple<Tensor, Tensor> fused_add_rms_norm_fp8_dynamic(
      const Tensor& x, Tensor& residual, const Tensor& weight, double eps,
      const std::optional<Tensor>& scale_ub, int64_t casting, double offset) {
    Fp8NormOutputs outputs =
        run_rms_norm_fp8<Launch>("fused_add_rms_norm_fp8_dynamic", x, &residual, weight,
                                 std::nullopt, scale_ub, eps, casting, offset);
    return {outputs.first, *outputs.second};
  }
};

}  // namespace hotloop
