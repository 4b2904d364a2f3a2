"""Build a :class:`autoshard.graph.Graph` from an aten-level FX graph of a training step.

:func:`trace_training_step` traces forward, backward (``torch.autograd.grad``) and an
AdamW update written with ``torch._foreach_*`` ops through ``make_fx``, by default
under ``FakeTensorMode`` so no real memory is allocated (a 48-layer GPT-2 traces in
seconds). :func:`graph_from_fx` turns any such FX graph into the framework-neutral
graph: ``getitem`` and ``detach`` become references, each foreach op becomes one node
per list element, and in-place ops produce a new version of the tensor they mutate
(joined to its alias group).

Example:
    >>> import torch
    >>> from autoshard.models import GPT2, GPT2Config
    >>> model = GPT2(GPT2Config(vocab=64, n_positions=16, n_embd=32, n_layer=1, n_head=2))
    >>> g = trace_training_step(model, (torch.zeros(2, 8, dtype=torch.long),) * 2)
    >>> sum(n.role == "param" for n in g.nodes) == len(list(model.parameters()))
    True
"""
from __future__ import annotations

import operator
from typing import Any, Callable, Sequence

import torch
from torch import nn

from autoshard.graph import Graph, TensorMeta

_PASS_THROUGH = {"aten.detach.default", "aten.alias.default", "aten.lift_fresh_copy.default",
                 "aten.lift_fresh.default"}
_SKIP_PREFIX = ("profiler.",)


def trace_training_step(model: nn.Module, batch: Sequence[torch.Tensor], *, lr: float = 1e-3,
                        weight_decay: float = 0.01, fake: bool = True, name: str = "") -> Graph:
    """Trace ``loss = model(*batch)``, its gradients and one AdamW step into a Graph.

    Args:
        model: returns a scalar loss from ``model(*batch)``; tied weights are traced once.
        batch: example inputs (only shapes and dtypes matter when ``fake``).
        fake: trace under ``FakeTensorMode`` (no memory, no real arithmetic).
    """
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.func import functional_call
    from torch.fx.experimental.proxy_tensor import make_fx

    names = [n for n, _ in model.named_parameters()]  # tied weights appear once
    n_p = len(names)
    buffers: dict[str, torch.Tensor] = {}  # a meta model's buffers (rotary tables) as CPU fakes

    def step(*flat: torch.Tensor) -> tuple[torch.Tensor, ...]:
        params, m, v, data = flat[:n_p], list(flat[n_p:2 * n_p]), list(flat[2 * n_p:3 * n_p]), flat[3 * n_p:]
        loss = functional_call(model, {**dict(zip(names, params)), **buffers}, tuple(data))
        grads = torch.autograd.grad(loss, params)
        with torch.no_grad():  # AdamW, as torch.optim's foreach path computes it (step count fixed)
            params = list(params)
            torch._foreach_mul_(params, 1 - lr * weight_decay)
            torch._foreach_lerp_(m, grads, 0.1)
            torch._foreach_mul_(v, 0.999)
            torch._foreach_addcmul_(v, grads, grads, 0.001)
            denom = torch._foreach_sqrt(v)
            torch._foreach_add_(denom, 1e-8)
            torch._foreach_addcdiv_(params, m, denom, -lr)
        return (loss, *grads)

    def inputs() -> list[torch.Tensor]:
        ps = [p.detach().requires_grad_() for p in model.parameters()]
        return ps + [torch.zeros_like(p) for p in ps] * 2 + [b.detach() for b in batch]

    if fake:
        with FakeTensorMode(allow_non_fake_inputs=True) as mode:
            flat = [_fake(mode, t) for t in inputs()]
            for p in flat[:n_p]:
                p.requires_grad_()
            buffers.update((n, _fake(mode, b)) for n, b in model.named_buffers() if b.device.type == "meta")
            gm = make_fx(step, tracing_mode="real")(*flat)
    else:
        gm = make_fx(step)(*inputs())
    roles = ["param"] * n_p + ["opt_state"] * 2 * n_p + ["input"] * len(batch)
    labels = names + [f"exp_avg:{n}" for n in names] + [f"exp_avg_sq:{n}" for n in names] + \
        [f"input{i}" for i in range(len(batch))]
    groups = [[i, n_p + i, 2 * n_p + i] for i in range(n_p)]
    return graph_from_fx(gm, roles, labels, alias_groups=groups, grad_outputs=list(range(1, n_p + 1)),
                         name=name or type(model).__name__)


def _fake(mode: Any, t: torch.Tensor) -> torch.Tensor:
    """A fake tensor for ``t``; a ``meta`` tensor becomes a fake CPU tensor.

    NOTE: on the meta device SDPA decomposes into bmm + softmax and the trace holds its
    O(T^2) score matrices; on (fake) CPU it stays one fused op holding O(T) (output and
    logsumexp), as the accelerators' fused kernels do. A fake CPU tensor holds no memory.
    """
    if t.device.type == "meta":
        with mode:
            return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="cpu")
    return t if isinstance(t, torch._subclasses.FakeTensor) else mode.from_tensor(t)


def graph_from_fx(gm: torch.fx.GraphModule, roles: Sequence[str], names: Sequence[str], *,
                  alias_groups: Sequence[Sequence[int]] = (), grad_outputs: Sequence[int] = (),
                  name: str = "graph") -> Graph:
    """Convert an aten FX graph; placeholder ``i`` gets ``roles[i]`` and ``names[i]``.

    ``alias_groups`` are placeholder-index groups (param, exp_avg, exp_avg_sq);
    ``grad_outputs[i]`` is the position in the returned tuple of parameter i's gradient.
    """
    g = Graph(name=name)
    env: dict[torch.fx.Node, Any] = {}
    group_of: dict[int, int] = {}
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if len(placeholders) != len(roles):
        raise ValueError(f"{len(placeholders)} placeholders but {len(roles)} roles given")
    for i, ph in enumerate(placeholders):
        env[ph] = (g.add("placeholder", (), (_meta(ph.meta["val"]),), role=roles[i], name=names[i]), 0)
    ph_ids = [env[ph][0] for ph in placeholders]
    groups = [[ph_ids[i] for i in grp] for grp in alias_groups]
    for k, grp in enumerate(groups):
        group_of.update({v: k for v in grp})
    for node in gm.graph.nodes:
        if node.op == "call_function":
            _convert(g, node, env, groups, group_of)
    out_node = next(n for n in gm.graph.nodes if n.op == "output")
    results = out_node.args[0]
    g.outputs = [env[r] for r in results if isinstance(r, torch.fx.Node) and r in env]
    params = [v for v in ph_ids if g.nodes[v].role == "param"]
    for p, pos in zip(params, grad_outputs):
        gid, gidx = env[results[pos]]
        g.grads[p] = (gid, gidx)
        if g.nodes[gid].role == "op":
            g.nodes[gid] = _with_role(g.nodes[gid], "grad")
    g.outputs = [o for o in g.outputs if o not in set(g.grads.values())]
    g.outputs += [(grp[-1], 0) for grp in groups if g.nodes[grp[0]].role == "param"]
    g.alias_groups = groups
    return g


def _with_role(node: Any, role: str) -> Any:
    from dataclasses import replace

    return replace(node, role=role)


def _meta(val: Any) -> TensorMeta:
    return TensorMeta(tuple(int(s) for s in val.shape), str(val.dtype).removeprefix("torch."))


def _op_name(target: Callable) -> str:
    return str(target)


def _convert(g: Graph, node: torch.fx.Node, env: dict, groups: list[list[int]], group_of: dict[int, int]) -> None:
    if node.target is operator.getitem:
        src, idx = node.args
        ref = env.get(src)
        if isinstance(ref, list):
            env[node] = ref[idx]
        elif ref is not None:
            env[node] = (ref[0], idx)
        return
    op = _op_name(node.target)
    if op.startswith(_SKIP_PREFIX):
        return
    if op in _PASS_THROUGH:
        env[node] = env.get(node.args[0])
        return
    if op.startswith("aten._foreach_"):
        _convert_foreach(g, node, op, env, groups, group_of)
        return
    inputs, args = _flatten_args(node.args, env)
    val = node.meta.get("val")
    metas = _metas(val)
    if not metas and _mutated_arg(node) is None:
        return
    if not metas:  # in-place op returning nothing: the output is the mutated tensor
        metas = (g.nodes[inputs[0][0]].outputs[inputs[0][1]],)
    nid = g.add(op, tuple(inputs), metas, args)
    env[node] = (nid, 0)  # getitem re-indexes multi-output nodes
    mutated = _mutated_arg(node)
    if mutated is not None and isinstance(node.args[mutated], torch.fx.Node):
        _new_version(node.args[mutated], (nid, 0), env, groups, group_of)


def _convert_foreach(g: Graph, node: torch.fx.Node, op: str, env: dict, groups: list[list[int]],
                     group_of: dict[int, int]) -> None:
    lists = [i for i, a in enumerate(node.args) if isinstance(a, (list, tuple))]
    n = len(node.args[lists[0]])
    inplace = op.split(".")[1].endswith("_")
    outs = []
    for k in range(n):
        elem_args = tuple(a[k] if i in lists else a for i, a in enumerate(node.args))
        inputs, args = _flatten_args(elem_args, env)
        first = inputs[0]
        meta = g.nodes[first[0]].outputs[first[1]]
        nid = g.add(op, tuple(inputs), (meta,), args, name=f"{op}[{k}]")
        outs.append((nid, 0))
        if inplace:
            _new_version(node.args[0][k], (nid, 0), env, groups, group_of)
    env[node] = outs


def _new_version(fx_arg: torch.fx.Node, ref: tuple[int, int], env: dict, groups: list[list[int]],
                 group_of: dict[int, int]) -> None:
    old = env.get(fx_arg)
    env[fx_arg] = ref
    if old is not None and old[0] in group_of:
        k = group_of[old[0]]
        groups[k].append(ref[0])
        group_of[ref[0]] = k


def _mutated_arg(node: torch.fx.Node) -> int | None:
    schema = getattr(node.target, "_schema", None)
    if schema is None:
        return None
    for i, a in enumerate(schema.arguments):
        if a.alias_info is not None and a.alias_info.is_write and not a.kwarg_only:
            return i
    return None


def _flatten_args(args: Sequence[Any], env: dict) -> tuple[list[tuple[int, int]], tuple[Any, ...]]:
    inputs: list[tuple[int, int]] = []
    plain: list[Any] = []
    for a in args:
        if isinstance(a, torch.fx.Node):
            ref = env.get(a)
            if isinstance(ref, tuple):
                inputs.append(ref)
                plain.append(None)
            else:
                plain.append(_scalar(a))
        elif isinstance(a, (list, tuple)) and any(isinstance(x, torch.fx.Node) for x in a):
            refs = [env.get(x) for x in a]
            inputs.extend(r for r in refs if isinstance(r, tuple))
            plain.append(None)
        else:
            plain.append(_scalar(a))
    return inputs, tuple(plain)


def _scalar(a: Any) -> Any:
    if isinstance(a, (int, float, bool, str)) or a is None:
        return a
    if isinstance(a, (list, tuple)):
        return tuple(_scalar(x) for x in a)
    if isinstance(a, torch.fx.Node):
        v = a.meta.get("val")
        return v if isinstance(v, (int, float)) else None
    return str(a)


def _metas(val: Any) -> tuple[TensorMeta, ...]:
    if isinstance(val, torch.Tensor):
        return (_meta(val),)
    if isinstance(val, (tuple, list)):
        return tuple(_meta(v) if isinstance(v, torch.Tensor) else TensorMeta((), "int64") for v in val)
    return ()
