// The casting modes (norm_casting.h) in the CPU kernels of the norms, on the vectors of
// cpu_vec.h: compiled once per CpuIsa level inside that level's namespace, included by the
// kernel files that cpu_foreach_isa.h compiles (hence no include guard and no includes).
// rms_norm, fused_add_rms_norm and the FP8 norms form their values through these alike.

// v rounded to scalar_t and back (kLlama's normalised value); float32/float64 as they are.
template <typename scalar_t>
vec_t<scalar_t> rounded_to(vec_t<scalar_t> v) {
  if constexpr (std::is_same_v<scalar_t, acc_type<scalar_t>>) {
    return v;
  } else {
    scalar_t lanes[Vec<scalar_t>::kWidth];
    store(lanes, v);
    return load(lanes);
  }
}

// x * rstd as the weight sees it: rounded to the dtype first in kLlama (norm_casting.h).
template <typename scalar_t, Casting kCasting>
vec_t<scalar_t> normed(vec_t<scalar_t> xhat) {
  return kCasting == Casting::kLlama ? rounded_to<scalar_t>(xhat) : xhat;
}

// The weight's vector at w as it multiplies: offset + w in kGemma, formed in float32.
template <typename scalar_t, Casting kCasting>
vec_t<scalar_t> weight_at(const scalar_t* w, int64_t count, acc_type<scalar_t> offset) {
  const vec_t<scalar_t> v = load_n(w, count);
  return kCasting == Casting::kGemma ? offset + v : v;
}
