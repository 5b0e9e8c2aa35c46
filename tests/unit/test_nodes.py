"""Which mesh axes cross nodes (`dtp.runtime.nodes`): tp and Ulysses groups stay inside a node or the mesh is
refused with the axis named; cfg and cp may cross. Meshes of any size on torch's fake process group; node
placement as torchrun gives it (consecutive ranks per node)."""

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import dtp
from dtp.analysis.fakepg import fake_world
from dtp.runtime.nodes import axis_groups, check_axes_within_nodes


def consecutive_nodes(world: int, per_node: int) -> list[str]:
    return [f"node{rank // per_node}" for rank in range(world)]


def test_axis_groups_follow_the_row_major_layout():
    """The independent construction: with (cfg, cp, tp) = (2, 2, 2), rank = 4 cfg + 2 cp + tp."""
    with fake_world(8):
        mesh = dtp.make_mesh(tp=2, cp=2, cfg=2, device_type="cpu")
        assert axis_groups(mesh, "tp") == [[0, 1], [2, 3], [4, 5], [6, 7]]
        assert axis_groups(mesh, "cp") == [[0, 2], [1, 3], [4, 6], [5, 7]]
        assert axis_groups(mesh, "cfg") == [[0, 4], [1, 5], [2, 6], [3, 7]]


@settings(max_examples=40, deadline=None)
@given(
    per_node=st.sampled_from([1, 2, 4, 8]),
    nodes=st.sampled_from([1, 2, 4]),
    tp=st.sampled_from([1, 2, 4, 8]),
    cfg=st.sampled_from([1, 2]),
)
def test_tp_stays_inside_a_node_exactly_when_the_node_holds_whole_tp_groups(per_node, nodes, tp, cfg):
    world = per_node * nodes
    assume(world % (tp * cfg) == 0)  # otherwise there is no such mesh
    with fake_world(world):
        mesh = dtp.make_mesh(tp=tp, cp=world // (tp * cfg), cfg=cfg, device_type="cpu")
        placement = consecutive_nodes(world, per_node)
        inside = per_node % tp == 0
        if inside:
            check_axes_within_nodes(mesh, placement)
        else:
            with pytest.raises(dtp.PlanError, match=r"the tp group of ranks .* spans \d nodes"):
                check_axes_within_nodes(mesh, placement)
        check_axes_within_nodes(mesh, placement, allow=("tp",))  # asked for: accepted


def test_cp_and_cfg_may_cross_nodes():
    """2 nodes x 2 ranks, cp=2 x tp=2: cp groups {0, 2} and {1, 3} cross, tp groups do not: accepted."""
    with fake_world(4):
        mesh = dtp.make_mesh(tp=2, cp=2, device_type="cpu")
        check_axes_within_nodes(mesh, consecutive_nodes(4, 2))
        mesh = dtp.make_mesh(tp=1, cp=2, cfg=2, device_type="cpu")
        check_axes_within_nodes(mesh, consecutive_nodes(4, 1))


def test_the_message_names_the_ranks_nodes_and_fix():
    with fake_world(4):
        mesh = dtp.make_mesh(tp=4, device_type="cpu")
        with pytest.raises(dtp.PlanError) as raised:
            check_axes_within_nodes(mesh, consecutive_nodes(4, 2))
    message = str(raised.value)
    assert "[0, 1, 2, 3]" in message and "node0, node1" in message and "tp <= 2" in message
    assert "allow_cross_node=('tp',)" in message
