// The CUDA side of the tensor-facing layer (see tensor_api.h): the current
// stream, a device guard and launch checks, in the stable-ABI and ATen flavours.
#pragma once

#include <cuda_runtime.h>

#include "tensor_api.h"

#ifdef HOTLOOP_STABLE_ABI
#include <torch/csrc/inductor/aoti_torch/c/shim.h>
#include <torch/csrc/stable/accelerator.h>
#else
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace hotloop {

#define HOTLOOP_CUDA_CHECK(expr)                                                               \
  do {                                                                                         \
    const cudaError_t hotloop_err = (expr);                                                    \
    HOTLOOP_CHECK(hotloop_err == cudaSuccess, "CUDA error: ", cudaGetErrorString(hotloop_err), \
                  " (", #expr, ")");                                                           \
  } while (false)

// After a <<<...>>> launch: a bad configuration is reported here, not later.
#define HOTLOOP_KERNEL_LAUNCH_CHECK() HOTLOOP_CUDA_CHECK(cudaGetLastError())

#ifdef HOTLOOP_STABLE_ABI
// Makes `t`'s GPU current for the scope (torch's CUDAGuard, through the shim).
class CudaDeviceGuard {
 public:
  explicit CudaDeviceGuard(const Tensor& t) : guard_(t.get_device_index()) {}

 private:
  torch::stable::accelerator::DeviceGuard guard_;
};

// torch's current stream on the current device: kernels queue behind torch's own work.
inline cudaStream_t current_stream() {
  void* stream = nullptr;
  const int32_t device = torch::stable::accelerator::getCurrentDeviceIndex();
  HOTLOOP_CHECK(aoti_torch_get_current_cuda_stream(device, &stream) == AOTI_TORCH_SUCCESS,
                "hotloop: torch could not give the current CUDA stream of device ", device);
  return static_cast<cudaStream_t>(stream);
}
#else
class CudaDeviceGuard {
 public:
  explicit CudaDeviceGuard(const Tensor& t) : guard_(t.device()) {}

 private:
  c10::cuda::CUDAGuard guard_;
};

inline cudaStream_t current_stream() { return c10::cuda::getCurrentCUDAStream(); }
#endif

inline int current_device() {
  int device = 0;
  HOTLOOP_CUDA_CHECK(cudaGetDevice(&device));
  return device;
}

}  // namespace hotloop
