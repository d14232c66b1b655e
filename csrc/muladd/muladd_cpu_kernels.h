// CPU kernel of muladd and mul on a range of elements, compiled once per instruction set
// by common/cpu_foreach_isa.h (no include guard, no includes: see there).

// out = a * b (+ c) for n elements, in the op-math type (float32, float64 for float64).
template <typename scalar_t, bool kAddC>
void muladd_range(const scalar_t* a, const scalar_t* b, scalar_t* out, int64_t n, double c) {
  const acc_type<scalar_t> c_acc = static_cast<acc_type<scalar_t>>(c);
  for_each_vector<scalar_t>(n, [&](int64_t j, int64_t count) {
    vec_t<scalar_t> v = load_n(a + j, count) * load_n(b + j, count);
    if constexpr (kAddC) {
      v += c_acc;
    }
    store_n(out + j, v, count);
  });
}
