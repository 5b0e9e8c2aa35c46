"""Worker side of the LoRA parity tests: one spawned group runs every model and adapter step."""

import dataclasses
import os
import tempfile

import torch
from safetensors.torch import save_file
from torch import nn
from torch.distributed.tensor import DTensor

import dtp
from dtp.engine import SPEC_ATTR
from dtp.testing.tiny import output_tensor, tiny_inputs, tiny_model

MODELS = {
    "flux": "FluxTransformer2DModel",
    "flux2": "Flux2Transformer2DModel",
    "qwenimage": "QwenImageTransformer2DModel",
}
RANK = 4


def random_lora(model: nn.Module, seed: int, rank: int = RANK) -> dict[str, torch.Tensor]:
    """A rank-`rank` LoRA on every nn.Linear of `model`, in diffusers' format (`transformer.<path>.lora_A.weight`)."""
    generator = torch.Generator().manual_seed(seed)
    state_dict = {}
    for path, module in model.named_modules():
        if isinstance(module, nn.Linear):
            a = torch.randn(rank, module.in_features, generator=generator) * 0.2
            b = torch.randn(module.out_features, rank, generator=generator) * 0.2
            state_dict[f"transformer.{path}.lora_A.weight"] = a
            state_dict[f"transformer.{path}.lora_B.weight"] = b
    return state_dict


def steps(model: nn.Module, load, inputs: dict, safe_fusing: bool = False) -> dict[str, torch.Tensor]:
    """The issue's sequence of adapter operations, the output after each (`load(model, sd, name)` loads one)."""
    out = {}
    lora_a, lora_b = random_lora(model, seed=10), random_lora(model, seed=11)

    def record(name):
        with torch.no_grad():
            out[name] = output_tensor(model(**inputs)).clone()

    record("base")
    load(model, lora_a, "a")
    record("a")
    load(model, lora_b, "b")
    model.set_adapters(["a", "b"], weights=[0.7, -0.4])
    record("a+b weighted")
    model.set_adapters("a")
    model.fuse_lora(lora_scale=0.5, safe_fusing=safe_fusing)
    record("fused a x0.5")
    model.unfuse_lora()
    record("unfused")
    model.disable_lora()
    record("disabled")
    model.enable_lora()
    record("enabled")
    model.delete_adapters("a")
    model.set_adapters("b")
    record("deleted a, b active")
    return out


def reference_load(model, state_dict, name):
    model.load_lora_adapter(state_dict, adapter_name=name, prefix="transformer")


def sharded_load(model, state_dict, name):
    return dtp.load_lora(model, state_dict, adapter_name=name)


def relative(out: dict, ref: dict) -> dict[str, float]:
    return {k: float((out[k] - ref[k]).abs().max() / ref[k].abs().max()) for k in ref}


def run_cases(rank, world_size, tp, extra=True, models=tuple(MODELS)):
    """Each of `models` through `steps`, sharded vs reference; with `extra`, the adapter bytes, the pipeline, error
    and control cases."""
    mesh = dtp.make_mesh(tp=tp)
    results = {}
    for name in models:
        cls = MODELS[name]
        inputs = tiny_inputs(cls)
        ref = steps(tiny_model(cls), reference_load, inputs)
        sharded = dtp.parallelize(tiny_model(cls), mesh)
        results[name] = relative(steps(sharded, sharded_load, inputs), ref)
        results[f"{name}/ref_vs_base"] = {k: relative({k: ref[k]}, {k: ref["base"]})[k] for k in ref}
    results["flux/one_block_packed_rowwise"] = one_block_control(mesh)
    if extra:
        results["bytes"] = adapter_bytes(mesh)
        results["pipelines"] = pipeline_cases(mesh)
        results["bad"] = bad_lora_cases(mesh)
    return results


def adapter_bytes(mesh) -> dict[str, tuple[int, int]]:
    """(bytes this rank holds, bytes of the whole adapter) for one rank-4 LoRA on every Linear."""
    found = {}
    for name, cls in MODELS.items():
        model = dtp.parallelize(tiny_model(cls), mesh)
        stats = dtp.load_lora(model, random_lora(model, seed=10), adapter_name="a")
        found[name] = (stats.local_bytes, stats.full_bytes)
    return found


def one_block_control(mesh) -> float:
    """Negative control: FLUX.1's packed_rowwise `proj_out` adapter cut as one block (ignoring [attn | mlp])."""
    cls = MODELS["flux"]
    inputs = tiny_inputs(cls)
    reference = tiny_model(cls)
    reference_load(reference, random_lora(reference, seed=10), "a")
    model = dtp.parallelize(tiny_model(cls), mesh)
    for block in model.single_transformer_blocks:
        spec = getattr(block.proj_out, SPEC_ATTR)
        setattr(block.proj_out, SPEC_ATTR, dataclasses.replace(spec, sizes=(sum(spec.sizes),)))
    sharded_load(model, random_lora(model, seed=10), "a")
    with torch.no_grad():
        ref, out = output_tensor(reference(**inputs)), output_tensor(model(**inputs))
    return float((out - ref).abs().max() / ref.abs().max())


def pipeline_cases(mesh) -> dict[str, float]:
    """`dtp.load_lora_weights(pipe, folder)` vs `pipe.load_lora_weights(folder)`: transformer outputs, relative."""
    found = {}
    for name, make_pipe in (("flux", _flux_pipe), ("qwenimage", _qwen_pipe)):
        cls = MODELS[name]
        inputs = tiny_inputs(cls)
        with tempfile.TemporaryDirectory() as folder:
            save_file(random_lora(tiny_model(cls), seed=12), os.path.join(folder, "pytorch_lora_weights.safetensors"))
            reference = make_pipe(tiny_model(cls))
            reference.load_lora_weights(folder, adapter_name="p")
            pipe = make_pipe(dtp.parallelize(tiny_model(cls), mesh))
            dtp.load_lora_weights(pipe, folder, adapter_name="p")
        with torch.no_grad():
            ref = output_tensor(reference.transformer(**inputs))
            out = output_tensor(pipe.transformer(**inputs))
            base = output_tensor(tiny_model(cls)(**inputs))
        found[name] = float((out - ref).abs().max() / ref.abs().max())
        found[f"{name}/lora_vs_base"] = float((ref - base).abs().max() / base.abs().max())
    return found


def _flux_pipe(transformer):
    from diffusers import FluxPipeline

    none = dict(scheduler=None, vae=None, text_encoder=None, tokenizer=None, text_encoder_2=None, tokenizer_2=None)
    return FluxPipeline(transformer=transformer, **none)


def _qwen_pipe(transformer):
    from diffusers import QwenImagePipeline

    return QwenImagePipeline(transformer=transformer, scheduler=None, vae=None, text_encoder=None, tokenizer=None)


def snapshot(model: nn.Module) -> tuple:
    """Module tree, parameter/buffer names and this rank's values: what a failed load must leave as it was."""
    tensors = {
        k: (v.to_local() if isinstance(v, DTensor) else v).detach().clone() for k, v in model.state_dict().items()
    }
    return [(n, type(m).__name__) for n, m in model.named_modules()], tensors, set(getattr(model, "peft_config", {}))


def same(before: tuple, after: tuple) -> bool:
    return (
        before[0] == after[0]
        and before[2] == after[2]
        and before[1].keys() == after[1].keys()
        and all(torch.equal(before[1][k], after[1][k]) for k in before[1])
    )


def bad_lora_cases(mesh) -> dict[str, tuple[bool, str, bool]]:
    """Each bad LoRA: (raised PlanError, its message, the sharded model unchanged)."""
    cls = MODELS["flux"]
    model = dtp.parallelize(tiny_model(cls), mesh)
    good = random_lora(model, seed=10)
    dtp.load_lora(model, good, adapter_name="a")  # a loaded adapter must survive a failed second load
    q = "transformer.transformer_blocks.0.attn.to_q"
    cases = {
        "unknown module": {
            **good,
            "transformer.transformer_blocks.7.attn.to_q.lora_A.weight": good[f"{q}.lora_A.weight"],
            "transformer.transformer_blocks.7.attn.to_q.lora_B.weight": good[f"{q}.lora_B.weight"],
        },
        "B rows of a shard": {**good, f"{q}.lora_B.weight": good[f"{q}.lora_B.weight"][:32]},
        "ranks differ": {**good, f"{q}.lora_B.weight": torch.zeros(64, 8)},
        "DoRA magnitude": {**good, f"{q}.lora_magnitude_vector": torch.ones(64)},
        "name in use": good,
    }
    found = {}
    for case, state_dict in cases.items():
        before = snapshot(model)
        try:
            dtp.load_lora(model, state_dict, adapter_name="a" if case == "name in use" else "bad")
            found[case] = (False, "no error", same(before, snapshot(model)))
        except dtp.PlanError as error:
            found[case] = (True, str(error), same(before, snapshot(model)))
    return found


def fuse(model: nn.Module, scale: float, release_broken: bool = False) -> None:
    """`model.fuse_lora(lora_scale=scale)` on an fsdp model; release_broken: dtp's `release` replaced by each FSDP
    unit's `reshard()` (the fsdp LoRA control: a prefetched gather stays pending with the unfused weights)."""
    from torch.distributed.fsdp import FSDPModule

    import dtp.adapters.fsdp as lora_fsdp

    release = lora_fsdp.release
    if release_broken:
        lora_fsdp.release = lambda m: [u.reshard() for u in m.modules() if isinstance(u, FSDPModule)]
    try:
        model.fuse_lora(lora_scale=scale)
    finally:
        lora_fsdp.release = release
