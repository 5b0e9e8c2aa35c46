"""`dtp check --pad`: the padding overhead at full size (meta device, fake process group of its own)."""

import json

import pytest

from dtp.analysis.check import check
from dtp.tools import cli


def test_check_pad_full_size_zimage_tp8():
    """Full-size Z-Image at tp=8 with --pad: per rank / (unpadded total / 8) <= 1.08; 30 -> 32 heads."""
    report = check("zimage", tp=8, pad=True, forward=False)
    assert report["pad"] and report["ratio"] <= 1.08, report["ratio"]
    padding = report["padding"]
    assert padding["heads"] == ["30->32"]
    assert padding["attention_flops_ratio"] == pytest.approx(32 / 30)
    assert 1.0 < padding["linear_flops_ratio"] < 32 / 30
    assert padding["padded_bytes"] == 2 * padding["padded_params"]  # bf16
    assert report["candidates"] == list(range(1, 31))


def test_check_pad_cli_json(capsys):
    """`dtp check zimage --tp 4 --pad --json` runs; without --pad the same tp is refused with the hint."""
    assert cli.main(["check", "zimage", "--tp", "4", "--pad", "--json", "--no-forward"]) == 0
    assert json.loads(capsys.readouterr().out)["padding"]["heads"] == ["30->32"]
    assert cli.main(["check", "zimage", "--tp", "4", "--json", "--no-forward"]) == 1
    assert "pad=True" in json.loads(capsys.readouterr().err)["error"]
