"""`dtp fit` across nodes (`--nodes --gpus-per-node --inter-node`), USP candidates, `--replicas`, guidance passes:
the rank layout and which axes cross nodes against hand counts, the inter-node cost, the multi-node torchrun and srun
commands through torch's and dtp's own parsers, the passes each released pipeline makes, LTX-2's extra components."""

from __future__ import annotations

import os
import shlex

import pytest
import torch

import dtp
from dtp.fit import cost
from dtp.fit.candidates import Candidate, arrangement, candidates
from dtp.fit.estimate import RunOptions, command
from dtp.fit.hardware import GB, HARDWARE, INTER_NODE, hardware, inter_node
from dtp.fit.pipelines import Shape, fit_pipeline
from dtp.fit.placement import Nodes, check_within_nodes, crossing_axes, grid
from dtp.tools.commands import build_parser

IB = INTER_NODE["400Gb IB"]
FOUR_BY_EIGHT = Nodes(4, 8, IB)


def test_axes_crossing_nodes_on_four_nodes_of_eight():
    """cfg 2 x ring 4 x ulysses 2 x tp 2 on 4 x 8 GPUs (the module docstring's layout): tp {0, 1} and Ulysses {0, 2}
    inside node 0, ring {0, 4, 8, 12} over nodes 0-1, cfg {0, 16} over nodes 0 and 2; FSDP's groups (ranks with one tp
    index) and the whole mesh too. On one node nothing crosses."""
    layout = grid(cfg=2, cp=8, tp=2, ulysses=2)
    assert layout.mesh.shape == (1, 2, 4, 2, 2)
    assert crossing_axes(layout, FOUR_BY_EIGHT) == ("cfg", "ring", "fsdp", "world")
    check_within_nodes(layout, FOUR_BY_EIGHT)  # tp and Ulysses inside a node: accepted
    assert crossing_axes(grid(cfg=1, cp=4, tp=2, ulysses=4), FOUR_BY_EIGHT) == ()  # 8 ranks: one node
    assert crossing_axes(layout, Nodes(1, 32)) == ()
    # 4 replicas of an 8-rank mesh on 4 x 8: each replica is one node, nothing of a replica crosses
    assert crossing_axes(grid(cfg=2, cp=2, tp=2, ulysses=1, replicas=4), FOUR_BY_EIGHT) == ()


@pytest.mark.parametrize(
    ("cp", "tp", "ulysses", "axis"), [(1, 16, 1, "tp"), (2, 8, 2, "ulysses"), (16, 1, 16, "ulysses")]
)
def test_tp_and_ulysses_groups_spanning_nodes_are_refused_with_the_axis_named(cp, tp, ulysses, axis):
    """The runtime's rule (`runtime/nodes.py`) on fit's grid: tp 16, or Ulysses 2 over tp 8, or Ulysses 16 on nodes of
    8 GPUs spans two nodes: PlanError naming the axis; candidates() offers none of them."""
    with pytest.raises(dtp.PlanError, match=f"the {axis} group of ranks"):
        check_within_nodes(grid(cfg=1, cp=cp, tp=tp, ulysses=ulysses), Nodes(2, 8, IB))
    found = candidates(fit_pipeline("wan-pipeline"), 16, nodes=Nodes(2, 8, IB))
    assert found and all(c.tp * c.ulysses <= 8 for c in found)
    assert not [c for c in found if (c.cp, c.tp, c.ulysses) == (cp, tp, ulysses)]
    assert {c.cp_mode for c in found} == {None, "ulysses", "ring", "usp"}


def test_a_collective_on_a_crossing_axis_costs_the_inter_node_link():
    """A 100 MB all-gather over 2 ranks on the cfg axis: NVLink on one node (450 GB/s, 20 us); across 400Gb IB (50 GB/s
    per GPU, latency x2) when cfg crosses; 8x200Gb RoCE shares 200 GB/s over the node's 8 GPUs (25 GB/s); NVL72 is
    NVLink. A record of an axis that does not cross stays on NVLink."""
    h100 = HARDWARE["H100 SXM"]
    records = [("all_gather", 100 * 10**6, 2, "cfg")]
    assert cost.collective_seconds(records, h100) == pytest.approx(20e-6 + 50e6 / 450e9)
    ib = cost.Network(frozenset({"cfg"}), IB, 8)
    assert cost.collective_seconds(records, h100, ib) == pytest.approx(40e-6 + 50e6 / 50e9)
    roce = cost.Network(frozenset({"cfg"}), inter_node("8x200Gb RoCE"), 8)
    assert cost.collective_seconds(records, h100, roce) == pytest.approx(40e-6 + 50e6 / 25e9)
    assert cost.collective_seconds([("all_gather", 100 * 10**6, 2, "tp")], h100, ib) == pytest.approx(
        20e-6 + 50e6 / 450e9
    )
    nvl72 = cost.Network(frozenset({"cfg"}), inter_node("nvl72"), 4)
    assert cost.collective_seconds(records, HARDWARE["GB200"], nvl72) == pytest.approx(20e-6 + 50e6 / 900e9)


def test_blackwell_and_inter_node_presets():
    """B200 / GB200 by name (dense bf16 2.25 / 2.5 PFLOP/s, 180 / 186 GB, NVLink 5 900 GB/s a way); the link presets
    by name, case and spacing aside; unknown names list the presets; NVL72 joins 72 GPUs at most."""
    assert hardware("b200", 0).bf16_flops == 2250e12 and hardware("GB200", 0).memory_bytes == 186 * GB
    assert hardware("B200", 0).link_bandwidth == 900 * GB
    assert inter_node("400gb-ib") is IB and inter_node("8x200GbRoCE").gpu_bandwidth(4) == 50 * GB
    with pytest.raises(dtp.PlanError, match="400Gb IB"):
        inter_node("carrier pigeon")
    with pytest.raises(dtp.PlanError, match="72"):
        dtp.fit("wan-pipeline", nodes=19, gpus_per_node=4, inter_node="NVL72", hardware="GB200")
    with pytest.raises(dtp.PlanError, match="--gpu-memory"):
        dtp.fit("wan-pipeline", 8)


def _dtp_args(words: list[str]):
    """`dtp` arguments parsed by dtp's own parser; `--ulysses U` dropped first where this parser lacks it (the flag
    comes to run / serve on another branch, r11-usp), so the rest is still checked."""
    parser = build_parser()
    verbs = parser._subparsers._group_actions[0].choices
    known = {option for action in verbs[words[0]]._actions for option in action.option_strings}
    if "--ulysses" in words and "--ulysses" not in known:
        at = words.index("--ulysses")
        words = words[:at] + words[at + 2 :]
    return parser.parse_args(words)


def _torchrun(line: str, env: dict):
    """(torchrun's parsed arguments, dtp's) of a printed line, its $VARIABLES set from `env`."""
    from torch.distributed.run import get_args_parser

    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        words = shlex.split(os.path.expandvars(line))
    finally:
        for k, v in saved.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
    assert words[0] == "torchrun", line
    launch = get_args_parser().parse_args(words[1:])
    return launch, _dtp_args(words[words.index("dtp") + 1 :])


def _srun(line: str):
    """(srun's options, torchrun's and dtp's parsed arguments) of the printed SLURM line, run on node 2."""
    head, _, srun = line.partition(" && ")
    assert head.startswith("MASTER_ADDR=$(scontrol show hostnames"), line
    words = shlex.split(srun)
    assert words[0] == "srun" and words[-3:-1] == ["bash", "-c"], line
    inner = words[-1].replace("\\$SLURM_NODEID", "2")  # what bash -c sees on the node SLURM numbers 2
    return words[1:-3], *_torchrun(inner, {"MASTER_ADDR": "node0"})


def test_multi_node_commands_parse():
    """cfg 2 x ring 4 x ulysses 2 x tp 2 of Wan on 4 x 8: a torchrun line per node (4 nodes of 8, the node rank and
    the rendezvous endpoint from the environment) whose dtp part says --cfg 2 --cp 8 --ulysses 2, the same under
    SLURM (one torchrun per node, the node rank from SLURM_NODEID), and the serve line with --replicas."""
    spec = fit_pipeline("wan-pipeline")
    c = Candidate(cfg=2, cp=8, tp=2, ulysses=2, cp_mode="usp", text_encoders="sharded", parallel_vae=True)
    shape = Shape(1, 720, 1280, 81)
    run = RunOptions(nodes=FOUR_BY_EIGHT)
    launch, args = _torchrun(command(c, spec, shape, run=run), {"NODE_RANK": "3", "MASTER_ADDR": "node0"})
    assert (launch.nnodes, launch.nproc_per_node, launch.node_rank, launch.rdzv_endpoint) == (
        "4",
        "8",
        3,
        "node0:29500",
    )
    assert launch.module and launch.training_script == "dtp"
    assert (args.command, args.cfg, args.cp, args.frames, args.output) == ("run", 2, 8, 81, "output.mp4")
    assert getattr(args, "ulysses", 2) == 2
    srun, launch, args = _srun(command(c, spec, shape, run=run, slurm=True))
    assert srun == ["--nodes", "4", "--ntasks-per-node", "1", "--gpus-per-node", "8"]
    assert (launch.nnodes, launch.node_rank, launch.rdzv_endpoint) == ("4", 2, "node0:29500")
    assert (args.prompt, args.cp, args.model_dir) == ("a photo of a cat", 8, "./Wan2.1-T2V-14B-Diffusers")
    assert command(c, spec, shape, slurm=True) is None  # one node: no srun form
    half = Candidate(cfg=2, cp=2, tp=2, cp_mode="ring", parallel_vae=True)
    serve = command(half, spec, shape, "serve", RunOptions(nodes=FOUR_BY_EIGHT, replicas=4))
    launch, args = _torchrun(serve, {"NODE_RANK": "0", "MASTER_ADDR": "node0"})
    assert (launch.nnodes, launch.nproc_per_node, args.command, args.replicas) == ("4", "8", "serve", 4)


def test_guidance_passes_of_the_released_pipelines():
    """Passes per step: FLUX.1 1, Qwen-Image / Wan 2 (two calls), LTX-2 4 (a doubled CFG call, STG, modality); LTX-2
    at cfg = 1 runs 3 calls, the widest (2 rows) traced, costing 4 / 2 of it; at cfg = 2 two single-row calls a group,
    at cfg = 4 one."""
    passes = {
        n: fit_pipeline(n).passes for n in ("flux-pipeline", "qwenimage-pipeline", "wan-pipeline", "ltx2-pipeline")
    }
    assert passes == {"flux-pipeline": 1, "qwenimage-pipeline": 2, "wan-pipeline": 2, "ltx2-pipeline": 4}
    ltx2 = fit_pipeline("ltx2-pipeline")
    plans = {k: arrangement(Candidate(cfg=k, tp=8 // k), ltx2, 1) for k in (1, 2, 4)}
    got = {k: (p.cfg_path, p.calls_per_step, p.traced_calls, p.setups["transformer"].batch) for k, p in plans.items()}
    assert got == {1: (None, 3, 2, 2), 2: ("passes", 2, 2, 1), 4: ("passes", 1, 1, 1)}
    assert plans[1].setups["connectors"].batch == 2 and plans[1].setups["vocoder"].batch == 1
    assert ltx2.extras == {"connectors": "text", "audio_vae": "decode", "vocoder": "decode"}


def test_replicas_and_nodes_on_the_tiny_qwen_image():
    """The tiny Qwen-Image on 2 nodes x 4 GPUs with --replicas 2, cfg 2 and Ulysses 2 (a few traces): a single-mesh
    row (8 ranks: cfg 2 x ring 2 x Ulysses 2, USP) and a 2 x 4-rank row (cfg 2 x Ulysses 2), ranked by steps per
    second per GPU; the single mesh's cfg groups span the nodes (its ring groups {0, 2} do not), a replica is one node
    (nothing crosses); no tp or Ulysses group crosses; every command parses."""
    from dtp.families.pipelines import tiny_checkpoint
    from dtp.fit.measure import Measurer

    directory = str(tiny_checkpoint("qwenimage"))
    measurer = Measurer(fit_pipeline(directory), torch.float32)
    only = {"quant": None, "text_encoders": "whole", "fsdp": False, "pad": False, "cfg": 2, "tp": 1, "ulysses": 2}
    report = dtp.fit(directory, None, "1GB", nodes=2, gpus_per_node=4, inter_node="8x200Gb RoCE", replicas=2,
                     height=64, width=64, dtype="fp32", text_tokens=16, only=only, measurer=measurer,
                     hardware="H100 SXM")  # fmt: skip
    rows = [r for r in report["rows"] if r["fits"]]
    assert sorted((r["replicas"], r["cp_mode"]) for r in rows) == [(1, "usp"), (2, "ulysses")]
    throughput = [r["steps_per_gpu_second"] for r in rows]
    assert throughput == sorted(throughput, reverse=True)
    for r in rows:
        assert r["crosses_nodes"] == (["cfg"] if r["replicas"] == 1 else [])  # cfg {0, 4}; ring {0, 2}: node 0
        assert not {"tp", "ulysses"} & set(r["crosses_nodes"])
        assert r["tp"] * r["ulysses"] <= 4
        assert r["steps_per_gpu_second"] == pytest.approx(r["replicas"] / (r["step_seconds"] * 8))
        nodes = 2 if r["replicas"] == 1 else 1
        line = r["command"]
        if nodes == 2:
            launch, args = _torchrun(line, {"NODE_RANK": "1", "MASTER_ADDR": "node0"})
            assert (launch.nnodes, launch.nproc_per_node) == ("2", "4")
            _srun(r["srun_command"])
        else:
            assert line.startswith("torchrun --nproc-per-node 4 ") and r["srun_command"] is None
        serve = shlex.split(os.path.expandvars(r["serve_command"].replace("$NODE_RANK", "0")))
        assert ("--replicas" in serve) == (r["replicas"] == 2)


@pytest.mark.full
def test_wan_on_four_nodes_of_eight_b200():
    """The issue's command: `dtp fit wan-pipeline --nodes 4 --gpus-per-node 8 --inter-node "400Gb IB" --hardware B200`
    ranks USP meshes, keeps tp and Ulysses within a node, and prints multi-node commands the parsers accept."""
    from dtp.fit.report import format_table

    report = dtp.fit("wan-pipeline", nodes=4, gpus_per_node=8, inter_node="400Gb IB", hardware="B200")
    rows = [r for r in report["rows"] if r["fits"]]
    assert rows and any(r["cp_mode"] == "usp" for r in rows[:10])
    assert all(r["tp"] * r["ulysses"] <= 8 and not {"tp", "ulysses"} & set(r["crosses_nodes"]) for r in rows)
    for r in rows[:20]:
        _torchrun(r["command"], {"NODE_RANK": "0", "MASTER_ADDR": "node0"})
        _srun(r["srun_command"])
    assert "crosses nodes" in format_table(report, 10)


class _Figures:
    """A stand-in `Measurer`: each component's weights and phase peak as given (no traces), the transformer 1 TFLOP."""

    dtype = torch.bfloat16

    def __init__(self, weights: dict, peaks: dict):
        self.weights, self.peaks = weights, peaks

    def phase(self, name, setup, shape):
        from dtp.fit.measure import PhaseFigures

        flops = 10**12 if name == "transformer" else 0
        return PhaseFigures(weight_bytes=self.weights[name], peak_bytes=self.peaks[name], flops=flops, collectives=())

    def output_bytes(self, setup, shape):
        return 1000


def test_ltx2_rows_count_the_connectors_audio_vae_and_vocoder():
    """LTX-2's extra components in a row (stand-in figures): their weights resident in every phase, the connectors'
    peak in the text phase when it is the largest there, the vocoder's in the decode phase likewise (each runs after
    the other in its phase: the phase's peak is the largest); with the extras' figures at zero the row drops by
    exactly their weights."""
    from dtp.fit.estimate import estimate

    spec = fit_pipeline("ltx2-pipeline")
    names = ("transformer", "text_encoder", "vae", "connectors", "audio_vae", "vocoder")
    weights = dict(zip(names, (100, 50, 5, 7, 1, 2)))
    peaks = dict(zip(names, (30, 10, 20, 11, 3, 25)))
    shape = Shape(1, 512, 768, 121)
    c = Candidate(cfg=4, tp=2, text_encoders="whole", parallel_vae=True)
    row = estimate(c, spec, _Figures(weights, peaks), shape, 10**6, HARDWARE["B200"])
    assert row["weight_bytes"] == weights
    assert row["phase_bytes"] == {"text": 11, "denoise": 30, "decode": 25}
    assert row["resident_bytes"] == {p: 165 for p in ("text", "denoise", "decode")}
    assert row["calls_per_step"] == 1 and row["peak_bytes"] == 195
    none = {**weights, "connectors": 0, "audio_vae": 0, "vocoder": 0}
    bare = estimate(c, spec, _Figures(none, {**peaks, "connectors": 0, "vocoder": 0}), shape, 10**6, HARDWARE["B200"])
    assert bare["phase_bytes"] == {"text": 10, "denoise": 30, "decode": 20} and bare["peak_bytes"] == 195 - 10


@pytest.mark.full
def test_ltx2_connectors_traced_at_full_size():
    """LTX2TextConnectors at its class defaults, bf16, on the CFG pair's 2 rows of 512 tokens: its weights are its
    1.4315 B parameters x 2 bytes; the peak is at least its two outputs."""
    from dtp.fit.measure import Measurer, Setup

    measurer = Measurer(fit_pipeline("ltx2-pipeline"), torch.bfloat16, cache=False)
    figures = measurer.phase("connectors", Setup(batch=2), Shape(1, 512, 768, 121))
    assert figures.weight_bytes == pytest.approx(2 * 1431.4752e6, rel=1e-4)
    assert figures.peak_bytes > 2 * 512 * (4096 + 2048) * 2
