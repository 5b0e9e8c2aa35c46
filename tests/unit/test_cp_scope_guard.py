"""A forward that raises inside CP attention leaves no scope open: the attention modules' exit hooks are plain
(not `always_call`, which made dynamo compile one graph per block), so the root model's `ScopeGuard` pops what the
raised forward left. Without it the next call of any model in the process would route through a dead scope (its
SDPA calls to CP attention). Tiny FLUX.1 (dispatcher route) and CogVideoX (SDPA route: a TorchFunctionMode is
entered per attention module) at cp=2 on a fake process group."""

import pytest
import torch
from torch.overrides import _get_current_function_mode_stack

import dtp
from dtp.analysis.fakepg import fake_world
from dtp.runtime.cp import attention
from dtp.testing.tiny import tiny_inputs, tiny_model


class Boom(RuntimeError):
    pass


def _raise(self, original, args):
    raise Boom("attention failed")


@pytest.mark.parametrize("cls", ["FluxTransformer2DModel", "CogVideoXTransformer3DModel"])
def test_a_raised_forward_leaves_no_scope(cls, monkeypatch):
    with fake_world(2):
        model = dtp.parallelize(tiny_model(cls), dtp.make_mesh(cp=2, device_type="cpu"))
        modes_before = len(_get_current_function_mode_stack())
        monkeypatch.setattr(attention.CpAttention, "__call__", _raise)
        with torch.no_grad(), pytest.raises(Boom):
            model(**tiny_inputs(cls))
        assert attention._ACTIVE == []
        assert len(_get_current_function_mode_stack()) == modes_before


def test_without_the_guard_a_scope_is_left_open(monkeypatch):
    """The control: the same raise with the guard's close disabled leaves the attention's scope on the stack."""
    cls = "FluxTransformer2DModel"
    monkeypatch.setattr(attention.ScopeGuard, "close", lambda self, module, args, output: None)
    with fake_world(2):
        model = dtp.parallelize(tiny_model(cls), dtp.make_mesh(cp=2, device_type="cpu"))
        monkeypatch.setattr(attention.CpAttention, "__call__", _raise)
        with torch.no_grad(), pytest.raises(Boom):
            model(**tiny_inputs(cls))
        left = len(attention._ACTIVE)
        attention._ACTIVE.clear()
    assert left == 1
