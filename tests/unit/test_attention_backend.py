"""`attention_backend=`: one list of names (diffusers' own included), the check ring needs, refusal before anything
changes, and the choice reaching the model's processors and ring's block kernel (fake CUDA, fake process group)."""

from __future__ import annotations

import inspect

import pytest
import torch
from diffusers.models.attention_dispatch import AttentionBackendName, _AttentionBackendRegistry
from torch._subclasses.fake_tensor import FakeTensorMode

import dtp
from dtp.analysis.fakepg import fake_world
from dtp.choices import ATTENTION_BACKENDS, DIFFUSERS_BACKENDS, SDPA_BACKENDS
from dtp.policy import check_attention_backend, ring_kernel_family
from dtp.testing.fake_cuda import AtenIndexing, fake_cuda_like
from dtp.testing.tiny import tiny_inputs, tiny_model

FLUX = "FluxTransformer2DModel"


def test_the_names_are_diffusers_own_plus_the_sdpa_kernels():
    assert set(DIFFUSERS_BACKENDS) == {name.value for name in AttentionBackendName}
    assert ATTENTION_BACKENDS[: len(SDPA_BACKENDS)] == SDPA_BACKENDS
    assert len(set(ATTENTION_BACKENDS)) == len(ATTENTION_BACKENDS)
    assert set(DIFFUSERS_BACKENDS) <= set(ATTENTION_BACKENDS)


def test_check_maps_short_names_and_refuses_what_ring_cannot_run():
    assert check_attention_backend(None) is None and check_attention_backend("auto", "ring") is None
    assert check_attention_backend("cudnn", "ring") == "_native_cudnn"
    assert ring_kernel_family(check_attention_backend("flash", "ring")) == "flash"
    assert ring_kernel_family(check_attention_backend("_native_math", "ring")) == "math"
    with pytest.raises(dtp.PlanError, match="must be one of auto, flash, efficient, cudnn, math"):
        check_attention_backend("fa9")
    with pytest.raises(dtp.PlanError, match="cannot run ring attention.*'cudnn'.*cp_mode='ulysses'"):
        check_attention_backend("flex", "ring")
    assert check_attention_backend("flex", "ulysses") == "flex"


def test_a_backend_whose_package_is_missing_is_a_plan_error():
    """diffusers' own requirement check, as a PlanError naming the backend (FA3 is not installed here)."""
    with pytest.raises(dtp.PlanError, match="attention_backend='_flash_3'"):
        check_attention_backend("_flash_3", "ulysses")


def test_every_entry_point_takes_the_keyword():
    for entry in (dtp.parallelize, dtp.from_pretrained, dtp.parallelize_pipeline, dtp.load_pipeline, dtp.prepare):
        assert inspect.signature(entry).parameters["attention_backend"].default is None, entry


def test_ring_refusal_leaves_the_model_untouched():
    """cp=2 ring with a backend ring cannot run: PlanError from prepare; no hook, no backend set, weights equal."""
    with fake_world(2):
        model = tiny_model(FLUX)
        before = {k: v.clone() for k, v in model.state_dict().items()}
        with pytest.raises(dtp.PlanError, match="cannot run ring attention"):
            dtp.parallelize(model, dtp.make_mesh(cp=2, device_type="cpu"), cp_mode="ring", attention_backend="flex")
    assert not hasattr(model, "_dtp_cp_handles")
    assert model.transformer_blocks[0].attn.processor._attention_backend is None
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_the_backend_reaches_the_processors_and_the_ring_kernel():
    """FLUX.1 tiny bf16, cp=2 ring, attention_backend="cudnn", on fake CUDA: every processor names diffusers'
    `_native_cudnn` and every ring block runs `_scaled_dot_product_cudnn_attention` (2 per attention); diffusers'
    process-wide default stays as it was."""
    default = _AttentionBackendRegistry.get_active_backend()[0]
    with fake_world(2):
        with torch.device("meta"):
            model = tiny_model(FLUX).to(torch.bfloat16)
        mesh = dtp.make_mesh(cp=2, device_type="cpu")
        model = dtp.parallelize(model, mesh, cp_mode="ring", attention_backend="cudnn")
        attentions = [m for name, m in model.named_modules() if name.endswith(".attn")]
        assert {a.processor._attention_backend for a in attentions} == {AttentionBackendName._NATIVE_CUDNN}
        assert _AttentionBackendRegistry.get_active_backend()[0] == default
        inputs = tiny_inputs(FLUX)
        with FakeTensorMode(allow_non_fake_inputs=True):
            model = model.to_empty(device="cuda")
            fake = {k: fake_cuda_like(v, torch.bfloat16) if torch.is_tensor(v) else v for k, v in inputs.items()}
            ops = []
            with torch.no_grad(), AtenIndexing(), _Ops(ops):
                model(**fake)
    assert ops.count("aten._scaled_dot_product_cudnn_attention.default") == 2 * len(attentions)
    assert not any("flash_attention" in op or "efficient_attention" in op for op in ops)


class _Ops(torch.utils._python_dispatch.TorchDispatchMode):
    def __init__(self, ops: list):
        super().__init__()
        self.ops = ops

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


def test_the_sdpa_route_pins_torchs_own_kernels():
    """Ulysses on a processor that calls SDPA itself: torch's kernels are pinned (cuDNN on CPU: no kernel, so it
    raises; math runs), other backend names leave SDPA's own choice."""
    from dtp.runtime.cp.sdpa import sdpa_bshd

    q = torch.randn(1, 5, 2, 8)
    reference = sdpa_bshd(q, q, q)
    assert torch.allclose(sdpa_bshd(q, q, q, backend=AttentionBackendName._NATIVE_MATH), reference, atol=1e-6)
    assert torch.equal(sdpa_bshd(q, q, q, backend="sage"), reference)
    with pytest.raises(RuntimeError, match="No viable backend"):
        sdpa_bshd(q, q, q, backend="_native_cudnn")
