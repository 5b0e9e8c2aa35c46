"""`torchrun --nproc-per-node 2 -m dtp run` as a user runs it: a user error prints dtp's message once (no worker
traceback), torchrun's closing summary names it, and the launcher exits 1.

What torchrun adds on its own (its ChildFailedError traceback and the failure summary, ~35 lines) is
torch's; the test counts dtp's lines, the ones that say `dtp run:`, outside that summary.
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dtp.families.pipelines import tiny_checkpoint
from dtp.loading.checkpoint import WEIGHTS_NAME

ROOT = Path(__file__).resolve().parents[2]
MAX_LINES = 5
SUMMARY = "torch.distributed.elastic.multiprocessing.errors.ChildFailedError"


def torchrun(*argv) -> tuple[int, str]:
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
    command += ["-m", "dtp", "run", "--prompt", "cat", "--steps", "1", "--height", "32", "--width", "32", *argv]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": str(ROOT)}
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    return done.returncode, done.stdout + done.stderr


def dtp_lines(output: str) -> list[str]:
    """dtp's own lines: those before torchrun's summary that carry a `dtp run:` message."""
    before = output.split(SUMMARY)[0]
    return [line for line in before.splitlines() if "dtp run:" in line]


def assert_one_message(code: int, output: str, expected: str) -> None:
    assert code == 1, output
    lines = dtp_lines(output)
    assert 1 <= len(lines) <= MAX_LINES and expected in lines[0], output
    assert "[rank0]" not in output and "[rank1]" not in output, output  # no worker traceback
    assert output.count("Traceback (most recent call last)") <= 1, output  # at most torchrun's own
    summary = output.split(SUMMARY)[-1]
    assert expected in summary, output  # the launcher's summary names dtp's message, not "To enable traceback"


@pytest.fixture(scope="module")
def truncated(tmp_path_factory):
    os.environ.setdefault("DTP_CACHE", str(tmp_path_factory.mktemp("cache")))
    copy = shutil.copytree(tiny_checkpoint("flux"), tmp_path_factory.mktemp("damaged") / "pipeline")
    weights = copy / "transformer" / WEIGHTS_NAME
    os.truncate(weights, os.path.getsize(weights) - 100)
    return copy


def test_missing_model_dir(tmp_path):
    """Refused before torch is imported (`tools/early.py`, `failure.report_early`): no store, local rank 0 prints.
    1.4-1.5 CPU s, the launcher's own torch import most of it (8.3 CPU s when each rank imported torch first)."""
    code, output = torchrun("--model-dir", str(tmp_path / "nonexistent"))
    assert_one_message(code, output, f"dtp run: --model-dir {tmp_path / 'nonexistent'} does not exist")


@pytest.mark.full  # suite time (17 s); the store protocol stays default in test_cli_failures (`_report_rank`)
def test_truncated_checkpoint_while_sharding(truncated):
    """The CheckpointError is raised inside the process group (shard-on-load), on both ranks: the store path."""
    code, output = torchrun("--model-dir", str(truncated))
    assert_one_message(code, output, "is truncated: tensor")
