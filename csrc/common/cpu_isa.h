// Which x86-64 instruction set the CPU kernels run with, chosen once at run time.
//
// The wheel must run on any x86-64 CPU, so nothing is built with -march: each CPU
// kernel is compiled once per level below (cpu_foreach_isa.h) and the host code
// calls the best one this CPU (and its OS) supports.
#pragma once

namespace hotloop {

enum class CpuIsa {
  kBaseline,  // x86-64: SSE2
  kAvx2,      // AVX2 (2013 on)
  kAvx512,    // AVX-512 F, BW, DQ, VL (x86-64-v4's)
};

// The best level this CPU supports, capped by HOTLOOP_CPU_ISA=baseline|avx2|avx512 when
// set (so that tests and benchmarks reach every variant on one machine). Read once.
CpuIsa cpu_isa();

}  // namespace hotloop

// Calls ns::fn<Ts...>(args...) from the namespace of cpu_isa()'s level:
//   HOTLOOP_CPU_DISPATCH(rms_norm_rows<scalar_t>)(x, w, y, rows, hidden, eps);
#define HOTLOOP_CPU_DISPATCH(...)                     \
  [&] {                                               \
    switch (::hotloop::cpu_isa()) {                   \
      case ::hotloop::CpuIsa::kAvx512:                \
        return &::hotloop::cpu_avx512::__VA_ARGS__;   \
      case ::hotloop::CpuIsa::kAvx2:                  \
        return &::hotloop::cpu_avx2::__VA_ARGS__;     \
      default:                                        \
        return &::hotloop::cpu_baseline::__VA_ARGS__; \
    }                                                 \
  }()
