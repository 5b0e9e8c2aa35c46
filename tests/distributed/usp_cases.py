"""Shared by the USP parity modules (`test_cp_usp.py`, `test_cp_usp_models.py`): a case's inputs, the sharded
forward on a `make_mesh(cp=4, ulysses=2)` mesh, the negative controls and the ring-block counter."""

from __future__ import annotations

import torch

import dtp
import dtp.runtime.cp.attention as attention_module
import dtp.runtime.cp.ring as ring_module
import dtp.runtime.cp.ulysses as ulysses_module
from dtp.testing.counting import CallCounter
from dtp.testing.tiny import PLAN_CLASSES, output_tensor, tiny_inputs, tiny_model

TOL = 1e-5
QWEN, WAN, HUNYUAN, LTX = (
    "QwenImageTransformer2DModel",
    "WanTransformer3DModel",
    "HunyuanVideoTransformer3DModel",
    "LTXVideoTransformer3DModel",
)
QWEN21 = PLAN_CLASSES["qwenimage21"]
MODELS = (QWEN, WAN, HUNYUAN, LTX)


def inputs_for(name: str) -> dict:
    """A case's inputs: a model's tiny ones, Qwen-Image with a text key mask; "wan_odd" / "wan_compile": 9 Wan
    tokens; "hunyuan_odd": 9 HunyuanVideo video tokens and 7 text tokens."""
    if name == QWEN:
        inputs = tiny_inputs(QWEN, batch=2)
        inputs["encoder_hidden_states_mask"][1, -3:] = 0  # sample 1: its last 3 text tokens are padding
        return inputs
    if name == "hunyuan_odd":  # a 1 x 3 x 3 patch grid (9 video tokens) and 7 text tokens, sample 1 with 5 real
        return hunyuan_odd_inputs()
    if name in ("wan_odd", "wan_compile"):  # 3 latent frames of 1 x 3 patches: 9 tokens, cp=4 pads them to 12
        inputs = tiny_inputs(WAN, batch=2)
        batch, channels = inputs["hidden_states"].shape[:2]
        inputs["hidden_states"] = torch.randn(batch, channels, 3, 2, 6, generator=torch.Generator().manual_seed(3))
        return inputs
    return tiny_inputs(name)


def _wrong_mask_order(query, key, value, mask, *, group, full_mask=None, **kwargs):
    """The bug: the ring merging each Ulysses group's key blocks with its ranks' masks in the wrong order."""
    if full_mask is not None:
        blocks = full_mask.chunk(4, dim=1)  # cp rank = ring position * 2 + Ulysses rank
        full_mask = torch.cat([blocks[i] for i in (1, 0, 3, 2)], dim=1)
    return ring_module.ring_attention(query, key, value, mask, group=group, full_mask=full_mask, **kwargs)


def _wrong_heads(x, group):
    """The bug: the head groups coming back from the Ulysses exchange taken from the wrong rank (rolled by one)."""
    return REAL_HEADS_TO_SEQ(x, group).roll(x.shape[2], dims=2)


REAL_HEADS_TO_SEQ = ulysses_module.heads_to_seq
CONTROLS = {
    "wrong_mask_order": (attention_module, "ring_attention", _wrong_mask_order),
    "wrong_heads": (ulysses_module, "heads_to_seq", _wrong_heads),
}


def error_of(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out - ref).abs().max() / ref.abs().max()) if out.shape == ref.shape else float("inf")


@torch.no_grad()
def usp_forward(cls: str, mesh, inputs: dict, compiled: bool = False, **options) -> torch.Tensor:
    model = dtp.parallelize(tiny_model(cls), mesh, cp_mode="ring", **options)
    if compiled:
        model.compile_repeated_blocks(fullgraph=True, backend="eager")
    return output_tensor(model(**inputs)).float()


def run_case(mesh, case: str, cls: str, options: dict) -> dict:
    """One case on `mesh` against one process: {"error", "blocks" (ring blocks run), "graphs" (dynamo's)}."""
    inputs = inputs_for(case if case in ("wan_odd", "wan_compile", "hunyuan_odd") else cls)
    with torch.no_grad():
        ref = output_tensor(tiny_model(cls)(**inputs)).float()
    torch._dynamo.utils.counters.clear()
    with CallCounter(ring_module, "block_attention") as blocks:
        error = error_of(usp_forward(cls, mesh, inputs, **options), ref)
    return dict(error=error, blocks=blocks.calls, graphs=torch._dynamo.utils.counters["stats"]["unique_graphs"])


def run_controls(mesh) -> dict:
    """Each control's error on the padded Wan ("wan_odd")."""
    inputs = inputs_for("wan_odd")
    with torch.no_grad():
        ref = output_tensor(tiny_model(WAN)(**inputs)).float()
    results = {}
    for name, (module, attribute, bug) in CONTROLS.items():
        real = getattr(module, attribute)
        setattr(module, attribute, bug)
        try:
            results[name] = error_of(usp_forward(WAN, mesh, inputs), ref)
        finally:
            setattr(module, attribute, real)
    return results


def check_controls_failed(runs: list[dict], control: str) -> None:
    """Every rank's `control` (a CONTROLS name) missed one process by far (> 100 x TOL)."""
    for results in runs:
        print(f"{control}: {results[control]:.2e} vs one process")
        assert results[control] > 100 * TOL, (control, results[control])


def check_block_causal_refused(runs: list[dict]) -> None:
    """Every rank's `block_causal_refusal` (under "qwen21"): a PlanError naming ring, the model unchanged."""
    for results in runs:
        assert results["qwen21"] is not None
        message, unchanged = results["qwen21"]
        assert "ring attention cannot run this model" in message and unchanged, message


def block_causal_refusal(mesh) -> tuple[str, bool] | None:
    """Qwen-Image 2.1 (`ring_refused`) on the USP mesh: (the PlanError's message, model unchanged), None if accepted."""
    model = tiny_model(QWEN21)
    before = {name: p.clone() for name, p in model.state_dict().items()}
    try:
        dtp.parallelize(model, mesh)
    except dtp.PlanError as error:
        return str(error), all(torch.equal(before[name], p) for name, p in model.state_dict().items())
    return None


def run_lora_case(mesh) -> dict:
    """The padded Wan with a LoRA on every Linear: dtp's loader on the USP-sharded model against diffusers' own on
    one process (`lora_cases.random_lora`, seed 10)."""
    from lora_cases import random_lora

    inputs = inputs_for("wan_odd")
    lora = random_lora(tiny_model(WAN), seed=10)
    reference = tiny_model(WAN)
    reference.load_lora_adapter(lora, adapter_name="a", prefix="transformer")
    model = dtp.parallelize(tiny_model(WAN), mesh, cp_mode="ring")
    dtp.load_lora(model, lora, adapter_name="a")
    with torch.no_grad():
        ref = output_tensor(reference(**inputs)).float()
        plain = output_tensor(tiny_model(WAN)(**inputs)).float()
        with CallCounter(ring_module, "block_attention") as blocks:
            out = output_tensor(model(**inputs)).float()
    return dict(error=error_of(out, ref), blocks=blocks.calls, lora_effect=error_of(plain, ref))


def hunyuan_odd_inputs() -> dict:
    """HunyuanVideo at a length cp does not divide: a 1 x 3 x 3 patch grid (9 video tokens) and 7 text tokens,
    sample 1 with 5 real."""
    inputs = tiny_inputs(HUNYUAN, batch=2)
    g = torch.Generator().manual_seed(3)
    inputs["hidden_states"] = torch.randn(*inputs["hidden_states"].shape[:2], 1, 6, 6, generator=g)
    inputs["encoder_hidden_states"] = torch.randn(2, 7, inputs["encoder_hidden_states"].shape[2], generator=g)
    mask = torch.ones(2, 7, dtype=inputs["encoder_attention_mask"].dtype)
    mask[1, 5:] = 0
    inputs["encoder_attention_mask"] = mask
    return inputs
