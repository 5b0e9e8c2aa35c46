"""The loader's FSDP math (`loading/fsdp.py`) against an independent construction: FSDP2's own rule,
`torch.chunk(tp_slice, fsdp, dim=0)[f]`, of the TP slice `Layout.local_slice` cuts (block-wise, padded, shared)."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dtp.loading.fsdp import fsdp_rows, fsdp_slice, window
from dtp.resolve.layout import Layout


def expected(full: torch.Tensor, layout, tp: int, tp_rank: int, fsdp: int, fsdp_rank: int) -> torch.Tensor:
    """FSDP2's shard: torch.chunk of the TP slice, padded with an empty chunk past the last one."""
    local = full if layout is None else layout.local_slice(full, tp, tp_rank)
    chunks = torch.chunk(local, fsdp, dim=0)
    return chunks[fsdp_rank] if fsdp_rank < len(chunks) else local[:0]


@st.composite
def cases(draw):
    tp = draw(st.sampled_from([1, 2, 4]))
    fsdp = draw(st.integers(1, 5))
    kind = draw(st.sampled_from(["whole", "rows", "cols", "padded", "shared"]))
    blocks = tuple(draw(st.lists(st.integers(1, 3), min_size=1, max_size=3)))
    sizes = tuple(b * tp for b in blocks)
    width = draw(st.integers(1, 3)) * tp
    if kind == "whole":
        layout, shape = None, (draw(st.integers(1, 9)), width)
    elif kind == "rows":
        layout, shape = Layout(0, sizes), (sum(sizes), width)
    elif kind == "cols":
        layout, shape = Layout(1, sizes), (draw(st.integers(1, 9)), sum(sizes))
    elif kind == "padded":  # real blocks one row short of a multiple of tp: the last rank pads each with zeros
        real = tuple(max(s - 1, 1) for s in sizes)
        layout, shape = Layout(0, real, sizes), (sum(real), width)
    else:  # kv heads shared by 2 ranks
        tp = max(tp, 2)
        layout, shape = Layout(0, (tp // 2 * 3,), replicas=2), (tp // 2 * 3, width)
    return layout, shape, tp, draw(st.integers(0, tp - 1)), fsdp, draw(st.integers(0, fsdp - 1))


@settings(max_examples=300, deadline=None)
@given(cases())
def test_fsdp_slice_is_the_chunk_of_the_tp_slice(case):
    layout, shape, tp, tp_rank, fsdp, fsdp_rank = case
    full = torch.arange(float(torch.Size(shape).numel())).reshape(shape) + 1  # no zero: padding shows
    got = fsdp_slice(full, layout, tp, tp_rank, fsdp, fsdp_rank)
    torch.testing.assert_close(got, expected(full, layout, tp, tp_rank, fsdp, fsdp_rank), rtol=0, atol=0)


def test_worked_examples():
    """The docstrings' examples: chunk rows and a window over two row pieces."""
    assert fsdp_rows(5, 2, 1) == (3, 5) and fsdp_rows(1, 2, 1) == (1, 1)
    assert window([(1, 2, 0), (4, 6, 0)], 0, 2) == [(1, 2, 0), (4, 5, 0)]
    assert window([(1, 2, 0), (4, 6, 0)], 2, 3) == [(5, 6, 0)]
    assert window([(96, 120, 8)], 20, 32) == [(116, 120, 8)]


def test_reads_only_the_shard_from_a_safetensors_slice(tmp_path):
    """From a file, through `get_slice`: the same shard, and only its rows are read."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    full = torch.arange(48.0).reshape(8, 6)
    save_file({"w": full}, tmp_path / "w.safetensors")
    with safe_open(tmp_path / "w.safetensors", framework="pt") as handle:
        got = fsdp_slice(handle.get_slice("w"), Layout(1, (6,)), 2, 1, 2, 1)
    torch.testing.assert_close(got, full[4:8, 3:6])
