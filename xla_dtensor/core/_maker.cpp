// The lazy recorder's tensor maker: a wrapper tensor of a LazyTensor class, made in C++.
//
// torch.Tensor._make_wrapper_subclass makes the same tensor, but parses its 15 keyword
// parameters with torch's Python argument parser first: 1.3-2.3 us of the ~7 us an op
// costs the recorder, against 0.4-0.7 us here. Built against the installed torch by
// xla_dtensor.core.cxx (once, cached); core/_native.c calls MAKE through a capsule.
#include <Python.h>

#include <ATen/EmptyTensor.h>
#include <ATen/core/Tensor.h>
#include <c10/core/Allocator.h>
#include <c10/core/TensorImpl.h>
#include <c10/core/TensorOptions.h>
#include <torch/csrc/Device.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/autograd/python_variable.h>

namespace {

bool int_items(PyObject *seq, c10::SmallVector<int64_t, 6> &out, const char *what) {
  if (!PyTuple_Check(seq)) {
    PyErr_Format(PyExc_TypeError, "make_tensor: %s must be a tuple of ints, got %.100s", what, Py_TYPE(seq)->tp_name);
    return false;
  }
  Py_ssize_t n = PyTuple_GET_SIZE(seq);
  out.resize(n);
  for (Py_ssize_t i = 0; i < n; i++) {
    long long v = PyLong_AsLongLong(PyTuple_GET_ITEM(seq, i));
    if (v == -1 && PyErr_Occurred())
      return false;
    out[i] = v;
  }
  return true;
}

// A tensor of class cls (a torch.Tensor subclass defining __torch_dispatch__) of metadata
// meta = (shape, dtype, stride) on device, with no data: _make_wrapper_subclass(cls, shape,
// strides=stride, dtype=dtype, device=device). A new reference, or NULL with an error set.
PyObject *make(PyObject *cls, PyObject *meta, PyObject *device) {
  if (!PyType_Check(cls) || !PyTuple_Check(meta) || PyTuple_GET_SIZE(meta) != 3 ||
      !THPDtype_Check(PyTuple_GET_ITEM(meta, 1)) || !THPDevice_Check(device)) {
    PyErr_SetString(PyExc_TypeError, "make_tensor(cls, (shape, dtype, stride), device)");
    return nullptr;
  }
  c10::SmallVector<int64_t, 6> sizes, strides;
  if (!int_items(PyTuple_GET_ITEM(meta, 0), sizes, "shape") || !int_items(PyTuple_GET_ITEM(meta, 2), strides, "stride"))
    return nullptr;
  if (sizes.size() != strides.size()) {
    PyErr_Format(PyExc_ValueError, "make_tensor: shape has %zd dims, stride %zd", sizes.size(), strides.size());
    return nullptr;
  }
  try {
    auto options = c10::TensorOptions()
                       .dtype(reinterpret_cast<THPDtype *>(PyTuple_GET_ITEM(meta, 1))->scalar_type)
                       .device(reinterpret_cast<THPDevice *>(device)->device);
    int64_t nbytes = at::detail::computeStorageNbytes(sizes, strides, options.dtype().itemsize());
    // no data: the storage only tells aliasing apart, as _make_wrapper_subclass's does
    c10::Storage storage(c10::Storage::use_byte_size_t{}, nbytes, c10::DataPtr{nullptr, options.device()},
                         c10::GetAllocator(c10::kMeta), /*resizable=*/true);
    at::Tensor t = at::detail::make_tensor<c10::TensorImpl>(
        std::move(storage), c10::DispatchKeySet({options.computeDispatchKey()}), options.dtype());
    t.unsafeGetTensorImpl()->set_sizes_and_strides(sizes, strides);
    PyObject *obj = THPVariable_Wrap(t, reinterpret_cast<PyTypeObject *>(cls));
    if (obj != nullptr)
      t.unsafeGetTensorImpl()->set_python_dispatch(true);  // ops go to cls.__torch_dispatch__
    return obj;
  } catch (const std::exception &e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
    return nullptr;
  }
}

PyObject *make_tensor(PyObject *, PyObject *const *args, Py_ssize_t nargs) {
  if (nargs != 3) {
    PyErr_SetString(PyExc_TypeError, "make_tensor(cls, (shape, dtype, stride), device)");
    return nullptr;
  }
  return make(args[0], args[1], args[2]);
}

PyMethodDef methods[] = {
    {"make_tensor", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(make_tensor)), METH_FASTCALL,
     "make_tensor(cls, (shape, dtype, stride), device): _make_wrapper_subclass(cls, shape, strides=stride, "
     "dtype=dtype, device=device) in C++."},
    {nullptr, nullptr, 0, nullptr}};

PyModuleDef module = {PyModuleDef_HEAD_INIT, "_maker", "The lazy recorder's tensor maker (C++).", -1, methods};

}  // namespace

PyMODINIT_FUNC PyInit__maker(void) {
  PyObject *m = PyModule_Create(&module);
  if (m == nullptr)
    return nullptr;
  PyObject *cap = PyCapsule_New(reinterpret_cast<void *>(&make), "xla_dtensor.core._maker.MAKE", nullptr);
  if (cap == nullptr || PyModule_AddObject(m, "MAKE", cap) < 0) {
    Py_XDECREF(cap);
    Py_DECREF(m);
    return nullptr;
  }
  return m;
}
