"""`python benchmarks/gpu_check.py --cpu-smoke`: the device script's own code on the CPU at tiny sizes, so it does not
rot between the rare runs on a GPU. Every row must run (none failed, none skipped past its budget) and the report
must hold each section: the tp=1 checks, one rank's work per mesh (tp, Ulysses, ring at degree 2 on a fake process
group), the attention backends and the ring block against its fp32 reference. Measured: 118 CPU s (+6 system),
535 s wall on the shared 2-core machine at load ~15."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_check.py"
SECTIONS = ("## tp=1", "## One rank's work", "## Attention backends", "## Ring block")


def test_the_device_script_runs_on_the_cpu(tmp_path):
    # a generous budget: the smoke's own deadline (110 s) is for an idle machine; here 2 cores are shared
    command = [sys.executable, str(SCRIPT), "--cpu-smoke", "--out", str(tmp_path), "--budget-s", "600"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=900)
    report = tmp_path / "gpu_check.md"
    failed = [line for line in report.read_text().splitlines() if "FAILED" in line] if report.exists() else []
    assert done.returncode == 0, failed or done.stderr[-3000:]
    text = report.read_text()
    assert all(section in text for section in SECTIONS), text
    found = json.loads((tmp_path / "gpu_check.json").read_text())
    assert all(row[1] == "OK" for row in found["rows"]), found["rows"]
    for table in ("ranks", "backends", "ring_kernel"):
        assert found[table] and not [r for r in found[table] if "error" in r or "skipped" in r], found[table]
    meshes = {r["mesh"] for r in found["ranks"]}
    assert {"tp=2", "cp=2 ulysses", "cp=2 ring"} <= meshes, meshes
