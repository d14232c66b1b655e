// CPU kernel of fused_add_rms_norm on a range of rows, compiled once per instruction set
// by common/cpu_foreach_isa.h (no include guard, no library includes: see there).
#include "../common/cpu_norm_casting.h"

// residual += x, rounded to the dtype; x = rms_norm(residual) * weight as the casting mode
// kCasting computes it (rms_norm_cpu_kernels.h's rms_norm_rows), for rows
// [row_begin, row_end).
template <typename scalar_t, Casting kCasting>
void fused_add_rms_norm_rows(scalar_t* x, scalar_t* residual, const scalar_t* weight,
                             int64_t row_begin, int64_t row_end, int64_t hidden, double eps,
                             double offset) {
  using acc_t = acc_type<scalar_t>;
  using V = vec_t<scalar_t>;
  const acc_t offset_acc = static_cast<acc_t>(offset);
  for (int64_t row = row_begin; row < row_end; ++row) {
    scalar_t* x_row = x + row * hidden;
    scalar_t* res_row = residual + row * hidden;
    // The sum is stored, then read back: the norm sees it rounded to the dtype.
    const V sum_sq = blocked_sum<scalar_t, V>(hidden, [&](int64_t j, int64_t count) {
      store_n(res_row + j, load_n(x_row + j, count) + load_n(res_row + j, count), count);
      const V r = load_n(res_row + j, count);
      return r * r;
    });
    const acc_t rstd = acc_t(1) / std::sqrt(reduce_add(sum_sq) / static_cast<acc_t>(hidden) +
                                            static_cast<acc_t>(eps));
    for_each_vector<scalar_t>(hidden, [&](int64_t j, int64_t count) {
      const V xhat = normed<scalar_t, kCasting>(load_n(res_row + j, count) * rstd);
      store_n(x_row + j, xhat * weight_at<scalar_t, kCasting>(weight + j, count, offset_acc),
              count);
    });
  }
}
