"""`import dtp` does no work beyond imports: it parses no plan YAML (plans load on first use)."""

import subprocess
import sys

COUNT_YAML = """
import yaml
calls = []
original = yaml.safe_load
yaml.safe_load = lambda *a, **k: calls.append(1) or original(*a, **k)
import dtp
at_import = len(calls)
dtp.load_plan("flux")  # the counter sees a real load, so a zero above means something
print(at_import, len(calls))
"""


def test_import_dtp_reads_no_yaml():
    out = subprocess.run([sys.executable, "-c", COUNT_YAML], capture_output=True, text=True, check=True)
    at_import, after_load = map(int, out.stdout.split())
    assert at_import == 0
    assert after_load == 1
