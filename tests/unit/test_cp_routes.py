"""CP for every plan, the pure parts: SDPA routing scoped to one module, joint-mask segments, mask
reduction, refused plans, and `local` attention. Parity on processes: tests/distributed/test_cp_coverage.py."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F
from diffusers.models.attention_processor import SanaLinearAttnProcessor2_0

import dtp
from dtp import ForwardError
from dtp.plan.cp import SplitRule
from dtp.resolve import resolve, resolve_cp
from dtp.resolve.binding.cp import attention_routes
from dtp.runtime.cp import attention as plugin
from dtp.runtime.cp.hooks import SplitInputs
from dtp.runtime.cp.masks import split_mask
from dtp.runtime.cp.sequence import local_chunk, padded_chunk
from dtp.testing.tiny import PLAN_CLASSES, output_tensor, tiny_inputs, tiny_model
from dtp.tools.cli import main

SD3 = "SD3Transformer2DModel"


class _Recorder:
    """Stands in for CpAttention: records the call and defers to the original attention ([B, S, H, D])."""

    def __init__(self):
        self.calls, self.shapes = 0, []

    def __call__(self, original, args):
        self.calls += 1
        self.shapes.append(tuple(args["query"].shape))
        return original(args["query"], args["key"], args["value"], attn_mask=args["attn_mask"], scale=args["scale"])


@torch.no_grad()
def test_sdpa_route_is_scoped_to_the_hooked_module():
    """SD3's processor calls F.scaled_dot_product_attention: only the hooked module's call is routed, in the
    [B, S, H, D] layout, and the output is unchanged; other modules and later forwards are untouched."""
    model, inputs = tiny_model(SD3), tiny_inputs(SD3)
    before = output_tensor(model(**inputs))
    recorder = _Recorder()
    attn = model.transformer_blocks[1].attn
    assert attention_routes(attn) == ("sdpa",)
    handles = plugin.install_attention("transformer_blocks.1.attn", attn, recorder)
    torch.testing.assert_close(output_tensor(model(**inputs)), before, rtol=1e-6, atol=1e-6)
    assert recorder.calls == 1 and recorder.shapes == [(1, 16 + 8, 4, 16)]  # [B, image + text, heads, head_dim]
    for handle in handles:
        handle.remove()
    model(**inputs)
    assert recorder.calls == 1
    assert F.scaled_dot_product_attention(*(torch.randn(1, 1, 2, 4),) * 3).shape == (1, 1, 2, 4)  # no mode left


class _OwnMath(SanaLinearAttnProcessor2_0):
    """Sana's linear attention under a name dtp has no adapter for: its own math, no route CP can plug into."""


def test_processor_without_attention_call_is_refused_at_resolve():
    """A processor that calls neither route and has no CP adapter: a plan that lists it for CP is a PlanError at
    resolve. Sana's own `SanaLinearAttnProcessor2_0` takes the linear route (its adapter all-reduces the sums)."""
    model = tiny_model("SanaTransformer2DModel")
    assert attention_routes(model.transformer_blocks[0].attn1) == ("linear",)
    model.transformer_blocks[0].attn1.processor = _OwnMath()
    assert attention_routes(model.transformer_blocks[0].attn1) == ()
    with pytest.raises(dtp.PlanError, match="calls neither dispatch_attention_fn nor F.scaled_dot_product_attention"):
        resolve_cp(resolve(dtp.load_plan("sana"), model), model)


def test_cli_check_refuses_cp_for_a_refused_plan(capsys):
    """Before the module-scoped fake world below: `dtp check` builds its own. OmniGen takes Ulysses only (its full
    [B, 1, S, S] mask, `ring_refused`)."""
    assert main(["check", "omnigen", "--tp", "2", "--cp", "2", "--cp-mode", "ring", "--no-forward"]) == 1
    assert "ring attention cannot run this model" in capsys.readouterr().err
    assert main(["check", "wan", "--tp", "2", "--cp", "4", "--cp-mode", "ring", "--no-forward"]) == 0


@pytest.mark.parametrize(
    "name,mode,reason",
    [
        ("omnigen", "ring", r"ring attention cannot run this model: its attention mask is a full \[B, 1, S, S\]"),
        ("qwenimage21", "ring", "ring attention cannot run this model: its attention mask is block-causal"),
    ],
)
def test_refused_plans_say_why_before_anything_changes(name, mode, reason, fake_world):
    """`cp: refused` / `ring_refused`: parallelize at cp=2 raises the PlanError quoting the reason, model untouched."""
    model = tiny_model(PLAN_CLASSES[name])
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(dtp.PlanError, match=reason):
        dtp.parallelize(model, dtp.make_mesh(tp=2, cp=2, device_type="cpu"), cp_mode=mode)
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before) and not model._forward_pre_hooks


def test_local_attention_is_not_routed():
    """Wan: attn2 (cross-attention to the whole text) is `local`; only attn1 modules take CP attention."""
    model = tiny_model(PLAN_CLASSES["wan"])
    paths = [spec.path for spec in resolve_cp(resolve(dtp.load_plan("wan"), model), model).attention]
    assert paths == ["blocks.0.attn1", "blocks.1.attn1"]


def test_local_glob_skips_blocks_without_the_attention():
    """FIBO 2.0: cross_attention exists in the injection blocks only (None elsewhere); `local` over layers.* keeps
    layer 1's whole and routes every self-attention; the same glob with a wrong member is still a PlanError."""
    model, plan = tiny_model(PLAN_CLASSES["bria_fibo2"]), dtp.load_plan("bria_fibo2")
    assert model.layers[0].cross_attention is None and model.layers[1].cross_attention is not None
    paths = [spec.path for spec in resolve_cp(resolve(plan, model), model).attention]
    assert "layers.1.cross_attention" not in paths and {"layers.0.attention", "layers.1.attention"} <= set(paths)
    wrong = dataclasses.replace(plan.cp, local_attention=("layers.*.cross_attn",))
    with pytest.raises(dtp.PlanError, match="'layers.0.cross_attn' does not exist"):
        resolve_cp(resolve(dataclasses.replace(plan, cp=wrong), model), model)


def _bound(hook: SplitInputs, **kwargs) -> dict:
    """The hook's (args, kwargs) bound back to the block's parameter names."""
    args, kwargs = hook(None, (), kwargs)
    return dict(hook.binder.signature.bind(*args, **kwargs).arguments)


def test_segmented_split_lines_up_with_each_ranks_tokens():
    """Mask [B, 1, 1, 24 video + 8 text] at cp=2: rank r keeps video[12r:12r+12] then text[4r:4r+4]."""

    class Block(torch.nn.Module):
        def forward(self, hidden_states, encoder_hidden_states, attention_mask):
            return attention_mask

    rules = [
        SplitRule("b", "hidden_states", 1),
        SplitRule("b", "encoder_hidden_states", 1),
        SplitRule("b", "attention_mask", 3, 4, segments=("hidden_states", "encoder_hidden_states")),
    ]
    mask = torch.arange(32.0).view(1, 1, 1, 32)
    video, text = mask[..., :24], mask[..., 24:]
    for rank in range(2):
        hook = SplitInputs("b", Block(), rules, rank, 2)
        kwargs = _bound(
            hook, hidden_states=torch.zeros(1, 24, 3), encoder_hidden_states=torch.zeros(1, 8, 3), attention_mask=mask
        )
        expected = torch.cat([video.chunk(2, dim=3)[rank], text.chunk(2, dim=3)[rank]], dim=3)
        assert torch.equal(kwargs["attention_mask"], expected)
        # at a later block (mask rule only) the streams arrive local already: the same cut
        again = _bound(
            SplitInputs("b", Block(), rules[2:], rank, 2),
            hidden_states=torch.zeros(1, 12, 3),
            encoder_hidden_states=torch.zeros(1, 4, 3),
            attention_mask=mask,
        )
        assert torch.equal(again["attention_mask"], expected)


def test_segment_lengths_that_do_not_add_up_are_a_forward_error():
    class Block(torch.nn.Module):
        def forward(self, hidden_states, encoder_hidden_states, attention_mask):
            return attention_mask

    rule = SplitRule("b", "attention_mask", 1, segments=("hidden_states", "encoder_hidden_states"))
    hook = SplitInputs("b", Block(), [rule], 0, 2)
    with pytest.raises(ForwardError, match="not the 24 \\+ 8"):
        hook(None, (torch.zeros(1, 12, 3), torch.zeros(1, 4, 3), torch.ones(1, 30)), {})


def test_split_mask_reduces_expanded_and_outer_product_masks():
    valid = torch.tensor([[True, True, False, True]])
    expanded = valid[:, None, None, :].expand(1, 3, 4, 4)  # per key, expanded over heads and queries
    keys, rows = split_mask(expanded, 1, 4)
    assert torch.equal(keys, valid) and rows is None
    outer = (valid[:, None, :] & valid[:, :, None])[:, None]  # Chroma: valid_q & valid_k
    keys, rows = split_mask(outer, 1, 4)
    assert torch.equal(keys, valid) and torch.equal(rows, ~valid)
    causal = torch.ones(4, 4, dtype=torch.bool).tril()[None, None]
    with pytest.raises(ForwardError, match="neither"):
        split_mask(causal, 1, 4)


def test_length_cp_does_not_divide_is_refused_naming_it():
    """Without `pad`, 226 tokens at cp=4 are a ForwardError naming 226 and 4 (and the next multiple, 228)."""
    with pytest.raises(ForwardError, match=r"226.*cp degree 4.*228"):
        local_chunk(torch.zeros(1, 226, 2), 1, 0, 4, "text")


def test_padded_chunks_are_the_zero_padded_tensor_cut_in_rank_order():
    """226 tokens, cp=4: chunks of 57 (= torch.cat([x, zeros(2)]).chunk(4)); valid 57, 57, 57, 55."""
    x = torch.arange(226.0).reshape(1, 226, 1)
    expected = torch.cat([x, torch.zeros(1, 2, 1)], dim=1).chunk(4, dim=1)
    pieces = [padded_chunk(x, 1, rank, 4, "text") for rank in range(4)]
    assert all(torch.equal(chunk, e) for (chunk, _), e in zip(pieces, expected))
    assert [valid for _, valid in pieces] == [57, 57, 57, 55]
