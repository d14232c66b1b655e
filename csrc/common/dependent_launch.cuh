// Programmatic dependent launch (sm_90 and newer). A kernel started with launch_dependent may
// begin while the kernel before it in the stream is still running: its blocks become
// resident once every block of that kernel has called allow_dependent_grids() or exited, and
// wait in wait_for_prior_grids() until that kernel has finished and its writes are visible.
// So a dependent kernel must call wait_for_prior_grids() before it reads or writes any global
// memory; kernels here call it first thing. What it saves is part of the launch latency
// between two kernels. The rms_norm backward is launched so after the forward (or whatever
// kernel wrote grad_out), and lets the grad_weight partials' sum launch once its own blocks
// have started:
// bfloat16 forward+backward on an H100, % of copy, plain launches against dependent ones,
// 95.3 / 95.8 at H = 512, 95.1 / 95.7 at 1024, 93.9 / 94.4 at 2048, 94.3 / 94.7 at 4096
// (benchmarks/NOTES.md, run O20).
//
// The forward does not allow dependents early. Where every block did, a forward of 64-thread
// blocks (H = 512, one vector a thread) ran at 55.8 instead of 98.3 % of copy with nothing
// launched after it: the instruction slows the launch of blocks (ncu: 59 % of an SM's warps
// busy instead of 89 %). And a backward launched with a wave or more of the forward's blocks
// still to run took H = 2048 forward+backward from 94.4 to 74.3 (run O20). Letting only the
// grid's last 1024 blocks allow avoided both on one H100 and gained 0.3 at 4096, lost 0.2
// there on another, and 2048 blocks already lost 19 points at H = 2048 (run O23).
//
// On older GPUs the functions below do nothing and launch_dependent launches as <<<>>> does.
// A dependent launched after a kernel that never allows it starts when that kernel's blocks
// have exited; stream capture records the dependency as a programmatic edge of the graph.
#pragma once

#include <cuda_runtime.h>

#include "cuda_utils.cuh"

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

// kernel<<<grid, block, shared_bytes, stream>>>(args...) as a programmatic dependent of the
// kernel before it in the stream, where the GPU has that.
template <typename... Params, typename... Args>
void launch_dependent_with_shared_memory(void (*kernel)(Params...), dim3 grid, dim3 block,
                                         int64_t shared_bytes, cudaStream_t stream, Args... args) {
  cudaLaunchAttribute attribute;
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = static_cast<size_t>(shared_bytes);
  config.stream = stream;
  config.attrs = &attribute;
  config.numAttrs = compute_capability_major() >= 9 ? 1 : 0;
  HOTLOOP_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, args...));
}

template <typename... Params, typename... Args>
void launch_dependent(void (*kernel)(Params...), dim3 grid, dim3 block, cudaStream_t stream,
                      Args... args) {
  launch_dependent_with_shared_memory(kernel, grid, block, /*shared_bytes=*/0, stream, args...);
}

}  // namespace hotloop
