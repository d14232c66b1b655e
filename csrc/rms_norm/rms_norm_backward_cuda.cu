// CUDA kernels of rms_norm_backward (rms_norm_cuda.cu has the forward, and the file's
// overview of the row layouts both share).

#include "rms_norm_cuda.cuh"

namespace hotloop {
namespace {

// ---------------------------------------------------------------------------
// Backward
//
// grad_x = rstd * (g - xhat * mean(g * xhat)) = rstd * g - x * rstd^3 * sum(g * x) / H,
// with g = grad_out * weight and xhat = x * rstd.
// grad_weight = sum over rows of grad_out * xhat, reduced in two steps without a
// second pass over x: each block of the grid-strided kernel sums its rows into a
// float32 (float64) partial row of weight_partials ([gridDim.x, hidden]);
// sum_partials_kernel then adds up the partial rows column by column. The grid is
// sized to fill the GPU once (occupancy x SMs), so the partial buffer has a few
// rows per SM, not one per row of x.
// ---------------------------------------------------------------------------

// ---------------------------------------------------------------------------
// Casting (common/norm_casting.h): the forward's values come from common/norm_casting.cuh,
// the backward's from these.
// ---------------------------------------------------------------------------

// v rounded to scalar_t and back by a lone conversion: kLlama's rounding in the backward's
// one-element paths (the span-staged, scalar and generic kernels). In the bfloat16 vector
// kernel, at the 128-register cap of its launch bound, common/norm_casting.cuh's rounded()
// (v paired with itself) spilled 16 bytes and made H = 4096 forward+backward 1.3 % slower on
// an H100 (0.470 -> 0.477 ms, run 80); the vector helpers round in pairs (rounded_pairs).
template <typename scalar_t, typename acc_t>
__device__ __forceinline__ acc_t rounded_alone(acc_t v) {
  return static_cast<acc_t>(static_cast<scalar_t>(v));
}

// Each of v's values rounded to scalar_t and back, two a conversion for bfloat16: one
// F2FP.BF16.F32.PACK_AB a pair, where the lone conversion compiles to F2F.BF16.F32, on sm_90's
// slow conversion pipe (kLlama's bfloat16 vector kernel had 160 of them; with pairs, none,
// 1376 instructions on 127 registers, kTorch's 1520 on 128). On an H100 the two tie at the
// headline (run 81: 0.470-0.472 ms, the default 0.471-0.472): F2F hide behind its memory
// there. The H200, whose memory is faster, showed kLlama +4 % with them (last session's run);
// not re-measured on one since.
template <typename scalar_t, typename acc_t, int kCount>
__device__ __forceinline__ void rounded_pairs(acc_t (&v)[kCount]) {
  if constexpr (std::is_same_v<scalar_t, BFloat16> && kCount % 2 == 0) {
#pragma unroll
    for (int k = 0; k < kCount; k += 2) {
      const __nv_bfloat162 pair = __floats2bfloat162_rn(v[k], v[k + 1]);
      v[k] = __low2float(pair);
      v[k + 1] = __high2float(pair);
    }
  } else {
#pragma unroll
    for (int k = 0; k < kCount; ++k) {
      v[k] = rounded_alone<scalar_t>(v[k]);
    }
  }
}

// g = grad_out * weight; rounded to the dtype in kLlama, as autograd's product of two
// tensors of that dtype is.
template <Casting kCasting, typename scalar_t, typename acc_t>
__device__ __forceinline__ acc_t weighted_grad(acc_t go, acc_t w, acc_t offset) {
  const acc_t g = go * weight_value<kCasting>(w, offset);
  if constexpr (kCasting == Casting::kLlama) {
    return rounded_alone<scalar_t>(g);
  } else {
    return g;
  }
}

// x_coeff of grad_x_value for a row's rstd and sum(g * x): rstd^3 * sum(g * x) / H.
template <typename acc_t>
__device__ __forceinline__ acc_t grad_x_coefficient(acc_t rstd, acc_t sum_gx, acc_t inv_hidden) {
  return rstd * rstd * rstd * sum_gx * inv_hidden;
}

// grad_x before its rounding: rstd * g - x * x_coeff (kTorch keeps its association).
template <Casting kCasting, typename scalar_t, typename acc_t>
__device__ __forceinline__ acc_t grad_x_value(acc_t go, acc_t w, acc_t x, acc_t rstd, acc_t x_coeff,
                                              acc_t offset) {
  if constexpr (kCasting == Casting::kTorch) {
    return rstd * go * w - x * x_coeff;
  } else {
    return rstd * weighted_grad<kCasting, scalar_t>(go, w, offset) - x * x_coeff;
  }
}

// One element's share of grad_weight: grad_out * xhat, with xhat as the weight sees it
// (kTorch keeps its association; kLlama and kGemma form xhat first, as their models'
// autograd does, and so compute alike where kLlama's rounding rounds nothing).
template <Casting kCasting, typename scalar_t, typename acc_t>
__device__ __forceinline__ acc_t grad_weight_term(acc_t go, acc_t x, acc_t rstd) {
  if constexpr (kCasting == Casting::kTorch) {
    return go * x * rstd;
  } else if constexpr (kCasting == Casting::kLlama) {
    return go * rounded_alone<scalar_t>(x * rstd);
  } else {
    return go * (x * rstd);
  }
}

// One element's share of the row sums, sum(x^2) and sum(g * x), with g = grad_out * weight as
// kCasting forms it: `weight_at()` gives the weight's element, read only with has_weight.
template <Casting kCasting, typename scalar_t, typename acc_t, typename WeightAt>
__device__ __forceinline__ void add_element_sums(acc_t x, acc_t go, const WeightAt& weight_at,
                                                 bool has_weight, acc_t (&sums)[2], acc_t offset) {
  acc_t g = go;
  if (has_weight) {
    g = weighted_grad<kCasting, scalar_t>(g, static_cast<acc_t>(weight_at()), offset);
  }
  sums[0] += x * x;
  sums[1] += g * x;
}

// The weight's vector idx, or an unset one without a weight.
template <Casting kCasting, typename Vec>
__device__ __forceinline__ Vec weight_vector(const Vec* weight_vec, int idx) {
  Vec wv;
  if (has_weight<kCasting>(weight_vec)) {
    wv = weight_vec[idx];
  }
  return wv;
}

// Span rows in rms_norm_backward_span_staged_kernel: one or two vectors a thread on up to 1024
// threads (16-bit rows up to 16377 elements, float32 up to 8189); the target of one warp over 256
// keeps a 4095-element 16-bit row at two vectors on 288 threads.
constexpr RowKernelLimits kSpanStagedLimits{/*max_vectors_per_thread=*/2,
                                            /*target_threads=*/256 + kWarpSize,
                                            /*max_threads=*/kMaxThreadsPerBlock};
// The one-vector span backward's bound, with two blocks an SM: ptxas then gives a thread 65536 /
// (640 * 2) registers, rounded down to 48. It bounds registers, not blocks (never above the
// plan's target_threads).
constexpr int kSpanOneVectorBoundThreads = 640;
static_assert(kSpanStagedLimits.target_threads <= kSpanOneVectorBoundThreads);
// Where memory is fast for an SM (an H200), spans of more than 160 vectors take two vectors a
// thread: H = 2047 in 16 bits, 257 vectors, on 160 threads instead of one vector on 288 (bfloat16
// forward+backward on an H200 71.8 -> 77.3 % of copy, Llama's casting 66.1 -> 69.6, Gemma's
// 70.7 -> 75.9; run O82, 2 rounds each, the ranges apart). Wider spans planned the same.
constexpr RowKernelLimits kSpanStagedFastMemoryLimits{/*max_vectors_per_thread=*/2,
                                                      /*target_threads=*/128 + kWarpSize,
                                                      /*max_threads=*/kMaxThreadsPerBlock};
// Where memory is fast for an SM (an H200), spans of more than this many vectors (6 KiB) stage
// two rows a block. bfloat16 forward+backward on an H200, % of copy, one row -> two (run O81,
// 2 rounds each, torch's / Llama's / Gemma's casting):
//   4095: 77.6 -> 79.0 / 69.8 -> 71.5 / 76.3 -> 78.4
//   6001: 76.9 -> 82.8 / 69.1 -> 76.4 / 76.2 -> 82.6
//   8193: 74.7 -> 75.1 / 55.0 -> 69.9 / 72.6 -> 67.8
// and below it they lost (2047: 71.8 -> 71.5 / 66.1 -> 64.4; 3001: 83.0 -> 82.3). At 2047's
// two vectors a thread too (run 143, from 257 vectors): 77.3 -> 74.5 / 69.6 -> 68.0 / 75.9 ->
// 74.1; 3001: 82.8 -> 82.1 / 75.0 -> 75.6 / 81.7 -> 81.9.
constexpr int64_t kSpanTwoRowsMinVectors = 384;
// The weight's copy stays in registers in blocks of up to this many threads. With more, the
// 64 registers a thread that 1024-thread bounds allow leave one block an SM (bfloat16
// backward at H = 8193 on an H100: 1684-1948 GB/s, against 2186-2313 reading it each pass).
constexpr int kSpanWeightRegistersMaxThreads = 512;

// The weight's elements for add_backward_sums and backward_vector: of a vector in
// registers, or of vector idx in global memory, read one by one where they are used.
template <typename Vec>
__device__ __forceinline__ auto elements_of(const Vec& v) {
  return [&v](int k) { return v.val[k]; };
}
template <typename Vec>
__device__ __forceinline__ auto elements_of(const Vec* vectors, int idx) {
  return [vectors, idx](int k) { return vectors[idx].val[k]; };
}

// The backward's arithmetic on one 16-byte vector of a row, shared by its kernels: the
// row sums sum(x^2) and sum(g * x) with g = grad_out * weight ... `weight_at(k)` gives the
// weight's element k of the vector (called only with has_weight): the vector kernel reads a
// vector it loaded, the staged kernel each element from global memory where it multiplies,
// as it did before these helpers (with a vector loaded up front, and x and grad_out read
// through references into shared memory, its bfloat16 SASS grew from 2840 to 3080
// instructions and H = 32768 forward+backward fell from 89 to 77 % of copy on an H100;
// benchmarks/NOTES.md, runs 75-78). The span-staged kernel keeps its own two loops: through
// these helpers nvcc scheduled it differently, and H = 8193 fell from 83 to 70 %. kLlama (which
// always has a weight) forms the vector's values first and rounds them in pairs.
template <Casting kCasting, typename Vec, typename acc_t, typename WeightAt>
__device__ __forceinline__ void add_backward_sums(const Vec& x, const Vec& grad_out,
                                                  const WeightAt& weight_at, bool has_weight,
                                                  acc_t (&sums)[2], acc_t offset) {
  using scalar_t = std::remove_cv_t<std::remove_reference_t<decltype(x.val[0])>>;
  constexpr int kVec = sizeof(x.val) / sizeof(x.val[0]);
  if constexpr (kCasting == Casting::kLlama) {
    acc_t g[kVec];
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      g[k] = static_cast<acc_t>(grad_out.val[k]) * static_cast<acc_t>(weight_at(k));
    }
    rounded_pairs<scalar_t>(g);
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      const acc_t xk = static_cast<acc_t>(x.val[k]);
      sums[0] += xk * xk;
      sums[1] += g[k] * xk;
    }
  } else {
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      add_element_sums<kCasting, scalar_t>(
          static_cast<acc_t>(x.val[k]), static_cast<acc_t>(grad_out.val[k]),
          [&] { return weight_at(k); }, has_weight, sums, offset);
    }
  }
}

// ... and, once the row's rstd and x_coeff = rstd^3 * sum(g * x) / H are known, grad_x of
// the vector, adding its grad_out * xhat to the thread's grad_weight accumulator dw.
template <Casting kCasting, typename Vec, typename acc_t, int kVec, typename WeightAt>
__device__ __forceinline__ Vec backward_vector(const Vec& x, const Vec& grad_out,
                                               const WeightAt& weight_at, bool has_weight,
                                               acc_t rstd, acc_t x_coeff, acc_t (&dw)[kVec],
                                               acc_t offset) {
  using scalar_t = std::remove_cv_t<std::remove_reference_t<decltype(x.val[0])>>;
  Vec out;
  if constexpr (kCasting == Casting::kLlama) {
    acc_t g[kVec];
    acc_t xhat[kVec];
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      g[k] = static_cast<acc_t>(grad_out.val[k]) * static_cast<acc_t>(weight_at(k));
      xhat[k] = static_cast<acc_t>(x.val[k]) * rstd;
    }
    rounded_pairs<scalar_t>(g);
    rounded_pairs<scalar_t>(xhat);
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      const acc_t xk = static_cast<acc_t>(x.val[k]);
      out.val[k] = static_cast<scalar_t>(rstd * g[k] - xk * x_coeff);
      dw[k] += static_cast<acc_t>(grad_out.val[k]) * xhat[k];
    }
  } else {
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      const acc_t xk = static_cast<acc_t>(x.val[k]);
      const acc_t gok = static_cast<acc_t>(grad_out.val[k]);
      const acc_t wk = has_weight ? static_cast<acc_t>(weight_at(k)) : acc_t(1);
      out.val[k] = static_cast<scalar_t>(
          grad_x_value<kCasting, scalar_t>(gok, wk, xk, rstd, x_coeff, offset));
      dw[k] += grad_weight_term<kCasting, scalar_t>(gok, xk, rstd);
    }
  }
  return out;
}

// A thread's grad_weight accumulator of the vector kernels: element k of its vector i.
template <int kVectorsPerThread, int kVec, typename acc_t>
__device__ __forceinline__ void zero_accumulator(acc_t (&dw)[kVectorsPerThread][kVec]) {
#pragma unroll
  for (int i = 0; i < kVectorsPerThread; ++i) {
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      dw[i][k] = 0;
    }
  }
}

// The accumulator's vectors idx = threadIdx.x + i * stride < num_vectors into `partial`: a
// partial row (out_t = acc_t), or grad_weight itself (the weight's dtype).
template <int kVectorsPerThread, int kVec, typename acc_t, typename out_t>
__device__ __forceinline__ void store_partial_vectors(AlignedVector<out_t, kVec>* partial,
                                                      const acc_t (&dw)[kVectorsPerThread][kVec],
                                                      int stride, int num_vectors) {
#pragma unroll
  for (int i = 0; i < kVectorsPerThread; ++i) {
    const int idx = threadIdx.x + i * stride;
    if (idx < num_vectors) {
      AlignedVector<out_t, kVec> out;
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        out.val[k] = static_cast<out_t>(dw[i][k]);
      }
      partial[idx] = out;
    }
  }
}

// Four 16-byte vectors a thread on up to 512 threads (bfloat16 rows up to H = 16384), a
// variant built for 512 threads so that its 4 vectors of x, of grad_out and of the
// grad_weight accumulator stay in registers (two vectors on 1024 threads, at most 64
// registers each, spilled: 77% of copy bandwidth at H = 16384 on an H100). Shorter rows
// take the same variant on fewer threads (a warp or less from 1024 bfloat16 elements
// down, several rows a block): on an H200 that was 7-16 % faster at H = 512-8192 than one
// vector a thread on up to 1024 threads with two rows a step, and two vectors a thread
// were slower than either (benchmarks/NOTES.md, run 67). Longer rows take the staged,
// scalar or generic kernels.
constexpr int kBackwardVectors = 4;
constexpr int kBackwardMaxThreads = 512;
constexpr RowKernelLimits kBackwardLimits{/*max_vectors_per_thread=*/kBackwardVectors,
                                          /*target_threads=*/kBackwardMaxThreads,
                                          /*max_threads=*/kBackwardMaxThreads,
                                          /*min_vectors_per_thread=*/kBackwardVectors};

// bfloat16 and float32 rows of up to this many threads (bfloat16 up to H = 2048, float32 up to
// 1024) load their next row's x and grad_out before they sum this one (kLoadAhead), so a block
// always has loads in flight, as the Triton backward's prefetch does. Its blocks, of at most 128
// threads, take up to 166 registers, so 3 blocks of 128 threads fit an SM instead of 4.
// Forward+backward on an H100, % of copy bandwidth, against main's wheel in alternating
// processes (runs O13-O15): bfloat16 H = 512 94.1 -> 94.9, 1000 91.9 -> 93.6, 1024 93.7 ->
// 95.1, 2048 92.9 -> 94.0; llama and gemma casting +0.3 to +1.2 but llama at 2048 even;
// float32 1024 +0.6-0.7. float16 lost 0.3-0.5 at 512-2048 in every casting measured (the
// cause is not known) and keeps the kernel as it was; so does float64 (not measured). With
// 128 threads a row it lost too: bfloat16 4096 94.0 -> 93.6, and 8192 (one block of 256
// threads an SM) 94.7 -> 82.2. Bounded to 128 registers (two 256-thread blocks) it spilled:
// 76-79 %. On an H200 the rows it takes read 4.4-5.4 points lower with it (bfloat16
// forward+backward at 512-2048: 85.6-88.7 % in run 109, 90.7-93.9 in run 100 before it; the
// forward and every wider row within 0.7 of each other), so it is taken only where memory is
// slow for an SM (memory_is_slow_for_an_sm: the H100, not the H200).
constexpr int kLoadAheadMaxThreadsPerRow = 64;
constexpr int kLoadAheadMaxThreads = kThreadsForShortRows;
template <typename scalar_t>
constexpr bool kLoadsAhead = std::is_same_v<scalar_t, BFloat16> || std::is_same_v<scalar_t, float>;
static_assert(kLoadAheadMaxThreadsPerRow <= kLoadAheadMaxThreads);

// Rows of kWarpSize to kManyRowsMaxThreads threads may share a block (kManyRows, chosen by
// rows_a_block): one block an SM holds the rows of several, with one partial row of grad_weight
// for all of them.
constexpr int kManyRowsMaxThreads = 128;

// The grid only fills the GPU once (every row slot holds a grad_weight accumulator in
// registers), rows strided over it. A grid of one block writes grad_weight itself (given
// grad_weight, no weight_partials).
template <typename scalar_t, Casting kCasting, bool kLoadAhead, bool kManyRows>
__global__ void __launch_bounds__(kLoadAhead ? kLoadAheadMaxThreads : kBackwardMaxThreads)
    rms_norm_backward_vector_kernel(const scalar_t* grad_out, const scalar_t* __restrict__ x,
                                    const scalar_t* __restrict__ weight, scalar_t* grad_x,
                                    acc_type<scalar_t>* __restrict__ weight_partials, int64_t rows,
                                    int64_t hidden, acc_type<scalar_t> eps,
                                    acc_type<scalar_t> offset, scalar_t* __restrict__ grad_weight) {
  constexpr int kVectorsPerThread = kBackwardVectors;
  using acc_t = acc_type<scalar_t>;
  constexpr int kVec = vector_size<scalar_t>();
  using Vec = AlignedVector<scalar_t, kVec>;
  using AccVec = AlignedVector<acc_t, kVec>;
  const acc_t inv_hidden = acc_t(1) / static_cast<acc_t>(hidden);
  const int64_t row_slots = static_cast<int64_t>(gridDim.x) * blockDim.y;
  const int num_vectors = static_cast<int>(hidden / kVec);
  const Vec* weight_vec = reinterpret_cast<const Vec*>(weight);
  // Launched as a dependent: nothing global is touched before this (dependent_launch.cuh).
  wait_for_prior_grids();
  allow_dependent_grids();

  acc_t dw[kVectorsPerThread][kVec];
  zero_accumulator(dw);

  // Not block_rows: with it nvcc compiles this kernel to other instructions. The loop bound is
  // the same for the whole block; rows past the end are masked.
  // x and grad_out of `row` (none past the end) into xv and gov.
  const auto load_row = [&](Vec(&xv)[kVectorsPerThread], Vec(&gov)[kVectorsPerThread],
                            int64_t row) {
    load_vector_pairs(xv, reinterpret_cast<const Vec*>(x + row * hidden), gov,
                      reinterpret_cast<const Vec*>(grad_out + row * hidden), /*row_valid=*/true,
                      row < rows ? num_vectors : 0);
  };
  Vec ahead_x[kLoadAhead ? kVectorsPerThread : 1];
  Vec ahead_go[kLoadAhead ? kVectorsPerThread : 1];
  if constexpr (kLoadAhead) {
    load_row(ahead_x, ahead_go, static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y);
  }
  for (int64_t block_row = static_cast<int64_t>(blockIdx.x) * blockDim.y; block_row < rows;
       block_row += row_slots) {
    const int64_t row = block_row + threadIdx.y;
    const int row_vectors = row < rows ? num_vectors : 0;  // 0 for a row past the end
    Vec xv[kVectorsPerThread];
    Vec gov[kVectorsPerThread];
    acc_t sums[2] = {0, 0};  // sum(x^2) and sum(g * x)
    // The two loops over the row's vectors below are written out, not for_row_vectors: through
    // it nvcc allocated the load-ahead kernels' registers differently (sm_90), and those run
    // only on the H100, where that has not been timed (benchmarks/NOTES.md, run O71).
    if constexpr (kLoadAhead) {
#pragma unroll
      for (int i = 0; i < kVectorsPerThread; ++i) {
        xv[i] = ahead_x[i];
        gov[i] = ahead_go[i];
      }
      load_row(ahead_x, ahead_go, row + row_slots);
    } else {
      load_row(xv, gov, row);
    }
#pragma unroll
    for (int i = 0; i < kVectorsPerThread; ++i) {
      const int idx = threadIdx.x + i * blockDim.x;
      if (idx < row_vectors) {
        const Vec wv = weight_vector<kCasting>(weight_vec, idx);
        add_backward_sums<kCasting>(xv[i], gov[i], elements_of(wv),
                                    has_weight<kCasting>(weight_vec), sums, offset);
      }
    }
    row_sum<kManyRows>(sums);

    const acc_t rstd = row_rstd<kCasting>(sums[0], inv_hidden, eps);
    const acc_t x_coeff = grad_x_coefficient(rstd, sums[1], inv_hidden);
#pragma unroll
    for (int i = 0; i < kVectorsPerThread; ++i) {
      const int idx = threadIdx.x + i * blockDim.x;
      if (idx < row_vectors) {
        const Vec wv = weight_vector<kCasting>(weight_vec, idx);
        reinterpret_cast<Vec*>(grad_x + row * hidden)[idx] = backward_vector<kCasting>(
            xv[i], gov[i], elements_of(wv), has_weight<kCasting>(weight_vec), rstd, x_coeff, dw[i],
            offset);
      }
    }
  }

  if (weight_partials == nullptr && grad_weight == nullptr) {
    return;
  }
  // One partial row per block. Rows that share a block along threadIdx.y add their
  // accumulators in shared memory first, in a fixed order (deterministic).
  __shared__ acc_t
      block_dw[(kManyRows ? kManyRowsMaxThreads : kWarpSize) * kVectorsPerThread * kVec];
  if (blockDim.y > 1) {
    for (int y = 0; y < static_cast<int>(blockDim.y); ++y) {
      if (threadIdx.y == y) {
        for_row_vectors<kVectorsPerThread>(blockDim.x, true, num_vectors, [&](int i, int idx) {
#pragma unroll
          for (int k = 0; k < kVec; ++k) {
            acc_t& slot = block_dw[idx * kVec + k];
            slot = (y == 0 ? acc_t(0) : slot) + dw[i][k];
          }
        });
      }
      __syncthreads();
    }
    if (threadIdx.y != 0) {
      return;
    }
    for_row_vectors<kVectorsPerThread>(blockDim.x, true, num_vectors, [&](int i, int idx) {
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        dw[i][k] = block_dw[idx * kVec + k];
      }
    });
  }
  if (grad_weight != nullptr) {
    store_partial_vectors(reinterpret_cast<Vec*>(grad_weight), dw, blockDim.x, num_vectors);
  } else {
    store_partial_vectors(reinterpret_cast<AccVec*>(weight_partials + blockIdx.x * hidden), dw,
                          blockDim.x, num_vectors);
  }
}

// The weight's vector idx, or an unset one without a weight, read again: nvcc may not take it
// for an earlier read of the same vector (and keep what was computed from that one).
template <Casting kCasting, typename Vec>
__device__ __forceinline__ Vec weight_vector_read_again(const Vec* weight_vec, int idx) {
  static_assert(sizeof(Vec) == kVectorBytes, "one 16-byte vector");
  Vec wv;
  if (has_weight<kCasting>(weight_vec)) {
    uint32_t w0, w1, w2, w3;
    asm volatile("ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(w0), "=r"(w1), "=r"(w2), "=r"(w3)
                 : "l"(weight_vec + idx));
    wv = bit_copy<Vec>(make_uint4(w0, w1, w2, w3));
  }
  return wv;
}

// The backward of 16-bit rows of exactly kThreads x kVectorsPerThread vectors, kBlocksPerSm
// blocks an SM looping over rows: x and grad_out read once into registers, and the grad_weight
// accumulator (a float per column, the block's partial row) in shared memory, where the vector
// kernel keeps it in registers. Each thread owns its columns' slots, element-major in 16-byte
// chunks (thread t's chunk c at accumulator[c * kThreads + t]) so that a warp's accesses are
// consecutive and no barrier guards them. Freed of the accumulator, a thread holds the row's
// vectors in fewer registers, and the SM holds more of its bytes in flight, which an H200's
// memory needs. The widest rows are split over a cluster of kCluster blocks, each holding its
// part of the row and its columns' accumulator, the row sums exchanged through distributed
// shared memory (cluster_sum), one partial row a cluster. bfloat16 on an H200, % of copy,
// backward op / forward+backward, the kernels before it -> this one, torch's casting
// (benchmarks/NOTES.md, runs O61-O65, alternating processes, two rounds within 0.2; before it,
// 12288 and 32768 took a kernel that read the row twice from L2: 75.6 / 83.6 and 69.4 / 78.7 in
// run O61):
//   H = 12288 on two blocks of 384 x 4 (80 registers)      71.4 / 80.5 -> 90.5 / 94.1
//       16384 on two of 256 x 8 (128)                        80.8 / 87.0 -> 88.5 / 92.4
//       32768 over clusters of two of 256 x 8 (two an SM)    66.7 / 75.9 -> 75.2 / 83.0
//       65536 over clusters of four of 256 x 8               57.3 / 62.8 -> 69.8 / 71.0
// (32768 and 65536: run O65, where 32768 on one block of 1024 x 4, unsplit (64 registers, 40
// bytes spilled), read 69.9-70.6 / 78.4-79.0; it had read 67.0 / 75.9 -> 72.1 / 79.9 in O63).
// Split otherwise, they lost: 32768 over two blocks of 512 x 4 (two an SM, 64 registers) 71.9 /
// 80.2 and over four of 256 x 4 (four an SM) 67.5 / 77.2, 65536 over four of 512 x 4 68.0 /
// 70.0; in Llama's and Gemma's casting, 32768 over two of 256 x 8 spills 108-112 bytes (Llama's
// forward+backward 75.3 -> 68.5, Gemma's 76.0 -> 67.9) and 16384 over two of 256 x 4, four
// an SM, lost too (83.6 -> 63.6, 86.5 -> 47.6). On three of 256 x 4 an SM (80 registers, no
// spill) they gain (run O68, two rounds): Llama's 16384 over two 84.0 -> 85.5, 32768 over four
// 75.4 -> 79.9, 65536 over eight 63.4 -> 68.4, Gemma's 32768 76.0 -> 81.7 and 65536 64.2 ->
// 69.2, but Gemma's 16384 over two lost (86.7 -> 82.2); one block of 512 x 4 an SM over two or
// four lost (run O67: 73.3 at 32768, 61.7 at 65536). And 12288 in Llama's casting 67.4
// / 77.5 -> 83.8 / 90.2, in Gemma's 70.6 / 79.9 -> 90.2 / 94.0 (run O63). In those two castings
// 16384 on one block of 512 x 4 lost (Llama's 76.3 / 83.9 -> 73.0 / 81.5, Gemma's 80.1 / 86.7
// -> 77.9 / 84.8), and 32768 on one of 1024 x 4 spills 96-236 bytes (Llama's forward+backward fell
// to 24 % when it spilled 586), so they keep the vector and staged kernels there. float16 in
// torch's casting, forward+backward: 81.9 -> 94.6, 88.2 -> 92.3, 76.1 -> 78.6 (run O64). Other
// shapes lost to these in torch's casting: 12288 on two blocks of 768 x 2 (40 registers) 84.2
// / 90.0, of 512 x 3 (64, spilling 12 bytes) 80.3 / 86.7, on one of 384 x 4 76.0 / 83.6 and of 512
// x 3 75.5 / 83.4; 16384 on one of 512 x 4 83.1 / 88.5, on two (64, spilling 40) 81.9 / 87.4 and on
// one of 1024 x 2 78.0 / 85.0; 32768 on one of 512 x 8 (128) 69.4 / 78.3. At 8192 (two of 512 x 2)
// it lost to the vector kernel, 85.4 / 90.8 -> 83.0 / 89.5. Loading the next row's vectors before
// the sums, as the vector kernel's kLoadAhead does, lost 3-10 points at every shape (12288 on one
// block of 768 x 2: 72.1 / 80.9).
template <typename scalar_t, Casting kCasting, int kThreads, int kVectorsPerThread,
          int kBlocksPerSm, int kCluster>
__global__ void __launch_bounds__(kThreads, kBlocksPerSm)
    rms_norm_backward_shared_dw_kernel(const scalar_t* grad_out, const scalar_t* __restrict__ x,
                                       const scalar_t* __restrict__ weight, scalar_t* grad_x,
                                       acc_type<scalar_t>* __restrict__ weight_partials,
                                       int64_t rows, acc_type<scalar_t> eps,
                                       acc_type<scalar_t> offset) {
  using acc_t = acc_type<scalar_t>;
  constexpr int kVec = vector_size<scalar_t>();
  using Vec = AlignedVector<scalar_t, kVec>;
  constexpr int kChunk = kVectorBytes / static_cast<int>(sizeof(acc_t));
  constexpr int kChunks = kVec / kChunk;
  using Chunk = AlignedVector<acc_t, kChunk>;
  constexpr int kPartVectors = kThreads * kVectorsPerThread;
  constexpr int kRowVectors = kPartVectors * kCluster;
  constexpr acc_t kInvHidden = acc_t(1) / static_cast<acc_t>(kRowVectors * kVec);
  extern __shared__ __align__(16) unsigned char shared_bytes[];
  Chunk* accumulator = reinterpret_cast<Chunk*>(shared_bytes);
  // Block b takes part b % kCluster of its cluster's rows (as row_part orders them), in the
  // forms below: with part's fields the unsplit kernels' SASS changed.
  const int first_vector = static_cast<int>(blockIdx.x % kCluster) * kPartVectors;
  const Vec* weight_vec = reinterpret_cast<const Vec*>(weight);
  if (kCluster > 1 && weight_vec != nullptr) {
    weight_vec += first_vector;
  }
  wait_for_prior_grids();
  allow_dependent_grids();

  const bool has_partials = weight_partials != nullptr;
  if (has_partials) {
#pragma unroll
    for (int c = 0; c < kVectorsPerThread * kChunks; ++c) {
      Chunk zero;
#pragma unroll
      for (int k = 0; k < kChunk; ++k) {
        zero.val[k] = 0;
      }
      accumulator[c * kThreads + threadIdx.x] = zero;
    }
  }
  int parity = 0;
  for (int64_t row = blockIdx.x / kCluster; row < rows; row += gridDim.x / kCluster, parity ^= 1) {
    const int64_t first = row * kRowVectors + first_vector;
    const Vec* x_row = reinterpret_cast<const Vec*>(x) + first;
    const Vec* grad_out_row = reinterpret_cast<const Vec*>(grad_out) + first;
    Vec* grad_x_row = reinterpret_cast<Vec*>(grad_x) + first;
    Vec xv[kVectorsPerThread];
    Vec gov[kVectorsPerThread];
#pragma unroll
    for (int i = 0; i < kVectorsPerThread; ++i) {
      xv[i] = x_row[threadIdx.x + i * kThreads];
      gov[i] = grad_out_row[threadIdx.x + i * kThreads];
    }
    acc_t sums[2] = {0, 0};  // sum(x^2) and sum(g * x)
#pragma unroll
    for (int i = 0; i < kVectorsPerThread; ++i) {
      const Vec wv = weight_vector<kCasting>(weight_vec, threadIdx.x + i * kThreads);
      add_backward_sums<kCasting>(xv[i], gov[i], elements_of(wv), has_weight<kCasting>(weight_vec),
                                  sums, offset);
    }
    row_sum(sums);
    if constexpr (kCluster > 1) {
      // Declared here, where only a split row needs it: a block's static shared memory would
      // otherwise move the accumulator's, and change the unsplit kernels' code.
      __shared__ acc_t exchange[2][2];
      cluster_sum<kCluster>(sums, exchange, parity);
    }
    const acc_t rstd = row_rstd<kCasting>(sums[0], kInvHidden, eps);
    const acc_t x_coeff = grad_x_coefficient(rstd, sums[1], kInvHidden);
#pragma unroll
    for (int i = 0; i < kVectorsPerThread; ++i) {
      const int idx = threadIdx.x + i * kThreads;
      // In Llama's and Gemma's casting nvcc otherwise keeps g = grad_out * weight (rounded)
      // of every vector from the sums for this pass, and spills: 224-292 bytes at 384 x 4
      // on two blocks (bfloat16) instead of none, and forward+backward at 12288 ran at 43-47 %
      // of copy instead of 90-94 (runs O62-O63). In torch's casting reading it again made
      // 256 x 8 spill 70 bytes instead of none.
      const Vec wv = kCasting == Casting::kTorch
                         ? weight_vector<kCasting>(weight_vec, idx)
                         : weight_vector_read_again<kCasting>(weight_vec, idx);
      acc_t dw[kVec];
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        dw[k] = 0;
      }
      grad_x_row[idx] =
          backward_vector<kCasting>(xv[i], gov[i], elements_of(wv),
                                    has_weight<kCasting>(weight_vec), rstd, x_coeff, dw, offset);
      if (has_partials) {
#pragma unroll
        for (int c = 0; c < kChunks; ++c) {
          Chunk& slot = accumulator[(i * kChunks + c) * kThreads + threadIdx.x];
          Chunk sum = slot;
#pragma unroll
          for (int k = 0; k < kChunk; ++k) {
            sum.val[k] += dw[c * kChunk + k];
          }
          slot = sum;
        }
      }
    }
  }
  leave_cluster<kCluster>();
  if (!has_partials) {
    return;
  }
  // One partial row per cluster, each block writing its columns.
  Chunk* partial = reinterpret_cast<Chunk*>(weight_partials) +
                   static_cast<int64_t>(blockIdx.x / kCluster) * kRowVectors * kChunks +
                   first_vector * kChunks;
#pragma unroll
  for (int i = 0; i < kVectorsPerThread; ++i) {
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      partial[(threadIdx.x + i * kThreads) * kChunks + c] =
          accumulator[(i * kChunks + c) * kThreads + threadIdx.x];
    }
  }
}

// The casting modes a shape of rms_norm_backward_shared_dw_kernel serves, as a set of bits.
constexpr unsigned casting_bit(Casting casting) { return 1u << static_cast<int>(casting); }
constexpr unsigned kTorchCasting = casting_bit(Casting::kTorch);
constexpr unsigned kLlamaCasting = casting_bit(Casting::kLlama);
constexpr unsigned kLlamaAndGemmaCastings = kLlamaCasting | casting_bit(Casting::kGemma);
constexpr unsigned kEveryCasting = kTorchCasting | kLlamaAndGemmaCastings;

// rms_norm_backward_shared_dw_kernel's shapes (measured above): a row over kCluster blocks of
// kThreads x kVectorsPerThread vectors, kBlocksPerSm blocks an SM, for the castings in
// kCastings. Llama's and Gemma's casting keep g from the sums for the grad_x pass and spill at 8
// vectors a thread (or 4 on 64 registers), so their rows of 16384-65536 take 4 vectors on three
// blocks of 256 an SM (80 registers), over clusters of two, four and eight; at 16384 Gemma's
// keeps the vector kernel (run O68: 86.7 -> 82.2 over two, where Llama's gains 84.0 -> 85.5).
// Torch's casting lost on those shapes (run O69: 32768 84.9 -> 83.4, 65536 76.6 -> 76.2).
template <int kThreadsValue, int kVectorsPerThreadValue, int kBlocksPerSmValue,
          unsigned kCastingsValue, int kClusterValue = 1>
struct SharedDwShape {
  static constexpr int kThreads = kThreadsValue;
  static constexpr int kVectorsPerThread = kVectorsPerThreadValue;
  static constexpr int kBlocksPerSm = kBlocksPerSmValue;
  static constexpr unsigned kCastings = kCastingsValue;
  static constexpr int kCluster = kClusterValue;
};
constexpr std::tuple<
    SharedDwShape<384, 4, 2, kEveryCasting>, SharedDwShape<256, 8, 2, kTorchCasting>,
    SharedDwShape<256, 8, 2, kTorchCasting, 2>, SharedDwShape<256, 8, 2, kTorchCasting, 4>,
    SharedDwShape<256, 4, 3, kLlamaCasting, 2>, SharedDwShape<256, 4, 3, kLlamaAndGemmaCastings, 4>,
    SharedDwShape<256, 4, 3, kLlamaAndGemmaCastings, 8>>
    kSharedDwShapes;

// Aligned rows longer than the vector kernels take: x and grad_out of the row staged in
// shared memory (common/staged_rows.cuh), the grad_weight accumulator of this thread's
// kVectorsPerThread vectors in registers, one partial row per block as in the vector
// kernel.
//
// Rows split over a cluster take kBackwardSplitCluster blocks of kBackwardSplitVectors
// vectors a thread where that covers them (bfloat16 up to H = 65536, float32 up to 32768),
// bounded to two blocks an SM (kMinBlocksPerSm = 2: at most 64 registers a thread; the
// bfloat16 kernel spills 68 bytes). Split over two blocks of 8 vectors a thread, a block
// takes 128 registers, so one 512-thread block fills an SM: 16 warps, and while the block
// reduces a row its SM has no loads in flight (bfloat16, H = 65536 on an H100: 406 us,
// DRAM 59 %, 25 % of warps active; benchmarks/NOTES.md, run 48). Two blocks of 64 KB an
// SM, 32 warps: the backward took 383 us instead of 414 (run K1, one process,
// interleaved). Other ways to a second row an SM lost there: 8 vectors on 256 threads, two
// blocks an SM (433 us); clusters of 8, four blocks an SM (256 threads and 4 vectors:
// 404 us; 128 threads and 8 vectors: 450 us). The other instantiations keep
// kMinBlocksPerSm = 0, no bound: an explicit bound of one block changed their SASS.
constexpr int kBackwardStagedMaxVectors = 16;
constexpr int kBackwardSplitCluster = 4;
constexpr int kBackwardSplitVectors = 4;

template <typename scalar_t, Casting kCasting, int kVectorsPerThread, int kCluster,
          int kMinBlocksPerSm = 0>
__global__ void __launch_bounds__(kStagedThreads, kMinBlocksPerSm)
    rms_norm_backward_staged_kernel(const scalar_t* grad_out, const scalar_t* __restrict__ x,
                                    const scalar_t* __restrict__ weight, scalar_t* grad_x,
                                    acc_type<scalar_t>* __restrict__ weight_partials, int64_t rows,
                                    int64_t hidden, acc_type<scalar_t> eps,
                                    acc_type<scalar_t> offset) {
  using acc_t = acc_type<scalar_t>;
  constexpr int kVec = vector_size<scalar_t>();
  using Vec = AlignedVector<scalar_t, kVec>;
  using AccVec = AlignedVector<acc_t, kVec>;
  __shared__ acc_t exchange[2][2];
  const RowPart part = row_part<kCluster>(static_cast<int>(hidden / kVec));
  Vec* staged_x = staged_rows<Vec>();
  Vec* staged_go = staged_x + part.num_vectors;
  const acc_t inv_hidden = acc_t(1) / static_cast<acc_t>(hidden);
  const Vec* weight_vec = weight != nullptr ? part_vectors<Vec>(weight, 0, hidden, part) : nullptr;

  acc_t dw[kVectorsPerThread][kVec];
  zero_accumulator(dw);
  if (part.first_row < rows) {
    stage_vectors<kStagedThreads>(staged_x, part_vectors<Vec>(x, part.first_row, hidden, part),
                                  part.num_vectors);
    stage_vectors<kStagedThreads>(
        staged_go, part_vectors<Vec>(grad_out, part.first_row, hidden, part), part.num_vectors);
  }
  int parity = 0;
  for (int64_t row = part.first_row; row < rows; row += part.row_step, parity ^= 1) {
    wait_for_staged_vectors();
    acc_t sums[2] = {0, 0};  // sum(x^2), sum(g * x)
    for_row_vectors<kVectorsPerThread>(kStagedThreads, true, part.num_vectors, [&](int, int idx) {
      const Vec xv = staged_x[idx];
      const Vec gov = staged_go[idx];
      add_backward_sums<kCasting>(xv, gov, elements_of(weight_vec, idx),
                                  has_weight<kCasting>(weight_vec), sums, offset);
    });
    row_sum(sums);
    cluster_sum<kCluster>(sums, exchange, parity);
    const acc_t rstd = row_rstd<kCasting>(sums[0], inv_hidden, eps);
    const acc_t x_coeff = grad_x_coefficient(rstd, sums[1], inv_hidden);
    Vec* gx_part = part_vectors<Vec>(grad_x, row, hidden, part);
    const int64_t next = next_staged_row(part, row, rows);
    const Vec* x_next = part_vectors<Vec>(x, next, hidden, part);
    const Vec* go_next = part_vectors<Vec>(grad_out, next, hidden, part);
    for_row_vectors<kVectorsPerThread>(kStagedThreads, true, part.num_vectors, [&](int i, int idx) {
      const Vec xv = staged_x[idx];
      const Vec gov = staged_go[idx];
      gx_part[idx] =
          backward_vector<kCasting>(xv, gov, elements_of(weight_vec, idx),
                                    has_weight<kCasting>(weight_vec), rstd, x_coeff, dw[i], offset);
      // After the store, which needs both reads: the copies may not overtake them.
      if (next >= 0) {
        stage_vector(staged_x + idx, x_next + idx);
        stage_vector(staged_go + idx, go_next + idx);
      }
    });
  }
  leave_cluster<kCluster>();
  if (weight_partials == nullptr) {
    return;
  }
  // One partial row per cluster, each block writing its columns.
  store_partial_vectors(
      reinterpret_cast<AccVec*>(weight_partials + (blockIdx.x / kCluster) * hidden) +
          part.first_vector,
      dw, kStagedThreads, part.num_vectors);
}

// Span rows (see row_span) of the backward staged in shared memory: x and grad_out of the
// span copied with cp.async as the aligned staged kernel copies its rows, so no vector is
// held in registers across the row sum (16-bit span vectors in registers needed 78-122 of
// them: benchmarks/NOTES.md, runs 29-31), and each slot, once read by the second pass,
// takes the block's next row while this one is written. The grad_weight accumulator stays
// in registers; so does the weight's copy where the block is small enough (kWeightInRegisters,
// see kSpanWeightRegistersMaxThreads), else it is read again each pass. The grid is a
// multiple of kVec blocks (or one row a block: span_grid), so every row of a block sits at
// one offset from the vector boundary. It tests the weight at run time in every mode, not
// through has_weight: with it, nvcc scheduled kTorch's kernel differently (bfloat16, two
// vectors, weight not in registers: 1912 -> 1896 instructions), and H = 8193 forward+backward
// went from 0.535 to 0.640 ms on an H100 (runs 80-81), the fall 2f615c8 once caused here too.
// One vector a thread is bounded to 48 registers (kSpanOneVectorBoundThreads), from 49: a block
// more an SM where that fits (H = 1001: 10 blocks of 128 threads, from 9), and bfloat16 forward+
// backward on an H100 at H = 1001 85.3 -> 87.4 % of copy bandwidth, 1501 +0.4, 2047 +0.2, 2303
// even (run O11, one process). Two vectors lost 0-20 points at 48 or 40 registers (spills, O5).
// Its loops over a thread's vectors are written out: through for_row_vectors the one-vector
// kernels compiled to other code, and bfloat16 forward+backward at H = 2047 on an H200 went
// from 63.4 to 63.3 % of copy bandwidth in torch's casting and 62.4 to 62.2 in Gemma's (run
// O71, three rounds each, the ranges apart).
//
// kTwoRows: two slots a vector, so that the block's next row is copied while the whole of this
// one is worked on, not only while its grad_x is written (the cp.async wait held 29 % of the
// stall samples at H = 2047 on an H200, run 135). See kSpanTwoRowsMinVectors for where.
template <typename scalar_t, Casting kCasting, int kVectorsPerThread, bool kWeightInRegisters,
          bool kTwoRows>
__global__ void __launch_bounds__(kVectorsPerThread == 1 ? kSpanOneVectorBoundThreads
                                                         : kMaxThreadsPerBlock,
                                  kVectorsPerThread == 1 ? 2 : 0)
    rms_norm_backward_span_staged_kernel(const scalar_t* grad_out, const scalar_t* __restrict__ x,
                                         const scalar_t* __restrict__ weight_copies,
                                         scalar_t* grad_x,
                                         acc_type<scalar_t>* __restrict__ weight_partials,
                                         int64_t rows, int64_t hidden, int64_t span_vectors,
                                         acc_type<scalar_t> eps, acc_type<scalar_t> offset) {
  using acc_t = acc_type<scalar_t>;
  constexpr int kVec = vector_size<scalar_t>();
  using Vec = AlignedVector<scalar_t, kVec>;
  const int hidden_int = static_cast<int>(hidden);
  const acc_t inv_hidden = acc_t(1) / static_cast<acc_t>(hidden);
  const int lead = span_lead(x, blockIdx.x, hidden);
  const int num_vectors = span_vector_count<scalar_t>(lead, hidden);
  // Slot s of the block's rows: x's span vectors, then grad_out's.
  Vec* const staged = staged_rows<Vec>();
  int slot = 0;
  const auto staged_x_of = [&](int s) { return staged + s * 2 * span_vectors; };
  const Vec* weight_vec = span_weight<Vec>(weight_copies, lead, span_vectors);
  const SpanWeight<Vec, kVectorsPerThread, kWeightInRegisters> span_weight_vectors(weight_vec,
                                                                                   num_vectors);

  acc_t dw[kVectorsPerThread][kVec];
  zero_accumulator(dw);
  const auto stage = [&](int s, int64_t row, const RowSpan& span, int idx) {
    Vec* const into_x = staged_x_of(s);
    stage_span_vector(into_x + idx, x + row * hidden, span, idx, hidden_int);
    stage_span_vector(into_x + span_vectors + idx, grad_out + row * hidden, span, idx, hidden_int);
  };
  const auto stage_row = [&](int s, int64_t row) {
    const RowSpan span = row_span<scalar_t>(lead, row, rows, hidden);
#pragma unroll
    for (int i = 0; i < kVectorsPerThread; ++i) {
      const int idx = threadIdx.x + i * blockDim.x;
      if (idx < num_vectors) {
        stage(s, row, span, idx);
      }
    }
  };
  if (blockIdx.x < rows) {
    stage_row(0, blockIdx.x);
  }
  if constexpr (kTwoRows) {
    __pipeline_commit();
  }
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    if constexpr (kTwoRows) {
      // The next row's copies go out before this row's are waited for: of the two groups in
      // flight, this row's is the older.
      if (row + gridDim.x < rows) {
        stage_row(slot ^ 1, row + gridDim.x);
      }
      __pipeline_commit();
      __pipeline_wait_prior(1);
    } else {
      wait_for_staged_vectors();
    }
    const Vec* const staged_x = staged_x_of(slot);
    const Vec* const staged_go = staged_x + span_vectors;
    const RowSpan span = row_span<scalar_t>(lead, row, rows, hidden);
    acc_t sums[2] = {0, 0};  // sum(x^2), sum(g * x)
#pragma unroll
    for (int i = 0; i < kVectorsPerThread; ++i) {
      const int idx = threadIdx.x + i * blockDim.x;
      if (idx < num_vectors) {
        Vec xv = staged_x[idx];
        Vec gov = staged_go[idx];
        if (span.is_edge(idx)) {
          const unsigned own = own_elements<kVec>(idx * kVec - span.lead, hidden_int);
          keep_own_elements(xv, own);
          keep_own_elements(gov, own);
        }
        const Vec wv = span_weight_vectors.get(i, idx);
#pragma unroll
        for (int k = 0; k < kVec; ++k) {
          add_element_sums<kCasting, scalar_t>(
              static_cast<acc_t>(xv.val[k]), static_cast<acc_t>(gov.val[k]),
              [&] { return wv.val[k]; }, weight_vec != nullptr, sums, offset);
        }
      }
    }
    // Span rows have at least kSpanMinHidden elements, so whole warps. Unrolled with one
    // vector a thread; with two, the unrolled exchanges spilled registers. With the edges'
    // masks (own_elements), bfloat16 at H = 2047 on an H200 ran 206.5 M instructions instead of
    // 230.7 M, and forward+backward went from 63.5 to 67.5 % of copy bandwidth (run O73).
    row_sum</*kManyRows=*/false, /*kWholeWarps=*/kVectorsPerThread == 1>(sums);
    const acc_t rstd = row_rstd<kCasting>(sums[0], inv_hidden, eps);
    const acc_t x_coeff = grad_x_coefficient(rstd, sums[1], inv_hidden);
    const int64_t next = row + gridDim.x;
    const RowSpan next_span = row_span<scalar_t>(lead, next, rows, hidden);
#pragma unroll
    for (int i = 0; i < kVectorsPerThread; ++i) {
      const int idx = threadIdx.x + i * blockDim.x;
      if (idx < num_vectors) {
        // The neighbours' elements of an edge vector stay in: their outputs are not stored
        // and their grad_weight columns not kept.
        const Vec xv = staged_x[idx];
        const Vec gov = staged_go[idx];
        const Vec wv = span_weight_vectors.get(i, idx);
        Vec out;
#pragma unroll
        for (int k = 0; k < kVec; ++k) {
          const acc_t xk = static_cast<acc_t>(xv.val[k]);
          const acc_t gok = static_cast<acc_t>(gov.val[k]);
          const acc_t wk = weight_vec != nullptr ? static_cast<acc_t>(wv.val[k]) : acc_t(1);
          out.val[k] = static_cast<scalar_t>(
              grad_x_value<kCasting, scalar_t>(gok, wk, xk, rstd, x_coeff, offset));
          dw[i][k] += grad_weight_term<kCasting, scalar_t>(gok, xk, rstd);
        }
        store_span_vector(grad_x + row * hidden, span.lead, idx, hidden_int, out);
        // After the reads above: the copies may not overtake them.
        if (!kTwoRows && next < rows) {
          stage(slot, next, next_span, idx);
        }
      }
    }
    if constexpr (kTwoRows) {
      slot ^= 1;
    }
  }

  if (weight_partials != nullptr) {
    store_span_partials(weight_partials + blockIdx.x * hidden, dw, lead, num_vectors, hidden_int);
  }
}

// The backward of rms_norm_scalar_kernel: x and grad_out of the row in registers
// as scalars; the grad_weight accumulator too, or, for the fixed-thread variants
// whose accumulator fits in 48 KB, in shared memory (each thread only touches its
// own columns, so no barrier), which leaves registers for more rows per SM. Each
// row slot (slot = blockIdx.x * blockDim.y + threadIdx.y) writes its own partial
// row once at the end, every column of it, so the buffer needs no zeroing and no
// block-level reduction.
template <typename scalar_t, Casting kCasting, typename Rows>
__global__ void __launch_bounds__(Rows::kLaunchBound)
    rms_norm_backward_scalar_kernel(const scalar_t* grad_out, const scalar_t* __restrict__ x,
                                    const scalar_t* __restrict__ weight, scalar_t* grad_x,
                                    acc_type<scalar_t>* __restrict__ weight_partials, int64_t rows,
                                    int64_t hidden, acc_type<scalar_t> eps,
                                    acc_type<scalar_t> offset) {
  constexpr int kElemsPerThread = Rows::kElemsPerThread;
  using acc_t = acc_type<scalar_t>;
  constexpr int kFixedThreads = Rows::kFixedThreads;
  const int stride = scalar_stride<Rows>();
  // Element i of this thread is column threadIdx.x + i * stride of the row.
  const int own_columns = static_cast<int>(hidden) - static_cast<int>(threadIdx.x);
  const scalar_t* w_own = weight != nullptr ? weight + threadIdx.x : nullptr;
  const acc_t inv_hidden = acc_t(1) / static_cast<acc_t>(hidden);
  constexpr bool kSharedDw =
      kFixedThreads > 0 && kElemsPerThread * kFixedThreads * sizeof(acc_t) <= 48 * 1024;
  __shared__ acc_t dw_shared[kSharedDw ? kElemsPerThread * kFixedThreads : 1];
  acc_t dw_regs[kSharedDw ? 1 : kElemsPerThread];
  // Element i of this thread's grad_weight accumulator.
  auto dw = [&](int i) -> acc_t& {
    if constexpr (kSharedDw) {
      return dw_shared[threadIdx.x + i * kFixedThreads];
    } else {
      return dw_regs[i];
    }
  };
#pragma unroll
  for (int i = 0; i < kElemsPerThread; ++i) {
    dw(i) = 0;
  }
  for (const int64_t row : block_rows(rows)) {
    const int row_columns = row < rows ? own_columns : 0;  // masks rows past the end
    const int64_t own_offset = row * hidden + threadIdx.x;
    const scalar_t* x_own = x + own_offset;
    const scalar_t* go_own = grad_out + own_offset;
    scalar_t xv[kElemsPerThread];
    scalar_t gov[kElemsPerThread];
    acc_t sums[2] = {0, 0};  // sum(x^2), sum(g * x)
    load_scalar_pairs(xv, x_own, gov, go_own, stride, row_columns);
#pragma unroll
    // Not add_element_sums: with its two tests as one argument nvcc compiled torch's casting to
    // other instructions (2308 -> 2276 for float32 on 512 threads).
    for (int i = 0; i < kElemsPerThread; ++i) {
      const acc_t xi = static_cast<acc_t>(xv[i]);
      acc_t gi = static_cast<acc_t>(gov[i]);
      if (has_weight<kCasting>(w_own) && i * stride < row_columns) {
        gi = weighted_grad<kCasting, scalar_t>(gi, static_cast<acc_t>(w_own[i * stride]), offset);
      }
      sums[0] += xi * xi;
      sums[1] += gi * xi;
    }
    row_sum(sums);
    const acc_t rstd = row_rstd<kCasting>(sums[0], inv_hidden, eps);
    const acc_t x_coeff = grad_x_coefficient(rstd, sums[1], inv_hidden);
    scalar_t* gx_own = grad_x + own_offset;
#pragma unroll
    for (int i = 0; i < kElemsPerThread; ++i) {
      if (i * stride < row_columns) {
        const acc_t xi = static_cast<acc_t>(xv[i]);
        const acc_t goi = static_cast<acc_t>(gov[i]);
        const acc_t wi =
            has_weight<kCasting>(w_own) ? static_cast<acc_t>(w_own[i * stride]) : acc_t(1);
        gx_own[i * stride] = static_cast<scalar_t>(
            grad_x_value<kCasting, scalar_t>(goi, wi, xi, rstd, x_coeff, offset));
        dw(i) += grad_weight_term<kCasting, scalar_t>(goi, xi, rstd);
      }
    }
  }
  if (weight_partials == nullptr) {
    return;
  }
  const int64_t slot = static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y;
  acc_t* partial_own = weight_partials + slot * hidden + threadIdx.x;
#pragma unroll
  for (int i = 0; i < kElemsPerThread; ++i) {
    if (i * stride < own_columns) {
      partial_own[i * stride] = dw(i);
    }
  }
}

// Any hidden size and alignment. Each thread owns the columns j = threadIdx.x +
// n * blockDim.x of its row slot's partial row (slot = blockIdx.x * blockDim.y +
// threadIdx.y), so it accumulates there directly (the buffer starts zeroed)
// without any other thread touching those elements.
template <typename scalar_t, Casting kCasting>
__global__ void __launch_bounds__(kMaxThreadsPerBlock)
    rms_norm_backward_generic_kernel(const scalar_t* grad_out, const scalar_t* __restrict__ x,
                                     const scalar_t* __restrict__ weight, scalar_t* grad_x,
                                     acc_type<scalar_t>* __restrict__ weight_partials, int64_t rows,
                                     int64_t hidden, acc_type<scalar_t> eps,
                                     acc_type<scalar_t> offset) {
  using acc_t = acc_type<scalar_t>;
  const acc_t inv_hidden = acc_t(1) / static_cast<acc_t>(hidden);
  const int64_t slot = static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y;
  acc_t* partial_row = weight_partials != nullptr ? weight_partials + slot * hidden : nullptr;
  for (const int64_t row : block_rows(rows)) {
    const int64_t row_hidden = row < rows ? hidden : 0;  // masks rows past the end
    const scalar_t* x_row = x + row * hidden;
    const scalar_t* go_row = grad_out + row * hidden;
    acc_t sums[2] = {0, 0};  // sum(x^2), sum(g * x)
    for (int64_t j = threadIdx.x; j < row_hidden; j += blockDim.x) {
      add_element_sums<kCasting, scalar_t>(
          static_cast<acc_t>(x_row[j]), static_cast<acc_t>(go_row[j]), [&] { return weight[j]; },
          has_weight<kCasting>(weight), sums, offset);
    }
    row_sum(sums);
    const acc_t rstd = row_rstd<kCasting>(sums[0], inv_hidden, eps);
    const acc_t x_coeff = grad_x_coefficient(rstd, sums[1], inv_hidden);
    scalar_t* gx_row = grad_x + row * hidden;
    for (int64_t j = threadIdx.x; j < row_hidden; j += blockDim.x) {
      const acc_t xj = static_cast<acc_t>(x_row[j]);
      const acc_t goj = static_cast<acc_t>(go_row[j]);
      const acc_t wj = has_weight<kCasting>(weight) ? static_cast<acc_t>(weight[j]) : acc_t(1);
      gx_row[j] = static_cast<scalar_t>(
          grad_x_value<kCasting, scalar_t>(goj, wj, xj, rstd, x_coeff, offset));
      if (partial_row != nullptr) {
        partial_row[j] += grad_weight_term<kCasting, scalar_t>(goj, xj, rstd);
      }
    }
  }
}

// grad_weight[j] = sum over p of partials[p][j], rounded to the weight's dtype.
// Block (32, kRowGroups): threadIdx.x picks a column (coalesced reads along a partial
// row), threadIdx.y strides over the partial rows; shared memory finishes the sum.
// Each thread's sum is a chain of dependent adds, so its length sets the kernel's time: the
// 528 partial rows of the headline's backward took 5.6 us on an H100 with 8 row groups (66
// rows a chain) and 3.6 us with 32 (run 74). With few partial rows (wide rows: one a block
// and 132 blocks) 32 groups leave 4-5 rows a thread and ran 1-3 % slower than 8 (H = 32768
// and 65536, runs 75-77), so the launch takes 32 from kSumManyPartials rows on.
constexpr int kSumColumns = 32;
constexpr int64_t kSumManyPartials = 512;

template <typename scalar_t, int kRowGroups>
__global__ void sum_partials_kernel(const acc_type<scalar_t>* __restrict__ partials,
                                    scalar_t* __restrict__ grad_weight, int64_t num_partials,
                                    int64_t hidden) {
  using acc_t = acc_type<scalar_t>;
  wait_for_prior_grids();  // launched as a dependent of the kernel writing the partials
  __shared__ acc_t sums[kRowGroups][kSumColumns + 1];
  const int64_t col = static_cast<int64_t>(blockIdx.x) * kSumColumns + threadIdx.x;
  acc_t sum = 0;
  if (col < hidden) {
    for (int64_t p = threadIdx.y; p < num_partials; p += kRowGroups) {
      sum += partials[p * hidden + col];
    }
  }
  sums[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.y == 0 && col < hidden) {
    acc_t total = 0;
#pragma unroll
    for (int r = 0; r < kRowGroups; ++r) {
      total += sums[r][threadIdx.x];
    }
    grad_weight[col] = static_cast<scalar_t>(total);
  }
}

template <typename Kernel>
int64_t persistent_blocks(Kernel kernel, const RowLaunch& plan, int64_t rows) {
  // Rows for no more blocks than SMs take a block each whatever the occupancy, which the
  // runtime takes about 1 us to work out (benchmarks/NOTES.md, run 117).
  const int64_t row_groups = std::max<int64_t>(1, ceil_div(rows, plan.rows_per_block));
  if (row_groups <= num_sms()) {
    return row_groups;
  }
  int blocks_per_sm = 0;
  HOTLOOP_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
      &blocks_per_sm, kernel, plan.threads_per_row * plan.rows_per_block, 0));
  const int64_t full_gpu = static_cast<int64_t>(std::max(blocks_per_sm, 1)) * num_sms();
  return std::min(full_gpu, row_groups);
}

// Rows a block of the vector backward. Where memory is slow for an SM and a row of kWarpSize to
// kManyRowsMaxThreads threads fills every thread's vector slots (H = threads x kBackwardVectors
// vectors), rows share a block, as many as the SM holds blocks of one row (`kernel`'s occupancy),
// where they fill the kernel's bound exactly and there are rows for such a block on every SM; else
// the plan's. The rows of a block then move in lockstep through row_reduce's barriers, and that is
// where the gain is: a named barrier a row instead gave one row a block's figures back.
// Forward+backward on an H100, % of copy, in-process A/B (benchmarks/NOTES.md, runs O46-O50), torch
// / llama / gemma casting: float16 H = 4096 (four rows of 128 threads) 94.9 -> 95.8 / 94.6 -> 95.4
// / 94.8 -> 95.7, 2048 (eight of 64) 94.1 -> 95.7 / 93.8 -> 95.3 / 93.9 -> 95.7; bfloat16 4096 94.5
// -> 95.0-95.5 / 94.6 -> 94.1-94.3 / 94.6 -> 95.1-95.2, so bfloat16 in Llama's casting keeps one
// row a block (the launcher's kRowsMayShare). Five rows of 96 (3072, 480 threads) lost: bfloat16
// 95.1 -> 94.7 / 95.0 -> 93.0 / 95.2 -> 94.7. With idle slots the lockstep lost more (bfloat16 2560
// 95.3 -> 92.9, 3584 95.7 -> 94.6). Not with the load ahead: its bound, 128 threads, holds two rows
// of 64 where an SM holds six, and two rows a block there (bfloat16 2048) lost 1.4 points.
// float32's rows do not fill the bound (five or six blocks of 128 threads an SM). Not measured on
// an H200, whose memory is not slow for an SM.
template <typename Kernel>
int rows_a_block(Kernel kernel, const RowLaunch& plan, int64_t rows, int num_vectors,
                 bool load_ahead) {
  // The only row count that fills the bound; fewer rows than that many an SM would leave SMs
  // without a block that one row a block keeps busy (and need no occupancy query).
  const int filling_rows = kBackwardMaxThreads / plan.threads_per_row;
  if (plan.rows_per_block != 1 || plan.threads_per_row < kWarpSize ||
      plan.threads_per_row > kManyRowsMaxThreads ||
      filling_rows * plan.threads_per_row != kBackwardMaxThreads ||
      plan.threads_per_row * kBackwardVectors != num_vectors ||
      rows < static_cast<int64_t>(filling_rows) * num_sms() || load_ahead ||
      !memory_is_slow_for_an_sm()) {
    return plan.rows_per_block;
  }
  int blocks_per_sm = 0;
  HOTLOOP_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks_per_sm, kernel,
                                                                   plan.threads_per_row, 0));
  return blocks_per_sm == filling_rows ? filling_rows : plan.rows_per_block;
}

template <typename scalar_t, Casting kCasting>
void launch_rms_norm_backward(const scalar_t* grad_out, const scalar_t* x, const scalar_t* weight,
                              scalar_t* grad_x, scalar_t* grad_weight, int64_t rows, int64_t hidden,
                              double eps, double offset, const Tensor& like) {
  using acc_t = acc_type<scalar_t>;
  const bool aligned = is_vector_aligned(grad_out) && is_vector_aligned(x) &&
                       is_vector_aligned(grad_x) &&
                       (weight == nullptr || is_vector_aligned(weight));
  const RowLaunch plan = plan_row_launch(hidden, vector_size<scalar_t>(), aligned, kBackwardLimits);
  const cudaStream_t stream = current_stream();
  const acc_t eps_acc = static_cast<acc_t>(eps);
  const acc_t offset_acc = static_cast<acc_t>(offset);
  const ScalarType acc_dtype = acc_dtype_of(like.scalar_type());

  // Runs `run(partials)`, the kernel given num_partials rows of float32 (float64)
  // partial sums of grad_weight (nullptr without a weight), then sums them into grad_weight.
  // With none (num_partials == 0), the kernel writes grad_weight itself.
  auto with_partials = [&](int64_t num_partials, bool zeroed, auto&& run) {
    std::optional<Tensor> partials;
    acc_t* partials_ptr = nullptr;
    if (weight != nullptr && num_partials > 0) {
      partials = zeroed ? zeros_on(like, {num_partials, hidden}, acc_dtype)
                        : empty_on(like, {num_partials, hidden}, acc_dtype);
      partials_ptr = mutable_data<acc_t>(*partials);
    }
    run(partials_ptr);
    if (partials_ptr != nullptr) {
      const dim3 sum_grid(static_cast<unsigned>(ceil_div(hidden, kSumColumns)));
      if (num_partials >= kSumManyPartials) {
        launch_dependent(sum_partials_kernel<scalar_t, 32>, sum_grid, dim3(kSumColumns, 32), stream,
                         partials_ptr, grad_weight, num_partials, hidden);
      } else {
        launch_dependent(sum_partials_kernel<scalar_t, 8>, sum_grid, dim3(kSumColumns, 8), stream,
                         partials_ptr, grad_weight, num_partials, hidden);
      }
    }
  };
  // The scalar kernels write one partial row per row slot, overwriting it; the generic
  // kernel accumulates into one per row slot, which must start at zero.
  enum class Partials { kPerSlot, kPerSlotZeroed };
  auto launch = [&](auto kernel, const RowLaunch& launch_plan, Partials kind) {
    const int64_t blocks = persistent_blocks(kernel, launch_plan, rows);
    const int64_t num_partials = blocks * launch_plan.rows_per_block;
    with_partials(num_partials, kind == Partials::kPerSlotZeroed, [&](acc_t* partials_ptr) {
      kernel<<<dim3(static_cast<unsigned>(blocks)), launch_plan.block(), 0, stream>>>(
          grad_out, x, weight, grad_x, partials_ptr, rows, hidden, eps_acc, offset_acc);
      HOTLOOP_KERNEL_LAUNCH_CHECK();
    });
  };

  if constexpr (sizeof(scalar_t) == 2) {
    // rms_norm_backward_shared_dw_kernel at its widths and castings (above), where memory is fast
    // for an SM (memory_is_slow_for_an_sm: an H200, not an H100, where it was not measured) and
    // every block (cluster) takes at least two rows (fewer take the vector kernel, which writes
    // grad_weight itself for decode sizes).
    const auto shared_dw = [&](auto shape) {
      using Shape = decltype(shape);
      if constexpr ((Shape::kCastings & casting_bit(kCasting)) != 0) {
        // The width first: other widths (decode-sized calls among them) pay one comparison a
        // shape, not the device queries below.
        constexpr int64_t kPartElements =
            int64_t{Shape::kThreads} * Shape::kVectorsPerThread * vector_size<scalar_t>();
        if (hidden != kPartElements * Shape::kCluster || !aligned || memory_is_slow_for_an_sm() ||
            (Shape::kCluster > 1 && compute_capability_major() < 9)) {
          return false;
        }
        const int64_t bytes = kPartElements * static_cast<int64_t>(sizeof(acc_t));
        // A block's accumulator (48-64 KB) must fit the device's shared memory: so far GPUs
        // whose memory is fast for an SM have Hopper's 227 KB; one with less takes the others.
        const int64_t clusters = int64_t{Shape::kBlocksPerSm} * num_sms() / Shape::kCluster;
        if (bytes > staged_bytes_limit() || rows < 2 * clusters) {
          return false;
        }
        const auto kernel =
            rms_norm_backward_shared_dw_kernel<scalar_t, kCasting, Shape::kThreads,
                                               Shape::kVectorsPerThread, Shape::kBlocksPerSm,
                                               Shape::kCluster>;
        if constexpr (Shape::kCluster == 1) {
          allow_dynamic_shared_memory(kernel, bytes);
          with_partials(clusters, /*zeroed=*/false, [&](acc_t* partials_ptr) {
            launch_dependent_with_shared_memory(
                kernel, dim3(static_cast<unsigned>(clusters)), dim3(Shape::kThreads), bytes, stream,
                grad_out, x, weight, grad_x, partials_ptr, rows, eps_acc, offset_acc);
          });
        } else {
          // As many clusters as fit at once (cudaOccupancyMaxActiveClusters), each taking
          // at least two rows as the check above asked of the clusters an SM count gives.
          const StagedLaunch staged =
              plan_staged_launch(kernel, Shape::kCluster, Shape::kThreads, bytes, rows);
          with_partials(staged.clusters, /*zeroed=*/false, [&](acc_t* partials_ptr) {
            launch_staged(staged, stream, kernel, grad_out, x, weight, grad_x, partials_ptr, rows,
                          eps_acc, offset_acc);
          });
        }
        return true;
      }
      return false;
    };
    if (std::apply([&](auto... shapes) { return (shared_dw(shapes) || ...); }, kSharedDwShapes)) {
      return;
    }
  }
  const bool vector_launched = launch_vector_rows<kBackwardVectors>(plan, [&](auto) {
    [[maybe_unused]] const bool load_ahead = kLoadsAhead<scalar_t> &&
                                             plan.threads_per_row <= kLoadAheadMaxThreadsPerRow &&
                                             memory_is_slow_for_an_sm();
    const auto kernel = [&] {
      if constexpr (kLoadsAhead<scalar_t>) {
        if (load_ahead) {
          return rms_norm_backward_vector_kernel<scalar_t, kCasting, true, false>;
        }
      }
      return rms_norm_backward_vector_kernel<scalar_t, kCasting, false, false>;
    }();
    // One block where the rows take at most two of its passes (decode-sized rows): it writes
    // grad_weight itself, which saves the partial rows' allocation and the sum's launch. On
    // an H100, bfloat16 (benchmarks/NOTES.md, runs 94 and O40): at (1, 4096) the op took
    // 14.0-21.4 us a call instead of 24.7-26.6, 0.92-0.94x aten's against 1.11-1.56x; at
    // (2, 4096) 12.5-14.4 instead of 18.8-20.2 (aten 16.3-23.0), its GPU time in a CUDA graph
    // 4.2 us instead of 4.3-4.4. Four passes took 6.9 us of GPU time instead of 4.5.
    constexpr int64_t kDirectPasses = 2;
    // Measured in 16 bits (float32's rows never fill the bound; float64 is not measured), where
    // bfloat16 in Llama's casting lost (rows_a_block).
    constexpr bool kRowsMayShare = sizeof(scalar_t) == 2 && !(std::is_same_v<scalar_t, BFloat16> &&
                                                              kCasting == Casting::kLlama);
    RowLaunch launch_plan = plan;
    if constexpr (kRowsMayShare) {
      launch_plan.rows_per_block = rows_a_block(
          kernel, plan, rows, static_cast<int>(hidden / vector_size<scalar_t>()), load_ahead);
    }
    const auto launched =
        launch_plan.rows_per_block > plan.rows_per_block
            ? rms_norm_backward_vector_kernel<scalar_t, kCasting, false, kRowsMayShare>
            : kernel;
    const int64_t blocks = ceil_div(rows, launch_plan.rows_per_block) <= kDirectPasses
                               ? 1
                               : persistent_blocks(launched, launch_plan, rows);
    const bool direct = blocks == 1;
    with_partials(direct ? 0 : blocks, /*zeroed=*/false, [&](acc_t* partials_ptr) {
      launch_dependent(launched, dim3(static_cast<unsigned>(blocks)), launch_plan.block(), stream,
                       grad_out, x, weight, grad_x, partials_ptr, rows, hidden, eps_acc, offset_acc,
                       direct ? grad_weight : nullptr);
    });
  });
  if (vector_launched) {
    return;
  }
  // Span rows (spans_line_up), staged in shared memory.
  if constexpr (kScalarRowsInRegisters<scalar_t>) {
    constexpr int kVec = vector_size<scalar_t>();
    const int64_t span_vectors = widest_span_vectors<scalar_t>(hidden);
    const RowLaunch span_plan = plan_row_launch(
        span_vectors * kVec, kVec, /*vector_ok=*/true,
        memory_is_slow_for_an_sm() ? kSpanStagedLimits : kSpanStagedFastMemoryLimits);
    // In place too (grad_x over grad_out): an edge vector's neighbour elements, which other
    // blocks may be writing, are staged but never used (zeroed in the sums, their grad_x and
    // grad_weight columns not stored). The out-of-place call takes this kernel, so the
    // in-place one must too: the scalar kernel sums in another order, and its grad_x then
    // differed from it by one rounding now and then (runs 89 and 92, benchmarks/NOTES.md).
    if (span_plan.vectors_per_thread != 0 &&
        spans_line_up<scalar_t>(hidden, {grad_out, x, grad_x})) {
      const std::optional<Tensor> copies = shifted_weight_copies(weight, hidden, stream, like);
      // (Where two rows' spans fit in a block's shared memory at all: an H200's 227 KB hold
      // 2048 vectors' four spans, a GPU with less may not.)
      const bool two_rows_may_pay = !memory_is_slow_for_an_sm() &&
                                    span_vectors > kSpanTwoRowsMinVectors &&
                                    4 * span_vectors * kVectorBytes <= staged_bytes_limit();
      const auto plan = [&](auto kernel, int rows_staged) {
        StagedLaunch staged =
            plan_staged_launch(kernel, /*cluster=*/1, span_plan.threads_per_row,
                               rows_staged * 2 * span_vectors * kVectorBytes, rows);
        staged.clusters = span_grid<scalar_t>(staged.clusters, rows);
        return staged;
      };
      const auto run = [&](const StagedLaunch& staged, auto kernel) {
        with_partials(staged.clusters, /*zeroed=*/false, [&](acc_t* partials_ptr) {
          launch_staged(staged, stream, kernel, grad_out, x,
                        copies ? const_data<scalar_t>(*copies) : nullptr, grad_x, partials_ptr,
                        rows, hidden, span_vectors, eps_acc, offset_acc);
        });
      };
      // kSpanStagedLimits plans one or two vectors a thread: both are here.
      launch_vector_rows<1, 2>(span_plan, [&](auto vpt) {
        constexpr int kVectors = decltype(vpt)::value;
        const auto one_or_two_rows = [&](auto weight_in_registers) {
          constexpr bool kWeight = decltype(weight_in_registers)::value;
          const auto one_row =
              rms_norm_backward_span_staged_kernel<scalar_t, kCasting, kVectors, kWeight, false>;
          if (two_rows_may_pay) {
            // Only where the second row costs no block an SM: with Gemma's casting at 8193 on
            // an H200 the two-row kernel took 61 registers, one block of 544 threads an SM
            // where the one-row kernel's 54 left two, and forward+backward went 72.4 -> 67.5
            // (run O84; ncu in run 139). Llama's there went the other way, 58 -> 56. Rows that
            // take a block each need no second plan (nor its occupancy query).
            const auto two_rows =
                rms_norm_backward_span_staged_kernel<scalar_t, kCasting, kVectors, kWeight, true>;
            const StagedLaunch two_rows_launch = plan(two_rows, 2);
            if (two_rows_launch.clusters >= rows) {
              run(two_rows_launch, two_rows);
              return;
            }
            const StagedLaunch one_row_launch = plan(one_row, 1);
            if (two_rows_launch.clusters >= one_row_launch.clusters) {
              run(two_rows_launch, two_rows);
            } else {
              run(one_row_launch, one_row);
            }
            return;
          }
          run(plan(one_row, 1), one_row);
        };
        if (span_plan.threads_per_row <= kSpanWeightRegistersMaxThreads) {
          one_or_two_rows(std::true_type{});
        } else {
          one_or_two_rows(std::false_type{});
        }
      });
      return;
    }
  }
  // Staged rows (x and grad_out; common/staged_rows.cuh), one partial row per cluster: the
  // vector kernels take up to 2048 vectors, so a thread of the staged kernel holds 8 or 16
  // of its block's part of the row.
  const int64_t row_vectors = hidden / vector_size<scalar_t>();
  const int64_t staged_bytes = 2 * hidden * static_cast<int64_t>(sizeof(scalar_t));
  const int cluster = aligned && hidden % vector_size<scalar_t>() == 0
                          ? staged_cluster_size(staged_bytes, row_vectors, /*min_blocks_per_sm=*/1)
                          : 0;
  // `kernel` (an instance of rms_norm_backward_staged_kernel) over clusters of `blocks`.
  const auto launch_staged_rows = [&](auto kernel, int blocks) {
    const StagedLaunch staged =
        plan_staged_launch(kernel, blocks, kStagedThreads, staged_bytes / blocks, rows);
    with_partials(staged.clusters, /*zeroed=*/false, [&](acc_t* partials_ptr) {
      launch_staged(staged, stream, kernel, grad_out, x, weight, grad_x, partials_ptr, rows, hidden,
                    eps_acc, offset_acc);
    });
  };
  if (cluster > 1 && row_vectors % kBackwardSplitCluster == 0 &&
      row_vectors <= int64_t{kBackwardSplitCluster} * kStagedThreads * kBackwardSplitVectors) {
    launch_staged_rows(rms_norm_backward_staged_kernel<scalar_t, kCasting, kBackwardSplitVectors,
                                                       kBackwardSplitCluster,
                                                       /*kMinBlocksPerSm=*/2>,
                       kBackwardSplitCluster);
    return;
  }
  if (cluster > 0) {
    RowLaunch staged_plan;
    staged_plan.threads_per_row = kStagedThreads;
    staged_plan.vectors_per_thread = 8;
    while (int64_t{staged_plan.vectors_per_thread} * kStagedThreads * cluster < row_vectors) {
      staged_plan.vectors_per_thread *= 2;
    }
    const bool staged_launched =
        launch_vector_rows<8, kBackwardStagedMaxVectors>(staged_plan, [&](auto vpt) {
          auto run = [&](auto cluster_size) {
            launch_staged_rows(
                rms_norm_backward_staged_kernel<scalar_t, kCasting, decltype(vpt)::value,
                                                decltype(cluster_size)::value>,
                cluster);
          };
          if (cluster == 1) {
            run(std::integral_constant<int, 1>{});
          } else {
            run(std::integral_constant<int, kStagedCluster>{});
          }
        });
    if (staged_launched) {
      return;
    }
  }
  const ScalarRowLaunch scalar_plan = plan_scalar_row_launch(hidden);
  const bool launched = launch_scalar_rows<scalar_t>(scalar_plan, [&](auto rows_variant) {
    launch(rms_norm_backward_scalar_kernel<scalar_t, kCasting, decltype(rows_variant)>,
           scalar_plan.launch, Partials::kPerSlot);
  });
  if (!launched) {
    launch(rms_norm_backward_generic_kernel<scalar_t, kCasting>, plan, Partials::kPerSlotZeroed);
  }
}

}  // namespace

// Writes grad_x (contiguous, x's shape) and returns grad_weight.
Tensor rms_norm_backward_cuda_into(const Tensor& grad_out, const Tensor& x,
                                   const std::optional<Tensor>& weight, double eps, Casting mode,
                                   double offset, const Tensor& grad_x) {
  Tensor grad_weight = !weight.has_value() ? empty_on(x, {0}, x.scalar_type())
                       // No rows (or hidden == 0): the weight gradient is a sum over nothing.
                       : x.numel() == 0
                           ? zeros_on(*weight, sizes_of(*weight), weight->scalar_type())
                           : empty_on(*weight, sizes_of(*weight), weight->scalar_type());
  if (x.numel() == 0) {
    return grad_weight;
  }
  const CudaDeviceGuard guard(x);
  const Tensor x_contig = as_contiguous(x);
  const Tensor go_contig = as_contiguous(grad_out);
  const std::optional<Tensor> w_contig =
      weight.has_value() ? std::optional<Tensor>(as_contiguous(*weight)) : std::nullopt;
  const int64_t hidden = x.size(-1);
  const int64_t rows = x.numel() / hidden;
  HOTLOOP_DISPATCH_FLOATING(x.scalar_type(), "rms_norm_backward_cuda", [&] {
    dispatch_casting<scalar_t>(
        w_contig ? mode : Casting::kTorch, offset, [&](auto tag, double kernel_offset) {
          launch_rms_norm_backward<scalar_t, decltype(tag)::value>(
              const_data<scalar_t>(go_contig), const_data<scalar_t>(x_contig),
              w_contig ? const_data<scalar_t>(*w_contig) : nullptr, mutable_data<scalar_t>(grad_x),
              w_contig ? mutable_data<scalar_t>(grad_weight) : nullptr, rows, hidden, eps,
              kernel_offset, x);
        });
  });
  return grad_weight;
}

}  // namespace hotloop
