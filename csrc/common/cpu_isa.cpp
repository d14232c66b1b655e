#include "cpu_isa.h"

#include <cstdlib>
#include <stdexcept>
#include <string>

namespace hotloop {
namespace {

CpuIsa detect_cpu_isa() {
  // libgcc's CPU model: also checks that the OS saves the AVX and AVX-512 registers.
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl")) {
    return CpuIsa::kAvx512;
  }
  if (__builtin_cpu_supports("avx2")) {
    return CpuIsa::kAvx2;
  }
  return CpuIsa::kBaseline;
}

CpuIsa capped_cpu_isa() {
  const CpuIsa best = detect_cpu_isa();
  const char* cap = std::getenv("HOTLOOP_CPU_ISA");
  if (cap == nullptr || *cap == '\0') {
    return best;
  }
  const std::string name = cap;
  CpuIsa wanted;
  if (name == "baseline") {
    wanted = CpuIsa::kBaseline;
  } else if (name == "avx2") {
    wanted = CpuIsa::kAvx2;
  } else if (name == "avx512") {
    wanted = CpuIsa::kAvx512;
  } else {
    throw std::runtime_error("HOTLOOP_CPU_ISA must be baseline, avx2 or avx512, got '" + name +
                             "'");
  }
  return wanted < best ? wanted : best;
}

}  // namespace

CpuIsa cpu_isa() {
  static const CpuIsa isa = capped_cpu_isa();
  return isa;
}

}  // namespace hotloop
