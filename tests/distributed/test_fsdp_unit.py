"""fsdp= with a unit size (`runtime/fsdp_unit.py`: blocks per FSDP2 unit, or a byte budget per unit) on 2 gloo ranks
(cp=2, Ulysses).

- parity: tiny FLUX.1 at fsdp=2 (its 2 double blocks one unit, its 2 single blocks another) and tiny Wan at
  fsdp="1MB" (its 2 blocks, 0.19 MB each, one unit) against diffusers' one-process forward, twice (the second call
  gathers the units again); the negative control swaps one grouped weight's shards between the ranks.
- memory: one forward's peak (torch's MemTracker) above the activations, at fsdp=True and fsdp=2 (FLUX.1, 2 double
  + 1 single), against `runtime/fsdp.in_flight_bytes` and the figure `dtp fit` traces on meta for the same unit size
  (`analysis/fsdp.traced_fsdp`, what `fit/fsdp.fsdp_row` puts in the denoise phase): equal, and larger at fsdp=2 by
  what grouping gathers at once. Measured CPU: 2.0 s per rank + 3.0 s for the traces in the test process.
"""

from __future__ import annotations

import pytest
import torch
from fsdp_cases import TOL, TWO_DOUBLE, in_flight, parity

from dtp.testing.launch import spawn
from dtp.testing.scope import full_run

FLUX, WAN = "FluxTransformer2DModel", "WanTransformer3DModel"


@pytest.fixture(scope="module")
def results():
    return spawn(_worker, 2, timeout_s=600)


def _worker(rank, world):
    import dtp

    mesh, dims = dtp.make_mesh(cp=2), dict(cp=2)
    return dict(
        flux=parity(FLUX, mesh, dims, fsdp=2),
        wan=parity(WAN, mesh, dims, fsdp="1MB"),
        broken=parity(FLUX, mesh, dims, fsdp=2, broken=_SecondBlockFf()),
        units={unit: _units(mesh, unit) for unit in (2, "1MB")},
        memory={unit: in_flight(mesh, unit) for unit in (True, 2)},
        compiled=_compiled(mesh) if full_run() else None,
    )


@torch.no_grad()
def _compiled(mesh) -> dict:
    """diffusers' regional compile (dynamo's "eager" backend, fullgraph) of tiny FLUX.1 at fsdp=2: FSDP2's group
    hooks sit on every block of a unit, outside each compiled block, as with a unit a block."""
    import dtp
    from dtp.testing.tiny import output_tensor, tiny_inputs, tiny_model

    inputs = tiny_inputs(FLUX)
    ref = output_tensor(tiny_model(FLUX)(**inputs)).float()
    model = dtp.parallelize(tiny_model(FLUX), mesh, fsdp=2)
    torch._dynamo.reset()
    model.compile_repeated_blocks(fullgraph=True, backend="eager")
    out = output_tensor(model(**inputs)).float()
    return dict(diff=float((out - ref).abs().max()), ref=float(ref.abs().max()), repeated=list(model._repeated_blocks))


class _SecondBlockFf:
    """Picks the second block's `ff.net.2.weight` (`wrong_rank_shard` walks the blocks in order): in fsdp=2's first
    unit, though not its first module (a group's later blocks run on the group's gathered parameters too)."""

    def __init__(self):
        self.seen = 0

    def __call__(self, name: str, param) -> bool:
        self.seen += name == "ff.net.2.weight"
        return name == "ff.net.2.weight" and self.seen == 2


def _units(mesh, unit) -> list[tuple[str, int]]:
    """The gathering units of each model sharded with `unit`: (path, blocks grouped)."""
    import dtp
    from dtp.runtime.fsdp import LAYOUT_ATTR
    from dtp.testing.tiny import tiny_model

    out = []
    for cls in (FLUX, WAN):
        model = dtp.parallelize(tiny_model(cls), mesh, fsdp=unit)
        out += [(u.path, 1 + len(u.members)) for u in getattr(model, LAYOUT_ATTR).gathered()]
    return out


def _traced_in_flight(unit) -> int:
    """`dtp fit`'s in-flight figure for the same model and unit size (meta, fake process group: in this process)."""
    from dtp.analysis.fakepg import meta_model
    from dtp.analysis.fsdp import traced_fsdp
    from dtp.families import FAMILIES

    model = meta_model(FLUX, {**FAMILIES[FLUX].tiny, **TWO_DOUBLE}, torch.float32)
    return traced_fsdp("transformer", model, tp=1, cp=2, fsdp=unit).in_flight


def test_grouped_units_match_one_process(results):
    """fsdp=2 (FLUX.1) and fsdp="1MB" (Wan): max |out - ref| <= 1e-5 x max |ref|, both calls; no DTensor in a module;
    the grouped units leave the vectors whole too (`dtp.testing.fsdp_rule`)."""
    for per_rank in results:
        for key in ("flux", "wan"):
            r = per_rank[key]
            assert r["shape_ok"] and r["dtensor_modules"] == [], (key, r["dtensor_modules"][:5])
            assert r["rule_breaks"] == [], (key, r["rule_breaks"][:3])
            assert r["diff"] <= TOL * r["ref"] and r["again"] <= TOL * r["ref"], (key, r)


def test_grouped_units_are_the_asked_groups(results):
    """fsdp=2: FLUX.1's double blocks one unit, its single blocks another, Wan's 2 blocks one; "1MB" the same here
    (FLUX.1's double blocks 0.60 MB each: one a unit; single 0.25 MB: both in one)."""
    for per_rank in results:
        assert per_rank["units"][2] == [
            ("transformer_blocks.0", 2),
            ("single_transformer_blocks.0", 2),
            ("blocks.0", 2),
        ]
        assert per_rank["units"]["1MB"] == [
            ("transformer_blocks.0", 1),
            ("transformer_blocks.1", 1),
            ("single_transformer_blocks.0", 2),
            ("blocks.0", 2),
        ]


def test_wrong_shard_in_a_group_fails(results):
    """Negative control: the second double block's ff weight (grouped behind the first block) swapped between ranks."""
    for per_rank in results:
        r = per_rank["broken"]
        assert r["diff"] > TOL * r["ref"], r


def test_in_flight_follows_the_unit_size_as_fit_traces_it(results):
    """Measured forward peak above the activations within [in flight, 1.02 x (in flight + root 154 kB)] at both unit
    sizes, in flight == `dtp fit`'s traced figure. fsdp=2: the double pair's copy-out, 2 x 1.20 MB = 2.39 MB in flight,
    measured 2.42 MB (the pair and the single block after it, 1.44 MB, as counted before the copy-out term, failed
    this); dtp's units: 497 kB in flight, measured 527 kB."""
    fit = {unit: _traced_in_flight(unit) for unit in (True, 2)}
    for per_rank in results:
        for unit, m in per_rank["memory"].items():
            extra = m[True] - m[False]
            assert m["in_flight"] == fit[unit], (unit, m, fit)
            assert m["in_flight"] < extra <= 1.02 * (m["in_flight"] + m["root"]), (unit, extra, m)
        assert per_rank["memory"][2]["in_flight"] > 3 * per_rank["memory"][True]["in_flight"], per_rank["memory"]


@pytest.mark.full  # dynamo's tracing: seconds of CPU per rank
def test_regional_compile_with_grouped_units(results):
    """`compile_repeated_blocks(fullgraph=True)` at fsdp=2 finds the renamed blocks and runs without a graph break, the
    one-process output within TOL (measured 4.7e-7 relative, as eager)."""
    for per_rank in results:
        r = per_rank["compiled"]
        assert "FSDPFluxSingleTransformerBlock" in r["repeated"] and r["diff"] <= TOL * r["ref"], r
