"""mark_sharding (torch_xla doc examples) against the shardings JAX reports; views, propagation, errors."""
from __future__ import annotations

import jax
import pytest
import torch
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import xla_dtensor
import xla_dtensor.spmd as xs
from xla_dtensor.sharding import DuplicateAxisError, RankError, UnknownAxisError


def _jax_hlo(mesh, pspec, ndim):
    """The HLO sharding JAX itself gives ``pspec`` on ``mesh`` (independent oracle)."""
    return str(NamedSharding(mesh.jax_mesh(), P(*pspec))._to_xla_hlo_sharding(ndim))


def _compiled_out_hlo(ndim):
    """The sharding JAX reports for the last executable's first output."""
    from xla_dtensor.core import executor
    compiled = next(reversed(executor._CACHE.values()))
    return str(compiled.output_shardings[0]._to_xla_hlo_sharding(ndim))


@pytest.mark.parametrize("names,shape,spec", [
    (("x", "y"), (8, 4), (0, None)),
    (("x", "y"), (8, 4), (None, 1)),
    (("data", "model"), (8, 4), ("data", "model")),
    (("data", "model"), (2, 8, 4), (None, "data", "model")),
    (("data", "model"), (16,), (("data", "model"),)),
])
def test_torch_xla_doc_examples_match_jax(dev, names, shape, spec):
    mesh = xs.Mesh(range(8), (4, 2), names)
    jspec = tuple(names[e] if isinstance(e, int) else e for e in spec)
    want = _jax_hlo(mesh, jspec, len(shape))
    host = torch.randn(shape)
    # device data: resharded now
    t = host.to(dev)
    assert xs.mark_sharding(t, mesh, spec).sharding_spec == want
    assert str(t._storage.value.data.sharding._to_xla_hlo_sharding(len(shape))) == want
    # pending value: a constraint that the compiled program reports as its output sharding
    y = host.to(dev) + 1
    xs.mark_sharding(y, mesh, spec)
    torch.testing.assert_close(y.cpu(), host + 1)
    assert _compiled_out_hlo(len(shape)) == want


def test_sticky_sharding_survives_in_place_updates(dev):
    mesh = xs.Mesh(range(8), (4, 2), ("x", "y"))
    w = torch.randn(8, 4)
    t = w.to(dev)
    xs.mark_sharding(t, mesh, ("x", "y"))
    for _ in range(2):
        t.mul_(2).add_(1)
        xla_dtensor.sync()
    assert t._storage.value.data.sharding.spec == P("x", "y")
    torch.testing.assert_close(t.cpu(), (w * 2 + 1) * 2 + 1)


def _hlo_of(t, ndim):
    return str(t._storage.value.data.sharding._to_xla_hlo_sharding(ndim))


def test_sync_holds_sticky_layouts_as_output_shardings(dev):
    """A plain sync() computes a sticky storage in its layout through the program's output shardings: it
    records no constraint node, and the program reports the layout for that output only."""
    from xla_dtensor import metrics
    mesh = xs.Mesh(range(8), (4, 2), ("x", "y"))
    w, v = torch.randn(8, 4), torch.randn(8, 4)
    t, u = w.to(dev), v.to(dev)
    xs.mark_sharding(t, mesh, (None, "y"))
    xla_dtensor.sync()
    t.mul_(2)
    u.add_(1)
    before = metrics.counters()["ops_recorded"]
    xla_dtensor.sync()
    assert metrics.counters()["ops_recorded"] == before  # no sharding_constraint node for t
    assert _hlo_of(t, 2) == _jax_hlo(mesh, (None, "y"), 2)
    torch.testing.assert_close(t.cpu(), w * 2)
    torch.testing.assert_close(u.cpu(), v + 1)


def test_storages_sharing_a_value_keep_their_own_layouts(dev):
    """Two storages that hold one pending value but stick to different layouts come back each in its own."""
    mesh = xs.Mesh(range(8), (4, 2), ("x", "y"))
    h = torch.randn(8, 4)
    a, b = torch.zeros(8, 4).to(dev), torch.ones(8, 4).to(dev)
    xs.mark_sharding(a, mesh, ("x", None))
    xs.mark_sharding(b, mesh, (None, "y"))
    s = h.to(dev) * 3
    a.copy_(s)
    b.copy_(s)
    xla_dtensor.sync()
    assert _hlo_of(a, 2) == _jax_hlo(mesh, ("x", None), 2)
    assert _hlo_of(b, 2) == _jax_hlo(mesh, (None, "y"), 2)
    torch.testing.assert_close(a.cpu(), h * 3)
    torch.testing.assert_close(b.cpu(), h * 3)


def test_propagated_sharding_of_intermediates_after_sync(dev):
    mesh = xs.Mesh(range(8), (8,), ("x",))
    a = torch.randn(16, 4).to(dev)
    xs.mark_sharding(a, mesh, ("x", None))
    b = torch.exp(a) * 3
    assert xs.get_spec(b) is None  # not decided before the program is compiled
    xla_dtensor.sync()
    arr = b._storage.value.data
    assert xs.get_hlo_sharding(b) == str(arr.sharding._to_xla_hlo_sharding(2)) == _jax_hlo(mesh, ("x", None), 2)
    assert xs.XLAShardedTensor.wrap(b).placements[0].dim == 0


def test_annotating_a_view_keeps_the_sharding(dev):
    # torch_xla issue 8662: index_select -> view -> mark_sharding -> view -> print
    mesh = xs.Mesh(range(8), (1, 2, 4), ("data", "other", "model"))
    weight = torch.randn(64, 16)
    idx = torch.zeros(1, 16, dtype=torch.int64)
    w = weight.to(dev)
    xs.mark_sharding(w, mesh, ("model", None))
    v = torch.index_select(w, 0, idx.to(dev).view(-1)).view(1, 16, 16)
    xs.mark_sharding(v, mesh, ("data", "model", None))
    assert xs.get_hlo_sharding(v) == _jax_hlo(mesh, ("data", "model", None), 3)
    out = v.view(1, 16, 16) * 2
    ref = torch.index_select(weight, 0, idx.view(-1)).view(1, 16, 16) * 2
    torch.testing.assert_close(out.cpu(), ref)
    assert "tensor(" in repr(out)
    assert xs.get_hlo_sharding(v) == _jax_hlo(mesh, ("data", "model", None), 3)


def test_view_of_a_root_annotation_does_not_touch_the_base(dev):
    mesh = xs.Mesh(range(8), (8,), ("x",))
    base = torch.randn(4, 16).to(dev)
    view = base[1]
    xs.mark_sharding(view, mesh, ("x",))
    assert xs.get_spec(base) is None or xs.get_spec(base).is_replicated
    torch.testing.assert_close((view + 1).cpu(), base.cpu()[1] + 1)


@pytest.mark.parametrize("spec,err,text", [
    (("x",), RankError, "has 1 entries but the tensor has rank 2"),
    (("x", "y", None), RankError, "rank 2"),
    ((("x", "x"), None), DuplicateAxisError, "'x' is used twice"),
    (("x", "z"), UnknownAxisError, "'z'"),
])
def test_bad_specs_leave_the_tensor_as_it_was(dev, spec, err, text):
    mesh = xs.Mesh(range(8), (4, 2), ("x", "y"))
    t = torch.randn(8, 4).to(dev)
    xs.mark_sharding(t, mesh, (None, "y"))
    before_value, before_spec = t._storage.value, xs.get_spec(t)
    with pytest.raises(err, match=text):
        xs.mark_sharding(t, mesh, spec)
    assert t._storage.value is before_value and xs.get_spec(t) == before_spec


def test_mark_sharding_needs_a_device_tensor_and_known_devices(dev):
    with pytest.raises(xs.NotShardableError, match="jax device"):
        xs.mark_sharding(torch.ones(8), xs.Mesh(range(8), (8,)), (0,))
    with pytest.raises(xs.MeshDevicesError, match=r"\[8\]"):
        xs.mark_sharding(torch.ones(9, device=dev), xs.Mesh(range(9), (9,)), (0,))


def test_clear_sharding_and_visualize(dev, capsys):
    mesh = xs.Mesh(range(8), (4, 2), ("x", "y"))
    t = torch.randn(8, 8).to(dev)
    xs.mark_sharding(t, mesh, ("x", "y"))
    text = xs.visualize_tensor_sharding(t, width=40, color=False)
    assert "{devices=[4,2]<=[8]}" in text.plain and " 7 " in text.plain
    u = t * 2  # propagated layout, drawn after an implicit sync
    assert "{devices=[4,2]<=[8]}" in xs.visualize_tensor_sharding(u, width=40, color=False).plain
    xs.clear_sharding(t)
    assert xs.get_spec(t).is_replicated
    assert str(t._storage.value.data.sharding._to_xla_hlo_sharding(2)) == "{replicated}"


def test_mark_sharding_with_gradients(dev):
    mesh = xs.Mesh(range(8), (8,), ("x",))
    x0 = torch.randn(8, 4)
    x = x0.to(dev).requires_grad_()
    y = xs.mark_sharding_with_gradients(x, mesh, ("x", None))
    (y.sin() * 2).sum().backward()
    torch.testing.assert_close(x.grad.cpu(), 2 * torch.cos(x0))
    assert xs.get_hlo_sharding(x.grad) == _jax_hlo(mesh, ("x", None), 2)


def test_use_spmd_and_get_1d_mesh():
    xs.use_spmd()
    m = xs.get_1d_mesh("data")
    assert m.device_ids == tuple(d.id for d in jax.devices()) and m.axis_names == ("data",)
