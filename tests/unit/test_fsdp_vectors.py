"""Vectors stay out of FSDP2 (`runtime/fsdp.fsdp_shards`): each 1-D parameter whole on every rank, each matrix FSDP2's.

On a fake process group (no data moves; the placements and FSDP2's parameter groups are what is checked, by
`dtp.testing.fsdp_rule`, which reads torch's state, not dtp's rule): tiny FLUX.1 at (cp=2) and Wan (sharded QK-norm,
a rowwise bias Replicate over tp, a colwise one Shard(0)) at (cfg=2, cp=2, tp=2). Negative controls: the old rule
(VECTORS_WHOLE False: every vector sharded) and a wrongly left-out matrix both show as breaks. The units' gathered
bytes leave the vectors out (what `in_flight_bytes` and `dtp fit` count); the resident bytes count them whole
(tests/unit/test_check_fsdp.py). Parity on gloo: tests/distributed/fsdp_cases.py checks `rule_breaks` beside every
parity run.
"""

from __future__ import annotations

from unittest import mock

import pytest
import torch
from torch.distributed.tensor import DTensor

import dtp
import dtp.runtime.fsdp as runtime_fsdp
from dtp.analysis.fakepg import fake_world
from dtp.runtime.fsdp import LAYOUT_ATTR
from dtp.testing.fsdp_rule import rule_breaks
from dtp.testing.tiny import tiny_model

FLUX, WAN = "FluxTransformer2DModel", "WanTransformer3DModel"
MESHES = {FLUX: dict(cp=2), WAN: dict(cfg=2, cp=2, tp=2)}


def _sharded(cls: str, vectors_whole: bool = True):
    """`cls` tiny, parallelized with fsdp=True on its mesh of MESHES (inside a fake world of its size)."""
    with mock.patch.object(runtime_fsdp, "VECTORS_WHOLE", vectors_whole):
        return dtp.parallelize(tiny_model(cls), dtp.make_mesh(**MESHES[cls], device_type="cpu"), fsdp=True)


def _world(cls: str) -> int:
    return int(torch.tensor(list(MESHES[cls].values())).prod())


@pytest.mark.parametrize("cls", [FLUX, WAN])
def test_vectors_whole_matrices_sharded(cls):
    """No break; the vectors are plain tensors at tp=1, and at tp=2 a plain tensor or a DTensor on the tp axis alone
    (Shard(0): a colwise bias, Replicate: a rowwise one), with the shape the unsharded model gives them over tp."""
    with fake_world(_world(cls)):
        model = _sharded(cls)
        assert rule_breaks(model) == []
        vectors = [p for p in model.parameters() if p.ndim < 2]
        assert len(vectors) == sum(p.ndim < 2 for p in tiny_model(cls).parameters()) > 0
        if MESHES[cls].get("tp", 1) == 1:
            assert not any(isinstance(p, DTensor) for p in vectors)
        else:
            meshes = {p.device_mesh.mesh_dim_names for p in vectors if isinstance(p, DTensor)}
            kinds = {type(p.placements[0]).__name__ for p in vectors if isinstance(p, DTensor)}
            assert meshes == {("tp",)} and kinds == {"Shard", "Replicate"}, (meshes, kinds)


def test_the_old_rule_breaks_it():
    """Negative control: with every vector sharded (the rule before), each vector is a break."""
    with fake_world(_world(FLUX)):
        breaks = rule_breaks(_sharded(FLUX, vectors_whole=False))
    assert len(breaks) == sum(p.ndim < 2 for p in tiny_model(FLUX).parameters()) == 60, breaks[:3]
    assert all("vector" in b for b in breaks)


def test_a_matrix_left_out_breaks_it():
    """Negative control: one matrix (the first attention's to_q weight) left out of FSDP2 too: that one break."""
    with fake_world(_world(FLUX)):
        model = tiny_model(FLUX)
        victim = model.transformer_blocks[0].attn.to_q.weight
        with mock.patch.object(runtime_fsdp, "fsdp_shards", lambda p: p.ndim >= 2 and p is not victim):
            dtp.parallelize(model, dtp.make_mesh(cp=2, device_type="cpu"), fsdp=True)
        breaks = rule_breaks(model)
    assert breaks == ["transformer_blocks.0.attn.to_q.weight (matrix: in FSDP2's group False, sharded off tp False)"]


@pytest.mark.parametrize("cls", [FLUX, WAN])
def test_units_gather_the_matrices_only(cls):
    """Each unit's size (what `in_flight_bytes` and `dtp fit` count a gather to bring in) is what FSDP2's parameter
    group of that unit gathers: its parameters' tp-local sizes (FSDP2's `_orig_size`), the vectors not among them;
    fp32."""
    with fake_world(_world(cls)):
        layout = getattr(_sharded(cls), LAYOUT_ATTR)
        for unit in layout.units:
            group = unit.module._get_fsdp_state()._fsdp_param_group
            params = group.fsdp_params if group is not None else []
            assert all(p.sharded_param.ndim >= 2 for p in params), unit.path
            assert unit.size == sum(p._orig_size.numel() * 4 for p in params), (unit.path, unit.size)
        assert len(layout.gathered()) > 1


def _local(param) -> torch.Tensor:
    return param.to_local() if isinstance(param, DTensor) else param


class _Gated(torch.nn.Module):
    """A block with a scalar (0-d) parameter, as some DiTs hold a learned gate: FSDP2 refuses to shard one."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(8, 8)
        self.gate = torch.nn.Parameter(torch.tensor(0.5))

    def forward(self, x):
        return self.proj(x) * self.gate


class _Toy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.ModuleList([_Gated(), _Gated()])

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x


def test_a_scalar_parameter_stays_whole():
    """A 0-d parameter is left out with the vectors (kept whole), so the model shards; the rule before (every
    parameter to FSDP2) fails in `fully_shard` ("doesn't support scalar parameters"): the control."""
    from torch.distributed.device_mesh import init_device_mesh

    from dtp.runtime.fsdp import apply_fsdp

    with fake_world(2):
        model = apply_fsdp(_Toy(), init_device_mesh("cpu", (2,)))
        assert not isinstance(model.blocks[0].gate, DTensor) and isinstance(model.blocks[0].proj.weight, DTensor)
        with mock.patch.object(runtime_fsdp, "VECTORS_WHOLE", False), pytest.raises(ValueError, match="scalar"):
            apply_fsdp(_Toy(), init_device_mesh("cpu", (2,)))
