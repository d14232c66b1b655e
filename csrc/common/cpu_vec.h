// Vector primitives of the CPU kernels, compiled once per CpuIsa level inside that
// level's namespace by cpu_foreach_isa.h (hence no include guard and no includes).
//
// Every level uses the same 64-byte vectors (GCC vector extensions): 16 float or 8 double
// lanes, which the compiler lowers to four SSE2, two AVX2 or one AVX-512 instruction.
// Lanes and the order of every sum are the same on each level, so the variants give
// bit-identical results, whichever one a CPU runs. Rows of any length and alignment:
// loads and stores are unaligned, and a row's last partial vector goes through a
// zero-padded buffer.

using f32v = float __attribute__((vector_size(64)));
using f64v = double __attribute__((vector_size(64)));
using u32v = uint32_t __attribute__((vector_size(64)));
using u16v = uint16_t __attribute__((vector_size(32)));

// The vector of scalar_t's accumulation type (float for the 16-bit types).
template <typename scalar_t>
struct Vec {
  using type = f32v;
  static constexpr int64_t kWidth = 16;
};
template <>
struct Vec<double> {
  using type = f64v;
  static constexpr int64_t kWidth = 8;
};
template <typename scalar_t>
using vec_t = typename Vec<scalar_t>::type;

inline f32v load(const float* p) {
  f32v v;
  __builtin_memcpy(&v, p, sizeof(v));
  return v;
}
inline f64v load(const double* p) {
  f64v v;
  __builtin_memcpy(&v, p, sizeof(v));
  return v;
}
inline f32v load(const BFloat16* p) {
  u16v bits;
  __builtin_memcpy(&bits, p, sizeof(bits));
  return __builtin_bit_cast(f32v, __builtin_convertvector(bits, u32v) << 16);
}
inline f32v load(const Half* p) {
  float lanes[16];
  for (int64_t i = 0; i < 16; ++i) {
    lanes[i] = static_cast<float>(p[i]);
  }
  return load(lanes);
}

inline void store(float* p, f32v v) { __builtin_memcpy(p, &v, sizeof(v)); }
inline void store(double* p, f64v v) { __builtin_memcpy(p, &v, sizeof(v)); }
inline void store(BFloat16* p, f32v v) {
  // BFloat16's own rounding (round to nearest even; a NaN becomes 0x7FC0), on 16 lanes.
  const u32v bits = __builtin_bit_cast(u32v, v);
  const u32v rounded = (bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16;
  const u32v canonical_nan = u32v{} + 0x7FC0u;
  const u16v out = __builtin_convertvector(v != v ? canonical_nan : rounded, u16v);
  __builtin_memcpy(p, &out, sizeof(out));
}
inline void store(Half* p, f32v v) {
  for (int64_t i = 0; i < 16; ++i) {
    p[i] = static_cast<Half>(v[i]);
  }
}

// The first n < kWidth elements of p, the other lanes 0.
template <typename scalar_t>
vec_t<scalar_t> load_partial(const scalar_t* p, int64_t n) {
  scalar_t lanes[Vec<scalar_t>::kWidth] = {};
  __builtin_memcpy(lanes, p, n * sizeof(scalar_t));
  return load(lanes);
}
template <typename scalar_t>
void store_partial(scalar_t* p, vec_t<scalar_t> v, int64_t n) {
  scalar_t lanes[Vec<scalar_t>::kWidth];
  store(lanes, v);
  __builtin_memcpy(p, lanes, n * sizeof(scalar_t));
}

// Elements [0, count) at p; count is kWidth in the main loops, where this is one load.
template <typename scalar_t>
vec_t<scalar_t> load_n(const scalar_t* p, int64_t count) {
  return count == Vec<scalar_t>::kWidth ? load(p) : load_partial(p, count);
}
template <typename scalar_t>
void store_n(scalar_t* p, vec_t<scalar_t> v, int64_t count) {
  if (count == Vec<scalar_t>::kWidth) {
    store(p, v);
  } else {
    store_partial(p, v, count);
  }
}

// f(j, count) for the vectors of a row of n elements: count = kWidth, then the rest.
template <typename scalar_t, typename F>
void for_each_vector(int64_t n, const F& f) {
  constexpr int64_t width = Vec<scalar_t>::kWidth;
  int64_t j = 0;
  for (; j + width <= n; j += width) {
    f(j, width);
  }
  if (j < n) {
    f(j, n - j);
  }
}

// Two running sums taken in one pass over a row.
template <typename V>
struct VecPair {
  V first{};
  V second{};
  VecPair& operator+=(const VecPair& other) {
    first += other.first;
    second += other.second;
    return *this;
  }
};

// Sum over a row of n elements of term(j, count) (a vector, or a VecPair of them, for
// elements [j, j + count); zero lanes past the row's end). Two accumulators per block of
// 64 vectors, the blocks added up per lane: the error stays near a pairwise sum's for
// long rows, and the two chains keep the adder busy.
template <typename scalar_t, typename Acc, typename Term>
Acc blocked_sum(int64_t n, const Term& term) {
  constexpr int64_t width = Vec<scalar_t>::kWidth;
  constexpr int64_t block = 64 * width;
  Acc total{};
  int64_t j = 0;
  for (; j + block <= n; j += block) {
    Acc even{};
    Acc odd{};
    for (int64_t k = j; k < j + block; k += 2 * width) {
      even += term(k, width);
      odd += term(k + width, width);
    }
    total += even;
    total += odd;
  }
  Acc even{};
  Acc odd{};
  for (; j + 2 * width <= n; j += 2 * width) {
    even += term(j, width);
    odd += term(j + width, width);
  }
  if (j + width <= n) {
    even += term(j, width);
    j += width;
  }
  if (j < n) {
    odd += term(j, n - j);
  }
  total += even;
  total += odd;
  return total;
}

// The lanes' sum, in lane order.
template <typename V>
auto reduce_add(V v) {
  auto total = v[0];
  for (int64_t i = 1; i < static_cast<int64_t>(sizeof(V) / sizeof(v[0])); ++i) {
    total += v[i];
  }
  return total;
}
