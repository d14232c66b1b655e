// CUDA kernels of the FP8 norms (rms_norm_fp8, rms_norm_fp8_dynamic and their
// fused_add_ twins): one read of x (and of the residual), one write of the
// float8_e4m3fn output (and of the residual), as the CPU kernel computes it.
//
// Rows map onto blocks as in rms_norm (common/row_launch.cuh): register-resident
// 16-byte vectors when every row is 16-byte aligned; aligned rows past those (and the
// fused ops' rows whose vector blocks underfill an SM) read back from L2 in 16-byte
// vectors, as fused_add_rms_norm's re-read kernel; register-resident scalars for other
// rows up to 16384 elements (common/scalar_rows.cuh), and a generic kernel that re-reads
// the row for longer ones and for float64's. Per row: the sum
// of squares and, for the dynamic ops, the largest |v * weight|, in one exchange
// (Fp8RowQuantiser); rstd and the row's scale from them; then out = e4m3(y * (1 / scale))
// converted two at a time. Whether the scale is dynamic is a template parameter:
// the static ops neither compute nor exchange the maximum.
//
// The conversion is cuda_fp8.h's: one cvt.rn.satfinite instruction per pair of
// values on sm_89 and newer. The wheel also carries sm_80/sm_86 code (the other
// ops run there), where cuda_fp8.h emulates it; the host refuses those GPUs
// (check_device) rather than run an FP8 producer where no FP8 GEMM runs.

#include <cuda_fp8.h>

#include "../common/cuda_utils.cuh"
#include "../common/norm_casting.cuh"
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
// Rows of up to 128 threads, or 256 for the fused ops. Fewer threads a row means more
// vectors a thread and fewer barriers an element: on the H100 at 2048 and 4096 bfloat16
// elements that was 4-8 % faster with a static scale and 12-20 % with a dynamic one,
// but 4 % slower for the fused dynamic op at 4096, whose four-vector variant runs at
// 128 registers (benchmarks/NOTES.md, run 54).
template <bool kResidual>
constexpr RowKernelLimits kFp8Limits{/*max_vectors_per_thread=*/kFp8WideVectors,
                                     /*target_threads=*/kResidual ? 256 : 128,
                                     /*max_threads=*/kFp8MaxThreadsWide};

// The first GPUs with FP8 conversion and FP8 tensor cores: Ada (8.9), Hopper (9.0).
constexpr int kFp8MinCapability = 89;

// Whether this compilation pass emits the kernels' code: not for the sm_80 and sm_86 cubins
// of the wheel, whose GPUs check_device refuses before any launch, so that no caller reaches
// their FP8 code there (the kernels stay, empty, so that the host code can name them).
static_assert(kFp8MinCapability == 89, "the #if below spells out kFp8MinCapability");
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 890
#define HOTLOOP_FP8_KERNEL_CODE 0
#else
#define HOTLOOP_FP8_KERNEL_CODE 1
#endif

#if HOTLOOP_FP8_KERNEL_CODE
__device__ __forceinline__ __nv_fp8_storage_t e4m3(float v) {
  return __nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3);
}

// lo lands in the low byte, the first in memory.
__device__ __forceinline__ __nv_fp8x2_storage_t e4m3x2(float lo, float hi) {
  return __nv_cvt_float2_to_fp8x2(make_float2(lo, hi), __NV_SATFINITE, __NV_E4M3);
}
#endif

// rstd and 1 / scale of one row.
template <typename acc_t>
struct Fp8Row {
  acc_t rstd;
  float inv_scale;
};

// What a kernel needs to turn its threads' statistics of a row into the row's rstd and
// scale. The row's largest |y| is rstd * max|v * weight| (rstd > 0), which the CPU kernel
// forms the same way, so the sum of squares and the maximum need one exchange; a static
// scale needs neither the maximum nor its exchange.
template <typename scalar_t, Casting kCasting, bool kDynamic>
class Fp8RowQuantiser {
 public:
  using acc_t = acc_type<scalar_t>;
  // A thread's part of a row: the sum of squares [, the largest |v * weight|].
  using Stats = acc_t[kDynamic ? 2 : 1];

  __device__ __forceinline__ explicit Fp8RowQuantiser(const Fp8NormPointers<scalar_t>& p)
      : inv_hidden_(acc_t(1) / static_cast<acc_t>(p.hidden)),
        eps_(static_cast<acc_t>(p.eps)),
        offset_(static_cast<acc_t>(p.offset)),
        static_inv_scale_(kDynamic ? 0.0f : 1.0f / *p.scale),
        scale_ub_(p.scale_ub),
        row_scales_(p.row_scales),
        rows_(p.rows) {}

  // Only for a dynamic scale: v's contribution to stats[1], with the weight as it multiplies
  // (kLlama's rounding of v * rstd is left out: the scale only needs to bound the row).
  __device__ __forceinline__ void add_magnitude(Stats& stats, acc_t v, acc_t w) const {
    stats[1] = fmax(stats[1], fabs(v * weight_value<kCasting>(w, offset_)));
  }

  // add_magnitude of each element of a 16-byte vector v, w its weight vector.
  // (By value, as quantised(): a weight vector is loaded whole.)
  template <int kSize>
  __device__ __forceinline__ void add_magnitudes(Stats& stats,
                                                 const AlignedVector<scalar_t, kSize> v,
                                                 const AlignedVector<scalar_t, kSize> w) const {
#pragma unroll
    for (int k = 0; k < kSize; ++k) {
      add_magnitude(stats, static_cast<acc_t>(v.val[k]), static_cast<acc_t>(w.val[k]));
    }
  }

  // y of the casting mode, before its rounding to the dtype (which quantisation replaces).
  __device__ __forceinline__ acc_t y(acc_t v, acc_t rstd, acc_t w) const {
    return weighted<kCasting, scalar_t>(v * rstd, w, offset_);
  }

  // Every thread of the block calls it (row_reduce says why); thread 0 of a dynamic row
  // stores the row's scale.
  __device__ __forceinline__ Fp8Row<acc_t> finish(Stats& stats, int64_t row) const {
    if constexpr (kDynamic) {
      row_sum_and_max(stats);
    } else {
      row_sum(stats);
    }
    const acc_t rstd = row_rstd<kCasting>(stats[0], inv_hidden_, eps_);
    if constexpr (kDynamic) {
      const float row_scale = dynamic_row_scale(static_cast<float>(rstd * stats[1]), scale_ub_);
      if (row < rows_ && threadIdx.x == 0) {
        row_scales_[row] = row_scale;
      }
      return {rstd, 1.0f / row_scale};
    } else {
      return {rstd, static_inv_scale_};
    }
  }

 private:
  acc_t inv_hidden_;
  acc_t eps_;
  acc_t offset_;
  float static_inv_scale_;
  const float* scale_ub_;
  float* row_scales_;
  int64_t rows_;
};

// The FP8 values of a 16-byte vector of scalar_t: half as many bytes.
template <typename scalar_t>
using Fp8Vector = AlignedVector<__nv_fp8x2_storage_t, vector_size<scalar_t>() / 2>;

#if HOTLOOP_FP8_KERNEL_CODE
// The FP8 values of the row's 16-byte vector v, w its weight vector, converted two at a time.
// (By value: a vector in global memory is loaded whole, as one 16-byte load.)
template <typename Quantiser, typename scalar_t, int kSize>
__device__ __forceinline__ AlignedVector<__nv_fp8x2_storage_t, kSize / 2> quantised(
    const Quantiser& quantiser, const AlignedVector<scalar_t, kSize> v,
    const AlignedVector<scalar_t, kSize> w, const Fp8Row<typename Quantiser::acc_t>& r) {
  using acc_t = typename Quantiser::acc_t;
  AlignedVector<__nv_fp8x2_storage_t, kSize / 2> out;
#pragma unroll
  for (int k = 0; k < kSize / 2; ++k) {
    const acc_t y0 =
        quantiser.y(static_cast<acc_t>(v.val[2 * k]), r.rstd, static_cast<acc_t>(w.val[2 * k]));
    const acc_t y1 = quantiser.y(static_cast<acc_t>(v.val[2 * k + 1]), r.rstd,
                                 static_cast<acc_t>(w.val[2 * k + 1]));
    out.val[k] = e4m3x2(static_cast<float>(y0 * r.inv_scale), static_cast<float>(y1 * r.inv_scale));
  }
  return out;
}
#endif

template <typename scalar_t, Casting kCasting, bool kResidual, bool kDynamic, int kVectorsPerThread>
__global__ void __launch_bounds__(kVectorsPerThread >= kFp8WideVectors ? kFp8MaxThreadsWide
                                                                       : kMaxThreadsPerBlock)
    rms_norm_fp8_vector_kernel(const Fp8NormPointers<scalar_t> p) {
#if HOTLOOP_FP8_KERNEL_CODE
  using Quantiser = Fp8RowQuantiser<scalar_t, kCasting, kDynamic>;
  using acc_t = typename Quantiser::acc_t;
  constexpr int kVec = vector_size<scalar_t>();
  using Vec = AlignedVector<scalar_t, kVec>;
  const int num_vectors = static_cast<int>(p.hidden / kVec);
  const Quantiser quantiser(p);
  const Vec* weight_vec = reinterpret_cast<const Vec*>(p.weight);

  for (const int64_t row : block_rows(p.rows)) {
    const bool row_valid = row < p.rows;
    const int64_t offset = row * p.hidden;
    Vec v[kVectorsPerThread];  // x, or the rounded new residual
    if constexpr (kResidual) {
      // Every load before the first store to the residual (fused_add_rms_norm says why).
      Vec rv[kVectorsPerThread];
      const Vec* x_row = reinterpret_cast<const Vec*>(p.x + offset);
      Vec* res_row = reinterpret_cast<Vec*>(p.residual + offset);
      load_vector_pairs(v, x_row, rv, res_row, row_valid, num_vectors);
      for_row_vectors<kVectorsPerThread>(blockDim.x, row_valid, num_vectors, [&](int i, int idx) {
#pragma unroll
        for (int k = 0; k < kVec; ++k) {
          v[i].val[k] = rounded_sum(v[i].val[k], rv[i].val[k]);
        }
        res_row[idx] = v[i];
      });
    } else {
      const Vec* x_row = reinterpret_cast<const Vec*>(p.x + offset);
      for_row_vectors<kVectorsPerThread>(blockDim.x, row_valid, num_vectors,
                                         [&](int i, int idx) { v[i] = x_row[idx]; });
    }
    typename Quantiser::Stats stats = {};
    for_row_vectors<kVectorsPerThread>(blockDim.x, row_valid, num_vectors, [&](int i, int idx) {
      add_squares(stats[0], v[i]);
      if constexpr (kDynamic) {
        // The output reads the weight again (from L1) rather than hold it in registers:
        // holding it, or loading all of a row's weight vectors at once, cost occupancy
        // and lost (benchmarks/NOTES.md, runs 51-52).
        quantiser.add_magnitudes(stats, v[i], weight_vec[idx]);
      }
    });
    const Fp8Row<acc_t> r = quantiser.finish(stats, row);

    auto* out_row = reinterpret_cast<Fp8Vector<scalar_t>*>(p.out + offset);
    for_row_vectors<kVectorsPerThread>(blockDim.x, row_valid, num_vectors, [&](int i, int idx) {
      out_row[idx] = quantised(quantiser, v[i], weight_vec[idx], r);
    });
  }
#endif
}

// The fused ops' aligned rows that the vector kernel does not hold well, and the unfused ops'
// aligned rows past it: fused_add_rms_norm_reread_kernel's shape. The first pass forms the
// row's statistics (and stores the rounded sums into the residual), the second reads the row
// back from L2 and writes the FP8 values. On an H100, bfloat16, % of copy, before (the vector
// kernel, or past it the scalar and generic ones) -> after (benchmarks/NOTES.md, runs O36-O37):
// fused static 12288 86.6 -> 98.1, 16384 93.6 -> 98.0, 20480 52.5 -> 97.6, 32768 43.0 -> 96.6;
// fused dynamic 12288 76.9 -> 97.3, 16384 90.8 -> 97.6, 32768 35.3 -> 96.2; unfused static /
// dynamic at 16392 37.7 / 37.9 -> 92.8 / 88.0, 20480 37.6 -> 90.9 / 88.4, 32768 29.5 / 29.2 ->
// 90.2 / 86.7, 65536 27.5 / 27.4 -> 76.8 / 69.9.
//
// The fused ops hold one 16-byte vector of x and one of the residual a thread at a time, on
// 1024 threads, two blocks an SM; where two blocks' rows would leave the L2, two of each on one
// block of 1024 (48-64 registers; run O39, 65536 static / dynamic 38.3 / 24.4 -> 84.7 / 92.6,
// 40960 40.2 / 30.6 -> 96.0 / 94.5, which went to the generic kernel). The unfused ops have no
// residual load beside x's, so they load two vectors of x ahead instead: on the most blocks an
// SM whose rows stay in the L2 of 512 threads, three an SM (40 registers), 768, two an SM, or
// 1024, one an SM (54 registers). With two vectors in flight a thread, 1536 threads an SM.
// Run O37, unfused static / dynamic, one vector on 1024 x 2 -> two on 512 x 3 or on 768 x 2:
// 16392 82.5 / 77.6 -> 92.8 / 88.0 or 79.5 / 73.7; 20480 76.1 / 71.3 -> 90.9 / 88.4 or
// 87.2 / 83.9; 32768 (past the L2 at three blocks) 84.4 / 83.6 -> 86.5 / 84.5 or 90.2 / 86.7.
// One block of 1024 threads lost there (59-81 static), but takes the rows past the L2 at two
// blocks, which went to the generic kernel (run O38, 65536: 27.5 / 27.4 -> 76.8 / 69.9; 768
// threads, two blocks, 67.0 / 64.0). The vector plans of 12288 and 16384 stay ahead of the
// re-read (O38, dynamic 86.9 / 93.4 against 84.9 / 90.6 on 512 threads).
constexpr int fp8_reread_blocks_per_sm(int threads, int in_flight) {
  return (in_flight == 1 ? kRereadBlocksPerSm * kMaxThreadsPerBlock : 1536) / threads;
}

template <typename scalar_t, Casting kCasting, bool kResidual, bool kDynamic, int kThreads,
          int kInFlight>
__global__ void __launch_bounds__(kThreads, fp8_reread_blocks_per_sm(kThreads, kInFlight))
    rms_norm_fp8_reread_kernel(const Fp8NormPointers<scalar_t> p) {
#if HOTLOOP_FP8_KERNEL_CODE
  using Quantiser = Fp8RowQuantiser<scalar_t, kCasting, kDynamic>;
  using Vec = AlignedVector<scalar_t, vector_size<scalar_t>()>;
  const int num_vectors = static_cast<int>(p.hidden / vector_size<scalar_t>());
  const Quantiser quantiser(p);
  const Vec* weight_vec = reinterpret_cast<const Vec*>(p.weight);
  for (const int64_t row : block_rows(p.rows)) {
    const int64_t offset = row * p.hidden;
    const Vec* x_row = reinterpret_cast<const Vec*>(p.x + offset);
    Vec* res_row = kResidual ? reinterpret_cast<Vec*>(p.residual + offset) : nullptr;
    typename Quantiser::Stats stats = {};
#pragma unroll 1
    for (int first = threadIdx.x; first < num_vectors; first += kInFlight * kThreads) {
      Vec v[kInFlight];
      Vec rv[kResidual ? kInFlight : 1];
#pragma unroll
      for (int j = 0; j < kInFlight; ++j) {
        if (first + j * kThreads < num_vectors) {
          v[j] = x_row[first + j * kThreads];
          if constexpr (kResidual) {
            rv[j] = res_row[first + j * kThreads];
          }
        }
      }
#pragma unroll
      for (int j = 0; j < kInFlight; ++j) {
        const int idx = first + j * kThreads;
        if (idx < num_vectors) {
          if constexpr (kResidual) {
            add_rounded_squares(v[j], rv[j], stats[0]);
            res_row[idx] = v[j];
          } else {
            add_squares(stats[0], v[j]);
          }
          if constexpr (kDynamic) {
            quantiser.add_magnitudes(stats, v[j], weight_vec[idx]);
          }
        }
      }
    }
    const Fp8Row<typename Quantiser::acc_t> r = quantiser.finish(stats, row);
    const Vec* v_row = kResidual ? res_row : x_row;  // x, or the rounded new residual
    auto* out_row = reinterpret_cast<Fp8Vector<scalar_t>*>(p.out + offset);
#pragma unroll 1
    for (int idx = threadIdx.x; idx < num_vectors; idx += kThreads) {
      out_row[idx] = quantised(quantiser, v_row[idx], weight_vec[idx], r);
    }
  }
#endif
}

// Rows that the vector kernel cannot take but that fit in registers as scalars
// (common/scalar_rows.cuh), so x (and the residual) is read once.
template <typename scalar_t, Casting kCasting, bool kResidual, bool kDynamic, typename Rows>
__global__ void __launch_bounds__(Rows::kLaunchBound)
    rms_norm_fp8_scalar_kernel(const Fp8NormPointers<scalar_t> p) {
#if HOTLOOP_FP8_KERNEL_CODE
  constexpr int kElemsPerThread = Rows::kElemsPerThread;
  using Quantiser = Fp8RowQuantiser<scalar_t, kCasting, kDynamic>;
  using acc_t = typename Quantiser::acc_t;
  const Quantiser quantiser(p);
  const int stride = scalar_stride<Rows>();
  // Element i of this thread is column threadIdx.x + i * stride of the row.
  const int own_columns = static_cast<int>(p.hidden) - static_cast<int>(threadIdx.x);
  const scalar_t* w_own = p.weight + threadIdx.x;
  for (const int64_t row : block_rows(p.rows)) {
    const int row_columns = row < p.rows ? own_columns : 0;  // masks rows past the end
    const int64_t own_offset = row * p.hidden + threadIdx.x;
    const scalar_t* x_own = p.x + own_offset;
    acc_t v[kElemsPerThread];  // x, or the rounded new residual
    if constexpr (kResidual) {
      scalar_t* res_own = p.residual + own_offset;
      scalar_t xv[kElemsPerThread];
      scalar_t rv[kElemsPerThread];
      load_scalar_pairs(xv, x_own, rv, res_own, stride, row_columns);
#pragma unroll
      for (int i = 0; i < kElemsPerThread; ++i) {
        const scalar_t sum = rounded_sum(xv[i], rv[i]);
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
    typename Quantiser::Stats stats = {};
#pragma unroll
    for (int i = 0; i < kElemsPerThread; ++i) {
      stats[0] += v[i] * v[i];
      if constexpr (kDynamic) {
        if (i * stride < row_columns) {
          quantiser.add_magnitude(stats, v[i], static_cast<acc_t>(w_own[i * stride]));
        }
      }
    }
    const Fp8Row<acc_t> r = quantiser.finish(stats, row);

    __nv_fp8_storage_t* out_own = reinterpret_cast<__nv_fp8_storage_t*>(p.out + own_offset);
    if constexpr (kResidual && !kDynamic) {
      // One weight at a time between stores: the fused static kernel lost with the weight
      // read ahead in the full benchmark (4095: 76.5 % of copy like this, 70-71 % four
      // ahead; benchmarks/NOTES.md, runs 55, 58 and 61). Written out: the grouped loop below
      // with one weight a group compiles to different code from this measured one.
#pragma unroll
      for (int i = 0; i < kElemsPerThread; ++i) {
        if (i * stride < row_columns) {
          const acc_t y = quantiser.y(v[i], r.rstd, static_cast<acc_t>(w_own[i * stride]));
          out_own[i * stride] = e4m3(static_cast<float>(y * r.inv_scale));
        }
      }
    } else {
      // The weight is read four elements ahead of their stores. A load cannot pass a store
      // (the compiler must assume that the output may alias the weight), so read one at a
      // time each would wait for the store before it: 4-7 % slower at 2047-8193 elements
      // (benchmarks/NOTES.md, run 56).
      constexpr int kWeightAhead = 4;
      static_assert(kElemsPerThread % kWeightAhead == 0, "whole groups of weights");
#pragma unroll
      for (int group = 0; group < kElemsPerThread; group += kWeightAhead) {
        acc_t w[kWeightAhead];
#pragma unroll
        for (int j = 0; j < kWeightAhead; ++j) {
          const int i = group + j;
          w[j] = i * stride < row_columns ? static_cast<acc_t>(w_own[i * stride]) : acc_t(0);
        }
#pragma unroll
        for (int j = 0; j < kWeightAhead; ++j) {
          const int i = group + j;
          if (i * stride < row_columns) {
            const acc_t y = quantiser.y(v[i], r.rstd, w[j]);
            out_own[i * stride] = e4m3(static_cast<float>(y * r.inv_scale));
          }
        }
      }
    }
  }
#endif
}

// Any hidden size and alignment: the row is re-read (mostly from L1/L2) by each
// step. The fused variant adds the residual as fused_add_rms_norm's generic kernel
// does (common/residual_add.cuh); the later steps re-read the residual elements this
// same thread stored, so no barrier is needed between them.

template <typename scalar_t, Casting kCasting, bool kResidual, bool kDynamic>
__global__ void __launch_bounds__(kMaxThreadsPerBlock)
    rms_norm_fp8_generic_kernel(const Fp8NormPointers<scalar_t> p) {
#if HOTLOOP_FP8_KERNEL_CODE
  using Quantiser = Fp8RowQuantiser<scalar_t, kCasting, kDynamic>;
  using acc_t = typename Quantiser::acc_t;
  const Quantiser quantiser(p);
  for (const int64_t row : block_rows(p.rows)) {
    const int64_t row_hidden = row < p.rows ? p.hidden : 0;  // masks rows past the end
    const int64_t offset = row * p.hidden;
    const scalar_t* v_row = p.x + offset;  // x, or the rounded new residual
    typename Quantiser::Stats stats = {};
    if constexpr (kResidual) {
      // The sum of squares comes with the add; a dynamic scale's maximum takes a pass of
      // its own below.
      scalar_t* res_row = p.residual + offset;
      stats[0] = add_residual_row(p.x + offset, res_row, row_hidden);
      v_row = res_row;
    }
    if constexpr (!kResidual || kDynamic) {
      for (int64_t j = threadIdx.x; j < row_hidden; j += blockDim.x) {
        const acc_t v = static_cast<acc_t>(v_row[j]);
        if constexpr (!kResidual) {
          stats[0] += v * v;
        }
        if constexpr (kDynamic) {
          quantiser.add_magnitude(stats, v, static_cast<acc_t>(p.weight[j]));
        }
      }
    }
    const Fp8Row<acc_t> r = quantiser.finish(stats, row);
    __nv_fp8_storage_t* out_row = reinterpret_cast<__nv_fp8_storage_t*>(p.out + offset);
    for (int64_t j = threadIdx.x; j < row_hidden; j += blockDim.x) {
      const acc_t y =
          quantiser.y(static_cast<acc_t>(v_row[j]), r.rstd, static_cast<acc_t>(p.weight[j]));
      out_row[j] = e4m3(static_cast<float>(y * r.inv_scale));
    }
  }
#endif
}

template <typename scalar_t, Casting kCasting, bool kResidual, bool kDynamic>
void launch_rms_norm_fp8(const Fp8NormPointers<scalar_t>& p) {
  const bool aligned = is_vector_aligned(p.x) && is_vector_aligned(p.weight) &&
                       is_vector_aligned(p.out) && (!kResidual || is_vector_aligned(p.residual));
  const RowLaunch plan =
      plan_row_launch(p.hidden, vector_size<scalar_t>(), aligned, kFp8Limits<kResidual>);
  const cudaStream_t stream = current_stream();
  const auto vector_kernel = [](auto vpt) {
    return rms_norm_fp8_vector_kernel<scalar_t, kCasting, kResidual, kDynamic,
                                      decltype(vpt)::value>;
  };
  // Aligned rows the vector kernel does not take, and the fused ops' rows it takes with blocks
  // that underfill an SM (as fused_add_rms_norm's), are re-read while they stay in the L2, on
  // the most blocks an SM whose rows do. (Asked only for such rows: a
  // decode-sized call with a vector plan reads no device attribute for it.)
  const bool wide = aligned && p.hidden % vector_size<scalar_t>() == 0 &&
                    (plan.vectors_per_thread == 0 ||
                     (kResidual && vector_plan_underfills_sms<1, 2, kFp8WideVectors>(
                                       plan, p.rows, vector_kernel)));
  const int64_t blocks_in_l2 =
      wide ? reread_blocks_in_l2(p.hidden * static_cast<int64_t>(sizeof(scalar_t))) : 0;
  const auto reread = [&](auto threads, auto in_flight) {
    constexpr int kThreads = decltype(threads)::value;
    constexpr int kInFlight = decltype(in_flight)::value;
    if (blocks_in_l2 < fp8_reread_blocks_per_sm(kThreads, kInFlight)) {
      return false;
    }
    launch_reread_kernel<kThreads>(
        rms_norm_fp8_reread_kernel<scalar_t, kCasting, kResidual, kDynamic, kThreads, kInFlight>,
        p.rows, stream, p);
    return true;
  };
  using One = std::integral_constant<int, 1>;
  using Two = std::integral_constant<int, 2>;
  if constexpr (kResidual) {
    if (reread(std::integral_constant<int, kMaxThreadsPerBlock>{}, One{}) ||
        reread(std::integral_constant<int, kMaxThreadsPerBlock>{}, Two{})) {
      return;
    }
  } else if (reread(std::integral_constant<int, 512>{}, Two{}) ||
             reread(std::integral_constant<int, 768>{}, Two{}) ||
             reread(std::integral_constant<int, 1024>{}, Two{})) {
    return;
  }
  if (!launch_vector_row_kernel<1, 2, kFp8WideVectors>(plan, p.rows, stream, vector_kernel, p)) {
    const auto scalar_kernel = [](auto rows_variant) {
      return rms_norm_fp8_scalar_kernel<scalar_t, kCasting, kResidual, kDynamic,
                                        decltype(rows_variant)>;
    };
    launch_scalar_or_generic<scalar_t>(
        p.hidden, p.rows, stream, scalar_kernel,
        rms_norm_fp8_generic_kernel<scalar_t, kCasting, kResidual, kDynamic>, plan, p);
  }
}

struct LaunchCuda {
  // Refuses GPUs older than Ada/Hopper, naming the GPU, before anything is allocated.
  static void check_device(const char* op, const Tensor& x) {
    const CudaDeviceGuard guard(x);
    const int device = current_device();
    const int major = device_attribute(cudaDevAttrComputeCapabilityMajor, device);
    const int minor = device_attribute(cudaDevAttrComputeCapabilityMinor, device);
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

  template <typename scalar_t, Casting kCasting>
  static void run(const Tensor& x, const Fp8NormPointers<scalar_t>& p) {
    const CudaDeviceGuard guard(x);
    const bool fused = p.residual != nullptr;
    const bool dynamic = p.scale == nullptr;
    if (fused && dynamic) {
      launch_rms_norm_fp8<scalar_t, kCasting, true, true>(p);
    } else if (fused) {
      launch_rms_norm_fp8<scalar_t, kCasting, true, false>(p);
    } else if (dynamic) {
      launch_rms_norm_fp8<scalar_t, kCasting, false, true>(p);
    } else {
      launch_rms_norm_fp8<scalar_t, kCasting, false, false>(p);
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
