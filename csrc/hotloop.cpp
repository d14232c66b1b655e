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

  // torch.nn.functional.rms_norm(x, (x.size(-1),), weight, eps) with casting 0; casting 1
  // rounds x * rstd to x's dtype before the weight (transformers' LlamaRMSNorm), casting 2
  // multiplies by (offset + weight) in float32 (GemmaRMSNorm). common/norm_casting.h.
  m.def("rms_norm(Tensor x, Tensor? weight, float eps, int casting=0, float offset=0.) -> Tensor");
  // (grad_x, grad_weight); rstd is recomputed from x. grad_weight is an empty
  // tensor when weight is None.
  m.def(
      "rms_norm_backward(Tensor grad_out, Tensor x, Tensor? weight, float eps, int casting=0, "
      "float offset=0.) -> (Tensor, Tensor)");
  // rms_norm_backward with grad_x written over grad_out (contiguous, sharing no memory with
  // x or weight); returns grad_weight. The in-place backward of an eager rms_norm whose
  // incoming gradient nothing else holds (hotloop._grad_ownership).
  m.def(
      "rms_norm_backward_(Tensor(a!) grad_out, Tensor x, Tensor? weight, float eps, "
      "int casting=0, float offset=0.) -> Tensor");

  // In place: residual += x (in float32, rounded to the dtype on store), then
  // x = rms_norm(residual) * weight, where the norm reads the *rounded* residual
  // just stored. The op therefore equals the unfused
  //   residual.add_(x); x.copy_(rms_norm(residual, weight, eps, casting, offset))
  // on CPU and CUDA alike, casting and offset as rms_norm's.
  m.def(
      "fused_add_rms_norm(Tensor(a!) x, Tensor(b!) residual, Tensor weight, float eps, "
      "int casting=0, float offset=0.) -> ()");

  // RMSNorm with a float8_e4m3fn output, for FP8 GEMMs (vLLM's
  // rms_norm_static_fp8_quant and rms_norm_dynamic_per_token_quant):
  // y = rms_norm(x) * weight, kept in float32 (float64 for float64 x), then
  // out = e4m3(y * (1 / scale)), 1 / scale formed in float32, rounded to nearest
  // even and saturated to +-448 (NaN stays NaN). out is shaped like x, contiguous.
  // Static: `scale` is one float32 element ([] or [1]) on x's device, read there.
  // casting and offset as rms_norm's: y is the mode's before its rounding to the dtype
  // (rms_norm_fp8/rms_norm_fp8_common.h), in all four FP8 ops.
  m.def(
      "rms_norm_fp8(Tensor x, Tensor weight, Tensor scale, float eps, int casting=0, "
      "float offset=0.) -> Tensor");
  // Dynamic, one scale per row: scales[..., 0] = max(min(max|y_row|, scale_ub) / 448,
  // 1 / (448 * 512)), float32 of shape x.shape[:-1] + [1]; the floor keeps a row of
  // zeros from a zero scale. out.float() * scales dequantises.
  m.def(
      "rms_norm_fp8_dynamic(Tensor x, Tensor weight, float eps, Tensor? scale_ub=None, "
      "int casting=0, float offset=0.) -> (Tensor out, Tensor scales)");
  // In place: residual += x (in float32, rounded to the dtype on store), then the
  // quantised norm of that rounded residual; x is only read. Equals the unfused
  //   residual.add_(x); rms_norm_fp8(residual, weight, scale, eps)
  m.def(
      "fused_add_rms_norm_fp8(Tensor x, Tensor(a!) residual, Tensor weight, Tensor scale, "
      "float eps, int casting=0, float offset=0.) -> Tensor");
  m.def(
      "fused_add_rms_norm_fp8_dynamic(Tensor x, Tensor(a!) residual, Tensor weight, float eps, "
      "Tensor? scale_ub=None, int casting=0, float offset=0.) -> (Tensor out, Tensor scales)");
}
