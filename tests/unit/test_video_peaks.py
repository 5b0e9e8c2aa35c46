"""Full-size checks of the video families (issue 45): what made FramePack's, JoyImage Edit's and Kandinsky 5's
`dtp check --cp 8` fail, each on a cheap stand-in (`analysis/bounds.py`, `analysis/inputs.py`, `hooks_alike`), and
the tensors a check names as held whole at the per-rank peak (`analysis/whole.py`)."""

import dataclasses
from types import SimpleNamespace

import diffusers
import pytest
import torch
from torch import nn
from torch._subclasses.fake_tensor import DataDependentOutputException

from dtp import PlanError
from dtp.analysis.forward import hooks_alike, peak_report
from dtp.analysis.inputs import ForwardShape, forward_inputs
from dtp.analysis.trace import fake_like, fake_mode, to_fake, trace_call
from dtp.analysis.whole import Made, whole_at_peak
from dtp.families import FAMILIES
from dtp.plan.cp import cp_plan_from_mapping
from dtp.plan.io import load_plan
from dtp.runtime.cp.local_embed import anyflow_timestep, local_embed_for
from dtp.tools.check import format_peak


class MaskSliced(nn.Module):
    """FramePack at batch 1: the prompt cut to `mask.sum(dim=1)[0]` tokens (a host read of a mask's count)."""

    def forward(self, text, **given):
        (mask,) = given.values()  # encoder_attention_mask, or the negative control's input of another name
        mask = torch.cat([mask.new_ones((1, 4)), mask], dim=1)
        count = mask.sum(dim=1, dtype=torch.int)
        return torch.cat([text, text], dim=1)[:, : count[0]] * 2


def _trace(inputs):
    with fake_mode():
        model = to_fake(MaskSliced().to("meta"))
        return trace_call(model, lambda m, **k: m(**k), {k: fake_like(v) for k, v in inputs.items()})


def test_a_mask_count_read_on_the_host_is_every_element_set():
    """The count of an int64 mask input (4 ones prepended) is read as its bound, 4 + 60: the slice keeps 64 of 120
    rows, and the read is counted as guessed. An integer input not named a mask has no bound: still refused."""
    text = torch.empty(1, 60, 8, device="meta")
    trace = _trace({"text": text, "encoder_attention_mask": torch.empty(1, 60, dtype=torch.long, device="meta")})
    assert trace.guessed_branches == 1
    assert trace.output_bytes == 64 * 8 * 4  # fp32 rows of the slice: the bound, not the 120 of the cat
    with pytest.raises(DataDependentOutputException):
        _trace({"text": text, "token_ids": torch.empty(1, 60, dtype=torch.long, device="meta")})


def test_hooks_on_a_later_block_keep_the_model_whole():
    """A gather hook on the last block (Kandinsky 5's `visual_transformer_blocks.-1`) would be cut away with it."""
    model = nn.Module()
    model.blocks = nn.ModuleList(nn.Linear(2, 2) for _ in range(3))
    model.blocks[0].register_forward_pre_hook(lambda m, a: None)  # a split at the first block: kept by the cut
    assert hooks_alike(model)
    model.blocks[2].register_forward_hook(lambda m, a, o: None)
    assert not hooks_alike(model)


def test_joyimage_edit_full_size_inputs_keep_the_items_axis():
    """[B, N, C, T, H, W]: the target and a reference at 1024^2, 2 x 4096 tokens (the 5-D rewrite took N for C)."""
    config = {"in_channels": 16, "text_dim": 4096, "patch_size": [1, 2, 2]}
    inputs = forward_inputs("JoyImageEditTransformer3DModel", config, torch.bfloat16, ForwardShape())
    assert tuple(inputs.kwargs["hidden_states"].shape) == (1, 2, 16, 1, 128, 128)
    assert inputs.tokens == 8192


def test_framepack_full_size_histories_follow_the_grid():
    """The clean / 2x / 4x histories on the full-size latent grid, their frame indices before the noisy frames'."""
    config = {"in_channels": 16, "patch_size": 2, "text_embed_dim": 4096, "pooled_projection_dim": 768}
    config["image_proj_dim"] = 1152
    kwargs = forward_inputs("HunyuanVideoFramepackTransformer3DModel", config, torch.bfloat16, ForwardShape()).kwargs
    assert tuple(kwargs["latents_history_4x"].shape) == (1, 16, 4, 90, 160)
    assert kwargs["indices_latents"].tolist() == list(range(7, 7 + 33))


# Helios' cp section before `cp.forward: helios` (round 14): `tail` splits at the first block, every block and the
# output norm, which took the rank's rows of what diffusers' forward had joined whole
_PAD = {"at": "first", "attention": ["blocks.*.attn1"]}
HELIOS_TAIL_SPLITS = {
    "split": {
        "blocks.0": {"hidden_states": {"dim": 1, "expected_dims": 3, "tail": "original_context_length", "pad": _PAD}},
        "blocks.*": {
            "temb": {"dim": 1, "expected_dims": 4, "tail": "original_context_length", "pad": _PAD},
            "rotary_emb": {"dim": 1, "expected_dims": 3, "tail": "original_context_length", "pad": _PAD},
            "original_context_length": {"count": True},
        },
        "norm_out": {
            "temb": {"dim": 1, "expected_dims": 3, "tail": "original_context_length", "pad": _PAD},
            "original_context_length": {"count": True},
        },
    },
    "gather": {"proj_out": {"dim": 1, "expected_dims": 3, "trim": "last"}},
    "local": ["blocks.*.attn2"],
}


def test_check_names_what_stays_whole_at_the_peak():
    """Tiny Helios at cp=2 (84 current + 38 history tokens) under its former `tail` splits: the per-token modulation
    diffusers' forward builds for the whole joint sequence, [1, 6, 122, 64] from a `cat`, is the largest tensor no
    rank divides at the peak; its cost above ideal is half its bytes; the ratio without the whole tensors is lower;
    `dtp check` prints them. The bundled plan (`cp.forward: helios`, the cut before the joins) leaves none whole.
    Negative control: judged against a one-rank trace that made no tensor of those shapes, nothing is whole."""
    shape = ForwardShape(resolution=64, frames=9, text_tokens=8)
    config = FAMILIES["HeliosTransformer3DModel"].tiny
    plan = load_plan("helios")
    tails = dataclasses.replace(plan, cp=cp_plan_from_mapping(HELIOS_TAIL_SPLITS, "helios (tail splits)"))
    report = peak_report("HeliosTransformer3DModel", tails, cp=2, tp=1, config=config, shape=shape)
    whole = report["whole"]
    first = whole["tensors"][0]
    assert first["tensor"] == "[1, 6, 122, 64] bfloat16" and first["made_by"].startswith("cat")
    assert first["above_ideal_bytes"] == first["bytes"] // 2
    assert whole["ratio_without"] < report["ratio"] - 0.2
    assert any("held whole by every rank" in line for line in format_peak(report, "bf16"))
    bundled = peak_report("HeliosTransformer3DModel", plan, cp=2, tp=1, config=config, shape=shape)
    assert bundled["whole"]["count"] == 0 and bundled["ratio"] < report["ratio"] - 0.2, bundled
    sharded = SimpleNamespace(at_peak=[Made(10**6, (1, 6, 122, 64), "bfloat16", "cat", "")])
    assert whole_at_peak(sharded, SimpleNamespace(made=set()), cp=2, tp=1, per_rank=10**6, ideal=5e5)["count"] == 0


def _split(tensor, spec):
    return cp_plan_from_mapping({"split": {"b.*": {tensor: spec}}, "gather": {"o": {"dim": 1}}}, "t").splits


def test_one_element_split_two_spellings():
    """`name[i]` (JoyImage Edit's plan, now Allegro's too) and `element: i` are one rule: the same SplitRule, one
    runtime path (`SplitInputs._split_element`); both at once, or with another kind of cut, is a PlanError."""
    assert _split("rope[1]", {"dim": 1, "expected_dims": 2}) == _split(
        "rope", {"dim": 1, "expected_dims": 2, "element": 1}
    )
    for tensor, spec in (("rope[1]", {"dim": 1, "element": 1}), ("rope[0]", {"dim": 0, "strided": True})):
        with pytest.raises(PlanError):
            _split(tensor, spec)
    allegro = [r for r in load_plan("allegro").cp.splits if r.name == "image_rotary_emb"]
    joyimage = [r for r in load_plan("joyimage_edit").cp.splits if r.name == "image_rotary_emb"]
    assert [r.element for r in allegro] == [1] and sorted(r.element for r in joyimage) == [0, 1]


def test_anyflow_timestep_rows_are_computed_per_rank():
    """AnyFlow's per-token modulation: each rank's rows from the per-frame rows (`local_embed.anyflow_timestep`)
    concatenated in rank order equal diffusers' whole repeat bit for bit, at cp 2 and 3 (a rank's rows crossing a
    frame boundary); the bundled plan's two output cuts select it."""
    model = diffusers.AnyFlowTransformer3DModel.from_config(FAMILIES["AnyFlowTransformer3DModel"].tiny)
    embedder = model.condition_embedder
    g = torch.Generator().manual_seed(0)
    timestep, delta = torch.rand(2, 4, generator=g) * 1000, torch.rand(2, 4, generator=g) * 1000
    text = torch.randn(2, 5, 32, generator=g)
    whole = embedder.forward_timestep(timestep, delta, text, 6)
    for cp in (2, 3):
        ranks = [anyflow_timestep(embedder, timestep, delta, text, 6, rank=r, cp=cp, what="t") for r in range(cp)]
        for i, rows in enumerate(whole):
            assert torch.equal(torch.cat([local[i] for local in ranks], dim=1), rows)
    rules = [r for r in load_plan("anyflow").cp.splits if r.key == "condition_embedder"]
    assert local_embed_for(embedder, rules) is anyflow_timestep
    assert local_embed_for(embedder, rules[:1]) is None  # a plan cutting one of the two: the generic output hook
