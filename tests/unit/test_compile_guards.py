"""`runtime/compile_guards.py`: a compiled block of a tp-sharded model runs without the DTensor spec guards of the
parameters it reads as local tensors, and keeps every other guard.

Reference: the same block compiled with every guard kept (dynamo's own set): 48 spec checks a tiny Wan forward at
tp=2 (2 blocks x 24 sharded parameters), ~0.1x of the compiled forward's host time (benchmarks/results/
host_compiled.md). Negative controls: that keep-all filter (the guards run), and a module whose parameters go
through DTensor math (a weight replaced by a non-DTensor, as `dtp.quantize` does) keeping its bias's spec guard.
"""

from __future__ import annotations

from unittest import mock

import pytest
import torch
import torch._dynamo.guards as dynamo_guards

import dtp.runtime.compile as compile_module
from dtp.analysis.fakepg import fake_world
from dtp.runtime.compile import compile_blocks
from dtp.runtime.compile_guards import local_param_spec
from dtp.styles.parallel import STYLE_ATTR
from dtp.testing.host import MESHES, sharded_pair, tiny_inputs

WAN = "WanTransformer3DModel"
TP2 = next(m for m in MESHES if m.name == "tp=2")


def _spec_checks(model, inputs) -> int:
    """DTensor spec guard checks in one forward of `model`."""
    calls = []
    real = dynamo_guards.check_dtensor_spec
    count = mock.patch.object(dynamo_guards, "check_dtensor_spec", lambda *a: calls.append(1) or real(*a))
    with count, torch.no_grad():
        model(**inputs)
    return len(calls)


@pytest.mark.parametrize("keep_all", [False, True], ids=["dtp-filter", "control-keep-all"])
def test_compiled_tp_blocks_run_no_spec_guard_and_match_eager(keep_all):
    torch._dynamo.reset()
    with fake_world(TP2.world):
        _, model = sharded_pair(WAN, TP2)
        inputs = tiny_inputs(WAN, TP2)
        with torch.no_grad():
            eager = model(**inputs)[0].clone()
        keep = (lambda block: lambda entries: [True] * len(entries)) if keep_all else compile_module.guard_filter
        with mock.patch.object(compile_module, "guard_filter", keep):
            compile_blocks(model, backend="eager")
        with torch.no_grad():
            compiled = model(**inputs)[0]
        checks = _spec_checks(model, inputs)
    torch._dynamo.reset()
    assert torch.equal(compiled, eager)  # the fake group's partial sums, the same in both: the graph is unchanged
    assert checks == (48 if keep_all else 0), checks


def test_only_local_tensor_parameters_lose_their_spec_guard():
    with fake_world(TP2.world):
        _, model = sharded_pair(WAN, TP2)
    block = model.blocks[0]
    name = "self._modules['attn1']._modules['to_q']._parameters['{}']._spec"
    assert local_param_spec(block, name.format("weight")) and local_param_spec(block, name.format("bias"))
    assert not local_param_spec(block, "self._modules['attn1']._modules['to_q']._parameters['weight']")  # not a spec
    assert not local_param_spec(block, "self._modules['nope']._parameters['weight']._spec")
    assert not local_param_spec(block, "self._parameters['scale_shift_table']._spec")  # a plain parameter
    to_k = block.attn1.to_k
    del to_k.__dict__[STYLE_ATTR]  # a DTensor parameter of a module dtp does not run: its forward may dispatch on it
    assert not local_param_spec(block, "self._modules['attn1']._modules['to_k']._parameters['weight']._spec")
    to_q = block.attn1.to_q
    to_q._parameters["weight"] = torch.nn.Parameter(to_q.weight._local_tensor.clone())  # DTensor math from here
    assert not local_param_spec(block, name.format("bias"))
