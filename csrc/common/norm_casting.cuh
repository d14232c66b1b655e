// The casting modes (norm_casting.h) in the CUDA kernels of the norms: every kernel takes
// the mode as a template parameter and forms its values through these, so that rms_norm,
// fused_add_rms_norm and the FP8 norms round alike. kTorch compiles to the arithmetic the
// kernels had before the modes.
#pragma once

#include <cuda_bf16.h>

#include <type_traits>

#include "cuda_utils.cuh"
#include "norm_casting.h"

namespace hotloop {

__device__ __forceinline__ float mul_rn(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ double mul_rn(double a, double b) { return __dmul_rn(a, b); }

// rstd of a row from its sum of squares. kTorch: mean and eps in one FMA. kLlama and kGemma
// round the mean before adding eps, as the separate mean, add and rsqrt kernels of
// transformers' norms do (torch's CUDA mean multiplies the sum by 1 / H).
template <Casting kCasting, typename acc_t>
__device__ __forceinline__ acc_t row_rstd(acc_t sum_sq, acc_t inv_hidden, acc_t eps) {
  if constexpr (kCasting == Casting::kTorch) {
    return rsqrt_acc(sum_sq * inv_hidden + eps);
  } else {
    return rsqrt_acc(mul_rn(sum_sq, inv_hidden) + eps);
  }
}

// The weight as it multiplies: offset + w, in float32 (float64), in kGemma.
template <Casting kCasting, typename acc_t>
__device__ __forceinline__ acc_t weight_value(acc_t w, acc_t offset) {
  if constexpr (kCasting == Casting::kGemma) {
    return offset + w;
  } else {
    return w;
  }
}

// v rounded to scalar_t (to nearest even) and back. bfloat16 rounds through the paired
// conversion: nvcc compiles a lone float -> bfloat16 conversion whose result is widened again
// to F2F.BF16.F32, which sm_90 issues on its slow conversion pipe (kLlama's bfloat16 backward
// vector kernel had 160 of them, against none in kTorch's), and the paired one to
// F2FP.BF16.F32.PACK_AB, as the kernels' stores are. float16's lone conversion is F2FP
// already.
template <typename scalar_t, typename acc_t>
__device__ __forceinline__ acc_t rounded(acc_t v) {
  if constexpr (std::is_same_v<scalar_t, BFloat16>) {
    return __low2float(__floats2bfloat162_rn(v, v));
  } else {
    return static_cast<acc_t>(static_cast<scalar_t>(v));
  }
}

// xhat as the weight sees it: rounded to the dtype in kLlama.
template <Casting kCasting, typename scalar_t, typename acc_t>
__device__ __forceinline__ acc_t normed(acc_t xhat) {
  if constexpr (kCasting == Casting::kLlama) {
    return rounded<scalar_t>(xhat);
  } else {
    return xhat;
  }
}

// y before its rounding: normed(xhat) * the weight as it multiplies. The FP8 norms quantise
// this value; the others round it to the dtype.
template <Casting kCasting, typename scalar_t, typename acc_t>
__device__ __forceinline__ acc_t weighted(acc_t xhat, acc_t w, acc_t offset) {
  return normed<kCasting, scalar_t>(xhat) * weight_value<kCasting>(w, offset);
}

// The outputs of one vector v of a row: weighted(v * rstd) by the weight's vector w, rounded to
// the dtype.
template <Casting kCasting, typename scalar_t, int kSize, typename acc_t>
__device__ __forceinline__ AlignedVector<scalar_t, kSize> weighted_vector(
    const AlignedVector<scalar_t, kSize>& v, acc_t rstd, const AlignedVector<scalar_t, kSize>& w,
    acc_t offset) {
  AlignedVector<scalar_t, kSize> out;
#pragma unroll
  for (int k = 0; k < kSize; ++k) {
    out.val[k] = static_cast<scalar_t>(weighted<kCasting, scalar_t>(
        static_cast<acc_t>(v.val[k]) * rstd, static_cast<acc_t>(w.val[k]), offset));
  }
  return out;
}

}  // namespace hotloop
