// The hotloop operator library: every schema, in one place.
//
// The per-op files under csrc/<op>/ only implement and register kernels
// (HOTLOOP_LIBRARY_IMPL) for CPU and CUDA. This library needs no Python: a C++
// program can dlopen it (AOTInductor), Python loads it with
// torch.ops.load_library; the limited-API module `hotloop._C` is built apart
// (python_module.cpp).
#include "common/tensor_api.h"

HOTLOOP_LIBRARY(m) {
  // a * b + c, elementwise; a and b of the same shape, dtype and device.
  m.def("muladd(Tensor a, Tensor b, float c) -> Tensor");
  // a * b, elementwise.
  m.def("mul(Tensor a, Tensor b) -> Tensor");

  // torch.nn.functional.rms_norm(x, (x.size(-1),), weight, eps).
  m.def("rms_norm(Tensor x, Tensor? weight, float eps) -> Tensor");
  // (grad_x, grad_weight); rstd is recomputed from x. grad_weight is an empty
  // tensor when weight is None.
  m.def(
      "rms_norm_backward(Tensor grad_out, Tensor x, Tensor? weight, float eps) -> (Tensor, "
      "Tensor)");

  // In place: residual += x (in float32, rounded to the dtype on store), then
  // x = rms_norm(residual) * weight, where the norm reads the *rounded* residual
  // just stored. The op therefore equals the unfused
  //   residual.add_(x); x.copy_(rms_norm(residual, weight, eps))
  // up to float32 rounding, on CPU and CUDA alike.
  m.def("fused_add_rms_norm(Tensor(a!) x, Tensor(b!) residual, Tensor weight, float eps) -> ()");
}
