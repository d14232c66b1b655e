// The hotloop operator library: every schema, and the Python module init.
//
// All `m.def(...)` live here and nowhere else; the per-op files under csrc/<op>/
// only implement and register kernels (TORCH_LIBRARY_IMPL) for CPU and CUDA.
//
// The extension is built against Python's limited API (abi3) without pybind11:
// importing `hotloop._C` creates an empty module, and loading the shared library
// runs the static registrations below.
#include <Python.h>

#include <torch/library.h>

TORCH_LIBRARY(hotloop, m) {
  const std::vector<at::Tag> tags = {at::Tag::pt2_compliant_tag};

  // a * b + c, elementwise; a and b of the same shape, dtype and device.
  m.def("muladd(Tensor a, Tensor b, float c) -> Tensor", tags);
  // a * b, elementwise.
  m.def("mul(Tensor a, Tensor b) -> Tensor", tags);

  // torch.nn.functional.rms_norm(x, (x.size(-1),), weight, eps).
  m.def("rms_norm(Tensor x, Tensor? weight, float eps) -> Tensor", tags);
  // (grad_x, grad_weight); rstd is recomputed from x. grad_weight is an empty
  // tensor when weight is None.
  m.def(
      "rms_norm_backward(Tensor grad_out, Tensor x, Tensor? weight, float eps) -> (Tensor, "
      "Tensor)",
      tags);

  // In place: residual += x (in float32, rounded to the dtype on store), then
  // x = rms_norm(residual) * weight, where the norm reads the *rounded* residual
  // just stored. The op therefore equals the unfused
  //   residual.add_(x); x.copy_(rms_norm(residual, weight, eps))
  // up to float32 rounding, on CPU and CUDA alike.
  m.def("fused_add_rms_norm(Tensor(a!) x, Tensor(b!) residual, Tensor weight, float eps) -> ()",
        tags);
}

// Importing `hotloop._C` only needs to load this library (which runs the
// registrations above); the module itself is empty.
PyMODINIT_FUNC PyInit__C(void) {
  static PyModuleDef module_def = {
      PyModuleDef_HEAD_INIT,
      "_C",     // m_name
      nullptr,  // m_doc
      -1,       // m_size
      nullptr,  // m_methods
      nullptr,  // m_slots
      nullptr,  // m_traverse
      nullptr,  // m_clear
      nullptr,  // m_free
  };
  return PyModule_Create(&module_def);
}
