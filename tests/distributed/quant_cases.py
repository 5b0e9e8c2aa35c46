"""Worker side of the quantization parity tests: one spawned group runs every case and returns numbers.

"Exact" here: the sharded model quantized with a scheme equals the one-process model quantized with
the same scheme (fp32 compute on CPU), within 1e-5 relative; each case also reports the scheme's own
error against the unquantized model, so a pass is never vacuous (that error is 1e-3..1e-1).

Two measures per case: `layers`, the worst sharded quantized Linear fed the one-process model's input to that
Linear (its slice for a rowwise one): this is what is exact for every scheme (~1e-7, fp32 summation order);
`relative`, the whole forward. For weight-only schemes the whole forward is exact too (~1e-7). Float8 dynamic
activation quantizes every activation on the fly, a step function: the fp32 partial sums of a rowwise layer add
in another order than one process's matmul (a 1e-7 difference), an activation that sits on a float8 rounding
edge in the next layer then rounds the other way (one float8 step, up to 1/8 relative) and the difference grows
through the blocks (6.7e-2 for tiny Qwen-Image at tp=4 on every machine measured). Such a flip is one of the
roundings the scheme makes anyway, so the whole forward of a dynamic scheme is bounded by the scheme's own
error against the fp32 model (`quant_error`, 1.9e-1 there): a number computed from the model, not from the
machine's rounding noise.
"""

from __future__ import annotations

from dataclasses import replace

import torch
from torch.distributed.tensor import DTensor, Replicate, Shard

import dtp
from dtp.engine import SPEC_ATTR
from dtp.quant import describe, rebuild
from dtp.resolve import resolve
from dtp.styles import full_tensor
from dtp.testing.quant import quantize
from dtp.testing.tiny import output_tensor, tiny_inputs, tiny_model

CLASSES = {
    "flux": "FluxTransformer2DModel",
    "flux2": "Flux2Transformer2DModel",
    "qwenimage": "QwenImageTransformer2DModel",
}
ORDERS = ("quantize_then_shard", "shard_then_quantize")


def rowwise_paths(model) -> set[str]:
    """The planned Linears whose columns split (rowwise / packed_rowwise) under the model's bundled plan."""
    return {s.path for s in resolve(dtp.plan_for(model), model).linears if s.style.shard_dim == 1}


def scheme_filter(model, scheme: str):
    """Every Linear (torchao's default); kept as a hook for schemes that must skip some."""
    return None


@torch.no_grad()
def quant_parity(name: str, scheme: str, mesh, pad: bool = False) -> dict:
    """Both orders for one model and scheme: {order: (relative diff to the one-process quantized model, the
    scheme's own relative error, how many sharded Linears hold a quantized weight)}."""
    cls = CLASSES[name]
    inputs = tiny_inputs(cls)
    base = output_tensor(tiny_model(cls)(**inputs))
    reference = tiny_model(cls)
    ref = output_tensor(quantize(reference, scheme, scheme_filter(reference, scheme))(**inputs))
    results = {}
    for order in ORDERS:
        model = tiny_model(cls)
        filter_fn = scheme_filter(model, scheme)
        if order == "quantize_then_shard":
            dtp.parallelize(quantize(model, scheme, filter_fn), mesh, pad=pad)
        else:
            quantize(dtp.parallelize(model, mesh, pad=pad), scheme, filter_fn, sharded=True)
        out = output_tensor(model(**inputs))
        sharded = [m for m in model.modules() if hasattr(m, SPEC_ATTR) and _quantized(m.weight)]
        results[order] = dict(
            relative=float((out - ref).abs().max() / ref.abs().max()),
            layers=layer_parity(model, reference, inputs, mesh),
            quant_error=float((ref - base).abs().max() / base.abs().max()),
            sharded_quantized=len(sharded),
        )
    return results


@torch.no_grad()
def layer_parity(model, reference, inputs: dict, mesh) -> float:
    """The worst relative difference over `model`'s sharded quantized Linears, each called on the input the
    one-process `reference` gave the same Linear (rowwise: this rank's features of it), against the
    reference's output (colwise: this rank's features of it)."""
    seen = _record_linears(reference, inputs)
    tp, rank, worst = mesh.size(), mesh.get_local_rank(), 0.0
    for path, module in model.named_modules():
        if not (hasattr(module, SPEC_ATTR) and _quantized(module.weight)):
            continue
        x, y = seen[path]
        features = replace(getattr(module, SPEC_ATTR).weight_layout, dim=x.ndim - 1)
        if getattr(module, SPEC_ATTR).style.shard_dim == 1:
            x = features.local_slice(x, tp, rank)
        out = module(x)
        out = out.to_local() if isinstance(out, DTensor) else out
        if out.shape != y.shape:  # a colwise output stays split: this rank's features of the reference's
            y = features.local_slice(y, tp, rank)
        worst = max(worst, float((out - y).abs().max() / y.abs().max()))
    return worst


def _record_linears(model, inputs: dict) -> dict:
    """{path: (input, output)} of every Linear's first call in one forward of the one-process `model`."""
    seen, handles = {}, []

    def keep(path, args, out) -> None:  # a forward hook returning a value would replace the output
        seen.setdefault(path, (args[0].clone(), out.clone()))

    for path, module in model.named_modules():
        if isinstance(module, torch.nn.Linear):
            handles.append(module.register_forward_hook(lambda _, args, out, path=path: keep(path, args, out)))
    model(**inputs)
    for handle in handles:
        handle.remove()
    return seen


def _quantized(weight) -> bool:
    """A torchao subclass, or a plain float8 tensor (layerwise casting)."""
    return describe(weight) is not None or weight.dtype == torch.float8_e4m3fn


def full_weights_exact(mesh, scheme: str, pad: bool = False) -> bool:
    """`full_tensor` of every sharded quantized weight equals the one-process quantized weight, bit for bit,
    in both orders (shard then quantize: the rowwise row scales torchao computed on DTensors are global)."""
    original = quantize(tiny_model(CLASSES["flux2"]), scheme)
    checked = 0
    for order in ORDERS:
        model = tiny_model(CLASSES["flux2"])
        if order == "quantize_then_shard":
            dtp.parallelize(quantize(model, scheme), mesh, pad=pad)
        else:
            quantize(dtp.parallelize(model, mesh, pad=pad), scheme, sharded=True)
        for path, module in model.named_modules():
            if hasattr(module, SPEC_ATTR):
                full, before = full_tensor(module.weight), original.get_submodule(path).weight
                assert torch.equal(full.qdata.view(torch.uint8), before.qdata.view(torch.uint8)), (order, path)
                assert torch.equal(full.scale, before.scale) and full.block_size == before.block_size, (order, path)
                checked += 1
    return checked > 0


@torch.no_grad()
def column_slice_control(mesh) -> dict:
    """Negative control: every rowwise layer quantized from this rank's column slice (per-row scales of the
    slice, not of the whole row) instead of sliced from the one-process quantized weight. Must fail 1e-5."""
    from torchao.quantization import PerRow
    from torchao.quantization.quantize_.workflows.int8.int8_tensor import Int8Tensor

    cls = CLASSES["flux"]
    inputs = tiny_inputs(cls)
    plain = tiny_model(cls)
    ref = output_tensor(quantize(tiny_model(cls), "int8wo")(**inputs))
    model = dtp.parallelize(quantize(tiny_model(cls), "int8wo"), mesh)
    tp, rank = mesh.size(), mesh.get_local_rank()
    for path in rowwise_paths(plain):
        module, layout = model.get_submodule(path), getattr(model.get_submodule(path), SPEC_ATTR).weight_layout
        wrong = Int8Tensor.from_hp(layout.local_slice(plain.get_submodule(path).weight.detach(), tp, rank), PerRow())
        qdata = DTensor.from_local(wrong.qdata, mesh, [Shard(1)], run_check=False)
        scale = DTensor.from_local(wrong.scale, mesh, [Replicate()], run_check=False)  # differs per rank: wrong
        module.weight = torch.nn.Parameter(rebuild(module.weight, qdata, scale, module.weight.block_size), False)
    out = output_tensor(model(**inputs))
    base = output_tensor(plain(**inputs))
    return dict(
        relative=float((out - ref).abs().max() / ref.abs().max()),
        quant_error=float((ref - base).abs().max() / base.abs().max()),
    )


def int8_dynamic_rowwise_refused(mesh) -> str:
    """int8 dynamic activation on every Linear (rowwise ones too): the PlanError's text, the model untouched."""
    from torchao.quantization import Int8DynamicActivationInt8WeightConfig, quantize_

    model = tiny_model(CLASSES["flux"])
    quantize_(model, Int8DynamicActivationInt8WeightConfig())
    before = {n: type(p.qdata) for n, p in model.named_parameters() if describe(p) is not None}
    try:
        dtp.parallelize(model, mesh)
    except dtp.PlanError as error:
        after = {n: type(p.qdata) for n, p in model.named_parameters() if describe(p) is not None}
        assert after == before and DTensor not in after.values()
        return str(error)
    return "no error"


def local_token_scale_control(mesh) -> dict:
    """Negative control for float8 dynamic activation: rowwise layers with each rank's LOCAL token amax (the
    all-reduce of `quant/dynamic.py` skipped). Must miss the bound."""
    import dtp.quant.dynamic as dynamic

    real = dynamic.funcol

    class LocalMax:
        @staticmethod
        def all_reduce(tensor, op, group):
            return tensor if op == "max" else real.all_reduce(tensor, op, group)

    dynamic.funcol = LocalMax
    try:
        return quant_parity("flux", "fp8", mesh)["quantize_then_shard"]
    finally:
        dynamic.funcol = real


def run_quant_cases(
    mesh, schemes, pad: bool = False, controls: bool = True, classes=tuple(CLASSES), exact: bool = True
) -> dict:
    """`exact`: full_weights_exact too (both weight-only schemes); a mesh that repeats another's kind leaves it out."""
    results = {}
    for name in classes:
        for scheme in schemes:
            for order, found in quant_parity(name, scheme, mesh, pad).items():
                results[f"{name}/{scheme}/{order}"] = found
    if exact:
        results["full_weights_exact"] = all(full_weights_exact(mesh, s, pad) for s in ("int8wo", "fp8wo"))
    if controls:
        results["column_slice_control"] = column_slice_control(mesh)
        results["int8_dynamic_rowwise_refused"] = int8_dynamic_rowwise_refused(mesh)
        results["local_token_scale_control"] = local_token_scale_control(mesh)
    return results


@torch.no_grad()
def load_parity(path: str, mesh, scheme: str, pad: bool = False) -> dict:
    """`dtp.from_pretrained(..., quantization_config=TorchAoConfig(...))` against diffusers' own one-process
    `from_pretrained` with the same config: relative output diff, and the quantized weights bit for bit."""
    from diffusers import FluxTransformer2DModel, TorchAoConfig
    from torchao.quantization import Float8WeightOnlyConfig, Int8WeightOnlyConfig

    config = TorchAoConfig(Int8WeightOnlyConfig() if scheme == "int8wo" else Float8WeightOnlyConfig())
    reference = FluxTransformer2DModel.from_pretrained(path, quantization_config=config, torch_dtype=torch.float32)
    model = dtp.from_pretrained(FluxTransformer2DModel, path, mesh, quantization_config=config, pad=pad)
    inputs = tiny_inputs(CLASSES["flux"])
    ref, out = output_tensor(reference(**inputs)), output_tensor(model(**inputs))
    exact = all(
        torch.equal(
            full_tensor(m.weight).qdata.view(torch.uint8), reference.get_submodule(p).weight.qdata.view(torch.uint8)
        )
        and torch.equal(full_tensor(m.weight).scale, reference.get_submodule(p).weight.scale)
        for p, m in model.named_modules()
        if hasattr(m, SPEC_ATTR)
    )
    quantized = sum(describe(m.weight) is not None for m in model.modules() if isinstance(m, torch.nn.Linear))
    return dict(relative=float((out - ref).abs().max() / ref.abs().max()), weights_exact=exact, quantized=quantized)


PIPELINE_ARGS = dict(prompt="a cat holding a sign that says hello", steps=2, height=32, width=32, seed=0)


@torch.no_grad()
def pipeline_parity(model_dir: str, mesh, scheme: str) -> dict:
    """`dtp.load_pipeline(..., quantization_config=config_for(scheme))` on `mesh` against the one-process
    `load_pipeline` with the same config (diffusers' own quantized load): relative pixel difference, the
    scheme's own pixel error against the unquantized pipeline, quantized Linears in the sharded transformer
    and in the text encoders (none: they are left unquantized)."""
    from dtp.pipeline.generate import generate
    from dtp.quant import config_for

    def pixels(pipe):
        pipe.set_progress_bar_config(disable=True)
        return torch.from_numpy(generate(pipe, **PIPELINE_ARGS)[0]).double()

    config = config_for(scheme)
    fp32, cpu = torch.float32, torch.device("cpu")
    plain = pixels(dtp.load_pipeline(model_dir, torch_dtype=fp32, device=cpu))
    ref = pixels(dtp.load_pipeline(model_dir, torch_dtype=fp32, device=cpu, quantization_config=config))
    sharded = dtp.load_pipeline(model_dir, mesh, torch_dtype=fp32, device=cpu, quantization_config=config)
    out = pixels(sharded)
    quantized = {
        name: sum(describe(m.weight) is not None for m in component.modules() if isinstance(m, torch.nn.Linear))
        for name, component in sharded.components.items()
        if isinstance(component, torch.nn.Module)
    }
    return dict(
        relative=float((out - ref).abs().max() / ref.abs().max()),
        quant_error=float((ref - plain).abs().max() / plain.abs().max()),
        quantized=quantized,
    )
