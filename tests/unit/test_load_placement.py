"""Buffers, dtypes and devices after dtp.from_pretrained; the in-memory path parallelize(device=); local_device.

Uses the fake process group (rank 0 of 4, tp=4) and a small diffusers model with a persistent
buffer (saved in the checkpoint) and a non-persistent one (a RoPE-style table the checkpoint
does not hold), compared against diffusers' own from_pretrained of the same folder.
"""

from __future__ import annotations

import pytest
import torch
from diffusers import ConfigMixin, ModelMixin
from diffusers.configuration_utils import register_to_config
from torch import nn
from torch.distributed.tensor import DTensor

import dtp
from dtp.resolve.layout import local_slice
from dtp.runtime.placement import local_device
from dtp.testing.tiny import tiny_model

PLAN = dtp.Plan.from_dict({"proj_in": "colwise", "proj_out": "rowwise"})


class Buffered(ModelMixin, ConfigMixin):
    @register_to_config
    def __init__(self, dim: int = 8, hidden: int = 32):
        super().__init__()
        self.proj_in = nn.Linear(dim, hidden)
        self.proj_out = nn.Linear(hidden, dim)
        self.register_buffer("scale", torch.ones(dim), persistent=True)
        self.register_buffer("freqs", 1.0 / 10000 ** (torch.arange(0, dim, 2) / dim), persistent=False)

    def forward(self, x):
        return self.proj_out(torch.relu(self.proj_in(x))) * self.scale


class BufferedFp32(Buffered):
    """diffusers itself cannot load this one without `accelerate` (it insists on low_cpu_mem_usage)."""

    _keep_in_fp32_modules = ["proj_out"]


@pytest.fixture(scope="module")
def mesh(fake_world):
    return dtp.make_mesh(tp=4, device_type="cpu")


@pytest.fixture(scope="module")
def loaded(mesh, tmp_path_factory):
    """(dtp model, diffusers model, dtp model with proj_out kept in fp32), in bfloat16 from a checkpoint
    whose `scale` is not the init value."""
    path = tmp_path_factory.mktemp("buffered")
    torch.manual_seed(0)
    model = Buffered()
    model.scale.copy_(torch.arange(8.0))
    model.save_pretrained(path)
    ours = dtp.from_pretrained(Buffered, str(path), mesh, PLAN, torch_dtype=torch.bfloat16)
    theirs = Buffered.from_pretrained(path, torch_dtype=torch.bfloat16)
    fp32 = dtp.from_pretrained(BufferedFp32, str(path), mesh, PLAN, torch_dtype=torch.bfloat16)
    return ours, theirs, fp32


def test_buffers_match_diffusers(loaded):
    """The persistent buffer comes from the checkpoint, the non-persistent one is rebuilt, as diffusers has them."""
    ours, theirs, _ = loaded
    for name, buffer in theirs.named_buffers():
        mine = ours.get_buffer(name)
        assert mine.device == torch.device("cpu") and mine.dtype == buffer.dtype, name
        assert torch.equal(mine, buffer), name
    assert torch.equal(ours.scale.float(), torch.arange(8.0))


def test_nothing_left_on_meta(loaded):
    ours, _, _ = loaded
    assert [n for n, t in [*ours.named_parameters(), *ours.named_buffers()] if t.device.type == "meta"] == []


def test_params_are_slices_cast_like_diffusers(loaded):
    """Each parameter is this rank's slice of diffusers' parameter, same dtype, bit for bit."""
    ours, theirs, _ = loaded
    for name, param in theirs.named_parameters():
        mine = ours.get_parameter(name)
        assert isinstance(mine, DTensor) and mine.dtype == param.dtype, name
        layout = {"proj_in.weight": 0, "proj_in.bias": 0, "proj_out.weight": 1}.get(name)
        expected = param.data if layout is None else local_slice(param.data, layout, (param.shape[layout],), 4, 0)
        assert torch.equal(mine.to_local(), expected), name
    assert ours.proj_in.weight.dtype == torch.bfloat16


def test_keep_in_fp32_modules(loaded):
    """Modules in `_keep_in_fp32_modules` stay float32 under torch_dtype=bfloat16 (diffusers' rule)."""
    _, _, fp32 = loaded
    assert fp32.proj_out.weight.dtype == fp32.proj_out.bias.dtype == torch.float32
    assert fp32.proj_in.weight.dtype == torch.bfloat16


def test_parallelize_device_moves_only_slices(mesh):
    """In-memory path: sharded params become copies of this rank's slice (the full CPU tensors can be freed)."""
    model = tiny_model("FluxTransformer2DModel")
    full = {n: p.data for n, p in model.named_parameters()}
    dtp.parallelize(model, mesh, device="cpu")
    sharded = {n: p for n, p in model.named_parameters() if isinstance(p, DTensor) and p.placements[0].is_shard()}
    assert sharded
    for name, param in sharded.items():
        local = param.to_local()
        assert local.numel() * 4 == full[name].numel(), name
        assert local.untyped_storage().data_ptr() != full[name].untyped_storage().data_ptr(), name
    assert all(t.device == torch.device("cpu") for t in [*model.parameters(), *model.buffers()])


def test_local_device(monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "3")
    assert local_device("cuda") == torch.device("cuda", 3)
    assert local_device(torch.device("cuda")) == torch.device("cuda", 3)
    assert local_device("cuda:1") == torch.device("cuda", 1)
    assert local_device("cpu") == torch.device("cpu")
    if not torch.cuda.is_available():
        assert local_device(None) == local_device(dtp.policy.default_device_type())


def test_device_of_another_type_than_the_mesh(mesh):
    """A cuda device on a cpu mesh is refused before anything moves (DTensor would move the slices back)."""
    model = tiny_model("FluxTransformer2DModel")
    before = {n: p for n, p in model.named_parameters()}
    with pytest.raises(dtp.PlanError, match="device cuda:0 does not match the mesh's device type 'cpu'"):
        dtp.parallelize(model, mesh, device="cuda:0")
    assert all(p is before[n] for n, p in model.named_parameters())
