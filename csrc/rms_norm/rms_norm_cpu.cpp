// CPU kernels of rms_norm and rms_norm_backward.
//
// y = x * rstd [* weight], rstd = 1 / sqrt(mean(x^2 over the last dim) + eps),
// accumulated in float32 (float64 for float64 inputs). The normalised value stays
// in float32 until it has been multiplied by the weight; only then is it rounded (the
// casting modes kTorch and kGemma; kLlama rounds it before: common/norm_casting.h).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <tuple>
#include <type_traits>
#include <vector>

#include "../common/cpu_loops.h"
#include "../common/norm_casting.h"
#include "rms_norm_checks.h"

#define HOTLOOP_CPU_KERNELS "rms_norm/rms_norm_cpu_kernels.h"
#include "../common/cpu_foreach_isa.h"

namespace hotloop {
namespace {

// Rows per parallel task: about GRAIN_SIZE elements of work each.
int64_t rows_per_task(int64_t hidden) {
  return std::max<int64_t>(1, kGrainSize / std::max<int64_t>(hidden, 1));
}

template <typename scalar_t, Casting kCasting>
void rms_norm_cpu_kernel(const scalar_t* x, const scalar_t* weight, scalar_t* y, int64_t rows,
                         int64_t hidden, double eps, double offset) {
  const auto rows_kernel = HOTLOOP_CPU_DISPATCH(rms_norm_rows<scalar_t, kCasting>);
  parallel_for_in_tasks(rows, rows_per_task(hidden), [&](int64_t begin, int64_t end) {
    rows_kernel(x, weight, y, begin, end, hidden, eps, offset);
  });
}

// grad_weight = sum over rows of grad_out * xhat: each of a fixed number of row chunks
// sums into its own float32 (float64) partial row, and the partials are added at the
// end, so the result does not depend on the thread count.
template <typename scalar_t, Casting kCasting>
void rms_norm_backward_cpu_kernel(const scalar_t* grad_out, const scalar_t* x,
                                  const scalar_t* weight, scalar_t* grad_x,
                                  acc_type<scalar_t>* weight_partials, int64_t num_chunks,
                                  int64_t rows, int64_t hidden, double eps, double offset) {
  const auto rows_kernel = HOTLOOP_CPU_DISPATCH(rms_norm_backward_rows<scalar_t, kCasting>);
  parallel_for_each_task(num_chunks, [&](int64_t chunk) {
    acc_type<scalar_t>* dw = weight != nullptr ? weight_partials + chunk * hidden : nullptr;
    rows_kernel(grad_out, x, weight, grad_x, dw, rows * chunk / num_chunks,
                rows * (chunk + 1) / num_chunks, hidden, eps, offset);
  });
}

Tensor rms_norm_cpu(const Tensor& x, const std::optional<Tensor>& weight, double eps,
                    int64_t casting, double offset) {
  const Casting mode = checked_casting("rms_norm", casting, offset);
  check_rms_norm_inputs("rms_norm", x, weight);
  Tensor y = rms_norm_output(x);
  if (x.numel() == 0) {
    return y;
  }
  const Tensor x_contig = as_contiguous(x);
  const std::optional<Tensor> w_contig =
      weight.has_value() ? std::optional<Tensor>(as_contiguous(*weight)) : std::nullopt;
  const Tensor y_contig = y.is_contiguous() ? y : empty_like_contiguous(x);
  const int64_t hidden = x.size(-1);
  const int64_t rows = x.numel() / hidden;
  // Without a weight every mode computes the same: the normalised value rounded once.
  const Casting kernel_mode = w_contig ? mode : Casting::kTorch;
  HOTLOOP_DISPATCH_FLOATING(x.scalar_type(), "rms_norm", [&] {
    dispatch_casting<scalar_t>(kernel_mode, offset, [&](auto tag, double kernel_offset) {
      rms_norm_cpu_kernel<scalar_t, decltype(tag)::value>(
          const_data<scalar_t>(x_contig), w_contig ? const_data<scalar_t>(*w_contig) : nullptr,
          mutable_data<scalar_t>(y_contig), rows, hidden, eps, kernel_offset);
    });
  });
  return finish_rms_norm_output(y, y_contig);
}

// grad_weight[j] = sum over chunks of partials[chunk][j], in chunk order (deterministic).
template <typename scalar_t>
void sum_weight_partials(const acc_type<scalar_t>* partials, int64_t num_chunks, int64_t hidden,
                         scalar_t* grad_weight) {
  const auto columns_kernel = HOTLOOP_CPU_DISPATCH(sum_weight_partials_columns<scalar_t>);
  // About kGrainSize partial elements a task, in whole vectors of 16 columns.
  const int64_t columns_per_task = std::max<int64_t>(16, kGrainSize / num_chunks / 16 * 16);
  parallel_for_in_tasks(hidden, columns_per_task, [&](int64_t begin, int64_t end) {
    columns_kernel(partials, num_chunks, hidden, grad_weight, begin, end);
  });
}

// Row chunks of the backward, each with its own weight-gradient partial row. The count
// depends on the shape only (not on the threads), which keeps grad_weight deterministic;
// with at least 4 rows a chunk, the partials of a few long rows stay smaller than x (one
// partial row per row made the backward at (32, 8192) 6x slower than without a weight).
int64_t backward_chunks(int64_t rows) { return std::clamp<int64_t>(rows / 4, 1, 64); }

// Writes grad_x (contiguous, x's shape) and returns grad_weight.
Tensor rms_norm_backward_into(const Tensor& grad_out, const Tensor& x,
                              const std::optional<Tensor>& weight, double eps, Casting mode,
                              double offset, const Tensor& grad_x) {
  constexpr const char* op = "rms_norm_backward";
  const int64_t hidden = x.size(-1);
  const int64_t rows = hidden == 0 ? 0 : x.numel() / hidden;
  if (!weight.has_value()) {
    if (x.numel() > 0) {
      const Tensor x_contig = as_contiguous(x);
      const Tensor go_contig = as_contiguous(grad_out);
      // Without a weight every mode computes the same: no dispatch on it.
      HOTLOOP_DISPATCH_FLOATING(x.scalar_type(), op, [&] {
        rms_norm_backward_cpu_kernel<scalar_t, Casting::kTorch>(
            const_data<scalar_t>(go_contig), const_data<scalar_t>(x_contig), nullptr,
            mutable_data<scalar_t>(grad_x), nullptr, backward_chunks(rows), rows, hidden, eps, 0.0);
      });
    }
    return empty_on(x, {0}, x.scalar_type());
  }

  if (x.numel() == 0) {
    // No rows (or hidden == 0): the weight gradient is a sum over nothing.
    return zeros_on(*weight, sizes_of(*weight), weight->scalar_type());
  }
  const Tensor x_contig = as_contiguous(x);
  const Tensor go_contig = as_contiguous(grad_out);
  const Tensor w_contig = as_contiguous(*weight);
  Tensor grad_weight = empty_on(*weight, sizes_of(*weight), weight->scalar_type());
  const int64_t num_chunks = backward_chunks(rows);
  const Tensor weight_partials = zeros_on(x, {num_chunks, hidden}, acc_dtype_of(x.scalar_type()));
  HOTLOOP_DISPATCH_FLOATING(x.scalar_type(), op, [&] {
    auto* partials = mutable_data<acc_type<scalar_t>>(weight_partials);
    dispatch_casting<scalar_t>(mode, offset, [&](auto tag, double kernel_offset) {
      rms_norm_backward_cpu_kernel<scalar_t, decltype(tag)::value>(
          const_data<scalar_t>(go_contig), const_data<scalar_t>(x_contig),
          const_data<scalar_t>(w_contig), mutable_data<scalar_t>(grad_x), partials, num_chunks,
          rows, hidden, eps, kernel_offset);
    });
    sum_weight_partials<scalar_t>(partials, num_chunks, hidden,
                                  mutable_data<scalar_t>(grad_weight));
  });
  return grad_weight;
}

}  // namespace

HOTLOOP_LIBRARY_IMPL(CPU, m) {
  m.impl("rms_norm", HOTLOOP_KERNEL(&rms_norm_cpu));
  m.impl("rms_norm_backward", HOTLOOP_KERNEL(&rms_norm_backward_op<rms_norm_backward_into>));
  m.impl("rms_norm_backward_",
         HOTLOOP_KERNEL(&rms_norm_backward_in_place_op<rms_norm_backward_into>));
}

}  // namespace hotloop
