"""Worker side of the LoRA parity tests: one spawned group runs every model and adapter step."""

import dataclasses

import torch
from torch import nn

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


def steps(model: nn.Module, load, inputs: dict) -> dict[str, torch.Tensor]:
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
    model.fuse_lora(lora_scale=0.5)
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


def run_cases(rank, world_size, tp):
    mesh = dtp.make_mesh(tp=tp)
    results = {}
    for name, cls in MODELS.items():
        inputs = tiny_inputs(cls)
        ref = steps(tiny_model(cls), reference_load, inputs)
        sharded = dtp.parallelize(tiny_model(cls), mesh)
        results[name] = relative(steps(sharded, sharded_load, inputs), ref)
        results[f"{name}/bytes"] = adapter_bytes(mesh)[name]
    results["flux/one_block_packed_rowwise"] = one_block_control(mesh)
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
