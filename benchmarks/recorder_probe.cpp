// A recorder with no Python in its per-op path: what a C++ IR under torch's dispatcher would cost on this
// machine. A benchmark's probe (benchmarks/recorder_probe.py), not part of xla_dtensor.
//
// Tensors of PrivateUse1 (renamed "probe" by the Python side) are ProbeImpl: no data, a shared_ptr to the
// node that makes their value. One boxed kernel takes every op at the PrivateUse1 key (a fallback, plus the
// view ops whose composite kernels would make a plain TensorImpl). Per call it serializes the arguments into
// a signature (the op, each tensor's shape, stride and dtype, each scalar's value), finds the signature's
// plan (the output metadata; on a miss the op runs once on meta tensors, torch's own shape rules), makes one
// node (hash-consed), and wraps it in output tensors: a new one, a view sharing the input's storage, or the
// input itself for an in-place or out= op. Multi-output ops get one index node per output, as the lazy core
// records them. Nothing is ever computed: the probe measures recording only.
//
// Left out, on purpose: views' in-place writes reaching their base, the device program, sync. The device guard
// is the lazy core's (xla_dtensor/core/_cxx.cpp's register_device_guard, loaded without the rest of the library).
#include <Python.h>

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <c10/core/Allocator.h>
#include <c10/core/TensorImpl.h>
#include <torch/library.h>

#include <cstring>
#include <memory>
#include <unordered_map>
#include <vector>

namespace {

constexpr c10::DeviceType kType = c10::DeviceType::PrivateUse1;

struct Node {
  const c10::FunctionSchema *schema = nullptr;  // nullptr: a constant (a CPU tensor) or an index node
  std::vector<std::shared_ptr<Node>> inputs;
  std::vector<int64_t> statics;  // the call's signature: scalars and input metadata
  int64_t index = -1;            // an index node: output `index` of inputs[0]
  at::Tensor constant;
  size_t hash = 0;
};

int64_t nodes_made = 0, plan_misses = 0;
bool make_nodes = true;  // false: the floor (signature, plan and output tensors; no node)

struct ProbeImpl final : public c10::TensorImpl {
  ProbeImpl(c10::Storage &&storage, caffe2::TypeMeta dtype)
      : c10::TensorImpl(std::move(storage), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), dtype) {}
  std::shared_ptr<Node> node;

  template <typename VV>
  c10::intrusive_ptr<c10::TensorImpl> copy(VV &&version, bool allow_change) const {
    auto impl = c10::make_intrusive<ProbeImpl>(c10::Storage(storage()), dtype());
    copy_tensor_metadata(this, impl.get(), std::forward<VV>(version), allow_change);
    impl->node = node;
    impl->refresh_numel();
    return impl;
  }
  c10::intrusive_ptr<c10::TensorImpl> shallow_copy_and_detach(const c10::VariableVersion &version,
                                                              bool allow_change) const override {
    return copy(version, allow_change);
  }
  c10::intrusive_ptr<c10::TensorImpl> shallow_copy_and_detach(c10::VariableVersion &&version,
                                                              bool allow_change) const override {
    return copy(std::move(version), allow_change);
  }
};

ProbeImpl *probe_impl(const at::Tensor &t) {
  auto *impl = dynamic_cast<ProbeImpl *>(t.unsafeGetTensorImpl());
  TORCH_CHECK(impl != nullptr, "recorder probe: a ", t.device(), " tensor without a node (made by a kernel the ",
              "probe does not take)");
  return impl;
}

// ------------------------------------------------------------------------------------- signature

void put_meta(const at::Tensor &t, std::vector<int64_t> &key) {
  key.push_back(static_cast<int64_t>(t.scalar_type()));
  key.push_back(t.dim());
  for (auto s : t.sizes()) key.push_back(s);
  for (auto s : t.strides()) key.push_back(s);
  key.push_back(t.storage_offset());
}

void put(const c10::IValue &v, std::vector<int64_t> &key) {
  if (v.isNone()) {
    key.push_back(0);
  } else if (v.isTensor()) {
    const at::Tensor &t = v.toTensor();
    key.push_back(t.defined() ? (t.device().type() == kType ? 1 : 2) : 0);
    if (t.defined()) put_meta(t, key);
  } else if (v.isBool()) {
    key.push_back(3), key.push_back(v.toBool());
  } else if (v.isInt()) {
    key.push_back(4), key.push_back(v.toInt());
  } else if (v.isDouble()) {
    double d = v.toDouble();
    int64_t bits;
    std::memcpy(&bits, &d, sizeof bits);
    key.push_back(5), key.push_back(bits);
  } else if (v.isSymInt()) {
    key.push_back(4), key.push_back(v.toSymInt().guard_int(__FILE__, __LINE__));
  } else if (v.isIntList()) {
    auto l = v.toIntList();
    key.push_back(6), key.push_back(static_cast<int64_t>(l.size()));
    for (int64_t x : l) key.push_back(x);
  } else if (v.isDevice()) {
    key.push_back(7), key.push_back(static_cast<int64_t>(v.toDevice().type())), key.push_back(v.toDevice().index());
  } else if (v.isString()) {
    key.push_back(8), key.push_back(static_cast<int64_t>(std::hash<std::string>{}(v.toStringRef())));
  } else if (v.isList()) {
    auto l = v.toListRef();
    key.push_back(9), key.push_back(static_cast<int64_t>(l.size()));
    for (const auto &x : l) put(x, key);
  } else if (v.isScalar()) {
    put(v.toScalar().isFloatingPoint() ? c10::IValue(v.toScalar().toDouble()) : c10::IValue(v.toScalar().toLong()),
        key);
  } else {
    TORCH_CHECK(false, "recorder probe: an argument of type ", v.tagKind(), " is not taken");
  }
}

struct VecHash {
  size_t operator()(const std::vector<int64_t> &v) const noexcept {
    size_t h = v.size();
    for (int64_t x : v) h ^= static_cast<size_t>(x) + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
    return h;
  }
};

// ------------------------------------------------------------------------------------------- plans

struct Out {
  enum Kind { NONE, NEW, VIEW, WRITE, VALUE } kind = NONE;
  int arg = -1;  // VIEW / WRITE: the aliased argument
  std::vector<int64_t> sizes, strides;
  int64_t offset = 0;
  at::ScalarType dtype = at::kFloat;
  c10::IValue value;  // VALUE: a non-tensor result
};

struct Plan {
  std::vector<Out> outs;  // flattened over tensor lists
  std::vector<int> list_len;  // per return: -1 a tensor or value, else a list's length
};

std::unordered_map<std::vector<int64_t>, Plan, VecHash> plans;
std::unordered_map<size_t, std::shared_ptr<Node>> cons;

at::Tensor meta_of(const at::Tensor &t) {
  if (!t.defined()) return t;
  int64_t extent = t.storage_offset() + 1;
  for (int64_t d = 0; d < t.dim(); d++) extent += (t.size(d) - 1) * t.stride(d);
  if (t.numel() == 0) extent = t.storage_offset();
  auto base = at::empty({extent}, at::TensorOptions().dtype(t.scalar_type()).device(at::kMeta));
  return base.as_strided(t.sizes(), t.strides(), t.storage_offset());
}

c10::IValue to_meta(const c10::IValue &v) {
  if (v.isTensor()) return meta_of(v.toTensor());
  if (v.isDevice() && v.toDevice().type() == kType) return c10::Device(at::kMeta);
  if (v.isTensorList()) {
    c10::List<at::Tensor> l;
    for (const at::Tensor &t : v.toTensorList()) l.push_back(meta_of(t));
    return l;
  }
  if (v.isOptionalTensorList()) {
    c10::List<std::optional<at::Tensor>> l;
    for (std::optional<at::Tensor> t : v.toOptionalTensorList())
      l.push_back(t.has_value() ? std::optional<at::Tensor>(meta_of(*t)) : std::nullopt);
    return l;
  }
  return v;
}

int alias_arg(const c10::FunctionSchema &schema, const c10::AliasInfo &out) {
  const auto &args = schema.arguments();
  for (size_t i = 0; i < args.size(); i++) {
    const c10::AliasInfo *a = args[i].alias_info();
    if (a == nullptr) continue;
    for (const auto &s : a->beforeSets())
      if (out.beforeSets().count(s)) return static_cast<int>(i);
  }
  return -1;
}

Out out_of(const c10::IValue &r, const c10::Argument &ret, const c10::FunctionSchema &schema) {
  Out o;
  if (!r.isTensor()) {
    o.kind = Out::VALUE;
    o.value = r;
    return o;
  }
  const at::Tensor &t = r.toTensor();
  if (!t.defined()) return o;
  o.sizes.assign(t.sizes().begin(), t.sizes().end());
  o.strides.assign(t.strides().begin(), t.strides().end());
  o.offset = t.storage_offset();
  o.dtype = t.scalar_type();
  o.kind = Out::NEW;
  if (const c10::AliasInfo *a = ret.alias_info()) {
    o.arg = alias_arg(schema, *a);
    TORCH_CHECK(o.arg >= 0, "recorder probe: ", schema.name(), " returns an alias of no argument");
    o.kind = a->isWrite() ? Out::WRITE : Out::VIEW;
  }
  return o;
}

Plan make_plan(const c10::OperatorHandle &op, const torch::jit::Stack &args) {
  plan_misses++;
  torch::jit::Stack stack;
  for (const auto &v : args) stack.push_back(to_meta(v));
  op.callBoxed(stack);
  Plan plan;
  const auto &schema = op.schema();
  for (size_t i = 0; i < stack.size(); i++) {
    const c10::IValue &r = stack[i];
    if (r.isTensorList()) {
      auto l = r.toTensorList();
      plan.list_len.push_back(static_cast<int>(l.size()));
      for (const at::Tensor &t : l) plan.outs.push_back(out_of(t, schema.returns()[i], schema));
    } else {
      plan.list_len.push_back(-1);
      plan.outs.push_back(out_of(r, schema.returns()[i], schema));
    }
  }
  return plan;
}

// ------------------------------------------------------------------------------------------ record

std::shared_ptr<Node> constant(const at::Tensor &t) {
  auto n = std::make_shared<Node>();
  n->constant = t;
  n->hash = reinterpret_cast<size_t>(n.get());
  nodes_made++;
  return n;
}

void inputs_of(const c10::IValue &v, std::vector<std::shared_ptr<Node>> &out) {
  if (v.isTensor()) {
    const at::Tensor &t = v.toTensor();
    if (t.defined()) out.push_back(t.device().type() == kType ? probe_impl(t)->node : constant(t));
  } else if (v.isTensorList()) {
    for (const at::Tensor &t : v.toTensorList()) inputs_of(t, out);
  } else if (v.isOptionalTensorList()) {
    for (std::optional<at::Tensor> t : v.toOptionalTensorList())
      if (t.has_value()) inputs_of(*t, out);
  }
}

std::shared_ptr<Node> hash_cons(std::shared_ptr<Node> n) {
  size_t h = VecHash{}(n->statics) ^ (static_cast<size_t>(n->index) * 31);
  for (const auto &i : n->inputs) h = h * 1000003 ^ i->hash;
  n->hash = h;
  auto it = cons.find(h);
  if (it != cons.end() && it->second->schema == n->schema && it->second->index == n->index &&
      it->second->statics == n->statics && it->second->inputs == n->inputs)
    return it->second;
  cons[h] = n;
  nodes_made++;
  return n;
}

at::Tensor new_tensor(const Out &o, std::shared_ptr<Node> node, const at::Tensor *base) {
  auto dtype = c10::scalarTypeToTypeMeta(o.dtype);
  c10::Storage storage;
  if (base != nullptr) {
    storage = base->storage();
  } else {
    int64_t nbytes = at::detail::computeStorageNbytes(o.sizes, o.strides, dtype.itemsize(), o.offset);
    storage = c10::Storage(c10::Storage::use_byte_size_t{}, nbytes, c10::DataPtr{nullptr, c10::Device(kType, 0)},
                           c10::GetAllocator(c10::kMeta), /*resizable=*/true);
  }
  auto impl = c10::make_intrusive<ProbeImpl>(std::move(storage), dtype);
  impl->set_sizes_and_strides(o.sizes, o.strides, o.offset);
  impl->node = std::move(node);
  return at::Tensor(std::move(impl));
}

void record(const c10::OperatorHandle &op, torch::jit::Stack *stack) {
  const auto &schema = op.schema();
  size_t n_args = schema.arguments().size();
  torch::jit::Stack args(std::make_move_iterator(stack->end() - n_args), std::make_move_iterator(stack->end()));
  stack->erase(stack->end() - n_args, stack->end());

  std::vector<int64_t> key;
  key.reserve(32);
  key.push_back(reinterpret_cast<int64_t>(&schema));
  for (const auto &v : args) put(v, key);
  auto found = plans.find(key);
  if (found == plans.end()) found = plans.emplace(key, make_plan(op, args)).first;
  const Plan &plan = found->second;

  std::shared_ptr<Node> node;
  if (make_nodes) {
    node = std::make_shared<Node>();
    node->schema = &schema;
    node->statics = std::move(key);
    for (const auto &v : args) inputs_of(v, node->inputs);
    node = hash_cons(std::move(node));
  }

  size_t n_tensors = 0;
  for (const auto &o : plan.outs) n_tensors += o.kind != Out::NONE && o.kind != Out::VALUE;
  size_t k = 0;
  auto one = [&](const Out &o) -> c10::IValue {
    size_t i = k++;
    if (o.kind == Out::VALUE) return o.value;
    if (o.kind == Out::NONE) return at::Tensor();
    std::shared_ptr<Node> item = node;
    if (n_tensors > 1 && make_nodes) {
      auto ix = std::make_shared<Node>();
      ix->index = static_cast<int64_t>(i);
      ix->inputs.push_back(node);
      item = hash_cons(std::move(ix));
    }
    if (o.kind == Out::WRITE) {
      const at::Tensor &target = args[o.arg].toTensor();
      auto *impl = probe_impl(target);
      impl->node = std::move(item);
      if (!target.sizes().equals(o.sizes)) impl->set_sizes_and_strides(o.sizes, o.strides, o.offset);
      return target;
    }
    return new_tensor(o, std::move(item), o.kind == Out::VIEW ? &args[o.arg].toTensor() : nullptr);
  };
  for (int len : plan.list_len) {
    if (len < 0) {
      stack->push_back(one(plan.outs[k]));
    } else {
      c10::List<at::Tensor> l;
      l.reserve(len);
      for (int j = 0; j < len; j++) l.push_back(one(plan.outs[k]).toTensor());
      stack->push_back(std::move(l));
    }
  }
}

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) { m.fallback(torch::CppFunction::makeFromBoxedFunction<&record>()); }

// view ops whose composite kernels make a plain TensorImpl (alias_with_sizes_and_strides): the probe's kernel
TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  for (const char *name : {"detach", "alias", "view", "_unsafe_view", "_reshape_alias", "transpose.int", "t",
                           "permute", "expand", "unsqueeze", "squeeze", "squeeze.dim", "squeeze.dims",
                           "slice.Tensor", "select.int", "split.Tensor", "split_with_sizes", "unbind.int",
                           "as_strided", "narrow", "diagonal", "unfold", "view_as_real", "view_as_complex",
                           "lift_fresh", "_to_copy", "empty.memory_format", "empty_strided", "copy_"})
    m.impl(name, torch::CppFunction::makeFromBoxedFunction<&record>());
}

// ------------------------------------------------------------------------------------ device hooks

// what autograd's engine asks of a PrivateUse1 backend
struct Hooks final : public at::PrivateUse1HooksInterface {
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return true; }
  bool hasPrimaryContext(c10::DeviceIndex) const override { return true; }
  c10::DeviceIndex deviceCount() const override { return 1; }
  c10::DeviceIndex getCurrentDevice() const override { return 0; }
};

Hooks hooks;

// ------------------------------------------------------------------------------------------ module

PyObject *counts(PyObject *, PyObject *) {
  return Py_BuildValue("(LLn)", static_cast<long long>(nodes_made), static_cast<long long>(plan_misses),
                       static_cast<Py_ssize_t>(plans.size()));
}

PyObject *reset(PyObject *, PyObject *) {
  cons.clear();
  Py_RETURN_NONE;
}

PyObject *set_nodes(PyObject *, PyObject *on) {
  make_nodes = PyObject_IsTrue(on) == 1;
  Py_RETURN_NONE;
}

PyMethodDef methods[] = {
    {"set_nodes", set_nodes, METH_O, "set_nodes(on): whether ops make nodes (off: the floor below recording)."},
    {"counts", counts, METH_NOARGS, "counts(): (nodes made, plan misses, plans held)."},
    {"reset", reset, METH_NOARGS, "reset(): drop the hash-cons table (a step's end)."},
    {nullptr, nullptr, 0, nullptr}};

PyModuleDef module = {PyModuleDef_HEAD_INIT, "_recorder_probe", "A C++ recorder probe (benchmarks).", -1, methods};

}  // namespace

PyMODINIT_FUNC PyInit__recorder_probe(void) {
  if (!at::isPrivateUse1HooksRegistered())
    at::RegisterPrivateUse1HooksInterface(&hooks);
  return PyModule_Create(&module);
}
