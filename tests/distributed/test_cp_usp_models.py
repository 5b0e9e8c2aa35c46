"""USP (Ulysses x ring) on more models and composed with the other options: `dtp.make_mesh(cp=4, ulysses=2)` on 4
gloo ranks (ring 2 x ulysses 2), one spawned group. Each against one process within 1e-5 of max |ref|:
- pad (the default run): Wan (tiny, 4 heads) with 3 frames of 1 x 3 patches (9 tokens; padded to 12: rank 3 holds
  pad only), 2.2e-7;
- DTP_FULL=1: Qwen-Image (batch 2, text key mask), Wan, HunyuanVideo and LTX-Video at their tiny lengths (3.5e-7,
  3.3e-7, 5.7e-7, 4.1e-7); fsdp: Wan with fsdp=True (weights over the 4 cp ranks), 3.3e-7; compile: the padded
  Wan's repeated blocks compiled with `fullgraph=True` (dynamo's "eager" backend traces what inductor would: a graph
  break raises), 2.2e-7.
Qwen-Image 2.1 (block-causal, `ring_refused`) is refused before anything changes: PlanError naming ring.
Negative controls on the padded Wan: the ring merging a Ulysses group's key blocks in the wrong order (the pad keys
of cp rank 3 land on rank 2's), and a group's heads taken from the wrong rank on the way back; both miss by far
(measured 1.5e-1 and 8.4e-1; the exact padded run 2.2e-7, with fsdp 3.3e-7).
"""

from __future__ import annotations

import pytest
import torch

import dtp
import dtp.runtime.cp.attention as attention_module
import dtp.runtime.cp.ring as ring_module
import dtp.runtime.cp.ulysses as ulysses_module
from dtp.testing.launch import spawn
from dtp.testing.scope import full_run
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


def _inputs(name: str) -> dict:
    if name == QWEN:
        inputs = tiny_inputs(QWEN, batch=2)
        inputs["encoder_hidden_states_mask"][1, -3:] = 0  # sample 1: its last 3 text tokens are padding
        return inputs
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


class _CountBlocks:
    """Counts ring blocks (`ring.block_attention` calls), to prove the ring half of USP ran."""

    def __enter__(self):
        self.real, self.calls = ring_module.block_attention, 0

        def counted(*args, **kwargs):
            self.calls += 1
            return self.real(*args, **kwargs)

        ring_module.block_attention = counted
        return self

    def __exit__(self, *exc):
        ring_module.block_attention = self.real


def _error(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out - ref).abs().max() / ref.abs().max()) if out.shape == ref.shape else float("inf")


@torch.no_grad()
def _forward(cls: str, mesh, inputs: dict, compiled: bool = False, **options) -> torch.Tensor:
    model = dtp.parallelize(tiny_model(cls), mesh, cp_mode="ring", **options)
    if compiled:
        model.compile_repeated_blocks(fullgraph=True, backend="eager")
    return output_tensor(model(**inputs)).float()


def _run(rank: int, world: int) -> dict:
    results = {}
    mesh = dtp.make_mesh(cp=4, ulysses=2)
    cases = [("wan_odd", WAN, {})]  # the default run: USP with a padded split, and the controls on it
    if full_run():
        cases += [(name, name, {}) for name in MODELS]
        cases += [("wan_fsdp", WAN, dict(fsdp=True)), ("wan_compile", WAN, dict(compiled=True))]
    for case, cls, options in cases:
        inputs = _inputs(case if case in ("wan_odd", "wan_compile") else cls)
        with torch.no_grad():
            ref = output_tensor(tiny_model(cls)(**inputs)).float()
        torch._dynamo.utils.counters.clear()
        with _CountBlocks() as blocks:
            results[case] = (_error(_forward(cls, mesh, inputs, **options), ref), blocks.calls)
        results[case, "graphs"] = torch._dynamo.utils.counters["stats"]["unique_graphs"]
        if case == "wan_odd":
            for name, (module, attribute, bug) in CONTROLS.items():
                real = getattr(module, attribute)
                setattr(module, attribute, bug)
                try:
                    results[name] = _error(_forward(cls, mesh, inputs), ref)
                finally:
                    setattr(module, attribute, real)
    model = tiny_model(QWEN21)
    before = {name: p.clone() for name, p in model.state_dict().items()}
    try:
        dtp.parallelize(model, mesh)
        results["qwen21"] = None
    except dtp.PlanError as error:
        unchanged = all(torch.equal(before[name], p) for name, p in model.state_dict().items())
        results["qwen21"] = (str(error), unchanged)
    return results


@pytest.fixture(scope="module")
def runs():
    return spawn(_run, 4)


@pytest.mark.parametrize(
    "case", ["wan_odd", *(pytest.param(c, marks=pytest.mark.full) for c in (*MODELS, "wan_fsdp", "wan_compile"))]
)
def test_usp_parity(runs, case):
    """ring 2 x ulysses 2: within 1e-5 of one process on every rank; ring blocks ran (2 per attention call)."""
    for rank, results in enumerate(runs):
        error, blocks = results[case]
        print(f"{case}: {error:.2e} vs one process, {blocks} ring blocks")
        assert error <= TOL and blocks > 0, (rank, case, error, blocks)


@pytest.mark.full
def test_usp_compiled(runs):
    """The compiled case really compiled: dynamo captured graphs (one per distinct block), none for eager cases."""
    for results in runs:
        assert results["wan_compile", "graphs"] > 0 and results["wan_odd", "graphs"] == 0, results


@pytest.mark.parametrize("control", list(CONTROLS))
def test_usp_controls_fail(runs, control):
    for results in runs:
        print(f"{control}: {results[control]:.2e} vs one process")
        assert results[control] > 100 * TOL, (control, results[control])


def test_block_causal_model_refuses_usp(runs):
    """Qwen-Image 2.1 takes Ulysses only: a ring degree of 2 is a PlanError, the model untouched."""
    for results in runs:
        assert results["qwen21"] is not None
        message, unchanged = results["qwen21"]
        assert "ring attention cannot run this model" in message and unchanged, message
