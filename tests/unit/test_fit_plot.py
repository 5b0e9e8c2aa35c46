"""`dtp fit --plot FILE.png`: the chart of a real fit report, and the refusals that come before any work."""

import sys

import pytest

from dtp.tools.cli import main

FIT = ["fit", "flux-pipeline", "--gpus", "2", "--gpu-memory", "24GB"]


@pytest.mark.full  # suite time (15 s of matplotlib): the refusals below stay default
def test_plot_writes_a_png(tmp_path, capsys):
    path = tmp_path / "fit.png"
    assert main([*FIT, "--plot", str(path)]) == 0
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 10_000
    assert "commands" in capsys.readouterr().out  # the table is printed as without --plot


def test_a_name_that_is_not_png_is_refused_first(tmp_path, capsys):
    assert main([*FIT, "--plot", str(tmp_path / "fit.svg")]) == 1
    assert "FILE.png" in capsys.readouterr().err
    assert not (tmp_path / "fit.svg").exists()


def test_without_matplotlib_the_extra_is_named(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` raises ImportError
    assert main([*FIT, "--plot", str(tmp_path / "fit.png")]) == 1
    assert "pip install 'dtp[plot]'" in capsys.readouterr().err
