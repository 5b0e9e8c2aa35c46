"""`runtime/compile_guards.py`: a compiled block of a tp-sharded model runs without the DTensor spec guards of the
parameters it reads as local tensors, and keeps every other guard.

Reference: the same block compiled with every guard kept (dynamo's own set): 48 spec checks a tiny Wan forward at
tp=2 (2 blocks x 24 sharded parameters), ~0.1x of the compiled forward's host time (benchmarks/results/
host_compiled.md). Negative controls: that keep-all filter (the guards run), and a module whose parameters go
through DTensor math (a weight replaced by a non-DTensor, as `dtp.quantize` does) keeping its bias's spec guard.
Composition (`full`): a fused LoRA and int8 weights quantized after sharding, compiled, equal to eager.
"""

from __future__ import annotations

import sys
from pathlib import Path
from unittest import mock

import pytest
import torch
import torch._dynamo.guards as dynamo_guards

import dtp
import dtp.runtime.compile as compile_module
from dtp.analysis.fakepg import fake_world
from dtp.quant import config_for
from dtp.runtime.compile import compile_blocks
from dtp.runtime.compile_guards import local_param_spec
from dtp.styles.parallel import STYLE_ATTR
from dtp.testing.host import MESHES, sharded_pair, tiny_inputs
from dtp.testing.tiny import output_tensor, tiny_model
from dtp.testing.tiny import tiny_inputs as flux_inputs

WAN = "WanTransformer3DModel"
FLUX = "FluxTransformer2DModel"
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


def _random_lora(model):
    """The LoRA tests' random adapter (tests/distributed/lora_cases.py), imported as test_coverage_plans does."""
    sys.path.insert(0, str(Path(__file__).parents[1] / "distributed"))
    try:
        from lora_cases import random_lora
    finally:
        sys.path.pop(0)
    return random_lora(model, seed=10)


def _lora(model):
    dtp.load_lora(model, _random_lora(model), adapter_name="a")
    model.fuse_lora(lora_scale=0.5)


def _int8(model):
    dtp.quantize(model, config_for("int8wo"))


@pytest.mark.full
@pytest.mark.parametrize("change", [_lora, _int8], ids=["lora-fused", "int8wo-after-sharding"])
def test_filtered_compile_composes_with_lora_and_quantization(change):
    """tp=2 FLUX.1 compiled with dtp's filter after a LoRA fused into the sharded weights, or int8 weights quantized
    after sharding (DTensor math: their spec guards stay): the compiled forward equals the eager one on the fake
    group (measured: 0.0 for both)."""
    torch._dynamo.reset()
    with fake_world(2):
        model = dtp.parallelize(tiny_model(FLUX), dtp.make_mesh(tp=2, device_type="cpu"))
        change(model)
        inputs = flux_inputs(FLUX)
        with torch.no_grad():
            eager = output_tensor(model(**inputs)).clone()
            compile_blocks(model, backend="eager")
            compiled = output_tensor(model(**inputs))
    torch._dynamo.reset()
    assert torch.equal(compiled, eager)
