"""The plan-time head check under USP (`make_mesh(cp=C, ulysses=U)`): heads split over the Ulysses degree U only,
ring runs over C / U, so cp may exceed the head count. Tiny FLUX.1 (4 heads) on torch's fake process group of 8
ranks: cp=8 as plain Ulysses is refused naming cp=8; ulysses=4 x ring 2 passes; ulysses=8 is plain Ulysses again;
ring-refusing plans refuse any ring degree above 1. The 8-rank numeric parity is tests/distributed/test_cp_usp_8.py.
"""

import pytest

import dtp
from dtp.analysis.fakepg import fake_world
from dtp.policy import ulysses_degree
from dtp.runtime.parallelism import Parallelism
from dtp.testing.tiny import tiny_model

FLUX = "FluxTransformer2DModel"


def test_ulysses_degree_policy():
    assert ulysses_degree(8, "ulysses") == 8 and ulysses_degree(8, "ring") == 1
    assert ulysses_degree(8, "ring", 4) == 4 and ulysses_degree(8, "ulysses", 2) == 2
    with pytest.raises(dtp.PlanError, match=r"ulysses=3 does not divide cp=8.*1, 2, 4, 8"):
        ulysses_degree(8, "ulysses", 3)


@pytest.mark.parametrize("mode", ["ulysses", "ring"])
def test_four_heads_at_cp8_with_ulysses4(mode):
    """USP's degrees whatever cp_mode says; prepare passes: the heads (4) split over U = 4, not over cp = 8."""
    with fake_world(8):
        mesh = dtp.make_mesh(cp=8, ulysses=4, device_type="cpu")
        parallelism = Parallelism(mesh, cp_mode=mode)
        assert (parallelism.ulysses, parallelism.ring) == (4, 2)
        prepared = dtp.prepare(tiny_model(FLUX), mesh, cp_mode=mode)
        assert prepared.cp_resolved is not None


def test_four_heads_at_cp8_plain_ulysses_is_refused():
    """The same model as plain Ulysses (U = cp = 8): PlanError naming the heads, the degree and USP as the fix."""
    with fake_world(8):
        mesh = dtp.make_mesh(cp=8, device_type="cpu")
        with pytest.raises(dtp.PlanError, match=r"4 heads, 4 per rank at tp=1, and cp=8 does not divide 4.*--ulysses"):
            dtp.prepare(tiny_model(FLUX), mesh)
        mesh = dtp.make_mesh(cp=8, ulysses=8, device_type="cpu")  # U = cp: plain Ulysses, the same refusal
        with pytest.raises(dtp.PlanError, match="cp=8 does not divide 4"):
            dtp.prepare(tiny_model(FLUX), mesh)


def test_usp_heads_over_tp_then_ulysses():
    """tp=2 leaves 2 heads per rank: ulysses=2 x ring 2 passes, ulysses=4 is refused naming ulysses=4."""
    with fake_world(8):
        dtp.prepare(tiny_model(FLUX), dtp.make_mesh(tp=2, cp=4, ulysses=2, device_type="cpu"))
        with pytest.raises(dtp.PlanError, match=r"2 per rank at tp=2, and cp=4 does not divide 2"):
            dtp.prepare(tiny_model(FLUX), dtp.make_mesh(tp=2, cp=4, device_type="cpu"))
    assert dtp.tp_candidates(tiny_model(FLUX), cp=8, ulysses=4) == [1]
    assert dtp.tp_candidates(tiny_model(FLUX), cp=8) == []


def test_ring_refusing_plan_refuses_usp():
    """A plan whose model takes Ulysses only (`ring_refused`) refuses a ring degree above 1, named."""
    from dtp.resolve.binding.cp import CpAttentionSpec, CpResolved

    resolved = CpResolved("p", (), (), (CpAttentionSpec("a", 8, False),), ring_refused="block-causal masks.")
    resolved.check(1, 4, "ulysses")  # plain Ulysses: fine
    with pytest.raises(dtp.PlanError, match="ring attention cannot run this model: block-causal"):
        resolved.check(1, 4, "ulysses", ulysses=2)
    with pytest.raises(dtp.PlanError, match=r"8 heads, 8 per rank at tp=1, and ulysses=16 does not divide 8"):
        CpResolved("p", (), (), (CpAttentionSpec("a", 8, False),)).check(1, 32, "ring", ulysses=16)
