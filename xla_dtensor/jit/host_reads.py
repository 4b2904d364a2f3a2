"""Host reads while tracing: which ones depend on the call's data.

A compiled function that reads a device value on the host (``.item()``, ``if tensor:``,
``.tolist()``) while it is traced may take a Python branch that a replay cannot re-take.
That matters only when the value can change between calls. A value computed from
constants alone (Python scalars and tensors the function builds from host data, such as
``torch.arange(n, device=dev)``, or results of earlier such reads) is the same on every
call with the signature, so the branch is too: the read is *constant* and the trace can
be replayed. HF transformers' mask code reads one such value on every forward
(``find_packed_sequence_indices`` on position ids made by ``arange``).

A value that reaches anything else (an argument, a parameter, optimizer state, a
gradient, a fresh PRNG key, a CPU tensor argument moved to the device) is
*data-dependent*: the signature then runs lazily (``DataDependentWarning``).

Example:
    >>> import torch, xla_dtensor
    >>> dev = xla_dtensor.device()
    >>> @xla_dtensor.compile
    ... def step(x):
    ...     n = int(torch.arange(4, device=dev).sum())   # constant: replayed
    ...     return x * n
    >>> [step(torch.ones(2, device=dev)).tolist() for _ in range(3)]
    [[6.0, 6.0], [6.0, 6.0], [6.0, 6.0]]
"""
from __future__ import annotations

import numpy as np
import torch

from xla_dtensor.core.ir import PARAM, Node, topo_order

__all__ = ["classify", "host_array"]


def classify(log: list[tuple], hosts: list[tuple[int, torch.Tensor]]) -> tuple[int, int]:
    """``(data-dependent reads, constant reads)`` of one traced call.

    ``log``: the executor's capture log, in order (``("read", value, value after)`` per
    host read, ``("host", leaf)`` per device leaf made from host data); ``hosts``: the
    call's CPU tensor arguments ``(position, tensor)`` (moved to the device inside the
    function, they are inputs, not constants).
    """
    const: set[int] = set()
    dependent = constant = 0
    for entry in log:
        if entry[0] == "host":
            if not _is_argument(entry[1], hosts):
                const.add(id(entry[1]))
            continue
        _, value, after = entry
        if all(n.op == PARAM or id(n) in const for n in topo_order([value]) if n.fn is None):
            constant += 1
            const.add(id(after))  # its storage now holds the computed array: a constant too
        else:
            dependent += 1
    return dependent, constant


def _is_argument(leaf: Node, hosts: list[tuple[int, torch.Tensor]]) -> bool:
    shape = tuple(leaf.key[1])
    for _, t in hosts:
        if tuple(t.shape) == shape and np.array_equal(np.asarray(leaf.data), host_array(t, leaf.key[2])):
            return True
    return False


def host_array(t: torch.Tensor, dtype: torch.dtype) -> np.ndarray:
    """CPU tensor ``t`` as the numpy array a device leaf of ``dtype`` made from it holds."""
    c = t.detach().to(dtype)
    return c.float().numpy() if dtype == torch.bfloat16 else c.numpy()
