// `hotloop._C`: an empty module on Python's limited API (the wheel is cp39-abi3).
//
// The ops live in libhotloop_ops.so, which needs no Python; this module only
// keeps `import hotloop._C` meaningful and links nothing of torch.
#include <Python.h>

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
