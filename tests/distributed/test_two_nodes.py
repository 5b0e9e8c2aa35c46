"""`dtp run` launched as two nodes (two torchrun agents on this machine, `--nnodes 2 --rdzv-backend c10d`, two
processes each, gloo): ring cp=2 across the nodes x tp=2 inside each draws the one-process image (fp32 pixels
within mean 1e-6 / max 1e-4, the bound of every sharded run against one process; the reference runs in this
process), and tp=4, whose one group would span both nodes, is refused by `make_mesh` with the axis named
(`runtime/nodes.py`) before anything loads."""

from __future__ import annotations

import subprocess

import numpy as np
import pytest

from dtp.families.pipelines import tiny_checkpoint
from dtp.testing.serving import LAUNCHER, free_port, quiet_env
from dtp.tools.cli import main

RUN = ["run", "--prompt", "a cat", "--steps", "2", "--height", "32", "--width", "32", "--seed", "5"]
RUN += ["--dtype", "fp32"]


def two_agents(args: list[str]) -> tuple[list[int], list[str]]:
    """Run `python -m dtp ARGS` under two torchrun agents of two processes each; (return codes, logs)."""
    port = free_port()
    nodes = [
        "--nnodes", "2", "--nproc-per-node", "2", "--rdzv-backend", "c10d", "--rdzv-id", "dtp-two-nodes",
        "--rdzv-endpoint", f"127.0.0.1:{port}",
    ]  # fmt: skip
    agents = [
        subprocess.Popen(
            [*LAUNCHER, *nodes, "-m", "dtp", *args], env=quiet_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        )
        for _ in range(2)
    ]
    logs = [agent.communicate(timeout=600)[0].decode(errors="replace") for agent in agents]
    return [agent.returncode for agent in agents], logs


# two agents x 2 processes and a one-process run (~50 s on 2 cores): `full`; the refusal below stays default.
@pytest.mark.full
def test_two_agents_draw_the_one_process_image(tmp_path):
    model_dir = tiny_checkpoint("flux", root=tmp_path)
    common = [*RUN, "--model-dir", str(model_dir)]
    out = [*common, "--output", str(tmp_path / "two.png"), "--save-pixels", str(tmp_path / "two.npy")]
    codes, logs = two_agents([*out, "--cp", "2", "--cp-mode", "ring"])
    assert codes == [0, 0], "\n".join(log[-2000:] for log in logs)
    one = [*common, "--output", str(tmp_path / "one.png"), "--save-pixels", str(tmp_path / "one.npy")]
    assert main(one) == 0
    diff = np.abs(np.load(tmp_path / "two.npy").astype(np.float64) - np.load(tmp_path / "one.npy"))
    assert diff.mean() <= 1e-6 and diff.max() <= 1e-4, (diff.mean(), diff.max())


def test_tp_across_the_two_agents_is_refused(tmp_path):
    """tp=4 on 2 nodes x 2 ranks: the one tp group spans both nodes; every rank fails with the axis named."""
    model_dir = tiny_checkpoint("flux", root=tmp_path)
    codes, logs = two_agents([*RUN, "--model-dir", str(model_dir), "--output", str(tmp_path / "x.png")])
    assert all(code != 0 for code in codes), codes
    assert any("the tp group of ranks [0, 1, 2, 3] spans 2 nodes" in log for log in logs), logs[0][-3000:]
