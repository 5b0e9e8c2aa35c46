"""pad=True without processes: the padded Layout, the padding rules, the refusal, candidates, `dtp check --pad`."""

import pytest
import torch
import torch.nn.functional as F
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from torch import nn

import dtp
from dtp.engine import prepare
from dtp.resolve import resolve
from dtp.resolve.binding.heads import AttentionSpec
from dtp.resolve.layout import Layout, rank_pieces
from dtp.resolve.transforms.padding import head_padding, pad_resolved, round_up
from dtp.testing.tiny import tiny_model

ZIMAGE30 = dict(dim=240, n_heads=30, n_kv_heads=30, axes_dims=[4, 2, 2])


# ---------------------------------------------------------------------------------------------
# Layout with padded blocks


def reference_piece(tensor, dim, sizes, padded, tp, rank):
    """Independent construction: zero-pad each block to its padded size, `chunk(tp)[rank]` of each, concatenated."""
    blocks = torch.split(tensor, list(sizes), dim=dim)
    pieces = []
    for block, size in zip(blocks, padded):
        shape = list(block.shape)
        shape[dim] = size - block.shape[dim]
        padded_block = torch.cat([block, block.new_zeros(shape)], dim=dim)
        pieces.append(torch.chunk(padded_block, tp, dim=dim)[rank])
    return torch.cat(pieces, dim=dim)


@settings(max_examples=200, deadline=None)
@given(
    blocks=st.lists(st.integers(1, 13), min_size=1, max_size=4),
    extra=st.lists(st.integers(0, 2), min_size=4, max_size=4),
    tp=st.integers(1, 6),
    dim=st.integers(0, 1),
)
def test_padded_slices_match_independent_construction_and_reassemble(blocks, extra, tp, dim):
    """Every rank's piece equals pad-then-chunk per block; the pieces reassemble the original exactly."""
    padded = tuple(round_up(b, tp) + e * tp for b, e in zip(blocks, extra))
    assume(padded != tuple(blocks))  # the padded case (the unpadded one is test_slicing's)
    shape = [sum(blocks), 3] if dim == 0 else [3, sum(blocks)]
    tensor = torch.randn(shape)
    layout = Layout(dim, tuple(blocks), padded)
    pieces = [layout.local_slice(tensor, tp, r) for r in range(tp)]
    for rank, piece in enumerate(pieces):
        assert torch.equal(piece, reference_piece(tensor, dim, blocks, padded, tp, rank))
        assert tuple(piece.shape) == layout.local_shape(shape, tp)
    assert torch.equal(layout.assemble(pieces), tensor)


def test_padded_layout_worked_example():
    """30 heads of width 4 at tp=4 -> 32 heads: ranks 0-2 real rows only, rank 3 rows 96:120 and 8 zero rows."""
    assert rank_pieces((120,), 4, 0, padded=(128,)) == [(0, 32, 0)]
    assert rank_pieces((120,), 4, 3, padded=(128,)) == [(96, 120, 8)]
    # A rank can hold only padding of a block: 6 heads padded to 8 at tp=4 (rank 3: heads 6, 7).
    assert rank_pieces((6, 10), 4, 3, padded=(8, 12)) == [(6, 6, 2), (15, 16, 2)]
    weight = torch.arange(12.0).reshape(6, 2)
    assert torch.equal(Layout(0, (6,), (8,)).local_slice(weight, 4, 3), torch.zeros(2, 2))


def test_padded_slice_reads_only_real_rows_off_disk(tmp_path):
    """A safetensors slice: the real rows come from the file, the zero rows are made (same dtype)."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    weight = torch.randn(6, 5, dtype=torch.bfloat16)
    save_file({"w": weight}, tmp_path / "w.safetensors")
    layout = Layout(1, (2, 3), (3, 6))
    with safe_open(tmp_path / "w.safetensors", framework="pt") as handle:
        pieces = [layout.local_slice(handle.get_slice("w"), 3, r) for r in range(3)]
    assert all(p.dtype == torch.bfloat16 and p.shape == (6, 3) for p in pieces)
    assert torch.equal(layout.assemble(pieces), weight)


# ---------------------------------------------------------------------------------------------
# the rules


def padded_sizes(resolved, suffix):
    return {s.sizes: s.padded_sizes for s in resolved.linears if s.path.endswith(suffix)}


def test_zimage_30_heads_pad_to_32_at_tp4():
    model = tiny_model("ZImageTransformer2DModel", **ZIMAGE30)
    padding = pad_resolved(resolve(dtp.load_plan("zimage"), model), model, 4)
    assert {(h.heads, h.padded_heads, h.head_dim) for h in padding.heads} == {(30, 32, 8)}
    assert padded_sizes(padding.resolved, "attention.to_q") == {(240,): (256,)}
    assert padded_sizes(padding.resolved, "attention.to_out.0") == {(240,): (256,)}
    assert padded_sizes(padding.resolved, "feed_forward.w2") == {(640,): (640,)}  # 4 divides the FFN
    local = {"heads": 8, "inner_dim": 64, "inner_kv_dim": 64, "out_dim": 64}  # out_dim = the q width: per rank too
    assert padding.resolved.attention[0].local_values(4) == local
    # tp=2 divides everything: padding changes nothing.
    assert pad_resolved(resolve(dtp.load_plan("zimage"), model), model, 2).is_noop


def test_flux_tp3_pads_packed_blocks_ffn_and_gathered_widths():
    """FLUX.1 tiny (4 heads of 16, MLP 256) at tp=3: heads -> 6; proj_out [attn 64 | mlp 256] -> [96 | 258]."""
    model = tiny_model("FluxTransformer2DModel")
    padded = pad_resolved(resolve(dtp.load_plan("flux"), model), model, 3).resolved
    assert padded_sizes(padded, "single_transformer_blocks.0.proj_out") == {(64, 256): (96, 258)}
    assert padded_sizes(padded, "single_transformer_blocks.0.proj_mlp") == {(256,): (258,)}
    assert padded_sizes(padded, "transformer_blocks.0.ff.net.2") == {(256,): (258,)}
    assert padded_sizes(padded, "context_embedder") == {(64,): (66,)}  # gathered: trimmed after the gather
    assert padded.constraints and all(c.value % 3 == 0 for c in padded.constraints)


class GqaAttention(nn.Module):
    """Bare GQA attention (no head_dim / inner_dim): 6 q heads, 2 kv heads of width 4."""

    def __init__(self):
        super().__init__()
        self.heads, self.kv_heads = 6, 2
        self.to_q, self.to_k, self.to_v = nn.Linear(8, 24), nn.Linear(8, 8), nn.Linear(8, 8)
        self.to_out = nn.ModuleList([nn.Linear(24, 8)])


class GqaModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([GqaAttention()])


GQA_PLAN = {f"blocks.*.{n}": "colwise" for n in ("to_q", "to_k", "to_v")} | {"blocks.*.to_out.0": "rowwise"}


@pytest.mark.parametrize("tp, kv, q", [(2, 2, 6), (3, 3, 9), (4, 4, 12), (5, 5, 15)])
def test_gqa_pads_kv_heads_and_keeps_groups(tp, kv, q):
    """q head i reads kv head i // 3: kv heads pad to a multiple of tp, q heads to 3 x that (appended)."""
    model = GqaModel()
    padding = pad_resolved(resolve(dtp.Plan.from_dict(GQA_PLAN), model), model, tp)
    (heads,) = padding.heads
    assert (heads.head_dim, heads.padded_kv_heads, heads.padded_heads) == (4, kv, q)
    assert padded_sizes(padding.resolved, "to_k") == {(8,): (4 * kv,)}
    assert padded_sizes(padding.resolved, "to_out.0") == {(24,): (4 * q,)}


def test_gqa_padded_ranks_sum_to_the_unsharded_output():
    """Exactness of the GQA rule without processes: per rank, attention on its padded heads, out-projection
    of its columns; the sum over ranks equals the unsharded output (tp=4: 12 q / 4 kv heads, 2 of them zero)."""
    torch.manual_seed(0)
    model, tp = GqaModel(), 4
    attn = model.blocks[0]
    x = torch.randn(2, 5, 8)
    padded = pad_resolved(resolve(dtp.Plan.from_dict(GQA_PLAN), model), model, tp).resolved
    layouts = padded.param_layouts()

    def attention(q, k, v, heads, kv_heads):
        q, k, v = (t.unflatten(-1, (n, -1)).transpose(1, 2) for t, n in ((q, heads), (k, kv_heads), (v, kv_heads)))
        return F.scaled_dot_product_attention(q, k, v, enable_gqa=True).transpose(1, 2).flatten(2)

    def piece(name, param, rank):
        return layouts[f"blocks.0.{name}.{param}"].local_slice(attn.get_submodule(name).get_parameter(param), tp, rank)

    with torch.no_grad():
        full = attn.to_out[0](attention(attn.to_q(x), attn.to_k(x), attn.to_v(x), 6, 2))
        total = attn.to_out[0].bias.clone()
        local = padded.attention[0].local_values(tp)
        for rank in range(tp):
            qkv = [F.linear(x, piece(n, "weight", rank), piece(n, "bias", rank)) for n in ("to_q", "to_k", "to_v")]
            heads = attention(*qkv, local["heads"], local["kv_heads"])
            total = total + F.linear(heads, piece("to_out.0", "weight", rank))
    torch.testing.assert_close(total, full, rtol=1e-5, atol=1e-6)


def test_gqa_groups_must_be_whole():
    model = GqaModel()
    model.blocks[0].kv_heads = 4  # 6 q heads over 4 kv heads: no whole groups
    model.blocks[0].to_k, model.blocks[0].to_v = nn.Linear(8, 16), nn.Linear(8, 16)
    with pytest.raises(dtp.PlanError, match="6 query heads are not a multiple of 4 kv heads"):
        pad_resolved(resolve(dtp.Plan.from_dict(GQA_PLAN), model), model, 4)


# ---------------------------------------------------------------------------------------------
# the engine: refusal, candidates, cp


def test_refusal_without_pad_suggests_it(fake_world):
    """Z-Image tiny with 30 heads at tp=4: refused, the message names pad=True and its degrees 1..30."""
    model = tiny_model("ZImageTransformer2DModel", **ZIMAGE30)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    mesh = dtp.make_mesh(tp=4, device_type="cpu")
    every = ", ".join(map(str, range(1, 31)))
    message = rf"heads of .*=30.*Supported tp: 1, 2, 5, 10\. Or pass pad=True.*{every}\."
    with pytest.raises(dtp.PlanError, match=message):
        dtp.parallelize(model, mesh, dtp.load_plan("zimage"))
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    assert prepare(model, mesh, dtp.load_plan("zimage"), pad=True).padding.heads[0].padded_heads == 32


def test_tp_candidates_with_pad_full_size_zimage():
    """Z-Image 6B (30 heads): [1, 2, 5, 10] without padding; every degree 1..30 with it (also under Ulysses cp=2)."""
    from diffusers import ZImageTransformer2DModel

    with torch.device("meta"):
        model = ZImageTransformer2DModel()
    assert dtp.tp_candidates(model) == [1, 2, 5, 10]
    assert dtp.tp_candidates(model, pad=True) == list(range(1, 31))
    assert dtp.tp_candidates(model, cp=2, pad=True) == list(range(1, 31))


def test_ulysses_pads_heads_to_tp_times_cp(fake_world):
    """FLUX.1 tiny with 6 heads on (cp=2, tp=2): 3 heads per rank blocks Ulysses; padded to 8 they divide."""
    model = tiny_model("FluxTransformer2DModel", num_attention_heads=6)
    mesh = dtp.make_mesh(tp=2, cp=2, device_type="cpu")
    with pytest.raises(dtp.PlanError, match=r"Ulysses needs \(heads / tp\) % cp == 0"):
        prepare(model, mesh, dtp.load_plan("flux"))
    prepared = prepare(model, mesh, dtp.load_plan("flux"), pad=True)
    assert {h.padded_heads for h in prepared.padding.heads} == {8}
    assert {s.local_heads(2) for s in prepared.cp_resolved.attention} == {4}
    # ring attention has no head constraint: padding to a multiple of tp (6 heads, tp=2) is none.
    assert prepare(model, mesh, dtp.load_plan("flux"), cp_mode="ring", pad=True).padding.is_noop


@settings(max_examples=200, deadline=None)
@given(kv=st.integers(1, 40), group=st.integers(1, 4), head_dim=st.integers(1, 16), tp=st.integers(1, 16))
def test_head_padding_is_minimal_and_keeps_groups(kv, group, head_dim, tp):
    """kv' is the least multiple of tp >= kv; q' = kv' x group; widths follow the heads (GQA and MHA, group 1)."""
    heads = kv * group
    spec = AttentionSpec("attn", "attn", (("heads", heads), ("kv_heads", kv), ("inner_dim", heads * head_dim)))
    padding = head_padding(spec, nn.Module(), tp, "p")
    assert padding.padded_kv_heads % tp == 0 and 0 <= padding.padded_kv_heads - kv < tp
    assert padding.padded_heads == padding.padded_kv_heads * group
    assert padding.pad_width(heads * head_dim, tp) == padding.padded_heads * head_dim
    assert padding.pad_width(kv * head_dim, tp) == padding.padded_kv_heads * head_dim
    assert padding.head_dim == head_dim


def test_head_padding_without_kv_heads_is_plain():
    """MHA (no kv count): heads pad to the least multiple of tp, kv heads with them."""
    spec = AttentionSpec("attn", "attn", (("heads", 30), ("inner_dim", 3840)))
    padding = head_padding(spec, nn.Module(), 8, "p")
    assert (padding.heads, padding.padded_heads, padding.padded_kv_heads, padding.head_dim) == (30, 32, 32, 128)
