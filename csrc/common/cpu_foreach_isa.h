// Compiles the CPU kernels in the file named by HOTLOOP_CPU_KERNELS once per CpuIsa
// level (cpu_isa.h), each copy in its own namespace -- hotloop::cpu_baseline, cpu_avx2,
// cpu_avx512 -- built for that level with `#pragma GCC target`, as Highway's
// foreach_target.h does. HOTLOOP_CPU_DISPATCH then picks a copy at run time. The rest of
// the file is compiled for baseline x86-64 as usual, so the wheel runs on any x86-64 CPU.
//
// The kernel file and cpu_vec.h are included once per level: they have no include guard
// and include nothing (the op's file includes what they use first, so no library header
// is compiled for a target it was not written for). Usage, at file scope:
//
//   #define HOTLOOP_CPU_KERNELS "rms_norm/rms_norm_cpu_kernels.h"
//   #include "../common/cpu_foreach_isa.h"
#ifndef HOTLOOP_CPU_KERNELS
#error "define HOTLOOP_CPU_KERNELS as the file with the CPU kernels before including this"
#endif

#include <cstdint>

#include "cpu_isa.h"
#include "tensor_api.h"

// No a * b + c fused into one rounding (g++ does that by default for C++ wherever FMA is
// enabled, as AVX-512 implies): every level then rounds alike and gives the same bits.
#pragma GCC push_options
#pragma GCC optimize("fp-contract=off")

namespace hotloop {
namespace {
namespace cpu_baseline {
#include "cpu_vec.h"
#include HOTLOOP_CPU_KERNELS
}  // namespace cpu_baseline
}  // namespace
}  // namespace hotloop

#pragma GCC push_options
#pragma GCC target("avx2")
namespace hotloop {
namespace {
namespace cpu_avx2 {
#include "cpu_vec.h"
#include HOTLOOP_CPU_KERNELS
}  // namespace cpu_avx2
}  // namespace
}  // namespace hotloop
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512dq,avx512vl")
namespace hotloop {
namespace {
namespace cpu_avx512 {
#include "cpu_vec.h"
#include HOTLOOP_CPU_KERNELS
}  // namespace cpu_avx512
}  // namespace
}  // namespace hotloop
#pragma GCC pop_options

#pragma GCC pop_options

#undef HOTLOOP_CPU_KERNELS
