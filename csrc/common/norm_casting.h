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

// body(CastingTag<kCasting>{}) for the mode `casting`.
template <typename Body>
decltype(auto) dispatch_casting(Casting casting, const Body& body) {
  switch (casting) {
    case Casting::kLlama:
      return body(CastingTag<Casting::kLlama>{});
    case Casting::kGemma:
      return body(CastingTag<Casting::kGemma>{});
    default:
      return body(CastingTag<Casting::kTorch>{});
  }
}

}  // namespace hotloop
