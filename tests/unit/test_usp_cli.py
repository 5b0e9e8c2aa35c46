"""`--ulysses U` on `dtp run / serve / check / fit`, `--allow-cross-node` on run / serve: parsed, folded into the
load options (`shard_mode`: U = 1 ring, U = cp Ulysses, 1 < U < cp USP), `dtp check` at full size on a fake group
(FLUX.1-dev's 24 heads at cp=48: refused as Ulysses, accepted as ulysses 8 x ring 6), `dtp fit --ulysses` keeping
the rows of that degree, and the node rule applied to plain Ulysses' cp groups."""

import json

import pytest

import dtp
from dtp.analysis.fakepg import fake_world
from dtp.fit.report import keep_ulysses
from dtp.pipeline.session import LoadOptions, shard_mode
from dtp.runtime.nodes import check_axes_within_nodes
from dtp.tools.cli import main
from dtp.tools.commands import build_parser
from dtp.tools.run import load_options

RUN = ["run", "--model-dir", "m", "--prompt", "p", "--cp", "4"]


@pytest.mark.parametrize(
    "argv",
    [
        RUN,
        ["serve", "--model-dir", "m", "--cp", "4"],
        ["check", "flux", "--tp", "1"],
        ["fit", "wan-pipeline", "--gpus", "4", "--gpu-memory", "80GB"],
    ],
)
def test_every_command_takes_ulysses(argv):
    args = build_parser().parse_args([*argv, "--ulysses", "2"])
    assert args.ulysses == 2
    assert build_parser().parse_args(argv).ulysses is None


def test_run_folds_ulysses_and_cross_node_into_the_load_options():
    options = load_options(build_parser().parse_args([*RUN, "--ulysses", "2", "--allow-cross-node"]))
    assert (options.cp, options.ulysses, options.allow_cross_node) == (4, 2, True)
    assert load_options(build_parser().parse_args(RUN)).allow_cross_node is False


@pytest.mark.parametrize(
    "ulysses,cp_mode,expected",
    [
        (None, "ulysses", "ulysses"),
        (None, "ring", "ring"),
        (1, "ulysses", "ring"),
        (4, "ring", "ulysses"),
        (2, "ring", "ulysses"),
    ],
)
def test_shard_mode(ulysses, cp_mode, expected):
    assert shard_mode(LoadOptions(model_dir="m", cp=4, cp_mode=cp_mode, ulysses=ulysses)) == expected
    with pytest.raises(dtp.PlanError, match="ulysses=3 does not divide cp=4"):
        shard_mode(LoadOptions(model_dir="m", cp=4, ulysses=3))


def test_check_full_size_flux_past_its_head_count(capsys):
    """24 heads: cp=48 as Ulysses is refused; ulysses 8 x ring 6 is accepted and printed as such."""
    assert main(["check", "flux", "--tp", "1", "--cp", "48", "--no-forward"]) == 1
    assert "cp=48 does not divide 24" in capsys.readouterr().err
    assert main(["check", "flux", "--tp", "1", "--cp", "48", "--ulysses", "8", "--no-forward", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["ulysses"], report["ring"], report["candidates"]) == (8, 6, [1, 3])
    assert main(["check", "flux", "--tp", "1", "--cp", "48", "--ulysses", "8", "--no-forward"]) == 0
    assert "ulysses 8 x ring 6" in capsys.readouterr().out


def test_fit_keeps_the_rows_of_one_ulysses_degree():
    rows = [
        dict(cp=1, cp_mode=None, tp=4),
        dict(cp=4, cp_mode="ulysses", tp=1),
        dict(cp=4, cp_mode="ring", tp=1),
        dict(cp=4, cp_mode="ulysses", ulysses=2, tp=1),
        dict(cp=2, cp_mode="ulysses", tp=2),
    ]
    assert keep_ulysses({"rows": rows}, 2)["rows"] == [rows[3], rows[4]]
    assert keep_ulysses({"rows": rows}, 1)["rows"] == [rows[2]]
    assert "--ulysses 8" in keep_ulysses({"rows": rows}, 8)["reason"]


def test_plain_ulysses_groups_are_checked_against_the_nodes():
    """2 nodes x 2 ranks, cp=4 as plain Ulysses: its one group spans both nodes (named 'ulysses'), unless allowed;
    the same cp axis as ring is not checked."""
    nodes = ["node0", "node0", "node1", "node1"]
    with fake_world(4):
        mesh = dtp.make_mesh(cp=4, device_type="cpu")
        with pytest.raises(dtp.PlanError, match=r"the ulysses group of ranks \[0, 1, 2, 3\] spans 2 nodes"):
            check_axes_within_nodes(mesh, nodes, held={"ulysses": "cp"})
        check_axes_within_nodes(mesh, nodes, allow=("ulysses",), held={"ulysses": "cp"})
        check_axes_within_nodes(mesh, nodes)
