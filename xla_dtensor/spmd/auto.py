"""The AUTO sharding policy: the first training step's IR -> autoshard plan -> sticky annotations.

``distribute_module(model, mesh, partition_fn="AUTO")`` (also through torch's own
``torch.distributed.tensor.distribute_module`` on a ``DeviceMesh("xla", ...)``, which
passes the string through) moves the parameters to the jax device, replicated, and
registers the module for planning. Nothing is decided until the step has been
recorded: at the first ``sync()`` whose pending graph updates the module's parameters
(forward, backward and optimizer step recorded lazily), a PRE_SYNC hook

1. converts the pending IR to an autoshard graph (:func:`xla_dtensor.auto.graph_from_ir`;
   optimizer state is found through torch's global optimizer step hook),
2. solves it on the mesh's :class:`mesh.Topology` (:func:`autoshard.solve`; plans are
   cached in memory and on disk under ``$XLA_DTENSOR_CACHE_DIR/plans``),
3. annotates every parameter and optimizer-state storage with the plan's layout
   (sticky specs, as ``mark_sharding`` does), so this very sync already computes them
   in that layout and every later step keeps it; the module's tensor inputs
   (positional ``input:{i}``, keyword ``input:{name}``) are constrained to the plan's
   input layout from the next step on.

User hints (parameters annotated before, by ``mark_sharding`` or ``distribute_tensor``
with ``Shard`` placements) are pinned in the plan unless ``keep_user_sharding=False``.
The outputs of the plan's decision ops (matmuls, embeddings, attention, reductions...)
are constrained to the plan's layouts at this sync and at every later training step
(:class:`xla_dtensor.auto.activations.ActivationTable`), so XLA runs the layouts the
plan costed instead of propagating its own (``constrain_activations=False``: leave
them to XLA's propagation).

Example:
    >>> import torch, xla_dtensor
    >>> import xla_dtensor.spmd as xs
    >>> lin = xs.distribute_module(torch.nn.Linear(8, 8), xs.Mesh(range(8), (8,), ("d",)),
    ...                            partition_fn=xs.AutoPolicy(time_limit=5))
    >>> opt = torch.optim.SGD(lin.parameters(), lr=0.1)
    >>> lin(torch.ones(16, 8).to(xla_dtensor.device())).sum().backward()
    >>> opt.step()
    >>> xla_dtensor.sync()
    >>> sorted(xs.last_plan().placements), lin._auto_plan is xs.last_plan()
    (['bias', 'input:0', 'weight'], True)
"""
from __future__ import annotations

import functools

import logging
import warnings
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import torch
from torch import nn

import autoshard
from autoshard.guard import verdict
from mesh import Mesh, Topology, topology_for
from xla_dtensor.core import executor, phases, state
from xla_dtensor.core.tensor import LazyTensor, Storage, storage_of
from xla_dtensor.sharding import ShardingSpec
from xla_dtensor.spmd import annotate as A

_log = logging.getLogger("xla_dtensor.spmd.auto")
_PLATFORM_PRESET = {"cpu": "cpu", "gpu": "h100", "cuda": "h100", "tpu": "tpu-v5e"}


@dataclass(frozen=True)
class AutoPolicy:
    """Options of the AUTO policy; pass one as ``partition_fn`` (``"AUTO"`` = the defaults).

    Args:
        memory_budget: bytes per device the plan must fit (None: unlimited).
        time_limit: seconds for the solver.
        topology: a :class:`mesh.Topology` or a preset name (``"tpu-v5e"``, ``"h100"``,
            ``"cpu"``...); None picks one from the JAX platform.
        keep_user_sharding: pin parameters annotated before ``distribute_module``.
        cache_dir: the plan cache directory (None: ``$XLA_DTENSOR_CACHE_DIR/plans``;
            False: memory only).
        constrain_activations: constrain decision ops' outputs to the plan's layouts
            every step (False: only parameters, optimizer state and inputs).
        cluster: layer clustering (``autoshard.solve``'s ``cluster``): None solves a model with
            at least 4 identical layers once per layer (and may choose activation
            checkpointing under ``memory_budget``), True always, False never.
        progress: ``autoshard.solve``'s ``progress``: None prints the solver's phases to
            stderr once a solve has run 5 s, False prints nothing, or a callable per line.

    Calling it like a ``partition_fn`` raises: it is a marker for ``distribute_module``.
    """

    memory_budget: float | None = None
    time_limit: float = 60.0
    topology: Topology | str | None = None
    keep_user_sharding: bool = True
    cache_dir: Any = None
    constrain_activations: bool = True
    cluster: bool | None = None
    progress: Any = None

    def __post_init__(self) -> None:
        if self.memory_budget is not None and not self.memory_budget > 0:
            raise ValueError(f"memory_budget must be a positive number of bytes or None, got {self.memory_budget!r}")
        if not self.time_limit > 0:
            raise ValueError(f"time_limit must be positive seconds, got {self.time_limit!r}")
        if self.topology is not None and not isinstance(self.topology, (Topology, str)):
            raise TypeError(f"topology must be a mesh.Topology, a preset name or None, got {self.topology!r}")

    def __call__(self, *args: Any) -> None:
        raise TypeError("AutoPolicy is a marker for distribute_module(partition_fn=...), not a partition "
                        "function; pass it to distribute_module")

    def topology_for(self, m: Mesh) -> Topology:
        if isinstance(self.topology, Topology):
            if tuple(self.topology.axis_sizes) != tuple(m.mesh_shape):
                raise ValueError(f"topology axis sizes {self.topology.axis_sizes} do not match the mesh "
                                 f"shape {tuple(m.mesh_shape)}")
            return self.topology
        import jax
        preset = self.topology or _PLATFORM_PRESET.get(jax.devices()[0].platform, "tpu-v5e")
        return topology_for(m, preset)


AUTO = AutoPolicy()


@dataclass(eq=False)
class _Scope:
    """One AUTO-distributed module (or optimizer, under ``use_spmd(auto=True)``) waiting for its plan."""

    named_params: Callable[[], Iterator[tuple[str, torch.Tensor]]]
    mesh: Mesh
    policy: AutoPolicy
    hints: dict[str, ShardingSpec]
    owner: Any = None                       # weakref to the module (or the optimizer, use_spmd(auto=True))
    inputs: dict[str, LazyTensor] = field(default_factory=dict)  # "input:{i}" / "input:{keyword}" -> batch tensor
    optimizers: list[weakref.ref] = field(default_factory=list)
    plan: Any = None
    warned_no_grads: bool = False
    is_module: bool = False
    table: Any = None                       # ActivationTable of the plan's activation layouts


_WAITING: list[_Scope] = []
_LAST: dict[str, Any] = {}


def last_plan() -> autoshard.Plan:
    """The plan the AUTO policy applied last (``plan.explain()`` says why).

    Raises:
        LookupError: no AUTO plan was made in this process.
    """
    if "plan" not in _LAST:
        raise LookupError("no AUTO plan yet: it is made at the first sync() of a training step of a "
                          "module distributed with partition_fn='AUTO'")
    return _LAST["plan"]


def auto_stats() -> dict[str, int]:
    """How :func:`autoshard.solve` answered so far: ``solves``, ``memory_hits``, ``disk_hits``."""
    from autoshard.api import STATS
    return {k: STATS[k] for k in ("solves", "memory_hits", "disk_hits")}


# -- setting up ------------------------------------------------------------------------
def prepare_module(module: nn.Module, m: Mesh, policy: AutoPolicy) -> None:
    """Move ``module``'s parameters to the jax device for AUTO (hints kept) and register it."""
    hints = _hints(module.named_parameters(), m)
    from xla_dtensor.spmd.api import distribute_tensor
    from xla_dtensor.spmd.sharded_tensor import XLAShardedTensor

    done: dict[int, nn.Parameter] = {}
    for sub in module.modules():
        for key, p in list(sub._parameters.items()):
            if p is None:
                continue
            new = done.get(id(p))
            if new is None:
                if isinstance(p, LazyTensor) and A.sticky_spec(p) is not None:
                    t = XLAShardedTensor.wrap(p.detach())
                else:
                    t = distribute_tensor(p.detach(), m, None)
                    A.stick(storage_of(t), None)  # NOTE: the plan decides; replicated until then
                new = done[id(p)] = nn.Parameter(t, requires_grad=p.requires_grad)
            sub._parameters[key] = new
    owner = weakref.ref(module)  # NOTE: no strong reference: a dropped module drops its scope
    scope = _Scope(lambda: owner().named_parameters() if owner() is not None else iter(()), m, policy, hints,
                   owner=owner, is_module=True)
    module.register_forward_pre_hook(_forward_hook(scope), with_kwargs=True)
    _register(scope)


def prepare_optimizer(optimizer: torch.optim.Optimizer, m: Mesh, policy: AutoPolicy) -> None:
    """Register an optimizer's (lazy) parameters for AUTO, named ``param{i}`` (``use_spmd(auto=True)``)."""
    ref = weakref.ref(optimizer)

    def named() -> Iterator[tuple[str, torch.Tensor]]:
        opt = ref()
        params = [p for grp in opt.param_groups for p in grp["params"]] if opt is not None else []
        return ((f"param{i}", p) for i, p in enumerate(params))

    scope = _Scope(named, m, policy, _hints(named(), m), owner=ref)
    scope.optimizers.append(ref)
    _register(scope)


def _register(scope: _Scope) -> None:
    _WAITING.append(scope)
    if _whole_steps not in phases.WHOLE_STEP:
        phases.WHOLE_STEP.append(_whole_steps)
    if _pre_sync not in executor.PRE_SYNC:
        executor.PRE_SYNC.insert(0, _pre_sync)  # NOTE: before the sticky-spec hook, which then sees our specs
    _install_optimizer_hook()


def _whole_steps() -> bool:
    """Whether a live scope waits for its plan or re-applies its activation table: both read the whole
    step's graph at one sync, so ``backward()`` must not launch the step in phases (core.phases)."""
    return any(s.owner() is not None for s in _WAITING + _TABLES)


def _hints(named: Iterator[tuple[str, torch.Tensor]], m: Mesh) -> dict[str, ShardingSpec]:
    """The user's annotations of parameters, checked to be expressible as a plan placement."""
    out: dict[str, ShardingSpec] = {}
    for name, p in named:
        spec = A.sticky_spec(p) if isinstance(p, LazyTensor) else None
        if spec is None:
            continue
        root = spec.reduced().on_root()
        if root.mesh != m.root:
            raise ValueError(f"parameter {name!r} is annotated on mesh {root.mesh!r}, but AUTO plans on "
                             f"{m!r}; annotate it on the same mesh or clear_sharding() it first")
        for d, axes in enumerate(root.dim_axes):
            if list(axes) != sorted(axes):
                raise ValueError(f"parameter {name!r}: dim {d} is split over mesh axes {axes} in non-mesh "
                                 f"order, which the auto-sharder cannot pin; list them in mesh order")
        out[name] = root
    return out


def _to_autoshard(spec: ShardingSpec) -> tuple:
    where = {a: d for d, axes in enumerate(spec.dim_axes) for a in axes}
    return tuple(("S", where[a]) if a in where else "R" for a in range(spec.mesh.ndim))


def _from_autoshard(m: Mesh, spec: tuple, ndim: int) -> ShardingSpec:
    dims = tuple(tuple(a for a, p in enumerate(spec) if isinstance(p, tuple) and p[1] == d) for d in range(ndim))
    return ShardingSpec(m, dims)


# -- the optimizer hook: which optimizer steps which parameters --------------------------
_HOOK: dict[str, Any] = {}


def _install_optimizer_hook() -> None:
    if "handle" not in _HOOK:
        from torch.optim.optimizer import register_optimizer_step_pre_hook
        _HOOK["handle"] = register_optimizer_step_pre_hook(_on_optimizer_step)


def _on_optimizer_step(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
    ids = {id(p) for grp in optimizer.param_groups for p in grp["params"]}
    for scope in _WAITING:
        if any(id(p) in ids for _, p in scope.named_params()):
            if not any(r() is optimizer for r in scope.optimizers):
                scope.optimizers.append(weakref.ref(optimizer))
    policy = _GLOBAL.get("policy")
    if policy is not None and not _owned(ids):
        lazy = [p for grp in optimizer.param_groups for p in grp["params"] if isinstance(p, LazyTensor)]
        if lazy:
            prepare_optimizer(optimizer, _GLOBAL["mesh"], policy)


def _owned(ids: set[int]) -> bool:
    _DONE[:] = [s for s in _DONE if s.owner() is not None]
    return any(id(p) in ids for s in _WAITING + _DONE for _, p in s.named_params())


_DONE: list[_Scope] = []
_GLOBAL: dict[str, Any] = {}


def enable_global(m: Mesh, policy: AutoPolicy) -> None:
    """``use_spmd(auto=True)``: every optimizer stepping lazy parameters not yet planned gets AUTO."""
    _GLOBAL.update(mesh=m, policy=policy)
    _install_optimizer_hook()


def disable_global() -> None:
    _GLOBAL.clear()


# -- the forward hook: remember the batch, later constrain it --------------------------
def _forward_hook(scope: _Scope) -> Callable[..., Any]:
    """Positional tensor inputs are ``input:{i}``, keyword ones ``input:{name}`` (HF's ``input_ids``, ``labels``)."""
    def hook(mod: nn.Module, args: tuple, kwargs: dict) -> tuple | None:
        named = [(f"input:{i}", a) for i, a in enumerate(args)] + [(f"input:{k}", v) for k, v in kwargs.items()]
        if scope.plan is None:
            if scope in _WAITING:
                scope.inputs = {k: v for k, v in named if isinstance(v, LazyTensor)}
            return None
        new_args = tuple(_constrain_input(scope, f"input:{i}", a) for i, a in enumerate(args))
        return new_args, {k: _constrain_input(scope, f"input:{k}", v) for k, v in kwargs.items()}
    return hook


def _constrain_input(scope: _Scope, name: str, x: Any) -> Any:
    spec = scope.plan.placements.get(name)
    if not isinstance(x, LazyTensor) or spec is None or tuple(scope.plan.shapes.get(name, ())) != tuple(x.shape):
        return x
    from xla_dtensor.spmd.relayout import Relayout
    return Relayout.apply(x, _input_layout(scope.mesh, spec, x.dim()), None)


@functools.lru_cache(maxsize=256)
def _input_layout(m: Mesh, spec: tuple, ndim: int) -> ShardingSpec:
    """The layout ``constrain_activation`` gives an input the plan places as ``spec`` (made once, not
    per step: a ShardingSpec and its placements cost ~0.1 ms an input)."""
    from xla_dtensor.spmd.styles import layout_of_placements
    return layout_of_placements(m, _from_autoshard(m, spec, ndim).to_placements(), ndim)


# -- the sync hook: plan and annotate ----------------------------------------------------
def _pre_sync(pending: list[Storage]) -> None:
    if not _WAITING and not _TABLES:
        return
    pend = set(pending)
    _constrain_activations(pending, pend)
    for scope in list(_WAITING):
        if scope.owner() is None:
            _WAITING.remove(scope)
            continue
        params = list(scope.named_params())
        if any(isinstance(p, LazyTensor) and storage_of(p) in pend for _, p in params):
            _plan_scope(scope, params, pending)


_TABLES: list[_Scope] = []  # planned scopes with activation constraints to re-apply


def _constrain_activations(pending: list[Storage], pend: set[Storage]) -> None:
    """Re-apply each planned scope's activation layouts to a sync that trains its parameters."""
    _TABLES[:] = [s for s in _TABLES if s.owner() is not None]
    roots = None
    for scope in _TABLES:
        if any(isinstance(p, LazyTensor) and storage_of(p) in pend for _, p in scope.named_params()):
            if state.defer(scope.table):  # sync() lays the table on its own walk of the graph
                continue
            roots = roots if roots is not None else [s.value for s in pending]
            scope.table.apply(roots)


def _activation_shardings(scope: _Scope, plan: Any, graph: Any, ir_of: dict[tuple[int, int], Any]) -> dict[int, Any]:
    """``id(IR node) -> NamedSharding`` for the plan's layouts the IR should be held to.

    * every decision op's (first) output, in the plan's layout (non-Partial, evenly
      divisible ones; a multi-output op's through the IR ``getitem`` reading it);
    * every parameter's gradient, in the parameter's layout: the one the optimizer
      reads it in. Without it XLA may keep a Partial gradient scattered, run the
      optimizer on shards and gather the parameter and each state slot back (three
      all-gathers where the plan costed one reduction).
    """
    out: dict[int, Any] = {}
    for (nid, idx), n in ir_of.items():
        gnode = graph.nodes[nid]
        spec = plan.activations.get(gnode.name) if idx == 0 else None
        if spec is not None:
            _put(out, scope, n, spec, gnode.out.shape)
    for pid, ref in graph.grads.items():
        n, spec = ir_of.get(ref), plan.placements.get(graph.nodes[pid].name)
        if n is not None and spec is not None:
            _put(out, scope, n, spec, graph.nodes[ref[0]].outputs[ref[1]].shape)
    return out


def _put(out: dict[int, Any], scope: _Scope, n: Any, spec: tuple, shape: tuple[int, ...]) -> None:
    from xla_dtensor.core import layout as L

    if "P" in spec or not shape:
        return
    sspec = _from_autoshard(scope.mesh, spec, len(shape))
    if L.is_even(sspec, shape):
        out[id(n)] = L.named(sspec)


def _plan_scope(scope: _Scope, params: list[tuple[str, torch.Tensor]], pending: list[Storage]) -> None:
    from xla_dtensor.auto import step_roles
    from xla_dtensor.auto.activations import ActivationTable
    from xla_dtensor.auto.ir_graph import graph_from_ir_with_nodes
    from xla_dtensor.core.ir import topo_order

    opt = next((r() for r in reversed(scope.optimizers) if r() is not None), None)
    holder = _Holder(params)
    pstore, state = step_roles(holder, opt)
    inputs = {storage_of(t): k for k, t in scope.inputs.items()} if scope.is_module else None
    name = type(scope.owner()).__name__ if scope.is_module else "step"
    graph, ir_of = graph_from_ir_with_nodes(pending, params=pstore, opt_state=state, inputs=inputs, name=name)
    if not graph.grads:
        if not scope.warned_no_grads:
            scope.warned_no_grads = True
            warnings.warn(f"AUTO ({name}): this sync updates the parameters but computes no gradient; the plan "
                          f"waits for a sync() that runs a whole training step (forward, backward, optimizer)",
                          UserWarning, stacklevel=4)
        return
    pinned = {k: _to_autoshard(v) for k, v in scope.hints.items()} if scope.policy.keep_user_sharding else {}
    topo = scope.policy.topology_for(scope.mesh)
    _WAITING.remove(scope)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", autoshard.UnknownOpWarning)
            plan = autoshard.solve(graph, scope.mesh, topo, scope.policy.memory_budget, scope.policy.time_limit,
                                   cache_dir=scope.policy.cache_dir, pinned=pinned, cluster=scope.policy.cluster,
                                   progress=scope.policy.progress)
    except autoshard.MemoryBudgetError as err:
        _fallback(scope, params)
        raise autoshard.MemoryBudgetError(
            f"AUTO sharding of {name}: {err}. The module stays replicated and usable: call sync() again to run "
            f"this step replicated, or distribute a fresh module with memory_budget >= {err.min_peak:.0f} bytes",
            err.limit, err.min_peak, err.proven, err.top_nodes) from err
    except Exception:
        _fallback(scope, params)
        raise
    remat = plan.stats.get("remat") or {}
    if remat.get("count"):
        prefix = (plan.stats.get("clustering") or {}).get("prefix", "")
        warnings.warn(f"AUTO ({name}): the plan fits memory_budget only with activation checkpointing of "
                      f"{remat['count']} layers ({', '.join(f'{prefix}.{k}' for k in remat['layers'])}), which is not "
                      f"applied for you: wrap those layers in torch.utils.checkpoint (plan.explain())",
                      UserWarning, stacklevel=4)
    unknown = plan.stats.get("unknown_ops") or []
    if unknown:
        warnings.warn(f"AUTO ({name}): no sharding strategy rule for ops {unknown} and no generic one fits; they "
                      f"run whole on every device (their inputs are gathered)", autoshard.UnknownOpWarning, stacklevel=4)
    if scope.policy.constrain_activations:
        order = topo_order([s.value for s in pending])  # NOTE: before _apply wraps parameter values
        scope.table = ActivationTable.from_nodes(order, _activation_shardings(scope, plan, graph, ir_of))
        scope.table.apply([s.value for s in pending])
        _TABLES.append(scope)
    _apply(scope, plan, params, opt)


class _Holder:
    """The ``named_parameters`` of a scope, for :func:`xla_dtensor.auto.step_roles`."""

    def __init__(self, params: list[tuple[str, torch.Tensor]]) -> None:
        self._params = params

    def named_parameters(self) -> Iterator[tuple[str, torch.Tensor]]:
        return iter(self._params)


def _apply(scope: _Scope, plan: Any, params: list[tuple[str, torch.Tensor]], opt: Any) -> None:
    m = scope.mesh
    owners = {id(p): name for name, p in params}
    tensors = [(name, p) for name, p in params if not (scope.policy.keep_user_sharding and name in scope.hints)]
    for p, slots in (opt.state.items() if opt is not None else ()):
        pname = owners.get(id(p))
        if pname is not None:
            tensors += [(f"{k}:{pname}", v) for k, v in slots.items() if isinstance(v, LazyTensor)]
    for name, t in tensors:
        spec = plan.placements.get(name)
        if spec is not None and t.dim() > 0:
            A.apply_spec(t, _from_autoshard(m, spec, t.dim()))
    scope.plan, scope.inputs = plan, {}
    _DONE.append(scope)
    _LAST["plan"] = plan
    if scope.is_module and scope.owner() is not None:
        scope.owner()._auto_plan = plan
    sharded = sum(1 for n, _ in params if any(p != "R" for p in plan.placements.get(n, ())))
    quality = verdict(plan.stats.get("guard") or {})
    _log.info("AUTO plan for %s: %d of %d parameters sharded, solve %.2f s%s", plan.stats.get("graph_nodes"),
              sharded, len(params), plan.solve_time, f"; plan quality: {quality} (plan.explain())" if quality else "")


def _fallback(scope: _Scope, params: list[tuple[str, torch.Tensor]]) -> None:
    """No plan: parameters the user did not annotate become (sticky) replicated."""
    for name, p in params:
        if isinstance(p, LazyTensor) and name not in scope.hints and p.dim() > 0:
            A.apply_spec(p, ShardingSpec.replicated(scope.mesh, p.dim()))
    scope.inputs = {}
    _DONE.append(scope)
