"""torch.compile keeps working on a dtp-sharded tiny FLUX.1 and a split VAE (2 gloo processes, one spawned group).

Dynamo's "eager" backend traces exactly what the other backends trace, so it finds every graph break and
recompilation without AOT or C++ compilation; DTP_COMPILE_MATRIX=full adds the other cases and one inductor
case. Forms: `torch.compile(model)` and diffusers' regional `compile_repeated_blocks(fullgraph=True)`
(fullgraph: a break would raise).
Every case: 0 graph breaks, no recompilation over 3 timesteps, max |compiled - eager| <= 1e-5 * max |eager|
(the VAE's halo exchange with dynamo's `enable_p2p_compilation`, i.e. TORCHDYNAMO_ENABLE_P2P_COMPILATION=1; ring
attention without it: its K/V rotation is a functional collective).
The whole matrix with inductor and its cold-compile times: benchmarks/compile.py.
"""

import os

import pytest
import torch
from compile_cases import count_compiles, run_matrix

from dtp.testing.launch import spawn
from dtp.testing.scope import full_run

TOL = 1e-5
# The whole matrix costs ~100 s of CPU per rank (each case a cold trace; dynamo through DTensor is slow), too
# much for the suite: by default two regional cases, ring CP (its K/V rotation: functional collectives in the graph)
# and padded heads with int8 weights (TP's plain-tensor Linears over torchao's Int8Tensor holding DTensor data and
# scales; one compile for both kinds, 5.6 CPU s a rank against 8.3 + 9.2 apart); TP through the CLI is
# test_compile_run's (full). DTP_FULL=1 or DTP_COMPILE_MATRIX=full runs all (LoRA, Ulysses, the parallel VAEs' decodes
# compiled whole, pad and int8wo apart, inductor, fp8wo and CogVideoX's SDPA among them).
QUICK = [
    ("cp-ring", "regional", "eager"),
    ("pad-int8wo", "regional", "eager"),
]
FULL = [
    ("tp", "full", "eager"),
    ("cp-ulysses", "regional", "eager"),
    ("cp-ring", "regional", "eager"),
    ("pad", "regional", "eager"),
    ("lora", "regional", "eager"),
    ("tp", "regional", "inductor"),
    ("cp-sdpa", "full", "eager"),
    ("int8wo", "regional", "eager"),
    ("pad-int8wo", "regional", "eager"),
    ("fp8wo", "full", "eager"),
    ("vae-kl", "full", "eager"),
    ("vae-wan", "full", "eager"),
]
MATRIX = FULL if os.environ.get("DTP_COMPILE_MATRIX") == "full" or full_run() else QUICK


@pytest.fixture(scope="module")
def results():
    return spawn(run_matrix, 2, MATRIX, timeout_s=3600)


@pytest.mark.parametrize("key", MATRIX, ids=["/".join(k) for k in MATRIX])
def test_compiles_without_breaks_or_recompiles(results, key):
    for rank, per_rank in enumerate(results):
        r = per_rank[key]
        assert "error" not in r, (rank, r["error"])
        assert r["graph_breaks"] == 0, (rank, r["break_reasons"])
        assert r["graphs"] >= 1 and r["recompiles"] == 0, (rank, r)
        assert r["rel"] <= TOL, (rank, r)


def test_negative_control_the_counters_see_a_break_and_a_recompile():
    """The same counting on a module that breaks its graph and is called at a new shape: both are seen."""

    class Breaks(torch.nn.Module):
        def forward(self, x):
            x = x * 2
            torch._dynamo.graph_break()
            return x + 1

    found = count_compiles(torch.compile(Breaks(), backend="eager", dynamic=False), [torch.ones(2), torch.ones(3)])
    assert found["graph_breaks"] >= 1 and found["recompiles"] >= 1, found
