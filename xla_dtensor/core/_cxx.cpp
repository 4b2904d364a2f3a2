// The lazy core's C++ part, built against the installed torch by xla_dtensor.core.cxx (once, cached).
//
// 1. MAKE: a wrapper tensor of a LazyTensor class. torch.Tensor._make_wrapper_subclass makes the same
//    tensor but parses its 15 keyword parameters with torch's Python argument parser first: 1.3-2.3 us
//    of the ~7 us an op costs the recorder, against 0.4-0.7 us here. core/_native.c calls it through
//    a capsule.
// 2. install(): a kernel at the Python dispatch key for the hot ops, taking their calls on lazy
//    tensors straight to the core's C entry (LazyTensor.__torch_dispatch__). torch's Python fallback
//    gets there too, through its generic handling of subclasses and modes (~1.2 us an op more).
//    Anything else (a dispatch mode, another tensor subclass, a replaced __torch_dispatch__) goes the
//    fallback's way, reproduced below.
// 3. install_linear(): F.linear's kernel at AutogradPrivateUse1 (core/linear.py's route in C++): the
//    one recorded op and a C++ autograd node whose backward records the one gradient op. The Python
//    route cost ~17 us a layer's linear, forward and backward, in torch.autograd.Function's machinery;
//    every call this kernel does not take it hands to that route.
// 4. attention(): core/sdpa.py's fused call (after its Python checks) with a C++ autograd node in place
//    of torch.autograd.Function's.
// 5. register_device_guard(): PrivateUse1's device guard in C++. torch's Python-backend guard answers
//    every type() by a pybind11 override lookup into Python (GIL, attribute lookup, call, cast); autograd
//    asks it for each output's stream and each backward op's device, thousands of times a step.
#include <Python.h>

#include <ATen/EmptyTensor.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/Allocator.h>
#include <c10/core/TensorImpl.h>
#include <c10/core/TensorOptions.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/core/impl/PyInterpreterHooks.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>
#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/edge.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/saved_variable.h>
#include <pybind11/pybind11.h>
#include <torch/csrc/Device.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/DynamicTypes.h>
#include <torch/csrc/Layout.h>
#include <torch/csrc/utils/tensor_memoryformats.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/PyInterpreter.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/jit/python/pybind_utils.h>
#include <torch/library.h>

#include <memory>
#include <string>
#include <type_traits>
#include <vector>

namespace {

// ------------------------------------------------------------------------------------------ MAKE

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

// ------------------------------------------------------------------- the Python key's hot ops

// The lazy classes and their __torch_dispatch__ (as found in the class dict when installed), the
// core's C entry (called entry(cls, func, (cls,), args, kwargs)), the types tuples.
PyObject *lazy_cls, *lazy_td, *own_cls, *own_td, *entry, *lazy_types, *own_types, *s_td;
std::unique_ptr<torch::Library> library;
int64_t fast_calls, other_calls;
bool enabled = true;  // off: every call takes the fallback's way (tests compare the two)

// every key above the Python key: what torch's Python fallback excludes while __torch_dispatch__ runs
constexpr c10::DispatchKeySet above_python =
    c10::DispatchKeySet(c10::DispatchKeySet::FULL) ^
    (c10::DispatchKeySet(c10::DispatchKeySet::FULL_AFTER, c10::DispatchKey::Python) |
     c10::DispatchKeySet(c10::DispatchKey::Python));

// the kind of an argument's type, Optional[T] read as T
c10::TypeKind kind_of(const c10::TypePtr &type) {
  if (auto opt = type->cast<c10::OptionalType>())
    return opt->getElementType()->kind();
  return type->kind();
}

bool supported_arg(const c10::TypePtr &type) {
  switch (kind_of(type)) {
  case c10::TypeKind::TensorType:
  case c10::TypeKind::IntType:
  case c10::TypeKind::SymIntType:
  case c10::TypeKind::FloatType:
  case c10::TypeKind::BoolType:
  case c10::TypeKind::NumberType:  // Scalar
  case c10::TypeKind::ScalarTypeType:
  case c10::TypeKind::LayoutType:
  case c10::TypeKind::MemoryFormatType:
  case c10::TypeKind::DeviceObjType:
  case c10::TypeKind::StringType:
    return true;
  case c10::TypeKind::ListType: {
    c10::TypePtr t = type;
    if (auto opt = t->cast<c10::OptionalType>())
      t = opt->getElementType();
    auto k = kind_of(t->castRaw<c10::ListType>()->getElementType());
    return k == c10::TypeKind::TensorType || k == c10::TypeKind::IntType || k == c10::TypeKind::SymIntType ||
           k == c10::TypeKind::BoolType || k == c10::TypeKind::FloatType;
  }
  default:
    return false;
  }
}

// Whether the kernel can present op's arguments as torch does and take back its results.
bool supported(const c10::FunctionSchema &schema) {
  if (schema.is_vararg() || schema.is_varret() || schema.returns().empty())
    return false;
  for (const auto &a : schema.arguments())
    if (!supported_arg(a.real_type()))
      return false;
  for (const auto &r : schema.returns()) {
    auto k = r.real_type()->kind();
    bool list = k == c10::TypeKind::ListType &&
                r.real_type()->castRaw<c10::ListType>()->getElementType()->kind() == c10::TypeKind::TensorType;
    if (k != c10::TypeKind::TensorType && !list)
      return false;
  }
  return true;
}

// value v of an argument of type `type` as torch gives it to __torch_dispatch__ (a new reference)
PyObject *to_py(const c10::TypePtr &type, const c10::IValue &v) {
  if (v.isNone())
    Py_RETURN_NONE;
  switch (kind_of(type)) {
  case c10::TypeKind::ScalarTypeType:
    return Py_NewRef(reinterpret_cast<PyObject *>(torch::getTHPDtype(v.toScalarType())));
  case c10::TypeKind::LayoutType:
    return Py_NewRef(reinterpret_cast<PyObject *>(torch::getTHPLayout(v.toLayout())));
  case c10::TypeKind::MemoryFormatType:
    return Py_NewRef(torch::utils::getTHPMemoryFormat(v.toMemoryFormat()));
  case c10::TypeKind::DeviceObjType:
    return THPDevice_New(v.toDevice());
  default:
    break;
  }
  try {  // as torch's fallback gives the rest: a wrapped number as a Python number, lists as lists...
    return torch::jit::toPyObject(v).release().ptr();
  } catch (python_error &e) {
    e.restore();
  } catch (const std::exception &e) {
    PyErr_SetString(PyExc_TypeError, e.what());
  }
  return nullptr;
}

bool is_default(const c10::Argument &a, const c10::IValue &v) {
  return a.default_value().has_value() && *a.default_value() == v;
}

// (args, kwargs) as torch's Python fallback presents them: positional arguments up to the last one
// not at its default, keyword-only ones not at their defaults.
bool present(const c10::FunctionSchema &schema, const std::vector<c10::IValue> &values, PyObject **args,
             PyObject **kwargs) {
  const auto &decl = schema.arguments();
  size_t n = values.size(), kw_start = n;
  while (kw_start > 0 && decl[kw_start - 1].kwarg_only())
    kw_start--;
  size_t npos = kw_start;
  while (npos > 0 && is_default(decl[npos - 1], values[npos - 1]))
    npos--;
  *args = PyTuple_New(static_cast<Py_ssize_t>(npos));
  *kwargs = PyDict_New();
  if (*args == nullptr || *kwargs == nullptr)
    return false;
  for (size_t i = 0; i < npos; i++) {
    PyObject *o = to_py(decl[i].real_type(), values[i]);
    if (o == nullptr)
      return false;
    PyTuple_SET_ITEM(*args, static_cast<Py_ssize_t>(i), o);
  }
  for (size_t i = kw_start; i < n; i++) {
    if (is_default(decl[i], values[i]))
      continue;
    PyObject *o = to_py(decl[i].real_type(), values[i]);
    int bad = o == nullptr || PyDict_SetItemString(*kwargs, decl[i].name().c_str(), o) < 0;
    Py_XDECREF(o);
    if (bad)
      return false;
  }
  return true;
}

at::Tensor tensor_of(PyObject *o, const c10::OperatorHandle &op) {
  if (o == Py_None)  // an output not asked for (native_layer_norm_backward's output_mask): undefined
    return at::Tensor();
  TORCH_CHECK_TYPE(THPVariable_Check(o), "__torch_dispatch__ of ", op.schema().name(),
                   " returned ", Py_TYPE(o)->tp_name, " where a Tensor was expected");
  return THPVariable_Unpack(o);
}

void push_result(const c10::OperatorHandle &op, torch::jit::Stack *stack, PyObject *res) {
  const auto &rets = op.schema().returns();
  auto one = [&](const c10::Argument &r, PyObject *o) {
    if (r.real_type()->kind() == c10::TypeKind::TensorType) {
      torch::jit::push(*stack, tensor_of(o, op));
      return;
    }
    TORCH_CHECK_TYPE(PyList_Check(o) || PyTuple_Check(o), "__torch_dispatch__ of ", op.schema().name(),
                     " returned ", Py_TYPE(o)->tp_name, " where a list of tensors was expected");
    c10::List<at::Tensor> list;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(o);
    for (Py_ssize_t i = 0; i < n; i++)
      list.push_back(tensor_of(PySequence_Fast_ITEMS(o)[i], op));
    torch::jit::push(*stack, std::move(list));
  };
  if (rets.size() == 1) {
    one(rets[0], res);
    return;
  }
  TORCH_CHECK_TYPE((PyTuple_Check(res) || PyList_Check(res)) &&
                       PySequence_Fast_GET_SIZE(res) == static_cast<Py_ssize_t>(rets.size()),
                   "__torch_dispatch__ of ", op.schema().name(), " returned ", Py_TYPE(res)->tp_name,
                   " where ", rets.size(), " results were expected");
  for (size_t i = 0; i < rets.size(); i++)
    one(rets[i], PySequence_Fast_ITEMS(res)[i]);
}

// Which lazy class takes this call (own_cls, the subclass, wins as in torch's choice among overloaded
// arguments), or nullptr when a tensor with the Python key is of another class.
PyObject *lazy_class_of(const c10::IValue &v, PyObject *cls, bool &python) {
  auto visit = [&](c10::TensorImpl *t) -> bool {
    if (!t->key_set().has(c10::DispatchKey::Python))
      return true;
    python = true;
    PyObject *o = t->pyobj_slot()->load_pyobj();
    if (o == nullptr)
      return false;
    PyObject *tp = reinterpret_cast<PyObject *>(Py_TYPE(o));
    if (tp == own_cls && own_cls != nullptr)
      cls = own_cls;
    return tp == lazy_cls || tp == own_cls;
  };
  if (v.isTensor())
    return visit(v.unsafeToTensorImpl()) ? cls : nullptr;
  if (v.isTensorList() || v.isOptionalTensorList())
    for (const auto &nv : v.toListRef())
      if (!nv.isNone() && !visit(nv.unsafeToTensorImpl()))
        return nullptr;
  return cls;
}

// torch's Python fallback for this call: the innermost dispatch mode, else the arguments' interpreter.
void fallback(const c10::OperatorHandle &op, c10::DispatchKeySet keys, torch::jit::Stack *stack) {
  other_calls++;
  const auto nmodes = c10::impl::TorchDispatchModeTLS::stack_len();
  if (nmodes > 0) {
    c10::impl::TorchDispatchModeTLS::get_stack_at(nmodes - 1)->pyinterpreter()->dispatch(op, stack);
    return;
  }
  bool python = false;
  const c10::impl::PyInterpreter *interpreter = nullptr;
  auto visit = [&](c10::TensorImpl *t) {
    python = python || t->key_set().has(c10::DispatchKey::Python);
    if (interpreter == nullptr && t->pyobj_slot()->load_pyobj() != nullptr)
      interpreter = c10::impl::getGlobalPyInterpreter();  // (one interpreter per process in this torch)
  };
  for (const auto &v : torch::jit::last(*stack, op.schema().arguments().size())) {
    if (v.isTensor())
      visit(v.unsafeToTensorImpl());
    else if (v.isTensorList() || v.isOptionalTensorList())
      for (const auto &nv : v.toListRef())
        if (!nv.isNone())
          visit(nv.unsafeToTensorImpl());
  }
  TORCH_INTERNAL_ASSERT(interpreter != nullptr, "Python dispatch key but no argument has a Python interpreter");
  if (python) {
    (*interpreter)->dispatch(op, stack);
    return;
  }
  // no mode and no tensor with the Python key (a mode added the key): on without it
  auto local = c10::impl::tls_local_dispatch_key_set();
  c10::impl::ForceDispatchKeyGuard no_python(local.included_.remove(c10::DispatchKey::Python), local.excluded_);
  op.redispatchBoxed(keys.remove(c10::DispatchKey::Python), stack);
}

// the Python error set now, as a C++ exception torch's bindings turn back into it (kept with the exception:
// the call may come back to Python on another thread, as in a backward)
[[noreturn]] void raise_python_error() {
  python_error error;
  error.persist();
  throw error;
}

void kernel(const c10::OperatorHandle &op, c10::DispatchKeySet keys, torch::jit::Stack *stack) {
  c10::impl::ExcludeDispatchKeyGuard exclude(above_python);
  if (!enabled || c10::impl::TorchDispatchModeTLS::stack_len() > 0) {
    fallback(op, keys, stack);
    return;
  }
  pybind11::gil_scoped_acquire gil;
  const auto &schema = op.schema();
  const size_t n = schema.arguments().size();
  PyObject *cls = lazy_cls;
  bool python = false;
  for (const auto &v : torch::jit::last(*stack, n)) {
    cls = lazy_class_of(v, cls, python);
    if (cls == nullptr)
      break;
  }
  PyObject *td = cls == nullptr ? nullptr : _PyType_Lookup(reinterpret_cast<PyTypeObject *>(cls), s_td);
  if (cls == nullptr || !python || td != (cls == own_cls ? own_td : lazy_td)) {
    fallback(op, keys, stack);
    return;
  }
  fast_calls++;
  std::vector<c10::IValue> values = torch::jit::pop(*stack, n);
  PyObject *args = nullptr, *kwargs = nullptr;
  if (!present(schema, values, &args, &kwargs)) {
    Py_XDECREF(args);
    Py_XDECREF(kwargs);
    raise_python_error();
  }
  PyObject *call[5] = {cls, torch::detail::getTorchApiFunction(op).ptr(), cls == own_cls ? own_types : lazy_types,
                       args, kwargs};
  PyObject *res = PyObject_Vectorcall(entry, call, 5, nullptr);
  Py_DECREF(args);
  Py_DECREF(kwargs);
  if (res == nullptr)
    raise_python_error();
  try {
    push_result(op, stack, res);
  } catch (...) {
    Py_DECREF(res);
    throw;
  }
  Py_DECREF(res);
}


// ----------------------------------------------------------------------------- the fused linear

// core.linear's route (every call not taken here), the two ops as Python objects, metrics._COUNTS and its
// two keys, xla_dtensor.config and the option's name, torch._C._are_functorch_transforms_active
PyObject *lin_route, *lin_op, *lin_back_op, *lin_counts, *s_fused, *s_fused_back, *lin_config, *s_option,
    *functorch_active;
std::unique_ptr<torch::Library> linear_library;
int64_t linear_taken, linear_routed;
bool nodes_enabled = true;  // off: the linear kernel and attention() hand every call on (tests compare)

void bump(PyObject *key) {  // metrics.incr(key): a failure here is not the op's
  PyObject *v = PyDict_GetItemWithError(lin_counts, key);
  PyObject *n = PyLong_FromLongLong((v == nullptr ? 0 : PyLong_AsLongLong(v)) + 1);
  if (n == nullptr || PyDict_SetItem(lin_counts, key, n) < 0)
    PyErr_Clear();
  Py_XDECREF(n);
}

// The lazy class whose entry takes a call on these tensors as core.tensor.call_op would (own_cls wins), or
// nullptr: a tensor of another class, a dispatch mode or functorch transform on, a replaced entry.
PyObject *entry_class(std::initializer_list<const at::Tensor *> tensors) {
  if (lazy_cls == nullptr || c10::impl::TorchDispatchModeTLS::stack_len() > 0)
    return nullptr;
  PyObject *cls = lazy_cls;
  for (const at::Tensor *t : tensors) {
    if (t == nullptr || !t->defined())
      continue;
    c10::TensorImpl *impl = t->unsafeGetTensorImpl();
    PyObject *o = impl->key_set().has(c10::DispatchKey::Python) ? impl->pyobj_slot()->load_pyobj() : nullptr;
    PyObject *tp = o == nullptr ? nullptr : reinterpret_cast<PyObject *>(Py_TYPE(o));
    if (tp != nullptr && tp == own_cls)
      cls = own_cls;
    else if (tp == nullptr || tp != lazy_cls)
      return nullptr;
  }
  PyObject *on = PyObject_CallNoArgs(functorch_active);
  if (on == nullptr)
    throw python_error();
  Py_DECREF(on);
  if (on == Py_True)
    return nullptr;
  return _PyType_Lookup(reinterpret_cast<PyTypeObject *>(cls), s_td) == (cls == own_cls ? own_td : lazy_td) ? cls
                                                                                                            : nullptr;
}

bool option_on() {
  PyObject *v = PyObject_GetAttr(lin_config, s_option);
  if (v == nullptr)
    throw python_error();
  Py_DECREF(v);
  return v == Py_True;
}

PyObject *wrap(const at::Tensor &t) { return t.defined() ? THPVariable_Wrap(t) : Py_NewRef(Py_None); }

// entry(cls, op, (cls,), args, {}): the op recorded (a new reference); takes the reference to args
PyObject *call_entry(PyObject *cls, PyObject *op, PyObject *args) {
  PyObject *kwargs = PyDict_New();
  PyObject *call[5] = {cls, op, cls == own_cls ? own_types : lazy_types, args, kwargs};
  PyObject *res = kwargs == nullptr ? nullptr : PyObject_Vectorcall(entry, call, 5, nullptr);
  Py_XDECREF(kwargs);
  Py_DECREF(args);
  if (res == nullptr)
    raise_python_error();
  return res;
}

at::Tensor unpack_tensor(PyObject *o, const char *what) {
  if (!THPVariable_Check(o)) {
    Py_DECREF(o);
    TORCH_CHECK_TYPE(false, what, " returned ", Py_TYPE(o)->tp_name, " where a Tensor was expected");
  }
  at::Tensor t = THPVariable_Unpack(o);
  Py_DECREF(o);
  return t;
}

// The gradient of the fused linear: xla_dtensor::linear_backward where core.linear's Python backward would
// record it (every input needs its gradient, no graph of the gradient is wanted, a lazy gradient of the
// input's dtype), else torch's formula in torch ops.
struct LinearBackward final : torch::autograd::Node {
  explicit LinearBackward(bool bias) : has_bias(bias) {}
  torch::autograd::SavedVariable x, w;
  bool has_bias;

  std::string name() const override { return "LinearBackward"; }
  void release_variables() override {
    x.reset_data();
    w.reset_data();
  }

  torch::autograd::variable_list apply(torch::autograd::variable_list &&grads) override {
    at::Tensor input = x.unpack(), weight = w.unpack();
    const at::Tensor &g = grads[0];
    torch::autograd::variable_list out(3);
    if (!g.defined())
      return out;
    const bool need_x = next_edge(0).is_valid(), need_w = next_edge(1).is_valid(),
               need_b = has_bias && next_edge(2).is_valid();
    if (need_x && need_w && need_b == has_bias && !at::GradMode::is_enabled() &&
        g.scalar_type() == input.scalar_type()) {
      pybind11::gil_scoped_acquire gil;
      PyObject *cls = option_on() ? entry_class({&g, &input, &weight}) : nullptr;
      if (cls != nullptr) {
        bump(s_fused_back);
        PyObject *args = Py_BuildValue("(NNNO)", wrap(g), wrap(input), wrap(weight), has_bias ? Py_True : Py_False);
        if (args == nullptr)
          throw python_error();
        PyObject *res = call_entry(cls, lin_back_op, args);
        const Py_ssize_t n = (PyList_Check(res) || PyTuple_Check(res)) ? PySequence_Fast_GET_SIZE(res) : -1;
        if (n != (has_bias ? 3 : 2)) {
          Py_DECREF(res);
          TORCH_CHECK(false, "xla_dtensor::linear_backward returned ", n, " gradients, not ", has_bias ? 3 : 2);
        }
        for (Py_ssize_t i = 0; i < n; i++)
          out[i] = unpack_tensor(Py_NewRef(PySequence_Fast_ITEMS(res)[i]), "xla_dtensor::linear_backward");
        Py_DECREF(res);
        return out;
      }
    }
    const at::Tensor flat = g.reshape({-1, g.size(-1)});
    if (need_x)
      out[0] = g.matmul(weight);
    if (need_w)
      out[1] = flat.t().matmul(input.reshape({-1, input.size(-1)}));
    if (need_b)
      out[2] = flat.sum(0);
    return out;
  }
};

// a new node of class N as the autograd graph holds them (a shared_ptr in older torch, an intrusive_ptr now)
using NodePtr = decltype(torch::autograd::Edge::function);
template <typename N, typename P>
struct NodeMaker;
template <typename N>
struct NodeMaker<N, std::shared_ptr<torch::autograd::Node>> {
  static NodePtr make(bool bias) { return std::shared_ptr<N>(new N(bias)); }
};
template <typename N>
struct NodeMaker<N, c10::intrusive_ptr<torch::autograd::Node>> {
  static NodePtr make(bool bias) { return c10::make_intrusive<N>(bias); }
};

// Whether core.linear.fusable would say yes (lazy tensors of the kernel's classes are checked by the caller).
bool fusable(const at::Tensor &x, const at::Tensor &w, const at::Tensor *b) {
  if (x.dim() < 2 || w.dim() != 2 || x.size(-1) != w.size(1) || x.scalar_type() != w.scalar_type() ||
      !at::isFloatingType(x.scalar_type()))
    return false;
  return b == nullptr || (b->dim() == 1 && b->size(0) == w.size(0) && b->scalar_type() == x.scalar_type());
}

// (x, w, b) as a Python tuple, b None when absent
PyObject *linear_args(const at::Tensor &x, const at::Tensor &w, const at::Tensor *b) {
  PyObject *args = Py_BuildValue("(NNN)", THPVariable_Wrap(x), THPVariable_Wrap(w),
                                 b == nullptr ? Py_NewRef(Py_None) : THPVariable_Wrap(*b));
  if (args == nullptr)
    throw python_error();
  return args;
}

// the node pointer of `node` itself (what a saved output is unpacked for)
template <typename N, typename P>
struct SelfPtr;
template <typename N>
struct SelfPtr<N, std::shared_ptr<torch::autograd::Node>> {
  static NodePtr of(N *node) { return node->shared_from_this(); }
};
template <typename N>
struct SelfPtr<N, c10::intrusive_ptr<torch::autograd::Node>> {
  static NodePtr of(N *node) { return c10::intrusive_ptr<torch::autograd::Node>::reclaim_copy(node); }
};

PyObject *att_apply, *att_op, *att_back_op;  // sdpa._FusedAttention.apply, the two ops
int64_t attention_taken, attention_routed;

// The gradient of the fused attention: xla_dtensor::attention_backward of the saved q, k, v, mask, bias and
// output, through the lazy class's entry as core.tensor.call_op would, else through torch's dispatcher.
struct AttentionBackward final : torch::autograd::Node {
  AttentionBackward(bool causal, double s) : is_causal(causal), scale(s) {}
  torch::autograd::SavedVariable q, k, v, mask, bias, out;
  bool is_causal;
  double scale;

  std::string name() const override { return "AttentionBackward"; }
  void release_variables() override {
    for (auto *sv : {&q, &k, &v, &mask, &bias, &out})
      sv->reset_data();
  }

  torch::autograd::variable_list apply(torch::autograd::variable_list &&grads) override {
    at::Tensor tq = q.unpack(), tk = k.unpack(), tv = v.unpack(), tm = mask.unpack(), tb = bias.unpack(),
               to = out.unpack(SelfPtr<AttentionBackward, NodePtr>::of(this));
    torch::autograd::variable_list res(3);
    if (!grads[0].defined())
      return res;
    pybind11::gil_scoped_acquire gil;
    PyObject *cls = entry_class({&grads[0], &tq, &tk, &tv, &tm, &tb, &to});
    PyObject *args = Py_BuildValue("(NNNNNNNOd)", wrap(grads[0]), wrap(tq), wrap(tk), wrap(tv), wrap(tm), wrap(tb),
                                   wrap(to), is_causal ? Py_True : Py_False, scale);
    if (args == nullptr)
      throw python_error();
    PyObject *got;
    if (cls != nullptr) {
      got = call_entry(cls, att_back_op, args);
    } else {  // through torch's dispatcher, as call_op would
      got = PyObject_Call(att_back_op, args, nullptr);
      Py_DECREF(args);
      if (got == nullptr)
        raise_python_error();
    }
    const Py_ssize_t n = (PyList_Check(got) || PyTuple_Check(got)) ? PySequence_Fast_GET_SIZE(got) : -1;
    if (n != 3) {
      Py_DECREF(got);
      TORCH_CHECK(false, "xla_dtensor::attention_backward returned ", n, " gradients, not 3");
    }
    for (Py_ssize_t i = 0; i < 3; i++)
      res[i] = unpack_tensor(Py_NewRef(PySequence_Fast_ITEMS(got)[i]), "xla_dtensor::attention_backward");
    Py_DECREF(got);
    return res;
  }
};

template <typename N, typename P>
struct AttentionMaker;
template <typename N>
struct AttentionMaker<N, std::shared_ptr<torch::autograd::Node>> {
  static NodePtr make(bool causal, double scale) { return std::shared_ptr<N>(new N(causal, scale)); }
};
template <typename N>
struct AttentionMaker<N, c10::intrusive_ptr<torch::autograd::Node>> {
  static NodePtr make(bool causal, double scale) { return c10::make_intrusive<N>(causal, scale); }
};

// attention(q, k, v, mask, bias, is_causal, scale): sdpa.fused's call, taken here where call_op would enter a
// lazy class's entry, else handed to _FusedAttention.apply
PyObject *attention(PyObject *, PyObject *const *args, Py_ssize_t nargs) {
  if (nargs != 7 || att_apply == nullptr) {
    PyErr_SetString(PyExc_TypeError, nargs != 7 ? "attention(q, k, v, mask, bias, is_causal, scale)"
                                                : "attention: install_attention() first");
    return nullptr;
  }
  try {
    at::Tensor t[5];
    for (int i = 0; i < 5; i++) {
      if (args[i] == Py_None)
        continue;
      if (!THPVariable_Check(args[i])) {
        PyErr_Format(PyExc_TypeError, "attention: argument %d must be a Tensor or None, got %.100s", i,
                     Py_TYPE(args[i])->tp_name);
        return nullptr;
      }
      t[i] = THPVariable_Unpack(args[i]);
    }
    const int causal = PyObject_IsTrue(args[5]);
    const double scale = PyFloat_AsDouble(args[6]);
    if (causal < 0 || (scale == -1.0 && PyErr_Occurred()))
      return nullptr;
    PyObject *cls = nullptr;
    if (nodes_enabled && t[0].defined() && t[1].defined() && t[2].defined() &&
        !torch::autograd::isFwGradDefined(t[0]) && !torch::autograd::isFwGradDefined(t[1]) &&
        !torch::autograd::isFwGradDefined(t[2]) && !(t[3].defined() && t[3].requires_grad()) &&
        !(t[4].defined() && t[4].requires_grad()))
      cls = entry_class({&t[0], &t[1], &t[2], &t[3], &t[4]});
    if (cls == nullptr) {
      attention_routed++;
      return PyObject_Vectorcall(att_apply, args, 7, nullptr);
    }
    attention_taken++;
    PyObject *tuple = PyTuple_New(7);
    if (tuple == nullptr)
      return nullptr;
    for (int i = 0; i < 7; i++)
      PyTuple_SET_ITEM(tuple, i, Py_NewRef(args[i]));
    PyObject *res;
    {
      at::AutoGradMode no_grad(false);
      res = call_entry(cls, att_op, tuple);
    }
    const bool grad = at::GradMode::is_enabled() &&
                      (t[0].requires_grad() || t[1].requires_grad() || t[2].requires_grad());
    if (!grad)
      return res;
    if (!THPVariable_Check(res)) {
      PyErr_Format(PyExc_TypeError, "xla_dtensor::attention returned %.100s, not a Tensor", Py_TYPE(res)->tp_name);
      Py_DECREF(res);
      return nullptr;
    }
    at::Tensor out = THPVariable_Unpack(res);
    NodePtr node = AttentionMaker<AttentionBackward, NodePtr>::make(causal != 0, scale);
    auto *ab = static_cast<AttentionBackward *>(node.get());
    node->set_next_edges(torch::autograd::collect_next_edges(t[0], t[1], t[2]));
    ab->q = torch::autograd::SavedVariable(t[0], false);
    ab->k = torch::autograd::SavedVariable(t[1], false);
    ab->v = torch::autograd::SavedVariable(t[2], false);
    ab->mask = torch::autograd::SavedVariable(t[3], false);
    ab->bias = torch::autograd::SavedVariable(t[4], false);
    torch::autograd::set_history(out, node);
    ab->out = torch::autograd::SavedVariable(out, true);
    return res;
  } catch (python_error &e) {
    e.restore();
    return nullptr;
  } catch (const c10::Error &e) {
    PyErr_SetString(PyExc_RuntimeError, e.what_without_backtrace());
    return nullptr;
  } catch (const std::exception &e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
    return nullptr;
  }
}

// F.linear at AutogradPrivateUse1: the one op and a LinearBackward node where core.linear would record them
// (its fusable(), a lazy class's entry, no dispatch mode, functorch transform or forward-mode gradient),
// else core.linear's route.
at::Tensor linear_kernel(const at::Tensor &x, const at::Tensor &w, const std::optional<at::Tensor> &bias) {
  const at::Tensor *b = bias.has_value() && bias->defined() ? &*bias : nullptr;
  pybind11::gil_scoped_acquire gil;
  PyObject *cls = nullptr;
  if (nodes_enabled && fusable(x, w, b) && !torch::autograd::isFwGradDefined(x) &&
      !torch::autograd::isFwGradDefined(w) && !torch::autograd::isFwGradDefined(bias) && option_on())
    cls = entry_class({&x, &w, b});
  PyObject *args = linear_args(x, w, b);
  if (cls == nullptr) {
    linear_routed++;
    PyObject *res = PyObject_Call(lin_route, args, nullptr);
    Py_DECREF(args);
    if (res == nullptr)
      raise_python_error();
    return unpack_tensor(res, "core.linear's route");
  }
  linear_taken++;
  bump(s_fused);
  const bool grad = at::GradMode::is_enabled() && (x.requires_grad() || w.requires_grad() || (b && b->requires_grad()));
  PyObject *res;
  {  // as torch.autograd.Function runs a forward (with a gradient), as the route's no-grad branch does (without)
    at::AutoGradMode no_grad(false);
    at::AutoDispatchBelowAutograd below;
    res = call_entry(cls, lin_op, args);
  }
  at::Tensor out = unpack_tensor(res, "xla_dtensor::linear");
  if (grad) {
    NodePtr node = NodeMaker<LinearBackward, NodePtr>::make(b != nullptr);
    auto *lb = static_cast<LinearBackward *>(node.get());
    node->set_next_edges(torch::autograd::collect_next_edges(x, w, b ? *b : at::Tensor()));
    lb->x = torch::autograd::SavedVariable(x, false);
    lb->w = torch::autograd::SavedVariable(w, false);
    torch::autograd::set_history(out, node);
  }
  return out;
}

// cls's own __torch_dispatch__ (borrowed: the kernel compares the class's with it at each call), or NULL
// with a TypeError naming the caller `who`
PyObject *own_dispatch(PyObject *cls, const char *who) {
  PyObject *td = PyDict_GetItemString(reinterpret_cast<PyTypeObject *>(cls)->tp_dict, "__torch_dispatch__");
  if (td == nullptr)
    PyErr_Format(PyExc_TypeError, "%s: %.100s defines no __torch_dispatch__", who,
                 reinterpret_cast<PyTypeObject *>(cls)->tp_name);
  return td;
}

// install(lazy_cls, entry, names): the kernel for the ops named ("aten::add.Tensor"...) whose
// schemas it supports; the names it took.
PyObject *install(PyObject *, PyObject *args) {
  PyObject *cls, *fn, *names;
  if (!PyArg_ParseTuple(args, "O!OO!", &PyType_Type, &cls, &fn, &PyList_Type, &names))
    return nullptr;
  if (library != nullptr) {
    PyErr_SetString(PyExc_RuntimeError, "install: the kernel is installed already");
    return nullptr;
  }
  PyObject *td = own_dispatch(cls, "install");
  if (td == nullptr)
    return nullptr;
  PyObject *taken = PyList_New(0);
  if (taken == nullptr)
    return nullptr;
  try {
    s_td = PyUnicode_InternFromString("__torch_dispatch__");
    lazy_cls = Py_NewRef(cls);
    lazy_td = Py_NewRef(td);
    entry = Py_NewRef(fn);
    lazy_types = PyTuple_Pack(1, cls);
    library = std::make_unique<torch::Library>(torch::Library::IMPL, "aten", c10::DispatchKey::Python,
                                               __FILE__, __LINE__);
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(names); i++) {
      const char *name = PyUnicode_AsUTF8(PyList_GET_ITEM(names, i));
      if (name == nullptr)
        throw python_error();
      std::string full(name), base = full, overload;
      auto dot = full.find('.');
      if (dot != std::string::npos) {
        base = full.substr(0, dot);
        overload = full.substr(dot + 1);
      }
      auto handle = c10::Dispatcher::singleton().findSchema({base, overload == "default" ? "" : overload});
      if (!handle.has_value() || !supported(handle->schema()))
        continue;
      std::string short_name = base.substr(base.find("::") + 2) +
                               (overload.empty() || overload == "default" ? "" : "." + overload);
      library->impl(short_name.c_str(), torch::CppFunction::makeFromBoxedFunction<&kernel>());
      PyList_Append(taken, PyList_GET_ITEM(names, i));
    }
  } catch (python_error &e) {
    Py_DECREF(taken);
    e.restore();
    return nullptr;
  } catch (const std::exception &e) {
    Py_DECREF(taken);
    PyErr_SetString(PyExc_RuntimeError, e.what());
    return nullptr;
  }
  return taken;
}

// own_class(cls): a LazyTensor subclass whose calls the kernel also takes (XLAShardedTensor)
PyObject *own_class(PyObject *, PyObject *cls) {
  PyObject *td = PyType_Check(cls) ? own_dispatch(cls, "own_class") : nullptr;
  if (td == nullptr) {
    if (!PyErr_Occurred())
      PyErr_SetString(PyExc_TypeError, "own_class(cls): a class");
    return nullptr;
  }
  Py_XSETREF(own_cls, Py_NewRef(cls));
  Py_XSETREF(own_td, Py_NewRef(td));
  Py_XSETREF(own_types, PyTuple_Pack(1, cls));
  Py_RETURN_NONE;
}

// flag = on's truth; the old value as a bool
PyObject *toggle(bool &flag, PyObject *on) {
  int v = PyObject_IsTrue(on);
  if (v < 0)
    return nullptr;
  PyObject *was = PyBool_FromLong(flag);
  flag = v;
  return was;
}

// enable(on): whether the kernel takes calls to the entry (off: all go the fallback's way); the old setting
PyObject *enable(PyObject *, PyObject *on) { return toggle(enabled, on); }

// install_linear(route, linear, linear_backward, counts, config, functorch_active): linear_kernel at
// AutogradPrivateUse1 for aten::linear (see the kernel for the arguments)
PyObject *install_linear(PyObject *, PyObject *args) {
  PyObject *r, *op, *back, *counts, *config, *ft;
  if (!PyArg_ParseTuple(args, "OOOO!OO", &r, &op, &back, &PyDict_Type, &counts, &config, &ft))
    return nullptr;
  if (linear_library != nullptr) {
    PyErr_SetString(PyExc_RuntimeError, "install_linear: the kernel is installed already");
    return nullptr;
  }
  try {
    s_td = s_td != nullptr ? s_td : PyUnicode_InternFromString("__torch_dispatch__");
    s_fused = PyUnicode_InternFromString("fused_linear");
    s_fused_back = PyUnicode_InternFromString("fused_linear_backward");
    s_option = s_fused;  // config.fused_linear
    lin_route = Py_NewRef(r);
    lin_op = Py_NewRef(op);
    lin_back_op = Py_NewRef(back);
    lin_counts = Py_NewRef(counts);
    lin_config = Py_NewRef(config);
    functorch_active = Py_NewRef(ft);
    linear_library = std::make_unique<torch::Library>(torch::Library::IMPL, "aten",
                                                      c10::DispatchKey::AutogradPrivateUse1, __FILE__, __LINE__);
    linear_library->impl("linear", TORCH_FN(linear_kernel));
  } catch (const std::exception &e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
    return nullptr;
  }
  Py_RETURN_NONE;
}

// install_attention(apply, attention, attention_backward): what attention() hands calls to, and its two ops
PyObject *install_attention(PyObject *, PyObject *args) {
  PyObject *apply, *op, *back;
  if (!PyArg_ParseTuple(args, "OOO", &apply, &op, &back))
    return nullptr;
  if (lin_counts == nullptr) {
    PyErr_SetString(PyExc_RuntimeError, "install_attention: install_linear() first (it sets what both read)");
    return nullptr;
  }
  Py_XSETREF(att_apply, Py_NewRef(apply));
  Py_XSETREF(att_op, Py_NewRef(op));
  Py_XSETREF(att_back_op, Py_NewRef(back));
  Py_RETURN_NONE;
}

// attention_calls(): (calls attention() took, calls it handed to _FusedAttention.apply)
PyObject *attention_calls(PyObject *, PyObject *) {
  return Py_BuildValue("(LL)", static_cast<long long>(attention_taken), static_cast<long long>(attention_routed));
}

// linear_calls(): (calls linear_kernel took, calls it handed to the route)
PyObject *linear_calls(PyObject *, PyObject *) {
  return Py_BuildValue("(LL)", static_cast<long long>(linear_taken), static_cast<long long>(linear_routed));
}

// enable_nodes(on): whether linear_kernel and attention() take calls (off: all go to the Python route and
// _FusedAttention.apply); the old setting
PyObject *enable_nodes(PyObject *, PyObject *on) { return toggle(nodes_enabled, on); }

// calls(): (calls the kernel took to the entry, calls it handed to torch's fallback)
PyObject *calls(PyObject *, PyObject *) {
  return Py_BuildValue("(LL)", static_cast<long long>(fast_calls), static_cast<long long>(other_calls));
}

// ------------------------------------------------------------------------------------ DEVICE GUARD

// The guard of torch's Python backend path (torch/csrc/acc's PythonDeviceGuard) with type() answered in
// C++: one device, index 0, one default stream, events that are always complete.
struct Guard final : public c10::impl::DeviceGuardImplInterface {
  static constexpr c10::DeviceType kType = c10::DeviceType::PrivateUse1;
  c10::DeviceType type() const override { return kType; }
  c10::Device exchangeDevice(c10::Device) const override { return getDevice(); }
  c10::Device getDevice() const override { return c10::Device(kType, 0); }
  void setDevice(c10::Device) const override {}
  void uncheckedSetDevice(c10::Device) const noexcept override {}
  c10::Stream getStream(c10::Device) const noexcept override {
    return c10::Stream(c10::Stream::DEFAULT, c10::Device(kType, 0));
  }
  c10::Stream getNewStream(c10::Device, int) const override { return getStream(getDevice()); }
  c10::Stream exchangeStream(c10::Stream) const noexcept override { return getStream(getDevice()); }
  c10::DeviceIndex deviceCount() const noexcept override { return 1; }
  void record(void **, const c10::Stream &, const c10::DeviceIndex, const c10::EventFlag) const override {}
  void block(void *, const c10::Stream &) const override {}
  bool queryEvent(void *) const override { return true; }
  void destroyEvent(void *, const c10::DeviceIndex) const noexcept override {}
  bool queryStream(const c10::Stream &) const override { return true; }
  void synchronizeStream(const c10::Stream &) const override {}
};

// register_device_guard(): put Guard at PrivateUse1 unless a guard is there already (torch keeps the
// first); whether it did
PyObject *register_device_guard(PyObject *, PyObject *) {
  if (c10::impl::hasDeviceGuardImpl(Guard::kType))
    Py_RETURN_FALSE;
  static Guard guard;
  c10::impl::registerDeviceGuard(Guard::kType, &guard);
  Py_RETURN_TRUE;
}

// device_guard_is_ours(): whether PrivateUse1's guard is Guard
PyObject *device_guard_is_ours(PyObject *, PyObject *) {
  if (!c10::impl::hasDeviceGuardImpl(Guard::kType))
    Py_RETURN_FALSE;
  return PyBool_FromLong(dynamic_cast<const Guard *>(c10::impl::getDeviceGuardImpl(Guard::kType)) != nullptr);
}

PyMethodDef methods[] = {
    {"make_tensor", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(make_tensor)), METH_FASTCALL,
     "make_tensor(cls, (shape, dtype, stride), device): _make_wrapper_subclass(cls, shape, strides=stride, "
     "dtype=dtype, device=device) in C++."},
    {"install", install, METH_VARARGS,
     "install(lazy_cls, entry, names): the Python key's kernel for these ops (those it supports: returned)."},
    {"own_class", own_class, METH_O, "own_class(cls): a LazyTensor subclass the kernel also takes."},
    {"enable", enable, METH_O, "enable(on): whether the kernel takes calls to the entry; returns the old setting."},
    {"install_linear", install_linear, METH_VARARGS,
     "install_linear(route, linear, linear_backward, counts, config, functorch_active): F.linear's autograd "
     "kernel in C++."},
    {"linear_calls", linear_calls, METH_NOARGS, "linear_calls(): (calls the linear kernel took, calls it routed)."},
    {"enable_nodes", enable_nodes, METH_O,
     "enable_nodes(on): whether the linear kernel and attention() take calls; returns the old setting."},
    {"install_attention", install_attention, METH_VARARGS,
     "install_attention(apply, attention, attention_backward): what attention() hands other calls to; its ops."},
    {"attention", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(attention)), METH_FASTCALL,
     "attention(q, k, v, mask, bias, is_causal, scale): the fused attention with a C++ autograd node."},
    {"attention_calls", attention_calls, METH_NOARGS, "attention_calls(): (calls attention() took, calls routed)."},
    {"register_device_guard", register_device_guard, METH_NOARGS,
     "register_device_guard(): PrivateUse1's device guard in C++ unless one is registered; whether it was."},
    {"device_guard_is_ours", device_guard_is_ours, METH_NOARGS,
     "device_guard_is_ours(): whether PrivateUse1's device guard is register_device_guard's."},
    {"calls", calls, METH_NOARGS, "calls(): (calls taken to the entry, calls handed to torch's fallback)."},
    {nullptr, nullptr, 0, nullptr}};

PyModuleDef module = {PyModuleDef_HEAD_INIT, "_cxx", "The lazy core's C++ part (xla_dtensor.core.cxx).", -1,
                      methods};

}  // namespace

PyMODINIT_FUNC PyInit__cxx(void) {
  PyObject *m = PyModule_Create(&module);
  if (m == nullptr)
    return nullptr;
  PyObject *cap = PyCapsule_New(reinterpret_cast<void *>(&make), "xla_dtensor.core._cxx.MAKE", nullptr);
  if (cap == nullptr || PyModule_AddObject(m, "MAKE", cap) < 0) {
    Py_XDECREF(cap);
    Py_DECREF(m);
    return nullptr;
  }
  return m;
}
