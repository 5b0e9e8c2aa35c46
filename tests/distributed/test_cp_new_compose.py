"""The cp mechanisms added for issue 45's last families, composed with the other axes and options (DTP_FULL=1).

ONE 4-process group. Each family tiny with perturbed weights, batch 2, in its cp mode, against one process within
1e-5 of max |ref|:
- Nucleus-Image (expert choice from gathered router scores, `runtime/cp/expert_choice.py`), ring;
- Kandinsky 6 SR (NABLA's block mask from gathered key-block means, `runtime/cp/nabla.py`), ring, inside
  `sparse_flex()` (eager flex then attends through the mask, as the compiled kernel does);
- Kandinsky 6 (a rule per stream, the video gathered as one element of a tuple output), ring;
- Cosmos 3 Omni (each pathway padded and cut at layers.0, a block-causal ring prefix, `runtime/cp/packed.py`), ring;
- OmniGen (Ulysses with the model's whole mask, any length through `runtime/cp/whole_pad.py`), Ulysses;
- Helios (ring) and FramePack (Ulysses): dtp's forward for the class, cut before its own joins (`cp.forward`).
Composed with: cfg=2 x cp=2 (the batch over the cfg groups, each group's half over its cp pair), fsdp=True at cp=2
(weights over the cp ranks), a LoRA on every Linear (`dtp.load_lora` on the sharded model against diffusers'
`load_lora_adapter` on one process), and the repeated blocks compiled with `fullgraph=True` (dynamo's "eager" backend
traces what inductor would: a graph break raises; this found the cp split hook binding `**kwargs` signatures with
`inspect.Signature.bind`, which dynamo cannot trace), and torchao's int8 weight-only (`dtp.quantize` on the sharded
model against torchao's `quantize_` on one process). FramePack + LoRA found that `load_lora` moved only three kinds of
cp hook from the wrapped Linear to peft's layer: `proj_out`'s keep and ragged gather stayed on the base Linear and the
adapter's term came on other rows (a shape error); every hook `apply_cp` registered there moves now. Refused with a
PlanError, the model as it was
(test_refusals_leave_the_model_unchanged): cfg on OmniGen and Cosmos 3 Omni (their plans' `cfg_refused`: inputs that
are not rows of one batch; measured before: IndexError / a scatter_add error), a LoRA on OmniGen (no PeftAdapterMixin
in diffusers; was an AttributeError).
"""

from __future__ import annotations

import inspect
import warnings

import pytest
import torch
from lora_cases import random_lora
from torch.distributed.device_mesh import init_device_mesh

import dtp
from dtp.runtime.compile import compile_blocks
from dtp.testing.flex import sparse_flex
from dtp.testing.launch import spawn
from dtp.testing.perturb import perturb
from dtp.testing.quant import quantize
from dtp.testing.tiny import PLAN_CLASSES, output_tensor, tiny_inputs, tiny_model

pytestmark = pytest.mark.full  # each mechanism's own parity (and its control) runs by default in its module

TOL = 1e-5
MODES = dict(
    nucleusmoe="ring",
    kandinsky6_sr="ring",
    kandinsky6="ring",
    cosmos3_omni="ring",
    omnigen="ulysses",
    helios="ring",  # cp.forward: dtp's copy of the class's forward, cut before its own joins
    hunyuanvideo_framepack="ulysses",
)
OPTIONS = ("cfg", "fsdp", "lora", "compile", "quant")
REFUSED = {  # a PlanError before anything changes, with these words
    ("omnigen", "cfg"): "cannot run this model: its inputs are not rows of one batch",
    ("cosmos3_omni", "cfg"): "cannot run this model: its forward takes one packed sequence",
    ("omnigen", "lora"): "takes no LoRA in diffusers",
}


def _model(name: str):
    return perturb(tiny_model(PLAN_CLASSES[name]), seed=7)


def _reference(name: str, option: str, inputs: dict, lora: dict | None) -> torch.Tensor:
    model = _model(name)
    if lora is not None and hasattr(model, "load_lora_adapter"):
        model.load_lora_adapter(lora, adapter_name="a", prefix="transformer")
    if option == "quant":  # torchao's own int8 weight-only on one process
        quantize(model, "int8wo")
    return output_tensor(model(**inputs)).float()


def _state(model) -> dict:
    return {key: value.detach().clone() for key, value in model.state_dict().items()}


def _same(model, before: dict) -> bool:
    """Nothing changed since `before`: the same weights, no adapter, no cfg wrapper."""
    after = model.state_dict()
    weights = after.keys() == before.keys() and all(torch.equal(before[k], v) for k, v in after.items())
    return weights and not getattr(model, "peft_config", None) and inspect.ismethod(model.forward)


def _sharded(name: str, option: str, meshes: dict, lora: dict | None):
    """The sharded model; a PlanError's message and whether the step that refused left the model as it was."""
    model = _model(name)
    before = _state(model)
    try:
        dtp.parallelize(model, meshes["cfg" if option == "cfg" else "cp"], cp_mode=MODES[name], fsdp=option == "fsdp")
        before = _state(model)
        if option == "lora":
            dtp.load_lora(model, lora, adapter_name="a")
        if option == "quant":
            quantize(model, "int8wo", sharded=True)
    except dtp.PlanError as error:
        return None, dict(refused=str(error), unchanged=_same(model, before))
    if option == "compile":
        compile_blocks(model, backend="eager", fullgraph=True)
    return model, None


@torch.no_grad()
def _case(name: str, option: str, meshes: dict) -> dict:
    inputs = tiny_inputs(PLAN_CLASSES[name], batch=2)
    lora = random_lora(_model(name), seed=10) if option == "lora" else None
    with sparse_flex():
        model, refusal = _sharded(name, option, meshes, lora)
        if refusal is not None:
            return refusal
        ref = _reference(name, option, inputs, lora)
        plain = output_tensor(_model(name)(**inputs)).float()
        out = output_tensor(model(**inputs)).float()
    scale = ref.abs().max()
    return dict(
        error=float((out - ref).abs().max() / scale) if out.shape == ref.shape else float("inf"),
        effect=float((plain - ref).abs().max() / scale),  # how far the LoRA (or int8) moves the output
    )


def _guarded(name: str, option: str, meshes: dict) -> dict:
    try:
        return _case(name, option, meshes)
    except Exception as error:  # one case's failure reported beside the others'
        return dict(raised=f"{type(error).__name__}: {str(error)[:2000]}")


def _all(rank: int, world: int) -> dict:
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore", message=".*flex_attention called without torch.compile.*")
    pairs = init_device_mesh("cpu", (2, 2, 1), mesh_dim_names=("pair", "cp", "tp"))["cp", "tp"]
    meshes = {"cp": pairs, "cfg": dtp.make_mesh(cfg=2, cp=2)}
    return {(name, option): _guarded(name, option, meshes) for name in MODES for option in OPTIONS}


@pytest.fixture(scope="module")
def four():
    return spawn(_all, 4)


def _cases(refused: bool):
    return [(name, option) for name in MODES for option in OPTIONS if ((name, option) in REFUSED) == refused]


@pytest.mark.parametrize("name,option", _cases(refused=False))
def test_composed_parity(four, name, option):
    for rank, results in enumerate(four):
        found = results[name, option]
        print(f"{name} {MODES[name]} + {option}: {found}")
        assert "refused" not in found and "raised" not in found, (rank, found)
        assert found["error"] <= TOL, (rank, name, option, found)
        if option in ("lora", "quant"):
            assert found["effect"] > 100 * TOL, found  # the adapter / the int8 weights really changed the output


@pytest.mark.parametrize("name,option", _cases(refused=True))
def test_refusals_leave_the_model_unchanged(four, name, option):
    for rank, results in enumerate(four):
        found = results[name, option]
        print(f"{name} + {option}: {found}")
        assert REFUSED[name, option] in found.get("refused", ""), (rank, found)
        assert found["unchanged"], (rank, found)
