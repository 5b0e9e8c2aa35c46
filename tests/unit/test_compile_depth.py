"""Regional compile compiles a block class once, however deep the model: tiny FLUX.1 with 4 double + 6 single
blocks on a fake process group of 2 ranks (no collectives run; the graphs are what matters), `compile_blocks` with
dynamo's eager backend, two calls. The graphs must not grow with the depth: FLUX.1-dev has 19 + 38 blocks and dynamo
gives up on a function after 8 recompiles (`recompile_limit`), which `fullgraph=True` makes an error.

tp=2: 4 graphs (2 block classes; one recompile each in the first call: the first double block sees its mesh objects
identical, the first single block a concatenated input's strides), none in the second call.
cp=2 (Ulysses, ring, FSDP over cp): the same bound. The negative control is history: CP's attention scope was popped
by a forward hook registered with `always_call=True` on every attention module, dynamo guarded on that hook's id
(`___dict_contains(<id>, attn._forward_hooks_always_called)`), so every block instance compiled its own graph (these
cases failed, as strict xfails); the hook is now plain and the root model's `ScopeGuard` pops after a raise.
All cases `full`: each is a cold trace of 10 blocks (the four: 653 s wall on the shared 2-core machine).
"""

from __future__ import annotations

import pytest
import torch

import dtp
from dtp.analysis.fakepg import fake_world
from dtp.runtime.compile import compile_blocks
from dtp.testing.tiny import tiny_inputs, tiny_model

FLUX = "FluxTransformer2DModel"
DEPTH = dict(num_layers=4, num_single_layers=6)
MAX_GRAPHS = 4  # 2 block classes, each recompiled once in the first call (see the docstring)
CASES = {
    "tp": (dict(tp=2), {}),
    "cp-ulysses": (dict(cp=2), {}),
    "cp-ring": (dict(cp=2), dict(cp_mode="ring")),
    "fsdp": (dict(cp=2), dict(fsdp=True)),
}
# Known gap, measured at the end of round 14 on main and on 222a46d (the session's start) alike: at fsdp=True the
# 10-block model compiles 8 unique graphs (not <= 4), the same 8 on the second call (no recompile after step 1). dtp's
# units split large blocks into child units, so blocks of one class run under different FSDP2 hooks. strict: the
# case fails once it is fixed, to be moved back.
FSDP_GRAPHS = "fsdp=True: 8 unique graphs at depth 10 (dtp's split units), measured; not yet <= 4"


@pytest.mark.full
@pytest.mark.parametrize(
    "case",
    [c if c != "fsdp" else pytest.param(c, marks=pytest.mark.xfail(strict=True, reason=FSDP_GRAPHS)) for c in CASES],
)
def test_graphs_do_not_grow_with_the_depth(case):
    degrees, options = CASES[case]
    torch._dynamo.reset()
    counters = torch._dynamo.utils.counters
    with fake_world(2):
        model = dtp.parallelize(tiny_model(FLUX, **DEPTH), dtp.make_mesh(**degrees), **options)
        compile_blocks(model, backend="eager")
        inputs = tiny_inputs(FLUX)
        counters.clear()
        with torch.no_grad():
            model(**{**inputs, "timestep": torch.tensor([0.9])})
            first = counters["stats"]["unique_graphs"]
            model(**{**inputs, "timestep": torch.tensor([0.5])})
    assert sum(counters["graph_break"].values()) == 0
    assert first <= MAX_GRAPHS and counters["stats"]["unique_graphs"] == first, (first, dict(counters["stats"]))
