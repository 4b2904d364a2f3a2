"""``auto_vs_manual.py --only MODEL[,MESH]`` selects one case; bad names say what is allowed."""
from __future__ import annotations

import mesh  # noqa: F401  (8 virtual devices before jax)

import pytest

from benchmarks._cases import MODELS, real_topologies, virtual_meshes
from benchmarks.auto_vs_manual import only

MESHES, SYSTEMS = list(virtual_meshes()), list(real_topologies())


def test_model_and_mesh():
    models, meshes, systems = only("gpt2-2L-128,4x2", MODELS, MESHES, SYSTEMS)
    assert [c.name for c in models] == ["gpt2-2L-128"] and meshes == ["4x2"] and systems == []


def test_model_and_modelled_system():
    models, meshes, systems = only("vit-2L-128, TPU v5e 4x4", MODELS, MESHES, SYSTEMS)
    assert [c.name for c in models] == ["vit-2L-128"] and meshes == [] and systems == ["TPU v5e 4x4"]


def test_model_alone_keeps_every_mesh():
    models, meshes, systems = only("mlp-3x1024", MODELS, MESHES, SYSTEMS)
    assert [c.name for c in models] == ["mlp-3x1024"] and meshes == MESHES and systems == SYSTEMS


@pytest.mark.parametrize("spec,bad", [("gpt3,4x2", "'gpt3'"), ("gpt2-2L-128,3x3", "'3x3'")])
def test_unknown_names_are_rejected_with_the_allowed_ones(spec, bad):
    with pytest.raises(ValueError, match=bad) as err:
        only(spec, MODELS, MESHES, SYSTEMS)
    assert "allowed" in str(err.value)
