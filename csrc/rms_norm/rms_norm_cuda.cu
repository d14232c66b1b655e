// CUDA kernels of rms_norm (rms_norm_backward's are in rms_norm_backward_cuda.cu), and the
// CUDA registration of both ops.
//
// Rows of the [rows, hidden] view map onto blocks as planned by plan_row_launch
// (common/row_launch.cuh): one block per row (one warp per row for short rows),
// rows strided over the grid. When every pointer is 16-byte aligned and hidden is
// a multiple of the vector width, each thread keeps its slice of the row in
// registers as 16-byte vectors (kVectorsPerThread of them), so x is read from
// global memory once. Rows off the 16-byte boundary (odd hidden sizes) do the same with
// the aligned span around each row (common/span_rows.cuh; rms_norm_shifted_kernel, spans of up to
// 1024 vectors, or 2048 of 16-bit types where memory is fast for an SM: 16-bit rows up to 8185 or
// 16377 elements; wider ones take the scalar kernel); the backward
// stages those spans in shared memory (rms_norm_backward_span_staged_kernel). Other rows (unaligned
// views) of up to 16384 elements (float16/bfloat16/float32) stay in registers as scalars,
// read with coalesced scalar loads (the *_scalar_kernels). Longer ones, and float64, take a
// generic kernel with scalar loads that handles any hidden size, re-reading the
// row (mostly from L1/L2) for the second pass.
// Sums are float32 (float64 for float64).

#include "rms_norm_cuda.cuh"

namespace hotloop {
namespace {

// ---------------------------------------------------------------------------
// Forward
// ---------------------------------------------------------------------------

// Eight vectors per thread need more than the 64 registers a 1024-thread block
// leaves (bfloat16 spilled to local memory at H = 16384, 54% of copy bandwidth):
// that variant is built for at most 512 threads, so it takes rows up to 32768
// bfloat16 elements; longer ones go to the generic kernel.
constexpr int kForwardMaxThreadsAt8 = 512;
// At least two vectors a thread: a thread then has 32 bytes of its row in flight, not 16,
// and short rows take fewer threads (512 bfloat16 elements: one warp, no block barrier).
// On an H200, whose memory needs more bytes in flight than an H100's, one vector a thread
// left rows of 512-2048 bfloat16 elements at 73-81 % of copy bandwidth; two reached 90 %
// (benchmarks/NOTES.md, run 67). Up to 512 threads a row before a thread takes more vectors:
// at H = 12288 bfloat16 four vectors on 384 threads ran 3 % (H100) and 6 % (H200) faster
// than eight on 192, at 16384 four on 512 1-2.5 % faster than eight on 256, and 8192 and
// 32768 within 1 % (runs 73-74: the registers of eight vectors leave fewer warps an SM); 1024
// threads were 1-3 % slower on the H200 there. The H100 takes fewer bytes a thread, below.
// 16-bit rows of some widths (4096-32768) take rms_norm_l2_reread_kernel instead.
constexpr RowKernelLimits kForwardLimits{/*max_vectors_per_thread=*/8, /*target_threads=*/512,
                                         /*max_threads=*/kForwardMaxThreadsAt8,
                                         /*min_vectors_per_thread=*/2};

// On GPUs whose memory is slow for an SM (memory_is_slow_for_an_sm: an H100, not an H200) the
// forward runs faster on more threads with fewer vectors each:
// - rows of up to 128 threads at one vector a thread: twice the blocks an SM, each with half
//   the bytes in flight. bfloat16 on an H100, % of copy, one vector against two: H = 512
//   98.2 / 97.4, 1024 98.2 / 97.5, 1000 96.9 / 96.7, but 2048 (256 threads) 96.2 / 97.4 (run
//   O18). On an H200 one vector lost 20 % at 512-2048 (run 68).
// - then up to 1024 threads a row before a thread takes more vectors, and at most four: two
//   vectors for rows of up to 2048, not four on half the threads (bfloat16 forward on an
//   H100, % of copy, two against four: H = 12288 97.8 / 97.4, 16384 97.4 / 97.1,
//   forward+backward the same; run O26), and four for rows of up to 4096, not eight on half
//   the threads, whose 128 registers leave one block an SM (four against eight: 16392, 2049
//   vectors, 83.3 / 78.1; 20480 91.2 / 87.4; 32768 96.2 / 95.0, forward+backward 90.0 /
//   89.4; run O27). Not measured on other GPUs of this class (an A100, consumer cards).
constexpr RowKernelLimits kSlowMemoryForwardLimits[] = {
    {/*max_vectors_per_thread=*/1, /*target_threads=*/128, /*max_threads=*/128,
     /*min_vectors_per_thread=*/1},
    {/*max_vectors_per_thread=*/4, /*target_threads=*/kMaxThreadsPerBlock,
     /*max_threads=*/kMaxThreadsPerBlock, /*min_vectors_per_thread=*/2},
};

RowLaunch plan_forward(int64_t hidden, int vector_width, bool aligned) {
  return plan_row_launch_for_device(hidden, vector_width, aligned, kSlowMemoryForwardLimits,
                                    {kForwardLimits});
}

// x * rstd, times the weight's vector `idx` where there is a weight (as kCasting does it).
template <Casting kCasting, typename Vec, typename acc_t>
__device__ __forceinline__ Vec normalized(const Vec& x, acc_t rstd, const Vec* weight_vec, int idx,
                                          acc_t offset) {
  using scalar_t = std::remove_cv_t<std::remove_reference_t<decltype(x.val[0])>>;
  constexpr int kVec = sizeof(Vec) / sizeof(scalar_t);
  Vec out;
  if (has_weight<kCasting>(weight_vec)) {
    const Vec wv = weight_vec[idx];
    out = weighted_vector<kCasting>(x, rstd, wv, offset);
  } else {
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      out.val[k] = static_cast<scalar_t>(static_cast<acc_t>(x.val[k]) * rstd);
    }
  }
  return out;
}

template <typename scalar_t, Casting kCasting, int kVectorsPerThread>
__global__ void __launch_bounds__(kVectorsPerThread >= 8 ? kForwardMaxThreadsAt8
                                                         : kMaxThreadsPerBlock)
    rms_norm_vector_kernel(const scalar_t* __restrict__ x, const scalar_t* __restrict__ weight,
                           scalar_t* __restrict__ y, int64_t rows, int64_t hidden,
                           acc_type<scalar_t> eps, acc_type<scalar_t> offset) {
  using acc_t = acc_type<scalar_t>;
  constexpr int kVec = vector_size<scalar_t>();
  using Vec = AlignedVector<scalar_t, kVec>;
  const int num_vectors = static_cast<int>(hidden / kVec);
  const acc_t inv_hidden = acc_t(1) / static_cast<acc_t>(hidden);
  const Vec* weight_vec = reinterpret_cast<const Vec*>(weight);

  for (const int64_t row : block_rows(rows)) {
    const bool row_valid = row < rows;
    const Vec* x_row = reinterpret_cast<const Vec*>(x + row * hidden);
    Vec xv[kVectorsPerThread];
    acc_t sum_sq[1] = {0};
    for_row_vectors<kVectorsPerThread>(blockDim.x, row_valid, num_vectors, [&](int i, int idx) {
      xv[i] = x_row[idx];
      add_squares(sum_sq[0], xv[i]);
    });
    row_sum(sum_sq);
    const acc_t rstd = row_rstd<kCasting>(sum_sq[0], inv_hidden, eps);

    Vec* y_row = reinterpret_cast<Vec*>(y + row * hidden);
    for_row_vectors<kVectorsPerThread>(blockDim.x, row_valid, num_vectors, [&](int i, int idx) {
      const Vec out = normalized<kCasting>(xv[i], rstd, weight_vec, idx, offset);
      y_row[idx] = out;
    });
  }
}

// Reads this thread's vectors of a row (vector i at threadIdx.x + i * kThreads) into xv,
// kInFlight at a time, and hands each batch to use(i) once all its loads are issued.
template <L2Eviction kEviction, int kThreads, int kInFlight, typename Vec, int kVectorsPerThread,
          typename Use>
__device__ __forceinline__ void read_in_batches(const Vec* row, Vec (&xv)[kVectorsPerThread],
                                                Use&& use) {
#pragma unroll
  for (int first = 0; first < kVectorsPerThread; first += kInFlight) {
#pragma unroll
    for (int i = first; i < first + kInFlight; ++i) {
      xv[i] = load_with_l2_eviction<kEviction>(row + threadIdx.x + i * kThreads);
    }
#pragma unroll
    for (int i = first; i < first + kInFlight; ++i) {
      use(i);
    }
  }
}

// The forward of 16-bit rows of exactly kThreads x kVectorsPerThread vectors, shaped as
// torch.compile's kernel: one row a block and no loop over rows, x read twice. The first read
// asks L2 to keep x (L2Eviction::kKeep) and sums its squares; the second reads it back from L2
// as its last use and normalizes it, two vectors at a time. Holding no row across the barrier,
// it fits the 32 registers of 2048 threads an SM at every shape. bfloat16, % of copy, forward /
// forward+backward, from the vector kernel's plan (in brackets) to this one, and torch.compile's
// forward (benchmarks/NOTES.md: the H200 in run 126, three rounds; the H100 in run 127, two):
//   H200  H = 4096 on 256 x 2   (256 x 2) 94.6 / 91.6 -> 98.1 / 93.0, torch.compile 86.2
//             8192 on 512 x 2   (512 x 2) 94.9 / 89.5 -> 98.2 / 90.9, 98.2
//            12288 on 512 x 3   (384 x 4) 88.8 / 78.0 -> 97.5 / 80.6, 97.2
//            16384 on 512 x 4   (512 x 4) 94.3 / 85.9 -> 96.1 / 86.7, 95.8
//            32768 on 1024 x 4  (512 x 8) 85.3 / 73.3 -> 96.1 / 76.3, 95.1
//            65536 on 1024 x 8  (staged over clusters) 73.0 / 72.2 -> 86.0 / 77.1, 64.5 (run
//                               O68, two rounds; its first read four vectors at a time)
//   H100  H = 4096 on 256 x 2   (256 x 2) 97.3 / 95.4 -> 97.7 / 95.1
//             8192 on 512 x 2   (512 x 2) 97.3 / 95.1 -> 97.8 / 95.7, 97.5
//            12288 on 512 x 3   (768 x 2) 97.9 / 91.3 -> 97.7 / 91.5
//            32768 on 1024 x 4  (1024 x 4) 96.2 / 89.9 -> 97.4 / 90.2, 95.6
// float16 on the H200: 8192 94.4 -> 98.2, 32768 92.5 -> 96.3. So the H200 takes every shape and
// the H100 (memory_is_slow_for_an_sm) 8192's and 32768's. Other shapes of these rows lost on
// the H200 (run O59: 4096 on 512 x 1 83.8, 8192 on 1024 x 1 72.9, 12288 on 768 x 2 89.3 and on
// 1024 threads 67.0, 16384 on 1024 x 2 92.6, 32768 on 512 x 8 75.6), as did plain loads for
// both reads (8192 94.9, 12288 59.2, 32768 23.7: the row does not stay in L2) and the row
// length at run time with the last vectors masked (run O58: 87.4 at 8192, 54.7 at 32768).
template <typename scalar_t, Casting kCasting, int kThreads, int kVectorsPerThread>
__global__ void __launch_bounds__(kThreads, 2 * kMaxThreadsPerBlock / kThreads)
    rms_norm_l2_reread_kernel(const scalar_t* __restrict__ x, const scalar_t* __restrict__ weight,
                              scalar_t* __restrict__ y, acc_type<scalar_t> eps,
                              acc_type<scalar_t> offset) {
  using acc_t = acc_type<scalar_t>;
  constexpr int kVec = vector_size<scalar_t>();
  using Vec = AlignedVector<scalar_t, kVec>;
  constexpr int kRowVectors = kThreads * kVectorsPerThread;
  constexpr acc_t kInvHidden = acc_t(1) / static_cast<acc_t>(kRowVectors * kVec);
  const Vec* x_row =
      reinterpret_cast<const Vec*>(x) + static_cast<int64_t>(blockIdx.x) * kRowVectors;
  Vec* y_row = reinterpret_cast<Vec*>(y) + static_cast<int64_t>(blockIdx.x) * kRowVectors;
  const Vec* weight_vec = reinterpret_cast<const Vec*>(weight);
  Vec xv[kVectorsPerThread];
  // The first read four vectors at a time at most: eight spill at 32 registers.
  acc_t sum_sq[1] = {0};
  read_in_batches<L2Eviction::kKeep, kThreads, (kVectorsPerThread <= 4 ? kVectorsPerThread : 4)>(
      x_row, xv, [&](int i) { add_squares(sum_sq[0], xv[i]); });
  row_sum(sum_sq);
  const acc_t rstd = row_rstd<kCasting>(sum_sq[0], kInvHidden, eps);
  // Two vectors in flight a thread for the second read; more spilled at 32 registers.
  read_in_batches<L2Eviction::kLastUse, kThreads, (kVectorsPerThread <= 2 ? kVectorsPerThread : 1)>(
      x_row, xv, [&](int i) {
        const int idx = threadIdx.x + i * kThreads;
        y_row[idx] = normalized<kCasting>(xv[i], rstd, weight_vec, idx, offset);
      });
}

// Launches rms_norm_l2_reread_kernel where it applies (above) and returns whether it did.
template <typename scalar_t, Casting kCasting>
bool launch_l2_reread_rms_norm(const scalar_t* x, const scalar_t* weight, scalar_t* y, int64_t rows,
                               int64_t hidden, acc_type<scalar_t> eps, acc_type<scalar_t> offset,
                               bool aligned, cudaStream_t stream) {
  if constexpr (sizeof(scalar_t) != 2) {
    return false;
  } else {
    constexpr int kVec = vector_size<scalar_t>();
    if (!aligned || hidden % kVec != 0 || rows < 1 || rows > std::numeric_limits<int32_t>::max()) {
      return false;
    }
    const int64_t row_vectors = hidden / kVec;
    // One row a block, no loop over rows: the grid is the rows, not launch_reread_kernel's
    // (capped, for kernels that loop).
    const auto launch = [&](auto threads, auto vectors_per_thread, bool on_slow_memory) {
      constexpr int kThreads = decltype(threads)::value;
      constexpr int kVectorsPerThread = decltype(vectors_per_thread)::value;
      // The rows of the blocks an SM holds must stay in L2 for the second read
      // (reread_blocks_in_l2): on an H100 or an H200 every shape's do (32768: 2 blocks of 2),
      // a GPU with a smaller L2 keeps the vector kernel. A block reads its row back right after
      // summing it, so its rows may take three fifths of the L2, not the two of the fused ops'
      // (their second read comes after a pass): an H200's 65536 (2 x 132 rows of 128 KB, 56 %
      // of its 60 MB) gained 73.0 -> 86.0 here over the staged kernel (run O68).
      constexpr int kBlocksPerSm = 2 * kMaxThreadsPerBlock / kThreads;
      constexpr int64_t kL2Percent = 60;
      if (row_vectors != kThreads * kVectorsPerThread ||
          (!on_slow_memory && memory_is_slow_for_an_sm()) ||
          reread_blocks_in_l2(row_vectors * kVectorBytes, kL2Percent) < kBlocksPerSm) {
        return false;
      }
      rms_norm_l2_reread_kernel<scalar_t, kCasting, kThreads, kVectorsPerThread>
          <<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(x, weight, y, eps, offset);
      HOTLOOP_KERNEL_LAUNCH_CHECK();
      return true;
    };
    using std::integral_constant;
    return launch(integral_constant<int, 256>{}, integral_constant<int, 2>{}, false) ||
           launch(integral_constant<int, 512>{}, integral_constant<int, 2>{}, true) ||
           launch(integral_constant<int, 512>{}, integral_constant<int, 3>{}, false) ||
           launch(integral_constant<int, 512>{}, integral_constant<int, 4>{}, false) ||
           launch(integral_constant<int, 1024>{}, integral_constant<int, 4>{}, true) ||
           launch(integral_constant<int, 1024>{}, integral_constant<int, 8>{}, false);
  }
}

// Rows that the vector kernel cannot take but that fit in registers as scalars
// (common/scalar_rows.cuh), so x is read once.
template <typename scalar_t, Casting kCasting, typename Rows>
__global__ void __launch_bounds__(Rows::kLaunchBound)
    rms_norm_scalar_kernel(const scalar_t* __restrict__ x, const scalar_t* __restrict__ weight,
                           scalar_t* __restrict__ y, int64_t rows, int64_t hidden,
                           acc_type<scalar_t> eps, acc_type<scalar_t> offset) {
  constexpr int kElemsPerThread = Rows::kElemsPerThread;
  using acc_t = acc_type<scalar_t>;
  const int hidden_int = static_cast<int>(hidden);
  const acc_t inv_hidden = acc_t(1) / static_cast<acc_t>(hidden);
  const int stride = scalar_stride<Rows>();
  // Element i of this thread is column threadIdx.x + i * stride of the row.
  const int own_columns = hidden_int - static_cast<int>(threadIdx.x);
  const scalar_t* w_own = weight != nullptr ? weight + threadIdx.x : nullptr;
  for (const int64_t row : block_rows(rows)) {
    const int row_columns = row < rows ? own_columns : 0;  // masks rows past the end
    const scalar_t* x_own = x + row * hidden + threadIdx.x;
    acc_t xv[kElemsPerThread];
    acc_t sum_sq[1] = {0};
#pragma unroll
    for (int i = 0; i < kElemsPerThread; ++i) {
      xv[i] = i * stride < row_columns ? static_cast<acc_t>(x_own[i * stride]) : acc_t(0);
      sum_sq[0] += xv[i] * xv[i];
    }
    row_sum(sum_sq);
    const acc_t rstd = row_rstd<kCasting>(sum_sq[0], inv_hidden, eps);
    scalar_t* y_own = y + row * hidden + threadIdx.x;
#pragma unroll
    for (int i = 0; i < kElemsPerThread; ++i) {
      if (i * stride < row_columns) {
        acc_t v = xv[i] * rstd;
        if (has_weight<kCasting>(w_own)) {
          v = weighted<kCasting, scalar_t>(v, static_cast<acc_t>(w_own[i * stride]), offset);
        }
        y_own[i * stride] = static_cast<scalar_t>(v);
      }
    }
  }
}

// Blocks of rms_norm_shifted_kernel an SM at the least, which bounds a thread at 40 registers
// (nvcc gave it 44 for 16-bit types without the bound). A span's row has a warp more than an
// aligned row of the same width, so its blocks are small and registers decide how many of
// them an SM holds: 10 of 160 threads at H = 2047 instead of 8, 5 of 288 at 4095 instead of
// 4, which puts more of the rows' bytes in flight. bfloat16 forward on an H100, % of copy
// bandwidth (benchmarks/NOTES.md, runs O2-O3): 2047 86.5 -> 90.2, 4095 85.4 -> 91.3, 1001
// 93.0 -> 95.6, 3001 89.9 -> 95.7. A bound of 32 registers spilled and lost 4-10 points. On an
// H200 the spans staged in shared memory instead, for more bytes in flight, lost: groups of
// rows a warp a row, or each thread's vectors staged two to four rows ahead, 2047 74.4 ->
// 60.8-66.0 % and 4095 75.2 -> 54.2-68.0 (runs O70, O72).
constexpr int kShiftedMinBlocksPerSm = 3;

// Four vectors a thread: two blocks an SM at the least (53-56 registers for 16-bit types), since at
// three their 40 registers spilled 8-20 bytes (nvcc 13.0, sm_90).
template <int kVectorsPerThread>
constexpr int shifted_min_blocks_per_sm() {
  return kVectorsPerThread == 4 ? 2 : kShiftedMinBlocksPerSm;
}

// The forward of span rows: each thread keeps its 16-byte vectors of the span in
// registers, as the vector kernel does. The weight's vectors line up with no row's:
// `shifted_weight` holds kVec copies of it, copy `lead` starting `lead` zeros in, read as
// vectors at the span's vector index. y sits at x's offset from the boundary (launch
// checks). benchmarks/NOTES.md (runs 20-25) has the variants that ran slower than the
// scalar kernel. The vectors are held as four 32-bit words (uint4) until they are used: held
// as vectors of 16-bit elements, nvcc unpacked each one before it issued the next load, at 69 %
// instead of 85 % of copy bandwidth at H = 4095 on an H100 (run 36), and with the edges masked
// and the reduction unrolled at 63-64 % instead of 74-75 at 2047 and 4095 on an H200 (run O73).
// As words, the loads issue back to back with the masks and the unrolled reduction: bfloat16
// on an H200, 2047 74.4 -> 79.3 %, 4095 75.3 -> 78.6, 8193 68.9 -> 69.0 (run O74).
template <typename scalar_t, Casting kCasting, int kVectorsPerThread>
__global__ void __launch_bounds__(kForwardLimits.max_threads,
                                  shifted_min_blocks_per_sm<kVectorsPerThread>())
    rms_norm_shifted_kernel(const scalar_t* __restrict__ x,
                            const scalar_t* __restrict__ shifted_weight, scalar_t* __restrict__ y,
                            int64_t rows, int64_t hidden, int64_t span_vectors,
                            acc_type<scalar_t> eps, acc_type<scalar_t> offset) {
  using acc_t = acc_type<scalar_t>;
  constexpr int kVec = vector_size<scalar_t>();
  using Vec = AlignedVector<scalar_t, kVec>;
  const int hidden_int = static_cast<int>(hidden);
  const acc_t inv_hidden = acc_t(1) / static_cast<acc_t>(hidden);

  for (const int64_t row : block_rows(rows)) {
    const scalar_t* x_row = x + row * hidden;
    // Elements of the span before the row's first: the same for x and y.
    const int lead = static_cast<int>(reinterpret_cast<std::uintptr_t>(x_row) % kVectorBytes) /
                     static_cast<int>(sizeof(scalar_t));
    const int row_vectors = row < rows ? (lead + hidden_int + kVec - 1) / kVec : 0;
    const uint4* x_span = reinterpret_cast<const uint4*>(x_row - lead);
    // Every vector in flight at once: the loop holds no branch that waits on a load. The
    // vectors stay packed in four words until they are used, so that their 16-bit elements do
    // not take a register each while the loads are in flight (run O74). The span's edge
    // vectors hold the neighbouring rows' elements too, zeroed after the loads (never
    // subtracted later: a neighbour's inf would turn this row into NaN). Only where a row's
    // span reaches past either end of the tensor do its edge vectors come element by element
    // instead.
    const int64_t span_start = row * hidden - lead;  // element index of the span's first
    const bool span_past_tensor =
        span_start < 0 || span_start + int64_t{row_vectors} * kVec > rows * hidden;
    const auto is_edge = [&](int idx) { return idx == 0 || idx == row_vectors - 1; };
    uint4 xv[kVectorsPerThread];
#pragma unroll
    for (int i = 0; i < kVectorsPerThread; ++i) {
      const int idx = threadIdx.x + i * blockDim.x;
      if (idx < row_vectors && !(span_past_tensor && is_edge(idx))) {
        xv[i] = x_span[idx];
      }
    }
#pragma unroll
    for (int i = 0; i < kVectorsPerThread; ++i) {
      const int idx = threadIdx.x + i * blockDim.x;
      if (idx < row_vectors && is_edge(idx)) {
        const int first = idx * kVec - lead;
        const unsigned own = own_elements<kVec>(first, hidden_int);
        if (span_past_tensor) {
          Vec v;
#pragma unroll
          for (int k = 0; k < kVec; ++k) {
            v.val[k] = own >> k & 1u ? x_row[first + k] : scalar_t(acc_t(0));
          }
          xv[i] = bit_copy<uint4>(v);
        } else {
          keep_own_words<kVec>(xv[i], own);
        }
      }
    }
    acc_t sum_sq[1] = {0};
    for_row_vectors<kVectorsPerThread>(blockDim.x, true, row_vectors, [&](int i, int) {
      add_word_squares<scalar_t, acc_t, kVec>(sum_sq[0], xv[i]);
    });
    // Span rows have at least kSpanMinHidden elements (spans_line_up), so whole warps.
    row_sum<false, /*kWholeWarps=*/true>(sum_sq);
    const acc_t rstd = row_rstd<kCasting>(sum_sq[0], inv_hidden, eps);

    scalar_t* y_row = y + row * hidden;
    const Vec* weight_vec =
        shifted_weight != nullptr
            ? reinterpret_cast<const Vec*>(shifted_weight) + int64_t{lead} * span_vectors
            : nullptr;
#pragma unroll
    for (int i = 0; i < kVectorsPerThread; ++i) {
      const int idx = threadIdx.x + i * blockDim.x;
      if (idx < row_vectors) {
        store_span_vector(
            y_row, lead, idx, hidden_int,
            normalized<kCasting>(bit_copy<Vec>(xv[i]), rstd, weight_vec, idx, offset));
      }
    }
  }
}

// Aligned rows longer than the vector kernel takes, staged in shared memory, each row
// split over kCluster blocks (common/staged_rows.cuh).
template <typename scalar_t, Casting kCasting, int kCluster>
__global__ void __launch_bounds__(kStagedForwardThreads)
    rms_norm_staged_kernel(const scalar_t* __restrict__ x, const scalar_t* __restrict__ weight,
                           scalar_t* __restrict__ y, int64_t rows, int64_t hidden,
                           acc_type<scalar_t> eps, acc_type<scalar_t> offset) {
  using acc_t = acc_type<scalar_t>;
  constexpr int kVec = vector_size<scalar_t>();
  using Vec = AlignedVector<scalar_t, kVec>;
  __shared__ acc_t exchange[2][1];
  Vec* staged = staged_rows<Vec>();
  const RowPart part = row_part<kCluster>(static_cast<int>(hidden / kVec));
  const acc_t inv_hidden = acc_t(1) / static_cast<acc_t>(hidden);
  const Vec* weight_vec = weight != nullptr ? part_vectors<Vec>(weight, 0, hidden, part) : nullptr;
  if (part.first_row < rows) {
    stage_vectors<kStagedForwardThreads>(staged, part_vectors<Vec>(x, part.first_row, hidden, part),
                                         part.num_vectors);
  }
  int parity = 0;
  for (int64_t row = part.first_row; row < rows; row += part.row_step, parity ^= 1) {
    wait_for_staged_vectors();
    acc_t sum_sq[1] = {0};
    for (int idx = threadIdx.x; idx < part.num_vectors; idx += kStagedForwardThreads) {
      // Copied first: read through a reference into shared memory, the 16-bit kernels
      // compile to other instructions (as the backward's did in runs 75-78).
      const Vec xv = staged[idx];
      add_squares(sum_sq[0], xv);
    }
    row_sum(sum_sq);
    cluster_sum<kCluster>(sum_sq, exchange, parity);
    const acc_t rstd = row_rstd<kCasting>(sum_sq[0], inv_hidden, eps);
    Vec* y_part = part_vectors<Vec>(y, row, hidden, part);
    const int64_t next = next_staged_row(part, row, rows);
    const Vec* x_next = part_vectors<Vec>(x, next, hidden, part);
    for (int idx = threadIdx.x; idx < part.num_vectors; idx += kStagedForwardThreads) {
      const Vec xv = staged[idx];
      Vec out;
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        acc_t v = static_cast<acc_t>(xv.val[k]) * rstd;
        if (has_weight<kCasting>(weight_vec)) {
          v = weighted<kCasting, scalar_t>(v, static_cast<acc_t>(weight_vec[idx].val[k]), offset);
        }
        out.val[k] = static_cast<scalar_t>(v);
      }
      y_part[idx] = out;
      // After the store, which needs the read: the copy may not overtake it.
      if (next >= 0) {
        stage_vector(staged + idx, x_next + idx);
      }
    }
  }
  leave_cluster<kCluster>();
}

template <typename scalar_t, Casting kCasting>
__global__ void __launch_bounds__(kMaxThreadsPerBlock)
    rms_norm_generic_kernel(const scalar_t* __restrict__ x, const scalar_t* __restrict__ weight,
                            scalar_t* __restrict__ y, int64_t rows, int64_t hidden,
                            acc_type<scalar_t> eps, acc_type<scalar_t> offset) {
  using acc_t = acc_type<scalar_t>;
  const acc_t inv_hidden = acc_t(1) / static_cast<acc_t>(hidden);
  for (const int64_t row : block_rows(rows)) {
    const int64_t row_hidden = row < rows ? hidden : 0;  // masks rows past the end
    const scalar_t* x_row = x + row * hidden;
    acc_t sum_sq[1] = {0};
    for (int64_t j = threadIdx.x; j < row_hidden; j += blockDim.x) {
      const acc_t v = static_cast<acc_t>(x_row[j]);
      sum_sq[0] += v * v;
    }
    row_sum(sum_sq);
    const acc_t rstd = row_rstd<kCasting>(sum_sq[0], inv_hidden, eps);
    scalar_t* y_row = y + row * hidden;
    for (int64_t j = threadIdx.x; j < row_hidden; j += blockDim.x) {
      acc_t v = static_cast<acc_t>(x_row[j]) * rstd;
      if (has_weight<kCasting>(weight)) {
        v = weighted<kCasting, scalar_t>(v, static_cast<acc_t>(weight[j]), offset);
      }
      y_row[j] = static_cast<scalar_t>(v);
    }
  }
}

// Launches rms_norm_shifted_kernel and returns true where it takes the rows: span rows
// (spans_line_up) with y at x's offset from the vector boundary.
template <typename scalar_t, Casting kCasting>
bool launch_shifted_rms_norm(const scalar_t* x, const scalar_t* weight, scalar_t* y, int64_t rows,
                             int64_t hidden, acc_type<scalar_t> eps, acc_type<scalar_t> offset,
                             cudaStream_t stream, const Tensor& like) {
  constexpr int kVec = vector_size<scalar_t>();
  if constexpr (!kScalarRowsInRegisters<scalar_t>) {  // float64 rows: too many registers
    return false;
  } else {
    if (!spans_line_up<scalar_t>(hidden, {x, y})) {
      return false;
    }
    const int64_t span_vectors = widest_span_vectors<scalar_t>(hidden);
    // The aligned forward's plan: two vectors a thread on up to 512 threads (16-bit spans of up
    // to 1024 vectors, H <= 8185), then four (up to 2048 vectors, H <= 16377). One vector a
    // thread lost 4-12 % at 1001 and 2047 on both GPUs (runs 73-74). Two on more than 512
    // threads, at 40 registers, lost to the scalar kernel on an H100: H = 8193 on 544 threads
    // 80.7 against 85.2 %, 12289 on 800 65.8 against 83.3 % (run O9).
    // On GPUs whose memory is fast for an SM (an H200), 16-bit spans of more than 128 vectors
    // (each choice two warps or more) take two, three or four vectors a thread, whichever
    // leaves the fewest slots empty (fewest_idle_span_plan). On an H200, bfloat16 forward
    // against a fixed two or four (run O77): 2047 79.0 -> 88.9 % (three), 3001 85.4 -> 92.5
    // (four), 4095 78.5 -> 88.7 (three), 6001 82.5 -> 89.4 (four), 8193 86.3 -> 87.6 (three);
    // 12289 keeps four, the only choice on 512 threads. The same choice in the span backward
    // lost 2-16 points (O78). Three and four vectors a thread: 16-bit types only, and not on
    // GPUs whose memory is slow for an SM. On an H100, with the vectors still unpacked (before
    // run O74), four gave 44 % occupancy at H = 4095 (69 % of copy bandwidth) and 74 % at 8193
    // against the scalar kernel's 85. On an H200, held as words, four took bfloat16 at 8193
    // from the scalar kernel's 68.9 % to 86.6 forward and 68.3 to 74.3 forward+backward (run
    // O76).
    const bool fast_memory_16_bit = sizeof(scalar_t) == 2 && !memory_is_slow_for_an_sm();
    const RowLaunch plan =
        fast_memory_16_bit && span_vectors > 4 * kWarpSize
            ? fewest_idle_span_plan(span_vectors, {2, 3, 4}, kForwardLimits.max_threads)
            : plan_row_launch(span_vectors * kVec, kVec, /*vector_ok=*/true, kForwardLimits);
    if (plan.vectors_per_thread == 0 || (plan.vectors_per_thread != 2 && !fast_memory_16_bit)) {
      return false;
    }
    const std::optional<Tensor> shifted = shifted_weight_copies(weight, hidden, stream, like);
    const scalar_t* weight_copies = shifted ? const_data<scalar_t>(*shifted) : nullptr;
    const auto kernel = [](auto vpt) {
      return rms_norm_shifted_kernel<scalar_t, kCasting, decltype(vpt)::value>;
    };
    if constexpr (sizeof(scalar_t) == 2) {
      return launch_vector_row_kernel<2, 3, 4>(plan, rows, stream, kernel, x, weight_copies, y,
                                               rows, hidden, span_vectors, eps, offset);
    } else {
      return launch_vector_row_kernel<2>(plan, rows, stream, kernel, x, weight_copies, y, rows,
                                         hidden, span_vectors, eps, offset);
    }
  }
}

template <typename scalar_t, Casting kCasting>
void launch_rms_norm(const scalar_t* x, const scalar_t* weight, scalar_t* y, int64_t rows,
                     int64_t hidden, double eps, double offset, const Tensor& like) {
  using acc_t = acc_type<scalar_t>;
  const bool aligned = is_vector_aligned(x) && is_vector_aligned(y) &&
                       (weight == nullptr || is_vector_aligned(weight));
  const RowLaunch plan = plan_forward(hidden, vector_size<scalar_t>(), aligned);
  const cudaStream_t stream = current_stream();
  const acc_t eps_acc = static_cast<acc_t>(eps);
  const acc_t offset_acc = static_cast<acc_t>(offset);
  const auto vector_kernel = [](auto vpt) {
    return rms_norm_vector_kernel<scalar_t, kCasting, decltype(vpt)::value>;
  };
  if (launch_l2_reread_rms_norm<scalar_t, kCasting>(x, weight, y, rows, hidden, eps_acc, offset_acc,
                                                    aligned, stream) ||
      launch_vector_row_kernel<1, 2, 4, 8>(plan, rows, stream, vector_kernel, x, weight, y, rows,
                                           hidden, eps_acc, offset_acc) ||
      launch_shifted_rms_norm<scalar_t, kCasting>(x, weight, y, rows, hidden, eps_acc, offset_acc,
                                                  stream, like)) {
    return;
  }
  const int64_t row_bytes = hidden * static_cast<int64_t>(sizeof(scalar_t));
  const int64_t row_vectors = hidden / vector_size<scalar_t>();
  const int cluster = aligned && hidden % vector_size<scalar_t>() == 0
                          ? staged_cluster_size(row_bytes, row_vectors, /*min_blocks_per_sm=*/2)
                          : 0;
  if (cluster > 0) {
    const auto kernel = cluster == 1 ? rms_norm_staged_kernel<scalar_t, kCasting, 1>
                                     : rms_norm_staged_kernel<scalar_t, kCasting, kStagedCluster>;
    const StagedLaunch staged =
        plan_staged_launch(kernel, cluster, kStagedForwardThreads, row_bytes / cluster, rows);
    launch_staged(staged, stream, kernel, x, weight, y, rows, hidden, eps_acc, offset_acc);
    return;
  }
  const auto scalar_kernel = [](auto rows_variant) {
    return rms_norm_scalar_kernel<scalar_t, kCasting, decltype(rows_variant)>;
  };
  launch_scalar_or_generic<scalar_t>(hidden, rows, stream, scalar_kernel,
                                     rms_norm_generic_kernel<scalar_t, kCasting>, plan, x, weight,
                                     y, rows, hidden, eps_acc, offset_acc);
}

// ---------------------------------------------------------------------------
// Operators
// ---------------------------------------------------------------------------

Tensor rms_norm_cuda(const Tensor& x, const std::optional<Tensor>& weight, double eps,
                     int64_t casting, double offset) {
  const Casting mode = checked_casting("rms_norm", casting, offset);
  check_rms_norm_inputs("rms_norm", x, weight);
  Tensor y = rms_norm_output(x);
  if (x.numel() == 0) {
    return y;
  }
  const CudaDeviceGuard guard(x);
  const Tensor x_contig = as_contiguous(x);
  const std::optional<Tensor> w_contig =
      weight.has_value() ? std::optional<Tensor>(as_contiguous(*weight)) : std::nullopt;
  const Tensor y_contig = y.is_contiguous() ? y : empty_like_contiguous(x);
  const int64_t hidden = x.size(-1);
  const int64_t rows = x.numel() / hidden;
  HOTLOOP_DISPATCH_FLOATING(x.scalar_type(), "rms_norm_cuda", [&] {
    // Without a weight every mode computes the same: the kTorch kernels take those rows.
    dispatch_casting<scalar_t>(
        w_contig ? mode : Casting::kTorch, offset, [&](auto tag, double kernel_offset) {
          launch_rms_norm<scalar_t, decltype(tag)::value>(
              const_data<scalar_t>(x_contig), w_contig ? const_data<scalar_t>(*w_contig) : nullptr,
              mutable_data<scalar_t>(y_contig), rows, hidden, eps, kernel_offset, x);
        });
  });
  return finish_rms_norm_output(y, y_contig);
}

}  // namespace

HOTLOOP_LIBRARY_IMPL(CUDA, m) {
  m.impl("rms_norm", HOTLOOP_KERNEL(&rms_norm_cuda));
  m.impl("rms_norm_backward", HOTLOOP_KERNEL(&rms_norm_backward_op<rms_norm_backward_cuda_into>));
  m.impl("rms_norm_backward_",
         HOTLOOP_KERNEL(&rms_norm_backward_in_place_op<rms_norm_backward_cuda_into>));
}

}  // namespace hotloop
