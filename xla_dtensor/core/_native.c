/* The lazy recorder's hot path in C: IR nodes, hash-consing, the tape, call signatures.
 *
 * Same semantics as the Python in ir.py and signature.py, which stay the reference (and
 * the path taken where this module is not built: XLA_DTENSOR_NATIVE=0, no compiler).
 * State stays Python's: the cons table, the tape and its base are read from ir.py's
 * globals at each call, STATE.consing from the core's state object, the counters are
 * metrics._COUNTS. Nothing here imports torch: tensors are reached through their Python
 * attributes (_chain, _storage, _meta) and the functions given to configure_signature().
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>

/* ---------------------------------------------------------------- Node */

typedef struct {
    PyObject_HEAD
    PyObject *op, *key, *inputs, *hash, *fn, *data, *sharding;
    long long seq, tix;
    PyObject *weakreflist;
} NodeObject;

static PyTypeObject NodeType;
static long long node_seq = 0;

static NodeObject *
node_make(PyObject *op, PyObject *key, PyObject *inputs, PyObject *h, PyObject *fn, PyObject *data)
{
    NodeObject *n = PyObject_GC_New(NodeObject, &NodeType);
    if (n == NULL)
        return NULL;
    n->op = Py_NewRef(op);
    n->key = Py_NewRef(key);
    n->inputs = Py_NewRef(inputs);
    n->hash = Py_NewRef(h);
    n->fn = Py_NewRef(fn);
    n->data = Py_NewRef(data);
    n->sharding = Py_NewRef(Py_None);
    n->seq = node_seq++;
    n->tix = -1;
    n->weakreflist = NULL;
    PyObject_GC_Track(n);
    return n;
}

static PyObject *
node_vectorcall(PyObject *type, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    Py_ssize_t n = PyVectorcall_NARGS(nargsf);
    if (kwnames != NULL && PyTuple_GET_SIZE(kwnames) != 0) {
        PyErr_SetString(PyExc_TypeError, "Node() takes positional arguments only");
        return NULL;
    }
    if (n != 5 && n != 6) {
        PyErr_Format(PyExc_TypeError, "Node() takes 5 or 6 arguments (op, key, inputs, hash, fn[, data]), got %zd", n);
        return NULL;
    }
    if (!PyTuple_CheckExact(args[2])) {
        PyErr_Format(PyExc_TypeError, "Node inputs must be a tuple, got %.100s", Py_TYPE(args[2])->tp_name);
        return NULL;
    }
    return (PyObject *)node_make(args[0], args[1], args[2], args[3], args[4], n == 6 ? args[5] : Py_None);
}

static PyObject *
node_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    if (kwds != NULL && PyDict_GET_SIZE(kwds) != 0) {
        PyErr_SetString(PyExc_TypeError, "Node() takes positional arguments only");
        return NULL;
    }
    return node_vectorcall((PyObject *)type, &PyTuple_GET_ITEM(args, 0), PyTuple_GET_SIZE(args), NULL);
}

static int
node_traverse(NodeObject *n, visitproc visit, void *arg)
{
    Py_VISIT(n->op);
    Py_VISIT(n->key);
    Py_VISIT(n->inputs);
    Py_VISIT(n->hash);
    Py_VISIT(n->fn);
    Py_VISIT(n->data);
    Py_VISIT(n->sharding);
    return 0;
}

static int
node_clear(NodeObject *n)
{
    Py_CLEAR(n->op);
    Py_CLEAR(n->key);
    Py_CLEAR(n->inputs);
    Py_CLEAR(n->hash);
    Py_CLEAR(n->fn);
    Py_CLEAR(n->data);
    Py_CLEAR(n->sharding);
    return 0;
}

static void
node_dealloc(NodeObject *n)
{
    PyObject_GC_UnTrack(n);
    /* NOTE: the trashcan: freeing a long chain of nodes (a loop that never syncs) would recurse once per node */
    Py_TRASHCAN_BEGIN(n, node_dealloc)
    if (n->weakreflist != NULL)
        PyObject_ClearWeakRefs((PyObject *)n);
    node_clear(n);
    Py_TYPE(n)->tp_free((PyObject *)n);
    Py_TRASHCAN_END
}

static PyObject *
node_repr(NodeObject *n)
{
    unsigned long long h = PyLong_Check(n->hash) ? (unsigned long long)PyLong_AsLongLong(n->hash) & 0xffffffffULL : 0;
    if (PyErr_Occurred())
        PyErr_Clear();
    char hex[16];
    snprintf(hex, sizeof hex, "%08llx", h);
    if (n->fn == Py_None)
        return PyUnicode_FromFormat("Node(%S, leaf, hash=%s)", n->op, hex);
    return PyUnicode_FromFormat("Node(%S, %zd inputs, hash=%s)", n->op, PyTuple_GET_SIZE(n->inputs), hex);
}

/* A packed member's data (core.packs): a leaf whose data is an instance of packed_type reads as
 * packed_read(node), its own array unpacked from the pack; ``raw`` is the stored object. */
static PyObject *packed_type = NULL, *packed_read = NULL;

static PyObject *
node_get_data(NodeObject *n, void *closure)
{
    if (packed_type != NULL && (PyObject *)Py_TYPE(n->data) == packed_type)
        return PyObject_CallOneArg(packed_read, (PyObject *)n);
    return Py_NewRef(n->data);
}

static int
node_set_data(NodeObject *n, PyObject *value, void *closure)
{
    if (value == NULL) {
        PyErr_SetString(PyExc_AttributeError, "a node's data cannot be deleted");
        return -1;
    }
    Py_SETREF(n->data, Py_NewRef(value));
    return 0;
}

static PyObject *
configure_packed(PyObject *self, PyObject *args)
{
    PyObject *type, *read;
    if (!PyArg_ParseTuple(args, "OO", &type, &read))
        return NULL;
    Py_XSETREF(packed_type, Py_NewRef(type));
    Py_XSETREF(packed_read, Py_NewRef(read));
    Py_RETURN_NONE;
}

static PyObject *
node_is_leaf(NodeObject *n, void *closure)
{
    return Py_NewRef(n->fn == Py_None ? Py_True : Py_False);
}

static PyMemberDef node_members[] = {
    {"op", T_OBJECT, offsetof(NodeObject, op), READONLY, NULL},
    {"key", T_OBJECT, offsetof(NodeObject, key), READONLY, NULL},
    {"inputs", T_OBJECT, offsetof(NodeObject, inputs), READONLY, NULL},
    {"hash", T_OBJECT, offsetof(NodeObject, hash), READONLY, NULL},
    {"fn", T_OBJECT, offsetof(NodeObject, fn), READONLY, NULL},
    {"raw", T_OBJECT, offsetof(NodeObject, data), READONLY, NULL},
    {"sharding", T_OBJECT, offsetof(NodeObject, sharding), 0, NULL},
    {"seq", T_LONGLONG, offsetof(NodeObject, seq), READONLY, NULL},
    {"tix", T_LONGLONG, offsetof(NodeObject, tix), 0, NULL},
    {"__weaklistoffset__", T_PYSSIZET, offsetof(NodeObject, weakreflist), READONLY, NULL},
    {NULL}
};

static PyGetSetDef node_getset[] = {
    {"is_leaf", (getter)node_is_leaf, NULL, "Whether this node is a leaf (no fn).", NULL},
    {"data", (getter)node_get_data, (setter)node_set_data, "A leaf's value (a packed member's own array).", NULL},
    {NULL}
};

static PyTypeObject NodeType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "xla_dtensor.core._native.Node",
    .tp_doc = PyDoc_STR("One value of the lazy graph (see xla_dtensor.core.ir.Node)."),
    .tp_basicsize = sizeof(NodeObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = node_new,
    .tp_vectorcall = node_vectorcall,
    .tp_dealloc = (destructor)node_dealloc,
    .tp_traverse = (traverseproc)node_traverse,
    .tp_clear = (inquiry)node_clear,
    .tp_repr = (reprfunc)node_repr,
    .tp_members = node_members,
    .tp_getset = node_getset,
    .tp_weaklistoffset = offsetof(NodeObject, weakreflist),
};

/* ---------------------------------------------------------------- configuration */

static PyObject *ir_globals;   /* ir.py's module dict: _CONS, _TAPE, _BASE, CONS_LIMIT, TAPE_LIMIT, _drop_tape */
static PyObject *state;        /* the core's STATE (consing, ...) */
static PyObject *counts;       /* metrics._COUNTS */
static PyObject *lazy_type;    /* LazyTensor */
static PyObject *subclasses;   /* its subclasses (a set) */
static PyObject *value_of;     /* tensor.value_of (a view's value) */
static PyObject *arg_slow;     /* signature._arg, for anything not handled here */
static PyObject *signature_globals;  /* signature.py's globals: its ``param_leaf`` (this module's, unless replaced) */
static PyObject *param_leaf_self;    /* this module's param_leaf function object */
static PyObject *s_param_leaf;
static PyObject *param_op;     /* ir.PARAM */
static PyObject *ptype_int, *ptype_float, *ptype_complex;  /* the signature entries of a parameter */
static PyObject *pkey_int, *pkey_float, *pkey_complex;     /* (PARAM, type): a parameter leaf's key */
static PyObject *phash_int, *phash_float, *phash_complex;  /* and its hash */

static PyObject *s_CONS, *s_TAPE, *s_BASE, *s_CONS_LIMIT, *s_TAPE_LIMIT, *s_drop_tape, *s_consing;
static PyObject *s_ops_recorded, *s_hash_cons_hits, *s_chain, *s_storage, *s_value, *s_meta;
static PyObject *s_scalar_flags, *s_no_flags, *s_scalar_kw;

/* STATE's fields read and written in place: CoreState is a slots dataclass, each field a member at a fixed
 * offset of the object (PyObject_GetAttr's type lookup and descriptor call cost ~40 ns a field, ~8 reads
 * and writes an op). -1: not a plain object member (another state object): the attribute protocol. */
static Py_ssize_t off_consing = -1, off_owner = -1, off_modes = -1, off_eager_state = -1;

#ifndef Py_T_OBJECT_EX
#define Py_T_OBJECT_EX T_OBJECT_EX
#endif

static Py_ssize_t
member_offset(PyObject *obj, const char *name)
{
    PyObject *d = PyDict_GetItemString(Py_TYPE(obj)->tp_dict, name);
    if (d == NULL || !Py_IS_TYPE(d, &PyMemberDescr_Type))
        return -1;
    PyMemberDef *m = ((PyMemberDescrObject *)d)->d_member;
    return m->type == Py_T_OBJECT_EX && !(m->flags & READONLY) ? m->offset : -1;
}

/* getattr(STATE, name): a new reference, or NULL with an error set */
static PyObject *
state_get(Py_ssize_t off, PyObject *name)
{
    if (off < 0)
        return PyObject_GetAttr(state, name);
    PyObject *v = *(PyObject **)((char *)state + off);
    if (v == NULL) {
        PyErr_SetObject(PyExc_AttributeError, name);
        return NULL;
    }
    return Py_NewRef(v);
}

/* setattr(STATE, name, value) */
static int
state_set(Py_ssize_t off, PyObject *name, PyObject *value)
{
    if (off < 0)
        return PyObject_SetAttr(state, name, value);
    PyObject **slot = (PyObject **)((char *)state + off);
    Py_XSETREF(*slot, Py_NewRef(value));
    return 0;
}

/* configure_ir(ir_globals, state, counts): what ir.py's functions read */
static PyObject *
configure_ir(PyObject *self, PyObject *args)
{
    PyObject *g, *st, *c;
    if (!PyArg_ParseTuple(args, "O!OO!", &PyDict_Type, &g, &st, &PyDict_Type, &c))
        return NULL;
    PyObject *param = PyDict_GetItemString(g, "PARAM");
    if (param == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "configure_ir: the ir globals have no PARAM");
        return NULL;
    }
    PyObject *types[3] = {(PyObject *)&PyLong_Type, (PyObject *)&PyFloat_Type, (PyObject *)&PyComplex_Type};
    PyObject **pk[3] = {&pkey_int, &pkey_float, &pkey_complex};
    PyObject **ph[3] = {&phash_int, &phash_float, &phash_complex};
    for (int i = 0; i < 3; i++) {
        PyObject *key = PyTuple_Pack(2, param, types[i]);
        if (key == NULL)
            return NULL;
        Py_hash_t h = PyObject_Hash(key);
        PyObject *hv = h == -1 ? NULL : PyLong_FromSsize_t(h);
        if (hv == NULL) {
            Py_DECREF(key);
            return NULL;
        }
        Py_XSETREF(*pk[i], key);
        Py_XSETREF(*ph[i], hv);
    }
    Py_XSETREF(param_op, Py_NewRef(param));
    Py_XSETREF(ir_globals, Py_NewRef(g));
    Py_XSETREF(state, Py_NewRef(st));
    off_consing = member_offset(st, "consing");
    off_owner = member_offset(st, "owner");
    off_modes = member_offset(st, "modes");
    off_eager_state = member_offset(st, "eager_state");
    Py_XSETREF(counts, Py_NewRef(c));
    Py_RETURN_NONE;
}

/* configure_signature(lazy_type, subclasses, value_of, arg, ptype, signature_globals): what signature() reads */
static PyObject *
configure_signature(PyObject *self, PyObject *args)
{
    PyObject *lt, *sub, *vo, *ar, *ptype, *sg;
    if (!PyArg_ParseTuple(args, "OO!OOO!O!", &lt, &PySet_Type, &sub, &vo, &ar, &PyDict_Type, &ptype, &PyDict_Type, &sg))
        return NULL;
    PyObject *mine = PyObject_GetAttrString(self, "param_leaf");
    if (mine == NULL)
        return NULL;
    Py_XSETREF(param_leaf_self, mine);
    Py_XSETREF(signature_globals, Py_NewRef(sg));
    PyObject *types[3] = {(PyObject *)&PyLong_Type, (PyObject *)&PyFloat_Type, (PyObject *)&PyComplex_Type};
    PyObject **pt[3] = {&ptype_int, &ptype_float, &ptype_complex};
    for (int i = 0; i < 3; i++) {
        PyObject *e = PyDict_GetItem(ptype, types[i]);
        if (e == NULL) {
            PyErr_SetString(PyExc_RuntimeError, "configure_signature: ptype lacks int, float or complex");
            return NULL;
        }
        Py_XSETREF(*pt[i], Py_NewRef(e));
    }
    Py_XSETREF(lazy_type, Py_NewRef(lt));
    Py_XSETREF(subclasses, Py_NewRef(sub));
    Py_XSETREF(value_of, Py_NewRef(vo));
    Py_XSETREF(arg_slow, Py_NewRef(ar));
    Py_RETURN_NONE;
}

static int
configured(void)
{
    if (ir_globals == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "xla_dtensor.core._native used before configure_ir()");
        return 0;
    }
    return 1;
}

static int
signature_configured(void)
{
    if (lazy_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "xla_dtensor.core._native.signature used before configure_signature()");
        return 0;
    }
    return configured();
}

/* counts[name] += n */
static int
count(PyObject *name, Py_ssize_t n)
{
    if (n == 0)
        return 0;
    PyObject *old = PyDict_GetItemWithError(counts, name);
    if (old == NULL && PyErr_Occurred())
        return -1;
    PyObject *add = PyLong_FromSsize_t(n);
    if (add == NULL)
        return -1;
    PyObject *new = old == NULL ? Py_NewRef(add) : PyNumber_Add(old, add);
    Py_DECREF(add);
    if (new == NULL)
        return -1;
    int r = PyDict_SetItem(counts, name, new);
    Py_DECREF(new);
    return r;
}

/* STATE.consing as 0/1, -1 on error */
static int
consing(void)
{
    PyObject *v = state_get(off_consing, s_consing);
    if (v == NULL)
        return -1;
    int r = PyObject_IsTrue(v);
    Py_DECREF(v);
    return r;
}

static Py_ssize_t
global_ssize(PyObject *name)
{
    PyObject *v = PyDict_GetItemWithError(ir_globals, name);
    if (v == NULL) {
        if (!PyErr_Occurred())
            PyErr_Format(PyExc_RuntimeError, "ir has no %S", name);
        return -1;
    }
    return PyLong_AsSsize_t(v);
}

/* hash((key_hash, *map(hash_of, inputs))) */
static PyObject *
node_hash(PyObject *key_hash, PyObject *inputs)
{
    Py_ssize_t n = PyTuple_GET_SIZE(inputs);
    PyObject *t = PyTuple_New(n + 1);
    if (t == NULL)
        return NULL;
    PyTuple_SET_ITEM(t, 0, Py_NewRef(key_hash));
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *x = PyTuple_GET_ITEM(inputs, i);
        PyObject *h = Py_IS_TYPE(x, &NodeType) ? Py_NewRef(((NodeObject *)x)->hash) : PyObject_GetAttrString(x, "hash");
        if (h == NULL) {
            Py_DECREF(t);
            return NULL;
        }
        PyTuple_SET_ITEM(t, i + 1, h);
    }
    Py_hash_t h = PyObject_Hash(t);
    Py_DECREF(t);
    return h == -1 ? NULL : PyLong_FromSsize_t(h);
}

/* Put node on the tape (when there is one): node.tix = _BASE + len(tape); drop the tape past TAPE_LIMIT. */
static int
tape_append(NodeObject *node)
{
    PyObject *tape = PyDict_GetItemWithError(ir_globals, s_TAPE);
    if (tape == NULL)
        return PyErr_Occurred() ? -1 : 0;
    if (tape == Py_None)
        return 0;
    Py_ssize_t base = global_ssize(s_BASE);
    if (base == -1 && PyErr_Occurred())
        return -1;
    node->tix = (long long)base + PyList_GET_SIZE(tape);
    if (PyList_Append(tape, (PyObject *)node) < 0)
        return -1;
    Py_ssize_t limit = global_ssize(s_TAPE_LIMIT);
    if (limit == -1 && PyErr_Occurred())
        return -1;
    if (PyList_GET_SIZE(tape) > limit) {
        PyObject *drop = PyDict_GetItemWithError(ir_globals, s_drop_tape);
        if (drop == NULL)
            return -1;
        PyObject *r = PyObject_CallNoArgs(drop);
        if (r == NULL)
            return -1;
        Py_DECREF(r);
    }
    return 0;
}

/* ---------------------------------------------------------------- make_node, getitems */

static PyObject *
cons_key(PyObject *key_hash, PyObject *inputs)
{
    Py_ssize_t n = PyTuple_GET_SIZE(inputs);
    PyObject *ck = PyTuple_New(n + 1);
    if (ck == NULL)
        return NULL;
    PyTuple_SET_ITEM(ck, 0, Py_NewRef(key_hash));
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *id = PyLong_FromVoidPtr(PyTuple_GET_ITEM(inputs, i));
        if (id == NULL) {
            Py_DECREF(ck);
            return NULL;
        }
        PyTuple_SET_ITEM(ck, i + 1, id);
    }
    return ck;
}

static PyObject *
make_node(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "make_node(op, key, key_hash, inputs, fn)");
        return NULL;
    }
    if (!configured())
        return NULL;
    PyObject *op = args[0], *key = args[1], *key_hash = args[2], *inputs = args[3], *fn = args[4];
    if (!PyTuple_CheckExact(inputs)) {
        PyErr_Format(PyExc_TypeError, "make_node: inputs must be a tuple, got %.100s", Py_TYPE(inputs)->tp_name);
        return NULL;
    }
    int cons = consing();
    if (cons < 0)
        return NULL;
    if (!cons) {
        if (count(s_ops_recorded, 1) < 0)
            return NULL;
        PyObject *h = node_hash(key_hash, inputs);
        if (h == NULL)
            return NULL;
        PyObject *node = (PyObject *)node_make(op, key, inputs, h, fn, Py_None);
        Py_DECREF(h);
        return node;
    }
    PyObject *table = PyDict_GetItemWithError(ir_globals, s_CONS);
    if (table == NULL || !PyDict_Check(table)) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_RuntimeError, "ir._CONS is not a dict");
        return NULL;
    }
    PyObject *ck = cons_key(key_hash, inputs);
    if (ck == NULL)
        return NULL;
    PyObject *hit = PyDict_GetItemWithError(table, ck);
    if (hit == NULL && PyErr_Occurred())
        goto fail;
    if (hit != NULL) {
        PyObject *hk = Py_IS_TYPE(hit, &NodeType) ? ((NodeObject *)hit)->key : NULL;
        int same = hk == key ? 1 : hk == NULL ? 0 : PyObject_RichCompareBool(hk, key, Py_EQ);
        if (same < 0)
            goto fail;
        if (same) {
            Py_DECREF(ck);
            if (count(s_hash_cons_hits, 1) < 0)
                return NULL;
            return Py_NewRef(hit);
        }
    }
    PyObject *h = node_hash(key_hash, inputs);
    if (h == NULL)
        goto fail;
    NodeObject *node = node_make(op, key, inputs, h, fn, Py_None);
    Py_DECREF(h);
    if (node == NULL)
        goto fail;
    Py_ssize_t limit = global_ssize(s_CONS_LIMIT);
    if ((limit == -1 && PyErr_Occurred()) || (PyDict_GET_SIZE(table) >= limit && (PyDict_Clear(table), 0)) ||
        PyDict_SetItem(table, ck, (PyObject *)node) < 0 || tape_append(node) < 0 || count(s_ops_recorded, 1) < 0) {
        Py_DECREF(node);
        goto fail;
    }
    Py_DECREF(ck);
    return (PyObject *)node;
fail:
    Py_DECREF(ck);
    return NULL;
}

/* getitems(node, indices, table): table[i] is (key, its hash, fn) for output i (ir._getitem_table). */
static PyObject *
getitems(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "getitems(node, indices, table, getitem_op)");
        return NULL;
    }
    if (!configured())
        return NULL;
    PyObject *node = args[0], *indices = args[1], *table = args[2], *gop = args[3];
    if (!PyList_CheckExact(indices) || !PyList_CheckExact(table) || !Py_IS_TYPE(node, &NodeType)) {
        PyErr_SetString(PyExc_TypeError, "getitems: a Node, a list of indices and the getitem table");
        return NULL;
    }
    int cons = consing();
    if (cons < 0)
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(indices);
    PyObject *out = PyList_New(n);
    if (out == NULL)
        return NULL;
    PyObject *cons_table = NULL, *tape = Py_None, *nid = NULL, *inputs = NULL;
    Py_ssize_t base = 0, hits = 0, made = 0;
    PyObject *nh = ((NodeObject *)node)->hash;
    if (cons) {
        cons_table = PyDict_GetItemWithError(ir_globals, s_CONS);
        tape = PyDict_GetItemWithError(ir_globals, s_TAPE);
        if (cons_table == NULL || tape == NULL)
            goto fail;
        base = global_ssize(s_BASE);
        if (base == -1 && PyErr_Occurred())
            goto fail;
        Py_ssize_t limit = global_ssize(s_CONS_LIMIT);
        if (limit == -1 && PyErr_Occurred())
            goto fail;
        if (PyDict_GET_SIZE(cons_table) + n >= limit)
            PyDict_Clear(cons_table);
        nid = PyLong_FromVoidPtr(node);
        if (nid == NULL)
            goto fail;
    }
    inputs = PyTuple_Pack(1, node);
    if (inputs == NULL)
        goto fail;
    PyObject *pair = PyTuple_New(2);  /* (kh, nh): hashed for the node's hash */
    if (pair == NULL)
        goto fail;
    PyTuple_SET_ITEM(pair, 1, Py_NewRef(nh));
    PyTuple_SET_ITEM(pair, 0, Py_NewRef(Py_None));
    for (Py_ssize_t k = 0; k < n; k++) {
        Py_ssize_t i = PyLong_AsSsize_t(PyList_GET_ITEM(indices, k));
        if (i == -1 && PyErr_Occurred())
            goto fail_pair;
        if (i < 0 || i >= PyList_GET_SIZE(table)) {
            PyErr_Format(PyExc_IndexError, "getitems: output %zd has no table entry", i);
            goto fail_pair;
        }
        PyObject *ent = PyList_GET_ITEM(table, i);
        PyObject *key = PyTuple_GET_ITEM(ent, 0), *kh = PyTuple_GET_ITEM(ent, 1), *fn = PyTuple_GET_ITEM(ent, 2);
        PyObject *ck = NULL, *g = NULL;
        if (cons) {
            ck = PyTuple_Pack(2, kh, nid);
            if (ck == NULL)
                goto fail_pair;
            PyObject *hit = PyDict_GetItemWithError(cons_table, ck);
            if (hit == NULL && PyErr_Occurred()) {
                Py_DECREF(ck);
                goto fail_pair;
            }
            if (hit != NULL && Py_IS_TYPE(hit, &NodeType)) {
                int same = PyObject_RichCompareBool(((NodeObject *)hit)->key, key, Py_EQ);
                if (same < 0) {
                    Py_DECREF(ck);
                    goto fail_pair;
                }
                if (same) {
                    hits++;
                    g = Py_NewRef(hit);
                }
            }
        }
        if (g == NULL) {
            Py_SETREF(PyTuple_GET_ITEM(pair, 0), Py_NewRef(kh));
            Py_hash_t h = PyObject_Hash(pair);
            PyObject *hv = h == -1 ? NULL : PyLong_FromSsize_t(h);
            if (hv == NULL) {
                Py_XDECREF(ck);
                goto fail_pair;
            }
            g = (PyObject *)node_make(gop, key, inputs, hv, fn, Py_None);
            Py_DECREF(hv);
            if (g == NULL || (cons && (PyDict_SetItem(cons_table, ck, g) < 0 || tape_append((NodeObject *)g) < 0))) {
                Py_XDECREF(g);
                Py_XDECREF(ck);
                goto fail_pair;
            }
            made++;
        }
        Py_XDECREF(ck);
        PyList_SET_ITEM(out, k, g);
    }
    Py_DECREF(pair);
    Py_DECREF(inputs);
    Py_XDECREF(nid);
    if (count(s_hash_cons_hits, hits) < 0 || count(s_ops_recorded, made) < 0) {
        Py_DECREF(out);
        return NULL;
    }
    return out;
fail_pair:
    Py_DECREF(pair);
fail:
    Py_XDECREF(inputs);
    Py_XDECREF(nid);
    Py_DECREF(out);
    return NULL;
}

/* ---------------------------------------------------------------- param_leaf, signature */

static PyObject *
param_leaf_of(PyObject *value, PyObject *tp, int cons)
{
    PyObject *key = tp == (PyObject *)&PyLong_Type ? pkey_int : tp == (PyObject *)&PyFloat_Type ? pkey_float : pkey_complex;
    PyObject *h = tp == (PyObject *)&PyLong_Type ? phash_int : tp == (PyObject *)&PyFloat_Type ? phash_float : phash_complex;
    NodeObject *node = node_make(param_op, key, PyTuple_New(0) /* the empty tuple is a singleton */, h, Py_None, value);
    if (node == NULL)
        return NULL;
    Py_DECREF(node->inputs);  /* PyTuple_New(0)'s reference, now held by the node */
    if (cons && tape_append(node) < 0) {
        Py_DECREF(node);
        return NULL;
    }
    return (PyObject *)node;
}

static PyObject *
param_leaf(PyObject *self, PyObject *value)
{
    if (!configured())
        return NULL;
    PyObject *tp = (PyObject *)Py_TYPE(value);
    if (tp != (PyObject *)&PyLong_Type && tp != (PyObject *)&PyFloat_Type && tp != (PyObject *)&PyComplex_Type) {
        PyErr_Format(PyExc_TypeError, "param_leaf takes an int, float or complex, got %.100s", Py_TYPE(value)->tp_name);
        return NULL;
    }
    int cons = consing();
    return cons < 0 ? NULL : param_leaf_of(value, tp, cons);
}

static int
is_lazy(PyObject *a)
{
    PyObject *tp = (PyObject *)Py_TYPE(a);
    if (tp == lazy_type)
        return 1;
    return PySet_GET_SIZE(subclasses) ? PySet_Contains(subclasses, tp) : 0;
}

/* a lazy tensor's current value: its storage's, or value_of(a) for a view; appended to dyn */
static int
lazy_value(PyObject *a, PyObject *dyn)
{
    PyObject *chain = PyObject_GetAttr(a, s_chain);
    if (chain == NULL)
        return -1;
    int view = PyObject_IsTrue(chain);
    Py_DECREF(chain);
    if (view < 0)
        return -1;
    PyObject *v;
    if (view) {
        v = PyObject_CallOneArg(value_of, a);
    } else {
        PyObject *s = PyObject_GetAttr(a, s_storage);
        if (s == NULL)
            return -1;
        v = PyObject_GetAttr(s, s_value);
        Py_DECREF(s);
    }
    if (v == NULL)
        return -1;
    int r = PyList_Append(dyn, v);
    Py_DECREF(v);
    return r;
}

static PyObject *arg(PyObject *a, int scal, PyObject *dyn, int cons);

static PyObject *
arg_seq(PyObject *a, int scal, PyObject *dyn, int cons)
{
    Py_ssize_t n = PySequence_Fast_GET_SIZE(a);
    PyObject **items = PySequence_Fast_ITEMS(a);
    PyObject *out = PyTuple_New(n);
    if (out == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *x = arg(items[i], scal, dyn, cons);
        if (x == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyTuple_SET_ITEM(out, i, x);
    }
    return out;
}

/* The signature entry of argument a (see signature._arg), appending its graph inputs to dyn. */
static PyObject *
arg(PyObject *a, int scal, PyObject *dyn, int cons)
{
    PyTypeObject *tp = Py_TYPE(a);
    if (a == Py_None || tp == &PyBool_Type || tp == &PyUnicode_Type)
        return Py_NewRef(a);
    if (tp == &PyLong_Type || tp == &PyFloat_Type || tp == &PyComplex_Type) {
        if (scal) {
            int zero_or_one;
            if (tp == &PyFloat_Type) {
                double d = PyFloat_AS_DOUBLE(a);
                zero_or_one = d == 0.0 || d == 1.0;
            } else if (tp == &PyLong_Type) {
                int overflow;
                long v = PyLong_AsLongAndOverflow(a, &overflow);
                zero_or_one = !overflow && (v == 0 || v == 1);
            } else {
                Py_complex c = PyComplex_AsCComplex(a);
                zero_or_one = c.imag == 0.0 && (c.real == 0.0 || c.real == 1.0);
            }
            if (!zero_or_one) {
                /* signature.param_leaf, as the Python path calls it (compile's tracer watches it: jit.hyper) */
                PyObject *make = PyDict_GetItemWithError(signature_globals, s_param_leaf);
                if (make == NULL) {
                    if (!PyErr_Occurred())
                        PyErr_SetString(PyExc_RuntimeError, "xla_dtensor.core.signature has no param_leaf");
                    return NULL;
                }
                PyObject *leaf = make == param_leaf_self ? param_leaf_of(a, (PyObject *)tp, cons)
                                                         : PyObject_CallOneArg(make, a);
                if (leaf == NULL)
                    return NULL;
                int r = PyList_Append(dyn, leaf);
                Py_DECREF(leaf);
                if (r < 0)
                    return NULL;
                return Py_NewRef(tp == &PyLong_Type ? ptype_int : tp == &PyFloat_Type ? ptype_float : ptype_complex);
            }
        }
        return PyTuple_Pack(2, (PyObject *)tp, a);
    }
    if (tp == &PyList_Type || tp == &PyTuple_Type)
        return arg_seq(a, scal, dyn, cons);
    int lazy = is_lazy(a);
    if (lazy < 0)
        return NULL;
    if (lazy) {
        if (lazy_value(a, dyn) < 0)
            return NULL;
        return PyObject_GetAttr(a, s_meta);
    }
    /* anything else (dtypes, devices, CPU tensors, errors): the Python reference */
    PyObject *flag = scal ? Py_True : Py_False;
    PyObject *call[3] = {a, flag, dyn};
    return PyObject_Vectorcall(arg_slow, call, 3, NULL);
}

/* signature(args, kwargs, info, scalars, dyn): see signature.signature */
static PyObject *
signature(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "signature(args, kwargs, info, scalars, dyn)");
        return NULL;
    }
    if (!signature_configured())
        return NULL;
    PyObject *cargs = args[0], *kwargs = args[1], *info = args[2], *dyn = args[4];
    int scalars = PyObject_IsTrue(args[3]);
    if (scalars < 0)
        return NULL;
    if (!PyTuple_Check(cargs) || !PyDict_Check(kwargs) || !PyList_CheckExact(dyn)) {
        PyErr_SetString(PyExc_TypeError, "signature: args a tuple, kwargs a dict, dyn a list");
        return NULL;
    }
    int cons = consing();
    if (cons < 0)
        return NULL;
    PyObject *flags = PyObject_GetAttr(info, scalars ? s_scalar_flags : s_no_flags);
    if (flags == NULL)
        return NULL;
    if (!PyTuple_Check(flags)) {
        Py_DECREF(flags);
        PyErr_SetString(PyExc_TypeError, "signature: info's flags must be a tuple");
        return NULL;
    }
    Py_ssize_t n = PyTuple_GET_SIZE(cargs), nf = PyTuple_GET_SIZE(flags);
    Py_ssize_t nk = PyDict_GET_SIZE(kwargs);
    PyObject *key = PyTuple_New(n + nk);
    if (key == NULL) {
        Py_DECREF(flags);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        int scal = i < nf && PyTuple_GET_ITEM(flags, i) == Py_True;
        PyObject *x = arg(PyTuple_GET_ITEM(cargs, i), scal, dyn, cons);
        if (x == NULL)
            goto fail;
        PyTuple_SET_ITEM(key, i, x);
    }
    if (nk) {
        PyObject *sk = NULL;
        if (scalars) {
            sk = PyObject_GetAttr(info, s_scalar_kw);
            if (sk == NULL)
                goto fail;
        }
        Py_ssize_t pos = 0, i = n;
        PyObject *k, *v;
        while (PyDict_Next(kwargs, &pos, &k, &v)) {
            int scal = sk != NULL ? PySequence_Contains(sk, k) : 0;
            PyObject *x = scal < 0 ? NULL : arg(v, scal, dyn, cons);
            PyObject *item = x == NULL ? NULL : PyTuple_Pack(2, k, x);
            Py_XDECREF(x);
            if (item == NULL) {
                Py_XDECREF(sk);
                goto fail;
            }
            PyTuple_SET_ITEM(key, i++, item);
        }
        Py_XDECREF(sk);
    }
    Py_DECREF(flags);
    return key;
fail:
    Py_DECREF(flags);
    Py_DECREF(key);
    return NULL;
}

/* ---------------------------------------------------------------- Storage */

typedef struct {
    PyObject_HEAD
    PyObject *value, *meta, *donor, *owner, *layout;
    long long version, seq;
    PyObject *weakreflist;
} StorageObject;

static PyTypeObject StorageType;
static PyObject *storage_seq;  /* tensor._SEQ: storages count their creation order with Python's counter */
static PyObject *me_fn;        /* threads.me: the owner of what the calling thread records */
static PyObject *lock;         /* threads.LOCK */
static PyObject *lock_acquire, *lock_release, *lock_is_owned;  /* its bound methods */
static PyObject *live_data, *live_remove;  /* tensor.LIVE's set of weak references, and its removal callback */
static PyObject *s_owner, *s_is_owned, *s_acquire, *s_release, *s_version;

static StorageObject *
storage_make(PyObject *value, PyObject *meta, PyObject *owner)
{
    PyObject *seq = PyIter_Next(storage_seq);
    long long at = seq == NULL ? -1 : PyLong_AsLongLong(seq);
    Py_XDECREF(seq);
    if (at == -1) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_RuntimeError, "the storage counter ended");
        return NULL;
    }
    StorageObject *s = PyObject_GC_New(StorageObject, &StorageType);
    if (s == NULL)
        return NULL;
    s->value = Py_NewRef(value);
    s->meta = Py_NewRef(meta);
    s->donor = Py_NewRef(Py_None);
    s->owner = Py_NewRef(owner);
    s->layout = Py_NewRef(Py_None);
    s->version = 0;
    s->seq = at;
    s->weakreflist = NULL;
    PyObject_GC_Track(s);
    return s;
}

/* threads.me(), without its Python frame inside an op: STATE.owner while this thread holds the lock */
static PyObject *
current_owner(void)
{
    PyObject *owner = state_get(off_owner, s_owner);
    if (owner == NULL)
        return NULL;
    int set = PyObject_IsTrue(owner);
    if (set > 0) {
        PyObject *held = PyObject_CallNoArgs(lock_is_owned);
        if (held == NULL) {
            Py_DECREF(owner);
            return NULL;
        }
        set = held == Py_True;
        Py_DECREF(held);
    }
    if (set)
        return owner;
    Py_DECREF(owner);
    return set < 0 ? NULL : PyObject_CallNoArgs(me_fn);
}

static PyObject *
storage_vectorcall(PyObject *type, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    Py_ssize_t n = PyVectorcall_NARGS(nargsf);
    if ((kwnames != NULL && PyTuple_GET_SIZE(kwnames) != 0) || n != 2) {
        PyErr_SetString(PyExc_TypeError, "Storage(value, meta) takes two positional arguments");
        return NULL;
    }
    if (me_fn == NULL || storage_seq == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "Storage made before configure_tensor()");
        return NULL;
    }
    PyObject *owner = current_owner();
    if (owner == NULL)
        return NULL;
    PyObject *s = (PyObject *)storage_make(args[0], args[1], owner);
    Py_DECREF(owner);
    return s;
}

static PyObject *
storage_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    if (kwds != NULL && PyDict_GET_SIZE(kwds) != 0) {
        PyErr_SetString(PyExc_TypeError, "Storage(value, meta) takes two positional arguments");
        return NULL;
    }
    return storage_vectorcall((PyObject *)type, &PyTuple_GET_ITEM(args, 0), PyTuple_GET_SIZE(args), NULL);
}

static int
storage_traverse(StorageObject *s, visitproc visit, void *arg)
{
    Py_VISIT(s->value);
    Py_VISIT(s->meta);
    Py_VISIT(s->donor);
    Py_VISIT(s->owner);
    Py_VISIT(s->layout);
    return 0;
}

static int
storage_clear(StorageObject *s)
{
    Py_CLEAR(s->value);
    Py_CLEAR(s->meta);
    Py_CLEAR(s->donor);
    Py_CLEAR(s->owner);
    Py_CLEAR(s->layout);
    return 0;
}

static void
storage_dealloc(StorageObject *s)
{
    PyObject_GC_UnTrack(s);
    Py_TRASHCAN_BEGIN(s, storage_dealloc)
    if (s->weakreflist != NULL)
        PyObject_ClearWeakRefs((PyObject *)s);
    storage_clear(s);
    Py_TYPE(s)->tp_free((PyObject *)s);
    Py_TRASHCAN_END
}

static PyMemberDef storage_members[] = {
    {"value", T_OBJECT, offsetof(StorageObject, value), 0, NULL},
    {"meta", T_OBJECT, offsetof(StorageObject, meta), 0, NULL},
    {"donor", T_OBJECT, offsetof(StorageObject, donor), 0, NULL},
    {"owner", T_OBJECT, offsetof(StorageObject, owner), 0, NULL},
    {"layout", T_OBJECT, offsetof(StorageObject, layout), 0, NULL},
    {"version", T_LONGLONG, offsetof(StorageObject, version), 0, NULL},
    {"seq", T_LONGLONG, offsetof(StorageObject, seq), READONLY, NULL},
    {"__weaklistoffset__", T_PYSSIZET, offsetof(StorageObject, weakreflist), READONLY, NULL},
    {NULL}
};

static PyTypeObject StorageType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "xla_dtensor.core._native.Storage",
    .tp_doc = PyDoc_STR("The value cell shared by a root tensor and its views (see xla_dtensor.core.tensor.Storage)."),
    .tp_basicsize = sizeof(StorageObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = storage_new,
    .tp_vectorcall = storage_vectorcall,
    .tp_dealloc = (destructor)storage_dealloc,
    .tp_traverse = (traverseproc)storage_traverse,
    .tp_clear = (inquiry)storage_clear,
    .tp_members = storage_members,
    .tp_weaklistoffset = offsetof(StorageObject, weakreflist),
};

/* ---------------------------------------------------------------- output tensors */

static PyObject *make_wrapper;  /* torch.Tensor._make_wrapper_subclass */
typedef PyObject *(*make_fn)(PyObject *cls, PyObject *meta, PyObject *device);
static make_fn maker;           /* core/_cxx.cpp's MAKE: the same tensor without torch's argument parser */
static PyObject *out_local;     /* tensor.OUT: the class of the tensors ops make on this thread */
static PyObject *device;        /* the jax device */
static PyObject *wrapper_kwnames;  /* ("strides", "dtype", "device") */
static PyObject *empty_tuple;
static PyObject *s_cls, *s_vcache, *s_seen;

/* configure_tensor(lazy_type, make_wrapper, out, device, me, lock, live_data, live_remove, seq) */
static PyObject *
configure_tensor(PyObject *self, PyObject *args)
{
    PyObject *lt, *mw, *out, *dev, *me, *lk, *ld, *lr, *sq;
    if (!PyArg_ParseTuple(args, "OOOOOOO!OO", &lt, &mw, &out, &dev, &me, &lk, &PySet_Type, &ld, &lr, &sq))
        return NULL;
    if (!PyIter_Check(sq)) {
        PyErr_SetString(PyExc_TypeError, "configure_tensor: seq must be an iterator (tensor._SEQ)");
        return NULL;
    }
    Py_XSETREF(storage_seq, Py_NewRef(sq));
    Py_XSETREF(lazy_type, Py_NewRef(lt));
    Py_XSETREF(make_wrapper, Py_NewRef(mw));
    Py_XSETREF(out_local, Py_NewRef(out));
    Py_XSETREF(device, Py_NewRef(dev));
    Py_XSETREF(me_fn, Py_NewRef(me));
    PyObject *acq = PyObject_GetAttr(lk, s_acquire), *rel = PyObject_GetAttr(lk, s_release),
             *own = PyObject_GetAttr(lk, s_is_owned);
    if (acq == NULL || rel == NULL || own == NULL) {
        Py_XDECREF(acq);
        Py_XDECREF(rel);
        Py_XDECREF(own);
        return NULL;
    }
    Py_XSETREF(lock_acquire, acq);
    Py_XSETREF(lock_release, rel);
    Py_XSETREF(lock_is_owned, own);
    Py_XSETREF(lock, Py_NewRef(lk));
    Py_XSETREF(live_data, Py_NewRef(ld));
    Py_XSETREF(live_remove, Py_NewRef(lr));
    Py_RETURN_NONE;
}

/* a fresh wrapper tensor of metadata meta = (shape, dtype, stride) */
static PyObject *
wrapper(PyObject *meta)
{
    if (!PyTuple_Check(meta) || PyTuple_GET_SIZE(meta) != 3) {
        PyErr_SetString(PyExc_TypeError, "a tensor's meta is (shape, dtype, stride)");
        return NULL;
    }
    PyObject *cls = PyObject_GetAttr(out_local, s_cls);
    if (cls == NULL)
        return NULL;
    if (cls == Py_None)
        Py_SETREF(cls, Py_NewRef(lazy_type));
    PyObject *t;
    if (maker != NULL) {
        t = maker(cls, meta, device);
    } else {
        PyObject *call[5] = {cls, PyTuple_GET_ITEM(meta, 0), PyTuple_GET_ITEM(meta, 2), PyTuple_GET_ITEM(meta, 1), device};
        t = PyObject_Vectorcall(make_wrapper, call, 2, wrapper_kwnames);
    }
    Py_DECREF(cls);
    return t;
}

/* configure_maker(capsule or None): make output tensors with core/_cxx.cpp's MAKE (None: _make_wrapper_subclass) */
static PyObject *
configure_maker(PyObject *self, PyObject *capsule)
{
    if (capsule == Py_None) {
        maker = NULL;
        Py_RETURN_NONE;
    }
    void *fn = PyCapsule_GetPointer(capsule, "xla_dtensor.core._cxx.MAKE");
    if (fn == NULL)
        return NULL;
    maker = (make_fn)fn;
    Py_RETURN_NONE;
}

static int
set3(PyObject *t, PyObject *storage, PyObject *chain, PyObject *meta)
{
    if (PyObject_SetAttr(t, s_storage, storage) < 0 || PyObject_SetAttr(t, s_chain, chain) < 0 ||
        PyObject_SetAttr(t, s_meta, meta) < 0)
        return -1;
    return 0;
}

/* a root tensor holding value, its storage owned by owner (a new reference, or NULL: look it up) */
static PyObject *
new_tensor_c(PyObject *meta, PyObject *value)
{
    PyObject *t = wrapper(meta);
    if (t == NULL)
        return NULL;
    PyObject *owner = current_owner();
    if (owner == NULL) {
        Py_DECREF(t);
        return NULL;
    }
    StorageObject *s = storage_make(value, meta, owner);
    Py_DECREF(owner);
    if (s == NULL) {
        Py_DECREF(t);
        return NULL;
    }
    PyObject *ref = PyWeakref_NewRef((PyObject *)s, live_remove);
    int bad = ref == NULL || PySet_Add(live_data, ref) < 0 || set3(t, (PyObject *)s, empty_tuple, meta) < 0;
    Py_XDECREF(ref);
    Py_DECREF(s);
    if (bad) {
        Py_DECREF(t);
        return NULL;
    }
    return t;
}

static PyObject *
new_view_c(PyObject *meta, PyObject *storage, PyObject *chain, PyObject *value)
{
    PyObject *t = wrapper(meta);
    if (t == NULL)
        return NULL;
    PyObject *version = PyObject_GetAttr(storage, s_version);
    if (version == NULL || set3(t, storage, chain, meta) < 0 || PyObject_SetAttr(t, s_vcache, value) < 0 ||
        PyObject_SetAttr(t, s_seen, version) < 0) {
        Py_XDECREF(version);
        Py_DECREF(t);
        return NULL;
    }
    Py_DECREF(version);
    return t;
}

static PyObject *
new_tensor(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "new_tensor(meta, value)");
        return NULL;
    }
    if (make_wrapper == NULL || !configured()) {
        PyErr_SetString(PyExc_RuntimeError, "new_tensor used before configure_tensor()");
        return NULL;
    }
    return new_tensor_c(args[0], args[1]);
}

static PyObject *
new_view(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "new_view(meta, storage, chain, value)");
        return NULL;
    }
    if (make_wrapper == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "new_view used before configure_tensor()");
        return NULL;
    }
    return new_view_c(args[0], args[1], args[2], args[3]);
}

/* alias(op, args, kwargs): the special handler of detach/alias/lift_fresh (special._alias): a view of
 * args[0] with its storage, chain and value */
static PyObject *
alias(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3 || !PyTuple_Check(args[1]) || PyTuple_GET_SIZE(args[1]) < 1) {
        PyErr_SetString(PyExc_TypeError, "alias(op, (tensor, ...), kwargs)");
        return NULL;
    }
    if (make_wrapper == NULL || !signature_configured())
        return NULL;
    PyObject *t = PyTuple_GET_ITEM(args[1], 0);
    PyObject *one = PyList_New(0);
    if (one == NULL)
        return NULL;
    PyObject *meta = NULL, *storage = NULL, *chain = NULL, *res = NULL;
    if (lazy_value(t, one) == 0 && (meta = PyObject_GetAttr(t, s_meta)) != NULL &&
        (storage = PyObject_GetAttr(t, s_storage)) != NULL && (chain = PyObject_GetAttr(t, s_chain)) != NULL)
        res = new_view_c(meta, storage, chain, PyList_GET_ITEM(one, 0));
    Py_DECREF(one);
    Py_XDECREF(meta);
    Py_XDECREF(storage);
    Py_XDECREF(chain);
    return res;
}

/* ---------------------------------------------------------------- record */

/* ---------------------------------------------------------------- a sync's outputs */

/* data_leaves(keys, arrays, data_op): [Node(data_op, k, (), h, None, a) for (k, h), a in zip(keys, arrays)] */
static PyObject *
data_leaves(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3 || !PyList_CheckExact(args[0]) || !PyList_CheckExact(args[1]) ||
        PyList_GET_SIZE(args[0]) < PyList_GET_SIZE(args[1])) {
        PyErr_SetString(PyExc_TypeError, "data_leaves(keys, arrays, data_op): two lists, a key per array");
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(args[1]);
    PyObject *out = PyList_New(n);
    if (out == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *kh = PyList_GET_ITEM(args[0], i);
        if (!PyTuple_CheckExact(kh) || PyTuple_GET_SIZE(kh) != 2) {
            PyErr_SetString(PyExc_TypeError, "data_leaves: each key is (key, hash)");
            Py_DECREF(out);
            return NULL;
        }
        NodeObject *leaf = node_make(args[2], PyTuple_GET_ITEM(kh, 0), empty_tuple, PyTuple_GET_ITEM(kh, 1), Py_None,
                                     PyList_GET_ITEM(args[1], i));
        if (leaf == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, i, (PyObject *)leaf);
    }
    return out;
}

/* rebind(pending, where, leaves): each storage's value its leaf (leaves[where[i]], or leaves[i] when where is
   None), its version one more; the leaves on the tape (executor._sync's end) */
static PyObject *
rebind(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3 || !PyList_CheckExact(args[0]) || !PyList_CheckExact(args[2]) ||
        (args[1] != Py_None && !PyList_CheckExact(args[1]))) {
        PyErr_SetString(PyExc_TypeError, "rebind(pending, where, leaves): lists (where: a list or None)");
        return NULL;
    }
    PyObject *pending = args[0], *where = args[1], *leaves = args[2];
    Py_ssize_t n = PyList_GET_SIZE(pending), m = PyList_GET_SIZE(leaves);
    if ((where == Py_None ? m : PyList_GET_SIZE(where)) < n) {
        PyErr_SetString(PyExc_ValueError, "rebind: fewer leaves (or positions) than storages");
        return NULL;
    }
    for (Py_ssize_t i = 0; i < m; i++)
        if (!Py_IS_TYPE(PyList_GET_ITEM(leaves, i), &NodeType)) {
            PyErr_SetString(PyExc_TypeError, "rebind: leaves must be Nodes");
            return NULL;
        }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *st = PyList_GET_ITEM(pending, i);
        Py_ssize_t k = i;
        if (where != Py_None) {
            k = PyLong_AsSsize_t(PyList_GET_ITEM(where, i));
            if (k == -1 && PyErr_Occurred())
                return NULL;
        }
        if (!Py_IS_TYPE(st, &StorageType) || k < 0 || k >= m) {
            PyErr_SetString(PyExc_TypeError, "rebind: a Storage and a leaf position in range");
            return NULL;
        }
        StorageObject *s = (StorageObject *)st;
        Py_SETREF(s->value, Py_NewRef(PyList_GET_ITEM(leaves, k)));
        s->version++;
    }
    for (Py_ssize_t i = 0; i < m; i++)
        if (tape_append((NodeObject *)PyList_GET_ITEM(leaves, i)) < 0)
            return NULL;
    Py_RETURN_NONE;
}

/* ---------------------------------------------------------------- write */

static PyObject *write_py;  /* tensor.write's Python path: a view's write (a scatter into its storage's value) */

/* configure_write(python_write) */
static PyObject *
configure_write(PyObject *self, PyObject *fn)
{
    Py_XSETREF(write_py, Py_NewRef(fn));
    Py_RETURN_NONE;
}

/* tensor.write(t, value, owner=0) in C: a root tensor's storage rebound to value; a view's write (or a
   storage not of this module) goes to the Python path */
static PyObject *
write_c(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs < 2 || nargs > 3) {
        PyErr_SetString(PyExc_TypeError, "write(t, value, owner=0)");
        return NULL;
    }
    if (write_py == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "write called before configure_write()");
        return NULL;
    }
    PyObject *chain = PyObject_GetAttr(args[0], s_chain);
    if (chain == NULL)
        return NULL;
    int chained = PyObject_IsTrue(chain);
    Py_DECREF(chain);
    if (chained < 0)
        return NULL;
    PyObject *st = chained ? NULL : PyObject_GetAttr(args[0], s_storage);
    if (!chained && st == NULL)
        return NULL;
    if (chained || Py_TYPE(st) != &StorageType || Py_TYPE(((StorageObject *)st)->value) != &NodeType) {
        Py_XDECREF(st);
        return PyObject_Vectorcall(write_py, args, nargs, NULL);
    }
    StorageObject *s = (StorageObject *)st;
    PyObject *owner;
    int given = nargs == 3 ? PyObject_IsTrue(args[2]) : 0;
    if (given < 0 || (owner = given ? Py_NewRef(args[2]) : current_owner()) == NULL) {
        Py_DECREF(st);
        return NULL;
    }
    if (((NodeObject *)s->value)->fn == Py_None) {  /* the donor: the leaf's id (a reference would keep its buffer) */
        PyObject *donor = PyLong_FromVoidPtr(s->value);
        if (donor == NULL) {
            Py_DECREF(owner);
            Py_DECREF(st);
            return NULL;
        }
        Py_SETREF(s->donor, donor);
    }
    Py_SETREF(s->owner, owner);
    Py_SETREF(s->value, Py_NewRef(args[1]));
    s->version++;
    Py_DECREF(st);
    Py_RETURN_NONE;
}

static PyObject *entries_by_id;  /* dispatch._ENTRIES: id(op) -> _Op */
static PyObject *record_py;      /* dispatch.record's Python path (a new op) */
static PyObject *recorded_py;    /* dispatch._recorded: the rest after the signature */
static PyObject *getitems_py;    /* ir.getitems(node, indices) */
static PyObject *kind_fn, *kind_view;
static PyObject *s_info, *s_static_scalars, *s_entries, *s_returns_list, *s_kind, *s_random, *s_outs, *s_step,
    *s_key, *s_h, *s_fn;

/* configure_record(entries, record, recorded, fn_kind, view_kind, getitems) */
static PyObject *
configure_record(PyObject *self, PyObject *args)
{
    PyObject *e, *r, *rd, *kf, *kv, *gi;
    if (!PyArg_ParseTuple(args, "O!OOOOO", &PyDict_Type, &e, &r, &rd, &kf, &kv, &gi))
        return NULL;
    Py_XSETREF(getitems_py, Py_NewRef(gi));
    Py_XSETREF(entries_by_id, Py_NewRef(e));
    Py_XSETREF(record_py, Py_NewRef(r));
    Py_XSETREF(recorded_py, Py_NewRef(rd));
    Py_XSETREF(kind_fn, Py_NewRef(kf));
    Py_XSETREF(kind_view, Py_NewRef(kv));
    Py_RETURN_NONE;
}

/* the node of entry e over inputs dyn (a list) */
static PyObject *
entry_node(PyObject *op, PyObject *e, PyObject *dyn)
{
    PyObject *key = PyObject_GetAttr(e, s_key), *h = PyObject_GetAttr(e, s_h), *fn = PyObject_GetAttr(e, s_fn);
    PyObject *inputs = PyList_AsTuple(dyn);
    PyObject *node = NULL;
    if (key != NULL && h != NULL && fn != NULL && inputs != NULL) {
        PyObject *call[5] = {op, key, h, inputs, fn};
        node = make_node(NULL, call, 5);
    }
    Py_XDECREF(key);
    Py_XDECREF(h);
    Py_XDECREF(fn);
    Py_XDECREF(inputs);
    return node;
}

/* the tuple (or list) of tensors of entry e's outputs (metas outs; None: no tensor), as dispatch._wrap_many */
static PyObject *
many_outputs(PyObject *op, PyObject *e, PyObject *dyn, PyObject *outs, int listed)
{
    Py_ssize_t n = PyList_GET_SIZE(outs);
    PyObject *node = entry_node(op, e, dyn);
    if (node == NULL)
        return NULL;
    PyObject *idx = PyList_New(0), *res = NULL, *items = NULL;
    if (idx == NULL)
        goto done;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (PyList_GET_ITEM(outs, i) == Py_None)
            continue;
        PyObject *k = PyLong_FromSsize_t(i);
        if (k == NULL || PyList_Append(idx, k) < 0) {
            Py_XDECREF(k);
            goto done;
        }
        Py_DECREF(k);
    }
    {
        PyObject *call[2] = {node, idx};
        items = PyObject_Vectorcall(getitems_py, call, 2, NULL);
    }
    if (items == NULL || !PyList_Check(items) || PyList_GET_SIZE(items) != PyList_GET_SIZE(idx)) {
        if (items != NULL && !PyErr_Occurred())
            PyErr_SetString(PyExc_RuntimeError, "getitems returned the wrong number of nodes");
        goto done;
    }
    res = PyTuple_New(n);
    if (res == NULL)
        goto done;
    for (Py_ssize_t i = 0, j = 0; i < n; i++) {
        PyObject *meta = PyList_GET_ITEM(outs, i);
        PyObject *t = meta == Py_None ? Py_NewRef(Py_None) : new_tensor_c(meta, PyList_GET_ITEM(items, j++));
        if (t == NULL) {
            Py_CLEAR(res);
            goto done;
        }
        PyTuple_SET_ITEM(res, i, t);
    }
    if (listed) {
        Py_SETREF(res, PySequence_List(res));
    }
done:
    Py_DECREF(node);
    Py_XDECREF(idx);
    Py_XDECREF(items);
    return res;
}

/* record(op, args, kwargs): dispatch.record; the common cases (one output of a known signature: a
 * plain op, a view) here, the rest in Python */
static PyObject *
record(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "record(op, args, kwargs)");
        return NULL;
    }
    if (entries_by_id == NULL || make_wrapper == NULL || !signature_configured()) {
        PyErr_SetString(PyExc_RuntimeError, "record used before configure_record() and configure_tensor()");
        return NULL;
    }
    PyObject *op = args[0], *cargs = args[1], *kwargs = args[2];
    PyObject *id = PyLong_FromVoidPtr(op);
    if (id == NULL)
        return NULL;
    PyObject *st = PyDict_GetItemWithError(entries_by_id, id);
    Py_DECREF(id);
    if (st == NULL) {
        if (PyErr_Occurred())
            return NULL;
        return PyObject_Vectorcall(record_py, args, 3, NULL);
    }
    Py_INCREF(st);
    PyObject *res = NULL, *info = NULL, *stat = NULL, *entries = NULL, *dyn = NULL, *sig = NULL;
    info = PyObject_GetAttr(st, s_info);
    stat = PyObject_GetAttr(st, s_static_scalars);
    entries = PyObject_GetAttr(st, s_entries);
    dyn = PyList_New(0);
    if (info == NULL || stat == NULL || entries == NULL || dyn == NULL || !PyDict_Check(entries))
        goto done;
    PyObject *sargs[5] = {cargs, kwargs, info, stat == Py_True ? Py_False : Py_True, dyn};
    sig = signature(NULL, sargs, 5);
    if (sig == NULL)
        goto done;
    PyObject *e = PyDict_GetItemWithError(entries, sig);
    if (e == NULL && PyErr_Occurred())
        goto done;
    if (e != NULL) {
        Py_INCREF(e);  /* borrowed from the table, which Python code below could change */
        PyObject *kind = PyObject_GetAttr(e, s_kind), *rnd = PyObject_GetAttr(e, s_random);
        PyObject *outs = PyObject_GetAttr(e, s_outs), *listed = PyObject_GetAttr(st, s_returns_list);
        int fast = kind != NULL && rnd == Py_False && outs != NULL && PyList_Check(outs) &&
                   PyList_GET_SIZE(outs) == 1 && PyList_GET_ITEM(outs, 0) != Py_None && listed == Py_False &&
                   (kind == kind_fn || kind == kind_view);
        if (!fast && kind == kind_fn && rnd == Py_False && outs != NULL && PyList_Check(outs) &&
            (PyList_GET_SIZE(outs) > 1 || listed == Py_True)) {  /* a tuple or list: a getitem node and tensor each */
            res = many_outputs(op, e, dyn, outs, listed == Py_True);
            fast = 2;
        }
        PyObject *step = NULL, *base = NULL;
        if (fast && kind == kind_view) {  /* a view of args[0], its step made already */
            step = PyObject_GetAttr(e, s_step);
            base = PyTuple_GET_SIZE(cargs) ? PyTuple_GET_ITEM(cargs, 0) : NULL;
            fast = step != NULL && step != Py_None && base != NULL && is_lazy(base) == 1;
        }
        if (fast == 1) {
            PyObject *meta = PyList_GET_ITEM(outs, 0);
            PyObject *node = entry_node(op, e, dyn);
            if (node != NULL && kind == kind_fn) {
                res = new_tensor_c(meta, node);
            } else if (node != NULL) {
                PyObject *storage = PyObject_GetAttr(base, s_storage), *chain = PyObject_GetAttr(base, s_chain);
                PyObject *longer = NULL;
                if (storage != NULL && chain != NULL && PyTuple_Check(chain)) {
                    Py_ssize_t n = PyTuple_GET_SIZE(chain);
                    longer = PyTuple_New(n + 1);
                    if (longer != NULL) {
                        for (Py_ssize_t i = 0; i < n; i++)
                            PyTuple_SET_ITEM(longer, i, Py_NewRef(PyTuple_GET_ITEM(chain, i)));
                        PyTuple_SET_ITEM(longer, n, Py_NewRef(step));
                        res = new_view_c(meta, storage, longer, node);
                    }
                } else if (chain != NULL && !PyErr_Occurred()) {
                    PyErr_SetString(PyExc_TypeError, "a view chain must be a tuple");
                }
                Py_XDECREF(storage);
                Py_XDECREF(chain);
                Py_XDECREF(longer);
            }
            Py_XDECREF(node);
        }
        Py_XDECREF(kind);
        Py_XDECREF(rnd);
        Py_XDECREF(outs);
        Py_XDECREF(listed);
        Py_XDECREF(step);
        Py_DECREF(e);
        if (fast || PyErr_Occurred())
            goto done;
    }
    {
        PyObject *call[6] = {op, cargs, kwargs, st, sig, dyn};
        res = PyObject_Vectorcall(recorded_py, call, 6, NULL);
    }
done:
    Py_DECREF(st);
    Py_XDECREF(info);
    Py_XDECREF(stat);
    Py_XDECREF(entries);
    Py_XDECREF(dyn);
    Py_XDECREF(sig);
    return res;
}

/* ---------------------------------------------------------------- dispatch, __torch_dispatch__ */

static PyObject *special_by_id;  /* dispatch.SPECIAL.by_id: id(op) -> handler(op, args, kwargs) */
static PyObject *compute_now;    /* at_once.compute_now (eager mode) */
static PyObject *enter_fn;       /* threads.enter: the owner of an op entering the core */
static PyObject *on_error;       /* tensor._dispatch_error(op, args, kwargs, error): re-raise, or a poisoned result */
static PyObject *this_thread;    /* threads._THIS (a threading.local) */
static PyObject *dispatch_globals;  /* dispatch.py's globals: its ``dispatch`` (this module's, unless replaced) */
static PyObject *dispatch_self;     /* this module's dispatch function object */
static PyObject *s_dispatch;
static PyObject *s_kind_attr, *s_ident, *s_modes, *s_eager_state;
static long user_kind;           /* threads._USER */

/* configure_dispatch(special_by_id, compute_now, enter, on_error, this_thread, user_kind, dispatch_globals) */
static PyObject *
configure_dispatch(PyObject *self, PyObject *args)
{
    PyObject *sp, *cn, *en, *oe, *th, *dg;
    long uk;
    if (!PyArg_ParseTuple(args, "O!OOOOlO!", &PyDict_Type, &sp, &cn, &en, &oe, &th, &uk, &PyDict_Type, &dg))
        return NULL;
    PyObject *me = PyObject_GetAttrString(self, "dispatch");
    if (me == NULL)
        return NULL;
    Py_XSETREF(dispatch_self, me);
    Py_XSETREF(dispatch_globals, Py_NewRef(dg));
    Py_XSETREF(special_by_id, Py_NewRef(sp));
    Py_XSETREF(compute_now, Py_NewRef(cn));
    Py_XSETREF(enter_fn, Py_NewRef(en));
    Py_XSETREF(on_error, Py_NewRef(oe));
    Py_XSETREF(this_thread, Py_NewRef(th));
    user_kind = uk;
    Py_RETURN_NONE;
}

static PyObject *
dispatch_c(PyObject *op, PyObject *args, PyObject *kwargs)
{
    PyObject *id = PyLong_FromVoidPtr(op);
    if (id == NULL)
        return NULL;
    PyObject *special = PyDict_GetItemWithError(special_by_id, id);
    Py_DECREF(id);
    if (special == NULL && PyErr_Occurred())
        return NULL;
    PyObject *call[4] = {op, args, kwargs, NULL};
    PyObject *res = special != NULL ? PyObject_Vectorcall(special, call, 3, NULL) : record(NULL, call, 3);
    if (res == NULL)
        return NULL;
    int cons = consing();
    if (cons != 0) {  /* NOTE: off exactly while the op runs at once (eager mode, not tracing for compile) */
        if (cons < 0)
            Py_CLEAR(res);
        return res;
    }
    call[3] = res;
    PyObject *out = PyObject_Vectorcall(compute_now, call, 4, NULL);
    Py_DECREF(res);
    return out;
}

static int
dispatch_configured(void)
{
    if (special_by_id == NULL || entries_by_id == NULL || make_wrapper == NULL || !signature_configured()) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_RuntimeError, "dispatch used before the core configured xla_dtensor.core._native");
        return 0;
    }
    return 1;
}

static PyObject *
dispatch(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "dispatch(op, args, kwargs)");
        return NULL;
    }
    return dispatch_configured() ? dispatch_c(args[0], args[1], args[2]) : NULL;
}

/* threads.enter(args), without its frame for a thread Python started, in lazy mode everywhere */
static PyObject *
enter(PyObject *args)
{
    PyObject *kind = PyObject_GetAttr(this_thread, s_kind_attr);
    if (kind == NULL)
        return NULL;
    long k = PyLong_AsLong(kind);
    Py_DECREF(kind);
    if (k == -1 && PyErr_Occurred())
        return NULL;
    if (k == user_kind) {
        PyObject *modes = state_get(off_modes, s_modes), *eager = state_get(off_eager_state, s_eager_state);
        int lazy = modes != NULL && eager != NULL && PyObject_IsTrue(modes) == 0 && eager == Py_None;
        Py_XDECREF(modes);
        Py_XDECREF(eager);
        if (PyErr_Occurred())
            return NULL;
        if (lazy)
            return PyObject_GetAttr(this_thread, s_ident);
    }
    return PyObject_CallOneArg(enter_fn, args);
}

/* A subclass whose ops make tensors of its own class (XLAShardedTensor), configured by configure_own_class:
 * the ops it takes first in Python (own_ops, their handler own_first(func, args, kwargs) -> result or None
 * for the general path) and own_rewrap(result), which makes the plain lazy tensors of a result (an in-place
 * op returning a plain input) its class. */
static PyObject *own_cls, *own_ops, *own_first, *own_rewrap;

/* configure_own_class(cls, ops, first, rewrap) */
static PyObject *
configure_own_class(PyObject *self, PyObject *args)
{
    PyObject *cls, *ops, *first, *rewrap;
    if (!PyArg_ParseTuple(args, "O!O!OO", &PyType_Type, &cls, &PyTuple_Type, &ops, &first, &rewrap))
        return NULL;
    Py_XSETREF(own_cls, Py_NewRef(cls));
    Py_XSETREF(own_ops, Py_NewRef(ops));
    Py_XSETREF(own_first, Py_NewRef(first));
    Py_XSETREF(own_rewrap, Py_NewRef(rewrap));
    Py_RETURN_NONE;
}

/* whether result res holds a plain lazy tensor (itself, or in a list or tuple) that own_rewrap must wrap */
static int
needs_rewrap(PyObject *res)
{
    if (Py_IS_TYPE(res, (PyTypeObject *)lazy_type))
        return 1;
    if (!PyTuple_Check(res) && !PyList_Check(res))
        return 0;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(res);
    PyObject **items = PySequence_Fast_ITEMS(res);
    for (Py_ssize_t i = 0; i < n; i++)
        if (Py_IS_TYPE(items[i], (PyTypeObject *)lazy_type) || PyTuple_Check(items[i]) || PyList_Check(items[i]))
            return 1;
    return 0;
}

/* LazyTensor.__torch_dispatch__(cls, func, types, args=(), kwargs=None): hold the core's lock, set the
 * op's owner when entering the core, dispatch; an error inside a backward becomes a poisoned result.
 * For the own class (configure_own_class) the results are made of that class: tensor.OUT.cls is set
 * around the dispatch, under the lock, as XLAShardedTensor's Python entry does. */
static PyObject *
torch_dispatch(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    PyObject *func = NULL, *cargs = empty_tuple, *kwargs = Py_None;
    Py_ssize_t nk = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames);
    if (nargs < 3 || nargs > 5) {
        PyErr_SetString(PyExc_TypeError, "__torch_dispatch__(cls, func, types, args=(), kwargs=None)");
        return NULL;
    }
    func = args[1];
    if (nargs > 3)
        cargs = args[3];
    if (nargs > 4)
        kwargs = args[4];
    for (Py_ssize_t i = 0; i < nk; i++) {
        const char *name = PyUnicode_AsUTF8(PyTuple_GET_ITEM(kwnames, i));
        if (name == NULL)
            return NULL;
        if (strcmp(name, "args") == 0)
            cargs = args[nargs + i];
        else if (strcmp(name, "kwargs") == 0)
            kwargs = args[nargs + i];
        else {
            PyErr_Format(PyExc_TypeError, "__torch_dispatch__() got an unexpected keyword argument '%s'", name);
            return NULL;
        }
    }
    if (!PyTuple_Check(cargs)) {
        PyErr_Format(PyExc_TypeError, "__torch_dispatch__: args must be a tuple, got %.100s", Py_TYPE(cargs)->tp_name);
        return NULL;
    }
    if (!dispatch_configured())
        return NULL;
    PyObject *kw = kwargs != Py_None && PyDict_Check(kwargs) && PyDict_GET_SIZE(kwargs) ? Py_NewRef(kwargs) : PyDict_New();
    if (kw == NULL)
        return NULL;
    int own = own_cls != NULL && args[0] == own_cls;
    for (Py_ssize_t i = 0; own && i < PyTuple_GET_SIZE(own_ops); i++) {
        if (PyTuple_GET_ITEM(own_ops, i) != func)
            continue;
        PyObject *call[3] = {func, cargs, kw};
        PyObject *first = PyObject_Vectorcall(own_first, call, 3, NULL);
        if (first != Py_None) {
            Py_DECREF(kw);
            return first;  /* its result, or NULL with its error */
        }
        Py_DECREF(first);
        break;
    }
    PyObject *got = PyObject_CallNoArgs(lock_acquire);
    if (got == NULL) {
        Py_DECREF(kw);
        return NULL;
    }
    Py_DECREF(got);
    PyObject *res = NULL, *prev_cls = NULL;
    if (own && ((prev_cls = PyObject_GetAttr(out_local, s_cls)) == NULL ||
                PyObject_SetAttr(out_local, s_cls, own_cls) < 0)) {
        Py_CLEAR(prev_cls);
        goto release;
    }
    PyObject *outer = state_get(off_owner, s_owner);
    if (outer != NULL) {
        int inside = PyObject_IsTrue(outer);
        PyObject *owner = inside ? NULL : enter(cargs);
        if (inside < 0 || (!inside && (owner == NULL || state_set(off_owner, s_owner, owner) < 0))) {
            Py_XDECREF(owner);
        } else {
            Py_XDECREF(owner);
            /* dispatch.dispatch, as the Python path calls it (a test or a tool may have replaced it) */
            PyObject *fn = PyDict_GetItemWithError(dispatch_globals, s_dispatch);
            if (fn == dispatch_self) {
                res = dispatch_c(func, cargs, kw);
            } else if (fn != NULL) {
                PyObject *call[3] = {func, cargs, kw};
                res = PyObject_Vectorcall(fn, call, 3, NULL);
            } else if (!PyErr_Occurred()) {
                PyErr_SetString(PyExc_RuntimeError, "xla_dtensor.core.dispatch has no dispatch");
            }
            if (res == NULL && PyErr_ExceptionMatches(PyExc_Exception)) {
                PyObject *tp, *val, *tb;
                PyErr_Fetch(&tp, &val, &tb);
                PyErr_NormalizeException(&tp, &val, &tb);
                if (tb != NULL)
                    PyException_SetTraceback(val, tb);
                PyObject *call[4] = {func, cargs, kw, val};
                res = PyObject_Vectorcall(on_error, call, 4, NULL);
                Py_XDECREF(tp);
                Py_XDECREF(val);
                Py_XDECREF(tb);
            }
        }
        /* STATE.owner = outer, whatever happened (keeping the error, if any) */
        PyObject *tp, *val, *tb;
        PyErr_Fetch(&tp, &val, &tb);
        if (state_set(off_owner, s_owner, outer) < 0)
            PyErr_WriteUnraisable(state);
        PyErr_Restore(tp, val, tb);
        Py_DECREF(outer);
    }
    if (prev_cls != NULL) {  /* tensor.OUT.cls as it was, whatever happened (keeping the error, if any) */
        PyObject *tp, *val, *tb;
        PyErr_Fetch(&tp, &val, &tb);
        if (PyObject_SetAttr(out_local, s_cls, prev_cls) < 0)
            PyErr_WriteUnraisable(out_local);
        PyErr_Restore(tp, val, tb);
        Py_DECREF(prev_cls);
    }
release:;
    PyObject *tp, *val, *tb;
    PyErr_Fetch(&tp, &val, &tb);
    PyObject *released = PyObject_CallNoArgs(lock_release);
    if (released == NULL)
        PyErr_WriteUnraisable(lock);
    Py_XDECREF(released);
    PyErr_Restore(tp, val, tb);
    Py_DECREF(kw);
    if (own && res != NULL && !Py_IS_TYPE(res, (PyTypeObject *)own_cls) && needs_rewrap(res))
        Py_SETREF(res, PyObject_CallOneArg(own_rewrap, res));
    return res;
}

/* ---------------------------------------------------------------- a tape's structure (plan_cache) */

static int
int64_of(PyObject *v, int64_t *out)
{
    long long x = PyLong_AsLongLong(v);
    if (x == -1 && PyErr_Occurred())
        return -1;
    *out = (int64_t)x;
    return 0;
}

/* structure(tape, base, roots): plan_cache._structure's key without the sharding codes, and the leaves
 * read from outside the tape; None when the graph leaves the tape other than through leaves;
 * NotImplemented when a node is not this module's (the Python path reads it). */
static PyObject *
structure(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3 || !PyList_CheckExact(args[0]) || !PyList_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "structure(tape: list, base: int, roots: list)");
        return NULL;
    }
    PyObject *tape = args[0], *roots = args[2];
    int64_t base;
    if (int64_of(args[1], &base) < 0)
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(tape), nr = PyList_GET_SIZE(roots), nf = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *node = PyList_GET_ITEM(tape, i);
        if (!Py_IS_TYPE(node, &NodeType))
            Py_RETURN_NOTIMPLEMENTED;
        nf += PyTuple_GET_SIZE(((NodeObject *)node)->inputs);
    }
    int64_t *wiring = PyMem_Malloc(sizeof(int64_t) * (nf + 1)), *outs = PyMem_Malloc(sizeof(int64_t) * (nr + 1));
    PyObject *leaves = PyList_New(0), *first = PyDict_New(), *res = NULL;
    if (wiring == NULL || outs == NULL || leaves == NULL || first == NULL) {
        if (!PyErr_Occurred())
            PyErr_NoMemory();
        goto done;
    }
    Py_ssize_t f = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *inputs = ((NodeObject *)PyList_GET_ITEM(tape, i))->inputs;
        for (Py_ssize_t j = 0; j < PyTuple_GET_SIZE(inputs); j++, f++) {
            PyObject *x = PyTuple_GET_ITEM(inputs, j);
            if (!Py_IS_TYPE(x, &NodeType)) {
                res = Py_NewRef(Py_NotImplemented);
                goto done;
            }
            int64_t w = ((NodeObject *)x)->tix - base;
            if (w < 0 || w >= n) {  /* read from outside the tape: a leaf, numbered by first use */
                if (((NodeObject *)x)->fn != Py_None) {
                    res = Py_NewRef(Py_None);
                    goto done;
                }
                PyObject *id = PyLong_FromVoidPtr(x);
                if (id == NULL)
                    goto done;
                PyObject *k = PyDict_GetItemWithError(first, id);
                if (k == NULL) {
                    if (PyErr_Occurred() || (k = PyLong_FromSsize_t(n + PyList_GET_SIZE(leaves))) == NULL) {
                        Py_DECREF(id);
                        goto done;
                    }
                    int bad = PyDict_SetItem(first, id, k) < 0 || PyList_Append(leaves, x) < 0;
                    Py_DECREF(k);
                    if (bad) {
                        Py_DECREF(id);
                        goto done;
                    }
                    k = PyDict_GetItem(first, id);
                }
                Py_DECREF(id);
                if (int64_of(k, &w) < 0)
                    goto done;
            }
            wiring[f] = w;
        }
    }
    for (Py_ssize_t i = 0; i < nr; i++) {
        PyObject *r = PyList_GET_ITEM(roots, i);
        if (!Py_IS_TYPE(r, &NodeType)) {
            res = Py_NewRef(Py_NotImplemented);
            goto done;
        }
        outs[i] = ((NodeObject *)r)->tix - base;
        if (outs[i] < 0 || outs[i] >= n) {
            res = Py_NewRef(Py_None);
            goto done;
        }
    }
    Py_ssize_t nl = PyList_GET_SIZE(leaves);
    Py_ssize_t words = 4 + (n + nl) + n + nf + nr;
    PyObject *key = PyBytes_FromStringAndSize(NULL, words * (Py_ssize_t)sizeof(int64_t));
    if (key == NULL)
        goto done;
    int64_t *k = (int64_t *)PyBytes_AS_STRING(key);
    *k++ = n;
    *k++ = nl;
    *k++ = nf;
    *k++ = nr;
    for (Py_ssize_t i = 0; i < n + nl; i++) {
        PyObject *node = i < n ? PyList_GET_ITEM(tape, i) : PyList_GET_ITEM(leaves, i - n);
        if (int64_of(((NodeObject *)node)->hash, k++) < 0) {
            Py_DECREF(key);
            goto done;
        }
    }
    for (Py_ssize_t i = 0; i < n; i++)
        *k++ = PyTuple_GET_SIZE(((NodeObject *)PyList_GET_ITEM(tape, i))->inputs);
    memcpy(k, wiring, sizeof(int64_t) * nf);
    k += nf;
    memcpy(k, outs, sizeof(int64_t) * nr);
    res = PyTuple_Pack(2, key, leaves);
    Py_DECREF(key);
done:
    PyMem_Free(wiring);
    PyMem_Free(outs);
    Py_XDECREF(leaves);
    Py_XDECREF(first);
    return res;
}

/* ---------------------------------------------------------------- sticky layouts (core.layout) */

/* table[(id(s.layout), shape)] (borrowed) for a storage with a layout; NULL without one, or when the table
 * has no entry for it (*err: 0), or on an error (*err: -1, an exception set). */
static PyObject *
layout_entry(StorageObject *s, PyObject *table, int *err)
{
    *err = 0;
    PyObject *spec = s->layout;
    if (spec == NULL || spec == Py_None)
        return NULL;
    if (!PyTuple_Check(s->meta) || PyTuple_GET_SIZE(s->meta) != 3) {
        PyErr_SetString(PyExc_TypeError, "a storage's meta is (shape, dtype, stride)");
        *err = -1;
        return NULL;
    }
    PyObject *id = PyLong_FromVoidPtr(spec);
    if (id == NULL) {
        *err = -1;
        return NULL;
    }
    PyObject *k = PyTuple_Pack(2, id, PyTuple_GET_ITEM(s->meta, 0));
    Py_DECREF(id);
    if (k == NULL) {
        *err = -1;
        return NULL;
    }
    PyObject *e = PyDict_GetItemWithError(table, k);
    Py_DECREF(k);
    if (e == NULL && PyErr_Occurred())
        *err = -1;
    return e;
}

/* constrain_stored(pending, table, kind, fn): each storage of pending whose layout has an entry
 * table[(id(layout), shape)] = (layout, sharding, key, key_hash) gets its value wrapped in a constraint
 * node (op kind, that key, fn) with that sharding, unless its value is one already; returns the storages
 * with a layout and no entry (the caller's Python path lays them out). NotImplemented when pending holds
 * another storage type. */
static PyObject *
constrain_stored(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4 || !PyList_Check(args[0]) || !PyDict_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "constrain_stored(pending: list, table: dict, kind, fn)");
        return NULL;
    }
    PyObject *pending = args[0], *table = args[1], *kind = args[2], *fn = args[3];
    Py_ssize_t n = PyList_GET_SIZE(pending);
    for (Py_ssize_t i = 0; i < n; i++)
        if (!Py_IS_TYPE(PyList_GET_ITEM(pending, i), &StorageType))
            Py_RETURN_NOTIMPLEMENTED;
    PyObject *rest = PyList_New(0);
    if (rest == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        StorageObject *s = (StorageObject *)PyList_GET_ITEM(pending, i);
        PyObject *spec = s->layout;
        if (spec == NULL || spec == Py_None)
            continue;
        int err;
        PyObject *e = layout_entry(s, table, &err);
        if (err < 0)
            goto fail;
        if (e == NULL || !PyTuple_Check(e) || PyTuple_GET_SIZE(e) != 4 || PyTuple_GET_ITEM(e, 0) != spec) {
            if (PyList_Append(rest, (PyObject *)s) < 0)
                goto fail;
            continue;
        }
        PyObject *sharding = PyTuple_GET_ITEM(e, 1), *v = s->value;
        if (Py_IS_TYPE(v, &NodeType)) {
            NodeObject *vn = (NodeObject *)v;
            int same_op = vn->op == kind ? 1 : PyObject_RichCompareBool(vn->op, kind, Py_EQ);
            if (same_op < 0)
                goto fail;
            if (same_op) {
                int same = vn->sharding == sharding ? 1 : PyObject_RichCompareBool(vn->sharding, sharding, Py_EQ);
                if (same < 0)
                    goto fail;
                if (same)
                    continue;
            }
        }
        PyObject *inputs = PyTuple_Pack(1, v);
        if (inputs == NULL)
            goto fail;
        PyObject *call[5] = {kind, PyTuple_GET_ITEM(e, 2), PyTuple_GET_ITEM(e, 3), inputs, fn};
        PyObject *node = make_node(NULL, call, 5);
        Py_DECREF(inputs);
        if (node == NULL)
            goto fail;
        if (!Py_IS_TYPE(node, &NodeType)) {
            Py_DECREF(node);
            PyErr_SetString(PyExc_TypeError, "constrain_stored: make_node returned no node");
            goto fail;
        }
        Py_SETREF(((NodeObject *)node)->sharding, Py_NewRef(sharding));
        Py_SETREF(s->value, node);
    }
    return rest;
fail:
    Py_DECREF(rest);
    return NULL;
}

/* stored_shardings(pending, table): per storage of pending, the sharding of its layout where
 * table[(id(layout), shape)] = (layout, sharding, even, padded shape) is an even entry for it, else None;
 * and the positions of the storages with a layout and no such entry (new or uneven: the caller's Python
 * path lays them out). NotImplemented when pending holds another storage type. */
static PyObject *
stored_shardings(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !PyList_Check(args[0]) || !PyDict_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "stored_shardings(pending: list, table: dict)");
        return NULL;
    }
    PyObject *pending = args[0], *table = args[1];
    Py_ssize_t n = PyList_GET_SIZE(pending);
    for (Py_ssize_t i = 0; i < n; i++)
        if (!Py_IS_TYPE(PyList_GET_ITEM(pending, i), &StorageType))
            Py_RETURN_NOTIMPLEMENTED;
    PyObject *out = PyList_New(n), *rest = PyList_New(0);
    if (out == NULL || rest == NULL)
        goto fail;
    for (Py_ssize_t i = 0; i < n; i++) {
        StorageObject *s = (StorageObject *)PyList_GET_ITEM(pending, i);
        PyObject *spec = s->layout;
        if (spec == NULL || spec == Py_None) {
            PyList_SET_ITEM(out, i, Py_NewRef(Py_None));
            continue;
        }
        int err;
        PyObject *e = layout_entry(s, table, &err);
        if (err < 0)
            goto fail;
        if (e != NULL && PyTuple_Check(e) && PyTuple_GET_SIZE(e) == 4 && PyTuple_GET_ITEM(e, 0) == spec
                && PyTuple_GET_ITEM(e, 2) == Py_True) {
            PyList_SET_ITEM(out, i, Py_NewRef(PyTuple_GET_ITEM(e, 1)));
            continue;
        }
        PyList_SET_ITEM(out, i, Py_NewRef(Py_None));
        PyObject *at = PyLong_FromSsize_t(i);
        if (at == NULL)
            goto fail;
        int bad = PyList_Append(rest, at);
        Py_DECREF(at);
        if (bad < 0)
            goto fail;
    }
    PyObject *both = PyTuple_Pack(2, out, rest);
    Py_DECREF(out);
    Py_DECREF(rest);
    return both;
fail:
    Py_XDECREF(out);
    Py_XDECREF(rest);
    return NULL;
}

/* ---------------------------------------------------------------- a sync's first passes */

typedef struct {
    long long seq;
    PyObject *storage;
} SeqRef;

static int
seq_order(const void *a, const void *b)
{
    long long x = ((const SeqRef *)a)->seq, y = ((const SeqRef *)b)->seq;
    return (x > y) - (x < y);
}

/* A live object of tensor.LIVE's weak reference (a new reference), NULL with no error when it is dead */
static PyObject *
live_object(PyObject *ref)
{
#if PY_VERSION_HEX >= 0x030D0000
    PyObject *obj;
    if (PyWeakref_GetRef(ref, &obj) < 0)
        return NULL;
    return obj;
#else
    PyObject *obj = PyWeakref_GetObject(ref);
    if (obj == NULL || obj == Py_None)
        return NULL;
    return Py_NewRef(obj);
#endif
}

/* pending_storages(): (the live storages whose value is an op node, in creation order; the values of the
 * others) -- tensor.pending_py. NotImplemented when a live object is not a C Storage holding a Node. */
static PyObject *
pending_storages(PyObject *self, PyObject *unused)
{
    if (live_data == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "pending_storages() before configure_tensor()");
        return NULL;
    }
    PyObject *snap = PySequence_List(live_data);  /* a snapshot: a storage freed meanwhile leaves the set */
    if (snap == NULL)
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(snap), m = 0;
    SeqRef *buf = PyMem_Malloc(sizeof(SeqRef) * (n > 0 ? n : 1));
    PyObject *clean = PyList_New(0), *pending = NULL, *result = NULL;
    if (buf == NULL || clean == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *obj = live_object(PyList_GET_ITEM(snap, i));
        if (obj == NULL) {
            if (PyErr_Occurred())
                goto done;
            continue;
        }
        if (!Py_IS_TYPE(obj, &StorageType) || ((StorageObject *)obj)->value == NULL ||
                !Py_IS_TYPE(((StorageObject *)obj)->value, &NodeType)) {  /* (a deleted field: Python's answer) */
            Py_DECREF(obj);
            result = Py_NewRef(Py_NotImplemented);
            goto done;
        }
        StorageObject *s = (StorageObject *)obj;
        if (((NodeObject *)s->value)->fn != Py_None) {
            buf[m].seq = s->seq;
            buf[m++].storage = obj;  /* owned until moved into pending */
            continue;
        }
        int bad = PyList_Append(clean, s->value);
        Py_DECREF(obj);
        if (bad < 0)
            goto done;
    }
    qsort(buf, m, sizeof(SeqRef), seq_order);
    pending = PyList_New(m);
    if (pending == NULL)
        goto done;
    for (Py_ssize_t i = 0; i < m; i++)
        PyList_SET_ITEM(pending, i, buf[i].storage);
    m = 0;
    result = PyTuple_Pack(2, pending, clean);
done:
    for (Py_ssize_t i = 0; i < m; i++)
        Py_DECREF(buf[i].storage);
    PyMem_Free(buf);
    Py_DECREF(snap);
    Py_XDECREF(clean);
    Py_XDECREF(pending);
    return result;
}

/* distinct_values(pending): (the storages' values without repeats, per storage its value's position there or
 * None when none repeats, per value the first storage holding it, their donors, their metas) --
 * executor._distinct_values_py. NotImplemented when pending holds another storage type. */
static PyObject *
distinct_values(PyObject *self, PyObject *pending)
{
    if (!PyList_CheckExact(pending)) {
        PyErr_SetString(PyExc_TypeError, "distinct_values(pending): a list of storages");
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(pending);
    for (Py_ssize_t i = 0; i < n; i++) {
        StorageObject *s = (StorageObject *)PyList_GET_ITEM(pending, i);
        if (!Py_IS_TYPE(s, &StorageType) || s->value == NULL || s->donor == NULL || s->meta == NULL)
            Py_RETURN_NOTIMPLEMENTED;  /* (a deleted field: Python's answer) */
    }
    size_t size = 16;
    while (size < 2 * (size_t)n)
        size <<= 1;
    PyObject **keys = PyMem_Calloc(size, sizeof(PyObject *));
    Py_ssize_t *slot = PyMem_Malloc(size * sizeof(Py_ssize_t)), *pos = PyMem_Malloc((n > 0 ? n : 1) * sizeof(Py_ssize_t));
    PyObject *values = PyList_New(0), *firsts = PyList_New(0), *where = NULL, *donors = NULL, *metas = NULL;
    PyObject *result = NULL;
    if (keys == NULL || slot == NULL || pos == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    if (values == NULL || firsts == NULL)
        goto done;
    int repeats = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        StorageObject *s = (StorageObject *)PyList_GET_ITEM(pending, i);
        PyObject *v = s->value;
        size_t h = ((size_t)(uintptr_t)v >> 4) * (size_t)0x9E3779B97F4A7C15ULL;
        size_t j = (h ^ (h >> 29)) & (size - 1);
        while (keys[j] != NULL && keys[j] != v)
            j = (j + 1) & (size - 1);
        if (keys[j] == v) {
            pos[i] = slot[j];
            repeats = 1;
            continue;
        }
        keys[j] = v;
        slot[j] = pos[i] = PyList_GET_SIZE(values);
        if (PyList_Append(values, v) < 0 || PyList_Append(firsts, (PyObject *)s) < 0)
            goto done;
    }
    if (repeats) {
        if ((where = PyList_New(n)) == NULL)
            goto done;
        for (Py_ssize_t i = 0; i < n; i++) {
            PyObject *k = PyLong_FromSsize_t(pos[i]);
            if (k == NULL)
                goto done;
            PyList_SET_ITEM(where, i, k);
        }
    } else {
        where = Py_NewRef(Py_None);
    }
    Py_ssize_t d = PyList_GET_SIZE(firsts);
    if ((donors = PyList_New(d)) == NULL || (metas = PyList_New(d)) == NULL)
        goto done;
    for (Py_ssize_t i = 0; i < d; i++) {
        StorageObject *s = (StorageObject *)PyList_GET_ITEM(firsts, i);
        PyList_SET_ITEM(donors, i, Py_NewRef(s->donor));
        PyList_SET_ITEM(metas, i, Py_NewRef(s->meta));
    }
    result = PyTuple_Pack(5, values, where, firsts, donors, metas);
done:
    PyMem_Free(keys);
    PyMem_Free(slot);
    PyMem_Free(pos);
    Py_XDECREF(values);
    Py_XDECREF(firsts);
    Py_XDECREF(where);
    Py_XDECREF(donors);
    Py_XDECREF(metas);
    return result;
}

static PyObject *s_array, *s_layout;

/* split_packs(leaves, pack_type): None when no leaf's raw data is a pack_type; else (args: the other leaves'
 * raw data then each pack's array once, packs: in order of first use, sig: bytes, per member (its argument
 * position, its pack's number, its leaf's key[4]) then per pack id(pack.layout), as int64) --
 * packs._split_py. NotImplemented when leaves holds another node type. */
static PyObject *
split_packs(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !PyList_CheckExact(args[0]) || !PyType_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "split_packs(leaves: list, pack_type: type)");
        return NULL;
    }
    PyObject *leaves = args[0], *pack_type = args[1];
    Py_ssize_t n = PyList_GET_SIZE(leaves), members = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *x = PyList_GET_ITEM(leaves, i);
        if (!Py_IS_TYPE(x, &NodeType))
            Py_RETURN_NOTIMPLEMENTED;
        members += Py_TYPE(((NodeObject *)x)->data) == (PyTypeObject *)pack_type;
    }
    if (members == 0)
        Py_RETURN_NONE;
    PyObject *plain = PyList_New(0), *packs = PyList_New(0), *sig = NULL, *result = NULL;
    int64_t *code = PyMem_Malloc(sizeof(int64_t) * 4 * members);
    if (code == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    if (plain == NULL || packs == NULL)
        goto done;
    Py_ssize_t c = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        NodeObject *x = (NodeObject *)PyList_GET_ITEM(leaves, i);
        PyObject *raw = x->data;
        if (Py_TYPE(raw) != (PyTypeObject *)pack_type) {
            if (PyList_Append(plain, raw) < 0)
                goto done;
            continue;
        }
        Py_ssize_t g = PyList_GET_SIZE(packs);
        for (Py_ssize_t k = g - 1; k >= 0; k--)  /* a member's pack is mostly the last one met */
            if (PyList_GET_ITEM(packs, k) == raw) {
                g = k;
                break;
            }
        if (g == PyList_GET_SIZE(packs) && PyList_Append(packs, raw) < 0)
            goto done;
        if (!PyTuple_Check(x->key) || PyTuple_GET_SIZE(x->key) < 5) {
            PyErr_SetString(PyExc_TypeError, "split_packs: a packed member's key has its index at [4]");
            goto done;
        }
        long long at = PyLong_AsLongLong(PyTuple_GET_ITEM(x->key, 4));
        if (at == -1 && PyErr_Occurred())
            goto done;
        code[c++] = i;
        code[c++] = g;
        code[c++] = at;
    }
    Py_ssize_t p = PyList_GET_SIZE(packs);
    for (Py_ssize_t k = 0; k < p; k++) {
        PyObject *pk = PyList_GET_ITEM(packs, k);
        PyObject *array = PyObject_GetAttr(pk, s_array), *lay = PyObject_GetAttr(pk, s_layout);
        int bad = array == NULL || lay == NULL || PyList_Append(plain, array) < 0;
        if (!bad)
            code[c++] = (int64_t)(intptr_t)lay;  /* id(layout): Layout objects are kept by packs._LAYOUTS */
        Py_XDECREF(array);
        Py_XDECREF(lay);
        if (bad)
            goto done;
    }
    sig = PyBytes_FromStringAndSize((const char *)code, (Py_ssize_t)(c * sizeof(int64_t)));
    if (sig != NULL)
        result = PyTuple_Pack(3, plain, packs, sig);
done:
    PyMem_Free(code);
    Py_XDECREF(plain);
    Py_XDECREF(packs);
    Py_XDECREF(sig);
    return result;
}

/* sharding_codes(tape, code_by_id): bytes, per node of tape the int64 code of its sharding (None: 0, else
 * code_by_id[id(sharding)]), or None when a sharding's id is not there (plan_cache._sharding_codes codes it) */
static PyObject *
sharding_codes(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !PyList_CheckExact(args[0]) || !PyDict_CheckExact(args[1])) {
        PyErr_SetString(PyExc_TypeError, "sharding_codes(tape: list, code_by_id: dict)");
        return NULL;
    }
    PyObject *tape = args[0], *by_id = args[1];
    Py_ssize_t n = PyList_GET_SIZE(tape);
    PyObject *out = PyBytes_FromStringAndSize(NULL, n * (Py_ssize_t)sizeof(int64_t));
    if (out == NULL)
        return NULL;
    int64_t *code = (int64_t *)PyBytes_AS_STRING(out);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *x = PyList_GET_ITEM(tape, i);
        if (!Py_IS_TYPE(x, &NodeType)) {
            Py_DECREF(out);
            Py_RETURN_NOTIMPLEMENTED;
        }
        PyObject *sh = ((NodeObject *)x)->sharding;
        if (sh == Py_None) {
            code[i] = 0;
            continue;
        }
        PyObject *id = PyLong_FromVoidPtr(sh);
        if (id == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyObject *c = PyDict_GetItemWithError(by_id, id);
        Py_DECREF(id);
        if (c == NULL) {
            Py_DECREF(out);
            if (PyErr_Occurred())
                return NULL;
            Py_RETURN_NONE;
        }
        code[i] = PyLong_AsLongLong(c);
        if (code[i] == -1 && PyErr_Occurred()) {
            Py_DECREF(out);
            return NULL;
        }
    }
    return out;
}

/* ---------------------------------------------------------------- module */

static PyMethodDef methods[] = {
    {"configure_packed", (PyCFunction)configure_packed, METH_VARARGS,
     "configure_packed(type, read): a leaf whose data is of ``type`` reads as read(node) (core.packs)."},
    {"configure_ir", (PyCFunction)configure_ir, METH_VARARGS,
     "configure_ir(ir_globals, state, counts): bind ir.py's state."},
    {"configure_signature", (PyCFunction)configure_signature, METH_VARARGS,
     "configure_signature(lazy_type, subclasses, value_of, arg, ptype, signature_globals): what signatures read."},
    {"make_node", (PyCFunction)(void (*)(void))make_node, METH_FASTCALL, "ir.make_node in C."},
    {"getitems", (PyCFunction)(void (*)(void))getitems, METH_FASTCALL,
     "getitems(node, indices, table, getitem_op): ir.getitems in C."},
    {"param_leaf", (PyCFunction)param_leaf, METH_O, "ir.param_leaf in C."},
    {"configure_tensor", (PyCFunction)configure_tensor, METH_VARARGS,
     "configure_tensor(lazy_type, make_wrapper, out, device, me, lock, live_data, live_remove, seq)."},
    {"configure_record", (PyCFunction)configure_record, METH_VARARGS,
     "configure_record(entries, record, recorded, fn_kind, view_kind, getitems): what record() reads."},
    {"alias", (PyCFunction)(void (*)(void))alias, METH_FASTCALL, "special._alias in C (detach, alias, lift_fresh)."},
    {"configure_maker", (PyCFunction)configure_maker, METH_O,
     "configure_maker(capsule or None): the C++ tensor maker (xla_dtensor.core.cxx), or _make_wrapper_subclass."},
    {"new_tensor", (PyCFunction)(void (*)(void))new_tensor, METH_FASTCALL, "tensor.new_tensor in C."},
    {"data_leaves", (PyCFunction)(void (*)(void))data_leaves, METH_FASTCALL,
     "data_leaves(keys, arrays, data_op): device-data leaves of known keys (executor.out_leaves)."},
    {"rebind", (PyCFunction)(void (*)(void))rebind, METH_FASTCALL,
     "rebind(pending, where, leaves): storages to their new leaves, the leaves taped (executor._sync)."},
    {"configure_write", (PyCFunction)configure_write, METH_O, "configure_write(python_write): a view's write."},
    {"write", (PyCFunction)(void (*)(void))write_c, METH_FASTCALL, "tensor.write in C (a root tensor's)."},
    {"new_view", (PyCFunction)(void (*)(void))new_view, METH_FASTCALL, "tensor.new_view in C."},
    {"record", (PyCFunction)(void (*)(void))record, METH_FASTCALL, "dispatch.record in C (its common cases)."},
    {"configure_dispatch", (PyCFunction)configure_dispatch, METH_VARARGS,
     "configure_dispatch(special_by_id, compute_now, enter, on_error, this_thread, user_kind, dispatch_globals)."},
    {"dispatch", (PyCFunction)(void (*)(void))dispatch, METH_FASTCALL, "dispatch.dispatch in C."},
    {"constrain_stored", (PyCFunction)(void (*)(void))constrain_stored, METH_FASTCALL,
     "constrain_stored(pending, table, kind, fn): layout.constrain_stored in C."},
    {"stored_shardings", (PyCFunction)(void (*)(void))stored_shardings, METH_FASTCALL,
     "stored_shardings(pending, table): layout.stored_shardings' table look-ups in C."},
    {"configure_own_class", (PyCFunction)configure_own_class, METH_VARARGS,
     "configure_own_class(cls, ops, first, rewrap): a subclass whose ops make tensors of its class."},
    {"structure", (PyCFunction)(void (*)(void))structure, METH_FASTCALL,
     "structure(tape, base, roots): plan_cache._structure's key (without sharding codes) and leaves."},
    {"torch_dispatch", (PyCFunction)(void (*)(void))torch_dispatch, METH_FASTCALL | METH_KEYWORDS,
     "LazyTensor.__torch_dispatch__ in C (wrap in classmethod)."},
    {"pending_storages", (PyCFunction)pending_storages, METH_NOARGS,
     "pending_storages(): tensor.pending_py in C (the live storages with a pending value)."},
    {"distinct_values", (PyCFunction)distinct_values, METH_O,
     "distinct_values(pending): executor._distinct_values_py in C."},
    {"split_packs", (PyCFunction)(void (*)(void))split_packs, METH_FASTCALL,
     "split_packs(leaves, pack_type): packs._split_py in C."},
    {"sharding_codes", (PyCFunction)(void (*)(void))sharding_codes, METH_FASTCALL,
     "sharding_codes(tape, code_by_id): plan_cache._sharding_codes' look-ups in C."},
    {"signature", (PyCFunction)(void (*)(void))signature, METH_FASTCALL,
     "signature(args, kwargs, info, scalars, dyn): signature.signature in C."},
    {NULL}
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_native", "The lazy recorder's hot path in C (see xla_dtensor.core.native).", -1, methods
};

#define INTERN(var, text) if ((var = PyUnicode_InternFromString(text)) == NULL) return NULL

PyMODINIT_FUNC
PyInit__native(void)
{
    if (PyType_Ready(&NodeType) < 0 || PyType_Ready(&StorageType) < 0)
        return NULL;
    empty_tuple = PyTuple_New(0);
    wrapper_kwnames = Py_BuildValue("(sss)", "strides", "dtype", "device");
    if (empty_tuple == NULL || wrapper_kwnames == NULL)
        return NULL;
    INTERN(s_CONS, "_CONS");
    INTERN(s_TAPE, "_TAPE");
    INTERN(s_BASE, "_BASE");
    INTERN(s_CONS_LIMIT, "CONS_LIMIT");
    INTERN(s_TAPE_LIMIT, "TAPE_LIMIT");
    INTERN(s_drop_tape, "_drop_tape");
    INTERN(s_consing, "consing");
    INTERN(s_ops_recorded, "ops_recorded");
    INTERN(s_hash_cons_hits, "hash_cons_hits");
    INTERN(s_chain, "_chain");
    INTERN(s_storage, "_storage");
    INTERN(s_value, "value");
    INTERN(s_meta, "_meta");
    INTERN(s_scalar_flags, "scalar_flags");
    INTERN(s_no_flags, "no_flags");
    INTERN(s_scalar_kw, "scalar_kw");
    INTERN(s_owner, "owner");
    INTERN(s_is_owned, "_is_owned");
    INTERN(s_cls, "cls");
    INTERN(s_vcache, "_vcache");
    INTERN(s_seen, "_seen");
    INTERN(s_info, "info");
    INTERN(s_static_scalars, "static_scalars");
    INTERN(s_entries, "entries");
    INTERN(s_returns_list, "returns_list");
    INTERN(s_kind, "kind");
    INTERN(s_random, "random");
    INTERN(s_outs, "outs");
    INTERN(s_step, "step");
    INTERN(s_key, "key");
    INTERN(s_h, "h");
    INTERN(s_fn, "fn");
    INTERN(s_version, "version");
    INTERN(s_kind_attr, "kind");
    INTERN(s_ident, "ident");
    INTERN(s_modes, "modes");
    INTERN(s_eager_state, "eager_state");
    INTERN(s_acquire, "acquire");
    INTERN(s_release, "release");
    INTERN(s_dispatch, "dispatch");
    INTERN(s_param_leaf, "param_leaf");
    INTERN(s_array, "array");
    INTERN(s_layout, "layout");
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&NodeType);
    if (PyModule_AddObject(m, "Node", (PyObject *)&NodeType) < 0) {
        Py_DECREF(&NodeType);
        Py_DECREF(m);
        return NULL;
    }
    Py_INCREF(&StorageType);
    if (PyModule_AddObject(m, "Storage", (PyObject *)&StorageType) < 0) {
        Py_DECREF(&StorageType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
