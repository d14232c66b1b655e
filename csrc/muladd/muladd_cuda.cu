// CUDA kernels of muladd (a * b + c) and mul (a * b).
//
// A grid-stride loop over 16-byte vectors, kUnroll vectors per thread per step so
// several loads are in flight, computed in float32 (float64 for float64). The
// vector loop runs only when a, b and out are 16-byte aligned; the scalar loop
// covers the tail (or everything, for unaligned inputs).
#include <ATen/OpMathType.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "../common/checks.h"
#include "../common/cuda_utils.cuh"

namespace hotloop {
namespace {

constexpr int kThreads = 256;
constexpr int kUnroll = 4;

template <typename acc_t, bool kAddC>
__device__ __forceinline__ acc_t mul_add(acc_t a, acc_t b, acc_t c) {
  if constexpr (kAddC) {
    return a * b + c;
  } else {
    return a * b;  // not a * b + 0, which would turn -0.0 into +0.0
  }
}

template <typename scalar_t, bool kAddC>
__global__ void muladd_kernel(const scalar_t* __restrict__ a, const scalar_t* __restrict__ b,
                              scalar_t* __restrict__ out, int64_t n, at::opmath_type<scalar_t> c,
                              bool vectorized) {
  using acc_t = at::opmath_type<scalar_t>;
  constexpr int kVec = vector_size<scalar_t>();
  using Vec = AlignedVector<scalar_t, kVec>;
  const int64_t num_threads = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;

  int64_t scalar_begin = 0;
  if (vectorized) {
    const int64_t num_vectors = n / kVec;
    const Vec* a_vec = reinterpret_cast<const Vec*>(a);
    const Vec* b_vec = reinterpret_cast<const Vec*>(b);
    Vec* out_vec = reinterpret_cast<Vec*>(out);
    // Neighbouring threads take neighbouring vectors within each of the kUnroll slots.
    for (int64_t base = static_cast<int64_t>(blockIdx.x) * blockDim.x * kUnroll + threadIdx.x;
         base < num_vectors; base += num_threads * kUnroll) {
      Vec av[kUnroll];
      Vec bv[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t idx = base + static_cast<int64_t>(u) * blockDim.x;
        if (idx < num_vectors) {
          av[u] = a_vec[idx];
          bv[u] = b_vec[idx];
        }
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t idx = base + static_cast<int64_t>(u) * blockDim.x;
        if (idx < num_vectors) {
          Vec ov;
#pragma unroll
          for (int k = 0; k < kVec; ++k) {
            ov.val[k] = static_cast<scalar_t>(mul_add<acc_t, kAddC>(
                static_cast<acc_t>(av[u].val[k]), static_cast<acc_t>(bv[u].val[k]), c));
          }
          out_vec[idx] = ov;
        }
      }
    }
    scalar_begin = num_vectors * kVec;
  }
  for (int64_t i = scalar_begin + tid; i < n; i += num_threads) {
    out[i] = static_cast<scalar_t>(
        mul_add<acc_t, kAddC>(static_cast<acc_t>(a[i]), static_cast<acc_t>(b[i]), c));
  }
}

template <bool kAddC>
at::Tensor muladd_cuda_impl(const char* op, const at::Tensor& a, const at::Tensor& b, double c) {
  check_elementwise_inputs(op, a, b);
  at::Tensor out = at::empty(a.sizes(), a.options());
  const int64_t n = out.numel();
  if (n == 0) {
    return out;
  }
  const c10::cuda::CUDAGuard guard(a.device());
  const at::Tensor a_contig = a.contiguous();
  const at::Tensor b_contig = b.contiguous();
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  HOTLOOP_DISPATCH_FLOATING(a.scalar_type(), "muladd_cuda", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const scalar_t* a_ptr = a_contig.const_data_ptr<scalar_t>();
    const scalar_t* b_ptr = b_contig.const_data_ptr<scalar_t>();
    scalar_t* out_ptr = out.mutable_data_ptr<scalar_t>();
    const bool vectorized =
        is_vector_aligned(a_ptr) && is_vector_aligned(b_ptr) && is_vector_aligned(out_ptr);
    const int64_t items = vectorized ? ceil_div(n, vector_size<scalar_t>() * kUnroll) : n;
    // Enough blocks to fill every SM several times over; the loop strides over the rest.
    const int64_t blocks = std::min<int64_t>(ceil_div(items, kThreads), int64_t{num_sms()} * 16);
    muladd_kernel<scalar_t, kAddC><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
        a_ptr, b_ptr, out_ptr, n, static_cast<acc_t>(c), vectorized);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return out;
}

at::Tensor muladd_cuda(const at::Tensor& a, const at::Tensor& b, double c) {
  return muladd_cuda_impl</*kAddC=*/true>("muladd", a, b, c);
}

at::Tensor mul_cuda(const at::Tensor& a, const at::Tensor& b) {
  return muladd_cuda_impl</*kAddC=*/false>("mul", a, b, 0.0);
}

}  // namespace

TORCH_LIBRARY_IMPL(hotloop, CUDA, m) {
  m.impl("muladd", &muladd_cuda);
  m.impl("mul", &mul_cuda);
}

}  // namespace hotloop
