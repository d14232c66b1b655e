// CPU kernels of rms_norm and rms_norm_backward on a range of rows, compiled once per
// instruction set by common/cpu_foreach_isa.h (no include guard, no library includes: see
// there). The casting modes' values come from the per-level helpers of cpu_norm_casting.h.
#include "../common/cpu_norm_casting.h"

// 1 / sqrt(mean(x^2) + eps) of one row.
template <typename scalar_t>
acc_type<scalar_t> row_rstd(const scalar_t* x, int64_t hidden, acc_type<scalar_t> eps) {
  using V = vec_t<scalar_t>;
  const V sum_sq = blocked_sum<scalar_t, V>(hidden, [&](int64_t j, int64_t count) {
    const V v = load_n(x + j, count);
    return v * v;
  });
  using acc_t = acc_type<scalar_t>;
  return acc_t(1) / std::sqrt(reduce_add(sum_sq) / static_cast<acc_t>(hidden) + eps);
}

// y = normed(x * rstd) [* weight] for rows [row_begin, row_end).
template <typename scalar_t, Casting kCasting>
void rms_norm_rows(const scalar_t* x, const scalar_t* weight, scalar_t* y, int64_t row_begin,
                   int64_t row_end, int64_t hidden, double eps, double offset) {
  using acc_t = acc_type<scalar_t>;
  const acc_t offset_acc = static_cast<acc_t>(offset);
  for (int64_t row = row_begin; row < row_end; ++row) {
    const scalar_t* x_row = x + row * hidden;
    scalar_t* y_row = y + row * hidden;
    const acc_t rstd = row_rstd(x_row, hidden, static_cast<acc_t>(eps));
    if (weight != nullptr) {
      for_each_vector<scalar_t>(hidden, [&](int64_t j, int64_t count) {
        const auto xhat = normed<scalar_t, kCasting>(load_n(x_row + j, count) * rstd);
        store_n(y_row + j, xhat * weight_at<scalar_t, kCasting>(weight + j, count, offset_acc),
                count);
      });
    } else {
      for_each_vector<scalar_t>(hidden, [&](int64_t j, int64_t count) {
        store_n(y_row + j, load_n(x_row + j, count) * rstd, count);
      });
    }
  }
}

// grad_x = rstd * (g - xhat * mean(g * xhat)), g = grad_out * weight, xhat = x * rstd,
// for rows [row_begin, row_end); with weight, also weight_partial += grad_out * normed(xhat).
// In kLlama the weight multiplies a value rounded to the dtype, so g is rounded as autograd's
// product of two dtype tensors is; in kGemma the weight is offset + weight.
template <typename scalar_t, Casting kCasting>
void rms_norm_backward_rows(const scalar_t* grad_out, const scalar_t* x, const scalar_t* weight,
                            scalar_t* grad_x, acc_type<scalar_t>* weight_partial, int64_t row_begin,
                            int64_t row_end, int64_t hidden, double eps, double offset) {
  using acc_t = acc_type<scalar_t>;
  using V = vec_t<scalar_t>;
  const acc_t eps_acc = static_cast<acc_t>(eps);
  const acc_t offset_acc = static_cast<acc_t>(offset);
  const acc_t inv_hidden = acc_t(1) / static_cast<acc_t>(hidden);
  for (int64_t row = row_begin; row < row_end; ++row) {
    const scalar_t* x_row = x + row * hidden;
    const scalar_t* go_row = grad_out + row * hidden;
    scalar_t* gx_row = grad_x + row * hidden;
    auto g_at = [&](int64_t j, int64_t count) {
      const V go = load_n(go_row + j, count);
      if (weight == nullptr) {
        return go;
      }
      const V g = go * weight_at<scalar_t, kCasting>(weight + j, count, offset_acc);
      return kCasting == Casting::kLlama ? rounded_to<scalar_t>(g) : g;
    };
    // sum(x^2) and sum(g * x) in one pass over the row.
    const VecPair<V> sums =
        blocked_sum<scalar_t, VecPair<V>>(hidden, [&](int64_t j, int64_t count) {
          const V v = load_n(x_row + j, count);
          return VecPair<V>{v * v, g_at(j, count) * v};
        });
    const acc_t rstd =
        acc_t(1) / std::sqrt(reduce_add(sums.first) / static_cast<acc_t>(hidden) + eps_acc);
    const acc_t mean_g_xhat = reduce_add(sums.second) * rstd * inv_hidden;
    for_each_vector<scalar_t>(hidden, [&](int64_t j, int64_t count) {
      const V xhat = load_n(x_row + j, count) * rstd;
      const V go = load_n(go_row + j, count);
      const V gx = rstd * (g_at(j, count) - xhat * mean_g_xhat);
      if (weight_partial != nullptr) {
        acc_t* dw = weight_partial + j;
        store_n(dw, load_n(dw, count) + go * normed<scalar_t, kCasting>(xhat), count);
      }
      store_n(gx_row + j, gx, count);
    });
  }
}

// grad_weight[j] = sum over chunks of partials[chunk][j] in chunk order, for columns
// [col_begin, col_end).
template <typename scalar_t>
void sum_weight_partials_columns(const acc_type<scalar_t>* partials, int64_t num_chunks,
                                 int64_t hidden, scalar_t* grad_weight, int64_t col_begin,
                                 int64_t col_end) {
  for_each_vector<scalar_t>(col_end - col_begin, [&](int64_t j, int64_t count) {
    const int64_t col = col_begin + j;
    vec_t<scalar_t> total = load_n(partials + col, count);
    for (int64_t chunk = 1; chunk < num_chunks; ++chunk) {
      total += load_n(partials + chunk * hidden + col, count);
    }
    store_n(grad_weight + col, total, count);
  });
}
