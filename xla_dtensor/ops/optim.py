"""The fused optimizer steps torch calls for ``Adam/AdamW/SGD/Adagrad(fused=True)``, and GradScaler's ops.

``torch._fused_adamw_(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps, ...)``
updates every parameter and its state in one op; on the ``jax`` device it is one node
(one executable call in eager mode, against ~12 ``_foreach_*`` ops for ``foreach=True``).
The math is torch CPU's fused kernels': the step counters are already incremented by the
optimizer, ``grad_scale`` divides the gradients (and the unscaled gradients are written
back), and ``found_inf == 1`` leaves every tensor unchanged. Half types compute in float32.
The float hyperparameters (``lr``, ``beta1``, ``weight_decay``...) are traced program inputs,
not constants (``registry.traced_floats``): a learning-rate schedule reuses the step's program.

The functional overloads (``_fused_adamw.default``, what functionalization produces) return
one list per output group, as their schema says; the in-place overloads return the new
values of every mutated list flattened, in schema order (the lazy core's in-place
convention).

``torch.amp.GradScaler("jax")`` (float16 autocast) calls two ops, lowered here as torch's
CPU kernels compute them: ``_amp_foreach_non_finite_check_and_unscale_`` (each gradient
times ``inv_scale``; ``found_inf`` set to 1 if any is inf or NaN) and ``_amp_update_scale_``
(back off after an overflow, grow after ``growth_interval`` clean steps).

Example:
    >>> import torch, jax.numpy as jnp
    >>> from xla_dtensor.ops.registry import get_lowering
    >>> sgd = get_lowering(torch.ops.aten._fused_sgd.default)
    >>> p, g, buf = sgd([jnp.ones(2)], [jnp.ones(2)], [], weight_decay=0.0, momentum=0.0, lr=0.5,
    ...                 dampening=0.0, nesterov=False, maximize=False, is_first_step=False)
    >>> p[0].tolist()
    [0.5, 0.5]
"""
from __future__ import annotations

from typing import Any, Callable

import jax.numpy as jnp
import torch

from xla_dtensor.ops.dtypes import compute_type, to_jax, torch_dtype
from xla_dtensor.ops.registry import lowering, traced_floats

aten = torch.ops.aten
Groups = tuple[list[Any], ...]


def _prepare(grad: Any, grad_scale: Any, maximize: bool) -> tuple[Any, Any]:
    """(the gradient written back, the gradient the update uses, in compute precision).

    Without ``grad_scale`` the gradient written back is ``grad`` itself, so the lazy core
    sees the target unchanged and writes nothing (see ``core.entries._unchanged``).
    """
    ct = to_jax(compute_type(torch_dtype(grad)))
    g = grad.astype(ct)
    if grad_scale is None:
        return grad, -g if maximize else g
    g = g / grad_scale.astype(ct)
    return g, -g if maximize else g


def _nonzero(x: Any) -> bool:
    """Whether hyperparameter ``x`` may be non-zero: a traced one is (the core passes 0 as a literal)."""
    return not (isinstance(x, (int, float)) and x == 0)


def _guarded(new: Groups, old: Groups, found_inf: Any) -> Groups:
    """Each new value cast to its old dtype; all of them the old values where ``found_inf == 1``."""
    cast = tuple([n.astype(o.dtype) for n, o in zip(ns, os)] for ns, os in zip(new, old))
    if found_inf is None:
        return cast
    skip = jnp.reshape(found_inf, ()) == 1
    return tuple([jnp.where(skip, o, n) for n, o in zip(ns, os)] for ns, os in zip(cast, old))


def _adam(decoupled: bool) -> Callable[..., Groups]:
    def lower(params: list[Any], grads: list[Any], exp_avgs: list[Any], exp_avg_sqs: list[Any],
              max_exp_avg_sqs: list[Any], state_steps: list[Any], *, lr: Any, beta1: float, beta2: float,
              weight_decay: float, eps: float, amsgrad: bool, maximize: bool, grad_scale: Any = None,
              found_inf: Any = None) -> Groups:
        new: Groups = ([], [], [], [], [])
        for i, (p, grad, m, v) in enumerate(zip(params, grads, exp_avgs, exp_avg_sqs)):
            ct = to_jax(compute_type(torch_dtype(p)))
            p, m, v = p.astype(ct), m.astype(ct), v.astype(ct)
            g_out, g = _prepare(grad, grad_scale, maximize)
            step = jnp.reshape(state_steps[i], ()).astype(ct)
            if _nonzero(weight_decay):
                if decoupled:
                    p = p * (1 - lr * weight_decay)
                else:
                    g = g + p * weight_decay
            m = m + (g - m) * (1 - beta1)
            v = v * beta2 + (1 - beta2) * g * g
            bias1, bias2_sqrt = 1 - beta1 ** step, jnp.sqrt(1 - beta2 ** step)
            if amsgrad:
                vmax = jnp.maximum(max_exp_avg_sqs[i].astype(ct), v)
                new[4].append(vmax)
                denom = jnp.sqrt(vmax) / bias2_sqrt + eps
            else:
                denom = jnp.sqrt(v) / bias2_sqrt + eps
            p = p - (lr / bias1) * m / denom
            new[0].append(p)
            new[1].append(g_out)
            new[2].append(m)
            new[3].append(v)
        old = (params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs if amsgrad else [])
        out = _guarded(new, old, found_inf)
        return out[:4] + (out[4] if amsgrad else list(max_exp_avg_sqs),)
    lower.__name__ = "_fused_adamw" if decoupled else "_fused_adam"
    return lower


def _sgd(params: list[Any], grads: list[Any], momentum_buffer_list: list[Any], *, weight_decay: float,
         momentum: float, lr: Any, dampening: float, nesterov: bool, maximize: bool, is_first_step: bool,
         grad_scale: Any = None, found_inf: Any = None) -> Groups:
    new: Groups = ([], [], [])
    for i, (p, grad) in enumerate(zip(params, grads)):
        ct = to_jax(compute_type(torch_dtype(p)))
        p = p.astype(ct)
        g_out, g = _prepare(grad, grad_scale, maximize)
        if _nonzero(weight_decay):
            g = g + weight_decay * p
        if _nonzero(momentum):
            buf = g if is_first_step else momentum * momentum_buffer_list[i].astype(ct) + (1 - dampening) * g
            new[2].append(buf)
            g = g + momentum * buf if nesterov else buf
        new[0].append(p - lr * g)
        new[1].append(g_out)
    out = _guarded(new, (params, grads, momentum_buffer_list if _nonzero(momentum) else []), found_inf)
    return out[:2] + (out[2] if _nonzero(momentum) else list(momentum_buffer_list),)


def _adagrad(params: list[Any], grads: list[Any], state_sums: list[Any], state_steps: list[Any], *, lr: Any,
             lr_decay: float, weight_decay: float, eps: float, maximize: bool, grad_scale: Any = None,
             found_inf: Any = None) -> Groups:
    new: Groups = ([], [], [])
    for p, grad, s, step in zip(params, grads, state_sums, state_steps):
        ct = to_jax(compute_type(torch_dtype(p)))
        p, s = p.astype(ct), s.astype(ct)
        g_out, g = _prepare(grad, grad_scale, maximize)
        if _nonzero(weight_decay):
            g = g + weight_decay * p
        clr = lr / (1 + (jnp.reshape(step, ()).astype(ct) - 1) * lr_decay)
        s = s + g * g
        new[0].append(p - clr * g / (jnp.sqrt(s) + eps))
        new[1].append(g_out)
        new[2].append(s)
    return _guarded(new, (params, grads, state_sums), found_inf)


def _adagrad_default(*args: Any, **kwargs: Any) -> Groups:
    """The default overload also returns the (unchanged) step counters."""
    return _adagrad(*args, **kwargs) + (list(args[3]),)


def _flattened(functional: Callable[..., Groups], n_mutated: int) -> Callable[..., list[Any]]:
    """The in-place overload: the first ``n_mutated`` groups' new values, in one list."""
    def lower(*args: Any, **kwargs: Any) -> list[Any]:
        return [x for group in functional(*args, **kwargs)[:n_mutated] for x in group]
    lower.__name__ = functional.__name__ + "_"
    return lower


_adam_lower, _adamw_lower = _adam(False), _adam(True)
for _ops, _fn, _mutated in (
        ((aten._fused_adam.default, aten._fused_adam.tensor_lr), _adam_lower, None),
        ((aten._fused_adamw.default, aten._fused_adamw.tensor_lr), _adamw_lower, None),
        ((aten._fused_sgd.default, aten._fused_sgd.tensor_lr), _sgd, None),
        ((aten._fused_adagrad.tensor_lr,), _adagrad, None),
        ((aten._fused_adagrad.default,), _adagrad_default, None),
        ((aten._fused_adam_.default, aten._fused_adam_.tensor_lr), _adam_lower, 5),
        ((aten._fused_adamw_.default, aten._fused_adamw_.tensor_lr), _adamw_lower, 5),
        ((aten._fused_sgd_.default, aten._fused_sgd_.tensor_lr), _sgd, 3),
        ((aten._fused_adagrad_.tensor_lr,), _adagrad, 3),
        ((aten._fused_adagrad_.default,), _adagrad_default, 4)):
    lowering(*_ops)(_fn if _mutated is None else _flattened(_fn, _mutated))
    # hyperparameters as program inputs: a learning-rate schedule reuses the step's program
    traced_floats(*_ops, names=("lr", "beta1", "beta2", "weight_decay", "eps", "momentum", "dampening", "lr_decay"))
del _ops, _fn, _mutated


def _unscale(grads: list[Any], found_inf: Any, inv_scale: Any) -> tuple[list[Any], Any]:
    """GradScaler's unscale: every gradient times ``inv_scale``, ``found_inf`` 1 if any is not finite."""
    out, bad = [], jnp.zeros((), bool)
    for g in grads:
        out.append((g.astype(jnp.float32) * inv_scale.astype(jnp.float32)).astype(g.dtype))
        bad = bad | ~jnp.all(jnp.isfinite(g))
    return out, jnp.where(bad, jnp.ones_like(found_inf), found_inf)


def _update_scale(scale: Any, growth_tracker: Any, found_inf: Any, scale_growth_factor: float,
                  scale_backoff_factor: float, growth_interval: int) -> tuple[Any, Any]:
    """GradScaler's new (scale, growth tracker), as torch's ``_amp_update_scale_cpu_``."""
    inf = jnp.reshape(found_inf, ()) != 0
    grown = growth_tracker + 1
    grow = grown == growth_interval
    bigger = scale * scale_growth_factor
    grown_scale = jnp.where(jnp.isfinite(bigger), bigger, scale)  # torch keeps the scale if growing overflows
    new_scale = jnp.where(inf, scale * scale_backoff_factor, jnp.where(grow, grown_scale, scale))
    tracker = jnp.where(inf | grow, jnp.zeros_like(growth_tracker), grown)
    return new_scale.astype(scale.dtype), tracker


def _unscale_(grads: list[Any], found_inf: Any, inv_scale: Any) -> list[Any]:
    """The in-place overload: the new gradients, then ``found_inf``."""
    out, found = _unscale(grads, found_inf, inv_scale)
    return [*out, found]


lowering(aten._amp_foreach_non_finite_check_and_unscale.default)(_unscale)
lowering(aten._amp_foreach_non_finite_check_and_unscale_.default)(_unscale_)
lowering(aten._amp_update_scale.default, aten._amp_update_scale_.default)(_update_scale)
