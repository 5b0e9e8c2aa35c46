"""FSDP's units and prefetch windows (`runtime/fsdp.py`): the rule on sizes, the forward order, the bytes in flight.

- after the first call the prefetch windows follow the order the units ran in (recorded with forward pre-hooks on a
  tiny model of each parity family, and of two whose units run out of registration order), one forward each;
- `in_flight` against an independent simulation of FSDP2 with windows (gather on issue or on first use, free after
  the unit runs), for any sizes (hypothesis), and its bound (the largest unit + max(cap, largest));
- FLUX.1-dev at full size (meta): the double blocks split (0.68 GB > 2 x 0.28 GB), the single ones not, and in
  flight 2 x a single block.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from dtp.analysis.fakepg import fake_world, meta_model
from dtp.runtime.fsdp import LAYOUT_ATTR, SPLIT_RATIO, apply_fsdp, in_flight, prefetch_windows, unit_layout
from dtp.testing.tiny import tiny_inputs, tiny_model

OUT_OF_ORDER = ("WanAnimateTransformer3DModel",)  # gathering units run out of registration order
# Chroma's guidance layers alternate between two lists (`layers`, `norms`), but its norms hold vectors only: units that
# gather nothing since the vectors stay whole (runtime/fsdp.fsdp_shards), so its gathering units now run in order.
IN_ORDER_NOW = ("ChromaTransformer2DModel",)
FAMILIES = (
    "FluxTransformer2DModel",
    "Flux2Transformer2DModel",
    "QwenImageTransformer2DModel",
    "WanTransformer3DModel",
    "HunyuanVideoTransformer3DModel",
    "LTXVideoTransformer3DModel",
)


def _simulated_peak(sizes: list[int], windows: list[range]) -> int:
    """FSDP2 with explicit prefetch, by hand, over two calls: the root issues windows[0]; each unit is gathered if
    nothing issued it and copied out of its all-gather buffer (buffer and parameters both alive: counted, then the
    buffer freed), issues its window (itself excepted: it is gathered), runs (the bytes alive are counted), and is
    freed."""
    alive: set[int] = set(windows[0])
    peak = sum(sizes[j] for j in alive)
    for i in list(range(len(sizes))) * 2:
        alive |= {i}
        peak = max(peak, sum(sizes[j] for j in alive) + sizes[i])  # the copy-out: unit i twice
        alive |= set(windows[i + 1])
        peak = max(peak, sum(sizes[j] for j in alive))
        alive.discard(i)
    return peak


@given(st.lists(st.integers(1, 100), min_size=1, max_size=30), st.integers(1, 150))
def test_in_flight_is_the_simulated_peak(sizes, cap):
    """in_flight == the simulation's peak <= the largest unit + max(cap, largest); each window is the units that
    follow, at least one, summing to <= cap when it holds more than one."""
    windows = prefetch_windows(sizes, cap)
    assert len(windows) == len(sizes) + 1 and windows[-1] == windows[0]  # the last unit's: the next call's first
    for start, window in enumerate(windows[:-1]):
        assert window.start == start and len(window) >= 1
        assert len(window) <= 1 or sum(sizes[j] for j in window) <= cap
    largest = max(sizes)
    assert in_flight(sizes, cap) == _simulated_peak(sizes, windows) <= largest + max(cap, largest)


def test_small_units_prefetch_two_ahead():
    """The docstring's FLUX.1-dev example (GB x 100): the two AdaLN units fit one window."""
    windows = prefetch_windows([11, 11, 15, 15, 15, 28], 28)
    assert [list(w) for w in windows] == [[0, 1], [1, 2], [2], [3], [4], [5], [0, 1]]


@pytest.mark.parametrize(
    "cls",
    [
        *("FluxTransformer2DModel", *OUT_OF_ORDER, *IN_ORDER_NOW),  # split blocks; out of registration order
        *(pytest.param(cls, marks=pytest.mark.full) for cls in FAMILIES if cls != "FluxTransformer2DModel"),
    ],
)
def test_windows_follow_the_first_call(cls):
    """After the first call every gathering unit prefetches its window in the order the units ran (recorded here
    with forward pre-hooks of the test's own), and the root the first window. FSDP2 on a fake world of 2 ranks
    (the gathers return garbage; the order does not depend on values)."""
    from torch.distributed.device_mesh import init_device_mesh

    model, inputs = tiny_model(cls), tiny_inputs(cls)
    with fake_world(2):
        apply_fsdp(model, init_device_mesh("cpu", (2,)))
        layout = getattr(model, LAYOUT_ATTR)
        seen: list[str] = []
        for unit in layout.gathered():
            unit.module.register_forward_pre_hook(lambda m, a, path=unit.path: seen.append(path))
        with torch.no_grad():
            model(**inputs)
        paths = {id(u.module._get_fsdp_state()): u.path for u in layout.gathered()}
        sizes = {u.path: u.size for u in layout.gathered()}
        order = list(dict.fromkeys(seen))
        windows = prefetch_windows([sizes[p] for p in order], layout.cap)
        modules = {u.path: u.module for u in layout.gathered()}
        for path, window in zip([None, *order], windows):
            module = model if path is None else modules[path]
            got = [paths[id(state)] for state in module._get_fsdp_state()._states_to_forward_prefetch]
            assert got == [order[j] for j in window if order[j] != path], (path, got)
    if cls in OUT_OF_ORDER:  # the case the relearning exists for
        assert order != [u.path for u in layout.gathered()]
    if cls in IN_ORDER_NOW:
        assert order == [u.path for u in layout.gathered()]


def test_flux_dev_splits_the_double_blocks():
    """FLUX.1-dev bf16: 19 double blocks split into 5 units each (the block itself holds nothing), 38 single blocks
    one unit each; in flight at most two single blocks (0.57 GB) instead of two double blocks (1.36 GB)."""
    layout = unit_layout(meta_model("FluxTransformer2DModel", None, torch.bfloat16))
    double = [u for u in layout.units if u.path.startswith("transformer_blocks.")]
    single = [u for u in layout.units if u.path.startswith("single_transformer_blocks.")]
    assert len(double) == 19 * 6 and sum(u.size == 0 for u in double) == 19
    assert {u.path.split(".")[2] for u in double if u.size} == {"norm1", "norm1_context", "attn", "ff", "ff_context"}
    assert len(single) == 38 and layout.cap == single[0].size  # 0.28 GB
    assert sum(u.size for u in double[:6]) > SPLIT_RATIO * layout.cap  # 0.68 GB
    assert layout.in_flight() == 2 * layout.cap


class _Inner(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.mod = torch.nn.Linear(4, 4)
        self.ff = torch.nn.Linear(4, 4)

    def forward(self, x):
        return self.ff(self.mod(x))


class _Fused(torch.nn.Module):  # Kandinsky 6's fused block: runs its child's children, never the child
    def __init__(self):
        super().__init__()
        self.inner = _Inner()
        self.attn = torch.nn.Linear(4, 4)
        self.helper = torch.nn.Linear(4, 4)

    def forward(self, x):
        fn = self.helper  # called through a name the source does not show: stays in the block's unit
        return self.inner.ff(self.attn(self.inner.mod(x))) + fn(x)


def test_split_units_are_what_the_block_calls():
    """A split block's units are the modules its forward calls: `self.attn(`, and `self.inner.mod(` / `self.inner.ff(`
    where `self.inner(` never runs (its FSDP2 pre-hook would never gather it); `helper` stays in the block's unit.
    The tiny Kandinsky 6's fused blocks split the same way (was: `video_dec_block` a unit, a DTensor in addmm)."""
    from dtp.runtime.fsdp import called_parts

    assert [name for name, _ in called_parts(_Fused())] == ["inner.mod", "inner.ff", "attn"]
    paths = [u.path for u in unit_layout(tiny_model("Kandinsky6Transformer3DModel")).units]
    assert "visual_transformer_blocks.0.video_dec_block.self_attention" in paths, paths
    assert "visual_transformer_blocks.0.video_dec_block" not in paths, paths


@pytest.mark.parametrize(
    "value, kept",
    [(True, True), (False, False), (4, 4), ("4", 4), ("512 mb", "512MB"), ("1.5gib", "1.5GiB"), ("2GB", "2GB")],
)
def test_unit_size_values(value, kept):
    """fsdp= keeps True / False, a number of blocks per unit, or a byte budget (the CLI's strings normalized)."""
    from dtp.runtime.fsdp_unit import check_fsdp_option

    assert check_fsdp_option(value) == kept and type(check_fsdp_option(value)) is type(kept)


@pytest.mark.parametrize("value", [0, -2, "0", "many", "0MB", "3 parsecs", 1.5, None])
def test_unit_size_refusals(value):
    """A unit size that names no block count or byte budget: PlanError saying what fsdp= takes, from Parallelism."""
    from dtp.errors import PlanError
    from dtp.runtime.parallelism import Parallelism

    with pytest.raises(PlanError, match="byte budget per unit"):
        Parallelism(tp=1, cp=1, fsdp=value)


@given(st.lists(st.integers(1, 100), min_size=1, max_size=40), st.integers(1, 9), st.integers(1, 300))
def test_groups_are_consecutive_and_full(sizes, blocks, budget):
    """`group_blocks`: consecutive ranges covering every block once; k blocks each (the last may hold fewer); with a
    budget, each group <= the budget unless one block, and the next block would not have fitted."""
    from dtp.runtime.fsdp_unit import UnitSize, group_blocks

    by_count = group_blocks(sizes, UnitSize(blocks=blocks))
    assert [i for g in by_count for i in g] == list(range(len(sizes)))
    assert all(len(g) == blocks for g in by_count[:-1]) and 1 <= len(by_count[-1]) <= blocks
    by_bytes = group_blocks(sizes, UnitSize(budget=budget))
    assert [i for g in by_bytes for i in g] == list(range(len(sizes)))
    for group, following in zip(by_bytes, by_bytes[1:]):
        total = sum(sizes[i] for i in group)
        assert len(group) == 1 or total <= budget
        assert total + sizes[following.start] > budget


@pytest.mark.parametrize("unit, units, in_flight_gb", [(1, 57, 1.36), (2, 29, 2.72), (4, 15, 5.44), ("1GB", 32, 1.70)])
def test_flux_dev_units_per_size(unit, units, in_flight_gb):
    """FLUX.1-dev bf16: fsdp=k groups k blocks of a list (19 double, 38 single: ceil(19 / k) + ceil(38 / k) units), none
    split; in flight a unit and the next (two double pairs at k=2); "1GB": one double (0.68 GB) or three singles
    (0.85 GB) a unit. Against dtp's units: 133 units, 0.57 GB in flight."""
    model = meta_model("FluxTransformer2DModel", None, torch.bfloat16)
    layout = unit_layout(model, unit)
    assert len(layout.gathered()) == units and all(u.inside is None for u in layout.units)
    assert layout.in_flight() / 1e9 == pytest.approx(in_flight_gb, abs=0.01)
    assert sum(u.size for u in layout.units) == sum(u.size for u in unit_layout(model).units)  # every block counted
