// CUDA kernel of fused_add_rms_norm: residual += x; x = rms_norm(residual) * weight.
//
// One read of x and residual, one write of each. The sum is formed in float32
// (float64 for float64), rounded to the dtype and stored into residual; the norm is
// computed from that rounded value, as on CPU, so the op equals the unfused
// `residual.add_(x); x.copy_(rms_norm(residual, weight, eps))`. Rows map onto
// blocks as in rms_norm (common/row_launch.cuh): register-resident 16-byte
// vectors when aligned, a generic scalar kernel otherwise.
#include <ATen/OpMathType.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "../common/checks.h"
#include "../common/cuda_utils.cuh"
#include "../common/fused_add_rms_norm_checks.h"
#include "../common/row_launch.cuh"

namespace hotloop {
namespace {

constexpr RowKernelLimits kFusedLimits{/*max_vectors_per_thread=*/8, /*target_threads=*/256,
                                       /*max_threads=*/kMaxThreadsPerBlock};

template <typename scalar_t, int kVectorsPerThread>
__global__ void __launch_bounds__(kMaxThreadsPerBlock)
    fused_add_rms_norm_vector_kernel(scalar_t* __restrict__ x, scalar_t* __restrict__ residual,
                                     const scalar_t* __restrict__ weight, int64_t rows,
                                     int64_t hidden, at::opmath_type<scalar_t> eps) {
  using acc_t = at::opmath_type<scalar_t>;
  constexpr int kVec = vector_size<scalar_t>();
  using Vec = AlignedVector<scalar_t, kVec>;
  const int num_vectors = static_cast<int>(hidden / kVec);
  const acc_t inv_hidden = acc_t(1) / static_cast<acc_t>(hidden);
  const Vec* weight_vec = reinterpret_cast<const Vec*>(weight);

  // The loop bound is the same for the whole block; rows past the end are masked.
  for (int64_t block_row = static_cast<int64_t>(blockIdx.x) * blockDim.y; block_row < rows;
       block_row += static_cast<int64_t>(gridDim.x) * blockDim.y) {
    const int64_t row = block_row + threadIdx.y;
    const bool row_valid = row < rows;
    Vec* x_row = reinterpret_cast<Vec*>(x + row * hidden);
    Vec* res_row = reinterpret_cast<Vec*>(residual + row * hidden);
    Vec sum[kVectorsPerThread];  // the rounded residual, kept for the second step
    acc_t sum_sq[1] = {0};
#pragma unroll
    for (int i = 0; i < kVectorsPerThread; ++i) {
      const int idx = threadIdx.x + i * blockDim.x;
      if (row_valid && idx < num_vectors) {
        const Vec xv = x_row[idx];
        const Vec rv = res_row[idx];
#pragma unroll
        for (int k = 0; k < kVec; ++k) {
          sum[i].val[k] =
              static_cast<scalar_t>(static_cast<acc_t>(xv.val[k]) + static_cast<acc_t>(rv.val[k]));
          const acc_t v = static_cast<acc_t>(sum[i].val[k]);
          sum_sq[0] += v * v;
        }
        res_row[idx] = sum[i];
      }
    }
    row_sum(sum_sq);
    const acc_t rstd = rsqrt_acc(sum_sq[0] * inv_hidden + eps);
#pragma unroll
    for (int i = 0; i < kVectorsPerThread; ++i) {
      const int idx = threadIdx.x + i * blockDim.x;
      if (row_valid && idx < num_vectors) {
        const Vec wv = weight_vec[idx];
        Vec out;
#pragma unroll
        for (int k = 0; k < kVec; ++k) {
          out.val[k] = static_cast<scalar_t>(static_cast<acc_t>(sum[i].val[k]) * rstd *
                                             static_cast<acc_t>(wv.val[k]));
        }
        x_row[idx] = out;
      }
    }
  }
}

// Any hidden size and alignment. The second loop re-reads the residual elements
// this same thread stored in the first, so no barrier is needed between them.
template <typename scalar_t>
__global__ void __launch_bounds__(kMaxThreadsPerBlock)
    fused_add_rms_norm_generic_kernel(scalar_t* __restrict__ x, scalar_t* __restrict__ residual,
                                      const scalar_t* __restrict__ weight, int64_t rows,
                                      int64_t hidden, at::opmath_type<scalar_t> eps) {
  using acc_t = at::opmath_type<scalar_t>;
  const acc_t inv_hidden = acc_t(1) / static_cast<acc_t>(hidden);
  for (int64_t block_row = static_cast<int64_t>(blockIdx.x) * blockDim.y; block_row < rows;
       block_row += static_cast<int64_t>(gridDim.x) * blockDim.y) {
    const int64_t row = block_row + threadIdx.y;
    const int64_t row_hidden = row < rows ? hidden : 0;  // masks rows past the end
    scalar_t* x_row = x + row * hidden;
    scalar_t* res_row = residual + row * hidden;
    acc_t sum_sq[1] = {0};
    for (int64_t j = threadIdx.x; j < row_hidden; j += blockDim.x) {
      const scalar_t s =
          static_cast<scalar_t>(static_cast<acc_t>(x_row[j]) + static_cast<acc_t>(res_row[j]));
      res_row[j] = s;
      const acc_t v = static_cast<acc_t>(s);
      sum_sq[0] += v * v;
    }
    row_sum(sum_sq);
    const acc_t rstd = rsqrt_acc(sum_sq[0] * inv_hidden + eps);
    for (int64_t j = threadIdx.x; j < row_hidden; j += blockDim.x) {
      x_row[j] = static_cast<scalar_t>(static_cast<acc_t>(res_row[j]) * rstd *
                                       static_cast<acc_t>(weight[j]));
    }
  }
}

template <typename scalar_t>
void launch_fused_add_rms_norm(scalar_t* x, scalar_t* residual, const scalar_t* weight,
                               int64_t rows, int64_t hidden, double eps) {
  using acc_t = at::opmath_type<scalar_t>;
  const bool aligned =
      is_vector_aligned(x) && is_vector_aligned(residual) && is_vector_aligned(weight);
  const RowLaunch plan = plan_row_launch(hidden, vector_size<scalar_t>(), aligned, kFusedLimits);
  const dim3 grid(static_cast<unsigned>(row_blocks(rows, plan)));
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const acc_t eps_acc = static_cast<acc_t>(eps);
  switch (plan.vectors_per_thread) {
#define HOTLOOP_LAUNCH(VPT)                                                              \
  case VPT:                                                                              \
    fused_add_rms_norm_vector_kernel<scalar_t, VPT>                                      \
        <<<grid, plan.block(), 0, stream>>>(x, residual, weight, rows, hidden, eps_acc); \
    break;
    HOTLOOP_LAUNCH(1)
    HOTLOOP_LAUNCH(2)
    HOTLOOP_LAUNCH(4)
    HOTLOOP_LAUNCH(8)
#undef HOTLOOP_LAUNCH
    default:
      TORCH_INTERNAL_ASSERT(plan.vectors_per_thread == 0);
      fused_add_rms_norm_generic_kernel<scalar_t>
          <<<grid, plan.block(), 0, stream>>>(x, residual, weight, rows, hidden, eps_acc);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

void fused_add_rms_norm_cuda(at::Tensor& x, at::Tensor& residual, const at::Tensor& weight,
                             double eps) {
  check_fused_add_rms_norm_inputs(x, residual, weight);
  if (x.numel() == 0) {
    return;
  }
  const c10::cuda::CUDAGuard guard(x.device());
  const at::Tensor w_contig = weight.contiguous();
  const int64_t hidden = x.size(-1);
  const int64_t rows = x.numel() / hidden;
  HOTLOOP_DISPATCH_FLOATING(x.scalar_type(), "fused_add_rms_norm_cuda", [&] {
    launch_fused_add_rms_norm<scalar_t>(x.mutable_data_ptr<scalar_t>(),
                                        residual.mutable_data_ptr<scalar_t>(),
                                        w_contig.const_data_ptr<scalar_t>(), rows, hidden, eps);
  });
}

}  // namespace

TORCH_LIBRARY_IMPL(hotloop, CUDA, m) { m.impl("fused_add_rms_norm", &fused_add_rms_norm_cuda); }

}  // namespace hotloop
