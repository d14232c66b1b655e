// CPU kernels of rms_norm and rms_norm_backward.
//
// y = x * rstd [* weight], rstd = 1 / sqrt(mean(x^2 over the last dim) + eps),
// accumulated in float32 (float64 for float64 inputs). The normalised value stays
// in float32 until it has been multiplied by the weight; only then is it rounded.
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <tuple>

#include "../common/checks.h"
#include "../common/cpu_loops.h"

namespace hotloop {
namespace {

// Rows per parallel task: about GRAIN_SIZE elements of work each.
int64_t rows_per_task(int64_t hidden) {
  return std::max<int64_t>(1, kGrainSize / std::max<int64_t>(hidden, 1));
}

template <typename scalar_t, typename acc_t>
acc_t row_rstd(const scalar_t* x, int64_t hidden, acc_t eps) {
  const acc_t sum_sq = blocked_sum<acc_t>(hidden, [&](int64_t j) {
    const acc_t v = static_cast<acc_t>(x[j]);
    return v * v;
  });
  return acc_t(1) / std::sqrt(sum_sq / static_cast<acc_t>(hidden) + eps);
}

template <typename scalar_t>
void rms_norm_cpu_kernel(const scalar_t* x, const scalar_t* weight, scalar_t* y, int64_t rows,
                         int64_t hidden, double eps) {
  using acc_t = at::opmath_type<scalar_t>;
  const acc_t eps_acc = static_cast<acc_t>(eps);
  at::parallel_for(0, rows, rows_per_task(hidden), [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      const scalar_t* x_row = x + row * hidden;
      scalar_t* y_row = y + row * hidden;
      const acc_t rstd = row_rstd(x_row, hidden, eps_acc);
      for (int64_t j = 0; j < hidden; ++j) {
        acc_t v = static_cast<acc_t>(x_row[j]) * rstd;
        if (weight != nullptr) {
          v *= static_cast<acc_t>(weight[j]);
        }
        y_row[j] = static_cast<scalar_t>(v);
      }
    }
  });
}

// grad_x = rstd * (g - xhat * mean(g * xhat)), g = grad_out * weight, xhat = x * rstd.
// grad_weight = sum over rows of grad_out * xhat: each of a fixed number of row
// chunks sums into its own float32 (float64) partial row, and the partials are
// added at the end, so the result does not depend on the thread count.
template <typename scalar_t>
void rms_norm_backward_cpu_kernel(const scalar_t* grad_out, const scalar_t* x,
                                  const scalar_t* weight, scalar_t* grad_x,
                                  at::opmath_type<scalar_t>* weight_partials, int64_t num_chunks,
                                  int64_t rows, int64_t hidden, double eps) {
  using acc_t = at::opmath_type<scalar_t>;
  const acc_t eps_acc = static_cast<acc_t>(eps);
  const acc_t inv_hidden = acc_t(1) / static_cast<acc_t>(hidden);
  at::parallel_for(0, num_chunks, 1, [&](int64_t chunk_begin, int64_t chunk_end) {
    for (int64_t chunk = chunk_begin; chunk < chunk_end; ++chunk) {
      acc_t* dw = weight != nullptr ? weight_partials + chunk * hidden : nullptr;
      const int64_t row_begin = rows * chunk / num_chunks;
      const int64_t row_end = rows * (chunk + 1) / num_chunks;
      for (int64_t row = row_begin; row < row_end; ++row) {
        const scalar_t* x_row = x + row * hidden;
        const scalar_t* go_row = grad_out + row * hidden;
        scalar_t* gx_row = grad_x + row * hidden;
        const acc_t rstd = row_rstd(x_row, hidden, eps_acc);
        auto g_at = [&](int64_t j) {
          acc_t g = static_cast<acc_t>(go_row[j]);
          if (weight != nullptr) {
            g *= static_cast<acc_t>(weight[j]);
          }
          return g;
        };
        const acc_t mean_g_xhat =
            blocked_sum<acc_t>(hidden,
                               [&](int64_t j) { return g_at(j) * static_cast<acc_t>(x_row[j]); }) *
            rstd * inv_hidden;
        for (int64_t j = 0; j < hidden; ++j) {
          const acc_t xhat = static_cast<acc_t>(x_row[j]) * rstd;
          gx_row[j] = static_cast<scalar_t>(rstd * (g_at(j) - xhat * mean_g_xhat));
          if (dw != nullptr) {
            dw[j] += static_cast<acc_t>(go_row[j]) * xhat;
          }
        }
      }
    }
  });
}

at::Tensor rms_norm_cpu(const at::Tensor& x, const std::optional<at::Tensor>& weight, double eps) {
  check_rms_norm_inputs("rms_norm", x, weight);
  at::Tensor y = at::empty(x.sizes(), x.options());
  if (x.numel() == 0) {
    return y;
  }
  const at::Tensor x_contig = x.contiguous();
  const at::Tensor w_contig = weight.has_value() ? weight->contiguous() : at::Tensor();
  const int64_t hidden = x.size(-1);
  const int64_t rows = x.numel() / hidden;
  HOTLOOP_DISPATCH_FLOATING(x.scalar_type(), "rms_norm", [&] {
    rms_norm_cpu_kernel<scalar_t>(
        x_contig.const_data_ptr<scalar_t>(),
        w_contig.defined() ? w_contig.const_data_ptr<scalar_t>() : nullptr,
        y.mutable_data_ptr<scalar_t>(), rows, hidden, eps);
  });
  return y;
}

std::tuple<at::Tensor, at::Tensor> rms_norm_backward_cpu(const at::Tensor& grad_out,
                                                         const at::Tensor& x,
                                                         const std::optional<at::Tensor>& weight,
                                                         double eps) {
  constexpr const char* op = "rms_norm_backward";
  check_rms_norm_backward_inputs(op, grad_out, x, weight);

  at::Tensor grad_x = at::empty(x.sizes(), x.options());
  if (!weight.has_value()) {
    if (x.numel() > 0) {
      const at::Tensor x_contig = x.contiguous();
      const at::Tensor go_contig = grad_out.contiguous();
      const int64_t hidden = x.size(-1);
      const int64_t rows = x.numel() / hidden;
      HOTLOOP_DISPATCH_FLOATING(x.scalar_type(), "rms_norm_backward", [&] {
        rms_norm_backward_cpu_kernel<scalar_t>(go_contig.const_data_ptr<scalar_t>(),
                                               x_contig.const_data_ptr<scalar_t>(), nullptr,
                                               grad_x.mutable_data_ptr<scalar_t>(), nullptr,
                                               std::min<int64_t>(rows, 64), rows, hidden, eps);
      });
    }
    return {grad_x, at::empty({0}, x.options())};
  }

  if (x.numel() == 0) {
    // No rows (or hidden == 0): the weight gradient is a sum over nothing.
    return {grad_x, at::zeros(weight->sizes(), weight->options())};
  }
  const at::Tensor x_contig = x.contiguous();
  const at::Tensor go_contig = grad_out.contiguous();
  const at::Tensor w_contig = weight->contiguous();
  const int64_t hidden = x.size(-1);
  const int64_t rows = x.numel() / hidden;
  // A fixed chunk count (not the thread count) keeps grad_weight deterministic.
  const int64_t num_chunks = std::min<int64_t>(rows, 64);
  const auto acc_dtype = at::toOpMathType(x.scalar_type());
  at::Tensor weight_partials = at::zeros({num_chunks, hidden}, x.options().dtype(acc_dtype));
  HOTLOOP_DISPATCH_FLOATING(x.scalar_type(), "rms_norm_backward", [&] {
    rms_norm_backward_cpu_kernel<scalar_t>(
        go_contig.const_data_ptr<scalar_t>(), x_contig.const_data_ptr<scalar_t>(),
        w_contig.const_data_ptr<scalar_t>(), grad_x.mutable_data_ptr<scalar_t>(),
        weight_partials.mutable_data_ptr<at::opmath_type<scalar_t>>(), num_chunks, rows, hidden,
        eps);
  });
  at::Tensor grad_weight = weight_partials.sum(0).to(weight->scalar_type()).view(weight->sizes());
  return {grad_x, grad_weight};
}

}  // namespace

TORCH_LIBRARY_IMPL(hotloop, CPU, m) {
  m.impl("rms_norm", &rms_norm_cpu);
  m.impl("rms_norm_backward", &rms_norm_backward_cpu);
}

}  // namespace hotloop
