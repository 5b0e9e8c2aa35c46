"""`dtp verify` end to end (one run of 2 gloo processes): a wrong plan gives exit code 1, the module, the lint."""

import json
from pathlib import Path

import yaml

from dtp.tools.cli import main

PLANS = Path(__file__).resolve().parents[2] / "plans"


def test_cli_names_the_wrong_module(tmp_path, capsys):
    """Tiny FLUX.2, tp=2, its fused SwiGLU projection as plain colwise (refused by the pair rule, so
    --unchecked): exit 1, first divergence at the input of ff.linear_out, suspect ff.linear_in; lint agrees."""
    data = yaml.safe_load((PLANS / "flux2.yaml").read_text())
    data["tp"]["transformer_blocks.*.ff.linear_in"] = "colwise"
    plan = tmp_path / "flux2_plain_swiglu.yaml"
    plan.write_text(yaml.safe_dump(data))
    code = main(["verify", "Flux2Transformer2DModel", "--plan", str(plan), "--tp", "2", "--unchecked", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 1
    assert (report["first"]["path"], report["first"]["where"]) == ("transformer_blocks.0.ff.linear_out", "input")
    assert [s["path"] for s in report["suspects"]] == ["transformer_blocks.0.ff.linear_in"]
    lint = [(f["rule"], f["path"]) for f in report["lint"]]
    assert lint == [("split_across_blocks", "transformer_blocks.0.ff.linear_in")]
    assert report["output_rel"] > 1e-2


def test_cli_refuses_what_the_checks_refuse(tmp_path, capsys):
    """Without --unchecked the same plan is a PlanError from the pair rule; nothing is spawned."""
    data = yaml.safe_load((PLANS / "flux2.yaml").read_text())
    data["tp"]["transformer_blocks.*.ff.linear_in"] = "colwise"
    plan = tmp_path / "flux2_plain_swiglu.yaml"
    plan.write_text(yaml.safe_dump(data))
    assert main(["verify", "Flux2Transformer2DModel", "--plan", str(plan), "--tp", "2"]) == 1
    assert "ff.linear_out' (rowwise) matches no colwise width" in capsys.readouterr().err
