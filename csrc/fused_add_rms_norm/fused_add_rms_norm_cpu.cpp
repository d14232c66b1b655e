// CPU kernel of fused_add_rms_norm: residual += x; x = rms_norm(residual) * weight.
//
// The sum is formed in float32 (float64 for float64), rounded to the dtype and
// stored into residual; the norm is then computed from that rounded value, exactly
// as the CUDA kernel does, so the op equals the unfused
// `residual.add_(x); x.copy_(rms_norm(residual, weight, eps, casting, offset))` on both
// devices, in every casting mode (common/norm_casting.h).
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "../common/cpu_loops.h"
#include "../common/norm_casting.h"
#include "fused_add_rms_norm_checks.h"

#define HOTLOOP_CPU_KERNELS "fused_add_rms_norm/fused_add_rms_norm_cpu_kernels.h"
#include "../common/cpu_foreach_isa.h"

namespace hotloop {
namespace {

template <typename scalar_t, Casting kCasting>
void fused_add_rms_norm_cpu_kernel(scalar_t* x, scalar_t* residual, const scalar_t* weight,
                                   int64_t rows, int64_t hidden, double eps, double offset) {
  const auto rows_kernel = HOTLOOP_CPU_DISPATCH(fused_add_rms_norm_rows<scalar_t, kCasting>);
  const int64_t grain = std::max<int64_t>(1, kGrainSize / hidden);
  parallel_for_in_tasks(rows, grain, [&](int64_t begin, int64_t end) {
    rows_kernel(x, residual, weight, begin, end, hidden, eps, offset);
  });
}

void fused_add_rms_norm_cpu(Tensor& x, Tensor& residual, const Tensor& weight, double eps,
                            int64_t casting, double offset) {
  const Casting mode = checked_casting("fused_add_rms_norm", casting, offset);
  check_fused_add_rms_norm_inputs(x, residual, weight);
  if (x.numel() == 0) {
    return;
  }
  const Tensor w_contig = as_contiguous(weight);
  const int64_t hidden = x.size(-1);
  const int64_t rows = x.numel() / hidden;
  HOTLOOP_DISPATCH_FLOATING(x.scalar_type(), "fused_add_rms_norm", [&] {
    dispatch_casting<scalar_t>(mode, offset, [&](auto tag, double kernel_offset) {
      fused_add_rms_norm_cpu_kernel<scalar_t, decltype(tag)::value>(
          mutable_data<scalar_t>(x), mutable_data<scalar_t>(residual),
          const_data<scalar_t>(w_contig), rows, hidden, eps, kernel_offset);
    });
  });
}

}  // namespace

HOTLOOP_LIBRARY_IMPL(CPU, m) {
  m.impl("fused_add_rms_norm", HOTLOOP_KERNEL(&fused_add_rms_norm_cpu));
}

}  // namespace hotloop
