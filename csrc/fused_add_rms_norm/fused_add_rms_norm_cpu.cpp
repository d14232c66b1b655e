// CPU kernel of fused_add_rms_norm: residual += x; x = rms_norm(residual) * weight.
//
// The sum is formed in float32 (float64 for float64), rounded to the dtype and
// stored into residual; the norm is then computed from that rounded value, exactly
// as the CUDA kernel does, so the op equals the unfused
// `residual.add_(x); x.copy_(rms_norm(residual, weight, eps))` on both devices.
#include <algorithm>
#include <cmath>

#include "../common/cpu_loops.h"
#include "fused_add_rms_norm_checks.h"

namespace hotloop {
namespace {

template <typename scalar_t>
void fused_add_rms_norm_cpu_kernel(scalar_t* x, scalar_t* residual, const scalar_t* weight,
                                   int64_t rows, int64_t hidden, double eps) {
  using acc_t = acc_type<scalar_t>;
  const acc_t eps_acc = static_cast<acc_t>(eps);
  const int64_t grain = std::max<int64_t>(1, kGrainSize / hidden);
  parallel_for(0, rows, grain, [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      scalar_t* x_row = x + row * hidden;
      scalar_t* res_row = residual + row * hidden;
      for (int64_t j = 0; j < hidden; ++j) {
        res_row[j] =
            static_cast<scalar_t>(static_cast<acc_t>(x_row[j]) + static_cast<acc_t>(res_row[j]));
      }
      const acc_t sum_sq = blocked_sum<acc_t>(hidden, [&](int64_t j) {
        const acc_t v = static_cast<acc_t>(res_row[j]);
        return v * v;
      });
      const acc_t rstd = acc_t(1) / std::sqrt(sum_sq / static_cast<acc_t>(hidden) + eps_acc);
      for (int64_t j = 0; j < hidden; ++j) {
        x_row[j] = static_cast<scalar_t>(static_cast<acc_t>(res_row[j]) * rstd *
                                         static_cast<acc_t>(weight[j]));
      }
    }
  });
}

void fused_add_rms_norm_cpu(Tensor& x, Tensor& residual, const Tensor& weight, double eps) {
  check_fused_add_rms_norm_inputs(x, residual, weight);
  if (x.numel() == 0) {
    return;
  }
  const Tensor w_contig = as_contiguous(weight);
  const int64_t hidden = x.size(-1);
  const int64_t rows = x.numel() / hidden;
  HOTLOOP_DISPATCH_FLOATING(x.scalar_type(), "fused_add_rms_norm", [&] {
    fused_add_rms_norm_cpu_kernel<scalar_t>(mutable_data<scalar_t>(x),
                                            mutable_data<scalar_t>(residual),
                                            const_data<scalar_t>(w_contig), rows, hidden, eps);
  });
}

}  // namespace

HOTLOOP_LIBRARY_IMPL(CPU, m) {
  m.impl("fused_add_rms_norm", HOTLOOP_KERNEL(&fused_add_rms_norm_cpu));
}

}  // namespace hotloop
