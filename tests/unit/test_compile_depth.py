"""Regional compile compiles a block class a fixed number of times, however deep the model: tiny FLUX.1 on a fake
process group of 2 ranks (4 for tp x cp; no collectives run; the graphs are what matters), `compile_blocks` with
dynamo's eager backend, two calls, at 2 + 2 blocks and at 4 + 6. The graphs must not grow with the depth: FLUX.1-dev
has 19 + 38 blocks and dynamo gives up on a function after 8 recompiles (`recompile_limit`), which `fullgraph=True`
makes an error. Each depth holds at least two blocks of each class, so a first block's own graph shows at both.

Measured (torch 2.13, both depths and at 19 + 38 too): tp=2, Ulysses, ring and fsdp=2 (2 blocks a unit, none
split) 3 graphs (2 block classes; the first single block recompiles once: its input, a concatenation, has other
strides), none in the second call.
fsdp=True: 8 graphs at every depth. The double blocks are split into FSDP units (`runtime/fsdp.unit_layout`), so the
regions are 4 classes of unit: AdaLayerNormZero 3 graphs (image tokens; text tokens, a new length, so dynamic
sizes; the first block's text tokens are a view (the context embedder's output), which that dynamic graph guards on
through `x._base`, so the next block's compiles once more), FeedForward 2 (image, text), FluxAttention 1, the
single block 2. tp=2 x cp=2 with fsdp=True: 7 (the text tokens come out of TP's context embedder whole, not a
view). The FSDP2 subclass of a unit (`FSDPAdaLayerNormZero`) is one class for every instance, and its
hooks run outside the compiled `forward`: no guard differs between units of one class.

Bound: at most 2 graphs per region class in all (the first call's recompiles), and the same count at both depths.
Negative control (`test_a_guard_per_block_grows_with_the_depth`): the history of CP's attention scope, popped by a
forward hook registered with `always_call=True` on every attention module, which dynamo guarded on by the hook's id
(`___dict_contains(<id>, attn._forward_hooks_always_called)`): every single block compiled its own graph.
All `full`: a cold trace per depth and case (the 7 tests: 54 s wall on the shared 2-core machine, load 5).
"""

from __future__ import annotations

import math

import pytest
import torch

import dtp
from dtp.analysis.fakepg import fake_world
from dtp.runtime.compile import compile_blocks, repeated_blocks
from dtp.testing.tiny import tiny_inputs, tiny_model

FLUX = "FluxTransformer2DModel"
SHALLOW = dict(num_layers=2, num_single_layers=2)
DEEP = dict(num_layers=4, num_single_layers=6)
GRAPHS_PER_CLASS = 2  # in all, over the region classes: the first call's recompiles (see the docstring)
CASES = {
    "tp": (dict(tp=2), {}),
    "cp-ulysses": (dict(cp=2), {}),
    "cp-ring": (dict(cp=2), dict(cp_mode="ring")),
    "fsdp": (dict(cp=2), dict(fsdp=True)),
    "fsdp-grouped": (dict(cp=2), dict(fsdp=2)),  # 2 blocks a unit, none split: the 2 block classes are the regions
    "tp-fsdp": (dict(tp=2, cp=2), dict(fsdp=True)),  # FSDP inside TP (2-D layout), 4 ranks
}


def guard_per_attention(model) -> None:
    """The negative control: a no-op `always_call` hook on every attention module, as CP's scope once was."""
    for module in model.modules():
        if type(module).__name__ == "FluxAttention":
            module.register_forward_hook(lambda *args: None, always_call=True)


def graphs(degrees: dict, options: dict, depth: dict, prepare=None) -> dict:
    """Dynamo's counts over two calls of tiny FLUX.1 at `depth`, parallelized on `degrees` with `options` and
    compiled regionally: graphs after the first call and after the second, graph breaks, region classes."""
    torch._dynamo.reset()
    counters = torch._dynamo.utils.counters
    with fake_world(math.prod(degrees.values())):
        model = dtp.parallelize(tiny_model(FLUX, **depth), dtp.make_mesh(**degrees), **options)
        if prepare is not None:
            prepare(model)
        compile_blocks(model, backend="eager")
        classes = len({type(block) for block in repeated_blocks(model)})
        inputs = tiny_inputs(FLUX)
        counters.clear()
        with torch.no_grad():
            model(**{**inputs, "timestep": torch.tensor([0.9])})
            first = counters["stats"]["unique_graphs"]
            model(**{**inputs, "timestep": torch.tensor([0.5])})
    second = counters["stats"]["unique_graphs"]
    return dict(first=first, second=second, breaks=sum(counters["graph_break"].values()), classes=classes)


@pytest.mark.full
@pytest.mark.parametrize("case", list(CASES))
def test_graphs_do_not_grow_with_the_depth(case):
    deep = graphs(*CASES[case], DEEP)
    assert deep["breaks"] == 0
    assert deep["second"] == deep["first"], deep  # no recompile after the first call
    assert deep["first"] <= GRAPHS_PER_CLASS * deep["classes"], deep
    shallow = graphs(*CASES[case], SHALLOW)
    assert shallow["first"] == deep["first"], (shallow, deep)


@pytest.mark.full
def test_a_guard_per_block_grows_with_the_depth():
    # The bound and the depth check each catch it: 4 + 6 blocks compile the 6 single blocks one graph each.
    shallow = graphs(*CASES["fsdp"], SHALLOW, guard_per_attention)
    deep = graphs(*CASES["fsdp"], DEEP, guard_per_attention)
    assert deep["first"] > shallow["first"] and deep["first"] > GRAPHS_PER_CLASS * deep["classes"], (shallow, deep)
