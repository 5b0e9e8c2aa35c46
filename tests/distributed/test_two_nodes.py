"""`dtp run` launched as two nodes (two torchrun agents on this machine, `--nnodes 2 --rdzv-backend c10d`, one
process each, tp=2 over gloo) draws the one-process image: fp32 pixels within mean 1e-6 / max 1e-4, the bound of
every sharded run against one process. The reference runs in this process: cheaper than the one-node torchrun
launch this test compared with before (within 1e-6 of the two-node one, as the same ranks and plan should be)."""

from __future__ import annotations

import subprocess

import numpy as np

from dtp.families.pipelines import tiny_checkpoint
from dtp.testing.serving import LAUNCHER, free_port, quiet_env
from dtp.tools.cli import main

RUN = ["run", "--prompt", "a cat", "--steps", "2", "--height", "32", "--width", "32", "--seed", "5"]
RUN += ["--dtype", "fp32"]


def test_two_agents_draw_the_one_process_image(tmp_path):
    model_dir = tiny_checkpoint("flux", root=tmp_path)
    common = [*RUN, "--model-dir", str(model_dir)]
    port = free_port()
    nodes = [
        "--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d", "--rdzv-id", "dtp-two-nodes",
        "--rdzv-endpoint", f"127.0.0.1:{port}",
    ]  # fmt: skip
    out = ["-m", "dtp", *common, "--output", str(tmp_path / "two.png"), "--save-pixels", str(tmp_path / "two.npy")]
    agents = [
        subprocess.Popen([*LAUNCHER, *nodes, *out], env=quiet_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        for _ in range(2)
    ]
    logs = [agent.communicate(timeout=600)[0].decode(errors="replace") for agent in agents]
    assert [agent.returncode for agent in agents] == [0, 0], "\n".join(log[-2000:] for log in logs)
    one = [*common, "--output", str(tmp_path / "one.png"), "--save-pixels", str(tmp_path / "one.npy")]
    assert main(one) == 0
    diff = np.abs(np.load(tmp_path / "two.npy").astype(np.float64) - np.load(tmp_path / "one.npy"))
    assert diff.mean() <= 1e-6 and diff.max() <= 1e-4, (diff.mean(), diff.max())
