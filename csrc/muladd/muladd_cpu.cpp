// CPU kernels of muladd (a * b + c) and mul (a * b).
#include <cstdint>

#include "../common/checks.h"
#include "../common/cpu_loops.h"

#define HOTLOOP_CPU_KERNELS "muladd/muladd_cpu_kernels.h"
#include "../common/cpu_foreach_isa.h"

namespace hotloop {
namespace {

// out = a * b (+ c), computed in the op-math type (float32, float64 for float64).
template <bool kAddC>
Tensor muladd_cpu_impl(const char* op, const Tensor& a, const Tensor& b, double c) {
  check_elementwise_inputs(op, a, b);
  const Tensor a_contig = as_contiguous(a);
  const Tensor b_contig = as_contiguous(b);
  Tensor out = empty_like_contiguous(a);
  const int64_t n = out.numel();
  if (n == 0) {
    return out;
  }
  HOTLOOP_DISPATCH_FLOATING(a.scalar_type(), "muladd_cpu", [&] {
    const scalar_t* a_ptr = const_data<scalar_t>(a_contig);
    const scalar_t* b_ptr = const_data<scalar_t>(b_contig);
    scalar_t* out_ptr = mutable_data<scalar_t>(out);
    const auto range_kernel = HOTLOOP_CPU_DISPATCH(muladd_range<scalar_t, kAddC>);
    parallel_for_in_tasks(n, kGrainSize, [&](int64_t begin, int64_t end) {
      range_kernel(a_ptr + begin, b_ptr + begin, out_ptr + begin, end - begin, c);
    });
  });
  return out;
}

Tensor muladd_cpu(const Tensor& a, const Tensor& b, double c) {
  return muladd_cpu_impl</*kAddC=*/true>("muladd", a, b, c);
}

// mul is not muladd with c = 0: (-x * 0) + 0 would turn -0.0 into +0.0.
Tensor mul_cpu(const Tensor& a, const Tensor& b) {
  return muladd_cpu_impl</*kAddC=*/false>("mul", a, b, 0.0);
}

}  // namespace

HOTLOOP_LIBRARY_IMPL(CPU, m) {
  m.impl("muladd", HOTLOOP_KERNEL(&muladd_cpu));
  m.impl("mul", HOTLOOP_KERNEL(&mul_cpu));
}

}  // namespace hotloop
