"""`Parallelism`: built from degrees, validated on construction, the mesh built or adopted in one place.

On torch's fake process group (one process, any world size): the degrees a valid value reports are the ones
given, the mesh is built from them, and every invalid combination is a PlanError naming the value and the fix.
"""

from __future__ import annotations

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from dtp.analysis.fakepg import fake_world
from dtp.errors import PlanError
from dtp.runtime.mesh import make_mesh
from dtp.runtime.parallelism import Parallelism

degrees = st.sampled_from([1, 2, 4])


@settings(max_examples=40, deadline=None)
@given(tp=degrees, cp=degrees, cfg=degrees, fsdp=st.booleans())
def test_built_from_degrees(tp, cp, cfg, fsdp):
    """A valid value reports the degrees it was given and FSDP's degree cfg x cp; the mesh has those axes."""
    assume(not fsdp or cfg * cp > 1)
    with fake_world(tp * cp * cfg):
        p = Parallelism(tp=tp, cp=cp, cfg=cfg, fsdp=fsdp)
        assert (p.tp, p.cp, p.cfg, p.fsdp_degree) == (tp, cp, cfg, cfg * cp)
        assert p.mesh.size() == tp * cp * cfg and p.tp_mesh.size() == tp
        if fsdp:
            assert p.fsdp_mesh.size() == cfg * cp


@settings(max_examples=20, deadline=None)
@given(tp=degrees, cp=degrees)
def test_fsdp_without_a_non_tp_axis_is_refused(tp, cp):
    """fsdp=True where cfg x cp = 1: PlanError naming fsdp and the fix (cp=2), before anything is built on it."""
    assume(cp == 1)
    with fake_world(tp), pytest.raises(PlanError, match=r"fsdp=True .* cp=2"):
        Parallelism(tp=tp, cp=cp, fsdp=True)


@settings(max_examples=20, deadline=None)
@given(tp=degrees, cp=degrees, other=degrees)
def test_adopted_mesh_must_match_the_degrees(tp, cp, other):
    """A degree given with a mesh must be the mesh's; the mesh's degrees are read when none is given."""
    with fake_world(tp * cp):
        mesh = make_mesh(tp=tp, cp=cp)
        assert Parallelism(mesh).tp == tp and Parallelism(mesh).cp == cp
        if other != tp:
            with pytest.raises(PlanError, match=rf"tp={other} does not match .* size {tp}"):
                Parallelism(mesh, tp=other)


def test_bad_values_are_refused():
    """A degree that is not a positive int, an unknown cp_mode, an fsdp that is no bool nor unit size, a world of the
    wrong size."""
    with fake_world(4):
        for kwargs, words in (
            (dict(tp=0), "tp must be a positive integer"),
            (dict(tp=True), "tp must be a positive integer"),
            (dict(tp=4, cp_mode="ulises"), "cp_mode must be one of"),
            (dict(tp=2, cp=2, fsdp="yes"), "fsdp=.yes.: give True .* a byte budget per unit"),
            (dict(tp=2, cp=1), r"world size 4 != cfg \* cp \* tp"),
        ):
            with pytest.raises(PlanError, match=words):
                Parallelism(**kwargs)


def test_text_encoder_keeps_the_whole_mesh_for_fsdp():
    """`for_model` narrows a text encoder to the tp axis, while FSDP still shards it over the whole mesh's cp."""
    from dtp.testing.tiny_text import tiny_text_model

    with fake_world(4):
        p = Parallelism(tp=2, cp=2, fsdp=True).for_model(tiny_text_model("T5EncoderModel"))
        assert (p.tp, p.cp, p.cfg, p.fsdp_degree) == (2, 1, 1, 2) and p.mesh.ndim == 1
