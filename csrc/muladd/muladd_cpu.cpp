// CPU kernels of muladd (a * b + c) and mul (a * b).
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include "../common/checks.h"
#include "../common/cpu_loops.h"

namespace hotloop {
namespace {

// out = a * b (+ c), computed in the op-math type (float32, float64 for float64).
template <bool kAddC>
at::Tensor muladd_cpu_impl(const char* op, const at::Tensor& a, const at::Tensor& b, double c) {
  check_elementwise_inputs(op, a, b);
  const at::Tensor a_contig = a.contiguous();
  const at::Tensor b_contig = b.contiguous();
  at::Tensor out = at::empty(a.sizes(), a.options());
  const int64_t n = out.numel();
  if (n == 0) {
    return out;
  }
  HOTLOOP_DISPATCH_FLOATING(a.scalar_type(), "muladd_cpu", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const scalar_t* a_ptr = a_contig.const_data_ptr<scalar_t>();
    const scalar_t* b_ptr = b_contig.const_data_ptr<scalar_t>();
    scalar_t* out_ptr = out.mutable_data_ptr<scalar_t>();
    const acc_t c_acc = static_cast<acc_t>(c);
    at::parallel_for(0, n, kGrainSize, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        acc_t v = static_cast<acc_t>(a_ptr[i]) * static_cast<acc_t>(b_ptr[i]);
        if constexpr (kAddC) {
          v += c_acc;
        }
        out_ptr[i] = static_cast<scalar_t>(v);
      }
    });
  });
  return out;
}

at::Tensor muladd_cpu(const at::Tensor& a, const at::Tensor& b, double c) {
  return muladd_cpu_impl</*kAddC=*/true>("muladd", a, b, c);
}

// mul is not muladd with c = 0: (-x * 0) + 0 would turn -0.0 into +0.0.
at::Tensor mul_cpu(const at::Tensor& a, const at::Tensor& b) {
  return muladd_cpu_impl</*kAddC=*/false>("mul", a, b, 0.0);
}

}  // namespace

TORCH_LIBRARY_IMPL(hotloop, CPU, m) {
  m.impl("muladd", &muladd_cpu);
  m.impl("mul", &mul_cpu);
}

}  // namespace hotloop
