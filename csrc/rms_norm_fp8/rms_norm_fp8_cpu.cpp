// CPU kernel of the FP8 norms (rms_norm_fp8, rms_norm_fp8_dynamic and their
// fused_add_ twins): the reference the CUDA kernels are tested against.
//
// Per row: [residual += x, rounded to the dtype and stored;] rstd from the row
// (the rounded residual), y = v * rstd * weight in float32 (float64 for float64) as the
// casting mode forms it (rms_norm_fp8_common.h), [the row's scale from max |y|, formed as
// rstd * max |v * weight|;] out = e4m3(y * (1 / scale)).
#include <algorithm>
#include <cmath>

#include "../common/cpu_loops.h"
#include "rms_norm_fp8_common.h"

namespace hotloop {
namespace {

// sum of term(j), j in [0, n), in eight lanes per block of 1024 terms: float32 sums of
// long rows keep a pairwise sum's error, not a running sum's. (The vectorized kernels of
// the other ops have their own in common/cpu_vec.h; this reference kernel stays scalar.)
template <typename acc_t, typename Term>
acc_t blocked_sum(int64_t n, const Term& term) {
  constexpr int64_t kLanes = 8;
  constexpr int64_t kBlock = 1024;
  acc_t total = 0;
  for (int64_t begin = 0; begin < n; begin += kBlock) {
    const int64_t end = std::min(n, begin + kBlock);
    acc_t lanes[kLanes] = {};
    int64_t j = begin;
    for (; j + kLanes <= end; j += kLanes) {
      for (int64_t l = 0; l < kLanes; ++l) {
        lanes[l] += term(j + l);
      }
    }
    for (; j < end; ++j) {
      lanes[0] += term(j);
    }
    acc_t block = 0;
    for (int64_t l = 0; l < kLanes; ++l) {
      block += lanes[l];
    }
    total += block;
  }
  return total;
}

// The weight as it multiplies: offset + w in kGemma (cpu_norm_casting.h's weight_at).
template <Casting kCasting, typename acc_t>
acc_t weight_value(acc_t w, acc_t offset) {
  return kCasting == Casting::kGemma ? offset + w : w;
}

// y before its rounding to the dtype: xhat, rounded to the dtype first in kLlama, times the
// weight as it multiplies (cpu_norm_casting.h's normed, for one element).
template <typename scalar_t, Casting kCasting, typename acc_t>
acc_t weighted(acc_t xhat, acc_t w, acc_t offset) {
  const acc_t normed =
      kCasting == Casting::kLlama ? static_cast<acc_t>(static_cast<scalar_t>(xhat)) : xhat;
  return normed * weight_value<kCasting>(w, offset);
}

template <typename scalar_t, Casting kCasting>
void rms_norm_fp8_cpu_kernel(const Fp8NormPointers<scalar_t>& p) {
  using acc_t = acc_type<scalar_t>;
  const acc_t eps = static_cast<acc_t>(p.eps);
  const acc_t offset = static_cast<acc_t>(p.offset);
  const int64_t hidden = p.hidden;
  const float static_inv_scale = p.scale != nullptr ? 1.0f / *p.scale : 0.0f;
  const int64_t grain = std::max<int64_t>(1, kGrainSize / std::max<int64_t>(hidden, 1));
  parallel_for(0, p.rows, grain, [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      const scalar_t* x_row = p.x + row * hidden;
      const scalar_t* v_row = x_row;  // what is normalised: x, or the new residual
      if (p.residual != nullptr) {
        scalar_t* res_row = p.residual + row * hidden;
        for (int64_t j = 0; j < hidden; ++j) {
          res_row[j] =
              static_cast<scalar_t>(static_cast<acc_t>(x_row[j]) + static_cast<acc_t>(res_row[j]));
        }
        v_row = res_row;
      }
      const acc_t sum_sq = blocked_sum<acc_t>(hidden, [&](int64_t j) {
        const acc_t v = static_cast<acc_t>(v_row[j]);
        return v * v;
      });
      const acc_t rstd = acc_t(1) / std::sqrt(sum_sq / static_cast<acc_t>(hidden) + eps);
      auto y_at = [&](int64_t j) {
        return weighted<scalar_t, kCasting>(static_cast<acc_t>(v_row[j]) * rstd,
                                            static_cast<acc_t>(p.weight[j]), offset);
      };
      float inv_scale = static_inv_scale;
      if (p.scale == nullptr) {
        // rstd > 0 factors out of the maximum: the CUDA kernels take the maximum before they
        // know rstd, so that one exchange between threads gives both.
        acc_t max_vw = 0;
        for (int64_t j = 0; j < hidden; ++j) {
          const acc_t w = weight_value<kCasting>(static_cast<acc_t>(p.weight[j]), offset);
          max_vw = std::fmax(max_vw, std::fabs(static_cast<acc_t>(v_row[j]) * w));
        }
        const float row_scale = dynamic_row_scale(static_cast<float>(rstd * max_vw), p.scale_ub);
        p.row_scales[row] = row_scale;
        inv_scale = 1.0f / row_scale;
      }
      uint8_t* out_row = p.out + row * hidden;
      for (int64_t j = 0; j < hidden; ++j) {
        out_row[j] = e4m3_from_float(static_cast<float>(y_at(j) * inv_scale));
      }
    }
  });
}

struct LaunchCpu {
  static void check_device(const char* /*op*/, const Tensor& /*x*/) {}

  template <typename scalar_t, Casting kCasting>
  static void run(const Tensor& /*x*/, const Fp8NormPointers<scalar_t>& p) {
    rms_norm_fp8_cpu_kernel<scalar_t, kCasting>(p);
  }
};

using CpuOps = RmsNormFp8Ops<LaunchCpu>;

}  // namespace

HOTLOOP_LIBRARY_IMPL(CPU, m) {
  m.impl("rms_norm_fp8", HOTLOOP_KERNEL(&CpuOps::rms_norm_fp8));
  m.impl("rms_norm_fp8_dynamic", HOTLOOP_KERNEL(&CpuOps::rms_norm_fp8_dynamic));
  m.impl("fused_add_rms_norm_fp8", HOTLOOP_KERNEL(&CpuOps::fused_add_rms_norm_fp8));
  m.impl("fused_add_rms_norm_fp8_dynamic", HOTLOOP_KERNEL(&CpuOps::fused_add_rms_norm_fp8_dynamic));
}

}  // namespace hotloop
