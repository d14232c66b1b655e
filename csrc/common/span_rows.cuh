// Span rows of the row-wise norms (rms_norm forward and backward): rows off the 16-byte
// boundary (a hidden size that is not a multiple of the vector width) read and written as the
// 16-byte vectors of the aligned span around each row. The first and last vector of a span
// are shared with the neighbouring rows: their elements count and are stored only for the
// row's own. Tensors at the same offset from the boundary have the same spans. The weight's
// vectors line up with no row's, so the kernels read kVec shifted copies of it
// (shifted_weight_copies). The scalar kernels (common/scalar_rows.cuh), which such rows took
// before, left bfloat16 rows of 1001 and 2047 elements at 42 % of copy bandwidth on an H100;
// rms_norm's span forward runs 2047 at 90 % (benchmarks/NOTES.md, runs 18-28 and 101).
// rms_norm_cuda.cu says which rows take which kernel, and why.
#pragma once

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <optional>

#include "cuda_utils.cuh"
#include "row_launch.cuh"
#include "staged_rows.cuh"

namespace hotloop {

struct RowSpan {
  int lead;          // elements of the span before the row's first
  int vectors;       // 0 for a row past the end
  bool past_tensor;  // the span reaches past the first or last element of the tensor

  __device__ __forceinline__ bool is_edge(int idx) const { return idx == 0 || idx == vectors - 1; }
};

template <typename scalar_t>
__device__ __forceinline__ int span_lead(const scalar_t* tensor, int64_t row, int64_t hidden) {
  return static_cast<int>(reinterpret_cast<std::uintptr_t>(tensor + row * hidden) % kVectorBytes) /
         static_cast<int>(sizeof(scalar_t));
}

template <typename scalar_t>
__device__ __forceinline__ int span_vector_count(int lead, int64_t hidden) {
  constexpr int kVec = vector_size<scalar_t>();
  return (lead + static_cast<int>(hidden) + kVec - 1) / kVec;
}

template <typename scalar_t>
__device__ __forceinline__ RowSpan row_span(int lead, int64_t row, int64_t rows, int64_t hidden) {
  constexpr int kVec = vector_size<scalar_t>();
  RowSpan span;
  span.lead = lead;
  span.vectors = row < rows ? span_vector_count<scalar_t>(lead, hidden) : 0;
  const int64_t first = row * hidden - lead;  // element index of the span's first
  span.past_tensor = first < 0 || first + int64_t{span.vectors} * kVec > rows * hidden;
  return span;
}

// Bit k set where element k of a span vector is the row's own (0 <= first + k < hidden, with
// `first` the row's column of the vector's first element): one mask for an edge vector
// instead of two bounds checks and a branch an element (run O73).
template <int kVec>
__device__ __forceinline__ unsigned own_elements(int first, int hidden) {
  static_assert(kVec < 32, "a bit an element");
  const int begin = min(max(-first, 0), kVec);
  const int end = min(max(hidden - first, 0), kVec);
  return ((1u << end) - 1u) & ~((1u << begin) - 1u);
}

// Stores vector `idx` of the span starting `lead` elements before row_start, the row's own
// elements only.
template <typename Vec, typename scalar_t>
__device__ __forceinline__ void store_span_vector(scalar_t* row_start, int lead, int idx,
                                                  int hidden, const Vec& out) {
  constexpr int kVec = sizeof(Vec) / sizeof(scalar_t);
  const int first = idx * kVec - lead;
  if (first >= 0 && first + kVec <= hidden) {
    reinterpret_cast<Vec*>(row_start - lead)[idx] = out;
  } else {
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      if (static_cast<unsigned>(first + k) < static_cast<unsigned>(hidden)) {
        row_start[first + k] = out.val[k];
      }
    }
  }
}

// Vector idx of a span into `slot` of a staged kernel's shared memory: with cp.async, or,
// where the span reaches past the tensor, the row's own elements one by one and zeros in
// the neighbours' places.
template <typename scalar_t, int kVec>
__device__ __forceinline__ void stage_span_vector(AlignedVector<scalar_t, kVec>* slot,
                                                  const scalar_t* row_start, const RowSpan& span,
                                                  int idx, int hidden) {
  if (span.past_tensor && span.is_edge(idx)) {
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      const int col = idx * kVec - span.lead + k;
      slot->val[k] = col >= 0 && col < hidden ? row_start[col] : scalar_t(acc_type<scalar_t>(0));
    }
  } else {
    stage_vector(
        slot, reinterpret_cast<const AlignedVector<scalar_t, kVec>*>(row_start - span.lead) + idx);
  }
}

// Zeroes the elements of a span vector that are not the row's own (`own`, own_elements).
template <typename scalar_t, int kVec>
__device__ __forceinline__ void keep_own_elements(AlignedVector<scalar_t, kVec>& v, unsigned own) {
#pragma unroll
  for (int k = 0; k < kVec; ++k) {
    if (!(own >> k & 1u)) {
      v.val[k] = scalar_t(acc_type<scalar_t>(0));
    }
  }
}

// keep_own_elements on a vector held as its four 32-bit words: each word ANDed with the mask of
// its own elements, without unpacking them.
template <int kVec>
__device__ __forceinline__ void keep_own_words(uint4& v, unsigned own) {
  constexpr int kPerWord = kVec / 4;
  constexpr int kBits = 32 / kPerWord;
  constexpr unsigned kElement = kBits == 32 ? ~0u : (1u << kBits) - 1u;
  unsigned* words = &v.x;
#pragma unroll
  for (int w = 0; w < 4; ++w) {
    unsigned keep = 0;
#pragma unroll
    for (int e = 0; e < kPerWord; ++e) {
      keep |= (own >> (w * kPerWord + e) & 1u) != 0 ? kElement << (e * kBits) : 0u;
    }
    words[w] &= keep;
  }
}

// Copy `lead` of the shifted weight (shifted_weight_copies) as vectors, or nullptr.
template <typename Vec, typename scalar_t>
__device__ __forceinline__ const Vec* span_weight(const scalar_t* weight_copies, int lead,
                                                  int64_t span_vectors) {
  return weight_copies != nullptr
             ? reinterpret_cast<const Vec*>(weight_copies) + int64_t{lead} * span_vectors
             : nullptr;
}

// The weight vectors i < kVectorsPerThread (vector idx of the span) of a thread of the staged
// span kernels: held in registers from the start (kInRegisters), or read each time they are
// needed. Unset without a weight.
template <typename Vec, int kVectorsPerThread, bool kInRegisters>
class SpanWeight {
 public:
  __device__ __forceinline__ SpanWeight(const Vec* weight, int num_vectors) : weight_(weight) {
    if constexpr (kInRegisters) {
#pragma unroll
      for (int i = 0; i < kVectorsPerThread; ++i) {
        const int idx = threadIdx.x + i * blockDim.x;
        if (weight_ != nullptr && idx < num_vectors) {
          held_[i] = weight_[idx];
        }
      }
    }
  }

  __device__ __forceinline__ Vec get(int i, int idx) const {
    if constexpr (kInRegisters) {
      return held_[i];
    } else {
      Vec v;
      if (weight_ != nullptr) {
        v = weight_[idx];
      }
      return v;
    }
  }

 private:
  const Vec* weight_;
  Vec held_[kInRegisters ? kVectorsPerThread : 1];
};

// One partial row of grad_weight from accumulators in span coordinates: the row's own
// columns only (the partial row is not at the span's offset).
template <int kVectorsPerThread, int kVec, typename acc_t>
__device__ __forceinline__ void store_span_partials(acc_t* partial_row,
                                                    const acc_t (&dw)[kVectorsPerThread][kVec],
                                                    int lead, int num_vectors, int hidden) {
#pragma unroll
  for (int i = 0; i < kVectorsPerThread; ++i) {
    const int idx = threadIdx.x + i * blockDim.x;
    if (idx < num_vectors) {
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        const int col = idx * kVec - lead + k;
        if (col >= 0 && col < hidden) {
          partial_row[col] = dw[i][k];
        }
      }
    }
  }
}

// Copy `lead` (one per offset from the vector boundary) of the weight for the span kernels:
// span_vectors * kVec elements, the weight starting `lead` in, zeros around it.
template <typename scalar_t>
__global__ void shift_weight_kernel(const scalar_t* __restrict__ weight,
                                    scalar_t* __restrict__ shifted, int64_t hidden,
                                    int64_t span_elements, int64_t total) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t col = i % span_elements - i / span_elements;
    shifted[i] = col >= 0 && col < hidden ? weight[col] : scalar_t(acc_type<scalar_t>(0));
  }
}

// Shorter rows than kSpanMinHidden keep the scalar kernels (common/scalar_rows.cuh), which
// pack several to a block.
constexpr int64_t kSpanMinHidden = 256;

// Span rows: rows of at least kSpanMinHidden elements, every tensor in `pointers` at
// the same offset from the vector boundary, a whole number of elements in.
template <typename scalar_t>
bool spans_line_up(int64_t hidden, std::initializer_list<const void*> pointers) {
  const auto offset = [](const void* p) {
    return reinterpret_cast<std::uintptr_t>(p) % kVectorBytes;
  };
  const std::uintptr_t first = offset(*pointers.begin());
  return hidden >= kSpanMinHidden && first % sizeof(scalar_t) == 0 &&
         std::all_of(pointers.begin(), pointers.end(),
                     [&](const void* p) { return offset(p) == first; });
}

// The widest span of a row: one starting one element after a vector boundary.
template <typename scalar_t>
int64_t widest_span_vectors(int64_t hidden) {
  constexpr int kVec = vector_size<scalar_t>();
  return ceil_div(hidden + kVec - 1, kVec);
}

// A plan for span rows of `span_vectors` vectors: of `vectors_choices` vectors a thread, the one
// whose threads (whole warps, at most max_threads) leave the fewest vector slots empty, the fewer
// warps on a tie; none (vectors_per_thread 0) where no choice fits. A span is a vector longer
// than its row's aligned width, and at a fixed number of vectors a thread that vector could take
// a warp of its own: H = 2047 in 16 bits is 257 vectors, at two a thread on five warps whose
// fifth has one lane busy, at three on three warps. For spans of more than two warps' threads at
// every choice (the threads are then whole warps, one row a block).
inline RowLaunch fewest_idle_span_plan(int64_t span_vectors,
                                       std::initializer_list<int> vectors_choices,
                                       int max_threads) {
  RowLaunch best;
  int64_t best_idle = 0;
  for (const int vectors : vectors_choices) {
    const int threads = threads_for_row(ceil_div(span_vectors, int64_t{vectors}));
    if (threads > max_threads) {
      continue;
    }
    const int64_t idle = int64_t{threads} * vectors - span_vectors;
    if (best.vectors_per_thread == 0 || idle < best_idle ||
        (idle == best_idle && threads < best.threads_per_row)) {
      best.vectors_per_thread = vectors;
      best.threads_per_row = threads;
      best_idle = idle;
    }
  }
  return best;
}

// The kVec copies of the weight that the span kernels read (see shift_weight_kernel), or
// nullopt without a weight. `like` places them (a tensor on x's device).
template <typename scalar_t>
std::optional<Tensor> shifted_weight_copies(const scalar_t* weight, int64_t hidden,
                                            cudaStream_t stream, const Tensor& like) {
  if (weight == nullptr) {
    return std::nullopt;
  }
  constexpr int kVec = vector_size<scalar_t>();
  const int64_t span_elements = widest_span_vectors<scalar_t>(hidden) * kVec;
  const int64_t total = kVec * span_elements;
  Tensor shifted = empty_on(like, {total}, like.scalar_type());
  const int threads = 256;
  shift_weight_kernel<scalar_t>
      <<<static_cast<unsigned>(ceil_div(total, threads)), threads, 0, stream>>>(
          weight, mutable_data<scalar_t>(shifted), hidden, span_elements, total);
  HOTLOOP_KERNEL_LAUNCH_CHECK();
  return shifted;
}

// A grid of `blocks` for span rows: a multiple of kVec blocks, rows strided by it, so that
// every row of a block starts at one offset from the vector boundary; or one row a block.
template <typename scalar_t>
int64_t span_grid(int64_t blocks, int64_t rows) {
  constexpr int64_t kVec = vector_size<scalar_t>();
  return blocks >= rows ? rows : std::max(kVec, blocks - blocks % kVec);
}

}  // namespace hotloop
