"""`dtp check`: full-size figures on the meta device with a fake process group, and the CLI."""

import json
from pathlib import Path

import pytest
import torch

import dtp
from dtp import PlanError
from dtp.analysis.check import check, measure
from dtp.analysis.fakepg import meta_model
from dtp.plan.io import load_plan
from dtp.resolve import resolve
from dtp.resolve.layout import rank_ranges
from dtp.testing.tiny import TINY_CONFIGS
from dtp.tools.cli import main

RATIO_LIMIT = 1.05  # per-rank / (total / tp) at tp = 8, the target


def independent_per_rank_bytes(class_name: str, plan_name: str, tp: int, rank: int, dtype=torch.bfloat16) -> int:
    """Rank `rank`'s parameter bytes from the plan's layouts and the slicing math, without DTensor."""
    model = meta_model(class_name, dtype=dtype)
    layouts = resolve(load_plan(plan_name), model).param_layouts()
    total = 0
    for name, param in model.named_parameters():
        layout = layouts.get(name)
        if layout is None:
            total += param.numel() * param.element_size()
            continue
        dim, sizes = layout.dim, layout.block_sizes
        rows = sum(stop - start for start, stop in rank_ranges(sizes, tp, rank))
        total += rows * (param.numel() // param.shape[dim]) * param.element_size()
    return total


@pytest.mark.parametrize(
    "plan_name, class_name, tp",
    [
        ("flux", "FluxTransformer2DModel", 8),
        ("flux2", "Flux2Transformer2DModel", 4),  # packed blocks on both sides
        ("zimage", "ZImageTransformer2DModel", 2),
    ],
)
def test_figures_match_an_independent_count_of_local_shards(plan_name, class_name, tp):
    report = check(plan_name, tp=tp, forward=False)
    assert report["model"] == class_name
    expected = {independent_per_rank_bytes(class_name, plan_name, tp, rank) for rank in range(tp)}
    assert expected == {report["per_rank_bytes"]}  # every rank holds the same, and exactly that
    model = meta_model(class_name, dtype=torch.bfloat16)
    assert report["total_bytes"] == sum(p.numel() * 2 for p in model.parameters())
    assert report["ratio"] == pytest.approx(report["per_rank_bytes"] * tp / report["total_bytes"])


@pytest.mark.parametrize("plan_name", ["flux", "qwenimage", "flux2"])
def test_bundled_plans_reach_the_physical_limit_at_tp8(plan_name):
    report = check(plan_name, tp=8, forward=False)
    assert report["ratio"] <= RATIO_LIMIT, report["replicated"]


def test_flux_default_is_flux1_dev():
    """FLUX.1-dev = the class defaults with guidance_embeds=True: 11.90 B parameters."""
    report = check("flux", tp=8, forward=False)
    assert "guidance_embeds" in report["config"]
    assert 11.89e9 < report["params"] < 11.91e9


def test_diffusers_plan_keeps_modulation_replicated():
    """The peer: FluxTransformer2DModel._tp_plan at tp=8 holds 2.9x the limit (AdaLN replicated)."""
    from diffusers import FluxTransformer2DModel

    report = measure("FluxTransformer2DModel", dtp.Plan.from_dict(FluxTransformer2DModel._tp_plan), tp=8, forward=False)
    assert report["ratio"] > 2.5
    assert report["replicated"][0]["module"] in {
        "transformer_blocks.*.norm1.linear",
        "transformer_blocks.*.norm1_context.linear",
    }


@pytest.fixture(scope="module")
def tiny_flux_config(tmp_path_factory):
    path = tmp_path_factory.mktemp("cfg") / "config.json"
    path.write_text(json.dumps({"_class_name": "FluxTransformer2DModel", **TINY_CONFIGS["FluxTransformer2DModel"]}))
    return str(path)


def test_cli_json_with_measured_collectives(tiny_flux_config, capsys):
    """Tiny Flux (2 double + 2 single blocks), tp=4, 64x64 px = 16 image tokens."""
    code = main(
        [
            "check",
            "FluxTransformer2DModel",
            "--tp",
            "4",
            "--config",
            tiny_flux_config,
            "--resolution",
            "64",
            "--text-tokens",
            "8",
            "--dtype",
            "fp32",
            "--json",
            "--no-peak",
        ]
    )
    assert code == 0
    report = json.loads(capsys.readouterr().out)
    for key in (
        "model",
        "tp",
        "cp",
        "total_bytes",
        "per_rank_bytes",
        "ideal_bytes",
        "ratio",
        "candidates",
        "replicated",
    ):
        assert key in report
    assert report["plan"] == "flux" and report["candidates"] == [1, 2, 4]
    collectives = report["collectives"]
    # 2 x (to_out.0, to_add_out, ff.net.2, ff_context.net.2) + 2 x proj_out; 2 x 2 + 2 modulations,
    # norm_out.linear and context_embedder.
    assert collectives["implied"] == {"all_reduce": 10, "all_gather_into_tensor": 8}
    assert {op: e["count"] for op, e in collectives["measured"].items()} == collectives["implied"]


def test_cli_table_with_cp(tiny_flux_config, capsys):
    argv = ["check", "flux", "--tp", "2", "--cp", "2", "--config", tiny_flux_config, "--resolution", "64", "--no-peak"]
    code = main(argv)
    out = capsys.readouterr().out
    assert code == 0
    assert "fake process group of 4 ranks" in out and "ratio per-rank/ideal" in out and "cp=2" in out


def test_cli_refuses_a_degree_that_does_not_fit(capsys):
    """Z-Image 6B has 30 heads: tp=4 must exit non-zero with the PlanError, before the fake world."""
    code = main(["check", "zimage", "--tp", "4", "--no-forward"])
    err = capsys.readouterr().err
    assert code == 1
    assert "tp=4 does not divide" in err and "Supported tp: 1, 2, 5, 10." in err


def test_cli_refuses_an_unknown_target(capsys):
    assert main(["check", "NoSuchTransformer", "--tp", "2"]) == 1
    assert "neither a bundled plan" in capsys.readouterr().err


def test_class_name_with_plan_option_and_plan_file(tiny_flux_config):
    by_class = check("FluxTransformer2DModel", tp=2, plan="flux", config=tiny_flux_config, forward=False)
    plan_file = Path(__file__).resolve().parents[2] / "plans" / "flux.yaml"
    by_file = check(str(plan_file), tp=2, config=tiny_flux_config, forward=False)
    assert by_class["per_rank_bytes"] == by_file["per_rank_bytes"] and by_class["tp"] == 2
    with pytest.raises(PlanError, match="--plan applies to a class name only"):
        check("flux", tp=2, plan="flux2")


def test_cli_cp_aware_candidates_and_ulysses_refusal(capsys):
    """Z-Image 6B at (tp=2, cp=4): Ulysses needs (30/2) % 4 == 0 and refuses; ring accepts."""
    assert main(["check", "zimage", "--tp", "2", "--cp", "4", "--no-forward"]) == 1
    assert "Ulysses needs (heads / tp) % cp == 0" in capsys.readouterr().err
    assert main(["check", "zimage", "--tp", "2", "--cp", "4", "--cp-mode", "ring", "--no-forward", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["cp_mode"] == "ring" and report["candidates"] == [1, 2, 5, 10]
    assert main(["check", "flux", "--tp", "4", "--cp", "2", "--no-forward", "--json"]) == 0
    # FLUX.1 has 24 heads: with Ulysses over cp=2 the local heads 24/tp must be even, so 8 and 24 drop out.
    assert json.loads(capsys.readouterr().out)["candidates"] == [1, 2, 3, 4, 6, 12]
