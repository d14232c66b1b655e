// Programmatic dependent launch (sm_90 and newer). A kernel started with launch_dependent may
// begin while the kernel before it in the stream is still running: its blocks become
// resident once every block of that kernel has called allow_dependent_grids() (or exited),
// and wait in wait_for_prior_grids() until that kernel has finished and its writes are
// visible. So a dependent kernel must call wait_for_prior_grids() before it reads or writes
// any global memory; kernels here call it first thing. What it saves is the launch's
// latency between two kernels, which at the sweep's sizes is a point of copy bandwidth:
// the forward allowing the backward and the backward allowing the grad_weight partials' sum
// took bfloat16 forward+backward on an H100 from 94.1 to 94.9 % of copy at H = 4096, 94.8 to
// 95.2 at 8192, 94.9 to 95.3 at 16384 (benchmarks/NOTES.md, run O18).
//
// On older GPUs the functions below do nothing and launch_dependent launches as <<<>>> does.
// Neither side needs the other: a dependent launched after a kernel that never allows it
// starts when that kernel's blocks have exited, and a kernel's allowance does nothing for a
// kernel launched the usual way. Stream capture records the dependency as a programmatic
// edge of the graph.
#pragma once

#include <cuda_runtime.h>

#include "cuda_api.cuh"

namespace hotloop {

__device__ __forceinline__ void wait_for_prior_grids() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void allow_dependent_grids() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

inline bool dependent_launch_supported() {
  int major = 0;
  HOTLOOP_CUDA_CHECK(
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, current_device()));
  return major >= 9;
}

// kernel<<<grid, block, 0, stream>>>(args...) as a programmatic dependent of the kernel
// before it in the stream, where the GPU has that.
template <typename... Params, typename... Args>
void launch_dependent(void (*kernel)(Params...), dim3 grid, dim3 block, cudaStream_t stream,
                      Args... args) {
  cudaLaunchAttribute attribute;
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = 0;
  config.stream = stream;
  config.attrs = &attribute;
  config.numAttrs = dependent_launch_supported() ? 1 : 0;
  HOTLOOP_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, args...));
}

}  // namespace hotloop
