"""How LoRA factors are cut per rank (dtp.adapters.shard) and how bad LoRAs are refused (dtp.adapters.keys)."""

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from torch import nn

from dtp import PlanError
from dtp.adapters.keys import check_lora, peft_view
from dtp.adapters.shard import local_tensor, split_part
from dtp.plan import Rule, Style
from dtp.resolve.binding.linears import LinearSpec

RANK = 3


def independent_piece(full: torch.Tensor, dim: int, sizes, tp: int, rank: int) -> torch.Tensor:
    """Rank `rank`'s piece built without dtp: per block, chunk(tp)[rank], concatenated in block order."""
    return torch.cat([block.chunk(tp, dim)[rank] for block in full.split(list(sizes), dim)], dim)


def spec_of(style: Style, sizes) -> LinearSpec:
    return LinearSpec("layer", Rule("layer", style, tuple(sizes) if style.is_packed else None), tuple(sizes), False)


def merged_piece(spec: LinearSpec, a: torch.Tensor, b: torch.Tensor, tp: int, rank: int) -> torch.Tensor:
    """What peft's merge adds on this rank: local B @ local A (each factor cut by `local_tensor`)."""
    return local_tensor(spec, "lora_B", "weight", b, tp, rank) @ local_tensor(spec, "lora_A", "weight", a, tp, rank)


@settings(max_examples=40, deadline=None)
@given(
    style=st.sampled_from([s for s in Style if s.shard_dim in (0, 1)]),  # `experts` (3-D weights) takes no LoRA
    units=st.lists(st.integers(1, 3), min_size=1, max_size=4),
    tp=st.sampled_from([1, 2, 4]),
    data=st.data(),
)
def test_merged_adapter_piece_is_the_base_weights_piece(style, units, tp, data):
    """B_r @ A_r equals this rank's piece of B @ A under the base's own layout, for every style and block set."""
    assume(style.is_packed or len(units) == 1)
    sizes = [u * tp * 2 for u in units]
    rank = data.draw(st.integers(0, tp - 1))
    spec = spec_of(style, sizes)
    other = 5 * tp  # the unsplit dim of the base weight
    out_features, in_features = (sum(sizes), other) if style.shard_dim == 0 else (other, sum(sizes))
    a, b = torch.randn(RANK, in_features), torch.randn(out_features, RANK)
    expected = independent_piece(b @ a, style.shard_dim, sizes, tp, rank)
    torch.testing.assert_close(merged_piece(spec, a, b, tp, rank), expected)


def test_one_block_cut_of_a_packed_factor_is_wrong():
    """The edge case the per-block rule exists for: blocks [8, 24] at tp=2, cut as one block of 32."""
    sizes, tp, rank = (8, 24), 2, 1
    a, b = torch.randn(RANK, 10), torch.randn(32, RANK)
    expected = independent_piece(b @ a, 0, sizes, tp, rank)
    per_block = merged_piece(spec_of(Style.PACKED_COLWISE, sizes), a, b, tp, rank)
    one_block = merged_piece(spec_of(Style.COLWISE, (32,)), a, b, tp, rank)
    torch.testing.assert_close(per_block, expected)
    assert not torch.allclose(one_block, expected)


@pytest.mark.parametrize(
    "style, part", [(Style.COLWISE, "lora_B"), (Style.COLWISE_GATHERED, "lora_B"), (Style.ROWWISE, "lora_A")]
)
def test_the_split_factor_is_on_the_bases_split_side(style, part):
    assert split_part(spec_of(style, (8,))) == part


class Toy(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(8, 6)
        self.norm = nn.LayerNorm(6)


def lora(**overrides):
    state_dict = {
        "transformer.proj.lora_A.weight": torch.zeros(2, 8),
        "transformer.proj.lora_B.weight": torch.zeros(6, 2),
    }
    return peft_view({**state_dict, **overrides}, "transformer")


@pytest.mark.parametrize(
    "overrides, words",
    [
        ({"transformer.blocks.0.proj.lora_A.weight": torch.zeros(2, 8)}, ["blocks.0.proj", "no module"]),
        ({"transformer.proj.lora_B.weight": torch.zeros(3, 2)}, ["proj.lora_B.weight", "[3, 2]", "[6, 2]"]),
        ({"transformer.proj.lora_B.weight": torch.zeros(6, 4)}, ["rank 2", "[6, 2]"]),
        ({"transformer.norm.lora_A.weight": torch.zeros(2, 6)}, ["LayerNorm", "nn.Linear"]),
        ({"transformer.proj.lora_magnitude_vector": torch.zeros(6)}, ["lora_magnitude_vector", "DoRA"]),
    ],
)
def test_bad_lora_is_a_plan_error_naming_the_key(overrides, words):
    with pytest.raises(PlanError) as error:
        check_lora(Toy(), lora(**overrides), "x", "transformer")
    assert all(word in str(error.value) for word in words), str(error.value)


def test_good_lora_names_its_targets_and_rank():
    (target,) = check_lora(Toy(), lora(), "x", "transformer")
    assert (target.path, target.rank) == ("proj", 2)


def test_old_diffusers_names_are_converted_by_diffusers():
    old = {"transformer.proj.lora.down.weight": torch.zeros(2, 8), "transformer.proj.lora.up.weight": torch.zeros(6, 2)}
    assert sorted(peft_view(old, "transformer")) == ["proj.lora_A.weight", "proj.lora_B.weight"]


def test_a_peft_that_sizes_from_full_features_is_refused_before_loading(monkeypatch):
    """On a (fake) tp=2 FLUX.1, a peft that would size adapters from full features: PlanError, no adapter."""
    import peft.tuners.tuners_utils

    import dtp
    from dtp.analysis.fakepg import fake_world
    from dtp.testing.tiny import tiny_model

    monkeypatch.setattr(peft.tuners.tuners_utils, "_get_in_out_features", lambda m: (m.in_features, m.out_features))
    with fake_world(2):
        model = dtp.parallelize(tiny_model("FluxTransformer2DModel"), dtp.make_mesh(tp=2, device_type="cpu"))
        q = model.transformer_blocks[0].attn.to_q
        lora = {"transformer.transformer_blocks.0.attn.to_q.lora_A.weight": torch.zeros(2, q.in_features)}
        lora["transformer.transformer_blocks.0.attn.to_q.lora_B.weight"] = torch.zeros(q.out_features, 2)
        with pytest.raises(PlanError, match="local shard"):
            dtp.load_lora(model, lora, adapter_name="x")
        to_q = model.transformer_blocks[0].attn.to_q
        assert not hasattr(model, "peft_config") and isinstance(to_q, nn.Linear) and not hasattr(to_q, "lora_A")
