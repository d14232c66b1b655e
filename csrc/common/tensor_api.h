// The tensor-facing layer every hotloop op is written against, in two flavours.
//
// HOTLOOP_STABLE_ABI defined (torch >= 2.10): the LibTorch stable ABI only --
// torch/csrc/stable and torch/headeronly, compiled with TORCH_TARGET_VERSION and
// TORCH_STABLE_ONLY, so one binary loads into every torch from the target on.
// Otherwise (the pinned wheels for older torch): ATen and c10, tied to one torch
// minor. The kernels are plain C++/CUDA on raw pointers and never see either;
// the host wrappers use only the names below, so both flavours build from the
// same sources.
#pragma once

#include <cstdint>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#ifdef HOTLOOP_STABLE_ABI
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/core/ScalarType.h>
#include <torch/headeronly/util/BFloat16.h>
#include <torch/headeronly/util/Half.h>
#else
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/zeros.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <torch/library.h>
#endif

namespace hotloop {

#ifdef HOTLOOP_STABLE_ABI
using Tensor = torch::stable::Tensor;
using ScalarType = torch::headeronly::ScalarType;
using DeviceType = torch::headeronly::DeviceType;
using Half = torch::headeronly::Half;
using BFloat16 = torch::headeronly::BFloat16;
#else
using Tensor = at::Tensor;
using ScalarType = at::ScalarType;
using DeviceType = c10::DeviceType;
using Half = c10::Half;
using BFloat16 = c10::BFloat16;
#endif

namespace detail {
template <typename... Args>
std::string concat(const Args&... args) {
  std::ostringstream out;
  (out << ... << args);
  return out.str();
}
}  // namespace detail

// A failed check throws std::runtime_error in both flavours (Python sees a
// RuntimeError with exactly this message): the same text whichever wheel runs.
#define HOTLOOP_CHECK(cond, ...)                                        \
  do {                                                                  \
    if (!(cond)) {                                                      \
      throw std::runtime_error(::hotloop::detail::concat(__VA_ARGS__)); \
    }                                                                   \
  } while (false)

// For invariants a caller cannot break.
#define HOTLOOP_INTERNAL_ASSERT(cond) \
  HOTLOOP_CHECK(cond, "hotloop internal error: ", #cond, " failed; please report a bug")

// float32 accumulation for the 16-bit types, the dtype's own for float32/float64.
template <typename T>
struct AccType {
  using type = float;
};
template <>
struct AccType<double> {
  using type = double;
};
template <typename T>
using acc_type = typename AccType<T>::type;

inline ScalarType acc_dtype_of(ScalarType dtype) {
  return dtype == ScalarType::Double ? ScalarType::Double : ScalarType::Float;
}

// The four floating dtypes every hotloop op accepts; the body sees `scalar_t`.
#define HOTLOOP_DISPATCH_FLOATING(TYPE, NAME, ...)                                               \
  [&] {                                                                                          \
    switch (TYPE) {                                                                              \
      case ::hotloop::ScalarType::Half: {                                                        \
        using scalar_t = ::hotloop::Half;                                                        \
        return __VA_ARGS__();                                                                    \
      }                                                                                          \
      case ::hotloop::ScalarType::BFloat16: {                                                    \
        using scalar_t = ::hotloop::BFloat16;                                                    \
        return __VA_ARGS__();                                                                    \
      }                                                                                          \
      case ::hotloop::ScalarType::Float: {                                                       \
        using scalar_t = float;                                                                  \
        return __VA_ARGS__();                                                                    \
      }                                                                                          \
      case ::hotloop::ScalarType::Double: {                                                      \
        using scalar_t = double;                                                                 \
        return __VA_ARGS__();                                                                    \
      }                                                                                          \
      default:                                                                                   \
        throw std::runtime_error(::hotloop::detail::concat(NAME, ": unsupported dtype ", TYPE)); \
    }                                                                                            \
  }()

// "cpu", "cuda:0", "meta": how torch prints a device in its own messages.
inline std::string device_name(const Tensor& t) {
  const auto device = t.device();
  std::string type;
  switch (device.type()) {
    case DeviceType::CPU:
      return "cpu";
    case DeviceType::CUDA:
      type = "cuda";
      break;
    case DeviceType::Meta:
      return "meta";
    default:
      type = "device type " + std::to_string(static_cast<int>(device.type()));
  }
  return device.has_index() ? type + ":" + std::to_string(device.index()) : type;
}

inline bool same_device(const Tensor& a, const Tensor& b) { return a.device() == b.device(); }

// "[4, 64]"
inline std::string shape_of(const Tensor& t) {
  std::string out = "[";
  for (int64_t d = 0; d < t.dim(); ++d) {
    out += (d ? ", " : "") + std::to_string(t.size(d));
  }
  return out + "]";
}

inline std::vector<int64_t> sizes_of(const Tensor& t) {
  std::vector<int64_t> sizes(t.dim());
  for (int64_t d = 0; d < t.dim(); ++d) {
    sizes[d] = t.size(d);
  }
  return sizes;
}

template <typename T>
const T* const_data(const Tensor& t) {
  return static_cast<const T*>(t.const_data_ptr());
}
template <typename T>
T* mutable_data(const Tensor& t) {
  return static_cast<T*>(t.mutable_data_ptr());
}

#ifdef HOTLOOP_STABLE_ABI
// torch::stable::contiguous and empty_like go through torch_call_dispatcher, which looks the
// operator up by name on every call; new_empty is a direct shim function. A decode-sized
// call makes three of these: they are skipped where the tensor is contiguous already.
inline Tensor as_contiguous(const Tensor& t) {
  return t.is_contiguous() ? t : torch::stable::contiguous(t);
}

// Uninitialised, contiguous, on `like`'s device.
inline Tensor empty_on(const Tensor& like, const std::vector<int64_t>& sizes, ScalarType dtype) {
  return torch::stable::new_empty(like, sizes, dtype);
}
inline Tensor zeros_on(const Tensor& like, const std::vector<int64_t>& sizes, ScalarType dtype) {
  return torch::stable::new_zeros(like, sizes, dtype);
}

// Laid out like x (torch.empty_like's preserve_format).
inline Tensor empty_preserving_layout(const Tensor& x) {
  return x.is_contiguous() ? empty_on(x, sizes_of(x), x.scalar_type())
                           : torch::stable::empty_like(x);
}
inline void copy_into(Tensor& dst, const Tensor& src) { torch::stable::copy_(dst, src); }

template <typename F>
void parallel_for(int64_t begin, int64_t end, int64_t grain, const F& f) {
  torch::stable::parallel_for(begin, end, grain, f);
}
#else
inline Tensor as_contiguous(const Tensor& t) { return t.contiguous(); }

inline Tensor empty_on(const Tensor& like, const std::vector<int64_t>& sizes, ScalarType dtype) {
  return at::empty(sizes, like.options().dtype(dtype));
}
inline Tensor zeros_on(const Tensor& like, const std::vector<int64_t>& sizes, ScalarType dtype) {
  return at::zeros(sizes, like.options().dtype(dtype));
}

inline Tensor empty_preserving_layout(const Tensor& x) { return at::empty_like(x); }
inline void copy_into(Tensor& dst, const Tensor& src) { dst.copy_(src); }

template <typename F>
void parallel_for(int64_t begin, int64_t end, int64_t grain, const F& f) {
  at::parallel_for(begin, end, grain, f);
}
#endif

// An output shaped like `x`, same dtype and device, contiguous.
inline Tensor empty_like_contiguous(const Tensor& x) {
  return empty_on(x, sizes_of(x), x.scalar_type());
}

}  // namespace hotloop

// Kernel registration, spelled once for both flavours (schemas: csrc/hotloop.cpp):
//   HOTLOOP_LIBRARY_IMPL(CPU, m) { m.impl("muladd", HOTLOOP_KERNEL(&muladd_cpu)); }
#ifdef HOTLOOP_STABLE_ABI
#define HOTLOOP_LIBRARY(m) STABLE_TORCH_LIBRARY(hotloop, m)
#define HOTLOOP_LIBRARY_IMPL(KEY, m) STABLE_TORCH_LIBRARY_IMPL(hotloop, KEY, m)
#define HOTLOOP_KERNEL(fn) TORCH_BOX(fn)
#else
#define HOTLOOP_LIBRARY(m) TORCH_LIBRARY(hotloop, m)
#define HOTLOOP_LIBRARY_IMPL(KEY, m) TORCH_LIBRARY_IMPL(hotloop, KEY, m)
#define HOTLOOP_KERNEL(fn) fn
#endif
