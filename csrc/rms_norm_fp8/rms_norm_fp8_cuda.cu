// CUDA kernels of the FP8 norms (rms_norm_fp8, rms_norm_fp8_dynamic and their
// fused_add_ twins): one read of x (and of the residual), one write of the
// float8_e4m3fn output (and of the residual), as the CPU kernel computes it.
//
// Rows map onto blocks as in rms_norm (common/row_launch.cuh): register-resident
// 16-byte vectors when every row is 16-byte aligned, register-resident scalars
// for other rows up to 16384 elements (common/scalar_rows.cuh), and a generic
// kernel that re-reads the row for longer ones and for float64. Per row: the sum
// of squares (row_sum), for the dynamic ops the largest |y| (row_max) and the
// row's scale, then out = e4m3(y * (1 / scale)) converted two at a time.
//
// The conversion is cuda_fp8.h's: one cvt.rn.satfinite instruction per pair of
// values on sm_89 and newer. The wheel also carries sm_80/sm_86 code (the other
// ops run there), where cuda_fp8.h emulates it; the host refuses those GPUs
// (check_device) rather than run an FP8 producer where no FP8 GEMM runs.

#include <cuda_fp8.h>

#include "../common/cuda_utils.cuh"
#include "../common/residual_add.cuh"
#include "../common/row_launch.cuh"
#include "../common/scalar_rows.cuh"
#include "rms_norm_fp8_common.h"

namespace hotloop {
namespace {

// Up to four 16-byte vectors per thread (bfloat16 rows up to 16384), that variant
// built for at most 512 threads, as fused_add_rms_norm's: the fused ops hold x and
// the residual, and more vectors on more threads spilled there.
constexpr int kFp8WideVectors = 4;
constexpr int kFp8MaxThreadsWide = 512;
constexpr RowKernelLimits kFp8Limits{/*max_vectors_per_thread=*/kFp8WideVectors,
                                     /*target_threads=*/256,
                                     /*max_threads=*/kFp8MaxThreadsWide};

// The first GPUs with FP8 conversion and FP8 tensor cores: Ada (8.9), Hopper (9.0).
constexpr int kFp8MinCapability = 89;

__device__ __forceinline__ __nv_fp8_storage_t e4m3(float v) {
  return __nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3);
}

// lo lands in the low byte, the first in memory.
__device__ __forceinline__ __nv_fp8x2_storage_t e4m3x2(float lo, float hi) {
  return __nv_cvt_float2_to_fp8x2(make_float2(lo, hi), __NV_SATFINITE, __NV_E4M3);
}

// 1 / scale of a dynamic row from the row's largest |y| (partial in amax[0] on
// entry); thread 0 of the row stores the scale. Every thread of the block calls it.
template <typename acc_t>
__device__ __forceinline__ float dynamic_inv_scale(acc_t (&amax)[1], const float* scale_ub,
                                                   float* row_scales, int64_t row, bool row_valid) {
  row_max(amax);
  const float row_scale = dynamic_row_scale(static_cast<float>(amax[0]), scale_ub);
  if (row_valid && threadIdx.x == 0) {
    row_scales[row] = row_scale;
  }
  return 1.0f / row_scale;
}

template <typename scalar_t, bool kResidual, int kVectorsPerThread>
__global__ void __launch_bounds__(kVectorsPerThread >= kFp8WideVectors ? kFp8MaxThreadsWide
                                                                       : kMaxThreadsPerBlock)
    rms_norm_fp8_vector_kernel(const Fp8NormPointers<scalar_t> p) {
  using acc_t = acc_type<scalar_t>;
  constexpr int kVec = vector_size<scalar_t>();
  using Vec = AlignedVector<scalar_t, kVec>;
  using OutVec = AlignedVector<__nv_fp8x2_storage_t, kVec / 2>;
  const int num_vectors = static_cast<int>(p.hidden / kVec);
  const acc_t inv_hidden = acc_t(1) / static_cast<acc_t>(p.hidden);
  const acc_t eps = static_cast<acc_t>(p.eps);
  const Vec* weight_vec = reinterpret_cast<const Vec*>(p.weight);
  const bool dynamic = p.scale == nullptr;
  const float static_inv_scale = dynamic ? 0.0f : 1.0f / *p.scale;

  // The loop bound is the same for the whole block; rows past the end are masked.
  for (int64_t block_row = static_cast<int64_t>(blockIdx.x) * blockDim.y; block_row < p.rows;
       block_row += static_cast<int64_t>(gridDim.x) * blockDim.y) {
    const int64_t row = block_row + threadIdx.y;
    const bool row_valid = row < p.rows;
    const int64_t offset = row * p.hidden;
    Vec v[kVectorsPerThread];  // x, or the rounded new residual
    if constexpr (kResidual) {
      // Every load before the first store to the residual (fused_add_rms_norm says why).
      Vec rv[kVectorsPerThread];
      const Vec* x_row = reinterpret_cast<const Vec*>(p.x + offset);
      Vec* res_row = reinterpret_cast<Vec*>(p.residual + offset);
#pragma unroll
      for (int i = 0; i < kVectorsPerThread; ++i) {
        const int idx = threadIdx.x + i * blockDim.x;
        if (row_valid && idx < num_vectors) {
          v[i] = x_row[idx];
          rv[i] = res_row[idx];
        }
      }
#pragma unroll
      for (int i = 0; i < kVectorsPerThread; ++i) {
        const int idx = threadIdx.x + i * blockDim.x;
        if (row_valid && idx < num_vectors) {
#pragma unroll
          for (int k = 0; k < kVec; ++k) {
            v[i].val[k] = static_cast<scalar_t>(static_cast<acc_t>(v[i].val[k]) +
                                                static_cast<acc_t>(rv[i].val[k]));
          }
          res_row[idx] = v[i];
        }
      }
    } else {
      const Vec* x_row = reinterpret_cast<const Vec*>(p.x + offset);
#pragma unroll
      for (int i = 0; i < kVectorsPerThread; ++i) {
        const int idx = threadIdx.x + i * blockDim.x;
        if (row_valid && idx < num_vectors) {
          v[i] = x_row[idx];
        }
      }
    }
    acc_t sum_sq[1] = {0};
#pragma unroll
    for (int i = 0; i < kVectorsPerThread; ++i) {
      const int idx = threadIdx.x + i * blockDim.x;
      if (row_valid && idx < num_vectors) {
#pragma unroll
        for (int k = 0; k < kVec; ++k) {
          const acc_t value = static_cast<acc_t>(v[i].val[k]);
          sum_sq[0] += value * value;
        }
      }
    }
    row_sum(sum_sq);
    const acc_t rstd = rsqrt_acc(sum_sq[0] * inv_hidden + eps);

    float inv_scale = static_inv_scale;
    if (dynamic) {
      acc_t amax[1] = {0};
#pragma unroll
      for (int i = 0; i < kVectorsPerThread; ++i) {
        const int idx = threadIdx.x + i * blockDim.x;
        if (row_valid && idx < num_vectors) {
          const Vec wv = weight_vec[idx];
#pragma unroll
          for (int k = 0; k < kVec; ++k) {
            const acc_t y = static_cast<acc_t>(v[i].val[k]) * rstd * static_cast<acc_t>(wv.val[k]);
            amax[0] = fmax(amax[0], fabs(y));
          }
        }
      }
      inv_scale = dynamic_inv_scale(amax, p.scale_ub, p.row_scales, row, row_valid);
    }

    OutVec* out_row = reinterpret_cast<OutVec*>(p.out + offset);
#pragma unroll
    for (int i = 0; i < kVectorsPerThread; ++i) {
      const int idx = threadIdx.x + i * blockDim.x;
      if (row_valid && idx < num_vectors) {
        const Vec wv = weight_vec[idx];
        OutVec out;
#pragma unroll
        for (int k = 0; k < kVec / 2; ++k) {
          const acc_t y0 =
              static_cast<acc_t>(v[i].val[2 * k]) * rstd * static_cast<acc_t>(wv.val[2 * k]);
          const acc_t y1 = static_cast<acc_t>(v[i].val[2 * k + 1]) * rstd *
                           static_cast<acc_t>(wv.val[2 * k + 1]);
          out.val[k] =
              e4m3x2(static_cast<float>(y0 * inv_scale), static_cast<float>(y1 * inv_scale));
        }
        out_row[idx] = out;
      }
    }
  }
}

// Rows that the vector kernel cannot take but that fit in registers as scalars
// (common/scalar_rows.cuh), so x (and the residual) is read once.
template <typename scalar_t, bool kResidual, typename Rows>
__global__ void __launch_bounds__(Rows::kLaunchBound)
    rms_norm_fp8_scalar_kernel(const Fp8NormPointers<scalar_t> p) {
  constexpr int kElemsPerThread = Rows::kElemsPerThread;
  using acc_t = acc_type<scalar_t>;
  const acc_t inv_hidden = acc_t(1) / static_cast<acc_t>(p.hidden);
  const acc_t eps = static_cast<acc_t>(p.eps);
  const bool dynamic = p.scale == nullptr;
  const float static_inv_scale = dynamic ? 0.0f : 1.0f / *p.scale;
  const int stride = scalar_stride<Rows>();
  // Element i of this thread is column threadIdx.x + i * stride of the row.
  const int own_columns = static_cast<int>(p.hidden) - static_cast<int>(threadIdx.x);
  const scalar_t* w_own = p.weight + threadIdx.x;
  for (int64_t block_row = static_cast<int64_t>(blockIdx.x) * blockDim.y; block_row < p.rows;
       block_row += static_cast<int64_t>(gridDim.x) * blockDim.y) {
    const int64_t row = block_row + threadIdx.y;
    const int row_columns = row < p.rows ? own_columns : 0;  // masks rows past the end
    const int64_t own_offset = row * p.hidden + threadIdx.x;
    const scalar_t* x_own = p.x + own_offset;
    acc_t v[kElemsPerThread];  // x, or the rounded new residual
    if constexpr (kResidual) {
      scalar_t* res_own = p.residual + own_offset;
      scalar_t xv[kElemsPerThread];
      scalar_t rv[kElemsPerThread];
#pragma unroll
      for (int i = 0; i < kElemsPerThread; ++i) {
        const bool in_row = i * stride < row_columns;
        xv[i] = in_row ? x_own[i * stride] : scalar_t(0);
        rv[i] = in_row ? res_own[i * stride] : scalar_t(0);
      }
#pragma unroll
      for (int i = 0; i < kElemsPerThread; ++i) {
        const scalar_t sum =
            static_cast<scalar_t>(static_cast<acc_t>(xv[i]) + static_cast<acc_t>(rv[i]));
        if (i * stride < row_columns) {
          res_own[i * stride] = sum;
        }
        v[i] = static_cast<acc_t>(sum);
      }
    } else {
#pragma unroll
      for (int i = 0; i < kElemsPerThread; ++i) {
        v[i] = i * stride < row_columns ? static_cast<acc_t>(x_own[i * stride]) : acc_t(0);
      }
    }
    acc_t sum_sq[1] = {0};
#pragma unroll
    for (int i = 0; i < kElemsPerThread; ++i) {
      sum_sq[0] += v[i] * v[i];
    }
    row_sum(sum_sq);
    const acc_t rstd = rsqrt_acc(sum_sq[0] * inv_hidden + eps);

    float inv_scale = static_inv_scale;
    if (dynamic) {
      acc_t amax[1] = {0};
#pragma unroll
      for (int i = 0; i < kElemsPerThread; ++i) {
        if (i * stride < row_columns) {
          amax[0] = fmax(amax[0], fabs(v[i] * rstd * static_cast<acc_t>(w_own[i * stride])));
        }
      }
      inv_scale = dynamic_inv_scale(amax, p.scale_ub, p.row_scales, row, row < p.rows);
    }

    __nv_fp8_storage_t* out_own = reinterpret_cast<__nv_fp8_storage_t*>(p.out + own_offset);
#pragma unroll
    for (int i = 0; i < kElemsPerThread; ++i) {
      if (i * stride < row_columns) {
        const acc_t y = v[i] * rstd * static_cast<acc_t>(w_own[i * stride]);
        out_own[i * stride] = e4m3(static_cast<float>(y * inv_scale));
      }
    }
  }
}

// Any hidden size and alignment: the row is re-read (mostly from L1/L2) by each
// step. The fused variant adds the residual as fused_add_rms_norm's generic kernel
// does (common/residual_add.cuh); the later steps re-read the residual elements this
// same thread stored, so no barrier is needed between them.

template <typename scalar_t, bool kResidual>
__global__ void __launch_bounds__(kMaxThreadsPerBlock)
    rms_norm_fp8_generic_kernel(const Fp8NormPointers<scalar_t> p) {
  using acc_t = acc_type<scalar_t>;
  const acc_t inv_hidden = acc_t(1) / static_cast<acc_t>(p.hidden);
  const acc_t eps = static_cast<acc_t>(p.eps);
  const bool dynamic = p.scale == nullptr;
  const float static_inv_scale = dynamic ? 0.0f : 1.0f / *p.scale;
  for (int64_t block_row = static_cast<int64_t>(blockIdx.x) * blockDim.y; block_row < p.rows;
       block_row += static_cast<int64_t>(gridDim.x) * blockDim.y) {
    const int64_t row = block_row + threadIdx.y;
    const int64_t row_hidden = row < p.rows ? p.hidden : 0;  // masks rows past the end
    const int64_t offset = row * p.hidden;
    const scalar_t* v_row = p.x + offset;  // x, or the rounded new residual
    acc_t sum_sq[1] = {0};
    if constexpr (kResidual) {
      scalar_t* res_row = p.residual + offset;
      sum_sq[0] = add_residual_row(p.x + offset, res_row, row_hidden);
      v_row = res_row;
    } else {
      for (int64_t j = threadIdx.x; j < row_hidden; j += blockDim.x) {
        const acc_t value = static_cast<acc_t>(v_row[j]);
        sum_sq[0] += value * value;
      }
    }
    row_sum(sum_sq);
    const acc_t rstd = rsqrt_acc(sum_sq[0] * inv_hidden + eps);
    auto y_at = [&](int64_t j) {
      return static_cast<acc_t>(v_row[j]) * rstd * static_cast<acc_t>(p.weight[j]);
    };

    float inv_scale = static_inv_scale;
    if (dynamic) {
      acc_t amax[1] = {0};
      for (int64_t j = threadIdx.x; j < row_hidden; j += blockDim.x) {
        amax[0] = fmax(amax[0], fabs(y_at(j)));
      }
      inv_scale = dynamic_inv_scale(amax, p.scale_ub, p.row_scales, row, row < p.rows);
    }
    __nv_fp8_storage_t* out_row = reinterpret_cast<__nv_fp8_storage_t*>(p.out + offset);
    for (int64_t j = threadIdx.x; j < row_hidden; j += blockDim.x) {
      out_row[j] = e4m3(static_cast<float>(y_at(j) * inv_scale));
    }
  }
}

template <typename scalar_t, bool kResidual>
void launch_rms_norm_fp8(const Fp8NormPointers<scalar_t>& p) {
  const bool aligned = is_vector_aligned(p.x) && is_vector_aligned(p.weight) &&
                       is_vector_aligned(p.out) && (!kResidual || is_vector_aligned(p.residual));
  const RowLaunch plan = plan_row_launch(p.hidden, vector_size<scalar_t>(), aligned, kFp8Limits);
  const cudaStream_t stream = current_stream();
  if (plan.vectors_per_thread == 0) {
    const ScalarRowLaunch scalar_plan = plan_scalar_row_launch(p.hidden);
    const dim3 grid(static_cast<unsigned>(row_blocks(p.rows, scalar_plan.launch)));
    const bool launched = launch_scalar_rows<scalar_t>(scalar_plan, [&](auto rows_variant) {
      rms_norm_fp8_scalar_kernel<scalar_t, kResidual, decltype(rows_variant)>
          <<<grid, scalar_plan.launch.block(), 0, stream>>>(p);
    });
    if (launched) {
      HOTLOOP_KERNEL_LAUNCH_CHECK();
      return;
    }
  }
  const dim3 grid(static_cast<unsigned>(row_blocks(p.rows, plan)));
  switch (plan.vectors_per_thread) {
#define HOTLOOP_LAUNCH(VPT)                                                                     \
  case VPT:                                                                                     \
    rms_norm_fp8_vector_kernel<scalar_t, kResidual, VPT><<<grid, plan.block(), 0, stream>>>(p); \
    break;
    HOTLOOP_LAUNCH(1)
    HOTLOOP_LAUNCH(2)
    HOTLOOP_LAUNCH(kFp8WideVectors)
#undef HOTLOOP_LAUNCH
    default:
      HOTLOOP_INTERNAL_ASSERT(plan.vectors_per_thread == 0);
      rms_norm_fp8_generic_kernel<scalar_t, kResidual><<<grid, plan.block(), 0, stream>>>(p);
  }
  HOTLOOP_KERNEL_LAUNCH_CHECK();
}

struct LaunchCuda {
  // Refuses GPUs older than Ada/Hopper, naming the GPU, before anything is allocated.
  static void check_device(const char* op, const Tensor& x) {
    const CudaDeviceGuard guard(x);
    const int device = current_device();
    int major = 0;
    int minor = 0;
    HOTLOOP_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    HOTLOOP_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
    if (major * 10 + minor >= kFp8MinCapability) {
      return;
    }
    cudaDeviceProp prop{};
    HOTLOOP_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
    HOTLOOP_CHECK(false, op, ": ", prop.name, " (cuda:", device, ") has compute capability ", major,
                  ".", minor,
                  ", but the FP8 ops need 8.9 or newer (Ada, Hopper, Blackwell: GPUs that "
                  "convert to float8_e4m3fn in hardware and run the FP8 GEMMs its output feeds); "
                  "run them on such a GPU, or on the CPU");
  }

  template <typename scalar_t>
  void operator()(const Tensor& x, const Fp8NormPointers<scalar_t>& p) const {
    const CudaDeviceGuard guard(x);
    if (p.residual != nullptr) {
      launch_rms_norm_fp8<scalar_t, true>(p);
    } else {
      launch_rms_norm_fp8<scalar_t, false>(p);
    }
  }
};

using CudaOps = RmsNormFp8Ops<LaunchCuda>;

}  // namespace

HOTLOOP_LIBRARY_IMPL(CUDA, m) {
  m.impl("rms_norm_fp8", HOTLOOP_KERNEL(&CudaOps::rms_norm_fp8));
  m.impl("rms_norm_fp8_dynamic", HOTLOOP_KERNEL(&CudaOps::rms_norm_fp8_dynamic));
  m.impl("fused_add_rms_norm_fp8", HOTLOOP_KERNEL(&CudaOps::fused_add_rms_norm_fp8));
  m.impl("fused_add_rms_norm_fp8_dynamic",
         HOTLOOP_KERNEL(&CudaOps::fused_add_rms_norm_fp8_dynamic));
}

}  // namespace hotloop
