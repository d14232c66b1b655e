// CUDA kernel of fused_add_rms_norm: residual += x; x = rms_norm(residual) * weight, in the
// casting mode kCasting (common/norm_casting.cuh forms its values as rms_norm's kernels do).
//
// One read of x and residual, one write of each. The sum is formed in float32
// (float64 for float64), rounded to the dtype and stored into residual; the norm is
// computed from that rounded value, as on CPU, so the op equals the unfused
// `residual.add_(x); x.copy_(rms_norm(residual, weight, eps))`. Rows map onto
// blocks as in rms_norm (common/row_launch.cuh): register-resident 16-byte
// vectors when aligned and their blocks fill an SM; aligned rows beyond that re-read
// the residual they stored from L2, or, too wide for the L2 to keep them, are staged in
// shared memory (common/staged_rows.cuh); register-resident scalars for other rows up to
// 16384 elements (common/scalar_rows.cuh), a generic kernel for the rest.

#include "../common/cuda_utils.cuh"
#include "../common/norm_casting.cuh"
#include "../common/residual_add.cuh"
#include "../common/row_launch.cuh"
#include "../common/scalar_rows.cuh"
#include "../common/staged_rows.cuh"
#include "fused_add_rms_norm_checks.h"

namespace hotloop {
namespace {

// Up to four 16-byte vectors per thread of x and of the residual (bfloat16 rows up to
// 16384), the four-vector variant built for at most 512 threads: on 1024 threads, at
// most 64 registers each, it spilled, and eight vectors spilled even on 512 (H100,
// bfloat16, H = 16384: 70% and 62% of copy bandwidth; benchmarks/NOTES.md, runs 3-5).
// Longer aligned rows take the re-read or the staged kernel.
constexpr int kFusedWideVectors = 4;
constexpr int kFusedMaxThreadsWide = 512;
constexpr RowKernelLimits kFusedLimits{/*max_vectors_per_thread=*/kFusedWideVectors,
                                       /*target_threads=*/256,
                                       /*max_threads=*/kFusedMaxThreadsWide};

// GPUs whose memory is slow for an SM (memory_is_slow_for_an_sm: an H100, not an H200) run rows
// of up to 2048 vectors faster on more threads with fewer vectors each: one vector on up to
// 512 threads, then two on up to 1024. bfloat16 on an H100, % of copy, against kFusedLimits
// (benchmarks/NOTES.md, run O28): H = 4096 (one vector on 512 threads, not two on 256) 97.2
// -> 98.5, 8192 (two on 512, not four on 256) 98.0 -> 98.3, 12288 (two on 768, not four on
// 384) 86.4 -> 88.1, 16384 (two on 1024, not four on 512) 96.2 -> 96.6; the same in
// alternating processes against main's wheel (run O29). One vector on 1024 threads lost at
// 8192 (91.5). On an H200 these limits lost past 512 vectors (run O59: 8192 94.6 -> 82.0).
constexpr RowKernelLimits kSlowMemoryFusedLimits[] = {
    {/*max_vectors_per_thread=*/2, /*target_threads=*/512, /*max_threads=*/kMaxThreadsPerBlock},
};

// Elsewhere (an H200) 16-bit rows of up to 512 vectors take one vector on up to 512 threads, and
// longer ones kFusedLimits. bfloat16 on an H200, % of copy (benchmarks/NOTES.md, run 126; one
// vector on 512 threads, not two on 256, at 512 vectors): H = 3072 (384 vectors) 64.3 -> 95.7,
// 4096 85.8 -> 94.6, torch.compile 94.8 and 93.8; float16 at 4096 95.1 -> 95.2. Rows of up to
// 256 vectors had one vector a thread already (2048: 96.4 both). float32 keeps kFusedLimits:
// at 2048 (512 vectors) 95.5 -> 95.1.
constexpr RowKernelLimits kSixteenBitFusedLimits[] = {
    {/*max_vectors_per_thread=*/1, /*target_threads=*/512, /*max_threads=*/512},
    kFusedLimits,
};

// fused_add_rms_norm's vector plan on this device; for rows no vector kernel takes, the generic
// kernel's.
inline RowLaunch plan_fused_add(int64_t hidden, int vector_width, bool aligned) {
  if (vector_width == kVectorBytes / 2) {
    return plan_row_launch_for_device(hidden, vector_width, aligned, kSlowMemoryFusedLimits,
                                      kSixteenBitFusedLimits);
  }
  return plan_row_launch_for_device(hidden, vector_width, aligned, kSlowMemoryFusedLimits,
                                    {kFusedLimits});
}

// Where a vector plan's blocks leave an SM one block or less than half its threads and rows
// queue for them (vector_plan_underfills_sms), the rows take the re-read kernel (or, past its
// reach, the staged one): on an H100 rows of 1025-2048 vectors (two vectors on 513-1024
// threads at 57 registers, one block an SM), whose figures are the re-read kernel's below.
// 8192 in 16 bits (two blocks of 512) keeps the vector kernel: 98.4, re-read 98.4, staged 88.6
// (benchmarks/NOTES.md, run O33).

// The kernels load a thread's whole share of x and of the residual (the generic one:
// a chunk of it) before storing the sums: a store to the residual between the loads
// would, for all nvcc can tell, alias the next loads, which then wait for it one round
// trip at a time (49% of copy bandwidth at H = 4095 on an H100).
template <typename scalar_t, Casting kCasting, int kVectorsPerThread>
__global__ void __launch_bounds__(kVectorsPerThread >= kFusedWideVectors ? kFusedMaxThreadsWide
                                                                         : kMaxThreadsPerBlock)
    fused_add_rms_norm_vector_kernel(scalar_t* __restrict__ x, scalar_t* __restrict__ residual,
                                     const scalar_t* __restrict__ weight, int64_t rows,
                                     int64_t hidden, acc_type<scalar_t> eps,
                                     acc_type<scalar_t> offset) {
  using acc_t = acc_type<scalar_t>;
  constexpr int kVec = vector_size<scalar_t>();
  using Vec = AlignedVector<scalar_t, kVec>;
  const int num_vectors = static_cast<int>(hidden / kVec);
  const acc_t inv_hidden = acc_t(1) / static_cast<acc_t>(hidden);
  const Vec* weight_vec = reinterpret_cast<const Vec*>(weight);

  for (const int64_t row : block_rows(rows)) {
    const bool row_valid = row < rows;
    Vec* x_row = reinterpret_cast<Vec*>(x + row * hidden);
    Vec* res_row = reinterpret_cast<Vec*>(residual + row * hidden);
    Vec sum[kVectorsPerThread];  // x, then the rounded residual, kept for the second step
    Vec rv[kVectorsPerThread];
    load_vector_pairs(sum, x_row, rv, res_row, row_valid, num_vectors);
    acc_t sum_sq[1] = {0};
    for_row_vectors<kVectorsPerThread>(blockDim.x, row_valid, num_vectors, [&](int i, int idx) {
      add_rounded_squares(sum[i], rv[i], sum_sq[0]);
      res_row[idx] = sum[i];
    });
    row_sum(sum_sq);
    const acc_t rstd = row_rstd<kCasting>(sum_sq[0], inv_hidden, eps);
    for_row_vectors<kVectorsPerThread>(blockDim.x, row_valid, num_vectors, [&](int i, int idx) {
      const Vec wv = weight_vec[idx];
      x_row[idx] = weighted_vector<kCasting>(sum[i], rstd, wv, offset);
    });
  }
}

// Rows that the vector kernel cannot take, held in registers as scalars: the
// rounded sums are kept for the second step instead of re-read.
template <typename scalar_t, Casting kCasting, typename Rows>
__global__ void __launch_bounds__(Rows::kLaunchBound)
    fused_add_rms_norm_scalar_kernel(scalar_t* __restrict__ x, scalar_t* __restrict__ residual,
                                     const scalar_t* __restrict__ weight, int64_t rows,
                                     int64_t hidden, acc_type<scalar_t> eps,
                                     acc_type<scalar_t> offset) {
  constexpr int kElemsPerThread = Rows::kElemsPerThread;
  using acc_t = acc_type<scalar_t>;
  const acc_t inv_hidden = acc_t(1) / static_cast<acc_t>(hidden);
  const int stride = scalar_stride<Rows>();
  // Element i of this thread is column threadIdx.x + i * stride of the row.
  const int own_columns = static_cast<int>(hidden) - static_cast<int>(threadIdx.x);
  const scalar_t* w_own = weight + threadIdx.x;
  for (const int64_t row : block_rows(rows)) {
    const int row_columns = row < rows ? own_columns : 0;  // masks rows past the end
    scalar_t* x_own = x + row * hidden + threadIdx.x;
    scalar_t* res_own = residual + row * hidden + threadIdx.x;
    scalar_t xv[kElemsPerThread];
    scalar_t rv[kElemsPerThread];
    load_scalar_pairs(xv, x_own, rv, res_own, stride, row_columns);
    acc_t sum[kElemsPerThread];  // the rounded residual
    acc_t sum_sq[1] = {0};
#pragma unroll
    for (int i = 0; i < kElemsPerThread; ++i) {
      const scalar_t s = rounded_sum(xv[i], rv[i]);
      if (i * stride < row_columns) {
        res_own[i * stride] = s;
      }
      sum[i] = static_cast<acc_t>(s);
      sum_sq[0] += sum[i] * sum[i];
    }
    row_sum(sum_sq);
    const acc_t rstd = row_rstd<kCasting>(sum_sq[0], inv_hidden, eps);
#pragma unroll
    for (int i = 0; i < kElemsPerThread; ++i) {
      if (i * stride < row_columns) {
        x_own[i * stride] = static_cast<scalar_t>(weighted<kCasting, scalar_t>(
            sum[i] * rstd, static_cast<acc_t>(w_own[i * stride]), offset));
      }
    }
  }
}

// Aligned rows too wide for the re-read kernel (its rows in flight would not stay in L2): the
// rounded sums are staged in shared memory for the second step (common/staged_rows.cuh).
// Loading x and the residual through cp.async as well gained nothing (run O32).
template <typename scalar_t, Casting kCasting>
__global__ void __launch_bounds__(kStagedThreads)
    fused_add_rms_norm_staged_kernel(scalar_t* __restrict__ x, scalar_t* __restrict__ residual,
                                     const scalar_t* __restrict__ weight, int64_t rows,
                                     int64_t hidden, acc_type<scalar_t> eps,
                                     acc_type<scalar_t> offset) {
  using acc_t = acc_type<scalar_t>;
  constexpr int kVec = vector_size<scalar_t>();
  using Vec = AlignedVector<scalar_t, kVec>;
  Vec* staged = staged_rows<Vec>();
  const int num_vectors = static_cast<int>(hidden / kVec);
  const acc_t inv_hidden = acc_t(1) / static_cast<acc_t>(hidden);
  const Vec* weight_vec = reinterpret_cast<const Vec*>(weight);
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    Vec* x_row = reinterpret_cast<Vec*>(x + row * hidden);
    Vec* res_row = reinterpret_cast<Vec*>(residual + row * hidden);
    acc_t sum_sq[1] = {0};
    for (int base = threadIdx.x; base < num_vectors; base += kStagedUnroll * kStagedThreads) {
      Vec sum[kStagedUnroll];  // x, then the rounded residual
      Vec rv[kStagedUnroll];
#pragma unroll
      for (int u = 0; u < kStagedUnroll; ++u) {
        const int idx = base + u * kStagedThreads;
        if (idx < num_vectors) {
          sum[u] = x_row[idx];
          rv[u] = res_row[idx];
        }
      }
#pragma unroll
      for (int u = 0; u < kStagedUnroll; ++u) {
        const int idx = base + u * kStagedThreads;
        if (idx < num_vectors) {
          add_rounded_squares(sum[u], rv[u], sum_sq[0]);
          res_row[idx] = sum[u];
          staged[idx] = sum[u];
        }
      }
    }
    row_sum(sum_sq);
    const acc_t rstd = row_rstd<kCasting>(sum_sq[0], inv_hidden, eps);
    for (int idx = threadIdx.x; idx < num_vectors; idx += kStagedThreads) {
      const Vec sv = staged[idx];
      const Vec wv = weight_vec[idx];
      x_row[idx] = weighted_vector<kCasting>(sv, rstd, wv, offset);
    }
  }
}

// Aligned rows the vector kernel does not hold well: one 16-byte vector of x and of the
// residual a thread at a time on 1024 threads, the rounded sums stored into the residual and
// read back from L2 for the second pass, as torch.compile's kernel does. 32 registers a
// thread, two blocks (every thread) an SM: one block's row sum leaves the other's loads in
// flight. On an H100, bfloat16, % of copy, main's plans (the vector kernel to 2048 vectors
// unless it left an SM less than half full, then staged) against this, alternating processes
// (benchmarks/NOTES.md, run O33): H = 10240 93.2 -> 97.6, 12288 94.7 -> 98.0, 14336 93.7 ->
// 98.0, 16384 95.4 -> 97.7, 20480 91.0 -> 97.4, 24576 92.7 -> 97.5, 32768 94.2 -> 96.7
// (torch.compile 96.6-97.3); on 512 threads (four blocks an SM) 1-12 points lower.
template <typename scalar_t, Casting kCasting>
__global__ void __launch_bounds__(kMaxThreadsPerBlock, kRereadBlocksPerSm)
    fused_add_rms_norm_reread_kernel(scalar_t* __restrict__ x, scalar_t* __restrict__ residual,
                                     const scalar_t* __restrict__ weight, int64_t rows,
                                     int64_t hidden, acc_type<scalar_t> eps,
                                     acc_type<scalar_t> offset) {
  using acc_t = acc_type<scalar_t>;
  constexpr int kVec = vector_size<scalar_t>();
  using Vec = AlignedVector<scalar_t, kVec>;
  const int num_vectors = static_cast<int>(hidden / kVec);
  const acc_t inv_hidden = acc_t(1) / static_cast<acc_t>(hidden);
  const Vec* weight_vec = reinterpret_cast<const Vec*>(weight);
  for (const int64_t row : block_rows(rows)) {
    Vec* x_row = reinterpret_cast<Vec*>(x + row * hidden);
    Vec* res_row = reinterpret_cast<Vec*>(residual + row * hidden);
    acc_t sum_sq[1] = {0};
#pragma unroll 1
    for (int idx = threadIdx.x; idx < num_vectors; idx += kMaxThreadsPerBlock) {
      Vec sum = x_row[idx];
      const Vec rv = res_row[idx];
      add_rounded_squares(sum, rv, sum_sq[0]);
      res_row[idx] = sum;
    }
    row_sum(sum_sq);
    const acc_t rstd = row_rstd<kCasting>(sum_sq[0], inv_hidden, eps);
#pragma unroll 1
    for (int idx = threadIdx.x; idx < num_vectors; idx += kMaxThreadsPerBlock) {
      const Vec sv = res_row[idx];
      const Vec wv = weight_vec[idx];
      x_row[idx] = weighted_vector<kCasting>(sv, rstd, wv, offset);
    }
  }
}

// Any hidden size and alignment (common/residual_add.cuh); the second loop re-reads the
// residual elements this same thread stored in the first.
template <typename scalar_t, Casting kCasting>
__global__ void __launch_bounds__(kMaxThreadsPerBlock)
    fused_add_rms_norm_generic_kernel(scalar_t* __restrict__ x, scalar_t* __restrict__ residual,
                                      const scalar_t* __restrict__ weight, int64_t rows,
                                      int64_t hidden, acc_type<scalar_t> eps,
                                      acc_type<scalar_t> offset) {
  using acc_t = acc_type<scalar_t>;
  const acc_t inv_hidden = acc_t(1) / static_cast<acc_t>(hidden);
  for (const int64_t row : block_rows(rows)) {
    const int64_t row_hidden = row < rows ? hidden : 0;  // masks rows past the end
    scalar_t* x_row = x + row * hidden;
    scalar_t* res_row = residual + row * hidden;
    acc_t sum_sq[1] = {add_residual_row(x_row, res_row, row_hidden)};
    row_sum(sum_sq);
    const acc_t rstd = row_rstd<kCasting>(sum_sq[0], inv_hidden, eps);
    for (int64_t j = threadIdx.x; j < row_hidden; j += blockDim.x) {
      x_row[j] = static_cast<scalar_t>(weighted<kCasting, scalar_t>(
          static_cast<acc_t>(res_row[j]) * rstd, static_cast<acc_t>(weight[j]), offset));
    }
  }
}

template <typename scalar_t, Casting kCasting>
void launch_fused_add_rms_norm(scalar_t* x, scalar_t* residual, const scalar_t* weight,
                               int64_t rows, int64_t hidden, double eps, double offset) {
  using acc_t = acc_type<scalar_t>;
  const acc_t offset_acc = static_cast<acc_t>(offset);
  const bool aligned =
      is_vector_aligned(x) && is_vector_aligned(residual) && is_vector_aligned(weight);
  const RowLaunch plan = plan_fused_add(hidden, vector_size<scalar_t>(), aligned);
  const cudaStream_t stream = current_stream();
  const acc_t eps_acc = static_cast<acc_t>(eps);
  const auto vector_kernel = [](auto vpt) {
    return fused_add_rms_norm_vector_kernel<scalar_t, kCasting, decltype(vpt)::value>;
  };
  const int64_t row_bytes = hidden * static_cast<int64_t>(sizeof(scalar_t));
  // Aligned rows the vector kernel does not take, or takes with blocks that underfill an SM:
  // the re-read kernel while the residual rows it has stored and not yet read back stay in the
  // L2 (reread_blocks_in_l2), else the staged kernel where a row fits in shared memory.
  // Decided only for such rows: a decode-sized call with a vector plan reads no device
  // attribute for it.
  enum class WideRows { kNone, kReread, kStaged };
  const auto wide_rows = [&] {
    if (!aligned || hidden % vector_size<scalar_t>() != 0) {
      return WideRows::kNone;
    }
    if (reread_blocks_in_l2(row_bytes) >= kRereadBlocksPerSm) {
      return WideRows::kReread;
    }
    return row_bytes <= staged_bytes_limit() ? WideRows::kStaged : WideRows::kNone;
  };
  const WideRows wide =
      plan.vectors_per_thread == 0 ||
              vector_plan_underfills_sms<1, 2, kFusedWideVectors>(plan, rows, vector_kernel)
          ? wide_rows()
          : WideRows::kNone;
  if (wide == WideRows::kNone && launch_vector_row_kernel<1, 2, kFusedWideVectors>(
                                     plan, rows, stream, vector_kernel, x, residual, weight, rows,
                                     hidden, eps_acc, offset_acc)) {
    return;
  }
  if (wide == WideRows::kReread) {
    launch_reread_kernel(fused_add_rms_norm_reread_kernel<scalar_t, kCasting>, rows, stream, x,
                         residual, weight, rows, hidden, eps_acc, offset_acc);
    return;
  }
  if (wide == WideRows::kStaged) {
    const auto kernel = fused_add_rms_norm_staged_kernel<scalar_t, kCasting>;
    const StagedLaunch staged =
        plan_staged_launch(kernel, /*cluster=*/1, kStagedThreads, row_bytes, rows);
    launch_staged(staged, stream, kernel, x, residual, weight, rows, hidden, eps_acc, offset_acc);
    return;
  }
  const auto scalar_kernel = [](auto rows_variant) {
    return fused_add_rms_norm_scalar_kernel<scalar_t, kCasting, decltype(rows_variant)>;
  };
  launch_scalar_or_generic<scalar_t>(hidden, rows, stream, scalar_kernel,
                                     fused_add_rms_norm_generic_kernel<scalar_t, kCasting>, plan, x,
                                     residual, weight, rows, hidden, eps_acc, offset_acc);
}

void fused_add_rms_norm_cuda(Tensor& x, Tensor& residual, const Tensor& weight, double eps,
                             int64_t casting, double offset) {
  const Casting mode = checked_casting("fused_add_rms_norm", casting, offset);
  check_fused_add_rms_norm_inputs(x, residual, weight);
  if (x.numel() == 0) {
    return;
  }
  const CudaDeviceGuard guard(x);
  const Tensor w_contig = as_contiguous(weight);
  const int64_t hidden = x.size(-1);
  const int64_t rows = x.numel() / hidden;
  HOTLOOP_DISPATCH_FLOATING(x.scalar_type(), "fused_add_rms_norm_cuda", [&] {
    dispatch_casting<scalar_t>(mode, offset, [&](auto tag, double kernel_offset) {
      launch_fused_add_rms_norm<scalar_t, decltype(tag)::value>(
          mutable_data<scalar_t>(x), mutable_data<scalar_t>(residual),
          const_data<scalar_t>(w_contig), rows, hidden, eps, kernel_offset);
    });
  });
}

}  // namespace

HOTLOOP_LIBRARY_IMPL(CUDA, m) {
  m.impl("fused_add_rms_norm", HOTLOOP_KERNEL(&fused_add_rms_norm_cuda));
}

}  // namespace hotloop
