// Where an RMSNorm rounds to x's dtype: the `casting` argument of the norm ops, a
// compile-time parameter of their kernels (dispatch_casting picks the instantiation).
//
// The three modes are the three formulas models are trained with:
//   kTorch  torch.nn.RMSNorm: x * rstd * weight in float32, rounded once;
//   kLlama  transformers' LlamaRMSNorm (Mistral's, Qwen's): x * rstd rounded to the dtype
//           first, then times the weight and rounded again;
//   kGemma  transformers' GemmaRMSNorm: x * rstd * (offset + weight), offset + weight
//           formed in float32, all in float32, rounded once.
// rstd = 1 / sqrt(mean(x^2) + eps) in float32 (float64 for float64 x) in every mode.
#pragma once

#include <cstdint>
#include <type_traits>

#include "tensor_api.h"

namespace hotloop {

enum class Casting : int64_t { kTorch = 0, kLlama = 1, kGemma = 2 };

template <Casting kCasting>
using CastingTag = std::integral_constant<Casting, kCasting>;

// The op's casting and offset arguments, checked: offset is Gemma's, so only kGemma takes it.
inline Casting checked_casting(const char* op, int64_t casting, double offset) {
  HOTLOOP_CHECK(casting >= 0 && casting <= 2, op,
                ": casting must be 0 (torch), 1 (llama) or 2 (gemma) but got ", casting);
  HOTLOOP_CHECK(casting == 2 || offset == 0.0, op, ": offset ", offset,
                " is Gemma's (offset + weight) and needs casting 2 (gemma), but casting is ",
                casting);
  return static_cast<Casting>(casting);
}

// body(CastingTag<kCasting>{}, offset) for the mode `casting` on x of dtype scalar_t, with the
// offset that instantiation takes. Where scalar_t is its own accumulation type (float32,
// float64), kLlama's rounding of x * rstd to the dtype rounds nothing, and the rest of kLlama's
// arithmetic is kGemma's with an offset of -0.0 (w + -0.0 is w for every w, -0.0 included):
// kLlama runs the kGemma kernels there, and is not instantiated for those dtypes (a smaller
// library; the kernels' helpers form kLlama's and kGemma's values alike for this reason).
template <typename scalar_t, typename Body>
decltype(auto) dispatch_casting(Casting casting, double offset, const Body& body) {
  switch (casting) {
    case Casting::kLlama:
      if constexpr (std::is_same_v<scalar_t, acc_type<scalar_t>>) {
        return body(CastingTag<Casting::kGemma>{}, -0.0);
      } else {
        return body(CastingTag<Casting::kLlama>{}, offset);
      }
    case Casting::kGemma:
      return body(CastingTag<Casting::kGemma>{}, offset);
    default:
      return body(CastingTag<Casting::kTorch>{}, offset);
  }
}

}  // namespace hotloop
