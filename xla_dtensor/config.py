"""Runtime switches of the lazy core.

Example:
    >>> import xla_dtensor
    >>> xla_dtensor.config.cpu_fallback = True   # run ops without a lowering on CPU
    >>> xla_dtensor.config.cache_size
    256
"""
from __future__ import annotations

import gc
from dataclasses import dataclass

_PYTHON_GC = gc.get_threshold()  # Python's (or the user's) setting when the library loaded


@dataclass
class Config:
    """Mutable process-wide settings (one instance: ``xla_dtensor.config``).

    Attributes:
        cpu_fallback: run an op that has no lowering on CPU (counted in metrics)
            instead of raising ``NotImplementedError`` at the op.
        cache_size: executables kept in the in-memory LRU cache.
        donate: donate the buffers of tensors overwritten in place, at ``sync()``
            and by eager in-place ops whose old buffer nothing else holds.
        check_lowerings: compare each lowering's output shape/dtype with torch's
            meta kernel once per argument signature.
        compile_check_every: under ``xla_dtensor.compile``, re-trace every N-th
            replay and compare the graph with the cached one (0: never). A re-check
            costs a lazy trace (~22 ms of host CPU for a 4-layer GPT-2 step against
            ~0.7 ms a replay, ``benchmarks/spmd_step.py``): at 50 that is ~0.4 ms a call.
        compile_cache_size: programs (input signatures) kept per ``xla_dtensor.compile``
            function, least recently used dropped first, with a ``RetraceWarning`` the
            first time (a function that keeps retracing). Optimizer hyperparameters
            (learning-rate schedules) are program inputs, not signatures. The
            executables themselves live in the process-wide LRU (``cache_size``).
        recompile_warn_limit: warn when one call site has compiled more than this
            many different programs.
        check_indices: bounds-check the indices of indexing ops (embedding, ``x[idx]``,
            gather, index_select, take, index_put, scatter, index_add/copy/fill,
            nll_loss) and raise torch's error at the next barrier (``True``, the
            default: measured +0.3 to +1.1% of a GPT-2 step's CPU time,
            ``benchmarks/results/index_check_cost.md``); let XLA clamp them
            (``False``); ``None``: check in eager mode only. A replay of
            ``xla_dtensor.compile`` is never checked. See ``xla_dtensor/core/index_checks.py``.
        fused_attention: record ``F.scaled_dot_product_attention`` (lazy mode and
            ``compile``) as one attention op lowered to the platform's fused kernel
            (cuDNN on GPU, Pallas on TPU, XLA's math on CPU); ``False``: torch's
            decomposition into primitive ops. See ``xla_dtensor/core/sdpa.py``.
        fused_linear: record ``F.linear`` of plain lazy tensors as one op (``True``, the
            default) instead of torch's ``t``/``view``/``addmm``/``view`` (~2 us of host
            time less per layer projection), and its gradients as one op instead of ~9;
            ``False``: the decomposition. See ``xla_dtensor/core/linear.py``.
        fused_optimizers: torch's Adam, AdamW and SGD over lazy parameters, made with
            neither ``foreach`` nor ``fused``, take their fused implementation at their
            first step (``True``, the default: one recorded op a step instead of ~10 list
            ops, ~20% less host time a step on the 12-layer benchmark GPT); ``False``: torch's
            default (``foreach``). See ``xla_dtensor/core/fused_optim.py``.
        gc_threshold: Python's young-generation collection threshold (the first value of
            ``gc.set_threshold``) while the library is loaded: raised to this value, never
            lowered (default 20,000; ``None``: Python's own setting). A lazy step keeps ~5
            container objects per recorded op alive until ``sync()`` (node, tensor,
            storage, tuples), so at Python 3.11's 700 a 12-layer GPT step ran ~24 young
            collections, each traversing every young tensor: 16% of the step's host time
            (``benchmarks/results/lazy_overhead.md``). Reference cycles are still
            collected, just in larger batches.
        backward_on_caller: run ``backward()`` of device tensors on the thread that calls
            it (``True``, the default: torch's ``set_multithreading_enabled(False)``, set on
            each Python thread at its first op on the device) instead of torch's autograd
            device thread. Recording is Python under the GIL, so the extra thread bought
            no parallelism: it cost 6-20% more host CPU per 12-layer GPT step in two
            benchmark runs (the hand-off and per-op owner lookups), and its CPU time was
            missing from the calling thread's (``benchmarks/results/lazy_overhead.md``). Read at a thread's first op; a thread
            can still opt back in with ``torch.autograd.set_multithreading_enabled(True)``.
        launch_at_backward: in lazy mode, ``loss.backward()`` launches the recorded forward as
            it starts and the backward as it returns, so the device runs each while the host
            records the next. ``None`` (the default): on a GPU or TPU, not on CPU; ``True`` /
            ``False``: always / never. On an H100 it took a 12-layer GPT-2 step whose loss is
            read every step from 1.97x torch eager's time to 1.06x; on CPU, where XLA's threads
            share the host's cores, the launches mostly add host time (1.24x a 12-layer step's).
            Never under ``xla_dtensor.compile`` or the AUTO policy. See
            ``xla_dtensor/core/phases.py``.
        pack_state: at ``sync()``, the updated tensors whose layout is known (one device, or
            an even sticky layout) leave the step's program as one array per (dtype, layout),
            and the next program takes those arrays, not one per tensor (``True``, the
            default): JAX's host work per array is what a lazy step pays most for beyond
            recording. A tensor read on its own (a host read, ``compile``, a checkpoint)
            unpacks its whole group once. See ``xla_dtensor/core/packs.py``.
        pack_mesh_state: with ``pack_state``, tensors with an even sticky layout on a mesh
            (``mark_sharding``, ``distribute_tensor``, FSDP, AUTO's plan, and the optimizer
            state of such parameters) are packed too, shard-major (``False``, the default:
            on 8 CPU devices it took 2-4 ms off an AUTO-planned 12-layer GPT step's host
            time, but XLA:CPU computes each member's update again in the kernel that packs
            it, and a 2x4 Megatron step's device CPU time rose 14-31%; not yet measured on a
            GPU; see docs/lazy_core.md, "Packed state").
        free_on_helper: after a ``sync()`` whose program runs on several devices, the step's
            old graph (and with it the arrays the program read) is freed on a helper thread,
            while the caller records the next step (``True``, the default): freeing a 12-layer
            GPT step's 591 state arrays split over 8 CPU devices cost the calling thread ~4 ms,
            and JAX frees them mostly without the GIL. ``sync(wait=True)`` and ``wait()``
            return once it is freed. ``False``: freed by the thread that syncs, as on one
            device. See ``xla_dtensor/core/reaper.py``.
    """

    cpu_fallback: bool = False
    cache_size: int = 256
    donate: bool = True
    check_lowerings: bool = True
    compile_check_every: int = 50
    recompile_warn_limit: int = 8
    compile_cache_size: int = 32
    check_indices: bool | None = True
    fused_attention: bool = True
    fused_linear: bool = True
    fused_optimizers: bool = True
    gc_threshold: int | None = 20_000
    backward_on_caller: bool = True
    launch_at_backward: bool | None = None
    pack_state: bool = True
    pack_mesh_state: bool = False
    free_on_helper: bool = True

    def __setattr__(self, name: str, value: object) -> None:
        if name not in type(self).__dataclass_fields__:
            allowed = ", ".join(type(self).__dataclass_fields__)
            raise AttributeError(f"unknown config option {name!r}; options are: {allowed}")
        if name in ("cache_size", "compile_cache_size") and (not isinstance(value, int) or value < 1):
            raise ValueError(f"{name} must be a positive int, got {value!r}")
        if name in ("compile_check_every", "recompile_warn_limit") and (
                not isinstance(value, int) or isinstance(value, bool) or value < 0):
            raise ValueError(f"{name} must be an int >= 0, got {value!r}")
        if name in ("fused_attention", "fused_linear", "fused_optimizers", "backward_on_caller", "pack_state",
                    "pack_mesh_state", "free_on_helper") and \
                not isinstance(value, bool):
            raise ValueError(f"{name} must be True or False, got {value!r}")
        if name == "launch_at_backward" and value not in (None, True, False):
            raise ValueError(f"launch_at_backward must be True, False or None (on a GPU or TPU), got {value!r}")
        if name == "check_indices" and value not in (None, True, False):
            raise ValueError(f"check_indices must be True, False or None (eager mode only), got {value!r}")
        if name == "gc_threshold":
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise ValueError(f"gc_threshold must be a positive int or None, got {value!r}")
            _set_gc_threshold(value)
        object.__setattr__(self, name, value)


def _set_gc_threshold(value: int | None) -> None:
    young = _PYTHON_GC[0] if value is None or not _PYTHON_GC[0] else max(_PYTHON_GC[0], value)
    gc.set_threshold(young, *gc.get_threshold()[1:])


config = Config()
