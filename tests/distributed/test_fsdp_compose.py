"""fsdp=True composed with the rest of dtp, on 2 gloo ranks (one process group), against one-process pipelines.

Generates: Qwen-Image with true CFG (two calls per step) and PixArt-Sigma (one call on a doubled batch) on a cfg=2
mesh, where both cfg groups must gather the same blocks; the tiny FLUX.1 pipeline on cp=2 with ring attention
(transformer, CLIP and T5 text encoders under FSDP, the VAE split by rows); the same checkpoint through
`dtp.load_pipeline(fsdp=True)` with Ulysses; a LoRA fused before sharding (dtp.load_lora on an FSDP model:
test_fsdp_lora.py). Refuses, with PlanError: torchao quantization in either order (and pins, with torch and
torchao alone, what torchao lacks for it), a mesh without a non-tp axis, ranks that disagree.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from cfg_cases import CASES, STEPS, generate, references
from lora_cases import random_lora
from safetensors.torch import save_file

from dtp.families.pipelines import tiny_checkpoint, tiny_flux_pipeline, tiny_qwenimage_pipeline
from dtp.pipeline.compare import compare
from dtp.testing.launch import spawn
from dtp.testing.tiny import tiny_model

MEAN_TOL = 1e-6  # mean |pixels - reference| on [0, 1]; measured 0 to 3e-8
FLUX_CALL = dict(prompt="a cat holding a sign", num_inference_steps=STEPS, height=32, width=32)
CFG_CASES = ("qwenimage", "pixart")


@torch.no_grad()
def flux_pixels(pipe) -> np.ndarray:
    pipe.set_progress_bar_config(disable=True)
    out = pipe(**FLUX_CALL, generator=torch.Generator("cpu").manual_seed(0), output_type="np")
    return np.asarray(out.images, dtype=np.float32)


def fused_qwen(lora: str):
    """The tiny Qwen-Image pipeline with a LoRA loaded by diffusers and fused at 0.8, then unloaded."""
    pipe = tiny_qwenimage_pipeline()
    pipe.load_lora_weights(lora, adapter_name="lora")
    pipe.fuse_lora(lora_scale=0.8)
    pipe.unload_lora_weights()
    return pipe


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fsdp-compose")
    lora = tmp / "lora.safetensors"
    save_file(random_lora(tiny_model("QwenImageTransformer2DModel"), seed=10), str(lora))
    return str(tiny_checkpoint("flux")), str(lora)  # the shared cache: built once per machine, only read


@pytest.fixture(scope="module")
def results(files):
    return spawn(_worker, 2, *files)


def _refusal(call) -> str | None:
    try:
        call()
    except ValueError as exc:  # PlanError is a ValueError
        return f"{type(exc).__name__}: {exc}"
    return None


def _worker(rank, world, checkpoint, lora):
    import dtp
    from dtp.runtime.cfg import CFG_ATTR
    from dtp.runtime.fsdp import is_fsdp

    out, cfg = {}, dtp.make_mesh(cfg=2)
    for case in CFG_CASES:
        pipe = CASES[case][0]()
        dtp.parallelize_pipeline(pipe, cfg, fsdp=True)
        out[case] = generate(pipe, case)
        out[(case, "stats")] = vars(getattr(pipe.transformer, CFG_ATTR).stats).copy()
    pipe = fused_qwen(lora)
    dtp.parallelize_pipeline(pipe, cfg, fsdp=True)
    out["lora_fused"] = generate(pipe, "qwenimage")
    cp = dtp.make_mesh(cp=2)
    pipe = tiny_flux_pipeline()
    dtp.parallelize_pipeline(pipe, cp, cp_mode="ring", fsdp=True)
    out["flux_ring"] = flux_pixels(pipe)
    out["fsdp_components"] = sorted(n for n, m in pipe.components.items() if is_fsdp(m))
    out["flux_loaded"] = flux_pixels(dtp.load_pipeline(checkpoint, cp, fsdp=True))
    out["refusals"] = _refusals(rank)
    return out


def _refusals(rank: int) -> dict:
    import dtp
    from dtp.quant import config_for

    flux, mesh = "FluxTransformer2DModel", dtp.make_mesh(cp=2)
    sharded = dtp.parallelize(tiny_model(flux), mesh, fsdp=True)
    quantized = dtp.quantize(tiny_model(flux), config_for("int8wo"))
    before = dict(quantized.named_parameters())  # torchao's tensors have no torch.equal: the same objects, then
    return dict(
        quant_after=_refusal(lambda: dtp.quantize(sharded, config_for("int8wo"))),
        quant_before=_refusal(lambda: dtp.parallelize(quantized, mesh, fsdp=True)),
        quant_before_untouched=dict(quantized.named_parameters()) == before and type(quantized).__name__ == flux,
        tp_only=_refusal(lambda: dtp.parallelize(tiny_model(flux), dtp.make_mesh(tp=2), fsdp=True)),
        disagree=_refusal(lambda: dtp.parallelize(tiny_model(flux), mesh, fsdp=rank == 0)),
        torchao_gap=_torchao_gap(mesh),
    )


def _torchao_gap(mesh) -> dict:
    """What the refusals claim, tried with torch and torchao alone: FSDP2's fully_shard on a Linear whose weight
    torchao quantized first ("before"), and torchao's quantize_ on FSDP2's shards ("after"): the error each raises."""
    from torch import nn
    from torch.distributed.fsdp import fully_shard
    from torchao.quantization import quantize_

    from dtp.quant import config_for

    found = {}
    for scheme in ("int8wo", "fp8wo"):
        for order in ("before", "after"):
            linear, x = nn.Linear(64, 64), torch.ones(2, 64)
            if order == "before":
                quantize_(linear, config_for(scheme))
            try:
                fully_shard(linear, mesh=mesh["cp"])
                if order == "after":
                    quantize_(linear, config_for(scheme))
                linear(x)
                found[(scheme, order)] = "ran"
            except Exception as error:  # what torch / torchao raise: exactly what the refusal must keep naming
                found[(scheme, order)] = f"{type(error).__name__}: {error}"
    return found


def _check(results, key, reference) -> None:
    for rank, per_rank in enumerate(results):
        mean, p99, ok = compare(per_rank[key], reference)
        assert per_rank[key].shape == reference.shape and mean <= MEAN_TOL and ok, (rank, key, mean, p99)


@pytest.mark.parametrize("case", CFG_CASES)
def test_cfg_paths_with_fsdp(results, case):
    """cfg=2 with fsdp: the one-process image (mean |diff| <= 1e-6), through the pair path and the batch path."""
    _check(results, case, references([case])[case])
    stats = results[0][(case, "stats")]
    expected = dict(batch=0, predicted=STEPS - 1, hits=STEPS - 1, whole=2) if case == "qwenimage" else None
    assert stats == (expected or dict(batch=STEPS, predicted=0, hits=0, whole=0)), stats


def test_flux_ring_with_text_encoders_and_vae(results):
    """cp=2 ring with fsdp: the one-process image; the transformer and both text encoders are FSDP2 units."""
    _check(results, "flux_ring", flux_pixels(tiny_flux_pipeline()))
    assert results[0]["fsdp_components"] == ["text_encoder", "text_encoder_2", "transformer"]


def test_load_pipeline_with_fsdp(results, files):
    """load_pipeline(fsdp=True) on cp=2 (Ulysses): the image diffusers' one-process load makes."""
    from diffusers import DiffusionPipeline

    _check(results, "flux_loaded", flux_pixels(DiffusionPipeline.from_pretrained(files[0])))


def test_lora_fused_before_sharding(results, files):
    """A LoRA fused by diffusers, then the pipeline sharded with fsdp: the one-process fused image."""
    reference = generate(fused_qwen(files[1]), "qwenimage")
    assert compare(reference, references(["qwenimage"])["qwenimage"])[0] > 1e-3, "the LoRA must move the image"
    _check(results, "lora_fused", reference)


@pytest.mark.parametrize(
    "key,words",
    [
        ("quant_after", ["fsdp=True", "torchao", "aten.split", "fsdp_pre_all_gather", "_local_tensor", "fsdp=False"]),
        ("quant_before", ["fsdp=True", "Int8Tensor", "aten.split", "fsdp_pre_all_gather", "fsdp=False"]),
        ("tp_only", ["fsdp=True", "non-tp", "cp=2"]),
        ("disagree", ["option fsdp is True on ranks [0], False on ranks [1]"]),
    ],
)
def test_refusals(results, key, words):
    """Each refusal is a PlanError naming the setting and the fix, on every rank."""
    for per_rank in results:
        message = per_rank["refusals"][key]
        assert message is not None and message.startswith("PlanError") and all(w in message for w in words), message
    assert all(r["refusals"]["quant_before_untouched"] for r in results)


@pytest.mark.parametrize("scheme,missing", [("int8wo", "aten.split"), ("fp8wo", "aten.new_zeros")])
def test_torchao_cannot_be_sharded_by_fsdp2(results, scheme, missing):
    """Pins the fact behind the quantization refusals (`dtp.quant.FSDP_CANNOT`): with the installed torch and
    torchao, FSDP2 cannot cut a quantized weight into shards (an op torchao's tensor lacks), and a weight quantized
    after fully_shard is no DTensor FSDP2 can gather. Fails once torchao implements it: then lift the refusals."""
    from dtp.quant import FSDP_CANNOT

    for per_rank in results:
        gap = per_rank["refusals"]["torchao_gap"]
        assert "NotImplementedError" in gap[(scheme, "before")] and missing in gap[(scheme, "before")], gap
        assert "_local_tensor" in gap[(scheme, "after")], gap
    assert missing in FSDP_CANNOT and "_local_tensor" in FSDP_CANNOT
