// CUDA kernels of muladd (a * b + c) and mul (a * b).
//
// A grid-stride loop over 16-byte vectors, kUnroll vectors per thread per step so
// several loads are in flight, computed in float32 (float64 for float64). The
// vector loop runs only when a, b and out are 16-byte aligned; the scalar loop
// covers the tail (or everything, for unaligned inputs).

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
                              scalar_t* __restrict__ out, int64_t n, acc_type<scalar_t> c,
                              bool vectorized) {
  using acc_t = acc_type<scalar_t>;
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
Tensor muladd_cuda_impl(const char* op, const Tensor& a, const Tensor& b, double c) {
  check_elementwise_inputs(op, a, b);
  Tensor out = empty_like_contiguous(a);
  const int64_t n = out.numel();
  if (n == 0) {
    return out;
  }
  const CudaDeviceGuard guard(a);
  const Tensor a_contig = as_contiguous(a);
  const Tensor b_contig = as_contiguous(b);
  const cudaStream_t stream = current_stream();
  HOTLOOP_DISPATCH_FLOATING(a.scalar_type(), "muladd_cuda", [&] {
    using acc_t = acc_type<scalar_t>;
    const scalar_t* a_ptr = const_data<scalar_t>(a_contig);
    const scalar_t* b_ptr = const_data<scalar_t>(b_contig);
    scalar_t* out_ptr = mutable_data<scalar_t>(out);
    const bool vectorized =
        is_vector_aligned(a_ptr) && is_vector_aligned(b_ptr) && is_vector_aligned(out_ptr);
    const int64_t items = vectorized ? ceil_div(n, vector_size<scalar_t>() * kUnroll) : n;
    // Enough blocks to fill every SM several times over; the loop strides over the rest.
    const int64_t blocks = std::min<int64_t>(ceil_div(items, kThreads), int64_t{num_sms()} * 16);
    muladd_kernel<scalar_t, kAddC><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
        a_ptr, b_ptr, out_ptr, n, static_cast<acc_t>(c), vectorized);
    HOTLOOP_KERNEL_LAUNCH_CHECK();
  });
  return out;
}

Tensor muladd_cuda(const Tensor& a, const Tensor& b, double c) {
  return muladd_cuda_impl</*kAddC=*/true>("muladd", a, b, c);
}

Tensor mul_cuda(const Tensor& a, const Tensor& b) {
  return muladd_cuda_impl</*kAddC=*/false>("mul", a, b, 0.0);
}

}  // namespace

HOTLOOP_LIBRARY_IMPL(CUDA, m) {
  m.impl("muladd", HOTLOOP_KERNEL(&muladd_cuda));
  m.impl("mul", HOTLOOP_KERNEL(&mul_cuda));
}

}  // namespace hotloop
