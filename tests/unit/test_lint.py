"""dtp lint: each classic mistake, built on purpose, is found at its module; the bundled plans lint clean."""

from pathlib import Path

import diffusers
import pytest
import torch
import yaml
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from torch import nn

import dtp
from dtp.analysis.check import check
from dtp.analysis.lint import block_of, format_lint, lint, lint_report
from dtp.testing.plans import edited as edit_plan
from dtp.testing.scope import default_family
from dtp.testing.tiny import PLAN_CLASSES, model_class, tiny_inputs, tiny_model


def edited(name: str, changes: dict, attention=None) -> dtp.Plan:
    """Bundled plan `name`, edited (see dtp.testing.plans.edited)."""
    return edit_plan(dtp.load_plan(name), changes, attention)


def findings(cls: str, plan: dtp.Plan) -> set[tuple[str, str]]:
    return {(f.rule, f.path) for f in lint(tiny_model(cls), plan, tiny_inputs(cls))}


def _family(name: str):
    """A kind's family by default (dtp.testing.scope.KINDS); the families that repeat a kind with DTP_FULL=1."""
    return name if default_family(name) else pytest.param(name, marks=pytest.mark.full)


@pytest.mark.parametrize("name", [_family(n) for n in sorted(PLAN_CLASSES)])
def test_bundled_plans_lint_clean(name):
    cls = PLAN_CLASSES[name]
    assert findings(cls, dtp.load_plan(name)) == set()
    diffusers_plan = getattr(model_class(cls), "_tp_plan", None)
    if diffusers_plan:
        assert findings(cls, dtp.Plan.from_dict(diffusers_plan)) == set()


def test_lint_leaves_the_model_untouched():
    cls = "FluxTransformer2DModel"
    model, reference = tiny_model(cls), tiny_model(cls)
    lint(model, dtp.load_plan("flux"), tiny_inputs(cls))
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), reference.state_dict().values()))
    assert not any(hasattr(p, "_dtp_lint_tag") for p in model.parameters())


def test_plain_colwise_swiglu():
    """FLUX.2's fused [gate | up] as plain colwise: Flux2SwiGLU's x[..., :half] cuts inside the one block."""
    plan = edited("flux2", {"transformer_blocks.*.ff.linear_in": "colwise"})
    assert findings("Flux2Transformer2DModel", plan) == {("split_across_blocks", "transformer_blocks.0.ff.linear_in")}


def test_wrong_packed_split():
    """Q, K, V, gate, up = 64, 64, 64, 192, 192 declared as 192, 64, 64, 64, 192: qkv.chunk(3) cuts at 64, 128."""
    wrong = {"style": "packed_colwise", "blocks": [3, 1, 1, 1, 3]}
    plan = edited("flux2", {"single_transformer_blocks.*.attn.to_qkv_mlp_proj": wrong})
    assert findings("Flux2Transformer2DModel", plan) == {
        ("split_across_blocks", f"single_transformer_blocks.{i}.attn.to_qkv_mlp_proj") for i in range(2)
    }


def test_head_bookkeeping_dropped():
    plan = edited("zimage", {}, attention=["noise_refiner.*.attention", "context_refiner.*.attention"])
    assert findings("ZImageTransformer2DModel", plan) == {
        ("heads_not_local", f"layers.{i}.attention") for i in range(2)
    }


def test_colwise_into_a_replicated_linear():
    plan = edited("flux", {"transformer_blocks.*.ff.net.2": None})
    found = lint(tiny_model("FluxTransformer2DModel"), plan, tiny_inputs("FluxTransformer2DModel"))
    assert {(f.rule, f.path) for f in found} == {
        ("unpaired_colwise", f"transformer_blocks.{i}.ff.net.0.proj") for i in range(2)
    }
    assert "the replicated Linear 'transformer_blocks.0.ff.net.2'" in found[0].message


def test_rowwise_fed_by_a_replicated_activation():
    plan = edited("flux", {"transformer_blocks.*.ff.net.0.proj": None})
    assert findings("FluxTransformer2DModel", plan) == {
        ("replicated_rowwise", f"transformer_blocks.{i}.ff.net.2") for i in range(2)
    }


def test_swapped_pair_in_one_block():
    """Block 0's MLP with rowwise first and colwise second (block 1 right): both layers of block 0 are named."""
    changes = {"transformer_blocks.*.ff.net.0.proj": None, "transformer_blocks.*.ff.net.2": None}
    changes.update({"transformer_blocks.0.ff.net.0.proj": "rowwise", "transformer_blocks.0.ff.net.2": "colwise"})
    changes.update({"transformer_blocks.1.ff.net.0.proj": "colwise", "transformer_blocks.1.ff.net.2": "rowwise"})
    found = findings("FluxTransformer2DModel", edited("flux", changes))
    assert ("replicated_rowwise", "transformer_blocks.0.ff.net.0.proj") in found
    assert ("unpaired_colwise", "transformer_blocks.0.ff.net.2") in found
    assert not {path for _, path in found} & {"transformer_blocks.1.ff.net.0.proj", "transformer_blocks.1.ff.net.2"}


def test_plain_rowwise_over_a_cat():
    """FLUX.1's single-stream proj_out takes cat([attn (64), mlp (256)]): plain rowwise mixes them."""
    plan = edited("flux", {"single_transformer_blocks.*.proj_out": "rowwise"})
    assert findings("FluxTransformer2DModel", plan) == {
        ("cat_into_plain_rowwise", f"single_transformer_blocks.{i}.proj_out") for i in range(2)
    }


def test_qk_norm_across_heads():
    """Wan normalizes q and k over inner_dim (all heads): sharding to_q/to_k needs a distributed RMSNorm."""
    torch.manual_seed(0)
    model = diffusers.WanTransformer3DModel(
        patch_size=(1, 2, 2),
        num_attention_heads=4,
        attention_head_dim=16,
        in_channels=4,
        out_channels=4,
        text_dim=32,
        freq_dim=32,
        ffn_dim=64,
        num_layers=1,
        rope_max_seq_len=32,
    ).eval()
    attn = "blocks.*.attn1"
    plan = dtp.Plan.from_dict(
        {
            "attention": [attn],
            "tp": {
                f"{attn}.to_q": "colwise",
                f"{attn}.to_k": "colwise",
                f"{attn}.to_v": "colwise",
                f"{attn}.to_out.0": "rowwise",
            },
        }
    )
    inputs = dict(
        hidden_states=torch.randn(1, 4, 1, 8, 8),
        timestep=torch.rand(1),
        encoder_hidden_states=torch.randn(1, 8, 32),
        return_dict=False,
    )
    found = {(f.rule, f.path) for f in lint(model, plan, inputs)}
    assert found == {("norm_across_heads", "blocks.0.attn1.to_q"), ("norm_across_heads", "blocks.0.attn1.to_k")}


class Fused(nn.Module):
    """up (fused blocks) -> torch.split at `cuts` -> x2 each -> cat -> down: exact under TP iff the cuts are blocks."""

    def __init__(self, cuts):
        super().__init__()
        self.cuts = list(cuts)
        self.up = nn.Linear(4, sum(cuts))
        self.down = nn.Linear(sum(cuts), 4)

    def forward(self, x):
        return self.down(torch.cat([p * 2 for p in torch.split(self.up(x), self.cuts, dim=-1)], dim=-1))


widths = st.lists(st.integers(1, 4).map(lambda n: 2 * n), min_size=1, max_size=4)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(blocks=widths, data=st.data())
def test_split_finding_iff_a_cut_is_not_a_block_boundary(blocks, data):
    """Property: split_across_blocks is reported exactly when some cut offset is not a block boundary."""
    total = sum(blocks)
    inner = data.draw(st.sets(st.sampled_from(range(2, total, 2)), max_size=4) if total > 2 else st.just(set()))
    offsets = sorted(inner | {0, total})
    cuts = [b - a for a, b in zip(offsets, offsets[1:])]
    bounds = {sum(blocks[:i]) for i in range(len(blocks) + 1)}
    assume(len(cuts) > 1 or len(blocks) > 1)  # one piece over one block has nothing to decide
    plan = dtp.Plan.from_dict(
        {"up": {"style": "packed_colwise", "blocks": blocks}, "down": {"style": "packed_rowwise", "blocks": cuts}}
    )
    rules = {f.rule for f in lint(Fused(cuts), plan, {"x": torch.randn(2, 4)})}
    assert ("split_across_blocks" in rules) == (not set(offsets) <= bounds)


def test_split_property_has_both_outcomes():
    """The edge cases the property must separate, built explicitly: same cuts (clean), a cut inside a block."""
    clean = dtp.Plan.from_dict(
        {"up": {"style": "packed_colwise", "blocks": [2, 6]}, "down": {"style": "packed_rowwise", "blocks": [2, 6]}}
    )
    assert lint(Fused([2, 6]), clean, {"x": torch.randn(2, 4)}) == []
    inside = dtp.Plan.from_dict(
        {"up": {"style": "packed_colwise", "blocks": [4, 4]}, "down": {"style": "packed_rowwise", "blocks": [2, 6]}}
    )
    assert [f.rule for f in lint(Fused([2, 6]), inside, {"x": torch.randn(2, 4)})] == ["split_across_blocks"]


def test_dtp_check_reports_the_lint(tmp_path):
    """`dtp check` lints on the tiny model: bundled plan clean; a wrong packed split (passes the checks) found."""
    assert check("flux2", tp=2, forward=False)["lint"] == {"findings": [], "note": None}
    data = yaml.safe_load((Path(dtp.__file__).parents[1] / "plans" / "flux2.yaml").read_text())
    data["tp"]["single_transformer_blocks.*.attn.to_qkv_mlp_proj"] = {
        "style": "packed_colwise",
        "blocks": [3, 1, 1, 1, 3],
    }
    path = tmp_path / "wrong.yaml"
    path.write_text(yaml.safe_dump(data))
    # Since issue 26 `prepare` refuses it (the Linear declares other blocks); the lint still explains it.
    with pytest.raises(dtp.PlanError, match="declares blocks"):
        check(str(path), tp=2, forward=False)
    report = lint_report("Flux2Transformer2DModel", dtp.load_plan(str(path)))
    assert [f["rule"] for f in report["findings"]] == ["split_across_blocks"] * 2
    assert "[split_across_blocks] single_transformer_blocks.0.attn.to_qkv_mlp_proj" in "\n".join(format_lint(report))


def test_a_list_of_layers_is_not_a_list_of_blocks():
    """Pairing scope (`block_of`): the element of a list of repeated blocks; a diffusers FeedForward's `net`
    ([GELU, Dropout, Linear]) is a list of layers, so its `net.0.proj` and `net.2` share the FeedForward's scope
    outside any block list (Wan Animate's image embedder), and two blocks of one list stay apart."""
    from diffusers.models.attention import FeedForward

    model = nn.Module()
    model.ff = FeedForward(8, mult=2)
    model.blocks = nn.ModuleList([FeedForward(8, mult=2) for _ in range(2)])
    assert block_of(model, "ff.net.0.proj") == block_of(model, "ff.net.2") == ""
    assert block_of(model, "blocks.0.net.0.proj") == block_of(model, "blocks.0.net.2") == "blocks.0"
    assert block_of(model, "blocks.1.net.2") == "blocks.1"
